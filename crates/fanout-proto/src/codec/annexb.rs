//! H.264 (ITU-T H.264 Annex B) and HEVC byte streams: NAL units split at start codes, grouped
//! into access units (one picture, all its layers), and packetized into RTP payloads: single
//! NAL unit packets, or fragmentation units when a NAL unit exceeds the payload size
//! (FU-A, RFC 6184 §5.8; HEVC FU, RFC 7798 §4.4.3).

/// Which codec a byte stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    H264,
    H265,
}

/// Whether a NAL unit (without its start code) is a parameter set: H.264's SPS or PPS,
/// HEVC's VPS, SPS or PPS.
pub fn is_parameter_set(codec: Codec, nal: &[u8]) -> bool {
    let Some(&b) = nal.first() else { return false };
    match codec {
        Codec::H264 => matches!(b & 0x1f, 7 | 8),
        Codec::H265 => matches!((b >> 1) & 0x3f, 32..=34),
    }
}

/// NAL units of an Annex B byte stream (start codes and trailing zero bytes removed).
/// Whether RTP payloads that begin with these bytes can be H.264 (RFC 6184, SVC's RFC 6190):
/// each a NAL unit header with the forbidden bit clear and a type that is not reserved (1–15,
/// 19–21, and the RTP aggregates and fragments 24–31).
/// For a dynamic payload type nobody named, so that a relay describes as H.264 only what
/// looks like it (VP8's descriptor, Opus, or a PCM stream mostly do not, on every packet).
pub fn looks_like_h264_rtp(first_bytes: &[u8]) -> bool {
    let carried = |t: u8| matches!(t, 1..=15 | 19..=21 | 24..=31);
    !first_bytes.is_empty() && first_bytes.iter().all(|b| b & 0x80 == 0 && carried(b & 0x1f))
}

/// The picture size an H.264 SPS gives (h264-reader parses it).
pub fn sps_dimensions(sps: &[u8]) -> Option<(u16, u16)> {
    let rbsp = h264_reader::rbsp::decode_nal(sps).ok()?;
    let sps = h264_reader::nal::sps::SeqParameterSet::from_bits(h264_reader::rbsp::BitReader::new(&*rbsp)).ok()?;
    let (w, h) = sps.pixel_dimensions().ok()?;
    Some((u16::try_from(w).ok()?, u16::try_from(h).ok()?))
}

pub fn nal_units(stream: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut pos = find_start(stream, 0);
    std::iter::from_fn(move || {
        let (_, body) = pos?;
        let next = find_start(stream, body);
        let end = next.map_or(stream.len(), |(sc, _)| sc);
        pos = next;
        let mut nal = &stream[body..end];
        while let [rest @ .., 0] = nal {
            nal = rest;
        }
        Some(nal)
    })
}

/// The next start code at or after `from`: (where it begins, where the NAL unit begins).
fn find_start(s: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut i = from;
    while i + 3 <= s.len() {
        if s[i] == 0 && s[i + 1] == 0 && s[i + 2] == 1 {
            let begin = if i > from && s[i - 1] == 0 { i - 1 } else { i };
            return Some((begin, i + 3));
        }
        i += 1;
    }
    None
}

/// Whether `nal` is a coded slice (video coding layer).
pub fn is_vcl(codec: Codec, nal: &[u8]) -> bool {
    match (codec, nal.first()) {
        (Codec::H264, Some(&b)) => matches!(b & 0x1f, 1..=5 | 20),
        (Codec::H265, Some(&b)) => (b >> 1) & 0x3f < 32,
        _ => false,
    }
}

