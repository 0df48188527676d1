//! Decoding times for video that comes with presentation times only. RTP gives each picture
//! the time it is shown; with B-frames pictures come (in decoding order) ahead of pictures
//! shown before them, and MPEG-TS wants a decoding time for each that rises strictly and
//! never passes its presentation time. Sans-IO: pictures in, pictures with decoding times
//! out, held back by as many pictures as the stream reorders (none once a stream has shown
//! it has no B-frames).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// The most pictures a picture may come ahead of its place (x264's B-pyramids need 2, its
/// longest B runs 16; a stream reordering more gets times clamped, not held longer).
const MAX_DEPTH: usize = 16;
/// Pictures held while a stream's reordering is still being learned: its first pictures
/// decide how far decoding runs behind presentation, and a B-frame found later than this
/// would have to be clamped.
const FIRST_DEPTH: usize = 4;
/// After this many pictures the stream's reordering is taken as known.
const LEARNING: u64 = 64;
/// A presentation time this far (90 kHz) from a recent one is a new timeline, not reordering.
const JUMP_90K: i64 = 90_000;

/// The decoding times of one video stream.
pub struct DecodingTimes<T> {
    /// Held pictures in decoding (arrival) order, with their presentation times.
    held: VecDeque<(i64, T)>,
    /// The presentation times held, smallest first.
    times: BinaryHeap<Reverse<i64>>,
    /// The presentation times of the last `MAX_DEPTH` pictures, in arrival order.
    recent: VecDeque<i64>,
    /// The most pictures one came ahead of its place.
    depth: usize,
    /// How far decoding runs behind presentation (90 kHz): only grows on one timeline.
    lag: i64,
    last: Option<i64>,
    seen: u64,
    /// The held presentation times sorted (kept to spare an allocation per picture).
    sorted: Vec<i64>,
}

impl<T> Default for DecodingTimes<T> {
    fn default() -> Self {
        Self {
            held: VecDeque::new(),
            times: BinaryHeap::new(),
            recent: VecDeque::new(),
            depth: 0,
            lag: 0,
            last: None,
            seen: 0,
            sorted: Vec::new(),
        }
    }
}

impl<T> DecodingTimes<T> {
    /// Takes the next picture (presentation time `time`, 90 kHz, in decoding order); passes
    /// the pictures that can now be written to `out` as `(presentation, decoding, picture)`.
    pub fn push(&mut self, time: i64, picture: T, mut out: impl FnMut(i64, i64, T)) {
        if self.recent.iter().any(|&t| (time - t).abs() > JUMP_90K) {
            // A new timeline: what is held goes out on the old one, and learning starts over.
            self.release(0, &mut out);
            self.recent.clear();
            (self.lag, self.last, self.seen, self.depth) = (0, None, 0, 0);
        }
        let ahead = self.recent.iter().filter(|&&t| t > time).count();
        self.depth = self.depth.max(ahead).min(MAX_DEPTH);
        if self.recent.len() == MAX_DEPTH {
            self.recent.pop_front();
        }
        self.recent.push_back(time);
        self.seen += 1;
        self.held.push_back((time, picture));
        self.times.push(Reverse(time));
        let hold = if self.seen < LEARNING { self.depth.max(FIRST_DEPTH) } else { self.depth };
        self.release(hold, &mut out);
    }

    /// Writes held pictures until `keep` are left.
    fn release(&mut self, keep: usize, out: &mut impl FnMut(i64, i64, T)) {
        if self.held.len() <= keep {
            return;
        }
        // Decoding runs behind presentation by the most any held picture is shown before
        // the time its turn gets (known for those with `depth` pictures after them).
        self.sorted.clear();
        self.sorted.extend(self.times.iter().map(|r| r.0));
        self.sorted.sort_unstable();
        let known = self.held.len().saturating_sub(self.depth).max(1);
        let behind =
            self.held.iter().zip(&self.sorted).take(known).map(|((shown, _), turn)| turn - shown).max().unwrap_or(0);
        self.lag = self.lag.max(behind).min(JUMP_90K);
        while self.held.len() > keep {
            let (Some((shown, picture)), Some(Reverse(turn))) = (self.held.pop_front(), self.times.pop()) else {
                break;
            };
            let mut dts = turn - self.lag;
            if let Some(last) = self.last {
                dts = dts.max(last + 1);
            }
            // (A stream reordering past what was learned: clamped here, once.)
            let dts = dts.min(shown);
            self.last = Some(dts);
            out(shown, dts, picture);
        }
    }

