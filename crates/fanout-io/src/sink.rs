//! Sinks and sink groups: the send side of every data path.

use crate::engine::{Job, WorkerCtx};
use crate::layered::{Checkpoint, SinkLayers};
use crate::packet::Packet;
use crate::reactor::{IoFlags, Reactor, Registration};
use crate::session::{DataPath, FailurePolicy, Inner, SessionConfig, SinkStatus, SinkTarget};
use crate::sys::{self, RawAddr};
use crate::uring::UringSender;
use fanout_core::Cursor;
use parking_lot::Mutex;
use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

pub(crate) enum SinkIo {
    /// Its own connected UDP socket (`shared`): no route lookup per packet, and ICMP errors
    /// come back on this socket alone.
    Connected(UdpSocket),
    /// An address the group's socket sends to (`daemon`, `copy`).
    Unconnected(RawAddr),
    /// A TCP or HTTP subscriber.
    Stream(TcpStream),
    /// A queue a protocol task drains (RTSP interleaved clients).
    Channel(Arc<crate::channel::ChannelQueue>),
    Closed,
}

/// The UDP address sinks placed on it send from (their sockets bind it with SO_REUSEPORT),
/// none by default: the RTSP server's RTP address, because RTSP clients may take RTP only
/// from the `server_port` their SETUP answer named (retina connects its socket to it), and
/// from the address they sent RTSP to (fanout's own upstream checks it).
static UDP_SOURCE: std::sync::RwLock<Option<SocketAddr>> = std::sync::RwLock::new(None);

/// Sets the shared source address for UDP sinks created from now on (see [`UDP_SOURCE`]).
/// An unspecified IP (`0.0.0.0`) shares the port only.
pub fn set_udp_source(addr: SocketAddr) {
    *UDP_SOURCE.write().unwrap_or_else(|e| e.into_inner()) = Some(addr);
}

pub(crate) fn udp_source() -> Option<SocketAddr> {
    *UDP_SOURCE.read().unwrap_or_else(|e| e.into_inner())
}

/// A UDP socket to send from; `shared_port`: on the shared source address when one is set
/// and free to share, else on any port. (Only sinks asking for it share it: ICMP errors for a
/// port many sockets share reach one of them, not necessarily the sender, so the other
/// sinks keep a port of their own for their failures to be told apart.)
fn send_socket(v6: bool, shared_port: bool) -> io::Result<UdpSocket> {
    let any: SocketAddr = if v6 { ([0u16; 8], 0).into() } else { ([0, 0, 0, 0], 0).into() };
    // The shared address, where its family is the sink's.
    let shared = udp_source().filter(|a| shared_port && a.port() != 0 && a.is_ipv6() == v6);
    if let Some(from) = shared {
        let bound = (|| -> io::Result<UdpSocket> {
            let s = socket2::Socket::new(socket2::Domain::for_address(any), socket2::Type::DGRAM, None)?;
            s.set_reuse_port(true)?;
            s.bind(&from.into())?;
            Ok(s.into())
        })();
        match bound {
            Ok(s) => return Ok(s),
            Err(e) => tracing::warn!("cannot send from UDP {from} ({e}); sending from any port"),
        }
    }
    UdpSocket::bind(any)
}

impl SinkIo {
    pub fn connected_udp(to: SocketAddr, shared_port: bool) -> io::Result<Self> {
        let s = send_socket(to.is_ipv6(), shared_port)?;
        s.connect(to)?;
        s.set_nonblocking(true)?;
        Ok(SinkIo::Connected(s))
    }
}

/// A new sink's first packet.
#[derive(Debug, Clone, Copy)]
pub enum Await {
    /// A video keyframe (a cold start).
    Keyframe,
    /// The packet with this RTP sequence number: where the kernel program stopped serving it.
    RtpSeq(u16),
}

pub(crate) struct Sink {
    pub id: u64,
    target: SinkTarget,
    io: SinkIo,
    cursor: Cursor,
    bytes: u64,
    failed: Option<String>,
    /// Failed, and being reconnected by the control plane (`failed_sinks = "retry"`).
    retrying: bool,
    /// The control plane was asked to reconnect it (once per failure).
    retry_asked: bool,
    errors: u64,
    last_error: Option<String>,
    /// The socket was full; wait for the reactor to report it writable.
    blocked: bool,
    /// A packet a stream sink has started to write, and how much of it is written: a byte
    /// stream never gets half a packet followed by another.
    partial: Option<(Arc<Packet>, usize)>,
    pub flags: Arc<IoFlags>,
    pub reg: Option<Registration>,
    strip_rtp: bool,
    added: Instant,
    /// Layer adaptation, once a pin or a receiver report asked for it.
    pub layers: Option<Box<SinkLayers>>,
    /// What it waits for before it is sent anything, and until when at most.
    awaiting: Option<(Await, Instant)>,
}

