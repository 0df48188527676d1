//! Paced, fair egress (issue 17): players start the demo without timestamp warnings (a new
//! subscriber's catch-up is paced), and a subscriber that stalls long enough for the ring to
//! lap it resumes at a keyframe, so its decoder shows no broken picture after the lapse.

mod common;

use common::*;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

/// What ffmpeg said while it played `url` (`-vf showinfo`: a line per decoded frame), stopped
/// (SIGSTOP) after 3 s until `sent` (the relay's count of packets sent to it) stood still
/// (the socket buffers in between are full) and then long enough for the ring to lap it,
/// then left to play 4 s more.
fn play_with_a_stall(url: &str, input: &[&str], sent: impl Fn() -> u64) -> String {
    let mut child = Command::new("ffmpeg")
        .args(["-hide_banner", "-nostdin", "-threads", "1"])
        .args(input)
        .args(["-i", url, "-map", "0:v", "-vf", "showinfo", "-f", "null", "-"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ffmpeg");
    let mut err = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let pid = child.id() as i32;
    let signal = |sig| {
        // SAFETY: kill has no memory preconditions; pid is our child, not yet reaped.
        unsafe { libc::kill(pid, sig) };
    };
    std::thread::sleep(Duration::from_secs(3));
    signal(libc::SIGSTOP);
    let mut last = (sent(), std::time::Instant::now());
    let stood = wait_for(Duration::from_secs(40), || {
        std::thread::sleep(Duration::from_millis(250));
        let now = sent();
        if now != last.0 {
            last = (now, std::time::Instant::now());
        }
        last.1.elapsed() >= Duration::from_millis(1500)
    });
    // The ring (128 packets) laps it within 2 s of the stream.
    std::thread::sleep(Duration::from_secs(3));
    signal(libc::SIGCONT);
    assert!(stood, "{url}: the relay kept sending to a stopped player");
    std::thread::sleep(Duration::from_secs(4));
    signal(libc::SIGINT);
    let limit = std::time::Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < limit {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    log.join().unwrap()
}

/// Checks the log of a lapped player: after the jump in presentation time (the lapse), its
/// first frame is a keyframe and the decoder reports no error from there on.
fn assert_clean_resume(what: &str, log: &str) {
    let lines: Vec<&str> = log.lines().collect();
    let pts = |l: &str| -> Option<f64> {
        let rest = l.split("pts_time:").nth(1)?;
        rest.split_whitespace().next()?.parse().ok()
    };
    let frames: Vec<(usize, f64)> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("Parsed_showinfo"))
        .filter_map(|(i, l)| Some((i, pts(l)?)))
        .collect();
    assert!(frames.len() > 40, "{what}: too few frames decoded:\n{log}");
    let resume = frames.windows(2).find(|w| w[1].1 - w[0].1 > 1.0).map(|w| w[1].0);
    let Some(resume) = resume else { panic!("{what}: no lapse in the decoded frames:\n{log}") };
    assert!(
        lines[resume].contains("iskey:1"),
        "{what}: the first frame after the lapse is not a keyframe:\n{}",
        lines[resume.saturating_sub(3)..=resume].join("\n")
    );
    let errors: Vec<&&str> = lines[resume..].iter().filter(|l| l.starts_with("[h264 @")).collect();
    assert!(errors.is_empty(), "{what}: decode errors after the resume: {errors:#?}");
    let after = frames.iter().filter(|f| f.0 > resume).count();
    assert!(after >= 20, "{what}: only {after} frames after the resume:\n{log}");
}

/// A small ring, so a stall of a few seconds laps the subscriber.
const CONFIG: &str = "[[session]]\nname = \"tv\"\nring = 128\nsource = { demo = true }\n";

#[test]
fn a_lapped_http_subscriber_resumes_at_a_keyframe() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let url = relay.url("/v1/sessions/tv/stream");
    let sent = || {
        let sinks = relay.ok("GET", "/v1/sessions/tv/sinks", None);
        sinks["sinks"].as_array().into_iter().flatten().map(|s| s["packets_sent"].as_u64().unwrap_or(0)).sum()
    };
    // A small receive buffer: the stall reaches the relay soon.
    let log = play_with_a_stall(&url, &["-recv_buffer_size", "16384"], sent);
    assert_clean_resume("HTTP MPEG-TS", &log);
}

#[test]
fn a_lapped_rtsp_interleaved_subscriber_resumes_at_a_keyframe() {
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::with_config(CONFIG, &["--no-demo"]);
    let url = format!("rtsp://{}/tv", rtsp_addr(&relay));
    let sent = || {
        let clients = relay.ok("GET", "/v1/rtsp", None);
        let sinks = clients["clients"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["sinks"].as_array().into_iter().flatten());
        sinks.map(|s| s["packets_sent"].as_u64().unwrap_or(0)).sum()
    };
    let log = play_with_a_stall(&url, &["-rtsp_transport", "tcp"], sent);
    assert_clean_resume("RTSP/RTP over TCP", &log);
}

/// What a player's log says about timestamps going backwards or jumping at the start.
fn timestamp_warnings(log: &str) -> Vec<&str> {
    let bad = ["decreasing", "non monotonic", "non-monotonous", "timestamp", "discont", "out of order"];
    log.lines().filter(|l| bad.iter().any(|b| l.to_ascii_lowercase().contains(b))).collect()
}

/// ffmpeg and GStreamer's rtspsrc start the demo, over UDP and over TCP, with no warning about
/// timestamps: a new subscriber's catch-up (the GOP since the last keyframe) is paced.
#[test]
fn players_start_the_demo_without_timestamp_warnings() {
    if !have_ffmpeg() || !have_gstreamer() {
        return;
    }
    let relay = Relay::start(&["--rtsp", "127.0.0.1:0"]);
    let url = format!("rtsp://{}/demo", rtsp_addr(&relay));
    // A keyframe interval into the clip, so a new subscriber is owed a GOP.
    std::thread::sleep(Duration::from_millis(1500));
    for transport in ["udp", "tcp"] {
        let out = Command::new("timeout")
            .args(["20", "ffmpeg", "-hide_banner", "-nostdin", "-v", "warning", "-rtsp_transport", transport])
            .args(["-i", &url, "-t", "3", "-f", "null", "-"])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ffmpeg over {transport}: {log}");
        let w = timestamp_warnings(&log);
        assert!(w.is_empty(), "ffmpeg over {transport}: {w:#?}");

        let mut gst = Command::new("timeout");
        gst.args(["-s", "INT", "4", "gst-launch-1.0", "-v"])
            .args(
                format!(
                    "rtspsrc location={url} protocols={transport} name=s s. ! rtph264depay ! fakesink silent=false name=v s. ! fakesink"
                )
                .split(' '),
            )
            .env("GST_DEBUG", "2");
        let log = Gst::spawn(gst).log();
        // It must have played: H.264 reached the video sink, and nothing failed.
        let errors = gst_errors_while_playing(&log);
        assert!(errors.is_empty(), "gst-launch over {transport}: {errors:#?}\n{log}");
        assert!(log.contains("(v:sink)") && log.contains("chain"), "gst-launch over {transport} got no video: {log}");
        // Its debug log's warnings (-v also prints property changes, which name timestamps).
        let warnings: String = log.lines().filter(|l| l.contains("WARN")).collect::<Vec<_>>().join("\n");
        let w = timestamp_warnings(&warnings);
        assert!(w.is_empty(), "GStreamer over {transport}: {w:#?}");
    }
}

/// A rate of 0, a burst allowance smaller than one packet, a catch-up below 1: each a clear
/// refusal at creation; a good session shows the pace it holds its sinks to.
#[test]
fn bad_pacing_is_refused_and_the_pace_is_shown() {
    let relay = Relay::start(&["--no-demo"]);
    let bad = [
        (serde_json::json!({"rate_kbps": 0}), "rate_kbps 0 is out of range"),
        (serde_json::json!({"pace_burst_kb": 1}), "smaller than one packet"),
        (serde_json::json!({"pace_burst_kb": 0}), "cannot hold one packet"),
        (serde_json::json!({"pace_catchup": 0.5}), "pace_catchup 0.5 is out of range"),
        (serde_json::json!({"pace_link": "wifi"}), "pace_link"),
        (serde_json::json!({"pacing": "sometimes"}), "pacing"),
        (serde_json::json!({"pace_with": "sometimes"}), "pace_with"),
        (serde_json::json!({"pace_with": "txtime", "pacing": "off"}), "it needs pacing \"on\""),
        (serde_json::json!({"pace_with": "txtime", "datapath": "copy"}), "needs datapath \"shared\" or \"kernel\""),
        (serde_json::json!({"pace_with": "txtime", "udp_sinks": "connected"}), "it needs udp_sinks \"batched\""),
    ];
    for (fields, why) in bad {
        let mut spec = serde_json::json!({"name": "p", "source": {"udp": "127.0.0.1:0"}});
        spec.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        let (status, body) = relay.call("POST", "/v1/sessions", Some(spec.clone()));
        // A value of the wrong kind is refused by the JSON layer (422), a value out of range
        // by the relay (400): both clear.
        assert!(status == 400 || status == 422, "{spec}: {status} {body}");
        assert!(body["error"].as_str().unwrap_or("").contains(why), "{spec}: {body}");
    }
    assert_eq!(relay.call("GET", "/v1/sessions/p", None).0, 404, "nothing was created");

    let spec = serde_json::json!({"name": "p", "source": {"udp": "127.0.0.1:0"}, "rate_kbps": 800, "pace_burst_kb": 4, "pace_catchup": 2.0});
    let src = create_on_free_port(&relay, spec);
    send_paced(src, 20, 1000, 200.0);
    let ok = wait_for(Duration::from_secs(5), || !relay.ok("GET", "/v1/sessions/p", None)["pacing"].is_null());
    let p = &relay.ok("GET", "/v1/sessions/p", None)["pacing"];
    assert!(ok, "no pace shown: {p}");
    assert_eq!(p["sink_rate_bps"], 1_600_000, "{p}");
    assert_eq!(p["burst_bytes"], 4096, "{p}");
    assert_eq!(p["with"], "clock", "{p}");
}

/// `pace_link = "shared"`: a group's sinks are paced together as behind one link, at the
/// sum of their rates, so the copies of a packet leave spread over its interval instead of
/// back to back. The spread is a lower bound the relay's clocks enforce (a slow machine
/// only widens it), so the check cannot pass by luck.
#[test]
fn sinks_behind_a_shared_link_get_their_copies_spread() {
    let relay = Relay::start(&["--no-demo"]);
    let rx: Vec<std::net::UdpSocket> = (0..8).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let sinks: Vec<serde_json::Value> =
        rx.iter().map(|r| serde_json::json!({"udp": r.local_addr().unwrap()})).collect();
    // 128 kbit/s (16 kB/s) of 1000-byte packets, each sink paced at 1.5 × that (24 kB/s)
    // with 2 KiB of burst: the link's clock lets the group send 2 KiB at once, then
    // 8 × 24 kB/s, a packet each 5.2 ms.
    let spec = serde_json::json!({"name": "s", "source": {"udp": "127.0.0.1:0"}, "rate_kbps": 128,
        "pace_burst_kb": 2, "pace_link": "shared", "sinks": sinks});
    let src = create_on_free_port(&relay, spec);
    // Each receiver notes when each packet came.
    let readers: Vec<_> = rx
        .into_iter()
        .map(|r| {
            std::thread::spawn(move || {
                r.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                let mut got = std::collections::HashMap::new();
                let mut buf = [0u8; 2048];
                while let Ok(n) = r.recv(&mut buf) {
                    if n >= 8 {
                        got.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()), std::time::Instant::now());
                    }
                }
                got
            })
        })
        .collect();
    // 20 packets 100 ms apart: each one's copies are spread before the next comes.
    send_paced(src, 20, 1000, 10.0);
    let got: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let mut spans = Vec::new();
    for seq in 2..20u64 {
        let at: Vec<std::time::Instant> = got.iter().filter_map(|g| g.get(&seq).copied()).collect();
        assert_eq!(at.len(), 8, "packet {seq} reached every sink");
        spans.push(at.iter().max().unwrap().duration_since(*at.iter().min().unwrap()));
    }
    spans.sort();
    // Two copies at once, then the other six 5.2 ms apart: 31 ms from first to last (back
    // to back, well under a millisecond).
    assert!(spans[spans.len() / 2] >= Duration::from_millis(25), "copies back to back: {spans:?}");
}

