//! A playlist: MPEG-TS recordings played one after the other as one stream, for a `file`
//! source that names a directory. Bytes in, bytes out.
//!
//! Each recording's access units are taken out of its TS and muxed again into one program:
//! the same PIDs throughout, and times that run on from one recording to the next (each
//! starts where the last one's last picture and audio frame end), so a player sees one
//! stream with no seam. The result loops like any recording. Every recording must carry the
//! same tracks (the same video codec, audio or not): a player cannot follow a stream whose
//! tracks change under it. What is neither H.264, H.265 nor AAC is left out.

use crate::container::tsdemux::{Demux, Pes, STREAM_TYPE_H264, STREAM_TYPE_H265};
use crate::container::tsmux::{AccessUnit, StreamKind, TsMuxer};

/// Where the first access unit lands on the 90 kHz timeline (the PCR runs behind it).
const START_90K: u64 = 90_000;
/// ISO/IEC 13818-7 AAC in ADTS.
const STREAM_TYPE_AAC: u8 = 0x0f;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaylistError {
    #[error("a playlist needs at least one recording")]
    Empty,
    #[error("{0}: no H.264, H.265 or AAC with timestamps in it")]
    NothingToPlay(String),
    #[error("{name} carries {has}, but {first} carries {want}: every file of a playlist must carry the same tracks")]
    Mismatch { name: String, has: String, first: String, want: String },
}

/// One recording's access units by track, in file order: (pts, dts, data).
struct Recording {
    video: Option<(StreamKind, Vec<Pes>)>,
    audio: Vec<Pes>,
}

fn describe(r: &Recording) -> String {
    let video = match &r.video {
        Some((StreamKind::H265, _)) => "H.265",
        Some(_) => "H.264",
        None => "no video",
    };
    format!("{video}{}", if r.audio.is_empty() { "" } else { " + AAC" })
}

fn read(ts: &[u8]) -> Recording {
    let mut d = Demux::default();
    let mut pes: Vec<Pes> = ts.chunks(crate::container::mpegts::PACKET_LEN).filter_map(|p| d.push(p)).collect();
    pes.extend(d.flush());
    pes.retain(|p| p.pts.is_some() && !p.data.is_empty());
    // The first video stream (by the first of its access units), and the first AAC one.
    let kind = |st| match st {
        STREAM_TYPE_H264 => Some(StreamKind::H264),
        STREAM_TYPE_H265 => Some(StreamKind::H265),
        _ => None,
    };
    let video_pid = pes.iter().find(|p| kind(p.stream_type).is_some()).map(|p| (p.pid, kind(p.stream_type)));
    let audio_pid = pes.iter().find(|p| p.stream_type == STREAM_TYPE_AAC).map(|p| p.pid);
    let (mut video, mut audio) = (Vec::new(), Vec::new());
    for p in pes {
        if Some(p.pid) == video_pid.map(|v| v.0) {
            video.push(p);
        } else if Some(p.pid) == audio_pid {
            audio.push(p);
        }
    }
    Recording { video: video_pid.and_then(|(_, k)| k).map(|k| (k, video)), audio }
}

/// TS times are 33-bit counters of 90 kHz.
const WRAP: u64 = 1 << 33;

/// `t` against `base`, across a wrap of the 33-bit counter, either way.
fn since(t: u64, base: u64) -> i64 {
    let d = t.wrapping_sub(base) % WRAP;
    if d >= WRAP / 2 {
        d as i64 - WRAP as i64
    } else {
        d as i64
    }
}

/// A track's decoding times against `base`, and the end of its last access unit: its time
/// plus the step before it (a recording's pictures and audio frames come at a steady rate;
/// `default_step` for a track of one).
fn times(pes: &[Pes], base: u64, default_step: i64) -> (Vec<i64>, Option<i64>) {
    let t: Vec<i64> = pes.iter().map(|p| since(p.dts.or(p.pts).unwrap_or(0), base)).collect();
    let mut sorted = t.clone();
    sorted.sort_unstable();
    let step = sorted.windows(2).last().map_or(default_step, |w| w[1] - w[0]);
    let end = sorted.last().map(|l| l + step);
    (t, end)
}

/// Whether a video access unit starts a picture a decoder can begin at (IDR, IRAP).
fn is_key(kind: StreamKind, au: &[u8]) -> bool {
    crate::codec::annexb::nal_units(au).any(|n| match (kind, n.first()) {
        (StreamKind::H265, Some(b)) => (16..=23).contains(&((b >> 1) & 0x3f)),
        (_, Some(b)) => b & 0x1f == 5,
        _ => false,
    })
}

