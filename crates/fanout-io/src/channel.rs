//! A sink whose packets go into a queue that another task drains: for subscribers whose
//! socket a protocol task owns, such as RTSP clients taking RTP interleaved on their RTSP
//! connection (their responses and the `$` frames must come from one writer, or a frame
//! could be split by a response). The queue holds the ring's packets themselves (payload
//! sharing, no copy) and is bounded: a client that cannot keep up loses packets, counted,
//! and never holds back the others.

use crate::packet::Packet;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

type Wake = Box<dyn Fn() + Send + Sync>;

/// A queued packet and, for a sink that drops layers, the sequence number it goes out with.
pub type Frame = (Arc<Packet>, Option<u16>);

pub struct ChannelQueue {
    q: Mutex<VecDeque<Frame>>,
    cap: usize,
    dropped: AtomicU64,
    wake: Wake,
}

impl ChannelQueue {
    /// `wake` is called (from an engine worker) when packets were added.
    pub fn new(cap: usize, wake: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            q: Mutex::new(VecDeque::new()),
            cap: cap.max(1),
            dropped: AtomicU64::new(0),
            wake: Box::new(wake),
        })
    }

    /// Queues what fits; the rest is dropped and counted.
    pub(crate) fn push(&self, pending: &[Arc<Packet>]) {
        self.push_frames(pending.iter().map(|p| (p.clone(), None)));
    }

    /// Queues the packets `decide` keeps, with the sequence number it gives them; returns
    /// the bytes kept.
    /// `decide`: the sink's sequence number for a packet it keeps, and the packet rebuilt for
    /// it if it is (see [`crate::layered::SinkLayers::rebuild`]).
    pub(crate) fn push_layered(
        &self,
        pending: &[Arc<Packet>],
        mut decide: impl FnMut(&Packet) -> Option<(u16, Option<Arc<Packet>>)>,
    ) -> u64 {
        let mut bytes = 0;
        self.push_frames(pending.iter().filter_map(|p| {
            let (seq, rebuilt) = decide(p)?;
            let p = rebuilt.unwrap_or_else(|| p.clone());
            bytes += p.len() as u64;
            let rtp = p.is_rtp();
            Some((p, rtp.then_some(seq)))
        }));
        bytes
    }

    fn push_frames(&self, frames: impl Iterator<Item = Frame>) {
        let (mut added, mut lost) = (0, 0);
        {
            let mut q = self.q.lock();
            for f in frames {
                if q.len() < self.cap {
                    q.push_back(f);
                    added += 1;
                } else {
                    lost += 1;
                }
            }
        }
        self.dropped.fetch_add(lost, Ordering::Relaxed);
        if added > 0 {
            (self.wake)();
        }
    }

    /// Moves everything queued into `out`.
    pub fn drain(&self, out: &mut Vec<Frame>) {
        out.extend(self.q.lock().drain(..));
    }

    /// Packets dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
