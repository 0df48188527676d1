//! `fanout bench rtsp`: N RTSP clients of one upstream stream, through `fanout` (per data
//! path), straight from MediaMTX, and through the live555 proxy, side by side in one run.
//! The figure is the server's CPU per RTP packet the clients received.
//!
//! The upstream is MediaMTX fed by ffmpeg with the looped demo clip (video + audio). The
//! clients are one process (`bench rtsp-load`) that sets up N sessions over UDP with the
//! same sans-IO client the relay uses upstream and counts what arrives. Each server is its
//! own process; its CPU (plus ksoftirqd's) is read from /proc over the steady window.

use super::{process_cpu_s, softirqd_cpu_s, Proc, RelayProc};
use anyhow::{bail, Context};
use clap::Args;
use fanout_proto::rtsp::client::{Client, Step, Url};
use fanout_proto::rtsp::{self, Limits, Lower, Message};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct RtspArgs {
    /// Servers to compare: `fanout:PATH` (a data path), `fanout-srtp:PATH` (RTSPS with SRTP
    /// over UDP, one key per epoch shared by its clients), `fanout-srtp-each:PATH` (a key
    /// per client), `mediamtx`, `mediamtx-srtp` (its RTSPS with SRTP over UDP), `live555`.
    #[arg(long, value_delimiter = ',', default_value = "fanout:shared,mediamtx,live555")]
    targets: Vec<String>,
    /// Client counts to step through.
    #[arg(long, value_delimiter = ',', default_value = "100,500")]
    clients: Vec<usize>,
    /// Seconds measured per target and step.
    #[arg(long, default_value_t = 15.0)]
    seconds: f64,
    /// Rounds: the targets alternate, so drift on a noisy machine hits all alike.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// The peers scripts/install-peers builds.
    #[arg(long, default_value = ".peers")]
    peers: PathBuf,
    /// A short run (fanout only, 20 clients, 3 s, one round) that checks the bench works.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// (internal) The load client: N RTSP sessions over UDP in one process.
#[derive(Args)]
pub struct LoadArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    clients: usize,
    #[arg(long)]
    seconds: f64,
    /// RTSPS: trust this certificate and ask for SRTP (`RTP/SAVP`) over UDP.
    #[arg(long)]
    cacert: Option<PathBuf>,
    /// RTP interleaved on each client's RTSP connection (`RTP/AVP/TCP`) instead of UDP.
    /// (Either way every track's sequence numbers are followed and the missing reported.)
    #[arg(long)]
    tcp: bool,
}

/// An RTSP control connection: TCP, or TLS on TCP.
pub(super) trait Conn: Read + Write + Send {
    fn tcp(&self) -> &TcpStream;
}

impl Conn for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Conn for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// One client: its control connection and, per track, the RTP and RTCP sockets.
pub(super) struct LoadClient {
    pub conn: Box<dyn Conn>,
    pub client: Client,
    pub rtp: Vec<mio::net::UdpSocket>,
    pub rtcp: Vec<std::net::UdpSocket>,
}

