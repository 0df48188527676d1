//! Starts the real `fanout` binary on a free port and talks to it through its API.
#![allow(dead_code)]

pub mod browser;
pub mod vm;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Relay {
    child: Child,
    pub api: SocketAddr,
    pub token: Option<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Relay {
    pub fn start(extra: &[&str]) -> Relay {
        Self::try_start(extra).unwrap_or_else(|e| panic!("relay did not start: {e}"))
    }

    /// Starts the relay with this config file text (and RTSP on a free port).
    pub fn with_config(toml: &str, extra: &[&str]) -> Relay {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let cfg = std::env::temp_dir().join(format!("fanout-test-{}-{n}.toml", std::process::id()));
        std::fs::write(&cfg, toml).unwrap();
        let mut args = vec!["--rtsp", "127.0.0.1:0", "--config", cfg.to_str().unwrap()];
        args.extend_from_slice(extra);
        let relay = Relay::start(&args);
        let _ = std::fs::remove_file(&cfg);
        relay
    }

    pub fn try_start(extra: &[&str]) -> Result<Relay, String> {
        Self::try_start_wrapped(&[], extra)
    }

    /// Starts the relay under a wrapper command (e.g. `setpriv` to drop privileges).
    pub fn try_start_wrapped(wrapper: &[&str], extra: &[&str]) -> Result<Relay, String> {
        Self::try_start_at(wrapper, "127.0.0.1:0", extra)
    }

    /// Starts the relay under a wrapper (e.g. `ip netns exec NS`) with its API on `api`.
    pub fn try_start_at(wrapper: &[&str], api: &str, extra: &[&str]) -> Result<Relay, String> {
        let mut child = wrapped(wrapper, env!("CARGO_BIN_EXE_fanout"))
            .args(["serve", "--api", api])
            .args(extra)
            // (FANOUT_TEST_LOG=info shows more when a test is looked into.)
            .env("FANOUT_LOG", std::env::var("FANOUT_TEST_LOG").unwrap_or_else(|_| "warn".into()))
            // Each test's relay keeps no state (a test that does names its file).
            .env("FANOUT_STATE_FILE", "")
            // RTMP on a free port (`--rtmp` overrides it): tests run side by side.
            .env("FANOUT_RTMP", "127.0.0.1:0")
            .env("FANOUT_SRT", "127.0.0.1:0")
            .env("FANOUT_WEBRTC", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning fanout");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        if let Err(e) = out.read_line(&mut line) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.to_string());
        }
        let api_line = line.trim().strip_prefix("fanout: API ");
        let url = api_line.and_then(|l| l.strip_prefix("http://").or_else(|| l.strip_prefix("https://")));
        let Some(addr) = url.and_then(|l| l.strip_suffix("/v1/sessions")) else {
            let _ = child.wait();
            return Err(format!("unexpected first line {line:?}; stderr: {}", stderr.lock().unwrap()));
        };
        let api = addr.parse().unwrap();
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(line.clone()));
        let said = stdout.clone();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                let mut s = said.lock().unwrap();
                s.push_str(&l);
                s.push('\n');
            }
        });
        let token = extra.iter().position(|a| *a == "--token").map(|i| extra[i + 1].to_string());
        Ok(Relay { child, api, token, stderr, stdout })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api)
    }

    /// Calls the API; returns the status and the JSON body (Null if none).
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = ureq::request(method, &self.url(path)).timeout(Duration::from_secs(20));
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let r = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match r {
            Ok(resp) => {
                let code = resp.status();
                (code, resp.into_json().unwrap_or(Value::Null))
            }
            Err(ureq::Error::Status(code, resp)) => (code, resp.into_json().unwrap_or(Value::Null)),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    pub fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (code, v) = self.call(method, path, body);
        assert!((200..300).contains(&code), "{method} {path}: {code} {v}");
        v
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// What it printed on stdout (the banner).
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Opens an HTTP stream subscription and checks the response head.
    pub fn http_subscribe(&self, session: &str) -> TcpStream {
        let mut s = TcpStream::connect(self.api).unwrap();
        write!(s, "GET /v1/sessions/{session}/stream HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let head = read_head(&mut s);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s
    }

    /// Waits until the session's sinks count reaches `n`.
    pub fn wait_sinks(&self, session: &str, n: u64) {
        wait_for(Duration::from_secs(10), || self.ok("GET", &format!("/v1/sessions/{session}"), None)["sinks"] == n);
    }
}

impl Relay {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal and waits (bounded) for the relay to exit.
    pub fn signal_and_wait(&mut self, sig: i32) -> Option<std::process::ExitStatus> {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.pid(), sig) };
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// Whether this test runs as root. Without root it prints a loud SKIPPED line naming `what`
/// and why it `needs` root, and returns `false`; on CI, which runs as root, that is an error.
pub fn root_or_skip(what: &str, needs: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "CI runs the tests as root: {what} must run");
    eprintln!("\n*** SKIPPED {what}: needs root ({needs}) ***\n");
    false
}

