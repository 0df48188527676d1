//! Where the in-kernel data path keeps each session's sinks: a dense list per session, laid
//! over fixed-size chunks of one shared array, so a program can loop over `0..n` and a
//! removal is one move (the last sink fills the hole). Pure bookkeeping: the caller applies
//! the returned writes to the real maps in the order given, which keeps every state a
//! concurrent reader can see valid (see `kernel.rs`).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

pub const CHUNK_SHIFT: u32 = 8;
pub const CHUNK_SINKS: usize = 1 << CHUNK_SHIFT;

/// A chunk freed this recently may still be read by a program run that started before the
/// removal: it is not handed to another session before this has passed.
pub const CHUNK_GRACE: Duration = Duration::from_millis(50);

/// The shared array's chunks.
#[derive(Debug)]
pub struct ChunkPool {
    fresh: std::ops::Range<u32>,
    freed: VecDeque<(u32, Instant)>,
}

impl ChunkPool {
    pub fn new(chunks: u32) -> Self {
        Self { fresh: 0..chunks, freed: VecDeque::new() }
    }

    fn take(&mut self, now: Instant) -> Option<u32> {
        if let Some(c) = self.fresh.next() {
            return Some(c);
        }
        match self.freed.front() {
            Some(&(c, at)) if now.duration_since(at) >= CHUNK_GRACE => {
                self.freed.pop_front();
                Some(c)
            }
            _ => None,
        }
    }

    fn give(&mut self, chunk: u32, now: Instant) {
        self.freed.push_back((chunk, now));
    }
}

/// Why a sink could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    #[error("the session has {0} sinks in the kernel, its limit")]
    SessionFull(usize),
    #[error("every sink slot of the kernel data path is in use")]
    PoolFull,
}

/// One map write, in the order to apply it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotWrite {
    /// Chunk table entry `n` of the session now names chunk `chunk`.
    Chunk { n: usize, chunk: u32 },
    /// Store the new sink's entry at this slot.
    NewSink { slot: u32 },
    /// Copy the entry at `from` to `to`.
    Move { from: u32, to: u32 },
    /// The session's sink count.
    Len(usize),
}

/// One session's sinks, in the order the program visits them.
#[derive(Debug, Default)]
pub struct SessionSlots<K> {
    chunks: Vec<u32>,
    keys: Vec<K>,
    /// Each key's position in `keys`: finding a sink is O(1) at any session size.
    at: HashMap<K, usize>,
}

impl<K: Hash + Eq + Clone> SessionSlots<K> {
    pub fn new() -> Self {
        Self { chunks: Vec::new(), keys: Vec::new(), at: HashMap::new() }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The array slot of the sink at position `i`.
    pub fn slot(&self, i: usize) -> u32 {
        (self.chunks[i >> CHUNK_SHIFT] << CHUNK_SHIFT) | (i & (CHUNK_SINKS - 1)) as u32
    }

    /// Sinks and their slots, in visiting order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, u32)> + '_ {
        self.keys.iter().enumerate().map(|(i, k)| (k, self.slot(i)))
    }

    pub fn slot_of(&self, key: &K) -> Option<u32> {
        self.at.get(key).map(|&i| self.slot(i))
    }

    /// Appends a sink (a key not present); at most `max_chunks` chunks per session.
    pub fn push(
        &mut self,
        key: K,
        pool: &mut ChunkPool,
        max_chunks: usize,
        now: Instant,
    ) -> Result<Vec<SlotWrite>, SlotError> {
        let n = self.keys.len();
        let mut writes = Vec::with_capacity(3);
        if n == self.chunks.len() * CHUNK_SINKS {
            if self.chunks.len() >= max_chunks {
                return Err(SlotError::SessionFull(n));
            }
            let c = pool.take(now).ok_or(SlotError::PoolFull)?;
            self.chunks.push(c);
            writes.push(SlotWrite::Chunk { n: self.chunks.len() - 1, chunk: c });
        }
        self.at.insert(key.clone(), n);
        self.keys.push(key);
        writes.push(SlotWrite::NewSink { slot: self.slot(n) });
        writes.push(SlotWrite::Len(n + 1));
        Ok(writes)
    }

    /// Removes a sink: the last one moves into its place, then the count shrinks. A reader
    /// that loaded the old count may visit the moved sink twice for one packet, never skip
    /// one. Returns `None` if the key is unknown.
    pub fn remove(&mut self, key: &K, pool: &mut ChunkPool, now: Instant) -> Option<Vec<SlotWrite>> {
        let i = self.at.remove(key)?;
        let last = self.keys.len() - 1;
        let mut writes = Vec::with_capacity(2);
        if i != last {
            writes.push(SlotWrite::Move { from: self.slot(last), to: self.slot(i) });
        }
        self.keys.swap_remove(i);
        if let Some(moved) = self.keys.get(i) {
            self.at.insert(moved.clone(), i);
        }
        writes.push(SlotWrite::Len(last));
        if last.is_multiple_of(CHUNK_SINKS) {
            if let Some(c) = self.chunks.pop() {
                pool.give(c, now);
            }
        }
        Some(writes)
    }

