//! Fragmented MP4 (ISO/IEC 14496-12, the CMAF shape HLS and MSE play): an initialization
//! segment (`ftyp` + `moov` with one track per stream, `avc1`/`avcC`, `hvc1`/`hvcC` or
//! `mp4a`/`esds`) and
//! media segments (`moof` + `mdat`, one `traf` per track). Sans-IO: samples in, bytes out.

/// A track of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fmp4Track {
    /// H.264 with its SPS and PPS (NAL units without start codes).
    H264 { sps: Vec<u8>, pps: Vec<u8>, width: u16, height: u16 },
    /// H.265 with its VPS, SPS and PPS (NAL units without start codes) and what the SPS says.
    H265 { vps: Vec<u8>, sps: Vec<u8>, pps: Vec<u8>, info: crate::codec::hevc::SpsInfo },
    /// AAC with its AudioSpecificConfig.
    Aac { config: Vec<u8>, sample_rate: u32, channels: u16 },
    /// VP9 with what its first key frame says (`vp09`/`vpcC`).
    Vp9 { profile: u8, format: crate::codec::vpx::Vp9Format },
    /// AV1 with its sequence header OBU, sized, and what it says (`av01`/`av1C`).
    Av1 { header: crate::codec::av1::SequenceHeader, obu: Vec<u8> },
    /// Opus at 48 kHz (`Opus`/`dOps`).
    Opus { channels: u8 },
    /// MPEG audio, MP3 most often (`mp4a` of object type MPEG-1 or MPEG-2 audio).
    Mp3 { mpeg1: bool, sample_rate: u32, channels: u16 },
    /// G.711 µ-law or A-law (`ulaw`/`alaw`, as QuickTime and ffmpeg write it).
    G711 { mu_law: bool, sample_rate: u32, channels: u16 },
}

impl Fmp4Track {
    /// The parameter sets its sample entry holds (H.264 and H.265; none for the others).
    pub fn parameter_sets(&self) -> Vec<&[u8]> {
        match self {
            Fmp4Track::H264 { sps, pps, .. } => vec![sps, pps],
            Fmp4Track::H265 { vps, sps, pps, .. } => vec![vps, sps, pps],
            _ => Vec::new(),
        }
    }

    /// The track's time scale: 90 kHz for video, the sample rate for audio.
    pub fn timescale(&self) -> u32 {
        match self {
            Fmp4Track::Aac { sample_rate, .. }
            | Fmp4Track::Mp3 { sample_rate, .. }
            | Fmp4Track::G711 { sample_rate, .. } => *sample_rate,
            Fmp4Track::Opus { .. } => 48_000,
            _ => 90_000,
        }
    }

    pub fn is_audio(&self) -> bool {
        matches!(self, Fmp4Track::Aac { .. } | Fmp4Track::Opus { .. } | Fmp4Track::Mp3 { .. } | Fmp4Track::G711 { .. })
    }

    /// An audio sample's duration in the time scale: 1024 for AAC, what an Opus packet's
    /// TOC says (20 ms where it says nothing sound), what an MPEG audio frame's header says,
    /// a G.711 byte a sample.
    pub fn audio_duration(&self, sample: &[u8]) -> u32 {
        match self {
            Fmp4Track::Opus { .. } => crate::codec::opus::packet_samples(sample).unwrap_or(960),
            Fmp4Track::Mp3 { .. } => crate::codec::mpa::frame_header(sample).map_or(1152, |h| h.samples),
            Fmp4Track::G711 { channels, .. } => (sample.len() / usize::from((*channels).max(1))) as u32,
            _ => 1024,
        }
    }