/// Sends `bytes` and feeds responses to the client until it has something else to say.
fn exchange(c: &mut dyn Conn, client: &mut Client, bytes: &[u8]) -> anyhow::Result<Step> {
    c.write_all(bytes)?;
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 8192]);
    loop {
        while let Some((msg, used)) = rtsp::parse(&buf, &Limits::default())? {
            buf.drain(..used);
            if let Message::Response(r) = msg {
                return Ok(client.on_response(&r, 0)?);
            }
        }
        let n = c.read(&mut chunk)?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sets up every track over UDP (ports on `bind`), or with `interleaved` on the connection
/// (channels 2k and 2k + 1), and plays; with `tls`, over RTSPS, asking for SRTP.
pub(super) fn open_client(
    url: &Url,
    bind: std::net::IpAddr,
    tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
    interleaved: bool,
) -> anyhow::Result<LoadClient> {
    let tcp = TcpStream::connect((url.host.as_str(), url.port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(15)))?;
    let mut conn: Box<dyn Conn> = match tls {
        None => Box::new(tcp),
        Some(cfg) => {
            let name = rustls::pki_types::ServerName::try_from(url.host.clone())?;
            Box::new(rustls::StreamOwned::new(rustls::ClientConnection::new(cfg.clone(), name)?, tcp))
        }
    };
    let mut client = Client::new(url.clone(), "fanout-rtsp-load");
    client.savp = tls.is_some();
    let first = client.start(0);
    let (mut rtp, mut rtcp) = (Vec::new(), Vec::new());
    let mut step = exchange(conn.as_mut(), &mut client, &first)?;
    loop {
        step = match step {
            Step::Send(b) => exchange(conn.as_mut(), &mut client, &b)?,
            Step::Described(sdp) => {
                if client.savp {
                    // Our own key per track in SETUP (MediaMTX requires one; fanout ignores it).
                    client.key_mgmt = sdp.media.iter().map(|_| own_mikey()).collect::<anyhow::Result<_>>()?;
                }
                let mut lowers = Vec::new();
                for (k, _) in sdp.media.iter().enumerate() {
                    if interleaved {
                        let rtp = u8::try_from(2 * k).context("too many tracks")?;
                        lowers.push(Lower::Interleaved { rtp, rtcp: rtp + 1 });
                        continue;
                    }
                    let (a, b) = fanout_io::sys::port_pair(bind)?;
                    lowers.push(Lower::Udp { client_rtp: a.local_addr()?.port(), client_rtcp: b.local_addr()?.port() });
                    a.set_nonblocking(true)?;
                    rtp.push(mio::net::UdpSocket::from_std(a));
                    rtcp.push(b);
                }
                let b = client.setup(lowers, 0)?;
                exchange(conn.as_mut(), &mut client, &b)?
            }
            Step::Playing => return Ok(LoadClient { conn, client, rtp, rtcp }),
            Step::Idle => bail!("the server went quiet during setup"),
        }
    }
}

/// A fresh SRTP key as a MIKEY message (base64), for the SRTCP a client would send.
fn own_mikey() -> anyhow::Result<String> {
    // 30 bytes of key and salt, 20 for the message's RAND and CSB ID, 4 for the SSRC.
    let mut b = [0u8; 54];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut b)
        .map_err(|_| anyhow::anyhow!("no system randomness"))?;
    let key = fanout_proto::rtp::srtp::MasterKey::from_concat(&b[..30]).context("30 bytes")?;
    let rand: [u8; 20] = b[30..50].try_into().context("20 bytes")?;
    let ssrc = u32::from_be_bytes([b[50], b[51], b[52], b[53]]);
    let ntp =
        fanout_proto::rtp::rtcp::ntp_from_unix(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?);
    let suite = fanout_proto::rtp::srtp::Suite::AesCm128HmacSha1_80;
    Ok(fanout_proto::rtp::mikey::Mikey::announce(suite, &key, ssrc, rand, ntp))
}

/// A one-client player: plays `url` over UDP and hands over its first track's RTP socket,
/// blocking with a 50 ms read timeout.
pub(super) fn open_player(url: &Url) -> anyhow::Result<(LoadClient, std::net::UdpSocket)> {
    let mut c = open_client(url, std::net::IpAddr::from([0, 0, 0, 0]), None, false)?;
    let s = c.rtp.remove(0);
    // SAFETY: the mio socket's fd moves into a std socket that now owns it.
    let rtp =
        unsafe { <std::net::UdpSocket as std::os::fd::FromRawFd>::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(s)) };
    rtp.set_nonblocking(false)?;
    rtp.set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok((c, rtp))
}

