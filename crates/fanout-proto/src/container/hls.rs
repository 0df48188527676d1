//! HLS with fragmented MP4 segments (RFC 8216): a repackager's access units are cut into
//! segments at video keyframes once a target duration is reached, kept in a sliding window,
//! and listed in a media playlist. With a part target, each segment is built of partial
//! segments (Low-Latency HLS, RFC 8216bis): one `moof` + `mdat` fragment each, published as
//! soon as it is complete, so a player can be a part's length behind instead of a segment's.
//! Or, for set-top boxes and players without fMP4, MPEG-TS segments (HLS version 3): the
//! same cuts, each segment the transport packets from one keyframe's tables to the next
//! cut's. Sans-IO: units in, segments, parts and playlist text out.

use crate::container::fmp4::{avcc_sample, brings_other_sets, init_segment, media_segment, Fmp4Track, Sample};
use crate::container::repack::{TrackCodec, TrackInfo, TsPackager, Unit};
use bytes::Bytes;
use std::collections::VecDeque;

/// Segments kept (and listed): at the default 2 s, 12 s of the stream.
pub const WINDOW: usize = 6;
/// Samples held for one segment beyond this many bytes: a stream without keyframes; the
/// segment is dropped rather than grown without bound.
const MAX_PENDING: usize = 64 << 20;

/// One segment. Its bytes are held once: its parts are slices of them (served without a
/// copy: a request takes a reference).
#[derive(Debug, Clone)]
pub struct Segment {
    pub sequence: u64,
    /// Where it starts on the source's 90 kHz timeline.
    pub start: i64,
    /// Seconds.
    pub duration: f64,
    /// Its parts' fragments, one after another.
    pub data: Bytes,
    pub parts: Vec<Part>,
}

/// A partial segment: one fragment of a segment.
#[derive(Debug, Clone)]
pub struct Part {
    /// Seconds.
    pub duration: f64,
    /// It starts with a keyframe (or holds audio only): a player may start here.
    pub independent: bool,
    pub data: Bytes,
}

/// How far the segmenter has come: segments up to `last` are complete, and segment
/// `last + 1` has `parts` parts so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub last: u64,
    pub parts: usize,
}

impl Progress {
    /// Whether part `part` of segment `sequence` (`None`: the whole segment) exists.
    pub fn has(&self, sequence: u64, part: Option<usize>) -> bool {
        sequence <= self.last || (sequence == self.last + 1 && part.is_some_and(|p| p < self.parts))
    }
}

/// What a stream's segments are made of (MediaMTX's `hlsVariant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Variant {
    /// fMP4 segments of parts: Low-Latency HLS, a part's length behind live.
    #[default]
    LowLatency,
    /// fMP4 segments, whole.
    Fmp4,
    /// MPEG-TS segments, for players that know no fMP4.
    MpegTs,
}

impl Variant {
    /// The media segments' file extension and content type.
    pub fn segment_file(self) -> (&'static str, &'static str) {
        match self {
            Variant::MpegTs => ("ts", "video/mp2t"),
            _ => ("m4s", "video/mp4"),
        }
    }
}

/// MPEG-TS segments in the making: the packager, and the segment being gathered.
struct TsCut {
    pack: TsPackager,
    buf: Vec<u8>,
    /// A keyframe past the target came at this time: the segment ends at the tables that
    /// come in front of it (the packager may hold pictures before it, for B-frames).
    due: Option<i64>,
    /// What is gathered is to be dropped at the next cut, not published (it began with no
    /// keyframe, after a segment was dropped).
    discard: bool,
}

/// The first packet of `ts` that carries the PAT: where a keyframe's tables begin.
fn pat_at(ts: &[u8]) -> Option<usize> {
    ts.chunks(188).position(|p| p.len() == 188 && p[1] & 0x1f == 0 && p[2] == 0).map(|k| k * 188)
}

/// What a stream of the repackager becomes here.
#[derive(Debug, Clone)]
enum Input {
    /// A video track: its index among the file's tracks, and the codec (its sample entry
    /// comes from the first keyframe).
    Video(usize, TrackCodec),
    /// An audio track: its index and sample entry.
    Audio(usize, Fmp4Track),
    /// Not carried (AAC of an object type or rate fMP4 here does not describe; in MPEG-TS
    /// segments, a codec MPEG-TS does not carry).
    Skip,
}

/// Where the first keyframe sits on a file's timeline (90 kHz): decoding times may come
/// before its presentation by up to this much (B-frames reordered up to a second).
const REORDER_ROOM: i64 = 90_000;

/// The segmenter of one session.
pub struct Segmenter {
    inputs: Vec<Input>,
    /// The file's tracks, known once the first keyframe brought its parameter sets.
    tracks: Option<Vec<Fmp4Track>>,
    /// The video's parameters changed since the initialization: its sets stay in band.
    sets_in_band: bool,
    init: Option<Bytes>,
    /// The first keyframe's 90 kHz time: nothing earlier is taken. It is [`REORDER_ROOM`]
    /// into the file's timeline, which leaves room for decoding times before it.
    origin: Option<i64>,
    /// How far the video's decoding runs ahead of its presentation (B-frames), 90 kHz: the
    /// most seen so far.
    reorder: i64,
    /// Per file track: samples of the segment being gathered, with their 90 kHz times.
    pending: Vec<Vec<(i64, bool, Vec<u8>)>>,
    pending_bytes: usize,
    /// When the segment being gathered started (90 kHz).
    started: Option<i64>,
    target: i64,
    /// Parts: their target length (90 kHz; 0: none), when the one being gathered started,
    /// the segment's parts so far, and the gap between the last two video pictures (a part
    /// is cut a picture before it would outgrow its target).
    part_target: i64,
    part_started: Option<i64>,
    parts: Vec<Part>,
    frame_gap: i64,
    /// The last picture's presentation time (audio frame's, without video), and the latest
    /// of the pending ones'.
    last_video: Option<i64>,
    latest_pending: i64,
    /// Fragments made, for their `mfhd` numbers.
    fragments: u32,
    segments: VecDeque<Segment>,
    next: u64,
    has_video: bool,
    /// Segments dropped for want of a keyframe.
    pub dropped: u64,
    /// The stream ended ([`Segmenter::finish`]): the playlist says so.
    ended: bool,
    /// Audio that came before the first keyframe: a packet of several frames arrives at its
    /// first frame's time, so frames due after the keyframe may come before it.
    early: VecDeque<Unit>,
    /// MPEG-TS segments instead of fMP4's.
    ts: Option<TsCut>,
}

/// The most audio frames kept from before the first keyframe.
const EARLY_AUDIO: usize = 32;

