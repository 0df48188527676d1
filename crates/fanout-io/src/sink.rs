//! A sink: one subscriber, its socket (or queue), its place in the ring and what happened
//! to it.

use crate::due::{Await, Due};
use crate::layered::SinkLayers;
use crate::model::{FailurePolicy, SinkStatus, SinkTarget};
use crate::packet::Packet;
use crate::reactor::{IoFlags, Reactor, Registration};
use crate::sys::RawAddr;
use fanout_core::Cursor;
use std::io;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
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
pub(crate) fn send_socket(v6: bool, shared_port: bool) -> io::Result<UdpSocket> {
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

pub(crate) struct Sink {
    pub id: u64,
    pub target: SinkTarget,
    pub io: SinkIo,
    /// Its place in the ring, what it waits for, its pacing.
    pub due: Due,
    pub bytes: u64,
    pub failed: Option<String>,
    /// Failed, and being reconnected by the control plane (`failed_sinks = "retry"`).
    pub retrying: bool,
    /// The control plane was asked to reconnect it (once per failure).
    pub retry_asked: bool,
    errors: u64,
    last_error: Option<String>,
    /// The socket (or queue) was full; wait until it has room.
    pub blocked: bool,
    /// A packet a stream sink has started to write, and how much of it is written: a byte
    /// stream never gets half a packet followed by another.
    pub partial: Option<(Arc<Packet>, usize)>,
    /// The rest of a unit it began (pieces that continue it, after `partial`), taken out of
    /// the ring with its start: owed before anything else, whatever the ring does meanwhile.
    pub unit_rest: std::collections::VecDeque<Arc<Packet>>,
    pub flags: Arc<IoFlags>,
    pub reg: Option<Registration>,
    strip_rtp: bool,
    added: Instant,
    /// Layer adaptation, once a pin or a receiver report asked for it.
    pub layers: Option<Box<SinkLayers>>,
}

impl Sink {
    pub fn new(id: u64, target: SinkTarget, io: SinkIo, cursor: Cursor, strip_rtp: bool) -> Self {
        Self {
            id,
            target,
            io,
            due: Due { cursor, ..Due::default() },
            bytes: 0,
            failed: None,
            retrying: false,
            retry_asked: false,
            errors: 0,
            last_error: None,
            blocked: false,
            partial: None,
            unit_rest: Default::default(),
            flags: Arc::new(IoFlags::default()),
            reg: None,
            strip_rtp,
            added: Instant::now(),
            layers: None,
        }
    }

    /// Takes over what the kernel path counted for this sink before it moved to user space.
    pub fn carry(&mut self, packets: u64, bytes: u64, errors: u64, added: Instant, why: String) {
        self.due.cursor.received += packets;
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
        self.due.awaiting = Some((what, until));
    }

    /// Packets sent: taken from the ring, less the ones its layer allowance dropped.
    pub fn packets_sent(&self) -> u64 {
        self.due.cursor.received - self.layers.as_ref().map_or(0, |l| l.dropped)
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

    /// Whether it can be sent to now: not failed, its socket or queue not full.
    pub fn ready(&self) -> bool {
        self.failed.is_none() && !self.blocked
    }

    /// Whether its packets need a look each (a layer allowance, or renumbering after one).
    pub fn layered(&self) -> bool {
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
            packets_skipped: self.due.cursor.skipped,
            packets_before_keyframe: self.due.cursor.withheld,
            lag: if self.failed.is_some() { 0 } else { self.due.cursor.lag(head) },
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
        self.unit_rest.clear();
    }

    pub fn fail(&mut self, why: String, reactor: &Reactor, policy: FailurePolicy) {
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
        // (An HTTP subscriber leaving is no failure: its removal says so.)
        if !matches!(self.target, SinkTarget::Http(_)) {
            tracing::info!(sink = self.id, target = ?self.target, "sink failed: {why}");
        }
        self.failed = Some(why);
        self.retrying = retry && matches!(self.target, SinkTarget::Tcp(_));
        self.shut(reactor);
    }

    /// A send to the sink failed with `e`. An ICMP port unreachable at a UDP sink is its
    /// receiver gone for now (a set-top box rebooting): unless the policy is `remove`, it is
    /// counted and shown, and the sink is sent to on, so the receiver gets its stream back.
    /// Anything else fails it as the policy says.
    pub fn fail_io(&mut self, e: &io::Error, reactor: &Reactor, policy: FailurePolicy) {
        let refused = e.raw_os_error() == Some(libc::ECONNREFUSED);
        if refused && policy != FailurePolicy::Remove && matches!(self.target, SinkTarget::Udp(_)) {
            self.errors += 1;
            self.last_error = Some(describe(e));
            return;
        }
        self.fail(describe(e), reactor, policy);
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
        self.due.cursor.catch_up(head);
        self.last_error = self.failed.take();
        self.retrying = false;
        self.retry_asked = false;
        self.blocked = false;
        tracing::info!(sink = self.id, target = ?self.target, "sink reconnected");
        Ok(true)
    }

    pub fn bytes_of<'p>(&self, p: &'p Packet) -> &'p [u8] {
        if self.strip_rtp {
            p.payload()
        } else {
            p.data()
        }
    }
}

pub(crate) fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ICMP port unreachable (connection refused)".into(),
        Some(libc::EPIPE) | Some(libc::ECONNRESET) => "connection reset by peer".into(),
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => format!("ICMP unreachable: {e}"),
        _ => e.to_string(),
    }
}

impl crate::due::Seat for Sink {
    fn due(&self) -> &Due {
        &self.due
    }
    fn due_mut(&mut self) -> &mut Due {
        &mut self.due
    }
    fn ready(&self) -> bool {
        Sink::ready(self)
    }
    fn mid_write(&self) -> bool {
        self.partial.is_some() || !self.unit_rest.is_empty()
    }
    fn is_stream(&self) -> bool {
        match &self.io {
            SinkIo::Stream(_) => true,
            SinkIo::Channel(q) => q.is_batched(),
            _ => false,
        }
    }
    fn stamps(&self) -> bool {
        matches!(self.io, SinkIo::Unconnected(_))
    }
}
