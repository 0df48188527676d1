//! Recognising an HTTP stream subscription (`GET /v1/sessions/{name}/stream`, or HTTP-FLV's
//! `GET /{name}.flv`) from the head
//! of a request, before any HTTP library sees it: the relay then hands the raw socket to its
//! data plane. Everything else is left to the API server. And HTTP Basic credentials, as the
//! RTSP server and the WebRTC face read them.

/// What a stream request is served as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    /// `GET /v1/sessions/{name}/stream`: MPEG-TS (or the path's own payload).
    Ts,
    /// `GET /{name}.flv`: HTTP-FLV, as flv.js, mpegts.js and ffmpeg play it.
    Flv,
}

/// A stream request, if this request head is one.
#[derive(Debug, PartialEq, Eq)]
pub struct StreamRequest<'a> {
    pub session: &'a str,
    pub container: Container,
    pub query: Option<&'a str>,
    pub authorization: Option<&'a str>,
    /// A WebSocket opening handshake's `Sec-WebSocket-Key` (WebSocket-FLV, as mpegts.js and
    /// flv.js open `ws://…/{name}.flv`).
    pub websocket: Option<&'a str>,
    /// Length of the request head, including the blank line.
    pub head_len: usize,
}

/// What a (possibly partial) request head is, decided before an HTTP library sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Head<'a> {
    /// Not complete yet: read more.
    Incomplete,
    /// `GET /v1/sessions/{name}/stream`: the relay's data plane takes the socket.
    Stream(StreamRequest<'a>),
    /// RTSP over HTTP: one half of a tunnel (Apple's QuickTime tunnelling).
    Tunnel(TunnelRequest<'a>),
    /// Any other well-formed request: the API server's.
    Api,
    /// Refused before parsing further: the status and why (a JSON error to send, then close).
    Reject(u16, &'static str),
}

/// The user and password of an `Authorization: Basic …` value (RFC 7617: the scheme in any
/// case, base64 of `user:password`, the password may hold `:`); `None` for any other value.
/// `s` as one URL path segment or userinfo part: every byte but RFC 3986's unreserved
/// ones written `%XX`.
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn basic_credentials(authorization: &str) -> Option<(String, String)> {
    use base64::Engine as _;
    let (scheme, rest) = authorization.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("Basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
    let (u, p) = String::from_utf8(raw).ok()?.split_once(':').map(|(u, p)| (u.to_string(), p.to_string()))?;
    Some((u, p))
}

/// Longest request target accepted (414 beyond it).
pub const MAX_TARGET: usize = 4096;

/// The longest tunnel cookie taken.
pub const MAX_COOKIE: usize = 128;

/// One half of an RTSP-over-HTTP tunnel: a `GET` the server's answers and media go down,
/// or a `POST` whose body carries the client's requests in base64, paired by their
/// `x-sessioncookie`.
#[derive(Debug, PartialEq, Eq)]
pub struct TunnelRequest<'a> {
    pub post: bool,
    pub cookie: &'a str,
    pub path: &'a str,
    pub head_len: usize,
}

/// A tunnel's client-to-server half decoded as it comes: base64 (RFC 4648) in groups of
/// four, whitespace between them skipped, each group decoded on its own (clients encode
/// each request apart, so `=` padding comes mid-stream).
#[derive(Debug, Default)]
pub struct Base64Stream {
    quad: [u8; 4],
    n: usize,
}

impl Base64Stream {
    /// Decodes `input` onto `out`; a byte that is not base64 is an error (the tunnel ends).
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), crate::Invalid> {
        for &b in input {
            let v = match b {
                b'A'..=b'Z' => b - b'A',
                b'a'..=b'z' => b - b'a' + 26,
                b'0'..=b'9' => b - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                b'=' => 64,
                b' ' | b'\t' | b'\r' | b'\n' => continue,
                _ => return Err(format!("not base64: byte {b:#04x}").into()),
            };
            self.quad[self.n] = v;
            self.n += 1;
            if self.n < 4 {
                continue;
            }
            self.n = 0;
            let q = self.quad;
            // Padding only at a group's end: xx==, xxx=.
            let pads = q.iter().rev().take_while(|&&v| v == 64).count();
            if pads > 2 || q[..4 - pads].contains(&64) {
                return Err("base64 padding inside a group".into());
            }
            let bits = q.iter().fold(0u32, |acc, &v| acc << 6 | u32::from(v & 63));
            out.extend_from_slice(&bits.to_be_bytes()[1..4 - pads]);
        }
        Ok(())
    }
}

/// Looks at the first `buf` bytes of a connection; `max_head`: the longest head accepted
/// (431 beyond it).
pub fn classify(buf: &[u8], max_head: usize) -> Head<'_> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n");
    // The request line alone can be judged before the head ends.
    let line = &buf[..line_end.unwrap_or(buf.len())];
    let mut parts = line.split(|b| *b == b' ');
    let (method, target) = (parts.next().unwrap_or(&[]), parts.next());
    // RFC 9110 §5.6.2: a method is a token.
    let tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    if !method.iter().all(tchar) || (line_end.is_some() && (method.is_empty() || target.is_none())) {
        return Head::Reject(400, "malformed request line");
    }
    if target.is_some_and(|t| t.len() > MAX_TARGET) || (line_end.is_none() && line.len() > MAX_TARGET + 32) {
        return Head::Reject(414, "request target longer than 4096 bytes");
    }
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4) else {
        return if buf.len() >= max_head { Head::Reject(431, "request head too large") } else { Head::Incomplete };
    };
    if end > max_head {
        return Head::Reject(431, "request head too large");
    }
    let Ok(head) = std::str::from_utf8(&buf[..end]) else { return Head::Api };
    let mut lines = head.split("\r\n");
    let mut parts = lines.next().unwrap_or("").split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let headers: Vec<(&str, &str)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim(), v.trim())).collect();
    let header = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| *v);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    if let (Some(cookie), "GET" | "POST") = (header("x-sessioncookie"), method) {
        if cookie.is_empty() || cookie.len() > MAX_COOKIE || !cookie.bytes().all(|b| b.is_ascii_graphic()) {
            return Head::Reject(400, "x-sessioncookie: 1 to 128 visible characters");
        }
        let post = method == "POST";
        return Head::Tunnel(TunnelRequest { post, cookie, path, head_len: end });
    }
    if method != "GET" {
        return Head::Api;
    }
    let ts = path.strip_prefix("/v1/sessions/").and_then(|r| r.strip_suffix("/stream"));
    let flv = path.strip_prefix('/').and_then(|r| r.strip_suffix(".flv")).filter(|r| !r.starts_with("v1/"));
    let (session, container) = match (ts, flv) {
        (Some(s), _) => (s, Container::Ts),
        (None, Some(s)) => (s, Container::Flv),
        (None, None) => return Head::Api,
    };
    if session.split('/').any(str::is_empty) {
        return Head::Api;
    }
    let authorization = header("authorization");
    // RFC 6455 §4.2.1: `Upgrade` names websocket among its tokens.
    let upgrade = header("upgrade").is_some_and(|u| u.split(',').any(|t| t.trim().eq_ignore_ascii_case("websocket")));
    let websocket = match (upgrade, header("sec-websocket-key")) {
        (false, _) => None,
        (true, Some(key)) if container == Container::Flv && !key.is_empty() => Some(key),
        (true, None) => return Head::Reject(400, "a WebSocket handshake needs Sec-WebSocket-Key"),
        (true, Some(_)) => return Head::Reject(400, "WebSocket is served for HTTP-FLV (/{name}.flv) only"),
    };
    Head::Stream(StreamRequest { session, container, query, authorization, websocket, head_len: end })
}

