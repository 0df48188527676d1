//! A streaming AAC-LC encoder, for Opus → AAC (FLV, MPEG-TS and SRT players take no Opus).
//!
//! Deliberately plain: long sine windows only, and one scale factor for the whole spectrum of
//! a channel's frame (the global gain), moved frame by frame toward the bit rate; each band
//! coded with the Huffman codebook that takes fewest bits (rusty_aac's tables). No
//! psychoacoustic model, so it spends bits evenly across the spectrum: at the rates it runs
//! at (64 kbit/s a channel) speech and music come through clean. The MDCT overlap is carried
//! from frame to frame, so there are no seams, and a frame goes out as soon as its 1,024
//! samples and the next frame's are in (one frame of delay, the MDCT's).

use rustfft::num_complex::Complex32;
use rusty_aac::encode::{spectral_bits, spectral_emit, BitWriter};
use std::sync::Arc;

/// Samples a frame.
pub const FRAME: usize = 1024;
/// The one rate it encodes at: what the Opus decoder gives.
pub const RATE: u32 = 48_000;
/// Scale factor band edges of a long window at 44.1 and 48 kHz (ISO/IEC 14496-3, Table 4.129).
const SWB_48K: [u16; 50] = [
    0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 48, 56, 64, 72, 80, 88, 96, 108, 120, 132, 144, 160, 176, 196, 216, 240,
    264, 292, 320, 352, 384, 416, 448, 480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800, 832, 864, 896, 928, 1024,
];
/// The most a channel's frame may take (the decoder's input buffer, §4.5.3), less headers.
const MAX_CHANNEL_BITS: usize = 6144 - 64;
/// Quantized magnitudes above this cannot be coded (codebook 11's escapes).
const MAX_QUANT: f32 = 8191.0;

/// AAC-LC at 48 kHz, mono or stereo: interleaved samples in, raw access units out.
pub struct AacEncoder {
    channels: usize,
    /// Per channel: the last frame's samples (the first half of the next window) and the
    /// samples gathered toward the next frame.
    last: Vec<Vec<f32>>,
    next: Vec<Vec<f32>>,
    /// Per channel, the global gain (scale factor) the last frame used.
    gain: Vec<i32>,
    /// The bits a channel's frame aims at.
    target_bits: usize,
    mdct: Mdct,
}

impl AacEncoder {
    /// An encoder of `channels` (1 or 2) at `bits_per_second` in all.
    pub fn new(channels: usize, bits_per_second: u32) -> Self {
        let channels = channels.clamp(1, 2);
        let target = (bits_per_second as usize * FRAME / RATE as usize / channels).min(MAX_CHANNEL_BITS);
        Self {
            channels,
            last: vec![vec![0.0; FRAME]; channels],
            next: vec![Vec::with_capacity(FRAME); channels],
            gain: vec![120; channels],
            target_bits: target,
            mdct: Mdct::new(),
        }
    }

    /// The AudioSpecificConfig of its stream (AAC-LC, 48 kHz, its channels).
    pub fn config(&self) -> Vec<u8> {
        rusty_aac::encode::audio_specific_config_bytes(RATE, self.channels as u16)
    }

    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Takes interleaved samples in [-1, 1]; appends each access unit they complete to `out`.
    /// The first unit out covers the stream's first 1,024 samples from one frame before them
    /// (the MDCT's delay: a decoder's first 1,024 samples out are the priming).
    pub fn push(&mut self, pcm: &[f32], out: &mut Vec<Vec<u8>>) {
        for frame in pcm.chunks(self.channels) {
            for (c, s) in frame.iter().enumerate() {
                self.next[c].push(if s.is_finite() { s.clamp(-1.0, 1.0) } else { 0.0 });
            }
            if self.next[0].len() == FRAME {
                out.push(self.encode_frame());
            }
        }
    }

