//! A session's vocabulary: how it is set up (data path, payload, failure policy, config) and
//! what it reports (its status, its sinks'). Below everything that drives sessions, so that
//! the sinks, senders and groups can name these types without importing the session.

use crate::kernel::KernelSessionStats;
use fanout_core::Priority;
use fanout_proto::codec::layers::Layer;
use serde::Serialize;
use std::net::SocketAddr;
use std::time::Duration;

/// How a session moves packets from its source to its sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DataPath {
    /// One receive and one send thread per session, copy + send per packet per sink.
    Daemon,
    /// Worker pool, copy + send per packet per sink (OMSS-M).
    Copy,
    /// Worker pool with payload sharing and batched sends (OMSS).
    #[default]
    Shared,
    /// Worker pool with payload sharing, UDP sends through io_uring.
    Uring,
    /// A TC eBPF program clones each datagram to every IPv4 UDP sink in the kernel; other
    /// sinks (TCP, HTTP, IPv6, multicast, unreachable from the kernel) are served as `shared`.
    Kernel,
}

/// What the source carries, for HTTP subscribers (who get the bare payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PayloadMode {
    /// Strip a valid RTP header, deliver anything else whole.
    #[default]
    Auto,
    /// Every datagram must be RTP; others are counted as malformed and dropped.
    Rtp,
    /// Deliver every datagram whole.
    Raw,
}

/// What happens to a sink that failed (ICMP unreachable, reset, client gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Keep it listed as failed, with the reason, until it is deleted. A UDP sink is not
    /// failed by an ICMP error (its receiver may be rebooting): it is sent to on, with its
    /// errors counted and the last one shown.
    #[default]
    Keep,
    /// Remove it at once.
    Remove,
    /// Keep trying: a UDP sink keeps being sent to (errors are counted), a TCP sink is
    /// reconnected with backoff (what it missed meanwhile is counted as skipped). HTTP
    /// subscribers that left are removed whatever the policy.
    Retry,
}

/// How the `shared` path sends to UDP sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum UdpSinkMode {
    /// One `sendmmsg` per group run covering every sink of the group (and every pending
    /// packet), from the group's socket, straight from the ring.
    #[default]
    Batched,
    /// A connected socket per sink, one `send` per packet (a backlog goes in one `sendmmsg`).
    Connected,
}

/// How a UDP source is received (engine paths; `daemon` always blocks in `recv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SourceRecv {
    /// `recvmmsg`, up to 32 datagrams per call, when the reactor reports the socket readable
    /// (the default everywhere: it measured cheaper, docs/BENCHMARKS.md).
    #[default]
    Recvmmsg,
    /// A multishot io_uring `recv` with provided buffers: no system call per batch.
    Uring,
}

#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub name: String,
    pub priority: Priority,
    pub datapath: DataPath,
    pub ring_capacity: usize,
    pub max_datagram: usize,
    pub sinks_per_group: usize,
    pub payload: PayloadMode,
    pub failed_sinks: FailurePolicy,
    pub udp_sinks: UdpSinkMode,
    /// `uring` path: let a kernel thread poll the submission queue (SQPOLL).
    pub uring_sqpoll: bool,
    /// `kernel` path: spread the fan-out over the CPUs lo's RPS covers
    /// ([`KernelSession::spread`]).
    pub kernel_spread: bool,
    /// `shared`, `uring`, `kernel`: TCP/HTTP sinks are written at most once per this
    /// interval, everything pending in one vectored write (zero: at every packet).
    pub stream_flush: Duration,
    /// UDP source receive.
    pub source_recv: SourceRecv,
    /// Paced egress (`None`: every sink is sent all it is owed at once).
    pub pacing: Option<PaceConfig>,
    /// Bytes per second of the shared egress reserved for this session, all its sinks
    /// together (0: none; see [`crate::EngineOptions::egress_rate`]).
    pub reserve: u64,
}

/// How a session paces its sinks (see [`fanout_core::pace`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceConfig {
    /// The stream's rate in bytes per second; `None`: measured from the source.
    pub rate: Option<u64>,
    /// Bytes a sink may get back to back; `None`: the largest picture seen, whole.
    pub burst: Option<u64>,
    /// A sink's rate as a multiple of the stream's (≥ 1): how fast a new or lapped sink
    /// catches up.
    pub catchup: f64,
    /// The sinks share a link: a group's sinks are paced together too, never faster than
    /// the sum of their rates (and one burst), so their copies of a packet do not all reach
    /// the link's queue at once (the Oslo thesis's burst loss; Yau & Lam's rate control
    /// over a shared output).
    pub shared_link: bool,
    /// Paced datagrams to UDP sinks of the group's socket are handed to the kernel up to
    /// [a window](crate::due) early, each stamped with its departure time (`SO_TXTIME`,
    /// CLOCK_MONOTONIC), instead of being held back here: the `fq` qdisc on the egress holds
    /// them (without fq they leave at once). Fewer wake-ups for the same pace.
    pub txtime: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceState {
    /// Nothing received yet, or no publisher connected.
    Waiting,
    Active,
    /// Nothing received for a while.
    Silent,
    /// The publisher closed its connection.
    Closed,
    Failed,
}