    /// The RFC 6381 codec string (for HLS `CODECS` and MSE): `avc1.64001f`, `mp4a.40.2`.
    pub fn codec(&self) -> String {
        match self {
            Fmp4Track::H264 { sps, .. } => match sps.get(1..4) {
                Some(p) => format!("avc1.{:02x}{:02x}{:02x}", p[0], p[1], p[2]),
                None => "avc1".into(),
            },
            Fmp4Track::H265 { info, .. } => info.codec(),
            Fmp4Track::Aac { config, .. } => format!("mp4a.40.{}", config.first().map_or(2, |c| c >> 3)),
            Fmp4Track::Vp9 { profile, format } => crate::codec::vpx::vp9_codec_string(*profile, format),
            Fmp4Track::Av1 { header, .. } => header.codec(),
            Fmp4Track::Opus { .. } => "opus".into(),
            Fmp4Track::Mp3 { mpeg1: true, .. } => "mp4a.6b".into(),
            Fmp4Track::Mp3 { .. } => "mp4a.69".into(),
            Fmp4Track::G711 { mu_law: true, .. } => "ulaw".into(),
            Fmp4Track::G711 { .. } => "alaw".into(),
        }
    }
}

/// One sample of a track in a fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// In the track's time scale: to the next sample's decoding time.
    pub duration: u32,
    /// How far its presentation comes after its decoding, in the track's time scale (a
    /// picture decoded before the B-frames shown ahead of it).
    pub composition_offset: u32,
    /// A picture a decoder can start at (audio: every sample).
    pub key: bool,
    /// Video: NAL units each behind a 4-byte length. Audio: the raw frame.
    pub data: Vec<u8>,
}

/// A box: its size and type, then `body` writes the content.
fn mp4_box(out: &mut Vec<u8>, kind: &[u8; 4], body: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(kind);
    body(out);
    let size = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&size.to_be_bytes());
}

/// A full box: a box with a version and 24 bits of flags.
fn full_box(out: &mut Vec<u8>, kind: &[u8; 4], version: u8, flags: u32, body: impl FnOnce(&mut Vec<u8>)) {
    mp4_box(out, kind, |o| {
        o.extend_from_slice(&(u32::from(version) << 24 | flags).to_be_bytes());
        body(o);
    });
}

fn u16s(o: &mut Vec<u8>, v: &[u16]) {
    v.iter().for_each(|x| o.extend_from_slice(&x.to_be_bytes()));
}

fn u32s(o: &mut Vec<u8>, v: &[u32]) {
    v.iter().for_each(|x| o.extend_from_slice(&x.to_be_bytes()));
}

/// The unity matrix of `mvhd` and `tkhd`.
const MATRIX: [u32; 9] = [0x0001_0000, 0, 0, 0, 0x0001_0000, 0, 0, 0, 0x4000_0000];

/// The initialization segment for these tracks (track IDs 1, 2, …).
pub fn init_segment(tracks: &[Fmp4Track]) -> Vec<u8> {
    let mut o = Vec::with_capacity(1024);
    mp4_box(&mut o, b"ftyp", |o| {
        o.extend_from_slice(b"iso6");
        u32s(o, &[0]);
        o.extend_from_slice(b"iso6isommp41");
    });
    mp4_box(&mut o, b"moov", |o| {
        full_box(o, b"mvhd", 0, 0, |o| {
            u32s(o, &[0, 0, 1000, 0, 0x0001_0000]); // times, timescale, duration, rate
            u16s(o, &[0x0100, 0]); // volume, reserved
            u32s(o, &[0, 0]);
            u32s(o, &MATRIX);
            u32s(o, &[0; 6]);
            u32s(o, &[tracks.len() as u32 + 1]); // next track ID
        });
        for (i, t) in tracks.iter().enumerate() {
            trak(o, i as u32 + 1, t);
        }
        mp4_box(o, b"mvex", |o| {
            for i in 0..tracks.len() as u32 {
                full_box(o, b"trex", 0, 0, |o| u32s(o, &[i + 1, 1, 0, 0, 0]));
            }
        });
    });
    o
}