    /// One raw_data_block: a single channel element (or a channel pair without a common
    /// window), then END, byte-aligned.
    fn encode_frame(&mut self) -> Vec<u8> {
        let mut spectra = Vec::with_capacity(self.channels);
        for c in 0..self.channels {
            let window: Vec<f32> = self.last[c].iter().chain(&self.next[c]).map(|s| s * 32_768.0).collect();
            spectra.push(self.mdct.transform(&window));
            std::mem::swap(&mut self.last[c], &mut self.next[c]);
            self.next[c].clear();
        }
        let mut w = BitWriter::new();
        w.write(if self.channels == 1 { 0 } else { 1 }, 3); // ID_SCE or ID_CPE
        w.write(0, 4); // element_instance_tag
        if self.channels == 2 {
            w.write(0, 1); // common_window: each channel its own ics_info
        }
        for (c, spectrum) in spectra.iter().enumerate() {
            let (gain, ics) = self.fit(c, spectrum);
            self.gain[c] = gain;
            ics.write(&mut w);
        }
        w.write(7, 3); // ID_END
        w.into_bytes()
    }

    /// The channel's frame at the gain nearest its target: starting from the last frame's,
    /// coarser while it takes more than the target allows, finer while it takes much less.
    fn fit(&self, c: usize, spectrum: &[f32]) -> (i32, Ics) {
        let mut gain = self.gain[c];
        let mut ics = Ics::quantize(spectrum, gain);
        let mut bits = ics.bits();
        // (A few steps a frame: the rate follows within a frame or two of a change.)
        for _ in 0..8 {
            if bits > self.target_bits && gain < 255 {
                gain += 1;
            } else if bits < self.target_bits * 3 / 4 && gain > 0 {
                let finer = Ics::quantize(spectrum, gain - 1);
                let finer_bits = finer.bits();
                if finer_bits > self.target_bits {
                    break;
                }
                (gain, ics, bits) = (gain - 1, finer, finer_bits);
                continue;
            } else {
                break;
            }
            ics = Ics::quantize(spectrum, gain);
            bits = ics.bits();
        }
        while bits > MAX_CHANNEL_BITS && gain < 255 {
            gain += 1;
            ics = Ics::quantize(spectrum, gain);
            bits = ics.bits();
        }
        (gain, ics)
    }
}

/// One channel's individual_channel_stream: its global gain, and per band its codebook
/// (0: all zero) and quantized coefficients.
struct Ics {
    gain: i32,
    books: Vec<u8>,
    quant: Vec<i32>,
}

impl Ics {
    fn quantize(spectrum: &[f32], gain: i32) -> Self {
        // The decoder's value is q^(4/3) · 2^((gain − 100) / 4).
        let step = 2f32.powf(-0.25 * (gain - 100) as f32);
        let quant: Vec<i32> = spectrum
            .iter()
            .map(|x| {
                let q = ((x.abs() * step).powf(0.75) + 0.4054).floor().min(MAX_QUANT);
                if *x < 0.0 {
                    -(q as i32)
                } else {
                    q as i32
                }
            })
            .collect();
        let books = SWB_48K.windows(2).map(|b| best_book(&quant[usize::from(b[0])..usize::from(b[1])]).0).collect();
        Self { gain, books, quant }
    }

    /// The bands coded: up to the last that is not all zero.
    fn max_sfb(&self) -> usize {
        self.books.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
    }

    fn sections(&self) -> Vec<(u8, usize)> {
        let mut sections: Vec<(u8, usize)> = Vec::new();
        for &b in &self.books[..self.max_sfb()] {
            match sections.last_mut() {
                Some((book, len)) if *book == b => *len += 1,
                _ => sections.push((b, 1)),
            }
        }
        sections
    }

    fn bits(&self) -> usize {
        let header = 8 + 11 + 3; // global gain, ics_info, pulse/tns/gain control flags
        let sections: usize = self.sections().iter().map(|(_, len)| 4 + 5 * (len / 31 + 1)).sum();
        let coded = self.books[..self.max_sfb()].iter().filter(|&&b| b != 0).count();
        let spectral: usize = SWB_48K
            .windows(2)
            .zip(&self.books)
            .map(|(b, &book)| best_book(&self.quant[usize::from(b[0])..usize::from(b[1])]).1 * usize::from(book != 0))
            .sum();
        header + sections + coded + spectral
    }