impl Segmenter {
    /// A segmenter for a repackager's streams, cutting at `target_ms` or the next keyframe
    /// after it, numbering segments from `first` (a caller restarting a stream starts past
    /// the numbers it used, so that a cache never serves an old segment under a new name);
    /// `None` if no stream can go into fragmented MP4 (H.264 and AAC can).
    pub fn new(streams: &[TrackInfo], target_ms: u32, first: u64) -> Option<Self> {
        Self::with_parts(streams, target_ms, 0, first)
    }

    /// The segmenter of a `variant`: Low-Latency with parts of at most `part_ms`, else
    /// whole segments.
    pub fn of(variant: Variant, streams: &[TrackInfo], target_ms: u32, part_ms: u32, first: u64) -> Option<Self> {
        let mut s =
            Self::with_parts(streams, target_ms, if variant == Variant::LowLatency { part_ms } else { 0 }, first)?;
        if variant == Variant::MpegTs {
            s.ts = Some(TsCut { pack: TsPackager::new(streams), buf: Vec::new(), due: None, discard: false });
            for (input, stream) in s.inputs.iter_mut().zip(streams) {
                if stream.kind().is_none() {
                    *input = Input::Skip;
                }
            }
            s.has_video = s.inputs.iter().any(|i| matches!(i, Input::Video(..)));
        }
        Some(s)
    }

    pub fn variant(&self) -> Variant {
        match (&self.ts, self.part_target) {
            (Some(_), _) => Variant::MpegTs,
            (None, 0) => Variant::Fmp4,
            (None, _) => Variant::LowLatency,
        }
    }

    /// Leaves stream `stream` out of the segments (a track the relay made for players that
    /// cannot take another, which fMP4 carries as it came); before any unit is pushed.
    pub fn leave_out(&mut self, stream: usize) {
        if let Some(input) = self.inputs.get_mut(stream) {
            *input = Input::Skip;
        }
        let mut n = 0;
        for input in &mut self.inputs {
            match input {
                Input::Video(t, _) | Input::Audio(t, _) => {
                    *t = n;
                    n += 1;
                }
                Input::Skip => {}
            }
        }
        self.pending.truncate(n);
        self.has_video = self.inputs.iter().any(|i| matches!(i, Input::Video(..)));
    }

    /// As [`Segmenter::new`], each segment made of parts of at most `part_ms` (0: whole
    /// segments only); a part ends early at a segment's keyframe.
    pub fn with_parts(streams: &[TrackInfo], target_ms: u32, part_ms: u32, first: u64) -> Option<Self> {
        let mut n = 0;
        let mut next = || {
            n += 1;
            n - 1
        };
        let inputs: Vec<Input> = streams
            .iter()
            .map(|s| match &s.codec {
                TrackCodec::Aac { config, .. } => {
                    let c = u16::from_be_bytes([config[0], config.get(1).copied().unwrap_or(0)]);
                    let rate = crate::codec::aac::sample_rate(((c >> 7) & 0x0f) as u8);
                    match rate {
                        Some(sample_rate) if (1..=4).contains(&(c >> 11)) => Input::Audio(
                            next(),
                            Fmp4Track::Aac { config: config.clone(), sample_rate, channels: (c >> 3) & 0x0f },
                        ),
                        _ => Input::Skip,
                    }
                }
                TrackCodec::Opus { channels } => Input::Audio(next(), Fmp4Track::Opus { channels: *channels }),
                // (Its rate comes with its first frame.)
                TrackCodec::Mpa => Input::Audio(next(), Fmp4Track::Mp3 { mpeg1: true, sample_rate: 0, channels: 0 }),
                TrackCodec::G711 { mu_law } => {
                    Input::Audio(next(), Fmp4Track::G711 { mu_law: *mu_law, sample_rate: s.clock, channels: 1 })
                }
                video => Input::Video(next(), video.clone()),
            })
            .collect();
        let tracks = n;
        if tracks == 0 {
            return None;
        }
        let has_video = inputs.iter().any(|i| matches!(i, Input::Video(..)));
        Some(Self {
            inputs,
            tracks: None,
            init: None,
            origin: None,
            reorder: 0,
            pending: vec![Vec::new(); tracks],
            pending_bytes: 0,
            started: None,
            target: i64::from(target_ms) * 90,
            part_target: i64::from(part_ms.min(target_ms)) * 90,
            part_started: None,
            parts: Vec::new(),
            frame_gap: 0,
            last_video: None,
            latest_pending: i64::MIN,
            fragments: 0,
            segments: VecDeque::new(),
            next: first.max(1),
            has_video,
            dropped: 0,
            ended: false,
            early: VecDeque::new(),
            ts: None,
            sets_in_band: false,
        })
    }

    /// Takes one unit; returns whether it completed a part or a segment.
    pub fn push(&mut self, u: &Unit) -> bool {
        // (A stream that goes on after its end, a publisher back late, is live again.)
        self.ended = false;
        let Some(input) = self.inputs.get(u.stream).cloned() else { return false };
        let (track, video) = match input {
            Input::Video(t, codec) => (t, Some(codec)),
            Input::Audio(track, _) => (track, None),
            Input::Skip => return false,
        };
        let is_video = video.is_some();
        if self.ts.is_some() {
            return self.push_ts(u, is_video);
        }
        if self.tracks.is_none() {
            if self.has_video && !is_video {
                if self.early.len() == EARLY_AUDIO {
                    self.early.pop_front();
                }
                self.early.push_back(u.clone());
                return false;
            }
            // Start at a keyframe that brings its parameter sets (or anywhere, audio only).
            if (self.has_video && !u.key) || !self.describe(u) {
                return false;
            }
            self.origin = Some(u.time);
            self.started = Some(u.time);
            self.part_started = Some(u.time);
            let cut = self.push(u);
            // Each audio frame goes by its own time: those due from the keyframe on are taken.
            for e in std::mem::take(&mut self.early) {
                self.push(&e);
            }
            return cut;
        }
        let origin = self.origin.expect("set with the tracks");
        if u.time < origin {
            return false;
        }
        // Audio's times only go forward (a sample's duration is the step to the next); video's
        // are presentation times, which B-frames take back (never to the same time).
        if self.pending[track].last().is_some_and(|p| u.time <= p.0 && !(is_video && u.time != p.0)) {
            return false;
        }
        let mut cut = false;
        let cut_here = if self.has_video { is_video && u.key } else { true };
        if cut_here && self.started.is_some_and(|s| u.time - s >= self.target) {
            cut = self.cut(u.time);
        } else if self.part_due(u, is_video) {
            cut = self.cut_part(u.time, false);
        }
        // The units parts are cut before: pictures, or audio frames where there is no video.
        if is_video || !self.has_video {
            if let Some(prev) = self.last_video.filter(|&p| u.time > p) {
                self.frame_gap = u.time - prev;
            }
            self.last_video = Some(u.time);
            self.latest_pending = self.latest_pending.max(u.time);
        }
        let data = match video {
            Some(TrackCodec::Video { codec, .. }) => {
                if !self.sets_in_band && u.key {
                    let described = self.tracks.as_ref().and_then(|t| t.get(track)).map(Fmp4Track::parameter_sets);
                    self.sets_in_band = brings_other_sets(&u.data, codec, &described.unwrap_or_default());
                }
                avcc_sample(&u.data, codec, self.sets_in_band)
            }
            _ => u.data.clone(),
        };
        self.pending_bytes += data.len();
        self.pending[track].push((u.time, u.key || !is_video, data));
        if self.pending_bytes > MAX_PENDING {
            self.pending.iter_mut().for_each(Vec::clear);
            self.pending_bytes = 0;
            self.parts.clear();
            self.dropped += 1;
            self.started = None;
            self.part_started = None;
        }
        if self.started.is_none() && cut_here {
            self.started = Some(u.time);
            self.part_started = Some(u.time);
        }
        cut
    }

