//! Reloading the configuration (issue 34): readers keep playing across reloads that add,
//! change and remove other paths; a moved upstream switches in place; credentials and
//! limits change at once; a config with errors changes nothing; SIGHUP does the same.

mod common;
use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn config_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fanout-reload-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("fanout.toml")
}

fn session(name: &str, source: &str) -> String {
    format!("[[session]]\nname = \"{name}\"\nsource = {{ {source} }}\n")
}

fn reload(relay: &Relay, file: &Path, text: &str) -> (u16, Value) {
    std::fs::write(file, text).unwrap();
    relay.call("POST", "/v1/reload", None)
}

/// What a reader saw: packets by arrival, and whether its connection ended.
#[derive(Default)]
struct Seen {
    /// (arrival, RTP sequence number), or (arrival, 0) for what has none.
    packets: Vec<(Instant, u16)>,
    closed: bool,
}

impl Seen {
    /// Sequence numbers missing between consecutive packets.
    fn missing(&self) -> u64 {
        self.packets.windows(2).map(|w| u64::from(w[1].1.wrapping_sub(w[0].1).wrapping_sub(1))).sum()
    }

    fn longest_gap(&self) -> Duration {
        self.packets.windows(2).map(|w| w[1].0 - w[0].0).max().unwrap_or_default()
    }
}

type Log = Arc<Mutex<Seen>>;

/// Reads RTP from a UDP socket until `stop`.
fn read_udp(sock: UdpSocket, stop: Arc<AtomicBool>) -> Log {
    let log = Log::default();
    let l = log.clone();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            if let Ok(n) = sock.recv(&mut buf) {
                // (RTCP meant for a neighbour whose RTP port is ours minus one is not counted.)
                if n >= 12 && !(200..=204).contains(&buf[1]) {
                    l.lock().unwrap().packets.push((Instant::now(), u16::from_be_bytes([buf[2], buf[3]])));
                }
            }
        }
    });
    log
}

/// Reads interleaved RTP (channel 0) from an RTSP connection until `stop`.
fn read_interleaved(mut c: TcpStream, stop: Arc<AtomicBool>) -> Log {
    let log = Log::default();
    let l = log.clone();
    c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    std::thread::spawn(move || {
        let (mut buf, mut chunk) = (Vec::new(), [0u8; 65536]);
        while !stop.load(Ordering::Relaxed) {
            match c.read(&mut chunk) {
                Ok(0) => {
                    l.lock().unwrap().closed = true;
                    return;
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) => continue,
            }
            while buf.len() >= 4 && buf[0] == b'$' {
                let len = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
                if buf.len() < 4 + len {
                    break;
                }
                if buf[1] == 0 && len >= 12 {
                    l.lock().unwrap().packets.push((Instant::now(), u16::from_be_bytes([buf[6], buf[7]])));
                }
                buf.drain(..4 + len);
            }
        }
    });
    log
}

/// Reads an HTTP stream until `stop`: when bytes came, and whether it ended.
fn read_http(mut s: TcpStream, stop: Arc<AtomicBool>) -> Log {
    let log = Log::default();
    let l = log.clone();
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            match s.read(&mut chunk) {
                Ok(0) => {
                    l.lock().unwrap().closed = true;
                    return;
                }
                Ok(_) => l.lock().unwrap().packets.push((Instant::now(), 0)),
                Err(_) => {}
            }
        }
    });
    log
}