/// `pace_with = "txtime"`: the group's datagrams carry departure times (SO_TXTIME). Where no
/// fq qdisc holds them (this host's loopback) they leave at once: every sink still gets every
/// packet, and the log says the stamps are not honoured. That they are where fq runs is
/// tests/guest.rs's.
#[test]
fn stamped_departure_times_reach_every_sink() {
    let relay = Relay::start(&["--no-demo"]);
    let rx: Vec<std::net::UdpSocket> = (0..4).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let sinks: Vec<serde_json::Value> =
        rx.iter().map(|r| serde_json::json!({"udp": r.local_addr().unwrap()})).collect();
    let spec = serde_json::json!({"name": "t", "source": {"udp": "127.0.0.1:0"}, "rate_kbps": 128,
        "pace_burst_kb": 2, "pace_link": "shared", "pace_with": "txtime", "sinks": sinks});
    let src = create_on_free_port(&relay, spec);
    send_paced(src, 40, 1000, 40.0);
    assert_eq!(relay.ok("GET", "/v1/sessions/t", None)["pacing"]["with"], "txtime");
    for (i, r) in rx.iter().enumerate() {
        r.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        let mut buf = [0u8; 2048];
        while seen.len() < 40 {
            let Ok(n) = r.recv(&mut buf) else { break };
            assert_eq!(n, 1000);
            seen.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()));
        }
        assert_eq!(seen.len(), 40, "sink {i} got {} of 40", seen.len());
    }
    if !std::path::Path::new("/sys/module/sch_fq").exists() {
        assert!(relay.stderr().contains("the departure times are not honoured"), "{}", relay.stderr());
    }
}

