//! G.711 (ITU-T G.711) µ-law and A-law samples to linear PCM: each byte one 8 kHz sample,
//! expanded by the standard's segment rule (a 3-bit segment and a 4-bit step within it).

/// G.711's sampling rate.
pub const RATE: u32 = 8000;

/// A µ-law byte as a 14-bit sample (±8,031 steps, scaled to 16 bits: ±32,124).
pub fn ulaw(byte: u8) -> i16 {
    let b = !byte;
    let (segment, step) = ((b >> 4) & 7, i32::from(b & 0x0f));
    // The step's midpoint in its segment, biased by 33 (×4) so each segment doubles the last.
    let magnitude = (((step << 3) + 0x84) << segment) - 0x84;
    (if b & 0x80 != 0 { -magnitude } else { magnitude }) as i16
}

/// An A-law byte as a 13-bit sample (scaled to 16 bits: ±32,256).
pub fn alaw(byte: u8) -> i16 {
    let b = byte ^ 0x55;
    let (segment, step) = ((b >> 4) & 7, i32::from(b & 0x0f));
    // Segments 0 and 1 share one step size; each later one doubles it.
    let magnitude = match segment {
        0 => (step << 4) + 8,
        s => ((step << 4) + 0x108) << (s - 1),
    };
    (if b & 0x80 != 0 { magnitude } else { -magnitude }) as i16
}

/// Appends `bytes` as samples in [-1, 1) to `out`.
pub fn decode(bytes: &[u8], mu_law: bool, out: &mut Vec<f32>) {
    let expand = if mu_law { ulaw } else { alaw };
    out.extend(bytes.iter().map(|&b| f32::from(expand(b)) / 32_768.0));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The standard's end points and zeros (G.711 Tables 1a/2a, as 16-bit samples; all 256
    /// codes of each law were checked against Python's `audioop` when this was written).
    #[test]
    fn known_codes() {
        assert_eq!((ulaw(0xff), ulaw(0x7f)), (0, 0));
        assert_eq!((ulaw(0x80), ulaw(0x00)), (32_124, -32_124));
        assert_eq!((ulaw(0xfe), ulaw(0xef)), (8, 132));
        assert_eq!((alaw(0xd5), alaw(0x55)), (8, -8));
        assert_eq!((alaw(0xaa), alaw(0x2a)), (32_256, -32_256));
    }

    /// Both laws are odd, and rise with their code: each of the 128 magnitudes is larger than
    /// the last, from near zero to full scale.
    #[test]
    fn monotone_and_symmetric() {
        // µ-law magnitude k is code 0xff − k; A-law's is code k ^ 0xd5 (even bits inverted).
        let mu: Vec<i16> = (0..128u8).map(|k| ulaw(0xff - k)).collect();
        let a: Vec<i16> = (0..128u8).map(|k| alaw(k ^ 0xd5)).collect();
        for law in [&mu, &a] {
            assert!(law.windows(2).all(|w| w[1] > w[0]), "{law:?}");
            assert!(law[0] <= 8 && law[127] > 32_000);
        }
        for b in 0..=255u8 {
            assert_eq!(ulaw(b), -ulaw(b ^ 0x80));
            assert_eq!(alaw(b), -alaw(b ^ 0x80));
        }
    }
}
