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
const OBU_SEQUENCE_HEADER: u8 = 1;
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
    let mut rest = &payload[1..];
    let mut sequence_header = false;
    for i in 0.. {
        if rest.is_empty() {
            return false;
        }
        // The last of W elements has no length: it runs to the packet's end.
        let len = if w != 0 && i + 1 == w {
            rest.len()
        } else {
            let Some((len, used)) = leb128(rest) else { return false };
            rest = &rest[used..];
            len
        };
        let Some(obu) = rest.get(..len) else { return false };
        rest = &rest[len..];
        match obu_key(obu) {
            Some(Obu::SequenceHeader) => sequence_header = true,
            Some(Obu::Frame { key }) => return key && sequence_header,
            None => return false,
            Some(Obu::Other) => {}
        }
        if w != 0 && i + 1 == w {
            return false;
        }
    }
    false
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

    proptest! {
        #[test]
        fn any_payload_is_judged_without_panic(p in proptest::collection::vec(any::<u8>(), 0..64)) {
            let key = av1_keyframe_start(&p);
            // A continuation never starts anything.
            prop_assert!(!(key && p[0] & 0x80 != 0));
        }
    }
}
