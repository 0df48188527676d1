//! Admitting connections: a cap per client address, so one address (or a few) cannot hold
//! every slot of a listener, and the books of refusals, so a flood of refused connections
//! costs one log line per interval with its counts instead of one line each.
//!
//! Sans-IO: the I/O layer asks [`PerAddress::try_open`] when it accepts, calls
//! [`PerAddress::close`] when the connection ends, and passes the time to [`Refusals`].

use std::collections::HashMap;
use std::net::IpAddr;

/// Open connections per client address, under a cap.
#[derive(Debug, Default)]
pub struct PerAddress {
    cap: usize,
    open: HashMap<IpAddr, usize>,
}

impl PerAddress {
    /// At most `cap` connections per address at once; 0: no cap.
    pub fn new(cap: usize) -> Self {
        Self { cap, open: HashMap::new() }
    }

    /// A new cap (a reload): it applies to the next connections; those open stay.
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
    }

    /// Counts a new connection from `ip`, or `false` if that address is at its cap.
    pub fn try_open(&mut self, ip: IpAddr) -> bool {
        let n = self.open.entry(ip).or_insert(0);
        if self.cap > 0 && *n >= self.cap {
            return false;
        }
        *n += 1;
        true
    }

    /// A connection `try_open` counted has ended.
    pub fn close(&mut self, ip: IpAddr) {
        if let Some(n) = self.open.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.open.remove(&ip);
            }
        }
    }

    pub fn open(&self, ip: IpAddr) -> usize {
        self.open.get(&ip).copied().unwrap_or(0)
    }

    /// Addresses with a connection open.
    pub fn addresses(&self) -> usize {
        self.open.len()
    }
}

/// Seconds between two summaries of refusals in the log.
pub const SUMMARY_EVERY_MS: u64 = 10_000;

/// Refusals counted by reason (a short label such as `"rtsp: per-address cap"`), in total
/// (for `/metrics`) and since the last line in the log.
#[derive(Debug, Default)]
pub struct Refusals {
    /// (reason, total, since the last summary)
    counts: Vec<(&'static str, u64, u64)>,
    last_summary_ms: Option<u64>,
}

impl Refusals {
    /// One refusal at `now_ms`. The first after a quiet interval is told at once (a line for
    /// it: `Some`); the rest wait for [`Refusals::summary`].
    pub fn refuse(&mut self, reason: &'static str, now_ms: u64) -> Option<String> {
        let i = self.counts.iter().position(|c| c.0 == reason).unwrap_or_else(|| {
            self.counts.push((reason, 0, 0));
            self.counts.len() - 1
        });
        self.counts[i].1 += 1;
        let quiet = self.last_summary_ms.is_none_or(|t| now_ms.saturating_sub(t) >= SUMMARY_EVERY_MS);
        if quiet && self.counts.iter().all(|c| c.2 == 0) {
            self.last_summary_ms = Some(now_ms);
            return Some(format!("refused a connection: {reason}"));
        }
        self.counts[i].2 += 1;
        None
    }

    /// The line for the refusals not yet told, once an interval has passed since the last
    /// line (call it every few seconds); `None` when there is nothing to tell yet.
    pub fn summary(&mut self, now_ms: u64) -> Option<String> {
        if self.counts.iter().all(|c| c.2 == 0) {
            return None;
        }
        if self.last_summary_ms.is_some_and(|t| now_ms.saturating_sub(t) < SUMMARY_EVERY_MS) {
            return None;
        }
        let since = self.last_summary_ms.map_or(0, |t| now_ms.saturating_sub(t));
        let parts: Vec<String> = self.counts.iter().filter(|c| c.2 > 0).map(|c| format!("{} ({})", c.2, c.0)).collect();
        let n: u64 = self.counts.iter().map(|c| c.2).sum();
        for c in &mut self.counts {
            c.2 = 0;
        }
        self.last_summary_ms = Some(now_ms);
        Some(format!("refused {n} connections in the last {:.0} s: {}", since as f64 / 1000.0, parts.join(", ")))
    }

