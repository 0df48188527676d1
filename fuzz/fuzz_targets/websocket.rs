//! The WebSocket reader never panics, keeps no more than a header and a control payload
//! however the bytes come, and reads the same events whole or cut.
#![no_main]
use fanout_proto::websocket::Incoming;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = Incoming::default().push(data);
    let cut = data.first().map_or(1, |b| usize::from(*b % 16) + 1);
    let mut r = Incoming::default();
    let mut events = Vec::new();
    let mut failed = None;
    for chunk in data.chunks(cut) {
        match r.push(chunk) {
            Ok(e) => events.extend(e),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        assert!(r.kept() <= Incoming::MAX_KEPT);
    }
    match (whole, failed) {
        (Ok(w), None) => assert_eq!(w, events),
        (Err(a), Some(b)) => assert_eq!(a, b),
        (w, f) => panic!("whole {w:?}, cut {f:?}"),
    }
});
