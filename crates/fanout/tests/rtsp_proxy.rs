//! Sessions with an `rtsp://` source: the relay is an RTSP client of an upstream and serves
//! its clients from one upstream session. A scripted upstream (a thread here) plays the
//! faults a real one has: it restarts, changes SSRC, sends garbage, refuses UDP or sends
//! nothing over it.

mod common;
use common::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SDP: &str = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=fake\r\nt=0 0\r\nm=video 0 RTP/AVP 33\r\na=rtpmap:33 MP2T/90000\r\na=control:trackID=0\r\n";

/// What the scripted upstream does.
#[derive(Clone, Copy)]
enum Script {
    /// TCP interleaved. First connection: 50 packets (SSRC 0xA), garbage, 50 packets (SSRC
    /// 0xB), then it hangs up. Every later connection: 50 packets (SSRC 0xC), then it waits.
    RestartAndGarbage,
    /// Answers a UDP SETUP with 461; streams over TCP.
    RefuseUdp,
    /// Accepts UDP and sends nothing over it; streams over TCP.
    SilentUdp,
    /// TCP: 20 packets, then silence with the connection kept open, at every connection.
    Stall,
    /// As `SilentUdp`, but the first TCP connection hangs up after 50 packets: after the
    /// restart `auto` must try UDP and fall back to TCP again.
    SilentUdpThenRestart,
    /// Every request needs Digest credentials (user "cam", password "p@ss w"); TCP,
    /// 20 packets.
    RequireDigest,
}

/// Whether a request carries the right Digest answer for the scripted upstream's realm.
fn digest_ok(req: &fanout_proto::rtsp::Request) -> bool {
    let Some(auth) = req.headers.get("Authorization") else { return false };
    let field = |k: &str| auth.split(&format!("{k}=\"")).nth(1).and_then(|r| r.split('"').next());
    let want =
        fanout_proto::rtsp::digest_response("cam", "fake", "p@ss w", "n0nce", &req.method, field("uri").unwrap_or(""));
    auth.starts_with("Digest ") && field("username") == Some("cam") && field("response") == Some(want.as_str())
}

struct Fake {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    teardowns: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn rtp(ssrc: u32, seq: u16) -> Vec<u8> {
    let mut p = vec![0x80, 33];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&(u32::from(seq) * 3000).to_be_bytes());
    p.extend_from_slice(&ssrc.to_be_bytes());
    p.extend_from_slice(&[0x47; 188]);
    p
}

fn fake_upstream(script: Script) -> Fake {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (connections, teardowns, stop) = (Arc::default(), Arc::default(), Arc::new(AtomicBool::new(false)));
    let f = Fake { addr, connections: Arc::clone(&connections), teardowns: Arc::clone(&teardowns), stop: stop.clone() };
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(60);
        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
            let Ok((s, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let n = connections.fetch_add(1, Ordering::Relaxed);
            let (teardowns, stop) = (teardowns.clone(), stop.clone());
            std::thread::spawn(move || serve_fake(s, n, script, &teardowns, &stop));
        }
    });
    f
}