/// The byte range a `Range` header asks of a resource of `len` bytes (RFC 9110 §14.1.2):
/// `Ok(None)` for the whole, `Ok(Some((first, last)))` (inclusive), `Err(())` when none of
/// it can be served (416). One range only: a list of several is answered whole.
#[allow(clippy::result_unit_err)]
pub fn byte_range(header: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else { return Ok(None) };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else { return Ok(None) };
    let num = |s: &str| if s.is_empty() { Ok(None) } else { s.trim().parse::<u64>().map(Some).map_err(|_| ()) };
    let (Ok(a), Ok(b)) = (num(a), num(b)) else { return Ok(None) };
    match (a, b) {
        // The last `n` bytes.
        (None, Some(n)) if n > 0 && len > 0 => Ok(Some((len.saturating_sub(n), len - 1))),
        (Some(first), last) if first < len && last.is_none_or(|l| l >= first) => {
            Ok(Some((first, last.map_or(len - 1, |l| l.min(len - 1)))))
        }
        (None, None) => Ok(None),
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_ranges() {
        assert_eq!(byte_range(None, 10), Ok(None));
        assert_eq!(byte_range(Some("bytes=0-3"), 10), Ok(Some((0, 3))));
        assert_eq!(byte_range(Some("bytes=4-"), 10), Ok(Some((4, 9))));
        assert_eq!(byte_range(Some("bytes=-3"), 10), Ok(Some((7, 9))));
        assert_eq!(byte_range(Some("bytes=5-100"), 10), Ok(Some((5, 9))));
        assert_eq!(byte_range(Some("bytes=10-"), 10), Err(()));
        assert_eq!(byte_range(Some("bytes=5-2"), 10), Err(()));
        assert_eq!(byte_range(Some("bytes=0-1,4-5"), 10), Ok(None));
        assert_eq!(byte_range(Some("items=0-1"), 10), Ok(None));
    }

    proptest::proptest! {
        #[test]
        fn a_byte_range_is_inside_the_resource(h in "(bytes=)?[0-9]{0,3}-?[0-9]{0,3}", len in 0u64..2000) {
            if let Ok(Some((a, b))) = byte_range(Some(&h), len) {
                proptest::prop_assert!(a <= b && b < len);
            }
        }
    }

    use super::*;

    /// A tunnel's halves are told apart by method, paired by cookie; a cookie too long or
    /// with spaces is refused.
    #[test]
    fn tunnel_halves_are_recognised_by_their_cookie() {
        let get = b"GET /cam1 HTTP/1.0\r\nx-sessioncookie: abc123\r\nAccept: application/x-rtsp-tunnelled\r\n\r\n";
        let Head::Tunnel(t) = classify(get, 4096) else { panic!() };
        assert_eq!(t, TunnelRequest { post: false, cookie: "abc123", path: "/cam1", head_len: get.len() });
        let post = b"POST /cam1 HTTP/1.0\r\nx-sessioncookie: abc123\r\nContent-Length: 32767\r\n\r\nREVTQ1JJQkU=";
        let Head::Tunnel(t) = classify(post, 4096) else { panic!() };
        assert!(t.post && t.head_len == post.len() - 12);
        let long = format!("GET / HTTP/1.0\r\nx-sessioncookie: {}\r\n\r\n", "a".repeat(129));
        assert!(matches!(classify(long.as_bytes(), 4096), Head::Reject(400, _)));
        // Other methods with a cookie are the API's.
        assert!(matches!(classify(b"PUT / HTTP/1.1\r\nx-sessioncookie: a\r\n\r\n", 4096), Head::Api));
    }

    #[test]
    fn base64_decodes_across_pushes_and_mid_stream_padding() {
        let mut d = Base64Stream::default();
        let mut out = Vec::new();
        // Two requests encoded apart ("OPTIONS" and "ab"), split at odd places, with newlines.
        for part in [&b"T1BUSU"[..], b"9OUw==\r\n", b"YW", b"I="] {
            d.push(part, &mut out).unwrap();
        }
        assert_eq!(out, b"OPTIONSab");
        assert!(Base64Stream::default().push(b"ab=c", &mut Vec::new()).is_err());
        assert!(Base64Stream::default().push(b"a===", &mut Vec::new()).is_err());
        assert!(Base64Stream::default().push(b"ab*d", &mut Vec::new()).is_err());
    }

    proptest::proptest! {
        /// Chunks encoded apart and cut anywhere decode to what was encoded.
        #[test]
        fn base64_stream_round_trips(chunks in proptest::collection::vec(proptest::collection::vec(0u8.., 0..40), 0..6), cut in 0usize..400) {
            use base64::Engine as _;
            let text: String = chunks.iter().map(|c| base64::engine::general_purpose::STANDARD.encode(c)).collect();
            let (a, b) = text.as_bytes().split_at(cut.min(text.len()));
            let mut d = Base64Stream::default();
            let mut out = Vec::new();
            d.push(a, &mut out).unwrap();
            d.push(b, &mut out).unwrap();
            proptest::prop_assert_eq!(out, chunks.concat());
        }
    }

    use proptest::prelude::*;

    #[test]
    fn basic_credentials_are_read_as_rfc_7617_has_them() {
        // "Aladdin:open sesame", and a password with a colon.
        assert_eq!(
            basic_credentials("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
            Some(("Aladdin".into(), "open sesame".into()))
        );
        assert_eq!(basic_credentials("basic dTpwOnE="), Some(("u".into(), "p:q".into())));
        assert_eq!(basic_credentials("Bearer QWxhZGRpbjpvcGVuIHNlc2FtZQ=="), None);
        assert_eq!(basic_credentials("Basic bm9jb2xvbg=="), None, "no colon");
        assert_eq!(basic_credentials("Basic !!!"), None);
    }

    proptest! {
        #[test]
        fn basic_credentials_take_any_value(v in ".{0,80}") {
            let _ = basic_credentials(&v);
        }


        #[test]
        fn never_panics_and_head_len_is_inside(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
            match classify(&buf, 200) {
                Head::Stream(r) => {
                    prop_assert!(r.head_len <= buf.len() && r.head_len <= 200);
                    prop_assert!(!r.session.split('/').any(str::is_empty));
                }
                Head::Reject(status, _) => prop_assert!([400, 414, 431].contains(&status)),
                Head::Incomplete => prop_assert!(buf.len() < 200),
                Head::Tunnel(t) => prop_assert!(t.head_len <= buf.len() && t.cookie.len() <= MAX_COOKIE),
                Head::Api => {}
            }
        }
    }

    #[test]
    fn recognises_stream_requests() {
        let r = b"GET /v1/sessions/tv1/stream?token=x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer t\r\n\r\n";
        let Head::Stream(p) = classify(r, 8192) else { panic!("a stream request") };
        assert_eq!(p.session, "tv1");
        assert_eq!(p.query, Some("token=x"));
        assert_eq!(p.authorization, Some("Bearer t"));
        assert_eq!(p.head_len, r.len());
        assert_eq!(classify(b"GET /v1/sessions/tv1/stream HTTP/1.1\r\n", 8192), Head::Incomplete);
        assert_eq!(classify(b"GET /v1/sessions HTTP/1.1\r\n\r\n", 8192), Head::Api);
        assert_eq!(classify(b"POST /v1/sessions/a/stream HTTP/1.1\r\n\r\n", 8192), Head::Api);
        assert_eq!(classify(b"HEAD /v1/sessions/a/stream HTTP/1.1\r\n\r\n", 8192), Head::Api);
        assert!(
            matches!(classify(b"GET /v1/sessions/live/cam1/stream HTTP/1.1\r\n\r\n", 8192), Head::Stream(r) if r.session == "live/cam1")
        );
        assert_eq!(classify(b"GET /v1/sessions/live//stream HTTP/1.1\r\n\r\n", 8192), Head::Api);
        assert_eq!(p.container, Container::Ts);
    }

    #[test]
    fn recognises_websocket_flv_handshakes() {
        let ws = b"GET /cam.flv HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
            Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
        let Head::Stream(r) = classify(ws, 8192) else { panic!("a stream request") };
        assert_eq!((r.session, r.container, r.websocket), ("cam", Container::Flv, Some("dGhlIHNhbXBsZSBub25jZQ==")));
        let plain = b"GET /cam.flv HTTP/1.1\r\nSec-WebSocket-Key: k\r\n\r\n";
        assert!(matches!(classify(plain, 8192), Head::Stream(r) if r.websocket.is_none()));
        let keyless = b"GET /cam.flv HTTP/1.1\r\nUpgrade: WebSocket\r\n\r\n";
        assert_eq!(classify(keyless, 8192), Head::Reject(400, "a WebSocket handshake needs Sec-WebSocket-Key"));
        let ts = b"GET /v1/sessions/cam/stream HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n";
        assert!(matches!(classify(ts, 8192), Head::Reject(400, _)));
    }

    #[test]
    fn recognises_http_flv_requests() {
        let flv = |r: &'static [u8]| match classify(r, 8192) {
            Head::Stream(s) if s.container == Container::Flv => Some((s.session, s.query)),
            _ => None,
        };
        assert_eq!(flv(b"GET /demo.flv HTTP/1.1\r\n\r\n"), Some(("demo", None)));
        assert_eq!(flv(b"GET /live/cam1.flv?token=t HTTP/1.1\r\n\r\n"), Some(("live/cam1", Some("token=t"))));
        // Not a name: the API's (its 404), never the data plane's.
        for r in [
            &b"GET /.flv HTTP/1.1\r\n\r\n"[..],
            b"GET /live//a.flv HTTP/1.1\r\n\r\n",
            b"GET /v1/x.flv HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(classify(r, 8192), Head::Api, "{}", String::from_utf8_lossy(r));
        }
        assert_eq!(classify(b"POST /demo.flv HTTP/1.1\r\n\r\n", 8192), Head::Api);
    }

    #[test]
    fn rejects_what_the_api_would_answer_without_a_body() {
        assert_eq!(classify(b"G@T / HTTP/1.1\r\n\r\n", 8192), Head::Reject(400, "malformed request line"));
        assert_eq!(classify(b"G\x01", 8192), Head::Reject(400, "malformed request line"));
        assert_eq!(classify(b"BREW / HTTP/1.1\r\n\r\n", 8192), Head::Api, "unknown methods: the API's 405");
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(5000));
        assert_eq!(classify(long.as_bytes(), 8192), Head::Reject(414, "request target longer than 4096 bytes"));
        assert_eq!(
            classify(&long.as_bytes()[..4500], 8192),
            Head::Reject(414, "request target longer than 4096 bytes")
        );
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(9000));
        assert_eq!(classify(big.as_bytes(), 8192), Head::Reject(431, "request head too large"));
    }
}

#[cfg(test)]
mod percent_encode_tests {
    #[test]
    fn only_unreserved_bytes_stay() {
        assert_eq!(super::percent_encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(super::percent_encode("a b/c:d@é"), "a%20b%2Fc%3Ad%40%C3%A9");
    }
}
