//! The session buffer: a ring of fixed capacity holding each received packet once.
//!
//! Sequence numbers are `u64` and never wrap in practice (2^64 packets). The ring holds
//! sequence numbers `oldest()..head()`. Each sink owns a [`Cursor`]: the next sequence
//! number it wants. Publishing never waits for sinks: when the ring is full the new packet
//! replaces the oldest one, and a sink whose cursor still pointed at a replaced packet skips
//! ahead to the oldest one kept the next time it reads (slowest-sink-drop, applied lazily so
//! that a publish costs O(1) however many sinks there are). Every skipped packet is counted
//! on the cursor that skipped it, so `received + skipped == published since the sink joined`.
//!
//! The ring stores whatever handle the data path gives it (a refcounted payload in the relay);
//! the handle a replaced slot held is returned to the publisher for reuse.

/// Single-producer ring of packets, read by many cursors.
#[derive(Debug)]
pub struct SessionRing<T> {
    slots: Box<[Option<T>]>,
    head: u64,
}

impl<T> SessionRing<T> {
    /// A ring that keeps the last `capacity` packets. `capacity` must be at least 1.
    pub fn with_capacity(capacity: usize) -> Self {
        assert!(capacity > 0, "a session ring needs at least one slot");
        Self { slots: (0..capacity).map(|_| None).collect(), head: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Sequence number the next published packet gets.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Oldest sequence number still held.
    pub fn oldest(&self) -> u64 {
        self.head.saturating_sub(self.slots.len() as u64)
    }

    /// Number of packets held.
    pub fn len(&self) -> usize {
        (self.head - self.oldest()) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.head == 0
    }

    /// Appends a packet; returns the packet it replaced, if the ring was full.
    pub fn publish(&mut self, item: T) -> Option<T> {
        let idx = (self.head % self.slots.len() as u64) as usize;
        self.head += 1;
        self.slots[idx].replace(item)
    }

    /// The packet with sequence number `seq`, if still held.
    pub fn get(&self, seq: u64) -> Option<&T> {
        if seq < self.oldest() || seq >= self.head {
            return None;
        }
        self.slots[(seq % self.slots.len() as u64) as usize].as_ref()
    }
}

/// One sink's place in the ring and what happened to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    next: u64,
    /// Packets this sink was handed (sent or being sent).
    pub received: u64,
    /// Packets this sink skipped because the ring replaced them before it read them.
    pub skipped: u64,
    /// Packets passed over on purpose: video before the first keyframe a new sink could
    /// decode.
    pub withheld: u64,
}

impl Cursor {
    /// A cursor that starts with the next packet published (a sink joins live).
    pub fn at_head<T>(ring: &SessionRing<T>) -> Self {
        Self { next: ring.head(), ..Self::default() }
    }

    /// A cursor that starts at `seq` (clamped to what the ring holds): a sink that joins at
    /// an earlier entry point, such as the last keyframe.
    pub fn starting_at<T>(ring: &SessionRing<T>, seq: u64) -> Self {
        Self { next: seq.clamp(ring.oldest(), ring.head()), ..Self::default() }
    }

    pub fn next(&self) -> u64 {
        self.next
    }

    /// Slowest-sink-drop: if the ring no longer holds the packet this cursor needs, jump to
    /// the oldest packet still held. Returns how many packets were skipped now.
    pub fn catch_up(&mut self, oldest: u64) -> u64 {
        let skip = oldest.saturating_sub(self.next);
        self.next += skip;
        self.skipped += skip;
        skip
    }

    /// Packets published that this sink has not yet been handed.
    pub fn lag(&self, head: u64) -> u64 {
        head.saturating_sub(self.next)
    }

    /// Passes over the next `n` packets without handing them to the sink.
    pub fn withhold(&mut self, n: u64) {
        self.next += n;
        self.withheld += n;
    }

