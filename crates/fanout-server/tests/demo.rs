//! The built-in demo stream is real, decodable video for a real player.

mod common;
use common::*;
use std::process::Command;

#[test]
fn ffmpeg_decodes_frames_from_the_demo_stream_over_http() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::start(&[]);
    let url = relay.url("/v1/sessions/demo/stream");
    // Decode 3 seconds of the live stream: the demo is paced, so this takes ~3 s.
    let out = Command::new("timeout")
        .args(["30", "ffmpeg", "-hide_banner", "-nostdin", "-i", &url, "-t", "3", "-map", "0:v", "-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("Video: h264"), "{log}");
    let frames = decoded_frames(&log);
    // 25 fps: 3 s of video, less what precedes the first keyframe.
    assert!(frames >= 40, "decoded only {frames} frames: {log}");
    let st = relay.ok("GET", "/v1/sessions/demo", None);
    assert!(st["source"]["packets"].as_u64().unwrap() > 50, "{st}");
}