/// Runs `f` on a thread inside a new network namespace with its own `lo` up, so eBPF
/// programs and qdiscs never touch the machine's interfaces. Without root it prints a loud
/// SKIPPED line and returns `false` (on CI as root, failing to make one is an error).
pub fn in_private_netns(test: &str, f: impl FnOnce() + Send + 'static) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let made = std::thread::spawn(move || {
        // SAFETY: unshare affects only this thread's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(format!("unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error()));
        }
        let st = Command::new("ip").args(["link", "set", "lo", "up"]).status().map_err(|e| format!("ip: {e}"))?;
        if !st.success() {
            return Err("ip link set lo up failed".into());
        }
        f();
        Ok(())
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p));
    match made {
        Ok(()) => true,
        Err(why) if root && std::env::var_os("CI").is_some() => {
            panic!("root but cannot make a network namespace: {why}")
        }
        Err(why) => {
            eprintln!("\n*** SKIPPED {test}: needs root for a network namespace and eBPF ({why}) ***\n");
            false
        }
    }
}

/// Raises `net.core.netdev_max_backlog` (a machine-wide knob: clones of one datagram queue
/// on one CPU's backlog) while alive, and restores it after the last user.
pub struct BacklogGuard;

static BACKLOG: std::sync::Mutex<(usize, Option<String>)> = std::sync::Mutex::new((0, None));
const BACKLOG_PATH: &str = "/proc/sys/net/core/netdev_max_backlog";

impl BacklogGuard {
    /// Call from the machine's own namespace (the knob is not visible in others).
    pub fn raise(to: u64) -> BacklogGuard {
        let mut b = BACKLOG.lock().unwrap();
        if b.0 == 0 {
            let old = std::fs::read_to_string(BACKLOG_PATH).unwrap_or_default();
            if old.trim().parse::<u64>().is_ok_and(|v| v < to) && std::fs::write(BACKLOG_PATH, to.to_string()).is_ok() {
                b.1 = Some(old);
            }
        }
        b.0 += 1;
        BacklogGuard
    }
}

