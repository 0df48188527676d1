//! SRT (issue 32): ffmpeg publishes the demo clip over SRT into a `publish` path, with and
//! without a passphrase, and it plays back over RTSP picture for picture, over HTTP TS and
//! HLS, and over SRT to ffmpeg, GStreamer and srt-live-transmit; GStreamer publishes over
//! SRT too; a second publisher, a path that takes none, bad credentials and a wrong
//! passphrase are refused in SRT's handshake.

mod common;
use common::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

const CONFIG: &str = "[[session]]\nname = \"cam\"\nsource = { publish = true }\n";

const DEMO: &str = DEMO_TS;

/// Whether this machine has libsrt and ffmpeg with SRT (CI installs both: there, a lack fails).
fn have_srt() -> bool {
    if !have_ffmpeg() {
        return false;
    }
    let protocols = Command::new("ffmpeg").args(["-hide_banner", "-protocols"]).output().unwrap();
    let ok = String::from_utf8_lossy(&protocols.stdout).lines().any(|l| l.trim() == "srt") && fanout_srt_available();
    if !ok {
        eprintln!("SKIPPED (loudly): no libsrt or no ffmpeg with srt:// here");
        assert!(std::env::var("CI").is_err(), "CI must have SRT (scripts/test installs it)");
    }
    ok
}

fn fanout_srt_available() -> bool {
    std::fs::read_dir("/usr/lib/x86_64-linux-gnu")
        .into_iter()
        .chain(std::fs::read_dir("/usr/lib/aarch64-linux-gnu"))
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("libsrt"))
}

fn srt_addr(relay: &Relay) -> String {
    relay.ok("GET", "/v1/engine", None)["srt"].as_str().expect("the relay listens for SRT").to_string()
}

fn publisher(relay: &Relay) -> Value {
    relay.ok("GET", "/v1/sessions/cam", None)["publisher"].clone()
}

/// The clip's pictures twice over: any run of pictures played back is a window of it.
fn looped_clip() -> Vec<String> {
    let want = pictures(&["-i", DEMO]);
    assert_eq!(want.len(), 200, "8 s at 25 fps");
    want.iter().chain(&want).cloned().collect()
}

fn is_run_of(clip: &[String], got: &[String]) -> bool {
    !got.is_empty() && clip.windows(got.len()).any(|w| w == got)
}