fn trak(o: &mut Vec<u8>, id: u32, t: &Fmp4Track) {
    let video = !t.is_audio();
    let (w, h) = match t {
        Fmp4Track::H264 { width, height, .. } => (u32::from(*width), u32::from(*height)),
        Fmp4Track::H265 { info, .. } => (u32::from(info.width), u32::from(info.height)),
        Fmp4Track::Vp9 { format, .. } => (u32::from(format.width), u32::from(format.height)),
        Fmp4Track::Av1 { header, .. } => (u32::from(header.width), u32::from(header.height)),
        _ => (0, 0),
    };
    mp4_box(o, b"trak", |o| {
        // Enabled, in the movie.
        full_box(o, b"tkhd", 0, 3, |o| {
            u32s(o, &[0, 0, id, 0, 0, 0, 0]); // times, ID, reserved, duration, reserved ×2
            u16s(o, &[0, 0, if video { 0 } else { 0x0100 }, 0]); // layer, group, volume
            u32s(o, &MATRIX);
            u32s(o, &[w << 16, h << 16]);
        });
        mp4_box(o, b"mdia", |o| {
            full_box(o, b"mdhd", 0, 0, |o| {
                u32s(o, &[0, 0, t.timescale(), 0]);
                u16s(o, &[0x55c4, 0]); // "und"
            });
            full_box(o, b"hdlr", 0, 0, |o| {
                u32s(o, &[0]);
                o.extend_from_slice(if video { b"vide" } else { b"soun" });
                u32s(o, &[0, 0, 0]);
                o.extend_from_slice(if video { b"fanout video\0" } else { b"fanout audio\0" });
            });
            mp4_box(o, b"minf", |o| {
                if video {
                    full_box(o, b"vmhd", 0, 1, |o| u16s(o, &[0, 0, 0, 0]));
                } else {
                    full_box(o, b"smhd", 0, 0, |o| u16s(o, &[0, 0]));
                }
                mp4_box(o, b"dinf", |o| {
                    full_box(o, b"dref", 0, 0, |o| {
                        u32s(o, &[1]);
                        full_box(o, b"url ", 0, 1, |_| {});
                    });
                });
                mp4_box(o, b"stbl", |o| {
                    full_box(o, b"stsd", 0, 0, |o| {
                        u32s(o, &[1]);
                        sample_entry(o, t);
                    });
                    full_box(o, b"stts", 0, 0, |o| u32s(o, &[0]));
                    full_box(o, b"stsc", 0, 0, |o| u32s(o, &[0]));
                    full_box(o, b"stsz", 0, 0, |o| u32s(o, &[0, 0]));
                    full_box(o, b"stco", 0, 0, |o| u32s(o, &[0]));
                });
            });
        });
    });
}

/// The fields every visual sample entry starts with (ISO/IEC 14496-12 §12.1.3).
fn visual_entry(o: &mut Vec<u8>, width: u16, height: u16) {
    o.extend_from_slice(&[0; 6]);
    u16s(o, &[1, 0, 0]); // data reference index, pre-defined, reserved
    u32s(o, &[0, 0, 0]);
    u16s(o, &[width, height]);
    u32s(o, &[0x0048_0000, 0x0048_0000, 0]); // 72 dpi, reserved
    u16s(o, &[1]); // frame count
    o.extend_from_slice(&[0; 32]); // compressor name
    u16s(o, &[0x0018, 0xffff]); // depth, pre-defined
}

/// The fields every audio sample entry starts with (ISO/IEC 14496-12 §12.2.3).
fn audio_entry(o: &mut Vec<u8>, channels: u16, sample_rate: u32) {
    o.extend_from_slice(&[0; 6]);
    u16s(o, &[1]);
    u32s(o, &[0, 0]);
    u16s(o, &[channels, 16, 0, 0]);
    // A 16.16 rate: above 65535 Hz it does not fit (AAC's esds says it anyway).
    u32s(o, &[sample_rate.min(0xffff) << 16]);
}

