//! The `kernel` data path: a TC program (bpf/fanout_fwd.bpf.c) clones each source datagram
//! to every UDP sink inside the kernel; user space only keeps the maps and reads counters.
//!
//! One program serves every session: `SESSIONS` maps a source address to a session index,
//! `NSINKS[index]` is how many sinks it has, and its sinks sit densely in `SINKS`, over
//! chunks named by `CHUNKS` (the layout is [`fanout_core::slots`]). The program is attached
//! to an interface's ingress while some session receives there, as a tcx link (kernel 6.6+):
//! links die with the process, so nothing outlives `fanout`, even a crash. On older kernels
//! it is a clsact filter, removed on exit and, if a crash left one, replaced at start.

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use aya::programs::tc::{self, SchedClassifierLinkId, TcAttachType};
use aya::programs::{ProgramError, SchedClassifier};
use aya::{Ebpf, EbpfLoader, Pod};
use fanout_core::slots::{ChunkPool, SessionSlots, SlotWrite, CHUNK_SINKS};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::time::Instant;

use crate::layered::{SinkLayerStatus, SinkLayers};
use fanout_proto::codec::layers::Layer;
use fanout_proto::rtp::adapt::LayerRates;

static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fanout_fwd.o"));
const PROGRAM_NAME: &str = "fanout_fwd";

/// Must match the program's constants.
const MAX_SESSIONS: u32 = 256;
const MAX_CHUNKS: usize = 1024;
const SINK_LOCAL: u16 = 1;
const SINK_REMOTE: u16 = 2;
const SINK_FALLBACK: u16 = 4;
const LOOPBACK_IFINDEX: u32 = 1;

/// Sink slots of the shared array (96 bytes each, and 4 for the layer cap: 6.25 MiB).
pub const DEFAULT_MAX_SINKS: usize = 1 << 16;

/// Sinks per session the kernel path can hold.
pub const MAX_SESSION_SINKS: usize = MAX_CHUNKS * CHUNK_SINKS;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct BpfKey {
    addr: u32,
    port: u16,
    pad: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct BpfSink {
    daddr: u32,
    dport: u16,
    state: u16,
    ifindex: u32,
    redirect_flags: u32,
    l2: [u8; 12],
    reason: i32,
    saddr: u32,
    /// Network order; the clones' source port (0: the relay's).
    sport: u16,
    /// Network order: with `REASON_AGGREGATE`, the RTP number of the first packet the
    /// program did not send it.
    handoff_seq: u16,
    /// The highest layer it gets now (packed, see [`pack`]; 0: all). The program's.
    allow: u32,
    /// Packets dropped on purpose, mod 2^16: what its RTP numbers go back by.
    seq_delta: u16,
    pad2: u16,
    resolved_ns: u64,
    packets: u64,
    bytes: u64,
    errors: u64,
    dropped: u64,
}

/// The program's per-session video state (`struct video`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct BpfVideo {
    codec: u32,
    prefix: u32,
    fu: [u32; 3],
    pad: u32,
    unknown: u64,
}

/// A session's pace for sinks behind one link (`struct pace`): bytes/s per sink (0: none)
/// and the link's burst, bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct BpfPace {
    rate: u64,
    burst: u64,
}

const LAYER_VALID: u32 = 1 << 31;
/// A sink's `allow` while it waits for its first IDR (bpf/fanout_fwd.bpf.c).
const LAYER_HOLD: u32 = 1 << 29;
/// In LAYER_REQ: take the allowance at once (lifts a hold that waited too long).
const LAYER_FORCE: u32 = 1 << 28;
/// How long a held kernel sink waits for an IDR before it gets the stream anyway (a stream
/// whose keyframes the program does not recognise must still play).
const HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// A layer as the program packs it: comparing packed layers compares (did, qid, tid).
fn pack(l: Layer) -> u32 {
    LAYER_VALID | u32::from(l.did) << 16 | u32::from(l.qid) << 8 | u32::from(l.tid)
}

