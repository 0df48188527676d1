//! An MP4 recording remuxed into MPEG-TS, so that a `file` source plays it exactly like a TS
//! recording: paced by the PCRs written here from the samples' own times, looped seamlessly,
//! repackaged for RTSP and HLS. Bytes in, bytes out.
//!
//! The MP4 is read by the `mp4` crate (boxes, sample tables). What this module adds is the
//! conversion: H.264 and H.265 samples from length-prefixed NAL units (avcC, hvcC) to Annex B
//! with an access unit delimiter, the parameter sets in front of every keyframe; AAC frames
//! get an ADTS header from the track's AudioSpecificConfig. The crate reads `hev1` sample
//! entries without their parameter sets and does not know `hvc1` (what Apple's players
//! want, so what most HEVC MP4s carry): for HEVC the `hvcC` is found here. Samples of all tracks go out in decoding
//! order; the composition offsets (B-frames) become PTS apart from DTS.

use crate::container::tsmux::{adts_header, AccessUnit, StreamKind, TsMuxer};
use std::io::Cursor;

/// Where the first sample lands on the 90 kHz timeline: the PCR runs
/// [`crate::container::tsmux::PCR_LEAD_90K`] behind, which must not go below zero.
const START_90K: u64 = 90_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mp4Error {
    #[error("not an MP4 file that can be read: {0}")]
    Parse(String),
    #[error("fragmented MP4 is not read; make it progressive without re-encoding (ffmpeg -i IN -c copy OUT.mp4)")]
    Fragmented,
    #[error("no H.264, H.265 or AAC track to play (tracks: {0})")]
    NoTrack(String),
    #[error("track {track}, sample {sample}: {why}")]
    Sample { track: u32, sample: u32, why: String },
}

/// One track we carry: its id in the MP4, how it is muxed, and what goes in front.
struct Track {
    id: u32,
    kind: StreamKind,
    timescale: u32,
    samples: u32,
    /// H.264 and H.265: the NAL length size and the parameter sets (Annex B); AAC: the
    /// AudioSpecificConfig.
    nal_len: usize,
    prefix: Vec<u8>,
}

/// The reader is a third-party parser of an operator's file: a panic in it (fuzzing finds
/// some, e.g. on a short `emsg`) is a bad file, not a crashed relay.
fn guarded<T>(f: impl FnOnce() -> Result<T, Mp4Error>) -> Result<T, Mp4Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(Mp4Error::Parse("malformed boxes (the reader gave up)".into())))
}

/// Where a box's children start, past its 8-byte header, for the boxes the reader descends
/// into: containers, full boxes with an entry count, and sample entries.
fn children_at(kind: &[u8]) -> Option<usize> {
    match kind {
        b"moov" | b"trak" | b"mdia" | b"minf" | b"stbl" | b"dinf" | b"edts" | b"udta" | b"mvex" | b"moof" | b"traf"
        | b"mfra" | b"ilst" => Some(0),
        b"meta" => Some(4),
        b"dref" | b"stsd" => Some(8),
        b"avc1" | b"avc3" | b"hev1" | b"hvc1" | b"vp09" | b"encv" => Some(78),
        b"mp4a" | b"enca" => Some(28),
        b"tx3g" => Some(38),
        _ => None,
    }
}

/// The box tree's sizes are sound: every box at least its header, none past its parent, no
/// size 0 ("to the end of the file"). The reader would loop forever on a box that does not
/// move it forward (found by fuzzing: a zero-size box inside `moov`).
fn check_boxes(b: &[u8], depth: usize) -> Result<(), Mp4Error> {
    let bad = |why: String| Err(Mp4Error::Parse(why));
    let mut at = 0usize;
    while at < b.len() {
        let Some(h) = b.get(at..at + 8) else { return bad(format!("a box header cut short at byte {at}")) };
        let kind = &h[4..8];
        let (size, header) = match u32::from_be_bytes([h[0], h[1], h[2], h[3]]) {
            0 => return bad(format!("a box of size 0 ({}): remux the file with ffmpeg -c copy", name(kind))),
            1 => {
                let Some(l) = b.get(at + 8..at + 16) else { return bad("a large box header cut short".into()) };
                (u64::from_be_bytes(l.try_into().expect("8 bytes")), 16u64)
            }
            n => (u64::from(n), 8),
        };
        if size < header || size > (b.len() - at) as u64 {
            return bad(format!("box {} of {size} bytes does not fit where it is", name(kind)));
        }
        let body = &b[at + header as usize..at + size as usize];
        if let (Some(skip), true) = (children_at(kind), depth < 16) {
            if let Some(children) = body.get(skip..) {
                check_boxes(children, depth + 1)?;
            }
        }
        at += size as usize;
    }
    Ok(())
}

