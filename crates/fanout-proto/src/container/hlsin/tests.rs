use super::*;
use crate::container::fmp4::{init_segment, media_segment, Fmp4Track, Sample};
use proptest::prelude::*;

const SPS: &[u8] = &[0x67, 0x42, 0xc0, 0x1e, 0xda, 0x02, 0x80, 0xbf, 0xe5, 0x84, 0x00];
const PPS: &[u8] = &[0x68, 0xce, 0x3c, 0x80];
const ASC: [u8; 2] = [0x11, 0x90]; // AAC-LC, 48 kHz, stereo

/// MediaMTX's fMP4 multivariant playlist: the audio a rendition of its own.
const MULTIVARIANT: &str = "#EXTM3U\n#EXT-X-VERSION:9\n#EXT-X-INDEPENDENT-SEGMENTS\n\n\
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"audio2\",AUTOSELECT=YES,DEFAULT=YES,URI=\"audio2_stream.m3u8\"\n\
#EXT-X-STREAM-INF:BANDWIDTH=1200000,AVERAGE-BANDWIDTH=1000000,CODECS=\"avc1.64001f,mp4a.40.2\",RESOLUTION=1280x720,FRAME-RATE=30.000,AUDIO=\"audio\"\n\
video1_stream.m3u8\n";

/// An LL-HLS media playlist, parts and hints among the segments.
const LOW_LATENCY: &str = "#EXTM3U\n#EXT-X-VERSION:9\n#EXT-X-TARGETDURATION:2\n\
#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=1.2\n#EXT-X-PART-INF:PART-TARGET=0.4\n\
#EXT-X-MEDIA-SEQUENCE:7\n#EXT-X-MAP:URI=\"init.mp4\"\n\
#EXT-X-PROGRAM-DATE-TIME:2026-12-07T08:00:00Z\n#EXTINF:2.00000,\nseg7.mp4\n\
#EXT-X-PART:DURATION=0.4,URI=\"part40.mp4\",INDEPENDENT=YES\n#EXTINF:2.00000,\nseg8.mp4\n\
#EXT-X-PART:DURATION=0.4,URI=\"part45.mp4\",INDEPENDENT=YES\n#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"part46.mp4\"\n";

fn media(text: &str) -> Media {
    match parse(text).unwrap() {
        Playlist::Media(m) => m,
        p => panic!("not a media playlist: {p:?}"),
    }
}

fn live(first: u64, n: u64) -> Media {
    let mut s = format!("#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXT-X-MEDIA-SEQUENCE:{first}\n");
    for k in first..first + n {
        s += &format!("#EXTINF:1.0,\ns{k}.ts\n");
    }
    media(&s)
}

#[test]
fn a_multivariant_playlist_gives_the_variant_and_its_audio_rendition() {
    let Playlist::Multivariant(mv) = parse(MULTIVARIANT).unwrap() else { panic!() };
    let (v, audio) = mv.choose().unwrap();
    assert_eq!((v.uri.as_str(), v.bandwidth, audio), ("video1_stream.m3u8", 1_200_000, Some("audio2_stream.m3u8")));
    // The widest variant the relay carries, before a wider one it does not.
    let two = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000,CODECS=\"avc1.4d401f,mp4a.40.2\"\nlow.m3u8\n\
#EXT-X-STREAM-INF:BANDWIDTH=5000000,CODECS=\"av01.0.08M.08\"\nav1.m3u8\n\
#EXT-X-STREAM-INF:BANDWIDTH=2000000,CODECS=\"hvc1.1.6.L93.B0\"\nmid.m3u8\n";
    let Playlist::Multivariant(mv) = parse(two).unwrap() else { panic!() };
    assert_eq!(mv.choose().map(|c| (c.0.uri.as_str(), c.1)), Some(("mid.m3u8", None)));
}

#[test]
fn a_low_latency_playlist_is_read_by_its_whole_segments() {
    let m = media(LOW_LATENCY);
    assert_eq!(m.target_duration, 2.0);
    let got: Vec<(&str, u64, Option<&str>)> =
        m.segments.iter().map(|s| (s.uri.as_str(), s.sequence, s.map.as_deref())).collect();
    assert_eq!(got, [("seg7.mp4", 7, Some("init.mp4")), ("seg8.mp4", 8, Some("init.mp4"))]);
    assert!(!m.ended);
}

#[test]
fn what_cannot_be_followed_is_named() {
    for (text, why) in [
        ("<html>", "no #EXTM3U"),
        ("#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXT-X-KEY:METHOD=AES-128,URI=\"k\"\n", "encrypted"),
        ("#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXT-X-BYTERANGE:100@0\n#EXTINF:2,\na.ts\n", "byte ranges"),
        ("#EXTM3U\n#EXTINF:two,\na.ts\n", "#EXTINF"),
        ("#EXTM3U\n", "neither variants nor segments"),
    ] {
        let e = parse(text).unwrap_err().0;
        assert!(e.contains(why), "{text:?}: {e}");
    }
}