/// One egress for all sessions (KT_RC across streams): under contention each session gets
/// its reserved rate first, and the spare capacity goes to the higher class first. Three
/// sessions each owe two sinks 120 kB/s; the egress takes 220 kB/s: `r` (class 0) has
/// 80 kB/s reserved, `hi` (class 3) none and takes the spare whole, `lo` (class 0) gets
/// what is left (about 20 kB/s). Margins are wide; the order and the reservation are not.
#[test]
fn the_egress_is_shared_by_reservation_then_class() {
    let relay = Relay::with_config("egress_kbps = 1760\n", &["--no-demo"]);
    let e = relay.ok("GET", "/v1/engine", None);
    assert_eq!(e["egress"]["rate_kbps"], 1760, "{e}");
    let rx: Vec<std::net::UdpSocket> = (0..6).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let sessions = [("r", 0, Some(640)), ("hi", 3, None), ("lo", 0, None)];
    let mut sources = Vec::new();
    for (i, (name, class, reserve)) in sessions.iter().enumerate() {
        let sinks: Vec<_> =
            rx[2 * i..2 * i + 2].iter().map(|r| serde_json::json!({"udp": r.local_addr().unwrap()})).collect();
        let mut spec =
            serde_json::json!({"name": name, "source": {"udp": "127.0.0.1:0"}, "priority": class, "sinks": sinks});
        if let Some(kbps) = reserve {
            spec["reserve_kbps"] = serde_json::json!(kbps);
        }
        sources.push(create_on_free_port(&relay, spec));
    }
    assert_eq!(relay.ok("GET", "/v1/engine", None)["egress"]["reserved_kbps"], 640);
    // A reservation beyond what is left is refused, saying what is.
    let (code, v) = relay.call(
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({"name": "big", "source": {"udp": "127.0.0.1:0"}, "reserve_kbps": 1200})),
    );
    assert_eq!(code, 409, "{v}");
    assert!(v.to_string().contains("1120 of the egress's 1760 kbit/s"), "{v}");
    // 60 packets of 1000 bytes a second into each, for 4 s.
    let senders: Vec<_> =
        sources.into_iter().map(|s| std::thread::spawn(move || send_paced(s, 240, 1000, 60.0))).collect();
    senders.into_iter().for_each(|t| t.join().unwrap());
    // What each session got out while all three were owed more than the egress takes.
    let share: Vec<f64> = sessions
        .iter()
        .map(|(name, _, _)| {
            let sinks = relay.ok("GET", &format!("/v1/sessions/{name}/sinks"), None);
            let sent: u64 =
                sinks["sinks"].as_array().unwrap().iter().map(|s| s["packets_sent"].as_u64().unwrap()).sum();
            sent as f64 / 480.0
        })
        .collect();
    let (r, hi, lo) = (share[0], share[1], share[2]);
    eprintln!("shares of what each session was owed: r {r:.3} hi {hi:.3} lo {lo:.3}");
    assert!(hi > 0.9, "class 3 takes the spare capacity whole: r {r:.2} hi {hi:.2} lo {lo:.2}");
    assert!(r > 0.55, "the reservation (2/3 of what r is owed) is kept: r {r:.2} hi {hi:.2} lo {lo:.2}");
    assert!(lo < 0.4 && lo < r, "class 0 without a reservation gets what is left: r {r:.2} hi {hi:.2} lo {lo:.2}");
}

