//! What a client's credentials reach of `proto::auth`: a JWT (from a bearer header, a query or
//! a password) checked against a JWKS, and the permissions its claim lists; a path rule an
//! operator's service may hand back; an RTSP request's action. Never a panic, never a token
//! taken without a key.
#![no_main]
use fanout_proto::auth::{verify_jwt, JwkSet, PathRule};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // No keys: nothing verifies.
    let none = JwkSet { keys: Vec::new() };
    assert!(verify_jwt(&text, &none, "fanout_permissions", 1_800_000_000).is_err());
    // A JWKS from the bytes, and the bytes as a token against it.
    if let Ok(set) = serde_json::from_slice::<JwkSet>(data) {
        let _ = verify_jwt(&text, &set, "fanout_permissions", 0);
    }
    if let Ok(rule) = PathRule::parse(Some(&text)) {
        let _ = rule.matches("cam1");
    }
    if let Ok(Some((fanout_proto::rtsp::Message::Request(r), _))) =
        fanout_proto::rtsp::parse(data, &fanout_proto::rtsp::Limits::default())
    {
        let _ = fanout_proto::rtsp::server::auth_action(&r);
    }
});
