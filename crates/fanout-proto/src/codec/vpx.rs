//! VP8 (RFC 7741) and VP9 (RFC 9628) RTP payloads: whether a packet starts a keyframe, so a
//! new subscriber of such a stream starts at one from the ring, as it does for H.264/HEVC.
//!
//! The keyframe is judged from the codec's own frame header behind the payload descriptor,
//! not from the descriptor's hints alone: ffmpeg's VP9 packetizer, for one, never sets the
//! descriptor's inter-picture flag, which would make every frame look like a keyframe.

/// Whether a VP8 payload is the first packet of a keyframe: the start of partition 0 whose
/// frame tag says key frame, with the key frame's start code (9d 01 2a) after it.
pub fn vp8_keyframe_start(payload: &[u8]) -> bool {
    vp8_key_header(payload).is_some()
}

/// The picture size a VP8 keyframe's first packet gives (14 bits each, after its start
/// code); `None` for any other packet.
pub fn vp8_keyframe_size(payload: &[u8]) -> Option<(u16, u16)> {
    let f = vp8_key_header(payload)?;
    let size = f.get(6..10)?;
    Some((u16::from_le_bytes([size[0], size[1]]) & 0x3fff, u16::from_le_bytes([size[2], size[3]]) & 0x3fff))
}

/// A keyframe's first packet: its frame header (from the frame tag on).
fn vp8_key_header(payload: &[u8]) -> Option<&[u8]> {
    let &b0 = payload.first()?;
    let (start, pid) = (b0 & 0x10 != 0, b0 & 0x07);
    if !start || pid != 0 {
        return None;
    }
    let mut at = 1;
    if b0 & 0x80 != 0 {
        // Extension: |I|L|T|K|RSV|, then the fields it announces.
        let &x = payload.get(1)?;
        at = 2;
        if x & 0x80 != 0 {
            // PictureID, 7 or 15 bits (M).
            let &p = payload.get(at)?;
            at += if p & 0x80 != 0 { 2 } else { 1 };
        }
        if x & 0x40 != 0 {
            at += 1; // TL0PICIDX
        }
        if x & 0x30 != 0 {
            at += 1; // TID/Y/KEYIDX
        }
    }
    // The frame tag's lowest bit is 0 for a key frame; its start code follows the tag.
    let f = payload.get(at..)?;
    (f.len() >= 6 && f[0] & 0x01 == 0 && f[3..6] == [0x9d, 0x01, 0x2a]).then_some(f)
}

/// Whether a VP9 payload is the first packet of a keyframe: the beginning of a frame (B) of
/// the lowest spatial layer whose uncompressed header says key frame (and not a repeat of
/// an earlier frame).
pub fn vp9_keyframe_start(payload: &[u8]) -> bool {
    vp9_frame_start(payload).is_some_and(|f| f.spatial == 0 && f.key)
}

/// What the first packet of a VP9 frame says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Vp9Start {
    /// Its spatial layer (0 without layer indices).
    spatial: u8,
    /// A key frame by its uncompressed header.
    key: bool,
}

/// The frame a VP9 payload begins (B set, a well-formed header behind the descriptor).
fn vp9_frame_start(payload: &[u8]) -> Option<Vp9Start> {
    let b0 = *payload.first()?;
    let flag = |bit: u8| b0 & bit != 0;
    let (i, p, l, f, b, v) = (flag(0x80), flag(0x40), flag(0x20), flag(0x10), flag(0x08), flag(0x02));
    if !b {
        return None;
    }
    let mut at = 1;
    if i {
        at += if *payload.get(at)? & 0x80 != 0 { 2 } else { 1 };
    }
    let mut spatial = 0;
    if l {
        spatial = (*payload.get(at)? >> 1) & 0x07;
        at += if f { 1 } else { 2 }; // TL0PICIDX in non-flexible mode
    }
    if f && p {
        // Up to three reference differences, each with a "more follow" bit.
        for _ in 0..3 {
            let d = *payload.get(at)?;
            at += 1;
            if d & 0x01 == 0 {
                break;
            }
        }
    }
    if v {
        // Scalability structure: |N_S|Y|G|, sizes per spatial layer, picture groups.
        let ss = *payload.get(at)?;
        at += 1;
        if ss & 0x10 != 0 {
            at += 4 * (usize::from(ss >> 5) + 1);
        }
        if ss & 0x08 != 0 {
            let groups = *payload.get(at)?;
            at += 1;
            for _ in 0..groups {
                at += 1 + usize::from((*payload.get(at)? >> 2) & 0x03);
            }
        }
    }
    // The uncompressed header: frame_marker (2), profile (2, and a reserved bit for profile
    // 3), show_existing_frame, frame_type (0: key frame).
    let h = *payload.get(at)?;
    if h >> 6 != 0b10 {
        return None;
    }
    let profile = ((h >> 4) & 0x01) << 1 | ((h >> 5) & 0x01);
    let shift = if profile == 3 { 1 } else { 0 };
    let show_existing = (h >> (3 - shift)) & 0x01;
    let frame_type = (h >> (2 - shift)) & 0x01;
    Some(Vp9Start { spatial, key: show_existing == 0 && frame_type == 0 })
}