#[test]
fn a_reservation_needs_a_path_through_the_egress() {
    let relay = Relay::with_config("egress_kbps = 1000\n", &["--no-demo"]);
    let (code, v) = relay.call(
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({"name": "d", "source": {"udp": "127.0.0.1:0"}, "datapath": "daemon", "reserve_kbps": 100})),
    );
    assert_eq!(code, 400, "{v}");
    assert!(v.to_string().contains("daemon data path does not send through the shared egress"), "{v}");
}

/// The kernel path takes `pace_link = "shared"`: its clones get EDT departure times from the
/// session's pace (tests/guest.rs checks, in a guest with fq, that they leave at them). A
/// session left to a `kernel` default stays there; where no fq qdisc is loaded, the log says
/// the clones will leave back to back.
#[test]
fn a_shared_link_is_paced_on_the_kernel_path_by_departure_times() {
    in_private_netns("a_shared_link_is_paced_on_the_kernel_path_by_departure_times", move || {
        let relay = Relay::with_config("datapath = \"kernel\"\n", &["--no-demo"]);
        let spec = serde_json::json!({"name": "k", "source": {"udp": "127.0.0.1:0"}, "pace_link": "shared",
            "rate_kbps": 256});
        let created = relay.ok("POST", "/v1/sessions", Some(spec));
        assert_eq!(created["datapath"], "kernel", "{created}");
        // The pace reaches the program with the first packet: 256 kbit/s × pace_catchup 1.5.
        let src = source_addr(&created);
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let stamped = wait_for(Duration::from_secs(5), || {
            tx.send_to(&datagram(0, 200), src).unwrap();
            relay.ok("GET", "/v1/sessions/k", None)["kernel"]["stamped_rate_bps"] == 384_000
        });
        assert!(stamped, "{}", relay.ok("GET", "/v1/sessions/k", None));
        let unpaced = relay.ok(
            "POST",
            "/v1/sessions",
            Some(serde_json::json!({"name": "u", "source": {"udp": "127.0.0.1:0"}, "pacing": "off"})),
        );
        assert!(unpaced["kernel"].is_object() && unpaced["kernel"]["stamped_rate_bps"].is_null(), "{unpaced}");
        if !std::path::Path::new("/sys/module/sch_fq").exists() {
            assert!(relay.stderr().contains("no fq qdisc is loaded"), "{}", relay.stderr());
        }
    });
}

#[test]
fn a_reservation_needs_a_limited_egress() {
    let relay = Relay::start(&["--no-demo"]);
    let (code, v) = relay.call(
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({"name": "r", "source": {"udp": "127.0.0.1:0"}, "reserve_kbps": 500})),
    );
    assert_eq!(code, 400, "{v}");
    assert!(v.to_string().contains("egress_kbps"), "{v}");
}
