//! A sink group's task: the bookkeeping around one send.
//!
//! Each run takes the readiness and errors reported since the last one, snapshots what its
//! sinks still need from the ring (refcounts, no copies), lets lapped and new sinks pass over
//! what comes before a keyframe, decides for each sink how much may leave now (its virtual
//! clock, see [`fanout_core::pace`]) and in which order the sinks are served (from a sink that
//! changes each run, so no sink is always last), and hands that to its data path's
//! [`Sender`](crate::send::Sender).

use crate::due::{self, Seat as _};
use crate::engine::{Job, WorkerCtx};
use crate::model::{FailurePolicy, LayerError, SessionConfig, SinkStatus, SinkTarget};
use crate::reactor::Reactor;
use crate::send::{self, Batch, GroupFds, Offer, Sender};
use crate::sink::{describe, send_socket, Sink, SinkIo};
use crate::sys;
use parking_lot::Mutex;
use std::io::{self, ErrorKind};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often a group reads its sockets' error queues when no send has reported an error.
const ERRORS_READ_EVERY: Duration = Duration::from_secs(1);

/// A group of a session's sinks in user space: its task and its state.
pub(crate) struct Group {
    pub task: Arc<crate::engine::Task>,
    pub state: Arc<Mutex<GroupState>>,
}

/// A session's user-space sinks: its groups (placement is the session's, which knows its
/// workers and sending ports).
pub(crate) struct UserGroups {
    list: parking_lot::RwLock<Vec<Group>>,
    reactor: Arc<Reactor>,
}

impl UserGroups {
    pub fn new(reactor: Arc<Reactor>) -> Self {
        Self { list: parking_lot::RwLock::new(Vec::new()), reactor }
    }

    pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, Vec<Group>> {
        self.list.read()
    }

    pub fn write(&self) -> parking_lot::RwLockWriteGuard<'_, Vec<Group>> {
        self.list.write()
    }

    /// Runs `f` on sink `id`, if it is here.
    pub fn with_sink<R>(&self, id: u64, f: impl FnOnce(&mut Sink) -> R) -> Option<R> {
        for g in self.read().iter() {
            if let Some(sink) = g.state.lock().sinks.iter_mut().find(|s| s.id == id) {
                return Some(f(sink));
            }
        }
        None
    }
}

impl crate::sinkset::SinkSet for UserGroups {
    fn remove(&self, id: u64) -> Option<(u64, u64)> {
        for g in self.read().iter() {
            let mut st = g.state.lock();
            if let Some(i) = st.sinks.iter().position(|s| s.id == id) {
                let s = st.sinks.swap_remove(i);
                let sent = (s.packets_sent(), s.bytes_sent());
                s.close(&self.reactor);
                return Some(sent);
            }
        }
        None
    }

    fn clear(&self) -> (usize, u64, u64) {
        let (mut n, mut packets, mut bytes) = (0, 0, 0);
        for g in self.read().iter() {
            for s in g.state.lock().sinks.drain(..) {
                (n, packets, bytes) = (n + 1, packets + s.packets_sent(), bytes + s.bytes_sent());
                s.close(&self.reactor);
            }
        }
        (n, packets, bytes)
    }

    fn pin(&self, id: u64, pin: Option<fanout_proto::codec::layers::Layer>) -> Option<Result<(), LayerError>> {
        self.with_sink(id, |sink| match sink.adapt() {
            Some(l) => {
                l.set_pin(pin);
                Ok(())
            }
            None => Err(LayerError::NotRtp),
        })
    }

    fn report(
        &self,
        id: u64,
        feedback: crate::layered::Feedback,
        rates: &fanout_proto::rtp::adapt::LayerRates,
        now: Instant,
    ) -> Option<bool> {
        self.with_sink(id, |sink| {
            let (sent, bytes) = (sink.packets_sent(), sink.bytes_sent());
            sink.adapt().map(|l| l.on_feedback(feedback, sent, bytes, rates, now)).is_some()
        })
    }

    fn status(&self, id: u64, head: u64) -> Option<SinkStatus> {
        self.read().iter().find_map(|g| g.state.lock().sinks.iter().find(|s| s.id == id).map(|s| s.status(head)))
    }

    fn statuses(&self, head: u64, out: &mut Vec<SinkStatus>) {
        for g in self.read().iter() {
            out.extend(g.state.lock().sinks.iter().map(|s| s.status(head)));
        }
    }
}

