//! RTP repackaging into MPEG-TS and HLS segments never panics, whatever the packets; what
//! comes out as TS is whole transport packets that demux without an error. The first byte
//! picks the session: H.264, H.265 and AAC, or VP9, Opus, AV1, MP3 and G.711 (which go to HLS
//! alone). The
//! HEVC SPS, VP9 frame header, AV1 sequence header and MPEG audio readers take the same bytes,
//! as does the slate's search for a keyframe's SPS.
#![no_main]
use fanout_proto::container::repack::{Repackager, TrackInfo, TsPackager};
use libfuzzer_sys::fuzz_target;

const SDP: &str = "v=0\r\ns=x\r\nt=0 0\r\n\
    m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 sprop-parameter-sets=Z2QAHqzZQeA,aOvjyyLA\r\n\
    m=video 0 RTP/AVP 98\r\na=rtpmap:98 H265/90000\r\n\
    m=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\n\
    a=fmtp:97 mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config=1190\r\n";
const SDP_OPEN: &str = "v=0\r\ns=x\r\nt=0 0\r\n\
    m=video 0 RTP/AVP 96\r\na=rtpmap:96 VP9/90000\r\n\
    m=audio 0 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n\
    m=video 0 RTP/AVP 98\r\na=rtpmap:98 AV1/90000\r\n\
    m=audio 0 RTP/AVP 14\r\nm=audio 0 RTP/AVP 0\r\n";

fuzz_target!(|data: &[u8]| {
    let Some((&which, data)) = data.split_first() else { return };
    let sdp = fanout_proto::rtsp::sdp::Sdp::parse(if which & 1 == 0 { SDP } else { SDP_OPEN }).expect("a valid description");
    let size = fanout_proto::freeze::slate_size(&sdp.media[0], &[data.to_vec()]);
    assert_eq!(size.is_some(), which & 1 == 0, "a slate for H.264 only");
    let mut r = Repackager::new(sdp.media.iter().map(|m| TrackInfo::from_sdp(m).ok()).collect());
    let mut ts = TsPackager::new(r.streams());
    // The units also go into HLS segments and parts (an HEVC keyframe's SPS is read for its
    // hvcC).
    let mut hls =
        fanout_proto::container::hls::Segmenter::with_parts(r.streams(), 100, 30, 1).expect("every track segments");
    let (mut units, mut out) = (Vec::new(), Vec::new());
    // Packets: a track byte and a length byte, then that many bytes.
    let (mut rest, mut now) = (data, 0u64);
    while let [track, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let tracks = sdp.media.len();
        r.push_rtp(usize::from(*track) % tracks, &tail[..n], now, &mut units);
        for u in units.drain(..) {
            ts.write(&u, &mut out);
            hls.push(&u);
        }
        if *track & 0x80 != 0 {
            r.set_clock_map(usize::from(*track) % sdp.media.len(), u64::from(*len) << 32, u32::from(*track) << 16);
        }
        rest = &tail[n..];
        now += 7;
    }
    assert_eq!(out.len() % 188, 0);
    let mut d = fanout_proto::container::tsdemux::Demux::default();
    out.chunks(188).for_each(|p| drop(d.push(p)));
    d.flush();
    assert_eq!(d.errors, 0);
    // Each segment is its parts, one after another; the playlist lists what exists.
    let last = hls.progress().last;
    if let Some(seg) = hls.segment(last) {
        let joined: Vec<u8> = seg.parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        assert_eq!(&joined[..], &seg.data[..]);
    }
    if let Some(p) = hls.playlist("") {
        assert!(p.starts_with("#EXTM3U\n") && p.contains("#EXT-X-PRELOAD-HINT"));
    }
    // Any bytes as an HEVC SPS: read or refused, never a panic.
    if let Some(info) = fanout_proto::codec::hevc::parse_sps(data) {
        let _ = (info.codec(), info.hvcc(&[], data, &[]));
    }
    if let Some(f) = fanout_proto::codec::vpx::vp9_frame_header(data).and_then(|f| f.format) {
        let _ = fanout_proto::codec::vpx::vp9_codec_string(0, &f);
    }
    let _ = fanout_proto::codec::mpa::frame_header(data);
    if let Some(h) = fanout_proto::codec::av1::SequenceHeader::parse(data) {
        let _ = (h.codec(), h.av1c(data));
    }
});
