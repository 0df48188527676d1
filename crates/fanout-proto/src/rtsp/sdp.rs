//! SDP (RFC 8866) as an RTSP proxy needs it, sans-IO: parse an upstream's session
//! description into its session part and media sections, and write the proxy's own, with
//! the control URLs its clients will SETUP (`trackID=N`, relative to `Content-Base`).
//!
//! Lines are kept as they came (type, value) so attributes the proxy does not understand
//! (`fmtp`, `framerate`, ...) reach the clients unchanged.

use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SdpError {
    #[error("line {0}: not `x=value`")]
    BadLine(usize),
    #[error("line {0}: bad m= line")]
    BadMedia(usize),
    #[error("no v= line first")]
    NoVersion,
    #[error("more than {0} lines")]
    TooLong(usize),
}

/// One `m=` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Media {
    /// `video`, `audio`, `application`, ...
    pub kind: String,
    pub port: u16,
    pub proto: String,
    pub formats: Vec<String>,
    /// The section's lines after `m=`, in order.
    pub lines: Vec<(char, String)>,
}

impl Media {
    /// Value of the first `a=name:value` (or flag `a=name`, as "").
    pub fn attr(&self, name: &str) -> Option<&str> {
        attr(&self.lines, name)
    }

    /// The `rtpmap` encoding of a format: `("H264", 90000)`.
    pub fn rtpmap(&self, format: &str) -> Option<(&str, u32)> {
        self.lines.iter().filter(|(t, _)| *t == 'a').find_map(|(_, v)| {
            let rest = v.strip_prefix("rtpmap:")?;
            let (pt, enc) = rest.split_once(' ')?;
            if pt.trim() != format {
                return None;
            }
            let mut it = enc.trim().split('/');
            Some((it.next()?, it.next()?.parse().ok()?))
        })
    }
}

/// A session description: the session-level lines and the media sections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sdp {
    pub session: Vec<(char, String)>,
    pub media: Vec<Media>,
}

fn attr<'a>(lines: &'a [(char, String)], name: &str) -> Option<&'a str> {
    lines.iter().filter(|(t, _)| *t == 'a').find_map(|(_, v)| match v.split_once(':') {
        Some((n, val)) if n == name => Some(val),
        None if v == name => Some(""),
        _ => None,
    })
}

/// Lines an SDP may have before we stop reading (a description is a few dozen).
pub const MAX_LINES: usize = 512;

