//! WebRTC (issue 33): headless Chromium, from a page of another origin, plays the demo over
//! WHEP (`POST /{path}/whep`): its frames decode without a freeze or a lost packet, each
//! decoded milliseconds after the relay sent it, the status lists the viewer (and why the AAC
//! audio is left out), and `DELETE` of its resource ends it.

mod common;
use common::browser::{have_chromium, Driver};
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// Starts a WHEP viewer of `arguments[0]` in the page (video and audio offered, as a player
/// would; over ICE-TCP only if `arguments[1]`); `window.whep` tells how it goes, `window.stats` and `window.audio` its inbound
/// video and audio every 250 ms, `window.widths` how often each picture width was seen.
const WHEP: &str = r#"
const url = arguments[0];
window.whep = { state: 'starting' };
window.stats = {};
window.audio = {};
window.widths = {};
(async () => {
  try {
    const pc = new RTCPeerConnection();
    window.pc = pc;
    pc.addTransceiver('video', { direction: 'recvonly' });
    pc.addTransceiver('audio', { direction: 'recvonly' });
    const v = document.createElement('video');
    v.muted = true; v.autoplay = true; document.body.appendChild(v);
    // Audio plays only where an element renders it.
    const a = document.createElement('audio'); a.autoplay = true; document.body.appendChild(a);
    pc.ontrack = e => { (e.track.kind === 'video' ? v : a).srcObject = new MediaStream([e.track]); };
    await pc.setLocalDescription(await pc.createOffer());
    const r = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/sdp' }, body: pc.localDescription.sdp });
    window.whep.status = r.status;
    window.whep.location = r.headers.get('Location');
    let body = await r.text();
    if (r.status !== 201) { window.whep.state = 'refused: ' + body; return; }
    // arguments[1]: as if UDP were blocked, only the answer's TCP candidates are kept.
    if (arguments[1]) body = body.split('\r\n').filter(l => !(l.startsWith('a=candidate') && / udp /i.test(l))).join('\r\n');
    await pc.setRemoteDescription({ type: 'answer', sdp: body });
    window.whep.state = 'answered';
    setInterval(async () => {
      const all = await pc.getStats();
      all.forEach(s => {
        if (s.type === 'inbound-rtp' && s.kind === 'video') {
          window.stats = s;
          if (s.frameWidth) window.widths[s.frameWidth] = (window.widths[s.frameWidth] ?? 0) + 1;
        }
        if (s.type === 'inbound-rtp' && s.kind === 'audio') window.audio = s;
      });
      // The newest picture received: its RTP time, and when (Unix ms).
      const video = pc.getReceivers().find(r => r.track.kind === 'video');
      const src = video && video.getSynchronizationSources()[0];
      if (src) window.shown = { rtp: src.rtpTimestamp, unix_ms: src.timestamp };
      window.whep.ice = pc.iceConnectionState;
    }, 250);
  } catch (e) { window.whep.state = 'error: ' + e; }
})();
return true;
"#;

/// Chromium playing `whep` from a page of another origin (the `WHEP` script's state in
/// `window`).
fn whep_viewer(whep: &str) -> Driver {
    let d = Driver::start();
    d.post("url", json!({ "url": page_elsewhere() }));
    d.post("execute/sync", json!({ "script": WHEP, "args": [whep] }));
    d
}

/// An empty page on another origin (another port), as a site embedding a player would be.
fn page_elsewhere() -> String {
    let site = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let page = format!("http://localhost:{}/", site.local_addr().unwrap().port());
    std::thread::spawn(move || {
        for mut c in site.incoming().flatten() {
            let _ = std::io::Read::read(&mut c, &mut [0u8; 2048]);
            let body = "<!doctype html><title>player</title>";
            let head = format!("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n", body.len());
            let _ = std::io::Write::write_all(&mut c, (head + body).as_bytes());
        }
    });
    page
}

#[test]
fn chromium_plays_the_demo_over_whep() {
    if !have_chromium() {
        return;
    }
    let relay = Relay::start(&[]);
    let engine = relay.ok("GET", "/v1/engine", None);
    assert!(engine["webrtc"].is_string(), "the relay serves WebRTC: {engine}");
    let whep = relay.url("/demo/whep");
    // CORS: a page of another origin may POST an SDP body (a preflighted request).
    let pre = ureq::request("OPTIONS", &whep).set("Origin", "https://player.example").call().unwrap();
    assert_eq!(pre.status(), 204);
    assert!(pre.header("access-control-allow-methods").unwrap_or("").contains("POST"));
    // Not an SDP offer: refused with the reason.
    let bad = ureq::post(&whep).set("Content-Type", "application/sdp").send_string("v=0\r\nnonsense");
    assert!(matches!(bad, Err(ureq::Error::Status(400, _))), "{bad:?}");

    let d = Driver::start();
    d.post("url", json!({ "url": page_elsewhere() }));
    d.post("execute/sync", json!({ "script": WHEP, "args": [whep] }));
    let stat = |k: &str| d.js(&format!("return window.stats['{k}'] ?? null;"));
    let decoded = || stat("framesDecoded").as_u64().unwrap_or(0);
    assert!(
        wait_for(Duration::from_secs(20), || decoded() > 10),
        "no frames decoded: {} / {}",
        d.js("return window.whep;"),
        relay.ok("GET", "/v1/sessions/demo", None)["webrtc"]
    );
    let whep_state = d.js("return window.whep;");
    assert_eq!(whep_state["status"], 201, "{whep_state}");
    let location = whep_state["location"].as_str().unwrap().to_string();

    // The status lists the viewer, playing H.264, and the AAC audio as Opus.
    let status = relay.ok("GET", "/v1/sessions/demo", None);
    let viewers = status["webrtc"].as_array().unwrap();
    assert_eq!(viewers.len(), 1, "{status}");
    assert_eq!(viewers[0]["state"], "playing");
    assert!(viewers[0]["tracks"][0].as_str().unwrap().starts_with("video H264"), "{}", viewers[0]);
    assert!(viewers[0]["tracks"][1].as_str().unwrap().starts_with("audio opus"), "{}", viewers[0]);
    assert_eq!(viewers[0]["left_out"], json!([]), "{}", viewers[0]);
    assert!(metrics(&relay).contains("fanout_webrtc_viewers{session=\"demo\"} 1"));

    // 20 s of play (60 s with the clock test below): every frame of the 25 fps demo decoded, no freeze, no packet lost.
    let (f0, t0) = (decoded(), std::time::Instant::now());
    let mut latencies = Vec::new();
    while t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_secs(1));
        // The relay's newest picture sent, and the browser's newest received: how long after
        // the relay sent an RTP time the browser had it (one machine, one clock).
        let sent = relay.ok("GET", "/v1/sessions/demo", None)["webrtc"][0]["last_picture"].clone();
        let shown = d.js("return window.shown ?? null;");
        let (Some(rs), Some(ts), Some(rb), Some(tb)) =
            (sent["rtp"].as_u64(), sent["unix_ms"].as_f64(), shown["rtp"].as_u64(), shown["unix_ms"].as_f64())
        else {
            continue;
        };
        let ahead_ms = f64::from((rb as u32).wrapping_sub(rs as u32) as i32) / 90.0;
        latencies.push(tb - (ts + ahead_ms));
    }
    let s = d.js("return window.stats;");
    let frames = decoded() - f0;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("WebRTC: {frames} frames in {secs:.1} s, {s}");
    assert!(frames as f64 >= 0.9 * 25.0 * secs, "{frames} frames decoded in {secs:.1} s");
    assert_eq!(s["freezeCount"].as_u64().unwrap_or(0), 0, "freezes: {s}");
    assert_eq!(s["packetsLost"].as_i64().unwrap_or(0), 0, "packets lost: {s}");
    // Then its jitter buffer, assembly and decoding (Chromium's totalProcessingDelay: from a
    // frame's first packet to its decoded picture).
    latencies.sort_by(f64::total_cmp);
    assert!(!latencies.is_empty(), "no picture times: {s}");
    let arrival = latencies[latencies.len() / 2];
    let processing = 1000.0 * s["totalProcessingDelay"].as_f64().unwrap() / s["framesDecoded"].as_f64().unwrap();
    let behind = arrival + processing;
    eprintln!(
        "WebRTC: a picture is decoded {behind:.0} ms after the relay sends it ({arrival:.0} ms to arrive, median of {}; {processing:.0} ms in the browser)",
        latencies.len()
    );
    assert!(behind < 500.0, "{behind} ms behind");

    // DELETE ends it: gone from the status, frames stop.
    let del = ureq::delete(&relay.url(&location)).call().unwrap();
    assert_eq!(del.status(), 200);
    assert!(wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/sessions/demo", None)["webrtc"] == json!([])));
    std::thread::sleep(Duration::from_secs(1));
    let stopped = decoded();
    std::thread::sleep(Duration::from_secs(2));
    assert!(decoded() - stopped < 5, "frames still coming after DELETE");
    let again = ureq::delete(&relay.url(&location)).call();
    assert!(matches!(again, Err(ureq::Error::Status(404, _))));
    let log = d.post("se/log", json!({ "type": "browser" }));
    let bad: Vec<&Value> = log.as_array().unwrap().iter().filter(|e| e["level"] == "SEVERE").collect();
    assert!(bad.is_empty(), "console: {bad:#?}");
}

