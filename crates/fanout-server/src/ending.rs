//! When a path ends, as small state machines with time passed in, each saying when it next
//! needs a look (`poll_timeout`): a stream's end told to its players after a grace, and an
//! on-demand path deleted after a linger without readers.

use std::time::{Duration, Instant};

/// Whether a stream that can end (a file played once, a publisher's) has ended for its
/// players: over for `wait` without coming back. A publisher back in time changes nothing
/// for them; one that goes again is waited for again.
#[derive(Debug)]
pub struct EndWatch {
    wait: Duration,
    /// A file ends once; a publisher's stream each time it goes.
    once: bool,
    over_since: Option<Instant>,
    told: bool,
}

/// What an [`EndWatch`] says after a look.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Nothing to do now.
    Not,
    /// Tell the players the stream ended (once per time it ended).
    Tell,
    /// Told, and the watch is over (a file).
    TellAndStop,
}

impl EndWatch {
    /// A file played once: its end is told 1 s after its last packet (the ring's last
    /// packets go out first).
    pub fn file() -> Self {
        Self { wait: Duration::from_secs(1), once: true, over_since: None, told: false }
    }

    /// A publisher's stream: its end is told after `grace` without a publisher.
    pub fn publisher(grace: Duration) -> Self {
        Self { wait: grace, once: false, over_since: None, told: false }
    }

    /// A reload's new grace.
    pub fn set_wait(&mut self, wait: Duration) {
        if !self.once {
            self.wait = wait;
        }
    }

    /// A look at the stream at `now`: `over` whether it has ended (no publisher, the file's
    /// source closed).
    pub fn observe(&mut self, over: bool, now: Instant) -> End {
        if !over {
            (self.over_since, self.told) = (None, false);
            return End::Not;
        }
        let since = *self.over_since.get_or_insert(now);
        if self.told || now.duration_since(since) < self.wait {
            return End::Not;
        }
        self.told = true;
        if self.once {
            End::TellAndStop
        } else {
            End::Tell
        }
    }

    /// When the next look could tell the end, from `now`: once the stream is over and not
    /// yet told, when its wait runs out; else never (only a change of the stream matters).
    pub fn poll_timeout(&self, now: Instant) -> Option<Duration> {
        let since = self.over_since.filter(|_| !self.told)?;
        Some(self.wait.saturating_sub(now.duration_since(since)))
    }
}

/// An on-demand path's use: it ends once nothing used it for `linger`.
#[derive(Debug)]
pub struct Linger {
    linger: Duration,
    idle_since: Instant,
}

impl Linger {
    /// Made at `now`, as if just used (the one who asked for it is about to read).
    pub fn new(linger: Duration, now: Instant) -> Self {
        Self { linger, idle_since: now }
    }

    /// A look at `now`: `used` whether anyone reads it (or its publisher publishes).
    /// `true`: it has not been used for `linger`, and ends.
    pub fn observe(&mut self, used: bool, now: Instant) -> bool {
        if used {
            self.idle_since = now;
            return false;
        }
        now.duration_since(self.idle_since) >= self.linger
    }

    /// When a path unused since its last look would end, from `now`.
    pub fn poll_timeout(&self, now: Instant) -> Duration {
        self.linger.saturating_sub(now.duration_since(self.idle_since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_publishers_end_is_told_after_the_grace_once_and_not_if_it_came_back() {
        let t0 = Instant::now();
        let mut w = EndWatch::publisher(ms(1000));
        assert_eq!(w.observe(false, t0), End::Not);
        assert_eq!(w.poll_timeout(t0), None, "nothing to wait for while it plays");
        assert_eq!(w.observe(true, t0 + ms(100)), End::Not, "gone, within the grace");
        assert_eq!(w.poll_timeout(t0 + ms(300)), Some(ms(800)), "the grace's end");
        assert_eq!(w.observe(false, t0 + ms(900)), End::Not, "back in time");
        assert_eq!(w.observe(true, t0 + ms(1500)), End::Not, "gone again: a new grace");
        assert_eq!(w.observe(true, t0 + ms(2400)), End::Not);
        assert_eq!(w.observe(true, t0 + ms(2500)), End::Tell);
        assert_eq!(w.poll_timeout(t0 + ms(2600)), None, "told: nothing more to wait for");
        assert_eq!(w.observe(true, t0 + ms(9000)), End::Not, "told once");
        assert_eq!(w.observe(false, t0 + ms(9100)), End::Not, "a new publisher");
        assert_eq!(w.observe(true, t0 + ms(9200)), End::Not);
        assert_eq!(w.observe(true, t0 + ms(10_200)), End::Tell, "its end is told too");
    }

    #[test]
    fn a_files_end_is_told_a_second_after_and_the_watch_stops() {
        let t0 = Instant::now();
        let mut w = EndWatch::file();
        w.set_wait(ms(5)); // (a reload's grace is a publisher's, not a file's)
        assert_eq!(w.observe(true, t0), End::Not);
        assert_eq!(w.observe(true, t0 + ms(999)), End::Not);
        assert_eq!(w.observe(true, t0 + ms(1000)), End::TellAndStop);
    }

    #[test]
    fn a_grace_of_zero_tells_at_the_first_look() {
        let t0 = Instant::now();
        assert_eq!(EndWatch::publisher(Duration::ZERO).observe(true, t0), End::Tell);
    }

    #[test]
    fn an_unused_path_ends_after_its_linger_and_use_restarts_it() {
        let t0 = Instant::now();
        let mut l = Linger::new(ms(2000), t0);
        assert!(!l.observe(false, t0 + ms(1500)));
        assert_eq!(l.poll_timeout(t0 + ms(1500)), ms(500));
        assert!(!l.observe(true, t0 + ms(1900)), "read: the linger starts again");
        assert!(!l.observe(false, t0 + ms(3800)));
        assert!(l.observe(false, t0 + ms(3900)));
        assert_eq!(l.poll_timeout(t0 + ms(5000)), Duration::ZERO);
    }
}