/// A VP9 stream's frame in progress, to set the descriptor's inter-picture flag (P) that
/// some packetizers leave clear on every frame (ffmpeg's): a receiver that trusts it (a
/// browser) takes each frame for a key frame, drops what it thinks it can skip and freezes.
/// Only single-layer, non-flexible streams are touched, where P=1 asks for nothing more.
#[derive(Debug, Default)]
pub struct Vp9Predicted {
    inter: bool,
}

impl Vp9Predicted {
    /// Judges one payload in order: returns whether it starts a keyframe, and sets P on each
    /// packet of a predicted frame where the descriptor allows.
    pub fn packet(&mut self, payload: &mut [u8]) -> bool {
        let start = vp9_frame_start(payload);
        if let Some(f) = start {
            self.inter = !f.key;
        }
        if let Some(b0) = payload.first_mut() {
            // Not flexible (F), no layer indices (L), P clear.
            if self.inter && *b0 & 0x70 == 0 {
                *b0 |= 0x40;
            }
        }
        start.is_some_and(|f| f.spatial == 0 && f.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // A VP8 key frame's first bytes: the frame tag (key, version 0, shown, partition size),
    // the start code, 640x480.
    const VP8_KEY: [u8; 10] = [0x50, 0x42, 0x00, 0x9d, 0x01, 0x2a, 0x80, 0x02, 0xe0, 0x01];
    const VP8_INTER: [u8; 3] = [0x31, 0x0e, 0x00];

    #[test]
    fn vp8_keyframes_are_found_behind_every_descriptor_form() {
        // Bare descriptor, S=1, PID 0.
        assert!(vp8_keyframe_start(&[&[0x10][..], &VP8_KEY].concat()));
        // Extended: I with a 15-bit picture id, L, T/K (ffmpeg's and browsers' forms).
        assert!(vp8_keyframe_start(&[&[0x90, 0x80, 0x81, 0x23][..], &VP8_KEY].concat()));
        assert!(vp8_keyframe_start(&[&[0x90, 0xf0, 0x05, 0x11, 0x40][..], &VP8_KEY].concat()));
        // Not a start: S=0, another partition, an inter frame, a truncated packet.
        assert!(!vp8_keyframe_start(&[&[0x00][..], &VP8_KEY].concat()));
        assert!(!vp8_keyframe_start(&[&[0x11][..], &VP8_KEY].concat()));
        assert!(!vp8_keyframe_start(&[&[0x10][..], &VP8_INTER, &[0; 8]].concat()));
        assert!(!vp8_keyframe_start(&[0x90, 0x80]));
        assert!(!vp8_keyframe_start(&[]));
        // Its picture size, from a keyframe's first packet only.
        assert_eq!(vp8_keyframe_size(&[&[0x90, 0x80, 0x81, 0x23][..], &VP8_KEY].concat()), Some((640, 480)));
        assert_eq!(vp8_keyframe_size(&[&[0x10][..], &VP8_INTER, &[0; 8]].concat()), None);
        assert_eq!(vp8_keyframe_size(&[&[0x10][..], &VP8_KEY[..8]].concat()), None);
    }

    // VP9 uncompressed headers, profile 0: frame marker 10, profile 00, show_existing 0,
    // frame_type 0 (key) / 1 (inter); then the key frame's sync code.
    const VP9_KEY: [u8; 4] = [0x82, 0x49, 0x83, 0x42];
    const VP9_INTER: [u8; 4] = [0x86, 0x00, 0x40, 0x92];

    #[test]
    fn vp9_keyframes_are_found_by_their_header_not_the_descriptors_hint() {
        // ffmpeg's descriptor: B alone (its P bit is never set).
        assert!(vp9_keyframe_start(&[&[0x08][..], &VP9_KEY].concat()));
        assert!(!vp9_keyframe_start(&[&[0x08][..], &VP9_INTER].concat()));
        // A browser's: I with a 15-bit id, B, E, and a scalability structure (one layer, sizes,
        // one group with one reference).
        let ss = [0x18, 0x02, 0x80, 0x01, 0xe0, 0x01, 0x04, 0x11];
        assert!(vp9_keyframe_start(&[&[0x8e, 0x81, 0x02][..], &ss, &VP9_KEY].concat()));
        // Layer indices: spatial layer 0 counts (with TL0PICIDX), layer 1 does not.
        assert!(vp9_keyframe_start(&[&[0x28, 0x00, 0x07][..], &VP9_KEY].concat()));
        assert!(!vp9_keyframe_start(&[&[0x28, 0x02, 0x07][..], &VP9_KEY].concat()));
        // Flexible mode with references (an inter picture by its descriptor, too).
        assert!(!vp9_keyframe_start(&[&[0x58, 0x03, 0x02][..], &VP9_INTER].concat()));
        // Not the beginning of a frame; a repeated frame; profile 3's extra bit.
        assert!(!vp9_keyframe_start(&[&[0x00][..], &VP9_KEY].concat()));
        assert!(!vp9_keyframe_start(&[0x08, 0x88]));
        assert!(vp9_keyframe_start(&[0x08, 0xb0]));
        assert!(!vp9_keyframe_start(&[0x08, 0xb2]));
        assert!(!vp9_keyframe_start(&[0x88]));
    }

    #[test]
    fn ffmpegs_vp9_gets_its_inter_frames_flagged() {
        let mut v = Vp9Predicted::default();
        let mut key = [&[0x08][..], &VP9_KEY].concat();
        let mut key_rest = [0x04, 0x11, 0x22];
        let mut inter = [&[0x08][..], &VP9_INTER].concat();
        let mut inter_rest = [0x04, 0x33];
        assert!(v.packet(&mut key));
        assert!(!v.packet(&mut key_rest));
        assert_eq!((key[0], key_rest[0]), (0x08, 0x04), "a key frame's packets stay as they are");
        assert!(!v.packet(&mut inter));
        assert!(!v.packet(&mut inter_rest));
        assert_eq!((inter[0], inter_rest[0]), (0x48, 0x44), "P on each packet of an inter frame");
        // Flexible mode or layer indices: left alone (P would ask for fields not there).
        let mut flexible = [&[0x18][..], &VP9_INTER].concat();
        let mut layered = [&[0x28, 0x00, 0x01][..], &VP9_INTER].concat();
        v.packet(&mut flexible);
        v.packet(&mut layered);
        assert_eq!((flexible[0], layered[0]), (0x18, 0x28));
    }

    proptest! {
        // Judging any bytes in any order changes at most the P bit of the first byte.
        #[test]
        fn vp9_flagging_touches_nothing_but_p(ps in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..8)) {
            let mut v = Vp9Predicted::default();
            for p in ps {
                let mut q = p.clone();
                let key = v.packet(&mut q);
                prop_assert_eq!(key, vp9_keyframe_start(&p));
                if let (Some(a), Some(b)) = (p.first(), q.first()) {
                    prop_assert_eq!(a | 0x40, b | 0x40);
                    prop_assert_eq!(&p[1..], &q[1..]);
                }
            }
        }


        // Any bytes: no panic, and a packet that is not a frame's start is never a keyframe's.
        #[test]
        fn any_payload_is_judged_without_panic(p in proptest::collection::vec(any::<u8>(), 0..64)) {
            let (k8, k9) = (vp8_keyframe_start(&p), vp9_keyframe_start(&p));
            if p.first().is_some_and(|b| b & 0x10 == 0) {
                prop_assert!(!k8);
            }
            if p.first().is_some_and(|b| b & 0x08 == 0) {
                prop_assert!(!k9);
            }
        }

        // A key frame stays found behind any picture id the descriptor carries.
        #[test]
        fn keyframes_are_found_whatever_the_picture_id(id in 0u16..0x8000) {
            let pid = [0x80 | (id >> 8) as u8, id as u8];
            prop_assert!(vp8_keyframe_start(&[&[0x90, 0x80][..], &pid, &VP8_KEY].concat()));
            prop_assert!(vp9_keyframe_start(&[&[0x88][..], &pid, &VP9_KEY].concat()));
        }
    }
}
