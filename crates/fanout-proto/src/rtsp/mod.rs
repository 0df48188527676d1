//! RTSP 1.0 (RFC 2326) messages, sans-IO: an incremental parser over a connection's bytes
//! (requests, responses and `$`-framed interleaved data, as clients pipeline them), the
//! writer, and the headers the proxy reasons about (`Transport`, `Session`, `CSeq`).
//!
//! The parser never reads past the limits it is given: an oversized head or body is an
//! error with the status code a server answers (431 / 413), not a growing buffer.
//!
//! Beside the messages: [`server`], the relay's RTSP server as a state machine; [`client`],
//! its client to an upstream; [`sdp`], session descriptions read and written.

pub mod client;
pub mod sdp;
pub mod server;

use std::fmt::Write as _;

/// Bounds on what one message may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Start line plus headers, bytes.
    pub max_head: usize,
    pub max_headers: usize,
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_head: 8192, max_headers: 64, max_body: 65536 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RtspError {
    #[error("malformed start line")]
    BadStartLine,
    #[error("malformed header line")]
    BadHeader,
    #[error("unsupported protocol version {0:?}")]
    Version(String),
    #[error("request head larger than {0} bytes")]
    HeadTooLarge(usize),
    #[error("more than {0} headers")]
    TooManyHeaders(usize),
    #[error("body of {0} bytes is over the limit")]
    BodyTooLarge(usize),
    #[error("bad Content-Length")]
    BadContentLength,
}

impl RtspError {
    /// The status a server answers with before closing the connection.
    pub fn status(&self) -> u16 {
        match self {
            RtspError::HeadTooLarge(_) | RtspError::TooManyHeaders(_) => 431,
            RtspError::BodyTooLarge(_) => 413,
            RtspError::Version(_) => 505,
            _ => 400,
        }
    }
}

/// Headers in arrival order; names compared case-insensitively.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn set(&mut self, name: &str, value: impl Into<String>) {
        let value = value.into();
        match self.0.iter_mut().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name.to_string(), value)),
        }
    }
    pub fn cseq(&self) -> Option<u32> {
        self.get("CSeq")?.trim().parse().ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub uri: String,
    pub headers: Headers,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    pub headers: Headers,
    pub body: Vec<u8>,
}

/// One item of an RTSP connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Request(Request),
    Response(Response),
    /// `$` channel length data: RTP/RTCP interleaved on the connection.
    Interleaved {
        channel: u8,
        data: Vec<u8>,
    },
}

/// Parses the next complete message at the start of `buf`: `Ok(None)` when more bytes are
/// needed, else the message and how many bytes it took.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(Message, usize)>, RtspError> {
    if buf.first() == Some(&b'$') {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
        if buf.len() < 4 + len {
            return Ok(None);
        }
        return Ok(Some((Message::Interleaved { channel: buf[1], data: buf[4..4 + len].to_vec() }, 4 + len)));
    }
    // Blank lines between messages are allowed (RFC 2326 §4: keep-alive CRLFs).
    let skip = buf.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
    let buf = &buf[skip..];
    let Some(head_end) = find_head_end(buf) else {
        if buf.len() > limits.max_head {
            return Err(RtspError::HeadTooLarge(limits.max_head));
        }
        return Ok(None);
    };
    let (head_len, body_start) = head_end;
    if head_len > limits.max_head {
        return Err(RtspError::HeadTooLarge(limits.max_head));
    }
    let head = std::str::from_utf8(&buf[..head_len]).map_err(|_| RtspError::BadHeader)?;
    let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let start = lines.next().ok_or(RtspError::BadStartLine)?;
    let mut headers = Headers::default();
    for line in lines.filter(|l| !l.is_empty()) {
        if line.starts_with([' ', '\t']) {
            // Obsolete line folding: continue the previous header's value.
            let last = headers.0.last_mut().ok_or(RtspError::BadHeader)?;
            last.1.push(' ');
            last.1.push_str(line.trim());
            continue;
        }
        let (name, value) = line.split_once(':').ok_or(RtspError::BadHeader)?;
        let name = name.trim();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(RtspError::BadHeader);
        }
        if headers.0.len() >= limits.max_headers {
            return Err(RtspError::TooManyHeaders(limits.max_headers));
        }
        headers.0.push((name.to_string(), value.trim().to_string()));
    }
    let body_len = match headers.get("Content-Length") {
        None => 0,
        Some(v) => v.trim().parse::<usize>().map_err(|_| RtspError::BadContentLength)?,
    };
    if body_len > limits.max_body {
        return Err(RtspError::BodyTooLarge(body_len));
    }
    if buf.len() < body_start + body_len {
        return Ok(None);
    }
    let body = buf[body_start..body_start + body_len].to_vec();
    let used = skip + body_start + body_len;
    let mut parts = start.splitn(3, ' ');
    let (a, b, c) = (parts.next().unwrap_or(""), parts.next(), parts.next());
    let msg = if let Some(version) = a.strip_prefix("RTSP/") {
        check_version(version)?;
        let status = b.and_then(|s| s.parse::<u16>().ok()).filter(|s| (100..1000).contains(s));
        let status = status.ok_or(RtspError::BadStartLine)?;
        Message::Response(Response { status, reason: c.unwrap_or("").to_string(), headers, body })
    } else {
        let (Some(uri), Some(version)) = (b, c) else { return Err(RtspError::BadStartLine) };
        let version = version.strip_prefix("RTSP/").ok_or(RtspError::BadStartLine)?;
        check_version(version)?;
        if a.is_empty() || !a.bytes().all(|b| b.is_ascii_uppercase() || b == b'_' || b == b'-') || uri.is_empty() {
            return Err(RtspError::BadStartLine);
        }
        Message::Request(Request { method: a.to_string(), uri: uri.to_string(), headers, body })
    };
    Ok(Some((msg, used)))
}

