//! Recording and playback (issue 34): a path recorded to fragmented MP4 files that ffprobe
//! reads, whose durations tile the recorded time; a time range as one download starting at a
//! keyframe and as an HLS VOD playlist ffmpeg plays; `kill -9` mid-write leaves files that
//! play; retention deletes what it should and nothing else.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-rec-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A file a listing names (below the recordings' root: the host's directories are not a
/// client's business) as it is on disk.
fn on_disk(dir: &Path, f: &Value) -> String {
    let name = f["file"].as_str().unwrap();
    assert!(!name.starts_with('/') && !name.contains(dir.to_str().unwrap()), "{name} shows the host's directories");
    dir.join(name).to_str().unwrap().to_string()
}

fn config(dir: &Path, sessions: &str) -> String {
    format!("record_path = \"{}/%path/%Y-%m-%d_%H-%M-%S-%f\"\n\n{sessions}", dir.display())
}

/// Seconds of an RFC 3339 UTC time the API gives, from the start of its day (the tests run
/// far less than a day; a wrap past midnight is taken into account by the caller's
/// differences being small).
fn seconds(t: &str) -> f64 {
    let time = t.split('T').nth(1).unwrap().trim_end_matches('Z');
    let mut p = time.split(':');
    let (h, m, s): (f64, f64, f64) =
        (p.next().unwrap().parse().unwrap(), p.next().unwrap().parse().unwrap(), p.next().unwrap().parse().unwrap());
    h * 3600.0 + m * 60.0 + s
}

/// The RFC 3339 time `s` seconds after `t` (within its day).
fn later(t: &str, s: f64) -> String {
    let s = seconds(t) + s;
    let day = &t[..t.find('T').unwrap()];
    let (h, m, sec) = ((s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64, s % 60.0);
    format!("{day}T{h:02}:{m:02}:{sec:09.6}Z")
}

fn between(a: &str, b: &str) -> f64 {
    let d = seconds(b) - seconds(a);
    if d < -43_200.0 {
        d + 86_400.0
    } else {
        d
    }
}

/// ffprobe's view of a file: its duration, and the first video frame's key flag and time.
fn probe(file: &str) -> (f64, bool, f64) {
    let out = Command::new("timeout")
        .args(["30", "ffprobe", "-v", "error", "-select_streams", "v:0", "-show_frames", "-read_intervals", "%+#1"])
        .args(["-show_entries", "frame=key_frame,pts_time:format=duration", "-of", "json", file])
        .output()
        .unwrap();
    assert!(out.status.success(), "ffprobe {file}: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let duration = v["format"]["duration"].as_str().unwrap_or("0").parse().unwrap();
    let frame = &v["frames"][0];
    let pts = frame["pts_time"].as_str().unwrap_or("-1").parse().unwrap();
    (duration, frame["key_frame"] == 1, pts)
}

/// Per track of a file (`video` or `audio`): when its first sample starts and its last
/// ends, in seconds, from its packets.
fn spans(file: &str) -> Vec<(String, f64, f64)> {
    let out = Command::new("timeout")
        .args(["30", "ffprobe", "-v", "error", "-show_entries", "stream=index,codec_type"])
        .args(["-show_entries", "packet=stream_index,pts_time,duration_time", "-of", "json", file])
        .output()
        .unwrap();
    assert!(out.status.success(), "ffprobe {file}: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let num = |x: &Value| x.as_str().and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    let packets = v["packets"].as_array().unwrap();
    v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let mine: Vec<&Value> = packets.iter().filter(|p| p["stream_index"] == s["index"]).collect();
            let first = mine.iter().map(|p| num(&p["pts_time"])).fold(f64::MAX, f64::min);
            let end = mine.iter().map(|p| num(&p["pts_time"]) + num(&p["duration_time"])).fold(0.0, f64::max);
            (s["codec_type"].as_str().unwrap().to_string(), first, end)
        })
        .collect()
}

fn get_bytes(url: &str, range: Option<&str>) -> (u16, Vec<u8>) {
    let mut req = ureq::get(url).timeout(Duration::from_secs(30));
    if let Some(r) = range {
        req = req.set("Range", r);
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("GET {url}: {e}"),
    };
    let code = resp.status();
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut resp.into_reader(), &mut body).unwrap();
    (code, body)
}

/// The demo as a recorded path: 2 s files of 500 ms fragments.
const CAM: &str =
    "[[session]]\nname = \"cam\"\nsource = { demo = true }\nrecord = { segment_s = 2, fragment_ms = 500 }\n";