    /// Every reason with its total so far.
    pub fn totals(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.counts.iter().map(|c| (c.0, c.1))
    }
}

/// How long failures are counted together, and how long an address that reached the limit
/// within it is refused.
pub const GUESS_WINDOW_MS: u64 = 60_000;
pub const GUESS_BAN_MS: u64 = 60_000;

/// Failed logins a minute from one address before it is refused for a minute.
pub const DEFAULT_FAILED_LOGINS: u32 = 20;

/// At most one line a second per address about its failures.
pub const GUESS_TELL_EVERY_MS: u64 = 1_000;
/// Addresses remembered at most: past it, those with nothing to remember are let go first.
const GUESSERS: usize = 65_536;

/// Failed logins (wrong credentials, a wrong SRT passphrase) per client address: each is
/// counted; the log is told at most once a second per address; an address that fails
/// `limit` times within a minute is refused everything for a minute (0: never).
#[derive(Debug, Default)]
pub struct Guesses {
    limit: u32,
    by_ip: HashMap<IpAddr, Guesser>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Guesser {
    since_ms: u64,
    failures: u32,
    banned_until_ms: u64,
    told_ms: Option<u64>,
    untold: u32,
}

/// What to tell of an address's failures: how many since the last line, and whether it is
/// refused now.
#[derive(Debug, PartialEq, Eq)]
pub struct Told {
    pub failures: u32,
    pub banned: bool,
}

impl Guesses {
    pub fn new(limit: u32) -> Self {
        Self { limit, by_ip: HashMap::new() }
    }

    /// A reload's new limit (for the next failures).
    pub fn set_limit(&mut self, limit: u32) {
        self.limit = limit;
    }

    /// A failed login from `ip` at `now_ms`; `Some` when a line about it is due.
    pub fn fail(&mut self, ip: IpAddr, now_ms: u64) -> Option<Told> {
        if self.by_ip.len() >= GUESSERS && !self.by_ip.contains_key(&ip) {
            self.by_ip.retain(|_, g| g.banned_until_ms > now_ms || now_ms.saturating_sub(g.since_ms) < GUESS_WINDOW_MS);
            if self.by_ip.len() >= GUESSERS {
                // Every one of them recent: the oldest window goes.
                let oldest = self.by_ip.iter().min_by_key(|(_, g)| g.since_ms).map(|(ip, _)| *ip);
                self.by_ip.remove(&oldest.expect("not empty"));
            }
        }
        let g = self.by_ip.entry(ip).or_insert(Guesser { since_ms: now_ms, ..Guesser::default() });
        if now_ms.saturating_sub(g.since_ms) >= GUESS_WINDOW_MS {
            (g.since_ms, g.failures) = (now_ms, 0);
        }
        g.failures = g.failures.saturating_add(1);
        g.untold = g.untold.saturating_add(1);
        if self.limit > 0 && g.failures >= self.limit && g.banned_until_ms <= now_ms {
            g.banned_until_ms = now_ms + GUESS_BAN_MS;
            // Banned now: told at once.
            g.told_ms = None;
        }
        if g.told_ms.is_some_and(|t| now_ms.saturating_sub(t) < GUESS_TELL_EVERY_MS) {
            return None;
        }
        g.told_ms = Some(now_ms);
        Some(Told { failures: std::mem::take(&mut g.untold), banned: g.banned_until_ms > now_ms })
    }

    /// Whether `ip` is refused now (it failed too often).
    pub fn banned(&self, ip: IpAddr, now_ms: u64) -> bool {
        self.by_ip.get(&ip).is_some_and(|g| g.banned_until_ms > now_ms)
    }

    /// Addresses refused now.
    pub fn banned_count(&self, now_ms: u64) -> usize {
        self.by_ip.values().filter(|g| g.banned_until_ms > now_ms).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_address_is_capped_and_others_are_not() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut p = PerAddress::new(2);
        assert!(p.try_open(a) && p.try_open(a));
        assert!(!p.try_open(a), "a third from the same address");
        assert!(p.try_open(b));
        p.close(a);
        assert!(p.try_open(a));
        assert_eq!((p.open(a), p.open(b), p.addresses()), (2, 1, 2));
        let mut free = PerAddress::new(0);
        assert!((0..1000).all(|_| free.try_open(a)));
    }

    /// A flood: the first refusal is told at once, the next 10 s of them in one line with
    /// their counts by reason; a quiet time later, the first is told at once again.
    #[test]
    fn a_flood_of_refusals_is_one_line_per_interval() {
        let mut r = Refusals::default();
        assert_eq!(
            r.refuse("rtsp: per-address cap", 0).as_deref(),
            Some("refused a connection: rtsp: per-address cap")
        );
        let mut told = 0;
        for i in 0..50_000u64 {
            let reason = if i % 10 == 0 { "rtsp: connection cap" } else { "rtsp: per-address cap" };
            told += usize::from(r.refuse(reason, i / 10).is_some());
            if i % 100 == 0 {
                assert_eq!(r.summary(i / 10), None, "before the interval is over");
            }
        }
        assert_eq!(told, 0);
        let line = r.summary(10_000).unwrap();
        assert_eq!(
            line,
            "refused 50000 connections in the last 10 s: 45000 (rtsp: per-address cap), 5000 (rtsp: connection cap)"
        );
        assert_eq!(r.summary(30_000), None, "nothing new");
        assert!(r.refuse("rtsp: connection cap", 40_000).is_some(), "after a quiet interval");
        let totals: Vec<_> = r.totals().collect();
        assert_eq!(totals, vec![("rtsp: per-address cap", 45_001), ("rtsp: connection cap", 5_001)]);
    }

