//! `file` sources (issue 16): a recorded MPEG-TS or MP4 played at its own rate, looped
//! without a seam, or once; files it cannot play are refused with a reason.

mod common;
use common::*;
use serde_json::json;
use std::time::Duration;

const CLIP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts");

/// A relay that may read the clip and the test's own files (`file_roots`).
fn relay(extra: &[&str]) -> Relay {
    let tmp = std::env::temp_dir();
    let mut args = vec![
        "--file-root",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets"),
        "--file-root",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata"),
        "--file-root",
    ];
    args.push(tmp.to_str().unwrap());
    args.extend_from_slice(extra);
    Relay::start(&args)
}

/// 10 s of a looped 8 s file over HTTP: every picture 40 ms after the last, across the loop.
#[test]
fn a_looped_file_plays_without_a_seam() {
    if !have_ffmpeg() {
        return;
    }
    let relay = relay(&["--no-demo"]);
    plays_without_a_seam(&relay, "clip", CLIP, "file ", "8.0 s", 10);
}

/// The same clip as MP4 (H.264 + AAC, remuxed by ffmpeg without re-encoding): the same 8 s a
/// loop, seamless over HTTP, and its H.264 and AAC over RTSP.
#[test]
fn an_mp4_file_plays_like_its_ts() {
    if !have_ffmpeg() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("fanout-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mp4 = dir.join("clip.mp4");
    let ok = std::process::Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-i", CLIP, "-c", "copy", "-bsf:a", "aac_adtstoasc"])
        .arg(&mp4)
        .status()
        .unwrap();
    assert!(ok.success());
    let relay = relay(&["--no-demo", "--rtsp", "127.0.0.1:0"]);
    plays_without_a_seam(&relay, "clip", mp4.to_str().unwrap(), "file ", "8.0 s", 10);
    let probe = std::process::Command::new("timeout")
        .args(["20", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
        .arg(format!("rtsp://{}/clip", rtsp_addr(&relay)))
        .output()
        .unwrap();
    let codecs = String::from_utf8_lossy(&probe.stdout);
    assert!(codecs.contains("h264") && codecs.contains("aac"), "{codecs} {probe:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An HEVC MP4 (`hvc1`, B-frames, AAC; 2 s, looped) plays as MPEG-TS over HTTP, as H.265 over
/// RTSP and as HLS, each decoded without an error.
#[test]
fn an_hevc_mp4_file_plays_over_http_rtsp_and_hls() {
    if !have_ffmpeg() {
        return;
    }
    let relay = relay(&["--no-demo", "--rtsp", "127.0.0.1:0"]);
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/hevc/demo-2s-hevc.mp4");
    let created = relay.ok("POST", "/v1/sessions", Some(json!({"name": "hevc", "source": {"file": file}})));
    assert!(created["source"]["kind"].as_str().unwrap().contains("2.0 s, looped"), "{created}");
    let rtsp = format!("rtsp://{}/hevc", rtsp_addr(&relay));
    for url in [relay.url("/v1/sessions/hevc/stream"), rtsp, relay.url("/v1/sessions/hevc/hls/index.m3u8")] {
        let out = std::process::Command::new("timeout")
            .args(["30", "ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-stats", "-i", &url])
            .args(["-t", "3", "-map", "0:v", "-f", "null", "-"])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        // 3 s at 25 pictures a second, across a loop.
        assert!(out.status.success() && decoded_frames(&log) >= 60, "{url}: {log}");
        let errors: Vec<&str> = log.lines().filter(|l| l.starts_with('[')).collect();
        assert!(errors.is_empty(), "{url}: {errors:?}");
    }
    let probe = std::process::Command::new("timeout")
        .args(["20", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
        .arg(format!("rtsp://{}/hevc", rtsp_addr(&relay)))
        .output()
        .unwrap();
    let codecs = String::from_utf8_lossy(&probe.stdout);
    assert!(codecs.contains("hevc") && codecs.contains("aac"), "{codecs} {probe:?}");
}

/// A directory is a playlist: a TS and an MP4 (the same 8 s clip) play as one 16 s stream,
/// looped, with no seam at the joins nor at the loop.
#[test]
fn a_directory_plays_as_a_playlist_without_a_seam() {
    if !have_ffmpeg() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("fanout-playlist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(CLIP, dir.join("1-first.ts")).unwrap();
    let ok = std::process::Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-i", CLIP, "-c", "copy", "-bsf:a", "aac_adtstoasc"])
        .arg(dir.join("2-second.mp4"))
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::write(dir.join("notes.txt"), "not a recording: left out").unwrap();
    let relay = relay(&["--no-demo"]);
    plays_without_a_seam(&relay, "list", dir.to_str().unwrap(), "playlist ", "16.0 s", 20);
    // With a recording of other tracks (video only) in it, the directory is refused, saying why.
    let ok = std::process::Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-i", CLIP, "-an", "-c", "copy"])
        .arg(dir.join("3-silent.ts"))
        .status()
        .unwrap();
    assert!(ok.success());
    let spec = json!({"name": "bad", "source": {"file": dir.to_str().unwrap()}});
    let (status, body) = relay.call("POST", "/v1/sessions", Some(spec));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("3-silent.ts carries H.264, but 1-first.ts carries H.264 + AAC"),
        "{body}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Creates session `name` of `file` (its kind starting `kind`, `span` long, looped) and
/// decodes `seconds` of its HTTP stream: every picture 40 ms after the last, across the
/// loop (timestamps as they come: a gap is not filled with repeated pictures).
fn plays_without_a_seam(relay: &Relay, name: &str, file: &str, kind: &str, span: &str, seconds: u32) {
    let created = relay.ok("POST", "/v1/sessions", Some(json!({"name": name, "source": {"file": file}})));
    let k = created["source"]["kind"].as_str().unwrap();
    assert!(k.starts_with(kind) && k.contains(&format!("{span}, looped")), "{k}");
    let out = std::process::Command::new("timeout")
        .args(["60", "ffmpeg", "-nostdin", "-loglevel", "error", "-i"])
        .arg(relay.url(&format!("/v1/sessions/{name}/stream")))
        .args(["-t", &seconds.to_string(), "-map", "0:v", "-fps_mode", "passthrough", "-f", "framemd5", "-"])
        .output()
        .unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let pts: Vec<i64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(',').nth(2)?.trim().parse().ok())
        .collect();
    assert!(pts.len() as u32 >= seconds * 24, "{seconds} s at 25 fps: {} pictures", pts.len());
    let steps: Vec<i64> = pts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        steps.iter().all(|s| *s == steps[0]),
        "a seam: steps {:?}",
        steps.iter().filter(|s| **s != steps[0]).collect::<Vec<_>>()
    );
}

/// `loop = false`: the file plays once (8 s), then the source is closed.
#[test]
fn a_file_played_once_ends() {
    let relay = relay(&["--no-demo"]);
    let spec = json!({"name": "once", "source": {"file": CLIP, "loop": false}});
    let created = relay.ok("POST", "/v1/sessions", Some(spec));
    assert!(created["source"]["kind"].as_str().unwrap().contains("once"), "{created}");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(relay.ok("GET", "/v1/sessions/once", None)["source"]["state"], "active");
    assert!(
        wait_for(Duration::from_secs(10), || relay.ok("GET", "/v1/sessions/once", None)["source"]["state"] == "closed"),
        "still playing after the file's 8 s"
    );
    // About one lap of datagrams (7 TS packets each), no more.
    let st = relay.ok("GET", "/v1/sessions/once", None);
    let packets = st["source"]["packets"].as_u64().unwrap();
    let lap = std::fs::metadata(CLIP).unwrap().len() / 1316;
    assert!(packets.abs_diff(lap) <= 2, "{packets} datagrams, a lap is {lap}");
}

/// Issue 30 item 11: players of a file played once are told it ended: ffmpeg over RTSP (UDP
/// and interleaved, by the RTCP BYE and the close) and over HTTP (the stream's end) exits by
/// itself, and so does an HLS player (the playlist's `#EXT-X-ENDLIST`); a DESCRIBE afterwards
/// is 404 instead of a description of silence.
#[test]
fn players_of_a_file_played_once_get_its_end() {
    if !have_ffmpeg() {
        return;
    }
    let relay = relay(&["--no-demo", "--rtsp", "127.0.0.1:0"]);
    relay.ok("POST", "/v1/sessions", Some(json!({"name": "once", "source": {"file": CLIP, "loop": false}})));
    let rtsp = format!("rtsp://{}/once", rtsp_addr(&relay));
    let http = relay.url("/v1/sessions/once/stream");
    let hls = relay.url("/v1/sessions/once/hls/index.m3u8");
    std::thread::sleep(Duration::from_secs(1));
    let play = |args: &[&str]| {
        std::process::Command::new("timeout")
            .args(["30", "ffmpeg", "-nostdin", "-v", "error"])
            .args(args)
            .args(["-f", "null", "-"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let t0 = std::time::Instant::now();
    let players = [
        ("RTSP over UDP", play(&["-rtsp_transport", "udp", "-i", &rtsp])),
        ("RTSP interleaved", play(&["-rtsp_transport", "tcp", "-i", &rtsp])),
        ("HTTP", play(&["-i", &http])),
        ("HLS", play(&["-i", &hls])),
    ];
    for (what, mut p) in players {
        let st = p.wait().unwrap();
        // `timeout` says 124 when it had to stop a player that hung.
        assert_ne!(st.code(), Some(124), "{what}: still playing 30 s after an 8 s file");
        assert!(t0.elapsed() < Duration::from_secs(20), "{what}: ended only after {:?}", t0.elapsed());
    }
    let (ok, log) = ffmpeg_decode(&rtsp, &[], 1);
    assert!(!ok && log.contains("404"), "a DESCRIBE after the end: {log}");
    let playlist = ureq::get(&format!("{hls}?player=p")).call().unwrap().into_string().unwrap();
    assert!(playlist.ends_with("#EXT-X-ENDLIST\n"), "{playlist}");
}

/// What cannot be played is refused at once, with why.
#[test]
fn files_it_cannot_play_are_refused() {
    let relay = relay(&["--no-demo"]);
    let not_ts = std::env::temp_dir().join(format!("fanout-not-{}.ts", std::process::id()));
    std::fs::write(&not_ts, b"not a transport stream").unwrap();
    let not_ts = not_ts.to_str().unwrap().to_string();
    // An MP4 by its first box, broken after it.
    let not_mp4 = std::env::temp_dir().join(format!("fanout-not-{}.mp4", std::process::id()));
    std::fs::write(&not_mp4, b"\0\0\0\x18ftypisom\0\0\x02\0isomavc1\0\0\x01\0moovjunk").unwrap();
    let not_mp4 = not_mp4.to_str().unwrap().to_string();
    let missing = std::env::temp_dir().join("fanout-no-such-file.ts");
    let empty_dir = std::env::temp_dir().join(format!("fanout-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty_dir).unwrap();
    let mkv = std::env::temp_dir().join("clip.mkv");
    let (mkv, remux) = (mkv.to_str().unwrap(), format!("ffmpeg -i {} -c copy -f mpegts", mkv.display()));
    for (file, why) in [
        (missing.to_str().unwrap(), "No such file"),
        (mkv, remux.as_str()),
        (&not_ts, "not a playable MPEG-TS"),
        (&not_mp4, "not an MP4 file that can be read"),
        (empty_dir.to_str().unwrap(), "a directory with no recording in it"),
    ] {
        let (code, body) = relay.call("POST", "/v1/sessions", Some(json!({"name": "f", "source": {"file": file}})));
        assert_eq!(code, 400, "{file}: {body}");
        assert!(body["error"].as_str().unwrap().contains(why), "{file}: {body}");
    }
    let (code, body) =
        relay.call("POST", "/v1/sessions", Some(json!({"name": "f", "source": {"udp": "127.0.0.1:0", "loop": true}})));
    assert!(code == 400 && body["error"].as_str().unwrap().contains("only applies"), "{body}");
    assert_eq!(relay.ok("GET", "/v1/sessions", None)["sessions"], json!([]));
    let _ = std::fs::remove_file(&not_mp4);
    let _ = std::fs::remove_file(&not_ts);
    let _ = std::fs::remove_dir(&empty_dir);
}
