//! What needs a kernel this host may not have, run in a QEMU guest (`common::vm`): the kernel
//! data path's clones spread over a shared link by EDT departure times, which only the `fq`
//! qdisc honours, and the user-space paths' datagrams stamped the same way (`SO_TXTIME`)
//! (issue 35), and a WebRTC viewer behind a link `netem` makes lossy (issue 33).
//! Alone in this test binary, one guest at a time: a guest takes both CPUs.

mod common;

use common::vm::{Guest, IN_GUEST};
use common::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[test]
fn the_kernel_path_spreads_a_packets_clones_by_departure_time_where_fq_runs() {
    in_guest("the kernel path's EDT pacing", "in_guest_kernel_clones_leave_at_their_departure_times", 400);
}

/// Packets 1000 bytes, 4 a second, to 8 kernel sinks of two sessions: `plain` unpaced,
/// `paced` with `pace_link = "shared"` at 128 kbit/s per sink (the least pace) and 2 KiB of
/// burst. The link's clock then lets 2 clones leave at once and the other 6 one 7.8 ms
/// apart, 47 ms from first to last; unpaced they leave back to back.
#[test]
#[ignore = "runs in the QEMU guest of the test above"]
fn in_guest_kernel_clones_leave_at_their_departure_times() {
    assert!(std::env::var_os(IN_GUEST).is_some(), "runs in the guest the test above boots");
    let run = |cmd: &[&str]| {
        let st = std::process::Command::new(cmd[0]).args(&cmd[1..]).status().unwrap();
        assert!(st.success(), "{cmd:?}");
    };
    // The clones to local sinks leave through lo's egress: fq there holds them to their times.
    run(&["modprobe", "sch_fq"]);
    run(&["tc", "qdisc", "replace", "dev", "lo", "root", "fq"]);
    let relay = Relay::start(&["--no-demo"]);
    let mut sessions = Vec::new();
    for (name, paced) in [("plain", false), ("paced", true)] {
        let rx: Vec<std::net::UdpSocket> = (0..8).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let sinks: Vec<serde_json::Value> =
            rx.iter().map(|r| serde_json::json!({"udp": r.local_addr().unwrap()})).collect();
        let mut spec = serde_json::json!({"name": name, "source": {"udp": "127.0.0.1:0"}, "datapath": "kernel",
            "sinks": sinks});
        if paced {
            for (k, v) in [
                ("rate_kbps", serde_json::json!(128)),
                ("pace_catchup", 1.0.into()),
                ("pace_burst_kb", 2.into()),
                ("pace_link", "shared".into()),
            ] {
                spec[k] = v;
            }
        } else {
            spec["pacing"] = "off".into();
        }
        let src = create_on_free_port(&relay, spec);
        sessions.push((name, src, rx));
    }
    let srcs: Vec<_> = sessions.iter().map(|(_, s, _)| *s).collect();
    let receivers: Vec<(&str, Vec<_>)> = sessions
        .into_iter()
        .map(|(name, _, rx)| (name, rx.into_iter().map(|r| std::thread::spawn(move || arrivals(r))).collect()))
        .collect();
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let start = Instant::now();
    for seq in 0..16u64 {
        if let Some(d) = (start + Duration::from_millis(250 * seq)).checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        for s in &srcs {
            tx.send_to(&datagram(seq, 1000), s).unwrap();
        }
    }
    // Served by the program, not by user space; the paced one's clones stamped.
    for name in ["plain", "paced"] {
        let st = relay.ok("GET", &format!("/v1/sessions/{name}"), None);
        assert_eq!(st["datapath"], "kernel", "{st}");
        assert_eq!(st["kernel"]["sinks"], 8, "{st}");
        let stamped = &st["kernel"]["stamped_rate_bps"];
        assert_eq!(stamped.as_u64(), (name == "paced").then_some(128_000), "{st}");
    }
    let mut spread = HashMap::new();
    for (name, rx) in receivers {
        let got: Vec<HashMap<u64, Instant>> = rx.into_iter().map(|r| r.join().unwrap()).collect();
        let (mut spans, mut gaps) = (Vec::new(), Vec::new());
        for seq in 2..16u64 {
            let mut at: Vec<Instant> = got.iter().filter_map(|g| g.get(&seq).copied()).collect();
            assert_eq!(at.len(), 8, "{name}: packet {seq} reached every sink");
            at.sort();
            spans.push(at[7].duration_since(at[0]).as_secs_f64() * 1e3);
            gaps.extend(at.windows(2).skip(1).map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e3));
        }
        let (span, gap) = (median(spans), median(gaps));
        println!("fanout-vm: {name}: the clones of a packet arrive over {span:.1} ms (median), {gap:.1} ms apart after the burst");
        spread.insert(name, (span, gap));
    }
    let (plain, paced) = (spread["plain"], spread["paced"]);
    assert!(plain.0 < 15.0, "unpaced clones leave back to back: {plain:?}");
    // 47 ms and 7.8 ms by the clock; the guest's own timing is coarse.
    assert!((30.0..120.0).contains(&paced.0), "paced clones spread over ~47 ms: {paced:?}");
    assert!(paced.1 >= 4.0, "paced clones one step (7.8 ms) apart: {paced:?}");
}