    /// Skips the next `n` packets on purpose (a lapped sink waiting for a keyframe): counted
    /// with the ones the ring replaced.
    pub fn skip(&mut self, n: u64) {
        self.next += n;
        self.skipped += n;
    }

    /// Moves past the next `n` packets, which reached the sink another way.
    pub fn pass(&mut self, n: u64) {
        self.next += n;
    }

    /// Records that the next `n` packets were handed to the sink.
    pub fn advance(&mut self, n: u64) {
        self.next += n;
        self.received += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_ring_keeps_new_packet_and_laggard_skips() {
        let mut ring = SessionRing::with_capacity(4);
        let mut slow = Cursor::at_head(&ring);
        let mut fast = Cursor::at_head(&ring);
        for seq in 0..10u64 {
            assert_eq!(ring.publish(seq), seq.checked_sub(4));
            assert_eq!(ring.get(fast.next()), Some(&seq));
            fast.advance(1);
        }
        assert_eq!(fast.received, 10);
        assert_eq!(slow.lag(ring.head()), 10);
        assert_eq!(slow.catch_up(ring.oldest()), 6);
        assert_eq!(ring.get(slow.next()), Some(&6));
        slow.advance(slow.lag(ring.head()));
        assert_eq!((slow.received, slow.skipped), (4, 6));
        assert_eq!(ring.get(10), None);
        assert_eq!(ring.get(5), None);
    }

    #[test]
    fn starting_at_is_clamped_to_the_ring() {
        let mut ring = SessionRing::with_capacity(4);
        for i in 0..10 {
            ring.publish(i);
        }
        assert_eq!(Cursor::starting_at(&ring, 7).next(), 7);
        assert_eq!(Cursor::starting_at(&ring, 2).next(), 6);
        assert_eq!(Cursor::starting_at(&ring, 99).next(), 10);
    }

    /// One step of the model: publish some packets, then let each sink read up to its speed.
    #[derive(Debug, Clone)]
    struct Step {
        publish: usize,
        reads: Vec<usize>,
    }

    fn steps(sinks: usize) -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            (0usize..6, proptest::collection::vec(0usize..8, sinks))
                .prop_map(|(publish, reads)| Step { publish, reads }),
            1..200,
        )
    }

    proptest! {
        /// Sinks read at random speeds; the first is always fast enough.
        #[test]
        fn fast_sinks_lose_nothing_slow_sinks_account_for_everything(
            capacity in 1usize..16, steps in steps(4)
        ) {
            let mut ring = SessionRing::with_capacity(capacity);
            let mut cursors = [Cursor::at_head(&ring); 4];
            let mut seen: Vec<Vec<u64>> = vec![Vec::new(); 4];
            let mut published = 0u64;
            for step in &steps {
                // Cap the burst at the capacity so that sink 0, which drains fully every
                // step, can never be lapped.
                for _ in 0..step.publish.min(capacity) {
                    ring.publish(published);
                    published += 1;
                }
                for (i, c) in cursors.iter_mut().enumerate() {
                    c.catch_up(ring.oldest());
                    let want = if i == 0 { usize::MAX } else { step.reads[i] };
                    let n = c.lag(ring.head()).min(want as u64);
                    for k in 0..n {
                        // No slot is reused while a sink still needs it: what a sink reads
                        // at sequence s is the packet published as s.
                        let seq = c.next() + k;
                        prop_assert_eq!(ring.get(seq), Some(&seq));
                        seen[i].push(seq);
                    }
                    c.advance(n);
                }
            }
            prop_assert_eq!(&seen[0], &(0..published).collect::<Vec<_>>());
            prop_assert_eq!(cursors[0].skipped, 0);
            for (i, c) in cursors.iter().enumerate() {
                prop_assert_eq!(c.received + c.skipped + c.lag(ring.head()), published);
                prop_assert!(seen[i].windows(2).all(|w| w[0] < w[1]), "in order");
                prop_assert_eq!(seen[i].len() as u64, c.received);
            }
        }
    }
}