#[test]
fn ffmpeg_publishes_over_srt_and_it_plays_back_over_rtsp_http_hls_and_srt() {
    if !have_srt() {
        return;
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let srt = srt_addr(&relay);
    let session = relay.ok("GET", "/v1/sessions/cam", None);
    assert_eq!(session["srt_publish_url"], format!("srt://{srt}?streamid=publish:cam"), "{session}");
    assert_eq!(session["srt_read_url"], format!("srt://{srt}?streamid=read:cam"), "{session}");
    let _first = publish(&format!("srt://{srt}?streamid=publish:cam"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    assert_eq!(publisher(&relay)["transport"], "srt", "{}", publisher(&relay));
    let m = metrics(&relay);
    assert!(m.contains("fanout_publishing{session=\"cam\",protocol=\"srt\"} 1"), "{m}");

    // Played back over RTSP: 100 pictures, each the clip's, in order.
    let clip = looped_clip();
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "100"]);
    assert_eq!(got.len(), 100);
    assert!(is_run_of(&clip, &got), "the pictures played back over RTSP are not a run of the clip's");
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
    // Read back over SRT: a run of the clip's pictures, counted as a reader meanwhile.
    let reader = Kill(
        Command::new("timeout")
            .args(["20", "ffmpeg", "-nostdin", "-loglevel", "error", "-i", &format!("srt://{srt}?streamid=read:cam")])
            .args(["-t", "15", "-f", "null", "-"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let readers = || {
        let links = relay.ok("GET", "/v1/sessions/cam", None)["srt"].clone();
        links.as_array().unwrap().iter().filter(|l| l["mode"] == "read").count()
    };
    assert!(wait_for(Duration::from_secs(10), || readers() == 1), "no SRT reader in the status");
    assert!(metrics(&relay).contains("fanout_srt_readers{session=\"cam\"} 1"));
    drop(reader);
    let got = pictures(&["-i", &format!("srt://{srt}?streamid=#!::r=cam,m=request"), "-frames:v", "50"]);
    assert_eq!(got.len(), 50);
    assert!(is_run_of(&clip, &got), "the pictures read over SRT are not a run of the clip's");
    // The publisher's link: libsrt's counters, nothing lost on loopback.
    let links = relay.ok("GET", "/v1/sessions/cam", None)["srt"].clone();
    let p = links.as_array().unwrap().iter().find(|l| l["mode"] == "publish").cloned().unwrap();
    assert!(p["packets_received"].as_u64().unwrap() > 100 && p["dropped"] == 0, "{p}");

    // A second publisher, and one of a path that takes none: refused in the handshake.
    let (ok, log) = try_publish(&format!("srt://{srt}?streamid=publish:cam"));
    assert!(!ok, "a second publisher was let in: {log}");
    let (ok, _) = try_publish(&format!("srt://{srt}?streamid=publish:nosuch"));
    assert!(!ok, "a path that takes no publisher took one");
    let log = relay.stderr();
    assert!(log.contains("SRT caller refused") && log.contains("cam is being published"), "{log}");
    assert_eq!(publisher(&relay)["publishes"], 1, "{}", publisher(&relay));
}

/// H.265 over SRT, in and out (issue 53 item 5): ffmpeg publishes a looped H.265 clip as
/// MPEG-TS over SRT; read back over SRT and over RTSP, every picture is the clip's, in order.
#[test]
fn h265_goes_over_srt_in_and_out() {
    if !have_srt() {
        return;
    }
    let clip_file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/hevc/demo-2s-hevc.mp4");
    let want = pictures(&["-i", clip_file]);
    assert_eq!(want.len(), 50, "2 s at 25 fps");
    let clip: Vec<String> = want.iter().chain(&want).cloned().collect();
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let srt = srt_addr(&relay);
    let _publisher = Kill(
        Command::new("ffmpeg")
            .args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", clip_file])
            .args(["-t", "30", "-c", "copy", "-f", "mpegts", &format!("srt://{srt}?streamid=publish:cam")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let probe = Command::new("timeout")
        .args(["20", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
        .arg(format!("srt://{srt}?streamid=read:cam"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&probe.stdout).contains("hevc"), "{probe:?}");
    let got = pictures(&["-i", &format!("srt://{srt}?streamid=read:cam"), "-frames:v", "40"]);
    assert_eq!(got.len(), 40);
    assert!(is_run_of(&clip, &got), "the H.265 pictures read over SRT are not a run of the clip's");
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "40"]);
    assert_eq!(got.len(), 40);
    assert!(is_run_of(&clip, &got), "the H.265 pictures played over RTSP are not a run of the clip's");
}

/// With `srt_passphrase`, only callers with it get in (and their stream decodes); with RTSP
/// users, only callers naming one; refusals are logged without the secret.
#[test]
fn a_passphrase_and_credentials_are_required_where_configured() {
    if !have_srt() {
        return;
    }
    let pass = "correct horse battery";
    let config = format!(
        "srt_passphrase = \"{pass}\"\nsrt_pbkeylen = 32\n[[rtsp_user]]\nname = \"alice\"\npassword = \"pw-alice-1\"\n{CONFIG}"
    );
    let relay = Relay::with_config(&config, &["--no-demo"]);
    let srt = srt_addr(&relay);
    let (ok, _) = try_publish(&format!("srt://{srt}?streamid=publish:cam:alice:pw-alice-1"));
    assert!(!ok, "no passphrase, let in");
    let (ok, _) = try_publish(&format!(
        "srt://{srt}?streamid=publish:cam:alice:pw-alice-1&passphrase=wrong-passphrase&pbkeylen=32"
    ));
    assert!(!ok, "a wrong passphrase, let in");
    let (ok, _) = try_publish(&format!("srt://{srt}?streamid=publish:cam:alice:guessed&passphrase={pass}&pbkeylen=32"));
    assert!(!ok, "a wrong password, let in");
    let log = relay.stderr();
    assert!(log.contains("bad or missing credentials") && !log.contains("guessed"), "{log}");
    let _p = publish(&format!("srt://{srt}?streamid=publish:cam:alice:pw-alice-1&passphrase={pass}&pbkeylen=32"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    // The RTSP side wants alice too; the stream is the clip.
    let url = format!("rtsp://alice:pw-alice-1@{}/cam", rtsp_addr(&relay));
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "50"]);
    assert!(is_run_of(&looped_clip(), &got), "{} pictures, not a run of the clip's", got.len());
    // A reader needs both as well (the #!:: form, its password in `s`).
    let read = format!("srt://{srt}?streamid=#!::r=cam,u=alice,s=pw-alice-1&passphrase={pass}&pbkeylen=32");
    let got = pictures(&["-i", &read, "-frames:v", "25"]);
    assert_eq!(got.len(), 25);
    let (ok, _) = ffmpeg_decode(&format!("srt://{srt}?streamid=read:cam&passphrase={pass}&pbkeylen=32"), &[], 1);
    assert!(!ok, "a reader without credentials read");
}

/// GStreamer publishes over SRT (`srtsink`) and reads over SRT (`srtsrc`); srt-live-transmit
/// reads the demo path, whose source is a TS file.
#[test]
fn gstreamer_and_srt_live_transmit_publish_and_read() {
    if !have_srt() || !have_gstreamer() {
        return;
    }
    let relay = Relay::with_config(CONFIG, &[]);
    let srt = srt_addr(&relay);
    let (host, port) = srt.rsplit_once(':').unwrap();
    let mut c = Command::new("timeout");
    c.args([
        "30",
        "gst-launch-1.0",
        "-q",
        "filesrc",
        &format!("location={DEMO}"),
        "!",
        "tsparse",
        "set-timestamps=true",
    ]);
    c.args(["!", "queue", "!", "srtsink", &format!("uri=srt://{host}:{port}?streamid=publish:cam"), "sync=true"]);
    let _gst = Kill(c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "50"]);
    assert!(
        is_run_of(&looped_clip(), &got),
        "{} pictures from GStreamer's publish, not a run of the clip's",
        got.len()
    );

    // GStreamer reads the demo path over SRT and decodes it.
    let mut c = Command::new("timeout");
    c.args([
        "-s",
        "INT",
        "8",
        "gst-launch-1.0",
        "-e",
        "srtsrc",
        &format!("uri=srt://{host}:{port}?streamid=read:demo"),
    ]);
    c.args(["!", "tsdemux", "!", "h264parse", "!", "openh264dec", "!", "fakesink", "name=v", "silent=false", "-v"]);
    let log = Gst::spawn(c).log();
    let frames = log.lines().filter(|l| l.contains("(v:sink)") && l.contains("chain")).count();
    assert!(frames >= 50, "{frames} pictures decoded by GStreamer over SRT: {log}");
    assert!(gst_errors_while_playing(&log).is_empty(), "{log}");

    // srt-live-transmit writes what it reads to stdout: MPEG-TS that ffprobe reads.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "timeout 6 srt-live-transmit -q 'srt://{host}:{port}?streamid=read:demo' file://con > {dir}/slt.ts; \
             ffprobe -v error -count_frames -select_streams v -show_entries stream=codec_name,nb_read_frames -of csv=p=0 {dir}/slt.ts",
            dir = std::env::temp_dir().display()
        ))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let frames: u64 = said.trim().rsplit(',').next().and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(said.starts_with("h264") && frames >= 100, "srt-live-transmit's copy: {said}");
}

/// A lossy, slow link between an SRT caller and the relay: datagrams either way are dropped
/// with probability `loss` and delayed by `delay`. (This kernel has no `netem`: the
/// impairment is done here, in user space, on loopback.) Stops when dropped.
struct Impair {
    addr: std::net::SocketAddr,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    passed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Impair {
    fn new(to: std::net::SocketAddr, loss: f64, delay: Duration) -> Impair {
        use std::net::UdpSocket;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
        use std::sync::Arc;
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let back = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        back.connect(to).unwrap();
        let (dropped, passed, stop) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let caller: Arc<std::sync::Mutex<Option<std::net::SocketAddr>>> = Arc::default();
        // One direction: receive, drop or hold for `delay`, send on (a constant delay keeps
        // the order, so one queue per direction).
        let direction = |from: Arc<UdpSocket>, to: Arc<UdpSocket>, forward: bool, seed: u64| {
            let (dropped, passed, stop, caller) = (dropped.clone(), passed.clone(), stop.clone(), caller.clone());
            let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
            let (stop2, caller2) = (stop.clone(), caller.clone());
            std::thread::spawn(move || {
                while let Ok((due, data)) = rx.recv() {
                    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
                    if stop2.load(Relaxed) {
                        return;
                    }
                    let _ = if forward { to.send(&data) } else { to.send_to(&data, caller2.lock().unwrap().unwrap()) };
                }
            });
            std::thread::spawn(move || {
                from.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                let mut rng = seed;
                let mut buf = [0u8; 2048];
                while !stop.load(Relaxed) {
                    let Ok((n, src)) = from.recv_from(&mut buf) else { continue };
                    if forward {
                        *caller.lock().unwrap() = Some(src);
                    }
                    // xorshift: the same losses every run.
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if (rng % 10_000) as f64 / 10_000.0 < loss {
                        dropped.fetch_add(1, Relaxed);
                        continue;
                    }
                    passed.fetch_add(1, Relaxed);
                    let _ = tx.send((std::time::Instant::now() + delay, buf[..n].to_vec()));
                }
            });
        };
        direction(front.clone(), back.clone(), true, 0x9e37_79b9_7f4a_7c15);
        direction(back, front.clone(), false, 0x2545_f491_4f6c_dd1d);
        Impair { addr: front.local_addr().unwrap(), dropped, passed, stop }
    }
}

impl Drop for Impair {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Over a link that loses 5% of datagrams each way and delays each by 50 ms, a publisher
/// with a latency of a second reaches the relay whole: libsrt found packets missing and had
/// them sent again, gave up on none, and the relay's copy plays back as a run of the clip's
/// pictures.
#[test]
fn srt_under_loss_and_delay_arrives_whole() {
    if !have_srt() {
        return;
    }
    let relay = Relay::with_config(&format!("srt_latency_ms = 1000\n{CONFIG}"), &["--no-demo"]);
    let link = Impair::new(srt_addr(&relay).parse().unwrap(), 0.05, Duration::from_millis(50));
    // ffmpeg's SRT latency is in microseconds.
    let _p = publish(&format!("srt://{}?streamid=publish:cam&latency=1000000", link.addr));
    assert!(wait_for(Duration::from_secs(15), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "150"]);
    assert_eq!(got.len(), 150);
    assert!(is_run_of(&looped_clip(), &got), "pictures played back after the lossy link are not a run of the clip's");
    let links = relay.ok("GET", "/v1/sessions/cam", None)["srt"].clone();
    let p = links.as_array().unwrap().iter().find(|l| l["mode"] == "publish").cloned().unwrap();
    let dropped = link.dropped.load(std::sync::atomic::Ordering::Relaxed);
    let passed = link.passed.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("link: {dropped} dropped, {passed} passed; the relay's SRT link: {p}");
    assert!(dropped * 100 >= passed * 3, "the link lost too little to test anything: {dropped} of {passed}");
    assert!(p["lost"].as_u64().unwrap() > 0, "libsrt saw no loss: {p}");
    assert_eq!(p["dropped"], 0, "packets given up on within the latency: {p}");
    assert!(p["rtt_ms"].as_f64().unwrap() >= 90.0, "the round trip is two delays: {p}");
}

/// A path pulled from an SRT listener (here the relay's own, reading the demo): its MPEG-TS
/// becomes tracks that play over RTSP picture for picture; nobody else may publish it; a
/// pull that cannot connect says why.
#[test]
fn a_path_pulls_an_srt_source() {
    if !have_srt() {
        return;
    }
    let relay = Relay::start(&[]);
    let srt = srt_addr(&relay);
    let spec = serde_json::json!({ "name": "pulled", "source": { "srt": format!("srt://{srt}?streamid=read:demo&latency=200") } });
    relay.ok("POST", "/v1/sessions", Some(spec));
    let pub_state = || relay.ok("GET", "/v1/sessions/pulled", None)["publisher"].clone();
    assert!(wait_for(Duration::from_secs(15), || pub_state()["state"] == "publishing"), "{}", pub_state());
    let s = relay.ok("GET", "/v1/sessions/pulled", None);
    assert!(s.get("srt_publish_url").is_none() && s.get("rtmp_publish_url").is_none(), "{s}");
    let url = format!("rtsp://{}/pulled", rtsp_addr(&relay));
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "100"]);
    assert!(is_run_of(&looped_clip(), &got), "{} pictures pulled over SRT, not a run of the clip's", got.len());
    // Not a path anyone publishes to.
    let (ok, _) = try_publish(&format!("srt://{srt}?streamid=publish:pulled"));
    assert!(!ok, "an SRT publisher took a pulled path");
    // A pull of nothing: retried, and the reason shown.
    let spec = serde_json::json!({ "name": "nowhere", "source": { "srt": "srt://127.0.0.1:9?streamid=read:x" } });
    relay.ok("POST", "/v1/sessions", Some(spec));
    let why = || relay.ok("GET", "/v1/sessions/nowhere", None)["publisher"]["pull_error"].clone();
    assert!(wait_for(Duration::from_secs(10), || why().is_string()), "{}", why());
    // Nor while its pull is not connected.
    let (ok, _) = try_publish(&format!("srt://{srt}?streamid=publish:nowhere"));
    assert!(!ok, "an SRT publisher took a pulled path whose pull is down");
    let (code, body) = relay.call(
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({ "name": "bad", "source": { "srt": "srt://127.0.0.1:9?latency=5" } })),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.to_string().contains("latency"), "{body}");

    // On demand: it calls only once a reader asks, and hangs up a linger after the last.
    let spec = serde_json::json!({ "name": "lazy", "source": {
        "srt": format!("srt://{srt}?streamid=read:demo&latency=200"), "on_demand": true, "linger_s": 1 } });
    relay.ok("POST", "/v1/sessions", Some(spec));
    let lazy = || relay.ok("GET", "/v1/sessions/lazy", None)["publisher"].clone();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(lazy()["state"], "waiting", "{}", lazy());
    assert_eq!(lazy()["pull_error"], "on demand: no reader", "{}", lazy());
    let url = format!("rtsp://{}/lazy", rtsp_addr(&relay));
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "50"]);
    assert!(is_run_of(&looped_clip(), &got), "{} pictures pulled on demand, not a run of the clip's", got.len());
    assert!(wait_for(Duration::from_secs(20), || lazy()["state"] == "waiting"), "still pulled: {}", lazy());
}

/// When the publisher leaves for good (past `publisher_grace_s`), RTMP players and SRT
/// readers are told and closed, as RTSP and HTTP players are: none waits for its timeout.
#[test]
fn the_end_of_a_published_stream_reaches_rtmp_and_srt_players() {
    if !have_srt() {
        return;
    }
    let relay = Relay::with_config(&format!("publisher_grace_s = 1\n{CONFIG}"), &["--no-demo"]);
    let srt = srt_addr(&relay);
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let mut c = Command::new("ffmpeg");
    c.args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", DEMO, "-t", "8", "-c", "copy"]);
    c.args(["-f", "mpegts", &format!("srt://{srt}?streamid=publish:cam")]);
    let _p = Kill(c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let player = |url: String| {
        Command::new("timeout")
            .args(["40", "ffmpeg", "-nostdin", "-loglevel", "error", "-i", &url, "-f", "null", "-"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let started = std::time::Instant::now();
    let players = [player(format!("rtmp://{rtmp}/cam")), player(format!("srt://{srt}?streamid=read:cam"))];
    for (mut p, what) in players.into_iter().zip(["RTMP", "SRT"]) {
        let status = p.wait().unwrap();
        assert_ne!(status.code(), Some(124), "the {what} player was not told the stream ended");
    }
    assert!(started.elapsed() < Duration::from_secs(25), "the players took {:?} to end", started.elapsed());
}

/// Malformed handshakes and garbage on the SRT port (truncated and corrupted induction and
/// conclusion packets, random datagrams, from many ports) change nothing: a real caller is
/// served right after.
#[test]
fn garbage_on_the_srt_port_harms_nobody() {
    if !have_srt() {
        return;
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let srt: std::net::SocketAddr = srt_addr(&relay).parse().unwrap();
    // An SRT control packet: the control bit, a type, then whatever follows.
    let handshake = |version: u32, kind: u32, len: usize, fill: u8| {
        let mut p = vec![0x80, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&version.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 2]);
        p.extend_from_slice(&kind.to_be_bytes());
        p.resize(len, fill);
        p
    };
    let mut rng = 0x1234_5678_9abc_def0u64;
    for i in 0..2000u32 {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let p = match i % 4 {
            0 => handshake(4, 1, 64, 0),                                   // induction, short
            1 => handshake(5, 0xffff_ffff, 48 + (i as usize % 200), 0xff), // conclusion, bad extensions
            2 => handshake(rng as u32, rng as u32 >> 3, (rng % 1500) as usize, rng as u8),
            _ => (0..(rng % 1400) as usize).map(|k| (rng >> (k % 56)) as u8).collect(),
        };
        let _ = s.send_to(&p, srt);
    }
    let _p = publish(&format!("srt://{srt}?streamid=publish:cam"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let got = pictures(&["-i", &format!("srt://{srt}?streamid=read:cam"), "-frames:v", "25"]);
    assert_eq!(got.len(), 25, "a reader after the garbage");
}

fn publish(url: &str) -> Kill {
    ffmpeg_publish("mpegts", url)
}

fn try_publish(url: &str) -> (bool, String) {
    ffmpeg_try_publish("mpegts", url)
}

/// Issue 32: where the path says `takeover = true`, a new publisher replaces the one
/// publishing, whatever protocol either speaks (RTSP → RTMP → SRT → RTSP), and the one
/// replaced is closed (its ffmpeg exits); an RTSP reader stays through all of it and sees one
/// stream: one SSRC, no sequence number missing, its RTP time keeping to the wall clock; the
/// status counts the takeovers.
#[test]
fn a_new_publisher_takes_over_where_the_path_says_so() {
    if !have_srt() {
        return;
    }
    // ffmpeg's RTSP muxer wants AAC with its global header: the clip as MP4.
    let mp4 = std::env::temp_dir().join(format!("fanout-takeover-{}.mp4", std::process::id()));
    let made = Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-i", DEMO, "-c", "copy", "-bsf:a", "aac_adtstoasc"])
        .arg(&mp4)
        .status()
        .unwrap();
    assert!(made.success());
    // (From the MP4 over every protocol: the TS clip's audio starts late, and ffmpeg sends
    // its first second at once when it muxes it again, a jump ahead no relay can undo.)
    let publish = |format: &str, url: &str| {
        let mut c = Command::new("ffmpeg");
        c.args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i"]).arg(&mp4);
        c.args(["-t", "40", "-c", "copy", "-f", format]);
        if format == "rtsp" {
            c.args(["-rtsp_transport", "tcp"]);
        }
        Kill(c.arg(url).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
    };
    let config = "[[session]]\nname = \"cam\"\nsource = { publish = true, takeover = true }\n";
    let relay = Relay::with_config(&format!("publisher_grace_s = 60\n{config}"), &["--no-demo"]);
    let addr = rtsp_addr(&relay);
    let rtsp_url = format!("rtsp://{addr}/cam");
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let srt_url = format!("srt://{}?streamid=publish:cam", srt_addr(&relay));
    let now_over = |how: &str, takeovers: u64| {
        wait_for(Duration::from_secs(10), || {
            let p = publisher(&relay);
            p["transport"] == how && p["takeovers"] == takeovers
        })
    };
    let exits = |k: &mut Kill| wait_for(Duration::from_secs(10), || k.0.try_wait().unwrap().is_some());

    let mut first = publish("rtsp", &rtsp_url);
    assert!(now_over("interleaved", 0), "{}", publisher(&relay));
    assert_eq!(publisher(&relay)["takeover"], true);
    // A reader over RTSP (UDP): (arrival, SSRC, sequence number, RTP time) of every packet.
    let play = rtsp_play(addr, "cam", None);
    let rtp = play.rtp.try_clone().unwrap();
    let packets = rtp_headers_for(rtp, Duration::from_secs(22));
    std::thread::sleep(Duration::from_secs(4));

    let mut second = publish("flv", &format!("rtmp://{rtmp}/cam"));
    assert!(now_over("rtmp", 1), "{}", publisher(&relay));
    assert!(exits(&mut first), "the RTSP publisher taken over was not closed");
    std::thread::sleep(Duration::from_secs(4));

    let mut third = publish("mpegts", &srt_url);
    assert!(now_over("srt", 2), "{}", publisher(&relay));
    assert!(exits(&mut second), "the RTMP publisher taken over was not closed");
    std::thread::sleep(Duration::from_secs(4));

    let _fourth = publish("rtsp", &rtsp_url);
    assert!(now_over("interleaved", 3), "{}", publisher(&relay));
    assert!(exits(&mut third), "the SRT publisher taken over was not closed");
    assert_eq!(publisher(&relay)["publishes"], 4);

    let packets = packets.join().unwrap();
    drop(play);
    assert!(packets.len() > 500, "{} packets", packets.len());
    let (t0, ssrc, seq0, ts0) = packets[0];
    assert!(packets.iter().all(|p| p.1 == ssrc), "the SSRC changed");
    let last = packets.last().unwrap().2;
    let missing = usize::from(last.wrapping_sub(seq0)) + 1 - packets.len();
    assert_eq!(missing, 0, "sequence numbers missing");
    // Its RTP time never runs back, and keeps to the wall clock: a takeover may put it ahead
    // by what the new publisher sent before its tracks were known (ffmpeg's TS holds the
    // first audio ~0.7 s, and the pictures meanwhile wait for it), no more.
    assert!(packets.windows(2).all(|w| w[1].3.wrapping_sub(w[0].3) as i32 >= 0), "RTP time ran back");
    let ahead: Vec<f64> = packets
        .iter()
        .map(|&(t, _, _, ts)| f64::from(ts.wrapping_sub(ts0)) / 90_000.0 - (t - t0).as_secs_f64())
        .collect();
    let (lo, hi) = ahead.iter().fold((f64::MAX, f64::MIN), |(l, h), &a| (l.min(a), h.max(a)));
    eprintln!("RTP time ahead of the wall clock: {lo:.2} s to {hi:.2} s");
    assert!(hi - lo < 1.0, "the reader's RTP time moved against the wall clock by {lo:.2}..{hi:.2} s");
    let (ok, log) = ffmpeg_decode(&rtsp_url, &["-rtsp_transport", "tcp"], 2);
    assert!(ok && decoded_frames(&log) >= 45, "{log}");
    let _ = std::fs::remove_file(&mp4);
}
