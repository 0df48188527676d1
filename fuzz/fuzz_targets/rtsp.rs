//! The RTSP connection parser on arbitrary bytes: never a panic, never a message longer
//! than its input, and a parsed request or response writes back to bytes that parse to it.
#![no_main]
use fanout_proto::rtsp::{parse, parse_session, parse_transport, Limits, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_head: 2048, max_headers: 32, max_body: 4096 };
    let mut rest = data;
    while let Ok(Some((msg, used))) = parse(rest, &limits) {
        assert!(used > 0 && used <= rest.len());
        let mut out = Vec::new();
        match &msg {
            Message::Request(r) => r.write(&mut out),
            Message::Response(r) => r.write(&mut out),
            Message::Interleaved { .. } => {}
        }
        if !out.is_empty() {
            let again = parse(&out, &Limits::default()).expect("our own output parses");
            assert!(again.is_some(), "our own output is complete");
        }
        rest = &rest[used..];
    }
    let text = String::from_utf8_lossy(data);
    let _ = parse_transport(&text);
    let _ = parse_session(&text);
});
