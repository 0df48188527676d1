//! TS header parsing, schedule building, demuxing, joining recordings into a playlist and
//! trimming a clip to its lap never panic; schedules are monotonic; a demuxed PES payload is never larger than the
//! bytes fed in.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for (i, p) in data.chunks(188).enumerate() {
        let _ = fanout_proto::container::mpegts::parse_header(p, i * 188);
    }
    let mut d = fanout_proto::container::tsdemux::Demux::default();
    let mut out: usize = data.chunks(188).filter_map(|p| d.push(p)).map(|p| p.data.len()).sum();
    out += d.flush().iter().map(|p| p.data.len()).sum::<usize>();
    assert!(out <= data.len());
    if let Ok(s) = fanout_proto::container::mpegts::TsSchedule::new(data) {
        let mut last = 0;
        for n in 0..(2 * s.len() as u64).min(10_000) {
            let (off, len, due) = s.datagram(n);
            assert!(off + len <= data.len() && due >= last);
            last = due;
        }
    }
    // The input as a playlist of two recordings: its halves, split at a packet boundary.
    let (a, b) = data.split_at(data.len() / 376 * 188);
    let list = [("a".to_string(), a.to_vec()), ("b".to_string(), b.to_vec())];
    let _ = fanout_proto::container::playlist::concat(&list);
    // Trimmed to a lap (1 s, and one taken from the input): the same size, whatever it cuts.
    let lap = u64::from(data.first().copied().unwrap_or(0)) * 9_000;
    for lap in [90_000, lap] {
        if let Some(t) = fanout_proto::container::mpegts::trimmed_to_lap(data, lap) {
            assert_eq!(t.len(), data.len());
        }
    }
});
