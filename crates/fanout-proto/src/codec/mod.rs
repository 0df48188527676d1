//! Codecs, as a relay needs them: where pictures and layers start and what they are, never
//! decoding.
//!
//! - [`annexb`]: H.264/HEVC byte streams: NAL units, access units, RTP packetization.
//! - [`hevc`]: what an HEVC sequence parameter set says that an MP4 sample entry needs.
//! - [`aac`]: ADTS frames and the MPEG4-GENERIC (RFC 3640) RTP payload.
//! - [`layers`]: the scalable layer (H.264, SVC, HEVC) of an RTP packet, for layer dropping.
//! - [`dts`]: decoding times for video that comes with presentation times only.
//! - [`vpx`]: where VP8 and VP9 keyframes start in their RTP payloads; VP9's frame header.
//! - [`av1`]: where AV1 keyframes start in their RTP payloads; OBUs gathered for MP4.
//! - [`mpa`]: MPEG audio (MP3) frames and their RTP payload.
//! - [`opus`]: how long an Opus packet plays; its MP4 `dOps`.

pub mod aac;
pub mod annexb;
pub mod av1;
mod bits;
pub mod dts;
pub mod hevc;
pub mod layers;
pub mod mpa;
pub mod opus;
pub mod vpx;
