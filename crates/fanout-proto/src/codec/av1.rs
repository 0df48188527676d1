//! AV1 RTP payloads (the AOM "RTP Payload Format for AV1"): whether a packet starts a
//! keyframe, so a new subscriber of such a stream starts at one from the ring.
//!
//! A payload is an aggregation header, `|Z|Y|W W|N|-|-|-|`, then OBU elements: Z says the
//! first element continues an OBU of the packet before, W how many elements there are (0:
//! any, each with a LEB128 length; otherwise every one but the last has one), and N that
//! the packet begins a coded video sequence, i.e. a key frame with its sequence header.
//! A packetizer that leaves N clear is judged by the OBUs themselves: a sequence header,
//! then the header of a key frame.

/// OBU types that matter here (AV1 spec 6.2.2).
pub const OBU_SEQUENCE_HEADER: u8 = 1;
const OBU_FRAME_HEADER: u8 = 3;
const OBU_FRAME: u8 = 6;

/// Whether an AV1 payload is the first packet of a keyframe.
pub fn av1_keyframe_start(payload: &[u8]) -> bool {
    let Some(&agg) = payload.first() else { return false };
    let (z, w, n) = (agg & 0x80 != 0, usize::from((agg >> 4) & 0x03), agg & 0x08 != 0);
    if z {
        return false;
    }
    if n {
        return true;
    }
    let mut sequence_header = false;
    for obu in elements(&payload[1..], w) {
        match obu.and_then(obu_key) {
            Some(Obu::SequenceHeader) => sequence_header = true,
            Some(Obu::Frame { key }) => return key && sequence_header,
            None => return false,
            Some(Obu::Other) => {}
        }
    }
    false
}

/// The OBU elements of a payload after its aggregation header: with W (`w`) elements, the
/// last runs to the packet's end; with W = 0, each has a LEB128 length. `None` for an
/// element whose length runs past the packet, and nothing after it.
fn elements(mut rest: &[u8], w: usize) -> impl Iterator<Item = Option<&[u8]>> {
    let (mut i, mut done) = (0, false);
    std::iter::from_fn(move || {
        if done || rest.is_empty() {
            return None;
        }
        i += 1;
        let len = if w != 0 && i == w {
            done = true;
            rest.len()
        } else {
            let Some((len, used)) = leb128(rest) else {
                done = true;
                return Some(None);
            };
            rest = &rest[used..];
            len
        };
        let Some(element) = rest.get(..len) else {
            done = true;
            return Some(None);
        };
        rest = &rest[len..];
        Some(Some(element))
    })
}

enum Obu {
    SequenceHeader,
    /// A frame or frame header OBU: whether it is a key frame, shown now.
    Frame {
        key: bool,
    },
    Other,
}

/// What an OBU is, from its header and, for a frame, the first bits of its frame header
/// (`show_existing_frame`, `frame_type`: 0 is KEY_FRAME). `None`: malformed.
fn obu_key(obu: &[u8]) -> Option<Obu> {
    let h = *obu.first()?;
    if h & 0x80 != 0 {
        return None; // forbidden bit
    }
    let kind = (h >> 3) & 0x0f;
    let mut at = if h & 0x04 != 0 { 2 } else { 1 }; // extension header
    if h & 0x02 != 0 {
        // obu_has_size_field: a size inside the element too.
        at += leb128(obu.get(at..)?)?.1;
    }
    Some(match kind {
        OBU_SEQUENCE_HEADER => Obu::SequenceHeader,
        OBU_FRAME_HEADER | OBU_FRAME => {
            let b = *obu.get(at)?;
            Obu::Frame { key: b & 0x80 == 0 && (b >> 5) & 0x03 == 0 }
        }
        _ => Obu::Other,
    })
}

/// An unsigned LEB128 value (at most 8 bytes, as AV1 allows) and the bytes it took.
fn leb128(b: &[u8]) -> Option<(usize, usize)> {
    let mut v: u64 = 0;
    for (i, &byte) in b.iter().take(8).enumerate() {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((usize::try_from(v).ok()?, i + 1));
        }
    }
    None
}

