//! `forward` (issue 53): a path pushed over RTMP, RTSP, SRT and WHIP to other servers while
//! it has a stream, and pulled back from them (RTMP, WHEP, HLS). A second fanout and MediaMTX take it, and ffmpeg decodes it from them over RTSP
//! (and from a relay that pulls it back from MediaMTX over RTMP, an `rtmp` source); a
//! target killed and started again is fed again; a target that takes the connection and
//! never answers holds up neither the path nor the other target.

mod common;
use common::*;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A fanout that takes publishers on `cam`, its RTMP on `port`.
fn receiver(port: u16) -> Relay {
    let rtmp = format!("127.0.0.1:{port}");
    Relay::with_config("[[session]]\nname = \"cam\"\nsource = { publish = true }\n", &["--no-demo", "--rtmp", &rtmp])
}

/// Whether `cam` has its publisher, with video and audio.
fn publishing(relay: &Relay) -> bool {
    let p = &relay.ok("GET", "/v1/sessions/cam", None)["publisher"];
    p["state"] == "publishing" && p["tracks"].as_array().is_some_and(|t| t.len() == 2)
}

/// Whether `cam` has its publisher, with a track at least (WebRTC carries no AAC).
fn has_video(relay: &Relay) -> bool {
    let p = &relay.ok("GET", "/v1/sessions/cam", None)["publisher"];
    p["state"] == "publishing" && p["tracks"].as_array().is_some_and(|t| !t.is_empty())
}

fn forwards(relay: &Relay) -> Vec<Value> {
    relay.ok("GET", "/v1/sessions/cam", None)["forward"].as_array().cloned().unwrap_or_default()
}

