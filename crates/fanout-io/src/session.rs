//! A relay session (OMSS): one source, any number of sinks, a ring, a class and a data path.

use crate::engine::{Engine, Runner, Signal, Task, WorkerCtx};
use crate::group::{Group, GroupJob, GroupState, UserGroups};
use crate::kernel::{KernelFanout, KernelSinks};
use crate::packet::{Packet, PacketPool};
use crate::reactor::{Reactor, Registration};
use crate::sink::Sink;
use crate::sinkset::SinkSet;
use fanout_core::SessionRing;
use fanout_proto::codec::layers::Layer;
use parking_lot::Mutex;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::model::*;

/// See [`Session::set_ingest`].
type IngestFn = Box<dyn FnMut(&mut [u8], usize) -> Option<usize> + Send>;

#[derive(Debug, Default)]
pub(crate) struct SourceStats {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub oversized: AtomicU64,
    /// Dropped on arrival while the engine shed the session's class (overload).
    pub shed: AtomicU64,
    pub malformed: AtomicU64,
    /// Milliseconds since the session started at the last packet, +1 (0 = never).
    pub last_ms: AtomicU64,
    pub state: AtomicU8,
    pub publishers: AtomicU64,
    /// A stream publisher is attached now.
    pub connected: AtomicBool,
}

pub(crate) type SinkFailedFn = Box<dyn Fn(u64, SocketAddr) + Send + Sync>;

/// How long a new sink of a video session waits for a keyframe before it is sent whatever
/// comes (a stream whose keyframes are not recognised must still play).
const KEYFRAME_WAIT: Duration = Duration::from_secs(5);
/// A sink of a session of units waits for a unit's start this long: in effect, always.
const UNIT_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The least rate a session paces by, bytes per second (128 kbit/s).
const MIN_PACE_RATE: u64 = 16_000;

/// How long a sink taken over from the kernel waits for the packet the program stopped at.
const HANDOFF_WAIT: Duration = Duration::from_secs(1);
/// A session's sinks spread over a group per worker once a group holds this many.
const SPREAD_FROM: usize = 64;

pub(crate) struct Inner {
    /// Itself, for what must hand out a handle to it (a kernel fallback's new sink group).
    me: Weak<Inner>,
    pub cfg: SessionConfig,
    pub ring: Mutex<SessionRing<Arc<Packet>>>,
    /// Its sinks in user space.
    pub groups: UserGroups,
    pub src: SourceStats,
    pub source_kind: Mutex<String>,
    source_addr: Mutex<Option<SocketAddr>>,
    pub source_error: Mutex<Option<String>>,
    pub closed: AtomicBool,
    /// Its place on the egress the sessions share, if that is limited.
    pub egress: Option<crate::engine::EgressSeat>,
    /// Sequence number + 1 of the last packet that starts a video keyframe (0: none yet);
    /// written under the ring lock.
    last_key: AtomicU64,
    /// Its packets are pieces of units (an FLV tag) whose starts its inlet marks as
    /// keyframes: a sink starts, and resumes after a lap, only at a mark, however long that
    /// takes (anywhere else it would get half a unit).
    pub(crate) units: AtomicBool,
    pub started: Instant,
    next_sink: AtomicU64,
    /// Sinks the kernel path could not take (full maps), for a log line per thousand.
    kernel_refused: AtomicU64,
    /// Packets and bytes delivered to sinks since removed: the session's totals
    /// outlive short subscribers.
    pub retired: (AtomicU64, AtomicU64),
    /// Who runs the session's tasks: the engine, or the `daemon` path's own send thread.
    pub(crate) runner: Runner,
    pub reactor: Arc<Reactor>,
    source_reg: Mutex<Option<Registration>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    on_source_closed: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    /// Called with a TCP sink's id and address when it fails under `failed_sinks = "retry"`.
    pub on_sink_failed: Mutex<Option<SinkFailedFn>>,
    /// The `kernel` path: the engine's program, and this session's part of it (its sinks
    /// there) once the source is bound.
    kernel_fanout: Option<Arc<KernelFanout>>,
    kernel: KernelSinks,
    /// RTP video codec for keyframe marks (and, for H.264/HEVC, layer statistics): 0 none,
    /// 1 H.264, 2 HEVC, 3 VP8, 4 VP9.
    rtp_video: std::sync::atomic::AtomicU8,
    /// Rewrites each received packet in place after it was judged (keyframe, layer): the
    /// buffer and the packet's length in, its new length out (`None`: drop it).
    ingest: Mutex<Option<IngestFn>>,
    saw_parameter_sets: AtomicBool,
    /// VP9: the frame in progress, whose inter-picture flag is set where the source left it
    /// clear (see [`fanout_proto::codec::vpx::Vp9Predicted`]).
    vp9: Mutex<fanout_proto::codec::vpx::Vp9Predicted>,
    /// A reader asked for a keyframe (a WebRTC viewer's PLI, an RTSP client's PLI/FIR) that
    /// the source's side has not yet passed on; and how many were asked in all.
    keyframe_wanted: AtomicBool,
    keyframes_wanted: AtomicU64,
    /// Each packet's scalable layer, and the moving average rate per layer.
    layers: Mutex<(fanout_proto::codec::layers::LayerParser, fanout_proto::rtp::adapt::LayerRates)>,
    /// The source's rate and largest picture, and the pace they make (sessions that pace,
    /// once the rate is known).
    meter: Mutex<(fanout_core::StreamMeter, Option<fanout_core::Pace>)>,
    /// RTP time from the packets' arrival, for sender reports (see [`Session::rtp_now`]).
    arrival: Mutex<fanout_proto::rtp::arrival::ArrivalClock>,
}

/// A handle to a running session. Dropping it does not stop the session: call [`Session::close`].
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

/// Handles are equal when they are of the same session.
impl PartialEq for Session {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Session {}

impl Inner {
    /// Video with no keyframe in the ring: a new sink must wait for one.
    fn cold_video(&self) -> bool {
        self.rtp_video().is_some() && self.last_key.load(Ordering::Relaxed) <= self.ring.lock().oldest()
    }

    /// How long a lapped sink waits for a keyframe to resume at; `None` where the stream has
    /// none (none seen yet), and a sink resumes at once.
    pub(crate) fn resync_wait(&self) -> Option<Duration> {
        if self.units.load(Ordering::Relaxed) {
            Some(UNIT_WAIT)
        } else {
            (self.last_key.load(Ordering::Relaxed) > 0).then_some(crate::due::RESYNC_WAIT)
        }
    }

