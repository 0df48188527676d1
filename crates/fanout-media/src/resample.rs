//! Sample-rate conversion by linear interpolation: enough for speech and a camera's audio
//! going into a 48 kHz Opus encoder (which low-passes itself); the identity at 48 kHz.

pub struct Linear {
    /// Input samples per output sample.
    step: f64,
    channels: usize,
    /// Where the next output sample falls, in frames of the next input (-1: `last`).
    pos: f64,
    /// The last input frame of the previous call.
    last: Vec<f32>,
}

impl Linear {
    pub fn new(from: u32, to: u32, channels: usize) -> Self {
        Self { step: f64::from(from) / f64::from(to), channels, pos: 0.0, last: Vec::new() }
    }

    /// A new run: nothing carried over.
    pub fn reset(&mut self) {
        (self.pos, self.last) = (0.0, Vec::new());
    }

    /// Appends `input` (interleaved) at the output rate to `out`.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        let c = self.channels;
        if self.step == 1.0 {
            out.extend_from_slice(input);
            return;
        }
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
}
