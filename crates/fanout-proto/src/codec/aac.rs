//! AAC in ADTS frames (ISO/IEC 13818-7 / 14496-3) and its RTP payload format, MPEG4-GENERIC
//! in `AAC-hbr` mode (RFC 3640 §3.3.6): one access unit per packet behind a 16-bit AU
//! header (13 bits of size, 3 of index). Enough to send the AAC of a transport stream over
//! RTSP; sans-IO.

/// One ADTS frame: the raw AAC access unit and what its header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdtsFrame<'a> {
    pub au: &'a [u8],
    /// Audio object type (2 = AAC LC).
    pub object_type: u8,
    pub sample_rate_index: u8,
    pub channels: u8,
}

const RATES: [u32; 13] = [96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350];

/// The sample rate of a sampling frequency index (ISO/IEC 14496-3 §1.6.3.4).
pub fn sample_rate(index: u8) -> Option<u32> {
    RATES.get(usize::from(index)).copied()
}

impl AdtsFrame<'_> {
    pub fn sample_rate(&self) -> Option<u32> {
        RATES.get(usize::from(self.sample_rate_index)).copied()
    }

    /// The AudioSpecificConfig (two bytes) the SDP's `config=` carries.
    pub fn audio_specific_config(&self) -> [u8; 2] {
        let v: u16 =
            u16::from(self.object_type) << 11 | u16::from(self.sample_rate_index) << 7 | u16::from(self.channels) << 3;
        v.to_be_bytes()
    }
}

/// The ADTS frames of a buffer, in order; stops at the first bad header or a frame that
/// runs past the end.
pub fn adts_frames(mut b: &[u8]) -> Vec<AdtsFrame<'_>> {
    let mut out = Vec::new();
    while b.len() >= 7 && b[0] == 0xff && b[1] & 0xf6 == 0xf0 {
        let header = if b[1] & 1 == 1 { 7 } else { 9 };
        let len = usize::from(b[3] & 3) << 11 | usize::from(b[4]) << 3 | usize::from(b[5] >> 5);
        if len < header || len > b.len() {
            break;
        }
        out.push(AdtsFrame {
            au: &b[header..len],
            object_type: (b[2] >> 6) + 1,
            sample_rate_index: (b[2] >> 2) & 0x0f,
            channels: (b[2] & 1) << 2 | b[3] >> 6,
        });
        b = &b[len..];
    }
    out
}

/// The RTP payload of one access unit in AAC-hbr mode; `None` if it is too big for the
/// 13-bit size field.
pub fn rtp_payload(au: &[u8]) -> Option<Vec<u8>> {
    rtp_payload_of(&[au])
}

/// How many of `aus` (at least one, at most `most`) go in one payload of at most `max` bytes.
pub fn frames_per_packet(aus: &[&[u8]], most: usize, max: usize) -> usize {
    let mut size = 2;
    let fit = aus.iter().take(most).take_while(|au| {
        size += 2 + au.len();
        size <= max
    });
    fit.count().max(1).min(aus.len())
}

/// Consecutive AAC frames in one RFC 3640 AAC-hbr payload: a header per frame (its size,
/// index 0 then index deltas 0: each follows the one before), then the frames; `None` if
/// one is too large for a header.
pub fn rtp_payload_of(aus: &[&[u8]]) -> Option<Vec<u8>> {
    let headers = u16::try_from(aus.len() * 16).ok()?;
    let mut p = Vec::with_capacity(2 + 2 * aus.len() + aus.iter().map(|a| a.len()).sum::<usize>());
    p.extend_from_slice(&headers.to_be_bytes()); // AU-headers-length, in bits
    for au in aus {
        let size = u16::try_from(au.len()).ok().filter(|s| *s < 1 << 13)?;
        p.extend_from_slice(&(size << 3).to_be_bytes());
    }
    for au in aus {
        p.extend_from_slice(au);
    }
    Some(p)
}

/// How many whole access units an AAC-hbr payload (RFC 3640 with 16-bit AU headers, as
/// [`rtp_payload_of`] makes) carries; `None` if it is not one (or is a fragment of one unit):
/// the header sizes must add up to the data exactly.
pub fn hbr_frames(payload: &[u8]) -> Option<usize> {
    let bits = usize::from(u16::from_be_bytes([*payload.first()?, *payload.get(1)?]));
    if bits == 0 || bits % 16 != 0 {
        return None;
    }
    let n = bits / 16;
    let headers = payload.get(2..2 + 2 * n)?;
    let sizes: usize = headers.chunks(2).map(|h| usize::from(u16::from_be_bytes([h[0], h[1]]) >> 3)).sum();
    (sizes == payload.len() - 2 - 2 * n).then_some(n)
}

/// A raw AAC-LC access unit of silence for `channels` (1: one SCE, 2: one CPE), at any
/// sampling rate: each channel a long window with no scale factor bands coded (max_sfb 0),
/// so its whole spectrum is zero (ISO/IEC 14496-3, 4.4.2); `None` for other layouts.
pub fn silent_frame(channels: u8) -> Option<Vec<u8>> {
    // One channel's stream: global gain 100, ics_info of a long sine window with max_sfb 0
    // and no prediction, then no pulse, TNS or gain control data (22 bits).
    const ICS: (u32, u32) = (100 << 14, 22);
    let mut bits: Vec<(u32, u32)> = match channels {
        1 => vec![(0, 3), (0, 4), ICS],
        // (common_window 0: each channel its own ics_info.)
        2 => vec![(1, 3), (0, 4), (0, 1), ICS, ICS],
        _ => return None,
    };
    bits.push((7, 3)); // ID_END
    let (mut out, mut acc, mut n) = (Vec::new(), 0u64, 0u32);
    for (value, width) in bits {
        (acc, n) = ((acc << width) | u64::from(value), n + width);
        while n >= 8 {
            out.push((acc >> (n - 8)) as u8);
            n -= 8;
            acc &= (1 << n) - 1;
        }
    }
    if n > 0 {
        out.push((acc << (8 - n)) as u8);
    }
    Some(out)
}

