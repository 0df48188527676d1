//! The data paths and the engine of `fanout`: sockets, worker threads, batching.
//!
//! ```text
//!  reactor thread (epoll)          worker threads (one per core)
//!  ─ source readable ──schedule──▶ class queues ──▶ source task: recvmmsg into pool
//!                                  (strict prio)      buffers, publish to SessionRing,
//!  ─ sink writable ────schedule──▶                    schedule the session's groups
//!                                               ──▶ sink-group task: snapshot pending
//!                                                   ring entries (refcounts, no copy),
//!                                                   send them to each sink of the group
//! ```
//!
//! A session's data path decides who runs these tasks and how a group sends:
//! - [`DataPath::Daemon`]: the paper's baseline: one receive thread and one send thread per
//!   session, a user-space copy and one `sendto`/`send` per packet per sink;
//! - [`DataPath::Copy`]: the worker pool, but still a copy and a send call per packet per sink;
//! - [`DataPath::Shared`]: the worker pool with payload sharing: every sink sends straight from
//!   the ring's buffer, UDP sinks on their own connected socket with `sendmmsg` for a backlog,
//!   stream sinks with one vectored `sendmsg` for everything pending;
//! - [`DataPath::Uring`]: the worker pool with io_uring: one `IORING_OP_SEND` per packet per
//!   UDP sink on its connected socket, all submitted with one call (none with SQPOLL).
//!
//! Invariants: a packet is written into memory once (by the kernel, on receive); a task runs
//! on one worker at a time; lock order is group → ring; the reactor never does I/O.

pub mod channel;
mod due;
pub mod engine;
mod group;
pub mod gso;
pub mod inlet;
pub mod kernel;
pub mod layered;
pub mod model;
pub mod packet;
pub mod reactor;
mod send;
pub mod session;
mod sink;
mod sinkset;
mod source;
pub mod sys;
mod uring;

pub use engine::{Engine, EngineOptions};
pub use inlet::Inlet;
pub use session::{
    DataPath, FailurePolicy, LayerRate, LayerStatus, PaceConfig, PayloadMode, Session, SessionConfig, SessionStatus,
    SinkStatus, SinkTarget, SourceRecv, SourceState, SourceStatus, UdpSinkMode,
};
pub use sink::set_udp_source;
pub use source::{bind_udp_source, DemoClip, DemoTrack};
pub use sys::ThreadPriority;

/// The bundled demo clip: an H.264 test pattern with a tone, MPEG-TS at ~340 kbit/s
/// (`docs/ARCHITECTURE.md`, "The demo clip", says how it was made).
pub static DEMO_TS: &[u8] = include_bytes!("../../../assets/demo.ts");
