//! RTSP clients of relay sessions: a real client (ffmpeg) plays the demo over RTSP with RTP
//! over UDP, through the relay's own sinks; protocol errors get real servers' codes.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

fn start() -> Relay {
    Relay::start(&["--rtsp", "127.0.0.1:0"])
}

#[test]
fn ffmpeg_plays_the_demo_over_rtsp_and_its_sink_goes_with_it() {
    if !have_ffmpeg() {
        return;
    }
    plays_the_demo("udp");
}

/// ffmpeg decodes 3 s of the demo's video over RTSP with this transport; its TEARDOWN at
/// exit removes its sink.
fn plays_the_demo(transport: &str) {
    let relay = start();
    let url = format!("rtsp://{}/demo", rtsp_addr(&relay));
    let (ok, log) = ffmpeg_decode(&url, &["-rtsp_transport", transport], 3);
    assert!(ok, "{log}");
    assert!(log.contains("Video: h264"), "{log}");
    let frames = decoded_frames(&log);
    assert!(frames >= 70, "decoded only {frames} frames: {log}");
    assert!(
        wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/sessions/demo", None)["rtsp_tracks"][0]["sinks"] == 0),
        "the client's sink should be removed after TEARDOWN"
    );
}

/// The demo over RTSP has two tracks, H.264 and AAC: ffprobe names both, and ffmpeg
/// decodes 3 s of the audio without an error (48 kHz in 1024-sample frames: ~140 frames).
#[test]
fn the_demo_has_video_and_audio() {
    if !have_ffmpeg() {
        return;
    }
    let relay = start();
    let url = format!("rtsp://{}/demo", rtsp_addr(&relay));
    let probe = Command::new("timeout")
        .args([
            "20",
            "ffprobe",
            "-v",
            "error",
            "-rtsp_transport",
            "udp",
            "-show_entries",
            "stream=codec_name,sample_rate",
        ])
        .args(["-of", "csv", &url])
        .output()
        .unwrap();
    let streams = String::from_utf8_lossy(&probe.stdout);
    assert!(streams.contains("h264") && streams.contains("aac,48000"), "{streams}");
    let out = Command::new("timeout")
        .args(["30", "ffmpeg", "-nostdin", "-loglevel", "error", "-rtsp_transport", "udp", "-i", &url])
        .args(["-t", "3", "-map", "0:a", "-f", "framemd5", "-"])
        .output()
        .unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let frames = String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.starts_with('#')).count();
    assert!((120..=160).contains(&frames), "{frames} audio frames in 3 s");
}

/// RTP interleaved on the RTSP connection (`-rtsp_transport tcp`): ffmpeg decodes the demo,
/// and the client's sink goes when it leaves.
#[test]
fn ffmpeg_plays_the_demo_interleaved_over_tcp() {
    if !have_ffmpeg() {
        return;
    }
    plays_the_demo("tcp");
}