pub(crate) struct GroupState {
    pub sinks: Vec<Sink>,
    /// Pending ring entries, cloned (refcount only) under the ring lock; empty between runs.
    snapshot: Vec<Arc<crate::packet::Packet>>,
    /// The socket the group's unconnected UDP sinks send from, with ICMP errors queued.
    udp: UdpSocket,
    /// Its IPv6 twin, made when the group first has an IPv6 sink.
    udp6: Option<UdpSocket>,
    sender: Box<dyn Sender>,
    /// This run's offers, in the order the sinks are served.
    offers: Vec<Offer>,
    /// Their departure times, where stamped (CLOCK_MONOTONIC ns once the run has them).
    departs: Vec<u64>,
    /// Its UDP sockets take departure times (`SO_TXTIME`): the bytes of stamped datagrams
    /// their send buffers hold while fq keeps them.
    stamp_room: Option<u64>,
    /// Runs so far: where the serving order starts is a hash of it.
    runs: u64,
    failed: Vec<(usize, io::Error)>,
    reaped: Vec<(u64, io::Error)>,
    /// A send saw an error: read the error queues at the next run (else once a second, in
    /// case an ICMP error came while nothing was sent). Reading them every run cost a
    /// `recvmsg` per run that almost always found nothing.
    errors_pending: bool,
    errors_read: Instant,
    /// The group's own task, for a timed wake-up.
    pub task: Weak<crate::engine::Task>,
    /// When the stream sinks' held packets are written (see `SessionConfig::stream_flush`).
    flush_due: Option<Instant>,
    /// The timer armed for a paced sink's next packet.
    pace_due: Option<Instant>,
    /// With `shared_link`: the virtual clock of the link the group's sinks are behind.
    group_clock: fanout_core::VirtualClock,
    /// Its UDP sinks send from the shared source port.
    pub shared_port: bool,
}

impl GroupState {
    pub fn new(cfg: &SessionConfig, shared_port: bool) -> io::Result<Self> {
        let udp = send_socket(false, shared_port)?;
        udp.set_nonblocking(true)?;
        sys::enable_recv_err(udp.as_raw_fd(), false)?;
        let stamp_room = match cfg.pacing.is_some_and(|p| p.txtime) {
            true => Some(stamping(&udp)?),
            false => None,
        };
        Ok(Self {
            sinks: Vec::new(),
            snapshot: Vec::new(),
            udp,
            udp6: None,
            sender: send::for_path(cfg)?,
            offers: Vec::new(),
            departs: Vec::new(),
            stamp_room,
            runs: 0,
            failed: Vec::new(),
            reaped: Vec::new(),
            errors_pending: false,
            errors_read: Instant::now(),
            task: Weak::new(),
            flush_due: None,
            pace_due: None,
            group_clock: Default::default(),
            shared_port,
        })
    }

    /// Makes the IPv6 socket when the group gets its first unconnected IPv6 sink.
    pub fn ensure_udp6(&mut self, sink: &Sink) -> io::Result<()> {
        if self.udp6.is_none() && matches!(&sink.io, SinkIo::Unconnected(a) if a.is_v6()) {
            let s = send_socket(true, self.shared_port)?;
            s.set_nonblocking(true)?;
            sys::enable_recv_err(s.as_raw_fd(), true)?;
            if self.stamp_room.is_some() {
                stamping(&s)?;
            }
            self.udp6 = Some(s);
        }
        Ok(())
    }

    /// Readiness the reactor saw, failed sends reaped, ICMP errors queued on the group's
    /// sockets (matched to sinks by destination).
    fn take_errors(&mut self, reactor: &Reactor, policy: FailurePolicy, now: Instant) {
        for sink in self.sinks.iter_mut() {
            match &sink.io {
                SinkIo::Stream(_) => {
                    if sink.flags.writable.swap(false, Ordering::AcqRel) {
                        sink.blocked = false;
                    }
                    if sink.flags.readable.swap(false, Ordering::AcqRel) {
                        if let Some(why) = check_peer(&sink.io) {
                            sink.fail(why, reactor, policy);
                        }
                    }
                }
                // A full queue holds the sink back until its reader makes room.
                SinkIo::Channel(q) => sink.blocked = q.is_full(),
                _ => {}
            }
        }
        self.sender.reap(&mut self.reaped);
        self.errors_pending |= !self.reaped.is_empty();
        for (id, e) in self.reaped.drain(..) {
            if let Some(sink) = self.sinks.iter_mut().find(|k| k.id == id) {
                sink.fail_io(&e, reactor, policy);
            }
        }
        if !self.errors_pending && now.duration_since(self.errors_read) < ERRORS_READ_EVERY {
            return;
        }
        (self.errors_pending, self.errors_read) = (false, now);
        let fds = [Some(self.udp.as_raw_fd()), self.udp6.as_ref().map(|u| u.as_raw_fd())];
        for fd in fds.into_iter().flatten() {
            while let Some((addr, err)) = sys::recv_error(fd) {
                for sink in self.sinks.iter_mut().filter(|k| k.target == SinkTarget::Udp(addr)) {
                    sink.fail_io(&err, reactor, policy);
                }
            }
        }
    }

