//! Layer statistics of a relay session (issue 6): a scalable H.264 stream (mediasoup's
//! two spatial × three temporal layers) sent through `fanout gen`; the session's status
//! shows the moving average rate of every layer. Sinks capped through the API get streams
//! that still decode, frame for frame as the stream filtered offline, on every data path.

mod common;
use common::*;
use fanout_proto::adapt::within;
use fanout_proto::annexb::{nal_units, Codec, Depacketizer};
use fanout_proto::layers::{Layer, LayerParser, PacketLayer};
use serde_json::json;
use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

const STREAM: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/testdata/video/h264-svc/mediasoup_naluInfo.264");

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

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/testdata/video/");

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
fn receive(sock: &UdpSocket, codec: Codec) -> (Vec<u8>, usize) {
    sock.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let (mut buf, mut out, mut d) = (vec![0u8; 65536], Vec::new(), Depacketizer::default());
    let (mut last, mut packets) = (None::<u16>, 0);
    while let Ok(n) = sock.recv(&mut buf) {
        let v = fanout_proto::rtp::RtpView::parse(&buf[..n]).expect("RTP");
        if let Some(l) = last {
            assert_eq!(v.sequence_number(), l.wrapping_add(1), "sequence numbers run on without gaps");
        }
        last = Some(v.sequence_number());
        packets += 1;
        if let Some(nal) = d.push(codec, v.payload()) {
            out.extend_from_slice(&[0, 0, 0, 1]);
            out.extend_from_slice(&nal);
        }
    }
    (out, packets)
}