/// With a token, a WHEP offer needs it (`Authorization: Bearer`), a browser's CORS
/// preflight does not (it never carries one) and gets no data; a path that does not exist is
/// 404, and a body that is not SDP 415, each with the reason.
#[test]
fn whep_takes_the_token_and_refuses_with_reasons() {
    let relay = Relay::start(&["--token", "s3cret"]);
    let whep = relay.url("/v1/sessions/demo/whep");
    let pre = ureq::request("OPTIONS", &whep).set("Origin", "https://player.example").call().unwrap();
    assert_eq!(pre.status(), 204);
    assert_eq!(pre.header("access-control-allow-origin"), Some("*"));
    let offer = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n";
    let denied = ureq::post(&whep).set("Content-Type", "application/sdp").send_string(offer);
    assert!(matches!(denied, Err(ureq::Error::Status(401, _))), "{denied:?}");
    let auth = |r: ureq::Request| r.set("Authorization", "Bearer s3cret").set("Content-Type", "application/sdp");
    let why = |r: Result<ureq::Response, ureq::Error>| match r {
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        other => panic!("{other:?}"),
    };
    let (code, text) = why(auth(ureq::post(&relay.url("/nosuch/whep"))).send_string(offer));
    assert_eq!(code, 404, "{text}");
    assert!(text.contains("nosuch"), "{text}");
    let (code, text) = why(auth(ureq::post(&whep)).set("Content-Type", "text/plain").send_string(offer));
    assert_eq!((code, text.contains("application/sdp")), (415, true), "{text}");
    // An offer with no media: nothing to send it.
    let (code, text) = why(auth(ureq::post(&whep)).send_string(offer));
    assert_eq!(code, 400, "{text}");
}

/// Publishes a canvas that changes every frame over WHIP to `arguments[0]`, at 25 fps, in
/// the codec (`arguments[1]`, a MIME type) or the browser's choice; `window.whip` tells how
/// it goes. With `arguments[2]` (simulcast encodings, as `sendEncodings`), a 640×360 canvas
/// whose squares change colour, eight a picture (costly enough for an encoder's maximum
/// rate, not so costly that it drops pictures). With `arguments[3]`, a 440 Hz tone as its
/// audio (Opus).
const WHIP: &str = r#"
const url = arguments[0], codec = arguments[1], encodings = arguments[2], tone = arguments[3];
window.whip = { state: 'starting' };
(async () => {
  try {
    const [w, h] = encodings ? [640, 360] : [320, 240];
    const c = document.createElement('canvas'); c.width = w; c.height = h;
    document.body.appendChild(c);
    const g = c.getContext('2d'); let n = 0;
    setInterval(() => { n++; g.fillStyle = `hsl(${(n * 7) % 360} 80% 50%)`; if (!encodings || n == 1) g.fillRect(0, 0, w, h);
                        for (let i = 0; encodings && i < 8; i++) {
                          g.fillStyle = `hsl(${Math.random() * 360} 90% ${20 + Math.random() * 60}%)`;
                          g.fillRect(Math.floor(Math.random() * 16) * 40, Math.floor(Math.random() * 9) * 40, 40, 40);
                        }
                        g.fillStyle = '#fff'; g.font = '48px sans-serif'; g.fillText(String(n), 20, 140); }, 40);
    const stream = c.captureStream(25);
    // Fewer pictures rather than smaller ones when the encoder is short of CPU.
    if (encodings) stream.getVideoTracks()[0].contentHint = 'detail';
    const pc = new RTCPeerConnection();
    window.pc = pc;
    const t = pc.addTransceiver(stream.getVideoTracks()[0],
                                { direction: 'sendonly', streams: [stream], ...(encodings ? { sendEncodings: encodings } : {}) });
    if (tone) {
      const ac = new AudioContext(), osc = ac.createOscillator(), dest = ac.createMediaStreamDestination();
      osc.frequency.value = 440; osc.connect(dest); osc.start();
      pc.addTransceiver(dest.stream.getAudioTracks()[0], { direction: 'sendonly', streams: [stream] });
    }
    if (codec) {
      const caps = (RTCRtpSender.getCapabilities('video') || RTCRtpReceiver.getCapabilities('video')).codecs;
      t.setCodecPreferences(caps.filter(c => c.mimeType === codec));
    }
    await pc.setLocalDescription(await pc.createOffer());
    const r = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/sdp' }, body: pc.localDescription.sdp });
    window.whip.status = r.status;
    window.whip.location = r.headers.get('Location');
    const body = await r.text();
    if (r.status !== 201) { window.whip.state = 'refused: ' + body; return; }
    await pc.setRemoteDescription({ type: 'answer', sdp: body });
    window.whip.state = 'answered';
    pc.oniceconnectionstatechange = () => { window.whip.ice = pc.iceConnectionState; };
    // What each encoding sends, as the browser says.
    setInterval(async () => {
      const out = [];
      (await pc.getStats()).forEach(s => { if (s.type === 'outbound-rtp' && s.kind === 'video')
        out.push({ rid: s.rid, width: s.frameWidth, fps: s.framesPerSecond, bps: s.targetBitrate, limit: s.qualityLimitationReason }); });
      window.whip.out = out;
    }, 1000);
  } catch (e) { window.whip.state = 'error: ' + e; }
})();
return true;
"#;

/// Runs the WHIP script in `d`'s page with `args` and waits until the relay's `cam` path
/// says a WebRTC publisher publishes (`what` names the case in the failure).
fn whip_publishes(relay: &Relay, d: &Driver, args: Value, what: &str) {
    d.post("execute/sync", json!({ "script": WHIP, "args": args }));
    let publisher = || relay.ok("GET", "/v1/sessions/cam", None)["publisher"].clone();
    assert!(
        wait_for(Duration::from_secs(20), || publisher()["transport"] == "webrtc"),
        "{what}: not publishing: {} / {}",
        d.js("return window.whip;"),
        publisher()
    );
}

/// Chromium publishes over WHIP into a `publish` path: the path's publisher says `webrtc`,
/// ffmpeg decodes it over RTSP and HTTP TS without an error (the relay asks the browser for
/// a keyframe every 2 s, so a player joining late starts at once); its Opus tone reaches
/// RTMP, HTTP TS and MPEG-TS HLS players as AAC, made once for them all, which ffmpeg decodes
/// to a 440 Hz tone; a second WHIP publisher is
/// refused (409), a WHEP viewer in the same page plays it, and DELETE of the resource ends
/// the publishing and, past the grace, the viewer.
#[test]
fn chromium_publishes_over_whip_and_ffmpeg_plays_it() {
    if !have_chromium() || !have_ffmpeg() {
        return;
    }
    let config =
        "publisher_grace_s = 1\n[[session]]\nname = \"cam\"\nsource = { publish = true }\nhls_variant = \"mpegts\"\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let whip = relay.url("/cam/whip");
    let d = Driver::start();
    d.post("url", json!({ "url": page_elsewhere() }));
    whip_publishes(&relay, &d, json!([whip, null, null, true]), "H264");
    let publisher = || relay.ok("GET", "/v1/sessions/cam", None)["publisher"].clone();
    let status = relay.ok("GET", "/v1/sessions/cam", None);
    assert_eq!(status["webrtc"][0]["role"], "publisher", "{status}");
    // A player that joins now: its first picture within ~2 s (the keyframe asked for),
    // decoded without an error, over RTSP and over HTTP TS.
    let rtsp = format!("rtsp://{}/cam", rtsp_addr(&relay));
    let (ok, log) = ffmpeg_decode(&rtsp, &["-rtsp_transport", "tcp"], 4);
    assert!(ok && decoded_frames(&log) >= 60, "{log}");
    let (ok, log) = ffmpeg_decode(&relay.url("/v1/sessions/cam/stream"), &[], 4);
    assert!(ok && decoded_frames(&log) >= 60, "{log}");
    // The Opus as AAC, for the players that take no Opus: one transcoder for them all.
    let rtmp = format!("rtmp://{}/cam", relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap());
    for url in [rtmp, relay.url("/v1/sessions/cam/stream"), relay.url("/v1/sessions/cam/hls/index.m3u8")] {
        let (codec, hz) = tone_of(&url);
        assert_eq!(codec, "aac", "{url}: {}\n{}", relay.ok("GET", "/v1/sessions/cam", None), relay.stderr());
        assert!((hz - 440.0).abs() < 15.0, "{url}: the tone is at {hz} Hz");
    }
    let status = relay.ok("GET", "/v1/sessions/cam", None);
    let made = status["transcoding"].as_array().unwrap();
    assert!(made.len() == 1 && made[0]["from"] == "opus" && made[0]["to"] == "aac", "{status}");
    // A second publisher is refused while the first publishes.
    let offer = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n";
    let second = ureq::post(&whip).set("Content-Type", "application/sdp").send_string(offer);
    assert!(matches!(second, Err(ureq::Error::Status(409, _))), "{second:?}");
    // A WebRTC viewer of it, in the same page: WebRTC in and out.
    d.post("execute/sync", json!({ "script": WHEP, "args": [relay.url("/cam/whep")] }));
    let decoded = || d.js("return window.stats.framesDecoded ?? 0;").as_u64().unwrap_or(0);
    assert!(wait_for(Duration::from_secs(15), || decoded() > 25), "the viewer: {}", d.js("return window.whep;"));
    // DELETE ends it: the path waits for the next publisher; past the grace its viewers are
    // told the stream ended (their peer connection closed).
    let location = d.js("return window.whip.location;").as_str().unwrap().to_string();
    assert_eq!(ureq::delete(&relay.url(&location)).call().unwrap().status(), 200);
    assert!(wait_for(Duration::from_secs(5), || publisher()["state"] == "waiting"), "{}", publisher());
    let viewers = || relay.ok("GET", "/v1/sessions/cam", None)["webrtc"].as_array().map_or(0, Vec::len);
    assert!(wait_for(Duration::from_secs(10), || viewers() == 0), "{}", relay.ok("GET", "/v1/sessions/cam", None));
}

