//! Which scalable layer an RTP packet of H.264, H.264 SVC or HEVC belongs to, sans-IO and
//! without copying: the input is the packet's payload, the output its (dependency id,
//! quality id, temporal id), or "not layered" for what every subscriber needs (parameter
//! sets, SEI, access unit delimiters).
//!
//! - H.264 (RFC 6184): single NAL unit packets, STAP-A/B, MTAP16/24, FU-A/B.
//! - H.264 SVC (RFC 6190): prefix NAL units (type 14) and slices in scalable extension (20)
//!   carry the SVC header; base-layer slices (1, 5) take their ids from the prefix NAL unit
//!   in front of them (in the same or an earlier packet); PACSI (30) labels an aggregate;
//!   an FU carries the SVC header in its first fragment only, so later fragments take the
//!   first's layer.
//! - HEVC (RFC 7798): every NAL unit header, and every FU fragment's payload header, has
//!   the layer id and temporal id.
//!
//! An aggregation packet gets the lowest layer among its NAL units, so dropping a layer
//! never drops something a lower layer needs. Packets that cannot be judged (a fragment
//! whose start was lost, a truncated header) are `Unknown`: the caller forwards them and
//! counts them (docs/layers.md).

use crate::codec::annexb::Codec;

/// A scalable layer: spatial/dependency, quality, temporal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Layer {
    pub did: u8,
    pub qid: u8,
    pub tid: u8,
}

impl Layer {
    pub const BASE: Layer = Layer { did: 0, qid: 0, tid: 0 };
}

/// What a packet is, for layer dropping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketLayer {
    /// Media of this layer; `idr`: it starts an IDR (H.264 type 5 or SVC `idr_flag`, HEVC
    /// IDR/CRA/BLA), where a decoder can start and a subscriber may switch up.
    Media { layer: Layer, idr: bool },
    /// Everyone needs it (parameter sets, SEI, delimiters, prefix-only packets).
    NotLayered,
    /// Cannot be judged: truncated, malformed, or a fragment without its start.
    Unknown,
}

/// The layer of one NAL unit and whether it is an IDR, given the last prefix NAL unit.
fn h264_nal(nal: &[u8], prefix: &mut Option<(Layer, bool)>) -> PacketLayer {
    let Some(&h) = nal.first() else { return PacketLayer::Unknown };
    match h & 0x1f {
        // SVC header: svc_extension_flag, idr_flag, priority_id | no_inter_layer_pred,
        // dependency_id, quality_id | temporal_id, ...
        t @ (14 | 20 | 30) => {
            let Some(x) = nal.get(1..4) else { return PacketLayer::Unknown };
            if x[0] & 0x80 == 0 {
                return PacketLayer::NotLayered; // MVC, not SVC
            }
            let layer = Layer { did: (x[1] >> 4) & 7, qid: x[1] & 0x0f, tid: x[2] >> 5 };
            let idr = x[0] & 0x40 != 0;
            if t == 14 {
                *prefix = Some((layer, idr));
            }
            PacketLayer::Media { layer, idr }
        }
        // Base-layer slices: the prefix's ids, else the base layer itself.
        t @ (1 | 5) => {
            let (layer, idr) = prefix.take().unwrap_or((Layer::BASE, false));
            PacketLayer::Media { layer, idr: idr || t == 5 }
        }
        _ => PacketLayer::NotLayered,
    }
}

fn h265_nal(nal: &[u8]) -> PacketLayer {
    let Some(h) = nal.get(..2) else { return PacketLayer::Unknown };
    h265_header(h[0], h[1], (h[0] >> 1) & 0x3f)
}

/// From an HEVC NAL unit header (or an FU's payload header with the FU's type).
fn h265_header(b0: u8, b1: u8, typ: u8) -> PacketLayer {
    let tid_plus1 = b1 & 7;
    if tid_plus1 == 0 {
        return PacketLayer::Unknown;
    }
    if typ >= 32 {
        return PacketLayer::NotLayered; // VPS/SPS/PPS, AUD, EOS, SEI, ...
    }
    let layer = Layer { did: ((b0 & 1) << 5) | (b1 >> 3), qid: 0, tid: tid_plus1 - 1 };
    PacketLayer::Media { layer, idr: (16..=21).contains(&typ) }
}