fn check_version(v: &str) -> Result<(), RtspError> {
    if v.trim() == "1.0" {
        Ok(())
    } else {
        Err(RtspError::Version(v.trim().to_string()))
    }
}

/// Where the head ends: (head length without the blank line, offset of the body).
fn find_head_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            if buf.get(i + 1) == Some(&b'\n') {
                return Some((i, i + 2));
            }
            if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                return Some((i, i + 3));
            }
        }
        i += 1;
    }
    None
}

fn write_headers(out: &mut Vec<u8>, headers: &Headers, body: &[u8]) {
    let mut s = String::new();
    for (n, v) in &headers.0 {
        if !n.eq_ignore_ascii_case("Content-Length") {
            let _ = write!(s, "{n}: {v}\r\n");
        }
    }
    if !body.is_empty() {
        let _ = write!(s, "Content-Length: {}\r\n", body.len());
    }
    s.push_str("\r\n");
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(body);
}

impl Request {
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("{} {} RTSP/1.0\r\n", self.method, self.uri).as_bytes());
        write_headers(out, &self.headers, &self.body);
    }
}

impl Response {
    pub fn new(status: u16, cseq: Option<u32>) -> Self {
        let mut headers = Headers::default();
        if let Some(c) = cseq {
            headers.set("CSeq", c.to_string());
        }
        Self { status, reason: reason(status).to_string(), headers, body: Vec::new() }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("RTSP/1.0 {} {}\r\n", self.status, self.reason).as_bytes());
        write_headers(out, &self.headers, &self.body);
    }
}

/// Writes an interleaved frame header and data (`data` at most 65535 bytes).
pub fn write_interleaved(out: &mut Vec<u8>, channel: u8, data: &[u8]) {
    let len = u16::try_from(data.len()).expect("interleaved frames carry at most 65535 bytes");
    out.extend_from_slice(&[b'$', channel]);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(data);
}

/// The `Authorization` value answering a `WWW-Authenticate` challenge (Basic, or Digest
/// per RFC 2617 without `qop`, as RTSP servers use it); `None` for another scheme.
pub fn authorization(challenge: &str, user: &str, pass: &str, method: &str, uri: &str) -> Option<String> {
    use base64::Engine as _;
    let (scheme, rest) = challenge.trim().split_once(' ').unwrap_or((challenge.trim(), ""));
    if scheme.eq_ignore_ascii_case("Basic") {
        return Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))));
    }
    if !scheme.eq_ignore_ascii_case("Digest") {
        return None;
    }
    let params = digest_params(rest);
    let get = |k: &str| params.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str());
    let (realm, nonce) = (get("realm").unwrap_or(""), get("nonce")?);
    let response = digest_response(user, realm, pass, nonce, method, uri);
    Some(format!(
        "Digest username=\"{user}\", realm=\"{realm}\", nonce=\"{nonce}\", uri=\"{uri}\", response=\"{response}\""
    ))
}