    /// Snapshots what the sinks that can send now still need; sinks the ring lapped skip to
    /// its oldest packet and, in a stream with keyframes, wait for the next one. Returns the
    /// ring's head and the snapshot's first sequence number.
    fn snapshot(&mut self, s: &dyn Host, now: Instant) -> (u64, u64) {
        let ring = s.ring().lock();
        let (head, oldest) = (ring.head(), ring.oldest());
        let start = due::snapshot_start(&self.sinks, head, oldest);
        self.snapshot.clear();
        // Invariant: oldest <= start <= seq < head, so the ring holds every seq here.
        self.snapshot.extend((start..head).map(|seq| ring.get(seq).expect("held by the ring").clone()));
        due::catch_up(&mut self.sinks, oldest, s.resync_wait(), now);
        (head, start)
    }
}

/// The send buffer a group's stamped datagrams wait in while fq holds them (grown where
/// allowed), for a socket that now takes departure times: the bytes of datagrams it holds.
fn stamping(udp: &UdpSocket) -> io::Result<u64> {
    sys::enable_txtime(udp.as_raw_fd())?;
    let buffer = sys::grow_send_buffer(udp.as_raw_fd(), STAMP_BUFFER)?;
    // Each datagram costs its buffer about twice its bytes (its sk_buff and allocation).
    Ok(buffer as u64 / 2)
}

/// A stamping group socket's send buffer: a second of 32 sinks of 1 Mbit/s.
const STAMP_BUFFER: usize = 8 << 20;

/// What a sink group needs of its session. The session implements it, so that this module
/// (below the session) does not import it.
pub(crate) trait Host: Send + Sync {
    fn cfg(&self) -> &SessionConfig;
    fn ring(&self) -> &Mutex<fanout_core::SessionRing<Arc<crate::packet::Packet>>>;
    fn is_closed(&self) -> bool;
    /// Whether the stream's keyframes are known (a lapped sink then resumes at one), and how
    /// long such a sink waits for one.
    fn resync_wait(&self) -> Option<std::time::Duration>;
    fn reactor(&self) -> &Reactor;
    fn pace(&self) -> Option<(fanout_core::Pace, Instant)>;
    fn pace_shared_link(&self) -> bool;
    fn egress(&self) -> Option<&crate::engine::EgressSeat>;
    /// A sink leaves the session: its totals are kept.
    fn retire(&self, sink: &Sink);
    /// TCP sinks that failed under `retry`: the control plane is asked to reconnect them.
    /// Whether anyone was there to ask.
    fn ask_retry(&self, sinks: &[(u64, std::net::SocketAddr)]) -> bool;
}

pub(crate) struct GroupJob {
    pub session: Weak<dyn Host>,
    pub state: Arc<Mutex<GroupState>>,
}