#[test]
fn a_shared_link_behind_the_kernel_path_loses_nothing_at_joining_where_fq_runs() {
    in_guest("a shared link behind the kernel path", "in_guest_a_shared_link_behind_the_kernel_path", 600);
}

/// `bench pacing --quick` on the kernel path (its scenario scaled down: 3 subscribers on links
/// of their own joining one after another, 6 behind one link joining at once; 1.2 × the
/// stream's rate per subscriber, 20 ms of queue), fq on the relay's egress: unpaced, the
/// clones of each packet reach the shared link back to back and its queue drops some; paced
/// by their departure times, none.
#[test]
#[ignore = "runs in the QEMU guest of the test above"]
fn in_guest_a_shared_link_behind_the_kernel_path() {
    assert!(std::env::var_os(IN_GUEST).is_some(), "runs in the guest the test above boots");
    let out = std::env::temp_dir().join("bench-pacing");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["bench", "pacing", "--quick", "--datapaths", "kernel:link=shared", "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let summary = std::fs::read_to_string(out.join("pacing-summary.csv")).unwrap();
    let loss = |pacing: &str, link: &str| -> f64 {
        let row = summary.lines().find(|l| {
            let f: Vec<&str> = l.split(',').collect();
            f.len() > 4 && f[1] == pacing && f[2] == link
        });
        row.unwrap_or_else(|| panic!("no {pacing}/{link} row in\n{summary}"))
            .split(',')
            .nth(4)
            .unwrap()
            .parse()
            .unwrap()
    };
    for line in summary.lines() {
        println!("fanout-vm: {line}");
    }
    let (off, on) = (loss("off", "shared"), loss("on", "shared"));
    println!("fanout-vm: behind the shared link, unpaced clones lost {off}%, paced {on}%");
    assert!(off > 0.0, "the scenario must bite unpaced:\n{summary}");
    assert_eq!(on, 0.0, "paced, the shared link loses nothing:\n{summary}");
}

#[test]
fn the_relays_stamped_departures_keep_a_shared_link_clean_where_fq_runs() {
    in_guest("the relay's SO_TXTIME departures", "in_guest_the_relays_stamped_departures", 600);
}

/// `bench pacing --quick` on the `shared` path, its sinks behind one link paced as a group,
/// the relay holding each packet until its time (`with=clock`) and handing the kernel a
/// window ahead stamped with departure times (`with=txtime`), fq on the relay's egress.
/// Unpaced, the shared link drops some at joining; both ways of pacing, none (stamped, under
/// 0.5%); stamped, the relay wakes less. Without the stamps (or fq) each sink's window would leave at once and
/// the stamped round would lose as the unpaced one does.
#[test]
#[ignore = "runs in the QEMU guest of the test above"]
fn in_guest_the_relays_stamped_departures() {
    assert!(std::env::var_os(IN_GUEST).is_some(), "runs in the guest the test above boots");
    let out = std::env::temp_dir().join("bench-pacing-txtime");
    let (clock, txtime) = ("shared:link=shared", "shared:link=shared:with=txtime");
    // The whole run of BENCHMARKS with FANOUT_GUEST_BENCH=full on the host; the quick one else.
    let full = std::env::var("FANOUT_GUEST_BENCH").is_ok_and(|v| v == "full");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["bench", "pacing", "--datapaths", &format!("{clock},{txtime}"), "--out"])
        .arg(&out)
        .args(if full { &[][..] } else { &["--quick"][..] })
        .status()
        .unwrap();
    assert!(st.success());
    let summary = std::fs::read_to_string(out.join("pacing-summary.csv")).unwrap();
    let each = std::fs::read_to_string(out.join("pacing.csv")).unwrap();
    for line in summary.lines().chain(each.lines()) {
        println!("fanout-vm: {line}");
    }
    let field = |dp: &str, pacing: &str, link: &str, col: usize| -> f64 {
        let row = summary
            .lines()
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|f| f.len() > 8 && f[0] == dp && f[1] == pacing && f[2] == link);
        row.unwrap_or_else(|| panic!("no {dp}/{pacing}/{link} row in\n{summary}"))[col].parse().unwrap()
    };
    let (loss, wakeups) = (4, 7);
    assert!(field(clock, "off", "shared", loss) > 0.0, "the scenario must bite unpaced:\n{summary}");
    for link in ["shared", "own"] {
        assert_eq!(field(clock, "on", link, loss), 0.0, "held by the clock, nothing lost:\n{summary}");
        // (Stamped, a departure the emulated CPU makes late can bunch a window: CI once saw
        // 0.08% lost on the shared link, where unpaced loses 5-12%.)
        assert!(field(txtime, "on", link, loss) < 0.5, "stamped, fq keeps the pace:\n{summary}");
    }
    // Stamped, they keep up: as many packets reach them in the round as held by the clock.
    let got = |dp: &str| -> u64 {
        let rows = each.lines().map(|l| l.split(',').collect::<Vec<_>>());
        rows.filter(|f| f.len() > 3 && f[0] == dp && f[1] == "on").map(|f| f[3].parse::<u64>().unwrap()).sum()
    };
    println!("fanout-vm: packets to the paced subscribers: {} held, {} stamped", got(clock), got(txtime));
    assert!(got(txtime) * 10 >= got(clock) * 9, "stamped, the subscribers fall behind:\n{each}");
    // A sink joining behind the shared link waits for the windows stamped before it (at
    // most 250 ms more than held by the clock).
    let first = |dp: &str| field(dp, "on", "shared", 5);
    assert!(first(txtime) < first(clock) + 500.0, "stamped, the first picture comes late:\n{summary}");
    let (held, stamped) = (field(clock, "on", "shared", wakeups), field(txtime, "on", "shared", wakeups));
    println!("fanout-vm: the relay woke {held} times holding packets, {stamped} stamping them");
    assert!(stamped < held, "stamping spares the relay wake-ups:\n{summary}");
}