impl Sdp {
    pub fn parse(text: &str) -> Result<Self, SdpError> {
        let mut session = Vec::new();
        let mut media: Vec<Media> = Vec::new();
        let lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).filter(|l| !l.trim().is_empty());
        for (i, line) in lines.enumerate() {
            if i >= MAX_LINES {
                return Err(SdpError::TooLong(MAX_LINES));
            }
            let mut chars = line.chars();
            let (Some(t), Some('=')) = (chars.next(), chars.next()) else { return Err(SdpError::BadLine(i + 1)) };
            if !t.is_ascii_lowercase() {
                return Err(SdpError::BadLine(i + 1));
            }
            let value = chars.as_str().to_string();
            if i == 0 && t != 'v' {
                return Err(SdpError::NoVersion);
            }
            if t == 'm' {
                let mut f = value.split_whitespace();
                let kind = f.next().ok_or(SdpError::BadMedia(i + 1))?.to_string();
                let port = f.next().and_then(|p| p.split('/').next()?.parse().ok()).ok_or(SdpError::BadMedia(i + 1))?;
                let proto = f.next().ok_or(SdpError::BadMedia(i + 1))?.to_string();
                let formats: Vec<String> = f.map(String::from).collect();
                media.push(Media { kind, port, proto, formats, lines: Vec::new() });
            } else if let Some(m) = media.last_mut() {
                m.lines.push((t, value));
            } else {
                session.push((t, value));
            }
        }
        if session.is_empty() {
            return Err(SdpError::NoVersion);
        }
        Ok(Self { session, media })
    }

    pub fn attr(&self, name: &str) -> Option<&str> {
        attr(&self.session, name)
    }

    /// The description the proxy gives its clients: the upstream's media and attributes,
    /// its own origin and connection (`c=IN IP4 0.0.0.0`, ports 0: the client picks them in
    /// SETUP), a session-level `a=control:*`, and `a=control:trackID=N` for media section N.
    pub fn for_clients(&self, session_name: &str, session_id: u64) -> Sdp {
        let mut session = vec![
            ('v', "0".to_string()),
            ('o', format!("- {session_id} 1 IN IP4 0.0.0.0")),
            ('s', session_name.to_string()),
            ('c', "IN IP4 0.0.0.0".to_string()),
            ('t', "0 0".to_string()),
        ];
        session.extend(
            self.session
                .iter()
                .filter(|(t, v)| *t == 'a' && !v.starts_with("control:") && !v.starts_with("range:"))
                .cloned(),
        );
        session.push(('a', "control:*".to_string()));
        let media = self
            .media
            .iter()
            .enumerate()
            .map(|(n, m)| Media {
                kind: m.kind.clone(),
                port: 0,
                proto: m.proto.clone(),
                formats: m.formats.clone(),
                lines: m
                    .lines
                    .iter()
                    .filter(|(t, v)| *t != 'c' && !(*t == 'a' && v.starts_with("control:")))
                    .cloned()
                    .chain(std::iter::once(('a', format!("control:trackID={n}"))))
                    .collect(),
            })
            .collect();
        Sdp { session, media }
    }

    pub fn write(&self) -> String {
        let mut s = String::new();
        for (t, v) in &self.session {
            let _ = write!(s, "{t}={v}\r\n");
        }
        for m in &self.media {
            let _ = write!(s, "m={} {} {}", m.kind, m.port, m.proto);
            for f in &m.formats {
                let _ = write!(s, " {f}");
            }
            s.push_str("\r\n");
            for (t, v) in &m.lines {
                let _ = write!(s, "{t}={v}\r\n");
            }
        }
        s
    }
}

/// The `a=fmtp` parameters of an H.264 stream (RFC 6184 §8.1) from its SPS and PPS:
/// non-interleaved mode, the profile and level from the SPS, the parameter sets in base64.
pub fn h264_fmtp(sps: &[u8], pps: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = |x: &[u8]| base64::engine::general_purpose::STANDARD.encode(x);
    let mut f = String::from("packetization-mode=1");
    if let Some(p) = sps.get(1..4) {
        let _ = write!(f, ";profile-level-id={:02X}{:02X}{:02X}", p[0], p[1], p[2]);
    }
    let _ = write!(f, ";sprop-parameter-sets={},{}", b64(sps), b64(pps));
    f
}

/// The `a=fmtp` parameters of an H.265 stream (RFC 7798 §7.1): its VPS, SPS and PPS in
/// base64.
pub fn h265_fmtp(vps: &[u8], sps: &[u8], pps: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = |x: &[u8]| base64::engine::general_purpose::STANDARD.encode(x);
    format!("sprop-vps={};sprop-sps={};sprop-pps={}", b64(vps), b64(sps), b64(pps))
}

