//! Sample-rate conversion by linear interpolation: enough for a camera's audio going into a
//! 48 kHz encoder; the identity at 48 kHz. Raised by 2× or more (G.711's 8 kHz), the result
//! is low-passed below the input's Nyquist frequency, so the images interpolation leaves
//! (a 1 kHz tone's at 7 and 9 kHz) are not heard.

pub struct Linear {
    /// Input samples per output sample.
    step: f64,
    channels: usize,
    /// Where the next output sample falls, in frames of the next input (-1: `last`).
    pos: f64,
    /// The last input frame of the previous call.
    last: Vec<f32>,
    lowpass: Option<Lowpass>,
    scratch: Vec<f32>,
}

/// A windowed-sinc FIR low-pass over interleaved samples, its history carried across calls.
struct Lowpass {
    taps: Vec<f32>,
    channels: usize,
    /// The last `taps.len() − 1` frames in, then those of the call.
    history: Vec<f32>,
}

/// Its length: a transition of about a tenth of the output's band at 48 kHz.
const TAPS: usize = 97;

impl Lowpass {
    /// Passes below `cutoff` (a fraction of the sampling rate).
    fn new(cutoff: f64, channels: usize) -> Self {
        let m = (TAPS - 1) as f64;
        let mut taps: Vec<f32> = (0..TAPS)
            .map(|k| {
                let x = k as f64 - m / 2.0;
                let sinc = if x == 0.0 { 2.0 * cutoff } else { (2.0 * std::f64::consts::PI * cutoff * x).sin() / (std::f64::consts::PI * x) };
                // Blackman window.
                let w = 0.42 - 0.5 * (2.0 * std::f64::consts::PI * k as f64 / m).cos()
                    + 0.08 * (4.0 * std::f64::consts::PI * k as f64 / m).cos();
                (sinc * w) as f32
            })
            .collect();
        let sum: f32 = taps.iter().sum();
        taps.iter_mut().for_each(|t| *t /= sum);
        Self { taps, channels, history: vec![0.0; (TAPS - 1) * channels] }
    }

    fn reset(&mut self) {
        self.history.iter_mut().for_each(|s| *s = 0.0);
    }

    /// Appends `input` filtered to `out` (delayed by half the taps).
    fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        let c = self.channels;
        self.history.extend_from_slice(input);
        let frames = self.history.len() / c - (TAPS - 1);
        for f in 0..frames {
            for ch in 0..c {
                let acc: f32 = self.taps.iter().enumerate().map(|(k, t)| t * self.history[(f + k) * c + ch]).sum();
                out.push(acc);
            }
        }
        self.history.drain(..frames * c);
    }
}

impl Linear {
    pub fn new(from: u32, to: u32, channels: usize) -> Self {
        let step = f64::from(from) / f64::from(to);
        // (Just below the input's Nyquist frequency, as a fraction of the output rate.)
        let lowpass = (step <= 0.5).then(|| Lowpass::new(0.45 * step, channels));
        Self { step, channels, pos: 0.0, last: Vec::new(), lowpass, scratch: Vec::new() }
    }

    /// A new run: nothing carried over.
    pub fn reset(&mut self) {
        (self.pos, self.last) = (0.0, Vec::new());
        if let Some(l) = &mut self.lowpass {
            l.reset();
        }
    }

    /// Appends `input` (interleaved) at the output rate to `out`.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        if self.step == 1.0 {
            out.extend_from_slice(input);
            return;
        }
        let Some(mut lowpass) = self.lowpass.take() else {
            return self.interpolate(input, out);
        };
        let mut raised = std::mem::take(&mut self.scratch);
        raised.clear();
        self.interpolate(input, &mut raised);
        lowpass.push(&raised, out);
        (self.lowpass, self.scratch) = (Some(lowpass), raised);
    }

    fn interpolate(&mut self, input: &[f32], out: &mut Vec<f32>) {
        let c = self.channels;
        // Frame k of the input, with frame -1 the last of the previous call.
        let frames = input.len() / c;
        let last = std::mem::take(&mut self.last);
        let frame = |k: isize, ch: usize| -> f32 {
            if k < 0 {
                last.get(ch).copied().unwrap_or(0.0)
            } else {
                input[k as usize * c + ch]
            }
        };
        let mut pos = self.pos;
        while pos < frames as f64 - 1.0 {
            let k = pos.floor();
            let frac = (pos - k) as f32;
            for ch in 0..c {
                let (a, b) = (frame(k as isize, ch), frame(k as isize + 1, ch));
                out.push(a + (b - a) * frac);
            }
            pos += self.step;
        }
        if frames > 0 {
            self.last = input[(frames - 1) * c..frames * c].to_vec();
            // In the next call's frames, this call's last is frame -1.
            self.pos = pos - frames as f64;
        } else {
            self.last = last;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Linear;

    /// 44.1 kHz to 48 kHz: the output has the rate's share of the samples, and a tone keeps
    /// its frequency (its zero crossings per second), across calls of any size.
    #[test]
    fn a_tone_keeps_its_pitch_and_count() {
        let tone = |rate: f64, n: usize| -> Vec<f32> {
            (0..n).map(|k| (2.0 * std::f64::consts::PI * 1000.0 * k as f64 / rate).sin() as f32).collect()
        };
        let input = tone(44_100.0, 44_100);
        let mut r = Linear::new(44_100, 48_000, 1);
        let mut out = Vec::new();
        for chunk in input.chunks(1024) {
            r.push(chunk, &mut out);
        }
        assert!((out.len() as i64 - 48_000).abs() <= 2, "{} samples", out.len());
        let crossings = out.windows(2).filter(|w| w[0] < 0.0 && w[1] >= 0.0).count();
        assert!((crossings as i64 - 1000).abs() <= 1, "{crossings} cycles");
        let want = tone(48_000.0, out.len());
        let err = out.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(err < 0.02, "off the 48 kHz tone by {err}");
    }

    /// The power of `s` at `hz` (48 kHz samples), by correlation with its sine and cosine.
    fn power_at(s: &[f32], hz: f64) -> f64 {
        let w = 2.0 * std::f64::consts::PI * hz / 48_000.0;
        let (mut re, mut im) = (0.0, 0.0);
        for (k, x) in s.iter().enumerate() {
            re += f64::from(*x) * (w * k as f64).cos();
            im += f64::from(*x) * (w * k as f64).sin();
        }
        (re * re + im * im) / (s.len() as f64 * s.len() as f64)
    }

    /// 8 kHz (G.711) to 48 kHz: a 1 kHz tone comes out at its level, and its images at 7 and
    /// 9 kHz (what interpolation alone leaves, about −34 dB) more than 60 dB below it.
    #[test]
    fn raised_from_8_khz_the_images_are_gone() {
        let input: Vec<f32> = (0..8000).map(|k| (2.0 * std::f64::consts::PI * k as f64 / 8.0).sin() as f32 * 0.5).collect();
        let mut r = Linear::new(8000, 48_000, 1);
        let mut out = Vec::new();
        for chunk in input.chunks(160) {
            r.push(chunk, &mut out);
        }
        assert!((out.len() as i64 - 48_000).abs() <= 100, "{} samples", out.len());
        let s = &out[1000..];
        let tone = power_at(s, 1000.0);
        assert!((10.0 * (tone / 0.0625).log10()).abs() < 0.5, "the tone at {:.2} dB", 10.0 * (tone / 0.0625).log10());
        for image in [7000.0, 9000.0] {
            let db = 10.0 * (power_at(s, image) / tone).log10();
            assert!(db < -60.0, "the image at {image} Hz is {db:.1} dB");
        }
    }
}