impl Sink {
    pub fn new(id: u64, target: SinkTarget, io: SinkIo, cursor: Cursor, strip_rtp: bool) -> Self {
        Self {
            id,
            target,
            io,
            cursor,
            bytes: 0,
            failed: None,
            retrying: false,
            retry_asked: false,
            errors: 0,
            last_error: None,
            blocked: false,
            partial: None,
            flags: Arc::new(IoFlags::default()),
            reg: None,
            strip_rtp,
            added: Instant::now(),
            layers: None,
            awaiting: None,
        }
    }

    /// Takes over what the kernel path counted for this sink before it moved to user space.
    pub fn carry(&mut self, packets: u64, bytes: u64, errors: u64, added: Instant, why: String) {
        self.cursor.received += packets;
        self.bytes += bytes;
        self.errors += errors;
        self.added = added;
        self.last_error = Some(why);
    }

    pub fn stream_fd(&self) -> Option<RawFd> {
        match &self.io {
            SinkIo::Stream(s) => Some(s.as_raw_fd()),
            _ => None,
        }
    }

    /// Holds its media until a keyframe comes, or `until`.
    pub fn await_first(&mut self, what: Await, until: Instant) {
        self.awaiting = Some((what, until));
    }

    /// Packets sent: taken from the ring, less the ones its layer allowance dropped.
    pub fn packets_sent(&self) -> u64 {
        self.cursor.received - self.layers.as_ref().map_or(0, |l| l.dropped)
    }

    pub fn bytes_sent(&self) -> u64 {
        self.bytes
    }

    /// Its layer adaptation, started now if it was not; `None` where a cap cannot apply.
    pub fn adapt(&mut self) -> Option<&mut SinkLayers> {
        if !self.can_drop_layers() {
            return None;
        }
        let added = self.added;
        Some(self.layers.get_or_insert_with(|| Box::new(SinkLayers::new(added))))
    }

    /// Whether its packets need a look each (a layer allowance, or renumbering after one).
    fn layered(&self) -> bool {
        self.layers.as_ref().is_some_and(|l| !l.passes_all())
    }

    /// Whether a layer allowance can apply: RTP datagrams (UDP or a channel).
    fn can_drop_layers(&self) -> bool {
        !self.strip_rtp && matches!(self.io, SinkIo::Connected(_) | SinkIo::Unconnected(_) | SinkIo::Channel(_))
    }

    pub fn status(&self, head: u64) -> SinkStatus {
        SinkStatus {
            id: self.id,
            target: self.target.clone(),
            packets_sent: self.packets_sent(),
            bytes_sent: self.bytes,
            packets_skipped: self.cursor.skipped,
            packets_before_keyframe: self.cursor.withheld,
            lag: if self.failed.is_some() { 0 } else { self.cursor.lag(head) },
            state: match (&self.failed, self.retrying) {
                (None, _) => "active",
                (Some(_), true) => "retrying",
                (Some(_), false) => "failed",
            },
            reason: self.failed.clone().or_else(|| self.last_error.clone()),
            errors: self.errors,
            age_ms: self.added.elapsed().as_millis() as u64,
            path: "user",
            layers: self.layers.as_ref().map(|l| l.status()),
        }
    }

    /// Deregisters and closes the socket.
    pub fn close(mut self, reactor: &Reactor) {
        self.shut(reactor);
    }

    fn shut(&mut self, reactor: &Reactor) {
        if let Some(reg) = self.reg.take() {
            reactor.deregister(reg);
        }
        self.io = SinkIo::Closed;
        self.partial = None;
    }

    fn fail(&mut self, why: String, reactor: &Reactor, policy: FailurePolicy) {
        if self.failed.is_some() {
            return;
        }
        self.errors += 1;
        let retry = policy == FailurePolicy::Retry;
        if retry && matches!(self.target, SinkTarget::Udp(_)) {
            // The receiver may come back: keep sending, remember why it did not get it.
            self.last_error = Some(why);
            return;
        }
        tracing::info!(sink = self.id, target = ?self.target, "sink failed: {why}");
        self.failed = Some(why);
        self.retrying = retry && matches!(self.target, SinkTarget::Tcp(_));
        self.shut(reactor);
    }

    /// A retrying TCP sink's new connection: what it missed while away counts as skipped.
    pub fn reattach(
        &mut self,
        stream: TcpStream,
        head: u64,
        reactor: &Reactor,
        task: &Arc<crate::engine::Task>,
    ) -> io::Result<bool> {
        if !self.retrying {
            return Ok(false);
        }
        self.reg = Some(reactor.register_sink(stream.as_raw_fd(), task.clone(), self.flags.clone())?);
        self.io = SinkIo::Stream(stream);
        self.cursor.catch_up(head);
        self.last_error = self.failed.take();
        self.retrying = false;
        self.retry_asked = false;
        self.blocked = false;
        tracing::info!(sink = self.id, target = ?self.target, "sink reconnected");
        Ok(true)
    }

