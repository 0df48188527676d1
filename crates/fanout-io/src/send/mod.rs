//! How each data path turns "these packets to these sinks" into system calls.
//!
//! A sink group's task ([`crate::group`]) keeps the bookkeeping: readiness and errors, the
//! ring snapshot, cursors, keyframe waits, pacing and the order sinks are served in. Each run
//! it hands its path's [`Sender`] one [`Batch`]: for each sink, in that order, how many of its
//! pending packets may leave now. The sender sends them without waiting, moves each sink's
//! cursor and byte count by what went, and reports the sinks that failed. So pacing,
//! rotation and the keyframe resume are written once, for every path.

mod copy;
mod layered;
mod shared;
mod uring;

pub(crate) use crate::due::Offer;
use crate::engine::WorkerCtx;
use crate::model::{DataPath, SessionConfig};
use crate::packet::Packet;
use crate::sink::{Sink, SinkIo};
use crate::sys::RawAddr;
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

/// What a group run asks its sender to send.
pub(crate) struct Batch<'a> {
    pub sinks: &'a mut [Sink],
    /// The ring's packets from sequence number `start` on (refcounts, no copies).
    pub snapshot: &'a [Arc<Packet>],
    pub start: u64,
    /// In the order to serve them.
    pub offers: &'a [Offer],
    /// Departure times of the offers that have them (CLOCK_MONOTONIC ns, see [`Offer::departs`]).
    pub departs: &'a [u64],
    /// The group's sockets for its unconnected UDP sinks, by address family.
    pub fds: GroupFds,
}

/// The group's unconnected sockets (`-1`: none of that family).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupFds {
    pub v4: RawFd,
    pub v6: RawFd,
}

impl GroupFds {
    pub fn new(udp: &UdpSocket, udp6: Option<&UdpSocket>) -> Self {
        Self { v4: udp.as_raw_fd(), v6: udp6.map_or(-1, |u| u.as_raw_fd()) }
    }

    fn for_addr(&self, a: &RawAddr) -> RawFd {
        if a.is_v6() {
            self.v6
        } else {
            self.v4
        }
    }
}

/// The packets an offer gives its sink.
fn offered<'a>(snapshot: &'a [Arc<Packet>], start: u64, sink: &Sink, count: usize) -> &'a [Arc<Packet>] {
    let from = (sink.due.cursor.next() - start) as usize;
    &snapshot[from..from + count]
}

/// A data path's way of sending.
pub(crate) trait Sender: Send {
    /// Sends one sink its packets: the path's own kinds of sink (UDP and stream sockets).
    /// Layer-dropping and channel sinks are served alike on every path before this is asked.
    fn send_to(
        &mut self,
        sink: &mut Sink,
        pending: &[Arc<Packet>],
        fds: GroupFds,
        ctx: &mut WorkerCtx,
    ) -> io::Result<()>;

    /// Sends a batch; `failed` gets the sinks that failed, with why. By default each offer in
    /// turn.
    fn send(&mut self, b: &mut Batch, ctx: &mut WorkerCtx, failed: &mut Vec<(usize, io::Error)>) {
        send_each(self, b, ctx, failed, |_| false);
    }

    /// Failures of earlier sends that surface now (io_uring completions): `(sink id, error)`.
    fn reap(&mut self, _failed: &mut Vec<(u64, io::Error)>) {}