/// An `esds` box: ES descriptor > decoder config (object type `oti`, an audio stream) >
/// decoder specific info (AAC's AudioSpecificConfig; MPEG audio has none); SL config.
fn esds(o: &mut Vec<u8>, oti: u8, dsi: Option<&[u8]>) {
    full_box(o, b"esds", 0, 0, |o| {
        let dsi_len = dsi.map_or(0, |d| 2 + d.len() as u8);
        o.extend_from_slice(&[0x03, 21 + dsi_len, 0, 1, 0]);
        o.extend_from_slice(&[0x04, 13 + dsi_len, oti, 0x15, 0, 0, 0]);
        u32s(o, &[0, 0]); // max, average bit rate: unknown
        if let Some(d) = dsi {
            o.extend_from_slice(&[0x05, d.len() as u8]);
            o.extend_from_slice(d);
        }
        o.extend_from_slice(&[0x06, 1, 2]);
    });
}

fn sample_entry(o: &mut Vec<u8>, t: &Fmp4Track) {
    match t {
        Fmp4Track::H265 { vps, sps, pps, info } => mp4_box(o, b"hvc1", |o| {
            visual_entry(o, info.width, info.height);
            mp4_box(o, b"hvcC", |o| o.extend_from_slice(&info.hvcc(vps, sps, pps)));
        }),
        Fmp4Track::H264 { sps, pps, width, height } => mp4_box(o, b"avc1", |o| {
            visual_entry(o, *width, *height);
            mp4_box(o, b"avcC", |o| {
                let p = sps.get(1..4).unwrap_or(&[0x42, 0, 0x1e]);
                o.extend_from_slice(&[1, p[0], p[1], p[2], 0xff, 0xe1]); // 4-byte lengths, one SPS
                u16s(o, &[sps.len() as u16]);
                o.extend_from_slice(sps);
                o.push(1);
                u16s(o, &[pps.len() as u16]);
                o.extend_from_slice(pps);
            });
        }),
        Fmp4Track::Vp9 { profile, format: f } => mp4_box(o, b"vp09", |o| {
            visual_entry(o, f.width, f.height);
            full_box(o, b"vpcC", 1, 0, |o| {
                let level = crate::codec::vpx::vp9_codec_string(*profile, f)[8..10].parse().unwrap_or(0);
                o.extend_from_slice(&[*profile, level, f.bit_depth << 4 | f.chroma << 1 | u8::from(f.full_range)]);
                o.extend_from_slice(&[2, 2, 2]); // colour primaries, transfer, matrix: unspecified
                u16s(o, &[0]); // no codec initialization data
            });
        }),
        Fmp4Track::Av1 { header, obu } => mp4_box(o, b"av01", |o| {
            visual_entry(o, header.width, header.height);
            mp4_box(o, b"av1C", |o| o.extend_from_slice(&header.av1c(obu)));
        }),
        Fmp4Track::Opus { channels } => mp4_box(o, b"Opus", |o| {
            audio_entry(o, u16::from(*channels), 48_000);
            mp4_box(o, b"dOps", |o| o.extend_from_slice(&crate::codec::opus::dops(*channels)));
        }),
        Fmp4Track::Aac { config, sample_rate, channels } => mp4_box(o, b"mp4a", |o| {
            audio_entry(o, *channels, *sample_rate);
            esds(o, 0x40, Some(config));
        }),
        Fmp4Track::Mp3 { mpeg1, sample_rate, channels } => mp4_box(o, b"mp4a", |o| {
            audio_entry(o, *channels, *sample_rate);
            esds(o, if *mpeg1 { 0x6b } else { 0x69 }, None);
        }),
        Fmp4Track::G711 { mu_law, sample_rate, channels } => {
            mp4_box(o, if *mu_law { b"ulaw" } else { b"alaw" }, |o| audio_entry(o, *channels, *sample_rate))
        }
    }
}