/// Decodes the first 100 pictures of `url`'s video with ffmpeg (4 s of the demo, bounded at
/// 20 s): all of them, without a decoder error.
fn decodes_100_frames(url: &str) {
    let out = Command::new("timeout")
        .args(["20", "ffmpeg", "-hide_banner", "-nostdin", "-rtsp_transport", "tcp", "-i", url])
        .args(["-map", "0:v", "-frames:v", "100", "-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ffmpeg could not decode {url}: {log}");
    assert_eq!(decoded_frames(&log), 100, "{url}: {log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.to_ascii_lowercase().contains("error")).collect();
    assert!(errors.is_empty(), "{url}: decoder errors: {errors:?}");
}

#[test]
fn a_path_is_pushed_to_a_second_fanout_and_again_after_it_restarts() {
    if !have_ffmpeg() {
        return;
    }
    let port = free_port();
    // A target that takes the connection and never says a word: it must hold nobody up.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute_port = mute.local_addr().unwrap().port();
    let far = receiver(port);
    // The hooks of each push's start and end write what they were told.
    let dir = scratch_dir("forward-hooks");
    let told = dir.join("told");
    let config = format!(
        "[[session]]\nname = \"cam\"\nsource = {{ demo = true }}\n\
         forward = [\"rtmp://127.0.0.1:{mute_port}/cam\", {{ url = \"rtmp://127.0.0.1:{port}/cam?user=x&pass=secret\" }}]\n\
         on_forward_start = [\"sh\", \"-c\", \"echo start $FANOUT_FORWARD_URL >> {told}\"]\n\
         on_forward_stop = [\"sh\", \"-c\", \"echo stop $FANOUT_FORWARD_FAILED $FANOUT_FORWARD_URL >> {told}\"]\n",
        told = told.display()
    );
    let near = Relay::with_config(&config, &["--no-demo"]);
    assert!(
        wait_for(Duration::from_secs(15), || publishing(&far)),
        "the far side has no publisher: {:?}",
        forwards(&near)
    );
    let far_rtsp = format!("rtsp://{}/cam", rtsp_addr(&far));
    decodes_100_frames(&far_rtsp);
    let f = forwards(&near);
    assert_eq!(f[1]["url"], format!("rtmp://127.0.0.1:{port}/cam"), "the key's query (a password) is not shown: {f:?}");
    assert!(f[1]["bytes"].as_u64().unwrap() > 50_000, "{f:?}");
    assert_eq!(f[1]["reconnects"], 0, "{f:?}");
    // The mute target is still being waited for (or given up on after 10 s), alone.
    assert_ne!(f[0]["state"], "pushing", "{f:?}");
    let readers = near.ok("GET", "/v1/sessions/cam/readers", None);
    let kinds: Vec<&str> = readers.as_array().unwrap().iter().filter_map(|r| r["protocol"].as_str()).collect();
    assert!(kinds.iter().filter(|k| **k == "forward").count() >= 1, "forwards are readers: {readers}");
    let m = metrics(&far);
    assert!(m.contains("fanout_publishing{session=\"cam\",protocol=\"rtmp\"} 1"), "{m}");
    let m = metrics(&near);
    let target = format!("{{session=\"cam\",url=\"rtmp://127.0.0.1:{port}/cam\"}}");
    assert!(m.contains(&format!("fanout_forward_pushing{target} 1")), "{m}");
    assert!(m.contains(&format!("fanout_forward_bytes_total{target} ")), "{m}");

    // The far side goes: the forward says why and tries again; back, it is fed again.
    drop(far);
    assert!(wait_for(Duration::from_secs(10), || forwards(&near)[1]["state"] == "retrying"), "{:?}", forwards(&near));
    let f = forwards(&near);
    assert!(f[1]["reconnects"].as_u64().unwrap() >= 1, "{f:?}");
    assert!(f[1]["last_error"].as_str().is_some_and(|e| !e.is_empty()), "{f:?}");
    let far = receiver(port);
    assert!(
        wait_for(Duration::from_secs(20), || publishing(&far)),
        "the far side has no publisher after its restart: {:?}",
        forwards(&near)
    );
    assert_eq!(forwards(&near)[1]["state"], "pushing");
    let far_rtsp = format!("rtsp://{}/cam", rtsp_addr(&far));
    decodes_100_frames(&far_rtsp);
    // The mute one was given up on within its 10 s and is tried again, on its own.
    let f = forwards(&near);
    assert!(f[0]["reconnects"].as_u64().unwrap() >= 1, "{f:?}");
    assert!(f[0]["last_error"].as_str().is_some_and(|e| e.contains("did not start the stream")), "{f:?}");
    drop(mute);
    // Two pushes started, and the first ended as the target's failure; the mute target
    // never pushed, so its hooks never ran.
    let url = format!("rtmp://127.0.0.1:{port}/cam");
    let want = format!("start {url}\nstop 1 {url}\nstart {url}\n");
    let hooks = || std::fs::read_to_string(&told).unwrap_or_default();
    assert!(wait_for(Duration::from_secs(5), || hooks() == want), "the hooks were told: {:?}", hooks());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fanout that takes publishers on `cam`, its SRT on UDP `port`; `None` (said loudly)
/// where this machine has no libsrt.
fn srt_receiver(port: u16) -> Option<Relay> {
    let srt = format!("127.0.0.1:{port}");
    let relay =
        Relay::with_config("[[session]]\nname = \"cam\"\nsource = { publish = true }\n", &["--no-demo", "--srt", &srt]);
    if relay.ok("GET", "/v1/engine", None)["srt"].is_string() {
        return Some(relay);
    }
    eprintln!("SKIPPED (loudly): no libsrt here");
    assert!(std::env::var("CI").is_err(), "CI must have SRT (scripts/test installs it)");
    None
}

#[test]
fn a_path_is_pushed_over_srt_to_a_second_fanout_and_again_after_it_restarts() {
    if !have_ffmpeg() {
        return;
    }
    let port = free_udp_port().port();
    let Some(far) = srt_receiver(port) else { return };
    let config = format!(
        "[[session]]\nname = \"cam\"\nsource = {{ demo = true }}\n\
         forward = [\"srt://127.0.0.1:{port}?streamid=publish:cam:u:secret&latency=200\"]\n"
    );
    let near = Relay::with_config(&config, &["--no-demo"]);
    assert!(
        wait_for(Duration::from_secs(15), || publishing(&far)),
        "the far side has no publisher: {:?}",
        forwards(&near)
    );
    assert_eq!(far.ok("GET", "/v1/sessions/cam", None)["publisher"]["transport"], "srt");
    decodes_100_frames(&format!("rtsp://{}/cam", rtsp_addr(&far)));
    let f = forwards(&near);
    assert_eq!(f[0]["url"], format!("srt://127.0.0.1:{port}?streamid=publish:cam"), "no credentials shown: {f:?}");
    assert_eq!((&f[0]["state"], &f[0]["reconnects"]), (&Value::from("pushing"), &Value::from(0)), "{f:?}");
    assert!(f[0]["bytes"].as_u64().unwrap() > 50_000, "{f:?}");

    // The far side goes: the forward sees its socket break and tries again; back, it is fed.
    drop(far);
    assert!(wait_for(Duration::from_secs(15), || forwards(&near)[0]["state"] == "retrying"), "{:?}", forwards(&near));
    let f = forwards(&near);
    assert!(f[0]["reconnects"].as_u64().unwrap() >= 1, "{f:?}");
    assert!(f[0]["last_error"].as_str().is_some_and(|e| !e.is_empty()), "{f:?}");
    let far = srt_receiver(port).unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || publishing(&far)),
        "the far side has no publisher after its restart: {:?}",
        forwards(&near)
    );
    decodes_100_frames(&format!("rtsp://{}/cam", rtsp_addr(&far)));
}

#[test]
fn a_path_is_pushed_over_rtsp_to_a_second_fanout() {
    if !have_ffmpeg() {
        return;
    }
    let far = receiver(free_port());
    let far_rtsp = rtsp_addr(&far);
    let config = format!(
        "[[session]]\nname = \"cam\"\nsource = {{ demo = true }}\nforward = [\"rtsp://u:secret@{far_rtsp}/cam\"]\n"
    );
    let near = Relay::with_config(&config, &["--no-demo"]);
    assert!(
        wait_for(Duration::from_secs(15), || publishing(&far)),
        "the far side has no publisher: {:?}",
        forwards(&near)
    );
    assert_eq!(far.ok("GET", "/v1/sessions/cam", None)["publisher"]["transport"], "interleaved", "an RTSP publisher");
    decodes_100_frames(&format!("rtsp://{far_rtsp}/cam"));
    let f = forwards(&near);
    assert_eq!(f[0]["url"], format!("rtsp://{far_rtsp}/cam"), "no credentials shown: {f:?}");
    assert_eq!((&f[0]["state"], &f[0]["reconnects"]), (&Value::from("pushing"), &Value::from(0)), "{f:?}");
    // The stream ends: the target is told (TEARDOWN), and is not counted as failing.
    near.ok("DELETE", "/v1/sessions/cam", None);
    assert!(wait_for(Duration::from_secs(10), || !publishing(&far)), "the far side still has the publisher");
}

#[test]
fn a_path_is_pushed_over_whip_to_a_second_fanout() {
    if !have_ffmpeg() {
        return;
    }
    let far = receiver(free_port());
    let whip = far.url("/cam/whip").replace("http://", "http://u:secret@");
    let config = format!("[[session]]\nname = \"cam\"\nsource = {{ demo = true }}\nforward = [\"{whip}\"]\n");
    let near = Relay::with_config(&config, &["--no-demo"]);
    assert!(
        wait_for(Duration::from_secs(15), || has_video(&far)),
        "the far side has no publisher: {:?}",
        forwards(&near)
    );
    assert_eq!(far.ok("GET", "/v1/sessions/cam", None)["publisher"]["transport"], "webrtc");
    decodes_100_frames(&format!("rtsp://{}/cam", rtsp_addr(&far)));
    let f = forwards(&near);
    assert_eq!(f[0]["url"], far.url("/cam/whip"), "no credentials shown: {f:?}");
    assert_eq!((&f[0]["state"], &f[0]["reconnects"]), (&Value::from("pushing"), &Value::from(0)), "{f:?}");

    // And a third relay views the near one's WHEP (a `whep` source), plays it over RTSP.
    let config = format!("[[session]]\nname = \"cam\"\nsource = {{ whep = \"{}\" }}\n", near.url("/cam/whep"));
    let viewer = Relay::with_config(&config, &["--no-demo"]);
    assert!(wait_for(Duration::from_secs(15), || has_video(&viewer)), "{}", viewer.ok("GET", "/v1/sessions/cam", None));
    let status = viewer.ok("GET", "/v1/sessions/cam", None);
    assert!(status["source"]["kind"].as_str().is_some_and(|k| k.contains("whep pull of http://")), "{status}");
    decodes_100_frames(&format!("rtsp://{}/cam", rtsp_addr(&viewer)));
}

#[test]
fn forwards_that_cannot_work_are_refused_with_a_reason() {
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    for (target, says) in [
        ("whip://127.0.0.1:9000/x", "or a WHIP endpoint (http://, https://)"),
        ("srt://127.0.0.1:9000?streamid=read:x", "a forward publishes"),
        ("rtmp://127.0.0.1:1935", "names no application"),
        ("rtmp://u:p@127.0.0.1/live/x", "credentials"),
        ("rtmp://127.0.0.1:99999/live/x", "bad port"),
    ] {
        let spec = serde_json::json!({ "name": "cam", "source": { "publish": true }, "forward": [target] });
        let (status, body) = relay.call("POST", "/v1/sessions", Some(spec));
        assert_eq!(status, 400, "{target}: {body}");
        assert!(body.to_string().contains(says), "{target}: {body}");
    }
    let spec = serde_json::json!({ "name": "cam", "source": { "publish": true },
        "forward": [{ "url": "rtmps://127.0.0.1/live/x", "tls_verify": false, "tls_ca": "/x.pem" }] });
    let (status, body) = relay.call("POST", "/v1/sessions", Some(spec));
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("at most one"), "{body}");
}

