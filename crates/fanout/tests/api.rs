//! The control API's answers to bad input, the token, the config file, and `fanout ctl`.

mod common;
use common::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

#[test]
fn bad_requests_get_clear_4xx_and_change_nothing() {
    let relay = Relay::start(&["--no-demo"]);
    let src = create_on_free_port(&relay, json!({"name":"tv1","source":{"udp":"127.0.0.1:0"}}));
    let cases = [
        ("POST", "/v1/sessions", json!({"name":"x","source":{"udp":"127.0.0.1:1"},"bogus":1}), 422, "unknown field"),
        ("POST", "/v1/sessions", json!({"name":"x","source":{"udp":"nope"}}), 422, "invalid socket address"),
        ("POST", "/v1/sessions", json!({"name":"tv1","source":{"udp":"127.0.0.1:0"}}), 409, "already exists"),
        ("POST", "/v1/sessions", json!({"name":"x","source":{"udp":src}}), 409, "cannot receive on udp"),
        ("POST", "/v1/sessions", json!({"name":"x","source":{"demo":true},"priority":8}), 400, "priority 8"),
        ("POST", "/v1/sessions/nope/sinks", json!({"udp":"127.0.0.1:9"}), 404, "no session named"),
        ("POST", "/v1/sessions/tv1/sinks", json!({"udp":"127.0.0.1:9","tcp":"127.0.0.1:9"}), 400, "exactly one"),
        ("POST", "/v1/sessions/tv1/sinks", json!({"tcp":"127.0.0.1:1"}), 502, "cannot connect"),
        ("GET", "/v1/sessions/tv1/sinks/99", json!(null), 404, "has no sink 99"),
        ("GET", "/v1/sessions/tv1/sinks/abc", json!(null), 400, "not a number"),
        ("DELETE", "/v1/sessions/nope", json!(null), 404, "no session named"),
        ("GET", "/v1/nothing", json!(null), 404, "no such API path"),
    ];
    for (method, path, body, code, msg) in cases {
        let (got, v) = relay.call(method, path, (!body.is_null()).then_some(body.clone()));
        assert_eq!(got, code, "{method} {path} {body}: {v}");
        assert!(v["error"].as_str().is_some_and(|e| e.contains(msg)), "{method} {path}: {v}");
    }
    // Invalid JSON and an oversized body.
    let raw = |body: &str| {
        let mut s = TcpStream::connect(relay.api).unwrap();
        write!(s, "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(raw("{\"name\":").starts_with("HTTP/1.1 400"));
    let big = format!("{{\"name\":\"{}\"}}", "a".repeat(2_000_000));
    assert!(raw(&big).starts_with("HTTP/1.1 413"));
    let v = relay.ok("GET", "/v1/sessions", None);
    assert_eq!(v["sessions"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["sessions"][0]["sinks"], 0, "{v}");
}

#[test]
fn sink_lifecycle_and_flush() {
    let relay = Relay::start(&["--no-demo"]);
    relay.ok("POST", "/v1/sessions", Some(json!({"name":"a","source":{"udp":"127.0.0.1:0"},"priority":5})));
    let ids: Vec<u64> = (0..3)
        .map(|_| {
            relay.ok("POST", "/v1/sessions/a/sinks", Some(json!({"udp": free_udp_port()})))["id"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(relay.ok("GET", &format!("/v1/sessions/a/sinks/{}", ids[0]), None)["state"], "active");
    assert_eq!(relay.call("DELETE", &format!("/v1/sessions/a/sinks/{}", ids[0]), None).0, 204);
    assert_eq!(relay.call("DELETE", &format!("/v1/sessions/a/sinks/{}", ids[0]), None).0, 404);
    assert_eq!(relay.ok("DELETE", "/v1/sessions/a/sinks", None)["removed"], 2);
    assert_eq!(relay.ok("GET", "/v1/sessions/a", None)["priority"], 5);
    let metrics = ureq::get(&relay.url("/metrics")).call().unwrap().into_string().unwrap();
    assert!(metrics.contains("fanout_session_sinks{session=\"a\"} 0"), "{metrics}");
    assert_eq!(relay.call("DELETE", "/v1/sessions/a", None).0, 204);
    assert_eq!(relay.call("GET", "/v1/sessions/a", None).0, 404);
}

#[test]
fn token_is_required_when_configured() {
    let relay = Relay::start(&["--no-demo", "--token", "s3cret"]);
    let anon = ureq::post(&relay.url("/v1/sessions")).send_json(json!({"name":"x","source":{"demo":true}}));
    match anon {
        Err(ureq::Error::Status(401, r)) => assert!(r.into_string().unwrap().contains("bearer token")),
        other => panic!("expected 401, got {other:?}"),
    }
    let wrong = ureq::get(&relay.url("/v1/sessions")).set("Authorization", "Bearer nope").call();
    assert!(matches!(wrong, Err(ureq::Error::Status(401, _))));
    let mut s = TcpStream::connect(relay.api).unwrap();
    write!(s, "GET /v1/sessions/x/stream HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    assert_eq!(relay.ok("GET", "/v1/sessions", None)["sessions"].as_array().unwrap().len(), 0);
}

#[test]
fn config_file_declares_sessions_and_bad_ones_are_rejected_with_the_line() {
    let dir = std::env::temp_dir().join(format!("fanout-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    let sink = free_udp_port();
    std::fs::write(
        &good,
        format!("demo = false\nring = 128\n[[session]]\nname = \"tv1\"\nsource = {{ udp = \"127.0.0.1:0\" }}\npriority = 3\n[[session.sink]]\nudp = \"{sink}\"\n"),
    )
    .unwrap();
    let relay = Relay::start(&["--config", good.to_str().unwrap()]);
    let v = relay.ok("GET", "/v1/sessions/tv1", None);
    assert_eq!(
        (v["priority"].as_u64(), v["ring_capacity"].as_u64(), v["sinks"].as_u64()),
        (Some(3), Some(128), Some(1))
    );
    drop(relay);

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "workers = 1\n[[session]]\nname = \"x\"\nsource = { udp = \"localhost\" }\n").unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_fanout")).args(["serve", "--config", bad.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("line 4"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ctl_wraps_the_api() {
    let relay = Relay::start(&["--no-demo"]);
    let ctl = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .arg("ctl")
            .args(["--api", &relay.url("")])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let src = "127.0.0.1:0";
    let (ok, out) = ctl(&["create", "tv1", "--udp", src, "--priority", "2"]);
    assert!(ok, "{out}");
    let (ok, out) = ctl(&["add-sink", "tv1", "--udp", "127.0.0.1:6000"]);
    assert!(ok && out.contains("sink 1 added"), "{out}");
    let (ok, out) = ctl(&["sessions"]);
    assert!(ok && out.contains("NAME") && out.contains("tv1"), "{out}");
    let (ok, out) = ctl(&["--json", "sink", "tv1", "1"]);
    assert!(ok && serde_json::from_str::<serde_json::Value>(&out).unwrap()["udp"] == "127.0.0.1:6000", "{out}");
    // Layer caps: a layered session's sink, capped at the base layer, then uncapped.
    let (ok, out) = ctl(&["create", "svc", "--udp", src, "--video", "h264"]);
    assert!(ok, "{out}");
    let (ok, out) = ctl(&["add-sink", "svc", "--udp", "127.0.0.1:6002"]);
    assert!(ok, "{out}");
    let (ok, out) = ctl(&["--json", "pin", "svc", "1", "--did", "0", "--tid", "0"]);
    let pin = serde_json::from_str::<serde_json::Value>(&out).unwrap()["layers"]["pin"].clone();
    assert!(ok && pin == serde_json::json!({ "did": 0, "qid": 15, "tid": 0 }), "{out}");
    let (ok, out) = ctl(&["--json", "unpin", "svc", "1"]);
    assert!(ok && serde_json::from_str::<serde_json::Value>(&out).unwrap()["layers"]["pin"].is_null(), "{out}");
    let (ok, out) = ctl(&["pin", "tv1", "1", "--tid", "0"]);
    assert!(!ok && out.contains("400") && out.contains("no layered video"), "{out}");
    let (ok, out) = ctl(&["session", "nope"]);
    assert!(!ok && out.contains("404") && out.contains("no session named"), "{out}");
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["ctl", "--api", "http://127.0.0.1:1", "sessions"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("is `fanout serve` running?"));
}

#[test]
fn api_port_in_use_is_a_clear_error() {
    let relay = Relay::start(&["--no-demo"]);
    let out =
        Command::new(env!("CARGO_BIN_EXE_fanout")).args(["serve", "--api", &relay.api.to_string()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on"), "{out:?}");
}

/// Issue 30 item 17: the sessions made through the API, with their sinks, come back after a
/// restart (the state file); a deleted one, a removed sink and the config's own sessions are
/// not written there; a second relay on the same file runs without it.
#[test]
fn api_sessions_survive_a_restart() {
    let dir = std::env::temp_dir().join(format!("fanout-state-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("sessions.json");
    let _ = std::fs::remove_file(&state);
    let cfg = dir.join("fanout.toml");
    std::fs::write(&cfg, "[[session]]\nname = \"fromcfg\"\nsource = { udp = \"127.0.0.1:0\" }\n").unwrap();
    let args = ["--no-demo", "--config", cfg.to_str().unwrap(), "--state-file", state.to_str().unwrap()];
    let relay = Relay::start(&args);
    let make = |name: &str| {
        relay.ok(
            "POST",
            "/v1/sessions",
            Some(serde_json::json!({"name": name, "source": {"udp": "127.0.0.1:0"}, "priority": 2, "payload": "raw"})),
        )
    };
    make("kept");
    make("gone");
    let sink =
        |to: &str| relay.ok("POST", "/v1/sessions/kept/sinks", Some(serde_json::json!({ "udp": to })))["id"].clone();
    sink("127.0.0.1:6010");
    let removed = sink("127.0.0.1:6011");
    relay.ok("DELETE", &format!("/v1/sessions/kept/sinks/{removed}"), None);
    relay.ok("DELETE", "/v1/sessions/gone", None);

    // A second relay on the same file while the first runs: it starts, without the state.
    let second = Relay::start(&["--no-demo", "--state-file", state.to_str().unwrap()]);
    assert_eq!(second.ok("GET", "/v1/sessions", None)["sessions"].as_array().unwrap().len(), 0);
    drop(second);
    drop(relay);

    let relay = Relay::start(&args);
    let names: Vec<String> = relay.ok("GET", "/v1/sessions", None)["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["fromcfg", "kept"]);
    let kept = relay.ok("GET", "/v1/sessions/kept", None);
    assert_eq!((kept["priority"].as_u64(), kept["spec"]["payload"].as_str()), (Some(2), Some("raw")), "{kept}");
    let sinks = relay.ok("GET", "/v1/sessions/kept/sinks", None);
    let to: Vec<&str> = sinks["sinks"].as_array().unwrap().iter().filter_map(|s| s["udp"].as_str()).collect();
    assert_eq!(to, ["127.0.0.1:6010"], "{sinks}");
    let text = std::fs::read_to_string(&state).unwrap();
    assert!(text.contains("\"kept\"") && !text.contains("fromcfg") && !text.contains("\"gone\""), "{text}");
    drop(relay);
    std::fs::remove_dir_all(&dir).unwrap();
}