fn name(kind: &[u8]) -> String {
    kind.iter().map(|&c| if c.is_ascii_graphic() { c as char } else { '?' }).collect()
}

/// The boxes one after the other in `b` (kind, body); stops at the first that does not fit.
pub(crate) fn boxes(mut b: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    std::iter::from_fn(move || {
        let size = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
        let (size, header) = match size {
            1 => (u64::from_be_bytes(b.get(8..16)?.try_into().ok()?), 16),
            n => (u64::from(n), 8),
        };
        if size < header || size > b.len() as u64 {
            return None;
        }
        let (kind, body) = (&b[4..8], &b[header as usize..size as usize]);
        b = &b[size as usize..];
        Some((kind, body))
    })
}

/// The body of the first box of this kind in `b`.
pub(crate) fn child<'a>(b: &'a [u8], kind: &[u8]) -> Option<&'a [u8]> {
    boxes(b).find(|(k, _)| *k == kind).map(|(_, body)| body)
}

/// The HEVC tracks: each one's id and the body of its `hvcC`.
fn hevc_configs(mp4: &[u8]) -> Vec<(u32, &[u8])> {
    let Some(moov) = child(mp4, b"moov") else { return Vec::new() };
    fn hevc(trak: &[u8]) -> Option<(u32, &[u8])> {
        let tkhd = child(trak, b"tkhd")?;
        // The track id follows the version, flags and two times (32 or 64 bits each).
        let at = if *tkhd.first()? == 1 { 20 } else { 12 };
        let id = u32::from_be_bytes(tkhd.get(at..at + 4)?.try_into().ok()?);
        let stsd = [b"mdia", b"minf", b"stbl", b"stsd"].iter().try_fold(trak, |b, k| child(b, *k))?;
        let (kind, entry) = boxes(stsd.get(8..)?).next()?;
        if kind != b"hvc1" && kind != b"hev1" {
            return None;
        }
        Some((id, child(entry.get(78..)?, b"hvcC")?))
    }
    boxes(moov).filter(|(k, _)| *k == b"trak").filter_map(|(_, t)| hevc(t)).collect()
}

/// An `hvcC` (ISO/IEC 14496-15 §8.3.3): the NAL length size, and the VPS, SPS and PPS in
/// Annex B.
pub(crate) fn hvcc(b: &[u8]) -> Result<(usize, Vec<u8>), crate::Invalid> {
    let short = || "hvcC cut short".to_string();
    let nal_len = usize::from(b.get(21).ok_or_else(short)? & 3) + 1;
    let arrays = *b.get(22).ok_or_else(short)?;
    let (mut at, mut prefix, mut have) = (23, Vec::new(), [false; 3]);
    for _ in 0..arrays {
        let h = b.get(at..at + 3).ok_or_else(short)?;
        let (kind, count) = (h[0] & 0x3f, u16::from_be_bytes([h[1], h[2]]));
        at += 3;
        for _ in 0..count {
            let l = b.get(at..at + 2).ok_or_else(short)?;
            let l = usize::from(u16::from_be_bytes([l[0], l[1]]));
            let nal = b.get(at + 2..at + 2 + l).ok_or_else(short)?;
            at += 2 + l;
            // VPS, SPS, PPS (SEI and the rest stay out).
            if let 32..=34 = kind {
                have[usize::from(kind - 32)] = true;
                prefix.extend_from_slice(&[0, 0, 0, 1]);
                prefix.extend_from_slice(nal);
            }
        }
    }
    match have {
        [true, true, true] => Ok((nal_len, prefix)),
        _ => Err("H.265 without its VPS, SPS and PPS (hvcC)".into()),
    }
}