/// Kills the child when dropped.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn mediamtx_takes_forwards_over_rtmp_rtsp_srt_and_whip_and_its_players_decode_them() {
    let Some(bin) = peer("mediamtx") else { return };
    if !have_ffmpeg() {
        return;
    }
    let dir = scratch_dir("forward-mtx");
    let (rtsp, rtmp, api, srt) = (free_port(), free_port(), free_port(), free_udp_port().port());
    let (webrtc, webrtc_udp, hls) = (free_port(), free_udp_port().port(), free_port());
    let cfg = format!(
        "logLevel: warn\napi: yes\napiAddress: 127.0.0.1:{api}\nrtspAddress: 127.0.0.1:{rtsp}\n\
         rtspTransports: [tcp]\nrtmp: yes\nrtmpAddress: 127.0.0.1:{rtmp}\n\
         hls: yes\nhlsAddress: 127.0.0.1:{hls}\nhlsVariant: lowLatency\nhlsAlwaysRemux: yes\n\
         srt: yes\nsrtAddress: 127.0.0.1:{srt}\n\
         webrtc: yes\nwebrtcAddress: 127.0.0.1:{webrtc}\nwebrtcLocalUDPAddress: 127.0.0.1:{webrtc_udp}\n\
         webrtcLocalTCPAddress: ''\nwebrtcIPsFromInterfaces: no\nwebrtcAdditionalHosts: [127.0.0.1]\n\
         metrics: no\npprof: no\nplayback: no\npaths:\n  all_others:\n"
    );
    std::fs::write(dir.join("mediamtx.yml"), cfg).unwrap();
    let _mtx = Proc(
        Command::new(&bin)
            .arg(dir.join("mediamtx.yml"))
            .stdout(std::fs::File::create(dir.join("mediamtx.log")).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(Duration::from_secs(10), || ureq::get(&format!("http://127.0.0.1:{api}/v3/paths/list"))
            .call()
            .is_ok()),
        "MediaMTX did not start: {}",
        std::fs::read_to_string(dir.join("mediamtx.log")).unwrap_or_default()
    );
    let config = format!(
        "[[session]]\nname = \"cam\"\nsource = {{ demo = true }}\n\
         forward = [\"rtmp://127.0.0.1:{rtmp}/live/cam\", \"srt://127.0.0.1:{srt}?streamid=publish:srt/cam\", \
         \"rtsp://127.0.0.1:{rtsp}/rtsp/cam\", \"http://127.0.0.1:{webrtc}/whip/cam/whip\"]\n"
    );
    let near = Relay::with_config(&config, &["--no-demo"]);
    let ready = |name: &str| {
        let list: Value = ureq::get(&format!("http://127.0.0.1:{api}/v3/paths/list")).call().ok()?.into_json().ok()?;
        list["items"].as_array()?.iter().find(|p| p["name"] == name).map(|p| p["ready"] == true)
    };
    for name in ["live/cam", "srt/cam", "rtsp/cam", "whip/cam"] {
        assert!(
            wait_for(Duration::from_secs(15), || ready(name) == Some(true)),
            "MediaMTX has no ready {name}: {:?}; {:?}; {}",
            forwards(&near),
            ureq::get(&format!("http://127.0.0.1:{api}/v3/paths/list")).call().ok().and_then(|r| r.into_string().ok()),
            std::fs::read_to_string(dir.join("mediamtx.log")).unwrap_or_default()
        );
    }
    // (Decoded side by side: a test run is long enough.)
    let decoders = ["live/cam", "srt/cam", "rtsp/cam", "whip/cam"]
        .map(|name| std::thread::spawn(move || decodes_100_frames(&format!("rtsp://127.0.0.1:{rtsp}/{name}"))));
    for d in decoders {
        d.join().unwrap();
    }
    let f = forwards(&near);
    assert!(f.iter().all(|f| f["reconnects"] == 0), "{f:?}");

    // And back, three ways at once, each played over RTSP: a relay pulls it from MediaMTX
    // over RTMP (an `rtmp` source), one views MediaMTX's WHEP (a `whep` source), one reads
    // MediaMTX's Low-Latency HLS (an `hls` source: fMP4, the audio a rendition of its own).
    let one = |source: String| {
        Relay::with_config(&format!("[[session]]\nname = \"cam\"\nsource = {{ {source} }}\n"), &["--no-demo"])
    };
    let puller = one(format!("rtmp = \"rtmp://127.0.0.1:{rtmp}/live/cam\""));
    let viewer = one(format!("whep = \"http://127.0.0.1:{webrtc}/live/cam/whep\""));
    let hls_reader = one(format!("hls = \"http://127.0.0.1:{hls}/live/cam/index.m3u8\""));
    for (relay, ready, how) in [
        (&puller, publishing as fn(&Relay) -> bool, "rtmp"),
        (&viewer, has_video, "webrtc"),
        (&hls_reader, publishing, "hls"),
    ] {
        assert!(
            wait_for(Duration::from_secs(20), || ready(relay)),
            "{how}: {}",
            relay.ok("GET", "/v1/sessions/cam", None)
        );
        let status = relay.ok("GET", "/v1/sessions/cam", None);
        assert_eq!(status["publisher"]["transport"], how, "{status}");
    }
    let status = puller.ok("GET", "/v1/sessions/cam", None);
    assert!(status["source"]["kind"].as_str().is_some_and(|k| k.contains("rtmp pull of rtmp://")), "{status}");
    let urls = [&puller, &viewer, &hls_reader].map(|r| format!("rtsp://{}/cam", rtsp_addr(r)));
    let decoders = urls.map(|url| std::thread::spawn(move || decodes_100_frames(&url)));
    for d in decoders {
        d.join().unwrap();
    }
    drop((puller, viewer, hls_reader));

    // On demand: it plays only while someone reads, from the first reader's ask.
    let config = format!(
        "[[session]]\nname = \"cam\"\n\
         source = {{ rtmp = \"rtmp://127.0.0.1:{rtmp}/live/cam\", on_demand = true, linger_s = 1 }}\n"
    );
    let lazy = Relay::with_config(&config, &["--no-demo"]);
    let readers_of_mtx = || {
        let list: Value = ureq::get(&format!("http://127.0.0.1:{api}/v3/paths/list")).call().ok()?.into_json().ok()?;
        let p = list["items"].as_array()?.iter().find(|p| p["name"] == "live/cam")?.clone();
        p["readers"].as_array().map(|r| r.len())
    };
    // (The relays dropped above leave MediaMTX a moment later: its readers are counted once
    // they stay the same for 2 s.)
    let mut before = readers_of_mtx();
    let mut same_since = std::time::Instant::now();
    let settled = wait_for(Duration::from_secs(20), || {
        let now = readers_of_mtx();
        if now != before {
            (before, same_since) = (now, std::time::Instant::now());
        }
        same_since.elapsed() >= Duration::from_secs(2)
    });
    assert!(settled, "MediaMTX's readers keep changing: {before:?}");
    assert!(!publishing(&lazy), "an on-demand pull plays with nobody reading");
    assert_eq!(readers_of_mtx(), before, "nobody reads MediaMTX for it yet");
    decodes_100_frames(&format!("rtsp://{}/cam", rtsp_addr(&lazy)));
    // The reader gone, it stops a linger (1 s) later, and MediaMTX loses its reader.
    assert!(
        wait_for(Duration::from_secs(15), || !publishing(&lazy) && readers_of_mtx() == before),
        "still playing with nobody reading: {}",
        lazy.ok("GET", "/v1/sessions/cam", None)
    );
    // And again for the next reader.
    decodes_100_frames(&format!("rtsp://{}/cam", rtsp_addr(&lazy)));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `hls` sources reading a second fanout's HLS in each of its variants (MPEG-TS segments,
/// fMP4 segments, Low-Latency), one on demand: each path has the video and the audio, and
/// ffmpeg decodes 100 pictures of each over RTSP; the on-demand one reads nothing before
/// its reader asks (its stop after the last reader is the pull loop's, tested with SRT).
#[test]
fn hls_of_every_variant_is_read_as_a_source() {
    if !have_ffmpeg() {
        return;
    }
    let far = Relay::with_config(
        "[[session]]\nname = \"ts\"\nsource = { demo = true }\nhls_variant = \"mpegts\"\n\
         [[session]]\nname = \"fmp4\"\nsource = { demo = true }\nhls_variant = \"fmp4\"\n\
         [[session]]\nname = \"ll\"\nsource = { demo = true }\n",
        &["--no-demo"],
    );
    let url = |name: &str| far.url(&format!("/v1/sessions/{name}/hls/index.m3u8"));
    let config = format!(
        "[[session]]\nname = \"ts\"\nsource = {{ hls = \"{}\" }}\n\
         [[session]]\nname = \"fmp4\"\nsource = {{ hls = \"{}\" }}\n\
         [[session]]\nname = \"ll\"\nsource = {{ hls = \"{}\", on_demand = true, linger_s = 1 }}\n",
        url("ts"),
        url("fmp4"),
        url("ll")
    );
    let near = Relay::with_config(&config, &["--no-demo"]);
    let playing = |name: &str| {
        let p = &near.ok("GET", &format!("/v1/sessions/{name}"), None)["publisher"];
        p["state"] == "publishing" && p["transport"] == "hls" && p["tracks"].as_array().is_some_and(|t| t.len() == 2)
    };
    for name in ["ts", "fmp4"] {
        assert!(
            wait_for(Duration::from_secs(20), || playing(name)),
            "{}",
            near.ok("GET", &format!("/v1/sessions/{name}"), None)
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(!playing("ll"), "an on-demand HLS source reads with nobody reading");
    let rtsp = rtsp_addr(&near);
    let decoders: Vec<_> = ["ts", "fmp4", "ll"]
        .into_iter()
        .map(|name| std::thread::spawn(move || decodes_100_frames(&format!("rtsp://{rtsp}/{name}"))))
        .collect();
    for d in decoders {
        d.join().unwrap();
    }
    let status = near.ok("GET", "/v1/sessions/ts", None);
    assert!(status["source"]["kind"].as_str().is_some_and(|k| k.starts_with("hls pull of http://")), "{status}");
}