/// An HLS player of `session` until `stop`: the newest segment of each playlist it loads
/// (every 500 ms), as the "sequence number", each new segment fetched; `closed` if a
/// playlist or segment failed.
fn read_hls(api: SocketAddr, session: &str, stop: Arc<AtomicBool>) -> Log {
    let log = Log::default();
    let l = log.clone();
    let base = format!("http://{api}/v1/sessions/{session}/hls");
    let get = |url: &str| -> Option<Vec<u8>> {
        let r = ureq::get(url).timeout(Duration::from_secs(10)).call().ok()?;
        let mut body = Vec::new();
        r.into_reader().read_to_end(&mut body).ok()?;
        Some(body)
    };
    std::thread::spawn(move || {
        let multivariant = String::from_utf8(get(&format!("{base}/index.m3u8")).unwrap_or_default()).unwrap();
        let Some(media) = multivariant.lines().find(|l| l.starts_with("index.m3u8?player=")) else {
            l.lock().unwrap().closed = true;
            return;
        };
        let mut newest = None;
        while !stop.load(Ordering::Relaxed) {
            let Some(playlist) = get(&format!("{base}/{media}")).map(|b| String::from_utf8_lossy(&b).into_owned())
            else {
                l.lock().unwrap().closed = true;
                return;
            };
            // (None until the first segment is complete.)
            let last = playlist.lines().filter_map(|l| l.strip_suffix(".m4s")).next_back();
            let last = last.and_then(|n| n.parse::<u64>().ok());
            if let Some(last) = last.filter(|l| newest != Some(*l)) {
                if get(&format!("{base}/{last}.m4s")).is_none() {
                    l.lock().unwrap().closed = true;
                    return;
                }
                // (Numbered as the sequence numbers are: modulo 2^16.)
                l.lock().unwrap().packets.push((Instant::now(), last as u16));
                newest = Some(last);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    log
}

/// An RTSP reader of track 0 over TCP (interleaved), already playing.
fn rtsp_tcp_play(addr: SocketAddr, resource: &str) -> TcpStream {
    let url = format!("rtsp://{addr}/{resource}");
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut ask = |req: String| {
        c.write_all(req.as_bytes()).unwrap();
        let head = read_head(&mut c);
        assert!(head.starts_with("RTSP/1.0 200"), "{head}");
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .map_or(0, |n| n.trim().parse::<usize>().unwrap());
        let mut body = vec![0u8; len];
        c.read_exact(&mut body).unwrap();
        head
    };
    ask(format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"));
    let h = ask(format!(
        "SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n"
    ));
    let id = h.lines().find_map(|l| l.strip_prefix("Session: ")).unwrap().split(';').next().unwrap().to_string();
    ask(format!("PLAY {url} RTSP/1.0\r\nCSeq: 3\r\nSession: {id}\r\n\r\n"));
    c
}

fn names(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect()
}

/// 200 readers of `keep` (160 RTSP over UDP, 20 over TCP, 10 HTTP TS, 10 HLS) and a UDP sink
/// play on across 20 reloads that add, change and remove other sessions, with no gap in
/// any reader's sequence numbers; a proxy whose upstream URL changes switches in place, its
/// reader staying connected through one gap under a second.
#[test]
fn readers_play_on_across_reloads_and_a_moved_upstream_switches_in_place() {
    let file = config_file("readers");
    // (All 200 readers come from one address.)
    let head = format!("max_connections_per_ip = 0\n{}", session("pub", "publish = true"));
    let base = format!("{head}{}{}", session("keep", "demo = true"), session("other", "demo = true"));
    std::fs::write(&file, &base).unwrap();
    let relay = Relay::start(&["--config", file.to_str().unwrap(), "--rtsp", "127.0.0.1:0", "--no-demo"]);
    let rtsp = rtsp_addr(&relay);
    // A proxy of `keep`, added by the first reload (the RTSP port is known only now).
    let proxy = |of: &str| {
        session(
            "px",
            &format!("rtsp = \"rtsp://{rtsp}/{of}\", rtsp_transport = \"tcp\", on_demand = false, timeout_s = 30"),
        )
    };
    let (code, p) = reload(&relay, &file, &format!("{base}{}", proxy("keep")));
    assert_eq!(code, 200, "{p}");
    assert_eq!(names(&p["sessions"]["added"]), ["px"]);
    assert!(
        wait_for(Duration::from_secs(10), || relay.ok("GET", "/v1/sessions/px", None)["upstream"]["state"]
            == "playing"),
        "the proxy did not start playing"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let mut logs: Vec<(String, Log)> = Vec::new();
    let mut held = Vec::new(); // the RTSP control connections of the UDP readers
    for i in 0..160 {
        let p = rtsp_play(rtsp, "keep", None);
        logs.push((format!("rtsp-udp-{i}"), read_udp(p.rtp.try_clone().unwrap(), stop.clone())));
        held.push(p);
    }
    for i in 0..20 {
        logs.push((format!("rtsp-tcp-{i}"), read_interleaved(rtsp_tcp_play(rtsp, "keep"), stop.clone())));
    }
    for i in 0..10 {
        logs.push((format!("http-{i}"), read_http(relay.http_subscribe("keep"), stop.clone())));
        logs.push((format!("hls-{i}"), read_hls(relay.api, "keep", stop.clone())));
    }
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sink.local_addr().unwrap().port();
    relay.ok("POST", "/v1/sessions/keep/sinks", Some(json!({ "udp": format!("127.0.0.1:{port}") })));
    logs.push(("udp-sink".into(), read_udp(sink, stop.clone())));
    let px = read_interleaved(rtsp_tcp_play(rtsp, "px"), stop.clone());
    // A publisher (ffmpeg over RTMP, where there is ffmpeg) and a reader of what it publishes.
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let mut publisher = have_ffmpeg().then(|| ffmpeg_publish("flv", &format!("rtmp://{rtmp}/live/pub")));
    if publisher.is_some() {
        assert!(
            wait_for(Duration::from_secs(10), || relay.ok("GET", "/v1/sessions/pub", None)["publisher"]["state"]
                == "publishing"),
            "ffmpeg did not publish"
        );
        std::thread::sleep(Duration::from_secs(1));
        logs.push(("rtsp-tcp-pub".into(), read_interleaved(rtsp_tcp_play(rtsp, "pub"), stop.clone())));
    }
    std::thread::sleep(Duration::from_secs(2));

    // 20 reloads: each adds a session, removes the one before, and changes `other`.
    let other = |priority: usize| format!("{}priority = {priority}\n", session("other", "demo = true"));
    let mut last = None;
    for i in 0..20 {
        let text = format!(
            "{head}{}{}{}{}",
            session("keep", "demo = true"),
            proxy("keep"),
            session(&format!("extra{i}"), "demo = true"),
            other(i % 3)
        );
        let (code, p) = reload(&relay, &file, &text);
        assert_eq!(code, 200, "reload {i}: {p}");
        assert_eq!(names(&p["sessions"]["added"]), [format!("extra{i}")], "reload {i}: {p}");
        let removed = last.map(|l: usize| vec![format!("extra{l}")]).unwrap_or_default();
        assert_eq!(names(&p["sessions"]["removed"]), removed, "reload {i}: {p}");
        assert!(p["sessions"]["failed"].as_array().unwrap().is_empty(), "reload {i}: {p}");
        last = Some(i);
        std::thread::sleep(Duration::from_millis(300));
    }
    let list = relay.ok("GET", "/v1/sessions", None);
    let mut running: Vec<&str> =
        list["sessions"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    running.sort();
    assert_eq!(running, ["extra19", "keep", "other", "pub", "px"]);

    // The proxy's upstream moves from `keep` to `other`: the same tracks, in place.
    let before = relay.ok("GET", "/v1/sessions/px", None)["upstream"]["connects"].as_u64().unwrap();
    let text = format!("{head}{}{}{}", session("keep", "demo = true"), proxy("other"), other(19 % 3));
    let switched_at = Instant::now();
    let (code, p) = reload(&relay, &file, &text);
    assert_eq!(code, 200, "{p}");
    assert_eq!(names(&p["sessions"]["switched"]), ["px"], "{p}");
    assert_eq!(names(&p["sessions"]["removed"]), ["extra19"], "{p}");
    assert!(
        wait_for(Duration::from_secs(10), || {
            let up = &relay.ok("GET", "/v1/sessions/px", None)["upstream"];
            up["state"] == "playing" && up["url"].as_str().unwrap().ends_with("/other")
        }),
        "the proxy did not move to /other"
    );
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));

    if let Some(Kill(ffmpeg)) = &mut publisher {
        assert!(ffmpeg.try_wait().unwrap().is_none(), "the publisher was disconnected");
        let p = &relay.ok("GET", "/v1/sessions/pub", None)["publisher"];
        assert_eq!((&p["state"], &p["publishes"]), (&json!("publishing"), &json!(1)), "{p}");
    }
    let after = relay.ok("GET", "/v1/sessions/px", None)["upstream"]["connects"].as_u64().unwrap();
    assert_eq!(after, before + 1, "one new upstream connection for the move");
    let streams = logs.iter().filter(|(n, _)| !n.starts_with("hls"));
    let (longest, who) = streams.map(|(n, l)| (l.lock().unwrap().longest_gap(), n)).max().unwrap();
    eprintln!("{} readers: the longest pause of a stream (not HLS) across the reloads {longest:?} ({who})", logs.len());
    for (name, log) in &logs {
        let seen = log.lock().unwrap();
        assert!(!seen.closed, "{name}: its connection ended");
        // The RTSP readers get RTP, with sequence numbers; the HTTP readers and the UDP sink
        // get the session's MPEG-TS (a read or a datagram of several TS packets each): for
        // them, no pause.
        if name.starts_with("rtsp") {
            assert!(seen.packets.len() > 200, "{name}: only {} packets", seen.packets.len());
            let odd: Vec<(Duration, u16, u16)> = seen
                .packets
                .windows(2)
                .filter(|w| w[1].1 != w[0].1.wrapping_add(1))
                .map(|w| (w[1].0 - seen.packets[0].0, w[0].1, w[1].1))
                .collect();
            assert_eq!(seen.missing(), 0, "{name}: sequence numbers missing: {odd:?}");
        } else if name.starts_with("hls") {
            // Polled four times a segment: each new segment is the next one.
            assert!(seen.packets.len() >= 5, "{name}: {} segments", seen.packets.len());
            assert_eq!(seen.missing(), 0, "{name}: segments skipped or gone back: {:?}", seen.packets);
        } else {
            assert!(seen.packets.len() > 20, "{name}: only {} reads", seen.packets.len());
            assert!(seen.longest_gap() < Duration::from_millis(800), "{name}: a gap of {:?}", seen.longest_gap());
        }
    }
    let px = px.lock().unwrap();
    assert!(!px.closed, "the proxy's reader was disconnected by the move");
    let gaps_after: Vec<Duration> = px
        .packets
        .windows(2)
        .filter(|w| w[1].0 > switched_at)
        .map(|w| w[1].0 - w[0].0)
        .filter(|g| *g > Duration::from_millis(300))
        .collect();
    let longest = px.packets.windows(2).filter(|w| w[1].0 > switched_at).map(|w| w[1].0 - w[0].0).max();
    eprintln!("the proxy's reader: longest gap after the move {longest:?}, {} sequence numbers skipped", px.missing());
    assert!(gaps_after.len() <= 1 && gaps_after.iter().all(|g| *g < Duration::from_secs(1)), "{gaps_after:?}");
    assert!(px.packets.last().unwrap().0 > switched_at + Duration::from_secs(1), "nothing came after the move");
    drop(held);
}

fn basic(user: &str, pass: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
}

/// The status of an RTSP DESCRIBE of `demo` with these credentials.
fn describe(rtsp: SocketAddr, user: &str, pass: &str) -> String {
    let mut c = TcpStream::connect(rtsp).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = basic(user, pass);
    write!(c, "DESCRIBE rtsp://{rtsp}/demo RTSP/1.0\r\nCSeq: 1\r\nAuthorization: Basic {auth}\r\n\r\n").unwrap();
    read_head(&mut c).lines().next().unwrap_or_default().to_string()
}

/// A reload changes the API token, the RTSP users and the per-address cap at once; settings
/// read at the start are reported and wait; a config with errors is refused whole and
/// nothing changes; SIGHUP reloads as the API does.
#[test]
fn credentials_and_limits_change_at_once_and_a_bad_config_changes_nothing() {
    let file = config_file("auth");
    let users = |u: &str, p: &str| format!("[[rtsp_user]]\nname = \"{u}\"\npassword = \"{p}\"\n");
    std::fs::write(&file, format!("token = \"one\"\n{}", users("alice", "pw1"))).unwrap();
    let mut relay = Relay::start(&["--config", file.to_str().unwrap(), "--rtsp", "127.0.0.1:0"]);
    relay.token = Some("one".into());
    let rtsp = rtsp_addr(&relay);
    assert!(describe(rtsp, "alice", "pw1").starts_with("RTSP/1.0 200"));

    let new = format!("token = \"two\"\nmax_connections_per_ip = 4\nworkers = 3\n{}", users("bob", "pw2"));
    let (code, p) = reload(&relay, &file, &new);
    assert_eq!(code, 200, "{p}");
    assert_eq!(names(&p["applied"]), ["rtsp_user", "max_connections_per_ip", "token"], "{p}");
    assert_eq!(names(&p["at_restart"]), ["workers"], "{p}");
    // The old token no longer opens the API, the new one does.
    assert_eq!(relay.call("GET", "/v1/sessions", None).0, 401);
    relay.token = Some("two".into());
    assert_eq!(relay.call("GET", "/v1/sessions", None).0, 200);
    // RTSP: the old user is refused, the new one plays.
    let (alice, bob) = (describe(rtsp, "alice", "pw1"), describe(rtsp, "bob", "pw2"));
    assert!(alice.starts_with("RTSP/1.0 401") && bob.starts_with("RTSP/1.0 200"), "{alice} / {bob}");
    // The cap holds: with three open, a fourth gets in, a fifth not.
    std::thread::sleep(Duration::from_millis(300)); // (the DESCRIBEs' connections are closed)
    let held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(rtsp).unwrap()).collect();
    let mut fourth = TcpStream::connect(rtsp).unwrap();
    fourth.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(fourth, "OPTIONS rtsp://{rtsp}/ RTSP/1.0\r\nCSeq: 1\r\n\r\n").unwrap();
    assert!(read_head(&mut fourth).starts_with("RTSP/1.0 200"));
    let mut fifth = TcpStream::connect(rtsp).unwrap();
    fifth.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = write!(fifth, "OPTIONS rtsp://{rtsp}/ RTSP/1.0\r\nCSeq: 1\r\n\r\n");
    let mut b = [0u8; 64];
    let n = fifth.read(&mut b).unwrap_or(0);
    let answer = String::from_utf8_lossy(&b[..n]);
    assert!(n == 0 || answer.starts_with("RTSP/1.0 503"), "a fifth connection from one address: {answer}");
    drop((held, fourth, fifth));

    // A config with errors: refused whole, every problem named, nothing changed.
    let (code, p) = reload(&relay, &file, "token = \"three\"\nring = 1\nworkers = \"x\"\n");
    assert_eq!(code, 400, "{p}");
    let e = p["error"].as_str().unwrap();
    assert!(e.contains("line 2") && e.contains("ring") && e.contains("line 3"), "{e}");
    assert_eq!(relay.call("GET", "/v1/sessions", None).0, 200, "the token changed with a refused config");
    assert!(describe(rtsp, "bob", "pw2").starts_with("RTSP/1.0 200"));

    // SIGHUP: the same reload.
    std::fs::write(&file, format!("token = \"two\"\n{}{}", users("bob", "pw2"), session("hup", "demo = true")))
        .unwrap();
    assert_eq!(unsafe { libc::kill(relay.pid(), libc::SIGHUP) }, 0);
    assert!(
        wait_for(Duration::from_secs(10), || relay.call("GET", "/v1/sessions/hup", None).0 == 200),
        "SIGHUP did not add the session: {}",
        relay.stderr()
    );
    std::fs::write(&file, "token = \"two\"\nring = 1\n").unwrap();
    assert_eq!(unsafe { libc::kill(relay.pid(), libc::SIGHUP) }, 0);
    assert!(
        wait_for(Duration::from_secs(10), || relay.stderr().contains("the configuration is refused")),
        "{}",
        relay.stderr()
    );
    assert_eq!(relay.call("GET", "/v1/sessions/hup", None).0, 200, "a refused config removed a session");
}

/// `watch_config = true`: an edit of the file is applied within seconds, with no signal;
/// an edit with errors is refused (logged), the running configuration stays, and the next
/// good edit is applied.
#[test]
fn an_edited_config_file_is_applied_when_watched() {
    let file = config_file("watch");
    std::fs::write(&file, "watch_config = true\n").unwrap();
    let relay = Relay::start(&["--config", file.to_str().unwrap(), "--no-demo"]);
    assert_eq!(relay.call("GET", "/v1/sessions/w1", None).0, 404);
    std::fs::write(&file, format!("watch_config = true\n{}", session("w1", "demo = true"))).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || relay.call("GET", "/v1/sessions/w1", None).0 == 200),
        "the edit was not applied: {}",
        relay.stderr()
    );
    std::fs::write(&file, format!("watch_config = true\nring = 1\n{}", session("w2", "demo = true"))).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || relay.stderr().contains("is refused")),
        "a bad edit was not reported: {}",
        relay.stderr()
    );
    assert_eq!(relay.call("GET", "/v1/sessions/w1", None).0, 200, "a refused edit removed a session");
    assert_eq!(relay.call("GET", "/v1/sessions/w2", None).0, 404);
    std::fs::write(&file, format!("watch_config = true\n{}", session("w2", "demo = true"))).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || relay.call("GET", "/v1/sessions/w2", None).0 == 200
            && relay.call("GET", "/v1/sessions/w1", None).0 == 404),
        "the next edit was not applied: {}",
        relay.stderr()
    );
}

