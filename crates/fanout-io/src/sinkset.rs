//! The two ways a session's sinks are served, behind one interface: the user-space sink groups
//! ([`crate::group::UserGroups`]) and the `kernel` program's maps
//! ([`crate::kernel::KernelSinks`]). A session asks each set in turn, the kernel's first (a
//! sink it serves is not in user space), so it never branches on its data path.

use crate::kernel::{KernelSinkStats, KernelSinks};
use crate::layered::Feedback;
use crate::model::{LayerError, SinkStatus, SinkTarget};
use fanout_proto::codec::layers::Layer;
use fanout_proto::rtp::adapt::LayerRates;
use std::time::Instant;

pub(crate) trait SinkSet: Send + Sync {
    /// Removes sink `id`; the packets and bytes it was sent, if it was here.
    fn remove(&self, id: u64) -> Option<(u64, u64)>;
    /// Removes every sink: how many, and the packets and bytes they were sent.
    fn clear(&self) -> (usize, u64, u64);
    /// Caps sink `id`'s scalable layers (`None` lifts the cap); `None` if it is not here.
    fn pin(&self, id: u64, pin: Option<Layer>) -> Option<Result<(), LayerError>>;
    /// Feedback from sink `id`'s subscriber: whether the sink adapts, `None` if it is not
    /// here.
    fn report(&self, id: u64, feedback: Feedback, rates: &LayerRates, now: Instant) -> Option<bool>;
    /// Sink `id`'s status (`head`: the ring's head, for its lag), if it is here.
    fn status(&self, id: u64, head: u64) -> Option<SinkStatus>;
    /// Every sink's status, appended to `out`.
    fn statuses(&self, head: u64, out: &mut Vec<SinkStatus>);
}

/// The kernel program's sinks (here rather than in `kernel`, which `model` names: the
/// statuses are `model`'s).
impl SinkSet for KernelSinks {
    fn remove(&self, id: u64) -> Option<(u64, u64)> {
        self.with(|k| k.remove(id)).flatten()
    }

    fn clear(&self) -> (usize, u64, u64) {
        self.with(|k| k.clear()).unwrap_or((0, 0, 0))
    }

    fn pin(&self, id: u64, pin: Option<Layer>) -> Option<Result<(), LayerError>> {
        self.with_sink(id, |k| k.set_pin(id, pin).map_err(|e| LayerError::Kernel(e.to_string())))
    }

    fn report(&self, id: u64, feedback: Feedback, rates: &LayerRates, now: Instant) -> Option<bool> {
        self.with_sink(id, |k| k.report(id, feedback, rates, now))
    }

    fn status(&self, id: u64, _head: u64) -> Option<SinkStatus> {
        self.with_sink(id, |k| k.sink(id).map(kernel_sink_status)).flatten()
    }

    fn statuses(&self, _head: u64, out: &mut Vec<SinkStatus>) {
        out.extend(self.with(|k| k.sinks()).unwrap_or_default().into_iter().map(kernel_sink_status));
    }
}

/// A kernel sink as the session shows every sink (the program keeps no lag or skip counts).
fn kernel_sink_status(k: KernelSinkStats) -> SinkStatus {
    SinkStatus {
        packets_before_keyframe: 0,
        id: k.id,
        target: SinkTarget::Udp(k.addr),
        packets_sent: k.packets,
        bytes_sent: k.bytes,
        packets_skipped: 0,
        lag: 0,
        state: "active",
        reason: None,
        errors: k.errors,
        age_ms: k.added.elapsed().as_millis() as u64,
        path: "kernel",
        layers: k.layers,
    }
}