/// The SDP `a=fmtp` parameters for [`rtp_payload`]'s packets.
pub fn fmtp(config: [u8; 2]) -> String {
    format!(
        "streamtype=5;profile-level-id=1;mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config={:02X}{:02X}",
        config[0], config[1]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Silence is 4 bytes mono (29 bits and ID_END), 7 stereo (55 bits); the decoder's view
    /// of it is tested in `fanout-media`, which has one.
    #[test]
    fn silent_frames_are_the_bits_of_empty_channels() {
        assert_eq!(silent_frame(1).unwrap(), [0x00, 100 << 1, 0x00, 0x07]);
        assert_eq!(silent_frame(2).unwrap().len(), 7);
        assert_eq!(silent_frame(2).unwrap()[0] >> 5, 1, "a channel pair element");
        assert_eq!(silent_frame(6), None);
    }

    #[test]
    fn hbr_frames_counts_whole_units_only() {
        let three = rtp_payload_of(&[&[1; 10], &[2; 20], &[3; 5]]).unwrap();
        assert_eq!(hbr_frames(&three), Some(3));
        assert_eq!(hbr_frames(&rtp_payload(&[7; 300]).unwrap()), Some(1));
        // A unit cut over packets (its size beyond the data), and what is no AAC-hbr.
        assert_eq!(hbr_frames(&three[..three.len() - 1]), None);
        assert_eq!(hbr_frames(&[0x80, 0x00, 1, 2, 3]), None);
        assert_eq!(hbr_frames(&[]), None);
    }

    proptest::proptest! {
        #[test]
        fn hbr_frames_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let _ = hbr_frames(&data);
        }
    }
    use proptest::prelude::*;

    /// An ADTS header (no CRC) for a frame of `payload` bytes: AAC LC, 48 kHz, mono.
    fn adts(payload: &[u8]) -> Vec<u8> {
        let len = payload.len() + 7;
        let mut h = vec![
            0xff,
            0xf1,
            (1 << 6) | (3 << 2),
            (1 << 6) | (len >> 11) as u8,
            (len >> 3) as u8,
            ((len & 7) << 5) as u8 | 0x1f,
            0xfc,
        ];
        h.extend_from_slice(payload);
        h
    }

    #[test]
    fn frames_config_and_payload() {
        let mut b = adts(&[1, 2, 3]);
        b.extend(adts(&[4; 300]));
        let f = adts_frames(&b);
        assert_eq!(f.len(), 2);
        assert_eq!(
            (f[0].au, f[0].object_type, f[0].sample_rate(), f[0].channels),
            (&[1u8, 2, 3][..], 2, Some(48000), 1)
        );
        // AAC LC, 48 kHz, mono: the "1188" MediaMTX and live555 put in their SDP.
        assert_eq!(f[0].audio_specific_config(), [0x11, 0x88]);
        assert!(fmtp(f[0].audio_specific_config()).ends_with("config=1188"));
        // Several frames: a header each (size, index 0 / delta 0), then the frames.
        let two = rtp_payload_of(&[&[1, 2, 3, 4, 5], &[6, 7, 8]]).unwrap();
        assert_eq!(two, [0, 32, 0, 5 << 3, 0, 3 << 3, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(rtp_payload_of(&[&[0; 9000]]), None, "too large for a 13-bit size");
        let fit = |sizes: &[usize]| {
            let frames: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; *n]).collect();
            frames_per_packet(&frames.iter().map(Vec::as_slice).collect::<Vec<_>>(), 3, 1400)
        };
        assert_eq!(fit(&[200, 200, 200, 200]), 3);
        assert_eq!(fit(&[700, 700, 700]), 1, "two would not fit");
        assert_eq!(fit(&[2000]), 1, "one always goes");
        assert_eq!(frames_per_packet(&[], 3, 1400), 0);
        assert_eq!(rtp_payload(f[1].au).unwrap()[..4], [0, 16, (300u16 << 3 >> 8) as u8, (300u16 << 3) as u8]);
        // A frame that claims more than there is ends the list.
        assert_eq!(adts_frames(&b[..b.len() - 1]).len(), 1);
    }

    #[test]
    fn the_demo_clips_audio() {
        let ts = include_bytes!("../../../../assets/demo.ts");
        let mut d = crate::container::tsdemux::Demux::default();
        let mut pes: Vec<_> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
        pes.extend(d.flush());
        let frames: usize = pes.iter().filter(|p| p.stream_type == 0x0f).map(|p| adts_frames(&p.data).len()).sum();
        // 8 s of 48 kHz audio in 1024-sample frames: ~375.
        assert!((360..=390).contains(&frames), "{frames}");
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut total = 0;
            for f in adts_frames(&b) {
                total += f.au.len();
                let _ = rtp_payload(f.au);
            }
            prop_assert!(total <= b.len());
        }
    }
}
