//! `fanout bench kernel-pacers`: fanout's virtual clock against the kernel's own pacers on
//! the same traffic (issue 35): `SO_MAX_PACING_RATE` (a rate per socket) and `SO_TXTIME` (a
//! departure time per datagram), both carried out by the `fq` qdisc on the sender's egress.
//!
//! The traffic is a relay's when subscribers join: `--sinks` subscribers behind one shared
//! link of `--factor` × their streams' rate, each owed `--backlog-s` of its stream at once
//! (the ring from the last keyframe), then the live stream. One sender thread in the relay's
//! namespace of a [`Topology`] sends every sink's datagrams from one UDP socket, as the
//! relay's user-space paths do, in one of four ways:
//! - `none`: as they come;
//! - `clock`: held to one virtual clock at `--catchup` × the sinks' rates (what the relay
//!   does with `pace_link = "shared"`), the thread sleeping until each may leave;
//! - `max-pacing-rate`: the socket's `SO_MAX_PACING_RATE` at that rate, sent as they come
//!   (fq queues an unconnected socket's datagrams by destination and holds each destination
//!   to the socket's rate, so this is the group's rate per sink);
//! - `max-pacing-rate-sink`: the same at one sink's share of that rate;
//! - `txtime`: each datagram stamped (`SCM_TXTIME`, CLOCK_MONOTONIC) with the virtual
//!   clock's departure time for it, sent as it comes.
//!
//! `fq` is on the sender's egress in every round. Counted: each sink's datagrams at the far
//! end, drops at fq and at the link, when the last of the backlog arrived, and the sender's
//! sends, wake-ups (context switches) and CPU. Writes `kernel-pacers.csv` and
//! `kernel-pacers.png` (what arrived, per 100 ms, in each round). Needs root and `sch_fq`.

use super::layers::{qdisc_counter, Topology};
// CLOCK_MONOTONIC, what fq compares SO_TXTIME stamps with.
use crate::mono_ns;
use anyhow::{bail, Context};
use clap::Args;
use fanout_core::{Pace, VirtualClock};
use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct KernelPacersArgs {
    /// Subscribers behind the shared link.
    #[arg(long, default_value_t = 12)]
    sinks: usize,
    /// Each subscriber's stream, kbit/s of UDP payload.
    #[arg(long, default_value_t = 340)]
    kbps: u64,
    /// The shared link's rate as a multiple of all the streams' (with their headers).
    #[arg(long, default_value_t = 1.2)]
    factor: f64,
    /// The link's queue, in milliseconds at its rate.
    #[arg(long, default_value_t = 20)]
    queue_ms: u32,
    /// Seconds of its stream each subscriber is owed at once when it joins.
    #[arg(long, default_value_t = 1.0)]
    backlog_s: f64,
    /// The paced rate as a multiple of the streams': below --factor.
    #[arg(long, default_value_t = 1.1)]
    catchup: f64,
    /// Seconds of live stream after the join.
    #[arg(long, default_value_t = 15.0)]
    seconds: f64,
    /// The ways of sending, one round each.
    #[arg(long, value_delimiter = ',', default_value = "none,clock,max-pacing-rate,max-pacing-rate-sink,txtime")]
    modes: Vec<String>,
    /// A short run that checks the bench works (6 subscribers, half a second owed, 8 s).
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// UDP payload of every datagram; with UDP, IP and Ethernet headers on the link.
const PAYLOAD: usize = 1200;
const WIRE: usize = PAYLOAD + 8 + 20 + 14;
/// Bytes the clock lets leave back to back (its burst), as the relay's group clock would.
const BURST: u64 = 4 * WIRE as u64;
/// Arrival bins for the plot.
const BIN_MS: u64 = 100;
const FIRST_PORT: u16 = 41000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    None,
    Clock,
    MaxPacingRate,
    MaxPacingRateSink,
    Txtime,
}