fn unpack(v: u32) -> Option<Layer> {
    (v != 0 && v & LAYER_HOLD == 0).then_some(Layer { did: (v >> 16) as u8, qid: (v >> 8) as u8, tid: v as u8 })
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct BpfStats {
    packets: u64,
    bytes: u64,
    unhandled: u64,
    fallbacks: u64,
}

// SAFETY: plain `repr(C)` integers and arrays; the padding is explicit.
unsafe impl Pod for BpfKey {}
unsafe impl Pod for BpfSink {}
unsafe impl Pod for BpfStats {}
unsafe impl Pod for BpfVideo {}
unsafe impl Pod for BpfPace {}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The program cannot run here at all (not built, no privilege, verifier).
    #[error("the kernel data path is unavailable: {0}")]
    Unavailable(String),
    #[error("kernel data path: {0}")]
    Setup(String),
    #[error("kernel data path: {0}")]
    Full(#[from] fanout_core::slots::SlotError),
}

fn setup(what: &str, e: impl std::fmt::Display) -> KernelError {
    KernelError::Setup(format!("{what}: {e}"))
}

struct Maps {
    sessions: BpfHashMap<MapData, BpfKey, u32>,
    nsinks: Array<MapData, u32>,
    chunks: Array<MapData, u32>,
    sinks: Array<MapData, BpfSink>,
    stats: Array<MapData, BpfStats>,
    video: Array<MapData, BpfVideo>,
    /// Per sink slot: the layer cap its selector wants (packed; 0: none).
    layer_req: Array<MapData, u32>,
    /// Per session: the CPUs its fan-out is spread over (0: one).
    spread: Array<MapData, u32>,
    /// Per session: the pace of sinks behind one link (EDT stamps; rate 0: none).
    pace: Array<MapData, BpfPace>,
}

/// The program's `MAX_SPREAD`.
const MAX_SPREAD: u32 = 64;
const LO_RPS: &str = "/sys/class/net/lo/queues/rx-0/rps_cpus";
/// How often a spread session reads lo's settings again.
const SPREAD_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

struct State {
    ebpf: Ebpf,
    maps: Maps,
    pool: ChunkPool,
    free_sessions: Vec<u32>,
    /// Interface -> (link, sessions using it).
    attached: HashMap<String, (SchedClassifierLinkId, usize)>,
}

/// The loaded program and its maps, shared by every `kernel` session of the engine.
pub struct KernelFanout {
    state: Mutex<State>,
}

impl KernelFanout {
    /// Loads the program (not yet attached anywhere). `max_sinks` sizes the sink array
    /// (96 bytes each), shared by all sessions.
    pub fn load(max_sinks: usize) -> Result<Arc<Self>, KernelError> {
        if PROGRAM.is_empty() {
            return Err(KernelError::Unavailable(
                "fanout was built without clang, so without the eBPF program (install clang and rebuild)".into(),
            ));
        }
        let chunks = max_sinks.div_ceil(CHUNK_SINKS).max(1) as u32;
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("SINKS", chunks * CHUNK_SINKS as u32)
            .map_max_entries("LAYER_REQ", chunks * CHUNK_SINKS as u32)
            .load(PROGRAM)
            .map_err(|e| KernelError::Unavailable(explain_load(&format!("{e:?}"))))?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut(PROGRAM_NAME)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| KernelError::Unavailable("the object has no tc program".into()))?;
        prog.load().map_err(|e| KernelError::Unavailable(explain_program(e)))?;
        let mut take = |name: &str| ebpf.take_map(name).ok_or_else(|| setup("map missing", name));
        let maps = Maps {
            sessions: take("SESSIONS")?.try_into().map_err(|e| setup("SESSIONS", e))?,
            nsinks: take("NSINKS")?.try_into().map_err(|e| setup("NSINKS", e))?,
            chunks: take("CHUNKS")?.try_into().map_err(|e| setup("CHUNKS", e))?,
            sinks: take("SINKS")?.try_into().map_err(|e| setup("SINKS", e))?,
            stats: take("STATS")?.try_into().map_err(|e| setup("STATS", e))?,
            video: take("VIDEO")?.try_into().map_err(|e| setup("VIDEO", e))?,
            layer_req: take("LAYER_REQ")?.try_into().map_err(|e| setup("LAYER_REQ", e))?,
            spread: take("SPREAD")?.try_into().map_err(|e| setup("SPREAD", e))?,
            pace: take("PACE")?.try_into().map_err(|e| setup("PACE", e))?,
        };
        Ok(Arc::new(Self {
            state: Mutex::new(State {
                ebpf,
                maps,
                pool: ChunkPool::new(chunks),
                free_sessions: (0..MAX_SESSIONS).rev().collect(),
                attached: HashMap::new(),
            }),
        }))
    }

    /// Starts fanning out datagrams addressed to `addr` (the session's bound source).
    pub fn open(self: &Arc<Self>, addr: SocketAddr) -> Result<KernelSession, KernelError> {
        let SocketAddr::V4(addr) = addr else {
            return Err(setup("IPv6 sources are not supported", addr));
        };
        let ifaces = ingress_interfaces(*addr.ip())?;
        // A multicast group is the datagrams' destination; a wildcard bind (0) matches any.
        let key = BpfKey { addr: u32::from(*addr.ip()).to_be(), port: addr.port().to_be(), pad: 0 };
        let mut st = self.state.lock();
        let index = st.free_sessions.pop().ok_or_else(|| setup("too many sessions", MAX_SESSIONS))?;
        let opened = (|| {
            st.maps.nsinks.set(index, 0, 0).map_err(|e| setup("NSINKS", e))?;
            st.maps.stats.set(index, BpfStats::default(), 0).map_err(|e| setup("STATS", e))?;
            st.maps.video.set(index, BpfVideo::default(), 0).map_err(|e| setup("VIDEO", e))?;
            st.maps.spread.set(index, 0, 0).map_err(|e| setup("SPREAD", e))?;
            st.maps.pace.set(index, BpfPace::default(), 0).map_err(|e| setup("PACE", e))?;
            st.maps.sessions.insert(key, index, 0).map_err(|e| setup("SESSIONS", e))?;
            for (n, name) in ifaces.iter().enumerate() {
                if let Err(e) = st.attach(name) {
                    for done in &ifaces[..n] {
                        st.release(done);
                    }
                    let _ = st.maps.sessions.remove(&key);
                    return Err(e);
                }
            }
            Ok(())
        })();
        if let Err(e) = opened {
            st.free_sessions.push(index);
            return Err(e);
        }
        tracing::info!(%addr, ?ifaces, index, "kernel fan-out attached");
        Ok(KernelSession {
            fanout: self.clone(),
            index,
            key,
            ifaces,
            slots: SessionSlots::new(),
            targets: HashMap::new(),
            layers: HashMap::new(),
            seen_fallbacks: 0,
            holds: Default::default(),
            spread: None,
            pace: BpfPace::default(),
        })
    }
}