    /// [`Segmenter::push`] for MPEG-TS segments: from the first keyframe (or any audio frame
    /// where there is no video), every unit through the packager; a segment is cut at the
    /// tables of the first keyframe past the target (audio only: before the frame past it,
    /// with tables of its own).
    fn push_ts(&mut self, u: &Unit, is_video: bool) -> bool {
        let cut_here = if self.has_video { is_video && u.key } else { true };
        if self.tracks.is_none() {
            if !cut_here || !self.describe(u) {
                return false;
            }
            self.origin = Some(u.time);
            self.started = Some(u.time);
        }
        if self.origin.is_some_and(|o| u.time < o) {
            return false;
        }
        if is_video || !self.has_video {
            if let Some(prev) = self.last_video.filter(|&p| u.time > p) {
                self.frame_gap = u.time - prev;
            }
            self.last_video = Some(u.time);
        }
        self.latest_pending = self.latest_pending.max(u.time);
        let ts = self.ts.as_mut().expect("MPEG-TS segments");
        if cut_here && ts.due.is_none() && self.started.is_none_or(|s| u.time - s >= self.target) {
            ts.due = Some(u.time);
        }
        let mut out = Vec::new();
        let mut cut = false;
        if !self.has_video && ts.due.is_some() {
            // No keyframe to bring tables: the segment ends before this frame, and the next
            // one starts with tables of its own.
            let end = ts.due.take().expect("due");
            cut = self.close_ts(end, Vec::new());
            let ts = self.ts.as_mut().expect("MPEG-TS segments");
            ts.pack.tables(&mut out);
        }
        let ts = self.ts.as_mut().expect("MPEG-TS segments");
        ts.pack.write(u, &mut out);
        match ts.due.and_then(|end| Some((end, pat_at(&out)?))) {
            Some((end, at)) => {
                ts.due = None;
                ts.buf.extend_from_slice(&out[..at]);
                out.drain(..at);
                cut = self.close_ts(end, out);
            }
            None => ts.buf.extend_from_slice(&out),
        }
        let ts = self.ts.as_mut().expect("MPEG-TS segments");
        if ts.buf.len() > MAX_PENDING {
            ts.buf.clear();
            ts.discard = true;
            self.dropped += 1;
            self.started = None;
        }
        cut
    }

    /// Publishes the gathered MPEG-TS as the segment that ends at `end` (unless it is to be
    /// dropped), and starts the next one with `next`.
    fn close_ts(&mut self, end: i64, next: Vec<u8>) -> bool {
        let ts = self.ts.as_mut().expect("MPEG-TS segments");
        let data = std::mem::replace(&mut ts.buf, next);
        let discard = std::mem::take(&mut ts.discard);
        let start = self.started.replace(end);
        let Some(start) = start.filter(|_| !discard && !data.is_empty()) else { return false };
        let sequence = self.next;
        self.next += 1;
        let duration = (end - start) as f64 / 90_000.0;
        self.segments.push_back(Segment { sequence, start, duration, data: data.into(), parts: Vec::new() });
        while self.segments.len() > WINDOW {
            self.segments.pop_front();
        }
        true
    }

    /// Whether a part ends before `u`: the part would outgrow its target with another
    /// picture, and (video) `u` is shown after every pending picture, so that B-frames shown
    /// before it stay in the part and its decoding times follow on from the last part's.
    fn part_due(&self, u: &Unit, is_video: bool) -> bool {
        if self.part_target == 0 || (self.has_video && !is_video) {
            return false;
        }
        let Some(start) = self.part_started else { return false };
        u.time - start + self.frame_gap > self.part_target && (!is_video || u.time > self.latest_pending)
    }

    /// The file's tracks from the first keyframe's parameter sets and the audio configs.
    fn describe(&mut self, u: &Unit) -> bool {
        let mut tracks = Vec::new();
        for (stream, input) in self.inputs.iter().enumerate() {
            match input {
                Input::Video(_, TrackCodec::Video { codec: crate::codec::annexb::Codec::H265, .. }) => {
                    let nals: Vec<&[u8]> = crate::codec::annexb::nal_units(&u.data).collect();
                    let find = |t: u8| nals.iter().find(|n| n.first().is_some_and(|b| (b >> 1) & 0x3f == t));
                    let (Some(vps), Some(sps), Some(pps)) = (find(32), find(33), find(34)) else { return false };
                    let Some(info) = crate::codec::hevc::parse_sps(sps) else { return false };
                    tracks.push(Fmp4Track::H265 { vps: vps.to_vec(), sps: sps.to_vec(), pps: pps.to_vec(), info });
                }
                Input::Video(_, TrackCodec::Vp9) => {
                    let Some(f) = crate::codec::vpx::vp9_frame_header(&u.data) else { return false };
                    let Some(format) = f.format else { return false };
                    tracks.push(Fmp4Track::Vp9 { profile: f.profile, format });
                }
                Input::Video(_, TrackCodec::Av1) => {
                    let Some((header, obu)) = crate::codec::av1::sized_obus(&u.data)
                        .filter(|o| o.0 == crate::codec::av1::OBU_SEQUENCE_HEADER)
                        .find_map(|(_, obu, payload)| Some((crate::codec::av1::SequenceHeader::parse(payload)?, obu)))
                    else {
                        return false;
                    };
                    tracks.push(Fmp4Track::Av1 { header, obu: obu.to_vec() });
                }
                Input::Video(..) => {
                    let nals: Vec<&[u8]> = crate::codec::annexb::nal_units(&u.data).collect();
                    let find = |t: u8| nals.iter().find(|n| n.first().is_some_and(|b| b & 0x1f == t));
                    let (Some(sps), Some(pps)) = (find(7), find(8)) else { return false };
                    let (width, height) = crate::codec::annexb::sps_dimensions(sps).unwrap_or((0, 0));
                    tracks.push(Fmp4Track::H264 { sps: sps.to_vec(), pps: pps.to_vec(), width, height });
                }
                Input::Audio(_, Fmp4Track::Mp3 { .. }) => {
                    // Described by a frame of its own: this one, or one held from before the
                    // keyframe; none yet, and the file waits for the next keyframe.
                    let frame = if u.stream == stream {
                        Some(&u.data)
                    } else {
                        self.early.iter().find(|e| e.stream == stream).map(|e| &e.data)
                    };
                    let Some(h) = frame.and_then(|f| crate::codec::mpa::frame_header(f)) else { return false };
                    tracks.push(Fmp4Track::Mp3 { mpeg1: h.mpeg1, sample_rate: h.sample_rate, channels: h.channels });
                }
                Input::Audio(_, track) => tracks.push(track.clone()),
                Input::Skip => {}
            }
        }
        self.init = Some(init_segment(&tracks).into());
        self.tracks = Some(tracks);
        self.sets_in_band = false;
        true
    }