/// A media segment: fragment `sequence` (from 1) holding, per track (in init order), its
/// samples from `base` (its first sample's decoding time, in the track's time scale).
pub fn media_segment(sequence: u32, tracks: &[(u64, Vec<Sample>)]) -> Vec<u8> {
    let mut o = Vec::with_capacity(tracks.iter().flat_map(|t| &t.1).map(|s| s.data.len() + 12).sum::<usize>() + 256);
    // Where each traf's data offset field is, to patch once the moof's size is known.
    let mut offsets = Vec::new();
    mp4_box(&mut o, b"moof", |o| {
        full_box(o, b"mfhd", 0, 0, |o| u32s(o, &[sequence]));
        for (i, (base, samples)) in tracks.iter().enumerate() {
            mp4_box(o, b"traf", |o| {
                // Offsets are from the moof.
                full_box(o, b"tfhd", 0, 0x02_0000, |o| u32s(o, &[i as u32 + 1]));
                full_box(o, b"tfdt", 1, 0, |o| o.extend_from_slice(&base.to_be_bytes()));
                // Data offset, and per sample its duration, size, flags and composition
                // offset.
                full_box(o, b"trun", 0, 0x000f01, |o| {
                    u32s(o, &[samples.len() as u32]);
                    offsets.push(o.len());
                    u32s(o, &[0]);
                    for s in samples {
                        // A sync sample depends on nothing; others depend and are no sync.
                        let flags = if s.key { 0x0200_0000 } else { 0x0101_0000 };
                        u32s(o, &[s.duration, s.data.len() as u32, flags, s.composition_offset]);
                    }
                });
            });
        }
    });
    let moof_len = o.len();
    let mut data_at = moof_len + 8;
    for ((_, samples), at) in tracks.iter().zip(offsets) {
        o[at..at + 4].copy_from_slice(&(data_at as u32).to_be_bytes());
        data_at += samples.iter().map(|s| s.data.len()).sum::<usize>();
    }
    mp4_box(&mut o, b"mdat", |o| {
        for s in tracks.iter().flat_map(|t| &t.1) {
            o.extend_from_slice(&s.data);
        }
    });
    o
}

/// Whether an access unit (Annex B) brings a parameter set its track's sample entry does
/// not hold (`described`): the stream's parameters changed (another publisher, a fallback).
pub fn brings_other_sets(annexb: &[u8], codec: crate::codec::annexb::Codec, described: &[&[u8]]) -> bool {
    use crate::codec::annexb::{is_parameter_set, nal_units};
    nal_units(annexb).any(|n| is_parameter_set(codec, n) && !described.contains(&n))
}

