//! Rate-based flow control by a virtual clock (Yau & Lam's Algorithm KT, per subscriber).
//!
//! Each sink has a [`VirtualClock`]: the virtual time at which its link has finished the last
//! packet it was sent, were the link exactly as fast as the sink's rate. A packet of `len`
//! bytes may leave now if the clock, advanced by `len / rate`, runs no further ahead of the
//! real time than the burst allowance (`burst / rate`): a token bucket of `burst` bytes
//! refilled at `rate`, kept as one timestamp. The clock never lags the real time: time the
//! sink spent idle does not become credit beyond the burst (work-conserving, no catch-up
//! flood after a pause).
//!
//! Times are nanoseconds on any monotonic clock the caller chooses; nothing here reads it.

use thiserror::Error;

/// A sink's rate and burst allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Bytes per second; never zero.
    rate: u64,
    /// Bytes that may leave back to back; at least one packet.
    burst: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum BadPace {
    #[error("a pacing rate must be above zero")]
    ZeroRate,
    #[error("a burst allowance of {burst} bytes is smaller than one packet ({packet} bytes)")]
    BurstBelowPacket { burst: u64, packet: u64 },
}

impl Pace {
    /// `rate` bytes per second with `burst` bytes back to back; `packet` is the largest
    /// packet that may come, which the burst must hold or the sink could never send it.
    pub fn new(rate: u64, burst: u64, packet: u64) -> Result<Self, BadPace> {
        if rate == 0 {
            return Err(BadPace::ZeroRate);
        }
        if burst < packet {
            return Err(BadPace::BurstBelowPacket { burst, packet });
        }
        Ok(Self { rate, burst })
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// How long `bytes` take at this rate, in nanoseconds (rounded up).
    fn span(&self, bytes: u64) -> u64 {
        ((bytes as u128 * 1_000_000_000).div_ceil(self.rate as u128)).min(u64::MAX as u128) as u64
    }
}

/// One sink's virtual clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtualClock {
    /// Virtual finish time of the last packet sent, in nanoseconds.
    finish: u64,
}

/// What the clock allows of a run of packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// How many of the packets (a prefix) may leave now.
    pub count: usize,
    /// When the first packet held back may leave (`None`: none was held back).
    pub next_at: Option<u64>,
}

impl VirtualClock {
    /// Stamps the packets of `lens` in order, as many as may leave at `now`, and returns how
    /// many that is and when the next may. Only the allowed packets move the clock.
    pub fn admit(&mut self, pace: &Pace, now: u64, lens: impl IntoIterator<Item = usize>) -> Allowed {
        self.take(pace, now, 0, lens, |_| {})
    }

    /// Like [`admit`](Self::admit), but packets are also let out up to `ahead` nanoseconds
    /// before they may leave, each with the time it may (pushed to `departs`, in order): for
    /// a sender that hands departure times to the kernel (`SO_TXTIME`, held by the `fq`
    /// qdisc) instead of waiting for them. A packet the burst allows departs at `now`.
    /// `next_at`: when the first packet held back falls within `ahead`.
    pub fn stamp(
        &mut self,
        pace: &Pace,
        now: u64,
        ahead: u64,
        lens: impl IntoIterator<Item = usize>,
        departs: &mut Vec<u64>,
    ) -> Allowed {
        self.take(pace, now, ahead, lens, |t| departs.push(t))
    }

    fn take(
        &mut self,
        pace: &Pace,
        now: u64,
        ahead: u64,
        lens: impl IntoIterator<Item = usize>,
        mut depart: impl FnMut(u64),
    ) -> Allowed {
        let mut count = 0;
        for len in lens {
            let at = self.departure(pace, now, len);
            if at > now.saturating_add(ahead) {
                // It may go once the real time has moved on by what it overshoots.
                return Allowed { count, next_at: Some(at - ahead) };
            }
            self.depart(pace, at, len);
            depart(at);
            count += 1;
        }
        Allowed { count, next_at: None }
    }

    /// When a packet of `len` bytes could leave, `now` at the earliest: once the clock, run
    /// on by it, is no more than the burst ahead of the real time.
    pub fn departure(&self, pace: &Pace, now: u64, len: usize) -> u64 {
        let end = self.finish.max(now).saturating_add(pace.span(len as u64));
        end.saturating_sub(pace.span(pace.burst)).max(now)
    }

