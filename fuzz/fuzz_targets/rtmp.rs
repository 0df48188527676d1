//! RTMP on arbitrary bytes: a server connection fed them as they come (raw, and after a good
//! handshake, so the chunk stream and the commands are reached; a publish or play it asks
//! for is accepted), everything it accepts as media through the FLV-to-RTP ingest, and the
//! bytes alone as AMF0 and as FLV tags. Never a panic; AMF0 that decodes encodes back to the
//! same bytes again; every RTP packet parses. The client side (forwards, pulls) is fed the
//! same bytes as a server's answers, raw and after a good handshake.
#![no_main]
use fanout_proto::rtmp::{amf, client, ingest::Ingest, server::{Event, Server}};
use libfuzzer_sys::fuzz_target;

fn run(server: &mut Server, data: &[u8]) {
    let mut ingest = Ingest::default();
    let mut out = Vec::new();
    // In pieces, as reads come.
    for piece in data.chunks(97) {
        if server.input(piece).is_err() {
            return;
        }
        while let Some(e) = server.poll_event() {
            match e {
                Event::Publish { stream_id, name } => server.accept_publish(stream_id, &name),
                Event::Play { stream_id, name } => {
                    server.accept_play(stream_id, &name);
                    server.media(true, 0, name.as_bytes());
                }
                Event::Video { timestamp, body } => {
                    let _ = ingest.video(timestamp, &body, &mut out);
                }
                Event::Audio { timestamp, body } => {
                    let _ = ingest.audio(timestamp, &body, &mut out);
                }
                _ => {}
            }
        }
        let _ = server.take_output();
    }
    if let Some(sdp) = ingest.sdp() {
        fanout_proto::rtsp::sdp::Sdp::parse(&sdp).expect("the ingest's SDP parses");
    }
    for p in &out {
        fanout_proto::rtp::RtpView::parse(&p.data).expect("the ingest's RTP parses");
    }
}

fuzz_target!(|data: &[u8]| {
    run(&mut Server::new(1), data);
    // After a good handshake (C0, C1, C2).
    let mut s = Server::new(2);
    let mut hello = vec![3u8];
    hello.extend(std::iter::repeat_n(0u8, 2 * 1536));
    s.input(&hello).expect("a good handshake");
    run(&mut s, data);

    if let Ok(values) = amf::decode_all(data) {
        // Compared as bytes (a NaN number is not equal to itself).
        let bytes = amf::encode_all(&values);
        let again = amf::decode_all(&bytes).expect("our own AMF0 decodes");
        assert_eq!(amf::encode_all(&again), bytes, "AMF0 round trip");
    }
    let mut ingest = Ingest::default();
    let mut out = Vec::new();
    let _ = ingest.video(0, data, &mut out);
    let _ = ingest.audio(0, data, &mut out);

    for (i, role) in [client::Role::Publish, client::Role::Play].into_iter().enumerate() {
        let url = client::RtmpUrl::parse("rtmp://h/live/k").expect("a good URL");
        let mut c = client::Client::new(url, role, i as u64);
        if i == 1 {
            let mut hello = vec![3u8];
            hello.extend(std::iter::repeat_n(0u8, 2 * 1536));
            c.input(&hello).expect("a good handshake");
        }
        for piece in data.chunks(97) {
            if c.input(piece).is_err() {
                break;
            }
            while c.poll_event().is_some() {}
            c.media(true, 0, piece);
            let _ = c.take_output();
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = client::RtmpUrl::parse(s);
    }
});
