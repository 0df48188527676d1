//! FLV audio and video tag bodies, as RTMP carries them (FLV 10.1 §E.4.2–3), with Enhanced
//! RTMP's FourCC video header (v1/v2: `hvc1`, `av01`, `vp09`, `avc1`): the codec, whether a
//! body is its decoder configuration or coded frames, and the frames' NAL units; and the
//! decoder configuration tag written from parameter sets.

use crate::codec::annexb::Codec;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FlvError {
    #[error("FLV tag cut short")]
    Short,
    #[error("a decoder configuration record that does not parse")]
    BadConfig,
    #[error("a NAL unit length past the end of the frame")]
    BadLength,
}

/// A video codec FLV can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VideoCodec {
    Avc,
    Hevc,
    Av1,
    Vp9,
    /// Another codec id or FourCC (Sorenson, VP6, ...): carried by no face of the relay.
    Other(u32),
}

impl VideoCodec {
    /// Its name, for a log line.
    pub fn name(self) -> String {
        match self {
            VideoCodec::Avc => "H.264".into(),
            VideoCodec::Hevc => "H.265".into(),
            VideoCodec::Av1 => "AV1".into(),
            VideoCodec::Vp9 => "VP9".into(),
            VideoCodec::Other(id) if id > 0xff => {
                format!("FourCC {:?}", String::from_utf8_lossy(&id.to_be_bytes()))
            }
            VideoCodec::Other(id) => format!("FLV codec id {id}"),
        }
    }