impl Mode {
    fn parse(s: &str) -> anyhow::Result<Mode> {
        Ok(match s {
            "none" => Mode::None,
            "clock" => Mode::Clock,
            "max-pacing-rate" => Mode::MaxPacingRate,
            "max-pacing-rate-sink" => Mode::MaxPacingRateSink,
            "txtime" => Mode::Txtime,
            _ => bail!("unknown mode {s:?}: none, clock, max-pacing-rate, max-pacing-rate-sink or txtime"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Clock => "clock",
            Mode::MaxPacingRate => "max-pacing-rate",
            Mode::MaxPacingRateSink => "max-pacing-rate-sink",
            Mode::Txtime => "txtime",
        }
    }
}

/// One round's figures.
struct Round {
    mode: Mode,
    sent: u64,
    received: u64,
    fq_drops: u64,
    link_drops: u64,
    /// When the last datagram of the backlog arrived, after the join (`None`: some never did).
    backlog_ms: Option<f64>,
    wakeups: u64,
    sender_cpu_ms: f64,
    /// Bytes that arrived in each 100 ms after the join.
    bins: Vec<u64>,
}

pub fn run(mut a: KernelPacersArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.sinks, a.backlog_s, a.seconds) = (6, 0.5, 8.0);
    }
    if a.catchup >= a.factor {
        bail!("--catchup {} must be below --factor {}: the link could not carry the catching up", a.catchup, a.factor);
    }
    let modes = a.modes.iter().map(|m| Mode::parse(m)).collect::<anyhow::Result<Vec<_>>>()?;
    super::ensure_dir(&a.out)?;
    let streams_wire_kbps = a.sinks as f64 * a.kbps as f64 * WIRE as f64 / PAYLOAD as f64;
    let link = (a.factor * streams_wire_kbps).ceil() as u32;
    let topo = Topology::new(&[link], a.queue_ms)?;
    if !topo.egress_fq(true) {
        bail!("no fq qdisc on this kernel (modprobe sch_fq): the kernel's pacers need it");
    }
    println!(
        "{} subscribers of {} kbit/s behind one link of {link} kbit/s ({}×), {} ms of queue; each owed {} s at once, \
         paced at {}×",
        a.sinks, a.kbps, a.factor, a.queue_ms, a.backlog_s, a.catchup
    );
    let mut pb = super::progress(modes.len() as u64, "bench kernel-pacers");
    let mut rounds = Vec::new();
    for &mode in &modes {
        pb.set_message(mode.name().to_string());
        // A fresh fq each round: its counters start at zero.
        topo.egress_fq(false);
        topo.egress_fq(true);
        let link_before = topo.link_drops(0);
        let mut r = round(&topo, &a, mode)?;
        r.fq_drops = qdisc_counter(&topo.relay_qdisc(), "dropped");
        r.link_drops = topo.link_drops(0).saturating_sub(link_before);
        pb.println(format!(
            "{}: {} of {} datagrams arrived ({:.3}% lost; fq dropped {}, the link {}), backlog in by {}, \
             sender: {} wake-ups, {:.0} ms of CPU",
            mode.name(),
            r.received,
            r.sent,
            loss_pct(&r),
            r.fq_drops,
            r.link_drops,
            r.backlog_ms.map_or("never".into(), |ms| format!("{ms:.0} ms")),
            r.wakeups,
            r.sender_cpu_ms
        ));
        rounds.push(r);
        pb.inc(1);
        // What is still queued drains before the next round.
        std::thread::sleep(Duration::from_secs(1));
    }
    pb.finish_and_clear();
    let csv_path = a.out.join("kernel-pacers.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "mode,sinks,stream_kbps,link_kbps,sent,received,loss_pct,fq_drops,link_drops,backlog_ms,sender_wakeups,sender_cpu_ms"
    )?;
    for r in &rounds {
        writeln!(
            csv,
            "{},{},{},{link},{},{},{:.3},{},{},{},{},{:.1}",
            r.mode.name(),
            a.sinks,
            a.kbps,
            r.sent,
            r.received,
            loss_pct(r),
            r.fq_drops,
            r.link_drops,
            r.backlog_ms.map_or(String::new(), |ms| format!("{ms:.0}")),
            r.wakeups,
            r.sender_cpu_ms
        )?;
    }
    let png = a.out.join("kernel-pacers.png");
    let series = rounds
        .iter()
        .map(|r| {
            let pts = r
                .bins
                .iter()
                .enumerate()
                .map(|(i, b)| ((i as u64 * BIN_MS) as f64 / 1000.0, *b as f64 * 8.0 / BIN_MS as f64));
            (r.mode.name().to_string(), pts.collect())
        })
        .collect();
    super::plot::panels(
        &png,
        &format!("{} subscribers joining behind one {link} kbit/s link: what arrived", a.sinks),
        "seconds after the join",
        false,
        &[super::plot::Panel { y_label: "kbit/s arriving", series, log_y: false }],
    )?;
    println!("\nCSV: {}\nPNG: {}", csv_path.display(), png.display());
    Ok(())
}