    /// Ends the segment being gathered at `end` (90 kHz), its last part with it.
    fn cut(&mut self, end: i64) -> bool {
        let Some(start) = self.started.take() else { return false };
        if !self.cut_part(end, true) {
            return false;
        }
        self.part_started = Some(end);
        let mut parts = std::mem::take(&mut self.parts);
        let sequence = self.next;
        self.next += 1;
        // The parts joined once; each part then becomes a slice of the segment.
        let data = Bytes::from(parts.iter().map(|p| &p.data[..]).collect::<Vec<_>>().concat());
        let mut at = 0;
        for p in &mut parts {
            p.data = data.slice(at..at + p.data.len());
            at += p.data.len();
        }
        self.segments.push_back(Segment { sequence, start, duration: (end - start) as f64 / 90_000.0, data, parts });
        while self.segments.len() > WINDOW {
            self.segments.pop_front();
        }
        true
    }

    /// Ends the part being gathered at `end` (90 kHz): one fragment of every sample before it.
    /// `at_keyframe`: `end` is a keyframe's time, where decoding starts afresh; elsewhere the
    /// next picture may be shown after B-frames still to come, and the last picture of the
    /// part lasts one frame.
    fn cut_part(&mut self, end: i64, at_keyframe: bool) -> bool {
        let (Some(start), Some(tracks), Some(origin)) = (self.part_started.take(), &self.tracks, self.origin) else {
            return false;
        };
        self.part_started = Some(end);
        let mut independent = !self.has_video;
        let mut parts = Vec::with_capacity(tracks.len());
        for (t, pending) in tracks.iter().zip(&mut self.pending) {
            let scale = i64::from(t.timescale());
            let to_track = |time: i64| ((time - origin + REORDER_ROOM).max(0) * scale / 90_000) as u64;
            let video = !t.is_audio();
            // Video: everything before the keyframe that cuts, in decoding order (B-frames
            // shown before `end` come after it, none before); audio: what starts before `end`.
            let take =
                if video { pending.len() } else { pending.iter().position(|p| p.0 >= end).unwrap_or(pending.len()) };
            let samples: Vec<(i64, bool, Vec<u8>)> = pending.drain(..take).collect();
            if video {
                independent = samples.first().is_some_and(|s| s.1);
            }
            // Decoding times: the presentation times in order, taken in decoding order, moved
            // back by the reordering (RTP carries no decoding times). The reordering is the
            // most any picture of the stream was shown ahead of its place, so times only grow.
            let mut shown: Vec<i64> = samples.iter().map(|s| s.0).collect();
            shown.sort_unstable();
            if video {
                let ahead = shown.iter().zip(&samples).map(|(d, s)| d - s.0).max().unwrap_or(0);
                self.reorder = self.reorder.max(ahead).min(REORDER_ROOM);
            }
            let lag = if video { self.reorder } else { 0 };
            let dts = |k: usize| if video { shown[k] - lag } else { samples[k].0 };
            let base = if samples.is_empty() { to_track(start - lag) } else { to_track(dts(0)) };
            let mut out = Vec::with_capacity(samples.len());
            for (k, (time, key, data)) in samples.iter().enumerate() {
                let duration = match (video, samples.get(k + 1)) {
                    (false, _) => u64::from(t.audio_duration(data)),
                    // (Saturating: times that make no sense, from a broken source, give
                    // nonsense durations, not a panic.)
                    (true, Some(_)) => to_track(dts(k + 1)).saturating_sub(to_track(dts(k))),
                    (true, None) => {
                        let to_end = to_track(end - lag).saturating_sub(to_track(dts(k)));
                        // One frame: the least step between the part's presentation times.
                        let frame = shown.windows(2).map(|w| w[1] - w[0]).filter(|&d| d > 0).min();
                        match frame.filter(|_| !at_keyframe) {
                            Some(f) => to_track(dts(k) + f).saturating_sub(to_track(dts(k))).min(to_end),
                            None => to_end,
                        }
                    }
                };
                let composition_offset = to_track(*time).saturating_sub(to_track(dts(k)));
                out.push(Sample {
                    duration: duration as u32,
                    composition_offset: composition_offset as u32,
                    key: *key,
                    data: data.clone(),
                });
            }
            parts.push((base, out));
        }
        self.pending_bytes = self.pending.iter().flatten().map(|p| p.2.len()).sum();
        self.latest_pending = i64::MIN;
        self.fragments = self.fragments.wrapping_add(1);
        let data = media_segment(self.fragments, &parts).into();
        self.parts.push(Part { duration: (end - start) as f64 / 90_000.0, independent, data });
        true
    }

    /// The stream has ended: what is gathered becomes the last segment (its last picture
    /// lasting one frame), and the playlist ends with `#EXT-X-ENDLIST`, so that players
    /// play to the end and stop instead of reloading for ever.
    pub fn finish(&mut self) -> bool {
        if self.ended {
            return false;
        }
        if self.ts.is_some() {
            let step = if self.frame_gap > 0 { self.frame_gap } else { 3000 };
            if self.started.is_some() && self.latest_pending > i64::MIN {
                self.close_ts(self.latest_pending + step, Vec::new());
            }
            // More media (a publisher back) starts a segment at its next keyframe's tables.
            if let Some(ts) = &mut self.ts {
                ts.discard = true;
            }
            self.ended = true;
            return true;
        }
        let last = self.pending.iter().flatten().map(|p| p.0).max();
        if let Some(last) = last {
            let step = if self.frame_gap > 0 { self.frame_gap } else { 3000 };
            self.cut(last + step);
        }
        self.parts.clear();
        self.ended = true;
        true
    }

    /// The initialization segment, once the first keyframe came.
    pub fn init(&self) -> Option<Bytes> {
        self.init.clone().filter(|_| self.ts.is_none())
    }

    /// A segment still in the window.
    pub fn segment(&self, sequence: u64) -> Option<Segment> {
        self.segments.iter().find(|s| s.sequence == sequence).cloned()
    }

    /// The newest segment's sequence number.
    pub fn last(&self) -> Option<u64> {
        self.segments.back().map(|s| s.sequence)
    }

