//! MPEG audio (MP3 and its layers I/II) frames as RTP carries them (RFC 2250 §3.5, the `MPA`
//! payload): the frame header says how long a frame is and how long it plays, which splits
//! a payload into frames and gives an MP4 track its time scale.

/// What an MPEG audio frame header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// MPEG-1 (not MPEG-2 or 2.5).
    pub mpeg1: bool,
    pub layer: u8,
    pub sample_rate: u32,
    pub channels: u16,
    /// The whole frame's length in bytes, header included.
    pub len: usize,
    /// Samples it plays.
    pub samples: u32,
}

/// Reads a frame header; `None` for a bad sync, a reserved field or the free format.
pub fn frame_header(b: &[u8]) -> Option<FrameHeader> {
    let h = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
    if h >> 21 != 0x7ff {
        return None;
    }
    let version = (h >> 19) & 3; // 0: MPEG-2.5, 2: MPEG-2, 3: MPEG-1
    let layer = match (h >> 17) & 3 {
        1 => 3,
        2 => 2,
        3 => 1,
        _ => return None,
    };
    let (bitrate_index, rate_index) = (((h >> 12) & 0xf) as usize, ((h >> 10) & 3) as usize);
    if version == 1 || bitrate_index == 0 || bitrate_index == 15 || rate_index == 3 {
        return None;
    }
    let mpeg1 = version == 3;
    const V1: [[u32; 15]; 3] = [
        [0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448],
        [0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384],
        [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320],
    ];
    const V2: [[u32; 15]; 2] = [
        [0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256],
        [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160],
    ];
    let kbps =
        if mpeg1 { V1[usize::from(layer - 1)][bitrate_index] } else { V2[usize::from(layer > 1)][bitrate_index] };
    let base = [44_100, 48_000, 32_000][rate_index];
    let sample_rate = match version {
        3 => base,
        2 => base / 2,
        _ => base / 4,
    };
    let padding = (h >> 9) & 1;
    let bits = kbps * 1000;
    let (len, samples) = match layer {
        1 => ((12 * bits / sample_rate + padding) * 4, 384),
        2 => (144 * bits / sample_rate + padding, 1152),
        _ if mpeg1 => (144 * bits / sample_rate + padding, 1152),
        _ => (72 * bits / sample_rate + padding, 576),
    };
    let channels = if (h >> 6) & 3 == 3 { 1 } else { 2 };
    Some(FrameHeader { mpeg1, layer, sample_rate, channels, len: len as usize, samples })
}

/// Gathers `MPA` RTP payloads into whole frames: a payload's 4-byte header says where in a
/// frame its data starts (a frame larger than a packet comes in fragments).
#[derive(Debug, Default)]
pub struct MpaDepacketizer {
    buf: Vec<u8>,
}

impl MpaDepacketizer {
    /// One payload in order; its complete frames go to `out`. `false`: malformed or out of
    /// step (a fragment whose beginning was lost), and dropped.
    pub fn push(&mut self, payload: &[u8], out: &mut Vec<Vec<u8>>) -> bool {
        let Some(offset) = payload.get(2..4).map(|o| usize::from(u16::from_be_bytes([o[0], o[1]]))) else {
            return false;
        };
        if offset == 0 {
            self.buf.clear();
        } else if offset != self.buf.len() {
            self.buf.clear();
            return false;
        }
        self.buf.extend_from_slice(&payload[4..]);
        let mut at = 0;
        while let Some(h) = frame_header(&self.buf[at..]) {
            if at + h.len > self.buf.len() || h.len < 4 {
                break;
            }
            out.push(self.buf[at..at + h.len].to_vec());
            at += h.len;
        }
        let ok = at == self.buf.len() || frame_header(&self.buf[at..]).is_some();
        self.buf.drain(..at);
        if !ok {
            self.buf.clear();
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An MPEG-1 Layer III header: 128 kbit/s, 44.1 kHz, no padding, joint stereo.
    const MP3_128K: [u8; 4] = [0xff, 0xfb, 0x90, 0x44];

    fn frame(header: [u8; 4], len: usize) -> Vec<u8> {
        let mut f = header.to_vec();
        f.resize(len, 0x55);
        f
    }

    #[test]
    fn headers_give_length_rate_and_samples() {
        let h = frame_header(&MP3_128K).unwrap();
        assert_eq!((h.mpeg1, h.layer, h.sample_rate, h.channels, h.len, h.samples), (true, 3, 44_100, 2, 417, 1152));
        // Padded: a byte more. MPEG-2 Layer III at 24 kHz, 64 kbit/s, mono: 576 samples.
        assert_eq!(frame_header(&[0xff, 0xfb, 0x92, 0x44]).unwrap().len, 418);
        let h = frame_header(&[0xff, 0xf3, 0x84, 0xc4]).unwrap();
        assert_eq!((h.mpeg1, h.sample_rate, h.channels, h.len, h.samples), (false, 24_000, 1, 192, 576));
        // Free format, a reserved rate, no sync.
        assert_eq!(frame_header(&[0xff, 0xfb, 0x00, 0x44]), None);
        assert_eq!(frame_header(&[0xff, 0xfb, 0x9c, 0x44]), None);
        assert_eq!(frame_header(&[0x12, 0xfb, 0x90, 0x44]), None);
    }

    #[test]
    fn payloads_split_into_frames_and_fragments_join() {
        let mut d = MpaDepacketizer::default();
        let mut out = Vec::new();
        let (a, b) = (frame(MP3_128K, 417), frame(MP3_128K, 417));
        // Two frames in one payload.
        assert!(d.push(&[&[0, 0, 0, 0][..], &a, &b].concat(), &mut out));
        assert_eq!(out, [a.clone(), b.clone()]);
        // One frame over two payloads, the second at offset 300.
        out.clear();
        assert!(d.push(&[&[0, 0, 0, 0][..], &a[..300]].concat(), &mut out));
        assert!(out.is_empty());
        assert!(d.push(&[&[0, 0, 0x01, 0x2c][..], &a[300..]].concat(), &mut out));
        assert_eq!(out, std::slice::from_ref(&a));
        // A fragment whose start was lost is dropped.
        out.clear();
        assert!(!d.push(&[&[0, 0, 0x01, 0x2c][..], &a[300..]].concat(), &mut out));
        assert!(out.is_empty());
        assert!(!d.push(&[0, 0], &mut out));
    }

    proptest! {
        #[test]
        fn any_payloads_give_whole_frames(ps in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..600), 0..6)) {
            let mut d = MpaDepacketizer::default();
            let mut out = Vec::new();
            for p in &ps {
                d.push(p, &mut out);
            }
            for f in &out {
                prop_assert_eq!(frame_header(f).map(|h| h.len), Some(f.len()));
            }
        }
    }
}