/// RTSP over HTTP (issue 53 item 8) on the API's port: ffmpeg (`-rtsp_transport http`) and
/// GStreamer (`rtsph://`) play the demo through a GET/POST tunnel, its client is listed
/// among the path's RTSP readers and goes when the tunnel closes; a POST no GET waits for
/// is 404, a cookie in use 409.
#[test]
fn rtsp_over_http_tunnels_play_in_ffmpeg_and_gstreamer() {
    if !have_ffmpeg() || !have_gstreamer() {
        return;
    }
    let relay = start();
    let url = format!("rtsp://{}/demo", relay.api);
    let (ok, log) = ffmpeg_decode(&url, &["-rtsp_transport", "http"], 3);
    assert!(ok && decoded_frames(&log) >= 70, "{log}");
    assert!(
        wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/sessions/demo", None)["rtsp_tracks"][0]["sinks"] == 0),
        "the tunnelled client's sink should go with it"
    );
    // GStreamer, with a reader listed meanwhile.
    let mut gst = Command::new("timeout");
    gst.args(["-s", "INT", "6", "gst-launch-1.0", "-v"]).args(
        format!("rtspsrc location=rtsph://{}/demo name=s s. ! rtph264depay ! h264parse ! openh264dec ! fakesink name=v silent=false sync=false", relay.api)
            .split(' '),
    );
    let gst = Gst::spawn(gst);
    let listed = wait_for(Duration::from_secs(5), || {
        relay
            .ok("GET", "/v1/sessions/demo/readers", None)
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x["protocol"] == "rtsp"))
    });
    let log = gst.log();
    assert!(listed, "no RTSP reader listed while GStreamer played");
    let errors = gst_errors_while_playing(&log);
    assert!(errors.is_empty(), "{errors:#?}\n{log}");
    let pictures = log.lines().filter(|l| l.contains("chain") && l.contains("(v:sink)")).count();
    assert!(pictures >= 50, "{pictures} pictures decoded in about 5 s: {log}");
    // A POST alone, and a second GET with a cookie in use.
    let half = |method: &str, cookie: &str| {
        let mut c = TcpStream::connect(relay.api).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(c, "{method} /demo HTTP/1.0\r\nx-sessioncookie: {cookie}\r\nContent-Length: 32767\r\n\r\n").unwrap();
        let mut head = [0u8; 12];
        let _ = c.read_exact(&mut head);
        (c, String::from_utf8_lossy(&head).into_owned())
    };
    assert!(half("POST", "lonely").1.starts_with("HTTP/1.1 404"));
    let (_waiting, first) = half("GET", "twice");
    assert!(first.starts_with("HTTP/1.0 200"), "{first}");
    assert!(half("GET", "twice").1.starts_with("HTTP/1.1 409"));
}

/// Interleaved by hand: `$`-frames on the channel SETUP named carry every packet from the
/// RTP-Info sequence number on; a frame on a channel nobody set up is ignored; the session
/// stays.
#[test]
fn interleaved_frames_carry_the_stream_without_a_gap() {
    let relay = start();
    let addr = rtsp_addr(&relay);
    let url = format!("rtsp://{addr}/demo");
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut pending: Vec<u8> = Vec::new();
    let next = |c: &mut TcpStream, pending: &mut Vec<u8>| loop {
        if let Some((m, used)) = fanout_proto::rtsp::parse(pending, &fanout_proto::rtsp::Limits::default()).unwrap() {
            pending.drain(..used);
            return m;
        }
        let mut b = [0u8; 8192];
        let n = c.read(&mut b).unwrap();
        assert!(n > 0, "connection closed");
        pending.extend_from_slice(&b[..n]);
    };
    let setup =
        format!("SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP/TCP;unicast;interleaved=4-5\r\n\r\n");
    c.write_all(setup.as_bytes()).unwrap();
    let fanout_proto::rtsp::Message::Response(r) = next(&mut c, &mut pending) else { panic!() };
    assert_eq!(r.status, 200);
    assert!(r.headers.get("Transport").unwrap().contains("interleaved=4-5"), "{r:?}");
    let session = r.headers.get("Session").unwrap().split(';').next().unwrap().to_string();
    c.write_all(format!("PLAY {url} RTSP/1.0\r\nCSeq: 2\r\nSession: {session}\r\n\r\n").as_bytes()).unwrap();
    let fanout_proto::rtsp::Message::Response(r) = next(&mut c, &mut pending) else { panic!() };
    let info = r.headers.get("RTP-Info").unwrap().to_string();
    let first: u16 = info.split(';').find_map(|f| f.strip_prefix("seq=")).unwrap().parse().unwrap();
    // Junk on a channel that was not set up: ignored, the stream goes on.
    let mut junk = Vec::new();
    fanout_proto::rtsp::write_interleaved(&mut junk, 9, b"junk");
    c.write_all(&junk).unwrap();
    let (mut got, mut sender_report) = (Vec::new(), false);
    let t = std::time::Instant::now();
    // 100 packets, and a sender report on the RTCP channel (one every 5 s).
    while got.len() < 100 || (!sender_report && t.elapsed() < Duration::from_secs(8)) {
        match next(&mut c, &mut pending) {
            fanout_proto::rtsp::Message::Interleaved { channel: 4, data } if got.len() < 100 => {
                got.push(fanout_proto::rtp::RtpView::parse(&data).expect("RTP").sequence_number());
            }
            fanout_proto::rtsp::Message::Interleaved { channel: 4, .. } => {}
            fanout_proto::rtsp::Message::Interleaved { channel: 5, data } => {
                let r = fanout_proto::rtp::rtcp::parse_reports(&data).expect("RTCP on the RTCP channel");
                sender_report |= r[0].sender && r[0].reporter == 0x4641_4e4f;
            }
            m => panic!("unexpected {m:?}"),
        }
    }
    assert!(sender_report, "a sender report on channel 5 within 8 s");
    let want: Vec<u16> = (0..100).map(|k| first.wrapping_add(k)).collect();
    assert_eq!(got, want);
    assert_eq!(relay.ok("GET", "/v1/sessions/demo", None)["rtsp_tracks"][0]["sinks"], 1);
    let c0 = &relay.ok("GET", "/v1/rtsp", None)["clients"][0];
    assert_eq!((c0["interleaved"].as_bool(), c0["playing"].as_bool()), (Some(true), Some(true)), "{c0}");
    // A keep-alive is answered between frames.
    c.write_all(format!("GET_PARAMETER {url} RTSP/1.0\r\nCSeq: 3\r\nSession: {session}\r\n\r\n").as_bytes()).unwrap();
    let answered = (0..500)
        .any(|_| matches!(next(&mut c, &mut pending), fanout_proto::rtsp::Message::Response(r) if r.status == 200));
    assert!(answered);
    drop(c);
    // The connection closed: its interleaved session and sink go.
    assert!(
        wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/sessions/demo", None)["rtsp_tracks"][0]["sinks"] == 0)
    );
}

