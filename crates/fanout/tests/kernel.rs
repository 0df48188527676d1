//! The in-kernel (eBPF) data path: faults, removal under load (also on the user-space paths,
//! for comparison), and a clean unload. Each kernel test makes its own network namespace
//! (root only; skipped loudly otherwise), so no program is ever attached to the machine's
//! own interfaces.

mod common;
use common::*;
use serde_json::{json, Value};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

fn seq_of(buf: &[u8]) -> u64 {
    u64::from_be_bytes(buf[..8].try_into().unwrap())
}

/// Removing half the sinks while packets flow, with one sink that never reads: the others
/// get every packet in order, the removed ones a gap-free prefix (at most one packet twice,
/// see below), and then nothing.
#[test]
fn kernel_removal_under_load_and_a_stalled_sink_leave_the_others_whole() {
    let _backlog = BacklogGuard::raise(20_000);
    in_private_netns("kernel_removal_under_load_and_a_stalled_sink_leave_the_others_whole", || {
        removal_under_load("kernel")
    });
}

/// The same on every user-space path (the machine's own loopback: no program involved).
#[test]
fn removal_under_load_and_a_stalled_sink_leave_the_others_whole_on_every_user_space_path() {
    for dp in ["daemon", "copy", "shared", "uring"] {
        removal_under_load(dp);
    }
}

