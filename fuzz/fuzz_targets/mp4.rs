//! The MP4-to-TS remux of `file` sources never panics past its guard and never aborts on any
//! bytes; what it makes is whole transport packets. Inputs starting with an `ftyp` box reach
//! the box reader (the first 4 bytes give the box size).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ts) = fanout_proto::mp4ts::remux(data) {
        assert_eq!(ts.len() % 188, 0);
    }
});
