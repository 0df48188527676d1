//! A sink's share of layer adaptation (issue 6): which packets it gets and the sequence
//! numbers it sees. The decisions are `fanout_proto::rtp::adapt`'s (sans-IO); this keeps their
//! per-sink state beside the sink and turns a receiver report into the interval they need.

use crate::packet::Packet;
use fanout_proto::codec::layers::Layer;
use fanout_proto::rtp::adapt::{Interval, LayerRates, LayerSelector, Mode, SeqRewriter};
use std::time::Instant;

/// What a sink's subscriber tells about its link.
#[derive(Debug, Clone, Copy)]
pub enum Feedback {
    /// An RTCP receiver report: its cumulative loss.
    Lost(i32),
    /// A bandwidth estimate from congestion feedback (transport-wide congestion control,
    /// REMB), in bits per second.
    Estimate(f64),
}

/// What the sink's last receiver report was measured against.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Instant,
    sent: u64,
    bytes: u64,
    lost: i64,
}

#[derive(Debug)]
pub(crate) struct SinkLayers {
    /// The selector that decides (AIMD, ours).
    sel: LayerSelector,
    /// The thesis's one-step rule on the same reports, for comparison only.
    thesis: LayerSelector,
    seq: SeqRewriter,
    /// Packets dropped on purpose.
    pub dropped: u64,
    reports: u64,
    /// Reports with impossible counts (more lost than sent), clamped and counted.
    bad_reports: u64,
    mark: Mark,
}

/// A sink's decision state at some packet (small, copied on every batch).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checkpoint {
    switch: (Option<Layer>, Option<Layer>),
    seq: SeqRewriter,
    dropped: u64,
}

/// What the status API shows of a sink's adaptation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SinkLayerStatus {
    /// The highest layer it gets now (`null`: every layer).
    pub allowance: Option<Layer>,
    /// A higher allowance waiting for a packet where the decoder can switch up.
    pub target: Option<Layer>,
    pub pin: Option<Layer>,
    pub estimate_bps: Option<f64>,
    /// What the thesis's one-step rule would allow after the same reports.
    pub thesis_allowance: Option<Layer>,
    pub thesis_estimate_bps: Option<f64>,
    pub packets_dropped: u64,
    pub reports: u64,
    pub bad_reports: u64,
}

impl SinkLayers {
    pub fn new(now: Instant) -> Self {
        Self {
            sel: LayerSelector::new(Mode::Aimd),
            thesis: LayerSelector::new(Mode::Thesis),
            seq: SeqRewriter::default(),
            dropped: 0,
            reports: 0,
            bad_reports: 0,
            mark: Mark { at: now, sent: 0, bytes: 0, lost: 0 },
        }
    }

    /// Whether packets go out as they are: nothing is held back and nothing ever was.
    pub fn passes_all(&self) -> bool {
        self.sel.allowance().is_none() && self.dropped == 0
    }

    /// Decides one packet: `Some(seq)` to send it with that sequence number, `None` to drop
    /// it. Packets without an RTP header pass as they are.
    pub fn decide(&mut self, p: &Packet) -> Option<u16> {
        if !p.is_rtp() {
            return Some(0);
        }
        if self.sel.forward(p.layer()) {
            let d = p.data();
            Some(self.seq.forward(u16::from_be_bytes([d[2], d[3]])))
        } else {
            self.seq.drop_one();
            self.dropped += 1;
            None
        }
    }

    /// A kept aggregation packet rebuilt without the NAL units above this sink's allowance
    /// (call right after [`SinkLayers::decide`] kept it); `None`: send it as it is.
    pub fn rebuild(&self, p: &Packet) -> Option<std::sync::Arc<Packet>> {
        let codec = p.aggregate()?;
        let allow = self.sel.allowance()?;
        let payload = fanout_proto::codec::layers::filter_aggregate(codec, p.payload(), |l| {
            fanout_proto::rtp::adapt::within(l, allow)
        })?;
        Some(std::sync::Arc::new(p.with_payload(&payload)))
    }

    /// Goes on from the kernel program's renumbering of this sink (its `seq_delta`): the
    /// subscriber sees no jump when the sink moves to user space.
    pub fn continue_numbering(&mut self, kernel_seq_delta: u16) {
        self.seq = fanout_proto::rtp::adapt::SeqRewriter::continuing(kernel_seq_delta);
    }