    /// Records that a packet of `len` bytes leaves at `at` (its [`departure`](Self::departure)
    /// or later: a later one, held by another clock, is no credit).
    pub fn depart(&mut self, pace: &Pace, at: u64, len: usize) {
        self.finish = self.finish.max(at).saturating_add(pace.span(len as u64));
    }

    /// Stamps a packet of `len` bytes that leaves whatever the clock says (a link's clock,
    /// moved by traffic that was admitted elsewhere).
    pub fn charge(&mut self, pace: &Pace, now: u64, len: usize) {
        self.finish = self.finish.max(now).saturating_add(pace.span(len as u64));
    }

    /// How far ahead of `now` the clock runs: the sink's queue at its rate, in nanoseconds.
    pub fn ahead(&self, now: u64) -> u64 {
        self.finish.saturating_sub(now)
    }
}

/// A stream's rate and the size of its largest picture, measured as packets arrive: what a
/// session paces by when it has no configured rate.
#[derive(Debug, Clone, Default)]
pub struct StreamMeter {
    /// When the last packet came (`None`: none yet).
    last: Option<u64>,
    window_start: u64,
    window_bytes: u64,
    /// Bytes per second over the last whole window (0: none yet).
    rate: u64,
    /// The RTP timestamp of the picture being summed, and its bytes so far.
    frame: Option<(u32, u64)>,
    largest_frame: u64,
    largest_packet: u64,
}

/// The window a rate is measured over, in nanoseconds.
const METER_WINDOW: u64 = 1_000_000_000;

impl StreamMeter {
    /// A packet of `len` bytes arrived at `now`; `rtp_ts`: its RTP timestamp, if it has one
    /// (packets of one picture share it).
    pub fn packet(&mut self, now: u64, len: usize, rtp_ts: Option<u32>) {
        let len = len as u64;
        if self.last.is_none_or(|l| now.saturating_sub(l) >= METER_WINDOW) {
            // The first packet, or the first after a second of silence: a window spans
            // sending time only. One that began before the source did would measure it
            // slower than it sends, and its sinks would be paced below the stream's rate.
            (self.window_start, self.window_bytes) = (now, 0);
        } else if now.saturating_sub(self.window_start) >= METER_WINDOW {
            let span = now - self.window_start;
            self.rate = (self.window_bytes as u128 * 1_000_000_000 / span as u128) as u64;
            (self.window_start, self.window_bytes) = (now, 0);
        }
        self.last = Some(now);
        self.window_bytes += len;
        self.largest_packet = self.largest_packet.max(len);
        if let Some(ts) = rtp_ts {
            let bytes = match self.frame {
                Some((t, b)) if t == ts => b + len,
                _ => len,
            };
            self.frame = Some((ts, bytes));
            self.largest_frame = self.largest_frame.max(bytes);
        }
    }

    /// Bytes per second: over the last whole second, or over the current one so far when
    /// that is half again as fast (once half of it has passed), so a stream that speeds up
    /// is paced by its new rate soon. A keyframe makes the current half second up to a third
    /// faster than the stream: counted, it paced sinks above a link 1.2 times the stream's
    /// rate (issue 17's shared bottleneck). 0 until a first measurement.
    pub fn rate_at(&self, now: u64) -> u64 {
        let span = now.saturating_sub(self.window_start);
        let current = if span >= METER_WINDOW / 2 {
            (self.window_bytes as u128 * 1_000_000_000 / span as u128) as u64
        } else {
            0
        };
        if current > self.rate + self.rate / 2 {
            current
        } else {
            self.rate
        }
    }

    /// The largest picture seen (RTP: packets sharing a timestamp), in bytes.
    pub fn largest_frame(&self) -> u64 {
        self.largest_frame
    }

    pub fn largest_packet(&self) -> u64 {
        self.largest_packet
    }

