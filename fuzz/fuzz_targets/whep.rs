//! What a WebRTC peer's bytes reach of the relay's own code (ICE, DTLS, SRTP and RTCP are
//! str0m's): an SDP that `proto::whep` matches against a path (the viewer's side) or makes a
//! publisher's tracks of, and RTP payloads of H.264 that `InBandParams` looks into before a
//! viewer gets them. Never a panic; a plan routes each track once and only to a media section
//! of the answer; at most the two parameter sets go before a payload.
#![no_main]
use fanout_proto::rtsp::sdp::Sdp;
use fanout_proto::whep::{ingest, plan, publisher_video, InBandParams};
use libfuzzer_sys::fuzz_target;

const PATH: &str = "v=0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n\
a=fmtp:96 packetization-mode=1;sprop-parameter-sets=Z0LAHg==,aM48gA==\r\n\
m=audio 0 RTP/AVP 97\r\na=rtpmap:97 opus/48000/2\r\n";

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(answer) = Sdp::parse(&text) {
        let path = Sdp::parse(PATH).unwrap();
        let p = plan(&path, &answer);
        for r in &p.routes {
            assert!(r.track < path.media.len());
            assert!(answer.media.iter().any(|m| m.attr("mid") == Some(r.mid.as_str())));
        }
        if let Some(i) = ingest(&answer) {
            assert!(Sdp::parse(&i.sdp).is_ok());
        }
        // As a WHIP publisher's offer: the video codec taken is one of the three, or none.
        assert!(matches!(publisher_video(&answer), None | Some("H264" | "VP8" | "VP9")));
        // Its own sprop parameter sets, whatever they decode to.
        for r in p.routes {
            let mut params = InBandParams::new(&r.params);
            for (i, piece) in data.chunks(97).enumerate() {
                assert!(params.before(i as u32 / 3, piece).len() <= 2);
            }
        }
    }
    let mut params = InBandParams::new(&[vec![0x67, 0x42], vec![0x68, 0xce]]);
    for (i, piece) in data.chunks(61).enumerate() {
        assert!(params.before(i as u32 / 4, piece).len() <= 2);
    }
});
