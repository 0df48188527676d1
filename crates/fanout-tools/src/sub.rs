//! `fanout sub`: the media client emulator. Many subscribers in one process (UDP, TCP, HTTP),
//! optionally registering themselves as sinks through the control API; per subscriber it
//! measures received packets, loss and reordering (RTP sequence numbers), one-way latency
//! (the probe's send time, same-host clock), RFC 3550 jitter and interarrival variance.

use super::{mono_ns, rtp_ts, RTP_HZ};
use crate::client::ApiClient;
use anyhow::{bail, Context};
use clap::Args;
use fanout_proto::probe::{self, Probe};
use fanout_proto::rtp::stats::RecvStats;
use fanout_proto::rtp::RtpView;
use hdrhistogram::Histogram;
use mio::net::{TcpListener, TcpStream, UdpSocket};
use mio::{Events, Interest, Poll, Token};
use serde::Serialize;
use serde_json::json;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct SubArgs {
    /// Play this RTMP or SRT URL with --count players instead (rtmp://HOST/APP/NAME,
    /// srt://HOST:PORT?streamid=read:NAME), each its own thread, for --duration seconds.
    #[arg(long)]
    pub read: Option<String>,
    /// With --read: how many players.
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// UDP subscribers per session.
    #[arg(long, default_value_t = 0)]
    pub udp: usize,
    /// TCP subscribers per session (the relay connects to them; needs --api).
    #[arg(long, default_value_t = 0)]
    pub tcp: usize,
    /// HTTP subscribers per session (GET /v1/sessions/{name}/stream; needs --api).
    #[arg(long, default_value_t = 0)]
    pub http: usize,
    /// The HTTP subscribers play HTTP-FLV (GET /{name}.flv) instead: bytes are counted, no
    /// packets.
    #[arg(long)]
    pub flv: bool,
    /// The relay's API; with --session, subscribers register themselves as sinks and
    /// remove themselves at the end.
    #[arg(long)]
    pub api: Option<String>,
    /// Bearer token for the API.
    #[arg(long, env = "FANOUT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Session(s) to subscribe to (repeat for several; the counts are per session).
    #[arg(long)]
    pub session: Vec<String>,
    /// Without --api: bind the UDP subscribers to consecutive ports from this address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// Size of one packet as `gen` sent it (RTP header included): TCP and HTTP subscribers
    /// get a byte stream and cut it into packets of this size (HTTP: minus the RTP header).
    #[arg(long, default_value_t = 1400)]
    pub record: usize,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Stop once packets have flowed and then none arrived for this many seconds.
    #[arg(long)]
    pub idle_exit: Option<f64>,
    /// Write the full report (every subscriber) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Receiving threads (0: one per 4,000 subscribers, at most one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Subscribers one receiving thread takes by default.
const PER_THREAD: usize = 4_000;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Udp,
    Tcp,
    Http,
}

enum Io {
    Udp(UdpSocket),
    Listen(TcpListener),
    Stream(TcpStream, Vec<u8>),
}

struct Subscriber {
    group: usize,
    kind: Kind,
    addr: String,
    sink_id: Option<u64>,
    io: Io,
    stats: RecvStats,
    /// Datagrams without a probe, or stream bytes out of step with the probes.
    garbled: u64,
    /// Every byte that arrived, probe or not.
    bytes: u64,
    lat_sum_us: f64,
    lat_max_us: u64,
}

#[derive(Debug, Serialize)]
pub struct SubscriberReport {
    pub session: String,
    pub kind: Kind,
    pub addr: String,
    pub received: u64,
    pub expected: u64,
    pub lost: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub garbled: u64,
    pub bytes: u64,
    pub latency_mean_us: f64,
    pub latency_max_us: u64,
    pub jitter_ms: f64,
    pub interarrival_var_ms2: f64,
}

#[derive(Debug, Serialize)]
pub struct GroupReport {
    pub session: String,
    pub kind: Kind,
    pub subscribers: usize,
    pub received: u64,
    pub expected: u64,
    pub lost: u64,
    pub loss_pct: f64,
    pub reordered: u64,
    pub duplicates: u64,
    /// Packets (UDP) or resyncs (TCP/HTTP) that carried no probe: a stream not made by
    /// `fanout gen` arrives here, not in `received`.
    pub garbled: u64,
    pub bytes: u64,
    /// Subscribers that received nothing at all.
    pub silent: usize,
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub latency_max_us: u64,
    pub jitter_ms_mean: f64,
    pub jitter_ms_max: f64,
    pub interarrival_var_ms2_mean: f64,
}