/// One upstream connection: answers requests in order; streams once PLAY is answered.
fn serve_fake(mut s: TcpStream, n: usize, script: Script, teardowns: &AtomicUsize, stop: &AtomicBool) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
    let end = Instant::now() + Duration::from_secs(60);
    let mut playing = false;
    let mut sent_phase = false;
    let mut tcp = false;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(_) => {}
        }
        while let Ok(Some((msg, used))) = fanout_proto::rtsp::parse(&buf, &fanout_proto::rtsp::Limits::default()) {
            buf.drain(..used);
            let fanout_proto::rtsp::Message::Request(req) = msg else { continue };
            let mut r = fanout_proto::rtsp::Response::new(200, req.headers.cseq());
            if matches!(script, Script::RequireDigest) && !digest_ok(&req) {
                r = fanout_proto::rtsp::Response::new(401, req.headers.cseq());
                r.headers.set("WWW-Authenticate", "Digest realm=\"fake\", nonce=\"n0nce\"");
                let mut out = Vec::new();
                r.write(&mut out);
                s.write_all(&out).unwrap();
                continue;
            }
            match req.method.as_str() {
                "OPTIONS" => r.headers.set("Public", "OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN"),
                "DESCRIBE" => {
                    r.headers.set("Content-Base", format!("{}/", req.uri));
                    r.headers.set("Content-Type", "application/sdp");
                    r.body = SDP.as_bytes().to_vec();
                }
                "SETUP" => {
                    let t = req.headers.get("Transport").unwrap_or("").to_string();
                    tcp = t.contains("TCP");
                    if t.contains("client_port") && matches!(script, Script::RefuseUdp) {
                        r = fanout_proto::rtsp::Response::new(461, req.headers.cseq());
                    } else {
                        r.headers.set("Transport", format!("{t};server_port=9-10"));
                        r.headers.set("Session", "f00d;timeout=60");
                    }
                }
                "PLAY" => playing = true,
                "TEARDOWN" => {
                    teardowns.fetch_add(1, Ordering::Relaxed);
                    playing = false;
                }
                _ => r = fanout_proto::rtsp::Response::new(405, req.headers.cseq()),
            }
            let mut out = Vec::new();
            r.write(&mut out);
            s.write_all(&out).unwrap();
        }
        if playing && !sent_phase {
            sent_phase = true;
            // Give the proxy's clients time to join after the upstream plays.
            std::thread::sleep(Duration::from_millis(700));
            let frame = |s: &mut TcpStream, data: &[u8]| {
                let mut out = Vec::new();
                fanout_proto::rtsp::write_interleaved(&mut out, 0, data);
                s.write_all(&out).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            };
            match (script, n) {
                (Script::RestartAndGarbage, 0) => {
                    (0..50).for_each(|i| frame(&mut s, &rtp(0xA, 1000 + i)));
                    frame(&mut s, b"garbage");
                    let mut wrong_pt = rtp(0xA, 1050);
                    wrong_pt[1] = 99;
                    frame(&mut s, &wrong_pt);
                    (0..50).for_each(|i| frame(&mut s, &rtp(0xB, 7 + i)));
                    return; // hang up: the proxy reconnects
                }
                (Script::RestartAndGarbage, _) => (0..50).for_each(|i| frame(&mut s, &rtp(0xC, 40_000 + i))),
                (Script::RequireDigest, _) => (0..20).for_each(|i| frame(&mut s, &rtp(0xF, i))),
                (Script::Stall, n) => (0..20).for_each(|i| frame(&mut s, &rtp(0xE0 + n as u32, 500 * n as u16 + i))),
                (Script::SilentUdpThenRestart, 1) if tcp => {
                    (0..50).for_each(|i| frame(&mut s, &rtp(0xD, i)));
                    return;
                }
                (Script::SilentUdpThenRestart, _) if tcp => (0..50).for_each(|i| frame(&mut s, &rtp(0xD, 50 + i))),
                // Over UDP it sends nothing at all.
                (Script::RefuseUdp | Script::SilentUdp, _) if tcp => (0..50).for_each(|i| frame(&mut s, &rtp(0xD, i))),
                _ => {}
            }
        }
    }
}

/// Reads RTP from a client's socket until `n` packets came or `limit` passed.
fn receive(sock: &UdpSocket, n: usize, limit: Duration) -> Vec<(u32, u16)> {
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let (mut got, mut buf) = (Vec::new(), [0u8; 2048]);
    let end = Instant::now() + limit;
    while got.len() < n && Instant::now() < end {
        if let Ok(k) = sock.recv(&mut buf) {
            let v = fanout_proto::rtp::RtpView::parse(&buf[..k]).expect("clients get RTP only");
            got.push((v.ssrc(), v.sequence_number()));
        }
    }
    got
}

fn start_with(upstream: SocketAddr, transport: &str) -> Relay {
    start_with_source(upstream, json!({ "rtsp_transport": transport }))
}

