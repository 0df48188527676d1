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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
