//! The dashboard in a real browser (issue 16): headless Chromium, driven over WebDriver by
//! Debian's chromedriver, opens `/`, finds the demo session with live numbers that change,
//! plays its preview (the video's time advances) and logs no error on its console.
//! `FANOUT_UI_SCREENSHOT=path` also saves a screenshot there (docs/dashboard.png is one).
//! And hls.js, the common web player, plays a session from a page of another origin.

mod common;
use common::browser::{have_chromium, Driver};
use common::*;
use serde_json::{json, Value};

use std::time::Duration;

#[test]
fn the_dashboard_shows_live_sessions_and_plays_a_preview() {
    if !have_chromium() {
        return;
    }
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    // A second session, to see more than one card (no source sends to it: it waits).
    relay.ok("POST", "/v1/sessions", Some(json!({"name": "cam2", "source": {"udp": "127.0.0.1:0"}})));
    let d = Driver::start();
    d.post("url", json!({ "url": relay.url("/") }));

    // The demo's card, its input rate filled in and changing from second to second.
    let rate = || d.js("const c = document.querySelector('[data-session=demo] .in'); return c ? c.textContent : null;");
    assert!(
        wait_for(Duration::from_secs(10), || rate()
            .as_str()
            .is_some_and(|r| r.parse::<f64>().is_ok_and(|v| v > 100.0))),
        "the demo's input rate never showed: {:?}",
        rate()
    );
    let cards = d.js("return [...document.querySelectorAll('.card .name')].map(e => e.textContent);");
    assert_eq!(cards, json!(["cam2", "demo"]));
    let plot = || d.js("return document.querySelector('[data-session=demo] .plot-in').toDataURL();");
    let before = plot();
    std::thread::sleep(Duration::from_millis(2500));
    assert_ne!(plot(), before, "the rate plot did not move");

    // The preview of the first session that sends plays by itself (issue 30 item 17): the
    // video's time advances.
    let time =
        || d.js("return document.querySelector('[data-session=demo] video').currentTime;").as_f64().unwrap_or(0.0);
    let why = || d.js("return document.querySelector('[data-session=demo] .why').textContent;");
    assert!(wait_for(Duration::from_secs(20), || time() > 0.5), "the preview did not start: {:?}", why());
    let t0 = time();
    std::thread::sleep(Duration::from_secs(3));
    let t1 = time();
    assert!(t1 - t0 > 2.0, "the preview stalled: {t0} then {t1}: {:?}", why());
    // While it plays, the card counts it: one HLS player, and what it is sent.
    let number = |k: &str| {
        d.js(&format!("return document.querySelector('[data-session=demo] .{k}').textContent;"))
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(wait_for(Duration::from_secs(10), || number("hls") >= 1.0), "HLS players: {}", number("hls"));
    assert!(wait_for(Duration::from_secs(5), || number("out") > 50.0), "kbit/s out: {}", number("out"));
    let engine = d.js("return document.getElementById('engine').textContent;");
    assert!(engine.as_str().is_some_and(|e| e.contains("2 sessions")), "{engine}");
    let latency = || d.js("return document.querySelector('[data-session=demo] .latency').textContent;");
    assert!(wait_for(Duration::from_secs(5), || latency().as_str().is_some_and(|l| l.starts_with("HLS: "))));

    // The switch beside it: the same preview over WebRTC, how far behind it says, the card
    // counts the viewer; stopped, the viewer is gone.
    let toggle = "document.querySelector('[data-session=demo] .play').click(); return true;";
    d.js(toggle);
    d.js("document.querySelector('[data-session=demo] .how').value = 'webrtc'; return true;");
    d.js(toggle);
    let t0 = time();
    assert!(wait_for(Duration::from_secs(15), || time() > t0 + 2.0), "the WebRTC preview did not play: {:?}", why());
    assert!(wait_for(Duration::from_secs(10), || number("webrtc") >= 1.0), "WebRTC viewers: {}", number("webrtc"));
    assert!(
        wait_for(Duration::from_secs(10), || latency().as_str().is_some_and(|l| l.starts_with("WebRTC: decoded"))),
        "{:?}",
        latency()
    );
    eprintln!("dashboard: {} / {}", latency(), why());
    d.js(toggle);
    assert!(wait_for(Duration::from_secs(10), || relay.ok("GET", "/v1/sessions/demo", None)["webrtc"] == json!([])));

    // The card's readers: an HTTP TS reader is listed, and its button ends it (the stream's
    // body ends).
    let mut ts = relay.http_subscribe("demo");
    d.js("document.querySelector('[data-session=demo] .readers-box').open = true; return true;");
    let row = "[...document.querySelectorAll('[data-session=demo] .readers-table tr')].find(r => r.cells[0].textContent === 'http_ts')";
    assert!(
        wait_for(Duration::from_secs(5), || d.js(&format!("return !!{row};")) == json!(true)),
        "readers shown: {}",
        d.js("return document.querySelector('[data-session=demo] .readers-table').textContent;")
    );
    d.js(&format!("{row}.querySelector('.kick').click(); return true;"));
    assert!(stream_ends_within(&mut ts, Duration::from_secs(10)), "the stream ended from the dashboard did not end");

    if let Some(path) = std::env::var_os("FANOUT_UI_SCREENSHOT") {
        let png: Value = ureq::get(&format!("{}/screenshot", d.url)).call().unwrap().into_json().unwrap();
        let png = &png["value"];
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
    // Nothing on the console worse than information.
    let log = d.post("se/log", json!({ "type": "browser" }));
    let bad: Vec<&Value> =
        log.as_array().unwrap().iter().filter(|e| e["level"] == "SEVERE" || e["level"] == "WARNING").collect();
    assert!(bad.is_empty(), "console: {bad:#?}");
}

/// hls.js (testdata/web, the player most web pages use) plays the demo's HLS from a page of
/// another origin: the relay lets any origin read HLS and streams (CORS), the video's time
/// advances, and hls.js reports no fatal error.
#[test]
fn hls_js_plays_the_session_from_another_origin() {
    if !have_chromium() {
        return;
    }
    let relay = Relay::start(&[]);
    let playlist = relay.url("/v1/sessions/demo/hls/index.m3u8");
    let r = ureq::get(&playlist).set("Origin", "https://player.example").call().unwrap();
    assert_eq!(r.header("access-control-allow-origin"), Some("*"), "the playlist");
    let r = ureq::head(&relay.url("/v1/sessions/demo/stream")).call().unwrap();
    assert_eq!(r.header("access-control-allow-origin"), Some("*"), "the MPEG-TS stream");

    // A page of another origin (another port), as a site embedding the player would be.
    let site = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let page = format!("http://localhost:{}/", site.local_addr().unwrap().port());
    std::thread::spawn(move || {
        for c in site.incoming().flatten() {
            let mut c = c;
            let mut head = [0u8; 2048];
            let _ = std::io::Read::read(&mut c, &mut head);
            let body = "<!doctype html><title>player</title><video muted></video>";
            let _ = std::io::Write::write_all(
                &mut c,
                format!("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
                    .as_bytes(),
            );
        }
    });
    let d = Driver::start();
    d.post("url", json!({ "url": page }));
    let lib =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/web/hls.js/hls.light.min.js"))
            .unwrap();
    let load = "const s = document.createElement('script'); s.textContent = arguments[0]; \
                document.head.appendChild(s); return typeof Hls === 'function' && Hls.isSupported();";
    assert_eq!(d.post("execute/sync", json!({ "script": load, "args": [lib] })), json!(true), "hls.js loads");
    let play = "const v = document.querySelector('video'); window.fatal = []; \
                if (window.h) { window.h.destroy(); } const h = new Hls({ lowLatencyMode: arguments[1] }); window.h = h; \
                h.on(Hls.Events.ERROR, (e, d) => { if (d.fatal) window.fatal.push(d.type + ': ' + d.details); }); \
                h.loadSource(arguments[0]); h.attachMedia(v); v.play(); return true;";
    d.post("execute/sync", json!({ "script": play, "args": [playlist, true] }));
    let time = || d.js("return document.querySelector('video').currentTime;").as_f64().unwrap_or(0.0);
    let fatal = || d.js("return window.fatal;");
    assert!(wait_for(Duration::from_secs(25), || time() > 0.5), "hls.js did not start: {:?}", fatal());
    let t0 = time();
    std::thread::sleep(Duration::from_secs(3));
    let t1 = time();
    assert!(t1 - t0 > 2.0, "hls.js stalled: {t0} then {t1}: {:?}", fatal());
    assert_eq!(fatal(), json!([]));
    // Low-Latency HLS: hls.js plays from parts, about PART-HOLD-BACK (1.5 s) behind the
    // newest part, not three 2 s segments behind.
    let latency = d.js("return window.h.latency;").as_f64().unwrap_or(f64::NAN);
    let low = d.js("return window.h.lowLatencyMode;");
    eprintln!("hls.js: {latency:.2} s behind the live edge (low-latency mode {low})");
    assert!(low == json!(true) && latency > 0.0 && latency < 3.0, "hls.js {latency} s behind live");
    // Beside it, the same player on whole segments.
    d.post("execute/sync", json!({ "script": play, "args": [playlist, false] }));
    assert!(wait_for(Duration::from_secs(25), || time() > 0.5), "hls.js on segments did not start: {:?}", fatal());
    std::thread::sleep(Duration::from_secs(3));
    let segments = d.js("return window.h.latency;").as_f64().unwrap_or(f64::NAN);
    eprintln!("hls.js on whole segments: {segments:.2} s behind the live edge");
    assert!(segments > latency, "parts {latency} s, segments {segments} s");
    let log = d.post("se/log", json!({ "type": "browser" }));
    let bad: Vec<&Value> = log.as_array().unwrap().iter().filter(|e| e["level"] == "SEVERE").collect();
    assert!(bad.is_empty(), "console: {bad:#?}");
}