/// RFC 2617 §3.2.2.1 `response` without `qop`: MD5(HA1:nonce:HA2).
pub fn digest_response(user: &str, realm: &str, pass: &str, nonce: &str, method: &str, uri: &str) -> String {
    use md5::Digest as _;
    let h = |s: String| hex(&md5::Md5::digest(s.as_bytes()));
    let (ha1, ha2) = (h(format!("{user}:{realm}:{pass}")), h(format!("{method}:{uri}")));
    h(format!("{ha1}:{nonce}:{ha2}"))
}

/// RFC 2617 §3.2.2.1 `response` with `qop=auth`: MD5(HA1:nonce:nc:cnonce:auth:HA2), `nc`
/// as 8 hex digits.
#[allow(clippy::too_many_arguments)]
pub fn digest_response_qop(
    user: &str,
    realm: &str,
    pass: &str,
    nonce: &str,
    nc: u32,
    cnonce: &str,
    method: &str,
    uri: &str,
) -> String {
    use md5::Digest as _;
    let h = |s: String| hex(&md5::Md5::digest(s.as_bytes()));
    let (ha1, ha2) = (h(format!("{user}:{realm}:{pass}")), h(format!("{method}:{uri}")));
    h(format!("{ha1}:{nonce}:{nc:08x}:{cnonce}:auth:{ha2}"))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `name="value", name=value, ...` of a Digest header.
pub(crate) fn digest_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((name, after)) = rest.split_once('=') else { break };
        let after = after.trim_start();
        let (value, tail) = match after.strip_prefix('"') {
            Some(q) => match q.find('"') {
                Some(end) => (&q[..end], &q[end + 1..]),
                None => (q, ""),
            },
            None => after.split_once(',').unwrap_or((after, "")),
        };
        out.push((name.trim().trim_start_matches(',').trim().to_string(), value.to_string()));
        rest = tail.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// RFC 2326 §7.1.1 reason phrases for the codes the proxy sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Request Entity Too Large",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        454 => "Session Not Found",
        455 => "Method Not Valid in This State",
        459 => "Aggregate Operation Not Allowed",
        461 => "Unsupported Transport",
        463 => "Key Management Failure",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "RTSP Version Not Supported",
        _ => "Unknown",
    }
}

/// The lower transport a client asks for in `Transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lower {
    /// RTP/AVP(/UDP) unicast to the client's RTP and RTCP ports.
    Udp { client_rtp: u16, client_rtcp: u16 },
    /// RTP/AVP/TCP interleaved on the RTSP connection, on these channels.
    Interleaved { rtp: u8, rtcp: u8 },
    /// RTP/AVP UDP multicast: the track's group and ports, which the server chooses (a
    /// client's `multicast` spec is this with a group of 0.0.0.0 until then). One stream per
    /// group, whatever the number of clients.
    Multicast { group: std::net::Ipv4Addr, rtp: u16, rtcp: u16 },
}

/// One transport spec of a `Transport` header (the client may offer several, comma-separated;
/// [`parse_transport`] returns them in order of preference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportSpec {
    pub lower: Option<Lower>,
    pub multicast: bool,
    /// Profile `RTP/SAVP`: SRTP (RFC 3711).
    pub savp: bool,
    /// The whole spec as sent, for answers that echo it.
    pub raw: String,
}

fn port_pair(v: &str) -> Option<(u16, u16)> {
    match v.split_once('-') {
        Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
        None => {
            let a: u16 = v.trim().parse().ok()?;
            Some((a, a.checked_add(1)?))
        }
    }
}