fn removal_under_load(datapath: &str) {
    const PACKETS: u64 = 400;
    let relay = Relay::start(&["--no-demo"]);
    let rx: Vec<UdpSocket> = (0..200)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let stalled = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket2::SockRef::from(&stalled).set_recv_buffer_size(1).unwrap();
    let mut sinks: Vec<Value> = rx.iter().map(|r| json!({"udp": r.local_addr().unwrap()})).collect();
    sinks.push(json!({"udp": stalled.local_addr().unwrap()}));
    let src = create_on_free_port(
        &relay,
        json!({"name":"k","source":{"udp":"127.0.0.1:0"},"datapath":"kernel","sinks":sinks}),
    );
    let listed = relay.ok("GET", "/v1/sessions/k/sinks", None)["sinks"].as_array().unwrap().clone();
    let ids: Vec<u64> = listed.iter().map(|s| s["id"].as_u64().unwrap()).collect();
    assert!(listed.iter().all(|s| s["path"] == "kernel"), "{listed:?}");

    let sender = std::thread::spawn(move || send_paced(src, PACKETS, 300, 400.0));
    let mut got: Vec<Vec<u64>> = vec![Vec::new(); rx.len()];
    let mut buf = [0u8; 512];
    let mut removed = false;
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end && got[..100].iter().any(|g| (g.len() as u64) < PACKETS) {
        for (r, g) in rx.iter().zip(got.iter_mut()) {
            while let Ok(n) = r.recv(&mut buf) {
                g.push(seq_of(&buf[..n]));
            }
        }
        if !removed && got[0].len() >= 150 {
            for id in &ids[100..200] {
                relay.ok("DELETE", &format!("/v1/sessions/k/sinks/{id}"), None);
            }
            removed = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    sender.join().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for (r, g) in rx.iter().zip(got.iter_mut()) {
        while let Ok(n) = r.recv(&mut buf) {
            g.push(seq_of(&buf[..n]));
        }
    }
    assert!(removed, "{datapath}: the first sink never got 150 packets: {}", got[0].len());
    let all: Vec<u64> = (0..PACKETS).collect();
    for (i, g) in got[..100].iter().enumerate() {
        // Every packet exactly once. On the machine's loopback two sends of one sink from
        // workers on different CPUs can swap (each CPU's backlog is processed on its own):
        // seen once in many runs on `copy`; allow a couple, not a pattern.
        let mut sorted = g.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, all, "{datapath}: kept sink {i} got {} of {PACKETS}", g.len());
        let swaps = g.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(swaps <= 2, "{datapath}: kept sink {i} got {swaps} packets out of order");
    }
    for (i, g) in got[100..].iter().enumerate() {
        // A removal moves the session's last sink into the hole; a program run that read
        // the count before may send that sink one packet twice (never skip one).
        // (And, as for the kept sinks, two packets may swap between CPUs' backlogs.)
        let swaps = g.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(swaps <= 2, "{datapath}: removed sink {} got {swaps} packets out of order", 100 + i);
        let mut g = g.clone();
        g.sort_unstable();
        let n = g.len();
        g.dedup();
        assert!(n - g.len() <= 1, "{datapath}: removed sink {} got {} duplicates", 100 + i, n - g.len());
        let prefix: Vec<u64> = (0..g.len() as u64).collect();
        assert_eq!(g, prefix, "{datapath}: removed sink {} got a gap", 100 + i);
        assert!((g.len() as u64) < PACKETS, "{datapath}: removed sink {} kept receiving", 100 + i);
    }
    let st = relay.ok("GET", "/v1/sessions/k", None);
    assert_eq!(st["sinks"], 101);
    // The session's delivered total keeps what the removed sinks got (every path); the
    // stalled sink's socket drops what it is sent (at most all of it), a removed sink may
    // get one packet twice, and under a loaded machine the test's own sockets may overflow
    // before it reads them (the kernel counts those drops; they are not the relay's).
    let received: u64 = got.iter().map(|g| g.len() as u64).sum();
    let delivered = st["delivered_packets_total"].as_u64().unwrap();
    let ports: Vec<u16> = rx.iter().map(|r| r.local_addr().unwrap().port()).collect();
    let dropped_here = udp_receive_drops(&ports);
    assert!(
        delivered + 100 >= received && delivered <= received + dropped_here + PACKETS,
        "{datapath}: {delivered} delivered, {received} received, {dropped_here} dropped at the test's sockets"
    );
    if datapath == "kernel" {
        assert_eq!(st["kernel"]["sinks"], 101);
        assert_eq!(st["kernel"]["packets"], PACKETS);
        assert_eq!(st["kernel"]["unhandled"], 0);
    }
}

/// A sink the kernel has no route to is handed to user space (which then reports the send
/// error); the sinks the kernel reaches do not notice.
#[test]
fn an_unreachable_sink_falls_back_to_user_space() {
    in_private_netns("an_unreachable_sink_falls_back_to_user_space", || {
        let relay = Relay::start(&["--no-demo"]);
        let rx: Vec<UdpSocket> = (0..3).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let mut sinks: Vec<Value> = rx.iter().map(|r| json!({"udp": r.local_addr().unwrap()})).collect();
        sinks.insert(1, json!({"udp": "10.255.0.1:5000"}));
        let src = create_on_free_port(
            &relay,
            json!({"name":"k","source":{"udp":"127.0.0.1:0"},"datapath":"kernel","sinks":sinks}),
        );
        send_paced(src, 50, 100, 500.0);
        let mut buf = [0u8; 200];
        for r in &rx {
            r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            for seq in 0..50 {
                let n = r.recv(&mut buf).unwrap();
                assert_eq!(seq_of(&buf[..n]), seq);
            }
        }
        let far = wait_for(Duration::from_secs(5), || {
            let s = relay.ok("GET", "/v1/sessions/k/sinks/2", None);
            s["path"] == "user" && s["state"] == "failed"
        });
        let s = relay.ok("GET", "/v1/sessions/k/sinks/2", None);
        assert!(far, "the unreachable sink should be in user space and failed: {s}");
        assert!(relay.stderr().contains("served from user space"), "no log line: {}", relay.stderr());
        let st = relay.ok("GET", "/v1/sessions/k", None);
        assert_eq!(st["kernel"]["sinks"], 3, "{st}");
        let metrics = ureq::get(&relay.url("/metrics")).call().unwrap().into_string().unwrap();
        assert!(metrics.contains("fanout_kernel_packets_total{session=\"k\"} 50"), "{metrics}");
        assert!(
            metrics.contains("fanout_sink_packets_total{session=\"k\",sink=\"1\",path=\"kernel\"} 50"),
            "{metrics}"
        );
    });
}

/// The program is attached while a kernel session lives and gone after the session is
/// deleted, after SIGTERM, and after SIGKILL (tcx links die with their process).
#[test]
fn the_program_leaves_with_its_session_and_its_process() {
    in_private_netns("the_program_leaves_with_its_session_and_its_process", || {
        let attached = || fanout_io::kernel::attached_to("lo").expect("querying lo's tcx programs");
        let spec = json!({"name":"k","source":{"udp":"127.0.0.1:0"},"datapath":"kernel"});
        let relay = Relay::start(&["--no-demo"]);
        relay.ok("POST", "/v1/sessions", Some(spec.clone()));
        assert_eq!(attached(), 1);
        relay.ok("DELETE", "/v1/sessions/k", None);
        assert_eq!(attached(), 0, "deleting the session should detach the program");
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            let mut relay = Relay::start(&["--no-demo"]);
            relay.ok("POST", "/v1/sessions", Some(spec.clone()));
            assert_eq!(attached(), 1);
            assert!(relay.signal_and_wait(sig).is_some(), "relay did not exit on signal {sig}");
            assert!(wait_for(Duration::from_secs(5), || attached() == 0), "program left behind after signal {sig}");
        }
    });
}

