//! The built-in demo stream is real, decodable video for a real player.

mod common;
use common::*;

#[test]
fn ffmpeg_decodes_frames_from_the_demo_stream_over_http() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::start(&[]);
    let url = relay.url("/v1/sessions/demo/stream");
    // Decode 3 seconds of the live stream: the demo is paced, so this takes ~3 s.
    let (ok, log) = ffmpeg_decode(&url, &[], 3);
    assert!(ok, "{log}");
    assert!(log.contains("Video: h264"), "{log}");
    let frames = decoded_frames(&log);
    // 25 fps: 3 s of video. Subscribers start at the last keyframe, so nothing is lost to
    // waiting for one and the decoder never meets a picture without its parameter sets.
    assert!(frames >= 70, "decoded only {frames} frames: {log}");
    assert!(!log.contains("non-existing PPS"), "{log}");
    let mut http = relay.http_subscribe("demo");
    let mut first = vec![0u8; 1316];
    std::io::Read::read_exact(&mut http, &mut first).unwrap();
    assert!(fanout_proto::container::mpegts::starts_video_keyframe(&first), "an HTTP subscriber starts at a keyframe");
    let st = relay.ok("GET", "/v1/sessions/demo", None);
    assert!(st["source"]["packets"].as_u64().unwrap() > 50, "{st}");
}