impl State {
    fn attach(&mut self, iface: &str) -> Result<(), KernelError> {
        if let Some((_, n)) = self.attached.get_mut(iface) {
            *n += 1;
            return Ok(());
        }
        let tcx = kernel_at_least(6, 6);
        if !tcx {
            // Netlink filters outlive their process: add the qdisc, drop a crashed run's filter.
            let _ = tc::qdisc_add_clsact(iface);
            if tc::qdisc_detach_program(iface, TcAttachType::Ingress, PROGRAM_NAME).is_ok() {
                tracing::warn!(iface, "replaced a stale fanout program left by an earlier run");
            }
        }
        let prog: &mut SchedClassifier =
            self.ebpf.program_mut(PROGRAM_NAME).and_then(|p| p.try_into().ok()).expect("loaded at start");
        let link = prog
            .attach(iface, TcAttachType::Ingress)
            .map_err(|e| setup(&format!("attaching to {iface} ingress"), explain_program(e)))?;
        self.attached.insert(iface.to_string(), (link, 1));
        Ok(())
    }

    fn release(&mut self, iface: &str) {
        let Some((_, n)) = self.attached.get_mut(iface) else { return };
        *n -= 1;
        if *n > 0 {
            return;
        }
        let (link, _) = self.attached.remove(iface).expect("present");
        let prog: &mut SchedClassifier =
            self.ebpf.program_mut(PROGRAM_NAME).and_then(|p| p.try_into().ok()).expect("loaded at start");
        if let Err(e) = prog.detach(link) {
            tracing::warn!(iface, "detaching the kernel fan-out: {e}");
        }
    }

    #[cfg(test)]
    fn pool_chunks(&self) -> u32 {
        self.maps.sinks.len() / CHUNK_SINKS as u32
    }

    fn apply(&mut self, index: u32, writes: &[SlotWrite], new: Option<&BpfSink>) -> Result<(), KernelError> {
        for w in writes {
            match *w {
                SlotWrite::Chunk { n, chunk } => self
                    .maps
                    .chunks
                    .set(index * MAX_CHUNKS as u32 + n as u32, chunk, 0)
                    .map_err(|e| setup("CHUNKS", e))?,
                SlotWrite::NewSink { slot } => {
                    self.maps.layer_req.set(slot, 0, 0).map_err(|e| setup("LAYER_REQ", e))?;
                    self.maps.sinks.set(slot, new.expect("a new sink's entry"), 0).map_err(|e| setup("SINKS", e))?
                }
                SlotWrite::Move { from, to } => {
                    let req = self.maps.layer_req.get(&from, 0).map_err(|e| setup("LAYER_REQ", e))?;
                    self.maps.layer_req.set(to, req, 0).map_err(|e| setup("LAYER_REQ", e))?;
                    let v = self.maps.sinks.get(&from, 0).map_err(|e| setup("SINKS", e))?;
                    self.maps.sinks.set(to, v, 0).map_err(|e| setup("SINKS", e))?
                }
                SlotWrite::Len(n) => self.maps.nsinks.set(index, n as u32, 0).map_err(|e| setup("NSINKS", e))?,
            }
        }
        Ok(())
    }
}

/// A sink's counters as the kernel keeps them.
#[derive(Debug, Clone)]
pub struct KernelSinkStats {
    pub id: u64,
    pub addr: SocketAddr,
    pub packets: u64,
    pub bytes: u64,
    pub errors: u64,
    pub added: Instant,
    /// Its layer adaptation, with the program's allowance and drop count.
    pub layers: Option<SinkLayerStatus>,
}

impl KernelSinkStats {
    fn of(id: u64, to: SocketAddrV4, added: Instant, v: &BpfSink, layers: Option<SinkLayerStatus>) -> Self {
        Self { id, addr: to.into(), packets: v.packets, bytes: v.bytes, errors: v.errors, added, layers }
    }
}

