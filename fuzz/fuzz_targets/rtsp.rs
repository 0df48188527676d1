//! The RTSP connection parser on arbitrary bytes: never a panic, never a message longer
//! than its input, and a parsed request or response writes back to bytes that parse to it.
//! Parsed responses go to the clients (one playing, one recording).
//! Parsed requests go on into the server state machines (open, and with a user), bodies into the SDP parser; the
//! whole input is also tried as RTCP.
#![no_main]
use fanout_proto::rtsp::{parse, parse_session, parse_transport, Limits, Message};
use fanout_proto::rtsp::server::{Config, Resource, Server};
use fanout_proto::rtsp::sdp::Sdp;
use libfuzzer_sys::fuzz_target;

/// `demo` to play, `pub` to publish to (ANNOUNCE, SETUP with mode=record, RECORD).
fn lookup(name: &str) -> Option<Resource> {
    match name {
        "demo" => Some(Resource {
            sdp: Sdp::parse("v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n").unwrap().for_clients("demo", 1),
            next_rtp: vec![Some((1, 2))],
            publishable: false,
            busy: false,
            takeover: false,
        }),
        "pub" => Some(Resource { sdp: Sdp { session: vec![], media: vec![] }, next_rtp: vec![], publishable: true, busy: false, takeover: false }),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_head: 2048, max_headers: 32, max_body: 4096 };
    // (With multicast groups, two of them: a third track is refused.)
    let multicast = Some(fanout_proto::rtsp::server::Multicast {
        first: std::net::Ipv4Addr::new(239, 1, 1, 0),
        count: 2,
        rtp: 8002,
        rtcp: 8003,
        ttl: 1,
    });
    let mut server = Server::new(Config { max_sessions: 4, multicast, ..Config::default() }, [1; 32]);
    // The same requests to a server with a user (Basic `u:p` is `dTpw`; Digest answers too).
    let users = vec![("u".to_string(), "p".to_string())];
    let mut guarded = Server::new(Config { max_sessions: 4, users, ..Config::default() }, [2; 32]);
    let mut now = 0;
    let mut rest = data;
    // Responses also go to an upstream client, walked through its phases.
    let url = fanout_proto::rtsp::client::Url::parse("rtsp://u:p@h:554/cam").unwrap();
    let mut client = fanout_proto::rtsp::client::Client::new(url.clone(), "fuzz");
    client.start(0);
    // And to a recorder (a forward publishing), walked through ANNOUNCE, SETUP and RECORD.
    let announced = lookup("demo").unwrap().sdp;
    let mut recorder = fanout_proto::rtsp::client::Client::recorder(url, "fuzz", announced);
    recorder.start(0);
    while let Ok(Some((msg, used))) = parse(rest, &limits) {
        if let Message::Response(r) = &msg {
            let mut r = r.clone();
            r.headers.0.retain(|(n, _)| !n.eq_ignore_ascii_case("CSeq")); // answers whatever is pending
            if let Ok(fanout_proto::rtsp::client::Step::Described(sdp)) = client.on_response(&r, now) {
                let lowers = (0..sdp.media.len())
                    .map(|i| fanout_proto::rtsp::Lower::Interleaved { rtp: 2 * i as u8, rtcp: 2 * i as u8 + 1 })
                    .collect();
                let _ = client.setup(lowers, now);
            }
            let _ = client.keepalive(now + 100_000);
            let _ = recorder.on_response(&r, now);
            let _ = recorder.keepalive(now + 100_000);
        }
        if let Message::Request(r) = &msg {
            now += 1000;
            // Requests come on one of three connections (sessions belong to theirs).
            let conn = u64::from(r.headers.cseq().unwrap_or(0) % 3);
            let _ = server.handle(r, conn, now, &lookup);
            let _ = server.expire(now);
            let _ = guarded.handle(r, conn, now, &lookup);
            if let Ok(text) = std::str::from_utf8(&r.body) {
                if let Ok(sdp) = Sdp::parse(text) {
                    let _ = sdp.for_clients("x", 1).write();
                }
            }
        }
        assert!(used > 0 && used <= rest.len());
        let mut out = Vec::new();
        match &msg {
            Message::Request(r) => r.write(&mut out),
            Message::Response(r) => r.write(&mut out),
            Message::Interleaved { .. } => {}
        }
        if !out.is_empty() {
            let again = parse(&out, &Limits::default()).expect("our own output parses");
            assert!(again.is_some(), "our own output is complete");
        }
        rest = &rest[used..];
    }
    // The same bytes as RTCP (clients' receiver reports).
    if let Ok(reports) = fanout_proto::rtp::rtcp::parse_reports(data) {
        for b in reports.iter().flat_map(|r| &r.blocks) {
            let _ = fanout_proto::rtp::rtcp::round_trip(b, 0x1234_5678);
        }
        // A sender report, and only one, has sender info.
        assert!(reports.iter().all(|r| r.sender == r.info.is_some()));
    }
    let text = String::from_utf8_lossy(data);
    let _ = parse_transport(&text);
    let _ = parse_session(&text);
});