/// Parses a `Transport` header value. A spec the proxy cannot serve (an unknown profile,
/// missing ports, multicast over TCP) has `lower: None`: the server answers 461 if no spec is
/// usable.
pub fn parse_transport(value: &str) -> Vec<TransportSpec> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|spec| {
            let mut params = spec.split(';').map(str::trim);
            let proto = params.next().unwrap_or("").to_ascii_uppercase();
            let (tcp, savp) = match proto.as_str() {
                "RTP/AVP" | "RTP/AVP/UDP" => (Some(false), false),
                "RTP/AVP/TCP" => (Some(true), false),
                "RTP/SAVP" | "RTP/SAVP/UDP" => (Some(false), true),
                "RTP/SAVP/TCP" => (Some(true), true),
                _ => (None, false),
            };
            let (mut multicast, mut client, mut interleaved) = (false, None, None);
            for p in params {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                match k.trim().to_ascii_lowercase().as_str() {
                    "multicast" => multicast = true,
                    "client_port" => client = port_pair(v),
                    "interleaved" => {
                        interleaved =
                            port_pair(v).and_then(|(a, b)| Some((u8::try_from(a).ok()?, u8::try_from(b).ok()?)))
                    }
                    _ => {}
                }
            }
            let lower =
                match (tcp, multicast) {
                    // Port 0 is no port: nothing could be sent there (461).
                    (Some(false), false) => client
                        .filter(|(a, b)| *a != 0 && *b != 0)
                        .map(|(a, b)| Lower::Udp { client_rtp: a, client_rtcp: b }),
                    (Some(false), true) => {
                        Some(Lower::Multicast { group: std::net::Ipv4Addr::UNSPECIFIED, rtp: 0, rtcp: 0 })
                    }
                    (Some(true), _) => Some(interleaved.map_or(Lower::Interleaved { rtp: 0, rtcp: 1 }, |(a, b)| {
                        Lower::Interleaved { rtp: a, rtcp: b }
                    })),
                    _ => None,
                };
            TransportSpec { lower, multicast, savp, raw: spec.to_string() }
        })
        .collect()
}