/// The program's reason for a capped sink that met an aggregation packet (see the program).
const REASON_AGGREGATE: i32 = 101;

/// A sink the kernel could not reach, or cannot serve as capped, handed to user space.
#[derive(Debug)]
pub struct Fallback {
    pub id: u64,
    pub addr: SocketAddr,
    pub reason: String,
    pub stats: KernelSinkStats,
    /// Its clones had a source port of their own (an RTSP client's `server_port`).
    pub own_sport: bool,
    /// Where user space takes over exactly: the RTP number of the first packet the program
    /// did not send, with the sink's layer adaptation (numbering continued). `None`: from the
    /// next packet published, afresh.
    pub(crate) handoff: Option<(u16, Box<SinkLayers>)>,
}

/// What the program counted for a session.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KernelSessionStats {
    pub interfaces: Vec<String>,
    /// Source datagrams the program fanned out.
    pub packets: u64,
    pub bytes: u64,
    /// Source datagrams it could not (IP options, fragments, GSO): no kernel sink got them.
    pub unhandled: u64,
    /// Sinks served by the kernel now.
    pub sinks: usize,
    /// With `pace_link = "shared"`: the rate per sink, bits/s, its clones' departure times
    /// are stamped by (held to where the egress qdisc is `fq`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stamped_rate_bps: Option<u64>,
}

/// One session's part of the kernel path. Dropping it detaches the session.
pub struct KernelSession {
    fanout: Arc<KernelFanout>,
    index: u32,
    key: BpfKey,
    ifaces: Vec<String>,
    slots: SessionSlots<u64>,
    targets: HashMap<u64, (SocketAddrV4, Instant)>,
    /// Sinks that adapt: their selectors (the program applies the switch points).
    layers: HashMap<u64, SinkLayers>,
    seen_fallbacks: u64,
    /// Held sinks (cold video) and when their hold is lifted regardless, oldest first.
    holds: std::collections::VecDeque<(u64, Instant)>,
    /// Spreading asked for: the CPUs it runs on now (1: back on the arriving CPU because lo
    /// no longer allows it), and when lo's settings were last read.
    spread: Option<(u32, Instant)>,
    /// The pace the program holds now (rate 0: none).
    pace: BpfPace,
}

impl KernelSession {
    /// Whether the kernel can serve a sink at `to` (IPv4 unicast); others stay in user space.
    pub fn serves(to: SocketAddr) -> bool {
        matches!(to, SocketAddr::V4(a) if !a.ip().is_multicast() && !a.ip().is_broadcast() && !a.ip().is_unspecified())
    }

    /// Adds a sink; `from`: the UDP source its clones carry (`None`: the relay's; an
    /// unspecified or IPv6 address there: the port only).
    /// `hold`: video with no keyframe at hand: the program sends it no media before an IDR.
    pub fn add(&mut self, id: u64, to: SocketAddr, from: Option<SocketAddr>, hold: bool) -> Result<(), KernelError> {
        let saddr = match from {
            Some(SocketAddr::V4(a)) if !a.ip().is_unspecified() => u32::from(*a.ip()).to_be(),
            _ => 0,
        };
        let SocketAddr::V4(to) = to else { return Err(setup("not an IPv4 sink", to)) };
        let local = to.ip().is_loopback() || UdpSocket::bind((*to.ip(), 0)).is_ok();
        let entry = BpfSink {
            daddr: u32::from(*to.ip()).to_be(),
            dport: to.port().to_be(),
            state: if local { SINK_LOCAL } else { SINK_REMOTE },
            ifindex: LOOPBACK_IFINDEX,
            // Through lo's transmit, so a clone keeps the original's route (a loopback
            // destination without one is a martian, unless route_localnet is set).
            redirect_flags: 0,
            sport: from.map_or(0, |a| a.port().to_be()),
            saddr,
            allow: if hold { LAYER_HOLD } else { 0 },
            ..Default::default()
        };
        let mut st = self.fanout.state.lock();
        let st = &mut *st;
        let writes = self.slots.push(id, &mut st.pool, MAX_CHUNKS, Instant::now())?;
        if let Err(e) = st.apply(self.index, &writes, Some(&entry)) {
            self.slots.remove(&id, &mut st.pool, Instant::now());
            return Err(e);
        }
        self.targets.insert(id, (to, Instant::now()));
        if hold {
            self.holds.push_back((id, Instant::now() + HOLD_MAX));
        }
        Ok(())
    }

    pub fn contains(&self, id: u64) -> bool {
        self.targets.contains_key(&id)
    }

    /// Removes a sink; returns the packets and bytes it was sent (for the session's totals),
    /// or `None` if it is not here.
    pub fn remove(&mut self, id: u64) -> Option<(u64, u64)> {
        let mut st = self.fanout.state.lock();
        let sent = self.entry(&st, id).map_or((0, 0), |(_, v)| (v.packets, v.bytes));
        let st = &mut *st;
        let writes = self.slots.remove(&id, &mut st.pool, Instant::now())?;
        if let Err(e) = st.apply(self.index, &writes, None) {
            tracing::error!(session = self.index, "removing a kernel sink: {e}");
        }
        self.targets.remove(&id);
        self.layers.remove(&id);
        Some(sent)
    }

