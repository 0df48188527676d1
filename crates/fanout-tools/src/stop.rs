//! When a load's players stop reading, and how many WebRTC viewers connect at once: shared by
//! `read` (which starts the players) and `whep` (a viewer).

use std::time::Instant;

/// When the reading ends: set once every player plays; `until` at the latest. And how
/// many WebRTC viewers connect at once (ICE and DTLS): a relay connects so many a second,
/// and one that waits too long for its turn is dropped.
pub struct Stop {
    at: std::sync::OnceLock<Instant>,
    until: Instant,
    connecting: (std::sync::Mutex<usize>, std::sync::Condvar),
}

/// WebRTC viewers connecting at once, per load process.
const CONNECTING: usize = 32;

/// A place among the viewers connecting, given back when dropped.
pub struct Connecting<'a>(&'a Stop);

impl Drop for Connecting<'_> {
    fn drop(&mut self) {
        *self.0.connecting.0.lock().unwrap() -= 1;
        self.0.connecting.1.notify_one();
    }
}

impl Stop {
    pub fn new(until: Instant) -> Self {
        Self {
            at: std::sync::OnceLock::new(),
            until,
            connecting: (std::sync::Mutex::new(0), std::sync::Condvar::new()),
        }
    }

    /// Every player plays: the reading ends at `at`.
    pub fn set(&self, at: Instant) {
        let _ = self.at.set(at);
    }

    /// Waits for a place to connect in.
    pub fn connect(&self) -> Connecting<'_> {
        let (lock, cv) = &self.connecting;
        let mut n = cv.wait_while(lock.lock().unwrap(), |n| *n >= CONNECTING).unwrap();
        *n += 1;
        Connecting(self)
    }

    pub fn reached(&self) -> bool {
        let now = Instant::now();
        now >= self.until || self.at.get().is_some_and(|at| now >= *at)
    }
}