impl Job for GroupJob {
    fn run(&self, ctx: &mut WorkerCtx) -> bool {
        let Some(s) = self.session.upgrade() else { return false };
        if s.is_closed() {
            return false;
        }
        let s = &*s;
        let mut guard = self.state.lock();
        let g = &mut *guard;
        let (reactor, policy) = (s.reactor(), s.cfg().failed_sinks);
        let now = Instant::now();

        g.take_errors(reactor, policy, now);
        let (head, start) = g.snapshot(s, now);
        due::skip_to_awaited(&mut g.sinks, &g.snapshot, start, now);
        let write_streams = stream_flush_now(g, s.cfg(), head, reactor, now);
        g.runs += 1;
        let run = due::Run {
            start,
            head,
            ring: s.cfg().ring_capacity,
            write_streams,
            pace: s.pace(),
            shared_link: s.pace_shared_link(),
            stamp: g.stamp_room,
            egress: s.egress(),
            turn: fanout_core::rotation(g.runs, g.sinks.len().max(1)),
            now,
        };
        let wake = due::offer(&mut g.sinks, &g.snapshot, &mut g.group_clock, &run, &mut g.offers, &mut g.departs);
        if let (false, Some((_, epoch))) = (g.departs.is_empty(), run.pace) {
            // From the clocks' epoch to CLOCK_MONOTONIC, what SO_TXTIME stamps are read on.
            let since = now.saturating_duration_since(epoch).as_nanos() as u64;
            let base = sys::monotonic_ns().saturating_sub(since);
            g.departs.iter_mut().for_each(|t| *t += base);
        }
        if let Some(at) = wake.filter(|&at| g.pace_due.is_none_or(|due| due <= now || at < due)) {
            g.pace_due = Some(at);
            if let Some(task) = g.task.upgrade() {
                reactor.schedule_at(task, at);
            }
        }

        let GroupState { sinks, snapshot, udp, udp6, sender, offers, departs, failed, errors_pending, .. } = g;
        let mut batch = Batch { sinks, snapshot, start, offers, departs, fds: GroupFds::new(udp, udp6.as_ref()) };
        sender.send(&mut batch, ctx, failed);
        *errors_pending |= std::mem::take(&mut ctx.send_error) || !failed.is_empty();
        for (i, e) in failed.drain(..) {
            sinks[i].fail_io(&e, reactor, policy);
        }
        if let Err(e) = sender.flush() {
            tracing::warn!(session = %s.cfg().name, "io_uring submit failed: {e}");
        }
        snapshot.clear();
        g.retire_failed(s, policy);
        false
    }
}

impl GroupState {
    /// Drops the sinks that failed for good; asks the control plane to reconnect the TCP
    /// sinks that just failed under `retry`.
    fn retire_failed(&mut self, s: &dyn Host, policy: FailurePolicy) {
        // An HTTP subscriber that went away cannot come back on the same connection.
        let keep_failed = policy != FailurePolicy::Remove;
        self.sinks.retain(|k| {
            let keep = k.failed.is_none() || (keep_failed && !matches!(k.target, SinkTarget::Http(_)));
            if !keep {
                s.retire(k);
                let why = k.failed.as_deref().unwrap_or("");
                match &k.target {
                    SinkTarget::Http(peer) => {
                        tracing::info!(session = %s.cfg().name, sink = k.id, ?peer, why, "HTTP subscriber left")
                    }
                    t => tracing::info!(session = %s.cfg().name, sink = k.id, target = ?t, why, "failed sink removed"),
                }
            }
            keep
        });
        let ask: Vec<(u64, std::net::SocketAddr)> = self
            .sinks
            .iter()
            .filter(|k| k.retrying && !k.retry_asked)
            .filter_map(|k| match k.target {
                SinkTarget::Tcp(addr) => Some((k.id, addr)),
                _ => None,
            })
            .collect();
        if !ask.is_empty() && s.ask_retry(&ask) {
            self.sinks.iter_mut().filter(|k| k.retrying).for_each(|k| k.retry_asked = true);
        }
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

/// Stream sinks of the sharing paths (and batched channel sinks) are written once per
/// `stream_flush` ([`due::stream_flush`]). Whether to write them in this run; arms the group's timer if not.
fn stream_flush_now(g: &mut GroupState, cfg: &SessionConfig, head: u64, reactor: &Reactor, now: Instant) -> bool {
    use crate::model::DataPath;
    if cfg.stream_flush.is_zero() || matches!(cfg.datapath, DataPath::Daemon | DataPath::Copy) {
        return true;
    }
    let waiting = g
        .sinks
        .iter()
        .filter(|k| k.is_stream() && k.ready())
        .map(|k| head.saturating_sub(k.due.cursor.next()))
        .max()
        .unwrap_or(0);
    // One grid of flush times for the process (see `due::stream_flush`).
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    match due::stream_flush(waiting, &mut g.flush_due, cfg.stream_flush, now, epoch) {
        due::Flush::Now => true,
        due::Flush::Hold(arm) => {
            if let Some((at, task)) = arm.zip(g.task.upgrade()) {
                reactor.schedule_at(task, at);
            }
            false
        }
    }
}