#[derive(Debug, Clone, Serialize)]
pub struct SourceStatus {
    pub kind: String,
    /// The local address the source receives on (UDP) or listens on (TCP), once bound: ask
    /// for port 0 and read the port here.
    pub addr: Option<SocketAddr>,
    pub state: SourceState,
    pub packets: u64,
    pub bytes: u64,
    /// Datagrams larger than `max_datagram`, dropped.
    pub oversized: u64,
    /// Dropped on arrival while the relay was overloaded and the session's class was shed
    /// (see `shed_after_ms`).
    pub shed: u64,
    /// Datagrams that were empty or (with `payload = "rtp"`) not RTP, dropped.
    pub malformed: u64,
    pub last_packet_ms_ago: Option<u64>,
    pub publishers: u64,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SessionStatus {
    pub name: String,
    pub priority: u8,
    pub datapath: DataPath,
    pub source: SourceStatus,
    pub ring_capacity: usize,
    pub ring_used: usize,
    pub ring_head: u64,
    pub sinks: usize,
    pub sinks_failed: usize,
    pub groups: usize,
    /// Sent to the sinks it has now.
    pub packets_sent: u64,
    pub bytes_sent: u64,
    /// Sent to every sink it ever had, removed ones too.
    pub delivered_packets_total: u64,
    pub delivered_bytes_total: u64,
    pub packets_skipped: u64,
    /// The `kernel` path's own counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelSessionStats>,
    /// RTP video of a known codec: the rate of each scalable layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<LayerStatus>,
    /// The pace its sinks are held to, once its rate is known (sessions that pace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pacing: Option<PaceStatus>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PaceStatus {
    /// A sink's rate: the stream's times `pace_catchup`, bits per second.
    pub sink_rate_bps: u64,
    /// Bytes a sink may get back to back.
    pub burst_bytes: u64,
    /// What holds a paced packet until it may leave: `clock` (the relay) or `txtime` (its
    /// departure time, for the fq qdisc).
    pub with: &'static str,
}

/// Per-layer rates: moving averages over 200 ms windows, `new = (15·old + sample)/16`.
#[derive(Debug, Clone, Serialize)]
pub struct LayerStatus {
    pub codec: &'static str,
    pub layers: Vec<LayerRate>,
    /// What every subscriber gets (parameter sets, SEI, ...), bits per second.
    pub not_layered_bps: f64,
    /// Packets whose layer could not be judged (see docs/layers.md): forwarded, counted.
    pub unknown_packets: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LayerRate {
    #[serde(flatten)]
    pub layer: Layer,
    pub bps: f64,
}

/// Why a sink's layers cannot be capped.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("no such sink")]
    NoSink,
    #[error("the session carries no layered video (set its `video` codec)")]
    NotLayered,
    #[error("layers can be capped for RTP datagram sinks only (UDP, RTSP), not TCP or HTTP streams")]
    NotRtp,
    #[error("the kernel path refused: {0}")]
    Kernel(String),
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SinkTarget {
    Udp(SocketAddr),
    Tcp(SocketAddr),
    Http(SocketAddr),
    /// An in-process subscriber: a repackaging, an SRTP key epoch (what it is).
    Local(&'static str),
}

#[derive(Debug, Clone, Serialize)]
pub struct SinkStatus {
    pub id: u64,
    #[serde(flatten)]
    pub target: SinkTarget,
    pub packets_sent: u64,
    pub bytes_sent: u64,
    /// Packets skipped by slowest-sink-drop.
    pub packets_skipped: u64,
    /// Video packets a new sink was not sent because they came before any keyframe it could
    /// start decoding at (a cold start).
    #[serde(skip_serializing_if = "is_zero")]
    pub packets_before_keyframe: u64,
    /// Packets published that this sink has not been handed yet.
    pub lag: u64,
    /// `active`, `failed`, or `retrying` (a TCP sink being reconnected).
    pub state: &'static str,
    /// Why it failed; with `failed_sinks = "retry"`, the last error.
    pub reason: Option<String>,
    /// Send errors seen (ICMP unreachable, resets).
    pub errors: u64,
    pub age_ms: u64,
    /// Who sends to it: `kernel` (the eBPF program) or `user` (the engine's workers).
    pub path: &'static str,
    /// Its layer adaptation, once a pin or a receiver report started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<crate::layered::SinkLayerStatus>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
