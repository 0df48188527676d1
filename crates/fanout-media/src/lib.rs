//! Media preparation, apart from protocol processing (DIVISOR's split): what a path's readers
//! need that its publisher does not send, made once per path whatever the readers: a
//! camera's or encoder's AAC as Opus, the audio browsers take over WebRTC, and a WHIP
//! publisher's Opus or a camera's G.711 as AAC, the audio FLV, MPEG-TS and SRT players take.
//!
//! The transcoder is sans-IO (access units and their times in, Opus packets and theirs
//! out); decoding is Symphonia's AAC-LC decoder (pure Rust), encoding libopus, loaded at
//! run time as libsrt is, so that building the relay needs no codec headers and a machine
//! without libopus serves everything but this.

mod aac;
pub mod aacenc;
pub mod g711;
pub mod opus;
mod resample;
pub mod slate;

pub use aac::AacDecoder;

use thiserror::Error;

#[derive(Debug, Error)]
#[error("{0}")]
pub struct MediaError(pub String);

/// Opus frames are 20 ms at 48 kHz.
pub const OPUS_FRAME: usize = 960;
/// The Opus RTP clock (RFC 7587).
pub const OPUS_CLOCK: u32 = 48_000;
/// The bit rate each Opus channel is encoded at.
const BITS_PER_CHANNEL: i32 = 48_000;
/// An access unit further than this (48 kHz ticks) from where the last ended starts a new
/// run of packets (the publisher's gap or restart), instead of shifting the stream.
const GAP: i64 = 4 * OPUS_FRAME as i64;

/// AAC access units in, Opus packets out: decoded, resampled to 48 kHz, encoded in 20 ms
/// frames. Packet times follow on exactly from one to the next while the AAC does.
pub struct AacToOpus {
    aac: AacDecoder,
    resample: resample::Resampler,
    opus: opus::Encoder,
    channels: usize,
    /// Samples (interleaved, 48 kHz) waiting for a whole frame.
    pcm: Vec<f32>,
    /// The 48 kHz time of `pcm`'s first sample.
    at: Option<i64>,
    scratch: Vec<f32>,
}

impl AacToOpus {
    /// A transcoder of the AAC that AudioSpecificConfig `config` describes.
    pub fn new(config: &[u8]) -> Result<Self, MediaError> {
        let aac = AacDecoder::new(config)?;
        let channels = aac.channels().min(2);
        let mut opus = opus::Encoder::new(channels)?;
        opus.set_bitrate(BITS_PER_CHANNEL * channels as i32)?;
        Ok(Self {
            resample: resample::Resampler::new(aac.rate(), OPUS_CLOCK, channels),
            aac,
            opus,
            channels,
            pcm: Vec::new(),
            at: None,
            scratch: Vec::new(),
        })
    }

    /// Opus channels (1 or 2).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// The AAC's sampling rate.
    pub fn input_rate(&self) -> u32 {
        self.aac.rate()
    }

    /// Takes an access unit whose first sample is at `time` (48 kHz ticks, any origin);
    /// appends the Opus packets it completes to `out`, each with its time. A unit that does
    /// not decode is skipped (its time is taken up by the next).
    pub fn push(&mut self, au: &[u8], time: i64, out: &mut Vec<(Vec<u8>, i64)>) {
        let expected = self.at.map(|a| a + (self.pcm.len() / self.channels) as i64);
        if expected.is_none_or(|e| (time - e).abs() > GAP) {
            // A new run: what is gathered of the last is dropped (less than a frame).
            self.pcm.clear();
            self.resample.reset();
            self.at = Some(time);
        }
        self.scratch.clear();
        if self.aac.decode(au, self.channels, &mut self.scratch).is_err() {
            return;
        }
        self.resample.push(&self.scratch, &mut self.pcm);
        let whole = OPUS_FRAME * self.channels;
        let mut used = 0;
        while self.pcm.len() - used >= whole {
            if let Ok(packet) = self.opus.encode(&self.pcm[used..used + whole]) {
                out.push((packet, self.at.expect("set above")));
            }
            used += whole;
            *self.at.as_mut().expect("set above") += OPUS_FRAME as i64;
        }
        self.pcm.drain(..used);
    }
}

