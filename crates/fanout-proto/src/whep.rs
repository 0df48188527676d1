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
    /// H.264's parameter sets from the path's description (`sprop-parameter-sets`), for
    /// [`InBandParams`].
    pub params: Vec<Vec<u8>>,
}

/// What a viewer gets, and what it does not (for the status and the log).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub routes: Vec<Route>,
    /// Why a track of the path is not sent (`"audio is MPEG4-GENERIC: WebRTC takes Opus"`).
    pub left_out: Vec<String>,
}

/// A format's encoding name: its rtpmap's, or for the static payload types of G.711 (RFC
/// 3551: 0 PCMU, 8 PCMA, 8 kHz) that many cameras send without one, theirs.
pub fn encoding<'a>(m: &'a Media, format: &str) -> Option<&'a str> {
    match (m.rtpmap(format), format) {
        (Some((name, _)), _) => Some(name),
        (None, "0") => Some("PCMU"),
        (None, "8") => Some("PCMA"),
        _ => None,
    }
}

/// A track's codec as WebRTC names it, where it carries it: H.264 (packetization mode 1),
/// H.265 (to viewers whose offer has it: Safari, Chrome with a hardware decoder, pion), VP8
/// and VP9 (every browser), AV1 (Chromium, Firefox, Safari with a decoder for it), Opus, and
/// G.711 (PCMU, PCMA: browsers take it, and many cameras' audio is G.711).
pub fn webrtc_codec(m: &Media) -> Result<&'static str, crate::Invalid> {
    let format = m.formats.first().map(String::as_str).unwrap_or("");
    let name = encoding(m, format).unwrap_or("");
    match (m.kind.as_str(), name.to_ascii_uppercase().as_str()) {
        ("video", "H264") => Ok("H264"),
        ("video", "H265") => Ok("H265"),
        ("video", "VP8") => Ok("VP8"),
        ("video", "VP9") => Ok("VP9"),
        ("video", "AV1") => Ok("AV1"),
        ("audio", "OPUS") => Ok("OPUS"),
        ("audio", "PCMU") => Ok("PCMU"),
        ("audio", "PCMA") => Ok("PCMA"),
        (kind, "") => Err(format!("{kind} has no rtpmap: not carried over WebRTC here").into()),
        (kind, n) => {
            Err(format!("{kind} is {n}: WebRTC here carries H264, H265, VP8, VP9 or AV1 video and Opus or G.711 audio")
                .into())
        }
    }
}

/// The payload types of `codec` the answer's media section accepts, in its order; for H.264
/// only packetization mode 1 (what the relay's RTP uses: FU-A, STAP-A); for VP9 only the
/// path's profile (`vp9`, RFC 9628's `profile-id`: a decoder of profile 2 expects 10 bits).
fn answer_pts(m: &Media, codec: &str, vp9: &str) -> Vec<u8> {
    m.formats
        .iter()
        .filter(|f| encoding(m, f).is_some_and(|n| n.eq_ignore_ascii_case(codec)))
        .filter(|f| codec != "H264" || fmtp(m, f).is_some_and(|p| p.contains("packetization-mode=1")))
        .filter(|f| codec != "VP9" || vp9_profile_of(m, f) == vp9)
        .filter_map(|f| f.parse().ok())
        .collect()
}

/// A track's VP9 profile (`profile-id` of its first format's fmtp; 0 where it names none).
fn vp9_profile(m: &Media) -> &str {
    m.formats.first().map_or("0", |f| vp9_profile_of(m, f))
}

fn vp9_profile_of<'a>(m: &'a Media, format: &str) -> &'a str {
    let params = fmtp(m, format).unwrap_or("");
    params.split(';').find_map(|p| p.trim().strip_prefix("profile-id=")).unwrap_or("0")
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
    plan_where(path, answer, |a| a.attr("sendonly").is_some() || a.attr("sendrecv").is_some())
}

/// As [`plan`], where the relay offered and publishes (a WHIP push, `forward`): `answer` is
/// the far side's, whose sections receive.
pub fn plan_push(path: &Sdp, answer: &Sdp) -> Plan {
    plan_where(path, answer, |a| a.attr("recvonly").is_some() || a.attr("sendrecv").is_some())
}