#[derive(Debug, Serialize)]
pub struct SubReport {
    pub seconds: f64,
    pub groups: Vec<GroupReport>,
    pub subscribers: Vec<SubscriberReport>,
    /// Each receiving thread's CPU time over the run, percent of its wall time.
    pub thread_busy_pct: Vec<f64>,
    /// Datagrams the kernel dropped at full UDP receive buffers in this network namespace
    /// during the run (`/proc/net/snmp`, `RcvbufErrors`): subscribers that did not read in
    /// time. Packets lost there are the subscribers' loss, not the relay's.
    pub rcvbuf_errors: u64,
}

impl SubReport {
    /// Why this run's loss may be the load tool's own, if it may.
    pub fn self_limited(&self) -> Option<String> {
        let busiest = self.thread_busy_pct.iter().copied().fold(0.0, f64::max);
        if self.rcvbuf_errors > 0 {
            Some(format!(
                "{} datagrams overflowed the subscribers' receive buffers (busiest receiving thread {busiest:.0}% of a core): the load tool, not the relay, dropped them; use more --threads or more sub processes",
                self.rcvbuf_errors
            ))
        } else if busiest > 90.0 {
            Some(format!("a receiving thread was busy {busiest:.0}% of the time: the load tool is near its limit"))
        } else {
            None
        }
    }
}

