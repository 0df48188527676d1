//! RTSP publishing (issue 16): ffmpeg (and GStreamer) push the demo clip with
//! ANNOUNCE/RECORD into a `publish` session, a second ffmpeg plays it back through `fanout` frame for frame, HTTP
//! players get it as MPEG-TS, a publisher that leaves is followed by the next one, and
//! resources that take no publisher refuse it.

mod common;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

const CONFIG: &str = "[[session]]\nname = \"pub\"\nsource = { publish = true }\n";

/// The demo clip as MP4 (ffmpeg's RTSP muxer wants AAC with its global header, which TS
/// does not carry): a file of each caller's own, since tests run side by side and each
/// removes its file when done (a shared one was rewritten or removed under another test's
/// publisher, which then never published).
fn clip() -> std::path::PathBuf {
    static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("fanout-publish-{}-{n}.mp4", std::process::id()));
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts");
    let ok = Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-i", demo, "-c", "copy", "-bsf:a", "aac_adtstoasc"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(ok.success());
    out
}

/// ffmpeg publishing `clip` looped to `url` (30 s at most), over `transport`.
fn publish(clip: &std::path::Path, url: &str, transport: Option<&str>) -> Kill {
    let mut c = Command::new("ffmpeg");
    c.args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i"]).arg(clip);
    // Bounded by its output's length (a `timeout` wrapper would outlive a kill).
    c.args(["-t", "30", "-c", "copy", "-f", "rtsp"]);
    if let Some(t) = transport {
        c.args(["-rtsp_transport", t]);
    }
    Kill(c.arg(url).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
}

fn publisher(relay: &Relay) -> Value {
    relay.ok("GET", "/v1/sessions/pub", None)["publisher"].clone()
}

#[test]
fn ffmpeg_publishes_and_another_ffmpeg_plays_it_back() {
    if !have_ffmpeg() {
        return;
    }
    let clip = clip();
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let url = format!("rtsp://{}/pub", rtsp_addr(&relay));
    assert_eq!(publisher(&relay)["state"], "waiting");
    // Nothing published yet: nothing to describe.
    let (ok, _) = ffmpeg_decode(&url, &[], 1);
    assert!(!ok);

    // ffmpeg's default transport, RTP over UDP, is taken (issue 30 item 12: it was 461).
    let first = publish(&clip, &url, None);
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    assert_eq!(publisher(&relay)["transport"], "udp", "{}", publisher(&relay));
    // Played back through the relay: 100 pictures, each one of the clip's, in order.
    let want = pictures(&["-i", clip.to_str().unwrap()]);
    assert_eq!(want.len(), 200, "8 s at 25 fps");
    let got = pictures(&["-rtsp_transport", "tcp", "-i", &url, "-frames:v", "100"]);
    assert_eq!(got.len(), 100);
    let looped: Vec<String> = want.iter().chain(&want).cloned().collect();
    assert!(
        looped.windows(got.len()).any(|w| w == got.as_slice()),
        "the pictures played back are not a run of the clip's"
    );
    // HTTP players get it as MPEG-TS, from the same tracks.
    let probe = Command::new("timeout")
        .args(["20", "ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0"])
        .arg(relay.url("/v1/sessions/pub/stream"))
        .output()
        .unwrap();
    let codecs = String::from_utf8_lossy(&probe.stdout).to_string();
    assert!(codecs.contains("h264") && codecs.contains("aac"), "{codecs}");

    // The publisher leaves: the session waits; the next one continues it.
    drop(first);
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "waiting"), "{}", publisher(&relay));
    let _second = publish(&clip, &url, Some("tcp"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"));
    assert_eq!(publisher(&relay)["publishes"], 2);
    let (ok, log) = ffmpeg_decode(&url, &["-rtsp_transport", "tcp"], 2);
    assert!(ok && decoded_frames(&log) >= 45, "{log}");
    let _ = std::fs::remove_file(&clip);
}

/// A publisher whose H.264 has B-frames (x264, two between anchors): HTTP players get
/// MPEG-TS whose decoding times rise and precede the presentation times (RTP carries none),
/// and ffmpeg remuxes it with no complaint about them.
#[test]
fn b_frames_published_get_decoding_times_in_the_mpegts() {
    if !have_ffmpeg() {
        return;
    }
    let clip = std::env::temp_dir().join(format!("fanout-publish-b-{}.mp4", std::process::id()));
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts");
    let encoded = Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-i", demo, "-c:v", "libx264", "-preset", "veryfast"])
        .args(["-bf", "2", "-g", "50", "-c:a", "copy", "-bsf:a", "aac_adtstoasc"])
        .arg(&clip)
        .status()
        .unwrap();
    assert!(encoded.success());
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let _publisher = publish(&clip, &format!("rtsp://{}/pub", rtsp_addr(&relay)), Some("tcp"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let stream = relay.url("/v1/sessions/pub/stream");
    let probe = Command::new("timeout")
        .args(["20", "ffprobe", "-v", "warning", "-select_streams", "v", "-show_entries", "packet=pts,dts"])
        .args(["-of", "csv=p=0", "-read_intervals", "%+3"])
        .arg(&stream)
        .output()
        .unwrap();
    let times: Vec<(i64, i64)> = String::from_utf8_lossy(&probe.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split(',').map(|v| v.trim().parse::<i64>());
            Some((f.next()?.ok()?, f.next()?.ok()?))
        })
        .collect();
    assert!(times.len() >= 50, "{times:?} {probe:?}");
    assert!(times.iter().any(|(pts, dts)| pts > dts), "B-frames reordered: {times:?}");
    assert!(times.windows(2).all(|w| w[1].1 > w[0].1), "decoding times rise: {times:?}");
    assert!(times.iter().all(|(pts, dts)| dts <= pts), "{times:?}");
    let remux = Command::new("timeout")
        .args(["20", "ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "warning", "-i"])
        .arg(&stream)
        .args(["-t", "3", "-c", "copy", "-f", "mp4", "-movflags", "frag_keyframe", "-y", "/dev/null"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&remux.stderr);
    assert!(remux.status.success() && !log.contains("DTS"), "{log}");
    let _ = std::fs::remove_file(&clip);
}

/// GStreamer's `rtspclientsink` publishes the demo clip (H.264 + AAC, ANNOUNCE/RECORD over
/// TCP), and ffmpeg plays it back through the relay.
#[test]
fn gstreamer_publishes_and_ffmpeg_plays_it_back() {
    if !have_ffmpeg() || !have_gstreamer() {
        return;
    }
    if !Command::new("gst-inspect-1.0").arg("rtspclientsink").output().is_ok_and(|o| o.status.success()) {
        assert!(std::env::var_os("CI").is_none(), "scripts/test installs gstreamer1.0-rtsp (rtspclientsink)");
        eprintln!("\n*** SKIPPED gstreamer_publishes: no rtspclientsink (gstreamer1.0-rtsp) ***\n");
        return;
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let url = format!("rtsp://{}/pub", rtsp_addr(&relay));
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts");
    // The clip's 8 s, at its own pace (the sink syncs to the clock), then EOS.
    let _gst = Kill(
        Command::new("timeout")
            .args(["-s", "INT", "20", "gst-launch-1.0", "-q", "filesrc", &format!("location={demo}")])
            .args(["!", "tsdemux", "name=d", "d.", "!", "queue", "!", "h264parse", "!"])
            .args(["rtspclientsink", "name=s", &format!("location={url}"), "protocols=tcp"])
            .args(["d.", "!", "queue", "!", "aacparse", "!", "s."])
            .stdout(Stdio::null())
            // (It reports the relay going away at the end as an error: not ours to show.)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let tracks = relay.ok("GET", "/v1/sessions/pub", None)["rtsp_tracks"].as_array().map_or(0, Vec::len);
    assert_eq!(tracks, 2, "video and audio");
    let (ok, log) = ffmpeg_decode(&url, &["-rtsp_transport", "tcp"], 3);
    assert!(ok && decoded_frames(&log) >= 60, "{log}");
}

/// An RTSP client playing `pub` over UDP that asks for keyframes: its RTP socket, and a
/// function sending a PLI naming `ssrc` to the relay's RTCP port.
fn asking_reader(relay: &Relay) -> (std::net::UdpSocket, impl Fn(u32)) {
    let rtcp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let p = rtsp_play(rtsp_addr(relay), "pub", Some(rtcp.local_addr().unwrap().port()));
    let server_rtcp = p.server_rtcp();
    let pli = move |ssrc| {
        let mut pli = Vec::new();
        fanout_proto::rtp::rtcp::write_keyframe_request(&mut pli, 0x1234, ssrc);
        rtcp.send_to(&pli, ("127.0.0.1", server_rtcp)).unwrap();
    };
    (p.rtp, pli)
}

/// A reader's keyframe requests reach an RTSP publisher over UDP: GStreamer's rtspclientsink
/// publishes a live picture encoded with a keyframe every 80 s (openh264); an RTSP client of
/// the path gets no new keyframe in 3 s while it asks for none, then sends a PLI every 250 ms
/// for 4 s: the relay passes them on as one request a second at most (the publisher's status
/// counts them), GStreamer's RTP session turns each into a keyframe from its encoder, and the
/// client gets them. (rtspclientsink reads no RTCP on its RTSP connection: the interleaved
/// case is the next test's, with a publisher by hand.)
#[test]
fn an_rtsp_publisher_is_asked_for_the_keyframes_its_readers_want() {
    if !have_gstreamer() {
        return;
    }
    for element in ["rtspclientsink", "openh264enc"] {
        if !Command::new("gst-inspect-1.0").arg(element).output().is_ok_and(|o| o.status.success()) {
            assert!(std::env::var_os("CI").is_none(), "scripts/test installs GStreamer's {element}");
            eprintln!("\n*** SKIPPED an_rtsp_publisher_is_asked: no {element} ***\n");
            return;
        }
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let url = format!("rtsp://{}/pub", rtsp_addr(&relay));
    let _gst = Kill(
        Command::new("timeout")
            .args(["-s", "INT", "30", "gst-launch-1.0", "-q", "videotestsrc", "is-live=true", "!"])
            .args(["video/x-raw,width=320,height=240,framerate=25/1", "!", "openh264enc", "gop-size=2000", "!"])
            .args(["h264parse", "!", "rtspclientsink", &format!("location={url}"), "protocols=udp"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let (rtp, pli) = asking_reader(&relay);
    rtp.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    // Keyframes (an IDR slice, whole or its first fragment) arriving in `secs`, asking for one
    // every 250 ms if `ask`.
    let keyframes = |secs: u64, ask: bool| {
        let (mut n, mut ssrc, mut asked_at) = (0, None, std::time::Instant::now());
        let t0 = std::time::Instant::now();
        let mut b = [0u8; 2048];
        while t0.elapsed() < Duration::from_secs(secs) {
            if let Ok(len) = rtp.recv(&mut b) {
                let v = fanout_proto::rtp::RtpView::parse(&b[..len]).unwrap();
                ssrc = Some(v.ssrc());
                let pl = v.payload();
                let idr = match pl.first().map(|x| x & 0x1f) {
                    Some(5) => true,
                    Some(28) => pl.get(1).is_some_and(|h| h & 0x80 != 0 && h & 0x1f == 5),
                    _ => false,
                };
                n += usize::from(idr);
            }
            if let (true, Some(ssrc)) = (ask, ssrc) {
                if asked_at.elapsed() >= Duration::from_millis(250) {
                    pli(ssrc);
                    asked_at = std::time::Instant::now();
                }
            }
        }
        n
    };
    // The ring's keyframe first, then none while nobody asks.
    keyframes(1, false);
    let unasked = keyframes(3, false);
    let asked = keyframes(4, true);
    let sent = publisher(&relay)["keyframes_asked"].as_u64().unwrap();
    eprintln!("{unasked} keyframes unasked in 3 s; asking 16 times in 4 s: {sent} requests to the publisher, {asked} keyframes");
    assert_eq!(unasked, 0, "the encoder makes a keyframe every 80 s");
    assert!((2..=5).contains(&sent), "{sent} requests in 4 s");
    assert!(asked >= 2, "{asked} keyframes after {sent} requests");
}

/// The same over an RTSP publisher's connection (interleaved), with a publisher by hand: it
/// sends H.264 slices as SSRC 0xABCD on channel 0; a reader asks for a keyframe every 100 ms
/// for 3 s; on channel 1 the publisher reads receiver reports with a PLI naming 0xABCD, at
/// most one a second.
#[test]
fn an_interleaved_rtsp_publisher_reads_keyframe_requests_on_its_rtcp_channel() {
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let addr = rtsp_addr(&relay);
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let sdp = "v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1\r\na=control:streamid=0\r\n";
    let mut request = |head: String| -> String {
        c.write_all(head.as_bytes()).unwrap();
        let answer = read_head(&mut c);
        assert!(answer.starts_with("RTSP/1.0 200"), "{head}\n{answer}");
        answer
    };
    request(format!(
        "ANNOUNCE rtsp://{addr}/pub RTSP/1.0\r\nCSeq: 1\r\nContent-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
        sdp.len()
    ));
    let setup = request(format!(
        "SETUP rtsp://{addr}/pub/streamid=0 RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1;mode=record\r\n\r\n"
    ));
    let session =
        setup.lines().find_map(|l| l.strip_prefix("Session: ")).unwrap().split(';').next().unwrap().to_string();
    request(format!("RECORD rtsp://{addr}/pub RTSP/1.0\r\nCSeq: 3\r\nSession: {session}\r\n\r\n"));
    // Its media: a keyframe, then P slices, 25 a second for 8 s.
    let mut w = c.try_clone().unwrap();
    let feeder = std::thread::spawn(move || {
        for i in 0..200u32 {
            let mut pkt = vec![0u8; 12];
            fanout_proto::rtp::write_header(&mut pkt, true, 96, i as u16, i * 3600, 0xABCD);
            pkt.extend_from_slice(if i == 0 { &[0x65, 0x88, 0x80, 0x10] } else { &[0x41, 0x9a, 0x02, 0x20] });
            let mut frame = vec![b'$', 0];
            frame.extend_from_slice(&(pkt.len() as u16).to_be_bytes());
            frame.extend_from_slice(&pkt);
            if w.write_all(&frame).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(40));
        }
    });
    assert!(wait_for(Duration::from_secs(5), || publisher(&relay)["state"] == "publishing"), "{}", publisher(&relay));
    let (rtp, pli) = asking_reader(&relay);
    rtp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 2048];
    let n = rtp.recv(&mut b).expect("RTP from the relay");
    let ssrc = fanout_proto::rtp::RtpView::parse(&b[..n]).unwrap().ssrc();
    // What comes on the publisher's connection: `$`-framed RTCP on channel 1.
    let reader = std::thread::spawn(move || {
        let (mut plis, mut other) = (0, 0);
        let t0 = std::time::Instant::now();
        let mut head = [0u8; 4];
        c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        while t0.elapsed() < Duration::from_secs(4) {
            if c.read_exact(&mut head).is_err() {
                continue;
            }
            assert_eq!(head[0], b'$', "an interleaved frame");
            let mut body = vec![0u8; usize::from(u16::from_be_bytes([head[2], head[3]]))];
            c.read_exact(&mut body).unwrap();
            if head[1] == 1 && fanout_proto::rtp::rtcp::keyframe_requests(&body).contains(&0xABCD) {
                plis += 1;
            } else {
                other += 1;
            }
        }
        (plis, other)
    });
    for _ in 0..30 {
        pli(ssrc);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (plis, other) = reader.join().unwrap();
    let sent = publisher(&relay)["keyframes_asked"].as_u64().unwrap();
    eprintln!(
        "30 requests in 3 s: {sent} sent to the publisher, it read {plis} PLIs naming its SSRC ({other} other frames)"
    );
    assert!((2..=5).contains(&plis), "{plis} PLIs on the publisher's channel");
    assert_eq!(sent, plis as u64);
    drop(feeder);
}

/// One RTSP request on a fresh connection; the status code.
fn rtsp_status(addr: std::net::SocketAddr, request: &str) -> u16 {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{head:?}"))
}

/// A session that is not `publish` refuses ANNOUNCE (405), an unknown one is 404, a
/// description that does not parse is 400, and a second publisher while one records is 455.
/// A publisher that sends garbage has it counted and dropped; when it leaves, the session
/// waits for the next.
#[test]
fn publishers_are_refused_where_they_do_not_belong() {
    let relay = Relay::with_config(CONFIG, &[]);
    let addr = rtsp_addr(&relay);
    let sdp = "v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=control:streamid=0\r\n";
    let announce = |name: &str, body: &str| {
        format!(
            "ANNOUNCE rtsp://{addr}/{name} RTSP/1.0\r\nCSeq: 1\r\nContent-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    assert_eq!(rtsp_status(addr, &announce("demo", sdp)), 405);
    assert_eq!(rtsp_status(addr, &announce("nothing", sdp)), 404);
    assert_eq!(rtsp_status(addr, &announce("pub", "not a description")), 400);
    // A publisher recording over its connection (ANNOUNCE, SETUP, RECORD), then a second.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut talk = |req: String| {
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 2048];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    assert!(talk(announce("pub", sdp)).starts_with("RTSP/1.0 200"));
    let setup = talk(format!(
        "SETUP rtsp://{addr}/pub/streamid=0 RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1;mode=record\r\n\r\n"
    ));
    let session =
        setup.lines().find_map(|l| l.strip_prefix("Session: ")).unwrap().split(';').next().unwrap().to_string();
    assert!(talk(format!("RECORD rtsp://{addr}/pub RTSP/1.0\r\nCSeq: 3\r\nSession: {session}\r\n\r\n"))
        .starts_with("RTSP/1.0 200"));
    assert!(wait_for(Duration::from_secs(5), || publisher(&relay)["state"] == "publishing"));
    assert_eq!(rtsp_status(addr, &announce("pub", sdp)), 455);

    // It sends garbage on its channel (not RTP, then RTP of a foreign version): counted as
    // dropped, nothing reaches the session, and the relay answers everyone else as before.
    for frame in [&b"not rtp at all"[..], &[0x40; 40], &[0x80, 96, 0, 1]] {
        let mut f = vec![b'$', 0];
        f.extend_from_slice(&(frame.len() as u16).to_be_bytes());
        f.extend_from_slice(frame);
        s.write_all(&f).unwrap();
    }
    let dropped = || publisher(&relay)["tracks"][0]["dropped"].as_u64().unwrap_or(0);
    assert!(wait_for(Duration::from_secs(5), || dropped() == 3), "{}", publisher(&relay));
    assert_eq!(publisher(&relay)["tracks"][0]["packets"], 0);
    assert_eq!(relay.ok("GET", "/v1/sessions/pub", None)["source"]["packets"], 0);
    assert_eq!(rtsp_status(addr, &format!("OPTIONS rtsp://{addr}/demo RTSP/1.0\r\nCSeq: 9\r\n\r\n")), 200);
    // Its connection closes: the session waits for the next publisher.
    drop(s);
    assert!(wait_for(Duration::from_secs(5), || publisher(&relay)["state"] == "waiting"), "{}", publisher(&relay));
}

/// Issue 30 item 11: when the publisher leaves and none comes back within
/// `publisher_grace_s`, players are told the stream ended: ffmpeg over RTSP (interleaved and
/// UDP) and over HTTP exits by itself. A publisher back within the grace changes nothing.
#[test]
fn players_get_the_end_when_the_publisher_leaves() {
    if !have_ffmpeg() {
        return;
    }
    let clip = clip();
    let relay = Relay::with_config(&format!("publisher_grace_s = 4\n{CONFIG}"), &["--no-demo"]);
    let url = format!("rtsp://{}/pub", rtsp_addr(&relay));
    let first = publish(&clip, &url, Some("tcp"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"));
    let play = |args: &[&str]| {
        Kill(
            Command::new("timeout")
                .args(["40", "ffmpeg", "-nostdin", "-v", "error"])
                .args(args)
                .args(["-f", "null", "-"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let http = relay.url("/v1/sessions/pub/stream");
    let mut players = [
        ("RTSP interleaved", play(&["-rtsp_transport", "tcp", "-i", &url])),
        ("RTSP over UDP", play(&["-rtsp_transport", "udp", "-i", &url])),
        ("HTTP", play(&["-i", &http])),
    ];
    std::thread::sleep(Duration::from_secs(4));
    // A publisher that comes back within the grace: the players play on.
    drop(first);
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "waiting"));
    let second = publish(&clip, &url, Some("tcp"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"));
    std::thread::sleep(Duration::from_secs(3));
    for (what, p) in players.iter_mut() {
        assert!(p.0.try_wait().unwrap().is_none(), "{what} ended though the publisher came back");
    }
    // The publisher goes for good: each player ends by itself, soon after the grace.
    drop(second);
    let t0 = std::time::Instant::now();
    for (what, p) in players.iter_mut() {
        let st = p.0.wait().unwrap();
        assert_ne!(st.code(), Some(124), "{what} hung after the publisher left");
        assert!(t0.elapsed() < Duration::from_secs(15), "{what} ended only after {:?}", t0.elapsed());
    }
    let _ = std::fs::remove_file(&clip);
}

/// Issue 30 item 9: across a publisher change, the sender reports a client gets keep one
/// clock: each report's RTP time against its wall clock follows from the first report's at
/// the video's 90 kHz (a new publisher's first report, mapped with the last one's offset, had
/// jumped by hours).
#[test]
fn sender_reports_keep_one_clock_across_publishers() {
    if !have_ffmpeg() {
        return;
    }
    let clip = clip();
    let relay = Relay::with_config(&format!("publisher_grace_s = 60\n{CONFIG}"), &["--no-demo"]);
    let addr = rtsp_addr(&relay);
    let url = format!("rtsp://{addr}/pub");
    let first = publish(&clip, &url, Some("tcp"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"));
    let rtcp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let play = rtsp_play(addr, "pub", Some(rtcp.local_addr().unwrap().port()));
    // (NTP seconds, RTP) of each sender report for the video track.
    let mut reports = sender_reports(&rtcp, std::time::Instant::now() + Duration::from_secs(6));
    drop(first);
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "waiting"));
    let _second = publish(&clip, &url, Some("tcp"));
    assert!(wait_for(Duration::from_secs(10), || publisher(&relay)["state"] == "publishing"));
    reports.extend(sender_reports(&rtcp, std::time::Instant::now() + Duration::from_secs(12)));
    drop(play);
    assert_one_clock(&reports, 90_000.0);
    let _ = std::fs::remove_file(&clip);
}

/// What an RTSP reader there all along got (more than `least` packets) is one stream: one
/// SSRC, no sequence number missing, RTP time never running back.
fn assert_one_stream(packets: &[(std::time::Instant, u32, u16, u32)], least: usize) {
    assert!(packets.len() > least, "{} packets", packets.len());
    let (_, ssrc, seq0, _) = packets[0];
    assert!(packets.iter().all(|p| p.1 == ssrc), "the SSRC changed");
    let missing = usize::from(packets.last().unwrap().2.wrapping_sub(seq0)) + 1 - packets.len();
    assert_eq!(missing, 0, "sequence numbers missing");
    assert!(packets.windows(2).all(|w| w[1].3.wrapping_sub(w[0].3) as i32 >= 0), "RTP time ran back");
}

/// ffmpeg decoding `url` (`args` before it) for `seconds`, in a thread: whether it ended
/// well, the pictures and the audio frames it decoded, and what it said.
fn decode(
    url: String,
    args: &'static [&'static str],
    seconds: &'static str,
) -> std::thread::JoinHandle<(bool, usize, usize, String)> {
    std::thread::spawn(move || {
        let out = Command::new("timeout")
            .args(["40", "ffmpeg", "-nostdin", "-loglevel", "error"])
            .args(args)
            .args(["-i", &url, "-t", seconds, "-map", "0", "-f", "framemd5", "-"])
            .output()
            .unwrap();
        let md5 = String::from_utf8_lossy(&out.stdout).into_owned();
        let count = |s: &str| md5.lines().filter(|l| l.starts_with(s)).count();
        (out.status.success(), count("0,"), count("1,"), String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

/// `fallback`: a path that is always available. With no publisher the file plays (the
/// status says `fallback`); an RTMP publisher replaces it at once, though the path has no
/// `takeover`, and when it leaves the file plays again. An RTSP reader there all along sees
/// one stream (one SSRC, no sequence number missing, RTP time never running back) and
/// ffmpeg decodes it through both switches without a decoder error.
#[test]
fn a_fallback_plays_while_no_one_publishes_and_readers_see_one_stream() {
    if !have_ffmpeg() {
        return;
    }
    let config = format!("[[session]]\nname = \"pub\"\nsource = {{ publish = true, fallback = \"{DEMO_TS}\" }}\n");
    let relay = Relay::with_config(&config, &["--no-demo"]);
    let now = |how: &str| wait_for(Duration::from_secs(10), || publisher(&relay)["transport"] == how);
    assert!(now("fallback"), "{}", publisher(&relay));
    let addr = rtsp_addr(&relay);
    let url = format!("rtsp://{addr}/pub");
    let decoded = decode(url, &["-rtsp_transport", "tcp"], "16");
    let play = rtsp_play(addr, "pub", None);
    let rtp = play.rtp.try_clone().unwrap();
    let packets = rtp_headers_for(rtp, Duration::from_secs(15));
    std::thread::sleep(Duration::from_secs(4));
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let live = ffmpeg_publish("flv", &format!("rtmp://{rtmp}/pub"));
    assert!(now("rtmp"), "the publisher did not replace the fallback: {}", publisher(&relay));
    assert_eq!(publisher(&relay)["takeovers"], 0, "replacing the fallback is no takeover");
    std::thread::sleep(Duration::from_secs(5));
    drop(live);
    assert!(now("fallback"), "the fallback did not play again: {}", publisher(&relay));

    let packets = packets.join().unwrap();
    drop(play);
    assert_one_stream(&packets, 300);
    let (ok, frames, _, errors) = decoded.join().unwrap();
    assert!(ok && errors.is_empty(), "ffmpeg across the switches: {errors}");
    assert!(frames >= 16 * 25 * 9 / 10, "{frames} pictures in 16 s");
}

/// `fallback = "freeze"`: while no one publishes, the last publisher's last picture is held
/// (its keyframe again twice a second) and its AAC is silent, in its own codecs, so no
/// player has to start over. Three switches (live, held, live, held): an RTSP reader there
/// all along sees one stream with no gap longer than the held picture's interval (one
/// SSRC, no sequence number missing, RTP time never running back), and ffmpeg decodes the
/// video and audio over RTSP and over HLS across them without a decoder error.
#[test]
fn freeze_holds_the_last_picture_while_no_one_publishes() {
    if !have_ffmpeg() {
        return;
    }
    let config = "[[session]]\nname = \"pub\"\nsource = { publish = true, fallback = \"freeze\" }\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let now = |how: &str| wait_for(Duration::from_secs(10), || publisher(&relay)["transport"] == how);
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let rtmp = format!("rtmp://{rtmp}/pub");
    std::thread::sleep(Duration::from_secs(1));
    assert!(publisher(&relay)["transport"].is_null(), "nothing to hold before a publisher: {}", publisher(&relay));
    let live = ffmpeg_publish("flv", &rtmp);
    assert!(now("rtmp"), "{}", publisher(&relay));
    let addr = rtsp_addr(&relay);
    let hls = relay.url("/v1/sessions/pub/hls/index.m3u8");
    assert!(wait_for(Duration::from_secs(10), || ureq::get(&hls).call().is_ok()));
    let over_rtsp = decode(format!("rtsp://{addr}/pub"), &["-rtsp_transport", "tcp"], "15");
    let over_hls = decode(hls, &[], "15");
    let play = rtsp_play(addr, "pub", None);
    let packets = rtp_headers_for(play.rtp.try_clone().unwrap(), Duration::from_secs(14));
    std::thread::sleep(Duration::from_secs(3));
    drop(live);
    assert!(now("fallback"), "the picture is not held: {}", publisher(&relay));
    std::thread::sleep(Duration::from_secs(3));
    let live = ffmpeg_publish("flv", &rtmp);
    assert!(now("rtmp"), "the publisher did not replace the held picture: {}", publisher(&relay));
    std::thread::sleep(Duration::from_secs(4));
    drop(live);
    assert!(now("fallback"), "the picture is not held again: {}", publisher(&relay));

    let packets = packets.join().unwrap();
    drop(play);
    assert_one_stream(&packets, 150);
    let gap = packets.windows(2).map(|w| w[1].0 - w[0].0).max().unwrap();
    assert!(gap < Duration::from_millis(1500), "a gap of {gap:?} in the video");
    for (face, decoded) in [("RTSP", over_rtsp), ("HLS", over_hls)] {
        let (ok, pictures, audio, errors) = decoded.join().unwrap();
        assert!(ok && errors.is_empty(), "ffmpeg over {face} across the switches: {errors}");
        assert!(pictures >= 100 && audio >= 300, "over {face}: {pictures} pictures, {audio} audio frames in 15 s");
    }
}

/// One picture decoded from `url`: its width, height and luma samples (as coded: a `gray`
/// output would stretch them to full range).
fn grab_luma(url: &str) -> (usize, usize, Vec<u8>) {
    let out = Command::new("timeout")
        .args(["20", "ffmpeg", "-nostdin", "-loglevel", "error", "-rtsp_transport", "tcp", "-i", url])
        .args(["-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "yuv420p", "-"])
        .output()
        .unwrap();
    let probe = Command::new("timeout")
        .args(["20", "ffprobe", "-v", "error", "-rtsp_transport", "tcp", "-select_streams", "v:0"])
        .args(["-show_entries", "stream=width,height", "-of", "csv=p=0", url])
        .output()
        .unwrap();
    let size = String::from_utf8_lossy(&probe.stdout).trim().to_string();
    let (w, h) = size.split_once(',').unwrap_or_else(|| panic!("no size from ffprobe: {size:?}"));
    let (w, h): (usize, usize) = (w.parse().unwrap(), h.parse().unwrap());
    let size = w * h + 2 * (w.div_ceil(2) * h.div_ceil(2));
    assert_eq!(out.stdout.len(), size, "one {w}×{h} picture: {}", String::from_utf8_lossy(&out.stderr));
    (w, h, out.stdout[..w * h].to_vec())
}

/// The slate's colour bars, exact: each bar's luma at its middle macroblock, and the band's
/// black at the bottom left.
fn assert_bars(w: usize, h: usize, luma: &[u8]) {
    const BARS: [u8; 7] = [180, 162, 131, 112, 84, 65, 35];
    let mbs = w.div_ceil(16);
    for (i, want) in BARS.iter().enumerate() {
        let columns: Vec<usize> = (0..mbs).filter(|x| x * 7 / mbs == i).collect();
        let x = columns[columns.len() / 2] * 16 + 8;
        assert_eq!(luma[8 * w + x], *want, "bar {i} of the {w}×{h} slate");
    }
    assert_eq!(luma[(h - 1) * w], 16, "the band under the bars");
}

/// `fallback = "slate"`: the path is available before anyone publishes, with a picture the
/// relay draws (colour bars, exact, at 1280×720, and silent AAC); a publisher replaces it
/// at once, and when it leaves the slate comes back at the publisher's picture size. An
/// RTSP reader there all along sees one stream (one SSRC, no sequence number missing, RTP
/// time never running back), and ffmpeg decodes it over RTSP and over HLS across both
/// switches without an error, though the publisher's parameters differ from the slate's
/// (its sets go in band from its first keyframe); an HTTP-FLV player that joins while it
/// publishes gets its decoder configuration, not the slate's.
#[test]
fn a_slate_stands_in_before_and_between_publishers() {
    if !have_ffmpeg() {
        return;
    }
    let config = "[[session]]\nname = \"pub\"\nsource = { publish = true, fallback = \"slate\" }\n";
    let relay = Relay::with_config(config, &["--no-demo"]);
    let now = |how: &str| wait_for(Duration::from_secs(10), || publisher(&relay)["transport"] == how);
    assert!(now("fallback"), "no slate before the first publisher: {}", publisher(&relay));
    let addr = rtsp_addr(&relay);
    let url = format!("rtsp://{addr}/pub");
    let hls = relay.url("/v1/sessions/pub/hls/index.m3u8");
    assert!(wait_for(Duration::from_secs(10), || ureq::get(&hls).call().is_ok()));
    let over_rtsp = decode(url.clone(), &["-rtsp_transport", "tcp"], "14");
    let over_hls = decode(hls, &[], "14");
    let play = rtsp_play(addr, "pub", None);
    let packets = rtp_headers_for(play.rtp.try_clone().unwrap(), Duration::from_secs(13));
    let (w, h, luma) = grab_luma(&url);
    assert_eq!((w, h), (1280, 720));
    assert_bars(w, h, &luma);

    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let live = ffmpeg_publish("flv", &format!("rtmp://{rtmp}/pub"));
    assert!(now("rtmp"), "the publisher did not replace the slate: {}", publisher(&relay));
    std::thread::sleep(Duration::from_secs(1));
    let (ok, pictures, _, errors) = decode(relay.url("/pub.flv"), &[], "2").join().unwrap();
    assert!(ok && errors.is_empty() && pictures >= 25, "HTTP-FLV joining the publisher: {pictures} pictures; {errors}");
    drop(live);
    assert!(now("fallback"), "the slate did not come back: {}", publisher(&relay));
    let (w, h, luma) = grab_luma(&url);
    assert_eq!((w, h), (480, 270), "the slate at the publisher's size");
    assert_bars(w, h, &luma);

    let packets = packets.join().unwrap();
    drop(play);
    assert_one_stream(&packets, 100);
    for (face, decoded) in [("RTSP", over_rtsp), ("HLS", over_hls)] {
        let (ok, pictures, audio, errors) = decoded.join().unwrap();
        assert!(ok && errors.is_empty(), "ffmpeg over {face} across the switches: {errors}");
        assert!(pictures >= 20 && audio >= 300, "over {face}: {pictures} pictures, {audio} audio frames in 14 s");
    }
}
