//! Receiver statistics for one RTP stream (RFC 3550 §6.4.1 and appendix A.3/A.8): packets
//! received, expected and lost from extended sequence numbers, reordering and duplicates,
//! interarrival jitter, and the variance of interarrival times (DIVISOR's QoS figure).
//!
//! Sans-IO: the caller passes each packet's sequence number, RTP timestamp and arrival time
//! (converted to RTP timestamp units for jitter, and nanoseconds for interarrival variance).

/// How far back duplicates are detected.
const WINDOW: u64 = 1024;

#[derive(Debug, Clone, Default)]
pub struct RecvStats {
    /// First extended sequence number seen.
    base: Option<u64>,
    /// Highest extended sequence number seen.
    max: u64,
    /// Bitmap of the last `WINDOW` sequence numbers up to `max` (bit 0 = max).
    seen: [u64; (WINDOW / 64) as usize],
    pub received: u64,
    pub reordered: u64,
    pub duplicates: u64,
    /// RFC 3550 interarrival jitter, in RTP timestamp units.
    jitter: f64,
    last_transit: Option<i64>,
    // Welford's running mean and variance of interarrival times (ns).
    last_arrival_ns: Option<u64>,
    ia_n: u64,
    ia_mean: f64,
    ia_m2: f64,
}

/// What one packet turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The next expected packet, or one after a gap.
    InOrder,
    /// Older than the highest seen: reordered (a late packet, not a loss after all).
    Reordered,
    Duplicate,
}

impl RecvStats {
    /// Extends a 16-bit sequence number to the value closest to the highest seen.
    fn extend(&self, seq: u16) -> u64 {
        let Some(_) = self.base else { return u64::from(seq) + (1 << 16) };
        let delta = seq.wrapping_sub(self.max as u16) as i16;
        (self.max as i64 + i64::from(delta)).max(0) as u64
    }

    fn bit(&mut self, ext: u64) -> Option<(usize, u64)> {
        let back = self.max.checked_sub(ext)?;
        (back < WINDOW).then(|| ((back / 64) as usize, 1u64 << (back % 64)))
    }

    /// Records one packet. `arrival_ts` is the arrival time in the stream's RTP clock units;
    /// `arrival_ns` the arrival time in nanoseconds (any fixed origin).
    pub fn record(&mut self, seq: u16, rtp_ts: u32, arrival_ts: u32, arrival_ns: u64) -> Arrival {
        let ext = self.extend(seq);
        let kind = match self.base {
            None => {
                self.base = Some(ext);
                self.max = ext;
                self.seen[0] = 1;
                Arrival::InOrder
            }
            Some(_) if ext > self.max => {
                // Shift the window forward by the advance.
                let shift = ext - self.max;
                self.max = ext;
                if shift >= WINDOW {
                    self.seen = [0; (WINDOW / 64) as usize];
                } else {
                    let (words, bits) = ((shift / 64) as usize, (shift % 64) as u32);
                    let n = self.seen.len();
                    for i in (0..n).rev() {
                        let src = i.checked_sub(words);
                        let lo = src.map_or(0, |s| self.seen[s]);
                        let hi = src.and_then(|s| s.checked_sub(1)).map_or(0, |s| self.seen[s]);
                        self.seen[i] = if bits == 0 { lo } else { (lo << bits) | (hi >> (64 - bits)) };
                    }
                }
                self.seen[0] |= 1;
                Arrival::InOrder
            }
            Some(_) => match self.bit(ext) {
                Some((w, m)) if self.seen[w] & m != 0 => Arrival::Duplicate,
                Some((w, m)) => {
                    self.seen[w] |= m;
                    Arrival::Reordered
                }
                // Older than the window: count as reordered (it cannot be told from a duplicate).
                None => Arrival::Reordered,
            },
        };
        match kind {
            Arrival::Duplicate => {
                self.duplicates += 1;
                return kind;
            }
            Arrival::Reordered => self.reordered += 1,
            Arrival::InOrder => {}
        }
        self.received += 1;
        if let Some(b) = self.base {
            self.base = Some(b.min(ext));
        }
        // RFC 3550 A.8.
        let transit = i64::from(arrival_ts.wrapping_sub(rtp_ts) as i32);
        if let Some(last) = self.last_transit {
            let d = (transit - last).abs() as f64;
            self.jitter += (d - self.jitter) / 16.0;
        }
        self.last_transit = Some(transit);
        if let Some(last) = self.last_arrival_ns {
            let ia = arrival_ns.saturating_sub(last) as f64;
            self.ia_n += 1;
            let delta = ia - self.ia_mean;
            self.ia_mean += delta / self.ia_n as f64;
            self.ia_m2 += delta * (ia - self.ia_mean);
        }
        self.last_arrival_ns = Some(arrival_ns);
        kind
    }

    /// Packets expected from the first to the highest sequence number seen.
    pub fn expected(&self) -> u64 {
        self.base.map_or(0, |b| self.max - b + 1)
    }

    /// The highest extended sequence number seen (RFC 3550's cycles << 16 | max_seq).
    pub fn highest(&self) -> u64 {
        self.max
    }

    /// Packets expected but not received (never negative).
    pub fn lost(&self) -> u64 {
        self.expected().saturating_sub(self.received)
    }