pub fn run(a: SubArgs) -> anyhow::Result<()> {
    if let Some(url) = &a.read {
        return crate::read::run(url, a.count, a.duration);
    }
    let report = subscribe(&a, || println!("sub: ready"))?;
    print_summary(&report);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Sets the subscribers up, calls `ready`, receives until the end, cleans up, reports.
pub fn subscribe(a: &SubArgs, ready: impl FnOnce()) -> anyhow::Result<SubReport> {
    let total = a.udp + a.tcp + a.http;
    if total == 0 {
        bail!("no subscribers: give --udp, --tcp and/or --http");
    }
    let api = a.api.as_ref().map(|b| ApiClient::new(b, a.token.clone()));
    if (a.tcp > 0 || a.http > 0 || !a.session.is_empty()) && api.is_none() {
        bail!("--tcp, --http and --session need --api (the relay to register with)");
    }
    if api.is_some() && a.session.is_empty() {
        bail!("--api needs at least one --session to subscribe to");
    }
    if a.record < 12 + probe::LEN {
        bail!("--record {} is smaller than an RTP header and a probe (36 bytes)", a.record);
    }
    let groups: Vec<String> = if a.session.is_empty() { vec!["-".into()] } else { a.session.clone() };
    let need = (total * groups.len()) as u64 + 64;
    let have = fanout_io::sys::raise_nofile_limit(need);
    if have < need {
        bail!("{total} subscribers per session need {need} open files; the limit here is {have} (raise it with ulimit -n)");
    }
    let mut subs: Vec<Subscriber> = Vec::with_capacity(total * groups.len());
    let new = |group, kind, addr: String, io| Subscriber {
        group,
        kind,
        addr,
        sink_id: None,
        io,
        stats: RecvStats::default(),
        garbled: 0,
        bytes: 0,
        lat_sum_us: 0.0,
        lat_max_us: 0,
    };
    let result = (|| -> anyhow::Result<()> {
        for (g, session) in groups.iter().enumerate() {
            for i in 0..a.udp {
                let bind = if a.bind.port() == 0 || api.is_some() {
                    SocketAddr::new(a.bind.ip(), 0)
                } else {
                    let p = a.bind.port().checked_add((g * a.udp + i) as u16).context("ports run past 65535")?;
                    SocketAddr::new(a.bind.ip(), p)
                };
                let s = UdpSocket::bind(bind).with_context(|| format!("cannot bind a UDP subscriber to {bind}"))?;
                let addr = s.local_addr()?;
                // Room for bursts while this process is busy with the others.
                let _ = socket2::SockRef::from(&s).set_recv_buffer_size(1 << 20);
                let mut sub = new(g, Kind::Udp, addr.to_string(), Io::Udp(s));
                if let Some(api) = &api {
                    let v = api.call("POST", &format!("/v1/sessions/{session}/sinks"), Some(json!({ "udp": addr })))?;
                    sub.sink_id = v["id"].as_u64();
                }
                subs.push(sub);
            }
            for _ in 0..a.tcp {
                let l = TcpListener::bind(SocketAddr::new(a.bind.ip(), 0))?;
                let addr = l.local_addr()?;
                let mut sub = new(g, Kind::Tcp, addr.to_string(), Io::Listen(l));
                // Invariant: --tcp requires --api (checked above).
                let api = api.as_ref().expect("api");
                let v = api.call("POST", &format!("/v1/sessions/{session}/sinks"), Some(json!({ "tcp": addr })))?;
                sub.sink_id = v["id"].as_u64();
                subs.push(sub);
            }
            for _ in 0..a.http {
                let api = api.as_ref().expect("api");
                let host = api.base.trim_start_matches("http://");
                let target: SocketAddr = host.parse().with_context(|| format!("--api {host}: need http://IP:PORT"))?;
                let mut s = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(3))?;
                let auth = a.token.as_ref().map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
                let target = if a.flv { format!("/{session}.flv") } else { format!("/v1/sessions/{session}/stream") };
                write!(s, "GET {target} HTTP/1.1\r\nHost: {host}\r\n{auth}\r\n")?;
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    s.read_exact(&mut b).context("reading the HTTP response head")?;
                    head.push(b[0]);
                }
                let head = String::from_utf8_lossy(&head);
                if !head.starts_with("HTTP/1.1 200") {
                    bail!("HTTP subscriber to {session}: {}", head.lines().next().unwrap_or(""));
                }
                s.set_nonblocking(true)?;
                let addr = s.local_addr()?.to_string();
                subs.push(new(g, Kind::Http, addr, Io::Stream(TcpStream::from_std(s), Vec::new())));
            }
        }
        Ok(())
    })();
    let cleanup = |subs: &[Subscriber]| {
        if let Some(api) = &api {
            for s in subs {
                if let Some(id) = s.sink_id {
                    let _ = api.call("DELETE", &format!("/v1/sessions/{}/sinks/{id}", groups[s.group]), None);
                }
            }
        }
    };
    if let Err(e) = result {
        cleanup(&subs);
        return Err(e);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if a.threads > 0 { a.threads } else { subs.len().div_ceil(PER_THREAD).clamp(1, cores) };
    let chunk = subs.len().div_ceil(threads);
    let polls = subs.chunks_mut(chunk).map(register).collect::<std::io::Result<Vec<Poll>>>()?;
    let rcvbuf0 = udp_rcvbuf_errors();
    ready();

    let start = mono_ns();
    let end = start + (a.duration * 1e9) as u64;
    let n_groups = groups.len();
    let results: Vec<anyhow::Result<(Vec<Histogram<u64>>, f64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = subs
            .chunks_mut(chunk)
            .zip(polls)
            .map(|(mine, poll)| scope.spawn(move || receive(mine, poll, n_groups, a, end)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a receiving thread panicked"))))
            .collect()
    });
    let seconds = (mono_ns() - start) as f64 / 1e9;
    let rcvbuf_errors = udp_rcvbuf_errors().saturating_sub(rcvbuf0);
    cleanup(&subs);
    let mut hist = new_histograms(groups.len());
    let mut busy = Vec::new();
    for r in results {
        let (h, cpu) = r?;
        for (into, from) in hist.iter_mut().zip(&h) {
            into.add(from).context("merging latency histograms")?;
        }
        busy.push(100.0 * cpu / seconds);
    }
    let mut r = report(&groups, &subs, &hist, seconds);
    (r.thread_busy_pct, r.rcvbuf_errors) = (busy, rcvbuf_errors);
    Ok(r)
}

fn new_histograms(groups: usize) -> Vec<Histogram<u64>> {
    (0..groups * 3).map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")).collect()
}

/// A poll over these subscribers' sockets (tokens: their index here).
fn register(subs: &mut [Subscriber]) -> std::io::Result<Poll> {
    let poll = Poll::new()?;
    for (i, s) in subs.iter_mut().enumerate() {
        let t = Token(i);
        match &mut s.io {
            Io::Udp(u) => poll.registry().register(u, t, Interest::READABLE)?,
            Io::Listen(l) => poll.registry().register(l, t, Interest::READABLE)?,
            Io::Stream(st, _) => poll.registry().register(st, t, Interest::READABLE)?,
        }
    }
    Ok(poll)
}

/// One receiving thread: takes what its subscribers get until `end` (or the idle exit);
/// returns its latency histograms and the CPU seconds it used.
fn receive(
    subs: &mut [Subscriber],
    mut poll: Poll,
    groups: usize,
    a: &SubArgs,
    end: u64,
) -> anyhow::Result<(Vec<Histogram<u64>>, f64)> {
    let cpu0 = super::thread_cpu_s();
    let mut hist = new_histograms(groups);
    let mut last_packet = 0u64;
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; 65536];
    loop {
        let now = mono_ns();
        if now >= end {
            break;
        }
        if let (Some(idle), true) = (a.idle_exit, last_packet > 0) {
            if now.saturating_sub(last_packet) as f64 > idle * 1e9 {
                break;
            }
        }
        poll.poll(&mut events, Some(Duration::from_millis(50).min(Duration::from_nanos(end - now))))?;
        for ev in events.iter() {
            let i = ev.token().0;
            let s = &mut subs[i];
            let h = &mut hist[hist_index(s.group, s.kind)];
            let got = drain(s, &mut buf, a.record, h, poll.registry(), Token(i))?;
            if got > 0 {
                last_packet = mono_ns();
            }
        }
    }
    Ok((hist, super::thread_cpu_s() - cpu0))
}