    /// Forgets every sink, returning the chunks to the pool.
    pub fn clear(&mut self, pool: &mut ChunkPool, now: Instant) {
        self.keys.clear();
        self.at.clear();
        for c in self.chunks.drain(..) {
            pool.give(c, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Applies writes to a model of the maps: slot -> key, plus the count.
    fn apply(
        writes: &[SlotWrite],
        slots: &mut HashMap<u32, u64>,
        table: &mut HashMap<usize, u32>,
        len: &mut usize,
        new: u64,
    ) {
        for w in writes {
            match *w {
                SlotWrite::Chunk { n, chunk } => {
                    table.insert(n, chunk);
                }
                SlotWrite::NewSink { slot } => {
                    slots.insert(slot, new);
                }
                SlotWrite::Move { from, to } => {
                    let v = slots[&from];
                    slots.insert(to, v);
                }
                SlotWrite::Len(n) => *len = n,
            }
        }
    }

    proptest! {
        /// Whatever the adds and removes, the maps the program reads list exactly the live
        /// sinks of each session, and no slot is shared between live sinks.
        #[test]
        fn maps_always_hold_exactly_the_live_sinks(ops in prop::collection::vec((0usize..3, any::<bool>(), 0u64..600), 1..700)) {
            let mut pool = ChunkPool::new(8);
            let t0 = Instant::now();
            let mut sessions: Vec<SessionSlots<u64>> = (0..3).map(|_| SessionSlots::new()).collect();
            let mut slots = HashMap::new();
            let mut tables: Vec<HashMap<usize, u32>> = vec![HashMap::new(); 3];
            let mut lens = [0usize; 3];
            let mut live: Vec<Vec<u64>> = vec![Vec::new(); 3];
            for (k, (s, add, key)) in ops.into_iter().enumerate() {
                let now = t0 + CHUNK_GRACE * k as u32;
                let key = key + 1000 * s as u64;
                if add && !live[s].contains(&key) {
                    match sessions[s].push(key, &mut pool, 4, now) {
                        Ok(w) => {
                            apply(&w, &mut slots, &mut tables[s], &mut lens[s], key);
                            live[s].push(key);
                        }
                        Err(SlotError::SessionFull(n)) => prop_assert_eq!(n, 4 * CHUNK_SINKS),
                        Err(SlotError::PoolFull) => {}
                    }
                } else if let Some(w) = sessions[s].remove(&key, &mut pool, now) {
                    apply(&w, &mut slots, &mut tables[s], &mut lens[s], 0);
                    live[s].retain(|&x| x != key);
                }
                let mut all_slots = Vec::new();
                for s in 0..3 {
                    prop_assert_eq!(lens[s], live[s].len());
                    let mut seen: Vec<u64> = (0..lens[s])
                        .map(|i| {
                            let slot = (tables[s][&(i >> CHUNK_SHIFT)] << CHUNK_SHIFT) | (i % CHUNK_SINKS) as u32;
                            all_slots.push(slot);
                            slots[&slot]
                        })
                        .collect();
                    seen.sort();
                    let mut want = live[s].clone();
                    want.sort();
                    prop_assert_eq!(seen, want);
                    for (i, &key) in live[s].iter().enumerate() {
                        let slot = sessions[s].slot_of(&key).expect("a live sink has a slot");
                        prop_assert_eq!(slots[&slot], key, "sink {} of {}", i, live[s].len());
                    }
                }
                let n = all_slots.len();
                all_slots.sort();
                all_slots.dedup();
                prop_assert_eq!(all_slots.len(), n);
            }
        }
    }

    #[test]
    fn a_freed_chunk_waits_out_the_grace_period() {
        let mut pool = ChunkPool::new(1);
        let t0 = Instant::now();
        let mut a: SessionSlots<u32> = SessionSlots::new();
        let mut b: SessionSlots<u32> = SessionSlots::new();
        a.push(1, &mut pool, 1, t0).unwrap();
        assert_eq!(b.push(2, &mut pool, 1, t0), Err(SlotError::PoolFull));
        a.remove(&1, &mut pool, t0).unwrap();
        assert_eq!(b.push(2, &mut pool, 1, t0), Err(SlotError::PoolFull));
        assert!(b.push(2, &mut pool, 1, t0 + CHUNK_GRACE).is_ok());
        assert_eq!(b.slot_of(&2), Some(0));
    }

    #[test]
    fn a_session_is_bounded_by_its_chunk_limit() {
        let mut pool = ChunkPool::new(4);
        let mut a: SessionSlots<usize> = SessionSlots::new();
        let t = Instant::now();
        for k in 0..CHUNK_SINKS {
            a.push(k, &mut pool, 1, t).unwrap();
        }
        assert_eq!(a.push(CHUNK_SINKS, &mut pool, 1, t), Err(SlotError::SessionFull(CHUNK_SINKS)));
    }
}