    /// The pace every sink is held to now, with the epoch of its clocks; `None` when the
    /// session does not pace or its rate is not known yet.
    pub(crate) fn pace(&self) -> Option<(fanout_core::Pace, Instant)> {
        self.cfg.pacing?;
        self.meter.lock().1.map(|p| (p, self.started))
    }

    /// Whether a group's sinks are paced together, as behind one link.
    pub(crate) fn pace_shared_link(&self) -> bool {
        self.cfg.pacing.is_some_and(|p| p.shared_link)
    }

    /// Measures what the source sent and sets the pace from it (or from the configured rate).
    fn measure(&self, packets: &[Arc<Packet>]) {
        let now = self.now_ns();
        let mut guard = self.meter.lock();
        let (m, pace) = &mut *guard;
        // Pictures are told apart by RTP timestamp in RTP video only (RTP/MP2T stamps each
        // datagram).
        let video = self.rtp_video().is_some();
        for p in packets {
            let ts =
                (video && p.is_rtp()).then(|| u32::from_be_bytes([p.data()[4], p.data()[5], p.data()[6], p.data()[7]]));
            m.packet(now, p.len(), ts);
        }
        let Some(pc) = self.cfg.pacing else { return };
        let Some(rate) = pc.rate.or(Some(m.rate_at(now)).filter(|&r| r > 0)) else { return };
        // A sparse or quiet source measures a rate no media link is thinner than.
        let rate = rate.max(MIN_PACE_RATE);
        let burst = pc.burst.unwrap_or_else(|| m.default_burst(rate).max(4 * m.largest_packet()));
        let sink_rate = (rate as f64 * pc.catchup) as u64;
        *pace = fanout_core::Pace::new(sink_rate, burst, m.largest_packet()).ok();
        if pc.shared_link {
            // The kernel path's clones are spread by departure times on the same clock.
            self.kernel.set_pace(pace.map(|p| (p.rate(), p.burst())));
        }
    }

    /// A send buffer for a stream subscriber: about a second of the stream (64 KiB – 4 MiB;
    /// 256 KiB until its rate is known). Left to autotuning, a stalled subscriber's socket
    /// grows to megabytes, a minute of a slow stream, and slowest-sink-drop never sees it.
    pub(crate) fn stream_send_buffer(&self) -> usize {
        let rate = self.cfg.pacing.and_then(|p| p.rate).unwrap_or_else(|| self.meter.lock().0.rate_at(self.now_ns()));
        if rate == 0 {
            256 << 10
        } else {
            (rate as usize).clamp(64 << 10, 4 << 20)
        }
    }

    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// Adds a sink that is going to its session's totals.
    pub(crate) fn retire(&self, sink: &crate::sink::Sink) {
        self.retired.0.fetch_add(sink.packets_sent(), Ordering::Relaxed);
        self.retired.1.fetch_add(sink.bytes_sent(), Ordering::Relaxed);
    }

    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Publishes received packets into the ring and wakes every sink group. Replaced buffers
    /// go back to `pool`.
    pub fn publish(&self, packets: &mut Vec<Arc<Packet>>, pool: &mut PacketPool) {
        if packets.is_empty() {
            return;
        }
        self.take_kernel_fallbacks();
        let n = packets.len() as u64;
        let bytes: u64 = packets.iter().map(|p| p.len() as u64).sum();
        self.src.packets.fetch_add(n, Ordering::Relaxed);
        self.src.bytes.fetch_add(bytes, Ordering::Relaxed);
        let now = self.now_ms();
        self.src.last_ms.store(now + 1, Ordering::Relaxed);
        self.src.state.store(SourceState::Active as u8, Ordering::Relaxed);
        if let Some(last) = packets.last() {
            let mut arrival = self.arrival.lock();
            if arrival.wants(now) {
                if let Ok(v) = fanout_proto::rtp::RtpView::parse(last.data()) {
                    arrival.sample(v.ssrc(), v.timestamp(), now);
                }
            }
        }
        if self.runner.is_shed(self.cfg.priority) {
            // Overload: the class's work stops here, before any sink group is woken.
            self.src.shed.fetch_add(n, Ordering::Relaxed);
            packets.drain(..).for_each(|p| pool.give(p));
            return;
        }
        self.measure(packets);
        {
            let mut ring = self.ring.lock();
            for p in packets.drain(..) {
                if p.is_keyframe() {
                    // From the first packet of its access unit (a delimiter before the
                    // parameter sets): a new sink gets the picture whole.
                    let mut start = ring.head();
                    while start > ring.oldest() && ring.get(start - 1).is_some_and(|q| q.same_access_unit(&p)) {
                        start -= 1;
                    }
                    self.last_key.store(start + 1, Ordering::Relaxed);
                }
                if let Some(old) = ring.publish(p) {
                    pool.give(old);
                }
            }
        }
        // Groups are woken from one that changes each batch: none is always served last.
        let groups = self.groups.read();
        if !groups.is_empty() {
            let turn = fanout_core::rotation(self.src.packets.load(Ordering::Relaxed), groups.len());
            for g in groups[turn..].iter().chain(&groups[..turn]) {
                g.task.schedule();
            }
        }
    }

    /// Moves the sinks the kernel program gave up on to user space. Runs before the batch
    /// that revealed them is published, so they start with it: nothing is lost (a packet of
    /// the batch the kernel already sent them may arrive twice).
    fn take_kernel_fallbacks(&self) {
        let found = self.kernel.take_fallbacks();
        let Some(me) = self.me.upgrade().filter(|_| !found.is_empty()) else { return };
        for f in found {
            tracing::warn!(session = %self.cfg.name, sink = %f.addr, "{}", f.reason);
            let io = crate::sink::SinkIo::Unconnected(crate::sys::RawAddr::new(f.addr));
            let (start, layers) = match f.handoff {
                Some((seq, layers)) => (Start::RtpSeq(seq), Some(layers)),
                None => (Start::Head, None),
            };
            let how = Placement::udp(start, f.own_sport);
            let r = me.add_sink_with(f.id, SinkTarget::Udp(f.addr), io, how, |sink| {
                sink.carry(f.stats.packets, f.stats.bytes, f.stats.errors, f.stats.added, f.reason.clone());
                sink.layers = layers;
            });
            if let Err(e) = r {
                tracing::error!(session = %self.cfg.name, sink = %f.addr, "cannot serve a kernel fallback: {e}");
            }
        }
    }

