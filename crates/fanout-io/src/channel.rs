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

pub struct ChannelQueue {
    q: Mutex<VecDeque<Arc<Packet>>>,
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
        let added = {
            let mut q = self.q.lock();
            let room = self.cap.saturating_sub(q.len()).min(pending.len());
            q.extend(pending[..room].iter().cloned());
            self.dropped.fetch_add((pending.len() - room) as u64, Ordering::Relaxed);
            room
        };
        if added > 0 {
            (self.wake)();
        }
    }

    /// Moves everything queued into `out`.
    pub fn drain(&self, out: &mut Vec<Arc<Packet>>) {
        out.extend(self.q.lock().drain(..));
    }

    /// Packets dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
