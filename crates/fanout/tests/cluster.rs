//! A tree of relays, really started: etcd (Debian's etcd-server) and six `fanout serve`
//! processes, each in its own network namespace, joined by veth pairs to a bridge in a
//! private namespace of the test's own. Real players (ffmpeg, GStreamer) decode on the edges.
//!
//! ```text
//!               etcd 10.77.0.1 (bridge)
//!   o1 .11 demo   o2 .12 demo (replica)   o3 .13 cam (an RTSP upstream)     tier 0
//!        e1 .21            e2 .22                                           tier 1
//!                 e3 .23                                                    tier 2
//! ```

mod common;

use common::{decoded_frames, have_ffmpeg, have_gstreamer, in_private_netns, wait_for, wrapped, Relay};
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A named network namespace, deleted on drop.
struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct Node {
    name: &'static str,
    ip: String,
    ns: Ns,
    relay: std::sync::Mutex<Option<Relay>>,
}

impl Node {
    fn with<T>(&self, f: impl FnOnce(&Relay) -> T) -> T {
        f(self.relay.lock().unwrap().as_ref().unwrap_or_else(|| panic!("{} was stopped", self.name)))
    }

    fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.with(|r| r.ok(method, path, body))
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.with(|r| r.call(method, path, body))
    }

    /// Kills the node's relay.
    fn stop(&self) {
        self.relay.lock().unwrap().take();
    }

    fn is_up(&self) -> bool {
        self.relay.lock().unwrap().is_some()
    }

    /// A command run inside this node's namespace.
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns.0, program]);
        c
    }

    fn cluster(&self) -> Value {
        self.ok("GET", "/v1/cluster", None)
    }

    fn pull(&self, channel: &str) -> Option<Value> {
        self.cluster()["pulls"].as_array()?.iter().find(|p| p["channel"] == channel).cloned()
    }

    /// ffmpeg decodes `seconds` of a channel's video from this node over RTSP.
    fn ffmpeg(&self, channel: &str, seconds: u32) -> (bool, String) {
        let out = self
            .cmd("timeout")
            .args(["-k", "5", "40", "ffmpeg", "-hide_banner", "-nostdin", "-rtsp_transport", "tcp"])
            .args(["-i", &format!("rtsp://{}:8554/{channel}", self.ip), "-t", &seconds.to_string()])
            .args(["-map", "0:v", "-f", "null", "-"])
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The response head to a plain RTSP DESCRIBE of a node's channel.
fn describe(n: &Node, channel: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect((n.ip.as_str(), 8554)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "DESCRIBE rtsp://{}:8554/{channel} RTSP/1.0\r\nCSeq: 1\r\nUser-Agent: test\r\n\r\n", n.ip).unwrap();
    common::read_head(&mut s)
}

/// Lines of an ffmpeg log that say a picture could not be decoded.
fn decode_errors(log: &str) -> Vec<&str> {
    let bad = ["error while decoding", "concealing", "no frame!", "Invalid NAL", "non-existing PPS", "corrupt"];
    log.lines().filter(|l| bad.iter().any(|b| l.contains(b))).collect()
}

/// etcd, stopped on drop (a failing test leaves nothing behind).
struct Etcd(Child);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where etcd keeps its data: on tmpfs where there is one (on a busy CI host its fsyncs to
/// disk took seconds), removed on drop.
struct EtcdData(std::path::PathBuf);

impl EtcdData {
    fn new(test: &str) -> Self {
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        Self(base.join(format!("fanout-{test}-etcd-{}", std::process::id())))
    }
}

impl Drop for EtcdData {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The end of every node's log, for a failure's message.
fn logs(nodes: &[Node]) -> String {
    let tail = |s: String| s.chars().rev().take(1500).collect::<Vec<_>>().into_iter().rev().collect::<String>();
    let each = nodes.iter().map(|n| {
        let log = n.relay.lock().unwrap().as_ref().map(|r| tail(r.stderr())).unwrap_or_else(|| "(stopped)".into());
        format!("--- {} ---\n{log}", n.name)
    });
    each.collect::<Vec<_>>().join("\n")
}

/// etcd serving clients at `client` (its peer port on 127.0.0.1:2380), started by `wrapper`
/// (a command that runs the rest of its arguments) if one is given.
fn start_etcd(dir: &std::path::Path, client: &str, wrapper: &[&str]) -> Etcd {
    let url = format!("http://{client}");
    let child = wrapped(wrapper, "etcd")
        .args(["--data-dir", dir.to_str().unwrap(), "--name", "t"])
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380"])
        .args(["--initial-cluster", "t=http://127.0.0.1:2380"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting etcd");
    let up = wait_for(Duration::from_secs(15), || {
        std::net::TcpStream::connect_timeout(&client.parse().unwrap(), Duration::from_millis(200)).is_ok()
    });
    let etcd = Etcd(child);
    assert!(up, "etcd did not listen within 15 s");
    etcd
}

fn have_etcd() -> bool {
    let ok = Command::new("etcd").arg("--version").output().is_ok_and(|o| o.status.success());
    let built = cfg!(feature = "etcd");
    if !(ok && built) {
        let why = if built { "etcd is not installed (Debian: etcd-server)" } else { "built without --features etcd" };
        if std::env::var_os("CI").is_some() {
            panic!("cluster test cannot run: {why}; scripts/test installs etcd and builds with the feature");
        }
        eprintln!("\n*** SKIPPED cluster test: {why}; run scripts/test ***\n");
    }
    ok && built
}

#[test]
fn a_tree_of_relays_on_etcd_serves_pulls_fails_over_and_survives_etcd_restarts() {
    if !have_ffmpeg() || !have_etcd() {
        return;
    }
    in_private_netns("a_tree_of_relays_on_etcd", tree);
}

fn tree() {
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("fanout-cluster-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    sh(&["ip", "link", "add", "br0", "type", "bridge"]);
    sh(&["ip", "addr", "add", "10.77.0.1/24", "dev", "br0"]);
    sh(&["ip", "link", "set", "br0", "up"]);
    let etcd_data = EtcdData::new("tree");
    let etcd = start_etcd(&etcd_data.0, "10.77.0.1:2379", &[]);

    // (name, host number, tier, demo, extra config, extra [cluster] keys)
    let cam =
        "[[session]]\nname = \"cam\"\nsource = { rtsp = \"rtsp://10.77.0.11:8554/demo\", rtsp_transport = \"tcp\" }\n";
    let plan: [(&str, u8, u32, bool, &str, &str); 6] = [
        ("o1", 11, 0, true, "", ""),
        ("o2", 12, 0, true, "", ""),
        ("o3", 13, 0, false, cam, ""),
        ("e1", 21, 1, false, "", ""),
        ("e2", 22, 1, false, "", "max_subscribers = 1\nredirect = true\n"),
        ("e3", 23, 2, false, "", ""),
    ];
    let mut nodes: Vec<Node> = Vec::new();
    for (i, (name, host, tier, demo, extra, cluster_extra)) in plan.into_iter().enumerate() {
        let ns = Ns(format!("fanout-{pid}-{name}"));
        sh(&["ip", "netns", "add", &ns.0]);
        let veth = format!("fo{}v{i}", pid % 100_000);
        sh(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns.0]);
        sh(&["ip", "link", "set", &veth, "master", "br0", "up"]);
        let ip = format!("10.77.0.{host}");
        sh(&["ip", "-n", &ns.0, "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        sh(&["ip", "-n", &ns.0, "link", "set", "eth0", "up"]);
        sh(&["ip", "-n", &ns.0, "link", "set", "lo", "up"]);
        let cfg = dir.join(format!("{name}.toml"));
        let toml = format!(
            "rtsp = \"{ip}:8554\"\ndemo = {demo}\n{extra}\n[cluster]\nnode = \"{name}\"\ntier = {tier}\n\
             etcd = [\"10.77.0.1:2379\"]\nlease_s = 2\nlinger_s = 3\napi_url = \"http://{ip}:7070\"\n{cluster_extra}"
        );
        std::fs::write(&cfg, toml).unwrap();
        let wrapper = ["ip", "netns", "exec", &ns.0];
        let relay = Relay::try_start_at(
            &wrapper,
            &format!("{ip}:7070"),
            &["--config", cfg.to_str().unwrap(), "--allow-unauthenticated"],
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        nodes.push(Node { name, ip, ns, relay: std::sync::Mutex::new(Some(relay)) });
    }
    let node = |name: &str| nodes.iter().position(|n| n.name == name).unwrap();
    let (o1, o2, o3, e1, e2, e3) = (node("o1"), node("o2"), node("o3"), node("e1"), node("e2"), node("e3"));

    // Every node registered, every origin's channels in the directory.
    let all_in = wait_for(Duration::from_secs(15), || {
        let c = nodes[e3].cluster();
        c["nodes"].as_array().is_some_and(|n| n.len() == 6)
            && c["channels"]["demo"].as_array().is_some_and(|e| e.len() == 2)
            && c["channels"]["cam"].as_array().is_some_and(|e| e.len() == 1)
    });
    assert!(all_in, "directory incomplete: {}\n{}", nodes[e3].cluster(), logs(&nodes));

    // --- Players on every edge; e3 (tier 2) joins once e1 and e2 relay the channel.
    std::thread::scope(|s| {
        let p1 = s.spawn(|| nodes[e1].ffmpeg("demo", 6));
        let p2 = s.spawn(|| nodes[e2].ffmpeg("demo", 6));
        let relaying = wait_for(Duration::from_secs(10), || {
            nodes[e3].cluster()["channels"]["demo"].as_array().is_some_and(|e| e.len() == 4)
        });
        assert!(relaying, "e1 and e2 do not publish their copies: {}\n{}", nodes[e3].cluster(), logs(&nodes));
        let p3 = s.spawn(|| nodes[e3].ffmpeg("demo", 4));
        let gst = s.spawn(|| {
            if !have_gstreamer() {
                return None;
            }
            let url = format!("rtsp://{}:8554/demo", nodes[e3].ip);
            let mut gst = nodes[e3].cmd("timeout");
            gst.args(["-k", "5", "-s", "INT", "8", "gst-launch-1.0", "-v"]).args(
                format!(
                    "rtspsrc location={url} protocols=tcp name=s s. ! rtph264depay ! h264parse ! openh264dec ! \
                     fakesink silent=false name=v s. ! fakesink"
                )
                .split_whitespace(),
            );
            Some(common::Gst::spawn(gst).log())
        });
        // e2 is at its cap (1 subscriber, redirect on): a new player is sent to a node with
        // room, and plays there.
        let redirected = wait_for(Duration::from_secs(6), || {
            let head = describe(&nodes[e2], "demo");
            head.starts_with("RTSP/1.0 302") && head.contains("Location: rtsp://10.77.0.") && !head.contains(".22:")
        });
        assert!(redirected, "e2 at its cap: {}", describe(&nodes[e2], "demo"));
        let head = {
            use std::io::Write;
            let mut s = std::net::TcpStream::connect((nodes[e2].ip.as_str(), 7070)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            write!(s, "GET /v1/sessions/demo/stream HTTP/1.1\r\nHost: e2\r\n\r\n").unwrap();
            common::read_head(&mut s)
        };
        assert!(
            head.starts_with("HTTP/1.1 302") && head.contains("Location: http://10.77.0.") && !head.contains(".22:"),
            "an HTTP player of e2 at its cap: {head}"
        );
        // A new HLS player too (its first playlist request); one already playing at e2 (its
        // media playlist names it) stays.
        let get_head = |path: &str| {
            use std::io::Write;
            let mut s = std::net::TcpStream::connect((nodes[e2].ip.as_str(), 7070)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: e2\r\n\r\n").unwrap();
            common::read_head(&mut s)
        };
        let head = get_head("/v1/sessions/demo/hls/index.m3u8").to_ascii_lowercase();
        assert!(
            head.starts_with("http/1.1 302")
                && head.contains("location: http://10.77.0.")
                && head.contains("/v1/sessions/demo/hls/index.m3u8")
                && !head.contains(".22:"),
            "a new HLS player of e2 at its cap: {head}"
        );
        let head = get_head("/v1/sessions/demo/hls/index.m3u8?player=p1");
        assert!(!head.starts_with("HTTP/1.1 302"), "a playing HLS player stays: {head}");
        let (ok, log) = nodes[e2].ffmpeg("demo", 2);
        assert!(ok && decoded_frames(&log) > 20, "a player redirected by e2: {log}");
        // One pull per edge: the tier-1 edges from an origin, e3 from a tier-1 edge.
        for e in [e1, e2] {
            let p = nodes[e].pull("demo").expect("edge pulls demo");
            assert!(p["from"] == "o1" || p["from"] == "o2", "{p}");
            assert_eq!(p["path"].as_array().unwrap().len(), 1, "{p}");
        }
        let p = nodes[e3].pull("demo").expect("e3 pulls demo");
        assert!(p["from"] == "e1" || p["from"] == "e2", "tier 2 pulls from tier 1: {p}");
        assert_eq!(p["path"].as_array().unwrap().len(), 2, "{p}");
        let pulls_served: usize = [o1, o2]
            .iter()
            .map(|&o| {
                let r = nodes[o].ok("GET", "/v1/rtsp", None);
                let edges = [&nodes[e1].ip, &nodes[e2].ip];
                let pull = |c: &&Value| c["resource"] == "demo" && edges.iter().any(|ip| c["peer"] == ***ip);
                r["clients"].as_array().unwrap().iter().filter(pull).count()
            })
            .sum();
        assert_eq!(pulls_served, 2, "the origins serve one pull per tier-1 edge");
        for (who, p) in [("e1", p1), ("e2", p2), ("e3", p3)] {
            let (ok, log) = p.join().unwrap();
            assert!(ok && decoded_frames(&log) >= 60, "ffmpeg on {who}: {log}");
            assert!(decode_errors(&log).is_empty(), "ffmpeg on {who}: {:?}", decode_errors(&log));
        }
        if let Some(log) = gst.join().unwrap() {
            let pictures = log.lines().filter(|l| l.contains("(v:sink)") && l.contains("chain")).count();
            assert!(pictures > 30, "GStreamer on e3: {pictures} pictures: {log}");
            let errors = common::gst_errors_while_playing(&log);
            assert!(errors.is_empty(), "GStreamer on e3: {errors:#?}\n{log}");
        }
    });

    // --- A channel with one origin: killing the origin ends it on the edge, cleanly.
    // e2 has room again once its players ended: the named HLS player counts for 10 s after
    // its last request.
    let room = wait_for(Duration::from_secs(20), || nodes[e2].cluster()["node"]["load"]["subscribers"] == 0);
    assert!(room, "e2 is still at its cap: {}", nodes[e2].cluster()["node"]);
    std::thread::scope(|s| {
        let player = s.spawn(|| {
            let t0 = Instant::now();
            let r = nodes[e2].ffmpeg("cam", 30);
            (r, t0.elapsed())
        });
        assert!(wait_for(Duration::from_secs(10), || nodes[e2].pull("cam").is_some()), "e2 does not pull cam");
        std::thread::sleep(Duration::from_secs(2));
        let killed = Instant::now();
        nodes[o3].stop();
        let ((_, log), played) = player.join().unwrap();
        assert!(decoded_frames(&log) > 0, "cam never played on e2: {log}");
        assert!(played < Duration::from_secs(25), "the player of a dead channel was left hanging: {log}");
        let gone = wait_for(Duration::from_secs(10), || {
            nodes[e2].call("GET", "/v1/sessions/cam", None).0 == 404 && nodes[e2].pull("cam").is_none()
        });
        assert!(gone, "e2 kept the dead channel {:?} after o3 died", killed.elapsed());
    });

    // --- Failover: the origin e1 pulls from dies; e1 moves to the replica within 3 s, and
    // its player keeps decoding.
    std::thread::scope(|s| {
        let player = s.spawn(|| nodes[e1].ffmpeg("demo", 12));
        assert!(wait_for(Duration::from_secs(10), || nodes[e1].pull("demo").is_some()), "e1 does not pull demo");
        std::thread::sleep(Duration::from_secs(3));
        let from = nodes[e1].pull("demo").unwrap()["from"].as_str().unwrap().to_string();
        let (dead, other) = if from == "o1" { (o1, "o2") } else { (o2, "o1") };
        let t0 = Instant::now();
        nodes[dead].stop();
        let moved = wait_for(Duration::from_secs(3), || nodes[e1].pull("demo").is_some_and(|p| p["from"] == other));
        assert!(moved, "e1 did not move to {other} within 3 s: {:?}", nodes[e1].pull("demo"));
        eprintln!("failover from {from} to {other} took {:?}", t0.elapsed());
        let (ok, log) = player.join().unwrap();
        assert!(ok, "ffmpeg on e1 through the failover: {log}");
        assert!(decoded_frames(&log) >= 200, "ffmpeg on e1 stalled in the failover: {log}");
        assert!(decode_errors(&log).is_empty(), "ffmpeg on e1: {:?}", decode_errors(&log));
    });
    let survivor = if nodes[o1].is_up() { o1 } else { o2 };

    // --- etcd stops: a running stream keeps flowing, a new lookup is a clear 503; etcd
    // back: the nodes register again and a channel made meanwhile resolves.
    let mut sub = nodes[e1].with(|r| r.http_subscribe("demo"));
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 65536];
    let mut read_for = |d: Duration| {
        use std::io::Read;
        let (t0, mut n) = (Instant::now(), 0usize);
        while t0.elapsed() < d {
            n += sub.read(&mut buf).unwrap_or(0);
        }
        n
    };
    assert!(read_for(Duration::from_secs(1)) > 10_000, "no stream from e1");
    drop(etcd);
    let down = wait_for(Duration::from_secs(10), || {
        let (code, v) = nodes[e2].call("GET", "/v1/sessions/late/stream", None);
        code == 503 && v["error"].as_str().is_some_and(|e| e.contains("etcd"))
    });
    assert!(down, "a lookup with etcd down: {:?}", nodes[e2].call("GET", "/v1/sessions/late/stream", None));
    assert!(read_for(Duration::from_secs(3)) > 50_000, "the stream stopped with etcd");
    let spec = serde_json::json!({"name": "late", "source": {"demo": true}});
    nodes[survivor].ok("POST", "/v1/sessions", Some(spec));
    let etcd = start_etcd(&etcd_data.0, "10.77.0.1:2379", &[]);
    let back = wait_for(Duration::from_secs(15), || {
        let c = nodes[e2].cluster();
        c["directory"]["state"] == "connected"
            && c["directory"]["registrations"].as_u64() >= Some(2)
            && c["channels"]["late"].as_array().is_some_and(|e| !e.is_empty())
    });
    assert!(back, "the directory did not come back: {}", nodes[e2].cluster());
    let (ok, log) = nodes[e2].ffmpeg("late", 3);
    assert!(ok && decoded_frames(&log) > 30, "a channel made while etcd was down: {log}");
    assert!(read_for(Duration::from_secs(1)) > 10_000, "the stream stopped after etcd came back");

    drop(etcd);
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}

/// etcd's writes wait for its disk; on a busy host each took seconds, and a node that kept
/// its lease alive between writes let it lapse and left the directory. Here every fsync of
/// etcd's takes 0.75 s more (strace's fault injection: a write waits for two) while a node
/// with a 2 s lease, whose channel entry is rewritten as its rate changes, runs for 15 s: it
/// stays registered, once, and stays listed.
#[test]
fn a_node_keeps_its_lease_while_etcds_disk_is_slow() {
    if !have_etcd() || !common::root_or_skip("the slow etcd test", "a network namespace") {
        return;
    }
    if !Command::new("strace").arg("-V").output().is_ok_and(|o| o.status.success()) {
        assert!(std::env::var_os("CI").is_none(), "strace is missing: scripts/test installs it");
        eprintln!("\n*** SKIPPED the slow etcd test: strace is not installed ***\n");
        return;
    }
    in_private_netns("a_node_keeps_its_lease_while_etcds_disk_is_slow", || {
        let data = EtcdData::new("slow");
        // The seccomp filter stops etcd at its syncs only: nothing else is slowed.
        let slow = ["strace", "-f", "-qq", "-o", "/dev/null", "--seccomp-bpf", "-e", "trace=fsync,fdatasync"];
        let slow = [&slow[..], &["-e", "inject=fsync,fdatasync:delay_enter=750000"]].concat();
        let etcd = start_etcd(&data.0, "127.0.0.1:2379", &slow);
        // etcd starts slowly too (a dozen syncs): a put answers once it is up, and takes the
        // injected time (or this test would prove nothing).
        let put = || {
            let t = Instant::now();
            let r = ureq::post("http://127.0.0.1:2379/v3/kv/put")
                .timeout(Duration::from_secs(10))
                .send_string(r#"{"key":"dGVzdA==","value":"eA=="}"#);
            r.is_ok().then(|| t.elapsed())
        };
        let mut took = None;
        assert!(
            wait_for(Duration::from_secs(40), || {
                took = put();
                took.is_some()
            }),
            "etcd did not answer a put"
        );
        let took = put().expect("a second put");
        assert!(took >= Duration::from_millis(1400), "a put took {took:?}: the injected delay did not hold");

        let cfg = std::env::temp_dir().join(format!("fanout-slow-etcd-{}.toml", std::process::id()));
        let toml = "[cluster]\nnode = \"n\"\ntier = 0\netcd = [\"127.0.0.1:2379\"]\nlease_s = 2\n";
        std::fs::write(&cfg, toml).unwrap();
        let relay = Relay::start(&["--rtsp", "127.0.0.1:8554", "--config", cfg.to_str().unwrap()]);
        let _ = std::fs::remove_file(&cfg);
        let status = || relay.ok("GET", "/v1/cluster", None);
        let listed = |c: &Value| {
            c["nodes"].as_array().is_some_and(|n| n.iter().any(|n| n["name"] == "n"))
                && c["channels"]["demo"].as_array().is_some_and(|e| e.len() == 1)
        };
        assert!(wait_for(Duration::from_secs(20), || listed(&status())), "not registered: {}", status());
        let start = Instant::now();
        let mut polls = 0;
        while start.elapsed() < Duration::from_secs(15) {
            let c = status();
            assert!(
                c["directory"]["registrations"] == 1 && c["directory"]["state"] == "connected" && listed(&c),
                "after {:.1} s of a slow etcd: {c}\n{}",
                start.elapsed().as_secs_f64(),
                relay.stderr()
            );
            polls += 1;
            std::thread::sleep(Duration::from_millis(300));
        }
        // (A read waits behind etcd's commits too: a status takes ~1.3 s here.)
        assert!(polls >= 5, "the status answered {polls} times in 15 s");
        drop((relay, etcd, data));
    });
}

/// Without etcd: an edge names its parents. The first is down (nothing listens), so the edge
/// pulls from the second; players decode over RTSP and HTTP; the status, `ctl cluster` and
/// /metrics show the pull and the parents' health; the pull ends `linger_s` after the last
/// player.
#[test]
fn an_edge_pulls_from_the_first_parent_that_is_up() {
    if !have_ffmpeg() {
        return;
    }
    let origin = Relay::with_config("", &[]);
    let origin_rtsp = common::rtsp_addr(&origin);
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // closed at once
    let toml = format!(
        "demo = false\n[cluster]\nnode = \"edge\"\ntier = 1\nlinger_s = 1\n\
         parents = [\"rtsp://{dead}\", \"rtsp://{origin_rtsp}\"]\n"
    );
    let edge = Relay::with_config(&toml, &[]);
    let edge_rtsp = common::rtsp_addr(&edge);
    let (ok, log) = common::ffmpeg_decode(&format!("rtsp://{edge_rtsp}/demo"), &["-rtsp_transport", "tcp"], 3);
    assert!(ok && decoded_frames(&log) > 30, "RTSP through the edge: {log}");
    let (ok, log) = common::ffmpeg_decode(&edge.url("/v1/sessions/demo/stream"), &[], 3);
    assert!(ok && decoded_frames(&log) > 30, "HTTP through the edge: {log}");

    let c = edge.ok("GET", "/v1/cluster", None);
    assert_eq!(c["directory"]["state"], "none");
    let parents = c["parents"].as_array().unwrap();
    assert_eq!(parents[0]["health"], "down", "{c}");
    assert_eq!(parents[1]["health"], "up", "{c}");
    let bin = env!("CARGO_BIN_EXE_fanout");
    let out = Command::new(bin).args(["ctl", "--api", &edge.url(""), "cluster"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("parent rtsp://") && text.contains("down"), "{text}");
    let metrics = ureq::get(&edge.url("/metrics")).call().unwrap().into_string().unwrap();
    assert!(metrics.contains(&format!("fanout_cluster_parent_up{{parent=\"rtsp://{dead}\"}} 0")), "{metrics}");
    assert!(metrics.contains(&format!("fanout_cluster_parent_up{{parent=\"rtsp://{origin_rtsp}\"}} 1")), "{metrics}");

    // Nobody watches: the pull and its session go; the origin's RTSP client with them.
    let gone = wait_for(Duration::from_secs(15), || {
        edge.ok("GET", "/v1/cluster", None)["pulls"].as_array().is_some_and(|p| p.is_empty())
            && edge.call("GET", "/v1/sessions/demo", None).0 == 404
    });
    assert!(gone, "the idle pull stayed: {}", edge.ok("GET", "/v1/cluster", None));
    let left = wait_for(Duration::from_secs(10), || {
        origin.ok("GET", "/v1/rtsp", None)["clients"].as_array().is_some_and(|c| c.is_empty())
    });
    assert!(left, "the edge's pull still plays at the origin");
    // A relay that is no cluster node says so.
    assert_eq!(origin.call("GET", "/v1/cluster", None).0, 404);
}

/// Issue 30 item 9, after a failover: an edge's RTSP client keeps one clock in its sender
/// reports when the edge's parent dies and it pulls the channel from another (a relay of its
/// own clock, RTP times and SSRC) — stepped by no more than the new parent's replayed GOP —
/// and it goes on receiving.
#[test]
fn sender_reports_keep_one_clock_across_a_failover() {
    let first = Relay::with_config("", &[]);
    let second = Relay::with_config("", &[]);
    let (a, b) = (common::rtsp_addr(&first), common::rtsp_addr(&second));
    let toml = format!(
        "demo = false\n[cluster]\nnode = \"edge\"\ntier = 1\nlinger_s = 5\nparents = [\"rtsp://{a}\", \"rtsp://{b}\"]\n"
    );
    let edge = Relay::with_config(&toml, &[]);
    let rtcp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let play = common::rtsp_play(common::rtsp_addr(&edge), "demo", Some(rtcp.local_addr().unwrap().port()));
    let reports = common::sender_reports(&rtcp, Instant::now() + Duration::from_secs(6));
    assert!(!reports.is_empty(), "no sender report before the failover");
    drop(first);
    let switched = wait_for(Duration::from_secs(20), || {
        edge.ok("GET", "/v1/cluster", None)["pulls"][0]["from"].as_str().is_some_and(|f| f.contains(&b.to_string()))
    });
    assert!(switched, "no failover: {}", edge.ok("GET", "/v1/cluster", None));
    let after = common::sender_reports(&rtcp, Instant::now() + Duration::from_secs(10));
    assert!(after.len() >= 2, "sender reports after the failover: {after:?}");
    // The new parent's stream starts at the last keyframe it holds: the edge's timeline goes
    // on from where it was by the time that passed, so it moves ahead by that keyframe's age
    // (up to the demo's 1 s GOP) — a step, not the other source's clock (hours off).
    let (t0, r0) = reports[0];
    let (t1, r1) = after[0];
    let step = f64::from(r1.wrapping_sub(r0) as i32) / 90_000.0 - (t1 - t0);
    assert!((-0.5..1.5).contains(&step), "the clock stepped {step:.2} s at the failover: {reports:?} then {after:?}");
    common::assert_one_clock(&after, 90_000.0);
    // The client still gets the stream.
    play.rtp.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert!(play.rtp.recv(&mut [0u8; 2048]).is_ok(), "no RTP after the failover");
}

/// Relay to relay over RTSPS: an edge whose parent is an `rtsps://` origin (its certificate
/// checked against the CA in `[cluster] tls_ca`) pulls SRTP over UDP, keyed in the TLS
/// connection, and gives the origin a key of its own for its reports, which the origin
/// reads. Players of the edge decode the demo.
#[test]
fn an_edge_pulls_from_an_rtsps_parent_over_srtp() {
    if !have_ffmpeg() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("fanout-cluster-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (dir.join("origin.crt"), dir.join("origin.key"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let origin = Relay::with_config(
        &format!(
            "[tls]\ncert = {cert:?}\nkey = {key:?}\nhttps = false\nrtsps = \"127.0.0.1:0\"\nrtmps = \"127.0.0.1:0\"\n"
        ),
        &[],
    );
    let rtsps = origin.ok("GET", "/v1/engine", None)["rtsps"].as_str().unwrap().to_string();
    let toml = format!(
        "demo = false\n[cluster]\nnode = \"edge\"\ntier = 1\nlinger_s = 1\npull_transport = \"udp\"\n\
         parents = [\"rtsps://{rtsps}\"]\ntls_ca = {cert:?}\n"
    );
    let edge = Relay::with_config(&toml, &[]);
    let url = format!("rtsp://{}/demo", common::rtsp_addr(&edge));
    let (ok, log) = common::ffmpeg_decode(&url, &["-rtsp_transport", "tcp"], 3);
    assert!(ok && decoded_frames(&log) > 30, "RTSP through the edge: {log}");
    let up = edge.ok("GET", "/v1/sessions/demo", None)["upstream"].clone();
    assert_eq!((up["tls"].as_bool(), up["transport"].as_str()), (Some(true), Some("udp")), "{up}");
    assert_eq!(up["srtp_dropped"], 0, "{up}");
    // At the origin: the edge is an SRTP client whose own reports are read under its key.
    let read = wait_for(Duration::from_secs(10), || {
        let clients = origin.ok("GET", "/v1/rtsp", None)["clients"].clone();
        clients.as_array().is_some_and(|c| {
            c.iter().any(|c| c["srtp"] == true && c["srtcp_keyed"] == true && c["fraction_lost"].is_number())
        })
    });
    assert!(read, "{}", origin.ok("GET", "/v1/rtsp", None));
    let _ = std::fs::remove_dir_all(&dir);
}