fn loss_pct(r: &Round) -> f64 {
    if r.sent == 0 {
        0.0
    } else {
        100.0 * r.sent.saturating_sub(r.received) as f64 / r.sent as f64
    }
}

/// One round: receivers in the subscribers' namespace, the sender in the relay's.
fn round(topo: &Topology, a: &KernelPacersArgs, mode: Mode) -> anyhow::Result<Round> {
    let interval_ns = (PAYLOAD as u64 * 8 * 1_000_000_000) / (a.kbps * 1000);
    let backlog = ((a.backlog_s * 1e9) as u64 / interval_ns).max(1) as u32;
    let live = ((a.seconds * 1e9) as u64 / interval_ns) as u32;
    let joined = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let bins = ((a.seconds + 2.0) * 1000.0 / BIN_MS as f64).ceil() as usize;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    type Received = (u64, Option<u64>, Vec<u64>);
    let (receivers, (sent_total, wakeups, cpu_ms)) = std::thread::scope(|s| -> anyhow::Result<(Vec<Received>, _)> {
        let mut handles = Vec::new();
        for i in 0..a.sinks {
            let (joined, stop, ready) = (joined.clone(), stop.clone(), ready_tx.clone());
            handles.push(s.spawn(move || -> anyhow::Result<Received> {
                topo.enter_sub(0)?;
                let sock = UdpSocket::bind(("10.99.0.2", FIRST_PORT + i as u16))?;
                sock.set_read_timeout(Some(Duration::from_millis(200)))?;
                socket2::SockRef::from(&sock).set_recv_buffer_size(4 << 20)?;
                let _ = ready.send(());
                let (mut got, mut backlog_in, mut hist) = (0u64, None, vec![0u64; bins]);
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(n) = sock.recv(&mut buf) else { continue };
                    let now = mono_ns();
                    got += 1;
                    let since = now.saturating_sub(joined.load(Ordering::Relaxed));
                    let seq = u32::from_be_bytes(buf[4..8].try_into().expect("4 bytes"));
                    if seq + 1 == backlog {
                        backlog_in = Some(since);
                    }
                    if let Some(b) = hist.get_mut((since / 1_000_000 / BIN_MS) as usize) {
                        *b += n as u64;
                    }
                }
                Ok((got, backlog_in, hist))
            }));
        }
        for _ in 0..a.sinks {
            ready_rx.recv_timeout(Duration::from_secs(10)).context("a receiver did not start")?;
        }
        let sender = s.spawn(|| send(topo, a, mode, backlog, live, interval_ns, &joined));
        let sent = sender.join().expect("the sender thread");
        // The last datagrams through the link's queue, then the receivers stop.
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        let out =
            handles.into_iter().map(|h| h.join().expect("a receiver thread")).collect::<anyhow::Result<Vec<_>>>()?;
        Ok((out, sent?))
    })?;
    let mut hist = vec![0u64; bins];
    for (_, _, h) in &receivers {
        hist.iter_mut().zip(h).for_each(|(a, b)| *a += b);
    }
    let backlog_ms = receivers
        .iter()
        .map(|r| r.1)
        .collect::<Option<Vec<u64>>>()
        .map(|v| v.into_iter().max().unwrap_or(0) as f64 / 1e6);
    Ok(Round {
        mode,
        sent: sent_total,
        received: receivers.iter().map(|r| r.0).sum(),
        fq_drops: 0,
        link_drops: 0,
        backlog_ms,
        wakeups,
        sender_cpu_ms: cpu_ms,
        bins: hist,
    })
}