/// The MPEG-TS of a progressive MP4 with an H.264 or H.265 and/or an AAC track (the first of
/// each; other tracks are left out).
pub fn remux(mp4: &[u8]) -> Result<Vec<u8>, Mp4Error> {
    check_boxes(mp4, 0)?;
    let mut r = guarded(|| {
        mp4::Mp4Reader::read_header(Cursor::new(mp4), mp4.len() as u64).map_err(|e| Mp4Error::Parse(e.to_string()))
    })?;
    if r.is_fragmented() {
        return Err(Mp4Error::Fragmented);
    }
    let mut ids: Vec<u32> = r.tracks().keys().copied().collect();
    ids.sort_unstable();
    let (mut video, mut audio, mut seen) = (None, None, Vec::new());
    let hevc = hevc_configs(mp4);
    for id in ids {
        let t = &r.tracks()[&id];
        let stsd = &t.trak.mdia.minf.stbl.stsd;
        let timescale = t.timescale().max(1);
        if let (Some((_, cfg)), None) = (hevc.iter().find(|h| h.0 == id), &video) {
            let (nal_len, prefix) = hvcc(cfg).map_err(|why| Mp4Error::Parse(format!("track {id}: {why}")))?;
            video = Some(Track { id, kind: StreamKind::H265, timescale, samples: t.sample_count(), nal_len, prefix });
        } else if let (Some(avc1), None) = (&stsd.avc1, &video) {
            let c = &avc1.avcc;
            let mut prefix = Vec::new();
            for nal in c.sequence_parameter_sets.iter().chain(&c.picture_parameter_sets) {
                prefix.extend_from_slice(&[0, 0, 0, 1]);
                prefix.extend_from_slice(&nal.bytes);
            }
            if c.sequence_parameter_sets.is_empty() || c.picture_parameter_sets.is_empty() {
                return Err(Mp4Error::Parse(format!("track {id}: H.264 without its parameter sets (avcC)")));
            }
            let nal_len = usize::from(c.length_size_minus_one & 3) + 1;
            video = Some(Track { id, kind: StreamKind::H264, timescale, samples: t.sample_count(), nal_len, prefix });
        } else if let (Some(esds), None) = (stsd.mp4a.as_ref().and_then(|a| a.esds.as_ref()), &audio) {
            let d = &esds.es_desc.dec_config.dec_specific;
            let asc = [(d.profile << 3) | (d.freq_index >> 1), ((d.freq_index & 1) << 7) | (d.chan_conf << 3)];
            if adts_header(&asc, 0).is_none() {
                return Err(Mp4Error::Parse(format!("track {id}: AAC configuration ADTS cannot carry")));
            }
            let samples = t.sample_count();
            audio = Some(Track { id, kind: StreamKind::AacAdts, timescale, samples, nal_len: 0, prefix: asc.to_vec() });
        } else {
            seen.push(format!("{id}: {}", t.media_type().map_or_else(|_| "unknown".into(), |m| m.to_string())));
        }
    }
    let tracks: Vec<Track> = video.into_iter().chain(audio).collect();
    if let Some(t) = tracks.iter().find(|t| t.samples as usize > mp4.len()) {
        return Err(Mp4Error::Parse(format!("track {} claims more samples than the file has bytes", t.id)));
    }
    if tracks.is_empty() {
        return Err(Mp4Error::NoTrack(if seen.is_empty() { "none".into() } else { seen.join(", ") }));
    }

    // Every sample's times on the 90 kHz timeline, then all in decoding order.
    let mut order: Vec<(u64, i64, usize, u32, bool)> = Vec::new(); // (dts, pts, track, sample, sync)
    for (ti, t) in tracks.iter().enumerate() {
        for sid in 1..=t.samples {
            let s = read(&mut r, t, sid)?;
            let scale = |v: i128| (v * 90_000 / i128::from(t.timescale)) as i64;
            let dts = scale(i128::from(s.start_time));
            let pts = scale(i128::from(s.start_time) + i128::from(s.rendering_offset));
            order.push((dts as u64, pts, ti, sid, s.is_sync));
        }
    }
    order.sort_by_key(|o| (o.0, o.2));
    // Shift so that no time is below the start (composition offsets may be negative).
    let lowest = order.iter().map(|o| o.1.min(o.0 as i64)).min().unwrap_or(0);
    let shift = START_90K as i64 - lowest.min(0);

    let kinds: Vec<StreamKind> = tracks.iter().map(|t| t.kind).collect();
    let mut mux = TsMuxer::new(&kinds);
    let mut out = Vec::with_capacity(mp4.len() + mp4.len() / 8);
    let mut data = Vec::new();
    for (dts, pts, ti, sid, sync) in order {
        let t = &tracks[ti];
        let s = read(&mut r, t, sid)?;
        data.clear();
        let key = match t.kind {
            StreamKind::AacAdts => {
                let h = adts_header(&t.prefix, s.bytes.len()).ok_or_else(|| Mp4Error::Sample {
                    track: t.id,
                    sample: sid,
                    why: "an AAC frame too large for ADTS".into(),
                })?;
                data.extend_from_slice(&h);
                data.extend_from_slice(&s.bytes);
                false
            }
            kind => {
                // An access unit delimiter: H.264's, or H.265's (type 35, any picture type).
                match kind {
                    StreamKind::H265 => data.extend_from_slice(&[0, 0, 0, 1, 0x46, 0x01, 0x50]),
                    _ => data.extend_from_slice(&[0, 0, 0, 1, 0x09, 0xf0]),
                }
                if sync {
                    data.extend_from_slice(&t.prefix);
                }
                annexb(&s.bytes, t.nal_len, &mut data).map_err(|why| Mp4Error::Sample {
                    track: t.id,
                    sample: sid,
                    why: why.0,
                })?;
                sync
            }
        };
        let (dts, pts) = ((dts as i64 + shift) as u64, (pts + shift) as u64);
        mux.push(&AccessUnit { stream: ti, pts, dts, key, data: &data }, &mut out);
    }
    Ok(out)
}