/// The lowest of two judgements: media below media, and anything everyone needs wins.
fn lowest(a: Option<PacketLayer>, b: PacketLayer) -> PacketLayer {
    use PacketLayer::*;
    match (a, b) {
        (None, b) => b,
        (Some(Unknown), _) | (_, Unknown) => Unknown,
        (Some(NotLayered), _) | (_, NotLayered) => NotLayered,
        (Some(Media { layer: la, idr: ia }), Media { layer: lb, idr: ib }) => {
            Media { layer: la.min(lb), idr: ia || ib }
        }
    }
}

/// Per-stream state: the last prefix NAL unit (H.264 SVC), the layer of the fragmented NAL
/// unit in progress, and counters.
#[derive(Debug, Default)]
pub struct LayerParser {
    prefix: Option<(Layer, bool)>,
    fu: Option<PacketLayer>,
    /// Packets judged `Unknown`.
    pub unknown: u64,
}

impl LayerParser {
    /// Judges one RTP payload.
    pub fn packet(&mut self, codec: Codec, payload: &[u8]) -> PacketLayer {
        let r = match codec {
            Codec::H264 => self.h264(payload),
            Codec::H265 => self.h265(payload),
        };
        if r == PacketLayer::Unknown {
            self.unknown += 1;
        }
        r
    }

    /// Judges one NAL unit of an Annex B stream (as single NAL unit packets would be).
    pub fn nal(&mut self, codec: Codec, nal: &[u8]) -> PacketLayer {
        match codec {
            Codec::H264 => h264_nal(nal, &mut self.prefix),
            Codec::H265 => h265_nal(nal),
        }
    }

    fn h264(&mut self, p: &[u8]) -> PacketLayer {
        let Some(&b0) = p.first() else { return PacketLayer::Unknown };
        match b0 & 0x1f {
            // STAP-A (size, NAL)*; STAP-B with a 16-bit DON first.
            24 => self.h264_aggregate(&p[1..], 0),
            25 => self.h264_aggregate(p.get(3..).unwrap_or(&[]), 0),
            // MTAP16/24: DONB, then (size, DOND, TS offset, NAL)*.
            26 => self.h264_aggregate(p.get(3..).unwrap_or(&[]), 3),
            27 => self.h264_aggregate(p.get(3..).unwrap_or(&[]), 4),
            // FU-A / FU-B (with a DON after the FU header).
            t @ (28 | 29) => {
                let Some(&fu) = p.get(1) else { return PacketLayer::Unknown };
                if fu & 0x80 == 0 {
                    // Not a start: the start's judgement, if we saw it.
                    let r = self.fu.unwrap_or(PacketLayer::Unknown);
                    if fu & 0x40 != 0 {
                        self.fu = None;
                    }
                    return r;
                }
                let body = if t == 28 { p.get(2..) } else { p.get(4..) };
                let Some(body) = body else { return PacketLayer::Unknown };
                // The NAL unit's own header, then the start of its body (the SVC header).
                let mut head = [0u8; 4];
                head[0] = (b0 & 0xe0) | (fu & 0x1f);
                let n = body.len().min(3);
                head[1..1 + n].copy_from_slice(&body[..n]);
                let r = h264_nal(&head[..1 + n], &mut self.prefix);
                self.fu = if fu & 0x40 != 0 { None } else { Some(r) };
                r
            }
            _ => h264_nal(p, &mut self.prefix),
        }
    }

    /// The NAL units of an aggregation body: a 16-bit NAL unit size, `skip` bytes of
    /// per-unit fields (MTAP's DOND and timestamp offset, not counted in the size), the
    /// NAL unit.
    fn h264_aggregate(&mut self, mut b: &[u8], skip: usize) -> PacketLayer {
        let mut acc = None;
        while !b.is_empty() {
            let Some(sz) = b.get(..2) else { return PacketLayer::Unknown };
            let n = usize::from(u16::from_be_bytes([sz[0], sz[1]]));
            let Some(nal) = b.get(2 + skip..2 + skip + n) else { return PacketLayer::Unknown };
            // A PACSI labels the whole aggregate.
            if nal.first().is_some_and(|h| h & 0x1f == 30) {
                return h264_nal(nal, &mut self.prefix);
            }
            acc = Some(lowest(acc, h264_nal(nal, &mut self.prefix)));
            b = &b[2 + skip + n..];
        }
        acc.unwrap_or(PacketLayer::Unknown)
    }

