//! A session spec as the API reads it (any JSON body): read or refused, never a panic, and
//! what is read is written back to JSON that reads again as a spec of the same name, source
//! kind and verdict (the state file's way; floats may move in their last bit).
#![no_main]
use fanout_server::spec::SessionSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = serde_json::from_slice::<SessionSpec>(data) else { return };
    let written = serde_json::to_string(&spec).expect("a read spec writes");
    let again: SessionSpec = serde_json::from_str(&written).expect("what was written reads");
    assert_eq!(again.name, spec.name);
    assert_eq!(std::mem::discriminant(&again.source), std::mem::discriminant(&spec.source));
    assert_eq!(again.validate().is_ok(), spec.validate().is_ok());
});