/// `extra`: source fields besides the URL (linger 1 s unless given).
fn start_with_source(upstream: SocketAddr, extra: serde_json::Value) -> Relay {
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let mut source = json!({ "rtsp": format!("rtsp://{upstream}/cam"), "linger_s": 1 });
    for (k, v) in extra.as_object().unwrap() {
        source[k] = v.clone();
    }
    let spec = json!({ "name": "cam", "source": source });
    relay.ok("POST", "/v1/sessions", Some(spec));
    relay
}

/// The upstream restarts, changes SSRC and slips in garbage: the client sees one SSRC and
/// sequence numbers without a gap from the one RTP-Info announced; the garbage is counted
/// and dropped; after the client leaves, the upstream is torn down a linger later.
#[test]
fn clients_see_one_stream_across_upstream_restarts_and_ssrc_changes() {
    let fake = fake_upstream(Script::RestartAndGarbage);
    let relay = start_with(fake.addr, "tcp");
    assert_eq!(fake.connections.load(Ordering::Relaxed), 0, "on demand: no upstream before a client");
    let mut p = rtsp_play(rtsp_addr(&relay), "cam", None);
    assert!(p.sdp.contains("a=rtpmap:33 MP2T/90000") && p.sdp.contains("a=control:trackID=0"), "{}", p.sdp);
    let got = receive(&p.rtp, 150, Duration::from_secs(20));
    let status = relay.ok("GET", "/v1/sessions/cam", None);
    assert_eq!(got.len(), 150, "50 + 50 + 50 packets; got {}: {status}", got.len());
    let ssrc = got[0].0;
    assert!(got.iter().all(|(s, _)| *s == ssrc), "one SSRC for the client");
    let want: Vec<u16> = (0..150).map(|k| p.seq.wrapping_add(k)).collect();
    assert_eq!(got.iter().map(|x| x.1).collect::<Vec<_>>(), want, "RTP-Info's sequence number first, no gap");
    let up = &status["upstream"];
    assert_eq!(up["tracks"][0]["dropped"], 2, "garbage and a wrong payload type are dropped: {up}");
    assert_eq!(up["tracks"][0]["breaks"], 2, "an SSRC change and a reconnect: {up}");
    assert!(up["connects"].as_u64() >= Some(2), "{up}");

    // The client leaves: one linger (1 s) later the upstream session is torn down.
    let url = format!("rtsp://{}/cam", rtsp_addr(&relay));
    p.conn
        .write_all(format!("TEARDOWN {url} RTSP/1.0\r\nCSeq: 9\r\nSession: {}\r\n\r\n", p.session).as_bytes())
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(8), || fake.teardowns.load(Ordering::Relaxed) == 1),
        "the upstream should get TEARDOWN after the linger"
    );
    assert!(
        wait_for(Duration::from_secs(3), || relay.ok("GET", "/v1/sessions/cam", None)["upstream"]["state"] == "idle")
    );
}

/// An upstream that stops sending but keeps its connection open is reconnected after
/// `timeout_s`; the client's stream goes on without a gap.
#[test]
fn a_silent_upstream_is_reconnected() {
    let fake = fake_upstream(Script::Stall);
    let relay = start_with_source(fake.addr, json!({ "rtsp_transport": "tcp", "timeout_s": 1.5 }));
    let p = rtsp_play(rtsp_addr(&relay), "cam", None);
    let got = receive(&p.rtp, 40, Duration::from_secs(15));
    let up = relay.ok("GET", "/v1/sessions/cam", None)["upstream"].clone();
    assert_eq!(got.len(), 40, "{up}");
    let want: Vec<u16> = (0..40).map(|k| p.seq.wrapping_add(k)).collect();
    assert_eq!(got.iter().map(|x| x.1).collect::<Vec<_>>(), want);
    assert!(up["connects"].as_u64() >= Some(2), "{up}");
    assert!(up["last_error"].as_str().is_some_and(|e| e.contains("no RTP")), "{up}");
    assert_eq!(up["last_error_origin"], "io", "{up}");
}

