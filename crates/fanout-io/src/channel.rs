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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

type Wake = Box<dyn Fn() + Send + Sync>;

/// A queued packet and, for a sink that drops layers, the sequence number it goes out with.
pub type Frame = (Arc<Packet>, Option<u16>);

pub struct ChannelQueue {
    q: Mutex<VecDeque<Frame>>,
    cap: usize,
    /// A push left packets behind to end at an access unit: the sink waits, like a full
    /// queue, until the reader has drained it.
    held: AtomicBool,
    /// Packets come at the session's `stream_flush`, as a TCP sink's are written, not as
    /// they arrive: for a reader that writes them to a socket and wants fewer, fuller writes.
    batched: bool,
    wake: Wake,
}

impl ChannelQueue {
    /// `wake` is called (from an engine worker) when packets were added.
    pub fn new(cap: usize, wake: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Self::with(cap, false, wake)
    }

    /// As [`ChannelQueue::new`], filled once per the session's `stream_flush` (see
    /// `batched`): RTSP clients taking RTP interleaved.
    pub fn batched(cap: usize, wake: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Self::with(cap, true, wake)
    }

    fn with(cap: usize, batched: bool, wake: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            q: Mutex::new(VecDeque::new()),
            cap: cap.max(1),
            held: AtomicBool::new(false),
            batched,
            wake: Box::new(wake),
        })
    }

    pub(crate) fn is_batched(&self) -> bool {
        self.batched
    }

    /// Queues what fits; returns how many did (the rest stays in the ring for later, and a
    /// reader that stays behind is lapped there like any slow sink).
    /// What fills the queue ends at the end of an RTP access unit: if the reader stalls and
    /// the ring laps it, the player holds whole pictures, and the keyframe it resumes at is
    /// not taken for the rest of a broken one (ffmpeg's parser glued the two into one picture
    /// with the old timestamp). A picture the queue already holds the start of is finished
    /// past the cap, by at most the cap again (RTP that never sets the marker bit, such as
    /// MPEG-TS, thus never makes the queue hold more than twice its cap).
    pub(crate) fn push(&self, pending: &[Arc<Packet>]) -> usize {
        self.push_with(|room, q| {
            let mut n = room.min(pending.len());
            if n == room {
                let open = q.back().is_some_and(|(p, _)| !p.ends_access_unit());
                match pending[..n].iter().rposition(|p| p.ends_access_unit()) {
                    Some(last) => n = last + 1,
                    None if open => {
                        let reach = (2 * self.cap).saturating_sub(q.len()).min(pending.len());
                        n = pending[..reach].iter().position(|p| p.ends_access_unit()).map_or(reach, |end| end + 1)
                    }
                    None if !q.is_empty() => n = 0,
                    None => {} // an access unit larger than the queue goes as it fits
                }
            }
            if n < pending.len() {
                self.held.store(true, Ordering::Relaxed);
            }
            q.extend(pending[..n].iter().map(|p| (p.clone(), None)));
            n
        })
    }

    /// Whether it holds all it may (or all it will before its reader drains it).
    pub(crate) fn is_full(&self) -> bool {
        self.held.load(Ordering::Relaxed) || self.q.lock().len() >= self.cap
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
        // Pictures whole, as in `push`; a decision cannot be taken back, so a picture is
        // begun only if all its packets fit (or the queue is empty), and an open one is
        // finished past the cap by at most the cap again.
        self.push_with(|mut room, q| {
            let (mut decided, mut bytes) = (0, 0);
            let mut open = q.back().is_some_and(|(p, _)| !p.ends_access_unit());
            for (i, p) in pending.iter().enumerate() {
                let stop = if open {
                    q.len() >= 2 * self.cap
                } else {
                    let whole =
                        pending[i..].iter().position(|p| p.ends_access_unit()).map_or(pending.len() - i, |e| e + 1);
                    room == 0 || (whole > room && !q.is_empty())
                };
                if stop {
                    self.held.store(true, Ordering::Relaxed);
                    break;
                }
                decided += 1;
                open = !p.ends_access_unit();
                let Some((seq, rebuilt)) = decide(p) else { continue };
                room = room.saturating_sub(1);
                let p = rebuilt.unwrap_or_else(|| p.clone());
                bytes += p.len() as u64;
                let rtp = p.is_rtp();
                q.push_back((p, rtp.then_some(seq)));
            }
            (decided, bytes)
        })
    }

    /// Lets `fill` add to the queue, told how much room there is, under one lock; wakes the
    /// reader if it added to an empty queue (one that holds packets has been woken and not
    /// drained yet: a reader that drains at intervals is woken once per interval, not per
    /// packet).
    fn push_with<R>(&self, fill: impl FnOnce(usize, &mut VecDeque<Frame>) -> R) -> R {
        let (r, woken) = {
            let mut q = self.q.lock();
            let before = q.len();
            let r = fill(self.cap.saturating_sub(before), &mut q);
            (r, before == 0 && !q.is_empty())
        };
        if woken {
            (self.wake)();
        }
        r
    }

    /// Moves everything queued into `out`.
    pub fn drain(&self, out: &mut Vec<Frame>) {
        let mut q = self.q.lock();
        out.extend(q.drain(..));
        self.held.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RTP packet of timestamp `ts`, with the marker bit if it ends its access unit.
    fn rtp(ts: u32, marker: bool) -> Arc<Packet> {
        let mut p = Packet::with_capacity(64);
        let b = p.buf_mut();
        b[0] = 0x80;
        b[1] = 96 | if marker { 0x80 } else { 0 };
        b[4..8].copy_from_slice(&ts.to_be_bytes());
        b[12] = 1; // a non-IDR slice
        p.set_len(20, 12);
        Arc::new(p)
    }

    /// Three access units of three packets each.
    fn pictures() -> Vec<Arc<Packet>> {
        (0..9).map(|i| rtp(i / 3 * 3600, i % 3 == 2)).collect()
    }

    /// The reader is woken when packets come to an empty queue, not again until it drained
    /// it: one wake per drain however many pushes came between.
    #[test]
    fn the_reader_is_woken_once_per_drain() {
        use std::sync::atomic::AtomicUsize;
        let wakes = Arc::new(AtomicUsize::new(0));
        let w = wakes.clone();
        let q = ChannelQueue::new(100, move || {
            w.fetch_add(1, Ordering::Relaxed);
        });
        let p = pictures();
        for k in 0..9 {
            q.push(&p[k..k + 1]);
        }
        assert_eq!(wakes.load(Ordering::Relaxed), 1);
        let mut out = Vec::new();
        q.drain(&mut out);
        assert_eq!(out.len(), 9);
        q.push(&p[..0]);
        assert_eq!(wakes.load(Ordering::Relaxed), 1, "nothing added: no wake");
        q.push(&p[..3]);
        q.push_layered(&p[3..6], |_| Some((7, None)));
        assert_eq!(wakes.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_push_that_fills_the_queue_ends_at_an_access_unit() {
        let q = ChannelQueue::new(5, || {});
        // Room for five: the second picture's last packet does not fit, so it waits whole.
        assert_eq!(q.push(&pictures()), 3);
        assert!(q.is_full(), "it waits for its reader like a full queue");
        let mut out = Vec::new();
        q.drain(&mut out);
        assert_eq!(out.len(), 3);
        assert!(out.last().unwrap().0.ends_access_unit());
        assert!(!q.is_full());
        // What is not filled up takes everything, wherever it ends.
        assert_eq!(q.push(&pictures()[3..7]), 4);
        assert!(!q.is_full());
    }

    #[test]
    fn no_access_unit_end_in_reach_waits_for_the_reader_unless_the_queue_is_empty() {
        let q = ChannelQueue::new(2, || {});
        let big: Vec<_> = (0..4).map(|i| rtp(0, i == 3)).collect();
        // An empty queue takes a picture larger than itself as it fits...
        assert_eq!(q.push(&big), 2);
        let mut out = Vec::new();
        q.drain(&mut out);
        assert_eq!(q.push(&pictures()[2..3]), 1, "the end of a picture");
        // ...a queue holding something waits for its reader instead of ending mid-picture.
        assert_eq!(q.push(&big[2..3]), 0);
        assert!(q.is_full());
    }

    #[test]
    fn a_picture_the_queue_holds_the_start_of_is_finished_past_the_cap() {
        let p = pictures();
        let q = ChannelQueue::new(2, || {});
        assert_eq!(q.push(&p[..1]), 1);
        // Room for one, which would leave the first picture open: it is finished (one past
        // the cap), and the next waits whole.
        assert_eq!(q.push(&p[1..]), 2);
        let mut out = Vec::new();
        q.drain(&mut out);
        assert_eq!(out.len(), 3);
        // The rest of an open picture goes as it comes, past the cap.
        assert_eq!(q.push(&p[..2]), 2, "an empty queue takes what fits");
        assert_eq!(q.push(&p[2..6]), 1, "the open picture is finished, nothing more");
        assert!(q.is_full());
    }

    #[test]
    fn rtp_without_marker_bits_never_fills_the_queue_past_twice_its_cap() {
        let unmarked: Vec<_> = (0..50).map(|i| rtp(i, false)).collect();
        let keep = |_: &Packet| Some((0u16, None));
        for layered in [false, true] {
            let q = ChannelQueue::new(4, || {});
            let mut out = Vec::new();
            for _ in 0..3 {
                let mut queued = 0;
                for chunk in unmarked.chunks(3) {
                    let n = if layered { q.push_layered(chunk, keep).0 } else { q.push(chunk) };
                    queued += n;
                    if n < chunk.len() {
                        break;
                    }
                }
                assert!((4..=8).contains(&queued), "layered {layered}: {queued} queued");
                assert!(q.is_full());
                out.clear();
                q.drain(&mut out);
                assert_eq!(out.len(), queued);
            }
        }
    }

    #[test]
    fn a_layered_push_begins_only_pictures_that_fit_whole() {
        let p = pictures();
        let q = ChannelQueue::new(5, || {});
        // Every packet kept: the first picture fits, the second (3 more) does not.
        let keep = |_: &Packet| Some((0u16, None));
        assert_eq!(q.push_layered(&p, keep).0, 3);
        assert!(q.is_full());
        let mut out = Vec::new();
        q.drain(&mut out);
        // A picture whose end has not come yet is begun if what there is of it fits.
        assert_eq!(q.push_layered(&p[..1], keep).0, 1);
        let q2 = ChannelQueue::new(2, || {});
        assert_eq!(q2.push_layered(&p[..1], keep).0, 1);
        assert_eq!(q2.push_layered(&p[1..], keep).0, 2, "finished past the cap, the next not begun");
        // Packets a layer cap drops still count as decided.
        let q3 = ChannelQueue::new(8, || {});
        let last_only = |x: &Packet| (x.data()[1] & 0x80 != 0).then_some((0u16, None));
        assert_eq!(q3.push_layered(&p, last_only), (9, 60));
    }

    #[test]
    fn packets_that_are_not_rtp_fill_the_queue_to_the_brim() {
        let q = ChannelQueue::new(3, || {});
        let ts: Vec<_> = (0..5)
            .map(|_| {
                let mut p = Packet::with_capacity(188);
                p.buf_mut()[0] = 0x47;
                p.set_len(188, 0);
                Arc::new(p)
            })
            .collect();
        assert_eq!(q.push(&ts), 3);
        assert!(q.is_full());
    }

    #[test]
    fn an_access_unit_is_known_by_its_timestamp_source_and_marker() {
        let p = pictures();
        assert!(p[0].same_access_unit(&p[1]));
        assert!(!p[2].same_access_unit(&p[3]), "the marker bit ends it");
        let other = rtp(3600, false);
        assert!(!p[0].same_access_unit(&other), "another timestamp");
        let mut ssrc = Packet::with_capacity(64);
        ssrc.buf_mut()[..20].copy_from_slice(p[1].data());
        ssrc.buf_mut()[11] = 7;
        ssrc.set_len(20, 12);
        assert!(!p[0].same_access_unit(&ssrc), "another source");
    }
}
