//! Real decoders after the relay: H.264 (SVC) and HEVC files packetized into RTP by
//! `fanout gen`, relayed by `fanout serve`, received and decoded by ffmpeg.

mod common;
use common::*;
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video");

fn decode_through_relay(file: &str, encoding: &str, datapath: &str) -> u64 {
    let relay = Relay::start(&["--no-demo"]);
    let src = create_on_free_port(&relay, json!({"name":"v","source":{"udp":"127.0.0.1:0"},"datapath":datapath}));
    // ffmpeg listens on an even port (and the next one for RTCP) named in an SDP file.
    let port = unephemeral_udp_port(true).port();
    let dir = std::env::temp_dir().join(format!("fanout-interop-{}-{encoding}-{datapath}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sdp = dir.join("in.sdp");
    std::fs::write(
        &sdp,
        format!(
            "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=fanout\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=video {port} RTP/AVP 96\r\na=rtpmap:96 {encoding}/90000\r\na=fmtp:96 packetization-mode=1\r\n"
        ),
    )
    .unwrap();
    let ffmpeg = Command::new("ffmpeg")
        .args(["-hide_banner", "-nostdin", "-protocol_whitelist", "file,udp,rtp", "-i"])
        .arg(&sdp)
        .args(["-f", "null", "-"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    relay.ok("POST", "/v1/sessions/v/sinks", Some(json!({"udp": format!("127.0.0.1:{port}")})));
    std::thread::sleep(Duration::from_millis(800));
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["gen", "--to", &src.to_string(), "--file", &format!("{DATA}/{file}"), "--fps", "50", "--duration", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_millis(500));
    // SIGINT: ffmpeg stops and prints its final statistics.
    unsafe { libc::kill(ffmpeg.id() as i32, libc::SIGINT) };
    let out = ffmpeg.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
    let frames = decoded_frames(&log);
    assert!(frames > 0, "{log}");
    frames
}

#[test]
fn ffmpeg_decodes_h264_svc_relayed_over_rtp() {
    if !have_ffmpeg() {
        return;
    }
    // 3 s at 50 fps = 150 access units of a 100-AU file (its IDR is the first): ffmpeg
    // decodes the base layer of every one after the first SPS/PPS it saw.
    for datapath in ["shared", "daemon"] {
        let frames = decode_through_relay("h264-svc/mediasoup_naluInfo.264", "H264", datapath);
        assert!(frames >= 100, "{datapath}: only {frames} frames decoded");
    }
}

#[test]
fn ffmpeg_decodes_hevc_relayed_over_rtp() {
    if !have_ffmpeg() {
        return;
    }
    let frames = decode_through_relay("hevc/x265_temporal_320x192.265", "H265", "shared");
    // 32-frame file with repeated headers and an IDR every 16 frames, looped ~4.7 times.
    assert!(frames >= 100, "only {frames} frames decoded");
}

/// An HEVC RTP session plays as HLS: fMP4 segments with `hvc1`/`hvcC` (parameter sets
/// from the stream's keyframes), decoded by ffmpeg without a complaint.
#[test]
fn an_hevc_session_plays_as_hls() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::start(&["--no-demo"]);
    let spec = json!({"name": "v", "source": {"udp": "127.0.0.1:0"}, "video": "h265"});
    let src = create_on_free_port(&relay, spec);
    let file = format!("{DATA}/hevc/x265_temporal_320x192.265");
    let gen = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["gen", "--to", &src.to_string(), "--file", &file, "--fps", "25", "--duration", "16"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = Command::new("timeout")
        .args(["30", "ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-stats", "-i"])
        .arg(relay.url("/v1/sessions/v/hls/index.m3u8"))
        .args(["-t", "4", "-f", "null", "-"])
        .output()
        .unwrap();
    let _ = gen.wait_with_output();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && decoded_frames(&log) >= 50, "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("[hevc @") || l.starts_with("[mov,")).collect();
    assert!(errors.is_empty(), "decoder errors: {errors:?}");
    // The codecs a player is told (RFC 6381): HEVC Main, from the stream's SPS.
    let status = relay.ok("GET", "/v1/sessions/v", None);
    let codecs = status["repackaging"]["hls"]["codecs"].as_str().unwrap_or("");
    assert!(codecs.starts_with("hvc1.1.6.L"), "{status}");
}

/// An RTP source with `video` set plays over HTTP as MPEG-TS: HEVC and H.264 (the SVC
/// stream's base layer) files sent by `fanout gen`, decoded by ffmpeg from the stream URL.
#[test]
fn rtp_video_sessions_play_over_http_as_mpegts() {
    if !have_ffmpeg() {
        return;
    }
    for (file, video) in [("hevc/x265_temporal_320x192.265", "h265"), ("h264-svc/openh264_2S3T_320x192.264", "h264")] {
        let relay = Relay::start(&["--no-demo"]);
        let spec = json!({"name": "v", "source": {"udp": "127.0.0.1:0"}, "video": video});
        let src = create_on_free_port(&relay, spec);
        let gen = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args([
                "gen",
                "--to",
                &src.to_string(),
                "--file",
                &format!("{DATA}/{file}"),
                "--fps",
                "25",
                "--duration",
                "6",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let (ok, log) = ffmpeg_decode(&relay.url("/v1/sessions/v/stream"), &["-loglevel", "error", "-stats"], 3);
        let _ = gen.wait_with_output();
        let frames = decoded_frames(&log);
        // 3 s at 25 fps, from the first keyframe the repackaging passed on.
        assert!(ok && frames >= 60, "{file}: {frames} frames: {log}");
        // The decoder's complaints (a missing parameter set: a start without the VPS); the
        // null muxer's about the order of times are gen's (it stamps in decoding order).
        let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("[hevc @") || l.starts_with("[h264 @")).collect();
        assert!(errors.is_empty(), "{file}: decoder errors: {errors:?}");
    }
}