fn plan_where(path: &Sdp, answer: &Sdp, takes: impl Fn(&Media) -> bool) -> Plan {
    let mut plan = Plan::default();
    let mut used = vec![false; answer.media.len()];
    for (track, m) in path.media.iter().enumerate() {
        let codec = match webrtc_codec(m) {
            Ok(c) => c,
            Err(why) => {
                plan.left_out.push(why.0);
                continue;
            }
        };
        let found = answer.media.iter().enumerate().find_map(|(i, a)| {
            let sends = takes(a);
            let mid = a.attr("mid")?;
            let pt = *answer_pts(a, codec, vp9_profile(m)).first()?;
            (!used[i] && a.kind == m.kind && sends).then(|| (i, mid.to_string(), pt))
        });
        match found {
            Some((i, mid, pt)) => {
                used[i] = true;
                // (H.264's parameter sets go in band where they are missing: `InBandParams`.)
                let params = match crate::container::repack::TrackInfo::from_sdp(m).map(|t| t.codec) {
                    Ok(crate::container::repack::TrackCodec::Video { params, .. }) if codec == "H264" => params,
                    _ => Vec::new(),
                };
                plan.routes.push(Route { track, mid, pt, video: m.kind == "video", params });
            }
            None => plan.left_out.push(format!("{} ({codec}): the viewer's offer takes none", m.kind)),
        }
    }
    plan
}

/// H.264 parameter sets in band for a WebRTC viewer. Many RTSP publishers (ffmpeg with
/// libx264 among them) give the SPS and PPS only in the SDP, which a WebRTC viewer never
/// sees, and a browser decodes nothing without them. Before the first packet of a keyframe
/// (an IDR slice) that came without them, the viewer gets them as RTP payloads of their own,
/// at the keyframe's time. Ones the stream carries replace those of the SDP.
#[derive(Debug, Clone, Default)]
pub struct InBandParams {
    sps: Option<Vec<u8>>,
    pps: Option<Vec<u8>>,
    /// The RTP time of the last frame that had them.
    had_at: Option<u32>,
}

impl InBandParams {
    pub fn new(params: &[Vec<u8>]) -> Self {
        let find = |t: u8| params.iter().find(|n| n.first().is_some_and(|b| b & 0x1f == t)).cloned();
        Self { sps: find(7), pps: find(8), had_at: None }
    }

    /// What to send before `payload`, an H.264 RTP payload (RFC 6184) of time `ts`: the SPS
    /// and PPS, or nothing.
    pub fn before(&mut self, ts: u32, payload: &[u8]) -> Vec<Vec<u8>> {
        let mut idr_starts = false;
        for nal in nal_units(payload) {
            match nal.first().map(|b| b & 0x1f) {
                Some(7) => {
                    if self.sps.as_deref() != Some(nal) {
                        self.sps = Some(nal.to_vec());
                    }
                    self.had_at = Some(ts);
                }
                Some(8) if self.pps.as_deref() != Some(nal) => self.pps = Some(nal.to_vec()),
                Some(5) => idr_starts = true,
                _ => {}
            }
        }
        // An FU-A's first fragment of an IDR slice.
        if payload.len() >= 2 && payload[0] & 0x1f == 28 && payload[1] & 0x80 != 0 && payload[1] & 0x1f == 5 {
            idr_starts = true;
        }
        match (&self.sps, &self.pps) {
            (Some(sps), Some(pps)) if idr_starts && self.had_at != Some(ts) => {
                self.had_at = Some(ts);
                vec![sps.clone(), pps.clone()]
            }
            _ => Vec::new(),
        }
    }
}

/// The whole NAL units of an H.264 RTP payload: itself (types 1–23) or those a STAP-A
/// (24) aggregates; none for fragments and others. An iterator: this runs for every
/// packet of every viewer, and allocates nothing.
pub(crate) fn nal_units(payload: &[u8]) -> impl Iterator<Item = &[u8]> {
    let (mut rest, single) = match payload.first().map(|b| b & 0x1f) {
        Some(1..=23) => (&[][..], Some(payload)),
        Some(24) => (&payload[1..], None),
        _ => (&[][..], None),
    };
    single.into_iter().chain(std::iter::from_fn(move || {
        let n = usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?]));
        let nal = rest.get(2..2 + n)?;
        rest = &rest[2 + n..];
        Some(nal)
    }))
}

