//! A sink whose packets go into a queue that another task drains: for subscribers whose
//! socket a protocol task owns, such as RTSP clients taking RTP interleaved on their RTSP
//! connection (their responses and the `$` frames must come from one writer, or a frame
//! could be split by a response). The queue holds the ring's packets themselves (payload
//! sharing, no copy) and is bounded: when it is full the sink waits in the ring like a slow
//! socket, and is lapped there (resuming at a keyframe) if its reader stays behind; it never
//! holds back the others.

use crate::packet::Packet;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

type Wake = Box<dyn Fn() + Send + Sync>;

/// A queued packet and, for a sink that drops layers, the sequence number it goes out with.
pub type Frame = (Arc<Packet>, Option<u16>);

pub struct ChannelQueue {
    q: Mutex<VecDeque<Frame>>,
    cap: usize,
    wake: Wake,
}

impl ChannelQueue {
    /// `wake` is called (from an engine worker) when packets were added.
    pub fn new(cap: usize, wake: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self { q: Mutex::new(VecDeque::new()), cap: cap.max(1), wake: Box::new(wake) })
    }

    /// Queues what fits; returns how many did (the rest stays in the ring for later, and a
    /// reader that stays behind is lapped there like any slow sink).
    pub(crate) fn push(&self, pending: &[Arc<Packet>]) -> usize {
        self.push_with(|room, q| {
            let n = room.min(pending.len());
            q.extend(pending[..n].iter().map(|p| (p.clone(), None)));
            n
        })
    }

    /// Whether it holds all it may.
    pub(crate) fn is_full(&self) -> bool {
        self.q.lock().len() >= self.cap
    }

    /// Queues the packets `decide` keeps, with the sequence number it gives them, while
    /// there is room; returns how many of `pending` were decided and the bytes kept.
    /// `decide`: the sink's sequence number for a packet it keeps, and the packet rebuilt for
    /// it if it is (see [`crate::layered::SinkLayers::rebuild`]).
    pub(crate) fn push_layered(
        &self,
        pending: &[Arc<Packet>],
        mut decide: impl FnMut(&Packet) -> Option<(u16, Option<Arc<Packet>>)>,
    ) -> (usize, u64) {
        self.push_with(|mut room, q| {
            let (mut decided, mut bytes) = (0, 0);
            for p in pending {
                if room == 0 {
                    break;
                }
                decided += 1;
                let Some((seq, rebuilt)) = decide(p) else { continue };
                room -= 1;
                let p = rebuilt.unwrap_or_else(|| p.clone());
                bytes += p.len() as u64;
                let rtp = p.is_rtp();
                q.push_back((p, rtp.then_some(seq)));
            }
            (decided, bytes)
        })
    }

    /// Lets `fill` add to the queue, told how much room there is, under one lock; wakes the
    /// reader if it added any.
    fn push_with<R>(&self, fill: impl FnOnce(usize, &mut VecDeque<Frame>) -> R) -> R {
        let (r, added) = {
            let mut q = self.q.lock();
            let before = q.len();
            let r = fill(self.cap.saturating_sub(before), &mut q);
            (r, q.len() - before)
        };
        if added > 0 {
            (self.wake)();
        }
        r
    }

    /// Moves everything queued into `out`.
    pub fn drain(&self, out: &mut Vec<Frame>) {
        out.extend(self.q.lock().drain(..));
    }
}