fn read(r: &mut mp4::Mp4Reader<Cursor<&[u8]>>, t: &Track, sid: u32) -> Result<mp4::Mp4Sample, Mp4Error> {
    guarded(|| match r.read_sample(t.id, sid) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err(Mp4Error::Sample { track: t.id, sample: sid, why: "missing".into() }),
        Err(e) => Err(Mp4Error::Sample { track: t.id, sample: sid, why: e.to_string() }),
    })
}

/// Length-prefixed NAL units (`len` bytes of length each) to Annex B, appended to `out`.
pub(crate) fn annexb(mut b: &[u8], len: usize, out: &mut Vec<u8>) -> Result<(), crate::Invalid> {
    while !b.is_empty() {
        let n = b.get(..len).ok_or("a NAL length cut short")?.iter().fold(0usize, |a, &x| (a << 8) | usize::from(x));
        let nal = b.get(len..len + n).ok_or("a NAL unit longer than its sample")?;
        out.extend_from_slice(&[0, 0, 0, 1]);
        out.extend_from_slice(nal);
        b = &b[len + n..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::tsdemux::Demux;
    use proptest::prelude::*;

    const SPS: &[u8] = &[0x67, 0x42, 0xc0, 0x1e, 0xda, 0x02, 0x80, 0xbf, 0xe5, 0x84, 0x00];
    const PPS: &[u8] = &[0x68, 0xce, 0x3c, 0x80];

    /// A progressive MP4 of `frames` H.264 samples (a keyframe every `gop`, 25 per second at
    /// timescale 90000... or 1000) and AAC frames of 1024 at 48 kHz, written by the `mp4`
    /// crate's own writer.
    fn mp4_file(frames: u32, gop: u32, video_timescale: u32, with_audio: bool) -> Vec<u8> {
        let cfg = mp4::Mp4Config {
            major_brand: str::parse("isom").unwrap(),
            minor_version: 512,
            compatible_brands: vec![str::parse("isom").unwrap(), str::parse("avc1").unwrap()],
            timescale: 1000,
        };
        let mut w = mp4::Mp4Writer::write_start(Cursor::new(Vec::new()), &cfg).unwrap();
        w.add_track(&mp4::TrackConfig {
            track_type: mp4::TrackType::Video,
            timescale: video_timescale,
            language: "und".into(),
            media_conf: mp4::MediaConfig::AvcConfig(mp4::AvcConfig {
                width: 320,
                height: 240,
                seq_param_set: SPS.to_vec(),
                pic_param_set: PPS.to_vec(),
            }),
        })
        .unwrap();
        if with_audio {
            w.add_track(&mp4::TrackConfig {
                track_type: mp4::TrackType::Audio,
                timescale: 48_000,
                language: "und".into(),
                media_conf: mp4::MediaConfig::AacConfig(mp4::AacConfig {
                    bitrate: 128_000,
                    profile: mp4::AudioObjectType::AacLowComplexity,
                    freq_index: mp4::SampleFreqIndex::Freq48000,
                    chan_conf: mp4::ChannelConfig::Stereo,
                }),
            })
            .unwrap();
        }
        let step = u64::from(video_timescale) / 25;
        for i in 0..frames {
            // A length-prefixed slice NAL whose bytes say which frame it is.
            let key = i % gop == 0;
            let nal = [if key { 0x65 } else { 0x41 }, 0x88, (i >> 8) as u8, i as u8];
            let mut bytes = (nal.len() as u32).to_be_bytes().to_vec();
            bytes.extend_from_slice(&nal);
            let s = mp4::Mp4Sample {
                start_time: u64::from(i) * step,
                duration: step as u32,
                rendering_offset: 0,
                is_sync: key,
                bytes: mp4::Bytes::from(bytes),
            };
            w.write_sample(1, &s).unwrap();
        }
        if with_audio {
            for i in 0..frames * 48_000 / 25 / 1024 {
                let s = mp4::Mp4Sample {
                    start_time: u64::from(i) * 1024,
                    duration: 1024,
                    rendering_offset: 0,
                    is_sync: true,
                    bytes: mp4::Bytes::from(vec![0x21, 0x10, i as u8]),
                };
                w.write_sample(2, &s).unwrap();
            }
        }
        w.write_end().unwrap();
        w.into_writer().into_inner()
    }

    /// The TS's PES packets: (pid, pts, payload).
    fn pes(ts: &[u8]) -> Vec<(u16, u64, Vec<u8>)> {
        let mut d = Demux::default();
        let mut v: Vec<_> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
        v.extend(d.flush());
        v.into_iter().map(|p| (p.pid, p.pts.unwrap_or(0), p.data)).collect()
    }

    #[test]
    fn h264_and_aac_come_out_as_timed_pes_with_parameter_sets_at_keyframes() {
        let ts = remux(&mp4_file(50, 25, 90_000, true)).unwrap();
        assert_eq!(ts.len() % 188, 0);
        let all = pes(&ts);
        let video: Vec<_> = all.iter().filter(|p| p.0 == 0x100).collect();
        let audio: Vec<_> = all.iter().filter(|p| p.0 == 0x101).collect();
        assert_eq!((video.len(), audio.len()), (50, 50 * 48_000 / 25 / 1024));
        // 25 frames a second on the 90 kHz clock, from the start; audio at 1024/48000.
        for (i, v) in video.iter().enumerate() {
            assert_eq!(v.1, START_90K + i as u64 * 3600, "frame {i}");
            let key = i % 25 == 0;
            let mut want = vec![0, 0, 0, 1, 0x09, 0xf0];
            if key {
                want.extend_from_slice(&[0, 0, 0, 1]);
                want.extend_from_slice(SPS);
                want.extend_from_slice(&[0, 0, 0, 1]);
                want.extend_from_slice(PPS);
            }
            want.extend_from_slice(&[0, 0, 0, 1, if key { 0x65 } else { 0x41 }, 0x88, 0, i as u8]);
            assert_eq!(v.2, want, "frame {i}");
        }
        assert_eq!(audio[2].1, START_90K + 2 * 1024 * 90_000 / 48_000);
        // ADTS: sync word, then the frame.
        assert_eq!((&audio[0].2[..2], &audio[0].2[7..]), (&[0xff, 0xf1][..], &[0x21, 0x10, 0][..]));
    }

    /// Two seconds of the demo in H.265 (B-frames, a keyframe a second) and its AAC, in MP4
    /// with `hvc1` (testdata/video/PROVENANCE.md).
    const HEVC_MP4: &[u8] = include_bytes!("../../../../testdata/video/hevc/demo-2s-hevc.mp4");

    fn hevc_nal_types(au: &[u8]) -> Vec<u8> {
        crate::codec::annexb::nal_units(au).map(|n| (n[0] >> 1) & 0x3f).collect()
    }

    /// Both sample entries HEVC comes in: `hvc1` (which the reader does not know) and `hev1`
    /// (which it reads without its parameter sets).
    #[test]
    fn hevc_comes_out_as_h265_pes_with_its_parameter_sets_at_keyframes() {
        let hev1 = {
            let mut b = HEVC_MP4.to_vec();
            let at = b.windows(4).position(|w| w == b"hvc1").expect("an hvc1 sample entry");
            b[at..at + 4].copy_from_slice(b"hev1");
            b
        };
        for (name, mp4) in [("hvc1", HEVC_MP4), ("hev1", &hev1[..])] {
            let ts = remux(mp4).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut d = Demux::default();
            let mut all: Vec<_> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
            all.extend(d.flush());
            assert_eq!(all.iter().filter(|p| p.stream_type == 0x0f).count(), 94, "{name}: every AAC frame");
            all.retain(|p| p.stream_type == crate::container::tsdemux::STREAM_TYPE_H265);
            assert_eq!(all.len(), 50, "{name}: every access unit");
            let mut keys = 0;
            for (i, p) in all.iter().enumerate() {
                let t = hevc_nal_types(&p.data);
                assert_eq!(t[0], 35, "{name}: AU {i} starts with a delimiter: {t:?}");
                // IRAP pictures (types 16..=23) get the VPS, SPS and PPS in front.
                if t.iter().any(|t| (16..=23).contains(t)) {
                    keys += 1;
                    assert_eq!(&t[1..4], &[32, 33, 34], "{name}: AU {i}: {t:?}");
                }
            }
            assert_eq!(keys, 2, "{name}: a keyframe a second");
            // Decoding order, with B-frames: DTS rises, PTS does not always.
            assert!(all.windows(2).all(|w| w[0].dts.or(w[0].pts) < w[1].dts.or(w[1].pts)), "{name}");
            assert!(all.windows(2).any(|w| w[0].pts > w[1].pts), "{name}: B-frames reordered");
        }
    }

    #[test]
    fn an_hvcc_without_its_parameter_sets_is_refused() {
        // 22 bytes of configuration, then one array: an SPS only.
        let mut b = vec![0u8; 22];
        b[21] = 3;
        b.extend_from_slice(&[1, 33, 0, 1, 0, 2, 0x42, 0x01]); // 1 array: type, count, length, NAL
        assert!(hvcc(&b).unwrap_err().0.contains("VPS, SPS and PPS"));
        assert!(hvcc(&b[..28]).unwrap_err().0.contains("cut short"));
        b.extend_from_slice(&[32, 0, 1, 0, 2, 0x40, 0x01, 34, 0, 1, 0, 2, 0x44, 0x01]);
        b[22] = 3;
        let (len, prefix) = hvcc(&b).unwrap();
        assert_eq!(len, 4);
        assert_eq!(prefix, [0, 0, 0, 1, 0x42, 0x01, 0, 0, 0, 1, 0x40, 0x01, 0, 0, 0, 1, 0x44, 0x01]);
    }

    /// Box trees the reader would loop on are refused before it sees them.
    #[test]
    fn unsound_box_sizes_are_refused() {
        // A zero-size box inside `moov` (the reader would skip it to where it is, forever).
        let mut hang = vec![0, 0, 0, 0x46];
        hang.extend_from_slice(b"moov");
        hang.resize(0x46, 0);
        let e = remux(&hang).unwrap_err().to_string();
        assert!(e.contains("size 0"), "{e}");
        let mut small = vec![0, 0, 0, 16];
        small.extend_from_slice(b"moov\0\0\0\x04free");
        assert!(remux(&small).unwrap_err().to_string().contains("does not fit"));
        assert!(check_boxes(&mp4_file(3, 1, 1000, true), 0).is_ok());
    }

    #[test]
    fn refusals_say_why() {
        assert!(matches!(remux(b"not an mp4 at all"), Err(Mp4Error::Parse(_))));
        assert!(matches!(remux(&[]), Err(Mp4Error::Parse(_))));
        let mut cut = mp4_file(10, 5, 1000, false);
        cut.truncate(cut.len() / 2);
        assert!(remux(&cut).is_err());
    }

    proptest! {
        /// Any frame count, GOP and timescale: every frame comes out once, in order, on the
        /// 90 kHz clock.
        #[test]
        fn every_frame_comes_out_once_in_order(frames in 1u32..120, gop in 1u32..60, scale in prop::sample::select(vec![1000u32, 12_800, 90_000])) {
            let ts = remux(&mp4_file(frames, gop, scale, false)).unwrap();
            let v = pes(&ts);
            prop_assert_eq!(v.len() as u32, frames);
            let step = u64::from(scale / 25) * 90_000 / u64::from(scale);
            for (i, p) in v.iter().enumerate() {
                prop_assert_eq!(p.1, START_90K + i as u64 * step);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = remux(&data);
        }
    }
}