    /// Tells the program which video codec the session's RTP carries (0: none, nothing is
    /// judged), and forgets its parser state.
    pub fn set_codec(&mut self, codec: u32) {
        let mut st = self.fanout.state.lock();
        let v = BpfVideo { codec, ..Default::default() };
        if let Err(e) = st.maps.video.set(self.index, v, 0) {
            tracing::error!(session = self.index, "setting the kernel path's codec: {e}");
        }
    }

    /// Paces the clones of each packet as sinks behind one link: `rate` bytes/s per sink,
    /// `burst` bytes back to back, by EDT departure times the egress qdisc (`fq`) holds the
    /// clones to; `None` stops it. Writes the map only when the pace changed.
    pub fn set_pace(&mut self, pace: Option<(u64, u64)>) {
        let (rate, burst) = pace.unwrap_or_default();
        let want = BpfPace { rate, burst };
        if want == self.pace {
            return;
        }
        match self.fanout.state.lock().maps.pace.set(self.index, want, 0) {
            Ok(()) => self.pace = want,
            Err(e) => tracing::error!(session = self.index, "setting the kernel path's pace: {e}"),
        }
    }

    /// Spreads the session's fan-out over the CPUs lo's receive steering (RPS) covers: its
    /// sinks split into one shard per CPU, each made by its CPU (see `SPREAD` in the
    /// program). The operator sets lo's `rps_cpus` to CPUs 0..n-1 (n ≥ 2), and lo's
    /// `accept_local` and `route_localnet`: a copy for another CPU has lost the sender's
    /// route, and its clones to local sinks are routed afresh, which lo refuses without them.
    /// Sessions with a video codec stay on one CPU. Returns the CPUs.
    pub fn spread(&mut self) -> Result<u32, KernelError> {
        let cpus = lo_allows_spreading()?;
        let mut st = self.fanout.state.lock();
        // The copies for other CPUs come in through lo.
        if !self.ifaces.iter().any(|i| i == "lo") {
            st.attach("lo")?;
            self.ifaces.push("lo".into());
        }
        st.maps.spread.set(self.index, cpus, 0).map_err(|e| setup("SPREAD", e))?;
        self.spread = Some((cpus, Instant::now()));
        tracing::info!(session = self.index, cpus, "kernel fan-out spread over CPUs");
        Ok(cpus)
    }

    /// Follows lo's settings after `spread`, reading them at most once a `SPREAD_RECHECK`:
    /// were RPS, `accept_local` or `route_localnet` turned off, the other CPUs' clones to
    /// local sinks would be dropped without a word, so the fan-out goes back to the arriving
    /// CPU until they are restored (over as many CPUs as RPS then covers).
    fn follow_lo(&mut self, now: Instant) {
        let Some((current, checked)) = self.spread else { return };
        if now.duration_since(checked) < SPREAD_RECHECK {
            return;
        }
        self.spread = Some((current, now));
        let allowed = lo_allows_spreading();
        let cpus = allowed.as_ref().map_or(1, |&n| n);
        if cpus == current {
            return;
        }
        if let Err(e) = self.fanout.state.lock().maps.spread.set(self.index, cpus, 0) {
            tracing::error!(session = self.index, "setting the kernel fan-out's CPUs: {e}");
            return;
        }
        self.spread = Some((cpus, now));
        match allowed {
            Ok(cpus) => {
                tracing::info!(session = self.index, cpus, "lo allows spreading again: kernel fan-out spread over CPUs")
            }
            Err(e) => tracing::warn!(session = self.index, "kernel fan-out back on one CPU until lo is set again: {e}"),
        }
    }

    /// A sink's entry and slot.
    fn entry(&self, st: &State, id: u64) -> Option<(u32, BpfSink)> {
        let slot = self.slots.slot_of(&id)?;
        Some((slot, st.maps.sinks.get(&slot, 0).ok()?))
    }

    /// Writes a sink's wanted cap for the program, which lowers at once and raises at a
    /// switch point.
    fn request(&mut self, id: u64) -> Result<(), KernelError> {
        let Some(l) = self.layers.get_mut(&id) else { return Ok(()) };
        let want = l.settle().map_or(0, pack);
        let mut st = self.fanout.state.lock();
        let (slot, _) = self.entry(&st, id).ok_or_else(|| setup("no such kernel sink", id))?;
        st.maps.layer_req.set(slot, want, 0).map_err(|e| setup("LAYER_REQ", e))
    }

    /// Caps a sink's layers (`None` lifts the cap).
    pub fn set_pin(&mut self, id: u64, pin: Option<Layer>) -> Result<(), KernelError> {
        self.adapt(id).ok_or_else(|| setup("no such kernel sink", id))?.set_pin(pin);
        self.request(id)
    }

