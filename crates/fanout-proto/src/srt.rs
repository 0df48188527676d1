//! What an SRT caller asks for, in its stream id (the only words SRT's handshake carries):
//! a mode, a path and, where the relay wants them, credentials. The forms people already
//! type for MediaMTX:
//!
//! - `publish:NAME`, `read:NAME`, each optionally `:USER:PASS`;
//! - the SRT Access Control form (`#!::` then `key=value` pairs, comma-separated):
//!   `r` the path, `m` the mode (`publish`, or `request`/absent for reading), `u` the user,
//!   `s` or `p` the password;
//! - a bare `NAME` (reading), as plain `srt://host:port?streamid=NAME` players send.
//!
//! A path may carry RTMP's query (`NAME?token=T`, `NAME?user=U&pass=P`) instead.
//!
//! And [`parse_url`]: a remote SRT source the relay pulls, `srt://HOST:PORT?streamid=…`.

/// What the caller does with the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Publish,
    Read,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamId {
    pub mode: Mode,
    pub path: String,
    pub user: Option<String>,
    pub pass: Option<String>,
}

/// SRT's own limit on a stream id.
pub const MAX_LEN: usize = 512;

/// Why a stream id was not understood (said to the log, never with its secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamIdError {
    Empty,
    TooLong,
    /// A `#!::` key this relay does not know.
    UnknownKey,
    /// A mode other than publish and request.
    BadMode,
    NoPath,
}

impl std::fmt::Display for StreamIdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Empty => "no stream id (say publish:NAME or read:NAME)",
            Self::TooLong => "a stream id longer than 512 bytes",
            Self::UnknownKey => "a #!:: key other than r, m, u, s, p, h, t",
            Self::BadMode => "a mode other than publish and request",
            Self::NoPath => "no path named",
        })
    }
}

impl std::error::Error for StreamIdError {}

pub fn parse(id: &str) -> Result<StreamId, StreamIdError> {
    if id.len() > MAX_LEN {
        return Err(StreamIdError::TooLong);
    }
    let id = id.trim();
    if id.is_empty() {
        return Err(StreamIdError::Empty);
    }
    let s = if let Some(pairs) = id.strip_prefix("#!::") {
        let mut s = StreamId { mode: Mode::Read, path: String::new(), user: None, pass: None };
        for kv in pairs.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "r" => s.path = v.to_string(),
                "m" => {
                    s.mode = match v {
                        "publish" => Mode::Publish,
                        "request" | "" => Mode::Read,
                        _ => return Err(StreamIdError::BadMode),
                    }
                }
                "u" => s.user = Some(v.to_string()),
                "s" | "p" => s.pass = Some(v.to_string()),
                // Host and type: nothing to decide here.
                "h" | "t" => {}
                _ => return Err(StreamIdError::UnknownKey),
            }
        }
        s
    } else {
        let (mode, rest) = match id.split_once(':') {
            Some(("publish", rest)) => (Mode::Publish, rest),
            Some(("read", rest)) => (Mode::Read, rest),
            _ => (Mode::Read, id),
        };
        let mut parts = rest.splitn(3, ':');
        let path = parts.next().unwrap_or("").to_string();
        let (user, pass) = (parts.next().map(str::to_string), parts.next().map(str::to_string));
        StreamId { mode, path, user, pass }
    };
    if s.path.is_empty() || s.path.chars().any(char::is_control) {
        return Err(StreamIdError::NoPath);
    }
    Ok(s)
}

/// A remote SRT source as a user writes it, libsrt's URI form (what srt-live-transmit
/// takes): `srt://HOST:PORT?streamid=…&passphrase=…&pbkeylen=16&latency=MS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrtUrl {
    pub host: String,
    pub port: u16,
    pub streamid: Option<String>,
    pub passphrase: Option<String>,
    pub pbkeylen: Option<u32>,
    /// Milliseconds (libsrt's unit; ffmpeg's `latency` is in microseconds).
    pub latency_ms: Option<u32>,
}