impl Drop for BacklogGuard {
    fn drop(&mut self) {
        let mut b = BACKLOG.lock().unwrap();
        b.0 -= 1;
        if b.0 == 0 {
            if let Some(old) = b.1.take() {
                let _ = std::fs::write(BACKLOG_PATH, old.trim());
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `program` run by `wrapper` (a command that runs the rest of its arguments: `ip netns exec
/// NS`, `setpriv ...`, `strace ...`), or by itself where there is none.
pub fn wrapped(wrapper: &[&str], program: &str) -> Command {
    match wrapper.split_first() {
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(program);
            c
        }
        None => Command::new(program),
    }
}

pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

pub fn free_udp_port() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A UDP port below the kernel's ephemeral range (32768+) that is free now: sockets bound
/// to port 0 (every other socket of the suite) can never be given it, so it stays free.
pub fn unephemeral_udp_port(even: bool) -> SocketAddr {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let seed = std::process::id() as u16 ^ now.subsec_nanos() as u16;
    (0..2000u16)
        .map(|i| 20_000 + (seed.wrapping_add(i * 7) % 10_000))
        .filter(|p| !even || p % 2 == 0)
        .find(|&p| UdpSocket::bind(("127.0.0.1", p)).is_ok() && UdpSocket::bind(("127.0.0.1", p + 1)).is_ok())
        .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
        .expect("a free port below the ephemeral range")
}

/// How many datagrams the kernel dropped at these local UDP ports' receive buffers
/// (`/proc/net/udp`, last column): what a starved test reader lost before it could read.
pub fn udp_receive_drops(ports: &[u16]) -> u64 {
    let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let port = u16::from_str_radix(cols.get(1)?.rsplit(':').next()?, 16).ok()?;
            ports.contains(&port).then(|| cols.last()?.parse::<u64>().ok()).flatten()
        })
        .sum()
}

/// A test datagram: `seq` as 8 bytes, then a fill pattern.
pub fn datagram(seq: u64, len: usize) -> Vec<u8> {
    let mut d = vec![(seq % 251) as u8; len];
    d[..8].copy_from_slice(&seq.to_be_bytes());
    d
}

/// Sends `n` datagrams to `to` at `rate` per second, bounded.
pub fn send_paced(to: SocketAddr, n: u64, len: usize, rate: f64) {
    let s = UdpSocket::bind(if to.is_ipv6() { "[::1]:0" } else { "127.0.0.1:0" }).unwrap();
    let start = Instant::now();
    for seq in 0..n {
        let due = start + Duration::from_secs_f64(seq as f64 / rate);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        s.send_to(&datagram(seq, len), to).unwrap();
    }
}

/// Whether ffmpeg is here; on CI its absence is a failure, elsewhere a loud skip.
pub fn have_ffmpeg() -> bool {
    let ok = Command::new("ffprobe").arg("-version").stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("ffprobe is missing: scripts/test installs it (apt-get install ffmpeg)");
        }
        eprintln!("\n*** SKIPPED: ffprobe/ffmpeg not installed; run scripts/test to install them ***\n");
    }
    ok
}

/// The audio codec of what ffmpeg reads at `url`, and the frequency of its strongest tone over
/// a second of it, from the zero crossings of the decoded samples.
pub fn tone_of(url: &str) -> (String, f64) {
    let out = Command::new("timeout")
        .args(["30", "ffmpeg", "-nostdin", "-hide_banner", "-i", url, "-map", "0:a", "-t", "2"])
        .args(["-ac", "1", "-ar", "48000", "-f", "s16le", "-"])
        .output()
        .unwrap();
    // (The input's audio codec, from ffmpeg's description of it: "Stream #0:1: Audio: aac".)
    let log = String::from_utf8_lossy(&out.stderr);
    let codec = log
        .lines()
        .take_while(|l| !l.starts_with("Stream mapping"))
        .find_map(|l| l.split_once(": Audio: ").map(|(_, c)| c.split([' ', ',']).next().unwrap_or("").to_string()))
        .unwrap_or_default();
    let samples: Vec<i16> = out.stdout.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
    // The last second (the decoder's start left behind).
    let last = &samples[samples.len().saturating_sub(48_000)..];
    let crossings = last.windows(2).filter(|w| (w[0] < 0) != (w[1] < 0)).count();
    (codec, crossings as f64 / 2.0 * 48_000.0 / last.len().max(1) as f64)
}

/// Decodes `seconds` of `url`'s video with ffmpeg (`input_args` go before `-i`), bounded
/// at 30 s; returns whether it succeeded and its log.
pub fn ffmpeg_decode(url: &str, input_args: &[&str], seconds: u32) -> (bool, String) {
    let out = std::process::Command::new("timeout")
        .args(["30", "ffmpeg", "-hide_banner", "-nostdin"])
        .args(input_args)
        .args(["-i", url, "-t", &seconds.to_string(), "-map", "0:v", "-f", "null", "-"])
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// How many frames ffmpeg's decoder makes of an H.264 file.
pub fn h264_file_frames(h264: &std::path::Path) -> u64 {
    let out = std::process::Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-f",
            "h264",
            "-count_frames",
            "-show_entries",
            "stream=nb_read_frames",
            "-of",
            "csv=p=0",
        ])
        .arg(h264)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
}