/// OBU types a stored stream leaves out (AV1-ISOBMFF §2.4): temporal delimiters, tile lists,
/// padding.
const OBU_TEMPORAL_DELIMITER: u8 = 2;
const OBU_TILE_LIST: u8 = 8;
const OBU_PADDING: u8 = 15;

/// Gathers AV1 RTP payloads into OBUs in the low-overhead form MP4 and Matroska store (each
/// OBU with its size field), OBUs split over packets joined. A fragment whose start was lost
/// is dropped, with the OBU it belonged to.
#[derive(Debug, Default)]
pub struct Av1Depacketizer {
    /// The OBU continued in the next packet (Y), as far as it came.
    frag: Vec<u8>,
}

impl Av1Depacketizer {
    /// One payload in order; its complete OBUs are appended to `out`. `false`: malformed.
    pub fn push(&mut self, payload: &[u8], out: &mut Vec<u8>) -> bool {
        let Some(&agg) = payload.first() else { return false };
        let (z, y, w) = (agg & 0x80 != 0, agg & 0x40 != 0, usize::from((agg >> 4) & 0x03));
        if !z {
            self.frag.clear();
        }
        let mut elements = elements(&payload[1..], w).peekable();
        let mut first = true;
        while let Some(element) = elements.next() {
            let Some(element) = element else { return false };
            let last = elements.peek().is_none();
            if std::mem::take(&mut first) && z {
                if self.frag.is_empty() {
                    // Its start was lost: the rest of that OBU is no use.
                    continue;
                }
                self.frag.extend_from_slice(element);
            } else {
                self.frag.clear();
                self.frag.extend_from_slice(element);
            }
            if last && y {
                return true; // continued in the next packet
            }
            let obu = std::mem::take(&mut self.frag);
            if !sized_obu(&obu, out) {
                return false;
            }
        }
        true
    }
}

/// Appends `obu` (as RTP carries it, with or without a size field) with its size field, unless
/// it is of a kind a stored stream leaves out; `false` if its header is malformed.
fn sized_obu(obu: &[u8], out: &mut Vec<u8>) -> bool {
    let Some(&h) = obu.first() else { return true };
    if h & 0x80 != 0 {
        return false;
    }
    let header = if h & 0x04 != 0 { 2 } else { 1 };
    let Some(mut payload) = obu.get(header..) else { return false };
    if h & 0x02 != 0 {
        let Some((len, used)) = leb128(payload) else { return false };
        let Some(p) = payload.get(used..used + len) else { return false };
        payload = p;
    }
    if matches!((h >> 3) & 0x0f, OBU_TEMPORAL_DELIMITER | OBU_TILE_LIST | OBU_PADDING) {
        return true;
    }
    out.push(h | 0x02);
    out.extend_from_slice(&obu[1..header]);
    write_leb128(payload.len(), out);
    out.extend_from_slice(payload);
    true
}

