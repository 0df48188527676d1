//! The MP4-to-TS remux of `file` sources never hangs and never panics outside its guard
//! around the MP4 reader (whose panics on bad boxes become errors); what it makes is whole
//! transport packets.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // libfuzzer-sys aborts at any panic, caught or not: the reader's, which the remux catches
    // by design, must not count. A panic of ours still escapes the target and aborts.
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    if let Ok(ts) = fanout_proto::container::mp4ts::remux(data) {
        assert_eq!(ts.len() % 188, 0);
    }
});