pub fn decoded_frames(ffmpeg_log: &str) -> u64 {
    ffmpeg_log
        .rsplit("frame=")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The address a session's source is bound to, from a session's JSON (create with port 0).
pub fn source_addr(session: &Value) -> SocketAddr {
    session["source"]["addr"].as_str().expect("source address").parse().unwrap()
}

/// Creates a session whose source binds a free port itself (no race with other tests for a
/// port chosen in advance); returns the bound address.
pub fn create_on_free_port(relay: &Relay, mut spec: Value) -> SocketAddr {
    let kind = if spec["source"]["tcp_listen"].is_null() { "udp" } else { "tcp_listen" };
    spec["source"][kind] = json!("127.0.0.1:0");
    source_addr(&relay.ok("POST", "/v1/sessions", Some(spec)))
}

pub fn rtsp_addr(relay: &Relay) -> SocketAddr {
    let e = relay.ok("GET", "/v1/engine", None);
    e["rtsp"].as_str().expect("the relay listens for RTSP").parse().unwrap()
}

/// An RTSP client playing track 0 of a resource over UDP, set up by hand.
pub struct RtspPlay {
    pub conn: std::net::TcpStream,
    pub rtp: std::net::UdpSocket,
    /// The sequence number `RTP-Info` announced.
    pub seq: u16,
    pub session: String,
    /// The SETUP answer's Transport.
    pub transport: String,
    /// The DESCRIBE answer's body.
    pub sdp: String,
}

impl RtspPlay {
    /// The server's RTCP port, from the SETUP answer's `server_port`.
    pub fn server_rtcp(&self) -> u16 {
        server_ports(&self.transport).1
    }
}

/// The `server_port` pair of a SETUP answer's Transport.
fn server_ports(transport: &str) -> (u16, u16) {
    transport
        .split(';')
        .find_map(|f| f.strip_prefix("server_port="))
        .and_then(|ports| ports.split_once('-'))
        .and_then(|(rtp, rtcp)| Some((rtp.parse().ok()?, rtcp.parse().ok()?)))
        .expect("server_port in the SETUP answer")
}

/// DESCRIBE, SETUP (track 0, UDP), PLAY. `rtcp`: the client's RTCP port to announce
/// (default: RTP + 1).
pub fn rtsp_play(addr: SocketAddr, resource: &str, rtcp: Option<u16>) -> RtspPlay {
    use std::io::{Read, Write};
    let url = format!("rtsp://{addr}/{resource}");
    let rtp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = rtp.local_addr().unwrap().port();
    let rtcp = rtcp.unwrap_or(port + 1);
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut ask = |req: String| -> fanout_proto::rtsp::Response {
        c.write_all(req.as_bytes()).unwrap();
        let mut buf = vec![0u8; 8192];
        let mut got = Vec::new();
        // One response: the head, then Content-Length bytes.
        loop {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed");
            got.extend_from_slice(&buf[..n]);
            if let Ok(Some((fanout_proto::rtsp::Message::Response(r), _))) =
                fanout_proto::rtsp::parse(&got, &fanout_proto::rtsp::Limits::default())
            {
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&got));
                return r;
            }
        }
    };
    let d = ask(format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n\r\n"));
    let sdp = String::from_utf8_lossy(&d.body).into_owned();
    let s = ask(format!(
        "SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP;unicast;client_port={port}-{rtcp}\r\n\r\n"
    ));
    let transport = s.headers.get("Transport").unwrap().to_string();
    // Take RTP only from the server's port, as players do: another test's relay may still be
    // sending to a port this socket got after it was freed.
    rtp.connect((addr.ip(), server_ports(&transport).0)).unwrap();
    let session = s.headers.get("Session").unwrap().split(';').next().unwrap().to_string();
    let p = ask(format!("PLAY {url} RTSP/1.0\r\nCSeq: 3\r\nSession: {session}\r\n\r\n"));
    let info = p.headers.get("RTP-Info").expect("RTP-Info").to_string();
    let seq = info.split(';').find_map(|f| f.strip_prefix("seq=")).unwrap().parse().unwrap();
    RtspPlay { conn: c, rtp, seq, session, transport, sdp }
}