    /// Part `k` of segment `sequence`, of a complete segment or of the one in progress.
    pub fn part(&self, sequence: u64, k: usize) -> Option<Part> {
        if sequence == self.next {
            return self.parts.get(k).cloned();
        }
        self.segments.iter().find(|s| s.sequence == sequence)?.parts.get(k).cloned()
    }

    /// Segments complete, and parts of the next one.
    pub fn progress(&self) -> Progress {
        Progress { last: self.next - 1, parts: self.parts.len() }
    }

    /// The part target in seconds (0: no parts).
    pub fn part_target(&self) -> f64 {
        self.part_target as f64 / 90_000.0
    }

    /// The RFC 6381 codecs of the file, for a master playlist or MSE.
    pub fn codecs(&self) -> Option<String> {
        Some(self.tracks.as_ref()?.iter().map(Fmp4Track::codec).collect::<Vec<_>>().join(","))
    }

    /// A multivariant playlist whose one variant is the media playlist at `uri` (RFC 8216
    /// §4.3.4.2): BANDWIDTH is the peak of the segments' bit rates, CODECS the tracks'.
    /// A player reloads the variant's URI, so a name put in it stays with the player.
    pub fn multivariant(&self, uri: &str) -> Option<String> {
        let codecs = self.codecs()?;
        let peak = self
            .segments
            .iter()
            .filter(|s| s.duration > 0.0)
            .map(|s| s.data.len() as f64 * 8.0 / s.duration)
            .fold(0.0, f64::max);
        let mean = {
            let (bytes, secs) =
                self.segments.iter().fold((0.0, 0.0), |(b, d), s| (b + s.data.len() as f64, d + s.duration));
            if secs > 0.0 {
                bytes * 8.0 / secs
            } else {
                0.0
            }
        };
        // (Old set-top boxes know version 3 only: the TS variant's playlists say no more.)
        let version = if self.ts.is_some() { 3 } else { 7 };
        Some(format!(
            "#EXTM3U\n#EXT-X-VERSION:{version}\n#EXT-X-INDEPENDENT-SEGMENTS\n\
             #EXT-X-STREAM-INF:BANDWIDTH={},AVERAGE-BANDWIDTH={},CODECS=\"{codecs}\"\n{uri}\n",
            peak.ceil().max(1.0) as u64,
            mean.ceil().max(1.0) as u64,
        ))
    }