/// The bit rate each AAC channel is encoded at.
const AAC_BITS_PER_CHANNEL: u32 = 64_000;

/// What [`ToAac`] decodes: Opus (by libopus, at 48 kHz) or G.711 (by table, raised from
/// 8 kHz to 48 kHz).
enum Pcm {
    Opus(opus::Decoder),
    G711 { mu_law: bool, raise: resample::Resampler, scratch: Vec<f32> },
}

impl Pcm {
    /// Appends what `payload` decodes to (interleaved, 48 kHz) to `out`.
    fn decode(&mut self, payload: &[u8], out: &mut Vec<f32>) -> Result<(), MediaError> {
        match self {
            Pcm::Opus(d) => d.decode(payload, out),
            Pcm::G711 { mu_law, raise, scratch } => {
                scratch.clear();
                g711::decode(payload, *mu_law, scratch);
                raise.push(scratch, out);
                Ok(())
            }
        }
    }

    /// A new run: nothing of the last carried into it.
    fn reset(&mut self) {
        if let Pcm::G711 { raise, .. } = self {
            raise.reset();
        }
    }
}

/// Opus packets or G.711 payloads in, AAC access units out (for players that take neither:
/// FLV, MPEG-TS, SRT): decoded to 48 kHz, encoded by [`aacenc::AacEncoder`] in 1,024-sample
/// frames. Unit times follow on exactly while the input does.
pub struct ToAac {
    pcm: Pcm,
    aac: aacenc::AacEncoder,
    channels: usize,
    /// The 48 kHz time of the next sample the encoder takes.
    at: Option<i64>,
    /// Samples (a channel) the encoder has taken, and units it has given.
    samples: i64,
    units: i64,
    /// The time the encoder's sample 0 would have, on this run's timeline.
    origin: i64,
    /// The last unit's time: a new run never starts before the next one's.
    last: Option<i64>,
    scratch: Vec<f32>,
    encoded: Vec<Vec<u8>>,
}

impl ToAac {
    /// A transcoder of Opus of `channels` (1 or 2, as the SDP says).
    pub fn of_opus(channels: usize) -> Result<Self, MediaError> {
        let channels = channels.clamp(1, 2);
        Ok(Self::of(Pcm::Opus(opus::Decoder::new(channels)?), channels))
    }

    /// A transcoder of G.711 (µ-law or A-law; mono), which needs no codec library.
    pub fn of_g711(mu_law: bool) -> Self {
        let raise = resample::Resampler::new(g711::RATE, OPUS_CLOCK, 1);
        Self::of(Pcm::G711 { mu_law, raise, scratch: Vec::new() }, 1)
    }

    fn of(pcm: Pcm, channels: usize) -> Self {
        Self {
            pcm,
            aac: aacenc::AacEncoder::new(channels, AAC_BITS_PER_CHANNEL * channels as u32),
            channels,
            at: None,
            samples: 0,
            units: 0,
            origin: 0,
            last: None,
            scratch: Vec::new(),
            encoded: Vec::new(),
        }
    }

    /// The AudioSpecificConfig of the AAC it makes (AAC-LC, 48 kHz).
    pub fn config(&self) -> Vec<u8> {
        self.aac.config()
    }

