//! A recording file as `proto::container::record` (and `recordts`, a TS one) reads it back for playback: any bytes (a
//! file cut short, damaged, or not a recording) scan without a panic, and what the scan
//! finds lies inside the file; a file name the layout takes is one it could have made.
#![no_main]
use fanout_proto::container::record::{fragment, pick, scan, timescales, vod_playlist, Layout, Recording, Retimer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let read = |at: u64, n: usize| data.get(at as usize..).map(|d| d[..n.min(d.len())].to_vec());
    if let Ok(index) = scan(data.len() as u64, read) {
        assert!(index.init_len <= data.len() as u64);
        for f in &index.fragments {
            assert!(f.offset >= index.init_len && f.offset + f.len <= data.len() as u64);
            let mut bytes = data[f.offset as usize..(f.offset + f.len) as usize].to_vec();
            Retimer::default().retime(&mut bytes, &index, f, 0);
        }
        let files = [Recording { start_us: 0, index: &index }];
        let picks = pick(&files, 0, i64::MAX / 2);
        let _ = vod_playlist(&files, &picks, |_| "a.mp4".into(), |p, at| format!("{}?{at}", p.fragment));
    }
    // A fragment as a playlist's URI asks for it: alone, with the time scales of an init.
    if let Some(f) = fragment(data) {
        assert_eq!(f.len, data.len() as u64);
        let scales = fanout_proto::container::record::FileIndex { timescales: timescales(data), ..Default::default() };
        Retimer::starting_at(0).retime(&mut data.to_vec(), &scales, &f, 1_000_000);
    }
    // The same bytes as a TS recording.
    if let Ok(index) = fanout_proto::container::recordts::scan(data.len() as u64, read) {
        let mut retimer = fanout_proto::container::recordts::TsRetimer::default();
        for f in &index.fragments {
            assert!(f.offset + f.len <= data.len() as u64);
            retimer.retime(&mut data[f.offset as usize..(f.offset + f.len) as usize].to_vec(), f, 1_000_000);
        }
    }
    let layout = Layout::new("r/%path/%Y-%m-%d_%H-%M-%S-%f").unwrap();
    if let Some((path, start)) = layout.parse(&String::from_utf8_lossy(data)) {
        assert_eq!(
            layout.parse(&layout.file(
                &path,
                start,
                fanout_proto::container::record::Format::of(&String::from_utf8_lossy(data))
            )),
            Some((path, start))
        );
    }
});