    #[test]
    fn guessing_is_told_once_a_second_and_refused_for_a_while_at_the_limit() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut g = Guesses::new(5);
        assert_eq!(g.fail(a, 0), Some(Told { failures: 1, banned: false }));
        assert_eq!(g.fail(a, 100), None, "within the second");
        assert_eq!(g.fail(a, 200), None);
        assert_eq!(g.fail(a, 1_000), Some(Told { failures: 3, banned: false }));
        assert!(!g.banned(a, 1_000));
        // The fifth within the minute: refused for a minute, told at once.
        assert_eq!(g.fail(a, 1_100), Some(Told { failures: 1, banned: true }));
        assert!(g.banned(a, 1_100) && g.banned(a, 61_099) && !g.banned(a, 61_100));
        assert!(!g.banned(b, 1_100), "another address is not");
        assert_eq!(g.banned_count(2_000), 1);
        // Failures a minute apart never add up to a ban.
        let mut g = Guesses::new(3);
        for k in 0..10 {
            g.fail(b, k * 40_000);
        }
        assert!(!g.banned(b, 400_000));
        // Limit 0: counted and told, never refused.
        let mut g = Guesses::new(0);
        for k in 0..1000 {
            g.fail(a, k);
        }
        assert!(!g.banned(a, 1000));
    }

    #[test]
    fn the_addresses_remembered_are_bounded() {
        let mut g = Guesses::new(3);
        for k in 0..(GUESSERS as u32 + 10) {
            g.fail(IpAddr::from(k.to_be_bytes()), 0);
        }
        assert!(g.by_ip.len() <= GUESSERS);
    }

    proptest! {
        /// Every failure is told in exactly one line, sooner or later, and no address is
        /// told of more than once a second (except the moment it is refused).
        #[test]
        fn every_failure_is_told_once(times in proptest::collection::vec((0u8..3, 0u64..700), 1..300), limit in 0u32..8) {
            let mut g = Guesses::new(limit);
            let mut now = 0;
            let (mut failed, mut told) = ([0u32; 3], [0u32; 3]);
            for (a, dt) in times {
                now += dt;
                let ip = IpAddr::from([10, 0, 0, a]);
                failed[a as usize] += 1;
                if let Some(t) = g.fail(ip, now) {
                    told[a as usize] += t.failures;
                }
            }
            for a in 0..3u8 {
                let late = g.fail(IpAddr::from([10, 0, 0, a]), now + GUESS_TELL_EVERY_MS);
                prop_assert_eq!(told[a as usize] + late.map_or(0, |t| t.failures), failed[a as usize] + 1);
            }
        }

        /// Opens and closes in any order: the count per address never passes the cap, and
        /// equals what was opened and not closed.
        #[test]
        fn counts_follow_opens_and_closes(ops in proptest::collection::vec((0u8..4, any::<bool>()), 0..200), cap in 0usize..5) {
            let mut p = PerAddress::new(cap);
            let mut model = [0usize; 4];
            for (a, open) in ops {
                let ip = IpAddr::from([10, 0, 0, a]);
                if open {
                    let ok = p.try_open(ip);
                    prop_assert_eq!(ok, cap == 0 || model[a as usize] < cap);
                    model[a as usize] += usize::from(ok);
                } else if model[a as usize] > 0 {
                    p.close(ip);
                    model[a as usize] -= 1;
                }
                prop_assert_eq!(p.open(ip), model[a as usize]);
            }
        }

        /// Every refusal is in exactly one line: told at once, or counted in a summary.
        #[test]
        fn every_refusal_is_told_once(times in proptest::collection::vec(0u64..5_000, 1..300)) {
            let mut r = Refusals::default();
            let mut now = 0;
            let mut told = 0u64;
            for dt in times {
                now += dt;
                if r.refuse("x", now).is_some() {
                    told += 1;
                }
                if let Some(line) = r.summary(now) {
                    told += line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
                }
            }
            if let Some(line) = r.summary(now + SUMMARY_EVERY_MS) {
                told += line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
            }
            prop_assert_eq!(told, r.totals().map(|t| t.1).sum::<u64>());
        }
    }
}