    /// Its channels (1 or 2).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Takes an Opus packet or G.711 payload whose first sample is at `time` (48 kHz ticks,
    /// any origin); appends the AAC units it completes to `out`, each with its time (a unit
    /// plays the 1,024 samples a frame before those it was made from last: the MDCT's delay).
    /// A packet that does not decode is skipped; a gap starts a new run, never before the
    /// last unit.
    pub fn push(&mut self, packet: &[u8], time: i64, out: &mut Vec<(Vec<u8>, i64)>) {
        if self.at.is_none_or(|e| (time - e).abs() > GAP) {
            self.at = Some(time);
            self.pcm.reset();
            // (Unit k is at origin + (k − 2) frames; the next is unit `units + 1`.)
            let frame = aacenc::FRAME as i64;
            let earliest = self.last.map_or(i64::MIN, |l| l + frame - (self.units - 1) * frame);
            self.origin = (time - self.samples).max(earliest);
        }
        self.scratch.clear();
        if self.pcm.decode(packet, &mut self.scratch).is_err() {
            return;
        }
        let n = (self.scratch.len() / self.channels) as i64;
        *self.at.as_mut().expect("set above") += n;
        self.samples += n;
        self.aac.push(&self.scratch, &mut self.encoded);
        // Unit k (from 1) plays the encoder's samples from (k − 2) frames on.
        for au in self.encoded.drain(..) {
            self.units += 1;
            let at = self.origin + (self.units - 2) * aacenc::FRAME as i64;
            self.last = Some(at);
            out.push((au, at));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo clip's AAC access units, their times (48 kHz ticks) and AudioSpecificConfig.
    fn demo_aac() -> (Vec<(Vec<u8>, i64)>, Vec<u8>) {
        use fanout_proto::container::tsdemux::Demux;
        let ts = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/demo.ts")).unwrap();
        let mut d = Demux::default();
        let mut pes: Vec<_> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
        pes.extend(d.flush());
        let (mut units, mut config) = (Vec::new(), Vec::new());
        for p in pes.iter().filter(|p| p.stream_type == 0x0f) {
            let t = p.pts.unwrap() as i64 * 48_000 / 90_000;
            for (k, f) in fanout_proto::codec::aac::adts_frames(&p.data).iter().enumerate() {
                let (o, r, c) = (f.object_type, f.sample_rate_index, f.channels);
                config = vec![(o << 3) | (r >> 1), ((r & 1) << 7) | (c << 3)];
                units.push((f.au.to_vec(), t + k as i64 * 1024));
            }
        }
        (units, config)
    }

    fn rms(s: &[f32]) -> f64 {
        (s.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / s.len().max(1) as f64).sqrt()
    }

    /// The demo's AAC as Opus: a packet per 20 ms, its times following on; decoded again, the
    /// sound is the AAC's (the same loudness within 1.5 dB, and the same waveform: their
    /// correlation at the codec delay above 0.9).
    #[test]
    fn the_demo_sounds_the_same_in_opus() {
        if let Err(e) = opus::available() {
            eprintln!("SKIPPED: {e}");
            assert!(std::env::var_os("CI").is_none(), "libopus is missing on CI: {e}");
            return;
        }
        let (units, config) = demo_aac();
        let mut t = AacToOpus::new(&config).unwrap();
        let mut packets = Vec::new();
        for (au, time) in &units {
            t.push(au, *time, &mut packets);
        }
        let audio_s = units.len() as f64 * 1024.0 / f64::from(t.aac.rate());
        assert!((packets.len() as f64 - audio_s * 50.0).abs() <= 2.0, "{} packets for {audio_s} s", packets.len());
        assert!(packets.windows(2).all(|w| w[1].1 - w[0].1 == OPUS_FRAME as i64), "packet times do not follow on");
        assert_eq!(packets[0].1, units[0].1, "the first packet at the first unit's time");

        let c = t.channels();
        let (mut aac, mut direct) = (AacDecoder::new(&config).unwrap(), Vec::new());
        for (au, _) in &units {
            aac.decode(au, c, &mut direct).unwrap();
        }
        let (mut dec, mut decoded) = (opus::Decoder::new(c).unwrap(), Vec::new());
        for (p, _) in &packets {
            dec.decode(p, &mut decoded).unwrap();
        }
        // (Mono for the comparison; Opus runs 312 samples behind its input.)
        let mono = |s: &[f32]| -> Vec<f32> { s.chunks_exact(c).map(|f| f.iter().sum::<f32>() / c as f32).collect() };
        let (a, b) = (mono(&direct), mono(&decoded));
        let n = a.len().min(b.len()) - 2000;
        let db = 20.0 * (rms(&b[..n]) / rms(&a[..n])).log10();
        assert!(db.abs() < 1.5, "Opus is {db:.2} dB off the AAC");
        let corr = |lag: usize| {
            let (x, y) = (&a[..n - 1000], &b[lag..lag + n - 1000]);
            let xy: f64 = x.iter().zip(y).map(|(p, q)| f64::from(*p) * f64::from(*q)).sum();
            xy / (rms(x) * rms(y) * x.len() as f64)
        };
        let best = (0..1000).map(corr).fold(f64::MIN, f64::max);
        assert!(best > 0.9, "the Opus waveform is not the AAC's: correlation {best:.3}");
    }

    /// The demo's AAC through Opus and back to AAC: the AAC made decodes to the same sound as
    /// the Opus it was made from (within 1 dB, correlation above 0.9 at the AAC's one frame of
    /// delay), its units 1,024 samples apart from a frame before the first packet.
    #[test]
    fn opus_becomes_aac_that_sounds_the_same() {
        if let Err(e) = opus::available() {
            eprintln!("SKIPPED: {e}");
            assert!(std::env::var_os("CI").is_none(), "libopus is missing on CI: {e}");
            return;
        }
        let (units, config) = demo_aac();
        let mut to_opus = AacToOpus::new(&config).unwrap();
        let mut packets = Vec::new();
        for (au, time) in &units {
            to_opus.push(au, *time, &mut packets);
        }
        let c = to_opus.channels();
        let mut to_aac = ToAac::of_opus(c).unwrap();
        let mut aac = Vec::new();
        for (p, time) in &packets {
            to_aac.push(p, *time, &mut aac);
        }
        assert_eq!(aac[0].1, packets[0].1 - 1024);
        assert!(aac.windows(2).all(|w| w[1].1 - w[0].1 == 1024), "unit times do not follow on");
        let (mut dec, mut from_opus) = (opus::Decoder::new(c).unwrap(), Vec::new());
        for (p, _) in &packets {
            dec.decode(p, &mut from_opus).unwrap();
        }
        let (mut d, mut from_aac) = (AacDecoder::new(&to_aac.config()).unwrap(), Vec::new());
        for (au, _) in &aac {
            d.decode(au, c, &mut from_aac).unwrap();
        }
        let mono = |s: &[f32]| -> Vec<f32> { s.chunks_exact(c).map(|f| f.iter().sum::<f32>() / c as f32).collect() };
        let (a, b) = (mono(&from_opus), mono(&from_aac[1024 * c..]));
        let n = a.len().min(b.len()) - 2000;
        let db = 20.0 * (rms(&b[..n]) / rms(&a[..n])).log10();
        assert!(db.abs() < 1.0, "the AAC is {db:.2} dB off the Opus");
        let xy: f64 = a[..n].iter().zip(&b[..n]).map(|(p, q)| f64::from(*p) * f64::from(*q)).sum();
        let corr = xy / (rms(&a[..n]) * rms(&b[..n]) * n as f64);
        assert!(corr > 0.9, "the AAC waveform is not the Opus's: correlation {corr:.3}");
    }

    /// A camera's G.711 (a 1 kHz tone, µ-law and A-law, 20 ms a packet) as AAC: units 1,024
    /// samples apart from the first packet's time less a frame; decoded, the tone is at its
    /// level (within 1 dB) and what is not the tone (raising's images, the coder's noise) is
    /// 30 dB below it. Needs no libopus.
    #[test]
    fn g711_becomes_aac_that_sounds_the_same() {
        let w = 2.0 * std::f64::consts::PI * 1000.0;
        let tone: Vec<f32> = (0..16_000).map(|k| (w * k as f64 / 8000.0).sin() as f32 * 0.5).collect();
        for mu_law in [true, false] {
            let expand = if mu_law { g711::ulaw } else { g711::alaw };
            // (Each sample as the code that expands nearest to it.)
            let code =
                |x: f32| (0..=255u8).min_by_key(|&b| (i32::from(expand(b)) - (x * 32_768.0) as i32).abs()).unwrap();
            let bytes: Vec<u8> = tone.iter().map(|&x| code(x)).collect();
            let mut t = ToAac::of_g711(mu_law);
            assert_eq!(t.channels(), 1);
            let mut units = Vec::new();
            for (k, packet) in bytes.chunks(160).enumerate() {
                t.push(packet, 5000 + k as i64 * 960, &mut units);
            }
            assert_eq!(units[0].1, 5000 - 1024);
            assert!(units.windows(2).all(|w| w[1].1 - w[0].1 == 1024), "unit times do not follow on");
            assert!((units.len() as i64 - 2 * 48_000 / 1024).abs() <= 2, "{} units for 2 s", units.len());
            let (mut d, mut pcm) = (AacDecoder::new(&t.config()).unwrap(), Vec::new());
            for (au, _) in &units {
                d.decode(au, 1, &mut pcm).unwrap();
            }
            let s = &pcm[4096..pcm.len() - 4096];
            let (mut re, mut im) = (0.0, 0.0);
            for (k, x) in s.iter().enumerate() {
                let a = 2.0 * std::f64::consts::PI * 1000.0 * k as f64 / 48_000.0;
                (re, im) = (re + f64::from(*x) * a.cos(), im + f64::from(*x) * a.sin());
            }
            let n = s.len() as f64;
            let at_tone = (re * re + im * im) / (n * n) * 2.0;
            let all = rms(s).powi(2);
            let level = 10.0 * (at_tone / 0.125).log10();
            assert!(level.abs() < 1.0, "mu_law {mu_law}: the tone at {level:.2} dB");
            let rest = 10.0 * ((all - at_tone).max(1e-12) / at_tone).log10();
            assert!(rest < -30.0, "mu_law {mu_law}: what is not the tone at {rest:.1} dB");
        }
    }

    /// A gap in the AAC (a publisher's pause) starts a new run of packets at the new time;
    /// a unit that does not decode costs its own time only.
    #[test]
    fn a_gap_starts_a_new_run_and_garbage_is_skipped() {
        if opus::available().is_err() {
            return;
        }
        let (units, config) = demo_aac();
        let mut t = AacToOpus::new(&config).unwrap();
        let mut packets = Vec::new();
        for (au, time) in &units[..50] {
            t.push(au, *time, &mut packets);
        }
        t.push(&[0xde, 0xad], units[50].1, &mut packets);
        let before = packets.len();
        let later = 10 * 48_000;
        for (au, time) in &units[51..100] {
            t.push(au, time + later, &mut packets);
        }
        assert_eq!(packets[before].1, units[51].1 + later, "a new run at the unit after the gap");
        assert!(packets[before..].windows(2).all(|w| w[1].1 - w[0].1 == OPUS_FRAME as i64));
    }
}

#[cfg(test)]
mod found {
    /// Inputs the fuzzer found (a config and access units): transcoded without a panic.
    #[test]
    fn odd_inputs_do_not_panic() {
        if crate::opus::available().is_err() {
            return;
        }
        let found: &[(&[u8], &[&[u8]])] = &[
            (&[22, 8], &[&[], &[]]),
            // Symphonia indexes past a table on this unit: caught, the unit skipped.
            (
                &[0x10, 0x10],
                &[&[
                    0x28, 0x40, 0x3f, 0, 0, 0xff, 0x41, 0x41, 0x41, 0x41, 0x41, 0x48, 0x41, 0x41, 0xff, 0xff, 0, 0,
                    0xff, 1, 0x0c, 0x10,
                ]],
            ),
        ];
        for (config, units) in found {
            if let Ok(mut t) = crate::AacToOpus::new(config) {
                let mut out = Vec::new();
                for (k, au) in units.iter().enumerate() {
                    t.push(au, k as i64 * 1024, &mut out);
                }
            }
        }
    }
}

#[cfg(test)]
mod silence {
    /// The silent frames a frozen path sends decode to silence of a frame's length: AAC mono
    /// and stereo at 44.1 and 48 kHz (Symphonia), Opus mono and stereo (libopus).
    #[test]
    fn silent_frames_decode_to_silence() {
        for (config, channels) in [([0x12, 0x08], 1), ([0x11, 0x90], 2), ([0x11, 0x88], 1)] {
            let frame = fanout_proto::codec::aac::silent_frame(channels as u8).unwrap();
            let mut d = crate::AacDecoder::new(&config).unwrap();
            let mut pcm = Vec::new();
            for _ in 0..3 {
                d.decode(&frame, channels, &mut pcm).unwrap();
            }
            assert_eq!(pcm.len(), 3 * 1024 * channels, "{config:?}");
            assert!(pcm.iter().all(|s| *s == 0.0), "{config:?}");
        }
        if crate::opus::available().is_err() {
            return;
        }
        for channels in [1, 2] {
            let mut d = crate::opus::Decoder::new(channels).unwrap();
            let mut pcm = Vec::new();
            d.decode(&fanout_proto::codec::opus::silent_packet(channels as u8), &mut pcm).unwrap();
            assert_eq!(pcm.len(), 960 * channels);
            assert!(pcm.iter().all(|s| s.abs() < 1e-6));
        }
    }
}