    fn write(&self, w: &mut BitWriter) {
        w.write(self.gain as u32, 8);
        // ics_info: reserved, ONLY_LONG_SEQUENCE, sine window, max_sfb, no prediction.
        w.write(0, 1);
        w.write(0, 2);
        w.write(0, 1);
        w.write(self.max_sfb() as u32, 6);
        w.write(0, 1);
        for (book, len) in self.sections() {
            w.write(u32::from(book), 4);
            let mut left = len;
            while left >= 31 {
                w.write(31, 5);
                left -= 31;
            }
            w.write(left as u32, 5);
        }
        // Every coded band at the global gain: a difference of 0, whose codeword is a 0 bit.
        for &b in &self.books[..self.max_sfb()] {
            if b != 0 {
                w.write(0, 1);
            }
        }
        w.write(0, 3); // no pulse, TNS or gain control data
        for (band, &book) in SWB_48K.windows(2).zip(&self.books[..self.max_sfb()]) {
            if book == 0 {
                continue;
            }
            let dim = if book <= 4 { 4 } else { 2 };
            for tuple in self.quant[usize::from(band[0])..usize::from(band[1])].chunks(dim) {
                spectral_emit(usize::from(book), tuple, w);
            }
        }
    }
}

/// The codebook that codes a band in fewest bits (0 if it is all zero), and those bits.
fn best_book(band: &[i32]) -> (u8, usize) {
    if band.iter().all(|&q| q == 0) {
        return (0, 0);
    }
    let largest = band.iter().map(|q| q.unsigned_abs()).max().unwrap_or(0);
    // The books whose largest value reaches this band's.
    let first = match largest {
        1 => 1,
        2 => 3,
        3..=4 => 5,
        5..=7 => 7,
        8..=12 => 9,
        _ => 11,
    };
    (first..=11u8)
        .filter_map(|book| {
            let dim = if book <= 4 { 4 } else { 2 };
            let bits: Option<usize> = band.chunks(dim).map(|t| spectral_bits(usize::from(book), t)).sum();
            Some((book, bits?))
        })
        .min_by_key(|&(_, bits)| bits)
        .unwrap_or((11, usize::MAX / 4))
}

/// The MDCT of a 2,048-sample sine-windowed block (ISO/IEC 14496-3 §4.6.11's forward
/// transform, X[k] = 2 Σ z[n] cos(2π/N (n + n0)(k + ½))), by folding into a DCT-IV of 1,024
/// computed with a 512-point complex FFT.
struct Mdct {
    window: Vec<f32>,
    fft: Arc<dyn rustfft::Fft<f32>>,
    pre: Vec<Complex32>,
    post: Vec<Complex32>,
}

impl Mdct {
    fn new() -> Self {
        let (n, m) = (2 * FRAME, FRAME);
        let window = (0..n).map(|i| (std::f32::consts::PI / n as f32 * (i as f32 + 0.5)).sin()).collect();
        let twiddle = |a: f64| Complex32::new(a.cos() as f32, a.sin() as f32);
        let pi = std::f64::consts::PI;
        Self {
            window,
            fft: rustfft::FftPlanner::new().plan_fft_forward(m / 2),
            pre: (0..m / 2).map(|i| twiddle(-pi * (i as f64 + 0.25) / m as f64)).collect(),
            post: (0..m / 2).map(|k| twiddle(-pi * k as f64 / m as f64)).collect(),
        }
    }