#[test]
fn uris_resolve_against_the_playlist() {
    let base = "http://h:8888/cam/index.m3u8?jwt=x";
    assert_eq!(resolve(base, "video1_stream.m3u8"), "http://h:8888/cam/video1_stream.m3u8");
    assert_eq!(resolve(base, "/other/a.m3u8"), "http://h:8888/other/a.m3u8");
    assert_eq!(resolve(base, "//cdn/a.ts"), "http://cdn/a.ts");
    assert_eq!(resolve(base, "https://x/y.ts"), "https://x/y.ts");
    assert_eq!(resolve("http://h:8888", "a.m3u8"), "http://h:8888/a.m3u8");
}

#[test]
fn a_follower_starts_near_the_end_and_then_takes_what_is_new() {
    let mut f = Follower::default();
    let seqs = |s: &[Segment]| s.iter().map(|s| s.sequence).collect::<Vec<_>>();
    assert_eq!(seqs(f.due(&live(10, 7))), [14, 15, 16], "the last three of a live playlist");
    assert_eq!(seqs(f.due(&live(10, 7))), Vec::<u64>::new(), "nothing new");
    assert_eq!(seqs(f.due(&live(11, 8))), [17, 18]);
    // Fallen behind: what went is counted, the rest taken.
    assert_eq!(seqs(f.due(&live(25, 3))), [25, 26, 27]);
    assert_eq!(f.skipped, 6);
    // The far side restarted: its numbering begins again.
    assert_eq!(seqs(f.due(&live(0, 5))), [2, 3, 4]);
    assert_eq!(f.skipped, 7);
    let mut ended = live(0, 4);
    ended.ended = true;
    assert_eq!(seqs(Follower::default().due(&ended)), [0, 1, 2, 3], "an ended playlist from its start");
}

/// H.264 samples (4-byte lengths) and AAC frames written by the relay's own fMP4 writer.
fn fmp4(frames: u32) -> (Vec<u8>, Vec<u8>) {
    let init = init_segment(&[
        Fmp4Track::H264 { sps: SPS.to_vec(), pps: PPS.to_vec(), width: 320, height: 240 },
        Fmp4Track::Aac { config: ASC.to_vec(), sample_rate: 48_000, channels: 2 },
    ]);
    let video = (0..frames)
        .map(|i| {
            let nal = [if i == 0 { 0x65 } else { 0x41 }, i as u8, 0xaa];
            let mut data = (nal.len() as u32).to_be_bytes().to_vec();
            data.extend_from_slice(&nal);
            Sample { duration: 3600, composition_offset: if i == 0 { 0 } else { 3600 }, key: i == 0, data }
        })
        .collect();
    let audio = (0..frames * 2)
        .map(|i| Sample { duration: 1024, composition_offset: 0, key: true, data: vec![0x21, i as u8] })
        .collect();
    (init, media_segment(1, &[(900_000, video), (480_000, audio)]))
}

#[test]
fn an_fmp4_segment_becomes_annex_b_and_adts_units_in_decoding_order() {
    let (init_bytes, seg) = fmp4(25);
    let i = init(&init_bytes).unwrap();
    assert_eq!(
        i.tracks.iter().map(|t| (t.id, t.kind, t.timescale)).collect::<Vec<_>>(),
        [(1, StreamKind::H264, 90_000), (2, StreamKind::AacAdts, 48_000)]
    );
    let units = fmp4_units(&i, &seg).unwrap();
    assert_eq!(units.len(), 75);
    assert!(units.windows(2).all(|w| w[0].dts <= w[1].dts), "decoding order across tracks");
    let video: Vec<&Unit> = units.iter().filter(|u| u.kind == StreamKind::H264).collect();
    // Both start at 10 s on 90 kHz.
    assert_eq!((video[0].dts, units.iter().find(|u| u.kind == StreamKind::AacAdts).unwrap().dts), (900_000, 900_000));
    let mut first = vec![0, 0, 0, 1, 0x09, 0xf0, 0, 0, 0, 1];
    first.extend_from_slice(SPS);
    first.extend_from_slice(&[0, 0, 0, 1]);
    first.extend_from_slice(PPS);
    first.extend_from_slice(&[0, 0, 0, 1, 0x65, 0, 0xaa]);
    assert_eq!(video[0].data, first, "a delimiter, the parameter sets, the picture");
    assert!(video[0].key && !video[1].key);
    assert_eq!((video[1].dts, video[1].pts), (903_600, 907_200), "the composition offset is the PTS");
    let audio = units.iter().find(|u| u.kind == StreamKind::AacAdts).unwrap();
    assert_eq!(audio.data.len(), 9);
    assert_eq!(&audio.data[..2], &[0xff, 0xf1], "an ADTS header");
    assert!(fmp4_units(&i, &seg[..seg.len() - 1]).is_err(), "a segment cut short");
}