/// Annex B to the 4-byte-length form of MP4 samples, leaving out access unit delimiters
/// and, unless `sets_in_band`, parameter sets (the `avcC` or `hvcC` has them). Once a
/// stream's parameters have changed ([`brings_other_sets`]) its sets stay in band: every
/// keyframe then brings the sets it was coded with, for a player that joins late as for
/// one that saw the change.
pub fn avcc_sample(annexb: &[u8], codec: crate::codec::annexb::Codec, sets_in_band: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(annexb.len() + 16);
    for nal in crate::codec::annexb::nal_units(annexb) {
        let aud = match codec {
            crate::codec::annexb::Codec::H265 => nal.first().is_some_and(|b| (b >> 1) & 0x3f == 35),
            _ => nal.first().is_some_and(|b| b & 0x1f == 9),
        };
        if nal.is_empty() || aud || (!sets_in_band && crate::codec::annexb::is_parameter_set(codec, nal)) {
            continue;
        }
        out.extend_from_slice(&(nal.len() as u32).to_be_bytes());
        out.extend_from_slice(nal);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boxes of a buffer: (type, body) at the top level.
    fn boxes(mut b: &[u8]) -> Vec<([u8; 4], &[u8])> {
        let mut out = Vec::new();
        while b.len() >= 8 {
            let size = u32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
            assert!(size >= 8 && size <= b.len(), "box size {size} of {}", b.len());
            out.push((b[4..8].try_into().unwrap(), &b[8..size]));
            b = &b[size..];
        }
        assert!(b.is_empty());
        out
    }

    #[test]
    fn boxes_nest_with_their_sizes() {
        let tracks = [
            Fmp4Track::H264 { sps: vec![0x67, 0x64, 0, 0x1e, 1], pps: vec![0x68, 1], width: 480, height: 270 },
            Fmp4Track::Aac { config: vec![0x11, 0x90], sample_rate: 48_000, channels: 2 },
        ];
        let init = init_segment(&tracks);
        let top = boxes(&init);
        assert_eq!(top.iter().map(|b| &b.0).collect::<Vec<_>>(), [b"ftyp", b"moov"]);
        let moov = boxes(top[1].1);
        assert_eq!(moov.iter().map(|b| &b.0).collect::<Vec<_>>(), [b"mvhd", b"trak", b"trak", b"mvex"]);
        assert_eq!((tracks[0].codec(), tracks[1].codec()), ("avc1.64001e".into(), "mp4a.40.2".into()));

        let seg = media_segment(
            7,
            &[
                (
                    900,
                    vec![Sample { duration: 3600, composition_offset: 0, key: true, data: vec![0, 0, 0, 2, 0x65, 1] }],
                ),
                (480, vec![Sample { duration: 1024, composition_offset: 0, key: true, data: vec![9; 10] }; 2]),
            ],
        );
        let top = boxes(&seg);
        assert_eq!(top.iter().map(|b| &b.0).collect::<Vec<_>>(), [b"moof", b"mdat"]);
        assert_eq!(top[1].1.len(), 26);
        // The second traf's data offset points at its samples in the mdat.
        let moof = boxes(top[0].1);
        let traf = boxes(moof[2].1);
        let trun = traf[2].1;
        let offset = u32::from_be_bytes(trun[8..12].try_into().unwrap()) as usize;
        assert_eq!(&seg[offset..offset + 10], &[9; 10]);
    }

    #[test]
    fn samples_leave_out_delimiters_and_described_parameter_sets() {
        let au = [0, 0, 0, 1, 9, 0xf0, 0, 0, 0, 1, 0x67, 1, 0, 0, 1, 0x68, 2, 0, 0, 0, 1, 0x65, 7, 7];
        let h264 = crate::codec::annexb::Codec::H264;
        assert_eq!(avcc_sample(&au, h264, false), [0, 0, 0, 3, 0x65, 7, 7]);
        // Once the stream's parameters changed, its sets stay; delimiters do not.
        let kept = [0, 0, 0, 2, 0x67, 1, 0, 0, 0, 2, 0x68, 2, 0, 0, 0, 3, 0x65, 7, 7];
        assert_eq!(avcc_sample(&au, h264, true), kept);
        assert!(!brings_other_sets(&au, h264, &[&[0x67, 1], &[0x68, 2]]));
        assert!(brings_other_sets(&au, h264, &[&[0x67, 1], &[0x68, 9]]));
        // HEVC: AUD (35), VPS (32), SPS (33), PPS (34) out; an IDR slice (19) in.
        let au = [
            0, 0, 1, 0x46, 1, 0x50, 0, 0, 1, 0x40, 1, 9, 0, 0, 1, 0x42, 1, 9, 0, 0, 1, 0x44, 1, 9, 0, 0, 1, 0x26, 1, 7,
        ];
        let hevc = crate::codec::annexb::Codec::H265;
        assert_eq!(avcc_sample(&au, hevc, false), [0, 0, 0, 3, 0x26, 1, 7]);
        assert!(!brings_other_sets(&au, hevc, &[&[0x40, 1, 9], &[0x42, 1, 9], &[0x44, 1, 9]]));
        assert!(brings_other_sets(&au, hevc, &[&[0x40, 1, 9], &[0x42, 1, 8], &[0x44, 1, 9]]));
    }
}
