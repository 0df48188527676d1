//! A sink group's task: the bookkeeping around one send.
//!
//! Each run takes the readiness and errors reported since the last one, snapshots what its
//! sinks still need from the ring (refcounts, no copies), lets lapped and new sinks pass over
//! what comes before a keyframe, decides for each sink how much may leave now (its virtual
//! clock, see [`fanout_core::pace`]) and in which order the sinks are served (from a sink that
//! changes each run, so no sink is always last), and hands that to its data path's
//! [`Sender`](crate::send::Sender).

use crate::engine::{Job, WorkerCtx};
use crate::model::{FailurePolicy, SessionConfig, SinkTarget};
use crate::reactor::Reactor;
use crate::send::{self, Batch, GroupFds, Offer, Sender};
use crate::sink::{describe, send_socket, Await, Sink, SinkIo};
use crate::sys;
use fanout_core::Pace;
use parking_lot::Mutex;
use std::io::{self, ErrorKind};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a sink that was lapped waits for a keyframe before it is sent whatever comes.
const RESYNC_WAIT: Duration = Duration::from_secs(5);
/// How often a group reads its sockets' error queues when no send has reported an error.
const ERRORS_READ_EVERY: Duration = Duration::from_secs(1);

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
        Ok(Self {
            sinks: Vec::new(),
            snapshot: Vec::new(),
            udp,
            udp6: None,
            sender: send::for_path(cfg)?,
            offers: Vec::new(),
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
        let min = self.sinks.iter().filter(|k| k.ready()).map(|k| k.cursor.next()).min();
        let start = min.unwrap_or(head).max(oldest);
        self.snapshot.clear();
        // Invariant: oldest <= start <= seq < head, so the ring holds every seq here.
        self.snapshot.extend((start..head).map(|seq| ring.get(seq).expect("held by the ring").clone()));
        let keyed = s.has_keyframes();
        for k in self.sinks.iter_mut() {
            if k.cursor.catch_up(oldest) > 0 && keyed && k.awaiting.is_none() {
                // Resume at a picture the decoder can start from, not mid-GOP.
                k.awaiting = Some((Await::KeyframeAfterLap, now + RESYNC_WAIT));
            }
        }
        (head, start)
    }

    /// Sinks waiting for their first packet pass over what comes before it.
    fn skip_to_awaited(&mut self, start: u64, now: Instant) {
        for k in self.sinks.iter_mut() {
            let Some((what, until)) = k.awaiting else { continue };
            // A sink that cannot take anything now (not in the snapshot) looks when it can,
            // and its wait starts over then: a player stalled for longer than the wait must
            // still resume at a keyframe, not at whatever comes when it reads again.
            if !k.ready() || k.cursor.next() < start {
                k.awaiting = Some((what, now + RESYNC_WAIT));
                continue;
            }
            let pending = &self.snapshot[(k.cursor.next() - start) as usize..];
            let first = match what {
                Await::Keyframe | Await::KeyframeAfterLap => {
                    pending.iter().position(|p| p.is_keyframe()).map(|i| access_unit_start(pending, i))
                }
                Await::RtpSeq(n) => pending.iter().position(|p| p.is_rtp() && p.data()[2..4] == n.to_be_bytes()),
            };
            let n = match (first, what) {
                (Some(i), _) => i,
                // The unfinished access unit at the end may still turn out to be a keyframe
                // (its delimiter came, its parameter sets have not): it waits in the ring.
                (None, Await::Keyframe | Await::KeyframeAfterLap) => match pending.last() {
                    Some(p) if !p.ends_access_unit() => access_unit_start(pending, pending.len() - 1),
                    _ => pending.len(),
                },
                (None, Await::RtpSeq(_)) => pending.len(),
            } as u64;
            match what {
                Await::Keyframe => k.cursor.withhold(n),
                Await::KeyframeAfterLap => k.cursor.skip(n),
                Await::RtpSeq(_) => k.cursor.pass(n), // the kernel sent those
            }
            if first.is_some() || now >= until {
                k.awaiting = None;
            }
        }
    }

    /// This run's offers, from a sink that changes each run ([`fanout_core::rotation`]);
    /// returns when the first packet a sink's clock held back may leave.
    /// A sink more than half a ring behind is sent all it can take: pacing must never be
    /// what gets a sink lapped.
    /// With `shared_link`, the group's sinks also share one clock at the sum of the rates of
    /// those with something to send (and one sink's burst): together they never send faster
    /// than that, as if behind one link, and each packet's copies leave spread over its
    /// interval.
    /// With `egress`, what each sink may take is then what is left of the session's place on
    /// the egress the sessions share (its reservation, then spare capacity by class).
    #[allow(clippy::too_many_arguments)]
    fn offer(
        &mut self,
        start: u64,
        head: u64,
        ring: usize,
        write_streams: bool,
        (pace, shared_link): (Option<(Pace, Instant)>, bool),
        egress: Option<&crate::engine::EgressSeat>,
        now: Instant,
    ) -> Option<Instant> {
        self.offers.clear();
        let n = self.sinks.len();
        if n == 0 {
            return None;
        }
        self.runs += 1;
        let turn = fanout_core::rotation(self.runs, n);
        // The link's rate: the sum of the rates of the sinks that have something to send
        // (the others, caught up, leave the link to them).
        let group_pace = pace.filter(|_| shared_link).and_then(|(p, _)| {
            let active = self.sinks.iter().filter(|k| k.ready() && k.cursor.next() < head).count().max(1);
            Pace::new(p.rate().saturating_mul(active as u64), p.burst(), 0).ok()
        });
        let mut wake: Option<Instant> = None;
        let mut egress = egress.map(|seat| {
            let t = now.saturating_duration_since(seat.egress.epoch).as_nanos() as u64;
            (seat.egress.link.lock(), seat, t)
        });
        for i in (turn..n).chain(0..turn) {
            let k = &mut self.sinks[i];
            if !k.ready() || (k.cursor.next() >= head && k.partial.is_none()) {
                continue;
            }
            if matches!(k.io, SinkIo::Stream(_)) && !write_streams && k.partial.is_none() {
                continue; // held for the next flush
            }
            // A sink still waiting for a keyframe has nothing to send yet (but the rest of a
            // partial write).
            let pending = match k.awaiting {
                Some(_) => &[][..],
                None => &self.snapshot[(k.cursor.next() - start) as usize..],
            };
            let clocks = (k.clock, self.group_clock);
            let mut count = match &pace {
                Some(_) if pending.len() > ring / 2 => pending.len(),
                None => pending.len(),
                Some((pace, epoch)) => {
                    let t = now.saturating_duration_since(*epoch).as_nanos() as u64;
                    let lens = pending.iter().map(|p| p.len());
                    let before = k.clock;
                    let a = k.clock.admit(pace, t, lens.clone());
                    let (mut count, mut next) = (a.count, a.next_at);
                    if let Some(gp) = &group_pace {
                        let g = self.group_clock.admit(gp, t, lens.clone().take(count));
                        if g.count < count {
                            // The link's clock holds some back: the sink's own takes only what goes.
                            k.clock = before;
                            k.clock.admit(pace, t, lens.take(g.count));
                            (count, next) = (g.count, g.next_at);
                        }
                    }
                    if let Some(at) = next {
                        let at = *epoch + Duration::from_nanos(at);
                        wake = Some(wake.map_or(at, |w| w.min(at)));
                    }
                    count
                }
            };
            if let Some((link, seat, t)) = egress.as_mut().filter(|_| count > 0) {
                let a = link.admit(seat.slot, *t, pending[..count].iter().map(|p| p.len()));
                if a.count < count {
                    count = a.count;
                    if let Some((pace, epoch)) = &pace {
                        // The clocks count only what leaves.
                        let t = now.saturating_duration_since(*epoch).as_nanos() as u64;
                        (k.clock, self.group_clock) = clocks;
                        let lens = pending[..count].iter().map(|p| p.len());
                        k.clock.admit(pace, t, lens.clone());
                        if let Some(gp) = &group_pace {
                            self.group_clock.admit(gp, t, lens);
                        }
                    }
                    if let Some(at) = a.next_at {
                        let at = seat.egress.epoch + Duration::from_nanos(at);
                        wake = Some(wake.map_or(at, |w| w.min(at)));
                    }
                }
            }
            if count > 0 || k.partial.is_some() {
                self.offers.push(Offer { sink: i, count });
            }
        }
        wake
    }
}