    /// A sink's layer adaptation, started now if it was not.
    fn adapt(&mut self, id: u64) -> Option<&mut SinkLayers> {
        let added = self.targets.get(&id)?.1;
        Some(self.layers.entry(id).or_insert_with(|| SinkLayers::new(added)))
    }

    /// A receiver report for a sink (its cumulative loss); returns whether the sink exists.
    pub fn report(&mut self, id: u64, feedback: crate::layered::Feedback, rates: &LayerRates, now: Instant) -> bool {
        let Some((_, v)) = self.entry(&self.fanout.state.lock(), id) else { return false };
        let Some(l) = self.adapt(id) else { return false };
        l.on_feedback(feedback, v.packets, v.bytes, rates, now);
        if let Err(e) = self.request(id) {
            tracing::warn!(session = self.index, sink = id, "{e}");
        }
        true
    }

    /// Removes every sink; returns how many, and the packets and bytes they were sent.
    pub fn clear(&mut self) -> (usize, u64, u64) {
        let n = self.targets.len();
        let (packets, bytes) = self.sinks().iter().fold((0, 0), |(p, b), s| (p + s.packets, b + s.bytes));
        let mut st = self.fanout.state.lock();
        let _ = st.maps.nsinks.set(self.index, 0, 0);
        self.slots.clear(&mut st.pool, Instant::now());
        self.targets.clear();
        (n, packets, bytes)
    }

    pub fn sinks(&self) -> Vec<KernelSinkStats> {
        let st = self.fanout.state.lock();
        self.slots.iter().map(|(&id, slot)| self.sink_stats(&st, id, slot)).collect()
    }

    /// One sink's counters: one map read, however many sinks the session has (a sink added
    /// through the API answers with its status).
    pub fn sink(&self, id: u64) -> Option<KernelSinkStats> {
        let slot = self.slots.slot_of(&id)?;
        Some(self.sink_stats(&self.fanout.state.lock(), id, slot))
    }

    fn sink_stats(&self, st: &State, id: u64, slot: u32) -> KernelSinkStats {
        let v = st.maps.sinks.get(&slot, 0).unwrap_or_default();
        let (to, added) = self.targets[&id];
        let layers = self.layers.get(&id).map(|l| {
            let mut s = l.status();
            s.allowance = unpack(v.allow);
            s.packets_dropped = v.dropped;
            s
        });
        KernelSinkStats::of(id, to, added, &v, layers)
    }

    pub fn stats(&self) -> KernelSessionStats {
        let st = self.fanout.state.lock();
        let s = st.maps.stats.get(&self.index, 0).unwrap_or_default();
        KernelSessionStats {
            interfaces: self.ifaces.clone(),
            packets: s.packets,
            bytes: s.bytes,
            unhandled: s.unhandled,
            sinks: self.slots.len(),
            stamped_rate_bps: (self.pace.rate > 0).then_some(self.pace.rate * 8),
        }
    }

    /// Sinks the program gave up on since the last call (no route, no neighbour, ...): they
    /// leave the kernel's list and are returned for user space to serve. One map read when
    /// nothing changed.
    /// Lifts the holds that waited `HOLD_MAX` for an IDR: the sink gets what it asks for at
    /// once. Cheap when nothing is held (called for every published batch).
    fn lift_stale_holds(&mut self, now: Instant) {
        while let Some(&(id, _)) = self.holds.front().filter(|(_, due)| *due <= now) {
            self.holds.pop_front();
            let want = self.layers.get_mut(&id).and_then(|l| l.settle()).unwrap_or(fanout_proto::rtp::adapt::ALL);
            let mut st = self.fanout.state.lock();
            let Some((slot, _)) = self.entry(&st, id).filter(|(_, v)| v.allow & LAYER_HOLD != 0) else { continue };
            tracing::info!(
                session = self.index,
                sink = id,
                "no keyframe for {HOLD_MAX:?}: sending the stream as it comes"
            );
            if let Err(e) = st.maps.layer_req.set(slot, pack(want) | LAYER_FORCE, 0) {
                tracing::warn!(session = self.index, sink = id, "lifting a hold: {e}");
            }
        }
    }