/// The sender: every sink's backlog at the join, then a datagram per sink every
/// `interval_ns`, sent the round's way. Returns (sent, wake-ups, CPU ms).
fn send(
    topo: &Topology,
    a: &KernelPacersArgs,
    mode: Mode,
    backlog: u32,
    live: u32,
    interval_ns: u64,
    joined: &AtomicU64,
) -> anyhow::Result<(u64, u64, f64)> {
    topo.enter_relay()?;
    let sock = UdpSocket::bind("10.98.0.1:0")?;
    let rate_wire = (a.catchup * a.sinks as f64 * a.kbps as f64 * 1000.0 / 8.0 * WIRE as f64 / PAYLOAD as f64) as u64;
    let pace = Pace::new(rate_wire, BURST, WIRE as u64).context("the pace")?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    match mode {
        Mode::MaxPacingRate => setsockopt(fd, libc::SO_MAX_PACING_RATE, &(rate_wire as u32))?,
        Mode::MaxPacingRateSink => setsockopt(fd, libc::SO_MAX_PACING_RATE, &((rate_wire / a.sinks as u64) as u32))?,
        Mode::Txtime => {
            let cfg = libc::sock_txtime { clockid: libc::CLOCK_MONOTONIC, flags: 0 };
            setsockopt(fd, libc::SO_TXTIME, &cfg)?;
        }
        _ => {}
    }
    let dests: Vec<SocketAddr> =
        (0..a.sinks).map(|i| SocketAddr::from(([10, 99, 0, 2], FIRST_PORT + i as u16))).collect();
    let (w0, cpu0) = (wakeups(), crate::thread_cpu_s());
    let t0 = mono_ns();
    joined.store(t0, Ordering::Relaxed);
    // What is due, in order: (sink, sequence number).
    let mut due: VecDeque<(usize, u32)> = (0..backlog).flat_map(|seq| (0..a.sinks).map(move |s| (s, seq))).collect();
    let mut clock = VirtualClock::default();
    let (mut next_live, mut sent) = (0u32, 0u64);
    let mut buf = [0u8; PAYLOAD];
    loop {
        let now = mono_ns();
        while next_live < live && t0 + next_live as u64 * interval_ns <= now {
            due.extend((0..a.sinks).map(|s| (s, backlog + next_live)));
            next_live += 1;
        }
        // How many may go now: all, but under the clock; and when the next held back may.
        let (n, held_until) = match mode {
            Mode::Clock => {
                let allowed = clock.admit(&pace, now, due.iter().map(|_| WIRE));
                (allowed.count, allowed.next_at)
            }
            _ => (due.len(), None),
        };
        for (sink, seq) in due.drain(..n) {
            buf[..4].copy_from_slice(&(sink as u32).to_be_bytes());
            buf[4..8].copy_from_slice(&seq.to_be_bytes());
            let txtime = (mode == Mode::Txtime).then(|| {
                // Its departure: the clock's finish less the burst, never in the past.
                let at = now + clock.ahead(now).saturating_sub(BURST * 1_000_000_000 / pace.rate());
                clock.charge(&pace, now, WIRE);
                at
            });
            send_one(fd, &buf, dests[sink], txtime)?;
            sent += 1;
        }
        if next_live >= live && due.is_empty() {
            break;
        }
        // Sleep until the next live datagram, or (clock) until the next held back may leave.
        let mut wake = t0 + next_live as u64 * interval_ns;
        if let Some(at) = held_until {
            wake = wake.min(at);
        }
        let now = mono_ns();
        if wake > now {
            std::thread::sleep(Duration::from_nanos(wake - now));
        }
    }
    Ok((sent, wakeups().saturating_sub(w0), (crate::thread_cpu_s() - cpu0) * 1000.0))
}

fn setsockopt<T>(fd: i32, opt: i32, v: &T) -> anyhow::Result<()> {
    // SAFETY: v points to a T of the given size for the call's duration.
    let r = unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, opt, (v as *const T).cast(), std::mem::size_of::<T>() as libc::socklen_t)
    };
    if r != 0 {
        bail!("setsockopt {opt}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// One datagram to `to`, with its departure time (`SCM_TXTIME`) where given. Blocking: a
/// socket whose datagrams wait in fq past its send buffer waits here.
fn send_one(fd: i32, payload: &[u8], to: SocketAddr, txtime: Option<u64>) -> anyhow::Result<()> {
    let SocketAddr::V4(v4) = to else { bail!("IPv4 only") };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
        sin_zero: [0; 8],
    };
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    // Room for one cmsg of a u64, aligned.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&addr as *const libc::sockaddr_in).cast_mut().cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(t) = txtime {
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a size computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(8) } as usize;
        // SAFETY: the control buffer holds CMSG_SPACE(8) bytes, so its first header and the
        // 8 bytes of data after it are inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_TXTIME;
            (*c).cmsg_len = libc::CMSG_LEN(8) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u64>(), t);
        }
    }
    // SAFETY: msg is a valid msghdr (above).
    if unsafe { libc::sendmsg(fd, &msg, 0) } < 0 {
        bail!("sendmsg: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// This thread's context switches so far (voluntary and not): its wake-ups.
fn wakeups() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    status
        .lines()
        .filter(|l| l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}
