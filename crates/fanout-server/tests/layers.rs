//! Layer statistics of a relay session (issue 6): a scalable H.264 stream (mediasoup's
//! two spatial × three temporal layers) sent through `fanout gen`; the session's status
//! shows the moving average rate of every layer.

mod common;
use common::*;
use serde_json::json;
use std::process::Command;

const STREAM: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/testdata/video/h264-svc/mediasoup_naluInfo.264");

#[test]
fn a_session_shows_the_rate_of_each_layer() {
    if !std::path::Path::new(STREAM).exists() {
        assert!(std::env::var_os("CI").is_none(), "{STREAM} is missing");
        eprintln!("\n*** SKIPPED: {STREAM} is missing ***\n");
        return;
    }
    let relay = Relay::start(&["--no-demo"]);
    let src =
        create_on_free_port(&relay, json!({ "name": "svc", "source": { "udp": "127.0.0.1:0" }, "video": "h264" }));
    // 100 access units at 50 fps: 2 s.
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["gen", "--to", &src.to_string(), "--file", STREAM, "--fps", "50", "--duration", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = relay.ok("GET", "/v1/sessions/svc", None);
    let l = &s["layers"];
    assert_eq!(l["codec"], "h264", "{s}");
    let mut seen: Vec<(u64, u64, f64)> = l["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["did"].as_u64().unwrap(), x["tid"].as_u64().unwrap(), x["bps"].as_f64().unwrap()))
        .collect();
    seen.sort_by_key(|x| (x.0, x.1));
    let ids: Vec<(u64, u64)> = seen.iter().map(|x| (x.0, x.1)).collect();
    assert_eq!(ids, vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)], "{l}");
    assert!(seen.iter().all(|x| x.2 > 0.0), "every layer has a rate: {l}");
    // The enhancement layer (416x256) costs more than the base (208x128).
    let rate = |did| seen.iter().filter(|x| x.0 == did).map(|x| x.2).sum::<f64>();
    assert!(rate(1) > rate(0), "{l}");
    assert!(l["not_layered_bps"].as_f64().unwrap() > 0.0, "parameter sets: {l}");
    assert_eq!(l["unknown_packets"], 0, "{l}");
}