#[test]
fn a_ts_segment_gives_its_units() {
    let demo = include_bytes!("../../../../../assets/demo.ts");
    let (units, errors) = ts_units(demo);
    assert_eq!(errors, 0);
    let video = units.iter().filter(|u| u.kind == StreamKind::H264).count();
    assert_eq!(video, 200, "8 s at 25 pictures a second, the last flushed at the segment's end");
    assert!(units.iter().any(|u| u.kind == StreamKind::AacAdts));
    assert!(units.iter().find(|u| u.kind == StreamKind::H264).unwrap().key);
}

fn unit(kind: StreamKind, dts: u64) -> Unit {
    Unit { kind, pts: dts, dts, key: true, data: vec![] }
}

#[test]
fn renditions_merge_in_decoding_order_and_wait_for_each_other() {
    let mut m = Merge::new(2, 90_000);
    m.push(0, (0..10).map(|i| unit(StreamKind::H264, 3_600 * i)).collect());
    assert!(m.pop().is_none(), "the audio may still bring earlier units");
    m.push(1, (0..4).map(|i| unit(StreamKind::AacAdts, 1_920 * i + 100)).collect());
    assert_eq!(m.kinds(), [StreamKind::H264, StreamKind::AacAdts]);
    let order: Vec<(StreamKind, u64)> = std::iter::from_fn(|| m.pop()).map(|u| (u.kind, u.dts)).collect();
    assert_eq!(order[..3], [(StreamKind::H264, 0), (StreamKind::AacAdts, 100), (StreamKind::AacAdts, 2_020)]);
    // Once the audio ran out, the video waits for it up to the patience.
    assert_eq!(m.queued(), 10 + 4 - order.len());
    assert!(order.iter().all(|o| o.1 < 7_200) && order.len() == 6, "{order:?}");
    m.push(0, (10..40).map(|i| unit(StreamKind::H264, 3_600 * i)).collect());
    assert!(m.pop().is_some(), "past a second of video, the silent audio is not waited for");
}

#[test]
fn a_jump_of_the_far_clock_is_taken_out() {
    let mut m = Merge::new(1, 0);
    m.push(
        0,
        vec![
            unit(StreamKind::H264, 90_000),
            unit(StreamKind::H264, 93_600),
            unit(StreamKind::H264, 10),
            unit(StreamKind::H264, 3_610),
            unit(StreamKind::H264, 9_000_000),
        ],
    );
    let dts: Vec<u64> = std::iter::from_fn(|| m.pop()).map(|u| u.dts).collect();
    assert_eq!(dts, [90_000, 93_600, 97_200, 100_800, 104_400], "a restart or a leap follows on one frame later");
}

proptest! {
    #[test]
    fn any_text_parses_or_is_refused(text in "(#EXT[-A-Z]{0,20}(:[A-Z0-9=\",.]{0,30})?\n|[a-z0-9./]{0,10}\n){0,20}") {
        let _ = parse(&format!("#EXTM3U\n{text}"));
    }

    #[test]
    fn any_bytes_are_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..600), cut in 0usize..2000) {
        let (init_bytes, seg) = fmp4(3);
        let i = init(&init_bytes).unwrap();
        let _ = fmp4_units(&i, &bytes);
        let _ = init(&bytes);
        let _ = ts_units(&bytes);
        let mut broken = seg.clone();
        let at = cut % broken.len();
        broken[at] ^= 0xff;
        let _ = fmp4_units(&i, &broken);
    }

    /// Whatever the sources bring, the merged times never go back and never leap.
    #[test]
    fn merged_times_keep_going(a in proptest::collection::vec(0u64..(1 << 34), 1..40), b in proptest::collection::vec(0u64..(1 << 34), 0..40)) {
        let mut m = Merge::new(2, 0);
        m.push(0, a.iter().map(|&d| unit(StreamKind::H264, d)).collect());
        m.push(1, b.iter().map(|&d| unit(StreamKind::AacAdts, d)).collect());
        let out: Vec<u64> = std::iter::from_fn(|| m.pop()).map(|u| u.dts).collect();
        prop_assert_eq!(out.len(), a.len() + b.len());
        for w in out.windows(2) {
            // (Late units stay within a second behind the latest; a leap is at most that
            // second and the jump allowed.)
            prop_assert!((-BACK_90K..=JUMP_90K + BACK_90K).contains(&(w[1] as i64 - w[0] as i64)), "{:?}", out);
        }
    }
}
