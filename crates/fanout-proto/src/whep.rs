//! WebRTC playback (WHEP, draft-ietf-wish-whep) and publishing (WHIP, RFC 9725): which of a
//! path's tracks a viewer can take, and with which payload type, from the path's
//! description and the SDP answer negotiated with the viewer; what a publisher's answer
//! makes of the path's tracks. The WebRTC stack (ICE, DTLS, SRTP) is `str0m`'s; this is
//! only the matching.

use crate::rtsp::sdp::{Media, Sdp};

/// A track of the path that goes to the viewer: the path's track `track` on the answer's
/// media section `mid` as payload type `pt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub track: usize,
    pub mid: String,
    pub pt: u8,
    pub video: bool,
}

/// What a viewer gets, and what it does not (for the status and the log).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub routes: Vec<Route>,
    /// Why a track of the path is not sent (`"audio is MPEG4-GENERIC: WebRTC takes Opus"`).
    pub left_out: Vec<String>,
}

/// A track's codec as WebRTC names it, where it carries it: H.264 (packetization mode 1)
/// and Opus.
fn webrtc_codec(m: &Media) -> Result<&'static str, String> {
    let format = m.formats.first().map(String::as_str).unwrap_or("");
    let (name, _) = m.rtpmap(format).unwrap_or(("", 0));
    match (m.kind.as_str(), name.to_ascii_uppercase().as_str()) {
        ("video", "H264") => Ok("H264"),
        ("audio", "OPUS") => Ok("OPUS"),
        (kind, "") => Err(format!("{kind} has no rtpmap: not carried over WebRTC here")),
        (kind, n) => Err(format!("{kind} is {n}: WebRTC here carries H264 video and Opus audio")),
    }
}

/// The payload types of `codec` the answer's media section accepts, in its order; for H.264
/// only packetization mode 1 (what the relay's RTP uses: FU-A, STAP-A).
fn answer_pts(m: &Media, codec: &str) -> Vec<u8> {
    m.formats
        .iter()
        .filter(|f| m.rtpmap(f).is_some_and(|(n, _)| n.eq_ignore_ascii_case(codec)))
        .filter(|f| codec != "H264" || fmtp(m, f).is_some_and(|p| p.contains("packetization-mode=1")))
        .filter_map(|f| f.parse().ok())
        .collect()
}

fn fmtp<'a>(m: &'a Media, format: &str) -> Option<&'a str> {
    m.lines.iter().filter(|(t, _)| *t == 'a').find_map(|(_, v)| {
        let (pt, params) = v.strip_prefix("fmtp:")?.split_once(' ')?;
        (pt == format).then_some(params)
    })
}

/// Matches the path's tracks (`path`, as the RTSP face describes them) to the sending media
/// sections of `answer`: each track goes to the first unused section of its kind whose
/// codec it is; a track nothing takes is left out, with the reason.
pub fn plan(path: &Sdp, answer: &Sdp) -> Plan {
    let mut plan = Plan::default();
    let mut used = vec![false; answer.media.len()];
    for (track, m) in path.media.iter().enumerate() {
        let codec = match webrtc_codec(m) {
            Ok(c) => c,
            Err(why) => {
                plan.left_out.push(why);
                continue;
            }
        };
        let found = answer.media.iter().enumerate().find_map(|(i, a)| {
            let sends = a.attr("sendonly").is_some() || a.attr("sendrecv").is_some();
            let mid = a.attr("mid")?;
            let pt = *answer_pts(a, codec).first()?;
            (!used[i] && a.kind == m.kind && sends).then(|| (i, mid.to_string(), pt))
        });
        match found {
            Some((i, mid, pt)) => {
                used[i] = true;
                plan.routes.push(Route { track, mid, pt, video: m.kind == "video" });
            }
            None => plan.left_out.push(format!("{} ({codec}): the viewer's offer takes none", m.kind)),
        }
    }
    plan
}

/// What a WHIP publisher's negotiated answer makes of the path: its description (a video
/// track of H.264, an audio track of Opus, as the answer took them) and which incoming
/// payload type feeds which track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingest {
    pub sdp: String,
    /// (payload type, track)
    pub pts: Vec<(u8, usize)>,
}