/// What a WHIP publisher's negotiated answer makes of the path: its description (a video
/// track of H.264, VP8, VP9 or AV1, an audio track of Opus, as the answer took them) and
/// which incoming payload type feeds which track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingest {
    pub sdp: String,
    /// (payload type, track)
    pub pts: Vec<(u8, usize)>,
}

/// The video codecs the relay takes from a WHIP publisher, in its preference: H.264
/// (packetization mode 1: what every face can carry), then VP8, VP9 and AV1, whose
/// keyframes the ring also finds.
pub const PUBLISHED_VIDEO: [&str; 4] = ["H264", "VP8", "VP9", "AV1"];

/// The video codec the relay takes from a WHIP publisher's `offer`: the first of
/// [`PUBLISHED_VIDEO`] it offers; `None` where it offers none of them.
pub fn publisher_video(offer: &Sdp) -> Option<&'static str> {
    let video: Vec<&Media> = offer.media.iter().filter(|m| m.kind == "video").collect();
    PUBLISHED_VIDEO.into_iter().find(|c| video.iter().any(|m| !answer_pts(m, c, vp9_profile(m)).is_empty()))
}

/// The publisher's tracks from `answer`: each receiving media section with video of
/// [`PUBLISHED_VIDEO`] (the first of them it has), or Opus, becomes a track, in order; `None`
/// when there is none.
pub fn ingest(answer: &Sdp) -> Option<Ingest> {
    ingest_where(answer, "WHIP publisher", |m| m.attr("recvonly").is_some() || m.attr("sendrecv").is_some())
}

/// As [`ingest`], where the relay offered to receive (a WHEP pull, source `whep`): `answer`
/// is the far side's, whose sections send.
pub fn ingest_pulled(answer: &Sdp) -> Option<Ingest> {
    ingest_where(answer, "WHEP pull", |m| m.attr("sendonly").is_some() || m.attr("sendrecv").is_some())
}

