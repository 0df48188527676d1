//! Sample-rate conversion to 48 kHz for an encoder: the identity at 48 kHz; by a whole factor
//! of 2 or more (G.711's 8 kHz, 16 and 24 kHz) a polyphase windowed-sinc interpolator, which
//! passes the input's band and stops the images (a 1 kHz tone's at 7 and 9 kHz, raised from
//! 8 kHz) at 16 multiply-adds a sample; otherwise linear interpolation (enough for 44.1 kHz),
//! low-passed after it where the rate is raised 2× or more.

pub struct Resampler {
    /// Input samples per output sample.
    step: f64,
    channels: usize,
    /// Where the next output sample falls, in frames of the next input (-1: `last`).
    pos: f64,
    /// The last input frame of the previous call.
    last: Vec<f32>,
    lowpass: Option<Lowpass>,
    scratch: Vec<f32>,
    /// By a whole factor: this instead.
    raise: Option<Polyphase>,
}

/// Raising by a whole factor `l`: input sample n gives output samples nl … nl + l − 1, each
/// a dot product of the last `PHASE_TAPS` inputs with its phase of one windowed-sinc filter.
struct Polyphase {
    phases: Vec<Vec<f32>>,
    channels: usize,
    /// The last `PHASE_TAPS − 1` frames in, then those of the call.
    history: Vec<f32>,
}

/// Taps a phase: the filter is `PHASE_TAPS × l` long (96 at 8 to 48 kHz).
const PHASE_TAPS: usize = 16;

impl Polyphase {
    fn new(l: usize, channels: usize) -> Self {
        // Cut just below the input's Nyquist frequency; gain l, for the zeros stuffed between.
        let taps = windowed_sinc(PHASE_TAPS * l, 0.45 / l as f64);
        let phases = (0..l).map(|p| (0..PHASE_TAPS).map(|j| taps[p + l * j] * l as f32).collect()).collect();
        Self { phases, channels, history: vec![0.0; (PHASE_TAPS - 1) * channels] }
    }

    fn reset(&mut self) {
        self.history.iter_mut().for_each(|s| *s = 0.0);
    }

    fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        let c = self.channels;
        self.history.extend_from_slice(input);
        let frames = self.history.len() / c - (PHASE_TAPS - 1);
        for f in 0..frames {
            // (x[n − j] is history frame f + PHASE_TAPS − 1 − j.)
            for phase in &self.phases {
                for ch in 0..c {
                    let acc: f32 = phase
                        .iter()
                        .enumerate()
                        .map(|(j, t)| t * self.history[(f + PHASE_TAPS - 1 - j) * c + ch])
                        .sum();
                    out.push(acc);
                }
            }
        }
        self.history.drain(..frames * c);
    }
}

/// A low-pass FIR of `n` taps passing below `cutoff` (a fraction of the sampling rate),
/// Blackman-windowed, its taps summing to 1.
fn windowed_sinc(n: usize, cutoff: f64) -> Vec<f32> {
    use std::f64::consts::PI;
    let m = (n - 1) as f64;
    let mut taps: Vec<f32> = (0..n)
        .map(|k| {
            let x = k as f64 - m / 2.0;
            let sinc = if x == 0.0 { 2.0 * cutoff } else { (2.0 * PI * cutoff * x).sin() / (PI * x) };
            let w = 0.42 - 0.5 * (2.0 * PI * k as f64 / m).cos() + 0.08 * (4.0 * PI * k as f64 / m).cos();
            (sinc * w) as f32
        })
        .collect();
    let sum: f32 = taps.iter().sum();
    taps.iter_mut().for_each(|t| *t /= sum);
    taps
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
        Self { taps: windowed_sinc(TAPS, cutoff), channels, history: vec![0.0; (TAPS - 1) * channels] }
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

impl Resampler {
    pub fn new(from: u32, to: u32, channels: usize) -> Self {
        let step = f64::from(from) / f64::from(to);
        // (Just below the input's Nyquist frequency, as a fraction of the output rate.)
        let whole = (to.is_multiple_of(from.max(1)) && to / from.max(1) >= 2).then(|| (to / from) as usize);
        let raise = whole.map(|l| Polyphase::new(l, channels));
        let lowpass = (step <= 0.5 && raise.is_none()).then(|| Lowpass::new(0.45 * step, channels));
        Self { step, channels, pos: 0.0, last: Vec::new(), lowpass, scratch: Vec::new(), raise }
    }

    /// A new run: nothing carried over.
    pub fn reset(&mut self) {
        (self.pos, self.last) = (0.0, Vec::new());
        if let Some(l) = &mut self.lowpass {
            l.reset();
        }
        if let Some(r) = &mut self.raise {
            r.reset();
        }
    }

    /// Appends `input` (interleaved) at the output rate to `out`.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        if self.step == 1.0 {
            out.extend_from_slice(input);
            return;
        }
        if let Some(r) = &mut self.raise {
            return r.push(input, out);
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
    use super::Resampler;

    /// 44.1 kHz to 48 kHz: the output has the rate's share of the samples, and a tone keeps
    /// its frequency (its zero crossings per second), across calls of any size.
    #[test]
    fn a_tone_keeps_its_pitch_and_count() {
        let tone = |rate: f64, n: usize| -> Vec<f32> {
            (0..n).map(|k| (2.0 * std::f64::consts::PI * 1000.0 * k as f64 / rate).sin() as f32).collect()
        };
        let input = tone(44_100.0, 44_100);
        let mut r = Resampler::new(44_100, 48_000, 1);
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

    /// 8 kHz (G.711, by the polyphase filter) and 22.05 kHz (linear, then low-passed) to
    /// 48 kHz: a 1 kHz tone comes out at its level, and its images (what linear interpolation
    /// alone leaves about 34 dB down at 8 kHz) more than 60 dB below it.
    #[test]
    fn raised_2x_or_more_the_images_are_gone() {
        for (rate, images) in [(8000u32, [7000.0, 9000.0]), (22_050, [21_050.0, 23_050.0])] {
            let tone = |k: usize| (2.0 * std::f64::consts::PI * 1000.0 * k as f64 / f64::from(rate)).sin() as f32 * 0.5;
            let input: Vec<f32> = (0..rate as usize).map(tone).collect();
            let mut r = Resampler::new(rate, 48_000, 1);
            let mut out = Vec::new();
            for chunk in input.chunks(160) {
                r.push(chunk, &mut out);
            }
            assert!((out.len() as i64 - 48_000).abs() <= 100, "{rate}: {} samples", out.len());
            let s = &out[1000..];
            let level = 10.0 * (power_at(s, 1000.0) / 0.0625).log10();
            assert!(level.abs() < 0.5, "{rate}: the tone at {level:.2} dB");
            for image in images {
                let db = 10.0 * (power_at(s, image) / 0.0625).log10();
                assert!(db < -60.0, "{rate}: the image at {image} Hz is {db:.1} dB");
            }
        }
    }
}