    fn transform(&self, block: &[f32]) -> Vec<f32> {
        let m = FRAME;
        let z: Vec<f32> = block.iter().zip(&self.window).map(|(x, w)| x * w).collect();
        let u: Vec<f32> =
            (0..m)
                .map(|i| {
                    if i < m / 2 {
                        -z[3 * m / 2 - 1 - i] - z[3 * m / 2 + i]
                    } else {
                        z[i - m / 2] - z[3 * m / 2 - 1 - i]
                    }
                })
                .collect();
        let mut t: Vec<Complex32> =
            (0..m / 2).map(|i| Complex32::new(u[2 * i], u[m - 1 - 2 * i]) * self.pre[i]).collect();
        self.fft.process(&mut t);
        let mut out = vec![0.0; m];
        for (k, v) in t.iter().enumerate() {
            let y = v * self.post[k];
            out[2 * k] = 2.0 * y.re;
            out[m - 1 - 2 * k] = -2.0 * y.im;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_mdct_is_the_standards_formula() {
        let block: Vec<f32> = (0..2 * FRAME).map(|i| ((i * 7919) % 2003) as f32 / 1000.0 - 1.0).collect();
        let fast = Mdct::new().transform(&block);
        let n = 2 * FRAME;
        let n0 = n as f64 / 4.0 + 0.5;
        for k in [0, 1, 17, 500, 1023] {
            let direct: f64 = (0..n)
                .map(|i| {
                    let w = (std::f64::consts::PI / n as f64 * (i as f64 + 0.5)).sin();
                    2.0 * f64::from(block[i])
                        * w
                        * (2.0 * std::f64::consts::PI / n as f64 * (i as f64 + n0) * (k as f64 + 0.5)).cos()
                })
                .sum();
            assert!((f64::from(fast[k]) - direct).abs() < 1e-2 * direct.abs().max(1.0), "{k}: {} vs {direct}", fast[k]);
        }
    }

    /// A tone and a sweep through the encoder and Symphonia's decoder come back as they went
    /// in, one frame late: 25 dB or more above the coding noise, at the same level.
    #[test]
    fn what_it_encodes_decodes_to_the_same_sound() {
        for channels in [1, 2] {
            let mut e = AacEncoder::new(channels, 64_000 * channels as u32);
            let mut d = crate::AacDecoder::new(&e.config()).unwrap();
            let n = 48_000;
            let signal: Vec<f32> = (0..n)
                .map(|i| {
                    let t = i as f32 / 48_000.0;
                    0.4 * (2.0 * std::f32::consts::PI * 440.0 * t).sin()
                        + 0.2 * (2.0 * std::f32::consts::PI * (200.0 + 3000.0 * t) * t).sin()
                })
                .collect();
            let pcm: Vec<f32> = signal.iter().flat_map(|&s| std::iter::repeat_n(s, channels)).collect();
            let mut units = Vec::new();
            e.push(&pcm, &mut units);
            let mut decoded = Vec::new();
            for au in &units {
                d.decode(au, 1, &mut decoded).unwrap();
            }
            // Decoded sample i + 1024 is input sample i (the MDCT's frame of delay).
            let (mut sig, mut err) = (0.0f64, 0.0f64);
            for i in 2 * FRAME..decoded.len() - FRAME {
                let (x, y) = (f64::from(signal[i - FRAME]), f64::from(decoded[i]));
                sig += x * x;
                err += (x - y) * (x - y);
            }
            let snr = 10.0 * (sig / err).log10();
            assert!(snr > 25.0, "{channels} channels: {snr:.1} dB");
        }
    }

    #[test]
    fn silence_is_a_few_bytes_a_frame_and_the_rate_is_kept() {
        let mut e = AacEncoder::new(2, 128_000);
        let mut out = Vec::new();
        e.push(&vec![0.0; 2 * 4 * FRAME], &mut out);
        assert_eq!(out.len(), 4);
        assert!(out.iter().all(|au| au.len() < 12), "{:?}", out.iter().map(Vec::len).collect::<Vec<_>>());
        assert_eq!(e.config(), [0x11, 0x90]);
        // Noise, the hardest: each frame near its share of 128 kbit/s (341 bytes), never
        // past what a decoder holds.
        let mut x = 1u32;
        let noise: Vec<f32> = (0..2 * 50 * FRAME)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 8) as f32 / (1 << 24) as f32 - 0.5
            })
            .collect();
        out.clear();
        e.push(&noise, &mut out);
        let late: Vec<usize> = out[10..].iter().map(Vec::len).collect();
        let mean = late.iter().sum::<usize>() / late.len();
        assert!((250..=400).contains(&mean), "{late:?}");
        assert!(out.iter().all(|au| au.len() < 2 * 6144 / 8), "{late:?}");
    }
}