/// Without the privilege to load eBPF, asking for `kernel` is refused with the reason, and a
/// server whose default is `kernel` serves sessions with `shared` instead, saying why.
#[test]
fn without_privilege_kernel_is_refused_and_the_default_falls_back() {
    let cfg = std::env::temp_dir().join(format!("fanout-kernel-default-{}.toml", std::process::id()));
    std::fs::write(&cfg, "datapath = \"kernel\"\ndemo = false\n").unwrap();
    // SAFETY: geteuid has no preconditions.
    let wrapper: &[&str] = if unsafe { libc::geteuid() } == 0 {
        &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    } else {
        &[]
    };
    let relay = Relay::try_start_wrapped(wrapper, &["--config", cfg.to_str().unwrap()]).expect("relay starts");
    let (code, body) = relay.call(
        "POST",
        "/v1/sessions",
        Some(json!({"name":"k","source":{"udp":"127.0.0.1:0"},"datapath":"kernel"})),
    );
    assert_eq!(code, 501, "{body}");
    assert!(body["error"].as_str().unwrap().contains("CAP_BPF"), "{body}");
    let s = relay.ok("POST", "/v1/sessions", Some(json!({"name":"d","source":{"udp":"127.0.0.1:0"}})));
    assert_eq!(s["datapath"], "shared");
    assert!(wait_for(Duration::from_secs(2), || relay.stderr().contains("instead of \\\"kernel\\\"")
        || relay.stderr().contains("instead of \"kernel\"")));
    let _ = std::fs::remove_file(cfg);
}

/// A session with more sinks than the kernel path holds (`kernel_sinks`, here its least)
/// keeps them all: the ones past the limit are served from user space, saying why (on the
/// sink, and once in the log).
#[test]
fn sinks_past_the_kernel_limit_are_served_from_user_space() {
    in_private_netns("sinks_past_the_kernel_limit_are_served_from_user_space", || {
        let cfg = std::env::temp_dir().join(format!("fanout-kernel-limit-{}.toml", std::process::id()));
        std::fs::write(&cfg, "kernel_sinks = 256\ndemo = false\n").unwrap();
        let relay = Relay::start(&["--config", cfg.to_str().unwrap()]);
        let n = 258;
        // Nobody listens on these ports: only the bookkeeping is under test.
        let sinks: Vec<Value> = (0..n).map(|i| json!({"udp": format!("127.0.0.2:{}", 10_000 + i)})).collect();
        relay.ok(
            "POST",
            "/v1/sessions",
            Some(json!({"name":"k","source":{"udp":"127.0.0.1:0"},"datapath":"kernel","sinks":sinks})),
        );
        let st = relay.ok("GET", "/v1/sessions/k", None);
        assert_eq!(st["sinks"], n as u64);
        assert_eq!(st["kernel"]["sinks"], 256);
        let last = relay.ok("GET", &format!("/v1/sessions/k/sinks/{n}"), None);
        assert_eq!(last["path"], "user", "{last}");
        assert!(last["reason"].as_str().unwrap().contains("in use"), "{last}");
        // One log line for the first sink refused, not one a sink (tens of thousands at the
        // wire bench's 80,000); the next is the thousandth's.
        let lines = || relay.stderr().lines().filter(|l| l.contains("served from user space")).count();
        wait_for(Duration::from_secs(2), || lines() > 0);
        assert_eq!(lines(), 1, "{}", relay.stderr());
        let _ = std::fs::remove_file(cfg);
    });
}