/// An upstream that wants Digest credentials gets them from the URL (percent-encoded
/// there), and the status API shows the URL without them.
#[test]
fn upstream_credentials_from_the_url() {
    let fake = fake_upstream(Script::RequireDigest);
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let url = format!("rtsp://cam:p%40ss%20w@{}/cam", fake.addr);
    relay.ok(
        "POST",
        "/v1/sessions",
        Some(json!({ "name": "cam", "source": { "rtsp": url, "rtsp_transport": "tcp" } })),
    );
    let p = rtsp_play(rtsp_addr(&relay), "cam", None);
    assert_eq!(receive(&p.rtp, 20, Duration::from_secs(10)).len(), 20);
    let status = relay.ok("GET", "/v1/sessions/cam", None);
    let shown = status.to_string();
    assert!(!shown.contains("p%40ss") && !shown.contains("p@ss"), "credentials leak into the API: {shown}");
    assert_eq!(status["spec"]["source"]["rtsp"], format!("rtsp://{}/cam", fake.addr));
    // A wrong password: the status says the upstream refused it, as an auth error.
    let url = format!("rtsp://cam:wrong@{}/cam", fake.addr);
    let spec = json!({ "name": "bad", "source": { "rtsp": url, "rtsp_transport": "tcp", "on_demand": false } });
    relay.ok("POST", "/v1/sessions", Some(spec));
    let refused = wait_for(Duration::from_secs(10), || {
        relay.ok("GET", "/v1/sessions/bad", None)["upstream"]["last_error_origin"] == "auth"
    });
    assert!(refused, "{}", relay.ok("GET", "/v1/sessions/bad", None)["upstream"]);
}

/// `auto` transport: an upstream that refuses UDP (461), and one that accepts it but sends
/// nothing over it, are both played over TCP interleaved.
#[test]
fn auto_transport_falls_back_to_tcp() {
    for script in [Script::RefuseUdp, Script::SilentUdp] {
        let fake = fake_upstream(script);
        let relay = start_with(fake.addr, "auto");
        let p = rtsp_play(rtsp_addr(&relay), "cam", None);
        let got = receive(&p.rtp, 10, Duration::from_secs(15));
        let up = relay.ok("GET", "/v1/sessions/cam", None)["upstream"].clone();
        assert!(got.len() >= 10, "{up}");
        assert_eq!(up["transport"], "tcp", "{up}");
        assert!(up["last_error"].as_str().is_some_and(|e| e.contains("switched to TCP")), "{up}");
    }
}

/// `auto` after an upstream restart: UDP is tried again, brings nothing, and the proxy falls
/// back to TCP again (it used to stay on UDP for ever: the UDP probe counted the packets of
/// the earlier connection).
#[test]
fn auto_transport_falls_back_again_after_a_restart() {
    let fake = fake_upstream(Script::SilentUdpThenRestart);
    let relay = start_with(fake.addr, "auto");
    let p = rtsp_play(rtsp_addr(&relay), "cam", None);
    let got = receive(&p.rtp, 100, Duration::from_secs(25));
    let up = relay.ok("GET", "/v1/sessions/cam", None)["upstream"].clone();
    assert_eq!(got.len(), 100, "50 packets before the restart and 50 after: {up}");
    assert_eq!(up["transport"], "tcp", "{up}");
    assert!(fake.connections.load(Ordering::Relaxed) >= 4, "UDP, TCP, UDP, TCP: {up}");
}

/// fanout proxies fanout over UDP: RTP comes from the address the RTSP server is bound to
/// (127.0.0.2 here), which is where the proxy's upstream client accepts it from.
#[test]
fn fanout_proxies_fanout_over_udp_from_a_non_default_address() {
    let origin = Relay::start(&["--rtsp", "127.0.0.2:0"]);
    let origin_rtsp = rtsp_addr(&origin);
    assert_eq!(origin_rtsp.ip().to_string(), "127.0.0.2");
    let edge = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    let source = json!({ "rtsp": format!("rtsp://{origin_rtsp}/demo"), "rtsp_transport": "udp", "linger_s": 1 });
    edge.ok("POST", "/v1/sessions", Some(json!({ "name": "cam", "source": source })));
    let p = rtsp_play(rtsp_addr(&edge), "cam", None);
    let got = receive(&p.rtp, 50, Duration::from_secs(15));
    let up = edge.ok("GET", "/v1/sessions/cam", None)["upstream"].clone();
    assert_eq!(got.len(), 50, "RTP through two relays over UDP: {up}");
    assert_eq!(up["transport"], "udp", "{up}");
}