#[test]
fn a_recording_plays_file_by_file_as_a_range_and_after_kill_9() {
    if !have_ffmpeg() {
        return;
    }
    let dir = dir("play");
    let mut relay = Relay::with_config(&config(&dir, CAM), &["--no-demo", "--token", "rec-secret"]);
    let complete = |v: &Value| v["files"].as_array().unwrap().iter().filter(|f| f["writing"] == false).count();
    assert!(
        wait_for(Duration::from_secs(40), || complete(&relay.ok("GET", "/v1/recordings/cam", None)) >= 4),
        "no recordings: {}\n{}",
        relay.ok("GET", "/v1/recordings/cam", None),
        relay.stderr()
    );
    let list = relay.ok("GET", "/v1/recordings/cam", None);
    assert_eq!(list["recording"], true);
    let files: Vec<&Value> = list["files"].as_array().unwrap().iter().filter(|f| f["writing"] == false).collect();

    // Every complete file: ffprobe reads it, it starts at a keyframe, its video runs the
    // listing's duration within a frame (25 fps) and its audio with it (the first file's audio
    // may start up to one of the demo's audio packets, three 21 ms frames, late: the recording
    // started at the stream's first packet, an audio packet due before the first keyframe);
    // each file starts where the last ended (no gap).
    let frame = 0.040;
    let mut total = 0.0;
    for (k, f) in files.iter().enumerate() {
        let name = &on_disk(&dir, f);
        let (_, key, _) = probe(name);
        let listed = f["duration_s"].as_f64().unwrap();
        assert!(key, "{name} does not start at a keyframe");
        assert!(listed >= 2.0 - frame && listed < 6.0, "{name}: {listed} s for a 2 s segment");
        let tracks = spans(name);
        assert_eq!(tracks.len(), 2, "{name}: {tracks:?}");
        for (kind, first, end) in &tracks {
            let (late, over) = if kind == "video" { (0.001, frame + 0.001) } else { (0.065, 0.022) };
            assert!(*first >= -0.001 && *first <= late, "{name}: its {kind} starts at {first} s");
            assert!((end - listed).abs() <= over, "{name}: its {kind} ends at {end} s, listed {listed} s");
        }
        if k > 0 {
            let last = files[k - 1];
            let gap = between(last["start"].as_str().unwrap(), f["start"].as_str().unwrap())
                - last["duration_s"].as_f64().unwrap();
            assert!(gap.abs() <= 0.002, "{gap} s between {} and {name}", last["file"]);
        }
        total += listed;
    }
    // The recording is one span: its duration is the files' sum.
    let spans = list["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 1, "{list}");
    let first = files[0]["start"].as_str().unwrap().to_string();
    assert_eq!(spans[0]["start"], first.as_str());
    assert!(spans[0]["duration_s"].as_f64().unwrap() >= total - frame);

    // A range: 2 s from 2.3 s into the recording, one download, from a keyframe at or
    // before the asked time, on a timeline from zero.
    let start = later(&first, 2.3);
    let url = relay.url(&format!("/v1/recordings/cam/get?start={start}&duration=2&token=rec-secret"));
    let (code, body) = get_bytes(&url, None);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let got = dir.join("range.mp4");
    std::fs::write(&got, &body).unwrap();
    let (duration, key, pts) = probe(got.to_str().unwrap());
    assert!(key, "the range does not start at a keyframe");
    assert!(pts.abs() < 0.1, "the range starts at {pts} s, not at zero");
    // It starts at or before the asked time, so it is at least as long as asked.
    assert!((2.0 - frame..2.0 + 3.0).contains(&duration), "a 2 s range is {duration} s");

    // The same as an HLS VOD playlist, which ffmpeg plays whole; its files' URLs carry the token.
    let url = relay.url(&format!("/v1/recordings/cam/index.m3u8?start={start}&duration=2&token=rec-secret"));
    let (code, text) = get_bytes(&url, None);
    let text = String::from_utf8(text).unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains("#EXT-X-ENDLIST") && text.contains("fragment.m4s?") && text.contains("&token=rec-secret"),
        "{text}"
    );
    assert!(text.contains(",BYTERANGE=\"") && text.contains(".mp4?token=rec-secret"), "{text}");
    assert!(!text.contains("DISCONTINUITY"), "one run, one timeline: {text}");
    let (ok, log) = ffmpeg_decode(&url, &[], 10);
    assert!(ok, "{log}");
    let frames = decoded_frames(&log) as f64;
    assert!(frames >= 2.0 / frame - 2.0, "{frames} frames of a 2 s playlist\n{text}");
    let whole = relay.url("/v1/recordings/cam/index.m3u8?token=rec-secret");
    let (ok, log) = ffmpeg_decode(&whole, &[], 60);
    assert!(ok, "{log}");
    assert!(decoded_frames(&log) as f64 >= (total / frame) * 0.95, "{log}");

    // Files: byte ranges of a recording of the path, nothing else.
    let name = files[0]["file"].as_str().unwrap();
    let enc: String =
        name.bytes().map(|b| if b == b'/' { "%2F".to_string() } else { (b as char).to_string() }).collect();
    let (code, part) =
        get_bytes(&relay.url(&format!("/v1/recordings/cam/files/{enc}?token=rec-secret")), Some("bytes=0-99"));
    assert_eq!((code, part.len()), (206, 100));
    assert_eq!(&part[4..8], b"ftyp");
    // RFC 9110: another unit, several ranges or a malformed one are answered 200 with the
    // whole file (not 206 with the whole file), past the end 416.
    let size = std::fs::metadata(on_disk(&dir, files[0])).unwrap().len() as usize;
    let file_url = relay.url(&format!("/v1/recordings/cam/files/{enc}?token=rec-secret"));
    for whole in ["items=0-10", "bytes=0-1,5-6", "bytes=--1"] {
        let (code, body) = get_bytes(&file_url, Some(whole));
        assert_eq!((code, body.len()), (200, size), "Range: {whole}");
    }
    assert_eq!(get_bytes(&file_url, Some(&format!("bytes={size}-"))).0, 416);
    for other in ["%2Fetc%2Fpasswd", "..%2F..%2Fetc%2Fpasswd", &enc.replace("cam", "cam2")] {
        let (code, _) = get_bytes(&relay.url(&format!("/v1/recordings/cam/files/{other}?token=rec-secret")), None);
        assert_eq!(code, 404, "{other}");
    }
    // Playback is behind the token.
    assert_eq!(get_bytes(&relay.url("/v1/recordings/cam"), None).0, 401);

    // kill -9 while a file is being written: every file plays, the cut one up to its last
    // whole fragment, and a relay started on the directory lists it.
    relay.signal_and_wait(libc::SIGKILL).expect("the relay did not die");
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir.join("cam")).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    let cut = names.last().unwrap().clone();
    for n in &names {
        let (duration, key, _) = probe(n.to_str().unwrap());
        assert!(key && duration > 0.0, "{} does not play after kill -9", n.display());
    }
    let again = Relay::with_config(&config(&dir, ""), &["--no-demo"]);
    let list = again.ok("GET", "/v1/recordings/cam", None);
    let last = list["files"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(on_disk(&dir, &last), cut.to_str().unwrap());
    assert!(last["duration_s"].as_f64().unwrap() > 0.0, "{last}");
    assert_eq!(again.ok("GET", "/v1/recordings", None)["paths"][0]["name"], "cam");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Retention deletes the path's files last written longer ago than `keep_s`, and then the
/// oldest beyond `keep_mb`; never the file being written, another path's files, or a file
/// the layout does not name.
#[test]
fn retention_deletes_what_it_should_and_nothing_else() {
    let dir = dir("retention");
    let layout_name = |path: &str, day: &str| dir.join(path).join(format!("{day}_01-02-03-000000.mp4"));
    let old = |p: &Path| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, vec![0u8; 400 << 10]).unwrap();
        let st = Command::new("touch").args(["-d", "3 hours ago"]).arg(p).status().unwrap();
        assert!(st.success());
    };
    let aged = [layout_name("cam", "2020-01-01"), layout_name("cam", "2020-01-02")];
    let recent = layout_name("cam", "2020-01-03");
    let others = [layout_name("other", "2020-01-01"), dir.join("cam").join("notes.txt")];
    for p in aged.iter().chain(&others) {
        old(p);
    }
    std::fs::write(&recent, vec![0u8; 400 << 10]).unwrap();
    // Over the cap: the oldest of cam2's (all written now) go first.
    let capped: Vec<PathBuf> = (1..=4).map(|d| layout_name("cam2", &format!("2020-02-0{d}"))).collect();
    for p in &capped {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, vec![0u8; 400 << 10]).unwrap();
    }
    let sessions = "[[session]]\nname = \"cam\"\nsource = { demo = true }\nrecord = { segment_s = 60, keep_s = 3600 }\n\n\
                    [[session]]\nname = \"cam2\"\nsource = { demo = true }\nrecord = { segment_s = 60, keep_s = 0, keep_mb = 1 }\n";
    let relay = Relay::with_config(&config(&dir, sessions), &["--no-demo"]);
    assert!(
        wait_for(Duration::from_secs(20), || aged.iter().all(|p| !p.exists()) && !capped[1].exists()),
        "retention did not delete {aged:?} and {:?}: {}",
        &capped[..2],
        relay.stderr()
    );
    assert!(!capped[0].exists());
    assert!(recent.exists(), "a file written within keep_s was deleted");
    for p in &others {
        assert!(p.exists(), "{} is not cam's recording, and was deleted", p.display());
    }
    // cam2: what is left fits in 1 MiB besides the file being written, which stays.
    let writing = || {
        relay.ok("GET", "/v1/recordings/cam2", None)["files"].as_array().unwrap().iter().any(|f| f["writing"] == true)
    };
    assert!(wait_for(Duration::from_secs(10), writing), "cam2 is not recorded");
    let list = relay.ok("GET", "/v1/recordings/cam2", None);
    // The files retention did not take, which are not recordings, are listed with why.
    assert!(list["files"].as_array().unwrap().iter().any(|f| f["error"].is_string()), "{list}");
    let files = list["files"].as_array().unwrap();
    let writing: Vec<&Value> = files.iter().filter(|f| f["writing"] == true).collect();
    assert_eq!(writing.len(), 1, "{list}");
    let kept: u64 = files.iter().filter(|f| f["writing"] == false).map(|f| f["bytes"].as_u64().unwrap()).sum();
    assert!(kept <= 1 << 20, "{kept} bytes kept over a 1 MiB cap: {list}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The dashboard lists the recordings and plays one in a real browser (headless Chromium):
/// the video's time advances.
#[test]
fn the_dashboard_lists_recordings_and_plays_one() {
    use common::browser::{have_chromium, Driver};
    if !have_chromium() {
        return;
    }
    let dir = dir("dashboard");
    let relay = Relay::with_config(&config(&dir, CAM), &["--no-demo"]);
    assert!(
        wait_for(Duration::from_secs(30), || relay.ok("GET", "/v1/recordings/cam", None)["files"]
            .as_array()
            .is_some_and(|f| f.len() >= 3)),
        "nothing recorded"
    );
    let d = Driver::start();
    d.post("url", serde_json::json!({ "url": relay.url("/") }));
    let rows = || d.js("return document.querySelectorAll('#recordings tbody tr').length;").as_u64().unwrap_or(0);
    assert!(wait_for(Duration::from_secs(10), || rows() >= 1), "the dashboard lists no recording");
    let path = d.js("return document.querySelector('#recordings tbody td').textContent;");
    assert_eq!(path, "cam");
    d.js("document.querySelector('#recordings .rec-play').click(); return null;");
    let time = || d.js("return document.querySelector('#recordings video').currentTime;").as_f64().unwrap_or(0.0);
    assert!(
        wait_for(Duration::from_secs(20), || time() > 1.5),
        "the recording did not play: {:?}",
        d.js("const v = document.querySelector('#recordings video'); return [v.error && v.error.message, v.src];")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A published path: each publisher's stream is its own run of files (the first closed when
/// it leaves, with its last fragment), the two are two spans with a gap between, and a
/// playlist over both plays with a discontinuity at the gap.
#[test]
fn each_publisher_starts_a_new_file_and_a_gap_stays_a_gap() {
    if !have_ffmpeg() {
        return;
    }
    let dir = dir("publish");
    let cfg = config(
        &dir,
        "publisher_grace_s = 0\n\n[[session]]\nname = \"live\"\nsource = { publish = true }\nrecord = { segment_s = 60 }\n",
    );
    let relay = Relay::with_config(&cfg, &["--no-demo"]);
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let files = || relay.ok("GET", "/v1/recordings/live", None)["files"].as_array().cloned().unwrap_or_default();
    for round in 1..=2 {
        let (ok, log) = Command::new("timeout")
            .args(["20", "ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-i", DEMO_TS, "-t", "4"])
            .args(["-c", "copy", "-f", "flv", &format!("rtmp://{rtmp}/live")])
            .output()
            .map(|o| (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned()))
            .unwrap();
        assert!(ok, "{log}");
        // The publisher left: its file is complete (not being written).
        assert!(
            wait_for(Duration::from_secs(10), || {
                let f = files();
                f.len() == round && f.iter().all(|f| f["writing"] == false)
            }),
            "round {round}: {:?}\n{}",
            files(),
            relay.stderr()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let list = relay.ok("GET", "/v1/recordings/live", None);
    for f in list["files"].as_array().unwrap() {
        let d = f["duration_s"].as_f64().unwrap();
        assert!((3.0..4.5).contains(&d), "a 4 s publish recorded as {d} s: {list}");
        let (duration, key, _) = probe(&on_disk(&dir, f));
        assert!(key && (duration - d).abs() < 0.05, "{f}: ffprobe {duration}");
    }
    assert_eq!(list["spans"].as_array().unwrap().len(), 2, "{list}");
    let url = relay.url("/v1/recordings/live/index.m3u8");
    let (code, text) = get_bytes(&url, None);
    let text = String::from_utf8(text).unwrap();
    assert_eq!(code, 200);
    assert_eq!(text.matches("#EXT-X-DISCONTINUITY").count(), 1, "{text}");
    let (ok, log) = ffmpeg_decode(&url, &[], 30);
    assert!(ok, "{log}");
    assert!(decoded_frames(&log) >= 150, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A publisher that comes back with other tracks (video alone, then video and audio) is
/// recorded with its own tracks: the recording starts again on them.
#[test]
fn a_publisher_with_other_tracks_is_recorded_with_them() {
    if !have_ffmpeg() {
        return;
    }
    let dir = dir("tracks");
    let sessions =
        "publisher_grace_s = 0\n\n[[session]]\nname = \"live\"\nsource = { publish = true }\nrecord = { segment_s = 60 }\n";
    let relay = Relay::with_config(&config(&dir, sessions), &["--no-demo"]);
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let publish = |extra: &[&str]| {
        let out = Command::new("timeout")
            .args(["20", "ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-i", DEMO_TS, "-t", "5"])
            .args(extra)
            .args(["-c", "copy", "-f", "flv", &format!("rtmp://{rtmp}/live")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let files = || relay.ok("GET", "/v1/recordings/live", None)["files"].as_array().cloned().unwrap_or_default();
    let streams = |f: &str| {
        let out = Command::new("ffprobe")
            .args(["-v", "error", "-show_entries", "stream=codec_type", "-of", "csv=p=0", f])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect::<Vec<_>>()
    };
    publish(&["-an"]);
    assert!(wait_for(Duration::from_secs(10), || files().iter().any(|f| f["writing"] == false)), "{:?}", files());
    assert_eq!(streams(&on_disk(&dir, &files()[0])), ["video"]);
    std::thread::sleep(Duration::from_secs(1));
    publish(&[]);
    assert!(wait_for(Duration::from_secs(10), || files().iter().all(|f| f["writing"] == false)), "{:?}", files());
    let all = files();
    let last = all.last().unwrap();
    assert_eq!(streams(&on_disk(&dir, last)), ["video", "audio"], "{all:?}\n{}", relay.stderr());
    // (The first second or so of the new publisher goes to a file of the old tracks.)
    assert!(last["duration_s"].as_f64().unwrap() >= 2.5, "{all:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Video packets of a file or URL as ffprobe reads them: (pts, keyframe).
fn video_packets(input: &str) -> Vec<(f64, bool)> {
    let out = Command::new("timeout")
        .args(["30", "ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "packet=pts_time,flags"])
        .args(["-of", "csv=p=0", input])
        .output()
        .unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "ffprobe {input}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(','))
        .map(|(t, f)| (t.parse().unwrap(), f.starts_with('K')))
        .collect()
}

/// `format = "mpegts"`: the demo recorded as `.ts` files that each start with a keyframe and
/// play concatenated as one stream (a run keeps one clock); a range download is exactly the
/// recording's pictures from the keyframe at or before its start, each 40 ms after the last,
/// from near zero; the VOD playlist of TS fragments plays; a file is served as `video/mp2t`.
#[test]
fn a_recording_as_mpegts_plays_file_by_file_concatenated_and_as_an_exact_range() {
    if !have_ffmpeg() {
        return;
    }
    let dir = dir("ts");
    let cam =
        "[[session]]\nname = \"cam\"\nsource = { demo = true }\nrecord = { segment_s = 2, format = \"mpegts\" }\n";
    let relay = Relay::with_config(&config(&dir, cam), &["--no-demo"]);
    let complete = |v: &Value| v["files"].as_array().unwrap().iter().filter(|f| f["writing"] == false).count();
    assert!(
        wait_for(Duration::from_secs(40), || complete(&relay.ok("GET", "/v1/recordings/cam", None)) >= 4),
        "no recordings: {}\n{}",
        relay.ok("GET", "/v1/recordings/cam", None),
        relay.stderr()
    );
    let list = relay.ok("GET", "/v1/recordings/cam", None);
    let files: Vec<&Value> = list["files"].as_array().unwrap().iter().filter(|f| f["writing"] == false).collect();
    let frame = 0.040;
    let mut all = Vec::new();
    for (k, f) in files.iter().enumerate() {
        let name = on_disk(&dir, f);
        assert!(name.ends_with(".ts"), "{name}");
        let packets = video_packets(&name);
        assert!(packets[0].1, "{name} does not start at a keyframe");
        let listed = f["duration_s"].as_f64().unwrap();
        let probed = packets.len() as f64 * frame;
        assert!((listed - probed).abs() <= frame + 0.001, "{name}: listed {listed} s, holds {probed} s of pictures");
        if k > 0 {
            let last = files[k - 1];
            let gap = between(last["start"].as_str().unwrap(), f["start"].as_str().unwrap())
                - last["duration_s"].as_f64().unwrap();
            assert!(gap.abs() <= 0.002, "{gap} s between {} and {name}", last["file"]);
        }
        all.extend(std::fs::read(&name).unwrap());
    }
    // Concatenated, the files are one stream: every picture 40 ms after the last.
    let joined = dir.join("joined.ts");
    std::fs::write(&joined, &all).unwrap();
    let packets = video_packets(joined.to_str().unwrap());
    for w in packets.windows(2) {
        assert!((w[1].0 - w[0].0 - frame).abs() < 0.002, "a seam between files: {:?} then {:?}", w[0], w[1]);
    }
    let recorded = pictures(&["-i", joined.to_str().unwrap()]);

    // A range 2 s long from 2.3 s in: the recording's own pictures, exactly, from a
    // keyframe, on a timeline from near zero (the muxer's 0.2 s clock lead).
    let first = files[0]["start"].as_str().unwrap().to_string();
    let start = later(&first, 2.3);
    let (code, body) = get_bytes(&relay.url(&format!("/v1/recordings/cam/get?start={start}&duration=2")), None);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let got = dir.join("range.ts");
    std::fs::write(&got, &body).unwrap();
    let packets = video_packets(got.to_str().unwrap());
    assert!(packets[0].1 && packets[0].0 < 0.3, "the range starts at {:?}", packets[0]);
    assert!(packets.windows(2).all(|w| (w[1].0 - w[0].0 - frame).abs() < 0.002), "{packets:?}");
    assert!(packets.len() as f64 * frame >= 2.0 - frame, "{} pictures in a 2 s range", packets.len());
    let range = pictures(&["-i", got.to_str().unwrap()]);
    let at = recorded.windows(range.len()).position(|w| w == range.as_slice());
    assert!(at.is_some(), "the range's {} pictures are not a run of the recording's {}", range.len(), recorded.len());

    // The VOD playlist: TS fragments, no initialization segment; ffmpeg plays it.
    let url = relay.url(&format!("/v1/recordings/cam/index.m3u8?start={start}&duration=2"));
    let (code, text) = get_bytes(&url, None);
    let text = String::from_utf8(text).unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("fragment.ts?") && !text.contains("EXT-X-MAP") && !text.contains("DISCONTINUITY"), "{text}");
    let (ok, log) = ffmpeg_decode(&url, &[], 10);
    assert!(ok && decoded_frames(&log) as f64 >= 2.0 / frame - 2.0, "{log}\n{text}");
    let resp = ureq::get(
        &relay.url(&format!("/v1/recordings/cam/files/{}", files[0]["file"].as_str().unwrap().replace('/', "%2F"))),
    )
    .call()
    .unwrap();
    assert_eq!(resp.header("content-type"), Some("video/mp2t"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// VP9 and Opus (what libvpx and libopus, or a browser, send) go into fragmented MP4: ffmpeg
/// publishes both over RTSP; HLS lists their codecs, ffprobe reads VP9 320x240 and Opus 48 kHz
/// from it, and ffmpeg decodes 4 s of it (a picture every 40 ms, an Opus packet every 20 ms)
/// without an error; the recording holds both and decodes whole; HTTP TS, which carries
/// neither, has the Opus as AAC.
#[test]
fn vp9_and_opus_play_over_hls_and_are_recorded() {
    if !have_ffmpeg() {
        return;
    }
    let dir = dir("vp9");
    let sessions = "[[session]]\nname = \"cam\"\nsource = { publish = true }\nrecord = { segment_s = 60 }\n";
    let relay = Relay::with_config(&config(&dir, sessions), &["--no-demo"]);
    let publisher = Kill(
        Command::new("ffmpeg")
            .args(["-nostdin", "-loglevel", "error", "-re", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25"])
            .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-t", "12"])
            .args(["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-g", "50", "-b:v", "300k"])
            .args(["-c:a", "libopus", "-b:a", "48k", "-strict", "experimental", "-rtsp_transport", "tcp"])
            .args(["-f", "rtsp", &format!("rtsp://{}/cam", rtsp_addr(&relay))])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let hls = relay.url("/v1/sessions/cam/hls/index.m3u8");
    let listed = || get_bytes(&hls, None).1;
    assert!(
        wait_for(Duration::from_secs(10), || String::from_utf8_lossy(&listed())
            .contains("CODECS=\"vp09.00.20.08,opus\"")),
        "{}",
        String::from_utf8_lossy(&listed())
    );
    let out = Command::new("timeout")
        .args(["30", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name,width,height,sample_rate"])
        .args(["-of", "csv=p=0", &hls])
        .output()
        .unwrap();
    let probed = String::from_utf8_lossy(&out.stdout);
    assert!(probed.contains("vp9,320,240") && probed.contains("opus,48000"), "{probed}");
    let out = Command::new("timeout")
        .args(["30", "ffmpeg", "-nostdin", "-loglevel", "error", "-i", &hls, "-t", "4", "-f", "framemd5", "-"])
        .output()
        .unwrap();
    let md5 = String::from_utf8_lossy(&out.stdout);
    let count = |stream: &str| md5.lines().filter(|l| l.starts_with(stream)).count();
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        (98..=101).contains(&count("0,")) && (196..=201).contains(&count("1,")),
        "{} / {}",
        count("0,"),
        count("1,")
    );
    // HTTP TS carries no VP9 and no Opus: the Opus reaches it as AAC, the video not at all.
    let out = Command::new("timeout")
        .args(["20", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
        .arg(relay.url("/v1/sessions/cam/stream"))
        .output()
        .unwrap();
    // (ffprobe lists the program's streams, then all: "aac", "", "aac".)
    let streams: Vec<String> =
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(String::from).collect();
    assert!(!streams.is_empty() && streams.iter().all(|s| s == "aac"), "{streams:?}");
    // The recording, once the publisher has gone.
    drop(publisher);
    let files = || relay.ok("GET", "/v1/recordings/cam", None)["files"].as_array().cloned().unwrap_or_default();
    assert!(wait_for(Duration::from_secs(15), || files().iter().any(|f| f["writing"] == false)), "{:?}", files());
    let file = on_disk(&dir, &files()[0]);
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0", &file])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().collect::<Vec<_>>(), ["vp9", "opus"]);
    let out =
        Command::new("ffmpeg").args(["-nostdin", "-v", "error", "-i", &file, "-f", "null", "-"]).output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A camera's MP3 (RTP `MPA`) and G.711 (PCMU on the static payload type): ffmpeg publishes
/// H.264 + MP3 to one path and PCMU alone to another, over RTSP. RTSP readers get them as they
/// came. HLS lists `mp4a.6b` for the MP3 and ffmpeg decodes 3 s without an error (an MP3
/// frame every 26 ms beside a picture every 40 ms); HTTP TS and HTTP-FLV carry it too, its
/// 440 Hz tone kept. The G.711, which browsers do not play in
/// fMP4 and MPEG-TS does not carry, becomes AAC for HLS (`mp4a.40.2`, 47 frames a second),
/// HTTP TS and the recording, its 440 Hz tone kept; the recordings decode whole.
#[test]
fn mp3_and_g711_play_over_rtsp_and_hls_and_are_recorded() {
    if !have_ffmpeg() {
        return;
    }
    let dir = dir("mp3");
    let sessions = "[[session]]\nname = \"mp3\"\nsource = { publish = true }\nrecord = { segment_s = 60 }\n\n\
                    [[session]]\nname = \"pcmu\"\nsource = { publish = true }\nrecord = { segment_s = 60 }\n";
    let relay = Relay::with_config(&config(&dir, sessions), &["--no-demo"]);
    let rtsp = rtsp_addr(&relay);
    let publish = |args: &[&str], path: &str| {
        Kill(
            Command::new("ffmpeg")
                .args(["-nostdin", "-loglevel", "error", "-re"])
                .args(args)
                .args(["-t", "40", "-rtsp_transport", "tcp", "-f", "rtsp", &format!("rtsp://{rtsp}/{path}")])
                .spawn()
                .unwrap(),
        )
    };
    let sine = |rate: &str| format!("sine=frequency=440:sample_rate={rate}");
    let _mp3 = publish(
        &["-stream_loop", "-1", "-i", DEMO_TS, "-f", "lavfi", "-i", &sine("44100"), "-map", "0:v", "-c:v", "copy"]
            .into_iter()
            .chain(["-map", "1:a", "-c:a", "libmp3lame", "-b:a", "128k"])
            .collect::<Vec<_>>(),
        "mp3",
    );
    let _pcmu = publish(&["-f", "lavfi", "-i", &sine("8000"), "-c:a", "pcm_mulaw"], "pcmu");
    for (path, codecs, audio, frames) in [
        ("mp3", "avc1.640015,mp4a.6b", "mp3", ("0,", 72..=76, "1,", 113..=117)),
        ("pcmu", "mp4a.40.2", "pcm_mulaw", ("", 0..=0, "0,", 138..=143)),
    ] {
        let hls = relay.url(&format!("/v1/sessions/{path}/hls/index.m3u8"));
        let listed = || String::from_utf8_lossy(&get_bytes(&hls, None).1).into_owned();
        assert!(
            wait_for(Duration::from_secs(10), || listed().contains(&format!("CODECS=\"{codecs}\""))),
            "{}",
            listed()
        );
        let probe = |url: &str| {
            let out = Command::new("timeout")
                .args(["20", "ffprobe", "-v", "error", "-select_streams", "a", "-show_entries", "stream=codec_name"])
                .args(["-of", "csv=p=0", url])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_string()
        };
        assert_eq!(probe(&format!("rtsp://{rtsp}/{path}")), audio, "over RTSP");
        // The 440 Hz tone over HTTP TS and HLS (G.711 as AAC), HTTP TS and HTTP-FLV (MP3).
        let stream = relay.url(&format!("/v1/sessions/{path}/stream"));
        let (heard, urls) = match path {
            "pcmu" => ("aac", [hls.clone(), stream]),
            _ => ("mp3", [stream, relay.url(&format!("/{path}.flv"))]),
        };
        for url in urls {
            let (codec, hz) = tone_of(&url);
            assert!(codec == heard && (hz - 440.0).abs() < 15.0, "{url}: {codec} at {hz} Hz");
        }
        if path == "mp3" {
            assert_eq!(probe(&hls), audio, "over HLS");
        }
        let out = Command::new("timeout")
            .args(["30", "ffmpeg", "-nostdin", "-loglevel", "error", "-i", &hls, "-t", "3", "-f", "framemd5", "-"])
            .output()
            .unwrap();
        let md5 = String::from_utf8_lossy(&out.stdout);
        assert!(out.stderr.is_empty(), "{path}: {}", String::from_utf8_lossy(&out.stderr));
        let (video, video_count, sound, sound_count) = frames.clone();
        let count = |stream: &str| md5.lines().filter(|l| !stream.is_empty() && l.starts_with(stream)).count();
        assert!(video_count.contains(&count(video)) && sound_count.contains(&count(sound)), "{path}: {md5}");
    }
    // The recordings, once the publishers have gone.
    drop((_mp3, _pcmu));
    for (path, streams) in [("mp3", vec!["h264", "mp3"]), ("pcmu", vec!["aac"])] {
        let files = || {
            relay.ok("GET", &format!("/v1/recordings/{path}"), None)["files"].as_array().cloned().unwrap_or_default()
        };
        assert!(wait_for(Duration::from_secs(20), || files().iter().any(|f| f["writing"] == false)), "{:?}", files());
        let file = on_disk(&dir, &files()[0]);
        let out = Command::new("ffprobe")
            .args(["-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0", &file])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().collect::<Vec<_>>(), streams);
        let out =
            Command::new("ffmpeg").args(["-nostdin", "-v", "error", "-i", &file, "-f", "null", "-"]).output().unwrap();
        assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
