//! AAC-LC access units to PCM, with Symphonia's decoder.

use crate::MediaError;
use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{CodecParameters, Decoder, DecoderOptions, CODEC_TYPE_AAC};
use symphonia::core::formats::Packet;

pub struct AacDecoder {
    decoder: Box<dyn Decoder>,
    rate: u32,
    channels: usize,
    buffer: Option<SampleBuffer<f32>>,
}

/// The sampling rates an AudioSpecificConfig's index names (ISO/IEC 14496-3 1.6.3.4).
const RATES: [u32; 13] = [96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350];

impl AacDecoder {
    /// A decoder of the AAC-LC (mono or stereo) AudioSpecificConfig `config` describes.
    pub fn new(config: &[u8]) -> Result<Self, MediaError> {
        let bad = |why: &str| MediaError(format!("AAC config {config:02x?}: {why}"));
        let [a, b, ..] = *config else { return Err(bad("shorter than 2 bytes")) };
        let (object, index, channels) = (a >> 3, ((a & 7) << 1) | (b >> 7), (b >> 3) & 0xf);
        if object != 2 {
            return Err(bad(&format!("object type {object}, not AAC-LC (2)")));
        }
        let rate = *RATES.get(usize::from(index)).ok_or_else(|| bad("an explicit sampling rate"))?;
        if !(1..=2).contains(&channels) {
            return Err(bad(&format!("{channels} channels (mono and stereo are decoded)")));
        }
        let mut params = CodecParameters::new();
        params.for_codec(CODEC_TYPE_AAC).with_sample_rate(rate).with_extra_data(config.into());
        let decoder = symphonia::default::get_codecs()
            .make(&params, &DecoderOptions::default())
            .map_err(|e| bad(&e.to_string()))?;
        Ok(Self { decoder, rate, channels: usize::from(channels), buffer: None })
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Decodes one access unit, appending its samples interleaved in `channels` (1 or 2;
    /// stereo taken down to mono by their mean) to `out`.
    pub fn decode(&mut self, au: &[u8], channels: usize, out: &mut Vec<f32>) -> Result<(), MediaError> {
        // Symphonia's decoder can panic on a malformed unit (an index past a table, found by
        // fuzzing): a publisher's bytes must not end the transcoder. Its state is then reset.
        let packet = Packet::new_from_slice(0, 0, 1024, au);
        let decoder = &mut self.decoder;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decoder.decode(&packet).map(|_| ()))) {
            Ok(r) => r.map_err(|e| MediaError(e.to_string()))?,
            Err(_) => {
                self.decoder.reset();
                return Err(MediaError("a malformed AAC unit".into()));
            }
        }
        let decoded = self.decoder.last_decoded();
        let spec = *decoded.spec();
        let frames = decoded.capacity() as u64;
        let buffer = match &mut self.buffer {
            Some(b) if b.capacity() >= decoded.capacity() * spec.channels.count() => b,
            slot => slot.insert(SampleBuffer::new(frames, spec)),
        };
        buffer.copy_interleaved_ref(decoded);
        let have = spec.channels.count();
        match (have, channels) {
            (a, b) if a == b => out.extend_from_slice(buffer.samples()),
            (2, 1) => out.extend(buffer.samples().chunks_exact(2).map(|s| (s[0] + s[1]) / 2.0)),
            (1, 2) => out.extend(buffer.samples().iter().flat_map(|&s| [s, s])),
            _ => return Err(MediaError(format!("{have} channels decoded"))),
        }
        Ok(())
    }
}