/// Connections that send nothing: past `rtsp_max_connections` a new one gets 503 and is
/// closed; after `rtsp_idle_s` the silent ones are closed, which frees their places.
#[test]
fn silent_connections_are_limited_and_timed_out() {
    let cfg = std::env::temp_dir().join(format!("fanout-rtsp-limits-{}.toml", std::process::id()));
    std::fs::write(&cfg, "rtsp_max_connections = 3\nrtsp_idle_s = 1.5\n").unwrap();
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--config", cfg.to_str().unwrap()]);
    let _ = std::fs::remove_file(&cfg);
    let a = rtsp_addr(&relay);
    let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(a).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let over = exchange(a, "OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n\r\n");
    assert!(over.starts_with("RTSP/1.0 503 "), "the fourth connection: {over:?}");
    // The silent ones are closed after the idle time (a read sees the end)...
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        assert_eq!(s.read(&mut b).unwrap_or(usize::MAX), 0, "a silent connection should be closed");
    }
    // ...and a new client is served again.
    let ok = exchange(a, "OPTIONS * RTSP/1.0\r\nCSeq: 2\r\n\r\n");
    assert!(ok.starts_with("RTSP/1.0 200 "), "{ok}");
}

/// With users configured, ffmpeg gets in with the credentials in its URL (it answers the
/// Digest challenge) and not without them.
#[test]
fn clients_authenticate_when_users_are_configured() {
    if !have_ffmpeg() {
        return;
    }
    let cfg = std::env::temp_dir().join(format!("fanout-rtsp-auth-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[[rtsp_user]]\nname = \"alice\"\npassword = \"s3cret\"\n").unwrap();
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0", "--config", cfg.to_str().unwrap()]);
    let _ = std::fs::remove_file(&cfg);
    let a = rtsp_addr(&relay);
    let probe = |url: &str| {
        Command::new("timeout")
            .args(["20", "ffprobe", "-v", "error", "-rtsp_transport", "udp", "-show_entries", "stream=codec_name"])
            .args(["-of", "csv", url])
            .output()
            .unwrap()
    };
    let ok = probe(&format!("rtsp://alice:s3cret@{a}/demo"));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("h264"), "{}", String::from_utf8_lossy(&ok.stderr));
    let denied = probe(&format!("rtsp://alice:wrong@{a}/demo"));
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("401"), "{}", String::from_utf8_lossy(&denied.stderr));
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
        (format!("SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 4\r\nTransport: RTP/AVP;multicast\r\n\r\n"), "461"),
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