pub fn load(a: LoadArgs) -> anyhow::Result<()> {
    let url = Url::parse(&a.url).map_err(anyhow::Error::msg)?;
    if a.tcp {
        if a.cacert.is_some() {
            bail!("--tcp is RTSP over plain TCP (RTSPS interleaved is not measured here)");
        }
        return load_interleaved(&url, a.clients, a.seconds);
    }
    let tls = a.cacert.as_deref().map(crate::tls::trusting).transpose()?;
    let mut clients = open_clients(&url, a.clients, tls.as_ref(), false)?;
    let mut poll = mio::Poll::new()?;
    let mut owner = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        for s in c.rtp.iter_mut() {
            poll.registry().register(s, mio::Token(owner.len()), mio::Interest::READABLE)?;
            owner.push(i);
        }
    }
    let mut buf = [0u8; 2048];
    let socks: Vec<&mio::net::UdpSocket> = clients.iter().flat_map(|c| c.rtp.iter()).collect();
    // What arrived while the other clients were being set up was sent before the server's
    // CPU is read: counted, it would flatter a server whose setups are slow (500 TLS
    // handshakes take seconds, and the first clients' buffers filled meanwhile).
    // Each track's sequence numbers are followed from the first packet on, the early ones too;
    // what went missing before the window (the first clients' buffers overflow while 3000
    // others are set up) is counted apart, as the early packets are.
    let mut seqs = vec![SeqFollow::default(); socks.len()];
    let mut early = 0u64;
    for (t, s) in socks.iter().enumerate() {
        while let Ok(n) = s.recv(&mut buf) {
            seqs[t].see(&buf[..n]);
            early += 1;
        }
    }
    let mut early_lost: u64 = seqs.iter().map(SeqFollow::lost).sum();
    // A socket that overflowed while the others were set up shows its gap only with the
    // first packet after it was drained: that gap is early too (the kernel's overflow count
    // over the window, printed below, says none was dropped in it).
    let mut fresh = vec![true; socks.len()];
    println!("rtsp-load: ready");
    std::io::stdout().flush()?;
    // Datagrams the kernel dropped at full receive buffers during the window: this load's
    // own shortfall (loopback only), told apart from what the server never sent.
    let overflows0 = crate::sub::udp_rcvbuf_errors();
    let mut got = vec![0u64; clients.len()];
    let mut bytes = 0u64;
    let mut events = mio::Events::with_capacity(1024);
    let end = Instant::now() + Duration::from_secs_f64(a.seconds.min(600.0));
    while Instant::now() < end {
        poll.poll(&mut events, Some(end.saturating_duration_since(Instant::now())))?;
        for e in &events {
            let t = e.token().0;
            while let Ok(n) = socks[t].recv(&mut buf) {
                got[owner[t]] += 1;
                bytes += n as u64;
                let before = seqs[t].lost();
                seqs[t].see(&buf[..n]);
                if std::mem::take(&mut fresh[t]) {
                    early_lost += seqs[t].lost().saturating_sub(before);
                }
            }
        }
    }
    let total: u64 = got.iter().sum();
    let (min, max) = (got.iter().min().copied().unwrap_or(0), got.iter().max().copied().unwrap_or(0));
    let lost = seqs.iter().map(SeqFollow::lost).sum::<u64>().saturating_sub(early_lost);
    let late: u64 = seqs.iter().map(|s| s.late).sum();
    println!("rtsp-load: packets {total} min {min} max {max} bytes {bytes} early {early} lost {lost} early_lost {early_lost} late {late} overflows {}",
        crate::sub::udp_rcvbuf_errors().saturating_sub(overflows0)
    );
    std::io::stdout().flush()?;
    // Every session is torn down and answered before the sockets go: a server still
    // sending to a closed client's port would reach whoever gets that port next (the next
    // step's load client), and its packets would be counted for the wrong server.
    for c in &mut clients {
        if let Some(b) = c.client.teardown(0) {
            let _ = c.conn.write_all(&b);
        }
    }
    let mut answered = 0;
    for c in &mut clients {
        let _ = c.conn.tcp().set_read_timeout(Some(Duration::from_secs(2)));
        let mut b = [0u8; 1024];
        if c.conn.read(&mut b).is_ok_and(|n| n > 0) {
            answered += 1;
        }
    }
    if answered < clients.len() {
        eprintln!("rtsp-load: {} of {} TEARDOWNs unanswered", clients.len() - answered, clients.len());
    }
    Ok(())
}

/// Opens `n` clients, retrying a refused setup a bounded number of times.
fn open_clients(
    url: &Url,
    n: usize,
    tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
    interleaved: bool,
) -> anyhow::Result<Vec<LoadClient>> {
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        // A server may refuse one setup now and then (MediaMTX answered one SETUP in a few
        // hundred with 400): retry it, a bounded number of times, and say so.
        let mut tries = 0;
        let c = loop {
            match open_client(url, std::net::IpAddr::from([127, 0, 0, 1]), tls, interleaved) {
                Ok(c) => break c,
                Err(e) if tries < 3 => {
                    tries += 1;
                    eprintln!("rtsp-load: client {i}: {e:#}; retrying");
                }
                Err(e) => return Err(e.context(format!("client {i}"))),
            }
        };
        clients.push(c);
    }
    Ok(clients)
}

/// One RTP stream's sequence numbers as they arrive. A jump forward of less than 1000 is a
/// gap; a packet less than 1000 behind the newest came late (loopback reorders: a sink's
/// packets sent from two CPUs wait in two per-CPU queues) and fills a gap counted before;
/// anything else is a new start.
#[derive(Default, Clone, Copy)]
struct SeqFollow {
    last: Option<u16>,
    gaps: u64,
    late: u64,
}