    /// What [`SinkLayers::decide`] changes, to take its decisions again from here.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint { switch: self.sel.switch_state(), seq: self.seq, dropped: self.dropped }
    }

    pub fn restore(&mut self, c: Checkpoint) {
        self.sel.rewind(c.switch);
        self.seq = c.seq;
        self.dropped = c.dropped;
    }

    /// Back to `c`, then the decisions for `packets` again: the state after a send that
    /// took only these.
    pub fn replay(&mut self, c: Checkpoint, packets: &[std::sync::Arc<Packet>]) {
        self.restore(c);
        for p in packets {
            self.decide(p);
        }
    }

    pub fn set_pin(&mut self, pin: Option<Layer>) {
        self.sel.set_pin(pin);
        self.thesis.set_pin(pin);
    }

    /// Feedback from this sink's subscriber; `sent` and `bytes` as for
    /// [`SinkLayers::on_report`].
    pub fn on_feedback(&mut self, f: Feedback, sent: u64, bytes: u64, rates: &LayerRates, now: Instant) {
        match f {
            Feedback::Lost(lost) => self.on_report(lost, sent, bytes, rates, now),
            Feedback::Estimate(bps) => {
                self.reports += 1;
                self.sel.on_estimate(bps, rates);
            }
        }
    }

    /// A receiver report for this sink: its cumulative loss, against what the sink has
    /// sent (packets and bytes, the dropped ones left out) since the last one.
    fn on_report(&mut self, cumulative_lost: i32, sent: u64, bytes: u64, rates: &LayerRates, now: Instant) {
        let lost = i64::from(cumulative_lost);
        let (d_sent, d_bytes) = (sent.saturating_sub(self.mark.sent), bytes.saturating_sub(self.mark.bytes));
        // Duplicates can make the cumulative count fall; more lost than sent is impossible.
        let mut d_lost = (lost - self.mark.lost).max(0) as u64;
        if d_lost > d_sent {
            self.bad_reports += 1;
            d_lost = d_sent;
        }
        let iv = Interval {
            seconds: now.saturating_duration_since(self.mark.at).as_secs_f64(),
            bytes_sent: d_bytes,
            packets_sent: d_sent,
            packets_lost: d_lost,
            packets_dropped: 0, // renumbered: the subscriber never counts them
        };
        self.mark = Mark { at: now, sent, bytes, lost };
        self.reports += 1;
        if iv.seconds > 0.0 && iv.packets_sent > 0 {
            self.sel.on_report(&iv, rates);
            self.thesis.on_report(&iv, rates);
        }
    }

    /// The allowance for a data path that finds switch points itself (the kernel path):
    /// a waiting rise is taken now.
    pub fn settle(&mut self) -> Option<Layer> {
        self.sel.commit();
        self.sel.allowance()
    }

    pub fn status(&self) -> SinkLayerStatus {
        SinkLayerStatus {
            allowance: self.sel.allowance(),
            target: self.sel.target(),
            pin: self.sel.pin,
            estimate_bps: self.sel.estimate_bps(),
            thesis_allowance: self.thesis.target(),
            thesis_estimate_bps: self.thesis.estimate_bps(),
            packets_dropped: self.dropped,
            reports: self.reports,
            bad_reports: self.bad_reports,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_proto::codec::layers::PacketLayer;

    /// An RTP packet with sequence number `seq` of temporal layer `tid`.
    fn packet(seq: u16, tid: u8) -> Packet {
        let mut p = Packet::with_capacity(64);
        let b = p.buf_mut();
        b[0] = 0x80;
        b[2..4].copy_from_slice(&seq.to_be_bytes());
        p.set_len(40, 12);
        p.set_layer(PacketLayer::Media { layer: Layer { did: 0, qid: 0, tid }, idr: false });
        p
    }

    #[test]
    fn a_cap_drops_and_renumbers_and_a_rollback_replays_the_same_decisions() {
        let mut l = SinkLayers::new(Instant::now());
        assert!(l.passes_all());
        l.set_pin(Some(Layer { did: 0, qid: 0, tid: 0 }));
        let stream: Vec<Packet> = (0..12u16).map(|i| packet(1000 + i, (i % 3) as u8)).collect();
        let first: Vec<Option<u16>> = stream[..6].iter().map(|p| l.decide(p)).collect();
        assert_eq!(first, [Some(1000), None, None, Some(1001), None, None]);
        let saved = l.checkpoint();
        let rest: Vec<Option<u16>> = stream[6..].iter().map(|p| l.decide(p)).collect();
        l.restore(saved);
        let again: Vec<Option<u16>> = stream[6..].iter().map(|p| l.decide(p)).collect();
        assert_eq!(rest, again);
        assert_eq!(rest, [Some(1002), None, None, Some(1003), None, None]);
        assert_eq!(l.dropped, 8);
        assert!(!l.passes_all(), "renumbering goes on even if the cap is lifted");
    }

    #[test]
    fn impossible_reports_are_clamped_and_counted() {
        let t0 = Instant::now();
        let mut l = SinkLayers::new(t0);
        let rates = LayerRates::default();
        let later = t0 + std::time::Duration::from_secs(1);
        l.on_report(500, 100, 10_000, &rates, later); // more lost than sent
        l.on_report(-5, 200, 20_000, &rates, later + std::time::Duration::from_secs(1)); // fell
        let s = l.status();
        assert_eq!((s.reports, s.bad_reports), (2, 1));
    }
}
