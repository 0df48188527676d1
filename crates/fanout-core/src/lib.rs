//! The relay's data structures and policies, still without sockets or threads.
//!
//! - [`ring`]: the session buffer of OMSS: a ring holding each received packet once, a
//!   cursor per sink, and slowest-sink-drop when a sink falls a whole ring behind.
//! - [`classq`]: strict-priority class queues of ready tasks.
//! - [`slots`]: how the in-kernel data path lays each session's sinks over one shared
//!   array, so a program loops over `0..n` and a removal is one move.
//! - [`pace`]: a virtual clock per sink (Yau & Lam's KT): no sink is sent faster than its
//!   rate plus a burst allowance.
//! - [`shed`]: which low classes to stop serving while the relay cannot serve them all.
//! - [`players`]: HLS players, which hold no connection, counted by their requests.
//! - [`admit`]: a cap on connections per client address, and refusals counted and logged
//!   once per interval.
//! - [`Priority`]: a session's class, 0–7, higher served first.

pub mod admit;
pub mod classq;
pub mod egress;
pub mod pace;
pub mod players;
pub mod ring;
pub mod shed;
pub mod slots;

pub use classq::ClassQueues;
pub use egress::{Egress, Overbooked, Slot};
pub use pace::{Allowed, BadPace, Pace, StreamMeter, VirtualClock};
pub use ring::{Cursor, SessionRing};
pub use shed::{ShedConfig, Shedder};

use thiserror::Error;

/// Where a rotating serving order starts for the `k`th packet (or run) over `n` places: a
/// multiplicative (Fibonacci) hash of `k`, so that every place comes first about equally
/// often and soon, even when there are more places than packets (a step of one per packet
/// would take `n` packets to go round once). The eBPF program computes the same.
pub fn rotation(k: u64, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    ((k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % n as u64) as usize
}

/// Number of priority classes.
pub const CLASSES: usize = 8;

/// A session's priority class: 0 (lowest) to 7 (highest). Higher classes are always served
/// first, so under overload the lowest class loses first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Priority(u8);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("priority {0} is out of range: classes are 0 (lowest) to 7 (highest)")]
pub struct BadPriority(pub i64);

impl Priority {
    pub const MAX: Priority = Priority(CLASSES as u8 - 1);
    pub fn new(p: i64) -> Result<Self, BadPriority> {
        u8::try_from(p).ok().filter(|&p| usize::from(p) < CLASSES).map(Priority).ok_or(BadPriority(p))
    }
    pub fn get(self) -> u8 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::rotation;

    /// Over `n` packets every one of `n` places is first about as often as the others: no
    /// place waits for most of the others every time.
    #[test]
    fn rotation_spreads_first_places_evenly_and_soon() {
        for n in [1usize, 7, 64, 1000] {
            let mut first = vec![0u32; n];
            let mut ranks = vec![0u64; n];
            for k in 0..(4 * n as u64) {
                let t = rotation(k, n);
                first[t] += 1;
                for (i, r) in ranks.iter_mut().enumerate() {
                    *r += ((i + n - t) % n) as u64;
                }
            }
            let mean = ranks.iter().sum::<u64>() as f64 / n as f64;
            for r in &ranks {
                assert!((*r as f64 - mean).abs() <= 0.2 * mean + 4.0, "n {n}: a place's mean rank {r} vs {mean}");
            }
            assert!(first.iter().all(|&f| f <= 16), "n {n}: {first:?}");
        }
    }
}