impl SeqFollow {
    fn see(&mut self, pkt: &[u8]) {
        let Some(b) = pkt.get(2..4) else { return };
        let seq = u16::from_be_bytes([b[0], b[1]]);
        let Some(last) = self.last else {
            self.last = Some(seq);
            return;
        };
        match seq.wrapping_sub(last) {
            0 => {}
            d @ 1..1000 => {
                self.gaps += u64::from(d - 1);
                self.last = Some(seq);
            }
            _ if last.wrapping_sub(seq) < 1000 => self.late += 1,
            _ => self.last = Some(seq),
        }
    }

    /// Packets missing: the gaps that no late packet filled.
    fn lost(&self) -> u64 {
        self.gaps.saturating_sub(self.late)
    }
}

/// One interleaved client's reading: bytes not yet a whole frame, and per RTP channel its
/// sequence numbers.
#[derive(Default)]
struct TcpReading {
    buf: Vec<u8>,
    seqs: [SeqFollow; 8],
    packets: u64,
}

impl TcpReading {
    /// Takes what the connection gave; returns the RTP bytes it completed.
    fn take(&mut self, data: &[u8]) -> u64 {
        self.buf.extend_from_slice(data);
        let (mut at, mut bytes) = (0, 0u64);
        while self.buf.len() - at >= 4 {
            let b = &self.buf[at..];
            if b[0] != b'$' {
                // A response (to nothing we asked mid-run): skip to the next frame.
                match b.iter().position(|&c| c == b'$') {
                    Some(k) => at += k,
                    None => at = self.buf.len(),
                }
                continue;
            }
            let len = usize::from(u16::from_be_bytes([b[2], b[3]]));
            if b.len() < 4 + len {
                break;
            }
            let (channel, pkt) = (b[1], &b[4..4 + len]);
            if channel % 2 == 0 && pkt.len() >= 12 {
                if let Some(seq) = self.seqs.get_mut(usize::from(channel / 2)) {
                    seq.see(pkt);
                }
                self.packets += 1;
                bytes += len as u64;
            }
            at += 4 + len;
        }
        self.buf.drain(..at);
        bytes
    }

    fn lost(&self) -> u64 {
        self.seqs.iter().map(SeqFollow::lost).sum()
    }
}

/// `rtsp-load --tcp`: N clients taking RTP interleaved, read with one poll loop.
fn load_interleaved(url: &Url, n: usize, seconds: f64) -> anyhow::Result<()> {
    let mut clients = open_clients(url, n, None, true)?;
    let mut poll = mio::Poll::new()?;
    let mut socks = Vec::with_capacity(clients.len());
    for (i, c) in clients.iter().enumerate() {
        let s = c.conn.tcp().try_clone()?;
        s.set_nonblocking(true)?;
        let mut s = mio::net::TcpStream::from_std(s);
        poll.registry().register(&mut s, mio::Token(i), mio::Interest::READABLE)?;
        socks.push(s);
    }
    let mut readings: Vec<TcpReading> = (0..clients.len()).map(|_| TcpReading::default()).collect();
    let mut buf = vec![0u8; 64 << 10];
    // What came during the others' setup is read and dropped (see `load`), but followed:
    // a sequence number missing later is still counted.
    let (mut early, mut early_lost) = (0u64, 0u64);
    for (s, r) in socks.iter_mut().zip(&mut readings) {
        while let Ok(k) = s.read(&mut buf) {
            if k == 0 {
                break;
            }
            r.take(&buf[..k]);
        }
        early += std::mem::take(&mut r.packets);
        early_lost += r.lost();
    }
    println!("rtsp-load: ready");
    std::io::stdout().flush()?;
    let mut bytes = 0u64;
    let mut closed = 0usize;
    let mut events = mio::Events::with_capacity(1024);
    let end = Instant::now() + Duration::from_secs_f64(seconds.min(600.0));
    while Instant::now() < end {
        poll.poll(&mut events, Some(end.saturating_duration_since(Instant::now())))?;
        for e in &events {
            let t = e.token().0;
            loop {
                match socks[t].read(&mut buf) {
                    Ok(0) => {
                        closed += 1;
                        let _ = poll.registry().deregister(&mut socks[t]);
                        break;
                    }
                    Ok(k) => bytes += readings[t].take(&buf[..k]),
                    Err(_) => break,
                }
            }
        }
    }
    let got: Vec<u64> = readings.iter().map(|r| r.packets).collect();
    let total: u64 = got.iter().sum();
    let lost = readings.iter().map(TcpReading::lost).sum::<u64>().saturating_sub(early_lost);
    let (min, max) = (got.iter().min().copied().unwrap_or(0), got.iter().max().copied().unwrap_or(0));
    println!("rtsp-load: packets {total} min {min} max {max} bytes {bytes} early {early} lost {lost} closed {closed}");
    std::io::stdout().flush()?;
    for c in &mut clients {
        if let Some(b) = c.client.teardown(0) {
            let _ = c.conn.write_all(&b);
        }
    }
    Ok(())
}