/// A browser that publishes VP8, VP9 or AV1 over WHIP (its offer has no H.264): the path
/// carries that codec, RTSP readers joining mid-GOP get a keyframe's first packet first, a
/// WHEP viewer in the same page decodes it, and (VP9, AV1) ffmpeg decodes it over HLS.
#[test]
fn chromium_publishes_vp8_vp9_and_av1_over_whip() {
    if !have_chromium() {
        return;
    }
    for (codec, mime, is_key) in [
        ("VP8", "video/VP8", fanout_proto::codec::vpx::vp8_keyframe_start as fn(&[u8]) -> bool),
        ("VP9", "video/VP9", fanout_proto::codec::vpx::vp9_keyframe_start),
        ("AV1", "video/AV1", fanout_proto::codec::av1::av1_keyframe_start),
    ] {
        let relay = Relay::with_config("[[session]]\nname = \"cam\"\nsource = { publish = true }\n", &["--no-demo"]);
        let d = Driver::start();
        d.post("url", json!({ "url": page_elsewhere() }));
        let encodes = d.js(&format!(
            "return (RTCRtpSender.getCapabilities('video')?.codecs ?? []).some(c => c.mimeType === '{mime}');"
        ));
        if encodes != json!(true) {
            eprintln!("\n*** SKIPPED {codec}: this Chromium has no {codec} encoder for WebRTC ***\n");
            continue;
        }
        whip_publishes(&relay, &d, json!([relay.url("/cam/whip"), mime]), codec);
        let status = relay.ok("GET", "/v1/sessions/cam", None);
        assert_eq!(status["webrtc"][0]["tracks"][0], format!("video {codec}"), "{status}");
        // Keyframes in the ring (the relay asks the browser for one every 2 s), then readers.
        std::thread::sleep(Duration::from_secs(3));
        for join in 0..2 {
            let play = rtsp_play(rtsp_addr(&relay), "cam", None);
            assert!(play.sdp.contains(&format!("{codec}/90000")), "{}", play.sdp);
            play.rtp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 2048];
            let n = play.rtp.recv(&mut buf).unwrap();
            let v = fanout_proto::rtp::RtpView::parse(&buf[..n]).unwrap();
            assert!(is_key(&buf[v.payload_range()]), "{codec}, join {join}: starts with {:02x?}", &buf[12..24.min(n)]);
            std::thread::sleep(Duration::from_millis(900));
        }
        d.post("execute/sync", json!({ "script": WHEP, "args": [relay.url("/cam/whep")] }));
        let decoded = || d.js("return window.stats.framesDecoded ?? 0;").as_u64().unwrap_or(0);
        assert!(
            wait_for(Duration::from_secs(15), || decoded() > 50),
            "{codec} viewer: {}",
            d.js("return window.whep;")
        );
        let stats = d.js("return window.stats;");
        eprintln!("{codec} over WHIP and WHEP: {stats}");
        assert_eq!(stats["freezeCount"].as_u64().unwrap_or(0), 0, "{stats}");
        if codec == "VP8" {
            continue; // (fMP4 carries VP9 and AV1, not VP8)
        }
        // Over HLS, in fragmented MP4: ffmpeg reads the codec and decodes without an error.
        let hls = relay.url("/v1/sessions/cam/hls/index.m3u8");
        let out = std::process::Command::new("timeout")
            .args(["30", "ffmpeg", "-nostdin", "-loglevel", "error", "-i", &hls, "-t", "3", "-map", "0:v"])
            .args(["-f", "framemd5", "-"])
            .output()
            .unwrap();
        let pictures = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("0,")).count();
        assert!(
            out.stderr.is_empty() && pictures >= 40,
            "{codec} over HLS: {pictures} pictures, {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = std::process::Command::new("ffprobe")
            .args(["-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0", &hls])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().next(), Some(&*codec.to_lowercase()));
    }
}

