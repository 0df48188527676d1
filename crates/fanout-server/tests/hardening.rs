//! Defects found by new users and hostile peers (issue 13), each with the test that showed it.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Sends one byte of `request` every 200 ms (a slowloris client) until the server closes the
/// connection; returns how long that took and what the server said, or `None` if it was still
/// open after `limit`.
fn trickle(addr: SocketAddr, request: &str, limit: Duration) -> Option<(Duration, String)> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let t0 = Instant::now();
    let mut said = Vec::new();
    let mut bytes = request.bytes().cycle();
    while t0.elapsed() < limit {
        if s.write_all(&[bytes.next().unwrap()]).is_err() {
            return Some((t0.elapsed(), String::from_utf8_lossy(&said).into()));
        }
        let mut b = [0u8; 512];
        match s.read(&mut b) {
            Ok(0) => return Some((t0.elapsed(), String::from_utf8_lossy(&said).into())),
            Ok(n) => said.extend_from_slice(&b[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some((t0.elapsed(), String::from_utf8_lossy(&said).into())),
        }
    }
    None
}

/// Item 6: a request head must arrive whole within `request_timeout_s`. Slowloris clients on
/// every RTSP slot are closed (408), and a new client is served while they trickle on.
#[test]
fn slowloris_rtsp_clients_are_closed_at_the_head_deadline() {
    let relay = Relay::with_config("rtsp_max_connections = 3\nrtsp_idle_s = 60\nrequest_timeout_s = 1\n", &[]);
    let a = rtsp_addr(&relay);
    let slow: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                trickle(a, "OPTIONS * RTSP/1.0\r\nCSeq: 1\r\nX-Pad: aaaaaaaaaaaaaaaaaaaa", Duration::from_secs(8))
            })
        })
        .collect();
    for t in slow {
        let (took, said) = t.join().unwrap().expect("a trickling RTSP client was never closed");
        assert!(took < Duration::from_secs(4), "closed only after {took:?}");
        assert!(said.starts_with("RTSP/1.0 408 "), "{said:?}");
    }
    let mut c = TcpStream::connect(a).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"OPTIONS * RTSP/1.0\r\nCSeq: 2\r\n\r\n").unwrap();
    let mut b = [0u8; 256];
    let n = c.read(&mut b).unwrap();
    assert!(b[..n].starts_with(b"RTSP/1.0 200 "), "{:?}", String::from_utf8_lossy(&b[..n]));
}

/// Item 6 for the API: a trickled HTTP request head is closed at the deadline too.
#[test]
fn slowloris_api_clients_are_closed_at_the_head_deadline() {
    let relay = Relay::with_config("request_timeout_s = 1\n", &[]);
    for path in ["/v1/sessions", "/v1/sessions/demo/stream"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        let (took, _) =
            trickle(relay.api, &req, Duration::from_secs(8)).expect("a trickling API client was never closed");
        assert!(took < Duration::from_secs(4), "{path}: closed only after {took:?}");
    }
    // The API still answers.
    relay.ok("GET", "/v1/sessions", None);
}