/// The upstream: MediaMTX with the looped demo clip published into `live`.
struct Upstream {
    rtsp: SocketAddr,
    /// Its RTSPS (SRTP over UDP, keys by MIKEY) where a target needs it; the certificate is
    /// `dir/mtx.crt`.
    rtsps: Option<SocketAddr>,
    server: Proc,
    _publisher: Proc,
    dir: PathBuf,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits (at most 10 s) until a server accepts TCP connections at `addr`.
fn wait_listening(addr: SocketAddr, what: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    while TcpStream::connect(addr).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("{what} did not start listening on {addr}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn mediamtx(bin: &Path, encrypted: bool) -> anyhow::Result<Upstream> {
    let dir = std::env::temp_dir().join(format!("fanout-bench-rtsp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (rtsp, api) = (free_port()?, free_port()?);
    let free_pair = || -> anyhow::Result<u16> {
        let (a, _b) = fanout_io::sys::port_pair(std::net::IpAddr::from([127, 0, 0, 1]))?;
        Ok(a.local_addr()?.port())
    };
    let pair = free_pair()?;
    let mut cfg = format!(
        "logLevel: error\napi: no\napiAddress: 127.0.0.1:{api}\nrtspAddress: 127.0.0.1:{rtsp}\n\
         rtspTransports: [udp, tcp]\nrtpAddress: 127.0.0.1:{pair}\nrtcpAddress: 127.0.0.1:{}\n\
         rtmp: no\nhls: no\nwebrtc: no\nsrt: no\nmetrics: no\npprof: no\nplayback: no\npaths:\n  all_others:\n",
        pair + 1
    );
    // RTSPS beside plain RTSP ("optional"): the plain targets read the same stream.
    let rtsps = match encrypted {
        true => {
            let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])?;
            std::fs::write(dir.join("mtx.crt"), ck.cert.pem())?;
            std::fs::write(dir.join("mtx.key"), ck.signing_key.serialize_pem())?;
            let (port, srtp) = (free_port()?, free_pair()?);
            cfg += &format!(
                "rtspEncryption: optional\nrtspsAddress: 127.0.0.1:{port}\nsrtpAddress: 127.0.0.1:{srtp}\n\
                 srtcpAddress: 127.0.0.1:{}\nrtspServerKey: {}\nrtspServerCert: {}\n",
                srtp + 1,
                dir.join("mtx.key").display(),
                dir.join("mtx.crt").display()
            );
            Some(SocketAddr::from(([127, 0, 0, 1], port)))
        }
        false => None,
    };
    std::fs::write(dir.join("mediamtx.yml"), cfg)?;
    let server = Proc(Command::new(bin).arg(dir.join("mediamtx.yml")).stdout(Stdio::null()).spawn()?);
    let clip = dir.join("clip.mp4");
    std::fs::write(dir.join("demo.ts"), fanout_io::DEMO_TS)?;
    let st = Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-i"])
        .arg(dir.join("demo.ts"))
        .args(["-c", "copy", "-bsf:a", "aac_adtstoasc"])
        .arg(&clip)
        .status()
        .context("running ffmpeg (apt-get install ffmpeg)")?;
    if !st.success() {
        bail!("ffmpeg could not remux the demo clip");
    }
    let rtsp = SocketAddr::from(([127, 0, 0, 1], rtsp));
    wait_listening(rtsp, "MediaMTX")?;
    let publisher = Proc(
        Command::new("ffmpeg")
            .args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i"])
            .arg(&clip)
            .args(["-t", "3600", "-c", "copy", "-f", "rtsp", "-rtsp_transport", "tcp"])
            .arg(format!("rtsp://{rtsp}/live"))
            .stdout(Stdio::null())
            .spawn()?,
    );
    std::thread::sleep(Duration::from_secs(2));
    Ok(Upstream { rtsp, rtsps, server, _publisher: publisher, dir })
}

/// A server under test: the process to meter and the URL its clients open.
struct Target {
    url: String,
    /// RTSPS: the certificate its clients trust.
    cacert: Option<PathBuf>,
    pid: u32,
    _procs: Vec<Proc>,
    _relay: Option<RelayProc>,
}

fn start_target(name: &str, up: &Upstream, peers: &Path) -> anyhow::Result<Target> {
    let upstream = format!("rtsp://{}/live", up.rtsp);
    if name == "mediamtx" {
        return Ok(Target { url: upstream, cacert: None, pid: up.server.0.id(), _procs: Vec::new(), _relay: None });
    }
    if name == "mediamtx-srtp" {
        let rtsps = up.rtsps.context("MediaMTX was started without RTSPS")?;
        let (url, cacert) = (format!("rtsps://{rtsps}/live"), Some(up.dir.join("mtx.crt")));
        return Ok(Target { url, cacert, pid: up.server.0.id(), _procs: Vec::new(), _relay: None });
    }
    if name == "live555" {
        let python = peers.join("live555/bin/python");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/live555-proxy.py");
        let port = free_port()?;
        let p = Proc(
            Command::new(&python)
                .arg(&script)
                .args([&port.to_string(), &upstream, "3600"])
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {} (scripts/install-peers)", python.display()))?,
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_listening(addr, "the live555 proxy")?;
        let pid = p.0.id();
        return Ok(Target { url: format!("rtsp://{addr}/cam"), cacert: None, pid, _procs: vec![p], _relay: None });
    }
    let (kind, path) = name.split_once(':').unwrap_or((name, ""));
    let keys = match kind {
        "fanout" => None,
        "fanout-srtp" => Some("shared"),
        "fanout-srtp-each" => Some("per-client"),
        _ => {
            bail!("target {name:?}: expected fanout:PATH, fanout-srtp:PATH, fanout-srtp-each:PATH, mediamtx, mediamtx-srtp or live555")
        }
    };
    // SRTP: RTSPS with a certificate made here, the API plain.
    let cacert = match keys {
        Some(keys) => {
            let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])?;
            let (cert, key, cfg) = (up.dir.join("cert.pem"), up.dir.join("key.pem"), up.dir.join("tls.toml"));
            std::fs::write(&cert, ck.cert.pem())?;
            std::fs::write(&key, ck.signing_key.serialize_pem())?;
            std::fs::write(
                &cfg,
                format!("[tls]\ncert = {cert:?}\nkey = {key:?}\nhttps = false\nrtsps = \"127.0.0.1:0\"\nsrtp_keys = \"{keys}\"\n"),
            )?;
            Some((cert, cfg))
        }
        None => None,
    };
    let relay = match &cacert {
        Some((_, cfg)) => RelayProc::start(&["--rtsp", "127.0.0.1:0", "--config", cfg.to_str().context("temp path")?])?,
        None => RelayProc::start(&["--rtsp", "127.0.0.1:0"])?,
    };
    let api = relay.client();
    let mut spec = serde_json::json!({ "name": "cam", "source": {
        "rtsp": upstream, "rtsp_transport": "udp", "on_demand": false } });
    for (k, v) in super::datapath_fields(path)? {
        spec[k] = v;
    }
    api.call("POST", "/v1/sessions", Some(spec))?;
    let t = Instant::now();
    while api.call("GET", "/v1/sessions/cam", None)?["upstream"]["state"] != "playing" {
        if t.elapsed() > Duration::from_secs(15) {
            bail!("fanout's upstream did not start playing");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let field = if cacert.is_some() { "rtsps" } else { "rtsp" };
    let rtsp = api.call("GET", "/v1/engine", None)?[field].as_str().context("fanout listens for RTSP")?.to_string();
    Ok(Target {
        url: format!("rtsp://{rtsp}/cam"),
        cacert: cacert.map(|c| c.0),
        pid: relay.pid(),
        _procs: Vec::new(),
        _relay: Some(relay),
    })
}

struct Sample {
    cpu_s: f64,
    seconds: f64,
    packets: u64,
    bytes: u64,
    min: u64,
    max: u64,
    /// Packets that arrived during setup, before the window: left out of `packets`.
    early: u64,
}

fn measure(t: &Target, clients: usize, seconds: f64) -> anyhow::Result<Sample> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["bench", "rtsp-load", "--url", &t.url, "--clients", &clients.to_string()])
        .args(["--seconds", &seconds.to_string()])
        .args(t.cacert.iter().flat_map(|c| [std::ffi::OsStr::new("--cacert"), c.as_os_str()]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("load stdout")?).lines();
    let mut p = Proc(child);
    let ready = lines.next().and_then(Result::ok);
    if ready.as_deref() != Some("rtsp-load: ready") {
        let _ = p.0.kill();
        let mut err = String::new();
        if let Some(mut e) = p.0.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        bail!("the load client did not get its {clients} clients playing: {}", err.trim());
    }
    let (cpu0, irq0, t0) = (process_cpu_s(t.pid)?, softirqd_cpu_s(), Instant::now());
    let result = lines.next().and_then(Result::ok).context("the load client ended without a result")?;
    let (cpu1, irq1, secs) = (process_cpu_s(t.pid)?, softirqd_cpu_s(), t0.elapsed().as_secs_f64());
    super::wait(&mut p, Duration::from_secs(30))?;
    let f: Vec<u64> = result.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    // "packets N min A max B bytes N early N lost N"
    let [packets, min, max, bytes, early, ..] = f[..] else { bail!("odd load result {result:?}") };
    Ok(Sample { cpu_s: (cpu1 - cpu0) + (irq1 - irq0), seconds: secs, packets, bytes, min, max, early })
}

pub fn run(mut a: RtspArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.targets, a.clients, a.seconds, a.rounds) = (vec!["fanout:shared".into()], vec![20], 3.0, 1);
    }
    super::ensure_dir(&a.out)?;
    let bin = a.peers.join("mediamtx");
    if !bin.exists() {
        bail!("{} is missing: run scripts/install-peers", bin.display());
    }
    let _ns = match a.targets.iter().any(|t| t.split_once(':').is_some_and(|(_, path)| path.starts_with("kernel"))) {
        true => Some(super::PrivateNetns::enter(10_000)?),
        false => None,
    };
    let up = mediamtx(&bin, a.targets.iter().any(|t| t == "mediamtx-srtp"))?;
    let csv_path = a.out.join("rtsp.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "target,clients,round,cpu_s,seconds,packets,bytes,cpu_us_per_packet,cpu_ms_per_mb,min_client_packets,max_client_packets,setup_packets_left_out"
    )?;
    let steps = (a.rounds * a.clients.len() * a.targets.len()) as u64;
    let mut pb = super::progress(steps, "bench rtsp");
    // (target, clients, µs per packet, ms per MB)
    let mut results: Vec<(String, usize, f64, f64)> = Vec::new();
    for round in 0..a.rounds {
        for &n in &a.clients {
            for name in &a.targets {
                pb.set_message(format!("{name}, {n} clients, round {}", round + 1));
                let t = start_target(name, &up, &a.peers)?;
                std::thread::sleep(Duration::from_secs(1));
                let s = measure(&t, n, a.seconds).with_context(|| format!("{name} with {n} clients"))?;
                let us = 1e6 * s.cpu_s / s.packets.max(1) as f64;
                let ms_mb = 1e3 * s.cpu_s / (s.bytes.max(1) as f64 / 1e6);
                writeln!(
                    csv,
                    "{name},{n},{round},{:.3},{:.2},{},{},{us:.3},{ms_mb:.3},{},{},{}",
                    s.cpu_s, s.seconds, s.packets, s.bytes, s.min, s.max, s.early
                )?;
                let line = format!(
                    "{name:>14} {n:>5} clients: {us:7.2} µs/packet {ms_mb:6.2} ms/MB ({:.0}% of a core, {} packets of {} B on average, per client {}..{})",
                    100.0 * s.cpu_s / s.seconds,
                    s.packets,
                    s.bytes / s.packets.max(1),
                    s.min,
                    s.max
                );
                pb.println(line);
                results.push((name.clone(), n, us, ms_mb));
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    // Means over rounds, and each target against MediaMTX.
    let mean = |name: &str, n: usize, per_mb: bool| {
        let v: Vec<f64> =
            results.iter().filter(|r| r.0 == name && r.1 == n).map(|r| if per_mb { r.3 } else { r.2 }).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    println!("\nmean server CPU (process + ksoftirqd) per delivered packet and per delivered MB:");
    for &n in &a.clients {
        let (base, base_mb) = (mean("mediamtx", n, false), mean("mediamtx", n, true));
        for name in &a.targets {
            let (m, mb) = (mean(name, n, false), mean(name, n, true));
            let ratio =
                if base > 0.0 { format!("{:.2}× / {:.2}× MediaMTX", m / base, mb / base_mb) } else { String::new() };
            println!("  {n:>5} clients {name:>14}: {m:7.2} µs/packet {mb:7.2} ms/MB  {ratio}");
        }
    }
    let png = a.out.join("rtsp.png");
    let series = |per_mb: bool| {
        a.targets
            .iter()
            .map(|name| (name.clone(), a.clients.iter().map(|&n| (n as f64, mean(name, n, per_mb))).collect()))
            .collect()
    };
    super::plot::panels(
        &png,
        "RTSP clients of one upstream: server CPU per delivered packet and byte",
        "RTSP clients (UDP)",
        false,
        &[
            super::plot::Panel { y_label: "CPU µs per packet", series: series(false), log_y: false },
            super::plot::Panel { y_label: "CPU ms per MB", series: series(true), log_y: false },
        ],
    )?;
    println!("\nCSV: {}\nPNG: {}", csv_path.display(), png.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{SeqFollow, TcpReading};
    use proptest::prelude::*;

    fn rtp(seq: u16) -> Vec<u8> {
        let [a, b] = seq.to_be_bytes();
        vec![0x80, 96, a, b]
    }

    /// `$`-framed RTP packets of channels 0 and 2, sequence numbers from `first`, with the
    /// ones in `skip` left out; an RTCP frame on channel 1 between.
    fn frames(first: u16, n: u16, skip: &[u16]) -> Vec<u8> {
        let mut out = Vec::new();
        for k in 0..n {
            for channel in [0u8, 2] {
                if skip.contains(&k) && channel == 0 {
                    continue;
                }
                let mut pkt = vec![0x80, 96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 7, 7, 7];
                pkt[2..4].copy_from_slice(&first.wrapping_add(k).to_be_bytes());
                out.extend_from_slice(&[b'$', channel, 0, pkt.len() as u8]);
                out.extend_from_slice(&pkt);
            }
            out.extend_from_slice(&[b'$', 1, 0, 2, 0x80, 200]);
        }
        out
    }

    #[test]
    fn counts_packets_and_the_missing_ones_across_a_wrap() {
        let mut r = TcpReading::default();
        let bytes = r.take(&frames(65_530, 20, &[3, 4, 9]));
        assert_eq!((r.packets, r.lost()), (40 - 3, 3));
        assert_eq!(bytes, 37 * 15);
    }

    #[test]
    fn a_late_packet_is_not_lost_and_does_not_restart_the_count() {
        let mut f = SeqFollow::default();
        for seq in [65_534, 65_535, 1, 0, 2, 4, 5, 5, 3000, 3001, 3003] {
            f.see(&rtp(seq));
        }
        // 0 came after 1 (late, fills its gap); 3 never came; 5 twice; 3000 a new start; 3002 lost.
        assert_eq!((f.gaps, f.late, f.lost()), (3, 1, 2));
    }

    proptest! {
        /// Any stream with some packets dropped and neighbours swapped: lost is what was
        /// dropped, whatever the swaps (the first and last packets stay: a loss at an end is
        /// not seen).
        #[test]
        fn swapped_neighbours_are_late_not_lost(
            first in any::<u16>(),
            n in 10usize..300,
            drops in proptest::collection::btree_set(1usize..299, 0..20),
            swaps in proptest::collection::btree_set(1usize..298, 0..20),
        ) {
            let dropped = |i: &usize| drops.contains(i) && *i < n - 1;
            let mut seqs: Vec<u16> = (0..n).filter(|i| !dropped(i)).map(|i| first.wrapping_add(i as u16)).collect();
            for &i in &swaps {
                if i + 2 < seqs.len() {
                    seqs.swap(i, i + 1);
                }
            }
            let mut f = SeqFollow::default();
            for &s in &seqs {
                f.see(&rtp(s));
            }
            prop_assert_eq!(f.lost(), (0..n).filter(dropped).count() as u64);
        }
        /// However the connection's bytes are cut, the count is the same.
        #[test]
        fn any_cut_reads_alike(cuts in proptest::collection::vec(1usize..40, 1..60), first in any::<u16>()) {
            let all = frames(first, 30, &[5]);
            let mut r = TcpReading::default();
            let mut at = 0;
            for c in cuts.iter().cycle() {
                if at >= all.len() {
                    break;
                }
                let end = (at + c).min(all.len());
                r.take(&all[at..end]);
                at = end;
            }
            prop_assert_eq!((r.packets, r.lost()), (59, 1));
            prop_assert!(r.buf.is_empty());
        }
    }
}