/// Whether `nal`, following a coded slice of the current access unit, begins the next one
/// (H.264 §7.4.1.2.3, H.265 §7.4.2.4.4).
fn starts_access_unit(codec: Codec, nal: &[u8]) -> bool {
    match codec {
        Codec::H264 => match nal.first().map(|b| b & 0x1f) {
            // AUD, SPS, PPS, SEI, prefix NAL, subset SPS, and reserved 16..18.
            Some(6..=9 | 14..=18) => true,
            // A base-layer slice with first_mb_in_slice = 0 (ue(v) "1" = 0).
            Some(1 | 5) => nal.get(1).is_some_and(|b| b & 0x80 != 0),
            _ => false,
        },
        Codec::H265 => {
            let Some(&b) = nal.first() else { return false };
            match (b >> 1) & 0x3f {
                // VPS, SPS, PPS, AUD, prefix SEI, reserved 41..44, unspecified 48..55.
                32..=35 | 39 | 41..=44 | 48..=55 => true,
                // first_slice_segment_in_pic_flag.
                0..=31 => nal.get(2).is_some_and(|b| b & 0x80 != 0),
                _ => false,
            }
        }
    }
}

/// Groups NAL units into access units: each item is the NAL units of one picture.
pub fn access_units(codec: Codec, stream: &[u8]) -> Vec<Vec<&[u8]>> {
    let mut aus: Vec<Vec<&[u8]>> = Vec::new();
    let mut cur: Vec<&[u8]> = Vec::new();
    let mut seen_vcl = false;
    for nal in nal_units(stream).filter(|n| !n.is_empty()) {
        if seen_vcl && starts_access_unit(codec, nal) {
            aus.push(std::mem::take(&mut cur));
            seen_vcl = false;
        }
        seen_vcl |= is_vcl(codec, nal);
        cur.push(nal);
    }
    if !cur.is_empty() {
        aus.push(cur);
    }
    aus
}

/// Splits one NAL unit into RTP payloads of at most `max` bytes, calling `out` for each with
/// whether it is the NAL unit's last. `max` must leave room for the FU headers (≥ 4).
pub fn packetize(codec: Codec, nal: &[u8], max: usize, scratch: &mut Vec<u8>, mut out: impl FnMut(&[u8], bool)) {
    if nal.len() <= max {
        out(nal, true);
        return;
    }
    let (hdr_len, prefix): (usize, [u8; 3]) = match codec {
        // FU indicator (F, NRI of the NAL, type 28), FU header (S, E, NAL type).
        Codec::H264 => (1, [(nal[0] & 0xe0) | 28, nal[0] & 0x1f, 0]),
        // PayloadHdr (F, type 49, LayerId, TID of the NAL), FU header (S, E, NAL type).
        Codec::H265 => (2, [(nal[0] & 0x81) | (49 << 1), nal[1], (nal[0] >> 1) & 0x3f]),
    };
    let fu_len = hdr_len + 1;
    let body = &nal[hdr_len..];
    let chunk = max - fu_len;
    let n = body.len().div_ceil(chunk);
    for (i, part) in body.chunks(chunk).enumerate() {
        scratch.clear();
        scratch.extend_from_slice(&prefix[..hdr_len]);
        let typ = prefix[hdr_len];
        let se = if i == 0 { 0x80 } else { 0 } | if i + 1 == n { 0x40 } else { 0 };
        scratch.push(se | typ);
        scratch.extend_from_slice(part);
        out(scratch, i + 1 == n);
    }
}

/// One picture's NAL units as RTP payloads of at most `max` bytes: consecutive units that
/// fit one aggregation packet together go in one ([`aggregate`]: a picture's delimiter,
/// parameter sets and small slices share a packet), a unit larger than a packet is
/// fragmented ([`packetize`]), any other goes alone. `out` gets each payload with whether it
/// ends the picture (the RTP marker).
pub fn packetize_frame(
    codec: Codec,
    nals: &[&[u8]],
    max: usize,
    scratch: &mut Vec<u8>,
    mut out: impl FnMut(&[u8], bool),
) {
    let hdr = if codec == Codec::H264 { 1 } else { 2 };
    // (A unit shorter than its own header is malformed: it goes alone, as it is.)
    let joins = |n: &[u8]| n.len() >= hdr;
    let mut j = 0;
    while j < nals.len() {
        let mut end = j + 1;
        if joins(nals[j]) {
            let mut size = hdr + 2 + nals[j].len();
            while end < nals.len() && joins(nals[end]) && size + 2 + nals[end].len() <= max {
                size += 2 + nals[end].len();
                end += 1;
            }
        }
        let ends = end == nals.len();
        if end - j > 1 {
            aggregate(codec, &nals[j..end], scratch);
            out(scratch, ends);
        } else {
            packetize(codec, nals[j], max, scratch, |p, last| out(p, ends && last));
        }
        j = end;
    }
}

