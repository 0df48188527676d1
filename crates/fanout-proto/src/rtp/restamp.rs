//! One continuous RTP stream out of an upstream that comes and goes.
//!
//! An RTSP upstream that reconnects, or a publisher that restarts, starts over with a new
//! SSRC, sequence numbers and timestamps. A player that was told `RTP-Info: seq=…;rtptime=…`
//! would see that as a different stream (or a huge gap) and stall. [`Restamp`] rewrites every
//! packet into one stream: the first SSRC it saw, sequence numbers that go on by one across
//! the break, and timestamps that go on by the wall time that passed. Within one upstream
//! stream the offsets are fixed, so loss and reordering stay visible to the clients.
//!
//! The first packet goes out with the sequence number and timestamp given at creation, so
//! a client that PLAYs before any packet arrived can still be told them in `RTP-Info`.

use crate::rtp::{RtpError, RtpView};

#[derive(Debug, Clone)]
pub struct Restamp {
    /// RTP clock rate of the stream (Hz), to turn a pause into timestamp units.
    clock: u32,
    out_ssrc: Option<u32>,
    in_ssrc: u32,
    seq_off: u16,
    ts_off: u32,
    /// What the first packet will carry.
    start: (u16, u32),
    /// The newest packet sent out (by extended order): sequence number, timestamp, when.
    last: Option<(u16, u32, u64)>,
    /// The next packet starts a new upstream stream even if its SSRC is the same.
    broken: bool,
    /// How many times the upstream stream changed (SSRC change or announced break).
    pub breaks: u64,
}

impl Restamp {
    /// `start`: the sequence number and timestamp of the first packet out (RFC 3550 wants
    /// them random).
    pub fn new(clock_rate: u32, start: (u16, u32)) -> Self {
        Self {
            clock: clock_rate.max(1),
            out_ssrc: None,
            in_ssrc: 0,
            seq_off: 0,
            ts_off: 0,
            start,
            last: None,
            broken: false,
            breaks: 0,
        }
    }

    /// The sequence number and timestamp the first packet will carry, until it passed.
    pub fn planned_start(&self) -> Option<(u16, u32)> {
        self.out_ssrc.is_none().then_some(self.start)
    }

    /// The upstream reconnected: whatever comes next is a new stream.
    pub fn discontinuity(&mut self) {
        self.broken = true;
    }

    /// The SSRC the clients see, once the first packet passed.
    pub fn ssrc(&self) -> Option<u32> {
        self.out_ssrc
    }

    /// Maps RTP time `ts` of the stream `ssrc` onto the clients' timeline (for sender
    /// reports): only for the stream being joined now, once its first packet set the map. A
    /// new publisher's report that comes before its first packet (or another stream's) would
    /// be mapped with the last stream's offset, hours off: `None`.
    /// The SSRC of the upstream stream followed now (`None` before its first packet, or
    /// when the next packet starts a new one): whom a request about it names.
    pub fn source_ssrc(&self) -> Option<u32> {
        (self.out_ssrc.is_some() && !self.broken).then_some(self.in_ssrc)
    }

    pub fn map_ts(&self, ssrc: u32, ts: u32) -> Option<u32> {
        (self.out_ssrc.is_some() && !self.broken && ssrc == self.in_ssrc).then(|| ts.wrapping_add(self.ts_off))
    }

