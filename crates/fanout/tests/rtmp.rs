//! RTMP (issue 32): ffmpeg publishes the demo clip over RTMP into a `publish` path, and plays
//! it back over RTSP and RTMP picture for picture, and as MPEG-TS and HLS; a second
//! publisher, a path that takes none and bad credentials are refused; a publisher that
//! leaves is followed by the next one; a path pulled over RTSP plays over RTMP.

mod common;
use common::browser::{have_chromium, Driver};
use common::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CONFIG: &str = "[[session]]\nname = \"cam\"\nsource = { publish = true }\n";

const DEMO: &str = DEMO_TS;

fn rtmp_addr(relay: &Relay) -> String {
    relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().expect("the relay listens for RTMP").to_string()
}

fn publisher(relay: &Relay) -> Value {
    relay.ok("GET", "/v1/sessions/cam", None)["publisher"].clone()
}

#[test]
fn ffmpeg_publishes_over_rtmp_and_plays_back_over_rtsp_http_and_hls() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let rtmp = rtmp_addr(&relay);
    let session = relay.ok("GET", "/v1/sessions/cam", None);
    assert_eq!(session["rtmp_publish_url"], format!("rtmp://{rtmp}/cam"), "{session}");
    // OBS's form: the app as "Server", the path as "Stream Key".
    let first = publish(&format!("rtmp://{rtmp}/live/cam"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    assert_eq!(publisher(&relay)["transport"], "rtmp", "{}", publisher(&relay));
    let m = metrics(&relay);
    assert!(m.contains("fanout_publishing{session=\"cam\",protocol=\"rtmp\"} 1"), "{m}");
    assert!(m.contains("fanout_publishes_total{session=\"cam\"} 1"), "{m}");

    // Played back over RTSP: 100 pictures, each the clip's, in order.
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
    let want = pictures(&["-i", DEMO]);
    assert_eq!(want.len(), 200, "8 s at 25 fps");
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "100"]);
    assert_eq!(got.len(), 100);
    let looped: Vec<String> = want.iter().chain(&want).cloned().collect();
    assert!(
        looped.windows(got.len()).any(|w| w == got.as_slice()),
        "the pictures played back are not a run of the clip's"
    );
    // As MPEG-TS over HTTP and as HLS, with its audio.
    for path in ["/v1/sessions/cam/stream", "/v1/sessions/cam/hls/index.m3u8"] {
        let probe = Command::new("timeout")
            .args(["30", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
            .arg(relay.url(path))
            .output()
            .unwrap();
        let codecs = String::from_utf8_lossy(&probe.stdout).to_string();
        assert!(codecs.contains("h264") && codecs.contains("aac"), "{path}: {codecs}");
        let (ok, log) = ffmpeg_decode(&relay.url(path), &[], 3);
        assert!(ok && decoded_frames(&log) >= 65, "{path}: {log}");
        assert!(!log.contains("[h264 @"), "{path}: decode errors: {log}");
    }

    // A second publisher of the path, one of a path that takes none, and a player: refused.
    let (ok, log) = try_publish(&format!("rtmp://{rtmp}/cam"));
    assert!(!ok, "a second publisher was let in: {log}");
    // Nor may an RTSP publisher take the path meanwhile (455 at its ANNOUNCE).
    let rtsp_pub = Command::new("timeout")
        .args(["20", "ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-i", DEMO, "-t", "2", "-an", "-c", "copy"])
        .args(["-f", "rtsp", "-rtsp_transport", "tcp", &url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&rtsp_pub.stderr);
    assert!(!rtsp_pub.status.success() && said.contains("455"), "an RTSP publisher beside the RTMP one: {said}");
    let (ok, _) = try_publish(&format!("rtmp://{rtmp}/nosuch"));
    assert!(!ok, "a path that does not exist took a publisher");
    assert_eq!(publisher(&relay)["publishes"], 1, "{}", publisher(&relay));
    // Played back over RTMP too: a run of the clip's pictures.
    let player = Kill(
        Command::new("timeout")
            .args(["20", "ffmpeg", "-nostdin", "-loglevel", "error", "-i", &format!("rtmp://{rtmp}/cam")])
            .args(["-t", "15", "-f", "null", "-"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let players = || relay.ok("GET", "/v1/sessions/cam", None)["repackaging"]["rtmp"]["players"].clone();
    assert!(wait_for(Duration::from_secs(10), || players() == 1), "{}", players());
    assert!(metrics(&relay).contains("fanout_rtmp_players{session=\"cam\"} 1"));
    drop(player);
    let got = pictures(&["-i", &format!("rtmp://{rtmp}/live/cam"), "-frames:v", "50"]);
    assert_eq!(got.len(), 50);
    assert!(
        looped.windows(got.len()).any(|w| w == got.as_slice()),
        "the pictures played over RTMP are not a run of the clip's"
    );

    // It leaves; the next publisher continues the same tracks.
    drop(first);
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "waiting"), "{}", publisher(&relay));
    let second = publish(&format!("rtmp://{rtmp}/cam"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"));
    assert_eq!(publisher(&relay)["publishes"], 2);
    let (ok, log) = ffmpeg_decode(&url, &["-rtsp_transport", "tcp"], 2);
    assert!(ok && decoded_frames(&log) >= 45, "{log}");
    drop(second);
}

#[test]
fn rtmp_publishers_authenticate_as_rtsp_users() {
    if !have_ffmpeg() {
        return;
    }
    let config = format!("{CONFIG}[[rtsp_user]]\nname = \"enc\"\npassword = \"s3cret\"\n");
    let relay = Relay::with_config(&config, &["--no-demo"]);
    let rtmp = rtmp_addr(&relay);
    for bad in ["cam", "cam?user=enc&pass=wrong", "cam?user=other&pass=s3cret"] {
        let (ok, _) = try_publish(&format!("rtmp://{rtmp}/{bad}"));
        assert!(!ok, "{bad}: let in");
    }
    assert!(!relay.stderr().contains("s3cret") && !relay.stderr().contains("wrong"), "a secret in the log");
    let _p = publish(&format!("rtmp://{rtmp}/cam?user=enc&pass=s3cret"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
}

/// GStreamer's `rtmp2sink` publishes the demo clip (flvmux of its H.264 and AAC), and
/// ffmpeg plays it back over RTSP.
#[test]
fn gstreamer_publishes_over_rtmp_and_ffmpeg_plays_it_back() {
    if !have_ffmpeg() || !have_gstreamer() {
        return;
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let location = format!("location=rtmp://{}/live/cam", rtmp_addr(&relay));
    let pipeline = format!(
        "filesrc location={DEMO} ! tsdemux name=d d. ! queue ! h264parse ! flvmux name=m streamable=true ! \
         rtmp2sink {location} d. ! queue ! aacparse ! m."
    );
    let _gst = Kill(
        Command::new("timeout")
            .args(["-s", "INT", "20", "gst-launch-1.0", "-q"])
            .args(pipeline.split_whitespace())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
    let (ok, log) = ffmpeg_decode(&url, &["-rtsp_transport", "tcp"], 2);
    assert!(ok && decoded_frames(&log) >= 45, "{log}");
    assert!(!log.contains("[h264 @"), "decode errors: {log}");
}

/// A connection that trickles its handshake is closed after `request_timeout_s`, and one
/// address holds at most `max_connections_per_ip` RTMP connections at once.
#[test]
fn rtmp_slowloris_and_per_address_cap() {
    use std::io::{ErrorKind, Read, Write};
    let config = format!("request_timeout_s = 2\nmax_connections_per_ip = 4\n{CONFIG}");
    let relay = Relay::with_config(&config, &["--no-demo"]);
    let rtmp: std::net::SocketAddr = rtmp_addr(&relay).parse().unwrap();
    // Whether the relay closed `s` (EOF or reset), waiting at most `wait` for it.
    let closed = |s: &mut std::net::TcpStream, wait: Duration| {
        s.set_read_timeout(Some(wait)).unwrap();
        match s.read(&mut [0u8; 4096]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        }
    };
    // A byte of C0/C1 every 300 ms: still closed once the 2 s are up.
    let t0 = std::time::Instant::now();
    let mut slow = std::net::TcpStream::connect(rtmp).unwrap();
    let mut gone = false;
    while !gone && t0.elapsed() < Duration::from_secs(8) {
        let _ = slow.write_all(&[3]);
        gone = closed(&mut slow, Duration::from_millis(300));
    }
    let took = t0.elapsed();
    assert!(
        gone && took >= Duration::from_millis(1800) && took < Duration::from_secs(4),
        "closed: {gone} after {took:?}"
    );
    // Four held from one address: a fifth is closed at once; once they go, one is served.
    let held: Vec<_> = (0..4).map(|_| std::net::TcpStream::connect(rtmp).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut fifth = std::net::TcpStream::connect(rtmp).unwrap();
    assert!(closed(&mut fifth, Duration::from_secs(1)), "a fifth connection from one address stayed");
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    let mut again = std::net::TcpStream::connect(rtmp).unwrap();
    let mut hello = vec![3u8];
    hello.extend(std::iter::repeat_n(0u8, 1536));
    again.write_all(&hello).unwrap();
    again.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut s0 = [0u8; 1];
    again.read_exact(&mut s0).unwrap();
    assert_eq!(s0[0], 3, "the handshake's S0");
}

/// H.265 over Enhanced RTMP (the `hvc1` FourCC, which ffmpeg 5.1 cannot send), published by
/// the project's own `gen --rtmp`: played back over RTSP and HLS, decoded by ffmpeg.
#[test]
fn h265_over_enhanced_rtmp_plays_over_rtsp_and_hls() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/hevc/demo-2s-hevc.mp4");
    let url = format!("rtmp://{}/live/cam", rtmp_addr(&relay));
    let _gen = Kill(
        Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["gen", "--rtmp", &url, "--file", file, "--duration", "25"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let rtsp = format!("rtsp://{}/cam", rtsp_addr(&relay));
    for (url, input) in
        [(rtsp.as_str(), &["-rtsp_transport", "tcp"][..]), (&relay.url("/v1/sessions/cam/hls/index.m3u8"), &[])]
    {
        let probe = Command::new("timeout")
            .args(["30", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
            .args(input)
            .arg(url)
            .output()
            .unwrap();
        let codecs = String::from_utf8_lossy(&probe.stdout).to_string();
        assert!(codecs.contains("hevc") && codecs.contains("aac"), "{url}: {codecs}");
        let (ok, log) = ffmpeg_decode(url, input, 3);
        assert!(ok && decoded_frames(&log) >= 65, "{url}: {log}");
        assert!(!log.contains("[hevc @"), "{url}: decode errors: {log}");
    }
}

/// A path that came in over RTSP (the relay pulling its own demo) plays over RTMP: ffmpeg
/// decodes it without an error; a path that does not exist is refused; GStreamer's
/// `rtmp2src` plays the demo.
#[test]
fn ffmpeg_plays_over_rtmp_a_path_pulled_over_rtsp() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::start(&[]);
    let demo = format!("rtsp://{}/demo", rtsp_addr(&relay));
    relay.ok("POST", "/v1/sessions", Some(serde_json::json!({ "name": "cam2", "source": { "rtsp": demo } })));
    let url = format!("rtmp://{}/cam2", rtmp_addr(&relay));
    let (ok, log) = ffmpeg_decode(&url, &[], 3);
    assert!(ok && decoded_frames(&log) >= 65, "{log}");
    assert!(!log.contains("[h264 @"), "decode errors: {log}");
    let (ok, _) = ffmpeg_decode(&format!("rtmp://{}/nosuch", rtmp_addr(&relay)), &[], 1);
    assert!(!ok, "a path that does not exist played");
    // GStreamer's rtmp2src reads the demo: its H.264 reaches the sink, nothing fails.
    if have_gstreamer() {
        let mut gst = Command::new("timeout");
        gst.args(["-s", "INT", "6", "gst-launch-1.0", "-v"]).args(
            format!(
                "rtmp2src location=rtmp://{}/live/demo ! flvdemux name=d d.video ! queue ! h264parse ! \
                 fakesink silent=false name=v",
                rtmp_addr(&relay)
            )
            .split_whitespace(),
        );
        let log = Gst::spawn(gst).log();
        let units = log.lines().filter(|l| l.contains("(v:sink)") && l.contains("chain")).count();
        assert!(units > 60, "GStreamer got {units} H.264 units: {log}");
        let errors = gst_errors_while_playing(&log);
        assert!(errors.is_empty(), "GStreamer: {errors:#?}\n{log}");
    }
}

fn publish(url: &str) -> Kill {
    ffmpeg_publish("flv", url)
}

fn try_publish(url: &str) -> (bool, String) {
    ffmpeg_try_publish("flv", url)
}

/// HTTP-FLV (`GET /{path}.flv`): ffprobe reads the demo's video frame for frame (every
/// picture 40 ms after the one before, from a keyframe) with its AAC; a raw reader gets an
/// FLV header, is listed among the path's readers as `http_flv`, and its stream ends when it
/// is kicked; an unknown path is a 404.
#[test]
fn http_flv_plays_frame_for_frame_and_its_player_is_a_reader() {
    use std::io::{Read, Write};
    if !have_ffmpeg() {
        return;
    }
    // (RTSP on a free port: the default one is another test's here.)
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    let url = relay.url("/demo.flv");
    let out = Command::new("timeout")
        .args(["30", "ffprobe", "-v", "error", "-read_intervals", "%+6", "-show_entries"])
        .args(["packet=stream_index,pts_time,flags:stream=codec_name", "-of", "csv=p=0", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("h264") && text.contains("aac"), "{text}");
    // Video packets: `0,pts,flags`.
    let video: Vec<(f64, bool)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("0,"))
        .filter_map(|l| l.split_once(','))
        .map(|(t, flags)| (t.parse().unwrap(), flags.starts_with('K')))
        .collect();
    assert!(video.len() >= 140, "{} pictures in 6 s", video.len());
    assert!(video[0].1, "the first picture is a keyframe");
    for w in video.windows(2) {
        assert!((w[1].0 - w[0].0 - 0.04).abs() < 0.002, "a picture missing or repeated: {:?} then {:?}", w[0], w[1]);
    }

    let mut s = std::net::TcpStream::connect(relay.api).unwrap();
    s.write_all(b"GET /demo.flv HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let head = read_head(&mut s);
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("video/x-flv"), "{head}");
    let mut start = [0u8; 13];
    s.read_exact(&mut start).unwrap();
    assert_eq!(&start[..5], b"FLV\x01\x05", "an FLV header with video and audio");
    // (Ours by its address: ffprobe's player may not have been seen to go yet.)
    let me = s.local_addr().unwrap().to_string();
    let reader = || {
        let all = relay.ok("GET", "/v1/sessions/demo/readers", None);
        all.as_array().unwrap().iter().find(|r| r["protocol"] == "http_flv" && r["addr"] == me.as_str()).cloned()
    };
    assert!(wait_for(Duration::from_secs(5), || reader().is_some_and(|r| r["bytes"].as_u64() > Some(1000))));
    let id = reader().unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(relay.call("DELETE", &format!("/v1/sessions/demo/readers/{id}"), None).0, 204);
    assert!(stream_ends_within(&mut s, Duration::from_secs(5)), "the kicked player's stream ends");
    assert!(wait_for(Duration::from_secs(5), || reader().is_none()));

    let mut s = std::net::TcpStream::connect(relay.api).unwrap();
    s.write_all(b"GET /nope.flv HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(read_head(&mut s).starts_with("HTTP/1.1 404"));
}

/// HTTP-FLV players give their API connection slot back once they play (their path's
/// `max_readers` bounds them): with `api_max_connections = 3`, six players play and the API
/// still answers.
#[test]
fn http_flv_players_hold_no_api_connection_slot() {
    use std::io::{Read, Write};
    let relay = Relay::with_config("api_max_connections = 3\n", &[]);
    let players: Vec<_> = (0..6)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(relay.api).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET /demo.flv HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            assert!(read_head(&mut s).starts_with("HTTP/1.1 200"));
            let mut header = [0u8; 13];
            s.read_exact(&mut header).unwrap();
            s
        })
        .collect();
    let readers = relay.ok("GET", "/v1/sessions/demo/readers", None);
    assert_eq!(readers.as_array().unwrap().iter().filter(|r| r["protocol"] == "http_flv").count(), players.len());
}

/// The send buffer (`ss`'s `tb`) of the relay's end of the connection from `local` to `relay`.
fn relay_send_buffer(relay: std::net::SocketAddr, local: std::net::SocketAddr) -> Option<u64> {
    let out = Command::new("ss")
        .args(["-tmnH", "state", "established"])
        .arg(format!("sport = :{} and dport = :{}", relay.port(), local.port()))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let tb = text.split([',', '(', ')']).find_map(|w| w.strip_prefix("tb"))?;
    tb.parse().ok()
}

/// A stalled FLV or RTMP player holds a second of its stream in its socket (as HTTP TS
/// sinks do), not the kernel's autotuned megabytes (3.9 MB here before): the demo's ~42 kB
/// a second is under the 64 kB floor, which the kernel doubles for its bookkeeping.
#[test]
fn flv_and_rtmp_players_hold_a_second_of_the_stream_in_their_socket() {
    use std::io::{Read, Write};
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    // (Once the path's rate is measured: 256 kB until then.)
    std::thread::sleep(Duration::from_secs(3));
    let mut flv = std::net::TcpStream::connect(relay.api).unwrap();
    flv.write_all(b"GET /demo.flv HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(read_head(&mut flv).starts_with("HTTP/1.1 200"));
    flv.read_exact(&mut [0u8; 13]).unwrap();
    let rtmp: std::net::SocketAddr = rtmp_addr(&relay).parse().unwrap();
    let player = fanout_tools::rtmp::Client::play(rtmp, "live", "demo").unwrap();
    let flv_local = flv.local_addr().unwrap();
    // (Set as a player starts: read once both play, neither reading meanwhile.)
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(relay_send_buffer(relay.api, flv_local), Some(2 * 65536), "HTTP-FLV");
    assert_eq!(relay_send_buffer(rtmp, player.local_addr()), Some(2 * 65536), "RTMP");
}

/// A page on another origin that loads mpegts.js (`script`) and holds one muted video.
fn player_page(script: String) -> String {
    let site = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let page = format!("http://localhost:{}/", site.local_addr().unwrap().port());
    std::thread::spawn(move || {
        for mut c in site.incoming().flatten() {
            let mut req = [0u8; 2048];
            let n = std::io::Read::read(&mut c, &mut req).unwrap_or(0);
            let (kind, body) = match String::from_utf8_lossy(&req[..n]).starts_with("GET /mpegts.js") {
                true => ("text/javascript", script.clone()),
                false => {
                    ("text/html", "<!doctype html><video id=v muted></video><script src=/mpegts.js></script>".into())
                }
            };
            let head = format!("HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n", body.len());
            let _ = std::io::Write::write_all(&mut c, (head + &body).as_bytes());
        }
    });
    page
}

/// mpegts.js plays `arguments[0]` (HTTP-FLV) into the page's video; its errors are kept.
const PLAY_FLV: &str = r#"
window.flvErrors = [];
const v = document.getElementById('v');
const p = mpegts.createPlayer({ type: 'flv', isLive: true, url: arguments[0] }, { enableWorker: false });
p.on(mpegts.Events.ERROR, (t, d, i) => window.flvErrors.push(t + ' ' + d + ' ' + JSON.stringify(i)));
p.attachMediaElement(v);
p.load();
p.play();
return true;
"#;

/// A browser plays HTTP-FLV and WebSocket-FLV as web players do: mpegts.js (from npm,
/// scripts/install-peers) in headless Chromium decodes at least 100 pictures of the demo in
/// 10 s over each, without an error, and the WebSocket player is a `ws_flv` reader.
#[test]
fn chromium_plays_http_and_websocket_flv_with_mpegts_js() {
    if !have_chromium() {
        return;
    }
    let Some(lib) = peer("mpegts.js/mpegts.js") else { return };
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    let d = Driver::start();
    let page = player_page(std::fs::read_to_string(lib).unwrap());
    let ws = relay.url("/demo.flv").replacen("http://", "ws://", 1);
    for (url, protocol) in [(relay.url("/demo.flv"), "http_flv"), (ws, "ws_flv")] {
        d.post("url", serde_json::json!({ "url": page }));
        d.post("execute/sync", serde_json::json!({ "script": PLAY_FLV, "args": [url] }));
        let frames = || {
            d.js("return document.getElementById('v').getVideoPlaybackQuality().totalVideoFrames;")
                .as_u64()
                .unwrap_or(0)
        };
        let t0 = std::time::Instant::now();
        let played = wait_for(Duration::from_secs(20), || frames() >= 100);
        let errors = d.js("return window.flvErrors;");
        assert!(played, "{url}: {} pictures decoded in {:?}; errors: {errors}", frames(), t0.elapsed());
        assert!(t0.elapsed() < Duration::from_secs(10), "{url}: 100 pictures took {:?}", t0.elapsed());
        assert_eq!(errors, serde_json::json!([]), "{url}: mpegts.js errors");
        let readers = relay.ok("GET", "/v1/sessions/demo/readers", None);
        assert!(readers.as_array().unwrap().iter().any(|r| r["protocol"] == protocol), "{readers}");
    }
}

/// One frame a server sent (unmasked): its opcode and payload.
fn ws_frame(s: &mut std::net::TcpStream) -> (u8, Vec<u8>) {
    use std::io::Read;
    let mut h = [0u8; 2];
    s.read_exact(&mut h).unwrap();
    assert_eq!(h[1] & 0x80, 0, "a server's frame is not masked");
    let len = match h[1] & 0x7f {
        126 => {
            let mut l = [0u8; 2];
            s.read_exact(&mut l).unwrap();
            u64::from(u16::from_be_bytes(l))
        }
        127 => {
            let mut l = [0u8; 8];
            s.read_exact(&mut l).unwrap();
            u64::from_be_bytes(l)
        }
        n => u64::from(n),
    };
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload).unwrap();
    assert_eq!(h[0] & 0x80, 0x80, "every frame whole");
    (h[0] & 0x0f, payload)
}

/// The payload of the close frame that follows the stream's binary frames.
fn ws_close(s: &mut std::net::TcpStream) -> Vec<u8> {
    loop {
        match ws_frame(s) {
            (2, _) => continue,
            (8, p) => return p,
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

/// WebSocket-FLV by hand, as RFC 6455 has it: the handshake's accept key, the FLV header in
/// the first binary frame, then whole tags in binary frames, each kind's times in order; a ping answered with its
/// payload; kicked, a close with 1001; a client's close answered and the reader gone; a
/// client's unmasked frame closed with 1002.
#[test]
fn websocket_flv_frames_the_stream_answers_pings_and_closes() {
    use std::io::Write;
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    let open = || {
        let mut s = std::net::TcpStream::connect(relay.api).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            b"GET /demo.flv HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .unwrap();
        let head = read_head(&mut s);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"), "{head}");
        let (op, header) = ws_frame(&mut s);
        assert_eq!((op, &header[..5]), (2, &b"FLV\x01\x05"[..]), "the FLV header, alone");
        s
    };
    let masked = |op: u8, payload: &[u8]| {
        let mask = [0x11, 0x22, 0x33, 0x44];
        let mut f = vec![0x80 | op, 0x80 | payload.len() as u8];
        f.extend(mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    };

    let mut s = open();
    // Every frame holds whole tags: a tag's header, its body, its previous-tag size.
    let (mut tags, mut pinged, mut pong) = (0, false, None);
    // Each kind's times never go back (its decoder configuration included).
    let mut last_ms = [None::<u32>; 2];
    for _ in 0..20 {
        if tags >= 5 && !std::mem::replace(&mut pinged, true) {
            s.write_all(&masked(9, b"are you there")).unwrap();
        }
        match ws_frame(&mut s) {
            (2, mut p) => {
                while !p.is_empty() {
                    assert!(matches!(p[0], 8 | 9), "a tag starts the frame or follows a whole one");
                    let len = u32::from_be_bytes([0, p[1], p[2], p[3]]) as usize;
                    let ms = u32::from_be_bytes([p[7], p[4], p[5], p[6]]);
                    let last = &mut last_ms[usize::from(p[0] == 9)];
                    assert!(last.is_none_or(|l| ms >= l), "a tag of kind {} at {ms} ms after {last:?}", p[0]);
                    *last = Some(ms);
                    assert_eq!(u32::from_be_bytes(p[11 + len..15 + len].try_into().unwrap()) as usize, 11 + len);
                    p.drain(..15 + len);
                    tags += 1;
                }
            }
            (10, p) => pong = Some(p),
            other => panic!("unexpected frame {other:?}"),
        }
    }
    assert_eq!(pong.as_deref(), Some(&b"are you there"[..]), "the ping answered");
    assert!(tags >= 10, "{tags} tags");
    let me = s.local_addr().unwrap().to_string();
    let reader = || {
        let all = relay.ok("GET", "/v1/sessions/demo/readers", None);
        all.as_array().unwrap().iter().find(|r| r["protocol"] == "ws_flv" && r["addr"] == me.as_str()).cloned()
    };
    let id = reader().expect("listed as a ws_flv reader")["id"].as_str().unwrap().to_string();
    assert_eq!(relay.call("DELETE", &format!("/v1/sessions/demo/readers/{id}"), None).0, 204);
    let close = ws_close(&mut s);
    assert_eq!(close, 1001u16.to_be_bytes(), "kicked: going away");

    let mut s = open();
    s.write_all(&masked(8, &1000u16.to_be_bytes())).unwrap();
    let answer = ws_close(&mut s);
    assert_eq!(answer, 1000u16.to_be_bytes(), "the client's close answered");
    assert!(stream_ends_within(&mut s, Duration::from_secs(5)));

    let mut s = open();
    s.write_all(&[0x82, 1, 0]).unwrap();
    let answer = ws_close(&mut s);
    assert_eq!(answer, 1002u16.to_be_bytes(), "an unmasked frame is a protocol error");
    assert!(wait_for(Duration::from_secs(5), || {
        relay.ok("GET", "/v1/sessions/demo/readers", None).as_array().unwrap().iter().all(|r| r["protocol"] != "ws_flv")
    }));
}

/// Pictures of one NAL unit each, numbered in their first bytes, a keyframe every
/// `key_every`, at `rate` a second, published over RTMP until `stop` (or 40 s).
fn publish_numbered(
    rtmp: std::net::SocketAddr,
    name: &str,
    rate: f64,
    key_every: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let mut c = fanout_tools::rtmp::Client::publish(rtmp, "live", name).unwrap();
    // The AVC decoder configuration: a made-up SPS and PPS.
    let config = [0x17, 0, 0, 0, 0, 1, 0x42, 0xc0, 0x1e, 0xff, 0xe1, 0, 4, 0x67, 0x42, 0xc0, 0x1e, 1, 0, 2, 0x68, 0xce];
    c.send(true, 0, &config).unwrap();
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(40) {
            while (n as f64) < t0.elapsed().as_secs_f64() * rate {
                let key = n.is_multiple_of(key_every);
                let nal_len = 16_000u32;
                let mut body = vec![if key { 0x17 } else { 0x27 }, 1, 0, 0, 0];
                body.extend_from_slice(&nal_len.to_be_bytes());
                body.push(if key { 0x65 } else { 0x41 });
                // Seven bits a byte, the top one set: no zeros that would read as a start code.
                body.extend((0..4).rev().map(|i| 0x80 | (n >> (7 * i)) as u8 & 0x7f));
                body.resize(9 + nal_len as usize, 0x5a);
                if c.send(true, (n as f64 * 1000.0 / rate) as u32, &body).is_err() {
                    return n;
                }
                n += 1;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        n
    })
}

/// The tags an HTTP-FLV player of `name` gets until its stream ends (or 60 s), as RTMP's.
fn flv_tags(api: std::net::SocketAddr, name: &str) -> Vec<fanout_tools::rtmp::Played> {
    read_flv_tags(&mut flv_player(api, name, None), Instant::now() + Duration::from_secs(60))
}

/// An HTTP-FLV player of `name` past the response head and the file's header (with a receive
/// buffer of `receive_buffer` bytes, where given).
fn flv_player(api: std::net::SocketAddr, name: &str, receive_buffer: Option<usize>) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    if let Some(n) = receive_buffer {
        sock.set_recv_buffer_size(n).unwrap();
    }
    sock.connect(&api.into()).unwrap();
    let mut s: std::net::TcpStream = sock.into();
    write!(s, "GET /{name}.flv HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(read_head(&mut s).starts_with("HTTP/1.1 200"));
    let mut header = [0u8; 13];
    s.read_exact(&mut header).unwrap();
    assert_eq!(&header[..3], b"FLV");
    s
}

/// The tags `s` gets until its stream ends or `until`; a tag whose size trailer does not
/// match its header (a tag cut short, or bytes from inside one) fails the test.
fn read_flv_tags(s: &mut std::net::TcpStream, until: Instant) -> Vec<fanout_tools::rtmp::Played> {
    use std::io::Read;
    let mut tags = Vec::new();
    let mut head = [0u8; 11];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return tags;
        }
        s.set_read_timeout(Some(left)).unwrap();
        if s.read_exact(&mut head).is_err() {
            return tags;
        }
        assert!(matches!(head[0], 8 | 9 | 18), "a tag's type, not {} ({} tags read)", head[0], tags.len());
        let len = u32::from_be_bytes([0, head[1], head[2], head[3]]) as usize;
        let mut body = vec![0u8; len + 4];
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.read_exact(&mut body).unwrap();
        assert_eq!(u32::from_be_bytes(body[len..].try_into().unwrap()) as usize, 11 + len, "a whole tag");
        body.truncate(len);
        let ms = u32::from_be_bytes([head[7], head[4], head[5], head[6]]);
        tags.push(fanout_tools::rtmp::Played { video: head[0] == 9, ms, body });
    }
}

/// The number a picture of [`publish_numbered`] carries: after its slice's NAL header,
/// wherever the relay put the parameter sets.
fn picture_number(tag: &fanout_tools::rtmp::Played) -> Option<u64> {
    let mut at = 5;
    while at + 4 <= tag.body.len() {
        let len = u32::from_be_bytes(tag.body[at..at + 4].try_into().unwrap()) as usize;
        let nal = tag.body.get(at + 4..at + 4 + len)?;
        if matches!(nal.first().map(|b| b & 0x1f), Some(1 | 5)) {
            return Some(nal.get(1..5)?.iter().fold(0, |n, b| n << 7 | u64::from(b & 0x7f)));
        }
        at += 4 + len;
    }
    None
}

/// A player that stops reading falls behind the path's channel of tags and skips ahead to
/// a keyframe, its picture whole; a player beside it loses nothing, every picture in order.
/// The same for HTTP-FLV players, sinks of the path's FLV session: the slow one is lapped by
/// the ring and resumes at a keyframe's tag, every tag whole.
#[test]
fn a_slow_rtmp_player_skips_to_a_keyframe_and_the_others_lose_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let rtmp: std::net::SocketAddr = rtmp_addr(&relay).parse().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    // 400 pictures of 16 kB a second (6.4 MB/s): the channel's 1,024 tags are 2.6 s of it.
    let publisher = publish_numbered(rtmp, "cam", 400.0, 50, stop.clone());
    // (Players are taken once the stream is there.)
    let play = || {
        let t0 = Instant::now();
        loop {
            match fanout_tools::rtmp::Client::play(rtmp, "live", "cam") {
                Ok(c) => return c,
                Err(e) if t0.elapsed() > Duration::from_secs(10) => panic!("no stream to play: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    };
    let mut fast = play();
    let slow = play();
    // (Above loopback's 64 kB segments: a window below one is opened by the persist timer.)
    slow.shrink_receive_buffer(256 << 10).unwrap();
    let mut slow_flv = flv_player(relay.api, "cam", Some(256 << 10));
    let slow_flv_me = slow_flv.local_addr().unwrap().to_string();
    let me = slow.local_addr().to_string();
    // (Until its connection ends with the stream, the publisher gone.)
    let fast_reads = std::thread::spawn(move || fast.read_tags(Instant::now() + Duration::from_secs(60), usize::MAX));
    let flv_reads = std::thread::spawn({
        let api = relay.api;
        move || flv_tags(api, "cam")
    });

    // The slow one reads nothing for 6 s: the sockets' buffers fill (the relay's grows to
    // ~4 MB: 250 pictures), its task waits on the write, and the channel laps it (2.6 s).
    std::thread::sleep(Duration::from_secs(6));
    let mut slow = slow;
    let got = slow.read_tags(Instant::now() + Duration::from_secs(4), usize::MAX).unwrap();
    let skips_of = |me: &str| {
        let all = relay.ok("GET", "/v1/sessions/cam/readers", None);
        let mine = all.as_array().unwrap().iter().find(|r| r["addr"] == me).cloned();
        mine.and_then(|r| r["skips"].as_u64()).unwrap_or(0)
    };
    let skips = skips_of(&me);
    let got_flv = read_flv_tags(&mut slow_flv, Instant::now() + Duration::from_secs(2));
    let flv_skips = skips_of(&slow_flv_me);
    let n: Vec<_> = got.iter().filter_map(picture_number).collect();
    assert!(
        skips > 1000,
        "the relay counts the slow player's skipped tags: {skips} ({} tags, {:?}..{:?})",
        got.len(),
        n.first(),
        n.last()
    );
    stop.store(true, Ordering::Relaxed);
    let published = publisher.join().unwrap();

    let numbers = |tags: &[fanout_tools::rtmp::Played]| -> Vec<(u64, bool)> {
        tags.iter().filter_map(|t| picture_number(t).map(|n| (n, t.key()))).collect()
    };
    assert!(flv_skips > 1000, "the slow HTTP-FLV player's skipped pieces: {flv_skips}");
    for (kind, got) in [("RTMP", &got), ("HTTP-FLV", &got_flv)] {
        let slow_pictures = numbers(got);
        let gaps: Vec<usize> =
            (1..slow_pictures.len()).filter(|&i| slow_pictures[i].0 != slow_pictures[i - 1].0 + 1).collect();
        assert!(
            !gaps.is_empty(),
            "the slow {kind} player skipped nothing ({} pictures: {:?} to {:?} of {published}; {} tags)",
            slow_pictures.len(),
            slow_pictures.first(),
            slow_pictures.last(),
            got.len()
        );
        for &i in &gaps {
            let around = &slow_pictures[i - 1..=i];
            assert!(slow_pictures[i].0 > slow_pictures[i - 1].0, "{kind}: pictures went back: {around:?}");
            assert!(slow_pictures[i].1, "{kind}: after a skip, a keyframe first: {around:?}");
        }
        assert!(slow_pictures[0].1, "{kind}: it starts at a keyframe");
    }

    // The fast ones (RTMP, HTTP-FLV) got every picture, each faster than one write of 64 kB
    // a flush interval; their connections end with the stream (the publisher gone).
    for (kind, tags) in [("RTMP", fast_reads.join().unwrap().unwrap()), ("HTTP-FLV", flv_reads.join().unwrap())] {
        let pictures = numbers(&tags);
        assert!(pictures[0].1, "{kind}: it starts at a keyframe");
        for w in pictures.windows(2) {
            assert_eq!(w[1].0, w[0].0 + 1, "the fast {kind} player lost or reordered a picture");
        }
        let last = pictures.last().unwrap().0;
        assert!(
            last + 400 >= published && pictures.len() > 1000,
            "{kind}: {} pictures to {last} of {published}",
            pictures.len()
        );
    }
}