    pub fn take_fallbacks(&mut self) -> Vec<Fallback> {
        let now = Instant::now();
        self.lift_stale_holds(now);
        self.follow_lo(now);
        let found: Vec<(u64, BpfSink)> = {
            let st = self.fanout.state.lock();
            let n = st.maps.stats.get(&self.index, 0).map(|s| s.fallbacks).unwrap_or(0);
            if n == self.seen_fallbacks {
                return Vec::new();
            }
            self.seen_fallbacks = n;
            self.slots
                .iter()
                .filter_map(|(&id, slot)| st.maps.sinks.get(&slot, 0).ok().map(|v| (id, v)))
                .filter(|(_, v)| v.state == SINK_FALLBACK)
                .collect()
        };
        found
            .into_iter()
            .filter_map(|(id, v)| {
                let (to, added) = *self.targets.get(&id)?;
                let layers = self.layers.remove(&id);
                self.remove(id);
                let stats = KernelSinkStats::of(id, to, added, &v, None);
                let (reason, handoff) = match (v.reason, layers) {
                    (REASON_AGGREGATE, layers) => {
                        let mut l = layers.unwrap_or_else(|| SinkLayers::new(added));
                        l.continue_numbering(v.seq_delta);
                        let why = "capped, and the stream carries aggregation packets: served from user space, which \
                                   rebuilds them without the layers above its cap";
                        (why.to_string(), Some((u16::from_be(v.handoff_seq), Box::new(l))))
                    }
                    (rc, _) => (fib_reason(rc), None),
                };
                Some(Fallback { id, addr: to.into(), reason, stats, own_sport: v.sport != 0, handoff })
            })
            .collect()
    }
}

/// A session's part of the kernel path once its source is bound (none before, and on every
/// other data path: then it holds no sink and the session's asks pass on to user space).
#[derive(Default)]
pub(crate) struct KernelSinks {
    session: Mutex<Option<KernelSession>>,
    /// Whether `session` is set: the publish path looks without taking the lock.
    attached: std::sync::atomic::AtomicBool,
}

impl KernelSinks {
    pub fn attach(&self, k: KernelSession) {
        *self.session.lock() = Some(k);
        self.attached.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Detaches the session from the program (and the program from idle interfaces).
    pub fn detach(&self) {
        self.attached.store(false, std::sync::atomic::Ordering::Release);
        drop(self.session.lock().take());
    }

    /// Offers the program a UDP sink: `None` if it does not serve that address (or the
    /// session is not on the kernel path), else whether it took it.
    pub fn offer(
        &self,
        id: u64,
        to: SocketAddr,
        from: Option<SocketAddr>,
        hold: bool,
    ) -> Option<Result<(), KernelError>> {
        let mut k = self.session.lock();
        Some(k.as_mut().filter(|_| KernelSession::serves(to))?.add(id, to, from, hold))
    }

    /// The sinks the program gave up on (see [`KernelSession::take_fallbacks`]).
    pub fn take_fallbacks(&self) -> Vec<Fallback> {
        if !self.attached.load(std::sync::atomic::Ordering::Acquire) {
            return Vec::new(); // no lock on the publish path of other sessions
        }
        self.session.lock().as_mut().map(|k| k.take_fallbacks()).unwrap_or_default()
    }

    pub fn set_codec(&self, codec: u32) {
        if let Some(k) = self.session.lock().as_mut() {
            k.set_codec(codec);
        }
    }

    pub fn stats(&self) -> Option<KernelSessionStats> {
        self.session.lock().as_ref().map(|k| k.stats())
    }

    /// See [`KernelSession::set_pace`]; nothing without a kernel session.
    pub fn set_pace(&self, pace: Option<(u64, u64)>) {
        if !self.attached.load(std::sync::atomic::Ordering::Acquire) {
            return; // no lock on the publish path of other sessions
        }
        if let Some(k) = self.session.lock().as_mut() {
            k.set_pace(pace);
        }
    }

    /// Runs `f` on the kernel session, if the session has one.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut KernelSession) -> R) -> Option<R> {
        self.session.lock().as_mut().map(f)
    }

    /// Runs `f` on the kernel session if it serves sink `id`.
    pub(crate) fn with_sink<R>(&self, id: u64, f: impl FnOnce(&mut KernelSession) -> R) -> Option<R> {
        self.session.lock().as_mut().filter(|k| k.contains(id)).map(f)
    }
}

impl Drop for KernelSession {
    fn drop(&mut self) {
        let mut st = self.fanout.state.lock();
        let _ = st.maps.sessions.remove(&self.key);
        let _ = st.maps.nsinks.set(self.index, 0, 0);
        self.slots.clear(&mut st.pool, Instant::now());
        for iface in &self.ifaces {
            st.release(iface);
        }
        st.free_sessions.push(self.index);
    }
}

/// The CPUs lo lets a session's fan-out spread over: its RPS covers CPUs 0..n-1 (n ≥ 2),
/// and `accept_local` and `route_localnet` let a copy's clones reach local sinks. Else why
/// not, with the command that fixes it.
fn lo_allows_spreading() -> Result<u32, KernelError> {
    let mask = std::fs::read_to_string(LO_RPS).map_err(|e| setup(&format!("reading {LO_RPS}"), e))?;
    let cpus = rps_cpus(&mask).ok_or_else(|| {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get()).min(MAX_SPREAD as usize);
        let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
        setup(
            "kernel_spread needs lo's receive steering (RPS) over CPUs 0..n-1, n ≥ 2, e.g. all of them",
            format!("echo {all:x} > {LO_RPS} (it is {:?})", mask.trim()),
        )
    })?;
    for knob in ["accept_local", "route_localnet"] {
        let path = format!("/proc/sys/net/ipv4/conf/lo/{knob}");
        if !std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == "1") {
            return Err(setup(
                "kernel_spread: another CPU's clones to local sinks are routed afresh, which lo refuses without",
                format!("sysctl -w net.ipv4.conf.lo.{knob}=1"),
            ));
        }
    }
    Ok(cpus)
}