/// The first packet of the access unit `pending[i]` belongs to (a keyframe is marked at its
/// parameter sets, which may follow a delimiter): a sink that starts there gets the picture
/// whole, and a player's parser never takes it for the rest of an earlier one.
fn access_unit_start(pending: &[Arc<crate::packet::Packet>], mut i: usize) -> usize {
    while i > 0 && pending[i - 1].same_access_unit(&pending[i]) {
        i -= 1;
    }
    i
}

/// What a sink group needs of its session. The session implements it, so that this module
/// (below the session) does not import it.
pub(crate) trait Host: Send + Sync {
    fn cfg(&self) -> &SessionConfig;
    fn ring(&self) -> &Mutex<fanout_core::SessionRing<Arc<crate::packet::Packet>>>;
    fn is_closed(&self) -> bool;
    /// Whether the stream's keyframes are known (a lapped sink then resumes at one).
    fn has_keyframes(&self) -> bool;
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
        g.skip_to_awaited(start, now);
        let write_streams = stream_flush_now(g, s.cfg(), head, reactor);
        let pace = (s.pace(), s.pace_shared_link());
        let wake = g.offer(start, head, s.cfg().ring_capacity, write_streams, pace, s.egress(), now);
        if let Some(at) = wake.filter(|&at| g.pace_due.is_none_or(|due| due <= now || at < due)) {
            g.pace_due = Some(at);
            if let Some(task) = g.task.upgrade() {
                reactor.schedule_at(task, at);
            }
        }

        let GroupState { sinks, snapshot, udp, udp6, sender, offers, failed, errors_pending, .. } = g;
        let mut batch = Batch { sinks, snapshot, start, offers, fds: GroupFds::new(udp, udp6.as_ref()) };
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

/// Stream sinks of the sharing paths are written once per `stream_flush`, so each write
/// carries every packet that came meanwhile: fewer, larger writes (and TCP segments) for a
/// bounded delay. Whether to write them in this run; arms the group's timer if not.
fn stream_flush_now(g: &mut GroupState, cfg: &SessionConfig, head: u64, reactor: &Reactor) -> bool {
    use crate::model::DataPath;
    /// Held packets that force a write before the interval is up.
    const HOLD_MAX: u64 = 32;
    if cfg.stream_flush.is_zero() || matches!(cfg.datapath, DataPath::Daemon | DataPath::Copy) {
        return true;
    }
    let waiting = g
        .sinks
        .iter()
        .filter(|k| matches!(k.io, SinkIo::Stream(_)) && k.ready())
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