/// Whether GStreamer's `gst-launch-1.0` is here; on CI its absence is a failure (scripts/test
/// installs it), elsewhere a loud skip.
pub fn have_gstreamer() -> bool {
    let ok = Command::new("gst-launch-1.0").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("gst-launch-1.0 is missing: scripts/test installs it (apt-get install gstreamer1.0-tools)");
        }
        eprintln!("\n*** SKIPPED: GStreamer not installed; run scripts/test to install it ***\n");
    }
    ok
}

/// A running `gst-launch-1.0` whose stdout and stderr share one pipe, read as it writes (a
/// verbose pipeline writes more than a pipe holds), so the log keeps GStreamer's own order
/// (`g_print` flushes every line).
pub struct Gst {
    child: Child,
    log: std::thread::JoinHandle<String>,
}

impl Gst {
    pub fn spawn(mut cmd: Command) -> Gst {
        let (mut r, w) = std::io::pipe().unwrap();
        cmd.stdout(w.try_clone().unwrap()).stderr(w);
        let child = cmd.spawn().unwrap();
        // The command keeps copies of the write end: drop them, or the reader never sees EOF.
        drop(cmd);
        let log = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        });
        Gst { child, log }
    }

    /// Waits for it to end and gives its whole log.
    pub fn log(mut self) -> String {
        let _ = self.child.wait();
        self.log.join().unwrap()
    }
}

/// GStreamer's errors while it played. Once `timeout -s INT` interrupts it, rtspsrc's PAUSE and
/// TEARDOWN may race its own flush of the connection ("Operation was cancelled", then "Could
/// not send message"): that is the player's shutdown, not the stream, so it is not counted.
pub fn gst_errors_while_playing(log: &str) -> Vec<&str> {
    let playing = log.split("handling interrupt").next().unwrap_or_default();
    playing.lines().filter(|l| l.contains("ERROR")).collect()
}