    fn bytes_of<'p>(&self, p: &'p Packet) -> &'p [u8] {
        if self.strip_rtp {
            p.payload()
        } else {
            p.data()
        }
    }
}

fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ICMP port unreachable (connection refused)".into(),
        Some(libc::EPIPE) | Some(libc::ECONNRESET) => "connection reset by peer".into(),
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => format!("ICMP unreachable: {e}"),
        _ => e.to_string(),
    }
}

pub(crate) struct GroupState {
    pub sinks: Vec<Sink>,
    /// Pending ring entries, cloned (refcount only) under the ring lock; empty between runs.
    snapshot: Vec<Arc<Packet>>,
    /// The socket the group's unconnected UDP sinks send from, with ICMP errors queued.
    udp: UdpSocket,
    /// Its IPv6 twin, made when the group first has an IPv6 sink.
    udp6: Option<UdpSocket>,
    /// `(sink index, datagrams offered)` of the batched send being built.
    plan: Vec<Planned>,
    /// The `uring` path's submission and completion rings.
    uring: Option<UringSender>,
    /// Failed io_uring sends reaped this run: `(sink id, errno)`.
    uring_failed: Vec<(u64, i32)>,
    /// The group's own task, for a timed wake-up.
    pub task: std::sync::Weak<crate::engine::Task>,
    /// When the stream sinks' held packets are written (see `SessionConfig::stream_flush`).
    flush_due: Option<Instant>,
    /// Its UDP sinks send from the shared source port.
    pub shared_port: bool,
}

impl GroupState {
    /// Makes the IPv6 socket when the group gets its first unconnected IPv6 sink.
    pub fn ensure_udp6(&mut self, sink: &Sink) -> io::Result<()> {
        if self.udp6.is_none() && matches!(&sink.io, SinkIo::Unconnected(a) if a.is_v6()) {
            let s = send_socket(true, self.shared_port)?;
            s.set_nonblocking(true)?;
            sys::enable_recv_err(s.as_raw_fd(), true)?;
            self.udp6 = Some(s);
        }
        Ok(())
    }

    pub fn new(cfg: &SessionConfig, shared_port: bool) -> io::Result<Self> {
        let udp = send_socket(false, shared_port)?;
        udp.set_nonblocking(true)?;
        sys::enable_recv_err(udp.as_raw_fd(), false)?;
        let uring = match cfg.datapath {
            DataPath::Uring => Some(UringSender::new(1024, cfg.uring_sqpoll)?),
            _ => None,
        };
        Ok(Self {
            sinks: Vec::new(),
            snapshot: Vec::new(),
            udp,
            udp6: None,
            plan: Vec::new(),
            uring,
            uring_failed: Vec::new(),
            task: std::sync::Weak::new(),
            flush_due: None,
            shared_port,
        })
    }
}

/// A sink's share of the group's batched send: its index, how many datagrams it is offered,
/// and, for a sink that drops layers, its decision state before this batch and where its
/// kept packets start in `WorkerCtx::picked` (and its rewritten bytes in `heads`).
struct Planned {
    sink: usize,
    datagrams: usize,
    layered: Option<(Checkpoint, usize)>,
}

pub(crate) struct GroupJob {
    pub session: Weak<Inner>,
    pub state: Arc<Mutex<GroupState>>,
}