/// Packs NAL units into one aggregation payload (H.264 STAP-A, RFC 6184 §5.7.1; HEVC AP,
/// RFC 7798 §4.4.2) in `out`: the header, then each unit as a 16-bit size and its bytes.
/// The header takes the highest NRI (H.264), or the lowest layer and temporal id (HEVC).
pub fn aggregate(codec: Codec, nals: &[&[u8]], out: &mut Vec<u8>) {
    out.clear();
    match codec {
        Codec::H264 => {
            let f_nri = nals.iter().map(|n| n[0] & 0xe0).max().unwrap_or(0);
            out.push(f_nri | 24);
        }
        Codec::H265 => {
            let (layer, tid) = nals.iter().map(|n| (((n[0] & 1) << 5) | (n[1] >> 3), n[1] & 7)).min().unwrap_or((0, 1));
            out.extend_from_slice(&[(48 << 1) | (layer >> 5), ((layer & 0x1f) << 3) | tid]);
        }
    }
    for n in nals {
        out.extend_from_slice(&(n.len() as u16).to_be_bytes());
        out.extend_from_slice(n);
    }
}

/// Reassembles NAL units from RTP payloads (single NAL unit, STAP-A/AP and FU packets), the
/// inverse of [`packetize`] and [`aggregate`]; used to check a stream end to end.
#[derive(Debug, Default)]
pub struct Depacketizer {
    fu: Vec<u8>,
}

impl Depacketizer {
    /// Feeds one payload; returns a complete NAL unit when one is.
    pub fn push(&mut self, codec: Codec, payload: &[u8]) -> Option<Vec<u8>> {
        let (is_fu, hdr_len) = match codec {
            Codec::H264 => (payload.first().is_some_and(|b| b & 0x1f == 28), 1),
            Codec::H265 => (payload.first().is_some_and(|b| (b >> 1) & 0x3f == 49), 2),
        };
        if !is_fu {
            return Some(payload.to_vec());
        }
        let fu = *payload.get(hdr_len)?;
        let data = payload.get(hdr_len + 1..)?;
        if fu & 0x80 != 0 {
            self.fu.clear();
            match codec {
                Codec::H264 => self.fu.push((payload[0] & 0xe0) | (fu & 0x1f)),
                Codec::H265 => self.fu.extend_from_slice(&[(payload[0] & 0x81) | ((fu & 0x3f) << 1), payload[1]]),
            }
        } else if self.fu.is_empty() {
            return None; // a fragment without its start: lost, drop it
        }
        self.fu.extend_from_slice(data);
        (fu & 0x40 != 0).then(|| std::mem::take(&mut self.fu))
    }