/// Bad sources are refused with the field named.
#[test]
fn bad_rtsp_sources_are_refused() {
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
    for (source, words) in [
        (json!({ "rtsp": "http://x/" }), "rtsp"),
        (json!({ "rtsp": "rtsp://h:notaport/" }), "port"),
        (json!({ "rtsp": "rtsp://h/", "rtsp_transport": "quic" }), "rtsp_transport"),
        (json!({ "udp": "127.0.0.1:0", "linger_s": 3 }), "only apply"),
    ] {
        let (code, body) = relay.call("POST", "/v1/sessions", Some(json!({ "name": "x", "source": source })));
        assert!(code == 400 || code == 422, "{source}: {code} {body}");
        assert!(body.to_string().contains(words), "{source}: {body}");
    }
}

/// Readers' keyframe requests reach the camera, coalesced: an RTSP client of an edge sends
/// a PLI every 150 ms for 3 s; the edge asks its upstream (here an origin relay, which counts
/// what it is asked) at most once a second, over UDP and interleaved.
#[test]
fn keyframe_requests_go_upstream_at_most_once_a_second() {
    let origin = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    let upstream = rtsp_addr(&origin);
    // What the origin's clients asked for (the first round's edge stays a client over UDP
    // until its RTSP session times out).
    let at_origin = || -> u64 {
        let clients = origin.ok("GET", "/v1/rtsp", None)["clients"].as_array().cloned().unwrap_or_default();
        clients.iter().filter_map(|c| c["keyframe_requests"].as_u64()).sum()
    };
    for transport in ["udp", "tcp"] {
        let before = at_origin();
        let edge = Relay::start(&["--rtsp", "127.0.0.1:0", "--no-demo"]);
        let source = json!({ "rtsp": format!("rtsp://{upstream}/demo"), "rtsp_transport": transport });
        edge.ok("POST", "/v1/sessions", Some(json!({ "name": "cam", "source": source })));
        let rtcp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let p = rtsp_play(rtsp_addr(&edge), "cam", Some(rtcp.local_addr().unwrap().port()));
        let server_rtcp = p.server_rtcp();
        // The SSRC this client is sent (its PLI names it).
        p.rtp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 2048];
        let n = p.rtp.recv(&mut b).expect("RTP from the edge");
        let ssrc = fanout_proto::rtp::RtpView::parse(&b[..n]).unwrap().ssrc();
        let t0 = Instant::now();
        for _ in 0..20 {
            let mut pli = Vec::new();
            fanout_proto::rtp::rtcp::write_keyframe_request(&mut pli, 0x1234, ssrc);
            rtcp.send_to(&pli, ("127.0.0.1", server_rtcp)).unwrap();
            std::thread::sleep(Duration::from_millis(150));
        }
        let secs = t0.elapsed().as_secs_f64();
        let client = &edge.ok("GET", "/v1/rtsp", None)["clients"][0];
        assert_eq!(client["keyframe_requests"], 20, "{client}");
        let asked = || edge.ok("GET", "/v1/sessions/cam", None)["upstream"]["tracks"][0]["keyframes_asked"].as_u64();
        std::thread::sleep(Duration::from_millis(1200));
        let asked = asked().unwrap_or(0);
        eprintln!("{transport}: 20 PLIs in {secs:.1} s, {asked} passed upstream");
        assert!(
            (2..=secs as u64 + 2).contains(&asked),
            "{transport}: {asked} keyframe requests upstream in {secs:.1} s"
        );
        // The origin read every one from its client, the edge (over UDP or its RTCP channel).
        assert!(
            wait_for(Duration::from_secs(3), || at_origin() == before + asked),
            "{transport}: the origin counted {} of {asked}",
            at_origin()
        );
    }
}