/// One session holds more than 65,536 sinks on the kernel path (it held no more before):
/// 70,000, all in the program's map, and the program sends to the last of them. (Counted by
/// the program: 70,000 clones a packet overflow loopback's backlog, so a receiver here would
/// see few of them.)
#[test]
fn a_kernel_session_holds_seventy_thousand_sinks() {
    in_private_netns("a_kernel_session_holds_seventy_thousand_sinks", || {
        let cfg = std::env::temp_dir().join(format!("fanout-kernel-70k-{}.toml", std::process::id()));
        std::fs::write(&cfg, "kernel_sinks = 70144\nmax_body = 4194304\ndemo = false\n").unwrap();
        let relay = Relay::start(&["--config", cfg.to_str().unwrap()]);
        let n = 70_000;
        let addr = |i: usize| format!("127.0.{}.{}:{}", 1 + i / 62_500, 2 + (i / 250) % 250, 10_000 + i % 250);
        let sinks: Vec<Value> = (0..n).map(|i| json!({ "udp": addr(i) })).collect();
        let created = relay.ok(
            "POST",
            "/v1/sessions",
            Some(json!({"name":"k","source":{"udp":"127.0.0.1:0"},"datapath":"kernel","pacing":"off","sinks":sinks})),
        );
        let st = relay.ok("GET", "/v1/sessions/k", None);
        assert_eq!((st["sinks"].as_u64(), st["kernel"]["sinks"].as_u64()), (Some(n as u64), Some(n as u64)));
        assert!(!relay.stderr().contains("served from user space"), "{}", relay.stderr());
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for seq in 0..5 {
            tx.send_to(&datagram(seq, 200), source_addr(&created)).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
        let all_in =
            wait_for(Duration::from_secs(5), || relay.ok("GET", "/v1/sessions/k", None)["kernel"]["packets"] == 5);
        assert!(all_in, "{}", relay.ok("GET", "/v1/sessions/k", None)["kernel"]);
        for id in [65_537, n] {
            let s = relay.ok("GET", &format!("/v1/sessions/k/sinks/{id}"), None);
            assert_eq!((s["path"].as_str(), s["packets_sent"].as_u64()), (Some("kernel"), Some(5)), "sink {id}: {s}");
        }
        let _ = std::fs::remove_file(cfg);
    });
}

/// Adding a sink to a kernel session costs the same at 20,000 sinks as at none: 20,000 in
/// one request, then 1,000 one API call at a time beside them take about as long as 1,000
/// into an empty session (loosely: a cost that grew with the sinks already there, as reading
/// every sink's counters per addition did, would take ten times as long).
#[test]
fn kernel_sinks_are_added_in_constant_time() {
    in_private_netns("kernel_sinks_are_added_in_constant_time", || {
        let relay = Relay::start(&["--no-demo"]);
        let addr = |i: usize| format!("127.0.{}.{}:{}", 1 + i / 50_000, 2 + (i / 250) % 250, 10_000 + i % 250);
        let t = Instant::now();
        let sinks: Vec<Value> = (0..20_000).map(|i| json!({ "udp": addr(i) })).collect();
        relay.ok(
            "POST",
            "/v1/sessions",
            Some(json!({"name":"big","source":{"udp":"127.0.0.1:0"},"datapath":"kernel","sinks":sinks})),
        );
        let batch = t.elapsed();
        relay.ok(
            "POST",
            "/v1/sessions",
            Some(json!({"name":"small","source":{"udp":"127.0.0.1:0"},"datapath":"kernel"})),
        );
        let one_by_one = |session: &str, from: usize| {
            let t = Instant::now();
            for i in from..from + 1_000 {
                relay.ok("POST", &format!("/v1/sessions/{session}/sinks"), Some(json!({ "udp": addr(i) })));
            }
            t.elapsed()
        };
        let empty = one_by_one("small", 30_000);
        let beside = one_by_one("big", 20_000);
        // Nine thousand more one by one: the tenth costs what the first did (the relay once
        // asked every sink added so far whether it was still there, at every add).
        let mut tenth = Duration::ZERO;
        for k in 1..10 {
            tenth = one_by_one("small", 30_000 + k * 1_000);
        }
        eprintln!(
            "20,000 sinks in one request: {batch:?}; 1,000 one by one: {empty:?} into an empty session, \
             {beside:?} beside 20,000, {tenth:?} beside 9,000 added one by one"
        );
        let st = relay.ok("GET", "/v1/sessions/big", None);
        assert_eq!(st["kernel"]["sinks"], 21_000, "every sink in the kernel");
        assert!(batch < Duration::from_secs(60), "20,000 sinks took {batch:?}");
        assert!(
            beside < empty * 4 + Duration::from_secs(1),
            "1,000 sinks beside 20,000 took {beside:?}, into an empty session {empty:?}"
        );
        assert!(
            tenth < empty * 4 + Duration::from_secs(1),
            "the tenth 1,000 sinks added one by one took {tenth:?}, the first {empty:?}"
        );
    });
}

fn run(cmd: &[&str]) -> String {
    let out = std::process::Command::new(cmd[0]).args(&cmd[1..]).output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A sink behind a real interface: the program resolves it through the FIB (egress
/// interface, both MACs) and clones onto a veth pair into a second namespace. A sink whose
/// neighbour is unknown is handed to user space with that reason.
#[test]
fn a_sink_behind_a_veth_pair_is_reached_through_the_fib() {
    in_private_netns("a_sink_behind_a_veth_pair_is_reached_through_the_fib", || {
        // The far namespace lives as long as this child.
        let mut far = std::process::Command::new("unshare").args(["-n", "sleep", "60"]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let pid = far.id().to_string();
        let nsexec = |args: &[&str]| {
            let mut v = vec!["nsenter", "-t", &pid, "-n"];
            v.extend_from_slice(args);
            run(&v)
        };
        run(&["ip", "link", "add", "fo-near", "type", "veth", "peer", "name", "fo-far"]);
        run(&["ip", "link", "set", "fo-far", "netns", &pid]);
        run(&["ip", "addr", "add", "10.77.0.1/24", "dev", "fo-near"]);
        run(&["ip", "link", "set", "fo-near", "up"]);
        nsexec(&["ip", "addr", "add", "10.77.0.2/24", "dev", "fo-far"]);
        nsexec(&["ip", "link", "set", "fo-far", "up"]);
        // The FIB answers for packets that arrive on lo only if this namespace forwards.
        std::fs::write("/proc/sys/net/ipv4/conf/all/forwarding", "1").unwrap();
        let link = nsexec(&["ip", "-o", "link", "show", "fo-far"]);
        let mac = link.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).expect("a MAC").to_string();
        run(&["ip", "neigh", "replace", "10.77.0.2", "lladdr", &mac, "dev", "fo-near", "nud", "permanent"]);

        // The receiver, in the far namespace: counts datagrams from the relay for 4 s.
        let mut rx = std::process::Command::new("nsenter")
            .args(["-t", &pid, "-n", "python3", "-c"])
            .arg(
                "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('10.77.0.2',6000))\n\
                 print('ready', flush=True)\n\
                 s.settimeout(4)\nn=0\ntry:\n  while True:\n    d,a=s.recvfrom(2048); n+=1\nexcept socket.timeout: pass\n\
                 print(n, a[0] if n else '')",
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Bound before anything is sent (a loaded machine starts python slowly).
        let mut rx_out = std::io::BufReader::new(rx.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut rx_out, &mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let relay = Relay::start(&["--no-demo"]);
        let src = create_on_free_port(
            &relay,
            json!({"name":"k","source":{"udp":"127.0.0.1:0"},"datapath":"kernel",
                   "sinks":[{"udp":"10.77.0.2:6000"},{"udp":"10.77.0.9:6000"}]}),
        );
        std::thread::sleep(Duration::from_millis(300));
        send_paced(src, 50, 300, 200.0);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut rx_out, &mut got).unwrap();
        let _ = rx.wait();
        let _ = far.kill();
        let _ = far.wait();
        let got = got.trim().to_string();
        assert_eq!(got, "50 10.77.0.1", "the far receiver's count and the clones' source");
        let near = relay.ok("GET", "/v1/sessions/k/sinks/1", None);
        assert_eq!((near["path"].as_str(), near["packets_sent"].as_u64()), (Some("kernel"), Some(50)), "{near}");
        let unknown = relay.ok("GET", "/v1/sessions/k/sinks/2", None);
        assert_eq!(unknown["path"], "user", "{unknown}");
        assert!(unknown["reason"].as_str().unwrap_or("").contains("neighbour"), "{unknown}");
    });
}

/// RTSP clients of a kernel-path session: their sinks stay in the kernel, and the program
/// rewrites the clones' source port to the RTSP `server_port`, the only source a strict
/// client (here: a connected socket, as retina uses) accepts.
#[test]
fn rtsp_clients_on_the_kernel_path_get_rtp_from_server_port() {
    in_private_netns("rtsp_clients_on_the_kernel_path_get_rtp_from_server_port", || {
        let relay = Relay::start(&["--no-demo", "--rtsp", "127.0.0.1:0"]);
        let src = create_on_free_port(&relay, json!({"name":"k","source":{"udp":"127.0.0.1:0"},"datapath":"kernel"}));
        // RTP (payload type 96) at 200 packets/s for 5 s, from another thread.
        let sender = std::thread::spawn(move || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            for seq in 0..1000u16 {
                let mut p = vec![0x80, 96];
                p.extend_from_slice(&seq.to_be_bytes());
                p.extend_from_slice(&(u32::from(seq) * 450).to_be_bytes());
                p.extend_from_slice(&7u32.to_be_bytes());
                p.extend_from_slice(&[0x41; 200]);
                s.send_to(&p, src).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let p = rtsp_play(rtsp_addr(&relay), "k", None);
        p.rtp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 2048];
        let mut got = 0;
        while got < 100 {
            p.rtp.recv(&mut buf).expect("RTP from server_port");
            got += 1;
        }
        let sinks = relay.ok("GET", "/v1/sessions/k/sinks", None)["sinks"].clone();
        assert_eq!(sinks[0]["path"], "kernel", "{sinks}");
        sender.join().unwrap();
    });
}

/// A sysfs of this thread's network namespace, in a mount namespace of its own: lo's RPS
/// can then be set without touching the machine's lo.
fn private_sysfs() {
    // SAFETY: unshare and mount with valid C strings; they affect this thread (and the
    // processes it starts) only.
    unsafe {
        assert_eq!(libc::unshare(libc::CLONE_NEWNS), 0, "unshare(CLONE_NEWNS)");
        let private = libc::MS_REC | libc::MS_PRIVATE;
        assert_eq!(libc::mount(c"none".as_ptr(), c"/".as_ptr(), std::ptr::null(), private, std::ptr::null()), 0);
        let sysfs = c"sysfs".as_ptr();
        assert_eq!(libc::mount(sysfs, c"/sys".as_ptr(), sysfs, 0, std::ptr::null()), 0, "mounting sysfs");
    }
}

fn lo_knob(knob: &str, on: bool) {
    std::fs::write(format!("/proc/sys/net/ipv4/conf/lo/{knob}"), if on { "1" } else { "0" }).unwrap();
}

/// Spreading (issue 14): a session's sinks split into one shard per CPU, the other CPUs'
/// shards reached by a copy steered through lo's RPS. Refused, with the command to run,
/// while lo has no RPS or refuses a copy's clones to local sinks; then every sink gets
/// every packet, in order, from the kernel, and still does once lo is set against it.
#[test]
fn a_spread_session_serves_every_sink_from_every_cpu() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).min(64);
    if cpus < 2 {
        eprintln!("\n*** SKIPPED a_spread_session_serves_every_sink_from_every_cpu: one CPU ***\n");
        return;
    }
    in_private_netns("a_spread_session_serves_every_sink_from_every_cpu", move || {
        private_sysfs();
        let rps = "/sys/class/net/lo/queues/rx-0/rps_cpus";
        std::fs::write(rps, "0").unwrap();
        let relay = Relay::start(&["--no-demo"]);
        let rx: Vec<UdpSocket> = (0..6).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let sinks: Vec<Value> = rx.iter().map(|r| json!({"udp": r.local_addr().unwrap()})).collect();
        let spec = json!({"name": "k", "source": {"udp": "127.0.0.1:0"}, "datapath": "kernel", "kernel_spread": true, "sinks": sinks});
        let refused = |why: &str| {
            let (code, v) = relay.call("POST", "/v1/sessions", Some(spec.clone()));
            assert!(code >= 400 && v.to_string().contains(why), "{why}: {code} {v}");
        };
        refused("rps_cpus");
        std::fs::write(rps, format!("{:x}", u64::MAX >> (64 - cpus))).unwrap();
        refused("accept_local");
        lo_knob("accept_local", true);
        refused("route_localnet");
        lo_knob("route_localnet", true);
        let (code, v) = relay.call(
            "POST",
            "/v1/sessions",
            Some(json!({"name": "n", "source": {"udp": "127.0.0.1:0"}, "datapath": "shared", "kernel_spread": true})),
        );
        assert_eq!(code, 400, "kernel_spread on shared: {v}");

        let src = create_on_free_port(&relay, spec.clone());
        send_paced(src, 100, 100, 500.0);
        let mut buf = [0u8; 200];
        for r in &rx {
            r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            for seq in 0..100 {
                let n = r.recv(&mut buf).unwrap_or_else(|e| panic!("packet {seq}: {e}"));
                assert_eq!(seq_of(&buf[..n]), seq);
            }
        }
        let listed = relay.ok("GET", "/v1/sessions/k/sinks", None);
        let listed = listed["sinks"].as_array().unwrap();
        assert!(listed.iter().all(|s| s["path"] == "kernel" && s["packets_sent"] == 100), "{listed:?}");

        // lo turned against spreading under the running session: within a second the
        // fan-out is back on the arriving CPU, and every sink gets every packet again
        // (spread on, the other CPU's half of the sinks would get nothing).
        lo_knob("route_localnet", false);
        send_paced(src, 60, 100, 40.0);
        for r in &rx {
            r.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            while r.recv(&mut buf).is_ok() {}
            r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        }
        send_paced(src, 100, 100, 500.0);
        for (k, r) in rx.iter().enumerate() {
            for seq in 0..100 {
                let n = r.recv(&mut buf).unwrap_or_else(|e| panic!("sink {k}, packet {seq} after lo changed: {e}"));
                assert_eq!(seq_of(&buf[..n]), seq, "sink {k}");
            }
        }
    });
}
