//! Opus packets (RFC 6716 §3.1): how long one plays, from its table-of-contents byte, for the
//! sample durations a container needs.

/// The samples at 48 kHz an Opus packet plays; `None` if its TOC (or frame count) is missing
/// or it would play longer than the 120 ms a packet may.
pub fn packet_samples(packet: &[u8]) -> Option<u32> {
    let toc = *packet.first()?;
    let config = toc >> 3;
    let frame = match config {
        // SILK: 10, 20, 40, 60 ms.
        0..=11 => [480, 960, 1920, 2880][usize::from(config & 3)],
        // Hybrid: 10, 20 ms.
        12..=15 => [480, 960][usize::from(config & 1)],
        // CELT: 2.5, 5, 10, 20 ms.
        _ => [120, 240, 480, 960][usize::from(config & 3)],
    };
    let frames = match toc & 3 {
        0 => 1,
        1 | 2 => 2,
        _ => u32::from(*packet.get(1)? & 0x3f),
    };
    let samples = frame * frames;
    (frames > 0 && samples <= 5760).then_some(samples)
}

/// A packet of 20 ms of silence (CELT, full band, one frame whose range coder says "silence"
/// at once): what DTX-less senders send through a pause.
pub fn silent_packet(channels: u8) -> [u8; 3] {
    [if channels >= 2 { 0xfc } else { 0xf8 }, 0xff, 0xfe]
}

/// The `dOps` box's content (the Opus-in-ISOBMFF encapsulation §4.3.2): version 0, the
/// channel count, the encoder's pre-skip (312, libopus's, where the stream does not say),
/// the input rate, no gain, mapping family 0 (mono or stereo).
pub fn dops(channels: u8) -> Vec<u8> {
    let mut d = vec![0, channels.clamp(1, 2)];
    d.extend_from_slice(&312u16.to_be_bytes());
    d.extend_from_slice(&48_000u32.to_be_bytes());
    d.extend_from_slice(&[0, 0, 0]);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn durations_follow_the_toc() {
        // Config 31 (CELT 20 ms), one frame: what libopus and browsers send.
        assert_eq!(packet_samples(&[0xf8, 0xff]), Some(960));
        // SILK 60 ms, two equal frames.
        assert_eq!(packet_samples(&[0x19]), Some(5760));
        // Hybrid 10 ms, code 3 with 6 frames.
        assert_eq!(packet_samples(&[0x63, 0x06]), Some(2880));
        // CELT 2.5 ms × 48 frames is 120 ms, the most; 49 is too many; 0 frames is nothing.
        assert_eq!(packet_samples(&[0x83, 48]), Some(5760));
        assert_eq!(packet_samples(&[0x83, 49]), None);
        assert_eq!(packet_samples(&[0x83, 0]), None);
        assert_eq!(packet_samples(&[0x83]), None);
        assert_eq!(packet_samples(&[]), None);
    }

    #[test]
    fn dops_is_eleven_bytes_of_a_stereo_stream() {
        assert_eq!(dops(2), [0, 2, 0x01, 0x38, 0, 0, 0xbb, 0x80, 0, 0, 0]);
        assert_eq!(dops(9)[1], 2);
    }

    proptest! {
        #[test]
        fn any_packet_plays_at_most_120_ms(p in proptest::collection::vec(any::<u8>(), 0..4)) {
            if let Some(n) = packet_samples(&p) {
                prop_assert!((120..=5760).contains(&n) && n % 120 == 0);
            }
        }
    }
}