impl Job for GroupJob {
    fn run(&self, ctx: &mut WorkerCtx) -> bool {
        let Some(s) = self.session.upgrade() else { return false };
        if s.closed.load(Ordering::Acquire) {
            return false;
        }
        let mut guard = self.state.lock();
        let g = &mut *guard;
        let reactor = &s.reactor;
        let policy = s.cfg.failed_sinks;

        // Readiness the reactor saw on stream sinks.
        for sink in g.sinks.iter_mut().filter(|k| matches!(k.io, SinkIo::Stream(_))) {
            if sink.flags.writable.swap(false, Ordering::AcqRel) {
                sink.blocked = false;
            }
            if sink.flags.readable.swap(false, Ordering::AcqRel) {
                if let Some(why) = check_peer(&sink.io) {
                    sink.fail(why, reactor, policy);
                }
            }
        }
        // Completed io_uring sends: packets released, failures attributed to their sink.
        if let Some(u) = g.uring.as_mut() {
            u.reap(&mut g.uring_failed);
            for (id, errno) in g.uring_failed.drain(..) {
                if let Some(sink) = g.sinks.iter_mut().find(|k| k.id == id) {
                    sink.fail(describe(&io::Error::from_raw_os_error(errno)), reactor, policy);
                }
            }
        }
        // ICMP errors for the group's sockets, matched to sinks by destination.
        let fds = [Some(g.udp.as_raw_fd()), g.udp6.as_ref().map(|u| u.as_raw_fd())];
        for fd in fds.into_iter().flatten() {
            while let Some((addr, err)) = sys::recv_error(fd) {
                for sink in g.sinks.iter_mut().filter(|k| k.target == SinkTarget::Udp(addr)) {
                    sink.fail(describe(&err), reactor, policy);
                }
            }
        }

        // Snapshot what the sinks that can send now still need.
        let (head, start) = {
            let ring = s.ring.lock();
            let (head, oldest) = (ring.head(), ring.oldest());
            let min = g.sinks.iter().filter(|k| k.failed.is_none() && !k.blocked).map(|k| k.cursor.next()).min();
            let start = min.unwrap_or(head).max(oldest);
            g.snapshot.clear();
            // Invariant: oldest <= start <= seq < head, so the ring holds every seq here.
            g.snapshot.extend((start..head).map(|seq| ring.get(seq).expect("held by the ring").clone()));
            for k in g.sinks.iter_mut() {
                k.cursor.catch_up(oldest);
            }
            (head, start)
        };

        // New sinks waiting for their first packet pass over what comes before it.
        for k in g.sinks.iter_mut() {
            let Some((what, until)) = k.awaiting else { continue };
            let pending = &g.snapshot[(k.cursor.next() - start) as usize..];
            let first = pending.iter().position(|p| match what {
                Await::Keyframe => p.is_keyframe(),
                Await::RtpSeq(n) => p.is_rtp() && p.data()[2..4] == n.to_be_bytes(),
            });
            let n = first.unwrap_or(pending.len()) as u64;
            match what {
                Await::Keyframe => k.cursor.withhold(n),
                Await::RtpSeq(_) => k.cursor.pass(n), // the kernel sent those
            }
            if first.is_some() || Instant::now() >= until {
                k.awaiting = None;
            }
        }

        // A `kernel` session's user-space sinks are served as `shared`.
        let dp = match s.cfg.datapath {
            DataPath::Kernel => DataPath::Shared,
            dp => dp,
        };
        // Unconnected sinks send from the group's socket of their address family.
        let (fd4, fd6) = (g.udp.as_raw_fd(), g.udp6.as_ref().map_or(-1, |u| u.as_raw_fd()));
        let group_fd = |a: &RawAddr| if a.is_v6() { fd6 } else { fd4 };
        let write_streams = stream_flush_now(g, &s.cfg, dp, head, reactor);
        if dp == DataPath::Shared {
            let mut refused = send_udp_group(g, head, start, ctx, false);
            if fd6 >= 0 {
                refused.extend(send_udp_group(g, head, start, ctx, true));
            }
            for (i, e) in refused {
                let sink = &mut g.sinks[i];
                sink.fail(describe(&e), reactor, policy);
                // Under `retry` it stays: what it could not be sent counts as skipped.
                sink.cursor.catch_up(head);
            }
        }
        for sink in g.sinks.iter_mut() {
            if sink.failed.is_some() || sink.blocked {
                continue;
            }
            if dp == DataPath::Shared && matches!(sink.io, SinkIo::Unconnected(_)) {
                continue; // sent by send_udp_group
            }
            if sink.cursor.next() >= head && sink.partial.is_none() {
                continue;
            }
            if matches!(sink.io, SinkIo::Stream(_)) && !write_streams && sink.partial.is_none() {
                continue; // held for the next flush
            }
            let from = (sink.cursor.next() - start) as usize;
            let pending = &g.snapshot[from..];
            if sink.layered() {
                // Per-packet decisions and sequence numbers: see send_udp_layered.
                let Sink { layers: Some(lay), io, .. } = sink else { unreachable!("layered") };
                let r = match io {
                    SinkIo::Connected(sock) => send_udp_layered(sock.as_raw_fd(), None, lay, pending, ctx),
                    SinkIo::Unconnected(addr) => send_udp_layered(group_fd(addr), Some(addr), lay, pending, ctx),
                    SinkIo::Channel(q) => {
                        let kept = |p: &Packet| lay.decide(p).map(|seq| (seq, lay.rebuild(p)));
                        Ok((pending.len(), q.push_layered(pending, kept)))
                    }
                    // The control plane gives an allowance to RTP datagram sinks only.
                    SinkIo::Stream(_) | SinkIo::Closed => Ok((0, 0)),
                };
                match r {
                    Ok((n, bytes)) => {
                        sink.bytes += bytes;
                        sink.cursor.advance(n as u64);
                    }
                    Err(e) => sink.fail(describe(&e), reactor, policy),
                }
                continue;
            }
            let r = match (&sink.io, dp) {
                (SinkIo::Connected(sock), DataPath::Uring) => {
                    // Invariant: uring groups always own a UringSender.
                    send_udp_uring(g.uring.as_mut().expect("uring sender"), sock.as_raw_fd(), pending, sink.id)
                }
                (SinkIo::Connected(sock), _) => send_udp_batched(sock.as_raw_fd(), pending, ctx),
                (SinkIo::Unconnected(addr), _) => send_udp_copy(group_fd(addr), addr, pending, ctx),
                (SinkIo::Stream(_), DataPath::Shared | DataPath::Uring) => send_stream_vectored(sink, pending, ctx),
                (SinkIo::Stream(_), _) => send_stream_copy(sink, pending, ctx),
                (SinkIo::Channel(q), _) => {
                    q.push(pending);
                    Ok(pending.len())
                }
                (SinkIo::Closed, _) => Ok(0),
            };
            match r {
                Ok(n) if !matches!(sink.io, SinkIo::Stream(_)) => {
                    sink.bytes += pending[..n].iter().map(|p| p.len() as u64).sum::<u64>();
                    sink.cursor.advance(n as u64);
                }
                Ok(_) => {}
                Err(e) => sink.fail(describe(&e), reactor, policy),
            }
        }
        if let Some(u) = g.uring.as_mut() {
            if let Err(e) = u.submit() {
                tracing::warn!(session = %s.cfg.name, "io_uring submit failed: {e}");
            }
        }
        g.snapshot.clear();
        // An HTTP subscriber that went away cannot come back on the same connection: drop it.
        let keep_failed = policy != FailurePolicy::Remove;
        g.sinks.retain(|k| {
            let keep = k.failed.is_none() || (keep_failed && !matches!(k.target, SinkTarget::Http(_)));
            if !keep {
                s.retire(k);
                let why = k.failed.as_deref().unwrap_or("");
                match &k.target {
                    SinkTarget::Http(peer) => {
                        tracing::info!(session = %s.cfg.name, sink = k.id, ?peer, why, "HTTP subscriber left")
                    }
                    t => tracing::info!(session = %s.cfg.name, sink = k.id, target = ?t, why, "failed sink removed"),
                }
            }
            keep
        });
        // Ask the control plane to reconnect the TCP sinks that just failed.
        if g.sinks.iter().any(|k| k.retrying && !k.retry_asked) {
            if let Some(cb) = s.on_sink_failed.lock().as_ref() {
                for k in g.sinks.iter_mut().filter(|k| k.retrying && !k.retry_asked) {
                    k.retry_asked = true;
                    if let SinkTarget::Tcp(addr) = k.target {
                        cb(k.id, addr);
                    }
                }
            }
        }
        false
    }
}

