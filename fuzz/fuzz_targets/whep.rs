//! What a WebRTC peer's bytes reach of the relay's own code (ICE, DTLS, SRTP and RTCP are
//! str0m's): an SDP that `proto::whep` matches against a path (the viewer's side) or makes a
//! publisher's tracks of, and RTP payloads of H.264 that `InBandParams` looks into before a
//! viewer gets them. Never a panic; a plan routes each track once and only to a media section
//! of the answer; at most the two parameter sets go before a payload. A simulcast publisher's
//! RIDs (from the answer) and the payloads its encodings are ranked by (H.264's SPS, VP8's key
//! frame header): the ranking names each encoding once, and the choice of one is an index.
//! The far side's answer to the relay's own offers (a WHIP forward, a WHEP pull), and a
//! `Location` it gives.
#![no_main]
use fanout_proto::rtsp::sdp::Sdp;
use fanout_proto::simulcast;
use fanout_proto::whep::{ingest, ingest_pulled, plan, plan_push, publisher_video, InBandParams, WhipUrl};
use libfuzzer_sys::fuzz_target;

const PATH: &str = "v=0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n\
a=fmtp:96 packetization-mode=1;sprop-parameter-sets=Z0LAHg==,aM48gA==\r\n\
m=audio 0 RTP/AVP 97\r\na=rtpmap:97 opus/48000/2\r\n";

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // A WHIP/WHEP endpoint's Location, resolved against its URL.
    let url = WhipUrl::parse("http://u:p@h:8889/cam/whep?token=t").unwrap();
    assert!(url.resource(&text).starts_with("http"));
    if let Ok(answer) = Sdp::parse(&text) {
        let path = Sdp::parse(PATH).unwrap();
        let p = plan(&path, &answer);
        for r in &p.routes {
            assert!(r.track < path.media.len());
            assert!(answer.media.iter().any(|m| m.attr("mid") == Some(r.mid.as_str())));
        }
        // And the far side's answer where the relay offered: to publish (a WHIP forward) or
        // to view (a WHEP pull).
        for r in &plan_push(&path, &answer).routes {
            assert!(r.track < path.media.len());
            assert!(answer.media.iter().any(|m| m.attr("mid") == Some(r.mid.as_str())));
        }
        for i in [ingest(&answer), ingest_pulled(&answer)].into_iter().flatten() {
            assert!(Sdp::parse(&i.sdp).is_ok());
        }
        // As a WHIP publisher's offer: the video codec taken is one of the four, or none.
        assert!(matches!(publisher_video(&answer), None | Some("H264" | "VP8" | "VP9" | "AV1")));
        assert!(simulcast::rids(&answer).iter().all(|r| !r.is_empty() && !r.contains(char::is_whitespace)));
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
    let mut ranking = simulcast::Ranking::new(vec!["a".into(), "b".into(), "c".into()]);
    for (i, piece) in data.chunks(53).enumerate() {
        let codec = if i % 2 == 0 { "H264" } else { "VP8" };
        let _ = simulcast::picture_size(codec, piece);
        ranking.packet(i % 4, codec, piece, i as u64 * 700);
    }
    if let Some(order) = ranking.order() {
        let mut seen = order.to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() == order.len() && order.iter().all(|&k| k < 3));
        let rates: Vec<f64> = order.iter().map(|&k| ranking.bps(k)).collect();
        assert!(simulcast::pick(&rates, data.len() as f64 * 1000.0, data.len() % 4) < rates.len().max(1));
    }
});