    /// Feeds one payload, aggregation packets too; calls `out` with each complete NAL
    /// unit. An aggregate whose sizes overrun it yields the units before the overrun.
    pub fn push_all(&mut self, codec: Codec, payload: &[u8], mut out: impl FnMut(Vec<u8>)) {
        let body = match codec {
            Codec::H264 if payload.first().is_some_and(|b| b & 0x1f == 24) => &payload[1..],
            Codec::H265 if payload.len() >= 2 && (payload[0] >> 1) & 0x3f == 48 => &payload[2..],
            _ => {
                if let Some(n) = self.push(codec, payload) {
                    out(n);
                }
                return;
            }
        };
        let mut b = body;
        while let Some(sz) = b.get(..2) {
            let n = usize::from(u16::from_be_bytes([sz[0], sz[1]]));
            let Some(nal) = b.get(2..2 + n) else { return };
            out(nal.to_vec());
            b = &b[2 + n..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_looks_like_h264_over_rtp() {
        // An IDR slice, SPS, STAP-A, FU-A: H.264.
        assert!(looks_like_h264_rtp(&[0x65, 0x67, 0x78, 0x7c, 0x41, 0x6e, 0x7e]));
        // VP8's descriptor (S bit: 0x10 is NAL type 16, reserved), a set forbidden bit, a
        // payload of zeros, nothing at all: not.
        assert!(!looks_like_h264_rtp(&[0x10]));
        assert!(!looks_like_h264_rtp(&[0x90]));
        assert!(!looks_like_h264_rtp(&[0x65, 0x00]));
        assert!(!looks_like_h264_rtp(&[]));
    }
    use proptest::prelude::*;

    const SVC: &[u8] = include_bytes!("../../../../testdata/video/h264-svc/mediasoup_naluInfo.264");
    const S2T3: &[u8] = include_bytes!("../../../../testdata/video/h264-svc/openh264_2S3T_320x192.264");
    const HEVC: &[u8] = include_bytes!("../../../../testdata/video/hevc/x265_temporal_320x192.265");

    #[test]
    fn splits_at_3_and_4_byte_start_codes() {
        let s = [0, 0, 0, 1, 0x67, 1, 2, 0, 0, 1, 0x68, 3, 0, 0, 0, 1, 0x65, 4, 0];
        let v: Vec<&[u8]> = nal_units(&s).collect();
        assert_eq!(v, [&[0x67, 1, 2][..], &[0x68, 3], &[0x65, 4]]);
    }

    #[test]
    fn access_units_of_real_streams() {
        // Ground truth from PROVENANCE.md: 100 access units, 32 frames, 32 frames.
        assert_eq!(access_units(Codec::H264, SVC).len(), 100);
        assert_eq!(access_units(Codec::H264, S2T3).len(), 32);
        assert_eq!(access_units(Codec::H265, HEVC).len(), 32);
        // mediasoup's CSV lists every NAL unit: the split must agree with its count.
        let csv = include_str!("../../../../testdata/video/h264-svc/mediasoup_naluInfo.csv");
        let rows = csv.lines().skip(1).filter(|l| !l.trim().is_empty()).count();
        assert_eq!(nal_units(SVC).count(), rows);
    }

    #[test]
    fn aggregates_round_trip() {
        for (codec, stream) in [(Codec::H264, SVC), (Codec::H265, HEVC)] {
            for au in access_units(codec, stream) {
                let small: Vec<&[u8]> = au.iter().copied().filter(|n| n.len() < 1000).collect();
                let mut p = Vec::new();
                aggregate(codec, &small, &mut p);
                let mut got = Vec::new();
                Depacketizer::default().push_all(codec, &p, |n| got.push(n));
                assert_eq!(got, small);
            }
        }
    }

    fn round_trip(codec: Codec, stream: &[u8], max: usize) {
        let mut d = Depacketizer::default();
        let mut scratch = Vec::new();
        for nal in nal_units(stream) {
            let mut got = Vec::new();
            packetize(codec, nal, max, &mut scratch, |p, last| {
                assert!(p.len() <= max);
                if let Some(n) = d.push(codec, p) {
                    assert!(last);
                    got.push(n);
                }
            });
            assert_eq!(got, [nal.to_vec()]);
        }
    }

    #[test]
    fn packetize_round_trips_real_streams() {
        for max in [100, 500, 1400] {
            round_trip(Codec::H264, SVC, max);
            round_trip(Codec::H264, S2T3, max);
            round_trip(Codec::H265, HEVC, max);
        }
    }

    /// A picture's units come back whole and in order from its payloads; small ones share
    /// one; the last payload alone ends the picture; none is larger than `max`.
    fn frame_round_trip(codec: Codec, nals: &[Vec<u8>], max: usize) -> usize {
        let refs: Vec<&[u8]> = nals.iter().map(Vec::as_slice).collect();
        let (mut d, mut got, mut payloads, mut ends) = (Depacketizer::default(), Vec::new(), 0, Vec::new());
        packetize_frame(codec, &refs, max, &mut Vec::new(), |p, end| {
            assert!(p.len() <= max, "{} > {max}", p.len());
            payloads += 1;
            ends.push(end);
            d.push_all(codec, p, |n| got.push(n));
        });
        assert_eq!(got, nals, "units changed");
        assert!(ends.last().is_none_or(|e| *e) && ends.iter().filter(|e| **e).count() == nals.len().min(1));
        payloads
    }

    #[test]
    fn a_pictures_small_units_share_a_packet() {
        // The demo's pictures: a delimiter and two slices of ~400 bytes: one packet.
        let (aud, s1, s2) = (vec![0x09, 0xf0], vec![0x41; 422], vec![0x41; 360]);
        assert_eq!(frame_round_trip(Codec::H264, &[aud.clone(), s1.clone(), s2.clone()], 1400), 1);
        // Its keyframe: SPS, PPS and SEI together, then slices too large to join.
        let key = [aud, vec![0x67; 25], vec![0x68; 4], vec![0x06; 699], vec![0x65; 2194], vec![0x65; 1625]];
        assert_eq!(frame_round_trip(Codec::H264, &key, 1400), 1 + 2 + 2);
        let hevc = [vec![0x40, 0x01, 1, 2], vec![0x42, 0x01, 3], vec![0x44, 0x01, 4], vec![0x26, 0x01, 9, 9]];
        assert_eq!(frame_round_trip(Codec::H265, &hevc, 1400), 1);
    }

    #[test]
    fn hevc_fragments_keep_layer_and_tid() {
        let nal: Vec<u8> = [0x02u8, 0x03].into_iter().chain(std::iter::repeat_n(7, 3000)).collect(); // type 1, TID 2
        let mut scratch = Vec::new();
        packetize(Codec::H265, &nal, 1000, &mut scratch, |p, _| {
            assert_eq!((p[0] >> 1) & 0x3f, 49);
            assert_eq!(p[1], 0x03);
            assert_eq!(p[2] & 0x3f, 1);
        });
    }

    proptest! {
        #[test]
        fn depacketizer_never_panics(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..20)) {
            let mut d = Depacketizer::default();
            for p in &payloads {
                let _ = d.push(Codec::H264, p);
                let _ = d.push(Codec::H265, p);
            }
        }

        #[test]
        fn any_picture_round_trips(
            nals in proptest::collection::vec(proptest::collection::vec(1u8..255, 2..3000), 0..8),
            max in 8usize..1500,
        ) {
            // (Real NAL unit types: those above are the payload formats' own.)
            let mut h264 = nals.clone();
            for n in &mut h264 {
                n[0] = (n[0] & 0xe0) | (1 + n[0] % 23);
            }
            frame_round_trip(Codec::H264, &h264, max);
            let mut h265 = nals;
            for n in &mut h265 {
                n[0] = (n[0] & 0x81) | (((n[0] >> 1) % 48) << 1);
            }
            frame_round_trip(Codec::H265, &h265, max);
        }

        #[test]
        fn splitting_never_panics(s in proptest::collection::vec(0u8..3, 0..200)) {
            for nal in nal_units(&s) {
                prop_assert!(nal.len() <= s.len());
            }
            let _ = access_units(Codec::H264, &s);
            let _ = access_units(Codec::H265, &s);
        }
    }
}