/// A `Session` header: the id and the optional `timeout` (seconds).
pub fn parse_session(value: &str) -> (String, Option<u64>) {
    let mut parts = value.split(';').map(str::trim);
    let id = parts.next().unwrap_or("").to_string();
    let timeout = parts.find_map(|p| p.strip_prefix("timeout=").and_then(|t| t.trim().parse().ok()));
    (id, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_what_ffmpeg_sends() {
        // Captured from ffprobe 5.1 (fixtures/rtsp/README.md): OPTIONS then DESCRIBE.
        let captured = include_bytes!("../../fixtures/rtsp/ffprobe-tcp.txt");
        let l = Limits::default();
        let (a, n) = parse(captured, &l).unwrap().unwrap();
        let (b, m) = parse(&captured[n..], &l).unwrap().unwrap();
        assert_eq!(n + m, captured.len());
        let (Message::Request(a), Message::Request(b)) = (a, b) else { panic!("two requests") };
        assert_eq!((a.method.as_str(), a.headers.cseq()), ("OPTIONS", Some(1)));
        assert_eq!(
            (b.method.as_str(), b.uri.as_str(), b.headers.cseq()),
            ("DESCRIBE", "rtsp://127.0.0.1:18554/demo", Some(2))
        );
        assert_eq!(b.headers.get("accept"), Some("application/sdp"));
        assert_eq!(b.headers.get("USER-AGENT"), Some("Lavf59.27.100"));
    }

    #[test]
    fn pipelined_requests_and_interleaved_frames_come_apart() {
        let mut buf = Vec::new();
        buf.extend_from_slice(b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n\r\n");
        write_interleaved(&mut buf, 1, b"rtcp!");
        buf.extend_from_slice(b"GET_PARAMETER rtsp://h/s RTSP/1.0\r\nCSeq: 3\r\nContent-Length: 2\r\n\r\nab");
        let l = Limits::default();
        let (a, n1) = parse(&buf, &l).unwrap().unwrap();
        let (b, n2) = parse(&buf[n1..], &l).unwrap().unwrap();
        let (c, n3) = parse(&buf[n1 + n2..], &l).unwrap().unwrap();
        assert_eq!(n1 + n2 + n3, buf.len());
        assert!(matches!(a, Message::Request(ref r) if r.method == "OPTIONS"));
        assert_eq!(b, Message::Interleaved { channel: 1, data: b"rtcp!".to_vec() });
        assert!(matches!(c, Message::Request(ref r) if r.body == b"ab"));
    }

    #[test]
    fn partial_input_asks_for_more() {
        let full = b"SETUP rtsp://h/s/trackID=0 RTSP/1.0\r\nCSeq: 3\r\nContent-Length: 4\r\n\r\nbody";
        for cut in 0..full.len() {
            assert_eq!(parse(&full[..cut], &Limits::default()), Ok(None), "cut at {cut}");
        }
        assert!(parse(&b"$\x00\x00\x05abc"[..], &Limits::default()).unwrap().is_none());
    }

    #[test]
    fn limits_and_bad_input_give_the_status_a_server_answers() {
        let l = Limits { max_head: 64, max_headers: 2, max_body: 10 };
        let big = vec![b'A'; 100];
        assert_eq!(parse(&big, &l).unwrap_err().status(), 431);
        assert_eq!(parse(b"OPTIONS * RTSP/1.0\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n", &l).unwrap_err().status(), 431);
        assert_eq!(parse(b"OPTIONS * RTSP/1.0\r\nContent-Length: 11\r\n\r\n", &l).unwrap_err().status(), 413);
        assert_eq!(parse(b"OPTIONS * RTSP/2.0\r\n\r\n", &l).unwrap_err().status(), 505);
        assert_eq!(parse(b"OPTIONS *\r\n\r\n", &l).unwrap_err().status(), 400);
        assert_eq!(parse(b"OPTIONS * RTSP/1.0\r\nno colon\r\n\r\n", &l).unwrap_err().status(), 400);
        assert_eq!(parse(b"OPTIONS * RTSP/1.0\r\nContent-Length: x\r\n\r\n", &l).unwrap_err().status(), 400);
    }

    #[test]
    fn transports_real_clients_send() {
        let t = parse_transport("RTP/AVP;unicast;client_port=5000-5001");
        assert_eq!(t[0].lower, Some(Lower::Udp { client_rtp: 5000, client_rtcp: 5001 }));
        let t = parse_transport("RTP/AVP/TCP;unicast;interleaved=2-3");
        assert_eq!(t[0].lower, Some(Lower::Interleaved { rtp: 2, rtcp: 3 }));
        let t = parse_transport("RTP/AVP;multicast;port=5000-5001, RTP/AVP/TCP;interleaved=0-1");
        // (The server chooses a multicast group and its ports.)
        let asked = Lower::Multicast { group: std::net::Ipv4Addr::UNSPECIFIED, rtp: 0, rtcp: 0 };
        assert_eq!((t[0].lower, t[1].lower), (Some(asked), Some(Lower::Interleaved { rtp: 0, rtcp: 1 })));
        assert_eq!(parse_transport("RTP/AVP/TCP;multicast")[0].lower, Some(Lower::Interleaved { rtp: 0, rtcp: 1 }));
        assert_eq!(parse_transport("RAW/RAW/UDP;unicast")[0].lower, None);
        assert_eq!(parse_transport("RTP/AVP;unicast")[0].lower, None, "UDP without ports");
        assert_eq!(parse_session("12345678;timeout=60"), ("12345678".to_string(), Some(60)));
    }

    fn token() -> impl Strategy<Value = String> {
        "[A-Za-z][A-Za-z0-9-]{0,15}"
    }

    proptest! {
        /// parse(write(m)) == m for requests and responses.
        #[test]
        fn write_then_parse_gives_the_message_back(
            method in "[A-Z][A-Z_]{0,12}",
            uri in "rtsp://[a-z0-9.]{1,12}(:[0-9]{1,5})?/[A-Za-z0-9/_=.-]{0,30}",
            headers in prop::collection::vec((token(), "[ -~]{0,40}"), 0..8),
            body in prop::collection::vec(any::<u8>(), 0..200),
            status in 100u16..1000,
        ) {
            let mut h = Headers::default();
            for (n, v) in headers {
                if !n.eq_ignore_ascii_case("content-length") {
                    h.0.push((n, v.trim().to_string()));
                }
            }
            let req = Request { method, uri, headers: h.clone(), body: body.clone() };
            let mut out = Vec::new();
            req.write(&mut out);
            let (m, used) = parse(&out, &Limits::default()).unwrap().unwrap();
            prop_assert_eq!(used, out.len());
            let Message::Request(mut got) = m else { panic!("not a request") };
            got.headers.0.retain(|(n, _)| !n.eq_ignore_ascii_case("content-length"));
            prop_assert_eq!(got, req);

            let mut resp = Response::new(status, Some(7));
            resp.headers.0.extend(h.0);
            resp.body = body;
            let mut out = Vec::new();
            resp.write(&mut out);
            let (m, _) = parse(&out, &Limits::default()).unwrap().unwrap();
            let Message::Response(mut got) = m else { panic!("not a response") };
            got.headers.0.retain(|(n, _)| !n.eq_ignore_ascii_case("content-length"));
            prop_assert_eq!(got, resp);
        }

        /// Arbitrary bytes never panic, and a parsed message never claims more than it saw.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(Some((_, used))) = parse(&bytes, &Limits::default()) {
                prop_assert!(used <= bytes.len());
            }
            let _ = parse_transport(&String::from_utf8_lossy(&bytes));
        }
    }
}