/// A child process killed (and reaped) when the test lets go of it, however it ends.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `framemd5` hashes of the video ffmpeg decodes with `args` (its input and options), in
/// order: what a test compares picture for picture.
pub fn pictures(args: &[&str]) -> Vec<String> {
    let out = Command::new("timeout")
        .args(["40", "ffmpeg", "-nostdin", "-loglevel", "error"])
        .args(args)
        .args(["-map", "0:v", "-f", "framemd5", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(',').nth(5).map(|m| m.trim().to_string()))
        .collect()
}

/// What arrives on RTP socket `rtp` for `how_long`, read on a thread of its own: (arrival,
/// SSRC, sequence number, RTP time) of each packet.
pub fn rtp_headers_for(
    rtp: std::net::UdpSocket,
    how_long: Duration,
) -> std::thread::JoinHandle<Vec<(Instant, u32, u16, u32)>> {
    let until = Instant::now() + how_long;
    std::thread::spawn(move || {
        rtp.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let (mut got, mut b) = (Vec::new(), [0u8; 2048]);
        while Instant::now() < until {
            let Ok(n) = rtp.recv(&mut b) else { continue };
            if n >= 12 {
                let word = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
                got.push((Instant::now(), word(8), u16::from_be_bytes([b[2], b[3]]), word(4)));
            }
        }
        got
    })
}

/// Reads a response head (HTTP or RTSP) byte by byte, through its blank line.
pub fn read_head(s: &mut impl Read) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

/// The sender reports (NTP seconds, RTP time) that arrive on `rtcp` until `until`.
pub fn sender_reports(rtcp: &std::net::UdpSocket, until: Instant) -> Vec<(f64, u32)> {
    rtcp.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut reports = Vec::new();
    let mut b = [0u8; 1500];
    while Instant::now() < until {
        let Ok(n) = rtcp.recv(&mut b) else { continue };
        if n >= 20 && b[1] == 200 {
            let ntp = u64::from_be_bytes(b[8..16].try_into().unwrap());
            let rtp = u32::from_be_bytes(b[16..20].try_into().unwrap());
            reports.push((ntp as f64 / 4_294_967_296.0, rtp));
        }
    }
    reports
}

/// Every report's RTP time against its wall clock follows from the first report's at
/// `rate` Hz, within half a second: one clock, whatever happened upstream.
pub fn assert_one_clock(reports: &[(f64, u32)], rate: f64) {
    assert!(reports.len() >= 2, "{} sender reports: {reports:?}", reports.len());
    let (t0, r0) = reports[0];
    for &(t, r) in &reports[1..] {
        let by_rtp = f64::from(r.wrapping_sub(r0)) / rate;
        assert!(
            (by_rtp - (t - t0)).abs() < 0.5,
            "a report {:.1} s on by its wall clock, {by_rtp:.1} s by its RTP time: {reports:?}",
            t - t0
        );
    }
}

/// The demo clip (H.264 + AAC, 8 s), as encoders in the tests publish it.
pub const DEMO_TS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts");

/// ffmpeg publishing the demo clip looped to `url` in container `format` (`flv` for RTMP,
/// `mpegts` for SRT), 30 s at most.
pub fn ffmpeg_publish(format: &str, url: &str) -> Kill {
    let mut c = Command::new("ffmpeg");
    c.args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", DEMO_TS]);
    c.args(["-t", "30", "-c", "copy", "-f", format, url]);
    Kill(c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
}

/// ffmpeg publishing for a moment: whether it was let in, and what it said.
pub fn ffmpeg_try_publish(format: &str, url: &str) -> (bool, String) {
    let out = Command::new("timeout")
        .args(["20", "ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-i", DEMO_TS, "-t", "2"])
        .args(["-c", "copy", "-f", format, url])
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The relay's `/metrics` text.
pub fn metrics(relay: &Relay) -> String {
    let out = Command::new("curl").args(["-s", &relay.url("/metrics")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A program scripts/install-peers put in `.peers/`. Where install-peers could not build it on
/// this machine it left `.peers/NAME.unavailable` with the reason: a loud skip. Otherwise its
/// absence is a failure on CI and a loud skip elsewhere.
pub fn peer(name: &str) -> Option<std::path::PathBuf> {
    let peers = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers");
    let p = peers.join(name);
    if p.exists() {
        return Some(p);
    }
    let top = name.split('/').next().unwrap_or(name);
    if let Ok(why) = std::fs::read_to_string(peers.join(format!("{top}.unavailable"))) {
        eprintln!("\n*** SKIPPED: {top} could not be installed here: {} ***\n", why.trim());
        return None;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{} is missing: scripts/test installs it (scripts/install-peers)", p.display());
    }
    eprintln!("\n*** SKIPPED: {name} not installed; run scripts/install-peers ***\n");
    None
}

/// Whether `s` comes to its end (EOF or a reset) within `limit`, reading what comes meanwhile.
pub fn stream_ends_within(s: &mut TcpStream, limit: Duration) -> bool {
    let t0 = Instant::now();
    let mut buf = [0u8; 64 << 10];
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    while t0.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A directory of this test's own, emptied first.
pub fn scratch_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A pion-peer's JSON report, after it ends by itself.
pub fn pion_report(child: std::process::Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|_| panic!("pion-peer: {text} / {}", String::from_utf8_lossy(&out.stderr)))
}

/// `fanout gen` sending an Annex B `file` to `to` at `fps` for `seconds` (killed when dropped).
pub fn gen_file(to: std::net::SocketAddr, file: &str, fps: u32, seconds: u32) -> Kill {
    Kill(
        std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["gen", "--to", &to.to_string(), "--file", file])
            .args(["--fps", &fps.to_string(), "--duration", &seconds.to_string()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A second WebRTC stack (pion, Go; scripts/install-peers builds `peers/pion`) as the player:
/// `pion-peer whep` plays `url` for `seconds` (dropping the fraction `drop` of the video
/// packets next to its network, asking for a keyframe every `pli_ms` unless 0), writes the
/// complete frames to `h264`, and reports.
pub fn pion_play(
    pion: &std::path::Path,
    url: &str,
    seconds: u32,
    drop: f64,
    h264: &std::path::Path,
    pli_ms: u32,
) -> std::process::Child {
    std::process::Command::new(pion)
        .args(["whep", url, "-seconds", &seconds.to_string(), "-drop", &drop.to_string()])
        .args(["-pli", &pli_ms.to_string(), "-h264"])
        .arg(h264)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}