#[test]
fn the_kernels_pacers_against_fanouts_clock_where_fq_runs() {
    in_guest("the kernel's pacers against fanout's clock", "in_guest_kernel_pacers_against_the_clock", 900);
}

/// `bench kernel-pacers --quick`: 6 subscribers behind one link of 1.2 × their streams, each
/// owed half a second at once, sent from one socket four ways. Unpaced, the link's queue
/// drops much of the backlog; fanout's clock loses nothing, nor do SO_TXTIME stamps from the
/// same clock or SO_MAX_PACING_RATE at a sink's share; at the group's rate, fq (which holds each
/// destination of an unconnected socket to it) lets the backlog through at once.
#[test]
#[ignore = "runs in the QEMU guest of the test above"]
fn in_guest_kernel_pacers_against_the_clock() {
    assert!(std::env::var_os(IN_GUEST).is_some(), "runs in the guest the test above boots");
    let out = std::env::temp_dir().join("bench-kernel-pacers");
    // The whole run of BENCHMARKS with FANOUT_GUEST_BENCH=full on the host; the quick one else.
    let full = std::env::var("FANOUT_GUEST_BENCH").is_ok_and(|v| v == "full");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["bench", "kernel-pacers", "--out"])
        .arg(&out)
        .args(if full { &[][..] } else { &["--quick"][..] })
        .status()
        .unwrap();
    assert!(st.success());
    let csv = std::fs::read_to_string(out.join("kernel-pacers.csv")).unwrap();
    for line in csv.lines() {
        println!("fanout-vm: {line}");
    }
    let row = |mode: &str| -> Vec<String> {
        let line = csv.lines().find(|l| l.starts_with(&format!("{mode},")));
        line.unwrap_or_else(|| panic!("no {mode} row in\n{csv}")).split(',').map(str::to_string).collect()
    };
    let loss = |mode: &str| -> f64 { row(mode)[6].parse().unwrap() };
    assert!(loss("none") > 5.0, "the scenario must bite unpaced:\n{csv}");
    assert_eq!(loss("clock"), 0.0, "fanout's clock loses nothing:\n{csv}");
    assert_eq!(loss("txtime"), 0.0, "departure times from the clock, held by fq:\n{csv}");
    // At its share per destination fq lets each flow's first quantum go at once: a little loss.
    assert!(loss("max-pacing-rate-sink") < 1.0, "each destination at its share:\n{csv}");
    assert!(loss("max-pacing-rate") > 1.0, "the group's rate per destination is no pace at all:\n{csv}");
    // Handing departure times to the kernel spares the sender its waits.
    let wakeups = |mode: &str| -> u64 { row(mode)[10].parse().unwrap() };
    assert!(wakeups("txtime") * 2 < wakeups("clock"), "{csv}");
}

#[test]
fn a_webrtc_viewer_behind_a_lossy_link_gets_its_frames_where_netem_runs() {
    let Some(_) = peer("pion-peer") else { return };
    in_guest("a WebRTC viewer behind netem", "in_guest_a_webrtc_viewer_behind_a_lossy_link", 400);
}

