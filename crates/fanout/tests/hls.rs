//! HLS with fMP4 segments (issue 16), and with MPEG-TS segments (issue 53): the demo and RTP
//! video sessions play in ffmpeg (and GStreamer) from their playlist; the files carry the headers an HTTP cache needs; a client that asks ahead
//! waits for the segment (blocking playlist reload); sessions HLS cannot carry say why.

mod common;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// GET `path`: status, the named headers, and the body.
fn get(relay: &Relay, path: &str, headers: &[&str]) -> (u16, Vec<Option<String>>, Vec<u8>) {
    let r = match ureq::get(&relay.url(path)).timeout(Duration::from_secs(20)).call() {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    let (status, hs) = (r.status(), headers.iter().map(|h| r.header(h).map(str::to_string)).collect());
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut r.into_reader(), &mut body).unwrap();
    (status, hs, body)
}

#[test]
fn the_demo_plays_over_hls() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::start(&[]);
    // 6 s of it, audio and video, without a decoder complaint.
    let out = std::process::Command::new("timeout")
        .args(["40", "ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-stats", "-i"])
        .arg(relay.url("/v1/sessions/demo/hls/index.m3u8"))
        .args(["-t", "6", "-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let frames = decoded_frames(&log);
    assert!(frames >= 145, "6 s at 25 fps: {frames} frames: {log}");
    let complaints: Vec<&str> = log.lines().filter(|l| l.starts_with('[')).collect();
    assert!(complaints.is_empty(), "{complaints:?}");
    let probe = std::process::Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
        .arg(relay.url("/v1/sessions/demo/hls/index.m3u8"))
        .output()
        .unwrap();
    // (ffprobe lists HLS streams twice: in the program and alone.)
    let mut codecs: Vec<String> = String::from_utf8_lossy(&probe.stdout).split_whitespace().map(String::from).collect();
    codecs.sort();
    codecs.dedup();
    assert_eq!(codecs, ["aac", "h264"]);

    // A new player gets a multivariant playlist that names it in its media playlist's URL.
    let (status, h, body) = get(&relay, "/v1/sessions/demo/hls/index.m3u8", &["content-type", "cache-control"]);
    let multivariant = String::from_utf8(body).unwrap();
    assert_eq!(
        (status, h[0].as_deref(), h[1].as_deref()),
        (200, Some("application/vnd.apple.mpegurl"), Some("no-cache"))
    );
    assert!(
        multivariant.contains("#EXT-X-STREAM-INF:BANDWIDTH=")
            && multivariant.contains("CODECS=\"avc1.640015,mp4a.40.2\"")
    );
    let media = multivariant.lines().find(|l| l.starts_with("index.m3u8?player=")).expect("a media playlist URI");
    // The files' URLs do not carry the name: every player asks for the same ones, which a
    // cache serves. The playlist is not cached, a segment is for good.
    let (status, h, body) = get(&relay, &format!("/v1/sessions/demo/hls/{media}"), &["cache-control"]);
    let playlist = String::from_utf8(body).unwrap();
    assert_eq!((status, h[0].as_deref()), (200, Some("no-cache")));
    assert!(playlist.contains("#EXT-X-MAP:URI=\"init.mp4\"") && !playlist.contains("player="), "{playlist}");
    let last: u64 = playlist.lines().filter_map(|l| l.strip_suffix(".m4s")).next_back().unwrap().parse().unwrap();
    let (status, h, seg) = get(&relay, &format!("/v1/sessions/demo/hls/{last}.m4s"), &["cache-control", "etag"]);
    assert_eq!((status, h[0].as_deref()), (200, Some("public, max-age=3600, immutable")), "{playlist}");
    assert!(h[1].is_some() && &seg[4..8] == b"moof");
    let (status, _, init) = get(&relay, "/v1/sessions/demo/hls/init.mp4", &[]);
    assert_eq!((status, &init[4..8]), (200, &b"ftyp"[..]));

    // Blocking reload: asking for the next segment waits until it is there (about 2 s).
    let t = Instant::now();
    let (status, _, body) = get(&relay, &format!("/v1/sessions/demo/hls/index.m3u8?_HLS_msn={}", last + 1), &[]);
    let waited = t.elapsed();
    assert_eq!(status, 200);
    assert!(String::from_utf8(body).unwrap().contains(&format!("\n{}.m4s\n", last + 1)), "after {waited:?}");
    assert!(waited > Duration::from_millis(200) && waited < Duration::from_secs(5), "{waited:?}");
    // A segment long gone, and one far ahead: clear answers.
    let (status, _, body) = get(&relay, "/v1/sessions/demo/hls/5.m4s", &[]);
    assert!(status == 404 && String::from_utf8_lossy(&body).contains("not in the window"), "{status}");
    let (status, _, _) = get(&relay, &format!("/v1/sessions/demo/hls/index.m3u8?_HLS_msn={}", last + 100), &[]);
    assert_eq!(status, 400);
    // Low-Latency HLS: the playlist lists parts and hints the next one, which a player may
    // ask for before it exists: the request is held until it does (at most a part later).
    let (_, _, body) = get(&relay, "/v1/sessions/demo/hls/index.m3u8?player=ll", &[]);
    let playlist = String::from_utf8(body).unwrap();
    assert!(playlist.contains("#EXT-X-PART-INF:PART-TARGET=0.500\n"), "{playlist}");
    assert!(playlist.contains("CAN-BLOCK-RELOAD=YES"), "{playlist}");
    let hint = playlist.lines().find_map(|l| l.strip_prefix("#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"")).expect("a hint");
    let hint = hint.trim_end_matches('"').to_string();
    let t = Instant::now();
    let (status, h, part) = get(&relay, &format!("/v1/sessions/demo/hls/{hint}"), &["cache-control"]);
    let waited = t.elapsed();
    assert_eq!((status, h[0].as_deref()), (200, Some("public, max-age=3600, immutable")), "{hint}");
    assert!(&part[4..8] == b"moof" && waited < Duration::from_millis(1500), "{hint} after {waited:?}");
    // A blocking reload for the part after it returns a playlist that lists it.
    let (seq, k) = hint.trim_end_matches(".m4s").split_once('.').unwrap();
    let (seq, k): (u64, usize) = (seq.parse().unwrap(), k.parse().unwrap());
    let (status, _, body) =
        get(&relay, &format!("/v1/sessions/demo/hls/index.m3u8?_HLS_msn={seq}&_HLS_part={}", k + 1), &[]);
    let playlist = String::from_utf8(body).unwrap();
    let next_listed =
        playlist.contains(&format!("URI=\"{seq}.{}.m4s\"", k + 1)) || playlist.contains(&format!("\n{seq}.m4s\n"));
    assert!(status == 200 && next_listed, "{playlist}");
    // The status shows the HLS side of the repackaging, with its players: the two named
    // here ("ll" and the multivariant's), and ffmpeg's and ffprobe's if they asked for
    // something within the last 10 s.
    let st = relay.ok("GET", "/v1/sessions/demo", None);
    assert_eq!(st["repackaging"]["hls"]["codecs"], "avc1.640015,mp4a.40.2", "{st}");
    let players = st["repackaging"]["hls"]["players"].as_u64().unwrap();
    assert!((2..=4).contains(&players), "{st}");
    // And so do the metrics.
    let (_, _, metrics) = get(&relay, "/metrics", &[]);
    let metrics = String::from_utf8(metrics).unwrap();
    let line = metrics.lines().find(|l| l.starts_with("fanout_hls_players{session=\"demo\"} ")).expect("a gauge");
    let gauge: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((2..=4).contains(&gauge), "{line}");
    // A name that could not go back into a URL is refused.
    let (status, _, _) = get(&relay, "/v1/sessions/demo/hls/index.m3u8?player=a%20b", &[]);
    assert_eq!(status, 400);
}

/// `hls_variant = "mpegts"` (issue 53): HLS for players without fMP4. The playlists are
/// version 3 with `.ts` segments and no map; each segment decodes on its own from a keyframe,
/// holds the pictures its `#EXTINF` says, and the next one goes on from the picture after
/// its last (ffprobe, frame for frame); ffmpeg plays it, and GStreamer's hlsdemux takes out
/// every picture, 40 ms after the one before.
#[test]
fn hls_with_mpeg_ts_segments_plays_frame_for_frame_in_ffmpeg_and_gstreamer() {
    if !have_ffmpeg() || !have_gstreamer() {
        return;
    }
    let config = "[[session]]\nname = \"iptv\"\nsource = { demo = true }\nhls_variant = \"mpegts\"\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let (status, _, body) = get(&relay, "/v1/sessions/iptv/hls/index.m3u8", &[]);
    let multivariant = String::from_utf8(body).unwrap();
    assert!(status == 200 && multivariant.contains("#EXT-X-VERSION:3\n"), "{multivariant}");
    // Three segments in a row, each complete in the window.
    let (status, _, body) = get(&relay, "/v1/sessions/iptv/hls/index.m3u8?player=p", &[]);
    assert_eq!(status, 200);
    let mut playlist = String::from_utf8(body).unwrap();
    let listed = |p: &str| -> Vec<(f64, String)> {
        let lines: Vec<&str> = p.lines().collect();
        lines
            .windows(2)
            .filter_map(|w| {
                Some((w[0].strip_prefix("#EXTINF:")?.trim_end_matches(',').parse().ok()?, w[1].to_string()))
            })
            .collect()
    };
    let t = Instant::now();
    while listed(&playlist).len() < 3 && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(500));
        playlist = String::from_utf8(get(&relay, "/v1/sessions/iptv/hls/index.m3u8?player=p", &[]).2).unwrap();
    }
    assert!(playlist.starts_with("#EXTM3U\n#EXT-X-VERSION:3\n"), "{playlist}");
    assert!(!playlist.contains("EXT-X-MAP") && !playlist.contains("EXT-X-PART"), "{playlist}");
    let segments = listed(&playlist);
    assert!(segments.len() >= 3 && segments.iter().all(|(_, f)| f.ends_with(".ts")), "{playlist}");
    let dir = std::env::temp_dir().join(format!("fanout-hls-ts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut last_pts: Option<f64> = None;
    for (extinf, file) in &segments[segments.len() - 3..] {
        let (status, h, data) = get(&relay, &format!("/v1/sessions/iptv/hls/{file}"), &["content-type"]);
        assert_eq!((status, h[0].as_deref()), (200, Some("video/mp2t")), "{file}");
        assert!(data.len() % 188 == 0 && data[0] == 0x47, "{file}: transport packets");
        let path = dir.join(file);
        std::fs::write(&path, &data).unwrap();
        let probe = std::process::Command::new("ffprobe")
            .args([
                "-v",
                "error",
                "-select_streams",
                "v",
                "-show_entries",
                "frame=pts_time,key_frame",
                "-of",
                "csv=p=0",
            ])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&probe.stderr);
        assert!(probe.status.success() && err.trim().is_empty(), "{file}: {err}");
        let frames: Vec<(bool, f64)> = String::from_utf8_lossy(&probe.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split(',');
                Some((f.next()? == "1", f.next()?.parse().ok()?))
            })
            .collect();
        assert!(frames.first().is_some_and(|f| f.0), "{file} starts at a keyframe: {frames:?}");
        assert_eq!(frames.len(), (extinf * 25.0).round() as usize, "{file}: #EXTINF:{extinf} at 25 fps");
        if let Some(prev) = last_pts {
            assert!((frames[0].1 - prev - 0.04).abs() < 0.002, "{file} goes on from {prev}: {}", frames[0].1);
        }
        last_pts = frames.last().map(|f| f.1);
    }
    let (status, _, why) = get(&relay, "/v1/sessions/iptv/hls/init.mp4", &[]);
    assert!(status == 404 && String::from_utf8_lossy(&why).contains("MPEG-TS"), "{status}");
    let (status, _, _) = get(&relay, &format!("/v1/sessions/iptv/hls/{}", segments[0].1.replace(".ts", ".m4s")), &[]);
    assert_eq!(status, 404);

    // ffmpeg plays 6 s of it without a complaint.
    let url = relay.url("/v1/sessions/iptv/hls/index.m3u8");
    let out = std::process::Command::new("timeout")
        .args(["40", "ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-stats", "-i", &url])
        .args(["-t", "6", "-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && decoded_frames(&log) >= 145, "{log}");
    assert!(log.lines().all(|l| !l.starts_with('[')), "{log}");

    // GStreamer's hlsdemux: what it takes out of the segments, remuxed to a file, holds every
    // picture 40 ms after the one before, and decodes. (Counted in the file: gst-launch's
    // -v prints of a sink's last buffer skip some on a busy machine.)
    let out = dir.join("gst.ts");
    let mut gst = std::process::Command::new("timeout");
    gst.args(["-s", "INT", "10", "gst-launch-1.0"]).args(
        format!(
            "souphttpsrc location={url} ! hlsdemux ! tsdemux name=d d. ! queue ! h264parse ! mpegtsmux name=m \
             ! filesink location={} d. ! queue ! aacparse ! m.",
            out.display()
        )
        .split_whitespace(),
    );
    let log = Gst::spawn(gst).log();
    let errors = gst_errors_while_playing(&log);
    assert!(errors.is_empty(), "{errors:#?}\n{log}");
    let probe = |what: &str| {
        let o = std::process::Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", what, "-show_entries", "packet=pts_time", "-of", "csv=p=0"])
            .arg(&out)
            .output()
            .unwrap();
        let pts: Vec<u64> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split(',').next()?.parse::<f64>().ok())
            .map(|t| (t * 1000.0).round() as u64)
            .collect();
        pts
    };
    let pts = probe("v");
    assert!(pts.len() >= 100, "{} pictures in about 8 s: {log}", pts.len());
    let steps: Vec<u64> = pts.windows(2).map(|w| w[1] - w[0]).filter(|&d| d != 40).collect();
    assert!(steps.is_empty(), "pictures not 40 ms apart: {steps:?}");
    assert!(!probe("a").is_empty(), "no audio");
    let decode = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-nostdin", "-i"])
        .arg(&out)
        .args(["-f", "null", "-"])
        .output()
        .unwrap();
    assert!(decode.status.success() && decode.stderr.is_empty(), "{}", String::from_utf8_lossy(&decode.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// HLS asks for the token like the stream URL, and its playlist passes it on to the files.
#[test]
fn hls_takes_the_token_in_the_url() {
    let relay = Relay::start(&["--token", "s3cret"]);
    let (status, _, _) = get(&relay, "/v1/sessions/demo/hls/index.m3u8", &[]);
    assert_eq!(status, 401);
    let (status, _, body) = get(&relay, "/v1/sessions/demo/hls/index.m3u8?token=s3cret", &[]);
    let multivariant = String::from_utf8(body).unwrap();
    assert_eq!(status, 200, "{multivariant}");
    let media = multivariant.lines().find(|l| l.starts_with("index.m3u8?player=")).expect("a media playlist URI");
    assert!(media.ends_with("&token=s3cret"), "{multivariant}");
    let (status, _, body) = get(&relay, &format!("/v1/sessions/demo/hls/{media}"), &[]);
    let playlist = String::from_utf8(body).unwrap();
    assert_eq!(status, 200, "{playlist}");
    assert!(playlist.contains("init.mp4?token=s3cret") && playlist.contains(".m4s?token=s3cret\n"), "{playlist}");
}

/// A session of unknown datagrams has nothing to segment: 415, saying why.
#[test]
fn sessions_hls_cannot_carry_say_why() {
    let relay = Relay::start(&["--no-demo"]);
    relay.ok("POST", "/v1/sessions", Some(json!({"name": "raw", "source": {"udp": "127.0.0.1:0"}})));
    let (status, _, body) = get(&relay, "/v1/sessions/raw/hls/index.m3u8", &[]);
    assert!(status == 415 && String::from_utf8_lossy(&body).contains("no known format"), "{status}");
    let (status, _, _) = get(&relay, "/v1/sessions/nope/hls/index.m3u8", &[]);
    assert_eq!(status, 404);
}