fn ingest_where(answer: &Sdp, name: &str, takes: impl Fn(&Media) -> bool) -> Option<Ingest> {
    let mut sdp = format!("v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\ns={name}\r\nt=0 0\r\n");
    let mut pts = Vec::new();
    for m in &answer.media {
        let receives = takes(m);
        let profile = vp9_profile(m);
        let vp9 = format!("VP9/90000\r\na=fmtp:96 profile-id={profile}");
        let (codec, line) = match m.kind.as_str() {
            "video" => match PUBLISHED_VIDEO.into_iter().find(|c| !answer_pts(m, c, profile).is_empty()) {
                Some("VP8") => ("VP8", "VP8/90000"),
                Some("VP9") => ("VP9", vp9.as_str()),
                Some("AV1") => ("AV1", "AV1/90000"),
                _ => ("H264", "H264/90000\r\na=fmtp:96 packetization-mode=1"),
            },
            "audio" => ("OPUS", "opus/48000/2"),
            _ => continue,
        };
        let taken = answer_pts(m, codec, profile);
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

/// A WHIP endpoint the relay publishes to (`forward`): `http[s]://[USER:PASS@]HOST[:PORT]/…`.
/// Credentials go as HTTP Basic (MediaMTX's way), a `?token=` query stays in the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhipUrl {
    /// The URL as requested: no credentials.
    pub url: String,
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// `Authorization` for the POST and DELETE, from the credentials.
    pub authorization: Option<String>,
}

impl WhipUrl {
    pub fn parse(s: &str) -> Result<Self, crate::Invalid> {
        let (tls, rest) = match (s.strip_prefix("http://"), s.strip_prefix("https://")) {
            (Some(r), _) => (false, r),
            (_, Some(r)) => (true, r),
            _ => return Err(format!("{s:?} is not an http:// or https:// URL").into()),
        };
        let (authority, path) = rest.find(['/', '?']).map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
        let (creds, hostport) = authority.rsplit_once('@').map_or((None, authority), |(c, h)| (Some(c), h));
        let (host, port) = match hostport.strip_prefix('[') {
            Some(v6) => {
                let (h, after) = v6.split_once(']').ok_or("unclosed [ in the URL's host")?;
                (h, after.strip_prefix(':'))
            }
            None => hostport.rsplit_once(':').map_or((hostport, None), |(h, p)| (h, Some(p))),
        };
        if host.is_empty() {
            return Err(format!("{s:?} has no host").into());
        }
        let port = match port {
            Some(p) => p.parse().ok().filter(|p| *p != 0).ok_or_else(|| format!("bad port {p:?} in a WHIP URL"))?,
            None if tls => 443,
            None => 80,
        };
        let authorization = creds.map(|c| {
            use base64::Engine as _;
            let (u, p) = c.split_once(':').unwrap_or((c, ""));
            let plain =
                format!("{}:{}", crate::rtsp::client::percent_decode(u), crate::rtsp::client::percent_decode(p));
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(plain))
        });
        let shown_host = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
        let url = format!("{}://{shown_host}:{port}{path}", if tls { "https" } else { "http" });
        Ok(Self { url, tls, host: host.to_string(), port, authorization })
    }

    /// As logs and the API show it: no credentials, no query (a token).
    pub fn shown(&self) -> String {
        self.url.split('?').next().unwrap_or_default().to_string()
    }

    /// The resource the server's `Location` names, resolved against the endpoint.
    pub fn resource(&self, location: &str) -> String {
        if location.starts_with("http://") || location.starts_with("https://") {
            return location.to_string();
        }
        let origin_end = self.url.find("://").map_or(0, |i| i + 3);
        let origin = &self.url[..self.url[origin_end..].find('/').map_or(self.url.len(), |i| origin_end + i)];
        if location.starts_with('/') {
            return format!("{origin}{location}");
        }
        let base = self.url.split('?').next().unwrap_or_default();
        format!("{}/{location}", &base[..base.rfind('/').unwrap_or(base.len())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn whip_urls() {
        let u = WhipUrl::parse("http://u:p%40ss@127.0.0.1:8889/cam/whip?token=t").unwrap();
        assert_eq!((u.url.as_str(), u.port, u.tls), ("http://127.0.0.1:8889/cam/whip?token=t", 8889, false));
        assert_eq!(u.authorization.as_deref(), Some("Basic dTpwQHNz"));
        assert_eq!(u.shown(), "http://127.0.0.1:8889/cam/whip");
        assert_eq!(u.resource("/cam/whip/abc"), "http://127.0.0.1:8889/cam/whip/abc");
        assert_eq!(u.resource("abc"), "http://127.0.0.1:8889/cam/abc");
        assert_eq!(u.resource("https://o/x"), "https://o/x");
        let u = WhipUrl::parse("https://[::1]/w").unwrap();
        assert_eq!((u.url.as_str(), u.host.as_str(), u.authorization), ("https://[::1]:443/w", "::1", None));
        for bad in ["rtmp://h/x", "http:///x", "http://h:0/x", "http://h:x/x", "https://[::1/x"] {
            assert!(WhipUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_pull_takes_the_answers_sending_sections_and_not_g711() {
        // As MediaMTX answers a viewer of H.264 with no audio it sends: its PCMU silence.
        let answer = "v=0\r\ns=-\r\nm=video 9 UDP/TLS/RTP/SAVPF 108\r\na=mid:0\r\na=sendonly\r\n\
            a=rtpmap:108 H264/90000\r\na=fmtp:108 packetization-mode=1;profile-level-id=42e01f\r\n\
            m=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:1\r\na=sendonly\r\na=rtpmap:0 PCMU/8000\r\n";
        let i = ingest_pulled(&Sdp::parse(answer).unwrap()).unwrap();
        assert_eq!(i.pts, vec![(108, 0)]);
        assert!(i.sdp.contains("m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000"), "{}", i.sdp);
        assert!(!i.sdp.contains("m=audio"), "{}", i.sdp);
        // A publisher's ingest of the same answer takes nothing: its sections send.
        assert_eq!(ingest(&Sdp::parse(answer).unwrap()), None);
    }

    #[test]
    fn a_push_goes_to_the_answers_receiving_sections() {
        let path = "v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n\
            m=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\n\
            m=audio 0 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n";
        let answer = "v=0\r\ns=-\r\nm=video 9 UDP/TLS/RTP/SAVPF 102\r\na=mid:0\r\na=recvonly\r\n\
            a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\n\
            m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:1\r\na=recvonly\r\na=rtpmap:111 opus/48000/2\r\n";
        let (path, answer) = (Sdp::parse(path).unwrap(), Sdp::parse(answer).unwrap());
        let p = plan_push(&path, &answer);
        let routes: Vec<_> = p.routes.iter().map(|r| (r.track, r.mid.as_str(), r.pt)).collect();
        assert_eq!(routes, vec![(0, "0", 102), (2, "1", 111)]);
        assert_eq!(p.left_out.len(), 1, "AAC: {:?}", p.left_out);
        // A viewer's plan of the same answer sends nothing: its sections receive.
        assert!(plan(&path, &answer).routes.is_empty());
    }

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
        assert_eq!(plan.routes, vec![Route { track: 0, mid: "0".into(), pt: 102, video: true, params: vec![] }]);
        assert_eq!(
            plan.left_out,
            vec![
                "audio is MPEG4-GENERIC: WebRTC here carries H264, H265, VP8, VP9 or AV1 video and Opus or G.711 audio"
            ]
        );
    }

    #[test]
    fn opus_goes_to_an_audio_section_and_a_recvonly_section_takes_nothing() {
        let path = "v=0\r\ns=x\r\nm=audio 0 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n\
            m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n";
        let answer = "v=0\r\ns=-\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:a\r\na=sendonly\r\n\
            a=rtpmap:111 opus/48000/2\r\nm=video 9 UDP/TLS/RTP/SAVPF 102\r\na=mid:v\r\na=recvonly\r\n\
            a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\n";
        let plan = plan(&Sdp::parse(path).unwrap(), &Sdp::parse(answer).unwrap());
        assert_eq!(plan.routes, vec![Route { track: 0, mid: "a".into(), pt: 111, video: false, params: vec![] }]);
        assert_eq!(plan.left_out, vec!["video (H264): the viewer's offer takes none"]);
    }

    /// Chromium publishing a canvas (H.264) and a microphone (Opus), as str0m answers it:
    /// a video and an audio track; every H.264 mode-1 type feeds the video, Opus the audio.
    #[test]
    fn h265_goes_to_a_viewer_whose_offer_has_it_and_is_left_out_with_the_reason_otherwise() {
        let path = Sdp::parse(
            "v=0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H265/90000\r\n\
             a=fmtp:96 sprop-vps=QAEMAf//AWAAAAMAkAAAAwAAAwA8lZgJ;sprop-sps=QgEBAWAAAAMAkAAAAwAAAwA8oAoIDxZZWUpMkyvAWoCAgKAQ;sprop-pps=RAHBcvCUTA==\r\n",
        )
        .unwrap();
        let with = Sdp::parse(
            "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 102 116\r\na=mid:0\r\na=sendonly\r\n\
             a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\na=rtpmap:116 H265/90000\r\n",
        )
        .unwrap();
        let plan = plan(&path, &with);
        assert_eq!(plan.routes.len(), 1, "{:?}", plan.left_out);
        assert_eq!((plan.routes[0].pt, plan.routes[0].video), (116, true));
        assert!(plan.routes[0].params.is_empty(), "H.264's in-band parameter sets are not H.265's");
        let without = Sdp::parse(
            "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 102\r\na=mid:0\r\na=sendonly\r\n\
             a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\n",
        )
        .unwrap();
        assert_eq!(super::plan(&path, &without).left_out, vec!["video (H265): the viewer's offer takes none"]);
    }

    /// VP8 and VP9 as ffmpeg's RTSP publisher describes them, to a Chromium-like answer that
    /// takes VP9 in profiles 0 and 2: each goes to its own codec, VP9 in the path's profile.
    #[test]
    fn vp8_and_vp9_go_to_their_codecs_and_vp9_keeps_its_profile() {
        let answer_text = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96 98 100 102\r\na=mid:0\r\na=sendonly\r\n\
             a=rtpmap:96 VP8/90000\r\na=rtpmap:98 VP9/90000\r\na=fmtp:98 profile-id=2\r\n\
             a=rtpmap:100 VP9/90000\r\na=fmtp:100 profile-id=0\r\n\
             a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\n";
        let answer = Sdp::parse(answer_text).unwrap();
        let route = |path: &str| {
            let p = plan(&Sdp::parse(path).unwrap(), &answer);
            assert!(p.left_out.is_empty(), "{:?}", p.left_out);
            p.routes[0].pt
        };
        assert_eq!(route("v=0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 VP8/90000\r\n"), 96);
        assert_eq!(route("v=0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 VP9/90000\r\n"), 100);
        assert_eq!(route("v=0\r\nm=video 0 RTP/AVP 97\r\na=rtpmap:97 VP9/90000\r\na=fmtp:97 profile-id=2\r\n"), 98);
        // An AV1 path to a viewer whose answer has no AV1: left out, with the reason.
        let av1 = plan(&Sdp::parse("v=0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 AV1/90000\r\n").unwrap(), &answer);
        assert_eq!(av1.left_out, vec!["video (AV1): the viewer's offer takes none"]);
        let with_av1 =
            Sdp::parse(&format!("{}a=rtpmap:45 AV1/90000\r\n", answer_text.replace(" 102\r\n", " 102 45\r\n")))
                .unwrap();
        let p = plan(&Sdp::parse("v=0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 AV1/90000\r\n").unwrap(), &with_av1);
        assert_eq!(p.routes[0].pt, 45);
    }

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

    #[test]
    fn a_whip_publisher_without_h264_publishes_vp8_or_vp9() {
        // Chromium's offer order (VP8, VP9 profiles 0 and 2, H.264): H.264 is taken.
        let offer = "v=0\r\ns=-\r\nm=video 9 UDP/TLS/RTP/SAVPF 96 98 100 102\r\na=sendonly\r\n\
            a=rtpmap:96 VP8/90000\r\na=rtpmap:98 VP9/90000\r\na=fmtp:98 profile-id=0\r\n\
            a=rtpmap:100 VP9/90000\r\na=fmtp:100 profile-id=2\r\n\
            a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\n";
        assert_eq!(publisher_video(&Sdp::parse(offer).unwrap()), Some("H264"));
        let no_h264 = offer.replace("a=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\n", "");
        assert_eq!(publisher_video(&Sdp::parse(&no_h264).unwrap()), Some("VP8"));
        let vp9 = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 98\r\na=rtpmap:98 VP9/90000\r\na=fmtp:98 profile-id=0\r\n";
        assert_eq!(publisher_video(&Sdp::parse(vp9).unwrap()), Some("VP9"));
        let av1 = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 45\r\na=rtpmap:45 AV1/90000\r\n";
        assert_eq!(publisher_video(&Sdp::parse(av1).unwrap()), Some("AV1"));
        let h263 = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 34\r\na=rtpmap:34 H263/90000\r\n";
        assert_eq!(publisher_video(&Sdp::parse(h263).unwrap()), None);
        // The answer to it (VP9 only) makes a VP9 track of the answer's profile.
        let answer = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 98\r\na=recvonly\r\na=rtpmap:98 VP9/90000\r\n\
            a=fmtp:98 profile-id=0\r\n";
        let got = ingest(&Sdp::parse(answer).unwrap()).unwrap();
        assert_eq!(got.pts, vec![(98, 0)]);
        assert!(got.sdp.contains("a=rtpmap:96 VP9/90000\r\na=fmtp:96 profile-id=0"), "{}", got.sdp);
        let vp8 = ingest(&Sdp::parse(&answer.replace("VP9", "VP8")).unwrap()).unwrap();
        assert!(vp8.sdp.contains("a=rtpmap:96 VP8/90000\r\n"), "{}", vp8.sdp);
        let av1 = ingest(&Sdp::parse(&answer.replace("VP9", "AV1")).unwrap()).unwrap();
        assert!(av1.sdp.contains("a=rtpmap:96 AV1/90000\r\n"), "{}", av1.sdp);
    }

    #[test]
    fn parameter_sets_go_before_a_keyframe_that_lacks_them() {
        let (sps, pps) = (vec![0x67, 0x42, 0xc0, 0x1e], vec![0x68, 0xce, 0x3c, 0x80]);
        let mut p = InBandParams::new(&[sps.clone(), pps.clone()]);
        // A P slice: nothing; an IDR slice's first FU-A fragment: the SPS and PPS, once.
        assert!(p.before(0, &[0x41, 0x9a]).is_empty());
        assert_eq!(p.before(3000, &[0x7c, 0x85, 0x88]), vec![sps.clone(), pps.clone()]);
        assert!(p.before(3000, &[0x7c, 0x05, 0x88]).is_empty(), "a later fragment");
        assert!(p.before(3000, &[0x65, 0x88]).is_empty(), "another slice of that keyframe");
        // A keyframe with its own (new) ones in a STAP-A: they are kept, nothing added.
        let new_sps = vec![0x67, 0x64, 0x00, 0x1f];
        let mut stap = vec![0x78, 0, 4];
        stap.extend(&new_sps);
        stap.extend([0, 4]);
        stap.extend(&pps);
        assert!(p.before(6000, &stap).is_empty());
        assert!(p.before(6000, &[0x65, 0x88]).is_empty());
        // The next keyframe without them gets the stream's.
        assert_eq!(p.before(9000, &[0x65, 0x88]), vec![new_sps, pps]);
        // Nothing known: nothing sent.
        assert!(InBandParams::new(&[]).before(0, &[0x65, 0x88]).is_empty());
    }

    #[test]
    fn g711_goes_to_a_section_that_takes_it_even_without_an_rtpmap() {
        // A camera's PCMU on static payload type 0, no rtpmap line; the answer takes PCMU.
        let path = Sdp::parse("v=0\r\nm=audio 0 RTP/AVP 0\r\n").unwrap();
        let answer = Sdp::parse("v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\na=mid:1\r\na=sendonly\r\na=rtpmap:111 opus/48000/2\r\na=rtpmap:0 PCMU/8000\r\n").unwrap();
        let p = plan(&path, &answer);
        assert_eq!(p.routes.len(), 1, "{p:?}");
        assert_eq!((p.routes[0].pt, p.routes[0].mid.as_str(), p.routes[0].video), (0, "1", false));
        // PCMA where the answer has only Opus: left out, with the reason.
        let path = Sdp::parse("v=0\r\nm=audio 0 RTP/AVP 8\r\n").unwrap();
        let answer = Sdp::parse(
            "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:1\r\na=sendonly\r\na=rtpmap:111 opus/48000/2\r\n",
        )
        .unwrap();
        let p = plan(&path, &answer);
        assert!(p.routes.is_empty() && p.left_out[0].contains("PCMA"), "{p:?}");
    }

    #[test]
    fn a_route_carries_the_paths_parameter_sets() {
        let path = Sdp::parse("v=0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1;sprop-parameter-sets=Z0LAHg==,aM48gA==\r\n").unwrap();
        let answer = Sdp::parse("v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 102\r\na=mid:0\r\na=sendonly\r\na=rtpmap:102 H264/90000\r\na=fmtp:102 packetization-mode=1\r\n").unwrap();
        let routes = plan(&path, &answer).routes;
        assert_eq!(routes[0].params, vec![vec![0x67, 0x42, 0xc0, 0x1e], vec![0x68, 0xce, 0x3c, 0x80]]);
    }

    proptest! {
        /// Any payload: no panic, and never more than the two parameter sets.
        #[test]
        fn in_band_params_take_any_payload(ts: u32, payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut p = InBandParams::new(&[vec![0x67, 1], vec![0x68, 2]]);
            prop_assert!(p.before(ts, &payload).len() <= 2);
        }

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