/// The recordings (a name for errors, the TS) as one MPEG-TS, one after the other. The
/// video runs on without a gap; audio keeps its place against the video, and the few audio
/// frames of a recording's start that would overlap the last one's end are left out.
pub fn concat(recordings: &[(String, Vec<u8>)]) -> Result<Vec<u8>, PlaylistError> {
    let all: Vec<(&str, Recording)> = recordings.iter().map(|(n, ts)| (n.as_str(), read(ts))).collect();
    let Some((first_name, first)) = all.first() else { return Err(PlaylistError::Empty) };
    let want = describe(first);
    for (name, r) in &all {
        if r.video.is_none() && r.audio.is_empty() {
            return Err(PlaylistError::NothingToPlay(name.to_string()));
        }
        let has = describe(r);
        if has != want {
            let (name, first) = (name.to_string(), first_name.to_string());
            return Err(PlaylistError::Mismatch { name, has, first, want: want.clone() });
        }
    }
    let mut kinds = Vec::new();
    if let Some((k, _)) = &first.video {
        kinds.push(*k);
    }
    let audio_index = kinds.len();
    if !first.audio.is_empty() {
        kinds.push(StreamKind::AacAdts);
    }
    let mut mux = TsMuxer::new(&kinds);
    let mut out = Vec::new();
    // Where the next recording starts, and where the last audio frame out ends.
    let (mut cursor, mut audio_floor) = (START_90K as i64, i64::MIN);
    for (_, r) in &all {
        let video = r.video.as_ref().map(|(k, v)| (*k, v));
        let first_pes = video.and_then(|v| v.1.first()).or(r.audio.first());
        let base = first_pes.map_or(0, |p| p.dts.or(p.pts).unwrap_or(0));
        let (vt, vend) = video.map_or((Vec::new(), None), |(_, v)| times(v, base, 3600));
        let (at, aend) = times(&r.audio, base, 1920);
        // The video's span where there is video: it must run on without a gap (audio that
        // begins before the first picture is placed before the cursor, against it).
        let start = match vt.iter().min() {
            Some(v) => *v,
            None => at.iter().copied().min().unwrap_or(0),
        };
        let end = vend.or(aend).unwrap_or(start);
        let shift = |t: i64| (cursor + t - start).rem_euclid(WRAP as i64) as u64;
        // Both tracks in decoding order, merged: (time, stream, access unit, keyframe).
        let mut units: Vec<(i64, usize, &Pes, bool)> = Vec::new();
        if let Some((k, v)) = video {
            units.extend(vt.iter().zip(v).map(|(t, p)| (*t, 0, p, is_key(k, &p.data))));
        }
        units.extend(at.iter().zip(&r.audio).map(|(t, p)| (*t, audio_index, p, false)));
        units.sort_by_key(|u| (u.0, u.1));
        let audio_step = at.windows(2).last().map_or(1920, |w| w[1] - w[0]);
        for (t, stream, p, key) in units {
            let pts = since(p.pts.unwrap_or(0), base);
            if stream == audio_index && kinds.len() > audio_index {
                if cursor + t - start < audio_floor {
                    continue;
                }
                // The next may not begin inside this one (half a frame of jitter allowed).
                audio_floor = cursor + t - start + audio_step / 2;
            }
            mux.push(&AccessUnit { stream, pts: shift(pts), dts: shift(t), key, data: &p.data }, &mut out);
        }
        cursor += end - start;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A TS of `frames` H.264 pictures 40 ms apart from `t0` (a keyframe every 25), and AAC
    /// frames of 1024 samples at 48 kHz over the same time if `audio`.
    fn recording(frames: u64, t0: u64, audio: bool) -> Vec<u8> {
        let kinds: &[StreamKind] = if audio { &[StreamKind::H264, StreamKind::AacAdts] } else { &[StreamKind::H264] };
        let mut mux = TsMuxer::new(kinds);
        let mut out = Vec::new();
        for i in 0..frames {
            let key = i % 25 == 0;
            let data = [0, 0, 0, 1, if key { 0x65 } else { 0x41 }, 0x88, i as u8];
            let t = t0 + i * 3600;
            mux.push(&AccessUnit { stream: 0, pts: t, dts: t, key, data: &data }, &mut out);
            if audio {
                let adts = crate::container::tsmux::adts_header(&[0x11, 0x90], 2).unwrap();
                let mut a = adts.to_vec();
                a.extend_from_slice(&[0x21, i as u8]);
                // Roughly two audio frames per picture (1920 of 3600 ticks each).
                for k in 0..2 {
                    let at = t + k * 1920;
                    mux.push(&AccessUnit { stream: 1, pts: at, dts: at, key: false, data: &a }, &mut out);
                }
            }
        }
        out
    }

    fn video_times(ts: &[u8]) -> Vec<u64> {
        let mut d = Demux::default();
        let mut v: Vec<Pes> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
        v.extend(d.flush());
        v.iter().filter(|p| p.stream_type == STREAM_TYPE_H264).map(|p| p.pts.unwrap()).collect()
    }

    #[test]
    fn recordings_run_on_from_each_other_without_a_seam() {
        // Three recordings whose own clocks start anywhere.
        let list = vec![
            ("a.ts".to_string(), recording(50, 1_000_000, true)),
            ("b.ts".to_string(), recording(30, 7, true)),
            ("c.ts".to_string(), recording(20, 5_000_000_000, true)),
        ];
        let ts = concat(&list).unwrap();
        let t = video_times(&ts);
        assert_eq!(t.len(), 100, "every picture once");
        assert_eq!(t[0], START_90K);
        assert!(t.windows(2).all(|w| w[1] - w[0] == 3600), "one step throughout: {t:?}");
        // Audio comes along, as many frames as went in.
        let mut d = Demux::default();
        let mut all: Vec<Pes> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
        all.extend(d.flush());
        // Audio comes along, every frame, in order.
        let audio: Vec<u64> = all.iter().filter(|p| p.stream_type == STREAM_TYPE_AAC).map(|p| p.pts.unwrap()).collect();
        assert_eq!(audio.len(), 200);
        assert!(audio.windows(2).all(|w| w[1] > w[0]), "{audio:?}");
    }

    /// A recording whose audio (steady 1024-sample frames at 48 kHz) runs `tail` frames past
    /// the end of its last picture: those would overlap the next recording's start.
    fn with_audio_tail(frames: u64, t0: u64, tail: u64) -> Vec<u8> {
        let mut mux = TsMuxer::new(&[StreamKind::H264, StreamKind::AacAdts]);
        let mut out = Vec::new();
        let mut a = crate::container::tsmux::adts_header(&[0x11, 0x90], 2).unwrap().to_vec();
        a.extend_from_slice(&[0x21, 0]);
        let audio_frames = frames * 3600 / 1920 + tail;
        let (mut v, mut k) = (0, 0);
        while v < frames || k < audio_frames {
            if v < frames && (k >= audio_frames || v * 3600 <= k * 1920) {
                let data = [0, 0, 0, 1, if v == 0 { 0x65 } else { 0x41 }, 0x88];
                let t = t0 + v * 3600;
                mux.push(&AccessUnit { stream: 0, pts: t, dts: t, key: v == 0, data: &data }, &mut out);
                v += 1;
            } else {
                let t = t0 + k * 1920;
                mux.push(&AccessUnit { stream: 1, pts: t, dts: t, key: false, data: &a }, &mut out);
                k += 1;
            }
        }
        out
    }

    #[test]
    fn audio_that_would_overlap_the_next_recording_is_left_out() {
        let list =
            vec![("a.ts".to_string(), with_audio_tail(25, 0, 3)), ("b.ts".to_string(), with_audio_tail(25, 0, 0))];
        let ts = concat(&list).unwrap();
        let mut d = Demux::default();
        let mut all: Vec<Pes> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
        all.extend(d.flush());
        let audio: Vec<u64> = all.iter().filter(|p| p.stream_type == STREAM_TYPE_AAC).map(|p| p.pts.unwrap()).collect();
        // b's first frames fell where a's tail was: as many left out as overlap.
        assert!(audio.windows(2).all(|w| w[1] >= w[0] + 960), "in order, none inside another: {audio:?}");
        assert!(audio.len() < 2 * 46 + 3 && audio.len() >= 2 * 46, "{}", audio.len());
        assert_eq!(video_times(&ts).windows(2).filter(|w| w[1] - w[0] != 3600).count(), 0, "the video runs on");
    }

    #[test]
    fn recordings_with_other_tracks_are_refused_with_why() {
        let list = vec![("a.ts".to_string(), recording(10, 0, true)), ("b.ts".to_string(), recording(10, 0, false))];
        let e = concat(&list).unwrap_err().to_string();
        assert!(e.contains("b.ts carries H.264, but a.ts carries H.264 + AAC"), "{e}");
        assert_eq!(concat(&[]), Err(PlaylistError::Empty));
        let junk = vec![("x.ts".to_string(), vec![0x47; 188 * 3])];
        assert_eq!(concat(&junk), Err(PlaylistError::NothingToPlay("x.ts".into())));
    }

    proptest! {
        /// Any lengths and starting times: the pictures come out once each, 40 ms apart.
        #[test]
        fn any_lengths_and_starts_play_as_one(parts in proptest::collection::vec((1u64..60, 0u64..(1 << 33)), 1..5)) {
            let list: Vec<_> = parts.iter().enumerate().map(|(i, (n, t0))| (format!("{i}.ts"), recording(*n, *t0, false))).collect();
            let t = video_times(&concat(&list).unwrap());
            prop_assert_eq!(t.len() as u64, parts.iter().map(|p| p.0).sum::<u64>());
            prop_assert!(t.windows(2).all(|w| w[1].wrapping_sub(w[0]) % WRAP == 3600), "{:?}", t);
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let _ = concat(&[("x".to_string(), data)]);
        }
    }
}
