//! TS header parsing and schedule building never panic; schedules are monotonic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for (i, p) in data.chunks(188).enumerate() {
        let _ = fanout_proto::mpegts::parse_header(p, i * 188);
    }
    if let Ok(s) = fanout_proto::mpegts::TsSchedule::new(data) {
        let mut last = 0;
        for n in 0..(2 * s.len() as u64).min(10_000) {
            let (off, len, due) = s.datagram(n);
            assert!(off + len <= data.len() && due >= last);
            last = due;
        }
    }
});