/// Whether process `pid` exists (a zombie counts as gone).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Processes an upgrade started (not the test's children): ended with the test, however
/// it ends.
struct Reap(Vec<u64>);

impl Drop for Reap {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

/// A process's threads and what each waits in (the kernel's view; gdb's where it is here).
fn threads(pid: u64) -> String {
    let mut out = String::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        out += &format!("\n  {} {}", read("comm").trim(), read("wchan"));
    }
    let bt = Command::new("gdb").args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt 8"]).output();
    if let Ok(bt) = bt {
        out += &String::from_utf8_lossy(&bt.stdout);
    }
    out
}

fn engine_pid(relay: &Relay) -> u64 {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.ok("GET", "/v1/engine", None)));
    r.unwrap_or_else(|_| panic!("the API did not answer; the relays said:\n{}", relay.stderr()))["pid"]
        .as_u64()
        .unwrap()
}

/// A binary upgrade under 500 readers (400 RTSP over UDP, 60 over TCP, 40 HTTP TS) and two
/// UDP sinks added through the API (one kept in the state file, one on a config session): a new process that fails to start changes nothing; one
/// that starts takes the listeners (new connections go to it, none refused while it takes
/// over) and the sinks, while every reader plays on from the old process without a reconnect
/// or a missing sequence number; the old one exits once they left. A second upgrade by
/// SIGUSR2.
#[test]
fn an_upgrade_under_500_readers_drops_none() {
    let file = config_file("upgrade");
    let dir = file.parent().unwrap().to_path_buf();
    let good = format!("max_connections_per_ip = 0\nupgrade_drain_s = 60\n{}", session("keep", "demo = true"));
    std::fs::write(&file, &good).unwrap();
    let state = dir.join("state.json");
    let config = file.to_str().unwrap();
    // As systemd would hear it (NotifyAccess=all): which process is the service's now.
    let notify_path = dir.join("notify");
    let _ = std::fs::remove_file(&notify_path);
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let env = format!("NOTIFY_SOCKET={}", notify_path.display());
    let args = ["--config", config, "--rtsp", "127.0.0.1:0", "--no-demo", "--state-file", state.to_str().unwrap()];
    let mut relay = Relay::try_start_wrapped(&["env", &env], &args).unwrap();
    let rtsp = rtsp_addr(&relay);
    let old = engine_pid(&relay);

    let stop = Arc::new(AtomicBool::new(false));
    let mut logs: Vec<(String, Log)> = Vec::new();
    let mut held = Vec::new();
    for i in 0..400 {
        let p = rtsp_play(rtsp, "keep", None);
        logs.push((format!("rtsp-udp-{i}"), read_udp(p.rtp.try_clone().unwrap(), stop.clone())));
        held.push(p);
    }
    for i in 0..60 {
        logs.push((format!("rtsp-tcp-{i}"), read_interleaved(rtsp_tcp_play(rtsp, "keep"), stop.clone())));
    }
    for i in 0..40 {
        logs.push((format!("http-{i}"), read_http(relay.http_subscribe("keep"), stop.clone())));
    }
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sink.local_addr().unwrap().port();
    // (A session made through the API: its sinks are the ones the state file keeps.)
    relay.ok("POST", "/v1/sessions", Some(json!({ "name": "made", "source": { "demo": true } })));
    relay.ok("POST", "/v1/sessions/made/sinks", Some(json!({ "udp": format!("127.0.0.1:{port}") })));
    let sink_log = read_udp(sink, stop.clone());
    // And one on the config's session (no state file keeps it: the old process hands it over).
    let config_sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = config_sink.local_addr().unwrap().port();
    relay.ok("POST", "/v1/sessions/keep/sinks", Some(json!({ "udp": format!("127.0.0.1:{port}") })));
    let config_sink_log = read_udp(config_sink, stop.clone());
    std::thread::sleep(Duration::from_secs(2));

    // A new binary that cannot start (here: the config it reads has an error): refused,
    // with the reason; this process serves on.
    std::fs::write(&file, format!("{good}ring = 1\n")).unwrap();
    let (code, why) = relay.call("POST", "/v1/upgrade", None);
    assert_eq!(code, 503, "{why}");
    assert!(why["error"].as_str().unwrap().contains("did not take over"), "{why}");
    assert_eq!(engine_pid(&relay), old);
    std::fs::write(&file, &good).unwrap();

    // New connections while the new process takes over: none refused.
    let knocking = Arc::new(AtomicBool::new(true));
    let knocker = {
        let knocking = knocking.clone();
        std::thread::spawn(move || {
            let (mut ok, mut refused) = (0, 0);
            while knocking.load(Ordering::Relaxed) {
                match TcpStream::connect(rtsp).and_then(|mut c| {
                    c.set_read_timeout(Some(Duration::from_secs(5)))?;
                    c.write_all(b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n\r\n")?;
                    let mut b = [0u8; 15];
                    c.read_exact(&mut b)?;
                    Ok(b.starts_with(b"RTSP/1.0 200"))
                }) {
                    Ok(true) => ok += 1,
                    _ => refused += 1,
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (ok, refused)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let at = Instant::now();
    let (code, up) = relay.call("POST", "/v1/upgrade", None);
    let took = at.elapsed();
    assert_eq!(code, 200, "{up}");
    let new = up["new_pid"].as_u64().unwrap();
    let mut reap = Reap(vec![new]);
    assert_ne!(new, old);
    assert_eq!(up["sinks_moved"], 2, "{up}");
    let mut told = [0u8; 256];
    let n = notify.recv(&mut told).expect("nothing told to NOTIFY_SOCKET");
    assert_eq!(std::str::from_utf8(&told[..n]).unwrap(), format!("MAINPID={new}\nREADY=1\n"));
    assert!(up["clients_draining"].as_u64().unwrap() >= 500, "{up}");
    std::thread::sleep(Duration::from_millis(500));
    knocking.store(false, Ordering::Relaxed);
    let (ok, refused) = knocker.join().unwrap();
    assert!(ok > 20 && refused == 0, "{ok} answered, {refused} refused around the hand-over");
    assert_eq!(engine_pid(&relay), new, "the API answers from the new process");
    // A reader that comes now plays from the new process.
    let late = read_interleaved(rtsp_tcp_play(rtsp, "keep"), stop.clone());
    std::thread::sleep(Duration::from_secs(3));
    assert!(relay.running(), "the old process exited while its readers play");
    let kept = relay.ok("GET", "/v1/sessions/made/sinks", None)["sinks"].as_array().unwrap().len();
    assert_eq!(kept, 1, "the kept sink is the new process's");

    stop.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    // The UDP readers leave as players do (an RTSP session outlives its connection).
    for mut p in held {
        let _ = write!(p.conn, "TEARDOWN rtsp://{rtsp}/keep RTSP/1.0\r\nCSeq: 9\r\nSession: {}\r\n\r\n", p.session);
    }
    // Its readers gone, the old process exits (well before upgrade_drain_s).
    assert!(wait_for(Duration::from_secs(10), || !relay.running()), "the old process did not exit once drained");

    let (longest, who) = logs.iter().map(|(n, l)| (l.lock().unwrap().longest_gap(), n)).max().unwrap();
    let sink_gap = sink_log.lock().unwrap().longest_gap().max(config_sink_log.lock().unwrap().longest_gap());
    eprintln!(
        "upgrade answered in {took:?} ({ok} connections answered around it); {} readers: longest gap {longest:?} ({who}); the moved UDP sinks' longest gap {sink_gap:?}",
        logs.len()
    );
    for (name, log) in &logs {
        let seen = log.lock().unwrap();
        assert!(!seen.closed, "{name}: its connection ended");
        // (An HTTP reader's reads come once per stream_flush_ms; the demo's video is about a
        // packet a picture.)
        let least = if name.starts_with("http") { 20 } else { 60 };
        assert!(seen.packets.len() > least, "{name}: only {} packets", seen.packets.len());
        if name.starts_with("rtsp") {
            let odd: Vec<(Duration, u16, u16)> = seen
                .packets
                .windows(2)
                .filter(|w| w[1].1 != w[0].1.wrapping_add(1))
                .map(|w| (w[1].0.saturating_duration_since(at), w[0].1, w[1].1))
                .take(10)
                .collect();
            assert_eq!(seen.missing(), 0, "{name}: sequence numbers missing (after the upgrade, from, to): {odd:?}");
        }
        assert!(seen.longest_gap() < Duration::from_millis(800), "{name}: a gap of {:?}", seen.longest_gap());
    }
    assert!(sink_gap < Duration::from_secs(1), "a moved sink paused {sink_gap:?}");
    for log in [&sink_log, &config_sink_log] {
        let last = log.lock().unwrap().packets.last().unwrap().0;
        assert!(last > at + Duration::from_secs(2), "a moved sink got nothing from the new process");
    }
    assert!(late.lock().unwrap().packets.len() > 30, "the reader after the upgrade got little");

    // Again, by SIGUSR2 to the process that serves now.
    assert!(alive(new), "the new process is gone; the relays said:\n{}", relay.stderr());
    assert!(Command::new("kill").args(["-USR2", &new.to_string()]).status().unwrap().success());
    assert!(wait_for(Duration::from_secs(10), || engine_pid(&relay) != new), "SIGUSR2 did not upgrade");
    let third = engine_pid(&relay);
    reap.0.push(third);
    assert!(
        wait_for(Duration::from_secs(12), || !alive(new)),
        "the second process did not exit, drained:\n{}",
        relay.stderr()
    );
    let p = rtsp_play(rtsp, "keep", None);
    p.rtp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(p.rtp.recv(&mut [0u8; 2048]).is_ok(), "no RTP from the third process");
    let _ = Command::new("kill").arg(third.to_string()).status();
    // (It once hung at exit: libsrt's exit handler waited for a listener bound after the
    // shutdown began. Where it waits, if it does again.)
    assert!(wait_for(Duration::from_secs(10), || !alive(third)), "the third process did not exit: {}", threads(third));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A publisher under an upgrade (ffmpeg over RTMP): it stays with the old process, whose
/// reader plays on; the new process's path waits for it. When the drain ends the old process
/// closes it; the encoder connecting again (as OBS does) publishes to the new process.
#[test]
fn a_publisher_stays_with_the_old_process_until_the_drain_ends() {
    if !have_ffmpeg() {
        return;
    }
    let file = config_file("upgrade-publisher");
    let dir = file.parent().unwrap().to_path_buf();
    std::fs::write(&file, format!("upgrade_drain_s = 4\n{}", session("pub", "publish = true"))).unwrap();
    let mut relay = Relay::start(&["--config", file.to_str().unwrap(), "--rtsp", "127.0.0.1:0", "--no-demo"]);
    let rtsp = rtsp_addr(&relay);
    let rtmp = relay.ok("GET", "/v1/engine", None)["rtmp"].as_str().unwrap().to_string();
    let url = format!("rtmp://{rtmp}/live/pub");
    let publishing = |relay: &Relay| relay.ok("GET", "/v1/sessions/pub", None)["publisher"]["state"] == "publishing";
    let mut first = ffmpeg_publish("flv", &url);
    assert!(wait_for(Duration::from_secs(10), || publishing(&relay)), "ffmpeg did not publish");
    std::thread::sleep(Duration::from_secs(1));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = read_interleaved(rtsp_tcp_play(rtsp, "pub"), stop.clone());

    let (code, up) = relay.call("POST", "/v1/upgrade", None);
    assert_eq!(code, 200, "{up}");
    let _reap = Reap(vec![up["new_pid"].as_u64().unwrap()]);
    let at = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    assert!(!publishing(&relay), "the new process has the publisher already");
    let during = reader.lock().unwrap().packets.iter().filter(|p| p.0 > at + Duration::from_millis(500)).count();
    assert!(during > 20, "the old process's reader got {during} packets after the hand-over");
    // The drain ends: the old process closes the publisher and its reader, and exits.
    assert!(wait_for(Duration::from_secs(10), || !relay.running()), "the old process did not exit");
    assert!(first.0.wait().is_ok());
    assert!(reader.lock().unwrap().closed, "the old process's reader was not closed at the end of the drain");
    // The encoder connects again: to the new process.
    let _second = ffmpeg_publish("flv", &url);
    assert!(wait_for(Duration::from_secs(10), || publishing(&relay)), "the new process took no publisher");
    let (ok, log) = ffmpeg_decode(&format!("rtsp://{rtsp}/pub"), &[], 2);
    assert!(ok && decoded_frames(&log) >= 25, "{log}");
    stop.store(true, Ordering::Relaxed);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A WebRTC viewer under an upgrade (pion over WHEP): it stays with the old process, on a
/// socket of its own connected to its address on the same port, and plays on frame for frame
/// while a viewer that comes after the upgrade plays from the new process on that port; the
/// old process exits once its viewer left.
#[test]
fn a_webrtc_viewer_plays_on_through_an_upgrade() {
    let Some(pion) = peer("pion-peer") else { return };
    let mut relay = Relay::start(&[]);
    let whep = relay.url("/demo/whep");
    let dir = std::env::temp_dir().join(format!("fanout-upgrade-webrtc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let play = |seconds: u32, name: &str| {
        Command::new(&pion)
            .args(["whep", &whep, "-seconds", &seconds.to_string(), "-h264"])
            .arg(dir.join(name))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let report = |c: std::process::Child| -> Value {
        let out = c.wait_with_output().unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("pion-peer: {e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let playing = |relay: &Relay| {
        let s = relay.ok("GET", "/v1/sessions/demo", None);
        s["webrtc"].as_array().map_or(0, |v| v.iter().filter(|v| v["state"] == "playing").count())
    };
    let before = play(16, "before.h264");
    assert!(wait_for(Duration::from_secs(10), || playing(&relay) == 1), "the viewer never played");
    std::thread::sleep(Duration::from_secs(3));
    let (code, up) = relay.call("POST", "/v1/upgrade", None);
    assert_eq!(code, 200, "{up}");
    let _reap = Reap(vec![up["new_pid"].as_u64().unwrap()]);
    assert_eq!(up["ports_moved"]["webrtc"], true, "{up}");
    std::thread::sleep(Duration::from_secs(2));
    let after = play(6, "after.h264");
    assert!(wait_for(Duration::from_secs(10), || playing(&relay) == 1), "the new process's viewer never played");
    let (kept, new) = (report(before), report(after));
    for (name, r) in [("the viewer through the upgrade", &kept), ("the viewer after it", &new)] {
        assert_eq!(r["ended"], "time", "{name}: {r}");
        assert!(r["starts_with_keyframe"] == true && r["frames_lost"] == 0, "{name}: {r}");
    }
    // (The demo is 25 pictures a second: the first viewer's 16 s are whole across the upgrade.)
    assert!(kept["frames_complete"].as_u64().unwrap() >= 14 * 25, "{kept}");
    assert!(new["frames_complete"].as_u64().unwrap() >= 4 * 25, "{new}");
    assert!(
        wait_for(Duration::from_secs(10), || !relay.running()),
        "the old process did not exit once its viewer left"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