/// A viewer joins mid-GOP and starts at the ring's last keyframe, so up to a second of the
/// stream is owed at once. Paced (the default, as on every face) it comes at 1.5 × the
/// stream's rate after a burst of about a picture, and a link of twice the stream's rate with
/// 60 ms of queue (pion's shaper) drops none of it; unpaced (`pacing = "off"`) the backlog
/// arrives back to back and the link's queue drops part of it (NACKs then repair it).
#[test]
fn a_joining_webrtc_viewer_is_paced_so_a_thin_link_loses_nothing() {
    let Some(pion) = peer("pion-peer") else { return };
    let relay = Relay::start(&["--no-demo"]);
    for (name, pacing) in [("paced", "on"), ("unpaced", "off")] {
        relay.ok("POST", "/v1/sessions", Some(json!({"name": name, "source": {"demo": true}, "pacing": pacing})));
    }
    let rate = || relay.ok("GET", "/v1/sessions/paced", None)["pacing"]["sink_rate_bps"].as_f64();
    assert!(wait_for(Duration::from_secs(10), || rate().is_some()), "{}", relay.ok("GET", "/v1/sessions/paced", None));
    // Half a GOP in (the demo's keyframes come each second): half a second owed at joining.
    std::thread::sleep(Duration::from_millis(2500));
    let link_kbps = (2.0 * rate().unwrap() / 1.5 / 1000.0).round();
    let dir = scratch_dir("pion-join");
    let play = |name: &str| {
        std::process::Command::new(&pion)
            .args(["whep", &relay.url(&format!("/{name}/whep")), "-seconds", "6", "-h264"])
            .arg(dir.join(format!("{name}.h264")))
            .args(["-kbps", &link_kbps.to_string(), "-queue-ms", "60"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Three of each, joining a third of a GOP apart: what is owed depends on where in the GOP
    // a viewer joins.
    let mut viewers = Vec::new();
    for _ in 0..3 {
        viewers.push((play("paced"), play("unpaced")));
        std::thread::sleep(Duration::from_millis(330));
    }
    let mut unpaced_dropped = 0;
    for (paced, unpaced) in viewers {
        let (paced, unpaced) = (pion_report(paced), pion_report(unpaced));
        eprintln!("a link of {link_kbps} kbit/s\npaced: {paced}\nunpaced: {unpaced}");
        for r in [&paced, &unpaced] {
            assert_eq!(r["connected"], true, "{r}");
            assert_eq!(r["starts_with_keyframe"], true, "{r}");
        }
        assert_eq!(paced["link"]["dropped"], 0, "{paced}");
        assert_eq!(paced["frames_lost"], 0, "{paced}");
        unpaced_dropped += unpaced["link"]["dropped"].as_u64().unwrap();
    }
    assert!(unpaced_dropped > 0, "unpaced, the backlog at once overflows the link");
}

/// An H.265 path (x265 with two temporal layers, ~330 kbit/s, from `fanout gen`) to a pion
/// viewer whose offer has H.265 (pion's does; headless Chromium's does not, and is told
/// why): it starts at a keyframe, and ffmpeg decodes every frame it assembled. (Layered
/// video: the viewer starts with what fits in a 300 kbit/s first estimate, the base temporal
/// layer, and gets the other within a second as its estimate grows: those first pictures of
/// the upper layer are all it misses.)
#[test]
fn pion_plays_h265_over_whep() {
    let Some(pion) = peer("pion-peer") else { return };
    if !have_ffmpeg() {
        return;
    }
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/hevc/x265_temporal_320x192.265");
    let relay = Relay::start(&["--no-demo"]);
    let src =
        create_on_free_port(&relay, json!({ "name": "hevc", "source": { "udp": "127.0.0.1:0" }, "video": "h265" }));
    let _gen = gen_file(src, file, 25, 30);
    assert!(
        wait_for(Duration::from_secs(10), || relay.ok("GET", "/v1/sessions/hevc", None)["ring_head"]
            .as_u64()
            .is_some_and(|n| n > 50)),
        "{}",
        relay.ok("GET", "/v1/sessions/hevc", None)
    );
    let dir = scratch_dir("pion-h265");
    let h265 = dir.join("out.h265");
    let r = pion_report(pion_play(&pion, &relay.url("/hevc/whep"), 10, 0.0, &h265, 0));
    eprintln!("pion, H.265: {r}");
    assert_eq!(r["connected"], true, "{r}");
    assert_eq!(r["codec"].as_str().map(str::to_ascii_lowercase).as_deref(), Some("video/h265"), "{r}");
    assert_eq!(r["starts_with_keyframe"], true, "{r}");
    let frames = r["frames_complete"].as_u64().unwrap();
    assert!(frames >= 200, "10 s at 25 fps: {r}");
    assert!(r["frames_lost"].as_u64().unwrap() <= 13, "more than the upper layer's first second: {r}");
    let out = std::process::Command::new("ffprobe")
        .args(["-v", "error", "-f", "hevc", "-count_frames", "-show_entries", "stream=nb_read_frames,codec_name"])
        .args(["-of", "csv=p=0"])
        .arg(&h265)
        .output()
        .unwrap();
    let probe = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // A decoder starting at a CRA skips its RASL pictures (they refer to pictures before it).
    let bytes = std::fs::read(&h265).unwrap();
    let types: Vec<u8> = bytes.windows(4).filter(|w| w[..3] == [0, 0, 1]).map(|w| (w[3] >> 1) & 0x3f).collect();
    let first_irap = types.iter().position(|t| (16..=21).contains(t)).expect("a keyframe");
    let rasl = types[first_irap..].iter().take_while(|t| !(0..=5).contains(*t)).filter(|t| matches!(t, 8 | 9)).count();
    assert_eq!(
        probe,
        format!("hevc,{}", frames - rasl as u64),
        "ffmpeg decodes every frame pion assembled ({rasl} RASL)"
    );
}

/// Pion publishes the demo's H.264 over WHIP (8 s, 200 frames, a keyframe every 25); a pion
/// viewer that joins a couple of seconds later starts at a keyframe from the ring and gets
/// every frame from there to the publisher's last: 200 minus whole GOPs. A second viewer asks
/// for a keyframe ten times a second: the publisher is asked for one at most twice a second
/// (coalesced), besides the relay's own request every 2 s.
#[test]
fn pion_publishes_over_whip_and_a_viewer_gets_every_frame() {
    let Some(pion) = peer("pion-peer") else { return };
    if !have_ffmpeg() {
        return;
    }
    let config = "publisher_grace_s = 1\n[[session]]\nname = \"cam\"\nsource = { publish = true }\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let dir = scratch_dir("pion-whip");
    let clip = dir.join("demo.h264");
    let demo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/demo.ts");
    let st = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-i"])
        .arg(&demo)
        .args(["-an", "-c:v", "copy", "-f", "h264"])
        .arg(&clip)
        .status()
        .unwrap();
    assert!(st.success());
    let publisher = std::process::Command::new(&pion)
        .args(["whip", &relay.url("/cam/whip"), "-seconds", "8", "-h264"])
        .arg(&clip)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let state = || relay.ok("GET", "/v1/sessions/cam", None)["publisher"].clone();
    assert!(wait_for(Duration::from_secs(15), || state()["transport"] == "webrtc"), "{}", state());
    std::thread::sleep(Duration::from_secs(2));
    let got = dir.join("got.h264");
    let viewer = pion_play(&pion, &relay.url("/cam/whep"), 25, 0.0, &got, 0);
    let asking = pion_play(&pion, &relay.url("/cam/whep"), 25, 0.0, &dir.join("asking.h264"), 100);
    let sent = pion_report(publisher);
    let seen = pion_report(viewer);
    let asked = pion_report(asking);
    eprintln!("pion publisher: {sent}\npion viewer: {seen}\npion viewer asking for keyframes: {asked}");
    assert_eq!(sent["frames_sent"], 200, "{sent}");
    // The asking viewer played about 5 of the 8 s: ~50 requests, ~10 passed on.
    assert!(asked["plis_sent"].as_u64().unwrap() >= 30, "{asked}");
    let plis = sent["plis"].as_u64().unwrap();
    assert!((8..=22).contains(&plis), "keyframe requests reaching the publisher: {plis}: {sent}");
    assert_ne!(seen["ended"], "time", "the viewer is ended with the stream: {seen}");
    assert_eq!(seen["starts_with_keyframe"], true, "{seen}");
    assert_eq!(seen["frames_lost"], 0, "{seen}");
    let frames = seen["frames_complete"].as_u64().unwrap();
    assert!(frames >= 50 && (200 - frames).is_multiple_of(25), "from a keyframe to the last frame: {frames} of 200");
    assert_eq!(h264_file_frames(&got), frames);
}

/// A hand-made WHEP offer (H.264 only), as any client could send.
const OFFER: &str = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n\
a=fingerprint:sha-256 5B:2A:1C:9E:44:07:31:6F:AD:18:90:C2:7B:E3:55:0D:12:34:56:78:9A:BC:DE:F0:01:23:45:67:89:AB:CD:EF\r\n\
m=video 9 UDP/TLS/RTP/SAVPF 102\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=ice-ufrag:flood\r\n\
a=ice-pwd:aaaaaaaaaaaaaaaaaaaaaaaa\r\na=setup:actpass\r\na=rtcp-mux\r\na=recvonly\r\n\
a=rtpmap:102 H264/90000\r\na=fmtp:102 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f\r\n";

/// One address cannot hold every WebRTC slot: past `max_connections_per_ip` peers (connecting
/// or playing) its offers are 429 with the reason, and counted; a peer that goes gives its
/// place back.
#[test]
fn one_address_cannot_take_every_webrtc_slot() {
    let relay = Relay::with_config("max_connections_per_ip = 4\n", &[]);
    let post = || match ureq::post(&relay.url("/demo/whep")).set("Content-Type", "application/sdp").send_string(OFFER) {
        Ok(r) => (r.status(), r.header("location").unwrap_or("").to_string()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{e}"),
    };
    let mine: Vec<_> = (0..4).map(|_| post()).collect();
    assert!(mine.iter().all(|(code, _)| *code == 201), "{mine:?}");
    let (code, why) = post();
    assert_eq!(code, 429, "{why}");
    assert!(why.contains("max_connections_per_ip"), "{why}");
    assert_eq!(ureq::delete(&relay.url(&mine[0].1)).call().unwrap().status(), 200);
    let (code, why) = post();
    assert_eq!(code, 201, "a place came back: {why}");
    assert!(metrics(&relay).contains("WebRTC per-address cap"), "the refusal is counted");
}

/// ffmpeg's wall clock in every picture: the time (Unix ms, its low 24 bits) when the frame
/// was made, as 24 white or black 16x16 blocks along the top of a 640x360 black picture,
/// encoded at once (x264, zero latency, a keyframe a second) and published over RTSP.
fn publish_clock(rtsp: &str, seconds: u32) -> Kill {
    let bits: String = (0..24)
        .map(|i| {
            format!(
                ",drawbox=x={}:y=0:w=16:h=16:color=white:t=fill:enable='mod(floor(t*1000/pow(2\\,{i}))\\,2)'",
                i * 16
            )
        })
        .collect();
    // Time stamps become the wall clock (RTCTIME) while the blocks are drawn, then frame counts.
    let filter = format!("setpts=RTCTIME/(1000000*TB){bits},setpts=N/(25*TB)");
    let mut c = std::process::Command::new("ffmpeg");
    c.args(["-nostdin", "-loglevel", "error", "-re", "-f", "lavfi", "-i", "color=c=black:s=640x360:r=25"])
        .args(["-t", &seconds.to_string(), "-vf", &filter])
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency", "-g", "25", "-bf", "0"])
        .args(["-pix_fmt", "yuv420p", "-b:v", "1M", "-f", "rtsp", "-rtsp_transport", "tcp", rtsp]);
    Kill(c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap())
}

/// Reads the clock of every picture `arguments[0]` (a video element) shows: in
/// `window.lat[arguments[1]]`, how many ms after it was made each was to be displayed.
const WATCH_CLOCK: &str = r#"
const [v, name] = arguments;
window.lat = window.lat || {};
window.lat[name] = [];
const c = document.createElement('canvas'); c.width = 384; c.height = 16;
const g = c.getContext('2d', { willReadFrequently: true });
const step = (now, meta) => {
  g.drawImage(v, 0, 0, 384, 16, 0, 0, 384, 16);
  const px = g.getImageData(0, 0, 384, 16).data;
  let made = 0;
  for (let i = 0; i < 24; i++) if (px[(8 * 384 + i * 16 + 8) * 4] > 128) made += 2 ** i;
  const shown = Math.round(performance.timeOrigin + meta.expectedDisplayTime) % 16777216;
  window.lat[name].push((shown - made + 16777216) % 16777216);
  v.requestVideoFrameCallback(step);
};
v.requestVideoFrameCallback(step);
return true;
"#;

/// Median and 95th percentile of plausible latencies (a picture whose blocks did not read
/// back gives nonsense, counted apart), how many were plausible, and of how many.
fn latency(samples: &Value) -> (f64, f64, usize, usize) {
    // The clocks differ in their low 24 bits: past half of that, the picture was shown a few
    // ms "before" it was made (the two clocks' reading points).
    let signed = |ms: f64| if ms >= f64::from(1 << 23) { ms - f64::from(1 << 24) } else { ms };
    let all: Vec<f64> = samples.as_array().unwrap().iter().filter_map(Value::as_f64).map(signed).collect();
    let mut ok: Vec<f64> = all.iter().copied().filter(|&ms| (-100.0..10_000.0).contains(&ms)).collect();
    ok.sort_by(f64::total_cmp);
    let at = |q: f64| ok.get(((ok.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(f64::NAN);
    (at(0.5), at(0.95), ok.len(), all.len())
}

/// From the source's clock to the screen: ffmpeg draws its wall clock into each picture and
/// publishes over RTSP; one Chromium page plays the path over WebRTC (WHEP) and over LL-HLS
/// (hls.js) side by side for 60 s, reads the clock back from every picture it shows, and
/// compares it with when that picture is displayed. WebRTC: no freeze, under 500 ms; LL-HLS
/// measured the same way, for comparison.
#[test]
fn chromium_shows_a_webrtc_picture_within_half_a_second_of_its_source() {
    if !have_chromium() || !have_ffmpeg() {
        return;
    }
    let config = "publisher_grace_s = 1\n[[session]]\nname = \"clock\"\nsource = { publish = true }\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let _source = publish_clock(&format!("rtsp://{}/clock", rtsp_addr(&relay)), 90);
    let state = || relay.ok("GET", "/v1/sessions/clock", None)["publisher"]["state"].clone();
    assert!(wait_for(Duration::from_secs(15), || state() == "publishing"), "{}", state());

    let d = Driver::start();
    d.post("url", json!({ "url": page_elsewhere() }));
    let lib =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/web/hls.js/hls.light.min.js"))
            .unwrap();
    let load = "const s = document.createElement('script'); s.textContent = arguments[0]; \
                document.head.appendChild(s); return typeof Hls === 'function';";
    assert_eq!(d.post("execute/sync", json!({ "script": load, "args": [lib] })), json!(true));
    d.post("execute/sync", json!({ "script": WHEP, "args": [relay.url("/clock/whep")] }));
    let hls = "const v = document.createElement('video'); v.muted = true; document.body.appendChild(v); \
               const h = new Hls({ lowLatencyMode: true }); h.loadSource(arguments[0]); h.attachMedia(v); v.play(); \
               window.hlsVideo = v; return true;";
    d.post("execute/sync", json!({ "script": hls, "args": [relay.url("/v1/sessions/clock/hls/index.m3u8")] }));
    let decoded = || d.js("return window.stats.framesDecoded ?? 0;").as_u64().unwrap_or(0);
    assert!(wait_for(Duration::from_secs(20), || decoded() > 10), "WHEP: {}", d.js("return window.whep;"));
    let playing = || d.js("return window.hlsVideo.currentTime;").as_f64().unwrap_or(0.0) > 0.5;
    assert!(wait_for(Duration::from_secs(25), playing), "hls.js did not start");
    for (video, name) in [("document.querySelector('video')", "webrtc"), ("window.hlsVideo", "hls")] {
        // The element itself cannot be an argument: a wrapper hands it over.
        d.post("execute/sync", json!({ "script": format!("const a = [{video}, '{name}']; return (function() {{ {WATCH_CLOCK} }}).apply(null, a);"), "args": [] }));
    }
    const PLAY_S: u64 = 60;
    let f0 = decoded();
    std::thread::sleep(Duration::from_secs(PLAY_S));
    let s = d.js("return window.stats;");
    let frames = decoded() - f0;
    assert!(frames * 100 >= 95 * 25 * PLAY_S, "{frames} frames decoded in {PLAY_S} s: {s}");
    assert_eq!(s["freezeCount"].as_u64().unwrap_or(0), 0, "freezes: {s}");
    let (rtc_median, rtc_p95, rtc_ok, rtc_all) = latency(&d.js("return window.lat.webrtc;"));
    let (hls_median, hls_p95, hls_ok, hls_all) = latency(&d.js("return window.lat.hls;"));
    eprintln!(
        "source to screen: WebRTC median {rtc_median:.0} ms, p95 {rtc_p95:.0} ms ({rtc_ok} of {rtc_all} pictures read); \
         LL-HLS median {hls_median:.0} ms, p95 {hls_p95:.0} ms ({hls_ok} of {hls_all})"
    );
    // Pictures shown (requestVideoFrameCallback: headless Chromium composites about 20 a
    // second), nearly all of whose clocks read back.
    assert!(
        rtc_ok as u64 * 2 >= 25 * PLAY_S && rtc_ok * 100 >= rtc_all * 95,
        "the clock read back from WebRTC's pictures: {rtc_ok} of {rtc_all}"
    );
    assert!(rtc_median < 500.0 && rtc_p95 < 500.0, "WebRTC: median {rtc_median} ms, p95 {rtc_p95} ms");
    assert!(hls_ok as u64 * 2 >= 25 * PLAY_S, "the clock read back from LL-HLS's pictures: {hls_ok} of {hls_all}");
    assert!(hls_median > rtc_median, "LL-HLS {hls_median} ms, WebRTC {rtc_median} ms");
}

/// WHEP and WHIP take the stream users RTSP, RTMP and SRT take (HTTP Basic), as well as the
/// API token: a path guarded by `rtsp_user` is not open over WebRTC. Without credentials,
/// or with wrong ones, 401 with the schemes to use; a resource's DELETE needs them too.
#[test]
fn webrtc_takes_the_stream_users_as_every_stream_face_does() {
    let users = "[[rtsp_user]]\nname = \"alice\"\npassword = \"wonder:land\"\n";
    let relay = Relay::with_config(users, &[]);
    let whep = relay.url("/demo/whep");
    let basic = |user: &str, pass: &str| {
        use base64::Engine as _;
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")))
    };
    let post = |auth: Option<String>| {
        let mut r = ureq::post(&whep).set("Content-Type", "application/sdp");
        if let Some(a) = auth {
            r = r.set("Authorization", &a);
        }
        match r.send_string(OFFER) {
            Ok(r) => (r.status(), r.header("location").unwrap_or("").to_string()),
            Err(ureq::Error::Status(code, r)) => (code, r.header("www-authenticate").unwrap_or("").to_string()),
            Err(e) => panic!("{e}"),
        }
    };
    let (code, challenge) = post(None);
    assert_eq!((code, challenge.as_str()), (401, "Basic realm=\"fanout\""));
    assert_eq!(post(Some(basic("alice", "wrong"))).0, 401);
    assert_eq!(post(Some("Bearer wonder:land".into())).0, 401, "no token is configured");
    let (code, location) = post(Some(basic("alice", "wonder:land")));
    assert_eq!(code, 201, "{location}");
    let delete = ureq::delete(&relay.url(&location)).call();
    assert!(matches!(delete, Err(ureq::Error::Status(401, _))), "{delete:?}");
    // A resource ends only through its own face: a viewer's not through a WHIP URL (nor a
    // publisher's through a WHEP URL, which a reader's rights open).
    let elsewhere = location.replace("/whep/", "/whip/");
    assert_ne!(elsewhere, location);
    let delete = ureq::delete(&relay.url(&elsewhere)).set("Authorization", &basic("alice", "wonder:land")).call();
    assert!(matches!(delete, Err(ureq::Error::Status(404, _))), "{delete:?}");
    let delete = ureq::delete(&relay.url(&location)).set("Authorization", &basic("alice", "wonder:land")).call();
    assert_eq!(delete.unwrap().status(), 200);
    drop(relay);

    // With a token too: either opens it.
    let relay = Relay::with_config(&format!("token = \"s3cret\"\n{users}"), &[]);
    let post = |auth: &str| {
        let r = ureq::post(&relay.url("/demo/whep")).set("Content-Type", "application/sdp").set("Authorization", auth);
        match r.send_string(OFFER) {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(post("Bearer s3cret"), 201);
    assert_eq!(post(&basic("alice", "wonder:land")), 201);
    assert_eq!(post("Bearer nope"), 401);
    // The status of a path named like the face is the API's, behind the token as ever.
    let status = ureq::get(&relay.url("/v1/sessions/whep")).call();
    assert!(matches!(status, Err(ureq::Error::Status(401, _))), "{status:?}");
}

/// VP8 and VP9 to a browser: ffmpeg publishes each (libvpx, a keyframe every two seconds)
/// over RTSP to a path of its own; Chromium plays both over WHEP, as VP8 and VP9, frames
/// decoded without a freeze. The relay finds these codecs' keyframes as it does H.264's: a
/// reader that joins mid-GOP starts at the ring's last keyframe (shown with an RTSP reader,
/// whose first packet is visible here), not at the next packet.
#[test]
fn chromium_plays_vp8_and_vp9_over_whep() {
    if !have_chromium() || !have_ffmpeg() {
        return;
    }
    let config = "[[session]]\nname = \"vp8\"\nsource = { publish = true }\n\
                  [[session]]\nname = \"vp9\"\nsource = { publish = true }\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let mut cameras = Vec::new();
    for (name, codec) in [("vp8", "libvpx"), ("vp9", "libvpx-vp9")] {
        let mut c = std::process::Command::new("ffmpeg");
        c.args(["-nostdin", "-loglevel", "error", "-re", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25"])
            .args(["-t", "40", "-c:v", codec, "-deadline", "realtime", "-cpu-used", "8", "-b:v", "300k", "-g", "50"])
            .args(["-pix_fmt", "yuv420p", "-strict", "experimental"])
            .args(["-f", "rtsp", "-rtsp_transport", "tcp", &format!("rtsp://{}/{name}", rtsp_addr(&relay))]);
        cameras.push(Kill(c.stdout(std::process::Stdio::null()).spawn().unwrap()));
        let state = || relay.ok("GET", &format!("/v1/sessions/{name}"), None)["publisher"]["state"].clone();
        assert!(wait_for(Duration::from_secs(15), || state() == "publishing"), "{name}: {}", state());
    }
    // Readers joining at three points of a GOP each get a keyframe's first packet first.
    std::thread::sleep(Duration::from_millis(2500));
    for join in 0..3 {
        for (name, is_key) in [
            ("vp8", fanout_proto::codec::vpx::vp8_keyframe_start as fn(&[u8]) -> bool),
            ("vp9", fanout_proto::codec::vpx::vp9_keyframe_start),
        ] {
            let play = rtsp_play(rtsp_addr(&relay), name, None);
            play.rtp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 2048];
            let n = play.rtp.recv(&mut buf).unwrap();
            let v = fanout_proto::rtp::RtpView::parse(&buf[..n]).unwrap();
            assert_eq!(v.sequence_number(), play.seq, "{name}: RTP-Info names the first packet");
            assert!(is_key(&buf[v.payload_range()]), "{name}, join {join}: starts with {:02x?}", &buf[12..24.min(n)]);
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    for (name, mime) in [("vp8", "video/VP8"), ("vp9", "video/VP9")] {
        let d = Driver::start();
        d.post("url", json!({ "url": page_elsewhere() }));
        d.post("execute/sync", json!({ "script": WHEP, "args": [relay.url(&format!("/{name}/whep"))] }));
        let decoded = || d.js("return window.stats.framesDecoded ?? 0;").as_u64().unwrap_or(0);
        assert!(
            wait_for(Duration::from_secs(20), || decoded() > 25),
            "{name}: {} / {}",
            d.js("return window.whep;"),
            relay.ok("GET", &format!("/v1/sessions/{name}"), None)["webrtc"]
        );
        let viewer = relay.ok("GET", &format!("/v1/sessions/{name}"), None)["webrtc"][0].clone();
        let track = format!("video {}", name.to_ascii_uppercase());
        assert!(viewer["tracks"][0].as_str().unwrap().starts_with(&track), "{viewer}");
        let first = decoded();
        std::thread::sleep(Duration::from_secs(8));
        let codec = d.js(
            "const out = []; return window.pc.getStats().then(all => { all.forEach(s => { if (s.type === 'codec') out.push(s.mimeType); }); return out; });",
        );
        let stats = d.js("return window.stats;");
        eprintln!("{name} over WebRTC: {stats}");
        assert!(codec.as_array().unwrap().iter().any(|c| c == mime), "{codec}");
        assert!(decoded() - first >= 175, "8 s at 25 fps: {} -> {}", first, decoded());
        // Nothing lost. Chromium counts a freeze when a frame comes well past its interval;
        // on a busy 2-vCPU machine its own renderer stalls so once in a few runs (0.27 s in
        // CI, with no packet lost): one short one is the machine's, more or a long one the
        // relay's.
        assert_eq!(stats["packetsLost"].as_u64().unwrap_or(0), 0, "{stats}");
        let (freezes, frozen) =
            (stats["freezeCount"].as_u64().unwrap_or(0), stats["totalFreezesDuration"].as_f64().unwrap_or(0.0));
        assert!(freezes <= 1 && frozen < 0.5, "{stats}");
        // The browser sees key frames as key frames only (a GOP of 50), VP9's too, whose
        // inter frames ffmpeg does not flag and the relay does.
        let keys = stats["keyFramesDecoded"].as_u64().unwrap_or(0);
        assert!((1..=stats["framesDecoded"].as_u64().unwrap() / 25).contains(&keys), "{stats}");
    }
}

/// A camera's G.711: ffmpeg publishes H.264 and PCMU (8 kHz, the static payload type 0, 20 ms
/// a packet) over RTSP; Chromium gets both over WHEP, the audio as PCMU, its samples played without
/// concealment to speak of.
#[test]
fn chromium_hears_a_cameras_g711_over_whep() {
    if !have_chromium() || !have_ffmpeg() {
        return;
    }
    let config = "[[session]]\nname = \"cam\"\nsource = { publish = true }\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let mut c = std::process::Command::new("ffmpeg");
    c.args(["-nostdin", "-loglevel", "error", "-re", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=8000:samples_per_frame=160", "-t", "40"])
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency", "-g", "25", "-bf", "0"])
        .args(["-pix_fmt", "yuv420p", "-c:a", "pcm_mulaw", "-ar", "8000", "-ac", "1"])
        .args(["-f", "rtsp", "-rtsp_transport", "tcp", &format!("rtsp://{}/cam", rtsp_addr(&relay))]);
    let _camera = Kill(c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap());
    let state = || relay.ok("GET", "/v1/sessions/cam", None)["publisher"]["state"].clone();
    assert!(wait_for(Duration::from_secs(15), || state() == "publishing"), "{}", state());
    let d = whep_viewer(&relay.url("/cam/whep"));
    let audio = |k: &str| d.js(&format!("return window.audio['{k}'] ?? 0;")).as_f64().unwrap_or(0.0);
    assert!(
        wait_for(Duration::from_secs(20), || audio("packetsReceived") > 100.0),
        "no audio: {} / {}",
        d.js("return window.whep;"),
        relay.ok("GET", "/v1/sessions/cam", None)["webrtc"]
    );
    let viewer = relay.ok("GET", "/v1/sessions/cam", None)["webrtc"][0].clone();
    assert!(
        viewer["tracks"].as_array().unwrap().iter().any(|t| t.as_str().unwrap().starts_with("audio PCMU")),
        "{viewer}"
    );
    assert_eq!(viewer["left_out"], json!([]), "{viewer}");
    std::thread::sleep(Duration::from_secs(5));
    let codec = d.js(
        "const out = []; return window.pc.getStats().then(all => { all.forEach(s => { if (s.type === 'codec') out.push(s.mimeType); }); return out; });",
    );
    assert!(codec.as_array().unwrap().iter().any(|c| c == "audio/PCMU"), "{codec}");
    let (samples, concealed) = (audio("totalSamplesReceived"), audio("concealedSamples"));
    eprintln!("PCMU over WebRTC: {samples} samples, {concealed} concealed, {}", d.js("return window.audio;"));
    assert!(samples > 8000.0 * 4.0, "{samples} samples");
    assert!(concealed < 0.05 * samples, "{concealed} of {samples} samples concealed");
    assert!(d.js("return window.stats.framesDecoded ?? 0;").as_u64().unwrap() > 100, "the video too");
}

/// A camera's AAC (the demo's: 48 kHz stereo), which browsers do not take, reaches Chromium
/// over WHEP as Opus, made once for the path: it is heard (its audio energy read back, few
/// samples concealed); a second viewer shares the one transcoder (the path's status shows
/// it and its subscribers).
#[test]
fn chromium_hears_a_cameras_aac_as_opus_over_whep() {
    if !have_chromium() {
        return;
    }
    let config = "[[session]]\nname = \"cam\"\nsource = { demo = true }\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let d = whep_viewer(&relay.url("/cam/whep"));
    let audio = |k: &str| d.js(&format!("return window.audio['{k}'] ?? 0;")).as_f64().unwrap_or(0.0);
    assert!(
        wait_for(Duration::from_secs(20), || audio("packetsReceived") > 100.0),
        "no audio: {} / {}",
        d.js("return window.whep;"),
        relay.ok("GET", "/v1/sessions/cam", None)["webrtc"]
    );
    let viewer = relay.ok("GET", "/v1/sessions/cam", None)["webrtc"][0].clone();
    assert!(
        viewer["tracks"].as_array().unwrap().iter().any(|t| t.as_str().unwrap().starts_with("audio opus")),
        "{viewer}"
    );
    std::thread::sleep(Duration::from_secs(5));
    let codec = d.js(
        "const out = []; return window.pc.getStats().then(all => { all.forEach(s => { if (s.type === 'codec') out.push(s.mimeType); }); return out; });",
    );
    assert!(codec.as_array().unwrap().iter().any(|c| c == "audio/opus"), "{codec}");
    let (samples, concealed, energy) =
        (audio("totalSamplesReceived"), audio("concealedSamples"), audio("totalAudioEnergy"));
    eprintln!("AAC as Opus over WebRTC: {samples} samples, {concealed} concealed, energy {energy}");
    assert!(samples > 48_000.0 * 4.0, "{samples} samples");
    assert!(concealed < 0.05 * samples, "{concealed} of {samples} samples concealed");
    assert!(energy > 0.01, "silence: total audio energy {energy}");
    // One transcoder for the path, whatever the viewers: the status shows it, and its
    // subscribers.
    let transcoding = || relay.ok("GET", "/v1/sessions/cam", None)["transcoding"].clone();
    assert_eq!(transcoding()[0]["session"], "cam/opus", "{}", transcoding());
    assert_eq!(transcoding()[0]["subscribers"], 1, "{}", transcoding());
    let d2 = whep_viewer(&relay.url("/cam/whep"));
    let heard2 = || d2.js("return window.audio['packetsReceived'] ?? 0;").as_f64().unwrap_or(0.0) > 50.0;
    assert!(wait_for(Duration::from_secs(20), heard2), "the second viewer hears nothing");
    assert_eq!(transcoding().as_array().map(Vec::len), Some(1));
    assert_eq!(transcoding()[0]["subscribers"], 2, "one transcoder for both: {}", transcoding());
}

/// The configured STUN/TURN servers reach a WHEP client as `Link: <…>; rel="ice-server"`
/// headers on its answer (a page of another origin may read them), and the TURN credentials
/// only there, not on the preflight that anyone may send.
#[test]
fn whep_hands_out_the_configured_ice_servers() {
    let config = "[[webrtc_ice_server]]\nurl = \"stun:stun.example.net:3478\"\n\
                  [[webrtc_ice_server]]\nurl = \"turn:turn.example.net:3478?transport=udp\"\nusername = \"u1\"\ncredential = \"c1\"\n";
    let relay = Relay::with_config(config, &[]);
    let r = ureq::post(&relay.url("/demo/whep")).set("Content-Type", "application/sdp").send_string(OFFER).unwrap();
    assert_eq!(r.status(), 201);
    let links = r.all("link");
    assert_eq!(
        links,
        vec![
            "<stun:stun.example.net:3478>; rel=\"ice-server\"",
            "<turn:turn.example.net:3478?transport=udp>; rel=\"ice-server\"; username=\"u1\"; credential=\"c1\"; credential-type=\"password\""
        ]
    );
    assert!(r.header("access-control-expose-headers").unwrap_or("").contains("Link"));
    let pre = ureq::request("OPTIONS", &relay.url("/demo/whep")).call().unwrap();
    assert!(pre.all("link").is_empty(), "no credentials before the client's were checked");
}

/// ICE-TCP for networks that block UDP: with `webrtc_tcp`, the answer offers a passive TCP
/// candidate on the WebRTC port beside the UDP one; Chromium, given only the TCP candidate
/// (as if UDP were blocked), connects over TCP and plays.
#[test]
fn chromium_plays_over_ice_tcp_where_udp_is_blocked() {
    if !have_chromium() {
        return;
    }
    let relay = Relay::with_config("webrtc_tcp = true\n", &[]);
    let d = Driver::start();
    d.post("url", json!({ "url": page_elsewhere() }));
    d.post("execute/sync", json!({ "script": WHEP, "args": [relay.url("/demo/whep"), true] }));
    let decoded = || d.js("return window.stats.framesDecoded ?? 0;").as_u64().unwrap_or(0);
    assert!(wait_for(Duration::from_secs(20), || decoded() > 50), "over TCP: {}", d.js("return window.whep;"));
    let protocol = d.js(
        "return window.pc.getStats().then(all => { let pair = null; all.forEach(s => { if (s.type === 'candidate-pair' && s.nominated && s.state === 'succeeded') pair = s; }); \
         return pair ? all.get(pair.remoteCandidateId).protocol : null; });",
    );
    assert_eq!(protocol, "tcp", "the pair in use");
    let s = d.js("return window.stats;");
    assert_eq!(s["packetsLost"].as_i64().unwrap_or(0), 0, "{s}");
}

/// The `cam` path's video as an RTSP reader finds it: `codec,width,height` (ffprobe).
fn rtsp_video(relay: &Relay) -> String {
    let probe = std::process::Command::new("timeout")
        .args(["20", "ffprobe", "-v", "error", "-rtsp_transport", "tcp", "-select_streams", "v:0"])
        .args(["-show_entries", "stream=codec_name,width,height", "-of", "csv=p=0"])
        .arg(format!("rtsp://{}/cam", rtsp_addr(relay)))
        .output()
        .unwrap();
    String::from_utf8_lossy(&probe.stdout).trim().to_string()
}

/// Chromium publishes simulcast over WHIP: two encodings of a 640×360 canvas (`h` whole, `l`
/// at a quarter of the size and a fraction of the rate). The relay ranks them by their pictures
/// (`h` first, whatever their order in the offer), the path carries `h` (ffmpeg reads 640×360
/// over RTSP), and each WebRTC viewer gets the encoding its estimate fits. Both start at `h`
/// (it fits a first estimate); a pion viewer behind a link between the two rates is switched
/// to `l` at one of its keyframes, its link then loses nothing and ffmpeg decodes the frames it
/// assembled across the switch; a Chromium viewer with no limit starts on `h`, is on `l` only
/// while its estimate is short of `h`, and shows what it gets.
#[test]
fn a_simulcast_publishers_viewers_get_the_encoding_that_fits() {
    let Some(pion) = peer("pion-peer") else { return };
    if !have_chromium() || !have_ffmpeg() {
        return;
    }
    let relay = Relay::with_config("[[session]]\nname = \"cam\"\nsource = { publish = true }\n", &["--no-demo"]);
    let d = Driver::start_alone();
    d.post("url", json!({ "url": page_elsewhere() }));
    let encodings = json!([
        { "rid": "l", "scaleResolutionDownBy": 4, "maxBitrate": 50_000 },
        { "rid": "h", "maxBitrate": 250_000 },
    ]);
    whip_publishes(&relay, &d, json!([relay.url("/cam/whip"), "video/H264", encodings]), "simulcast");
    // Ranked, and both encodings at their rates.
    let simulcast = || relay.ok("GET", "/v1/sessions/cam", None)["publisher"]["simulcast"].clone();
    let rate = |rid: &str| {
        simulcast().as_array().and_then(|a| a.iter().find(|e| e["rid"] == rid)?["bps"].as_f64()).unwrap_or(0.0)
    };
    assert!(
        wait_for(Duration::from_secs(20), || rate("h") > 120_000.0 && rate("l") > 30_000.0),
        "{} / {}",
        simulcast(),
        d.js("return window.whip;")
    );
    let ranked = simulcast();
    assert_eq!(ranked[0]["rid"], "h", "{ranked}");
    assert_eq!(ranked[0]["feeds_the_path"], true, "{ranked}");
    // The path is the whole picture.
    assert_eq!(rtsp_video(&relay), "h264,640,360");

    // A link that carries `l` with room (its rate over 0.85), not `h`: their rates once the
    // publisher's encoders settled.
    std::thread::sleep(Duration::from_secs(3));
    let (high, low) = (rate("h"), rate("l"));
    let link_kbps = ((low / 0.85 + high) / 2000.0).round();
    let dir = scratch_dir("pion-simulcast");
    let narrow = std::process::Command::new(&pion)
        .args(["whep", &relay.url("/cam/whep"), "-seconds", "20", "-kbps", &link_kbps.to_string()])
        // A link's buffer of a quarter second: a keyframe of `l` fits in it.
        .args(["-queue-ms", "250", "-h264"])
        .arg(dir.join("narrow.h264"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    d.post("execute/sync", json!({ "script": WHEP, "args": [relay.url("/cam/whep")] }));
    let mut samples: Vec<(f64, Vec<Value>)> = Vec::new();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(19) {
        let v = relay.ok("GET", "/v1/sessions/cam", None)["webrtc"].as_array().cloned().unwrap_or_default();
        samples.push((t0.elapsed().as_secs_f64(), v.into_iter().filter(|x| x["role"] == "viewer").collect()));
        std::thread::sleep(Duration::from_millis(500));
    }
    let narrow = pion_report(narrow);
    let chromium = d.js("return window.stats;");
    eprintln!("h {high:.0} bit/s, l {low:.0} bit/s, the link {link_kbps} kbit/s\npion: {narrow}\nchromium: {chromium}");
    eprintln!("the publisher: {}", d.js("return window.whip;"));
    for (t, v) in samples.iter().step_by(2) {
        let brief: Vec<String> = v
            .iter()
            .map(|x| format!("{:.0} {} {}", x["estimate_bps"].as_f64().unwrap_or(0.0), x["encoding"], x["switches"]))
            .collect();
        eprintln!("{t:5.1} s: {}", brief.join(" | "));
    }
    // Pion, behind the link: switched to `l`, and on it through the second half.
    assert_eq!(narrow["connected"], true, "{narrow}");
    assert_eq!(narrow["starts_with_keyframe"], true, "{narrow}");
    let id = |x: &Value| x["id"].as_str().unwrap_or("").to_string();
    let last = &samples.last().unwrap().1;
    assert_eq!(last.len(), 2, "{last:?}");
    // (Chromium's viewer is the one its WHEP resource names.)
    let location = d.js("return window.whep.location;").as_str().unwrap_or_default().to_string();
    let pion_at = |x: &Value| !location.ends_with(&format!("/{}", id(x)));
    for (t, v) in samples.iter().filter(|(t, _)| *t > 10.0) {
        assert!(
            v.iter().filter(|x| pion_at(x)).all(|x| x["encoding"] == "l"),
            "{t:.1} s: pion's viewer is not on l: {v:?}"
        );
    }
    let pion_status = last.iter().find(|x| pion_at(x)).unwrap();
    assert!(pion_status["switches"].as_u64().unwrap() >= 1, "pion's viewer never switched: {pion_status}");
    let link = &narrow["link"];
    let (passed, late) = (link["passed"].as_f64().unwrap(), link["dropped_second_half"].as_f64().unwrap());
    assert!(late <= 0.01 * passed, "the link still drops in the second half: {link}");
    // Across the switch (a new picture size at a keyframe), ffmpeg decodes what it assembled:
    // `h`'s pictures first, then `l`'s, every one of them after the switch (before it, the
    // link lost some of `h`'s, and pictures that refer to them do not decode).
    let frames = std::process::Command::new("ffprobe")
        .args(["-v", "error", "-f", "h264", "-show_entries", "frame=width", "-of", "csv=p=0"])
        .arg(dir.join("narrow.h264"))
        .output()
        .unwrap();
    let widths: Vec<u64> = String::from_utf8_lossy(&frames.stdout)
        .lines()
        .filter_map(|l| l.trim().trim_end_matches(',').parse().ok())
        .collect();
    let small_from = widths.iter().position(|&w| w == 160).unwrap_or(widths.len());
    assert!(widths[..small_from].iter().all(|&w| w == 640) && small_from > 0, "{widths:?}");
    assert!(widths[small_from..].iter().all(|&w| w == 160), "{widths:?}");
    let complete = narrow["frames_complete"].as_u64().unwrap();
    assert!(widths.len() - small_from >= 50, "{} of `l`'s pictures decoded: {narrow}", widths.len() - small_from);
    assert!(widths.len() as u64 <= complete, "{widths:?}: {narrow}");
    // Chromium, with no limit: it starts on `h`, and it is on `l` only while its estimate is
    // short of `h` (this busy machine's stalls take it down for a while at times).
    let chromium_samples: Vec<&Value> =
        samples.iter().flat_map(|(_, v)| v).filter(|x| !pion_at(x) && !x["encoding"].is_null()).collect();
    assert_eq!(chromium_samples.first().map(|x| x["encoding"].clone()), Some(json!("h")), "{chromium_samples:?}");
    for x in &chromium_samples {
        let estimate = x["estimate_bps"].as_f64().unwrap_or(0.0);
        assert!(x["encoding"] == "h" || estimate < 1.5 * high / 0.85, "on l with room for h: {x}");
    }
    // It showed `h`'s pictures (and `l`'s while on it), nothing else.
    let widths = d.js("return window.widths;");
    assert!(widths["640"].as_u64().unwrap_or(0) > 0, "{widths}");
    assert!(widths.as_object().unwrap().keys().all(|w| w == "640" || w == "160"), "{widths}");
    assert!(chromium["framesDecoded"].as_u64().unwrap_or(0) >= 150, "{chromium}");
    // (Its publisher, on the same busy machine, may skip pictures: no long freeze.)
    assert!(chromium["totalFreezesDuration"].as_f64().unwrap_or(9.0) < 2.0, "{chromium}");
}

/// Simulcast in VP8, what Chromium sends by default: the encodings are ranked by the size in
/// their key frame headers (`h` first, offered last), the path carries `h` (ffmpeg reads
/// 640×360 VP8 over RTSP), and a Chromium viewer, whose first estimate fits `h`, shows it.
#[test]
fn chromium_publishes_vp8_simulcast_and_the_largest_encoding_feeds_the_path() {
    if !have_chromium() || !have_ffmpeg() {
        return;
    }
    let relay = Relay::with_config("[[session]]\nname = \"cam\"\nsource = { publish = true }\n", &["--no-demo"]);
    let d = Driver::start();
    d.post("url", json!({ "url": page_elsewhere() }));
    let encodings = json!([
        { "rid": "l", "scaleResolutionDownBy": 4, "maxBitrate": 50_000 },
        { "rid": "h", "maxBitrate": 200_000 },
    ]);
    whip_publishes(&relay, &d, json!([relay.url("/cam/whip"), "video/VP8", encodings]), "VP8 simulcast");
    let simulcast = || relay.ok("GET", "/v1/sessions/cam", None)["publisher"]["simulcast"].clone();
    assert!(
        wait_for(Duration::from_secs(20), || simulcast().as_array().is_some_and(|a| a.len() == 2)),
        "{} / {}",
        simulcast(),
        d.js("return window.whip;")
    );
    assert_eq!(simulcast()[0]["rid"], "h", "{}", simulcast());
    assert_eq!(rtsp_video(&relay), "vp8,640,360");
    d.post("execute/sync", json!({ "script": WHEP, "args": [relay.url("/cam/whep")] }));
    let decoded = || d.js("return window.stats.framesDecoded ?? 0;").as_u64().unwrap_or(0);
    assert!(wait_for(Duration::from_secs(15), || decoded() > 50), "the viewer: {}", d.js("return window.whep;"));
    let widths = d.js("return window.widths;");
    assert!(widths["640"].as_u64().unwrap_or(0) > 0, "{widths} / {}", relay.ok("GET", "/v1/sessions/cam", None));
}