    /// The burst allowance that keeps the largest picture seen whole (with a quarter to
    /// spare); where pictures are not told apart (no RTP video timestamps, such as MPEG-TS),
    /// a fifth of a second of the stream.
    pub fn default_burst(&self, rate: u64) -> u64 {
        let burst = if self.largest_frame > 0 { self.largest_frame * 5 / 4 } else { rate / 5 };
        burst.max(self.largest_packet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn bad_paces_are_refused() {
        assert_eq!(Pace::new(0, 10_000, 1400), Err(BadPace::ZeroRate));
        assert_eq!(Pace::new(1000, 1000, 1400), Err(BadPace::BurstBelowPacket { burst: 1000, packet: 1400 }));
    }

    #[test]
    fn a_burst_goes_at_once_and_the_rest_at_the_rate() {
        // 1 MB/s, 10 kB burst, 1 kB packets: 10 now, then one per millisecond.
        let pace = Pace::new(1_000_000, 10_000, 1000).unwrap();
        let mut c = VirtualClock::default();
        let a = c.admit(&pace, 0, [1000; 30]);
        assert_eq!(a, Allowed { count: 10, next_at: Some(MS) });
        assert_eq!(c.admit(&pace, MS / 2, [1000; 20]).count, 0);
        assert_eq!(c.admit(&pace, MS, [1000; 20]).count, 1);
        assert_eq!(c.admit(&pace, 5 * MS, [1000; 19]).count, 4);
    }

    #[test]
    fn stamped_packets_go_early_with_the_times_they_may_leave() {
        // 1 MB/s, 10 kB burst, 1 kB packets, stamped up to 5 ms ahead: the burst departs
        // now, then one a millisecond up to 5 ms; the 16th falls within the window at 1 ms.
        let pace = Pace::new(1_000_000, 10_000, 1000).unwrap();
        let mut c = VirtualClock::default();
        let mut departs = Vec::new();
        let a = c.stamp(&pace, 0, 5 * MS, [1000; 30], &mut departs);
        assert_eq!(a, Allowed { count: 15, next_at: Some(MS) });
        let want: Vec<u64> = [0; 10].into_iter().chain((1..=5).map(|k| k * MS)).collect();
        assert_eq!(departs, want);
        // Nothing ahead: what admit allows, all departing now.
        let (mut c1, mut c2) = (VirtualClock::default(), VirtualClock::default());
        departs.clear();
        assert_eq!(c1.stamp(&pace, 7, 0, [1000; 30], &mut departs), c2.admit(&pace, 7, [1000; 30]));
        assert_eq!((c1, departs), (c2, vec![7; 10]));
    }

    #[test]
    fn idle_time_is_no_credit_beyond_the_burst() {
        let pace = Pace::new(1_000_000, 5_000, 1000).unwrap();
        let mut c = VirtualClock::default();
        assert_eq!(c.admit(&pace, 0, [1000; 3]).count, 3);
        assert_eq!(c.admit(&pace, 1000 * MS, [1000; 100]).count, 5);
    }

    #[test]
    fn the_meter_measures_rate_and_the_largest_picture() {
        let mut m = StreamMeter::default();
        // 2 s of 100 packets a second, 1000 B each; every tenth picture is 5 packets.
        let mut ts = 0u32;
        for i in 0..200u64 {
            let key = i % 50 < 5;
            if !key || i % 50 == 0 {
                ts += 3000;
            }
            m.packet(i * 10 * MS, 1000, Some(ts));
        }
        assert_eq!(m.rate_at(2000 * MS), 100_000);
        // A stream that doubles its rate is measured at its new rate within half a second;
        // one a fifth faster (a keyframe's burst looks like that) at the next whole second.
        for i in 0..100u64 {
            m.packet(2000 * MS + i * 5 * MS, 1000, None);
        }
        assert_eq!(m.rate_at(2400 * MS), 100_000);
        assert_eq!(m.rate_at(2500 * MS), 200_000);
        let mut k = StreamMeter::default();
        for i in 0..100u64 {
            k.packet(i * 10 * MS, 1000, None);
        }
        for i in 0..60u64 {
            k.packet(1000 * MS + i * 10 * MS, 1200, None);
        }
        assert_eq!(k.rate_at(1600 * MS), 100_000, "not yet");
        assert_eq!(m.largest_frame(), 5000);
        assert_eq!(m.default_burst(100_000), 6_250);
        let mut ts = StreamMeter::default();
        ts.packet(0, 1316, None);
        assert_eq!(ts.rate_at(0), 0, "no rate from one packet");
        assert_eq!(ts.default_burst(100_000), 20_000);
        assert_eq!(ts.default_burst(1_000), 1316);
    }

    /// A source that starts late, or resumes after a silence, is measured at the rate it
    /// sends at, never slower: its sinks would be held below the stream's rate.
    #[test]
    fn the_meter_counts_sending_time_only() {
        let mut m = StreamMeter::default();
        // Nothing for 700 ms, then 100 packets a second of 1000 B: known at its rate once
        // half a second of it has come.
        let mut t = 700 * MS;
        while t < 2_000 * MS {
            m.packet(t, 1000, None);
            t += 10 * MS;
            if t == 1_200 * MS {
                assert!(m.rate_at(t) >= 99_000, "{}", m.rate_at(t));
            }
        }
        // Five seconds of silence, then the same again: the rate it had holds meanwhile.
        t += 5_000 * MS;
        let resumed = t;
        while t < resumed + 1_200 * MS {
            m.packet(t, 1000, None);
            t += 10 * MS;
            assert!(m.rate_at(t) >= 99_000, "{} ms after resuming: {}", (t - resumed) / MS, m.rate_at(t));
        }
    }

    /// Packets sent as `(time, bytes)`, in time order: over any window, at most the burst
    /// plus the rate times the window.
    fn keeps_the_pace(pace: &Pace, sent: &[(u64, u64)]) -> Result<(), TestCaseError> {
        for i in 0..sent.len() {
            let t0 = sent[i].0;
            let mut bytes = 0u64;
            for &(t, l) in &sent[i..] {
                bytes += l;
                let allowance = pace.burst() as u128 + (t - t0) as u128 * pace.rate() as u128 / 1_000_000_000 + 1;
                prop_assert!(bytes as u128 <= allowance, "{} bytes in {} ns", bytes, t - t0);
            }
        }
        Ok(())
    }

    proptest! {
        /// Stamped departures never run ahead of the rate plus the burst from when they were
        /// stamped, never lie further ahead than asked, and come in order.
        #[test]
        fn stamped_departures_keep_the_pace(
            rate in 10_000u64..10_000_000,
            extra in 0u64..50_000,
            ahead in 0u64..2_000 * MS,
            steps in proptest::collection::vec((0u64..20 * MS, proptest::collection::vec(1usize..1500, 0..60)), 1..40),
        ) {
            let pace = Pace::new(rate, 1500 + extra, 1500).unwrap();
            let mut c = VirtualClock::default();
            let mut now = 0u64;
            let mut sent: Vec<(u64, u64)> = Vec::new();
            for (dt, lens) in &steps {
                now += dt;
                let mut departs = Vec::new();
                let a = c.stamp(&pace, now, ahead, lens.iter().copied(), &mut departs);
                prop_assert_eq!(departs.len(), a.count);
                prop_assert!(departs.windows(2).all(|w| w[0] <= w[1]));
                prop_assert!(departs.iter().all(|&t| t >= now && t <= now + ahead));
                if a.count < lens.len() {
                    prop_assert!(a.next_at.expect("a time for the held packet") > now);
                }
                sent.extend(departs.iter().zip(lens).map(|(&t, &l)| (t, l as u64)));
            }
            sent.sort();
            keeps_the_pace(&pace, &sent)?;
        }

        /// Over any window, what the clock lets out is at most the burst plus the rate times
        /// the window, and a sink offered more than that is never starved.
        #[test]
        fn never_faster_than_rate_plus_burst(
            rate in 10_000u64..10_000_000,
            extra in 0u64..50_000,
            steps in proptest::collection::vec((0u64..20 * MS, proptest::collection::vec(1usize..1500, 0..40)), 1..100),
        ) {
            let pace = Pace::new(rate, 1500 + extra, 1500).unwrap();
            let mut c = VirtualClock::default();
            let mut now = 0u64;
            let mut sent: Vec<(u64, u64)> = Vec::new();
            for (dt, lens) in &steps {
                now += dt;
                let a = c.admit(&pace, now, lens.iter().copied());
                prop_assert!(a.count <= lens.len());
                if a.count < lens.len() {
                    let at = a.next_at.expect("a time for the held packet");
                    prop_assert!(at > now);
                    // At that time, the held packet is allowed.
                    let mut probe = c;
                    prop_assert_eq!(probe.admit(&pace, at, [lens[a.count]]).count, 1);
                } else {
                    prop_assert_eq!(a.next_at, None);
                }
                for &l in &lens[..a.count] {
                    sent.push((now, l as u64));
                }
            }
            keeps_the_pace(&pace, &sent)?;
        }
    }
}
