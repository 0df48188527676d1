//! Recognising an HTTP stream subscription (`GET /v1/sessions/{name}/stream`) from the head
//! of a request, before any HTTP library sees it: the relay then hands the raw socket to its
//! data plane. Everything else is left to the API server.

/// A stream request, if this request head is one.
#[derive(Debug, PartialEq, Eq)]
pub struct StreamRequest<'a> {
    pub session: &'a str,
    pub query: Option<&'a str>,
    pub authorization: Option<&'a str>,
    /// Length of the request head, including the blank line.
    pub head_len: usize,
}

/// Looks at a (possibly partial) request head. `None`: not complete yet. `Some(None)`: not a
/// stream request (hand it to the API).
pub fn parse_stream_request(buf: &[u8]) -> Option<Option<StreamRequest<'_>>> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let mut parts = lines.next()?.split(' ');
    let (method, target) = (parts.next()?, parts.next()?);
    if method != "GET" {
        return Some(None);
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let Some(session) = path.strip_prefix("/v1/sessions/").and_then(|r| r.strip_suffix("/stream")) else {
        return Some(None);
    };
    if session.is_empty() || session.contains('/') {
        return Some(None);
    }
    let authorization = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim());
    Some(Some(StreamRequest { session, query, authorization, head_len: end }))
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    proptest! {
        #[test]
        fn never_panics_and_head_len_is_inside(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Some(Some(r)) = parse_stream_request(&buf) {
                prop_assert!(r.head_len <= buf.len());
                prop_assert!(!r.session.is_empty() && !r.session.contains('/'));
            }
        }
    }

    #[test]
    fn recognises_stream_requests() {
        let r = b"GET /v1/sessions/tv1/stream?token=x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer t\r\n\r\n";
        let p = parse_stream_request(r).unwrap().unwrap();
        assert_eq!(p.session, "tv1");
        assert_eq!(p.query, Some("token=x"));
        assert_eq!(p.authorization, Some("Bearer t"));
        assert_eq!(p.head_len, r.len());
        assert_eq!(parse_stream_request(b"GET /v1/sessions/tv1/stream HTTP/1.1\r\n"), None);
        assert_eq!(parse_stream_request(b"GET /v1/sessions HTTP/1.1\r\n\r\n"), Some(None));
        assert_eq!(parse_stream_request(b"POST /v1/sessions/a/stream HTTP/1.1\r\n\r\n"), Some(None));
        assert_eq!(parse_stream_request(b"GET /v1/sessions/a/b/stream HTTP/1.1\r\n\r\n"), Some(None));
    }
}