/// The publisher's tracks from `answer`: each receiving media section with H.264 (mode 1)
/// or Opus becomes a track, in order; `None` when there is none.
pub fn ingest(answer: &Sdp) -> Option<Ingest> {
    let mut sdp = String::from("v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\ns=WHIP publisher\r\nt=0 0\r\n");
    let mut pts = Vec::new();
    for m in &answer.media {
        let receives = m.attr("recvonly").is_some() || m.attr("sendrecv").is_some();
        let (codec, line) = match m.kind.as_str() {
            "video" => ("H264", "H264/90000\r\na=fmtp:96 packetization-mode=1"),
            "audio" => ("OPUS", "opus/48000/2"),
            _ => continue,
        };
        let taken = answer_pts(m, codec);
        if !receives || taken.is_empty() {
            continue;
        }
        let track = pts.iter().map(|(_, t)| *t + 1).max().unwrap_or(0);
        let pt = 96 + track;
        sdp +=
            &format!("m={} 0 RTP/AVP {pt}\r\na=rtpmap:{pt} {}\r\n", m.kind, line.replace(":96 ", &format!(":{pt} ")));
        pts.extend(taken.into_iter().map(|p| (p, track)));
    }
    (!pts.is_empty()).then_some(Ingest { sdp, pts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PATH: &str = "v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n\
        a=fmtp:96 packetization-mode=1;profile-level-id=64001f\r\n\
        m=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\n";

    /// An answer as str0m writes it to Chromium's offer of one video transceiver.
    const ANSWER: &str = "v=0\r\no=- 1 2 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n\
        m=video 9 UDP/TLS/RTP/SAVPF 104 102 108\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendonly\r\n\
        a=rtpmap:104 H264/90000\r\na=fmtp:104 packetization-mode=0;profile-level-id=42001f\r\n\
        a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1;profile-level-id=42001f\r\n\
        a=rtpmap:108 H264/90000\r\na=fmtp:108 packetization-mode=1;profile-level-id=42e01f\r\n";

    #[test]
    fn h264_goes_as_the_first_mode_1_type_and_aac_is_left_out_with_the_reason() {
        let plan = plan(&Sdp::parse(PATH).unwrap(), &Sdp::parse(ANSWER).unwrap());
        assert_eq!(plan.routes, vec![Route { track: 0, mid: "0".into(), pt: 102, video: true }]);
        assert_eq!(plan.left_out, vec!["audio is MPEG4-GENERIC: WebRTC here carries H264 video and Opus audio"]);
    }

    #[test]
    fn opus_goes_to_an_audio_section_and_a_recvonly_section_takes_nothing() {
        let path = "v=0\r\ns=x\r\nm=audio 0 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n\
            m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n";
        let answer = "v=0\r\ns=-\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:a\r\na=sendonly\r\n\
            a=rtpmap:111 opus/48000/2\r\nm=video 9 UDP/TLS/RTP/SAVPF 102\r\na=mid:v\r\na=recvonly\r\n\
            a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\n";
        let plan = plan(&Sdp::parse(path).unwrap(), &Sdp::parse(answer).unwrap());
        assert_eq!(plan.routes, vec![Route { track: 0, mid: "a".into(), pt: 111, video: false }]);
        assert_eq!(plan.left_out, vec!["video (H264): the viewer's offer takes none"]);
    }

    /// Chromium publishing a canvas (H.264) and a microphone (Opus), as str0m answers it:
    /// a video and an audio track; every H.264 mode-1 type feeds the video, Opus the audio.
    #[test]
    fn a_whip_answer_makes_h264_and_opus_tracks() {
        let answer = "v=0\r\ns=-\r\nm=video 9 UDP/TLS/RTP/SAVPF 102 108\r\na=mid:0\r\na=recvonly\r\n\
            a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1;profile-level-id=42001f\r\n\
            a=rtpmap:108 H264/90000\r\na=fmtp:108 packetization-mode=1;profile-level-id=42e01f\r\n\
            m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:1\r\na=recvonly\r\na=rtpmap:111 opus/48000/2\r\n";
        let got = ingest(&Sdp::parse(answer).unwrap()).unwrap();
        assert_eq!(got.pts, vec![(102, 0), (108, 0), (111, 1)]);
        let sdp = Sdp::parse(&got.sdp).unwrap();
        assert_eq!(sdp.media.len(), 2);
        assert_eq!(sdp.media[0].rtpmap("96"), Some(("H264", 90_000)));
        assert!(got.sdp.contains("a=fmtp:96 packetization-mode=1"), "{}", got.sdp);
        assert_eq!(sdp.media[1].rtpmap("97"), Some(("opus", 48_000)));
        // A section that only sends (a viewer's) makes no track.
        assert_eq!(ingest(&Sdp::parse(&answer.replace("recvonly", "sendonly")).unwrap()), None);
    }

    proptest! {
        /// Any pair of descriptions: every route names a track and a section that exist,
        /// each section at most once; every track is routed or has a reason.
        #[test]
        fn any_descriptions_make_a_consistent_plan(
            path in proptest::collection::vec(("(video|audio)", "(H264|opus|PCMU|H265)", 96u8..128), 0..4),
            answer in proptest::collection::vec(("(video|audio)", "(H264|opus)", 96u8..128, any::<bool>(), any::<bool>()), 0..4),
        ) {
            let mut p = String::from("v=0\r\n");
            for (kind, codec, pt) in &path {
                p += &format!("m={kind} 0 RTP/AVP {pt}\r\na=rtpmap:{pt} {codec}/90000\r\n");
            }
            let mut a = String::from("v=0\r\n");
            for (i, (kind, codec, pt, send, mode1)) in answer.iter().enumerate() {
                let dir = if *send { "sendonly" } else { "recvonly" };
                a += &format!("m={kind} 9 UDP/TLS/RTP/SAVPF {pt}\r\na=mid:{i}\r\na={dir}\r\na=rtpmap:{pt} {codec}/90000\r\n");
                a += &format!("a=fmtp:{pt} packetization-mode={}\r\n", u8::from(*mode1));
            }
            let (ps, asdp) = (Sdp::parse(&p).unwrap(), Sdp::parse(&a).unwrap());
            let plan = plan(&ps, &asdp);
            prop_assert_eq!(plan.routes.len() + plan.left_out.len(), ps.media.len());
            let mut mids: Vec<&str> = plan.routes.iter().map(|r| r.mid.as_str()).collect();
            mids.sort_unstable();
            mids.dedup();
            prop_assert_eq!(mids.len(), plan.routes.len());
            for r in &plan.routes {
                prop_assert!(r.track < ps.media.len());
                let m = asdp.media.iter().find(|m| m.attr("mid") == Some(r.mid.as_str())).unwrap();
                prop_assert_eq!(&m.kind, &ps.media[r.track].kind);
            }
        }
    }
}