/// A stream sink became readable: the peer sent bytes (drained, ignored) or closed.
fn check_peer(io: &SinkIo) -> Option<String> {
    let SinkIo::Stream(s) = io else { return None };
    let mut buf = [0u8; 1024];
    for _ in 0..16 {
        match io::Read::read(&mut &*s, &mut buf) {
            Ok(0) => return Some("peer closed the connection".into()),
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Some(describe(&e)),
        }
    }
    None
}

/// `shared` UDP: one datagram with `send`, a backlog with `sendmmsg`, straight from the ring.
/// Returns how many were sent; stops quietly when the socket is full (the rest stays pending).
fn send_udp_batched(fd: RawFd, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<usize> {
    if let [one] = pending {
        return match sys::send(fd, one.data()) {
            Ok(_) => Ok(1),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        };
    }
    let mut sent = 0;
    for chunk in pending.chunks(1024) {
        ctx.iov.clear();
        ctx.iov.extend(chunk.iter().map(|p| sys::iovec(p.data())));
        match sys::send_datagrams(fd, &mut ctx.iov, &mut ctx.hdrs) {
            Ok(n) => {
                sent += n;
                if n < chunk.len() {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if sent == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(sent)
}

/// UDP to a sink that drops layers: each packet the allowance keeps goes out as two pieces,
/// its first four bytes with the sink's own sequence number (a copy) and the rest straight
/// from the ring, in `sendmmsg` batches (on the `uring` path too: the rewritten bytes must
/// outlive the call, which a batch gives for free). Returns the packets consumed (sent or
/// dropped) and the bytes sent. When the socket takes only part of a batch, the decisions
/// are replayed up to the first unsent packet, which is decided again next time.
fn send_udp_layered(
    fd: RawFd,
    to: Option<&RawAddr>,
    lay: &mut SinkLayers,
    pending: &[Arc<Packet>],
    ctx: &mut WorkerCtx,
) -> io::Result<(usize, u64)> {
    const BATCH: usize = 512;
    let saved = lay.checkpoint();
    let (mut consumed, mut bytes) = (0, 0u64);
    for chunk in pending.chunks(BATCH) {
        // Decide first, so `ctx.heads` is complete (and never moves) before iovecs point in.
        ctx.heads.clear();
        ctx.picked.clear();
        ctx.rebuilt.clear();
        decide_kept(lay, chunk, ctx);
        ctx.iov.clear();
        push_kept(&mut ctx.iov, chunk, &ctx.heads, &ctx.picked, &ctx.rebuilt);
        ctx.hdrs.clear();
        for k in 0..ctx.picked.len() {
            ctx.hdrs.push(sys::mmsghdr_n(&mut ctx.iov[2 * k], 2, to));
        }
        let (mut sent, mut failure, mut retries) = (0, None, 0);
        while sent < ctx.hdrs.len() {
            match sys::sendmmsg(fd, &mut ctx.hdrs[sent..]) {
                Ok(0) => break,
                Ok(n) => sent += n,
                // The group socket's queued ICMP error, another sink's (as in send_udp_group).
                Err(e) if to.is_some() && e.raw_os_error() == Some(libc::ECONNREFUSED) && retries < 16 => retries += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) => break,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        bytes += (0..sent).map(|k| kept_packet(chunk, &ctx.picked, &ctx.rebuilt, k).len() as u64).sum::<u64>();
        if sent == ctx.picked.len() && failure.is_none() {
            consumed += chunk.len();
            continue;
        }
        if let (Some(e), 0, 0) = (failure, sent, consumed) {
            lay.restore(saved);
            return Err(e);
        }
        // Partly sent: consumed up to the first unsent packet; decide the rest again later.
        let upto = consumed + ctx.picked[sent];
        lay.replay(saved, &pending[..upto]);
        return Ok((upto, bytes));
    }
    Ok((consumed, bytes))
}

/// Decides `pending` for a layer-dropping sink: for each packet it keeps, the first four
/// bytes it goes out with (its own sequence number) into `heads` and its index into `picked`.
fn decide_kept(lay: &mut SinkLayers, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) {
    for (i, p) in pending.iter().enumerate() {
        if let Some(seq) = lay.decide(p) {
            let d = p.data();
            ctx.heads.push(if p.is_rtp() { [d[0], d[1], (seq >> 8) as u8, seq as u8] } else { [0; 4] });
            ctx.picked.push(i);
            ctx.rebuilt.push(lay.rebuild(p));
        }
    }
}

/// The `k`th kept packet: rebuilt for the sink, or the ring's.
fn kept_packet<'a>(
    pending: &'a [Arc<Packet>],
    picked: &[usize],
    rebuilt: &'a [Option<Arc<Packet>>],
    k: usize,
) -> &'a Packet {
    rebuilt[k].as_deref().unwrap_or(&pending[picked[k]])
}

/// Two iovecs per kept packet: its rewritten first four bytes and the rest (from the ring,
/// or from its rebuilt aggregate); a packet without an RTP header whole, and an empty piece.
fn push_kept(
    iov: &mut Vec<libc::iovec>,
    pending: &[Arc<Packet>],
    heads: &[[u8; 4]],
    picked: &[usize],
    rebuilt: &[Option<Arc<Packet>>],
) {
    for (k, head) in heads.iter().enumerate() {
        let p = kept_packet(pending, picked, rebuilt, k);
        let d = p.data();
        if p.is_rtp() {
            iov.push(sys::iovec(head));
            iov.push(sys::iovec(&d[4..]));
        } else {
            iov.push(sys::iovec(d));
            iov.push(sys::iovec(&[]));
        }
    }
}

/// `uring` UDP: queue one send per pending packet; they go to the kernel with the group's
/// single submit. Returns how many were queued.
fn send_udp_uring(u: &mut UringSender, fd: RawFd, pending: &[Arc<Packet>], sink: u64) -> io::Result<usize> {
    for (i, p) in pending.iter().enumerate() {
        if !u.queue(fd, p.data(), p, sink)? {
            return Ok(i);
        }
    }
    Ok(pending.len())
}

/// `shared` UDP, batched: every pending packet of every unconnected UDP sink of the group in
/// as few `sendmmsg` calls as possible (1024 datagrams each), straight from the ring.
/// Stream sinks of the sharing paths are written once per `stream_flush`, so each write
/// carries every packet that came meanwhile: fewer, larger writes (and TCP segments) for a
/// bounded delay. Whether to write them in this run; arms the group's timer if not.
fn stream_flush_now(g: &mut GroupState, cfg: &SessionConfig, dp: DataPath, head: u64, reactor: &Reactor) -> bool {
    /// Held packets that force a write before the interval is up.
    const HOLD_MAX: u64 = 32;
    if cfg.stream_flush.is_zero() || !matches!(dp, DataPath::Shared | DataPath::Uring) {
        return true;
    }
    let waiting = g
        .sinks
        .iter()
        .filter(|k| matches!(k.io, SinkIo::Stream(_)) && k.failed.is_none() && !k.blocked)
        .map(|k| head.saturating_sub(k.cursor.next()))
        .max()
        .unwrap_or(0);
    let now = Instant::now();
    match g.flush_due {
        _ if waiting == 0 => true,
        Some(due) if now >= due => {
            g.flush_due = None;
            true
        }
        _ if waiting >= HOLD_MAX => {
            g.flush_due = None;
            true
        }
        Some(_) => false,
        None => {
            let due = now + cfg.stream_flush;
            g.flush_due = Some(due);
            if let Some(task) = g.task.upgrade() {
                reactor.schedule_at(task, due);
            }
            false
        }
    }
}

/// Sends every pending datagram of the group's unconnected sinks of one address family (`v6`)
/// in one `sendmmsg` run, from that family's socket.
/// A sink that drops layers takes part with the packets it keeps, each in two pieces (see
/// [`send_udp_layered`]). Returns the sinks whose destination the kernel refused at once
/// (no route, ...), with the error: the rest of their datagrams are skipped so the sinks
/// after them still get theirs.
fn send_udp_group(g: &mut GroupState, head: u64, start: u64, ctx: &mut WorkerCtx, v6: bool) -> Vec<(usize, io::Error)> {
    let GroupState { sinks, snapshot, udp, udp6, plan, .. } = g;
    let Some(fd) = (if v6 { udp6.as_ref() } else { Some(&*udp) }).map(|u| u.as_raw_fd()) else { return Vec::new() };
    let mut refused = Vec::new();
    plan.clear();
    ctx.heads.clear();
    ctx.picked.clear();
    ctx.rebuilt.clear();
    // Decide first (the rewritten bytes must not move once iovecs point at them).
    for (i, sink) in sinks.iter_mut().enumerate() {
        let family = matches!(&sink.io, SinkIo::Unconnected(a) if a.is_v6() == v6);
        if sink.failed.is_some() || !family || sink.cursor.next() >= head {
            continue;
        }
        let pending = &snapshot[(sink.cursor.next() - start) as usize..];
        let layered = sink.layered();
        match sink.layers.as_deref_mut().filter(|_| layered) {
            None => plan.push(Planned { sink: i, datagrams: pending.len(), layered: None }),
            Some(lay) => {
                let (saved, first) = (lay.checkpoint(), ctx.picked.len());
                decide_kept(lay, pending, ctx);
                plan.push(Planned { sink: i, datagrams: ctx.picked.len() - first, layered: Some((saved, first)) });
            }
        }
    }
    ctx.iov.clear();
    for e in plan.iter() {
        let pending = &snapshot[(sinks[e.sink].cursor.next() - start) as usize..];
        match e.layered {
            None => ctx.iov.extend(pending.iter().map(|p| sys::iovec(p.data()))),
            Some((_, first)) => {
                let kept = first..first + e.datagrams;
                push_kept(
                    &mut ctx.iov,
                    pending,
                    &ctx.heads[kept.clone()],
                    &ctx.picked[kept.clone()],
                    &ctx.rebuilt[kept],
                );
            }
        }
    }
    // Headers point into ctx.iov, which is not touched again until they are sent.
    ctx.hdrs.clear();
    let mut k = 0;
    for e in plan.iter() {
        let SinkIo::Unconnected(addr) = &sinks[e.sink].io else { continue };
        let pieces = if e.layered.is_some() { 2 } else { 1 };
        for _ in 0..e.datagrams {
            ctx.hdrs.push(sys::mmsghdr_n(&mut ctx.iov[k], pieces, Some(addr)));
            k += pieces;
        }
    }
    let total = ctx.hdrs.len();
    // Datagrams [0, pos) are done: sent, or skipped for a refused sink (plan entry, first
    // datagram not sent).
    let mut pos = 0;
    let mut skipped: Vec<(usize, usize)> = Vec::new();
    let mut retries = 0;
    while pos < total {
        match sys::sendmmsg(fd, &mut ctx.hdrs[pos..]) {
            Ok(0) => break,
            Ok(n) => pos += n,
            // A queued ICMP error (its sink is found through the error queue) stopped the
            // batch; the datagram it stopped at was not sent: go on from there (bounded).
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) && retries < 16 => retries += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) => break,
            Err(e) => {
                // The datagram at `pos` cannot go to its sink at all: skip that sink's rest.
                let mut end = 0;
                let entry = plan.iter().position(|e| {
                    end += e.datagrams;
                    pos < end
                });
                let Some(entry) = entry else { break };
                skipped.push((entry, pos));
                refused.push((plan[entry].sink, e));
                pos = end;
            }
        }
    }
    let mut first_datagram = 0;
    for (entry, e) in plan.iter().enumerate() {
        let stop = skipped.iter().find(|&&(x, _)| x == entry).map_or(pos, |&(_, at)| at);
        let done = stop.clamp(first_datagram, first_datagram + e.datagrams) - first_datagram;
        first_datagram += e.datagrams;
        let sink = &mut sinks[e.sink];
        let from = (sink.cursor.next() - start) as usize;
        let pending = &snapshot[from..];
        let consumed = match e.layered {
            None => {
                sink.bytes += pending[..done].iter().map(|p| p.len() as u64).sum::<u64>();
                done
            }
            Some((saved, first)) => {
                let kept = &ctx.picked[first..first + e.datagrams];
                let rebuilt = &ctx.rebuilt[first..first + e.datagrams];
                sink.bytes += (0..done).map(|k| kept_packet(pending, kept, rebuilt, k).len() as u64).sum::<u64>();
                if done == e.datagrams {
                    pending.len()
                } else {
                    // Consumed up to its first unsent packet: decide the rest again later.
                    sink.layers.as_deref_mut().expect("a layered sink").replay(saved, &pending[..kept[done]]);
                    kept[done]
                }
            }
        };
        sink.cursor.advance(consumed as u64);
    }
    refused
}

/// The baselines' UDP: copy each payload into user space, then one `sendto` per packet.
fn send_udp_copy(fd: RawFd, to: &RawAddr, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<usize> {
    for (i, p) in pending.iter().enumerate() {
        let n = p.len();
        ctx.copy[..n].copy_from_slice(p.data());
        let mut r = sys::send_to(fd, &ctx.copy[..n], to);
        if matches!(&r, Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED)) {
            // A pending ICMP error of the shared socket (any sink's) surfaced here; the
            // error queue says whose. This packet was not sent: send it again.
            r = sys::send_to(fd, &ctx.copy[..n], to);
        }
        match r {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(i),
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => return Ok(i),
            Err(e) => return Err(e),
        }
    }
    Ok(pending.len())
}

/// Records `written` bytes of a stream write that covered the partial packet (if any) and
/// then `pending` in order; returns whether everything offered was written.
fn account_stream(sink: &mut Sink, pending: &[Arc<Packet>], mut written: usize, offered: usize) -> bool {
    sink.bytes += written as u64;
    let complete = written == offered;
    if let Some((p, off)) = sink.partial.take() {
        let rest = sink.bytes_of(&p).len() - off;
        if written < rest {
            sink.partial = Some((p, off + written));
            return complete;
        }
        written -= rest;
    }
    let mut started = 0u64;
    for p in pending {
        let len = sink.bytes_of(p).len();
        if written >= len {
            written -= len;
            started += 1;
        } else {
            if written > 0 {
                sink.partial = Some((p.clone(), written));
                started += 1;
            }
            break;
        }
    }
    sink.cursor.advance(started);
    complete
}

fn stream_fd(sink: &Sink) -> RawFd {
    match &sink.io {
        SinkIo::Stream(s) => s.as_raw_fd(),
        _ => -1,
    }
}

/// `shared` stream: everything pending (and the rest of a partial packet) in one `sendmsg`.
fn send_stream_vectored(sink: &mut Sink, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<usize> {
    let fd = stream_fd(sink);
    let max = libc::UIO_MAXIOV as usize;
    ctx.iov.clear();
    if let Some((p, off)) = &sink.partial {
        ctx.iov.push(sys::iovec(&sink.bytes_of(p)[*off..]));
    }
    let room = max - ctx.iov.len();
    let pending = &pending[..pending.len().min(room)];
    ctx.iov.extend(pending.iter().map(|p| sys::iovec(sink.bytes_of(p))));
    let offered: usize = ctx.iov.iter().map(|v| v.iov_len).sum();
    if offered == 0 {
        sink.cursor.advance(pending.len() as u64);
        return Ok(0);
    }
    match sys::send_vectored(fd, &ctx.iov) {
        Ok(w) => {
            if !account_stream(sink, pending, w, offered) {
                sink.blocked = true;
            }
            Ok(0)
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            sink.blocked = true;
            Ok(0)
        }
        Err(e) => Err(e),
    }
}

/// The baselines' stream: copy each packet into user space, one `send` per packet.
fn send_stream_copy(sink: &mut Sink, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<usize> {
    let fd = stream_fd(sink);
    if let Some((p, off)) = sink.partial.clone() {
        let rest = &sink.bytes_of(&p)[off..];
        ctx.copy[..rest.len()].copy_from_slice(rest);
        match sys::send(fd, &ctx.copy[..rest.len()]) {
            Ok(w) => {
                if !account_stream(sink, &[], w, rest.len()) {
                    sink.blocked = true;
                    return Ok(0);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                sink.blocked = true;
                return Ok(0);
            }
            Err(e) => return Err(e),
        }
    }
    for (i, p) in pending.iter().enumerate() {
        let b = sink.bytes_of(p);
        ctx.copy[..b.len()].copy_from_slice(b);
        match sys::send(fd, &ctx.copy[..b.len()]) {
            Ok(w) => {
                if !account_stream(sink, &pending[i..i + 1], w, b.len()) {
                    sink.blocked = true;
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                sink.blocked = true;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(0)
}
