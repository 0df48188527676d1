//! A path's readers, whatever their protocol: listed through the API, kicked one by one
//! (each client told the end its protocol's way), hooks once per reader, and `max_readers`
//! refusing the next reader on every face with that face's own answer.

mod common;
use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn have_srt() -> bool {
    let protocols = Command::new("ffmpeg").args(["-hide_banner", "-protocols"]).output();
    let ok = protocols.is_ok_and(|p| String::from_utf8_lossy(&p.stdout).lines().any(|l| l.trim() == "srt"))
        && fanout_srt::version().is_ok();
    if !ok {
        eprintln!("\n*** SKIPPED (SRT): no libsrt or no ffmpeg with srt:// here ***\n");
        assert!(std::env::var("CI").is_err(), "CI must have SRT (scripts/test installs it)");
    }
    ok
}

/// ffmpeg playing `url` to nothing, 60 s at most.
fn ffmpeg_player(url: &str, args: &[&str]) -> Child {
    Command::new("timeout")
        .args(["60", "ffmpeg", "-nostdin", "-loglevel", "error"])
        .args(args)
        .args(["-i", url, "-f", "null", "-"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn readers(relay: &Relay) -> Vec<Value> {
    relay.ok("GET", "/v1/sessions/cam/readers", None).as_array().unwrap().clone()
}

/// The one reader of `protocol` once it is listed.
fn listed(relay: &Relay, protocol: &str) -> Value {
    let mut found = None;
    let ok = wait_for(Duration::from_secs(15), || {
        found = readers(relay).into_iter().find(|r| r["protocol"] == protocol);
        found.is_some()
    });
    assert!(ok, "no {protocol} reader listed: {:?}", readers(relay));
    found.unwrap()
}

fn kick(relay: &Relay, id: &str) {
    let (status, body) = relay.call("DELETE", &format!("/v1/sessions/cam/readers/{id}"), None);
    assert_eq!(status, 204, "{body}");
    let (status, _) = relay.call("GET", &format!("/v1/sessions/cam/readers/{id}"), None);
    assert_eq!(status, 404, "a kicked reader is still listed");
}

/// Waits for a player process to end by itself (it was told the end), not by its timeout.
fn ends(mut p: Child, what: &str) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if let Some(status) = p.try_wait().unwrap() {
            assert_ne!(status.code(), Some(124), "{what}: ended by its timeout");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = p.kill();
    panic!("{what}: still playing 20 s after it was kicked");
}

#[test]
fn every_face_lists_its_readers_kicks_one_and_runs_the_hooks_once() {
    let log = std::env::temp_dir().join(format!("fanout-readers-hooks-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    // A program and its arguments, no shell of ours (the test asks for one to write a file).
    let hook = |what: &str| {
        let line =
            format!("{what} $FANOUT_READER_PROTOCOL $FANOUT_READER_ID $FANOUT_READER_ADDR b=$FANOUT_READER_BYTES");
        format!("[\"/bin/sh\", \"-c\", \"echo {line} >> {}\"]", log.display())
    };
    let relay = Relay::with_config(
        &format!(
            "[[session]]\nname = \"cam\"\nsource = {{ demo = true }}\non_read = {}\non_unread = {}\n",
            hook("read"),
            hook("unread")
        ),
        &["--no-demo"],
    );
    let engine = relay.ok("GET", "/v1/engine", None);
    let mut kicked: Vec<(String, &str)> = Vec::new();

    // HTTP TS: the engine's sink; the kick closes its socket. Its Basic user is shown.
    let mut ts = TcpStream::connect(relay.api).unwrap();
    ts.write_all(b"GET /v1/sessions/cam/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Basic YW5uOnB3\r\n\r\n").unwrap();
    assert!(read_head(&mut ts).starts_with("HTTP/1.1 200"));
    let r = listed(&relay, "http_ts");
    assert!(r["addr"].as_str().unwrap().starts_with("127.0.0.1:"), "{r}");
    assert_eq!(r["user"], "ann", "{r}");
    assert!(wait_for(Duration::from_secs(5), || {
        relay.ok("GET", &format!("/v1/sessions/cam/readers/{}", r["id"].as_str().unwrap()), None)["bytes"]
            .as_u64()
            .unwrap()
            > 0
    }));
    kick(&relay, r["id"].as_str().unwrap());
    assert!(stream_ends_within(&mut ts, Duration::from_secs(10)), "the HTTP stream did not end");
    kicked.push((r["id"].as_str().unwrap().into(), "http_ts"));

    // HLS: a player is named in its media playlist's URL; kicked, its reload is refused.
    let multivariant = ureq::get(&relay.url("/v1/sessions/cam/hls/index.m3u8")).call().unwrap().into_string().unwrap();
    let media = multivariant.lines().find(|l| l.starts_with("index.m3u8?player=")).unwrap().to_string();
    let player = media.trim_start_matches("index.m3u8?player=").to_string();
    let url = relay.url(&format!("/v1/sessions/cam/hls/{media}"));
    assert_eq!(ureq::get(&url).call().unwrap().status(), 200);
    let r = listed(&relay, "hls");
    assert_eq!(r["id"], player.as_str());
    kick(&relay, &player);
    let gone = ureq::get(&url).call().err().and_then(|e| e.into_response()).map(|r| r.status());
    assert_eq!(gone, Some(410), "a kicked HLS player's reload");
    kicked.push((player, "hls"));

    // WHEP: the reader is the resource; kicked, the resource is gone.
    let made = ureq::post(&relay.url("/cam/whep"))
        .set("Content-Type", "application/sdp")
        .send_string(&fanout_tools::whep::sample_offer().unwrap())
        .unwrap();
    let location = made.header("Location").unwrap().to_string();
    let id = location.rsplit('/').next().unwrap().to_string();
    let r = listed(&relay, "webrtc");
    assert_eq!(r["id"], id.as_str());
    kick(&relay, &id);
    assert!(
        wait_for(Duration::from_secs(5), || ureq::delete(&relay.url(&location)).call().is_err()),
        "the WHEP resource is still there"
    );
    kicked.push((id, "webrtc"));

    // A UDP sink added through the API.
    let sink =
        relay.ok("POST", "/v1/sessions/cam/sinks", Some(json!({"udp": free_udp_port()})))["id"].as_u64().unwrap();
    let r = listed(&relay, "udp_sink");
    kick(&relay, r["id"].as_str().unwrap());
    assert_eq!(relay.call("GET", &format!("/v1/sessions/cam/sinks/{sink}"), None).0, 404);
    kicked.push((r["id"].as_str().unwrap().into(), "udp_sink"));

    // Clients we did not write: ffmpeg over RTSP (interleaved), RTMP and SRT.
    if have_ffmpeg() {
        let rtsp = rtsp_addr(&relay);
        let rtmp = engine["rtmp"].as_str().unwrap().to_string();
        let mut players = vec![
            ("rtsp", ffmpeg_player(&format!("rtsp://{rtsp}/cam"), &["-rtsp_transport", "tcp"])),
            ("rtmp", ffmpeg_player(&format!("rtmp://{rtmp}/cam"), &[])),
        ];
        if have_srt() {
            let srt = engine["srt"].as_str().unwrap();
            players.push(("srt", ffmpeg_player(&format!("srt://{srt}?streamid=read:cam"), &[])));
        }
        for (protocol, p) in players {
            let r = listed(&relay, protocol);
            let id = r["id"].as_str().unwrap();
            let sent = || relay.ok("GET", &format!("/v1/sessions/cam/readers/{id}"), None)["bytes"].as_u64().unwrap();
            assert!(wait_for(Duration::from_secs(10), || sent() > 0), "{protocol}: no bytes counted");
            kick(&relay, id);
            ends(p, protocol);
            kicked.push((r["id"].as_str().unwrap().into(), protocol));
        }
    }

    // Each reader's hooks ran once each, with its protocol and id.
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    let done = wait_for(Duration::from_secs(10), || {
        lines().lines().filter(|l| l.starts_with("unread")).count() >= kicked.len()
    });
    assert!(done, "hooks:\n{}", lines());
    let text = lines();
    for (id, protocol) in &kicked {
        for what in ["read", "unread"] {
            let n = text.lines().filter(|l| l.starts_with(&format!("{what} {protocol} {id} "))).count();
            assert_eq!(n, 1, "{what} of {protocol} {id}:\n{text}");
        }
    }
    assert!(text.lines().any(|l| l.starts_with("unread http_ts") && !l.ends_with("b=0")), "{text}");
    if have_ffmpeg() {
        assert!(text.lines().any(|l| l.starts_with("unread rtmp") && !l.ends_with("b=0")), "{text}");
    }
    assert!(readers(&relay).is_empty(), "{:?}", readers(&relay));
    // Every path's readers in one list, and a reader unknown is 404.
    assert_eq!(relay.ok("GET", "/v1/readers", None), json!([]));
    assert_eq!(relay.call("DELETE", "/v1/sessions/cam/readers/0123", None).0, 404);
    let _ = std::fs::remove_file(&log);
}

#[test]
fn max_readers_refuses_the_next_reader_with_each_faces_own_answer() {
    let relay =
        Relay::with_config("[[session]]\nname = \"cam\"\nsource = { demo = true }\nmax_readers = 1\n", &["--no-demo"]);
    let engine = relay.ok("GET", "/v1/engine", None);
    // One reader holds the only place.
    let _first = relay.http_subscribe("cam");
    listed(&relay, "http_ts");
    let metrics = metrics(&relay);
    assert!(metrics.contains("fanout_readers{session=\"cam\",protocol=\"http_ts\"} 1"), "{metrics}");
    // HTTP TS: 503.
    let mut second = TcpStream::connect(relay.api).unwrap();
    second.write_all(b"GET /v1/sessions/cam/stream HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(read_head(&mut second).starts_with("HTTP/1.1 503"), "a second HTTP TS reader");
    // HLS: a new player's playlist is 503.
    let hls = ureq::get(&relay.url("/v1/sessions/cam/hls/index.m3u8")).call();
    assert_eq!(hls.err().and_then(|e| e.into_response()).map(|r| r.status()), Some(503));
    // WHEP: 503.
    let whep = ureq::post(&relay.url("/cam/whep"))
        .set("Content-Type", "application/sdp")
        .send_string(&fanout_tools::whep::sample_offer().unwrap());
    assert_eq!(whep.err().and_then(|e| e.into_response()).map(|r| r.status()), Some(503));
    // A UDP sink: 503.
    assert_eq!(relay.call("POST", "/v1/sessions/cam/sinks", Some(json!({"udp": free_udp_port()}))).0, 503);
    // RTSP: 453 Not Enough Bandwidth.
    let rtsp = rtsp_addr(&relay);
    let mut c = TcpStream::connect(rtsp).unwrap();
    c.write_all(format!("DESCRIBE rtsp://{rtsp}/cam RTSP/1.0\r\nCSeq: 1\r\n\r\n").as_bytes()).unwrap();
    assert!(read_head(&mut c).starts_with("RTSP/1.0 453"), "a second RTSP reader");
    if have_ffmpeg() {
        // RTMP: the play is refused; SRT: the handshake is.
        let rtmp = engine["rtmp"].as_str().unwrap();
        let mut urls = vec![format!("rtmp://{rtmp}/cam")];
        if have_srt() {
            urls.push(format!("srt://{}?streamid=read:cam", engine["srt"].as_str().unwrap()));
        }
        for url in urls {
            let t0 = Instant::now();
            let out = Command::new("timeout")
                .args(["20", "ffmpeg", "-nostdin", "-loglevel", "error", "-i", &url, "-t", "1", "-f", "null", "-"])
                .output()
                .unwrap();
            assert!(!out.status.success(), "{url} was let in");
            assert!(t0.elapsed() < Duration::from_secs(15), "{url}: refused only by a timeout");
        }
    }
    let listed_now = readers(&relay);
    assert_eq!(listed_now.len(), 1, "{listed_now:?}");
}

#[test]
fn publish_hooks_run_once_per_publisher() {
    if !have_ffmpeg() {
        return;
    }
    let log = std::env::temp_dir().join(format!("fanout-publish-hooks-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let hook = |what: &str| {
        let line = format!(
            "{what} $FANOUT_PATH $FANOUT_PUBLISHER_PROTOCOL $FANOUT_PUBLISHER_ADDR d=$FANOUT_PUBLISHER_DURATION_S"
        );
        format!("[\"/bin/sh\", \"-c\", \"echo {line} >> {}\"]", log.display())
    };
    let relay = Relay::with_config(
        &format!(
            "[[session]]\nname = \"in\"\nsource = {{ publish = true }}\non_publish = {}\non_unpublish = {}\n",
            hook("publish"),
            hook("unpublish")
        ),
        &["--no-demo"],
    );
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let (ok, said) = ffmpeg_try_publish("flv", &format!("rtmp://{rtmp}/in"));
    assert!(ok, "{said}");
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(wait_for(Duration::from_secs(10), || lines().contains("unpublish")), "hooks:\n{}", lines());
    let text = lines();
    let publish: Vec<&str> = text.lines().filter(|l| l.starts_with("publish in rtmp 127.0.0.1 d=")).collect();
    assert_eq!(publish.len(), 1, "{text}");
    let unpublish: Vec<&str> = text.lines().filter(|l| l.starts_with("unpublish in rtmp 127.0.0.1 d=")).collect();
    assert_eq!(unpublish.len(), 1, "{text}");
    let secs: f64 = unpublish[0].rsplit("d=").next().unwrap().parse().unwrap();
    assert!((1.0..10.0).contains(&secs), "published for {secs} s: {text}");
    let _ = std::fs::remove_file(&log);
}

/// Chromium plays a path over WHEP; kicked through the API, its peer connection sees the end
/// (the relay stops answering its checks and closes DTLS) and no frame comes after.
#[test]
fn chromium_kicked_through_the_api_sees_its_peer_connection_end() {
    use common::browser::{have_chromium, Driver};
    if !have_chromium() {
        return;
    }
    let relay = Relay::with_config("[[session]]\nname = \"cam\"\nsource = { demo = true }\n", &["--no-demo"]);
    let d = Driver::start();
    d.post("url", json!({ "url": relay.url("/ui/style.css") }));
    let play = r#"
      const url = arguments[0];
      window.frames_ = 0;
      (async () => {
        const pc = new RTCPeerConnection();
        window.pc = pc;
        pc.addTransceiver('video', { direction: 'recvonly' });
        await pc.setLocalDescription(await pc.createOffer());
        const r = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/sdp' }, body: pc.localDescription.sdp });
        window.location_ = r.headers.get('Location');
        await pc.setRemoteDescription({ type: 'answer', sdp: await r.text() });
        setInterval(async () => {
          (await pc.getStats()).forEach(s => { if (s.type === 'inbound-rtp') window.frames_ = s.framesDecoded ?? 0; });
        }, 250);
      })();"#;
    d.post("execute/sync", json!({ "script": play, "args": [relay.url("/cam/whep")] }));
    let frames = || d.js("return window.frames_ ?? 0;").as_u64().unwrap_or(0);
    assert!(wait_for(Duration::from_secs(20), || frames() > 10), "no frames decoded");
    let r = listed(&relay, "webrtc");
    let location = d.js("return window.location_;");
    assert!(location.as_str().unwrap().ends_with(r["id"].as_str().unwrap()), "{location} / {r}");
    let id = r["id"].as_str().unwrap();
    let packets = || relay.ok("GET", &format!("/v1/sessions/cam/readers/{id}"), None)["packets"].as_u64().unwrap();
    assert!(wait_for(Duration::from_secs(5), || packets() > 0), "no packets counted");
    kick(&relay, id);
    let state = || d.js("return window.pc.connectionState;");
    assert!(
        wait_for(Duration::from_secs(30), || state() != json!("connected")),
        "the browser's peer connection stayed {}",
        state()
    );
    let stopped = frames();
    std::thread::sleep(Duration::from_secs(2));
    assert!(frames() - stopped < 5, "frames still coming after the kick");
}

/// `on_connect` / `on_disconnect` run once per connection of each face, with its protocol, id
/// and address; the publisher is shown through the API and ended through it, whatever its
/// protocol, and the path waits for the next one.
#[test]
fn connection_hooks_run_once_and_the_publisher_is_shown_and_ended() {
    if !have_ffmpeg() {
        return;
    }
    let log = std::env::temp_dir().join(format!("fanout-conn-hooks-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let hook = |what: &str| {
        let line = format!("{what} $FANOUT_CONN_PROTOCOL $FANOUT_CONN_ID $FANOUT_CONN_ADDR d=$FANOUT_CONN_DURATION_S");
        format!("[\"/bin/sh\", \"-c\", \"echo {line} >> {}\"]", log.display())
    };
    let relay = Relay::with_config(
        &format!(
            "on_connect = {}\non_disconnect = {}\n[[session]]\nname = \"in\"\nsource = {{ publish = true }}\n",
            hook("connect"),
            hook("disconnect")
        ),
        &["--no-demo"],
    );
    let engine = relay.ok("GET", "/v1/engine", None);
    let rtmp = engine["rtmp"].as_str().unwrap().to_string();
    let (status, _) = relay.call("DELETE", "/v1/sessions/in/publisher", None);
    assert_eq!(status, 404, "nobody publishes yet");
    let mut publisher = ffmpeg_publish("flv", &format!("rtmp://{rtmp}/in"));
    let publishing = || relay.ok("GET", "/v1/sessions/in/publisher", None)["state"] == "publishing";
    assert!(wait_for(Duration::from_secs(15), publishing), "the RTMP publisher never published");
    assert_eq!(relay.ok("GET", "/v1/sessions/in/publisher", None)["transport"], "rtmp");
    let (status, body) = relay.call("DELETE", "/v1/sessions/in/publisher", None);
    assert_eq!(status, 204, "{body}");
    assert_eq!(relay.ok("GET", "/v1/sessions/in/publisher", None)["state"], "waiting");
    let t0 = Instant::now();
    let ended = wait_for(Duration::from_secs(15), || publisher.0.try_wait().unwrap().is_some());
    assert!(ended && t0.elapsed() < Duration::from_secs(15), "the ended publisher kept sending");
    // An RTSP connection that asks one thing and goes.
    let rtsp = engine["rtsp"].as_str().unwrap();
    let mut c = TcpStream::connect(rtsp).unwrap();
    c.write_all(format!("OPTIONS rtsp://{rtsp}/in RTSP/1.0\r\nCSeq: 1\r\n\r\n").as_bytes()).unwrap();
    assert!(read_head(&mut c).starts_with("RTSP/1.0 200"));
    drop(c);
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    // (Each hook is a process of its own: a short connection's two may finish in either order.)
    let both = || {
        ["connect rtmp", "disconnect rtmp", "connect rtsp", "disconnect rtsp"]
            .iter()
            .all(|l| lines().lines().any(|x| x.starts_with(l)))
    };
    assert!(wait_for(Duration::from_secs(10), both), "hooks:\n{}", lines());
    let text = lines();
    for face in ["rtmp", "rtsp"] {
        let of = |what: &str| -> Vec<Vec<String>> {
            let head = format!("{what} {face} ");
            text.lines().filter(|l| l.starts_with(&head)).map(|l| l.split(' ').map(String::from).collect()).collect()
        };
        let (connect, disconnect) = (of("connect"), of("disconnect"));
        assert_eq!((connect.len(), disconnect.len()), (1, 1), "{face}: once each\n{text}");
        assert_eq!(connect[0][2], disconnect[0][2], "{face}: one id for both\n{text}");
        assert_eq!(connect[0][2].len(), 32, "{face}: a 128-bit id\n{text}");
        assert!(connect[0][3].starts_with("127.0.0.1:"), "{face}: its address\n{text}");
        let secs: f64 = disconnect[0][4].trim_start_matches("d=").parse().unwrap();
        assert!(secs < 30.0, "{face}: connected {secs} s\n{text}");
    }
    let _ = std::fs::remove_file(&log);
}
