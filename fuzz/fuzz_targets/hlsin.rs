//! An HLS source's parsers on any bytes: a playlist is read or refused, a segment (MPEG-TS
//! or fMP4, with an initialization section from the first bytes) gives units or is refused;
//! the merge of what they gave keeps its times going. Nothing panics.
#![no_main]
use fanout_proto::container::hlsin;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(hlsin::Playlist::Media(m)) = hlsin::parse(&String::from_utf8_lossy(data)) {
        let mut f = hlsin::Follower::default();
        let due = f.due(&m);
        assert!(due.windows(2).all(|w| w[0].sequence < w[1].sequence));
        for s in due {
            let _ = hlsin::resolve("http://h:1/a/index.m3u8?x=1", &s.uri);
        }
    }
    let cut = usize::from(*data.first().unwrap_or(&0)) * 4;
    let (init, seg) = data.split_at(cut.min(data.len()));
    let mut merge = hlsin::Merge::new(2, 90_000);
    merge.push(0, hlsin::ts_units(seg).0);
    if let Ok(init) = hlsin::init(init) {
        if let Ok(units) = hlsin::fmp4_units(&init, seg) {
            merge.push(1, units);
        }
    }
    let mut last: Option<u64> = None;
    while let Some(u) = merge.pop() {
        if let Some(l) = last {
            assert!(u.dts + 90_000 >= l && u.dts <= l + 6 * 90_000);
        }
        last = Some(u.dts);
    }
});
