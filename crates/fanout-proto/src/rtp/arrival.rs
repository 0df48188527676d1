//! A track's RTP time now, read from when its packets arrived: what a sender report says
//! for a source that sends none of its own (the demo, a file, TS, RTMP or SRT ingest).
//!
//! The newest packet's timestamp plus the time since it arrived is wrong by however late
//! that packet was: a source or relay starved of CPU hands on a burst of late packets, and a
//! report made then puts the stream's clock back by the lateness (0.66 s was seen), which
//! a player takes for a jump. Lateness only ever delays, so the least-delayed packet of the
//! last few seconds is the best anchor — NTP's minimum-delay filter. Sans-IO: the caller
//! passes its own milliseconds.

use std::collections::VecDeque;

/// How far back the anchor is looked for.
const WINDOW_MS: u64 = 8_000;
/// At most one sample this often (the window holds at most 400).
const SPACING_MS: u64 = 20;
/// A sample that puts the clock further ahead than this (seconds) of the newest one is from
/// before the timestamps jumped back, not an early packet.
const JUMP_S: u64 = 3;
/// A clock read this recently is carried forward rather than read again (a relay reports
/// to thousands of readers of one track at once).
const REUSE_MS: u64 = 100;

#[derive(Debug, Default, Clone)]
pub struct ArrivalClock {
    ssrc: u32,
    /// (arrival in ms, RTP timestamp), oldest first.
    samples: VecDeque<(u64, u32)>,
    /// The last read: (at ms, clock rate, RTP time then).
    read: Option<(u64, u32, u32)>,
}

impl ArrivalClock {
    /// Whether a packet arriving at `now_ms` would be sampled (cheap: ask before parsing).
    pub fn wants(&self, now_ms: u64) -> bool {
        self.samples.back().is_none_or(|s| now_ms >= s.0 + SPACING_MS)
    }

    /// A packet of stream `ssrc` with timestamp `ts` arrived at `now_ms`. A new SSRC starts
    /// afresh.
    pub fn sample(&mut self, ssrc: u32, ts: u32, now_ms: u64) {
        if ssrc != self.ssrc {
            self.samples.clear();
            self.read = None;
            self.ssrc = ssrc;
        }
        if !self.wants(now_ms) {
            return;
        }
        self.samples.push_back((now_ms, ts));
        while self.samples.front().is_some_and(|s| s.0 + WINDOW_MS < now_ms) {
            self.samples.pop_front();
        }
    }

    /// `(ssrc, RTP time at now_ms)` for a track of `clock` Hz, from the least-delayed
    /// sample; `None` before the first.
    pub fn rtp_now(&mut self, clock: u32, now_ms: u64) -> Option<(u32, u32)> {
        if let Some((ms, c, rtp)) = self.read.filter(|r| r.1 == clock && r.0 <= now_ms && now_ms < r.0 + REUSE_MS) {
            return Some((self.ssrc, rtp.wrapping_add(((now_ms - ms) * u64::from(c) / 1000) as u32)));
        }
        let at = |&(ms, ts): &(u64, u32)| ts.wrapping_add((now_ms.saturating_sub(ms) * u64::from(clock) / 1000) as u32);
        let newest = at(self.samples.back()?);
        let jump = (JUMP_S * u64::from(clock)).min(i32::MAX as u64) as i64;
        let ahead = self
            .samples
            .iter()
            .map(|s| i64::from(at(s).wrapping_sub(newest) as i32))
            .filter(|&d| d <= jump)
            .max()
            .unwrap_or(0)
            .max(0);
        let rtp = newest.wrapping_add(ahead as u32);
        self.read = Some((now_ms, clock, rtp));
        Some((self.ssrc, rtp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CLOCK: u32 = 90_000;

    /// A stream of 30 packets a second whose packets from 2 s on came 660 ms late (as a
    /// starved relay hands them on): the clock read as the late burst ends is the on-time
    /// clock, where the newest packet's would be 0.66 s behind.
    #[test]
    fn a_late_burst_does_not_set_the_clock_back() {
        let mut c = ArrivalClock::default();
        let base = 1_000_000u32;
        for i in 0..81u64 {
            let sent = i * 1000 / 30;
            let late = if sent >= 2000 { 660 } else { 0 };
            c.sample(7, base.wrapping_add((sent * 90) as u32), sent + late);
        }
        let now = 3360;
        let (ssrc, rtp) = c.rtp_now(CLOCK, now).unwrap();
        assert_eq!(ssrc, 7);
        let want = base.wrapping_add((now * 90) as u32);
        assert!((i64::from(rtp.wrapping_sub(want) as i32)).abs() <= 90, "{rtp} against {want}");
    }

    /// Timestamps that jump back (a source restarted without a new SSRC): the clock follows
    /// the new timeline, not the old samples.
    #[test]
    fn a_jump_back_is_followed() {
        let mut c = ArrivalClock::default();
        for i in 0..100u64 {
            c.sample(1, 50_000_000 + (i * 40 * 90) as u32, i * 40);
        }
        for i in 100..120u64 {
            c.sample(1, (i * 40 * 90) as u32, i * 40);
        }
        let (_, rtp) = c.rtp_now(CLOCK, 4800).unwrap();
        assert_eq!(rtp, 4800 * 90);
    }

    #[test]
    fn nothing_before_the_first_packet_and_a_new_ssrc_starts_afresh() {
        let mut c = ArrivalClock::default();
        assert_eq!(c.rtp_now(CLOCK, 10), None);
        c.sample(1, 900_000, 0);
        c.sample(2, 90, 1000);
        assert_eq!(c.rtp_now(CLOCK, 1000), Some((2, 90)));
    }

    proptest! {
        /// Whatever the delays, the clock read is never behind the on-time clock by more
        /// than the least delay in the window, nor ahead of it (timestamps wrap freely).
        #[test]
        fn never_ahead_and_behind_by_the_least_delay(
            base in any::<u32>(),
            // (Short enough that no sample leaves the window.)
            delays in proptest::collection::vec(0u64..800, 1..250),
        ) {
            let mut c = ArrivalClock::default();
            let mut last = 0;
            let mut least = u64::MAX;
            for (i, d) in delays.iter().enumerate() {
                let sent = i as u64 * 25;
                let arrive = (sent + d).max(last);
                if c.wants(arrive) {
                    least = least.min(arrive - sent);
                }
                c.sample(9, base.wrapping_add((sent * 90) as u32), arrive);
                last = arrive;
            }
            let now = last + 5;
            let (_, rtp) = c.rtp_now(CLOCK, now).unwrap();
            let behind = i64::from(base.wrapping_add((now * 90) as u32).wrapping_sub(rtp) as i32);
            prop_assert!(behind >= 0, "ahead by {} ticks", -behind);
            prop_assert!(behind <= (least as i64) * 90 + 1, "behind by {behind} ticks, least delay {least} ms");
        }
    }
}