/// `%XX` escapes decoded (a stream id's `#` is sent as `%23` by careful users, raw by others).
fn unescape(v: &str) -> Result<String, crate::Invalid> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = v.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(hex.ok_or_else(|| format!("a bad %-escape in {v:?}"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| crate::Invalid(format!("{v:?} is not UTF-8 once unescaped")))
}

impl SrtUrl {
    /// The URL as logs and the API show it: no passphrase, and of the stream id only its
    /// mode and path (credentials and keys ride in stream ids).
    pub fn shown(&self) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        let id = self
            .streamid
            .as_deref()
            .and_then(|id| parse(id).ok().filter(|_| ["publish:", "read:", "#!::"].iter().any(|f| id.starts_with(f))));
        match id {
            Some(StreamId { mode: Mode::Publish, path, .. }) => {
                format!("srt://{host}:{}?streamid=publish:{path}", self.port)
            }
            Some(StreamId { mode: Mode::Read, path, .. }) => format!("srt://{host}:{}?streamid=read:{path}", self.port),
            None => format!("srt://{host}:{}", self.port),
        }
    }
}

pub fn parse_url(url: &str) -> Result<SrtUrl, crate::Invalid> {
    let rest = url.strip_prefix("srt://").ok_or("an SRT source starts with srt://")?;
    // The query starts at the first '?'; a '#' after it belongs to the stream id.
    let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = authority.trim_end_matches('/');
    let (host, port) = authority.rsplit_once(':').ok_or("srt://HOST:PORT: the port is missing")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err("srt://HOST:PORT: the host is missing".into());
    }
    let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(|| format!("{port:?} is not a port"))?;
    let mut u =
        SrtUrl { host: host.to_string(), port, streamid: None, passphrase: None, pbkeylen: None, latency_ms: None };
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let v = unescape(v)?;
        match k {
            "streamid" => {
                parse(&v).map_err(|e| format!("streamid {v:?}: {e}"))?;
                u.streamid = Some(v);
            }
            "passphrase" if (10..=79).contains(&v.chars().count()) => u.passphrase = Some(v),
            "passphrase" => return Err("passphrase: SRT takes 10 to 79 characters".into()),
            "pbkeylen" => {
                u.pbkeylen = Some(v.parse().ok().filter(|k| matches!(k, 16 | 24 | 32)).ok_or("pbkeylen: 16, 24 or 32")?)
            }
            "latency" => {
                u.latency_ms =
                    Some(v.parse().ok().filter(|l| (20..=10_000).contains(l)).ok_or("latency: 20 to 10000 ms")?)
            }
            // The relay always calls.
            "mode" if v == "caller" => {}
            _ => return Err(format!("{k:?}: an SRT source takes streamid, passphrase, pbkeylen, latency (ms)").into()),
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn source_urls() {
        let u = parse_url("srt://cam.example:9000?streamid=read:live&passphrase=0123456789&pbkeylen=32&latency=500")
            .unwrap();
        assert_eq!((u.host.as_str(), u.port), ("cam.example", 9000));
        assert_eq!(u.streamid.as_deref(), Some("read:live"));
        assert_eq!((u.passphrase.as_deref(), u.pbkeylen, u.latency_ms), (Some("0123456789"), Some(32), Some(500)));
        let u = parse_url("srt://[::1]:8890/?streamid=%23!::r=cam,m=request").unwrap();
        assert_eq!((u.host.as_str(), u.streamid.as_deref()), ("::1", Some("#!::r=cam,m=request")));
        assert_eq!(parse_url("srt://h:1?streamid=#!::r=cam").unwrap().streamid.as_deref(), Some("#!::r=cam"));
        assert!(parse_url("srt://h:1").unwrap().streamid.is_none());
        // Shown without secrets: a passphrase, a stream id's credentials, a bare id (a key).
        let shown = |u: &str| parse_url(u).unwrap().shown();
        assert_eq!(shown("srt://h:1?streamid=publish:cam:u:p&passphrase=0123456789"), "srt://h:1?streamid=publish:cam");
        assert_eq!(shown("srt://[::1]:1?streamid=%23!::r=cam,m=publish,s=pw"), "srt://[::1]:1?streamid=publish:cam");
        assert_eq!(shown("srt://h:1?streamid=live_0123secretkey"), "srt://h:1");
        assert_eq!(shown("srt://h:1?streamid=live:secretkey"), "srt://h:1");
        assert_eq!(shown("srt://h:1?streamid=read:cam"), "srt://h:1?streamid=read:cam");
        for bad in [
            "rtsp://h:1",
            "srt://h",
            "srt://:5",
            "srt://h:0",
            "srt://h:1?latency=5",
            "srt://h:1?pbkeylen=8",
            "srt://h:1?passphrase=short",
            "srt://h:1?streamid=",
            "srt://h:1?mode=listener",
            "srt://h:1?streamid=%zz",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    fn id(mode: Mode, path: &str, user: Option<&str>, pass: Option<&str>) -> StreamId {
        StreamId { mode, path: path.into(), user: user.map(Into::into), pass: pass.map(Into::into) }
    }

    #[test]
    fn the_forms_users_type() {
        assert_eq!(parse("publish:cam"), Ok(id(Mode::Publish, "cam", None, None)));
        assert_eq!(parse("read:cam"), Ok(id(Mode::Read, "cam", None, None)));
        assert_eq!(parse("publish:cam:alice:s3cret"), Ok(id(Mode::Publish, "cam", Some("alice"), Some("s3cret"))));
        assert_eq!(parse("read:cam:bob:a:b"), Ok(id(Mode::Read, "cam", Some("bob"), Some("a:b"))));
        assert_eq!(parse("#!::r=live/cam,m=publish"), Ok(id(Mode::Publish, "live/cam", None, None)));
        assert_eq!(parse("#!::m=request,r=cam,u=bob,s=pw"), Ok(id(Mode::Read, "cam", Some("bob"), Some("pw"))));
        assert_eq!(parse("#!::r=cam,h=example.com"), Ok(id(Mode::Read, "cam", None, None)));
        assert_eq!(parse("cam"), Ok(id(Mode::Read, "cam", None, None)));
        assert_eq!(parse("publish:cam?token=T").unwrap().path, "cam?token=T", "the query is the caller's to split");
    }

    #[test]
    fn what_is_refused_and_why() {
        assert_eq!(parse(""), Err(StreamIdError::Empty));
        assert_eq!(parse("publish:"), Err(StreamIdError::NoPath));
        assert_eq!(parse("#!::m=publish"), Err(StreamIdError::NoPath));
        assert_eq!(parse("#!::r=cam,m=bidirectional"), Err(StreamIdError::BadMode));
        assert_eq!(parse("#!::r=cam,x=1"), Err(StreamIdError::UnknownKey));
        assert_eq!(parse(&"a".repeat(513)), Err(StreamIdError::TooLong));
        assert_eq!(parse("read:c\u{1}am"), Err(StreamIdError::NoPath));
    }

    proptest! {
        #[test]
        fn any_url_is_parsed_or_refused(s in "srt://.{0,200}") {
            let _ = parse_url(&s);
        }

        #[test]
        fn any_text_is_parsed_or_refused(s in ".{0,600}") {
            if let Ok(p) = parse(&s) {
                prop_assert!(!p.path.is_empty() && s.len() <= MAX_LEN);
            }
        }

        #[test]
        fn the_colon_form_round_trips(path in "[a-z0-9/_-]{1,40}", user in "[a-z]{1,10}", pass in "[!-~]{1,20}") {
            let got = parse(&format!("publish:{path}:{user}:{pass}")).unwrap();
            prop_assert_eq!(got, id(Mode::Publish, &path, Some(&user), Some(&pass)));
        }
    }
}