    fn h265(&mut self, p: &[u8]) -> PacketLayer {
        let Some(h) = p.get(..2) else { return PacketLayer::Unknown };
        match (h[0] >> 1) & 0x3f {
            // AP: (size, NAL)*.
            48 => {
                let (mut b, mut acc) = (&p[2..], None);
                while !b.is_empty() {
                    let Some(sz) = b.get(..2) else { return PacketLayer::Unknown };
                    let n = usize::from(u16::from_be_bytes([sz[0], sz[1]]));
                    let Some(nal) = b.get(2..2 + n) else { return PacketLayer::Unknown };
                    acc = Some(lowest(acc, h265_nal(nal)));
                    b = &b[2 + n..];
                }
                acc.unwrap_or(PacketLayer::Unknown)
            }
            // FU: every fragment's payload header has the ids; the FU header the type.
            49 => match p.get(2) {
                Some(&fu) => h265_header(h[0], h[1], fu & 0x3f),
                None => PacketLayer::Unknown,
            },
            50 => PacketLayer::NotLayered, // PACI: its payload header says nothing alone
            _ => h265_nal(p),
        }
    }
}

/// An aggregation packet's RTP payload (H.264 STAP-A, HEVC AP) without the NAL units a
/// subscriber does not take (`keeps(layer)` false). `None`: not such an aggregate, malformed,
/// or nothing to remove (send it as it is). The aggregate as a whole was judged by its lowest
/// layer, so when the subscriber takes the packet at all, something is left. Parameter sets,
/// SEI and other units everyone needs are kept; an H.264 base-layer slice goes with the
/// prefix NAL unit in front of it.
pub fn filter_aggregate(codec: Codec, payload: &[u8], keeps: impl Fn(Layer) -> bool) -> Option<Vec<u8>> {
    let head = match codec {
        Codec::H264 if payload.first()? & 0x1f == 24 => 1,
        Codec::H265 if payload.len() >= 2 && (payload[0] >> 1) & 0x3f == 48 => 2,
        _ => return None,
    };
    let mut out = payload[..head].to_vec();
    let (mut b, mut prefix, mut removed) = (&payload[head..], None, false);
    while !b.is_empty() {
        let sz = b.get(..2)?;
        let n = usize::from(u16::from_be_bytes([sz[0], sz[1]]));
        let nal = b.get(2..2 + n)?;
        let judged = match codec {
            Codec::H264 => h264_nal(nal, &mut prefix),
            Codec::H265 => h265_nal(nal),
        };
        match judged {
            PacketLayer::Media { layer, .. } if !keeps(layer) => removed = true,
            _ => out.extend_from_slice(&b[..2 + n]),
        }
        b = &b[2 + n..];
    }
    (removed && out.len() > head).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::annexb::{nal_units, packetize};
    use proptest::prelude::*;

    const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/");

    /// A stream of the repository's test data (`testdata/video`).
    fn data(name: &str) -> Option<Vec<u8>> {
        Some(std::fs::read(format!("{DATA}{name}")).unwrap_or_else(|e| panic!("{DATA}{name}: {e}")))
    }

    fn media(did: u8, tid: u8) -> Layer {
        Layer { did, qid: 0, tid }
    }

    /// A STAP-A of SPS, a prefix + base slice (d0 t0), and an SVC slice of d1: capped at d0
    /// the d1 slice goes and the rest stays byte for byte; an AP of t0 and t1 keeps t0.
    #[test]
    fn aggregates_lose_only_what_is_above_the_cap() {
        let unit = |nal: &[u8]| [&(nal.len() as u16).to_be_bytes()[..], nal].concat();
        let sps = [0x67, 0x42, 0x00];
        let prefix_d0 = [0x6e, 0x80, 0x00, 0x00];
        let base = [0x65, 0x88];
        let d1 = [0x74, 0x80, 0x10, 0x00, 0x99];
        let stap = [&[0x78][..], &unit(&sps), &unit(&prefix_d0), &unit(&base), &unit(&d1)].concat();
        let d0 = |l: Layer| l.did == 0;
        let want = [&[0x78][..], &unit(&sps), &unit(&prefix_d0), &unit(&base)].concat();
        assert_eq!(filter_aggregate(Codec::H264, &stap, d0), Some(want));
        assert_eq!(filter_aggregate(Codec::H264, &stap, |_| true), None, "nothing to remove");
        assert_eq!(filter_aggregate(Codec::H264, &stap[..stap.len() - 2], d0), None, "malformed: as it is");
        assert_eq!(filter_aggregate(Codec::H264, &[0x65, 1, 2], d0), None, "not an aggregate");
        // HEVC AP (type 48): a TRAIL_R of tid 0 and a TSA_N of tid 1.
        let t0 = [0x02, 0x01, 0xaa];
        let t1 = [0x00, 0x02, 0xbb];
        let ap = [&[0x60, 0x01][..], &unit(&t0), &unit(&t1)].concat();
        let want = [&[0x60, 0x01][..], &unit(&t0)].concat();
        assert_eq!(filter_aggregate(Codec::H265, &ap, |l| l.tid == 0), Some(want));
    }

    proptest! {
        /// Whatever the bytes, the filter never grows a payload and keeps its header.
        #[test]
        fn filter_never_grows(payload in proptest::collection::vec(any::<u8>(), 0..200), h265 in any::<bool>(), tid in 0u8..3) {
            let codec = if h265 { Codec::H265 } else { Codec::H264 };
            if let Some(out) = filter_aggregate(codec, &payload, |l| l.tid <= tid) {
                prop_assert!(out.len() < payload.len());
                prop_assert_eq!(&out[..if h265 { 2 } else { 1 }], &payload[..if h265 { 2 } else { 1 }]);
            }
        }
    }

    /// Every NAL unit of mediasoup's SVC stream against its ground truth (type, length,
    /// spatial id, temporal id, IDR), prefix NAL units aside (mediasoup leaves them unlabelled).
    #[test]
    fn annex_b_ids_match_mediasoups_ground_truth() {
        let (Some(stream), Some(csv)) =
            (data("h264-svc/mediasoup_naluInfo.264"), data("h264-svc/mediasoup_naluInfo.csv"))
        else {
            return;
        };
        let csv = String::from_utf8(csv).unwrap();
        let rows: Vec<Vec<i32>> =
            csv.lines().skip(1).map(|l| l.split(',').map(|f| f.trim().parse().unwrap()).collect()).collect();
        let nals: Vec<&[u8]> = nal_units(&stream).collect();
        assert_eq!(nals.len(), rows.len());
        let mut p = LayerParser::default();
        for (i, (nal, row)) in nals.iter().zip(&rows).enumerate() {
            assert_eq!((i32::from(nal[0] & 0x1f), nal.len() as i32 + 4), (row[0], row[1]), "NAL unit {i}");
            let got = p.nal(Codec::H264, nal);
            let want = match (row[2], row[3], row[4]) {
                _ if row[0] == 14 => continue,
                (-1, -1, _) => PacketLayer::NotLayered,
                (s, t, idr) => PacketLayer::Media { layer: media(s as u8, t as u8), idr: idr == 1 },
            };
            assert_eq!(got, want, "NAL unit {i} (type {})", row[0]);
        }
    }

    /// One judgement per packet of a packetized stream: single NAL units and FU-A at
    /// `mtu`, aggregating what fits into STAP-A when `stap`. Returns the parser's answers
    /// and what each packet should get (the NAL units' judgements).
    fn packetized(codec: Codec, stream: &[u8], mtu: usize, stap: bool) -> (Vec<PacketLayer>, Vec<PacketLayer>) {
        let mut truth = LayerParser::default();
        let mut packets: Vec<(Vec<u8>, PacketLayer)> = Vec::new();
        let mut scratch = Vec::new();
        let mut pending: Vec<(&[u8], PacketLayer)> = Vec::new();
        let flush = |pending: &mut Vec<(&[u8], PacketLayer)>, packets: &mut Vec<(Vec<u8>, PacketLayer)>| {
            match pending.len() {
                0 => {}
                1 => packets.push((pending[0].0.to_vec(), pending[0].1)),
                _ => {
                    let mut p = match codec {
                        Codec::H264 => vec![24 | (pending.iter().map(|x| x.0[0] & 0x60).max().unwrap())],
                        Codec::H265 => vec![48 << 1, 1],
                    };
                    let mut want = None;
                    for (nal, l) in pending.iter() {
                        p.extend_from_slice(&(nal.len() as u16).to_be_bytes());
                        p.extend_from_slice(nal);
                        want = Some(lowest(want, *l));
                    }
                    packets.push((p, want.unwrap()));
                }
            }
            pending.clear();
        };
        for nal in nal_units(stream).filter(|n| !n.is_empty()) {
            let l = truth.nal(codec, nal);
            let size: usize = pending.iter().map(|x| x.0.len() + 2).sum::<usize>() + 3;
            if stap && nal.len() + 2 + size <= mtu {
                pending.push((nal, l));
                continue;
            }
            flush(&mut pending, &mut packets);
            if stap && nal.len() + 5 <= mtu {
                pending.push((nal, l));
                continue;
            }
            packetize(codec, nal, mtu, &mut scratch, |payload, _| packets.push((payload.to_vec(), l)));
        }
        flush(&mut pending, &mut packets);
        let mut p = LayerParser::default();
        let got = packets.iter().map(|(b, _)| p.packet(codec, b)).collect();
        (got, packets.into_iter().map(|x| x.1).collect())
    }

    #[test]
    fn rtp_packets_get_the_ids_of_their_nal_units_at_every_mtu() {
        let streams = [
            (Codec::H264, "h264-svc/mediasoup_naluInfo.264"),
            (Codec::H264, "h264-svc/openh264_2S3T_320x192.264"),
            (Codec::H264, "h264-svc/openh264_1S4T_prefix.264"),
            (Codec::H264, "h264-svc/openh264_sps_subsetsps_bothVUI.264"),
            (Codec::H265, "hevc/x265_temporal_320x192.265"),
        ];
        for (codec, name) in streams {
            let Some(stream) = data(name) else { return };
            for mtu in [60, 200, 500, 1200] {
                for stap in [false, true] {
                    let (got, want) = packetized(codec, &stream, mtu, stap);
                    assert_eq!(got, want, "{name} at MTU {mtu}, aggregated: {stap}");
                }
            }
        }
    }

    /// The layers each stream holds, as PROVENANCE.md says.
    #[test]
    fn the_streams_hold_the_layers_their_provenance_names() {
        let layers = |codec, name: &str| {
            let s = data(name)?;
            let mut p = LayerParser::default();
            let mut set: Vec<Layer> = nal_units(&s)
                .filter_map(|n| match p.nal(codec, n) {
                    PacketLayer::Media { layer, .. } => Some(layer),
                    _ => None,
                })
                .collect();
            set.sort();
            set.dedup();
            Some(set)
        };
        let Some(two) = layers(Codec::H264, "h264-svc/openh264_2S3T_320x192.264") else { return };
        assert_eq!(two, (0..2).flat_map(|d| (0..3).map(move |t| media(d, t))).collect::<Vec<_>>());
        let prefix_only = layers(Codec::H264, "h264-svc/openh264_1S4T_prefix.264").unwrap();
        assert_eq!(prefix_only, (0..4).map(|t| media(0, t)).collect::<Vec<_>>());
        let hevc = layers(Codec::H265, "hevc/x265_temporal_320x192.265").unwrap();
        assert_eq!(hevc, vec![media(0, 0), media(0, 1)]);
    }

    #[test]
    fn fragments_without_their_start_and_truncations_are_unknown() {
        let mut p = LayerParser::default();
        // An FU-A middle fragment with no start seen.
        assert_eq!(p.packet(Codec::H264, &[0x7c, 0x14, 1, 2]), PacketLayer::Unknown);
        // A STAP-A whose size overruns, an empty payload, a one-byte HEVC header.
        assert_eq!(p.packet(Codec::H264, &[0x78, 0, 9, 0x67]), PacketLayer::Unknown);
        assert_eq!(p.packet(Codec::H264, &[]), PacketLayer::Unknown);
        assert_eq!(p.packet(Codec::H265, &[0x40]), PacketLayer::Unknown);
        assert_eq!(p.unknown, 4);
        // A type-20 start fragment: the SVC header is right after the FU header, and the
        // later fragments take its layer.
        let start = [0x7c, 0x80 | 20, 0x80, 0x20, 0x40, 9, 9];
        let want = PacketLayer::Media { layer: media(2, 2), idr: false };
        assert_eq!(p.packet(Codec::H264, &start), want);
        assert_eq!(p.packet(Codec::H264, &[0x7c, 20, 9, 9]), want);
        assert_eq!(p.packet(Codec::H264, &[0x7c, 0x40 | 20, 9]), want);
        assert_eq!(p.packet(Codec::H264, &[0x7c, 20, 9]), PacketLayer::Unknown, "after the end fragment");
    }

    proptest! {
        /// Arbitrary payloads: never a panic, for either codec, whatever state came before.
        #[test]
        fn arbitrary_payloads_never_panic(packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..32)) {
            let mut p = LayerParser::default();
            for b in &packets {
                let _ = p.packet(Codec::H264, b);
                let _ = p.packet(Codec::H265, b);
            }
        }
    }
}
