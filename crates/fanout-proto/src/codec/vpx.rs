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

/// What a VP9 payload descriptor (RFC 9628 §4.2) says of its packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vp9Descriptor {
    /// Its length: the frame's bytes follow it.
    pub len: usize,
    /// The packet begins (B) or ends (E) a frame.
    pub begins: bool,
    pub ends: bool,
    /// Its spatial layer (0 without layer indices).
    pub spatial: u8,
}

/// Reads a VP9 payload descriptor; `None` if it runs past the packet.
pub fn vp9_descriptor(payload: &[u8]) -> Option<Vp9Descriptor> {
    let b0 = *payload.first()?;
    let flag = |bit: u8| b0 & bit != 0;
    let (i, p, l, f, v) = (flag(0x80), flag(0x40), flag(0x20), flag(0x10), flag(0x02));
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
    (at <= payload.len()).then_some(Vp9Descriptor { len: at, begins: flag(0x08), ends: flag(0x04), spatial })
}

/// The frame a VP9 payload begins (B set, a well-formed header behind the descriptor).
fn vp9_frame_start(payload: &[u8]) -> Option<Vp9Start> {
    let d = vp9_descriptor(payload).filter(|d| d.begins)?;
    let f = vp9_frame_header(&payload[d.len..])?;
    Some(Vp9Start { spatial: d.spatial, key: f.key })
}

/// What a VP9 frame's uncompressed header (VP9 bitstream spec §6.2) says; the picture's
/// format only for a key frame, which carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vp9Frame {
    /// A key frame, not a repeat of an earlier one.
    pub key: bool,
    pub profile: u8,
    pub format: Option<Vp9Format>,
}

/// A VP9 stream's picture format, from a key frame: what an MP4 `vpcC` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vp9Format {
    pub bit_depth: u8,
    /// ISO/IEC 14496-12 VP codec configuration's chroma subsampling: 1 is 4:2:0, 2 is
    /// 4:2:2, 3 is 4:4:4.
    pub chroma: u8,
    pub full_range: bool,
    pub width: u16,
    pub height: u16,
}

/// Reads a VP9 frame's uncompressed header.
pub fn vp9_frame_header(frame: &[u8]) -> Option<Vp9Frame> {
    let mut r = super::bits::Bits::new(frame);
    if r.bits(2)? != 0b10 {
        return None;
    }
    let low = r.bit()?;
    let profile = (r.bit()? << 1 | low) as u8;
    if profile == 3 {
        r.skip(1)?;
    }
    if r.bit()? == 1 {
        return Some(Vp9Frame { key: false, profile, format: None }); // show_existing_frame
    }
    if r.bit()? == 1 {
        return Some(Vp9Frame { key: false, profile, format: None }); // an inter frame
    }
    Some(Vp9Frame { key: true, profile, format: vp9_key_format(&mut r, profile) })
}

/// A key frame's picture format: behind show_frame and error_resilient_mode, the sync
/// code, color_config() and frame_size().
fn vp9_key_format(r: &mut super::bits::Bits<'_>, profile: u8) -> Option<Vp9Format> {
    r.skip(2)?;
    if r.bits(24)? != 0x49_8342 {
        return None;
    }
    let bit_depth = if profile >= 2 {
        if r.bit()? == 1 {
            12
        } else {
            10
        }
    } else {
        8
    };
    let rgb = r.bits(3)? == 7;
    let (full_range, (sub_x, sub_y)) = if !rgb {
        let range = r.bit()? == 1;
        let sub = if profile & 1 == 1 {
            let sub = (r.bit()?, r.bit()?);
            r.skip(1)?;
            sub
        } else {
            (1, 1)
        };
        (range, sub)
    } else {
        if profile & 1 == 1 {
            r.skip(1)?;
        }
        (true, (0, 0))
    };
    let chroma = match (sub_x, sub_y) {
        (1, 1) => 1,
        (1, 0) => 2,
        _ => 3,
    };
    let width = (r.bits(16)? as u16).saturating_add(1);
    let height = (r.bits(16)? as u16).saturating_add(1);
    Some(Vp9Format { bit_depth, chroma, full_range, width, height })
}

/// The frames of one picture (its spatial layers) as one sample: a single frame as it is,
/// several behind a superframe index (VP9 bitstream spec, Annex B).
pub fn vp9_superframe(frames: &[Vec<u8>]) -> Vec<u8> {
    if frames.len() == 1 {
        return frames[0].clone();
    }
    let frames = &frames[..frames.len().min(8)];
    let largest = frames.iter().map(Vec::len).max().unwrap_or(0);
    let size_bytes = (1..=4).find(|&n| n == 4 || largest < 1 << (8 * n)).unwrap_or(4);
    let marker = 0xc0 | ((size_bytes - 1) as u8) << 3 | (frames.len() - 1) as u8;
    let mut out = frames.concat();
    out.push(marker);
    for f in frames {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes()[..size_bytes]);
    }
    out.push(marker);
    out
}

/// The RFC 6381 codec string of a VP9 stream (`vp09.PP.LL.DD`), its level guessed from the
/// picture size alone (the frame rate is not known).
pub fn vp9_codec_string(profile: u8, f: &Vp9Format) -> String {
    let samples = u64::from(f.width) * u64::from(f.height);
    let level = [
        (36_864, 10),
        (73_728, 11),
        (122_880, 20),
        (245_760, 21),
        (552_960, 30),
        (983_040, 31),
        (2_228_224, 41),
        (8_912_896, 51),
    ]
    .iter()
    .find(|(max, _)| samples <= *max)
    .map_or(61, |(_, l)| *l);
    format!("vp09.{profile:02}.{level:02}.{:02}", f.bit_depth)
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
    fn a_vp9_key_frame_says_its_format_and_pictures_join_in_a_superframe() {
        // libvpx's 320x240 key frame (ffmpeg -c:v libvpx-vp9 -f ivf), profile 0.
        let key = [0x82, 0x49, 0x83, 0x42, 0x00, 0x13, 0xf0, 0x0e, 0xf6, 0x04];
        let f = vp9_frame_header(&key).unwrap();
        let format = Vp9Format { bit_depth: 8, chroma: 1, full_range: false, width: 320, height: 240 };
        assert_eq!(f, Vp9Frame { key: true, profile: 0, format: Some(format) });
        assert_eq!(vp9_codec_string(0, &format), "vp09.00.20.08");
        assert_eq!(vp9_frame_header(&VP9_INTER), Some(Vp9Frame { key: false, profile: 0, format: None }));
        // A key frame cut short is still a key frame, of no known format.
        assert_eq!(vp9_frame_header(&key[..3]).unwrap().format, None);
        assert_eq!(vp9_frame_header(&[0x00]), None);
        // Two frames of one picture: behind an index of 1-byte sizes, marked at both ends.
        assert_eq!(vp9_superframe(&[vec![1, 2], vec![3]]), [1, 2, 3, 0xc1, 2, 1, 0xc1]);
        assert_eq!(vp9_superframe(&[vec![9; 300], vec![3]])[301..], [0xc9, 0x2c, 0x01, 1, 0, 0xc9]);
        assert_eq!(vp9_superframe(&[vec![5]]), [5]);
        // The descriptor: B and E, and where the frame starts.
        let d = vp9_descriptor(&[0x8c, 0x81, 0x02, 0x86]).unwrap();
        assert_eq!((d.len, d.begins, d.ends), (3, true, true));
        assert_eq!(vp9_descriptor(&[0x80]), None);
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
