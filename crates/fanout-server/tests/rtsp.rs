//! RTSP clients of relay sessions: a real client (ffmpeg) plays the demo over RTSP with RTP
//! over UDP, through the relay's own sinks; protocol errors get real servers' codes.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

fn rtsp_addr(relay: &Relay) -> SocketAddr {
    let e = relay.ok("GET", "/v1/engine", None);
    e["rtsp"].as_str().expect("the relay listens for RTSP").parse().unwrap()
}

fn start() -> Relay {
    Relay::start(&["--rtsp", "127.0.0.1:0"])
}

#[test]
fn ffmpeg_plays_the_demo_over_rtsp_and_its_sink_goes_with_it() {
    if !have_ffmpeg() {
        return;
    }
    let relay = start();
    let url = format!("rtsp://{}/demo", rtsp_addr(&relay));
    let out = Command::new("timeout")
        .args(["30", "ffmpeg", "-hide_banner", "-nostdin", "-rtsp_transport", "udp", "-i", &url])
        .args(["-t", "3", "-map", "0:v", "-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("Video: h264"), "{log}");
    let frames = decoded_frames(&log);
    assert!(frames >= 70, "decoded only {frames} frames: {log}");
    // ffmpeg sent TEARDOWN on exit: its UDP sink is gone.
    assert!(
        wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/sessions/demo", None)["sinks"] == 0),
        "the client's sink should be removed after TEARDOWN"
    );
}

fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    // Everything answered until the server goes quiet (the first read waits longer).
    let (mut got, mut buf) = (Vec::new(), vec![0u8; 4096]);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn protocol_errors_get_the_codes_real_servers_give() {
    let relay = start();
    let a = rtsp_addr(&relay);
    let url = format!("rtsp://{a}/demo");
    let ok = exchange(a, &format!("OPTIONS {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"));
    assert!(ok.starts_with("RTSP/1.0 200 OK\r\n") && ok.contains("Public: OPTIONS, DESCRIBE"), "{ok}");
    let cases = [
        (format!("DESCRIBE rtsp://{a}/nope RTSP/1.0\r\nCSeq: 2\r\n\r\n"), "404"),
        (format!("FROB {url} RTSP/1.0\r\nCSeq: 3\r\n\r\n"), "501"),
        (format!("SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 4\r\nTransport: RTP/AVP/TCP;interleaved=0-1\r\n\r\n"), "461"),
        (format!("PLAY {url} RTSP/1.0\r\nCSeq: 5\r\nSession: 1234\r\n\r\n"), "454"),
        (format!("OPTIONS {url} RTSP/2.0\r\nCSeq: 6\r\n\r\n"), "505"),
        (format!("OPTIONS {url} RTSP/1.0\r\nCSeq: 7\r\n{}\r\n\r\n", "X-Pad: y\r\n".repeat(2000)), "431"),
    ];
    for (req, code) in cases {
        let resp = exchange(a, &req);
        assert!(resp.starts_with(&format!("RTSP/1.0 {code} ")), "{req:.60}… answered {resp}");
    }
    // A pipelined pair on one connection: both answered, in order.
    let two =
        exchange(a, &format!("OPTIONS {url} RTSP/1.0\r\nCSeq: 8\r\n\r\nOPTIONS {url} RTSP/1.0\r\nCSeq: 9\r\n\r\n"));
    let (i, j) = (two.find("CSeq: 8").unwrap_or(usize::MAX), two.rfind("CSeq: 9").unwrap_or(0));
    assert!(i < j, "{two}");
}