    fn add_sink_with(
        self: &Arc<Self>,
        id: u64,
        target: SinkTarget,
        io: crate::sink::SinkIo,
        how: Placement,
        init: impl FnOnce(&mut Sink),
    ) -> std::io::Result<u64> {
        let Placement { strip, start, shared_port } = how;
        let mut groups = self.groups.write();
        let per = self.cfg.sinks_per_group.max(1);
        // The least-loaded group with room (of the same sending port), else a new one:
        // groups spread over the workers.
        let mine = || groups.iter().enumerate().filter(|(_, g)| g.state.lock().shared_port == shared_port);
        let pick =
            mine().map(|(i, g)| (i, g.state.lock().sinks.len())).filter(|&(_, n)| n < per).min_by_key(|&(_, n)| n);
        // A session of more than SPREAD_FROM sinks gets a group per worker even below
        // `sinks_per_group`, so every worker can serve it at once: on a crowded host each
        // thread gets its own share of the CPU, and a session on one task gets one share.
        let spread = mine().count() < self.runner.workers() && pick.is_some_and(|(_, n)| n >= SPREAD_FROM);
        let gi = match pick.filter(|_| !spread) {
            Some((i, _)) => i,
            None => {
                let state = Arc::new(Mutex::new(GroupState::new(&self.cfg, shared_port)?));
                let host: Weak<dyn crate::group::Host> = Arc::downgrade(self) as _;
                let job = GroupJob { session: host, state: state.clone() };
                let task = Task::new(self.cfg.priority, self.runner.clone(), Box::new(job));
                state.lock().task = Arc::downgrade(&task);
                groups.push(Group { task, state });
                groups.len() - 1
            }
        };
        let g = &groups[gi];
        let mut st = g.state.lock();
        let (cursor, key_held) = {
            let ring = self.ring.lock();
            let k = self.last_key.load(Ordering::Relaxed);
            match start {
                Start::Keyframe if k > ring.oldest() => (fanout_core::Cursor::starting_at(&ring, k - 1), true),
                Start::RtpSeq(_) => (fanout_core::Cursor::starting_at(&ring, ring.oldest()), false),
                _ => (fanout_core::Cursor::at_head(&ring), false),
            }
        };
        let mut sink = Sink::new(id, target, io, cursor, strip);
        // Video with no keyframe held (an upstream just connected): hold the sink's media
        // until one comes, so its decoder never starts on delta frames.
        if start == Start::Keyframe && !key_held && self.units.load(Ordering::Relaxed) {
            sink.await_first(crate::due::Await::Keyframe, Instant::now() + UNIT_WAIT);
        } else if start == Start::Keyframe && !key_held && self.rtp_video().is_some() {
            sink.await_first(crate::due::Await::Keyframe, Instant::now() + KEYFRAME_WAIT);
        }
        if let Start::RtpSeq(n) = start {
            // Taken over from the kernel: from the first packet the program did not send
            // (its datagram may still be on its way through the source socket).
            sink.await_first(crate::due::Await::RtpSeq(n), Instant::now() + HANDOFF_WAIT);
        }
        init(&mut sink);
        st.ensure_udp6(&sink)?;
        if let Some(fd) = sink.stream_fd() {
            sink.reg = Some(self.reactor.register_sink(fd, g.task.clone(), sink.flags.clone())?);
        }
        st.sinks.push(sink);
        Ok(id)
    }