/// `RcvbufErrors` of `/proc/net/snmp` (this network namespace's UDP).
pub(crate) fn udp_rcvbuf_errors() -> u64 {
    let Ok(snmp) = std::fs::read_to_string("/proc/net/snmp") else { return 0 };
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Reads everything waiting on one subscriber's socket; returns packets taken.
fn drain(
    s: &mut Subscriber,
    buf: &mut [u8],
    record: usize,
    hist: &mut Histogram<u64>,
    reg: &mio::Registry,
    token: Token,
) -> anyhow::Result<u64> {
    let mut n = 0;
    loop {
        match &mut s.io {
            Io::Udp(u) => match u.recv(buf) {
                Ok(len) => {
                    n += 1;
                    s.bytes += len as u64;
                    let now = mono_ns();
                    match RtpView::parse(&buf[..len]).ok().and_then(|v| Probe::parse(v.payload()).map(|p| (v, p))) {
                        Some((v, p)) => account(s, v.sequence_number(), p, now, hist),
                        None => s.garbled += 1,
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // An ICMP error from an earlier send of ours (none here) or similar: ignore.
                Err(_) => return Ok(n),
            },
            Io::Listen(l) => match l.accept() {
                Ok((mut st, _)) => {
                    reg.deregister(l)?;
                    reg.register(&mut st, token, Interest::READABLE)?;
                    s.io = Io::Stream(st, Vec::new());
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(n),
                Err(e) => return Err(e.into()),
            },
            Io::Stream(st, pending) => match st.read(buf) {
                Ok(0) => return Ok(n),
                Ok(len) => {
                    s.bytes += len as u64;
                    pending.extend_from_slice(&buf[..len]);
                    let now = mono_ns();
                    // HTTP subscribers get the payload without the RTP header.
                    let (rec, off) = if s.kind == Kind::Http { (record - 12, 0) } else { (record, 12) };
                    let mut at = 0;
                    let mut parsed = Vec::new();
                    while pending.len() - at >= rec {
                        match Probe::parse(&pending[at + off..at + rec]) {
                            Some(p) => {
                                parsed.push(p);
                                at += rec;
                            }
                            None => {
                                // Out of step: find the next probe and count what was skipped.
                                s.garbled += 1;
                                let skip = pending[at + 1..].windows(4).position(|w| w == probe::MAGIC);
                                at = match skip {
                                    Some(k) => (at + 1 + k).saturating_sub(off),
                                    None => pending.len(),
                                };
                            }
                        }
                    }
                    pending.drain(..at.min(pending.len()));
                    for p in parsed {
                        n += 1;
                        account(s, p.seq as u16, p, now, hist);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Ok(n),
            },
        }
    }
}

fn account(s: &mut Subscriber, seq: u16, p: Probe, now: u64, hist: &mut Histogram<u64>) {
    s.stats.record(seq, rtp_ts(p.sent_ns), rtp_ts(now), now);
    let lat = now.saturating_sub(p.sent_ns) / 1000;
    s.lat_sum_us += lat as f64;
    s.lat_max_us = s.lat_max_us.max(lat);
    let _ = hist.record(lat.clamp(1, 60_000_000));
}

fn report(groups: &[String], subs: &[Subscriber], hist: &[Histogram<u64>], seconds: f64) -> SubReport {
    let per: Vec<SubscriberReport> = subs
        .iter()
        .map(|s| SubscriberReport {
            session: groups[s.group].clone(),
            kind: s.kind,
            addr: s.addr.clone(),
            received: s.stats.received,
            expected: s.stats.expected(),
            lost: s.stats.lost(),
            reordered: s.stats.reordered,
            duplicates: s.stats.duplicates,
            garbled: s.garbled,
            bytes: s.bytes,
            latency_mean_us: if s.stats.received > 0 { s.lat_sum_us / s.stats.received as f64 } else { 0.0 },
            latency_max_us: s.lat_max_us,
            jitter_ms: s.stats.jitter() * 1000.0 / RTP_HZ as f64,
            interarrival_var_ms2: s.stats.interarrival_variance() / 1e12,
        })
        .collect();
    // One row per session and kind of subscriber: UDP, TCP and HTTP differ too much to mix.
    let mut rows = Vec::new();
    for (g, name) in groups.iter().enumerate() {
        for kind in [Kind::Udp, Kind::Tcp, Kind::Http] {
            let mine: Vec<&SubscriberReport> =
                per.iter().zip(subs).filter(|(_, s)| s.group == g && s.kind == kind).map(|(r, _)| r).collect();
            if mine.is_empty() {
                continue;
            }
            let n = mine.len() as f64;
            // A subscriber that got nothing expected as much as the best one did.
            let best = mine.iter().map(|r| r.expected).max().unwrap_or(0);
            let expected: u64 = mine.iter().map(|r| if r.received == 0 { best } else { r.expected }).sum();
            let received: u64 = mine.iter().map(|r| r.received).sum();
            let lost = expected.saturating_sub(received);
            let h = &hist[hist_index(g, kind)];
            rows.push(GroupReport {
                session: name.clone(),
                kind,
                subscribers: mine.len(),
                received,
                expected,
                lost,
                loss_pct: if expected > 0 { 100.0 * lost as f64 / expected as f64 } else { 0.0 },
                reordered: mine.iter().map(|r| r.reordered).sum(),
                duplicates: mine.iter().map(|r| r.duplicates).sum(),
                garbled: mine.iter().map(|r| r.garbled).sum(),
                bytes: mine.iter().map(|r| r.bytes).sum(),
                silent: mine.iter().filter(|r| r.bytes == 0).count(),
                latency_p50_us: h.value_at_quantile(0.5),
                latency_p99_us: h.value_at_quantile(0.99),
                latency_max_us: h.max(),
                jitter_ms_mean: mine.iter().map(|r| r.jitter_ms).sum::<f64>() / n,
                jitter_ms_max: mine.iter().map(|r| r.jitter_ms).fold(0.0, f64::max),
                interarrival_var_ms2_mean: mine.iter().map(|r| r.interarrival_var_ms2).sum::<f64>() / n,
            });
        }
    }
    let groups = rows;
    SubReport { seconds, groups, subscribers: per, thread_busy_pct: Vec::new(), rcvbuf_errors: 0 }
}

/// Where a (session, kind) pair's latency histogram is.
fn hist_index(group: usize, kind: Kind) -> usize {
    group * 3 + kind as usize
}

fn print_summary(r: &SubReport) {
    println!(
        "{:<12} {:<4} {:>6} {:>10} {:>10} {:>8} {:>7} {:>8} {:>6} {:>9} {:>9} {:>9} {:>10}",
        "SESSION",
        "KIND",
        "SUBS",
        "RECEIVED",
        "EXPECTED",
        "LOSS%",
        "REORD",
        "GARBLED",
        "SILENT",
        "LAT p50",
        "LAT p99",
        "JITTER",
        "IA VAR"
    );
    for g in &r.groups {
        let kind = match g.kind {
            Kind::Udp => "udp",
            Kind::Tcp => "tcp",
            Kind::Http => "http",
        };
        println!(
            "{:<12} {:<4} {:>6} {:>10} {:>10} {:>8.3} {:>7} {:>8} {:>6} {:>7}µs {:>7}µs {:>7.3}ms {:>8.3}ms²",
            g.session,
            kind,
            g.subscribers,
            g.received,
            g.expected,
            g.loss_pct,
            g.reordered,
            g.garbled,
            g.silent,
            g.latency_p50_us,
            g.latency_p99_us,
            g.jitter_ms_mean,
            g.interarrival_var_ms2_mean
        );
    }
    let busy: Vec<String> = r.thread_busy_pct.iter().map(|b| format!("{b:.0}%")).collect();
    println!("receiving threads busy: {}; receive buffer overflows: {}", busy.join(" "), r.rcvbuf_errors);
    if let Some(why) = r.self_limited() {
        println!("*** sub: {why} ***");
    }
}