/// Sends a layered file once through a session on `datapath`, to one sink per cap (and
/// one without): each decodes to the frames of the stream filtered offline, and to the
/// frame count the test data's PROVENANCE.md gives.
fn decodable_after_dropping(datapath: &str, file: &str, caps: &[((u8, u8), usize)]) {
    let path = format!("{DATA}{file}");
    let codec = if file.ends_with(".265") { Codec::H265 } else { Codec::H264 };
    let stream = std::fs::read(&path).unwrap();
    let aus = fanout_proto::annexb::access_units(codec, &stream).len();
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
    let readers: Vec<_> =
        sinks.into_iter().chain([all]).map(|s| std::thread::spawn(move || receive(&s, codec))).collect();
    // The file once, at 100 access units per second.
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["gen", "--to", &src.to_string(), "--file", &path, "--fps", "100"])
        .args(["--duration", &format!("{}", aus as f64 / 100.0)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut got: Vec<(Vec<u8>, usize)> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let (whole, sent) = got.pop().unwrap();
    let offline = filter_offline(codec, &stream, fanout_proto::adapt::ALL);
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
        let have = frame_md5s(codec, &got, &tag);
        assert_eq!(want.len(), frames, "{file}: offline filter to {max:?} (PROVENANCE.md)");
        assert_eq!(have, want, "{datapath} {file} capped at {max:?}: decoded frames differ");
        let st = relay.ok("GET", "/v1/sessions/svc/sinks", None);
        let path = if datapath == "kernel" { "kernel" } else { "user" };
        assert!(st["sinks"].as_array().unwrap().iter().all(|s| s["path"] == path), "{st}");
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

fn have_data_and_ffmpeg() -> bool {
    if !std::path::Path::new(DATA).exists() {
        assert!(std::env::var_os("CI").is_none(), "{DATA} is missing");
        eprintln!("\n*** SKIPPED: {DATA} is missing ***\n");
        return false;
    }
    have_ffmpeg()
}

#[test]
fn svc_streams_stay_decodable_after_dropping_layers() {
    if !have_data_and_ffmpeg() {
        return;
    }
    // (did, tid) caps and the frames ffmpeg decodes (PROVENANCE.md); ffmpeg decodes the AVC
    // base layer, so the spatial cap keeps every frame and the temporal caps thin them.
    decodable_after_dropping(
        "shared",
        "h264-svc/mediasoup_naluInfo.264",
        &[((0, 7), 100), ((0, 1), 67), ((0, 0), 34), ((1, 0), 34)],
    );
    decodable_after_dropping("shared", "h264-svc/openh264_2S3T_320x192.264", &[((0, 7), 32), ((0, 1), 16), ((0, 0), 8)]);
    decodable_after_dropping("shared", "h264-svc/openh264_1S4T_prefix.264", &[((0, 7), 32), ((0, 1), 8), ((0, 0), 4)]);
}

#[test]
fn the_hevc_temporal_base_layer_stays_decodable() {
    if !have_data_and_ffmpeg() {
        return;
    }
    decodable_after_dropping("shared", "hevc/x265_temporal_320x192.265", &[((0, 0), 18)]);
    decodable_after_dropping("uring", "hevc/x265_temporal_320x192.265", &[((0, 0), 18)]);
}

#[test]
fn the_kernel_path_drops_layers_in_the_program() {
    if !have_data_and_ffmpeg() {
        return;
    }
    in_private_netns("the_kernel_path_drops_layers_in_the_program", || {
        decodable_after_dropping(
            "kernel",
            "h264-svc/mediasoup_naluInfo.264",
            &[((0, 7), 100), ((0, 1), 67), ((0, 0), 34)],
        );
        decodable_after_dropping("kernel", "hevc/x265_temporal_320x192.265", &[((0, 0), 18)]);
    });
}

/// `fanout bench layers` on one data path: subscribers behind 150 kbit/s, 600 kbit/s and
/// unlimited links (namespaces, veth, tc); returns its summary.
fn constrained_links(datapath: &str) -> serde_json::Value {
    let out = std::env::temp_dir().join(format!("fanout-layers-links-{}-{datapath}", std::process::id()));
    let file = format!("{DATA}h264-svc/mediasoup_naluInfo.264");
    let run = Command::new("timeout")
        .arg("150")
        .arg(env!("CARGO_BIN_EXE_fanout"))
        .args(["bench", "layers", "--links", "150,600,0", "--seconds", "60", "--datapath", datapath, "--file", &file])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{datapath}: {}", String::from_utf8_lossy(&run.stderr));
    let summary = std::fs::read_to_string(out.join("layers-summary.json")).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    serde_json::from_str(&summary).unwrap()
}

/// The selector against real links: after adaptation (the last 40% of a minute), the
/// constrained subscribers lose under 1% of what they are still sent and get fewer layers;
/// the unlimited one gets every layer, without loss. Both the user-space and the kernel
/// path, whose program applies the selector's allowance.
#[test]
fn subscribers_behind_constrained_links_adapt_without_loss() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs the tests as root");
        eprintln!("\n*** SKIPPED subscribers_behind_constrained_links_adapt_without_loss: needs root for namespaces and tc ***\n");
        return;
    }
    if !have_data_and_ffmpeg() {
        return;
    }
    let runs: Vec<_> =
        ["shared", "kernel"].map(|dp| std::thread::spawn(move || (dp, constrained_links(dp)))).into_iter().collect();
    for r in runs {
        let (dp, s) = r.join().unwrap();
        let links = s["links"].as_array().unwrap();
        let every: Vec<serde_json::Value> =
            [(0, 0, 0), (0, 0, 1), (0, 0, 2), (1, 0, 0), (1, 0, 1), (1, 0, 2)].iter().map(|l| json!(l)).collect();
        let path = if dp == "kernel" { "kernel" } else { "user" };
        for l in links {
            assert_eq!(l["sink_path"], path, "{dp}: {l}");
            assert!(l["expected_after"].as_u64().unwrap() > 1000, "{dp}: the subscriber got its stream: {l}");
            assert!(l["loss_after"].as_f64().unwrap() < 0.01, "{dp}: loss after adaptation: {l}");
        }
        let (narrow, mid, open) = (&links[0], &links[1], &links[2]);
        assert_eq!(open["layers_after"].as_array().unwrap(), &every, "{dp}: the unlimited link gets every layer");
        assert_eq!(open["aimd_allowance"], "d1q0t2", "{dp}: {open}");
        let kbps = |l: &serde_json::Value| l["received_kbps_after"].as_f64().unwrap();
        assert!(kbps(narrow) < 150.0 && kbps(mid) < 600.0, "{dp}: within the links: {s}");
        assert!(kbps(narrow) < kbps(mid) && kbps(mid) < kbps(open), "{dp}: {s}");
        assert!(narrow["aimd_allowance"].as_str().unwrap().starts_with("d0"), "{dp}: no enhancement layer at 150k");
    }
}