    /// Validates a received buffer and sets its payload offset; `false` = drop it.
    pub fn accept(&self, p: &mut Packet, len: usize) -> bool {
        if len == 0 {
            self.src.malformed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let data = &p.buf_mut()[..len];
        let off = match self.cfg.payload {
            PayloadMode::Raw => 0,
            PayloadMode::Auto => fanout_proto::rtp::classify::payload_offset(data),
            PayloadMode::Rtp => match fanout_proto::rtp::RtpView::parse(data) {
                Ok(v) => v.payload_range().start,
                Err(_) => {
                    self.src.malformed.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            },
        };
        p.set_len(len, off);
        self.mark_video_start(p);
        if let Some(f) = self.ingest.lock().as_mut() {
            match f(p.buf_mut(), len) {
                Some(n) => p.set_len_only(n),
                None => {
                    self.src.malformed.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
        true
    }

    /// RTP video of a known codec: a packet with parameter sets starts a keyframe; an IDR's
    /// first packet does only in streams that never carry parameter sets in band (their
    /// players take them from the SDP).
    /// VP8/VP9/AV1: a keyframe starts at its first packet (no layers judged here).
    pub(crate) fn mark_video_start(&self, p: &mut Packet) {
        use fanout_proto::rtp::classify::{video_start, RtpVideo, VideoStart};
        let codec = match self.rtp_video() {
            None => return,
            Some(RtpVideo::Nal(codec)) => codec,
            Some(vpx) => {
                let key = p.is_rtp()
                    && match vpx {
                        RtpVideo::Vp9 => self.vp9.lock().packet(p.payload_mut()),
                        RtpVideo::Av1 => fanout_proto::codec::av1::av1_keyframe_start(p.payload()),
                        _ => fanout_proto::codec::vpx::vp8_keyframe_start(p.payload()),
                    };
                if key {
                    p.mark_keyframe();
                }
                return;
            }
        };
        if p.payload().first() == Some(&fanout_proto::container::mpegts::SYNC_BYTE) {
            return;
        }
        match video_start(codec, p.payload()) {
            VideoStart::ParameterSets => {
                self.saw_parameter_sets.store(true, Ordering::Relaxed);
                p.mark_keyframe();
            }
            VideoStart::Idr if !self.saw_parameter_sets.load(Ordering::Relaxed) => p.mark_keyframe(),
            _ => {}
        }
        // The layer statistics (the thesis's per-layer moving averages).
        let now = self.now_ms();
        let mut l = self.layers.lock();
        let pl = l.0.packet(codec, p.payload());
        l.1.record(pl, p.len(), now);
        p.set_layer(pl);
        let aggregate = match (codec, p.payload()) {
            (fanout_proto::codec::annexb::Codec::H264, [b0, ..]) => b0 & 0x1f == 24,
            (fanout_proto::codec::annexb::Codec::H265, [b0, _, ..]) => (b0 >> 1) & 0x3f == 48,
            _ => false,
        };
        if aggregate {
            p.set_aggregate(codec);
        }
    }

    /// The video codec of the session's RTP, if known.
    fn rtp_video(&self) -> Option<fanout_proto::rtp::classify::RtpVideo> {
        use fanout_proto::{codec::annexb::Codec, rtp::classify::RtpVideo};
        match self.rtp_video.load(Ordering::Relaxed) {
            1 => Some(RtpVideo::Nal(Codec::H264)),
            2 => Some(RtpVideo::Nal(Codec::H265)),
            3 => Some(RtpVideo::Vp8),
            4 => Some(RtpVideo::Vp9),
            5 => Some(RtpVideo::Av1),
            _ => None,
        }
    }

    /// The session's RTP video codec where it is H.264/HEVC: what layers are judged for.
    fn video_codec(&self) -> Option<fanout_proto::codec::annexb::Codec> {
        self.rtp_video()?.nal()
    }

    pub fn source_closed(&self, state: SourceState, error: Option<String>) {
        self.src.state.store(state as u8, Ordering::Relaxed);
        self.src.connected.store(false, Ordering::Release);
        if error.is_some() {
            *self.source_error.lock() = error;
        }
        if let Some(reg) = self.source_reg.lock().take() {
            self.reactor.deregister(reg);
        }
        if let Some(cb) = self.on_source_closed.lock().as_ref() {
            cb();
        }
    }
}

impl crate::group::Host for Inner {
    fn cfg(&self) -> &SessionConfig {
        &self.cfg
    }
    fn ring(&self) -> &Mutex<SessionRing<Arc<Packet>>> {
        &self.ring
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
    fn resync_wait(&self) -> Option<Duration> {
        Inner::resync_wait(self)
    }
    fn reactor(&self) -> &Reactor {
        &self.reactor
    }
    fn pace(&self) -> Option<(fanout_core::Pace, Instant)> {
        Inner::pace(self)
    }
    fn pace_shared_link(&self) -> bool {
        Inner::pace_shared_link(self)
    }
    fn egress(&self) -> Option<&crate::engine::EgressSeat> {
        self.egress.as_ref()
    }
    fn retire(&self, sink: &Sink) {
        Inner::retire(self, sink)
    }
    fn ask_retry(&self, sinks: &[(u64, SocketAddr)]) -> bool {
        let cb = self.on_sink_failed.lock();
        let Some(cb) = cb.as_ref() else { return false };
        for &(id, addr) in sinks {
            cb(id, addr);
        }
        true
    }
}

impl crate::source::Feed for Inner {
    fn cfg(&self) -> &SessionConfig {
        &self.cfg
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
    fn is_shed(&self) -> bool {
        self.runner.is_shed(self.cfg.priority)
    }
    fn count_oversized(&self) {
        self.src.oversized.fetch_add(1, Ordering::Relaxed);
    }
    fn count_shed(&self, n: u64) {
        self.src.shed.fetch_add(n, Ordering::Relaxed);
    }
    fn accept(&self, p: &mut Packet, len: usize) -> bool {
        Inner::accept(self, p, len)
    }
    fn publish(&self, packets: &mut Vec<Arc<Packet>>, pool: &mut PacketPool) {
        Inner::publish(self, packets, pool)
    }
    fn source_closed(&self, state: SourceState, error: Option<String>) {
        Inner::source_closed(self, state, error)
    }
    fn mark_video_start(&self, p: &mut Packet) {
        Inner::mark_video_start(self, p)
    }
}

impl Session {
    pub fn new(cfg: SessionConfig, engine: &Engine) -> Self {
        let (cfg_datapath, cfg_priority, cfg_reserve) = (cfg.datapath, cfg.priority, cfg.reserve);
        let cfg_name = cfg.name.clone();
        let runner = match cfg.datapath {
            DataPath::Daemon => Runner::Thread(Arc::new(Signal::default())),
            _ => engine.runner(),
        };
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            ring: Mutex::new(SessionRing::with_capacity(cfg.ring_capacity.max(1))),
            cfg,
            groups: UserGroups::new(engine.reactor().clone()),
            src: SourceStats::default(),
            source_kind: Mutex::new("none".into()),
            source_addr: Mutex::new(None),
            source_error: Mutex::new(None),
            closed: AtomicBool::new(false),
            last_key: AtomicU64::new(0),
            units: AtomicBool::new(false),
            started: Instant::now(),
            next_sink: AtomicU64::new(1),
            kernel_refused: AtomicU64::new(0),
            retired: (AtomicU64::new(0), AtomicU64::new(0)),
            runner,
            reactor: engine.reactor().clone(),
            source_reg: Mutex::new(None),
            threads: Mutex::new(Vec::new()),
            on_source_closed: Mutex::new(None),
            on_sink_failed: Mutex::new(None),
            kernel_fanout: match cfg_datapath {
                DataPath::Kernel => engine.kernel().ok(),
                _ => None,
            },
            kernel: KernelSinks::default(),
            rtp_video: std::sync::atomic::AtomicU8::new(0),
            ingest: Mutex::new(None),
            saw_parameter_sets: AtomicBool::new(false),
            vp9: Mutex::default(),
            keyframe_wanted: AtomicBool::new(false),
            keyframes_wanted: AtomicU64::new(0),
            layers: Mutex::new(Default::default()),
            meter: Mutex::new(Default::default()),
            arrival: Mutex::default(),
            egress: engine.egress().map(|e| {
                e.join(cfg_priority, cfg_reserve).unwrap_or_else(|err| {
                    // The control plane checks before it creates a session; a race lands here.
                    tracing::warn!(session = %cfg_name, "{err}: the session shares the egress unreserved");
                    e.join(cfg_priority, 0).expect("no reservation always fits")
                })
            }),
        });
        if let Runner::Thread(sig) = &inner.runner {
            let (weak, sig) = (Arc::downgrade(&inner), sig.clone());
            let t = std::thread::Builder::new()
                .name(format!("daemon-send-{}", inner.cfg.name))
                .spawn(move || daemon_sender(weak, sig))
                .expect("spawning a thread");
            inner.threads.lock().push(t);
        }
        Self { inner }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Whether `other` is this very session (not another of the same name made later).
    pub fn is(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    pub fn config(&self) -> &SessionConfig {
        &self.inner.cfg
    }

    /// Tells the session its RTP carries this video codec, so new sinks can start at a
    /// keyframe (`None`: not video, or unknown).
    /// Rewrites every packet the (user-space) source receives, in place, after it was
    /// judged: e.g. SRTP encryption once per packet for every sink, with the keyframe marks
    /// of the plaintext. The buffer is `max_datagram` long; the packet's length goes in, its
    /// new length comes out (`None` drops it, counted as malformed). Not for the `kernel`
    /// path, whose program sends what arrives.
    pub fn set_ingest(&self, f: impl FnMut(&mut [u8], usize) -> Option<usize> + Send + 'static) {
        *self.inner.ingest.lock() = Some(Box::new(f));
    }

    /// The codec of the session's RTP video, if known.
    pub fn rtp_video(&self) -> Option<fanout_proto::rtp::classify::RtpVideo> {
        self.inner.rtp_video()
    }

    pub fn set_rtp_video(&self, codec: Option<fanout_proto::rtp::classify::RtpVideo>) {
        use fanout_proto::{codec::annexb::Codec, rtp::classify::RtpVideo};
        let v = match codec {
            None => 0,
            Some(RtpVideo::Nal(Codec::H264)) => 1,
            Some(RtpVideo::Nal(Codec::H265)) => 2,
            Some(RtpVideo::Vp8) => 3,
            Some(RtpVideo::Vp9) => 4,
            Some(RtpVideo::Av1) => 5,
        };
        if self.inner.rtp_video.swap(v, Ordering::Relaxed) != v {
            self.inner.saw_parameter_sets.store(false, Ordering::Relaxed);
            // The program judges H.264/HEVC only (its layers); VP8/VP9 are not judged there.
            self.inner.kernel.set_codec(u32::from(if v <= 2 { v } else { 0 }));
        }
    }

    /// Called (from a data-plane thread) when a stream publisher goes away.
    pub fn on_source_closed(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.inner.on_source_closed.lock() = Some(Box::new(f));
    }

    /// Called (from a data-plane thread) when a TCP sink fails under `failed_sinks = "retry"`;
    /// reconnect and hand the new connection to [`Session::reattach_stream`].
    pub fn on_sink_failed(&self, f: impl Fn(u64, SocketAddr) + Send + Sync + 'static) {
        *self.inner.on_sink_failed.lock() = Some(Box::new(f));
    }

    /// Gives a retrying TCP sink its new connection. Returns `false` if the sink is gone (or
    /// not retrying), so the caller can stop.
    pub fn reattach_stream(&self, id: u64, stream: TcpStream) -> std::io::Result<bool> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Ok(false);
        }
        stream.set_nonblocking(true)?;
        let _ = stream.set_nodelay(true);
        for g in self.inner.groups.read().iter() {
            let mut st = g.state.lock();
            if let Some(sink) = st.sinks.iter_mut().find(|s| s.id == id) {
                let head = self.inner.ring.lock().head();
                return sink.reattach(stream, head, &self.inner.reactor, &g.task);
            }
        }
        Ok(false)
    }

    /// Starts receiving from a bound UDP socket.
    pub fn attach_udp(&self, sock: UdpSocket) -> std::io::Result<()> {
        let addr = sock.local_addr()?;
        if self.inner.cfg.datapath == DataPath::Kernel {
            let fanout =
                self.inner.kernel_fanout.as_ref().ok_or_else(|| {
                    std::io::Error::other("the kernel data path is unavailable (see the log for why)")
                })?;
            let mut k = fanout.open(addr).map_err(|e| std::io::Error::other(e.to_string()))?;
            k.set_codec(u32::from(self.inner.rtp_video.load(Ordering::Relaxed)));
            if self.inner.cfg.kernel_spread {
                k.spread().map_err(|e| std::io::Error::other(e.to_string()))?;
            }
            self.inner.kernel.attach(k);
        }
        *self.inner.source_kind.lock() = format!("udp {addr}");
        *self.inner.source_addr.lock() = Some(addr);
        self.attach(crate::source::SourceIo::Udp(sock))
    }

    /// Starts receiving from a connected stream publisher. Fails if one is already active.
    pub fn attach_stream(&self, stream: TcpStream) -> std::io::Result<()> {
        self.inner.src.publishers.fetch_add(1, Ordering::Relaxed);
        self.inner.src.connected.store(true, Ordering::Release);
        self.inner.src.state.store(SourceState::Waiting as u8, Ordering::Relaxed);
        self.attach(crate::source::SourceIo::Tcp(stream))
    }

    pub fn set_source_kind(&self, kind: String) {
        *self.inner.source_kind.lock() = kind;
    }

    /// Records the address a TCP source listens on.
    pub fn set_source_addr(&self, addr: SocketAddr) {
        *self.inner.source_addr.lock() = Some(addr);
    }

    /// Whether a stream publisher is connected now.
    pub fn source_connected(&self) -> bool {
        self.inner.src.connected.load(Ordering::Acquire)
    }

    fn attach(&self, io: crate::source::SourceIo) -> std::io::Result<()> {
        let inner = &self.inner;
        match &inner.runner {
            Runner::Thread(_) => {
                let weak = Arc::downgrade(inner);
                let t = std::thread::Builder::new()
                    .name(format!("daemon-recv-{}", inner.cfg.name))
                    .spawn(move || crate::source::daemon_receiver(weak, io))?;
                inner.threads.lock().push(t);
            }
            Runner::Engine(_) => {
                io.set_nonblocking()?;
                let job = crate::source::SourceJob::new(Arc::downgrade(inner) as _, io);
                let fd = job.watch_fd();
                if job.uses_uring() {
                    inner.source_kind.lock().push_str(" (io_uring multishot receive)");
                }
                let task = Task::new(inner.cfg.priority, inner.runner.clone(), Box::new(job));
                let reg = inner.reactor.register_source(fd, task.clone())?;
                *inner.source_reg.lock() = Some(reg);
                // Data may already be waiting (edge-triggered readiness would not report it).
                task.schedule();
            }
        }
        Ok(())
    }

    /// Starts the built-in looped, paced MPEG-TS source.
    pub fn attach_demo(&self, clip: crate::source::DemoClip) -> std::io::Result<()> {
        self.attach_clip(clip, "demo")
    }

    /// Starts a paced MPEG-TS recording (`what` names it in the status: "demo", "file x.ts").
    pub fn attach_clip(&self, clip: crate::source::DemoClip, what: &str) -> std::io::Result<()> {
        let (rate, laps) = (clip.bitrate() / 1000.0, if clip.once { "once" } else { "looped" });
        *self.inner.source_kind.lock() = format!("{what} ({rate:.0} kbit/s, {:.1} s, {laps})", clip.duration_s());
        let weak = Arc::downgrade(&self.inner);
        let t = std::thread::Builder::new()
            .name(format!("demo-{}", self.inner.cfg.name))
            .spawn(move || crate::source::demo_source(weak, clip))?;
        self.inner.threads.lock().push(t);
        Ok(())
    }

    /// Starts one RTP track of the demo clip (for RTSP clients), paced from `start`.
    pub fn attach_demo_track(&self, track: crate::source::DemoTrack, start: Instant) -> std::io::Result<()> {
        *self.inner.source_kind.lock() = format!("demo RTP track ({} Hz, looped)", track.clock);
        if track.codec.is_some() {
            self.set_rtp_video(track.codec.map(Into::into));
        }
        let weak = Arc::downgrade(&self.inner);
        let t = std::thread::Builder::new()
            .name(format!("demo-{}", self.inner.cfg.name))
            .spawn(move || crate::source::demo_track_source(weak, track, start))?;
        self.inner.threads.lock().push(t);
        Ok(())
    }

    /// Adds a UDP sink; returns its id.
    pub fn add_udp_sink(&self, to: SocketAddr) -> std::io::Result<u64> {
        self.add_udp_sink_from(to, false)
    }

    /// Adds a UDP sink sent from the shared source address ([`crate::set_udp_source`]: the
    /// RTSP server's address and `server_port`, which strict clients require); on the kernel
    /// path the program rewrites its clones' source address and port to it.
    pub fn add_udp_sink_from_shared_port(&self, to: SocketAddr) -> std::io::Result<u64> {
        self.add_udp_sink_from(to, true)
    }

    fn add_udp_sink_from(&self, to: SocketAddr, shared_port: bool) -> std::io::Result<u64> {
        let from = shared_port.then(crate::sink::udp_source).flatten().filter(|a| a.port() != 0);
        let id = self.inner.next_sink.fetch_add(1, Ordering::Relaxed);
        let offered = self.inner.kernel.offer(id, to, from, self.inner.cold_video());
        if let Some(Ok(())) = offered {
            return Ok(id);
        }
        if let Some(Err(e)) = offered {
            // Full maps (or a failed map write): this sink is served from user space.
            let why = format!("served from user space: {e}");
            // The first, then one line a thousand: tens of thousands of sinks past a full map
            // must not be as many log lines (each sink's status says why).
            let n = self.inner.kernel_refused.fetch_add(1, Ordering::Relaxed) + 1;
            if n == 1 || n.is_multiple_of(1000) {
                tracing::warn!(session = %self.inner.cfg.name, sink = %to, refused = n, "{why}");
            }
            let io = crate::sink::SinkIo::Unconnected(crate::sys::RawAddr::new(to));
            let how = Placement::udp(Start::Keyframe, shared_port);
            return self
                .inner
                .add_sink_with(id, SinkTarget::Udp(to), io, how, |s| s.carry(0, 0, 0, Instant::now(), why));
        }
        self.add_user_udp_sink(id, to, shared_port)
    }

    fn add_user_udp_sink(&self, id: u64, to: SocketAddr, shared_port: bool) -> std::io::Result<u64> {
        let sink_io = match (self.inner.cfg.datapath, self.inner.cfg.udp_sinks) {
            (DataPath::Shared, UdpSinkMode::Connected) | (DataPath::Uring, _) => {
                crate::sink::SinkIo::connected_udp(to, shared_port)?
            }
            _ => crate::sink::SinkIo::Unconnected(crate::sys::RawAddr::new(to)),
        };
        self.inner.add_sink_with(id, SinkTarget::Udp(to), sink_io, Placement::udp(Start::Keyframe, shared_port), |_| {})
    }

    /// Adds a connected TCP sink (`http` = an HTTP subscriber, who gets the bare payload).
    pub fn add_stream_sink(&self, stream: TcpStream, http: bool) -> std::io::Result<u64> {
        self.add_stream_sink_sized(stream, http, self.inner.stream_send_buffer())
    }

    /// [`Session::add_stream_sink`] with a send buffer of `send_buffer` bytes: a second of a
    /// stream whose rate another session measured (this one's new, its rate not yet known).
    pub fn add_stream_sink_sized(&self, stream: TcpStream, http: bool, send_buffer: usize) -> std::io::Result<u64> {
        let peer = stream.peer_addr()?;
        stream.set_nonblocking(true)?;
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(send_buffer);
        let target = if http { SinkTarget::Http(peer) } else { SinkTarget::Tcp(peer) };
        self.add_sink(target, crate::sink::SinkIo::Stream(stream), http)
    }

    /// The send buffer a stream subscriber's socket should have (see
    /// `Inner::stream_send_buffer`): for sockets the session does not own, such as an RTSP
    /// client's taking RTP interleaved.
    pub fn stream_send_buffer(&self) -> usize {
        self.inner.stream_send_buffer()
    }

    /// Adds a sink whose packets go into `queue` (shown as a TCP sink of `peer`, or an HTTP
    /// one: its reader sends the payloads, as an HTTPS subscriber's task does).
    pub fn add_channel_sink(
        &self,
        peer: SocketAddr,
        queue: Arc<crate::channel::ChannelQueue>,
        http: bool,
    ) -> std::io::Result<u64> {
        let target = if http { SinkTarget::Http(peer) } else { SinkTarget::Tcp(peer) };
        self.add_sink(target, crate::sink::SinkIo::Channel(queue), false)
    }

    /// Adds a sink of `peer` whose packets go into `queue` from the newest packet on, not
    /// from the ring's last keyframe: a WebRTC viewer switching to this session from another
    /// encoding of the same pictures, which waits for the next keyframe itself.
    pub fn add_live_channel_sink(
        &self,
        peer: SocketAddr,
        queue: Arc<crate::channel::ChannelQueue>,
    ) -> std::io::Result<u64> {
        let id = self.inner.next_sink.fetch_add(1, Ordering::Relaxed);
        let how = Placement { strip: false, start: Start::Head, shared_port: false };
        self.inner.add_sink_with(id, SinkTarget::Tcp(peer), crate::sink::SinkIo::Channel(queue), how, |_| {})
    }

    /// Adds an in-process subscriber (`what` names it in the status) whose packets go into
    /// `queue`: an output that transforms the stream reads the ring this way, sharing its
    /// buffers, with no socket between.
    pub fn add_local_sink(&self, what: &'static str, queue: Arc<crate::channel::ChannelQueue>) -> std::io::Result<u64> {
        self.add_sink(SinkTarget::Local(what), crate::sink::SinkIo::Channel(queue), false)
    }

    fn add_sink(&self, target: SinkTarget, io: crate::sink::SinkIo, strip: bool) -> std::io::Result<u64> {
        let id = self.inner.next_sink.fetch_add(1, Ordering::Relaxed);
        // A new sink starts at the last video keyframe still held, so a player shows a
        // picture at once; without one (or for non-TS media) it starts live.
        let how = Placement { strip, start: Start::Keyframe, shared_port: false };
        self.inner.add_sink_with(id, target, io, how, |_| {})
    }

    /// Where the session's sinks are: the kernel program's first (a sink it serves is not in
    /// user space), then the user-space groups.
    fn sink_sets(&self) -> [&dyn SinkSet; 2] {
        [&self.inner.kernel, &self.inner.groups]
    }

    /// Removes one sink. Returns whether it existed.
    pub fn remove_sink(&self, id: u64) -> bool {
        let Some((packets, bytes)) = self.sink_sets().iter().find_map(|set| set.remove(id)) else { return false };
        self.inner.retired.0.fetch_add(packets, Ordering::Relaxed);
        self.inner.retired.1.fetch_add(bytes, Ordering::Relaxed);
        true
    }

    /// Removes every sink (the Oslo proxy's Flush). Returns how many.
    pub fn remove_all_sinks(&self) -> usize {
        let mut removed = 0;
        for set in self.sink_sets() {
            let (n, packets, bytes) = set.clear();
            self.inner.retired.0.fetch_add(packets, Ordering::Relaxed);
            self.inner.retired.1.fetch_add(bytes, Ordering::Relaxed);
            removed += n;
        }
        removed
    }

    /// Caps the scalable layers a sink gets (`None` lifts the cap): a phone that wants the
    /// base layer only. The cap takes effect with the next packet; lifting it, at the next
    /// packet a decoder can switch up at.
    pub fn pin_sink_layers(&self, id: u64, pin: Option<Layer>) -> Result<(), LayerError> {
        if self.inner.video_codec().is_none() {
            return Err(LayerError::NotLayered);
        }
        self.sink_sets().iter().find_map(|set| set.pin(id, pin)).unwrap_or(Err(LayerError::NoSink))
    }

    /// A receiver report block about this session's stream from the subscriber of sink
    /// `id` (its cumulative loss): the sink's layer selector re-estimates. Returns whether
    /// the sink exists and adapts.
    pub fn sink_report(&self, id: u64, cumulative_lost: i32) -> bool {
        self.sink_feedback(id, crate::layered::Feedback::Lost(cumulative_lost))
    }

    /// A bandwidth estimate for the subscriber of sink `id` (bits per second, from its
    /// congestion feedback: a WebRTC viewer's): the sink gets the layers that fit in it.
    /// Returns whether the sink exists and adapts.
    pub fn sink_estimate(&self, id: u64, bps: f64) -> bool {
        self.sink_feedback(id, crate::layered::Feedback::Estimate(bps))
    }

    fn sink_feedback(&self, id: u64, feedback: crate::layered::Feedback) -> bool {
        if self.inner.video_codec().is_none() {
            return false;
        }
        let now = Instant::now();
        // A copy: the source thread takes this lock for every packet.
        let rates = self.inner.layers.lock().1.clone();
        self.sink_sets().iter().find_map(|set| set.report(id, feedback, &rates, now)).unwrap_or(false)
    }

    pub fn sink_status(&self, id: u64) -> Option<SinkStatus> {
        let head = self.inner.ring.lock().head();
        self.sink_sets().iter().find_map(|set| set.status(id, head))
    }

    pub fn sinks(&self) -> Vec<SinkStatus> {
        let head = self.inner.ring.lock().head();
        let mut v = Vec::new();
        for set in self.sink_sets() {
            set.statuses(head, &mut v);
        }
        v.sort_by_key(|s| s.id);
        v
    }

    /// The last keyframe the ring holds whole, as its packets (from its access unit's first
    /// through the one with the marker bit); empty if there is none.
    pub fn last_keyframe(&self) -> Vec<Vec<u8>> {
        /// More packets than any picture takes: something is wrong with the marker bits.
        const MOST: u64 = 4096;
        let ring = self.inner.ring.lock();
        let key = self.inner.last_key.load(Ordering::Relaxed);
        if key <= ring.oldest() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for seq in key - 1..ring.head().min(key - 1 + MOST) {
            let Some(p) = ring.get(seq) else { break };
            out.push(p.data().to_vec());
            if p.ends_access_unit() {
                return out;
            }
        }
        Vec::new()
    }

    /// The RTP header `(payload type, sequence number, timestamp)` of the packet a sink
    /// added now starts with: the last keyframe's if the ring holds one, else the newest
    /// packet's with the sequence number one on (the next to come). `None` before the first
    /// packet, or if the source is not RTP.
    pub fn rtp_start(&self) -> Option<(u8, u16, u32)> {
        let ring = self.inner.ring.lock();
        let head = ring.head();
        let key = self.inner.last_key.load(Ordering::Relaxed);
        let (seq, next) = if key > ring.oldest() { (key - 1, false) } else { (head.checked_sub(1)?, true) };
        let p = ring.get(seq)?;
        let v = fanout_proto::rtp::RtpView::parse(p.data()).ok()?;
        let mut ts = v.timestamp();
        // The next packet's time, where it is not here yet: for a stream that is not video,
        // the last step again (per AAC frame, where packets carry several, times the
        // newest's frames), so RTP-Info names what comes.
        if next && self.inner.rtp_video().is_none() {
            let prev = seq.checked_sub(1).and_then(|s| ring.get(s));
            let prev = prev.and_then(|p| {
                let pv = fanout_proto::rtp::RtpView::parse(p.data()).ok()?;
                Some((pv.ssrc(), pv.timestamp(), fanout_proto::codec::aac::hbr_frames(pv.payload())))
            });
            if let Some((_, t, frames)) = prev.filter(|(ssrc, ..)| *ssrc == v.ssrc()) {
                let step = ts.wrapping_sub(t);
                if step > 0 && step <= 90_000 {
                    ts = ts.wrapping_add(match (frames, fanout_proto::codec::aac::hbr_frames(v.payload())) {
                        (Some(m), Some(n)) => step / m as u32 * n as u32,
                        _ => step,
                    });
                }
            }
        }
        Some((v.payload_type(), v.sequence_number().wrapping_add(u16::from(next)), ts))
    }

    /// The first payload byte of each RTP packet the ring holds, newest last (at most `n`):
    /// what the control plane looks at to tell a codec nobody named.
    pub fn rtp_payload_heads(&self, n: usize) -> Vec<u8> {
        let ring = self.inner.ring.lock();
        let from = ring.head().saturating_sub(n as u64).max(ring.oldest());
        (from..ring.head())
            .filter_map(|i| ring.get(i))
            .filter_map(|p| fanout_proto::rtp::RtpView::parse(p.data()).ok().and_then(|v| v.payload().first().copied()))
            .collect()
    }

    /// A reader wants a keyframe (it lost a picture, or cannot start without one). Requests
    /// coalesce: the source's side takes them with `take_keyframe_request` when it can ask its
    /// sender (an RTSP upstream, a WHIP publisher), at its own pace.
    pub fn want_keyframe(&self) {
        self.inner.keyframes_wanted.fetch_add(1, Ordering::Relaxed);
        self.inner.keyframe_wanted.store(true, Ordering::Relaxed);
    }

    /// Whether a keyframe was wanted since the last call.
    pub fn take_keyframe_request(&self) -> bool {
        self.inner.keyframe_wanted.swap(false, Ordering::Relaxed)
    }

    /// Keyframe requests from readers since the session began.
    pub fn keyframes_wanted(&self) -> u64 {
        self.inner.keyframes_wanted.load(Ordering::Relaxed)
    }

    /// The SSRC of the newest packet. `None` before the first packet, or if the source is
    /// not RTP.
    pub fn rtp_ssrc(&self) -> Option<u32> {
        let ring = self.inner.ring.lock();
        let p = ring.get(ring.head().checked_sub(1)?)?;
        fanout_proto::rtp::RtpView::parse(p.data()).ok().map(|v| v.ssrc())
    }

    /// `(ssrc, RTP time now)` of an RTP stream of `clock` Hz, from its least-delayed packet
    /// of the last seconds, for sender reports where the source sends none.
    pub fn rtp_now(&self, clock: u32) -> Option<(u32, u32)> {
        self.inner.arrival.lock().rtp_now(clock, self.inner.now_ms())
    }

    pub fn source_state(&self) -> SourceState {
        let s = &self.inner.src;
        let state = match s.state.load(Ordering::Relaxed) {
            x if x == SourceState::Active as u8 => SourceState::Active,
            x if x == SourceState::Closed as u8 => SourceState::Closed,
            x if x == SourceState::Failed as u8 => SourceState::Failed,
            _ => SourceState::Waiting,
        };
        let last = s.last_ms.load(Ordering::Relaxed);
        if state == SourceState::Active && self.inner.now_ms() + 1 - last > 5000 {
            return SourceState::Silent;
        }
        state
    }

    pub fn status(&self) -> SessionStatus {
        let inner = &self.inner;
        let (used, head, cap) = {
            let r = inner.ring.lock();
            (r.len(), r.head(), r.capacity())
        };
        let sinks = self.sinks();
        let last = inner.src.last_ms.load(Ordering::Relaxed);
        SessionStatus {
            name: inner.cfg.name.clone(),
            priority: inner.cfg.priority.get(),
            datapath: inner.cfg.datapath,
            source: SourceStatus {
                kind: inner.source_kind.lock().clone(),
                addr: *inner.source_addr.lock(),
                state: self.source_state(),
                packets: inner.src.packets.load(Ordering::Relaxed),
                bytes: inner.src.bytes.load(Ordering::Relaxed),
                oversized: inner.src.oversized.load(Ordering::Relaxed),
                shed: inner.src.shed.load(Ordering::Relaxed),
                malformed: inner.src.malformed.load(Ordering::Relaxed),
                last_packet_ms_ago: (last > 0).then(|| (inner.now_ms() + 1).saturating_sub(last)),
                publishers: inner.src.publishers.load(Ordering::Relaxed),
                error: inner.source_error.lock().clone(),
            },
            ring_capacity: cap,
            ring_used: used,
            ring_head: head,
            sinks: sinks.len(),
            sinks_failed: sinks.iter().filter(|s| s.state == "failed").count(),
            groups: inner.groups.read().len(),
            packets_sent: sinks.iter().map(|s| s.packets_sent).sum(),
            bytes_sent: sinks.iter().map(|s| s.bytes_sent).sum(),
            delivered_packets_total: sinks.iter().map(|s| s.packets_sent).sum::<u64>()
                + inner.retired.0.load(Ordering::Relaxed),
            delivered_bytes_total: sinks.iter().map(|s| s.bytes_sent).sum::<u64>()
                + inner.retired.1.load(Ordering::Relaxed),
            packets_skipped: sinks.iter().map(|s| s.packets_skipped).sum(),
            kernel: inner.kernel.stats(),
            layers: self.layer_status(),
            pacing: self.inner.pace().map(|(p, _)| PaceStatus {
                sink_rate_bps: p.rate() * 8,
                burst_bytes: p.burst(),
                with: if self.inner.cfg.pacing.is_some_and(|c| c.txtime) { "txtime" } else { "clock" },
            }),
        }
    }

    /// The whole stream's rate (bits per second) if its video is layered (more than one
    /// operating point so far): what a subscriber that adapts to its link may drop down
    /// from. `None`: there is nothing to adapt.
    pub fn layered_bps(&self) -> Option<f64> {
        self.inner.video_codec()?;
        let mut l = self.inner.layers.lock();
        l.1.roll(self.inner.now_ms());
        let ladder = l.1.ladder();
        (ladder.len() > 1).then(|| l.1.cumulative(fanout_proto::rtp::adapt::ALL))
    }

    fn layer_status(&self) -> Option<LayerStatus> {
        let codec = match self.inner.video_codec()? {
            fanout_proto::codec::annexb::Codec::H264 => "h264",
            fanout_proto::codec::annexb::Codec::H265 => "h265",
        };
        let mut l = self.inner.layers.lock();
        l.1.roll(self.inner.now_ms());
        let rates = l.1.rates();
        Some(LayerStatus {
            codec,
            layers: rates.iter().filter_map(|(k, bps)| k.map(|layer| LayerRate { layer, bps: *bps })).collect(),
            not_layered_bps: l.1.rate(None),
            unknown_packets: l.0.unknown,
        })
    }

    /// Stops the source and every sink, and joins the session's own threads.
    pub fn close(&self) {
        let inner = &self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(reg) = inner.source_reg.lock().take() {
            inner.reactor.deregister(reg);
        }
        self.remove_all_sinks();
        inner.kernel.detach();
        if let Runner::Thread(sig) = &inner.runner {
            sig.raise();
        }
        let threads: Vec<_> = inner.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Where a new sink's cursor starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// At the newest packet.
    Head,
    /// At the last video keyframe the ring holds, else the newest packet.
    Keyframe,
    /// At the packet with this RTP sequence number (looked for from the oldest held on).
    RtpSeq(u16),
}

/// How a new sink is placed: whether it gets payloads without their RTP header (HTTP),
/// where its cursor starts, and whether it goes to a group sending from the shared port.
#[derive(Debug, Clone, Copy)]
struct Placement {
    strip: bool,
    start: Start,
    shared_port: bool,
}

impl Placement {
    fn udp(start: Start, shared_port: bool) -> Self {
        Self { strip: false, start, shared_port }
    }
}

/// The `daemon` baseline's send thread: runs every group of its session when woken.
fn daemon_sender(session: Weak<Inner>, sig: Arc<Signal>) {
    let mut ctx = WorkerCtx::default();
    let mut tasks: Vec<Arc<Task>> = Vec::new();
    loop {
        let woken = sig.wait(Duration::from_millis(100));
        let Some(s) = session.upgrade() else { return };
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        if !woken {
            continue;
        }
        tasks.clear();
        tasks.extend(s.groups.read().iter().map(|g| g.task.clone()));
        drop(s);
        for t in &tasks {
            while t.run_now(&mut ctx) {}
        }
    }
}