    /// A receiver report block about source `ssrc` (RFC 3550 §6.4.1). `last`: expected and
    /// received at the previous report (updated), for the fraction lost since; `lsr`/`dlsr`:
    /// the last sender report's middle NTP bits and the delay since it (0 without one).
    pub fn report_block(&self, last: &mut (u64, u64), ssrc: u32, lsr: u32, dlsr: u32) -> crate::rtp::rtcp::ReportBlock {
        let (expected, received) = (self.expected(), self.received);
        let (de, dr) = (expected.saturating_sub(last.0), received.saturating_sub(last.1));
        *last = (expected, received);
        let fraction = if de == 0 || dr >= de { 0 } else { ((de - dr) * 256 / de).min(255) as u8 };
        crate::rtp::rtcp::ReportBlock {
            ssrc,
            fraction_lost: fraction,
            cumulative_lost: self.lost().min(0x7f_ffff) as i32,
            highest_seq: self.highest().saturating_sub(1 << 16) as u32,
            jitter: self.jitter() as u32,
            lsr,
            dlsr,
        }
    }

    /// Interarrival jitter in RTP timestamp units.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// Mean interarrival time in nanoseconds.
    pub fn interarrival_mean_ns(&self) -> f64 {
        self.ia_mean
    }

    /// Sample variance of interarrival times, in ns².
    pub fn interarrival_variance(&self) -> f64 {
        if self.ia_n < 2 {
            0.0
        } else {
            self.ia_m2 / (self.ia_n - 1) as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn feed(seqs: &[u16]) -> RecvStats {
        let mut s = RecvStats::default();
        for (i, &q) in seqs.iter().enumerate() {
            s.record(q, 0, 0, i as u64);
        }
        s
    }

    #[test]
    fn loss_reorder_duplicates_from_hand_made_sequences() {
        let s = feed(&[1, 2, 3, 4, 5]);
        assert_eq!((s.received, s.expected(), s.lost(), s.reordered, s.duplicates), (5, 5, 0, 0, 0));
        let s = feed(&[1, 2, 4, 5]); // 3 lost
        assert_eq!((s.received, s.expected(), s.lost()), (4, 5, 1));
        let s = feed(&[1, 3, 2, 4]); // 2 late, not lost
        assert_eq!((s.received, s.lost(), s.reordered), (4, 0, 1));
        let s = feed(&[1, 2, 2, 3]);
        assert_eq!((s.received, s.lost(), s.duplicates), (3, 0, 1));
        let s = feed(&[65534, 65535, 0, 1]); // wrap
        assert_eq!((s.received, s.expected(), s.lost()), (4, 4, 0));
        let s = feed(&[65535, 1]); // wrap with a loss
        assert_eq!((s.expected(), s.lost()), (3, 1));
        let s = feed(&[10, 9, 8]); // starts late: earlier packets extend the base
        assert_eq!((s.received, s.expected(), s.lost(), s.reordered), (3, 3, 0, 2));
    }

    /// RFC 3550 A.8 by hand: 8 kHz clock, 20 ms packets; transit 1000, 1010, 1000, 1020;
    /// J = 10/16, then + (10 - J)/16, then + (20 - J)/16.
    #[test]
    fn jitter_matches_a_worked_example() {
        let mut s = RecvStats::default();
        for (seq, (ts, arr)) in [(0u32, 1000u32), (160, 1170), (320, 1320), (480, 1500)].into_iter().enumerate() {
            s.record(seq as u16, ts, arr, 0);
        }
        assert_eq!(s.jitter(), 2.38525390625);
    }

    #[test]
    fn interarrival_variance() {
        let mut s = RecvStats::default();
        for (i, t) in [0u64, 10, 30, 40, 60].into_iter().enumerate() {
            s.record(i as u16, 0, 0, t);
        }
        // Interarrivals 10, 20, 10, 20: mean 15, sample variance 100/3.
        assert_eq!(s.interarrival_mean_ns(), 15.0);
        assert!((s.interarrival_variance() - 100.0 / 3.0).abs() < 1e-9);
    }

    proptest! {
        /// Any subset of a sequence, shuffled locally, with duplicates: the counts add up.
        #[test]
        fn accounting_adds_up(start: u16, n in 1usize..3000, drop in proptest::collection::vec(any::<bool>(), 3000),
                              swaps in proptest::collection::vec(0usize..3000, 0..50), dups in proptest::collection::vec(0usize..3000, 0..20)) {
            let mut seqs: Vec<u16> = (0..n).filter(|&i| i == 0 || i == n - 1 || !drop[i]).map(|i| start.wrapping_add(i as u16)).collect();
            let kept = seqs.len() as u64;
            for &s in &swaps { let i = s % seqs.len(); if i + 1 < seqs.len() && i > 0 { seqs.swap(i, i + 1); } }
            for &d in &dups { let i = d % seqs.len(); let v = seqs[i]; seqs.insert(i + 1, v); }
            let s = feed(&seqs);
            prop_assert_eq!(s.received, kept);
            prop_assert_eq!(s.expected(), n as u64);
            prop_assert_eq!(s.lost(), n as u64 - kept);
            prop_assert_eq!(s.duplicates, dups.len() as u64);
        }
    }
}