/// Which media section a client's SETUP URL names: `.../trackID=N` (absolute or relative,
/// with or without the session path), or the only section when the URL names none.
pub fn track_of(url: &str, tracks: usize) -> Option<usize> {
    let last = url.trim_end_matches('/').rsplit('/').next()?;
    match last.strip_prefix("trackID=") {
        Some(n) => n.parse().ok().filter(|&n| n < tracks),
        None if tracks == 1 => Some(0),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An H.264 + AAC description in the shape RTSP servers answer DESCRIBE with (written
    /// here by hand: absolute control URLs, fmtp with parameter sets).
    const UPSTREAM: &str = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=Stream\r\nc=IN IP4 0.0.0.0\r\nt=0 0\r\n\
m=video 0 RTP/AVP 96\r\na=control:rtsp://127.0.0.1:8554/live/trackID=0\r\na=rtpmap:96 H264/90000\r\n\
a=fmtp:96 packetization-mode=1; sprop-parameter-sets=Z2QAH6zZQFAFuhAAAAMAEAAAAwPI8YMZYA==,aOvjyyLA; profile-level-id=64001F\r\n\
m=audio 0 RTP/AVP 97\r\na=control:rtsp://127.0.0.1:8554/live/trackID=1\r\na=rtpmap:97 mpeg4-generic/48000/2\r\n\
a=fmtp:97 config=1190; indexdeltalength=3; indexlength=13; mode=AAC-hbr; profile-level-id=1; sizelength=13; streamtype=5\r\n";

    #[test]
    fn an_upstream_description_becomes_the_proxys() {
        let up = Sdp::parse(UPSTREAM).unwrap();
        assert_eq!(up.media.len(), 2);
        assert_eq!(up.media[0].rtpmap("96"), Some(("H264", 90000)));
        assert_eq!(up.media[1].rtpmap("97"), Some(("mpeg4-generic", 48000)));
        let ours = up.for_clients("tv1", 42);
        let text = ours.write();
        assert!(!text.contains("127.0.0.1"), "no upstream address leaks: {text}");
        assert!(text.contains("a=control:*\r\n"));
        assert!(text.contains("a=control:trackID=0\r\n") && text.contains("a=control:trackID=1\r\n"));
        assert!(text.contains("sprop-parameter-sets=Z2QAH6zZQFAFuhAAAAMAEAAAAwPI8YMZYA==,aOvjyyLA"), "fmtp kept");
        let again = Sdp::parse(&text).unwrap();
        assert_eq!(again, ours);
        assert_eq!(again.media[0].attr("control"), Some("trackID=0"));
    }

    #[test]
    fn setup_urls_real_clients_use_name_their_track() {
        assert_eq!(track_of("rtsp://h:8554/tv1/trackID=1", 2), Some(1));
        assert_eq!(track_of("trackID=0", 2), Some(0));
        assert_eq!(track_of("rtsp://h:8554/tv1/trackID=0/", 2), Some(0));
        assert_eq!(track_of("rtsp://h:8554/tv1", 1), Some(0));
        assert_eq!(track_of("rtsp://h:8554/tv1", 2), None);
        assert_eq!(track_of("rtsp://h:8554/tv1/trackID=2", 2), None);
        assert_eq!(track_of("rtsp://h:8554/tv1/trackID=x", 2), None);
    }

    #[test]
    fn bad_descriptions_are_refused() {
        assert_eq!(Sdp::parse("o=- 0 0 IN IP4 0.0.0.0\r\n"), Err(SdpError::NoVersion));
        assert_eq!(Sdp::parse("v=0\r\nnonsense\r\n"), Err(SdpError::BadLine(2)));
        assert_eq!(Sdp::parse("v=0\r\nm=video x RTP/AVP 96\r\n"), Err(SdpError::BadMedia(2)));
        assert_eq!(Sdp::parse(""), Err(SdpError::NoVersion));
    }

    proptest! {
        /// parse(write(sdp)) == sdp for any description the parser accepts.
        #[test]
        fn write_then_parse_is_the_identity(
            session in prop::collection::vec(("[a-z]", "[ -~]{0,30}"), 0..6),
            media in prop::collection::vec(("(video|audio)", 0u16..65535, "RTP/AVP", prop::collection::vec("[0-9]{1,3}", 1..3),
                prop::collection::vec(("[a-z]", "[ -~]{0,30}"), 0..5)), 0..4),
        ) {
            let clean = |v: &str| v.trim().to_string();
            let mut s = Sdp { session: vec![('v', "0".into())], media: Vec::new() };
            s.session.extend(session.into_iter().filter(|(t, _)| t != "m").map(|(t, v)| (t.chars().next().unwrap(), clean(&v))).filter(|(_, v)| !v.is_empty()));
            for (kind, port, proto, formats, lines) in media {
                s.media.push(Media {
                    kind, port, proto: proto.to_string(), formats,
                    lines: lines.into_iter().filter(|(t, _)| t != "m").map(|(t, v)| (t.chars().next().unwrap(), clean(&v))).filter(|(_, v)| !v.is_empty()).collect(),
                });
            }
            prop_assert_eq!(Sdp::parse(&s.write()).unwrap(), s);
        }

        #[test]
        fn arbitrary_text_never_panics(text in "[ -~\r\n]{0,400}") {
            if let Ok(s) = Sdp::parse(&text) {
                let _ = s.for_clients("x", 1).write();
            }
            let _ = track_of(&text, 3);
        }
    }
}
