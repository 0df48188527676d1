//! The stream-request recogniser never panics and never points past its input.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(Some(r)) = fanout_proto::http::parse_stream_request(data) {
        assert!(r.head_len <= data.len());
    }
});