fn play(addr: SocketAddr) -> (TcpStream, std::net::UdpSocket, u16, String) {
    let p = rtsp_play(addr, "demo", None);
    // The demo's H.264 per RFC 6184, with its parameter sets for the decoder.
    assert!(p.sdp.contains("a=rtpmap:96 H264/90000") && p.sdp.contains("sprop-parameter-sets="), "{}", p.sdp);
    (p.conn, p.rtp, p.seq, p.session)
}

/// A client's RTCP receiver report, sent to the server port its SETUP answer named, shows
/// up in `GET /v1/rtsp` with the loss it reports; the proxy's sender reports reach the
/// client, and a report answering one gives the round trip.
#[test]
fn receiver_reports_are_read_per_client() {
    let relay = start();
    let addr = rtsp_addr(&relay);
    let rtcp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let RtspPlay { conn: _c, session, transport, .. } =
        rtsp_play(addr, "demo", Some(rtcp.local_addr().unwrap().port()));
    let server_rtcp: u16 = transport.split("server_port=").nth(1).unwrap().split('-').nth(1).unwrap().parse().unwrap();
    let block = fanout_proto::rtp::rtcp::ReportBlock {
        ssrc: 0x4641_4e4f,
        fraction_lost: 64,
        cumulative_lost: 3,
        highest_seq: 1234,
        jitter: 90,
        lsr: 0,
        dlsr: 0,
    };
    let mut rr = Vec::new();
    fanout_proto::rtp::rtcp::write_receiver_report(&mut rr, 99, &block);
    rtcp.send_to(&rr, ("127.0.0.1", server_rtcp)).unwrap();
    let seen =
        wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/rtsp", None)["clients"][0]["rtcp_reports"] == 1);
    let c = &relay.ok("GET", "/v1/rtsp", None)["clients"][0];
    assert!(seen, "{c}");
    assert_eq!(c["session"], session.as_str());
    assert_eq!((c["fraction_lost"].as_f64(), c["cumulative_lost"].as_i64()), (Some(0.25), Some(3)), "{c}");
    assert_eq!(c["playing"], true);
    let metrics = ureq::get(&relay.url("/metrics")).call().unwrap().into_string().unwrap();
    let line = format!("fanout_rtsp_cumulative_lost{{resource=\"demo\",rtsp_session=\"{session}\"}} 3");
    assert!(metrics.contains(&line), "{metrics}");

    // Within 5 s a sender report comes: the demo's SSRC, and an NTP time to answer with.
    rtcp.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut buf = [0u8; 512];
    let n = rtcp.recv(&mut buf).expect("a sender report");
    let sr = fanout_proto::rtp::rtcp::parse_reports(&buf[..n]).unwrap();
    assert!(sr[0].sender && sr[0].reporter == 0x4641_4e4f, "{sr:?}");
    let ntp = u64::from_be_bytes(buf[8..16].try_into().unwrap());
    let answer =
        fanout_proto::rtp::rtcp::ReportBlock { lsr: fanout_proto::rtp::rtcp::ntp_mid32(ntp), dlsr: 0, ..block };
    let mut rr = Vec::new();
    fanout_proto::rtp::rtcp::write_receiver_report(&mut rr, 99, &answer);
    rtcp.send_to(&rr, ("127.0.0.1", server_rtcp)).unwrap();
    assert!(wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/rtsp", None)["clients"][0]["rtcp_reports"] == 2));
    let rtt = relay.ok("GET", "/v1/rtsp", None)["clients"][0]["rtt_ms"].as_f64().expect("a round trip");
    assert!((0.0..1000.0).contains(&rtt), "round trip {rtt} ms over loopback");
}

/// Twenty RTSP clients of the demo at once: each gets the sequence number its RTP-Info
/// announced first, then every packet without a gap, and TEARDOWN removes each one's sink.
#[test]
fn twenty_clients_get_what_rtp_info_announced_and_every_packet() {
    let relay = start();
    let addr = rtsp_addr(&relay);
    let clients: Vec<_> = (0..20).map(|_| play(addr)).collect();
    assert_eq!(relay.ok("GET", "/v1/sessions/demo", None)["rtsp_tracks"][0]["sinks"], 20);
    // Read every client as packets come (one at a time would overflow the others' buffers).
    let mut seqs: Vec<Vec<u16>> = vec![Vec::new(); clients.len()];
    for (_, rtp, _, _) in &clients {
        rtp.set_nonblocking(true).unwrap();
    }
    let end = std::time::Instant::now() + Duration::from_secs(15);
    let mut buf = [0u8; 2048];
    while seqs.iter().any(|s| s.len() < 100) && std::time::Instant::now() < end {
        for ((_, rtp, _, _), got) in clients.iter().zip(seqs.iter_mut()) {
            while let Ok(n) = rtp.recv(&mut buf) {
                let v = fanout_proto::rtp::RtpView::parse(&buf[..n]).expect("RTP");
                assert_eq!(v.payload_type(), 96);
                got.push(v.sequence_number());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for (i, ((mut c, _, first, session), got)) in clients.into_iter().zip(seqs).enumerate() {
        assert!(got.len() >= 100, "client {i} got {} packets", got.len());
        let want: Vec<u16> = (0..got.len() as u16).map(|k| first.wrapping_add(k)).collect();
        assert_eq!(got, want, "client {i}: the RTP-Info sequence number first, then no gap");
        let url = format!("rtsp://{addr}/demo");
        c.write_all(format!("TEARDOWN {url} RTSP/1.0\r\nCSeq: 4\r\nSession: {session}\r\n\r\n").as_bytes()).unwrap();
        let mut b = [0u8; 512];
        let n = c.read(&mut b).unwrap();
        assert!(b[..n].starts_with(b"RTSP/1.0 200"), "{}", String::from_utf8_lossy(&b[..n]));
    }
    assert!(
        wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/sessions/demo", None)["rtsp_tracks"][0]["sinks"] == 0)
    );
}

/// Issue 30 item 21: a UDP session of payload type 96 whose config names no codec is
/// described as H.264 only where its packets look like H.264: VP8 (its payload descriptor
/// first) is not described (404), so a puller does not wait for keyframes that never come.
#[test]
fn a_dynamic_payload_type_is_described_only_as_what_it_is() {
    let relay = Relay::start(&["--no-demo", "--rtsp", "127.0.0.1:0"]);
    let addr = rtsp_addr(&relay);
    for (name, first, want) in [("vp8", 0x90u8, 404), ("avc", 0x65, 200)] {
        let spec = serde_json::json!({"name": name, "source": {"udp": "127.0.0.1:0"}});
        let src = create_on_free_port(&relay, spec);
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for seq in 0..20u16 {
            let mut p = vec![0x80, 96];
            p.extend_from_slice(&seq.to_be_bytes());
            p.extend_from_slice(&(u32::from(seq) * 3000).to_be_bytes());
            p.extend_from_slice(&9u32.to_be_bytes());
            p.extend_from_slice(&[first, 0x11, 0x22, 0x33]);
            tx.send_to(&p, src).unwrap();
        }
        assert!(wait_for(Duration::from_secs(3), || {
            relay.ok("GET", &format!("/v1/sessions/{name}"), None)["source"]["packets"] == 20
        }));
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(c, "DESCRIBE rtsp://{addr}/{name} RTSP/1.0\r\nCSeq: 1\r\n\r\n").unwrap();
        let head = read_head(&mut c);
        assert!(head.starts_with(&format!("RTSP/1.0 {want} ")), "{name}: {head}");
    }
}
