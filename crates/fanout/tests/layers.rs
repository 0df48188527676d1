//! Layer statistics of a relay session (issue 6): a scalable H.264 stream (mediasoup's
//! two spatial × three temporal layers) sent through `fanout gen`; the session's status
//! shows the moving average rate of every layer. Sinks capped through the API get streams
//! that still decode, frame for frame as the stream filtered offline, on every data path.

mod common;
use common::*;
use fanout_proto::codec::annexb::{nal_units, Codec, Depacketizer};
use fanout_proto::codec::layers::{Layer, LayerParser, PacketLayer};
use fanout_proto::rtp::adapt::within;
use serde_json::json;
use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

const STREAM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/h264-svc/mediasoup_naluInfo.264");

#[test]
fn a_session_shows_the_rate_of_each_layer() {
    if !std::path::Path::new(STREAM).exists() {
        assert!(std::env::var_os("CI").is_none(), "{STREAM} is missing");
        eprintln!("\n*** SKIPPED: {STREAM} is missing ***\n");
        return;
    }
    let relay = Relay::start(&["--no-demo"]);
    let src =
        create_on_free_port(&relay, json!({ "name": "svc", "source": { "udp": "127.0.0.1:0" }, "video": "h264" }));
    // 100 access units at 50 fps: 2 s.
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["gen", "--to", &src.to_string(), "--file", STREAM, "--fps", "50", "--duration", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = relay.ok("GET", "/v1/sessions/svc", None);
    let l = &s["layers"];
    assert_eq!(l["codec"], "h264", "{s}");
    let mut seen: Vec<(u64, u64, f64)> = l["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["did"].as_u64().unwrap(), x["tid"].as_u64().unwrap(), x["bps"].as_f64().unwrap()))
        .collect();
    seen.sort_by_key(|x| (x.0, x.1));
    let ids: Vec<(u64, u64)> = seen.iter().map(|x| (x.0, x.1)).collect();
    assert_eq!(ids, vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)], "{l}");
    assert!(seen.iter().all(|x| x.2 > 0.0), "every layer has a rate: {l}");
    // The enhancement layer (416x256) costs more than the base (208x128).
    let rate = |did| seen.iter().filter(|x| x.0 == did).map(|x| x.2).sum::<f64>();
    assert!(rate(1) > rate(0), "{l}");
    assert!(l["not_layered_bps"].as_f64().unwrap() > 0.0, "parameter sets: {l}");
    assert_eq!(l["unknown_packets"], 0, "{l}");
}

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/");

/// A layer cap as the API takes it.
fn cap(did: u8, tid: u8) -> serde_json::Value {
    json!({ "max": { "did": did, "tid": tid } })
}

