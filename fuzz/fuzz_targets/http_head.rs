//! The request-head classifier (and the RTSP tunnel's base64 decoder) never panics and never points past its input or its limit;
//! a `Range` header never asks for bytes outside the resource; a name's steps made one in
//! a request path change nothing but those slashes.
#![no_main]
use fanout_proto::http::{byte_range, classify, Head};
use fanout_proto::name::encode_in_http_path;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match classify(data, 1024) {
        Head::Stream(r) => assert!(r.head_len <= data.len() && r.head_len <= 1024),
        Head::Incomplete => assert!(data.len() < 1024),
        Head::Reject(status, _) => assert!([400, 414, 431].contains(&status)),
        Head::Tunnel(t) => {
            assert!(t.head_len <= data.len() && t.cookie.len() <= fanout_proto::http::MAX_COOKIE)
        }
        Head::Api => {}
    }
    // The tunnel's decoder takes any bytes: decoded or refused, never more than 3/4 of them.
    let mut out = Vec::new();
    if fanout_proto::http::Base64Stream::default().push(data, &mut out).is_ok() {
        assert!(out.len() * 4 <= data.len() * 3);
    }
    let len = data.first().map_or(0, |b| u64::from(*b) * 7);
    if let Ok(Some((a, b))) = byte_range(std::str::from_utf8(data).ok(), len) {
        assert!(a <= b && b < len);
    }
    if let Some(path) = std::str::from_utf8(data).ok().filter(|p| !p.contains("%2F")) {
        if let Some(out) = encode_in_http_path(path) {
            assert_eq!(out.replace("%2F", "/"), path);
        }
    }
});