    /// The byte-stream codec of the relay's tracks, where it is one.
    pub fn annexb(self) -> Option<Codec> {
        match self {
            VideoCodec::Avc => Some(Codec::H264),
            VideoCodec::Hevc => Some(Codec::H265),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Video<'a> {
    /// The decoder configuration record (AVC/HEVC: the parameter sets).
    Config { codec: VideoCodec, record: &'a [u8] },
    /// Coded frames: `cts` is the composition time offset (ms), `data` length-prefixed NAL
    /// units (AVC/HEVC).
    Frames { codec: VideoCodec, keyframe: bool, cts: i32, data: &'a [u8] },
    /// The end of the sequence, a command frame, or a packet type not handled here.
    Other,
    /// A plain-FLV codec id that is neither AVC nor HEVC (Sorenson, VP6, ...).
    Unsupported(VideoCodec),
}

fn si24(b: &[u8]) -> i32 {
    (i32::from_be_bytes([b[0], b[1], b[2], 0])) >> 8
}

/// Parses a video message's body.
pub fn video(body: &[u8]) -> Result<Video<'_>, FlvError> {
    let b0 = *body.first().ok_or(FlvError::Short)?;
    let frame_type = (b0 >> 4) & 0x07;
    let keyframe = frame_type == 1;
    if frame_type == 5 {
        return Ok(Video::Other); // a video info/command frame
    }
    if b0 & 0x80 != 0 {
        // Enhanced RTMP: the packet type in the low nibble, then a FourCC.
        let packet_type = b0 & 0x0f;
        let fourcc = body.get(1..5).ok_or(FlvError::Short)?;
        let codec = match fourcc {
            b"avc1" => VideoCodec::Avc,
            b"hvc1" => VideoCodec::Hevc,
            b"av01" => VideoCodec::Av1,
            b"vp09" => VideoCodec::Vp9,
            f => VideoCodec::Other(u32::from_be_bytes([f[0], f[1], f[2], f[3]])),
        };
        let rest = &body[5..];
        return Ok(match packet_type {
            0 => Video::Config { codec, record: rest },
            // CodedFrames: AVC and HEVC carry a composition time first.
            1 if matches!(codec, VideoCodec::Avc | VideoCodec::Hevc) => {
                let cts = si24(rest.get(..3).ok_or(FlvError::Short)?);
                Video::Frames { codec, keyframe, cts, data: &rest[3..] }
            }
            1 => Video::Frames { codec, keyframe, cts: 0, data: rest },
            // CodedFramesX: no composition time.
            3 => Video::Frames { codec, keyframe, cts: 0, data: rest },
            _ => Video::Other,
        });
    }
    let codec = match b0 & 0x0f {
        7 => VideoCodec::Avc,
        12 => VideoCodec::Hevc, // the id some servers and encoders use for HEVC in plain FLV
        id => VideoCodec::Other(u32::from(id)),
    };
    if codec.annexb().is_none() {
        return Ok(Video::Unsupported(codec));
    }
    let h = body.get(1..5).ok_or(FlvError::Short)?;
    Ok(match h[0] {
        0 => Video::Config { codec, record: &body[5..] },
        1 => Video::Frames { codec, keyframe, cts: si24(&h[1..4]), data: &body[5..] },
        _ => Video::Other,
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audio<'a> {
    /// AAC's AudioSpecificConfig.
    AacConfig(&'a [u8]),
    /// One raw AAC frame.
    AacFrame(&'a [u8]),
    /// Another sound format (MP3, Speex, G.711, ...), by its FLV id.
    Other(u8),
}

/// Parses an audio message's body.
pub fn audio(body: &[u8]) -> Result<Audio<'_>, FlvError> {
    let b0 = *body.first().ok_or(FlvError::Short)?;
    let format = b0 >> 4;
    if format != 10 {
        return Ok(Audio::Other(format));
    }
    match *body.get(1).ok_or(FlvError::Short)? {
        0 => Ok(Audio::AacConfig(&body[2..])),
        _ => Ok(Audio::AacFrame(&body[2..])),
    }
}

/// The parameter sets of an AVC or HEVC decoder configuration record (VPS, SPS, PPS in that
/// order), and the size of the NAL unit length fields of the frames that follow.
pub fn parameter_sets(codec: Codec, record: &[u8]) -> Result<(Vec<&[u8]>, usize), FlvError> {
    let mut sets = Vec::new();
    let mut pos;
    let take = |pos: &mut usize, n: usize| -> Result<&[u8], FlvError> {
        let s = record.get(*pos..*pos + n).ok_or(FlvError::BadConfig)?;
        *pos += n;
        Ok(s)
    };
    let u16_at = |s: &[u8]| usize::from(u16::from_be_bytes([s[0], s[1]]));
    let length_size;
    match codec {
        Codec::H264 => {
            let h = record.get(..6).ok_or(FlvError::BadConfig)?;
            length_size = usize::from(h[4] & 0x03) + 1;
            pos = 6;
            let n_sps = usize::from(h[5] & 0x1f);
            for _ in 0..n_sps {
                let n = u16_at(take(&mut pos, 2)?);
                sets.push(take(&mut pos, n)?);
            }
            let n_pps = usize::from(take(&mut pos, 1)?[0]);
            for _ in 0..n_pps {
                let n = u16_at(take(&mut pos, 2)?);
                sets.push(take(&mut pos, n)?);
            }
        }
        Codec::H265 => {
            let h = record.get(..23).ok_or(FlvError::BadConfig)?;
            length_size = usize::from(h[21] & 0x03) + 1;
            pos = 23;
            let mut by_type: Vec<(u8, &[u8])> = Vec::new();
            for _ in 0..h[22] {
                let t = take(&mut pos, 1)?[0] & 0x3f;
                let count = u16_at(take(&mut pos, 2)?);
                for _ in 0..count {
                    let n = u16_at(take(&mut pos, 2)?);
                    by_type.push((t, take(&mut pos, n)?));
                }
            }
            by_type.sort_by_key(|(t, _)| *t); // VPS (32), SPS (33), PPS (34), then SEI
            sets.extend(by_type.into_iter().filter(|(t, _)| (32..=34).contains(t)).map(|(_, s)| s));
        }
    }
    if length_size == 3 {
        return Err(FlvError::BadConfig); // not a size the format allows
    }
    Ok((sets, length_size))
}

/// The NAL units of length-prefixed frames (`length_size` bytes of length each).
pub fn nal_units(data: &[u8], length_size: usize) -> Result<Vec<&[u8]>, FlvError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let l = data.get(pos..pos + length_size).ok_or(FlvError::BadLength)?;
        let n = l.iter().fold(0usize, |n, &b| n << 8 | usize::from(b));
        pos += length_size;
        out.push(data.get(pos..pos + n).ok_or(FlvError::BadLength)?);
        pos += n;
    }
    Ok(out)
}

/// A video tag carrying the decoder configuration record of the parameter sets (AVC: SPS,
/// PPS; HEVC, in Enhanced RTMP's `hvc1` SequenceStart: VPS, SPS, PPS), with 4-byte NAL unit
/// lengths in the frames that follow; what [`video`] and [`parameter_sets`] read.
pub fn video_config(codec: Codec, sets: &[&[u8]]) -> Vec<u8> {
    let mut t = Vec::new();
    match codec {
        Codec::H264 => {
            let set = |i: usize| sets.get(i).copied().unwrap_or_default();
            let (sps, pps) = (set(0), set(1));
            // Profile, compatibility and level as the SPS says (Baseline 3.0 if it is short).
            let plc = sps.get(1..4).unwrap_or(&[0x42, 0xc0, 0x1e]);
            t.extend_from_slice(&[0x17, 0, 0, 0, 0, 1, plc[0], plc[1], plc[2], 0xff, 0xe1]);
            t.extend_from_slice(&(sps.len() as u16).to_be_bytes());
            t.extend_from_slice(sps);
            t.push(1);
            t.extend_from_slice(&(pps.len() as u16).to_be_bytes());
            t.extend_from_slice(pps);
        }
        Codec::H265 => {
            t.push(0x80 | 0x10); // Enhanced RTMP, a keyframe's, packet type 0 (sequence start)
            t.extend_from_slice(b"hvc1");
            // HEVCDecoderConfigurationRecord: version 1, the SPS's profile, tier and level
            // (its bytes after the NAL header and the first byte), and 4-byte NAL lengths.
            let sps = sets.get(1).copied().unwrap_or_default();
            let ptl = sps.get(3..15).unwrap_or(&[0; 12]);
            t.push(1);
            t.extend_from_slice(ptl);
            t.extend_from_slice(&[0xf0, 0x00, 0xfc, 0xfd, 0xf8, 0xf8, 0, 0, 0x0f, sets.len() as u8]);
            for (set, nal_type) in sets.iter().zip([32u8, 33, 34]) {
                t.push(0x80 | nal_type);
                t.extend_from_slice(&1u16.to_be_bytes());
                t.extend_from_slice(&(set.len() as u16).to_be_bytes());
                t.extend_from_slice(set);
            }
        }
    }
    t
}

/// A video tag of one picture: `annexb` (start codes) as length-prefixed NAL units, access
/// unit delimiters left out; `cts` the composition offset in ms. AVC in a plain tag, HEVC in
/// Enhanced RTMP's `hvc1` CodedFrames.
pub fn video_frame(codec: Codec, key: bool, cts: i32, annexb: &[u8]) -> Vec<u8> {
    let mut t = match codec {
        Codec::H264 => vec![if key { 0x17 } else { 0x27 }, 1],
        Codec::H265 => {
            let mut b = vec![0x80 | if key { 0x10 } else { 0x20 } | 1];
            b.extend_from_slice(b"hvc1");
            b
        }
    };
    t.extend_from_slice(&cts.to_be_bytes()[1..]);
    let aud = |n: &[u8]| match codec {
        Codec::H264 => n.first().is_some_and(|b| b & 0x1f == 9),
        Codec::H265 => n.first().is_some_and(|b| (b >> 1) & 0x3f == 35),
    };
    for n in crate::codec::annexb::nal_units(annexb).filter(|n| !n.is_empty() && !aud(n)) {
        t.extend_from_slice(&(n.len() as u32).to_be_bytes());
        t.extend_from_slice(n);
    }
    t
}

/// An audio tag of AAC's AudioSpecificConfig.
pub fn aac_config(asc: &[u8]) -> Vec<u8> {
    [&[0xaf, 0][..], asc].concat()
}

/// An audio tag of one raw AAC frame.
pub fn aac_frame(au: &[u8]) -> Vec<u8> {
    [&[0xaf, 1][..], au].concat()
}

/// An audio tag of one MP3 frame (sound format 2). Its rate field says 44 kHz, 22 kHz or
/// 11 kHz, the nearest FLV can; decoders take the rate from the frame's own header.
pub fn mp3_frame(frame: &[u8]) -> Vec<u8> {
    let h = crate::codec::mpa::frame_header(frame);
    let rate: u8 = match h.as_ref().map_or(44_100, |h| h.sample_rate) {
        0..=11_025 => 1,
        11_026..=22_050 => 2,
        _ => 3,
    };
    let stereo = h.is_none_or(|h| h.channels == 2);
    let flags = (2 << 4) | (rate << 2) | (1 << 1) | u8::from(stereo);
    [&[flags][..], frame].concat()
}

/// The start of an FLV file (a live stream over HTTP): the header, saying whether video and
/// audio come, and the first PreviousTagSize (0).
pub fn file_header(video: bool, audio: bool) -> [u8; 13] {
    let flags = (u8::from(audio) << 2) | u8::from(video);
    [b'F', b'L', b'V', 1, flags, 0, 0, 0, 9, 0, 0, 0, 0]
}

/// One tag of an FLV file: its header (video or audio, the body's size, the time in ms with
/// its high byte last, stream 0), `body`, then the whole tag's size as the next
/// PreviousTagSize. A body is at most 16 MiB (24 bits); what is longer is cut there.
pub fn file_tag(video: bool, ms: u32, body: &[u8]) -> Vec<u8> {
    let body = &body[..body.len().min(0xff_ffff)];
    let mut t = Vec::with_capacity(11 + body.len() + 4);
    t.push(if video { 9 } else { 8 });
    t.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    t.extend_from_slice(&ms.to_be_bytes()[1..]);
    t.push((ms >> 24) as u8);
    t.extend_from_slice(&[0, 0, 0]);
    t.extend_from_slice(body);
    t.extend_from_slice(&((11 + body.len()) as u32).to_be_bytes());
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_file_starts_with_its_header_and_each_tag_ends_with_its_size() {
        assert_eq!(file_header(true, true), *b"FLV\x01\x05\0\0\0\x09\0\0\0\0");
        assert_eq!(file_header(false, true)[4], 4);
        // 0x01020304 ms: the low 24 bits, then the high byte.
        let t = file_tag(true, 0x0102_0304, &[0x17, 1, 0, 0, 0]);
        assert_eq!(t[..11], [9, 0, 0, 5, 0x02, 0x03, 0x04, 0x01, 0, 0, 0]);
        assert_eq!(t[11..16], [0x17, 1, 0, 0, 0]);
        assert_eq!(t[16..], 16u32.to_be_bytes());
    }

    proptest! {
        #[test]
        fn a_tags_sizes_and_time_read_back(video: bool, ms: u32, body in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let t = file_tag(video, ms, &body);
            prop_assert_eq!(t.len(), 11 + body.len() + 4);
            prop_assert_eq!(t[0], if video { 9 } else { 8 });
            prop_assert_eq!(u32::from_be_bytes([0, t[1], t[2], t[3]]) as usize, body.len());
            prop_assert_eq!(u32::from_be_bytes([t[7], t[4], t[5], t[6]]), ms);
            prop_assert_eq!(&t[11..11 + body.len()], &body[..]);
            let prev = u32::from_be_bytes(t[t.len() - 4..].try_into().unwrap()) as usize;
            prop_assert_eq!(prev, t.len() - 4);
        }
    }

    #[test]
    fn an_avc_sequence_header_and_a_keyframe() {
        let sps = [0x67, 0x64, 0x00, 0x1f, 0xac];
        let pps = [0x68, 0xee, 0x3c, 0x80];
        let mut record = vec![1, 0x64, 0, 0x1f, 0xff, 0xe1, 0, sps.len() as u8];
        record.extend_from_slice(&sps);
        record.extend_from_slice(&[1, 0, pps.len() as u8]);
        record.extend_from_slice(&pps);
        let mut tag = vec![0x17, 0, 0, 0, 0];
        tag.extend_from_slice(&record);
        let Video::Config { codec, record } = video(&tag).unwrap() else { panic!("a config") };
        assert_eq!(codec, VideoCodec::Avc);
        let (sets, len) = parameter_sets(Codec::H264, record).unwrap();
        assert_eq!((sets, len), (vec![&sps[..], &pps[..]], 4));

        let frame = [0x17, 1, 0, 0, 80, 0, 0, 0, 2, 0x65, 0x88, 0, 0, 0, 1, 0x06];
        let Video::Frames { keyframe, cts, data, .. } = video(&frame).unwrap() else { panic!("frames") };
        assert_eq!((keyframe, cts), (true, 80));
        assert_eq!(nal_units(data, 4).unwrap(), vec![&[0x65, 0x88][..], &[0x06][..]]);
        // A negative composition offset.
        let frame = [0x27, 1, 0xff, 0xff, 0xd8];
        assert!(matches!(video(&frame).unwrap(), Video::Frames { keyframe: false, cts: -40, .. }));
    }

    #[test]
    fn enhanced_rtmp_hevc() {
        let mut config = vec![0x80 | 0x10, b'h', b'v', b'c', b'1'];
        let mut record = vec![0u8; 23];
        record[21] = 0x03;
        record[22] = 3;
        for (t, nal) in [(33u8, &[0x42, 0x01][..]), (32, &[0x40, 0x01]), (34, &[0x44, 0x01])] {
            record.extend_from_slice(&[t, 0, 1, 0, nal.len() as u8]);
            record.extend_from_slice(nal);
        }
        config.extend_from_slice(&record);
        let Video::Config { codec, record } = video(&config).unwrap() else { panic!() };
        assert_eq!(codec, VideoCodec::Hevc);
        let (sets, _) = parameter_sets(Codec::H265, record).unwrap();
        assert_eq!(sets, vec![&[0x40, 0x01][..], &[0x42, 0x01], &[0x44, 0x01]], "VPS, SPS, PPS");
        // CodedFramesX: no composition time.
        let frames = [0x80 | 0x10 | 3, b'h', b'v', b'c', b'1', 0, 0, 0, 1, 0x26];
        assert!(matches!(video(&frames).unwrap(), Video::Frames { codec: VideoCodec::Hevc, cts: 0, .. }));
    }

    #[test]
    fn aac_and_other_audio() {
        assert_eq!(audio(&[0xaf, 0, 0x12, 0x10]).unwrap(), Audio::AacConfig(&[0x12, 0x10]));
        // MP3: 44.1 kHz stereo and 22.05 kHz mono (MPEG-2) frames; the frame follows whole.
        let mut stereo = vec![0xff, 0xfb, 0x90, 0x44];
        stereo.resize(417, 0);
        assert_eq!(mp3_frame(&stereo)[..5], [0x2f, 0xff, 0xfb, 0x90, 0x44]);
        assert_eq!(mp3_frame(&[0xff, 0xf3, 0x80, 0xc4, 0])[0], 0x2a);
        assert_eq!(audio(&[0xaf, 1, 0x21]).unwrap(), Audio::AacFrame(&[0x21]));
        assert_eq!(audio(&[0x2f, 1]).unwrap(), Audio::Other(2));
        assert_eq!(audio(&[]), Err(FlvError::Short));
    }

    #[test]
    fn the_configurations_written_read_back() {
        let (vps, sps, pps) =
            ([0x40, 1, 0x0c], [0x42, 1, 1, 1, 0x60, 0, 0, 0, 0x90, 0, 0, 0, 0, 0, 0x5d], [0x44, 1, 0xc1]);
        let tag = video_config(Codec::H265, &[&vps, &sps, &pps]);
        let Video::Config { codec, record } = video(&tag).unwrap() else { panic!("a config") };
        assert_eq!(codec, VideoCodec::Hevc);
        assert_eq!(parameter_sets(Codec::H265, record).unwrap(), (vec![&vps[..], &sps[..], &pps[..]], 4));
        let (sps, pps) = ([0x67, 0x42, 0xc0, 0x1e], [0x68, 0xce]);
        let tag = video_config(Codec::H264, &[&sps, &pps]);
        let Video::Config { codec, record } = video(&tag).unwrap() else { panic!("a config") };
        assert_eq!(codec, VideoCodec::Avc);
        assert_eq!(parameter_sets(Codec::H264, record).unwrap(), (vec![&sps[..], &pps[..]], 4));
    }

    #[test]
    fn a_picture_written_reads_back_without_its_delimiter() {
        let annexb = [0, 0, 0, 1, 0x09, 0xf0, 0, 0, 0, 1, 0x65, 0x88, 0x84, 0, 0, 1, 0x06, 0x05];
        let tag = video_frame(Codec::H264, true, 40, &annexb);
        let Video::Frames { keyframe, cts, data, .. } = video(&tag).unwrap() else { panic!("frames") };
        assert_eq!((keyframe, cts), (true, 40));
        assert_eq!(nal_units(data, 4).unwrap(), vec![&[0x65, 0x88, 0x84][..], &[0x06, 0x05][..]]);
        let tag = video_frame(Codec::H265, false, -80, &[0, 0, 1, 0x02, 0x01, 0xd0]);
        assert!(matches!(
            video(&tag).unwrap(),
            Video::Frames { codec: VideoCodec::Hevc, keyframe: false, cts: -80, .. }
        ));
        assert_eq!(audio(&aac_config(&[0x11, 0x90])).unwrap(), Audio::AacConfig(&[0x11, 0x90]));
        assert_eq!(audio(&aac_frame(&[1, 2])).unwrap(), Audio::AacFrame(&[1, 2]));
    }

    proptest! {
        #[test]
        fn any_tag_parses_or_fails_without_panic(b in proptest::collection::vec(any::<u8>(), 0..64), size in 1usize..5) {
            if let Ok(Video::Config { codec, record }) = video(&b) {
                if let Some(c) = codec.annexb() {
                    let _ = parameter_sets(c, record);
                }
            }
            let _ = audio(&b);
            let _ = nal_units(&b, size);
        }
    }
}
