//! Per-subscriber layer adaptation, sans-IO (issue 6; the Oslo thesis, chapter 5):
//!
//! - [`LayerRates`]: the stream's bit rate per layer, a moving average over 200 ms windows,
//!   `new = (15·old + sample) / 16`, as the thesis keeps it.
//! - [`LayerSelector`]: a subscriber's allowance (the highest layer it gets) from its RTCP
//!   receiver reports. `Thesis` mode is the thesis's rule: estimate the bandwidth from the
//!   bytes sent and the loss, pick the first operating point whose cumulative rate
//!   overshoots it, move one step per report. `Aimd` mode is ours: the estimate falls by a
//!   factor on loss and grows by a step without, the target never overshoots it, a fall is
//!   taken at once, and a rise waits for a packet the decoder can switch at.
//! - [`SeqRewriter`]: sequence numbers with the deliberately dropped packets taken out, so
//!   a subscriber neither reports them as lost nor waits for them.

use crate::codec::layers::{Layer, PacketLayer};
use std::collections::BTreeMap;

/// The thesis's window.
pub const WINDOW_MS: u64 = 200;

/// Whether `l` is part of the operating point `max` (every id at most `max`'s).
pub fn within(l: Layer, max: Layer) -> bool {
    l.did <= max.did && l.qid <= max.qid && l.tid <= max.tid
}

/// Every layer there can be: the allowance of a subscriber nothing holds back.
pub const ALL: Layer = Layer { did: 7, qid: 15, tid: 7 };

/// The operating point inside both `a` and `b`.
pub fn meet(a: Layer, b: Layer) -> Layer {
    Layer { did: a.did.min(b.did), qid: a.qid.min(b.qid), tid: a.tid.min(b.tid) }
}

#[derive(Debug, Default, Clone)]
pub struct LayerRates {
    window_start: Option<u64>,
    /// Bytes in the current window, per layer (`None`: not layered, everyone gets it).
    bytes: BTreeMap<Option<Layer>, u64>,
    /// Moving averages, bits per second.
    avg: BTreeMap<Option<Layer>, f64>,
}

impl LayerRates {
    /// Counts one packet of the stream.
    pub fn record(&mut self, pl: PacketLayer, bytes: usize, now_ms: u64) {
        self.roll(now_ms);
        let key = match pl {
            PacketLayer::Media { layer, .. } => Some(layer),
            PacketLayer::NotLayered | PacketLayer::Unknown => None,
        };
        *self.bytes.entry(key).or_default() += bytes as u64;
    }

    /// Closes every window that ended by `now_ms` into the averages.
    pub fn roll(&mut self, now_ms: u64) {
        let start = *self.window_start.get_or_insert(now_ms);
        if now_ms < start + WINDOW_MS {
            return;
        }
        let windows = (now_ms - start) / WINDOW_MS;
        for _ in 0..windows.min(64) {
            let keys: std::collections::BTreeSet<_> = self.avg.keys().chain(self.bytes.keys()).copied().collect();
            for k in keys {
                let sample = self.bytes.remove(&k).unwrap_or(0) as f64 * 8.0 * 1000.0 / WINDOW_MS as f64;
                let a = self.avg.entry(k).or_insert(sample);
                *a = (*a * 15.0 + sample) / 16.0;
            }
        }
        self.window_start = Some(start + windows * WINDOW_MS);
    }

    /// Bits per second of one layer (`None`: what is not layered).
    pub fn rate(&self, layer: Option<Layer>) -> f64 {
        self.avg.get(&layer).copied().unwrap_or(0.0)
    }

    /// Bits per second a subscriber allowed up to `max` receives.
    pub fn cumulative(&self, max: Layer) -> f64 {
        self.avg.iter().filter(|(k, _)| k.is_none_or(|l| within(l, max))).map(|(_, v)| v).sum()
    }

    /// The operating points (every layer seen), cheapest first.
    pub fn ladder(&self) -> Vec<Layer> {
        let mut v: Vec<Layer> = self.avg.keys().filter_map(|k| *k).collect();
        v.sort_by(|a, b| self.cumulative(*a).total_cmp(&self.cumulative(*b)).then(a.cmp(b)));
        v
    }