/// The number of CPUs an RPS mask (hex, comma-separated 32-bit words) names if they are
/// 0..n-1 with 2 ≤ n ≤ MAX_SPREAD: the program maps shard k to the kth CPU of the mask.
fn rps_cpus(mask: &str) -> Option<u32> {
    let hex: String = mask.trim().chars().filter(|c| *c != ',').collect();
    let bits = u128::from_str_radix(hex.trim_start_matches('0'), 16).ok()?;
    let n = bits.count_ones();
    ((2..=MAX_SPREAD).contains(&n) && bits == (1u128 << n) - 1).then_some(n)
}

/// Why `bpf_fib_lookup` could not give a next hop, in words.
fn fib_reason(rc: i32) -> String {
    let why = match rc {
        1 => "the route is a blackhole",
        2 => "the destination is unreachable",
        3 => "the route is prohibited",
        4 => "it is not forwarded (not a unicast route)",
        5 => "forwarding is disabled on the source's interface (net.ipv4.conf.<if>.forwarding)",
        6 => "the interface does not support the lookup",
        7 => "no neighbour entry yet",
        8 => "the packet is larger than the route's MTU",
        100 => "a loopback sink of a source that arrives on another interface: set net.ipv4.conf.lo.route_localnet=1",
        _ => "the lookup failed",
    };
    format!("served from user space: the kernel path cannot reach it ({why}, fib code {rc})")
}

/// The interfaces where datagrams to `ip` arrive.
fn ingress_interfaces(ip: Ipv4Addr) -> Result<Vec<String>, KernelError> {
    if ip.is_loopback() {
        return Ok(vec!["lo".into()]);
    }
    let all = ipv4_interfaces().map_err(|e| setup("listing interfaces", e))?;
    let mut names: Vec<String> =
        all.into_iter().filter(|(_, a)| ip.is_unspecified() || ip.is_multicast() || *a == ip).map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(setup("no interface has the source address", ip));
    }
    Ok(names)
}

fn ipv4_interfaces() -> std::io::Result<Vec<(String, Ipv4Addr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned; entries stay valid until freeifaddrs.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() && i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET {
            // SAFETY: AF_INET entries hold a sockaddr_in; ifa_name is a C string.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
            out.push((name, Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
        }
        p = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(rel) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else { return false };
    let mut it = rel.trim().split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u32>().ok());
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

fn explain_load(e: &str) -> String {
    if e.contains("Operation not permitted") || e.contains("EPERM") {
        format!("loading eBPF needs CAP_BPF and CAP_NET_ADMIN (run fanout as root): {e}")
    } else {
        e.to_string()
    }
}

fn explain_program(e: ProgramError) -> String {
    match e {
        ProgramError::LoadError { io_error, verifier_log } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            explain_load(&format!("the kernel's verifier rejected the program ({io_error}): {}", tail.join(" | ")))
        }
        e => explain_load(&e.to_string()),
    }
}

/// Whether a local program named like ours is attached to `iface`'s ingress (tcx), for tests
/// and the start-up check.
pub fn attached_to(iface: &str) -> Result<usize, String> {
    let (_, progs) = SchedClassifier::query_tcx(iface, TcAttachType::Ingress).map_err(|e| e.to_string())?;
    Ok(progs.iter().filter(|p| p.name_as_str() == Some(PROGRAM_NAME)).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loading (not attaching) touches no interface: it checks that the verifier accepts the
    /// program on this kernel.
    #[test]
    fn the_verifier_accepts_the_program() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("\n*** SKIPPED the_verifier_accepts_the_program: loading eBPF needs root ***\n");
            return;
        }
        if PROGRAM.is_empty() {
            panic!("built without clang: the eBPF program was not compiled");
        }
        let k = KernelFanout::load(1000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.state.lock().pool_chunks(), 4);
    }

    /// Spreading maps shard k to the kth CPU of lo's RPS mask: only masks of CPUs 0..n-1 do.
    #[test]
    fn rps_masks_of_the_first_cpus_are_spread_over() {
        assert_eq!(rps_cpus("3\n"), Some(2));
        assert_eq!(rps_cpus("000000ff"), Some(8));
        assert_eq!(rps_cpus("00000000,ffffffff"), Some(32));
        assert_eq!(rps_cpus("ffffffff,ffffffff"), Some(64));
        for refused in ["0", "1", "6", "5", "", "zz", "1,ffffffff,ffffffff"] {
            assert_eq!(rps_cpus(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn fib_codes_read_as_words() {
        assert!(fib_reason(7).contains("no neighbour"));
        assert!(fib_reason(99).contains("fib code 99"));
    }
}