    /// Pictures held back now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FRAME: i64 = 3600;

    fn run(order: &[i64]) -> Vec<(i64, i64, usize)> {
        let mut d = DecodingTimes::default();
        let mut out = Vec::new();
        for (k, &t) in order.iter().enumerate() {
            d.push(t * FRAME, k, |p, dts, k| out.push((p, dts, k)));
        }
        out
    }

    /// Presentation times (in frames) in decoding order: anchors `b + 1` frames apart, each
    /// followed by the `b` B-frames shown before it; with `pyramid` (and `b == 3`), the
    /// middle one first, as a reference for the other two.
    fn pattern(b: i64, anchors: i64, pyramid: bool) -> Vec<i64> {
        let mut v = vec![0];
        for a in 1..=anchors {
            let at = a * (b + 1);
            v.push(at);
            if pyramid && b == 3 {
                v.extend([at - 2, at - 3, at - 1]);
            } else {
                v.extend(at - b..at);
            }
        }
        v
    }

    fn check(out: &[(i64, i64, usize)], n: usize) {
        assert!(out.iter().enumerate().all(|(k, o)| o.2 == k), "in arrival order");
        assert!(out.windows(2).all(|w| w[1].1 > w[0].1), "decoding times rise: {out:?}");
        assert!(out.iter().all(|o| o.1 <= o.0), "decoded before shown: {out:?}");
        assert!(out.len() + MAX_DEPTH >= n, "{} of {n} out", out.len());
    }

    #[test]
    fn b_frames_decode_one_frame_behind() {
        let order = pattern(2, 40, false);
        let out = run(&order);
        check(&out, order.len());
        // I0 P3 B1 B2 ...: decoding times are the presentation times in order, a frame back.
        let dts: Vec<i64> = out.iter().take(6).map(|o| o.1 / FRAME).collect();
        assert_eq!(dts, [-1, 0, 1, 2, 3, 4]);
    }

    #[test]
    fn without_b_frames_pictures_go_out_as_they_come_once_learned() {
        let mut d = DecodingTimes::default();
        let mut out = Vec::new();
        for k in 0..200i64 {
            d.push(k * FRAME, k, |p, dts, _| out.push((p, dts)));
            if k as u64 >= LEARNING {
                assert_eq!(d.held(), 0);
            }
        }
        assert!(out.iter().all(|(p, dts)| p == dts));
    }

    #[test]
    fn a_jump_back_is_a_new_timeline() {
        let mut order = pattern(1, 10, false);
        order.extend(pattern(1, 10, false).iter().map(|t| t - 100));
        let out = run(&order);
        let at = out.iter().position(|o| o.0 < 0).unwrap();
        assert_eq!(at, order.len() / 2, "what the first timeline held goes out before the second");
        assert!(out[..at].windows(2).all(|w| w[1].1 > w[0].1));
        assert!(out[at..].windows(2).all(|w| w[1].1 > w[0].1));
        assert!(out.iter().all(|o| o.1 <= o.0));
    }

    proptest! {
        /// Any reordering up to the held depth, on one timeline: strictly rising decoding
        /// times, never after presentation, nothing lost or reordered.
        #[test]
        fn decoding_times_rise_and_precede_presentation(b in 0i64..4, pyramid in any::<bool>(), anchors in 1i64..30) {
            let order = pattern(b, anchors, pyramid);
            check(&run(&order), order.len());
        }

        /// Times that make no sense never break the rules either.
        #[test]
        fn any_times(times in proptest::collection::vec(-200_000i64..200_000, 0..200)) {
            let mut d = DecodingTimes::default();
            let mut out = Vec::new();
            for (k, t) in times.iter().enumerate() {
                d.push(*t, k, |p, dts, k| out.push((p, dts, k)));
            }
            prop_assert!(out.iter().all(|o| o.1 <= o.0));
            prop_assert!(out.iter().enumerate().all(|(k, o)| o.2 == k));
            prop_assert!(out.len() + MAX_DEPTH >= times.len());
        }
    }
}