    /// Rewrites `pkt` in place. `now_ms` is any monotonic clock in milliseconds.
    pub fn apply(&mut self, pkt: &mut [u8], now_ms: u64) -> Result<(), RtpError> {
        let v = RtpView::parse(pkt)?;
        let (ssrc, seq, ts) = (v.ssrc(), v.sequence_number(), v.timestamp());
        match (self.out_ssrc, self.last) {
            (None, _) => {
                self.out_ssrc = Some(ssrc);
                self.in_ssrc = ssrc;
                self.seq_off = self.start.0.wrapping_sub(seq);
                self.ts_off = self.start.1.wrapping_sub(ts);
            }
            (Some(_), Some((lseq, lts, lat))) if ssrc != self.in_ssrc || self.broken => {
                // Join the new stream to the end of the old one.
                let gap = now_ms.saturating_sub(lat).saturating_mul(u64::from(self.clock)) / 1000;
                let gap = gap.clamp(1, u64::from(u32::MAX / 2)) as u32;
                self.seq_off = lseq.wrapping_add(1).wrapping_sub(seq);
                self.ts_off = lts.wrapping_add(gap).wrapping_sub(ts);
                self.in_ssrc = ssrc;
                self.breaks += 1;
            }
            _ => {}
        }
        self.broken = false;
        let (oseq, ots) = (seq.wrapping_add(self.seq_off), ts.wrapping_add(self.ts_off));
        // Only a newer packet moves the end of the stream (a late one does not).
        if self.last.is_none_or(|(l, _, _)| (oseq.wrapping_sub(l) as i16) > 0) {
            self.last = Some((oseq, ots, now_ms));
        }
        pkt[2..4].copy_from_slice(&oseq.to_be_bytes());
        pkt[4..8].copy_from_slice(&ots.to_be_bytes());
        pkt[8..12].copy_from_slice(&self.out_ssrc.unwrap_or(ssrc).to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pkt(ssrc: u32, seq: u16, ts: u32) -> Vec<u8> {
        let mut p = vec![0x80, 96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xAA];
        p[2..4].copy_from_slice(&seq.to_be_bytes());
        p[4..8].copy_from_slice(&ts.to_be_bytes());
        p[8..12].copy_from_slice(&ssrc.to_be_bytes());
        p
    }

    /// A sender report maps only for the stream being joined, after its first packet.
    #[test]
    fn reports_map_only_for_the_stream_in_place() {
        let mut r = Restamp::new(90_000, (100, 1000));
        assert_eq!(r.map_ts(7, 50), None, "no packet yet");
        r.apply(&mut pkt(7, 1, 50), 0).unwrap();
        assert_eq!(r.map_ts(7, 60), Some(1010));
        r.discontinuity();
        assert_eq!(r.map_ts(7, 60), None, "a new publisher, before its first packet");
        assert_eq!(r.map_ts(9, 60), None);
        r.apply(&mut pkt(9, 500, 5_000_000), 1000).unwrap();
        assert_eq!(r.map_ts(7, 60), None, "the old stream's");
        assert_eq!(r.map_ts(9, 5_000_000), Some(1000 + 90_000));
    }

    fn out(p: &[u8]) -> (u32, u16, u32) {
        let v = RtpView::parse(p).unwrap();
        (v.ssrc(), v.sequence_number(), v.timestamp())
    }

    #[test]
    fn a_new_ssrc_continues_the_old_stream() {
        let mut r = Restamp::new(90_000, (100, 1000));
        assert_eq!(r.planned_start(), Some((100, 1000)));
        let mut a = pkt(1, 5, 77);
        r.apply(&mut a, 0).unwrap();
        assert_eq!(out(&a), (1, 100, 1000));
        assert_eq!(r.planned_start(), None);
        let mut b = pkt(1, 6, 3077);
        r.apply(&mut b, 33).unwrap();
        // The upstream restarts 500 ms later with another SSRC and numbering.
        let mut c = pkt(7, 60_000, 123);
        r.apply(&mut c, 533).unwrap();
        assert_eq!(out(&c), (1, 102, 4000 + 45_000));
        assert_eq!(r.breaks, 1);
        // Payload untouched.
        assert_eq!(c[12], 0xAA);
    }

    #[test]
    fn an_announced_break_rebases_even_with_the_same_ssrc() {
        let mut r = Restamp::new(8000, (10, 0));
        let mut a = pkt(5, 10, 0);
        r.apply(&mut a, 0).unwrap();
        r.discontinuity();
        let mut b = pkt(5, 9000, 777);
        r.apply(&mut b, 1000).unwrap();
        assert_eq!(out(&b), (5, 11, 8000));
    }

    #[test]
    fn garbage_is_refused_untouched() {
        let mut r = Restamp::new(90_000, (0, 0));
        let mut g = vec![0x40, 1, 2];
        assert!(r.apply(&mut g, 0).is_err());
        assert_eq!(g, vec![0x40, 1, 2]);
        assert_eq!(r.ssrc(), None);
    }

    proptest! {
        /// Whatever the upstream segments look like, the clients see one SSRC and sequence
        /// numbers that go up by exactly one per packet when each segment is in order.
        #[test]
        fn segments_join_into_one_gapless_stream(
            segs in proptest::collection::vec((any::<u32>(), any::<u16>(), any::<u32>(), 1usize..50, any::<bool>()), 1..8),
            start in any::<u16>(),
            start_ts in any::<u32>(),
        ) {
            let mut r = Restamp::new(90_000, (start, start_ts));
            let mut prev: Option<(u16, u32)> = None;
            let mut first_ssrc = None;
            let mut now = 0;
            for (k, (ssrc, seq0, ts0, n, announce)) in segs.into_iter().enumerate() {
                // Segments differ in SSRC unless announced, as a reconnect is.
                let ssrc = (k as u32) << 24 | (ssrc & 0xff_ffff);
                if announce { r.discontinuity(); }
                for i in 0..n {
                    now += 20;
                    let mut p = pkt(ssrc, seq0.wrapping_add(i as u16), ts0.wrapping_add(i as u32 * 1800));
                    r.apply(&mut p, now).unwrap();
                    let (s, q, t) = out(&p);
                    prop_assert_eq!(s, *first_ssrc.get_or_insert(s));
                    if prev.is_none() {
                        prop_assert_eq!((q, t), (start, start_ts));
                    }
                    if let Some((pq, pt)) = prev {
                        prop_assert_eq!(q, pq.wrapping_add(1));
                        // Time never jumps backwards by the rewrite.
                        prop_assert!((t.wrapping_sub(pt) as i32) >= 0);
                    }
                    prev = Some((q, t));
                }
            }
        }
    }
}