/// Decodes an Annex B stream with ffmpeg: one MD5 per decoded frame.
fn frame_md5s(codec: Codec, annexb: &[u8], tag: &str) -> Vec<String> {
    let path = std::env::temp_dir().join(format!("fanout-layers-{}-{tag}", std::process::id()));
    std::fs::write(&path, annexb).unwrap();
    let fmt = match codec {
        Codec::H264 => "h264",
        Codec::H265 => "hevc",
    };
    let out = Command::new("timeout")
        .args(["60", "ffmpeg", "-hide_banner", "-nostdin", "-v", "error", "-f", fmt, "-i"])
        .arg(&path)
        .args(["-f", "framemd5", "-"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "ffmpeg on {tag}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.rsplit(',').next().unwrap().trim().to_string())
        .collect()
}

/// The stream filtered offline: the NAL units of layers within `max` (and everything not
/// layered), in Annex B.
fn filter_offline(codec: Codec, stream: &[u8], max: Layer) -> Vec<u8> {
    let mut p = LayerParser::default();
    let mut out = Vec::new();
    for nal in nal_units(stream) {
        let keep = match p.nal(codec, nal) {
            PacketLayer::Media { layer, .. } => within(layer, max),
            _ => true,
        };
        if keep {
            out.extend_from_slice(&[0, 0, 0, 1]);
            out.extend_from_slice(nal);
        }
    }
    out
}

/// What a sink received: its RTP, checked for gapless sequence numbers, depacketized; and
/// how many packets. Reads until 1.5 s of silence (on its own thread, while the stream runs).
/// `kernel`: a packet may come twice in a row, once. When a capped sink is handed to user
/// space, the last kernel sink moves into its slot, and a program run that read the old count
/// sends that sink one packet twice (design/data-plane.md, "Layout"); a repeat is dropped here.
fn receive(sock: &UdpSocket, codec: Codec, kernel: bool) -> (Vec<u8>, usize) {
    sock.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let (mut buf, mut out, mut d) = (vec![0u8; 65536], Vec::new(), Depacketizer::default());
    let (mut last, mut packets, mut repeats) = (None::<u16>, 0, 0);
    while let Ok(n) = sock.recv(&mut buf) {
        let v = fanout_proto::rtp::RtpView::parse(&buf[..n]).expect("RTP");
        if kernel && last == Some(v.sequence_number()) && repeats == 0 {
            repeats += 1;
            continue;
        }
        if let Some(l) = last {
            assert_eq!(v.sequence_number(), l.wrapping_add(1), "sequence numbers run on without gaps");
        }
        last = Some(v.sequence_number());
        packets += 1;
        d.push_all(codec, v.payload(), |nal| {
            out.extend_from_slice(&[0, 0, 0, 1]);
            out.extend_from_slice(&nal);
        });
    }
    (out, packets)
}

/// Sends a layered file once through a session on `datapath` (in single NAL unit and FU
/// packets, plus STAP-A/AP with `aggregate`), to one sink per cap (and one without): each
/// decodes to the frames of the stream filtered offline, and to the frame count the test
/// data's PROVENANCE.md gives.
fn decodable_after_dropping(datapath: &str, file: &str, aggregate: bool, caps: &[((u8, u8), usize)]) {
    let path = format!("{DATA}{file}");
    let codec = if file.ends_with(".265") { Codec::H265 } else { Codec::H264 };
    let stream = std::fs::read(&path).unwrap();
    let aus = fanout_proto::codec::annexb::access_units(codec, &stream).len();
    let relay = Relay::start(&["--no-demo"]);
    let video = if codec == Codec::H265 { "h265" } else { "h264" };
    let src = create_on_free_port(
        &relay,
        json!({ "name": "svc", "source": { "udp": "127.0.0.1:0" }, "video": video, "datapath": datapath }),
    );
    let mut sinks = Vec::new();
    for (i, &((did, tid), _)) in caps.iter().enumerate() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = sock.local_addr().unwrap().to_string();
        let sink = relay.ok("POST", "/v1/sessions/svc/sinks", Some(json!({ "udp": to })));
        let id = sink["id"].as_u64().unwrap();
        let pinned = relay.ok("PUT", &format!("/v1/sessions/svc/sinks/{id}/layers"), Some(cap(did, tid)));
        assert_eq!(pinned["layers"]["pin"], json!({ "did": did, "qid": 15, "tid": tid }), "sink {i}: {pinned}");
        sinks.push(sock);
    }
    let all = UdpSocket::bind("127.0.0.1:0").unwrap();
    relay.ok("POST", "/v1/sessions/svc/sinks", Some(json!({ "udp": all.local_addr().unwrap().to_string() })));
    let kernel = datapath == "kernel";
    let readers: Vec<_> =
        sinks.into_iter().chain([all]).map(|s| std::thread::spawn(move || receive(&s, codec, kernel))).collect();
    // The file once, at 100 access units per second; from one CPU, as one flow from a NIC
    // arrives (see design/data-plane.md, "One flow, one CPU").
    let out = Command::new("taskset")
        .args([
            "-c",
            "0",
            env!("CARGO_BIN_EXE_fanout"),
            "gen",
            "--to",
            &src.to_string(),
            "--file",
            &path,
            "--fps",
            "100",
        ])
        .args(["--duration", &format!("{}", aus as f64 / 100.0)])
        .args(aggregate.then_some("--aggregate"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut got: Vec<(Vec<u8>, usize)> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let (whole, sent) = got.pop().unwrap();
    let offline = filter_offline(codec, &stream, fanout_proto::rtp::adapt::ALL);
    let first_diff = whole.iter().zip(&offline).position(|(a, b)| a != b);
    assert!(
        whole == offline,
        "{datapath} {file}: unpinned sink got {} bytes, {} expected, first difference at {first_diff:?}",
        whole.len(),
        offline.len()
    );
    for ((got, packets), &((did, tid), frames)) in got.into_iter().zip(caps) {
        let max = Layer { did, qid: 15, tid };
        let tag = format!("{datapath}-{did}-{tid}");
        let want = frame_md5s(codec, &filter_offline(codec, &stream, max), &format!("{tag}-offline"));
        // An aggregate reaches a capped sink without the NAL units above its cap: the same
        // bytes as the stream filtered offline, not only the same pictures (on the kernel
        // path, the program hands such a sink to user space at its first aggregate).
        let offline = filter_offline(codec, &stream, max);
        assert!(got == offline, "{tag} {file}: {} bytes received, {} within the cap", got.len(), offline.len());
        let have = frame_md5s(codec, &got, &tag);
        assert_eq!(want.len(), frames, "{file}: offline filter to {max:?} (PROVENANCE.md)");
        assert_eq!(have, want, "{datapath} {file} capped at {max:?}: decoded frames differ");
        let st = relay.ok("GET", "/v1/sessions/svc/sinks", None);
        // The program serves every sink but the capped ones of a stream with aggregates.
        let path = |s: &serde_json::Value| match (datapath, aggregate && s["layers"]["pin"].is_object()) {
            ("kernel", false) => "kernel",
            _ => "user",
        };
        assert!(st["sinks"].as_array().unwrap().iter().all(|s| s["path"] == path(s)), "{st}");
        let dropped: u64 = st["sinks"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["layers"]["packets_dropped"].as_u64())
            .filter(|d| *d as usize == sent - packets)
            .count() as u64;
        assert!(dropped >= 1, "{datapath}: a sink counts the {} packets it was spared: {st}", sent - packets);
    }
}

#[test]
fn svc_streams_stay_decodable_after_dropping_layers() {
    if !have_ffmpeg() {
        return;
    }
    // (did, tid) caps and the frames ffmpeg decodes (PROVENANCE.md); ffmpeg decodes the AVC
    // base layer, so the spatial cap keeps every frame and the temporal caps thin them.
    decodable_after_dropping(
        "shared",
        "h264-svc/mediasoup_naluInfo.264",
        false,
        &[((0, 7), 100), ((0, 1), 67), ((0, 0), 34), ((1, 0), 34)],
    );
    decodable_after_dropping(
        "shared",
        "h264-svc/openh264_2S3T_320x192.264",
        true,
        &[((0, 7), 32), ((0, 1), 16), ((0, 0), 8)],
    );
    decodable_after_dropping(
        "shared",
        "h264-svc/openh264_1S4T_prefix.264",
        false,
        &[((0, 7), 32), ((0, 1), 8), ((0, 0), 4)],
    );
    // In STAP-A, mediasoup's base slices travel with their d1 slices: a base-layer sink
    // gets the aggregates rebuilt without them.
    decodable_after_dropping("shared", "h264-svc/mediasoup_naluInfo.264", true, &[((0, 7), 100), ((0, 0), 34)]);
}

#[test]
fn the_hevc_temporal_base_layer_stays_decodable() {
    if !have_ffmpeg() {
        return;
    }
    decodable_after_dropping("shared", "hevc/x265_temporal_320x192.265", false, &[((0, 0), 18)]);
    decodable_after_dropping("uring", "hevc/x265_temporal_320x192.265", true, &[((0, 0), 18)]);
}

#[test]
fn the_kernel_path_drops_layers_in_the_program() {
    if !have_ffmpeg() {
        return;
    }
    in_private_netns("the_kernel_path_drops_layers_in_the_program", || {
        // Single NAL units and FU-A through the program's own parser; then aggregates
        // (STAP-A, AP): capped sinks are handed to user space, which rebuilds them.
        decodable_after_dropping(
            "kernel",
            "h264-svc/mediasoup_naluInfo.264",
            false,
            &[((0, 7), 100), ((0, 1), 67), ((0, 0), 34)],
        );
        decodable_after_dropping(
            "kernel",
            "h264-svc/mediasoup_naluInfo.264",
            true,
            &[((0, 7), 100), ((0, 1), 67), ((0, 0), 34)],
        );
        decodable_after_dropping("kernel", "hevc/x265_temporal_320x192.265", false, &[((0, 0), 18)]);
        decodable_after_dropping("kernel", "hevc/x265_temporal_320x192.265", true, &[((0, 0), 18)]);
    });
}

/// Receiver reports reach the reporting client's sink: a report about the stream starts
/// its selector; a block about an SSRC it is not sent is ignored and counted; a report
/// claiming more lost than was ever sent is clamped and counted. Its sink can be pinned
/// through the API by the id `GET /v1/rtsp` gives.
#[test]
fn receiver_reports_drive_the_rtsp_clients_selector_and_bad_ones_are_counted() {
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    let addr = rtsp_addr(&relay);
    let rtcp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let play = rtsp_play(addr, "demo", Some(rtcp.local_addr().unwrap().port()));
    let server_rtcp: u16 =
        play.transport.split("server_port=").nth(1).unwrap().split('-').nth(1).unwrap().parse().unwrap();
    let mut buf = [0u8; 2048];
    play.rtp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let n = play.rtp.recv(&mut buf).unwrap();
    let ssrc = fanout_proto::rtp::RtpView::parse(&buf[..n]).unwrap().ssrc();
    let report = |ssrc: u32, cumulative_lost: i32| {
        let block = fanout_proto::rtp::rtcp::ReportBlock {
            ssrc,
            fraction_lost: 0,
            cumulative_lost,
            highest_seq: 1,
            jitter: 0,
            lsr: 0,
            dlsr: 0,
        };
        let mut rr = Vec::new();
        fanout_proto::rtp::rtcp::write_receiver_report(&mut rr, 0x1234, &block);
        rtcp.send_to(&rr, ("127.0.0.1", server_rtcp)).unwrap();
    };
    let client = || relay.ok("GET", "/v1/rtsp", None)["clients"][0].clone();
    report(ssrc ^ 0xdead, 0);
    assert!(wait_for(Duration::from_secs(5), || client()["foreign_report_blocks"] == 1), "{}", client());
    assert!(client()["sinks"][0].get("layers").is_none(), "a foreign block starts nothing: {}", client());
    std::thread::sleep(Duration::from_millis(300));
    report(ssrc, 1_000_000);
    let layers = || client()["sinks"][0]["layers"].clone();
    assert!(wait_for(Duration::from_secs(5), || layers()["reports"] == 1), "{}", client());
    assert_eq!(layers()["bad_reports"], 1, "{}", client());
    // The demo's H.264 has one layer: the selector keeps it.
    assert_eq!(layers()["allowance"], json!({ "did": 0, "qid": 0, "tid": 0 }), "{}", client());
    // Pinned by the id the RTSP listing gives (the sink is in the demo's video track).
    let id = client()["sinks"][0]["sink"].as_u64().unwrap();
    let pinned = relay.ok("PUT", &format!("/v1/sessions/demo/sinks/{id}/layers"), Some(cap(0, 0)));
    assert_eq!(pinned["layers"]["pin"], json!({ "did": 0, "qid": 15, "tid": 0 }), "{pinned}");
    assert_eq!(layers()["pin"], pinned["layers"]["pin"]);
    // Bad requests say why.
    let (code, e) =
        relay.call("PUT", &format!("/v1/sessions/demo/sinks/{id}/layers"), Some(json!({ "max": { "tid": 9 } })));
    assert_eq!(code, 400, "{e}");
    let (code, e) = relay.call("PUT", "/v1/sessions/demo/sinks/999/layers", Some(json!({ "max": null })));
    assert_eq!(code, 404, "{e}");
}

/// An RTSP client taking RTP interleaved on its connection, capped at the temporal base:
/// its frames carry its own gapless sequence numbers and decode to the offline filter's
/// frames.
#[test]
fn an_interleaved_client_capped_at_the_temporal_base_decodes() {
    use fanout_proto::rtsp::{Limits, Message};
    use std::io::{Read, Write};
    if !have_ffmpeg() {
        return;
    }
    let path = format!("{DATA}h264-svc/mediasoup_naluInfo.264");
    let stream = std::fs::read(&path).unwrap();
    let file = path.clone();
    let relay = Relay::start(&["--no-demo", "--rtsp", "127.0.0.1:0"]);
    let src =
        create_on_free_port(&relay, json!({ "name": "svc", "source": { "udp": "127.0.0.1:0" }, "video": "h264" }));
    let addr = rtsp_addr(&relay);
    let url = format!("rtsp://{addr}/svc");
    // Before any packet there is no RTP-Info to give: prime the session with one pass.
    let gen = move |duration: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["gen", "--to", &src.to_string(), "--file", &file, "--fps", "100", "--duration", duration])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    gen("0.05");
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let mut pending: Vec<u8> = Vec::new();
    let next = |c: &mut std::net::TcpStream, pending: &mut Vec<u8>| loop {
        if let Some((m, used)) = fanout_proto::rtsp::parse(pending, &Limits::default()).unwrap() {
            pending.drain(..used);
            return Some(m);
        }
        let mut b = [0u8; 65536];
        match c.read(&mut b) {
            Ok(n) if n > 0 => pending.extend_from_slice(&b[..n]),
            _ => return None,
        }
    };
    c.write_all(
        format!("SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let Some(Message::Response(r)) = next(&mut c, &mut pending) else { panic!("no SETUP answer") };
    let session = r.headers.get("Session").unwrap().split(';').next().unwrap().to_string();
    c.write_all(format!("PLAY {url} RTSP/1.0\r\nCSeq: 2\r\nSession: {session}\r\n\r\n").as_bytes()).unwrap();
    let Some(Message::Response(r)) = next(&mut c, &mut pending) else { panic!("no PLAY answer") };
    assert_eq!(r.status, 200);
    let id = relay.ok("GET", "/v1/rtsp", None)["clients"][0]["sinks"][0]["sink"].as_u64().unwrap();
    relay.ok("PUT", &format!("/v1/sessions/svc/sinks/{id}/layers"), Some(cap(1, 0)));
    // The whole file once. The client gets the priming pass first (its sink starts at the
    // keyframe the ring holds); `gen` starts its numbers and times anew, so what counts
    // starts where the timestamps go back.
    let sender = std::thread::spawn(move || gen("1"));
    let (mut got, mut d, mut last, mut last_ts) = (Vec::new(), Depacketizer::default(), None::<u16>, 0);
    while let Some(m) = next(&mut c, &mut pending) {
        let Message::Interleaved { channel: 0, data } = m else { continue };
        let v = fanout_proto::rtp::RtpView::parse(&data).expect("RTP");
        if v.timestamp() < last_ts {
            (got, d, last) = (Vec::new(), Depacketizer::default(), None);
        }
        last_ts = v.timestamp();
        if let Some(l) = last {
            assert_eq!(v.sequence_number(), l.wrapping_add(1), "gapless");
        }
        last = Some(v.sequence_number());
        d.push_all(Codec::H264, v.payload(), |nal| {
            got.extend_from_slice(&[0, 0, 0, 1]);
            got.extend_from_slice(&nal);
        });
    }
    sender.join().unwrap();
    let max = Layer { did: 1, qid: 15, tid: 0 };
    let want = frame_md5s(Codec::H264, &filter_offline(Codec::H264, &stream, max), "tcp-offline");
    assert_eq!(want.len(), 34);
    assert_eq!(frame_md5s(Codec::H264, &got, "tcp"), want);
}

/// Caps need RTP datagram sinks of a layered session; anything else is refused, saying why.
#[test]
fn caps_are_refused_where_they_cannot_apply() {
    let relay = Relay::start(&["--no-demo"]);
    create_on_free_port(&relay, json!({ "name": "ts", "source": { "udp": "127.0.0.1:0" } }));
    let sink = relay.ok("POST", "/v1/sessions/ts/sinks", Some(json!({ "udp": "127.0.0.1:9" })));
    let (code, e) = relay.call("PUT", &format!("/v1/sessions/ts/sinks/{}/layers", sink["id"]), Some(cap(0, 0)));
    assert_eq!(code, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("no layered video"), "{e}");
    let (code, e) = relay.call("PUT", "/v1/sessions/ts/sinks/1/layers", Some(json!({ "maximum": 1 })));
    assert_eq!(code, 422, "unknown fields are refused: {e}");
}

/// Capped sinks behind a slow link on the relay's own interface: the socket pushes back, the
/// batched sends go out in parts, and each part's decisions are replayed from where it
/// stopped. Every capped sink still gets each packet it keeps once, in gapless numbers
/// (checked in `receive`), decoding to the offline filter's frames. (A UDP sink the socket
/// held back is served again when the next packet arrives, so the file is sent one and a
/// half times and the first pass compared.)
#[test]
fn capped_sinks_survive_partial_sends() {
    if !have_ffmpeg() {
        return;
    }
    in_private_netns("capped_sinks_survive_partial_sends", || {
        // Queue, do not drop: 2 Mbit/s with room for 10 MB, so senders block instead.
        let st = Command::new("tc")
            .args(["qdisc", "add", "dev", "lo", "root", "tbf", "rate", "2mbit", "burst", "32kb", "limit", "10mb"])
            .status()
            .unwrap();
        assert!(st.success(), "tc");
        let path = format!("{DATA}h264-svc/mediasoup_naluInfo.264");
        let stream = std::fs::read(&path).unwrap();
        let relay = Relay::start(&["--no-demo"]);
        let spec = json!({ "name": "svc", "source": { "udp": "127.0.0.1:0" }, "video": "h264", "ring": 65536 });
        let src = create_on_free_port(&relay, spec);
        let caps = [(0u8, 0u8), (1, 7), (0, 1)];
        let mut socks = Vec::new();
        for (did, tid) in caps {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let to = sock.local_addr().unwrap().to_string();
            let id = relay.ok("POST", "/v1/sessions/svc/sinks", Some(json!({ "udp": to })))["id"].as_u64().unwrap();
            relay.ok("PUT", &format!("/v1/sessions/svc/sinks/{id}/layers"), Some(cap(did, tid)));
            socks.push(sock);
        }
        let readers: Vec<_> =
            socks.into_iter().map(|s| std::thread::spawn(move || receive(&s, Codec::H264, false))).collect();
        let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["gen", "--to", &src.to_string(), "--file", &path, "--fps", "200", "--duration", "0.75"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for (r, (did, tid)) in readers.into_iter().zip(caps) {
            let (got, _) = r.join().unwrap();
            let max = Layer { did, qid: 15, tid };
            let want = frame_md5s(Codec::H264, &filter_offline(Codec::H264, &stream, max), "slow-offline");
            let have = frame_md5s(Codec::H264, &got, "slow");
            assert!(have.len() > want.len(), "capped at {max:?}: {} frames", have.len());
            assert_eq!(have[..want.len()], want, "capped at {max:?}");
        }
        let sinks = relay.ok("GET", "/v1/sessions/svc/sinks", None);
        assert!(sinks["sinks"].as_array().unwrap().iter().all(|s| s["packets_skipped"] == 0), "{sinks}");
    });
}
