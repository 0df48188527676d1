//! The relay's data structures and policies, still without sockets or threads.
//!
//! - [`ring`]: the session buffer of OMSS: a ring holding each received packet once, a
//!   cursor per sink, and slowest-sink-drop when a sink falls a whole ring behind.
//! - [`classq`]: strict-priority class queues of ready tasks.
//! - [`slots`]: how the in-kernel data path lays each session's sinks over one shared
//!   array, so a program loops over `0..n` and a removal is one move.
//! - [`Priority`]: a session's class, 0–7, higher served first.

pub mod classq;
pub mod ring;
pub mod slots;

pub use classq::ClassQueues;
pub use ring::{Cursor, SessionRing};

use thiserror::Error;

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