    /// The media playlist, its URIs followed by `query` (e.g. `?token=…`, or ""). With parts:
    /// those of the segments less than three target durations from the live end, the
    /// segment in progress's, and a hint of the next part (which a client may request
    /// before it exists: the server holds the request).
    pub fn playlist(&self, query: &str) -> Option<String> {
        if self.segments.is_empty() && self.parts.is_empty() {
            return None;
        }
        let first = self.segments.front().map_or(self.next, |s| s.sequence);
        let aimed = (self.target as f64 / 90_000.0).ceil() as u64;
        let target = self.segments.iter().map(|s| s.duration.round() as u64).max().unwrap_or(0).max(aimed).max(1);
        let version = match self.variant() {
            Variant::LowLatency => 9,
            Variant::Fmp4 => 7,
            Variant::MpegTs => 3,
        };
        let (ext, _) = self.variant().segment_file();
        let mut p = format!("#EXTM3U\n#EXT-X-VERSION:{version}\n#EXT-X-TARGETDURATION:{target}\n");
        let part_line = |p: &mut String, sequence: u64, k: usize, part: &Part| {
            let independent = if part.independent { ",INDEPENDENT=YES" } else { "" };
            p.push_str(&format!(
                "#EXT-X-PART:DURATION={:.5},URI=\"{sequence}.{k}.m4s{query}\"{independent}\n",
                part.duration
            ));
        };
        if self.part_target > 0 {
            let part = self.part_target();
            p.push_str(&format!(
                "#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK={:.3}\n#EXT-X-PART-INF:PART-TARGET={part:.3}\n",
                3.0 * part
            ));
        }
        p.push_str(&format!("#EXT-X-MEDIA-SEQUENCE:{first}\n#EXT-X-INDEPENDENT-SEGMENTS\n"));
        if self.ts.is_none() {
            p.push_str(&format!("#EXT-X-MAP:URI=\"init.mp4{query}\"\n"));
        }
        // Where parts start being listed: three target durations from the end.
        let in_progress: f64 = self.parts.iter().map(|p| p.duration).sum();
        let mut from_end = in_progress;
        let mut listed = self.segments.len();
        for s in self.segments.iter().rev() {
            if from_end >= 3.0 * target as f64 {
                break;
            }
            from_end += s.duration;
            listed -= 1;
        }
        for (i, s) in self.segments.iter().enumerate() {
            if self.part_target > 0 && i >= listed {
                for (k, part) in s.parts.iter().enumerate() {
                    part_line(&mut p, s.sequence, k, part);
                }
            }
            p.push_str(&format!("#EXTINF:{:.3},\n{}.{ext}{query}\n", s.duration, s.sequence));
        }
        if self.ended {
            p.push_str("#EXT-X-ENDLIST\n");
        } else if self.part_target > 0 {
            for (k, part) in self.parts.iter().enumerate() {
                part_line(&mut p, self.next, k, part);
            }
            p.push_str(&format!(
                "#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"{}.{}.m4s{query}\"\n",
                self.next,
                self.parts.len()
            ));
        }
        Some(p)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn streams() -> Vec<TrackInfo> {
        vec![
            TrackInfo {
                codec: TrackCodec::Video { codec: crate::codec::annexb::Codec::H264, params: vec![] },
                clock: 90_000,
            },
            TrackInfo {
                codec: TrackCodec::Aac { config: vec![0x11, 0x90], size_bits: 13, index_bits: 3, delta_bits: 3 },
                clock: 48_000,
            },
        ]
    }

    /// A stream left out (the relay's AAC made from a publisher's Opus, which fMP4 carries
    /// as it came): its units are not taken, the file has the others' tracks alone, and the
    /// tracks after it keep their samples.
    #[test]
    fn a_stream_left_out_is_not_in_the_file() {
        let mut streams = streams();
        streams.insert(1, TrackInfo { codec: TrackCodec::Opus { channels: 2 }, clock: 48_000 });
        let mut s = Segmenter::new(&streams, 1000, 1).unwrap();
        s.leave_out(2);
        for u in demo_units().into_iter().take(200) {
            // The AAC becomes stream 2; Opus packets of 20 ms (config 31) are stream 1.
            let time = u.time;
            s.push(&Unit { stream: if u.stream == 1 { 2 } else { 0 }, ..u });
            s.push(&Unit { stream: 1, time, key: false, data: vec![0xfc, 0xff, 0xfe] });
        }
        assert_eq!(s.codecs().as_deref(), Some("avc1.640015,opus"));
        assert!(s.progress().last >= 1);
    }

    /// The demo clip's H.264 and AAC, taken out of its TS, as units at their own times.
    pub(crate) fn demo_units() -> Vec<Unit> {
        let ts = include_bytes!("../../../../assets/demo.ts");
        let mut d = crate::container::tsdemux::Demux::default();
        let mut pes: Vec<crate::container::tsdemux::Pes> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
        pes.extend(d.flush());
        let mut units = Vec::new();
        for p in pes {
            let time = p.pts.unwrap() as i64;
            if p.stream_type == crate::container::tsdemux::STREAM_TYPE_H264 {
                let key = crate::codec::annexb::nal_units(&p.data).any(|n| n[0] & 0x1f == 5);
                units.push(Unit { stream: 0, time, key, data: p.data });
            } else {
                for (k, f) in crate::codec::aac::adts_frames(&p.data).iter().enumerate() {
                    units.push(Unit { stream: 1, time: time + k as i64 * 1920, key: false, data: f.au.to_vec() });
                }
            }
        }
        units.sort_by_key(|u| u.time);
        units
    }

    #[test]
    fn segments_start_at_keyframes_and_slide() {
        let mut s = Segmenter::new(&streams(), 2000, 1).unwrap();
        let units = demo_units();
        let cuts = units.iter().filter(|u| s.push(u)).count();
        // 8 s with a keyframe each second: a segment every 2 s, the last one still open.
        assert_eq!(cuts, 3);
        assert_eq!(s.codecs().as_deref(), Some("avc1.640015,mp4a.40.2"));
        let p = s.playlist("?token=x").unwrap();
        assert!(p.contains("#EXT-X-MAP:URI=\"init.mp4?token=x\"") && p.contains("\n1.m4s?token=x\n"), "{p}");
        // The multivariant playlist names the media playlist, with the rate the segments
        // measure: the demo's H.264 + AAC are about 0.5–2 Mbit/s at their peak.
        let m = s.multivariant("index.m3u8?player=p1").unwrap();
        assert!(m.starts_with("#EXTM3U\n") && m.ends_with("\nindex.m3u8?player=p1\n"), "{m}");
        let attr = |k: &str| -> u64 {
            m.split([',', ':', '\n']).find_map(|a| a.strip_prefix(k)?.strip_prefix('=')?.parse().ok()).unwrap()
        };
        let (peak, mean) = (attr("BANDWIDTH"), attr("AVERAGE-BANDWIDTH"));
        assert!(mean <= peak && (100_000..5_000_000).contains(&peak), "{m}");
        assert!(m.contains("CODECS=\"avc1.640015,mp4a.40.2\""), "{m}");
        assert!(p.contains("#EXTINF:2.000,"), "{p}");
        let seg = s.segment(1).unwrap();
        assert_eq!(&seg.data[4..8], b"moof");
        let Some(Fmp4Track::H264 { width, height, .. }) = s.tracks.as_ref().map(|t| t[0].clone()) else { panic!() };
        assert_eq!((width, height), (480, 270));
        // Looped on: the clip is 8 s.
        for k in 1..4 {
            for u in &units {
                s.push(&Unit { time: u.time + k * 8 * 90_000, ..u.clone() });
            }
        }
        assert_eq!(s.segments.len(), WINDOW);
    }

    /// A segment's transport packets demuxed on their own: its PIDs in order of their
    /// first packet, and its PES packets.
    fn demux(ts: &[u8]) -> (Vec<u16>, Vec<crate::container::tsdemux::Pes>) {
        assert_eq!(ts.len() % 188, 0);
        let mut pids: Vec<u16> = Vec::new();
        for p in ts.chunks(188) {
            let pid = (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2]);
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
        let mut d = crate::container::tsdemux::Demux::default();
        let mut pes: Vec<_> = ts.chunks(188).filter_map(|p| d.push(p)).collect();
        pes.extend(d.flush());
        (pids, pes)
    }

    /// MPEG-TS segments (issue 53): cut where fMP4's are, each one the PAT, the PMT and
    /// then a keyframe, so a player can start at any; together every picture and audio
    /// frame from the first keyframe on, once and in order; a version 3 playlist of `.ts`
    /// URIs with no map and no parts.
    #[test]
    fn ts_segments_start_with_their_tables_and_a_keyframe_and_lose_nothing() {
        use crate::container::tsdemux::STREAM_TYPE_H264;
        let mut s = Segmenter::of(Variant::MpegTs, &streams(), 2000, 500, 1).unwrap();
        let units = demo_units();
        let cuts = units.iter().filter(|u| s.push(u)).count();
        assert_eq!(cuts, 3, "8 s with a keyframe each second: a segment every 2 s");
        assert_eq!(s.variant(), Variant::MpegTs);
        assert!(s.init().is_none());
        assert_eq!(s.codecs().as_deref(), Some("avc1.640015,mp4a.40.2"));
        let p = s.playlist("?token=x").unwrap();
        assert!(p.starts_with("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n"), "{p}");
        assert!(p.contains("#EXTINF:2.000,\n1.ts?token=x\n") && !p.contains("MAP") && !p.contains("PART"), "{p}");
        assert!(s.finish());
        assert!(s.playlist("").unwrap().ends_with("\n4.ts\n#EXT-X-ENDLIST\n"));
        let key = units.iter().find(|u| u.key).unwrap().time;
        let lead = crate::container::tsmux::PCR_LEAD_90K as i64;
        let mut seen: Vec<(bool, i64)> = Vec::new();
        for n in 1..=4 {
            let seg = s.segment(n).unwrap();
            let (pids, pes) = demux(&seg.data);
            assert_eq!(pids[..2], [0, crate::container::tsmux::PMT_PID], "segment {n} opens with its tables");
            let video = pes.iter().find(|p| p.stream_type == STREAM_TYPE_H264).unwrap();
            assert!(crate::codec::annexb::nal_units(&video.data).any(|n| n[0] & 0x1f == 5), "segment {n}");
            assert!(n == 4 || (seg.duration - 2.0).abs() < 1e-9, "{n}: {}", seg.duration);
            seen.extend(pes.iter().map(|p| (p.stream_type == STREAM_TYPE_H264, p.pts.unwrap() as i64 - lead)));
        }
        let sent: Vec<(bool, i64)> = units.iter().filter(|u| u.time >= key).map(|u| (u.stream == 0, u.time)).collect();
        for video in [true, false] {
            let of = |v: &[(bool, i64)]| v.iter().filter(|x| x.0 == video).map(|x| x.1).collect::<Vec<_>>();
            assert_eq!(of(&seen), of(&sent), "video {video}: every unit once, in order");
        }
    }

    /// B-frames: the packager holds pictures for their decoding times, so a keyframe's
    /// tables come out after the cut was decided; what it held before them (the last GOP's
    /// B-frames) still ends the segment before, and every segment starts at its keyframe.
    #[test]
    fn ts_segments_of_b_frames_end_where_the_keyframe_tables_begin() {
        let units = ipbb_pictures();
        let mut s = Segmenter::of(Variant::MpegTs, &streams()[..1], 2000, 0, 1).unwrap();
        units.iter().for_each(|u| {
            s.push(u);
        });
        let mut shown = Vec::new();
        for n in 1..=s.last().unwrap() {
            let seg = s.segment(n).unwrap();
            let (_, pes) = demux(&seg.data);
            assert!(crate::codec::annexb::nal_units(&pes[0].data).any(|n| n[0] & 0x1f == 5), "segment {n}");
            let lead = crate::container::tsmux::PCR_LEAD_90K as i64;
            let times: Vec<i64> = pes.iter().map(|p| p.pts.unwrap() as i64 - lead).collect();
            // Its pictures are shown from its start to before the next one's.
            let end = (seg.start as f64 + seg.duration * 90_000.0).round() as i64;
            assert!(times.iter().all(|&t| t >= seg.start && t < end), "segment {n}: {times:?}");
            shown.extend(times);
        }
        let sent: Vec<i64> = units.iter().map(|u| u.time).take(shown.len()).collect();
        assert!(shown.len() >= 3 * 50, "{}", shown.len());
        let (mut a, mut b) = (shown, sent);
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }

    /// Audio alone: no keyframe brings tables, so each segment gets its own.
    #[test]
    fn audio_only_ts_segments_each_have_their_tables() {
        let mut s = Segmenter::of(Variant::MpegTs, &streams()[1..], 2000, 0, 1).unwrap();
        let units: Vec<Unit> =
            demo_units().into_iter().filter(|u| u.stream == 1).map(|u| Unit { stream: 0, ..u }).collect();
        let frames = units.len();
        units.iter().for_each(|u| {
            s.push(u);
        });
        s.finish();
        let mut total = 0;
        for n in 1..=s.last().unwrap() {
            let (pids, pes) = demux(&s.segment(n).unwrap().data);
            assert_eq!(pids[..2], [0, crate::container::tsmux::PMT_PID], "segment {n}");
            total += pes.len();
        }
        assert!(s.last().unwrap() >= 3);
        assert_eq!(total, frames);
    }

    /// Audio sent three frames a packet arrives at its first frame's time: frames due after
    /// the first keyframe may come before it, and are taken by their own times, none lost.
    #[test]
    fn audio_that_comes_before_the_first_keyframe_is_placed_by_its_time() {
        let units = demo_units();
        let key = units.iter().find(|u| u.key).unwrap().time;
        // Arrival: a picture at its time, an audio frame at its packet's first frame's.
        let mut arriving: Vec<(i64, &Unit)> = Vec::new();
        let audio: Vec<&Unit> = units.iter().filter(|u| u.stream == 1).collect();
        for packet in audio.chunks(3) {
            arriving.extend(packet.iter().map(|u| (packet[0].time, *u)));
        }
        arriving.extend(units.iter().filter(|u| u.stream == 0).map(|u| (u.time, u)));
        arriving.sort_by_key(|(at, u)| (*at, u.stream));
        let mut s = Segmenter::new(&streams(), 2000, 1).unwrap();
        for (at, u) in &arriving {
            if *at > key + 90_000 {
                break;
            }
            s.push(u);
        }
        let due: Vec<i64> = audio.iter().map(|u| u.time).filter(|&t| t >= key && t <= key + 90_000).collect();
        let taken: Vec<i64> = s.pending[1].iter().map(|p| p.0).filter(|&t| t <= key + 90_000).collect();
        assert!(due.first().unwrap() - key < 1920, "the clip has audio at its first keyframe");
        assert_eq!(taken, due);
    }

    /// A stream's end (issue 30 item 11): the open segment is closed, the playlist lists it
    /// last and ends with `#EXT-X-ENDLIST`, with no part to wait for; more media makes it
    /// live again.
    #[test]
    fn an_ended_stream_has_a_last_segment_and_an_endlist() {
        let mut s = Segmenter::with_parts(&streams(), 2000, 500, 1).unwrap();
        let units = demo_units();
        for u in &units {
            s.push(u);
        }
        let live = s.playlist("").unwrap();
        assert!(!live.contains("#EXT-X-ENDLIST") && live.contains("#EXT-X-PRELOAD-HINT"), "{live}");
        let before = s.progress().last;
        assert!(s.finish());
        assert!(!s.finish(), "once");
        assert_eq!(s.progress().last, before + 1, "the open segment is the last one");
        let done = s.playlist("").unwrap();
        assert!(done.ends_with(&format!("\n{}.m4s\n#EXT-X-ENDLIST\n", before + 1)), "{done}");
        assert!(!done.contains("PRELOAD-HINT"), "{done}");
        let last = s.segment(before + 1).unwrap();
        assert!(last.duration > 0.0 && last.duration <= 2.1, "{}", last.duration);
        s.push(&Unit { time: units.last().unwrap().time + 90_000, ..units[0].clone() });
        assert!(!s.playlist("").unwrap().contains("#EXT-X-ENDLIST"));
    }

    /// The first `trun` of a media segment (the video's): per sample its duration and
    /// composition offset.
    fn first_trun(seg: &[u8]) -> Vec<(u32, u32)> {
        let at = seg.windows(4).position(|w| w == b"trun").expect("a trun") + 4;
        let u = |i: usize| u32::from_be_bytes(seg[at + i..at + i + 4].try_into().unwrap());
        assert_eq!(u(0) & 0xffffff, 0xf01, "duration, size, flags and composition offset per sample");
        (0..u(4) as usize).map(|k| (u(12 + 16 * k), u(12 + 16 * k + 12))).collect()
    }

    /// The demo's pictures, restamped as I P B B P B B ... (a P shown after the two B that
    /// follow it in decoding order).
    fn ipbb_pictures() -> Vec<Unit> {
        let mut units: Vec<Unit> = demo_units().into_iter().filter(|u| u.stream == 0).collect();
        let mut gop_start = 0;
        for (i, u) in units.iter_mut().enumerate() {
            if u.key {
                gop_start = i;
            }
            let j = (i - gop_start) as i64;
            let shown = if j == 0 {
                0
            } else if (j - 1) % 3 == 0 {
                j + 2
            } else {
                j - 1
            };
            u.time = (gop_start as i64 + shown) * 3600;
        }
        units
    }

    /// B-frames: RTP gives presentation times, which go back and forth in decoding order.
    /// Every picture is kept, in decoding order; decoding times rise by one frame each, and
    /// each picture's composition offset brings it to its presentation time.
    #[test]
    fn b_frames_keep_their_order_with_composition_offsets() {
        let units = ipbb_pictures();
        let mut s = Segmenter::new(&streams()[..1], 2000, 1).unwrap();
        for u in &units {
            s.push(u);
        }
        let seg = s.segment(1).expect("a first segment");
        let samples = first_trun(&seg.data);
        assert_eq!(samples.len(), 50, "2 s of 25 pictures a second, none dropped");
        assert!(samples.iter().all(|s| s.0 == 3600), "one frame apart in decoding: {samples:?}");
        // Decoding at k frames (less the one-frame reordering), shown at its own time.
        for (k, (u, (_, offset))) in units.iter().zip(&samples).enumerate() {
            let dts = k as i64 * 3600 - 3600;
            assert_eq!(dts + i64::from(*offset), u.time, "picture {k}");
        }
    }

    /// The `tfdt` of a fragment's first track (the video's).
    fn first_tfdt(frag: &[u8]) -> u64 {
        let at = frag.windows(4).position(|w| w == b"tfdt").expect("a tfdt") + 8;
        u64::from_be_bytes(frag[at..at + 8].try_into().unwrap())
    }

    /// Parts of at most the part target make up each segment, byte for byte and second for
    /// second; a segment's first part starts at its keyframe.
    #[test]
    fn parts_make_up_their_segments() {
        let mut s = Segmenter::with_parts(&streams(), 2000, 500, 1).unwrap();
        let units = demo_units();
        let published = units.iter().filter(|u| s.push(u)).count();
        assert_eq!(s.segments.len(), 3);
        assert!(published >= 3 * 4, "{published} parts and segments");
        for seg in &s.segments {
            assert!(seg.parts.len() >= 4, "{} parts", seg.parts.len());
            let total: f64 = seg.parts.iter().map(|p| p.duration).sum();
            assert!((total - seg.duration).abs() < 1e-9, "{total} vs {}", seg.duration);
            let joined: Vec<u8> = seg.parts.iter().flat_map(|p| p.data.iter().copied()).collect();
            assert_eq!(&joined[..], &seg.data[..]);
            // Held once: a complete segment's parts are slices of its bytes.
            let last = seg.parts.last().unwrap();
            assert_eq!(seg.parts[0].data.as_ptr(), seg.data.as_ptr());
            assert_eq!(last.data.as_ptr_range().end, seg.data.as_ptr_range().end);
            assert!(seg.parts[0].independent && !seg.parts[1].independent);
            assert!(seg.parts.iter().all(|p| p.duration <= 0.5 + 1e-9 && p.duration > 0.0), "{:?}", seg.parts);
            // Decoding times run on from part to part.
            for w in seg.parts.windows(2) {
                let d: u64 = first_trun(&w[0].data).iter().map(|s| u64::from(s.0)).sum();
                assert_eq!(first_tfdt(&w[0].data) + d, first_tfdt(&w[1].data));
            }
        }
        assert_eq!(s.part(1, 0).unwrap().data, s.segments[0].parts[0].data);
        assert!(s.part(4, 0).is_some(), "the segment in progress has parts");
        assert_eq!(s.progress(), Progress { last: 3, parts: s.parts.len() });
    }

    #[test]
    fn the_playlist_lists_recent_parts_and_hints_the_next() {
        let mut s = Segmenter::with_parts(&streams(), 2000, 500, 1).unwrap();
        for u in demo_units() {
            s.push(&u);
        }
        let p = s.playlist("").unwrap();
        assert!(p.contains("#EXT-X-VERSION:9\n") && p.contains("#EXT-X-PART-INF:PART-TARGET=0.500\n"), "{p}");
        assert!(p.contains("#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=1.500\n"), "{p}");
        assert!(p.contains("URI=\"2.0.m4s\",INDEPENDENT=YES\n"), "{p}");
        let next = s.progress();
        assert!(p.ends_with(&format!("#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"4.{}.m4s\"\n", next.parts)), "{p}");
        // Every part listed can be fetched.
        for line in p.lines().filter(|l| l.starts_with("#EXT-X-PART:")) {
            let uri = line.split("URI=\"").nth(1).unwrap().split('"').next().unwrap();
            let (seq, k) = uri.trim_end_matches(".m4s").split_once('.').unwrap();
            assert!(s.part(seq.parse().unwrap(), k.parse().unwrap()).is_some(), "{uri}");
        }
        assert!(!Segmenter::new(&streams(), 2000, 1).unwrap().playlist("").is_some_and(|p| p.contains("PART")));
    }

    /// With B-frames a part ends only before a picture shown after every pending one:
    /// decoding times still rise one frame at a time across parts.
    #[test]
    fn b_frames_keep_their_order_across_parts() {
        let units = ipbb_pictures();
        let mut s = Segmenter::with_parts(&streams()[..1], 2000, 500, 1).unwrap();
        for u in &units {
            s.push(u);
        }
        let seg = s.segment(1).unwrap();
        let samples: Vec<(u32, u32)> = seg.parts.iter().flat_map(|p| first_trun(&p.data)).collect();
        assert_eq!(samples.len(), 50);
        assert!(samples.iter().all(|s| s.0 == 3600), "{samples:?}");
        for (k, (u, (_, offset))) in units.iter().zip(&samples).enumerate() {
            assert_eq!(k as i64 * 3600 - 3600 + i64::from(*offset), u.time, "picture {k}");
        }
    }

    #[test]
    fn hevc_goes_into_hvc1_segments() {
        use crate::codec::annexb::{access_units, Codec};
        let hevc = TrackInfo { codec: TrackCodec::Video { codec: Codec::H265, params: vec![] }, clock: 90_000 };
        let mut s = Segmenter::new(&[hevc], 1000, 1).unwrap();
        let clip = include_bytes!("../../../../testdata/video/hevc/x265_temporal_320x192.265");
        let aus = access_units(Codec::H265, clip);
        assert!(aus.len() > 10, "{} pictures", aus.len());
        // Looped (as `gen` sends it), so that keyframes come again and segments are cut.
        let looped = aus.iter().cycle().take(4 * aus.len());
        for (i, au) in looped.enumerate() {
            let data: Vec<u8> = au.iter().flat_map(|n| [&[0u8, 0, 0, 1][..], n].concat()).collect();
            // An IRAP picture (NAL types 16..=21) is where a decoder starts.
            let key = au.iter().any(|n| n.first().is_some_and(|b| (16..=21).contains(&((b >> 1) & 0x3f))));
            s.push(&Unit { stream: 0, time: i as i64 * 3600, key, data });
        }
        let init = s.init().unwrap();
        assert!(init.windows(4).any(|w| w == b"hvc1") && init.windows(4).any(|w| w == b"hvcC"));
        assert!(s.codecs().unwrap().starts_with("hvc1.1.6.L"), "{:?}", s.codecs());
        let Some(Fmp4Track::H265 { info, .. }) = s.tracks.as_ref().map(|t| t[0].clone()) else { panic!() };
        assert_eq!((info.width, info.height), (320, 192));
        assert!(s.last().is_some(), "segments cut at keyframes");
    }
}