fn write_leb128(mut v: usize, out: &mut Vec<u8>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The OBUs of a low-overhead stream (each with its size field): (type, the whole OBU, its
/// payload). Stops at the first malformed one.
pub fn sized_obus(mut data: &[u8]) -> impl Iterator<Item = (u8, &[u8], &[u8])> {
    std::iter::from_fn(move || {
        let &h = data.first()?;
        let header = if h & 0x04 != 0 { 2 } else { 1 };
        if h & 0x02 == 0 {
            return None;
        }
        let (len, used) = leb128(data.get(header..)?)?;
        let end = header.checked_add(used)?.checked_add(len)?;
        let obu = data.get(..end)?;
        data = &data[end..];
        Some(((h >> 3) & 0x0f, obu, &obu[header + used..]))
    })
}

/// Whether a temporal unit (sized OBUs) starts a coded video sequence: a sequence header
/// and a key frame shown.
pub fn temporal_unit_is_key(tu: &[u8]) -> bool {
    let mut sequence_header = false;
    for (kind, obu, _) in sized_obus(tu) {
        match (kind, obu_key(obu)) {
            (OBU_SEQUENCE_HEADER, _) => sequence_header = true,
            (_, Some(Obu::Frame { key })) => return key && sequence_header,
            _ => {}
        }
    }
    false
}

/// What an AV1 sequence header says that an MP4 `av1C` and a codec string need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceHeader {
    pub profile: u8,
    pub level: u8,
    pub tier: u8,
    pub bit_depth: u8,
    pub monochrome: bool,
    pub subsampling: (u8, u8),
    pub chroma_position: u8,
    pub width: u16,
    pub height: u16,
}

impl SequenceHeader {
    /// Reads a sequence header OBU's payload (AV1 spec §5.5).
    pub fn parse(payload: &[u8]) -> Option<Self> {
        let mut r = super::bits::Bits::new(payload);
        let profile = r.bits(3)? as u8;
        r.skip(1)?; // still_picture
        let reduced = r.bit()? == 1;
        let (level, tier) = if reduced {
            (r.bits(5)? as u8, 0)
        } else {
            let mut decoder_model = None;
            if r.bit()? == 1 {
                // timing_info(): tick, time scale, equal picture interval (and its ticks).
                r.skip(64)?;
                if r.bit()? == 1 {
                    uvlc(&mut r)?;
                }
                if r.bit()? == 1 {
                    // decoder_model_info()
                    let delay_bits = r.bits(5)? + 1;
                    r.skip(32 + 5 + 5)?;
                    decoder_model = Some(delay_bits);
                }
            }
            let initial_display_delay = r.bit()? == 1;
            let points = r.bits(5)? + 1;
            let mut first = None;
            for _ in 0..points {
                r.skip(12)?; // operating_point_idc
                let level = r.bits(5)? as u8;
                let tier = if level > 7 { r.bit()? as u8 } else { 0 };
                if let Some(n) = decoder_model {
                    if r.bit()? == 1 {
                        r.skip(2 * n as usize + 1)?;
                    }
                }
                if initial_display_delay && r.bit()? == 1 {
                    r.skip(4)?;
                }
                first.get_or_insert((level, tier));
            }
            first?
        };
        let width_bits = r.bits(4)? + 1;
        let height_bits = r.bits(4)? + 1;
        let width = r.bits(width_bits)? + 1;
        let height = r.bits(height_bits)? + 1;
        if !reduced && r.bit()? == 1 {
            r.skip(7)?; // frame id lengths
        }
        r.skip(3)?; // 128x128 superblocks, filter intra, intra edge filter
        if !reduced {
            r.skip(4)?; // interintra, masked compound, warped motion, dual filter
            let order_hint = r.bit()? == 1;
            if order_hint {
                r.skip(2)?;
            }
            let screen_content = if r.bit()? == 1 { 2 } else { r.bit()? };
            if screen_content > 0 && r.bit()? == 0 {
                r.skip(1)?; // seq_force_integer_mv
            }
            if order_hint {
                r.skip(3)?;
            }
        }
        r.skip(3)?; // superres, cdef, restoration
                    // color_config()
        let high = r.bit()? == 1;
        let bit_depth = match (profile, high) {
            (2, true) => {
                if r.bit()? == 1 {
                    12
                } else {
                    10
                }
            }
            (_, true) => 10,
            _ => 8,
        };
        let monochrome = profile != 1 && r.bit()? == 1;
        let (mut cp, mut tc, mut mc) = (2, 2, 2);
        if r.bit()? == 1 {
            (cp, tc, mc) = (r.bits(8)?, r.bits(8)?, r.bits(8)?);
        }
        let (subsampling, chroma_position) = if monochrome {
            ((1, 1), 0)
        } else if (cp, tc, mc) == (1, 13, 0) {
            ((0, 0), 0)
        } else {
            r.skip(1)?; // color_range
            let sub = match profile {
                0 => (1, 1),
                1 => (0, 0),
                _ if bit_depth == 12 => {
                    let x = r.bit()? as u8;
                    (x, if x == 1 { r.bit()? as u8 } else { 0 })
                }
                _ => (1, 0),
            };
            let position = if sub == (1, 1) { r.bits(2)? as u8 } else { 0 };
            (sub, position)
        };
        Some(Self {
            profile,
            level,
            tier,
            bit_depth,
            monochrome,
            subsampling,
            chroma_position,
            width: width.min(0xffff) as u16,
            height: height.min(0xffff) as u16,
        })
    }

    /// The `av1C` box's content (AV1-ISOBMFF §2.3.3), `obu` (the sequence header, sized) its
    /// configuration OBU.
    pub fn av1c(&self, obu: &[u8]) -> Vec<u8> {
        let mut c = vec![
            0x81,
            self.profile << 5 | (self.level & 0x1f),
            self.tier << 7
                | u8::from(self.bit_depth > 8) << 6
                | u8::from(self.bit_depth == 12) << 5
                | u8::from(self.monochrome) << 4
                | self.subsampling.0 << 3
                | self.subsampling.1 << 2
                | (self.chroma_position & 0x03),
            0,
        ];
        c.extend_from_slice(obu);
        c
    }

    /// The RFC 6381 codec string: `av01.0.08M.08`.
    pub fn codec(&self) -> String {
        format!(
            "av01.{}.{:02}{}.{:02}",
            self.profile,
            self.level,
            if self.tier == 1 { 'H' } else { 'M' },
            self.bit_depth
        )
    }
}

/// An unsigned variable-length code (AV1 spec §4.10.3).
fn uvlc(r: &mut super::bits::Bits<'_>) -> Option<u32> {
    let mut zeros = 0;
    while r.bit()? == 0 {
        zeros += 1;
        if zeros >= 32 {
            return Some(u32::MAX);
        }
    }
    Some(r.bits(zeros)? + ((1u64 << zeros) - 1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // OBU headers without size fields (as RTP carries them): a sequence header, a frame.
    const SEQ: [u8; 3] = [OBU_SEQUENCE_HEADER << 3, 0x00, 0x00];
    const KEY_FRAME: [u8; 3] = [OBU_FRAME << 3, 0x10, 0xaa];
    const INTER_FRAME: [u8; 3] = [OBU_FRAME << 3, 0x30, 0xaa];

    #[test]
    fn the_n_bit_starts_a_keyframe_unless_it_continues_a_fragment() {
        assert!(av1_keyframe_start(&[0x18, 0x0a, 0x0b]));
        assert!(!av1_keyframe_start(&[0x98, 0x0a]), "Z with N is no start");
        assert!(!av1_keyframe_start(&[0x10, 0x0a]));
        assert!(!av1_keyframe_start(&[]));
    }

    #[test]
    fn without_n_a_sequence_header_then_a_key_frame_is_a_start() {
        // W = 2: the sequence header with its length, the frame to the end.
        assert!(av1_keyframe_start(&[&[0x20, 3][..], &SEQ, &KEY_FRAME].concat()));
        assert!(!av1_keyframe_start(&[&[0x20, 3][..], &SEQ, &INTER_FRAME].concat()));
        // A key frame without its sequence header is not where a decoder can start.
        assert!(!av1_keyframe_start(&[&[0x10][..], &KEY_FRAME].concat()));
        // W = 0: every element with a length; a frame header OBU with an extension header
        // and a size field of its own.
        let frame_header = [OBU_FRAME_HEADER << 3 | 0x06, 0x08, 0x01, 0x10];
        assert!(av1_keyframe_start(&[&[0x00, 3][..], &SEQ, &[4], &frame_header].concat()));
        // A length past the end, a forbidden bit.
        assert!(!av1_keyframe_start(&[&[0x00, 9][..], &SEQ].concat()));
        assert!(!av1_keyframe_start(&[0x20, 3, 0x80 | OBU_SEQUENCE_HEADER << 3, 0, 0, 0x30]));
    }

    #[test]
    fn leb128_reads_multi_byte_lengths() {
        assert_eq!(leb128(&[0x05]), Some((5, 1)));
        assert_eq!(leb128(&[0x80, 0x01]), Some((128, 2)));
        assert_eq!(leb128(&[0x80; 8]), None);
    }

    /// Sequence headers libaom wrote (ffmpeg `-c:v libaom-av1 -f obu`): 320x240 8-bit at
    /// level 0 (2.0), 1280x720 10-bit at level 5 (3.1), as ffprobe reads them.
    const SEQ_320: [u8; 11] = [0x00, 0x00, 0x00, 0x04, 0x3c, 0xff, 0xbc, 0xda, 0xf9, 0x00, 0x40];
    const SEQ_720_10BIT: [u8; 11] = [0x00, 0x00, 0x00, 0x2d, 0x4c, 0xff, 0xb3, 0xcc, 0xaf, 0x94, 0x04];

    #[test]
    fn sequence_headers_say_what_av1c_and_the_codec_string_need() {
        let h = SequenceHeader::parse(&SEQ_320).unwrap();
        assert_eq!((h.profile, h.level, h.tier, h.bit_depth, h.width, h.height), (0, 0, 0, 8, 320, 240));
        assert_eq!((h.monochrome, h.subsampling), (false, (1, 1)));
        assert_eq!(h.codec(), "av01.0.00M.08");
        let h = SequenceHeader::parse(&SEQ_720_10BIT).unwrap();
        assert_eq!((h.level, h.bit_depth, h.width, h.height), (5, 10, 1280, 720));
        assert_eq!(h.codec(), "av01.0.05M.10");
        let obu = [&[0x0a, 11][..], &SEQ_720_10BIT].concat();
        assert_eq!(h.av1c(&obu)[..4], [0x81, 0x05, 0x4c, 0x00]);
        assert_eq!(h.av1c(&obu)[4..], obu);
        assert_eq!(SequenceHeader::parse(&SEQ_320[..6]), None, "cut short");
    }

    #[test]
    fn obus_split_over_packets_are_joined_and_a_lost_start_dropped() {
        let mut d = Av1Depacketizer::default();
        let mut out = Vec::new();
        // A frame OBU over three packets: Y; Z and Y; Z. W=1: one element, no length.
        assert!(d.push(&[0x50, 0x30, 0x01], &mut out));
        assert!(d.push(&[0xd0, 0x02], &mut out));
        assert!(out.is_empty());
        assert!(d.push(&[0x90, 0x03], &mut out));
        assert_eq!(out, [0x32, 3, 0x01, 0x02, 0x03]);
        // A continuation whose start was lost, then a whole OBU in the same packet (W=2).
        out.clear();
        assert!(d.push(&[0xa0, 1, 0x99, 0x30, 0x07], &mut out));
        assert_eq!(out, [0x32, 1, 0x07]);
        // An OBU that has its own size field keeps only what it says; padding is left out.
        out.clear();
        assert!(d.push(&[0x20, 3, 0x7a, 0x00, 0x00, 0x32, 1, 0x05, 0xee], &mut out));
        assert_eq!(out, [0x32, 1, 0x05]);
        assert!(!d.push(&[0x00, 9, 0x30], &mut out), "a length past the end");
        let obus: Vec<_> = sized_obus(&[0x0a, 1, 0x00, 0x32, 2, 0x10, 0x00]).map(|o| o.0).collect();
        assert_eq!(obus, [OBU_SEQUENCE_HEADER, OBU_FRAME]);
    }

    proptest! {
        #[test]
        fn any_packets_gather_without_panic_into_sized_obus(ps in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..6)) {
            let mut d = Av1Depacketizer::default();
            let mut out = Vec::new();
            for p in &ps {
                d.push(p, &mut out);
            }
            // What comes out is whole OBUs with their sizes, back to back.
            let whole: usize = sized_obus(&out).map(|o| o.1.len()).sum();
            prop_assert_eq!(whole, out.len());
            let first = sized_obus(&out).next().map(|o| o.2.to_vec());
            if let Some(payload) = first {
                let _ = SequenceHeader::parse(&payload);
            }
        }

        #[test]
        fn any_payload_is_judged_without_panic(p in proptest::collection::vec(any::<u8>(), 0..64)) {
            let key = av1_keyframe_start(&p);
            // A continuation never starts anything.
            prop_assert!(!(key && p[0] & 0x80 != 0));
        }
    }
}