    /// After a run's sends (io_uring: submit them).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Serves each offer in turn, but those whose sink `done` says was served already.
fn send_each<S: Sender + ?Sized>(
    sender: &mut S,
    b: &mut Batch,
    ctx: &mut WorkerCtx,
    failed: &mut Vec<(usize, io::Error)>,
    done: impl Fn(&Sink) -> bool,
) {
    for o in b.offers {
        let sink = &mut b.sinks[o.sink];
        if done(sink) {
            continue;
        }
        let pending = offered(b.snapshot, b.start, sink, o.count);
        let r = match layered::send_alike(sink, pending, b.fds, ctx) {
            Some(r) => r,
            None => sender.send_to(sink, pending, b.fds, ctx),
        };
        if let Err(e) = r {
            failed.push((o.sink, e));
        }
    }
}

/// The sender of a session's data path (a `kernel` session's user-space sinks: `shared`).
pub(crate) fn for_path(cfg: &SessionConfig) -> io::Result<Box<dyn Sender>> {
    Ok(match cfg.datapath {
        DataPath::Daemon | DataPath::Copy => Box::new(copy::CopySender),
        DataPath::Shared | DataPath::Kernel => Box::<shared::SharedSender>::default(),
        DataPath::Uring => Box::new(uring::UringPath::new(cfg)?),
    })
}

impl Sink {
    /// Records that the first `n` of `pending` went.
    pub(crate) fn sent(&mut self, pending: &[Arc<Packet>], n: usize) {
        self.bytes += pending[..n].iter().map(|p| p.len() as u64).sum::<u64>();
        self.due.cursor.advance(n as u64);
    }
}

/// Records `written` bytes of a stream write that covered the partial packet (if any), the
/// rest of the unit it began (if any), then `pending` in order; returns whether everything
/// offered was written. A unit begun and not finished leaves the ring with the sink (its
/// pieces kept in `unit_rest`): a lap then skips whole units only.
fn account_stream(sink: &mut Sink, pending: &[Arc<Packet>], mut written: usize, offered: usize) -> bool {
    sink.bytes += written as u64;
    let complete = written == offered;
    if let Some((p, off)) = sink.partial.take() {
        let rest = sink.bytes_of(&p).len() - off;
        if written < rest {
            sink.partial = Some((p, off + written));
            return complete;
        }
        written -= rest;
    }
    while let Some(p) = sink.unit_rest.pop_front() {
        let len = sink.bytes_of(&p).len();
        if written < len {
            if written > 0 {
                sink.partial = Some((p, written));
            } else {
                sink.unit_rest.push_front(p);
            }
            return complete;
        }
        written -= len;
    }
    let mut started = 0;
    for p in pending {
        let len = sink.bytes_of(p).len();
        if written >= len {
            written -= len;
            started += 1;
        } else {
            if written > 0 {
                sink.partial = Some((p.clone(), written));
                started += 1;
            }
            break;
        }
    }
    if started > 0 {
        while let Some(p) = pending.get(started).filter(|p| p.continues()) {
            sink.unit_rest.push_back(p.clone());
            started += 1;
        }
    }
    sink.due.cursor.advance(started as u64);
    complete
}

fn stream_fd(sink: &Sink) -> RawFd {
    match &sink.io {
        SinkIo::Stream(s) => s.as_raw_fd(),
        _ => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SinkTarget;
    use crate::sink::SinkIo;

    fn piece(byte: u8, len: usize, continues: bool) -> Arc<Packet> {
        let mut p = Packet::with_capacity(len);
        p.buf_mut().fill(byte);
        p.set_len(len, 0);
        if continues {
            p.set_continues();
        }
        Arc::new(p)
    }

    /// A write that ends inside a unit takes the unit's other pieces out of the ring with
    /// it (a lap can then skip whole units only), and they are owed before anything else.
    #[test]
    fn a_unit_begun_leaves_the_ring_with_the_sink() {
        let target = SinkTarget::Tcp(([127, 0, 0, 1], 9).into());
        let mut sink = Sink::new(1, target, SinkIo::Closed, fanout_core::Cursor::default(), false);
        let ring = [piece(1, 100, false), piece(1, 100, true), piece(1, 100, true), piece(2, 100, false)];
        assert!(!account_stream(&mut sink, &ring, 105, 400));
        assert_eq!(sink.partial.as_ref().map(|(p, off)| (p.data()[0], *off)), Some((1, 5)), "the second piece begun");
        assert_eq!(sink.unit_rest.len(), 1, "the unit's third piece kept");
        assert_eq!(sink.due.cursor.next(), 3, "past the whole unit, not the next one");
        // The next write: the partial piece's rest, the unit's rest, then the ring on.
        assert!(account_stream(&mut sink, &ring[3..], 95 + 100 + 100, 295));
        assert!(sink.partial.is_none() && sink.unit_rest.is_empty());
        assert_eq!(sink.due.cursor.next(), 4);
        // Ending exactly between two pieces of a unit keeps the rest too.
        let mut sink =
            Sink::new(2, SinkTarget::Tcp(([127, 0, 0, 1], 9).into()), SinkIo::Closed, Default::default(), false);
        assert!(!account_stream(&mut sink, &ring, 100, 400));
        assert!(sink.partial.is_none() && sink.unit_rest.len() == 2 && sink.due.cursor.next() == 3);
        // Nothing written of the unit's rest: still owed.
        assert!(!account_stream(&mut sink, &ring[3..], 0, 300));
        assert_eq!((sink.unit_rest.len(), sink.due.cursor.next()), (2, 3));
    }
    proptest::proptest! {
        /// Whatever the writes take, the bytes written are the ring's in order, and after
        /// each write the sink's place in the ring is a unit's start (what it owes of the
        /// unit it began is its own): a lap there skips whole units.
        #[test]
        fn writes_leave_the_sink_at_a_units_start(
            units in proptest::collection::vec(1usize..5, 1..20),
            writes in proptest::collection::vec(0usize..700, 1..60),
        ) {
            let mut ring = Vec::new();
            for (u, &pieces) in units.iter().enumerate() {
                for k in 0..pieces {
                    ring.push(piece(u as u8, 50 + 31 * k, k > 0));
                }
            }
            let whole: Vec<u8> = ring.iter().flat_map(|p| p.data().to_vec()).collect();
            let mut sink = Sink::new(1, SinkTarget::Tcp(([127, 0, 0, 1], 9).into()), SinkIo::Closed, Default::default(), false);
            let mut sent: Vec<u8> = Vec::new();
            for w in writes {
                // What the write is offered: the partial piece's rest, the unit's rest, the ring.
                let mut offered: Vec<u8> = Vec::new();
                if let Some((p, off)) = &sink.partial {
                    offered.extend(&p.data()[*off..]);
                }
                sink.unit_rest.iter().for_each(|p| offered.extend(p.data()));
                let at = sink.due.cursor.next() as usize;
                ring[at..].iter().for_each(|p| offered.extend(p.data()));
                let w = w.min(offered.len());
                sent.extend(&offered[..w]);
                account_stream(&mut sink, &ring[at..], w, offered.len());
                let next = sink.due.cursor.next() as usize;
                proptest::prop_assert!(next == ring.len() || !ring[next].continues(), "left inside a unit at {}", next);
            }
            proptest::prop_assert_eq!(&sent[..], &whole[..sent.len()]);
        }
    }
}
