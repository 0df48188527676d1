//! The traffic tools: gen and sub measure a real relay; the bench scenarios run (quick mode)
//! and write output that parses; bad input gives a clear message and a non-zero exit.

mod common;
use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

fn fanout(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fanout")).args(args).output().unwrap()
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn gen_and_sub_measure_a_relay_over_udp_tcp_and_http() {
    let relay = Relay::start(&["--no-demo"]);
    let src = create_on_free_port(&relay, json!({"name":"m","source":{"udp":"127.0.0.1:0"}}));
    let dir = tmpdir("gensub");
    let (sub_json, gen_json) = (dir.join("sub.json"), dir.join("gen.json"));
    let api = relay.url("");
    let mut sub = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["sub", "--api", &api, "--session", "m", "--udp", "5", "--tcp", "2", "--http", "2", "--record", "200"])
        .args(["--duration", "30", "--idle-exit", "1", "--json", sub_json.to_str().unwrap()])
        // Three receiving threads of three subscribers each: every kind is received alike.
        .args(["--threads", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(sub.stdout.as_mut().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "sub: ready");
    relay.wait_sinks("m", 9);
    let out = fanout(&["gen", "--to", &src.to_string(), "--pps", "100", "--payload", "200", "--count", "100"]);
    assert!(out.status.success(), "{out:?}");
    let out2 = fanout(&[
        "gen",
        "--to",
        &src.to_string(),
        "--pps",
        "100",
        "--payload",
        "200",
        "--count",
        "0",
        "--json",
        gen_json.to_str().unwrap(),
    ]);
    assert!(out2.status.success());
    assert!(sub.wait().unwrap().success());
    let r: Value = serde_json::from_slice(&std::fs::read(&sub_json).unwrap()).unwrap();
    let subs = r["subscribers"].as_array().unwrap();
    assert_eq!(subs.len(), 9);
    for s in subs {
        assert_eq!(
            (s["received"].as_u64(), s["lost"].as_u64(), s["garbled"].as_u64()),
            (Some(100), Some(0), Some(0)),
            "{s}"
        );
        assert!(s["latency_mean_us"].as_f64().unwrap() > 0.0);
    }
    // One summary row per kind of subscriber.
    let rows = r["groups"].as_array().unwrap();
    let kinds: Vec<(&str, u64)> =
        rows.iter().map(|g| (g["kind"].as_str().unwrap(), g["subscribers"].as_u64().unwrap())).collect();
    assert_eq!(kinds, vec![("udp", 5), ("tcp", 2), ("http", 2)], "{}", r["groups"]);
    assert!(rows.iter().all(|g| g["loss_pct"] == 0.0), "{}", r["groups"]);
    // It says how busy it was, and whether its own receive buffers overflowed.
    assert_eq!(r["thread_busy_pct"].as_array().map(Vec::len), Some(3), "{}", r["thread_busy_pct"]);
    assert!(r["rcvbuf_errors"].is_u64(), "{r}");
    // gen reports the rate it achieved; the schedule holds at this rate.
    let text = String::from_utf8_lossy(&out.stderr);
    let pps: f64 = text.split("s: ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!((pps - 100.0).abs() < 10.0, "{text}");
    // The subscribers removed themselves.
    assert!(wait_for(std::time::Duration::from_secs(5), || relay.ok("GET", "/v1/sessions/m", None)["sinks"] == 0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tools_fail_clearly_on_bad_input() {
    let cases: [(&[&str], &str); 6] = [
        (&["sub", "--api", "http://127.0.0.1:1", "--session", "x", "--udp", "1"], "cannot reach the relay"),
        (&["sub", "--duration", "1"], "no subscribers"),
        (&["sub", "--tcp", "1"], "need --api"),
        (&["gen", "--to", "127.0.0.1:1", "--tcp", "--count", "1"], "cannot connect"),
        (&["gen", "--to", "127.0.0.1:9", "--payload", "20"], "too small"),
        (&["gen", "--to", "127.0.0.1:9", "--file", "/nonexistent.ts"], "reading /nonexistent.ts"),
    ];
    for (args, msg) in cases {
        let out = fanout(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(msg), "{args:?}: {err}");
    }
    // An API error from a running relay reaches the user with the relay's reason.
    let relay = Relay::start(&["--no-demo"]);
    let api = relay.url("");
    let out = fanout(&["sub", "--api", &api, "--session", "nope", "--udp", "1", "--duration", "0.1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("404") && err.contains("no session named"), "{err}");
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = fanout(&["sub", "--bind", &addr, "--udp", "1", "--duration", "0.1"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("cannot bind"));
    // More subscribers than open files allowed (hard limit lowered in a shell).
    let out = Command::new("sh")
        .args(["-c", &format!("ulimit -n 64 && exec {} sub --udp 100 --duration 0.1", env!("CARGO_BIN_EXE_fanout"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("open files") && err.contains("ulimit"), "{err}");
}

#[test]
fn gen_replays_a_ts_file_at_its_own_rate() {
    let relay = Relay::start(&["--no-demo"]);
    let src = create_on_free_port(&relay, json!({"name":"f","source":{"udp":"127.0.0.1:0"}}));
    let http = relay.http_subscribe("f");
    http.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts");
    let out = fanout(&["gen", "--to", &src.to_string(), "--file", demo, "--duration", "1"]);
    assert!(out.status.success(), "{out:?}");
    // 337 KB over 8 s in 1316-byte datagrams: ~32 per second.
    let st = relay.ok("GET", "/v1/sessions/f", None);
    let n = st["source"]["packets"].as_u64().unwrap();
    assert!((20..=40).contains(&n), "{st}");
    // The HTTP subscriber got bare TS (RTP stripped): every 188 bytes a sync byte.
    let mut buf = vec![0u8; 188 * 7];
    std::io::Read::read_exact(&mut &http, &mut buf).unwrap();
    assert!(buf.chunks(188).all(|p| p[0] == 0x47));
}

/// `sub` on a stream that carries no probe (the demo): what arrives is counted as garbled,
/// and the subscribers are not "silent".
#[test]
fn sub_counts_a_stream_without_probes() {
    let relay = Relay::start(&[]);
    let dir = tmpdir("noprobe");
    let json_path = dir.join("sub.json");
    let out = fanout(&[
        "sub",
        "--api",
        &relay.url(""),
        "--session",
        "demo",
        "--udp",
        "2",
        "--http",
        "1",
        "--duration",
        "3",
        "--json",
        json_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    for g in r["groups"].as_array().unwrap() {
        assert_eq!(g["silent"], 0, "{g}");
        assert!(g["garbled"].as_u64() > Some(0) && g["bytes"].as_u64() > Some(10_000), "{g}");
    }
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("GARBLED") && table.contains("http"), "{table}");
}

/// `sub --read` of a WHEP URL: WebRTC viewers (a str0m peer each, as `bench peers` runs
/// them) connect to the relay's demo, are listed while they play, and count its H.264.
#[test]
fn sub_reads_over_webrtc() {
    let relay = Relay::start(&[]);
    let url = relay.url("/demo/whep");
    let relay_ref = &relay;
    let listed = std::thread::scope(|s| {
        let seen = s.spawn(move || {
            wait_for(std::time::Duration::from_secs(20), || {
                relay_ref.ok("GET", "/v1/sessions/demo", None)["webrtc"].as_array().is_some_and(|v| v.len() == 3)
            })
        });
        let out = fanout(&["sub", "--read", &url, "--count", "3", "--duration", "2"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("sub: ready"), "{text}");
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["players"], 3);
        // 2 s and more of the demo's video (about 300 kbit/s) each.
        assert!(last["least_bytes"].as_u64().unwrap() > 40_000, "{last}");
        seen.join().unwrap()
    });
    assert!(listed, "the relay did not list 3 WebRTC viewers");
}