    /// Averages as (layer, bits per second), for the status API.
    pub fn rates(&self) -> Vec<(Option<Layer>, f64)> {
        self.avg.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// What happened to a subscriber since its last receiver report.
#[derive(Debug, Clone, Copy, Default)]
pub struct Interval {
    pub seconds: f64,
    pub bytes_sent: u64,
    pub packets_sent: u64,
    /// Lost as the subscriber reports it (its cumulative loss, minus the last report's).
    pub packets_lost: u64,
    /// Dropped on purpose in the interval: the thesis subtracts them from the reported
    /// loss; with [`SeqRewriter`] the subscriber never counts them, so this stays 0.
    pub packets_dropped: u64,
}

impl Interval {
    /// The thesis's estimate (§5.3): bytes_sent/time × (sent − (lost − dropped)) / sent, in
    /// bits per second.
    pub fn thesis_bandwidth(&self) -> f64 {
        if self.seconds <= 0.0 || self.packets_sent == 0 {
            return 0.0;
        }
        let real_loss = self.packets_lost.saturating_sub(self.packets_dropped) as f64;
        let sent = self.packets_sent as f64;
        self.bytes_sent as f64 * 8.0 / self.seconds * ((sent - real_loss).max(0.0) / sent)
    }

    pub fn loss_fraction(&self) -> f64 {
        let real_loss = self.packets_lost.saturating_sub(self.packets_dropped) as f64;
        if self.packets_sent == 0 {
            0.0
        } else {
            (real_loss / self.packets_sent as f64).min(1.0)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Thesis,
    Aimd,
}

/// AIMD: loss above this fraction is congestion.
const LOSS_THRESHOLD: f64 = 0.02;
/// AIMD: the estimate after congestion, against what got through.
const DECREASE: f64 = 0.85;
/// AIMD: growth per loss-free report, as a fraction of the estimate (at least 20 kbit/s).
const INCREASE: f64 = 0.08;
/// AIMD: a rise is on trial for this many reports; loss above `TRIAL_LOSS` in them fails
/// it (a probe is told by less loss than congestion, so it costs little), and no further
/// rise is taken meanwhile, so that a loss has one rise to blame. Congestion fails the
/// newest rise that has not yet lasted `PROVEN` reports (a queue may take a while to
/// overflow).
const RISE_TRIAL: u32 = 2;
const TRIAL_LOSS: f64 = 0.005;
const PROVEN: u32 = 64;
/// AIMD: after its n-th failure in a row a point is not tried again for 2^(2n+1) reports
/// (8, 32, then 128): probing a link that cannot carry the next point costs loss each
/// time, so it is done ever more rarely.
const MAX_HOLD_SHIFT: u32 = 7;
/// AIMD: the estimate grows to at most this many times the whole stream's rate.
const ESTIMATE_CAP: f64 = 1.5;
/// An estimate from congestion feedback: a rise needs this much of it to fit.
const HEADROOM: f64 = 0.85;

#[derive(Debug, Clone)]
pub struct LayerSelector {
    mode: Mode,
    /// The allowance now; `None` until the first report (everything passes).
    allowance: Option<Layer>,
    /// A higher allowance waiting for a packet where the decoder can switch up.
    pending_up: Option<Layer>,
    /// A maximum set through the control API.
    pub pin: Option<Layer>,
    estimate_bps: Option<f64>,
    /// Reports so far.
    reports: u32,
    /// AIMD: the rises not yet proven (to which point, at which report), oldest first;
    /// the newest is the highest point in effect.
    rises: Vec<(Layer, u32)>,
    /// AIMD: points whose rise failed: failures in a row, and the report they may be tried
    /// again at.
    holds: BTreeMap<Layer, (u32, u32)>,
}

impl LayerSelector {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            allowance: None,
            pending_up: None,
            pin: None,
            estimate_bps: None,
            reports: 0,
            rises: Vec::new(),
            holds: BTreeMap::new(),
        }
    }

    pub fn allowance(&self) -> Option<Layer> {
        self.allowance
    }

    pub fn estimate_bps(&self) -> Option<f64> {
        self.estimate_bps
    }

    /// Where it is heading: a rise waiting for its switch point, else the allowance.
    pub fn target(&self) -> Option<Layer> {
        self.pending_up.or(self.allowance)
    }

    /// What [`LayerSelector::forward`] changes (the allowance and a waiting rise), to be put
    /// back with [`LayerSelector::rewind`] when the decisions since must be taken again.
    pub fn switch_state(&self) -> (Option<Layer>, Option<Layer>) {
        (self.allowance, self.pending_up)
    }

    pub fn rewind(&mut self, state: (Option<Layer>, Option<Layer>)) {
        (self.allowance, self.pending_up) = state;
    }

    /// Takes a waiting rise now: for a caller that applies switch points itself (the
    /// kernel path's program does).
    pub fn commit(&mut self) {
        if let Some(up) = self.pending_up.take() {
            self.allowance = Some(up);
        }
    }

    /// Caps (or, with `None`, uncaps) the allowance from the control plane. A cap takes
    /// effect at once; lifting it is a rise, taken at a switch point, up to what the
    /// reports allow (everything while there were none).
    pub fn set_pin(&mut self, pin: Option<Layer>) {
        self.pin = pin;
        match pin {
            Some(p) => {
                self.allowance = Some(self.allowance.map_or(p, |a| meet(a, p)));
                self.pending_up = self.pending_up.map(|u| meet(u, p)).filter(|u| Some(*u) != self.allowance);
            }
            None if self.estimate_bps.is_none() && self.allowance.is_some() => self.pending_up = Some(ALL),
            None => {}
        }
    }

    /// A receiver report arrived: re-estimates and re-targets. Returns the allowance (or
    /// the one waiting for a switch point).
    pub fn on_report(&mut self, iv: &Interval, rates: &LayerRates) -> Option<Layer> {
        let ladder = rates.ladder();
        if ladder.is_empty() {
            return self.allowance;
        }
        let cur = self.allowance.and_then(|a| ladder.iter().position(|l| *l == a)).unwrap_or(ladder.len() - 1);
        let got = iv.thesis_bandwidth();
        let target = match self.mode {
            Mode::Thesis => {
                self.estimate_bps = Some(got);
                // The first point whose cumulative rate overshoots the estimate (or the top).
                let t = ladder.iter().position(|l| rates.cumulative(*l) > got).unwrap_or(ladder.len() - 1);
                // One step per report.
                if t > cur {
                    cur + 1
                } else if t < cur {
                    cur - 1
                } else {
                    cur
                }
            }
            Mode::Aimd => {
                self.reports += 1;
                let loss = iv.loss_fraction();
                let congested = loss > LOSS_THRESHOLD;
                // The newest unproven rise: loss above TRIAL_LOSS on its trial, or
                // congestion, fails it and holds its point off.
                let failed = match self.rises.last() {
                    Some(&(to, at)) if congested || loss > TRIAL_LOSS && self.reports <= at + RISE_TRIAL => {
                        let fails = self.holds.get(&to).map_or(0, |h| h.0) + 1;
                        self.holds.insert(to, (fails, self.reports + (1 << (2 * fails + 1).min(MAX_HOLD_SHIFT))));
                        self.rises.pop();
                        true
                    }
                    _ => false,
                };
                let reports = self.reports;
                self.rises.retain(|&(to, at)| {
                    let proven = reports > at + PROVEN;
                    if proven {
                        self.holds.remove(&to);
                    }
                    !proven
                });
                let held = ladder.iter().position(|l| self.holds.get(l).is_some_and(|h| h.1 > self.reports));
                let e = match (self.estimate_bps, congested || failed) {
                    (_, true) => got * DECREASE,
                    (None, false) => got.max(rates.cumulative(ladder[cur])),
                    (Some(e), false) => e.max(got) + (e * INCREASE).max(20_000.0),
                };
                // It grows no further than what a held point showed the link cannot carry,
                // nor far beyond the whole stream.
                let ceiling = match held {
                    Some(h) => rates.cumulative(ladder[h]),
                    None => ESTIMATE_CAP * rates.cumulative(ladder[ladder.len() - 1]),
                };
                let e = e.min(ceiling);
                self.estimate_bps = Some(e);
                // The highest point that fits, below any held one; the base if none does.
                let mut fits = ladder.iter().rposition(|l| rates.cumulative(*l) <= e).unwrap_or(0);
                if let Some(h) = held {
                    fits = fits.min(h.saturating_sub(1));
                }
                // Up one step at most, once the last rise is through its trial.
                let trial_over = self.rises.last().is_none_or(|&(_, at)| self.reports > at + RISE_TRIAL);
                if fits > cur && trial_over {
                    self.rises.push((ladder[cur + 1], self.reports));
                    cur + 1
                } else {
                    fits.min(cur)
                }
            }
        };
        self.aim(&ladder, ladder[target])
    }

    /// A bandwidth estimate from the subscriber's congestion feedback (transport-wide
    /// congestion control, REMB), in bits per second: the highest point whose rate fits in
    /// it. A fall is taken when the point in effect no longer fits; a rise only to a point
    /// that fits with `HEADROOM` to spare, so an estimate hovering at a point's rate does
    /// not switch back and forth. Returns the allowance, as [`LayerSelector::on_report`].
    pub fn on_estimate(&mut self, bps: f64, rates: &LayerRates) -> Option<Layer> {
        let ladder = rates.ladder();
        if ladder.is_empty() || !bps.is_finite() {
            return self.allowance;
        }
        self.estimate_bps = Some(bps);
        let cur = self.target().and_then(|a| ladder.iter().position(|l| *l == a)).unwrap_or(ladder.len() - 1);
        let fits = |e: f64| ladder.iter().rposition(|l| rates.cumulative(*l) <= e).unwrap_or(0);
        let target = if rates.cumulative(ladder[cur]) > bps { fits(bps) } else { fits(bps * HEADROOM).max(cur) };
        self.aim(&ladder, ladder[target])
    }

    /// Heads for `want` (within the pin): down at once, up at the next switch point.
    fn aim(&mut self, ladder: &[Layer], mut want: Layer) -> Option<Layer> {
        if let Some(pin) = self.pin {
            if !within(want, pin) {
                want = ladder.iter().rev().find(|l| within(**l, pin)).copied().unwrap_or(ladder[0]);
            }
        }
        // Rises above where it is heading are no longer in effect, so no loss is theirs.
        let to = ladder.iter().position(|l| *l == want);
        self.rises.retain(|(r, _)| ladder.iter().position(|l| l == r) <= to);
        match self.allowance {
            // Down (or the first report): at once. Up: at the next switch point.
            Some(a) if !within(want, a) => self.pending_up = Some(want),
            _ => {
                self.allowance = Some(want);
                self.pending_up = None;
            }
        }
        self.allowance
    }

    /// Whether to send this packet; a pending rise happens here, at a packet the decoder
    /// can follow: an IDR for a higher dependency layer, a base-temporal (tid 0) picture for
    /// a higher temporal layer.
    pub fn forward(&mut self, pl: PacketLayer) -> bool {
        let PacketLayer::Media { layer, idr } = pl else { return true };
        if let (Some(up), Some(a)) = (self.pending_up, self.allowance) {
            let spatial_ok = up.did <= a.did && up.qid <= a.qid || idr;
            let temporal_ok = up.tid <= a.tid || layer.tid == 0;
            if spatial_ok && temporal_ok {
                self.allowance = Some(up);
                self.pending_up = None;
            }
        }
        self.allowance.is_none_or(|a| within(layer, a))
    }
}

/// Per-subscriber sequence numbers without the packets dropped on purpose.
#[derive(Debug, Clone, Copy, Default)]
pub struct SeqRewriter {
    dropped: u16,
}

impl SeqRewriter {
    /// One that continues a numbering that already left out `dropped` packets (a sink moved
    /// from the kernel program's renumbering to user space's).
    pub fn continuing(dropped: u16) -> Self {
        Self { dropped }
    }

    /// A packet is dropped on purpose.
    pub fn drop_one(&mut self) {
        self.dropped = self.dropped.wrapping_add(1);
    }

    /// The sequence number a forwarded packet carries to this subscriber.
    pub fn forward(&self, seq: u16) -> u16 {
        seq.wrapping_sub(self.dropped)
    }

    /// Dropped so far (mod 2^16): what a sender report's packet count must leave out.
    pub fn dropped(&self) -> u16 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn l(did: u8, tid: u8) -> Layer {
        Layer { did, qid: 0, tid }
    }

    fn media(did: u8, tid: u8) -> PacketLayer {
        PacketLayer::Media { layer: l(did, tid), idr: false }
    }

    /// A loss-free report interval of 5 s in which `kbps` got through.
    fn clean(kbps: u64) -> Interval {
        Interval {
            seconds: 5.0,
            bytes_sent: kbps * 1000 / 8 * 5,
            packets_sent: 500,
            packets_lost: 0,
            packets_dropped: 0,
        }
    }

    /// A steady stream: 100 kbit/s base, 200 kbit/s enhancement, 20 kbit/s parameter sets.
    fn steady() -> LayerRates {
        let mut r = LayerRates::default();
        for ms in (0..20_000).step_by(10) {
            r.record(media(0, 0), 125, ms); // 125 B / 10 ms = 100 kbit/s
            r.record(media(1, 0), 250, ms);
            if ms % 100 == 0 {
                r.record(PacketLayer::NotLayered, 250, ms);
            }
        }
        r.roll(20_000);
        r
    }

    #[test]
    fn moving_averages_converge_to_the_rates() {
        let r = steady();
        assert!((r.rate(Some(l(0, 0))) - 100_000.0).abs() < 1_000.0, "{:?}", r.rates());
        assert!((r.rate(Some(l(1, 0))) - 200_000.0).abs() < 2_000.0);
        assert!((r.rate(None) - 20_000.0).abs() < 500.0);
        assert!((r.cumulative(l(0, 0)) - 120_000.0).abs() < 2_000.0);
        assert_eq!(r.ladder(), vec![l(0, 0), l(1, 0)]);
        // (15·old + sample)/16: one silent window takes a sixteenth off.
        let mut q = r.clone();
        q.roll(20_200);
        assert!((q.rate(Some(l(0, 0))) - r.rate(Some(l(0, 0))) * 15.0 / 16.0).abs() < 1.0);
    }

    #[test]
    fn the_thesis_example_estimate() {
        // 800 kB sent in 1 s, 200 packets dropped on purpose, 300 reported lost of 1000.
        let iv =
            Interval { seconds: 1.0, bytes_sent: 800_000, packets_sent: 1000, packets_lost: 300, packets_dropped: 200 };
        assert!((iv.thesis_bandwidth() - 720_000.0 * 8.0).abs() < 1.0);
    }

    #[test]
    fn aimd_falls_at_once_and_rises_one_step_at_a_switch_point() {
        let rates = steady();
        let mut s = LayerSelector::new(Mode::Aimd);
        // A 150 kbit/s link: heavy loss on the full 320 kbit/s.
        let congested =
            Interval { seconds: 5.0, bytes_sent: 200_000, packets_sent: 1000, packets_lost: 500, packets_dropped: 0 };
        assert_eq!(s.on_report(&congested, &rates), Some(l(0, 0)));
        assert!(!s.forward(media(1, 0)) && s.forward(media(0, 0)) && s.forward(PacketLayer::NotLayered));
        // Loss-free reports: the estimate grows until the enhancement fits, then the rise
        // waits for an IDR.
        let mut reports = 0;
        while s.pending_up.is_none() && reports < 50 {
            s.on_report(&clean(120), &rates);
            reports += 1;
        }
        assert!(s.pending_up == Some(l(1, 0)), "{s:?}");
        assert!(!s.forward(media(1, 0)), "no switch without an IDR");
        assert!(s.forward(PacketLayer::Media { layer: l(1, 0), idr: true }));
        assert_eq!(s.allowance(), Some(l(1, 0)));
    }

    #[test]
    fn the_thesis_rule_moves_one_step_per_report_and_overshoots() {
        let rates = steady();
        let mut s = LayerSelector::new(Mode::Thesis);
        // 150 kbit/s got through: the first point overshooting it is the top one (320k).
        assert_eq!(s.on_report(&clean(150), &rates), Some(l(1, 0)), "the thesis keeps the overshooting layer");
        assert_eq!(s.on_report(&clean(50), &rates), Some(l(0, 0)));
    }

    #[test]
    fn a_pin_caps_the_allowance() {
        let rates = steady();
        let mut s = LayerSelector::new(Mode::Aimd);
        s.pin = Some(l(0, 7));
        let iv =
            Interval { seconds: 5.0, bytes_sent: 10_000_000, packets_sent: 5000, packets_lost: 0, packets_dropped: 0 };
        assert_eq!(s.on_report(&iv, &rates), Some(l(0, 0)));
        assert!(!s.forward(media(1, 0)));
    }

    #[test]
    fn a_pin_through_the_control_plane_acts_at_once_and_its_release_waits_for_a_switch_point() {
        let mut s = LayerSelector::new(Mode::Aimd);
        assert!(s.forward(media(1, 2)), "no reports, no pin: everything passes");
        s.set_pin(Some(l(0, 0)));
        assert!(!s.forward(media(1, 0)) && !s.forward(media(0, 1)) && s.forward(media(0, 0)));
        s.set_pin(None);
        assert!(!s.forward(media(0, 1)), "a rise waits for a switch point");
        assert!(s.forward(PacketLayer::Media { layer: l(0, 0), idr: true }));
        assert!(s.forward(media(1, 2)));
        assert_eq!(s.allowance(), Some(ALL));
    }

    #[test]
    fn a_point_whose_rise_fails_is_tried_ever_more_rarely() {
        let rates = steady();
        let mut s = LayerSelector::new(Mode::Aimd);
        // A link that carries the base (120k) but not the enhancement (320k).
        let lossy =
            Interval { seconds: 1.0, bytes_sent: 40_000, packets_sent: 100, packets_lost: 30, packets_dropped: 0 };
        assert_eq!(s.on_report(&lossy, &rates), Some(l(0, 0)));
        let mut tries = Vec::new();
        for report in 0..120 {
            s.on_report(&clean(120), &rates);
            if s.target() == Some(l(1, 0)) {
                tries.push(report);
                s.commit();
                s.on_report(&lossy, &rates); // the link cannot carry it
            }
        }
        assert!(tries.len() >= 3, "{tries:?}");
        let gaps: Vec<i32> = tries.windows(2).map(|w| w[1] - w[0]).collect();
        // Early on the estimate's regrowth sets the pace; then the holds, doubling.
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "the waits never shrink: {tries:?}");
        assert!(gaps[gaps.len() - 1] >= 4 * gaps[0], "and grow: {tries:?}");
    }

    /// Three points: 120k (base and parameter sets), 320k (d1 t0) and 520k (d1 t1).
    fn three() -> LayerRates {
        let mut r = steady();
        for ms in (20_000..40_000).step_by(10) {
            r.record(media(0, 0), 125, ms);
            r.record(media(1, 0), 250, ms);
            r.record(media(1, 1), 250, ms);
            if ms % 100 == 0 {
                r.record(PacketLayer::NotLayered, 250, ms);
            }
        }
        r.roll(40_000);
        r
    }

    /// A 1 s report interval of 100 packets in which `kbps` were sent and `lost` were lost.
    fn sent(kbps: u64, lost: u64) -> Interval {
        Interval {
            seconds: 1.0,
            bytes_sent: kbps * 1000 / 8,
            packets_sent: 100,
            packets_lost: lost,
            packets_dropped: 0,
        }
    }

    #[test]
    fn a_rise_waits_for_the_last_one_to_pass_its_trial() {
        let rates = three();
        assert_eq!(rates.ladder(), vec![l(0, 0), l(1, 0), l(1, 1)]);
        let mut s = LayerSelector::new(Mode::Aimd);
        assert_eq!(s.on_report(&sent(120, 30), &rates), Some(l(0, 0)));
        // A burst that seems to say the link carries everything at once.
        let mut rises = Vec::new();
        for report in 0..10 {
            let before = s.target();
            s.on_report(&sent(900, 0), &rates);
            s.commit();
            if s.target() != before {
                rises.push(report);
            }
        }
        assert_eq!(rises.len(), 2, "{rises:?}");
        assert!(rises[1] - rises[0] > RISE_TRIAL as i32, "the second rise came on the first's trial: {rises:?}");
        assert_eq!(s.allowance(), Some(l(1, 1)));
    }

    #[test]
    fn congestion_is_blamed_on_the_rise_in_effect_after_a_higher_one_failed() {
        let rates = three();
        let mut s = LayerSelector::new(Mode::Aimd);
        s.on_report(&sent(120, 30), &rates);
        let climb = |s: &mut LayerSelector, to: Layer| {
            for _ in 0..20 {
                s.on_report(&sent(600, 0), &rates);
                s.commit();
                if s.allowance() == Some(to) {
                    return;
                }
            }
            panic!("never rose to {to:?}: {s:?}");
        };
        climb(&mut s, l(1, 0));
        climb(&mut s, l(1, 1));
        // The top point loses a little on its trial: it fails, and d1 t0 stays, unproven.
        assert_eq!(s.on_report(&sent(500, 1), &rates), Some(l(1, 0)));
        // d1 t0 itself congests the link a few reports later: its rise fails too, so it is
        // held off, not retried as soon as the estimate regrows.
        s.on_report(&sent(350, 0), &rates);
        assert_eq!(s.on_report(&sent(300, 10), &rates), Some(l(0, 0)));
        let back = (0..40).position(|_| {
            s.on_report(&sent(120, 0), &rates);
            s.target() == Some(l(1, 0))
        });
        assert!(back.is_some_and(|r| r >= 7), "d1 t0 was retried after {back:?} reports");
    }

    #[test]
    fn an_estimate_falls_at_once_and_rises_with_headroom_at_a_switch_point() {
        // Base 120 kbit/s with the parameter sets, everything 320.
        let rates = steady();
        let mut s = LayerSelector::new(Mode::Aimd);
        assert_eq!(s.on_estimate(1_000_000.0, &rates), Some(l(1, 0)), "room for all");
        assert_eq!(s.on_estimate(200_000.0, &rates), Some(l(0, 0)), "the whole no longer fits: down at once");
        assert!(!s.forward(media(1, 0)) && s.forward(media(0, 0)));
        assert_eq!(s.estimate_bps(), Some(200_000.0));
        // Just above the whole stream's rate is not enough to go up: no headroom.
        s.on_estimate(330_000.0, &rates);
        assert_eq!(s.target(), Some(l(0, 0)));
        // With headroom: a rise, waiting for an IDR of the enhancement.
        assert_eq!(s.on_estimate(400_000.0, &rates), Some(l(0, 0)));
        assert_eq!(s.target(), Some(l(1, 0)));
        assert!(!s.forward(media(1, 0)));
        assert!(s.forward(PacketLayer::Media { layer: l(1, 0), idr: true }));
        assert_eq!(s.allowance(), Some(l(1, 0)));
        // Hovering a little under it (above what fits with headroom) keeps it.
        assert_eq!(s.on_estimate(330_000.0, &rates), Some(l(1, 0)));
        // Below the base: the base all the same.
        assert_eq!(s.on_estimate(50_000.0, &rates), Some(l(0, 0)));
        // A pin holds even with room.
        s.set_pin(Some(l(0, 0)));
        s.on_estimate(10_000_000.0, &rates);
        assert_eq!(s.target(), Some(l(0, 0)));
        // Nothing to choose from, or no number: nothing changes.
        let mut t = LayerSelector::new(Mode::Aimd);
        assert_eq!(t.on_estimate(100_000.0, &LayerRates::default()), None);
        assert_eq!(t.on_estimate(f64::NAN, &rates), None);
    }

    proptest! {
        /// Whatever the estimates, the point heading for is the base or fits in the last one,
        /// and a rise is only to a point that fits with headroom.
        #[test]
        fn an_estimate_never_targets_more_than_it_allows(estimates in proptest::collection::vec(0.0f64..1_000_000.0, 1..40)) {
            let rates = steady();
            let mut s = LayerSelector::new(Mode::Aimd);
            for e in estimates {
                let before = s.target();
                s.on_estimate(e, &rates);
                let t = s.target().unwrap();
                prop_assert!(t == l(0, 0) || rates.cumulative(t) <= e, "{t:?} at {e}");
                if before.is_some_and(|b| rates.cumulative(t) > rates.cumulative(b)) {
                    prop_assert!(rates.cumulative(t) <= e * HEADROOM);
                }
            }
        }

        /// With any drop pattern, a subscriber sees consecutive sequence numbers.
        #[test]
        fn rewritten_sequence_numbers_have_no_gaps(start in any::<u16>(), drops in proptest::collection::vec(any::<bool>(), 1..300)) {
            let mut r = SeqRewriter::default();
            let mut last: Option<u16> = None;
            for (i, d) in drops.iter().enumerate() {
                let seq = start.wrapping_add(i as u16);
                if *d {
                    r.drop_one();
                } else {
                    let out = r.forward(seq);
                    if let Some(p) = last {
                        prop_assert_eq!(out, p.wrapping_add(1));
                    }
                    last = Some(out);
                }
            }
        }
    }
}