/// Issue 33's loss case as written: a pion viewer of the demo in a namespace of its own whose
/// link loses 5% of the packets at random both ways (netem on each end of its veth; this
/// host's kernel has no netem). NACKs from the viewer get lost packets resent (RTX): fewer
/// than 0.5% of its frames are lost, and ffmpeg decodes every frame it assembled.
#[test]
#[ignore = "runs in the QEMU guest of the test above"]
fn in_guest_a_webrtc_viewer_behind_a_lossy_link() {
    assert!(std::env::var_os(IN_GUEST).is_some(), "runs in the guest the test above boots");
    let pion = peer("pion-peer").expect("the outer test checked");
    let run = |cmd: &str| {
        let st = std::process::Command::new("sh").args(["-c", cmd]).status().unwrap();
        assert!(st.success(), "{cmd}");
    };
    run("ip netns add viewer && ip link add rv type veth peer name vv netns viewer \
         && ip addr add 10.97.0.1/24 dev rv && ip link set rv up \
         && ip -n viewer addr add 10.97.0.2/24 dev vv && ip -n viewer link set vv up && ip -n viewer link set lo up");
    run("tc qdisc add dev rv root netem loss 5% && ip netns exec viewer tc qdisc add dev vv root netem loss 5%");
    let relay = Relay::try_start_at(&[], "10.97.0.1:0", &["--webrtc", "10.97.0.1:0", "--allow-unauthenticated"])
        .expect("the relay starts");
    let h264 = std::env::temp_dir().join("lossy.h264");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", "viewer"])
        .arg(&pion)
        .args(["whep", &relay.url("/demo/whep"), "-seconds", "20", "-h264"])
        .arg(&h264)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let r: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|_| panic!("pion-peer: {text} / {}", String::from_utf8_lossy(&out.stderr)));
    // Packets the qdisc sent and dropped (`Sent B bytes P pkt (dropped D, ...`).
    let netem = |cmd: &str| {
        let o = std::process::Command::new("sh").args(["-c", cmd]).output().unwrap();
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        let after = |key: &str| -> u64 {
            let word = s.split(key).nth(1).and_then(|d| d.split([',', ' ']).find(|w| !w.is_empty()));
            word.and_then(|d| d.parse().ok()).unwrap_or(0)
        };
        let sent = s.split(" pkt").next().and_then(|h| h.rsplit(' ').next()).and_then(|n| n.parse().ok());
        (sent.unwrap_or(0u64), after("dropped "))
    };
    let (to_viewer, from_viewer) =
        (netem("tc -s qdisc show dev rv"), netem("ip netns exec viewer tc -s qdisc show dev vv"));
    let decoded = h264_file_frames(&h264);
    println!(
        "fanout-vm: netem dropped {} of {} packets to the viewer and {} of {} from it; pion: {} of {} frames \
         complete, {} lost, {} NACKs sent; ffmpeg decodes {decoded}",
        to_viewer.1,
        to_viewer.0 + to_viewer.1,
        from_viewer.1,
        from_viewer.0 + from_viewer.1,
        r["frames_complete"],
        r["frames_expected"],
        r["frames_lost"],
        r["nacks_sent"]
    );
    assert_eq!(r["connected"], true, "{r}");
    let lossy = |(sent, dropped): (u64, u64)| dropped as f64 >= 0.02 * (sent + dropped) as f64;
    assert!(lossy(to_viewer) && lossy(from_viewer), "the link lost packets both ways: {to_viewer:?} {from_viewer:?}");
    assert!(r["nacks_sent"].as_u64().unwrap() > 0, "{r}");
    assert!(r["frames_expected"].as_u64().unwrap() >= 400, "20 s at 25 fps: {r}");
    assert!(r["lost_fraction"].as_f64().unwrap() < 0.005, "frames lost to the viewer: {r}");
    assert_eq!(decoded, r["frames_complete"].as_u64().unwrap(), "ffmpeg decodes every frame pion assembled");
}

/// Boots the guest and runs the ignored test `inner` there (it checks `what`), within
/// `secs`; prints its `fanout-vm:` lines. Without the guest's pieces, skips loudly.
fn in_guest(what: &str, inner: &str, secs: u64) {
    let guest = match Guest::find() {
        Ok(g) => g,
        Err(why) => {
            eprintln!("\n*** SKIPPED {what}: needs a QEMU guest: {why} ***\n");
            return;
        }
    };
    let (ok, console) = guest.run_test(inner, Duration::from_secs(secs));
    assert!(ok, "the guest's run:\n{console}");
    for line in console.lines().filter(|l| l.contains("fanout-vm")) {
        eprintln!("{line}");
    }
}

/// When each datagram (by its sequence number) reached `r`, until 3 s of silence.
fn arrivals(r: std::net::UdpSocket) -> HashMap<u64, Instant> {
    r.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut got = HashMap::new();
    let mut buf = [0u8; 2048];
    while let Ok(n) = r.recv(&mut buf) {
        if n >= 8 {
            got.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()), Instant::now());
        }
    }
    got
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
