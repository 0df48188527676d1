//! The request-head classifier never panics and never points past its input or its limit;
//! a `Range` header never asks for bytes outside the resource.
#![no_main]
use fanout_proto::http::{byte_range, classify, Head};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match classify(data, 1024) {
        Head::Stream(r) => assert!(r.head_len <= data.len() && r.head_len <= 1024),
        Head::Incomplete => assert!(data.len() < 1024),
        Head::Reject(status, _) => assert!([400, 414, 431].contains(&status)),
        Head::Api => {}
    }
    let len = data.first().map_or(0, |b| u64::from(*b) * 7);
    if let Ok(Some((a, b))) = byte_range(std::str::from_utf8(data).ok(), len) {
        assert!(a <= b && b < len);
    }
});
