//! RTP in, access units out: the tracks of a session (H.264 or HEVC per RFC 6184 / RFC 7798,
//! AAC per RFC 3640) are depacketized into access units on one 90 kHz timeline, for MPEG-TS
//! ([`TsPackager`], [`crate::container::tsmux`]) and fragmented MP4 ([`crate::container::fmp4`]), so that a session
//! fed by a camera can be played over HTTP by any player. Done once per session; sans-IO
//! (packets and arrival times in, units out).

use crate::codec::annexb::{Codec, Depacketizer};
use crate::codec::dts::DecodingTimes;
use crate::container::tsmux::{adts_header, AccessUnit, StreamKind, TsMuxer};
use crate::rtp::RtpView;
use crate::rtsp::sdp::Media;

use base64::Engine as _;
use std::collections::VecDeque;

/// An access unit larger than this is dropped (a broken stream, not a picture).
const MAX_AU: usize = 4 << 20;

/// Base64 with or without its padding: cameras write both in `sprop-*`.
const LENIENT_BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// A track this module can repackage, from its SDP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackInfo {
    pub codec: TrackCodec,
    /// RTP clock rate.
    pub clock: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackCodec {
    /// With the parameter sets the SDP gives (`sprop-*`), each a NAL unit.
    Video { codec: Codec, params: Vec<Vec<u8>> },
    /// MPEG4-GENERIC AAC: the AudioSpecificConfig and the AU header's field widths.
    Aac { config: Vec<u8>, size_bits: u8, index_bits: u8, delta_bits: u8 },
    /// Opus (RFC 7587): a packet a unit, at 48 kHz; its channels as the SDP says.
    Opus { channels: u8 },
    /// VP9 (RFC 9628): a picture's frames a unit (its spatial layers in a superframe).
    Vp9,
    /// AV1 (the AOM RTP payload format): a temporal unit's OBUs, each with its size field.
    Av1,
    /// MPEG audio, MP3 most often (RFC 2250 `MPA`): a frame a unit.
    Mpa,
    /// G.711 (PCMU, or PCMA when not `mu_law`): a packet a unit.
    G711 { mu_law: bool },
}

impl TrackInfo {
    /// The track of an SDP media section, or why it cannot be repackaged as MPEG-TS.
    pub fn from_sdp(m: &Media) -> Result<Self, crate::Invalid> {
        let fmt = m.formats.first().map(String::as_str).unwrap_or("");
        // The static payload types that cameras send without an rtpmap.
        let Some((enc, clock)) = m.rtpmap(fmt).or(match fmt {
            "0" => Some(("PCMU", 8000)),
            "8" => Some(("PCMA", 8000)),
            "14" => Some(("MPA", 90_000)),
            _ => None,
        }) else {
            return Err(format!("{} track without an rtpmap (static payload type {fmt:?})", m.kind).into());
        };
        let fmtp = fmtp(m, fmt);
        let param = |k: &str| fmtp.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| *v);
        let b64 = |v: &str| -> Vec<Vec<u8>> {
            v.split(',').filter_map(|p| LENIENT_BASE64.decode(p.trim()).ok()).filter(|n| !n.is_empty()).collect()
        };
        let codec = match enc.to_ascii_uppercase().as_str() {
            "H264" => TrackCodec::Video {
                codec: Codec::H264,
                params: param("sprop-parameter-sets").map(b64).unwrap_or_default(),
            },
            "H265" => TrackCodec::Video {
                codec: Codec::H265,
                params: ["sprop-vps", "sprop-sps", "sprop-pps"].iter().filter_map(|k| param(k)).flat_map(b64).collect(),
            },
            "MPEG4-GENERIC" => {
                let num = |k: &str| param(k).and_then(|v| v.parse::<u8>().ok());
                let config = param("config").and_then(hex).filter(|c| c.len() >= 2);
                let mode = param("mode").unwrap_or("");
                match (config, num("sizelength")) {
                    (Some(config), Some(size_bits))
                        if mode.to_ascii_lowercase().starts_with("aac") && size_bits > 0 =>
                    {
                        TrackCodec::Aac {
                            config,
                            size_bits,
                            index_bits: num("indexlength").unwrap_or(0),
                            delta_bits: num("indexdeltalength").unwrap_or(0),
                        }
                    }
                    _ => {
                        return Err(
                            format!("MPEG4-GENERIC track that is not AAC-hbr/lbr with a config: {fmtp:?}").into()
                        )
                    }
                }
            }
            "OPUS" => TrackCodec::Opus { channels: m.rtpmap(fmt).and_then(|_| rtpmap_channels(m, fmt)).unwrap_or(2) },
            "VP9" => TrackCodec::Vp9,
            "AV1" => TrackCodec::Av1,
            "MPA" => TrackCodec::Mpa,
            "PCMU" => TrackCodec::G711 { mu_law: true },
            "PCMA" => TrackCodec::G711 { mu_law: false },
            other => return Err(format!("{} track in {other}, which HTTP players are not given", m.kind).into()),
        };
        Ok(Self { codec, clock: clock.max(1) })
    }

    /// Its stream in MPEG-TS (and FLV), if those carry its codec: H.264, H.265 and AAC.
    pub fn kind(&self) -> Option<StreamKind> {
        match &self.codec {
            TrackCodec::Video { codec: Codec::H264, .. } => Some(StreamKind::H264),
            TrackCodec::Video { codec: Codec::H265, .. } => Some(StreamKind::H265),
            TrackCodec::Aac { .. } => Some(StreamKind::AacAdts),
            TrackCodec::Mpa => Some(StreamKind::Mpa),
            _ => None,
        }
    }

    pub fn is_video(&self) -> bool {
        matches!(self.codec, TrackCodec::Video { .. } | TrackCodec::Vp9 | TrackCodec::Av1)
    }

    /// Its codec's name, for the status: "H.264", "Opus".
    pub fn name(&self) -> &'static str {
        match &self.codec {
            TrackCodec::Video { codec: Codec::H264, .. } => "H.264",
            TrackCodec::Video { codec: Codec::H265, .. } => "H.265",
            TrackCodec::Aac { .. } => "AAC",
            TrackCodec::Opus { .. } => "Opus",
            TrackCodec::Vp9 => "VP9",
            TrackCodec::Av1 => "AV1",
            TrackCodec::Mpa => "MP3",
            TrackCodec::G711 { mu_law: true } => "G.711 PCMU",
            TrackCodec::G711 { mu_law: false } => "G.711 PCMA",
        }
    }
}

/// The channel count an `a=rtpmap` gives after the clock rate (`opus/48000/2`).
fn rtpmap_channels(m: &Media, fmt: &str) -> Option<u8> {
    m.lines.iter().filter(|(t, _)| *t == 'a').find_map(|(_, v)| {
        let (pt, map) = v.strip_prefix("rtpmap:")?.split_once(' ')?;
        (pt.trim() == fmt).then(|| map.trim().split('/').nth(2)?.parse().ok())?
    })
}

/// The `a=fmtp` parameters of a format, as (name, value) pairs.
fn fmtp<'a>(m: &'a Media, fmt: &str) -> Vec<(&'a str, &'a str)> {
    let line = m.lines.iter().filter(|(t, _)| *t == 'a').find_map(|(_, v)| {
        let (pt, rest) = v.strip_prefix("fmtp:")?.split_once(' ')?;
        (pt.trim() == fmt).then_some(rest)
    });
    line.into_iter()
        .flat_map(|l| l.split(';'))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// RTP time `ts` extended to the 64-bit count nearest a known (time, extended) pair.
fn near((at, ext): (u32, i64), ts: u32) -> i64 {
    ext + i64::from(ts.wrapping_sub(at) as i32)
}

/// Extends 32-bit RTP times to a signed 64-bit count that does not wrap.
#[derive(Debug, Default)]
struct Unwrap {
    last: Option<(u32, i64)>,
}

impl Unwrap {
    fn extend(&mut self, ts: u32) -> i64 {
        let ext = match self.last {
            None => i64::from(ts),
            Some(last) => near(last, ts),
        };
        self.last = Some((ts, ext));
        ext
    }
}

struct Track {
    info: TrackInfo,
    /// Its stream in the muxer.
    stream: usize,
    unwrap: Unwrap,
    /// 90 kHz timeline time = RTP time × 90000 / clock + offset; set at its first packet.
    offset: Option<i64>,
    /// The upstream's wall clock against this track's RTP time: (NTP, RTP).
    clock_map: Option<(u64, u32)>,
    // Video: the access unit being gathered, its RTP time, and the latest parameter sets.
    depack: Depacketizer,
    au: Vec<u8>,
    au_ts: Option<i64>,
    key: bool,
    params: Vec<Vec<u8>>,
    // AAC: one access unit fragmented over packets. VP9: the frame being gathered.
    frag: Vec<u8>,
    // VP9: the picture's frames so far.
    frames: Vec<Vec<u8>>,
    av1: crate::codec::av1::Av1Depacketizer,
    mpa: crate::codec::mpa::MpaDepacketizer,
}

/// Counts of what did not make it into the output.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RepackStats {
    pub packets: u64,
    pub units: u64,
    /// Packets that were not RTP or whose payload did not parse.
    pub bad: u64,
    /// Units dropped before the first video keyframe or for their size.
    pub dropped: u64,
}

/// The repackager of one session.
pub struct Repackager {
    tracks: Vec<Option<Track>>,
    /// The info of each output stream, in order.
    streams: Vec<TrackInfo>,
    /// The track whose timeline the others follow (the first to send a packet).
    reference: Option<usize>,
    /// Video has started (a keyframe went out), or there is no video track.
    started: bool,
    /// Audio frames from before video started, the newest [`EARLY_AUDIO`]: a packet of
    /// several frames comes at its first frame's time, so some may be due after the keyframe.
    early: VecDeque<Unit>,
    pub stats: RepackStats,
}

/// The most audio frames held until video starts.
const EARLY_AUDIO: usize = 32;

impl Repackager {
    /// A repackager for a session's tracks in order; `None` for a track it leaves out.
    pub fn new(tracks: Vec<Option<TrackInfo>>) -> Self {
        let mut streams = Vec::new();
        let tracks: Vec<Option<Track>> = tracks
            .into_iter()
            .map(|t| {
                t.map(|info| {
                    streams.push(info.clone());
                    let params = match &info.codec {
                        TrackCodec::Video { params, .. } => params.clone(),
                        _ => Vec::new(),
                    };
                    Track {
                        stream: streams.len() - 1,
                        info,
                        unwrap: Unwrap::default(),
                        offset: None,
                        clock_map: None,
                        depack: Depacketizer::default(),
                        au: Vec::new(),
                        au_ts: None,
                        key: false,
                        params,
                        frag: Vec::new(),
                        frames: Vec::new(),
                        av1: Default::default(),
                        mpa: Default::default(),
                    }
                })
            })
            .collect();
        let started = !streams.iter().any(TrackInfo::is_video);
        Self { tracks, streams, reference: None, started, early: VecDeque::new(), stats: RepackStats::default() }
    }

    /// The output streams ([`Unit::stream`] indexes them).
    pub fn streams(&self) -> &[TrackInfo] {
        &self.streams
    }

    /// Whether any track is repackaged at all.
    pub fn is_empty(&self) -> bool {
        self.tracks.iter().all(Option::is_none)
    }

    /// The upstream's wall clock for track `i` (from its RTCP sender reports, mapped to the
    /// RTP times this repackager is given): tracks that start after it are placed on the
    /// timeline by it, so audio and video stay in sync as the source had them.
    pub fn set_clock_map(&mut self, i: usize, ntp: u64, rtp: u32) {
        if let Some(Some(t)) = self.tracks.get_mut(i) {
            t.clock_map = Some((ntp, rtp));
        }
    }

    /// One RTP packet of track `i`, arrived at `now_ms` (any monotonic clock); appends the
    /// access units it completes to `out`.
    pub fn push_rtp(&mut self, i: usize, pkt: &[u8], now_ms: u64, out: &mut Vec<Unit>) {
        let Some(Some(_)) = self.tracks.get(i) else { return };
        self.stats.packets += 1;
        let Ok(v) = RtpView::parse(pkt) else {
            self.stats.bad += 1;
            return;
        };
        let time = self.timeline(i, v.timestamp(), now_ms);
        let t = self.tracks[i].as_mut().expect("checked");
        match &t.info.codec {
            TrackCodec::Video { codec, .. } => {
                let codec = *codec;
                if t.au_ts.is_some_and(|at| at != time) {
                    self.flush_video(i, out);
                }
                let t = self.tracks[i].as_mut().expect("checked");
                t.au_ts = Some(time);
                let (au, params, key, depack) = (&mut t.au, &mut t.params, &mut t.key, &mut t.depack);
                depack.push_all(codec, v.payload(), |nal| {
                    if au.len() + nal.len() > MAX_AU {
                        return;
                    }
                    match nal_type(codec, &nal) {
                        NalType::Params(first) => {
                            if first {
                                params.clear();
                            }
                            params.push(nal.clone());
                        }
                        NalType::Key => *key = true,
                        NalType::Other => {}
                    }
                    au.extend_from_slice(&[0, 0, 0, 1]);
                    au.extend_from_slice(&nal);
                });
                if v.marker() {
                    self.flush_video(i, out);
                }
            }
            TrackCodec::Aac { .. } => self.push_aac(i, &v, time, out),
            TrackCodec::Opus { .. } | TrackCodec::G711 { .. } => {
                let stream = t.stream;
                self.audio(Unit { stream, time, key: false, data: v.payload().to_vec() }, out);
            }
            TrackCodec::Mpa => {
                let mut frames = Vec::new();
                if !t.mpa.push(v.payload(), &mut frames) {
                    self.stats.bad += 1;
                }
                // Each frame at its own time: a packet's time is its first frame's.
                let (stream, mut at) = (t.stream, time);
                for data in frames {
                    let step = crate::codec::mpa::frame_header(&data)
                        .map_or(0, |h| i64::from(h.samples) * 90_000 / i64::from(h.sample_rate));
                    self.audio(Unit { stream, time: at, key: false, data }, out);
                    at += step;
                }
            }
            TrackCodec::Vp9 | TrackCodec::Av1 => self.push_coded(i, &v, time, out),
        }
    }

    /// A VP9 or AV1 packet: gathered into the picture of its RTP time, which ends at the
    /// marker or when a packet of another time comes.
    fn push_coded(&mut self, i: usize, v: &RtpView<'_>, time: i64, out: &mut Vec<Unit>) {
        let t = self.tracks[i].as_mut().expect("checked");
        if t.au_ts.is_some_and(|at| at != time) {
            self.flush_coded(i, out);
        }
        let t = self.tracks[i].as_mut().expect("checked");
        t.au_ts = Some(time);
        let payload = v.payload();
        let size = t.au.len() + t.frag.len() + t.frames.iter().map(Vec::len).sum::<usize>();
        let ok = if size + payload.len() > MAX_AU {
            true // dropped with its picture at the flush
        } else if t.info.codec == TrackCodec::Av1 {
            t.av1.push(payload, &mut t.au)
        } else if let Some(d) = crate::codec::vpx::vp9_descriptor(payload) {
            let frame = &payload[d.len..];
            if d.begins {
                if !t.frag.is_empty() {
                    t.frames.push(std::mem::take(&mut t.frag));
                }
                if d.spatial == 0 && t.frames.is_empty() {
                    t.key = crate::codec::vpx::vp9_frame_header(frame).is_some_and(|f| f.key);
                }
            }
            // A frame whose beginning was lost is left out.
            if d.begins || !t.frag.is_empty() {
                t.frag.extend_from_slice(frame);
                if d.ends {
                    t.frames.push(std::mem::take(&mut t.frag));
                }
            }
            true
        } else {
            false
        };
        if !ok {
            self.stats.bad += 1;
        }
        if v.marker() {
            self.flush_coded(i, out);
        }
    }

    fn flush_coded(&mut self, i: usize, out: &mut Vec<Unit>) {
        let t = self.tracks[i].as_mut().expect("a video track");
        let Some(time) = t.au_ts.take() else { return };
        if !t.frag.is_empty() {
            t.frames.push(std::mem::take(&mut t.frag));
        }
        let (data, key) = if t.info.codec == TrackCodec::Av1 {
            let tu = std::mem::take(&mut t.au);
            let key = crate::codec::av1::temporal_unit_is_key(&tu);
            (tu, key)
        } else {
            let frames = std::mem::take(&mut t.frames);
            let key = std::mem::take(&mut t.key);
            (if frames.is_empty() { Vec::new() } else { crate::codec::vpx::vp9_superframe(&frames) }, key)
        };
        if data.is_empty() || data.len() > MAX_AU {
            self.stats.dropped += u64::from(!data.is_empty());
            return;
        }
        let stream = t.stream;
        self.video_out(Unit { stream, time, key, data }, out);
    }

    /// Track `i`'s 90 kHz timeline time of RTP time `ts`.
    fn timeline(&mut self, i: usize, ts: u32, now_ms: u64) -> i64 {
        let reference = *self.reference.get_or_insert(i);
        // The reference's map, its RTP time extended like its packets' times.
        let reference_map = self.tracks[reference].as_ref().and_then(|r| {
            let (ntp, rtp) = r.clock_map?;
            Some((ntp, near(r.unwrap.last?, rtp), r.offset?, r.info.clock))
        });
        let t = self.tracks[i].as_mut().expect("checked");
        let ext = t.unwrap.extend(ts);
        let scaled = |rtp: i64, clock: u32| rtp * 90_000 / i64::from(clock);
        let offset = *t.offset.get_or_insert_with(|| {
            match (reference_map, t.clock_map) {
                // Both on the source's wall clock: this track's RTP time `r` is `ntp`, the
                // reference's RTP time at that `ntp` follows from its own map.
                (Some((rntp, rrtp, roff, rclock)), Some((ntp, rtp))) if reference != i => {
                    let d90 = (((i128::from(ntp) - i128::from(rntp)) * 90_000) >> 32) as i64;
                    let reference_at = scaled(rrtp, rclock) + roff + d90;
                    reference_at - scaled(near((ts, ext), rtp), t.info.clock)
                }
                // Else by arrival: this packet is now.
                _ => now_ms as i64 * 90 - scaled(ext, t.info.clock),
            }
        });
        scaled(ext, t.info.clock) + offset
    }

    fn flush_video(&mut self, i: usize, out: &mut Vec<Unit>) {
        let t = self.tracks[i].as_mut().expect("a video track");
        let (Some(time), false) = (t.au_ts.take(), t.au.is_empty()) else {
            t.au.clear();
            return;
        };
        let key = std::mem::take(&mut t.key);
        let nals = std::mem::take(&mut t.au);
        let TrackCodec::Video { codec, .. } = t.info.codec else { return };
        if !self.started && !key {
            self.stats.dropped += 1;
            return;
        }
        // An access unit delimiter first (players of TS expect one), then the parameter
        // sets in front of a keyframe that does not carry its own.
        let mut data = Vec::with_capacity(nals.len() + 64);
        data.extend_from_slice(match codec {
            Codec::H264 => &[0, 0, 0, 1, 0x09, 0xf0],
            Codec::H265 => &[0, 0, 0, 1, 0x46, 0x01, 0x50],
        });
        let carries_params =
            crate::codec::annexb::nal_units(&nals).any(|n| matches!(nal_type(codec, n), NalType::Params(_)));
        if key && !carries_params {
            for p in &t.params {
                data.extend_from_slice(&[0, 0, 0, 1]);
                data.extend_from_slice(p);
            }
        }
        data.extend_from_slice(&nals);
        let stream = t.stream;
        self.video_out(Unit { stream, time, key, data }, out);
    }

    /// A picture out, unless it comes before the first keyframe; with it, the held audio
    /// that is due from then on.
    fn video_out(&mut self, u: Unit, out: &mut Vec<Unit>) {
        if !self.started && !u.key {
            self.stats.dropped += 1;
            return;
        }
        self.started = true;
        let time = u.time;
        self.stats.units += 1;
        out.push(u);
        // Each held audio frame by its own time: those due from the keyframe on go out.
        for u in std::mem::take(&mut self.early) {
            if u.time >= time {
                self.stats.units += 1;
                out.push(u);
            } else {
                self.stats.dropped += 1;
            }
        }
    }

    fn push_aac(&mut self, i: usize, v: &RtpView<'_>, time: i64, out: &mut Vec<Unit>) {
        let t = self.tracks[i].as_mut().expect("checked");
        let TrackCodec::Aac { size_bits, index_bits, delta_bits, .. } = &t.info.codec else { return };
        let Some(aus) = au_sizes(v.payload(), *size_bits, *index_bits, *delta_bits) else {
            self.stats.bad += 1;
            return;
        };
        let (stream, clock) = (t.stream, t.info.clock);
        let mut data = &v.payload()[aus.data_at..];
        let mut frames = Vec::new();
        if aus.sizes.len() == 1 && aus.sizes[0] > data.len() {
            // One access unit over several packets (RFC 3640 §3.2.3): gather it.
            t.frag.extend_from_slice(data);
            if t.frag.len() < aus.sizes[0] && !v.marker() {
                return;
            }
            let whole = std::mem::take(&mut t.frag);
            if whole.len() == aus.sizes[0] {
                frames.push(whole);
            } else {
                self.stats.bad += 1;
            }
        } else {
            t.frag.clear();
            for &n in &aus.sizes {
                let Some(au) = data.get(..n) else {
                    self.stats.bad += 1;
                    break;
                };
                frames.push(au.to_vec());
                data = &data[n..];
            }
        }
        // Each AAC frame is 1024 samples.
        let step = 1024 * 90_000 / i64::from(clock);
        for (k, au) in frames.into_iter().enumerate() {
            self.audio(Unit { stream, time: time + k as i64 * step, key: false, data: au }, out);
        }
    }

    /// An audio unit out, or held until video starts.
    fn audio(&mut self, u: Unit, out: &mut Vec<Unit>) {
        if self.started {
            self.stats.units += 1;
            out.push(u);
        } else {
            if self.early.len() == EARLY_AUDIO {
                self.early.pop_front();
                self.stats.dropped += 1;
            }
            self.early.push_back(u);
        }
    }
}

/// One access unit on the session's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Its output stream (see [`Repackager::streams`]).
    pub stream: usize,
    /// 90 kHz; the first track starts at its arrival time.
    pub time: i64,
    /// A video picture a decoder can start at.
    pub key: bool,
    /// Video: Annex B, an access unit delimiter first, the parameter sets in front of a
    /// keyframe. AAC: the raw access unit.
    pub data: Vec<u8>,
}

/// MPEG-TS of a repackager's units.
pub struct TsPackager {
    mux: TsMuxer,
    /// Per stream, its stream in the muxer: none for a codec MPEG-TS does not carry.
    pids: Vec<Option<usize>>,
    /// Per stream, the AAC AudioSpecificConfig its ADTS headers are made from.
    aac: Vec<Option<Vec<u8>>>,
    /// Per video stream, its decoding times (pictures held back while B-frames are
    /// reordered): a keyframe flag and Annex B data per held picture.
    video: Vec<Option<DecodingTimes<HeldPicture>>>,
}

/// A picture held for its decoding time: whether it is a keyframe, and its Annex B data.
type HeldPicture = (bool, Vec<u8>);

impl TsPackager {
    pub fn new(streams: &[TrackInfo]) -> Self {
        let kinds: Vec<StreamKind> = streams.iter().filter_map(TrackInfo::kind).collect();
        let mut n = 0;
        let pids = streams
            .iter()
            .map(|s| {
                s.kind()?;
                n += 1;
                Some(n - 1)
            })
            .collect();
        let aac = streams
            .iter()
            .map(|s| match &s.codec {
                TrackCodec::Aac { config, .. } => Some(config.clone()),
                _ => None,
            })
            .collect();
        let video =
            streams.iter().map(|s| matches!(s.codec, TrackCodec::Video { .. }).then(DecodingTimes::default)).collect();
        Self { mux: TsMuxer::new(&kinds), pids, aac, video }
    }

    /// Appends the PAT and PMT: where a chunk starts other than at a video keyframe.
    pub fn tables(&mut self, out: &mut Vec<u8>) {
        self.mux.tables(out);
    }

    /// Appends the transport packets of the unit, or of the pictures it lets out (video is
    /// held back by as many pictures as it reorders, for its decoding times); `false` if it
    /// cannot be written (an AAC frame ADTS cannot frame).
    pub fn write(&mut self, u: &Unit, out: &mut Vec<u8>) -> bool {
        let Some(&Some(pid)) = self.pids.get(u.stream) else { return true };
        let (stream, mux) = (u.stream, &mut self.mux);
        if let Some(Some(times)) = self.video.get_mut(stream) {
            let stream = pid;
            times.push(u.time, (u.key, u.data.clone()), |pts, dts, (key, data)| {
                mux.push(&AccessUnit { stream, pts: ts_time(pts), dts: ts_time(dts), key, data: &data }, out)
            });
            return true;
        }
        let framed;
        let data = match self.aac.get(stream) {
            Some(Some(config)) => {
                let Some(h) = adts_header(config, u.data.len()) else { return false };
                framed = [&h[..], &u.data].concat();
                &framed
            }
            _ => &u.data,
        };
        let at = ts_time(u.time);
        mux.push(&AccessUnit { stream: pid, pts: at, dts: at, key: u.key, data }, out);
        true
    }
}

/// A session time as the muxer takes it: unsigned, modulo 2^33, with the PCR lead that keeps
/// every PES on time.
fn ts_time(time: i64) -> u64 {
    (time + crate::container::tsmux::PCR_LEAD_90K as i64).rem_euclid(1 << 33) as u64
}

enum NalType {
    /// A parameter set; `true` for the first of a set (H.264 SPS, HEVC VPS).
    Params(bool),
    /// A picture a decoder can start at.
    Key,
    Other,
}

fn nal_type(codec: Codec, nal: &[u8]) -> NalType {
    let Some(&b) = nal.first() else { return NalType::Other };
    match codec {
        Codec::H264 => match b & 0x1f {
            7 => NalType::Params(true),
            8 => NalType::Params(false),
            5 => NalType::Key,
            _ => NalType::Other,
        },
        Codec::H265 => match (b >> 1) & 0x3f {
            32 => NalType::Params(true),
            33 | 34 => NalType::Params(false),
            16..=21 => NalType::Key,
            _ => NalType::Other,
        },
    }
}

/// The AU headers of an RFC 3640 payload: each access unit's size, and where the data starts.
#[derive(Debug, PartialEq, Eq)]
struct AuHeaders {
    sizes: Vec<usize>,
    data_at: usize,
}

fn au_sizes(p: &[u8], size_bits: u8, index_bits: u8, delta_bits: u8) -> Option<AuHeaders> {
    let bits = usize::from(u16::from_be_bytes([*p.first()?, *p.get(1)?]));
    let data_at = 2 + bits.div_ceil(8);
    let headers = p.get(2..data_at)?;
    let read = |at: usize, n: u8| -> Option<usize> {
        (0..usize::from(n)).try_fold(0usize, |v, k| {
            let bit = at + k;
            Some(v << 1 | usize::from(headers.get(bit / 8)? >> (7 - bit % 8) & 1))
        })
    };
    let (mut at, mut sizes) = (0, Vec::new());
    while at + usize::from(size_bits) <= bits {
        sizes.push(read(at, size_bits)?);
        at += usize::from(size_bits) + usize::from(if sizes.len() == 1 { index_bits } else { delta_bits });
    }
    (!sizes.is_empty()).then_some(AuHeaders { sizes, data_at })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::mpegts::PACKET_LEN;
    use crate::container::tsdemux::{Demux, Pes};
    use proptest::prelude::*;

    const SDP: &str = "v=0\r\ns=x\r\nt=0 0\r\n\
        m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n\
        a=fmtp:96 packetization-mode=1;sprop-parameter-sets=Z2QAHqzZQeA,aOvjyyLA\r\n\
        m=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\n\
        a=fmtp:97 streamtype=5;profile-level-id=1;mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config=1190\r\n\
        m=audio 0 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n";

    fn tracks() -> Vec<Result<TrackInfo, crate::Invalid>> {
        crate::rtsp::sdp::Sdp::parse(SDP).unwrap().media.iter().map(TrackInfo::from_sdp).collect()
    }

    fn rtp(marker: bool, seq: u16, ts: u32, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 12 + payload.len()];
        crate::rtp::write_header(&mut p, marker, 96, seq, ts, 1);
        p[12..].copy_from_slice(payload);
        p
    }

    /// VP9, Opus and AV1 come out as whole pictures and packets: VP9's frame joined from its
    /// packets behind their descriptors, AV1's OBUs with size fields and without the
    /// temporal delimiter, Opus a packet a unit held until video starts; MPEG-TS leaves all
    /// three out.
    #[test]
    fn vp9_av1_and_opus_are_gathered_into_units_mpegts_does_not_carry() {
        let sdp = "v=0\r\ns=x\r\nt=0 0\r\n\
            m=video 0 RTP/AVP 96\r\na=rtpmap:96 VP9/90000\r\n\
            m=audio 0 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n\
            m=video 0 RTP/AVP 98\r\na=rtpmap:98 AV1/90000\r\n";
        let tracks: Vec<TrackInfo> =
            crate::rtsp::sdp::Sdp::parse(sdp).unwrap().media.iter().map(|m| TrackInfo::from_sdp(m).unwrap()).collect();
        let codecs: Vec<_> = tracks.iter().map(|t| t.codec.clone()).collect();
        assert_eq!(codecs, [TrackCodec::Vp9, TrackCodec::Opus { channels: 2 }, TrackCodec::Av1]);
        assert!(tracks.iter().all(|t| t.kind().is_none()));
        let mut r = Repackager::new(tracks.iter().cloned().map(Some).collect());
        let mut out = Vec::new();
        // Opus before any picture is held.
        r.push_rtp(1, &rtp(true, 1, 960, &[0xfc, 0xaa]), 0, &mut out);
        assert!(out.is_empty());
        // A VP9 key frame in two packets (B, then E with the marker), an inter frame in one.
        let key = [0x82, 0x49, 0x83, 0x42, 0x00, 0x13, 0xf0, 0x0e, 0xf6];
        r.push_rtp(0, &rtp(false, 1, 3000, &[&[0x88, 0x81, 0x02][..], &key[..5]].concat()), 0, &mut out);
        r.push_rtp(0, &rtp(true, 2, 3000, &[&[0x84, 0x81, 0x02][..], &key[5..]].concat()), 0, &mut out);
        r.push_rtp(0, &rtp(true, 3, 6600, &[0x8c, 0x81, 0x03, 0x86, 0x00, 0x40]), 40, &mut out);
        // A lost beginning: the rest of that frame is left out, with its picture.
        r.push_rtp(0, &rtp(true, 5, 10200, &[0x04, 0x11, 0x22]), 80, &mut out);
        let vp9: Vec<_> = out.iter().filter(|u| u.stream == 0).map(|u| (u.key, u.data.clone())).collect();
        assert_eq!(vp9, [(true, key.to_vec()), (false, vec![0x86, 0x00, 0x40])]);
        assert!(out.iter().any(|u| u.stream == 1 && u.data == [0xfc, 0xaa]), "the held Opus goes out");
        // AV1: a temporal delimiter, a sequence header and a key frame over two packets (Y,
        // then Z), W=0 so every element has its length.
        let (seq, frame) = ([0x08, 0x00, 0x00, 0x00], [0x30, 0x10, 0xaa, 0xbb]);
        out.clear();
        let first = [&[0x40, 1, 0x10, 4][..], &seq, &[2], &frame[..2]].concat();
        let second = [&[0x80, 2][..], &frame[2..]].concat();
        r.push_rtp(2, &rtp(false, 1, 3000, &first), 100, &mut out);
        r.push_rtp(2, &rtp(true, 2, 3000, &second), 100, &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].key);
        assert_eq!(out[0].data, [&[0x0a, 3][..], &seq[1..], &[0x32, 3], &frame[1..]].concat());
        // MPEG-TS has no stream for any of them.
        let mut ts = TsPackager::new(&tracks);
        let mut bytes = Vec::new();
        assert!(ts.write(&out[0], &mut bytes));
        assert!(bytes.is_empty());
    }

    /// A camera's MP3 and G.711, on static payload types without an rtpmap: MP3 split into
    /// its frames, each at its own time; G.711 a packet a unit.
    #[test]
    fn mp3_and_g711_come_out_frame_by_frame() {
        let sdp = "v=0\r\ns=x\r\nt=0 0\r\n\
            m=audio 0 RTP/AVP 14\r\nm=audio 0 RTP/AVP 0\r\nm=audio 0 RTP/AVP 8\r\n";
        let tracks: Vec<TrackInfo> =
            crate::rtsp::sdp::Sdp::parse(sdp).unwrap().media.iter().map(|m| TrackInfo::from_sdp(m).unwrap()).collect();
        let codecs: Vec<_> = tracks.iter().map(|t| (t.codec.clone(), t.clock)).collect();
        assert_eq!(
            codecs,
            [
                (TrackCodec::Mpa, 90_000),
                (TrackCodec::G711 { mu_law: true }, 8000),
                (TrackCodec::G711 { mu_law: false }, 8000)
            ]
        );
        let mut r = Repackager::new(tracks.into_iter().map(Some).collect());
        let mut out = Vec::new();
        // Two 128 kbit/s 44.1 kHz frames in one packet: 1152 samples (2351 at 90 kHz) apart.
        let mut frame = vec![0xff, 0xfb, 0x90, 0x44];
        frame.resize(417, 0);
        r.push_rtp(0, &rtp(true, 1, 9000, &[&[0, 0, 0, 0][..], &frame, &frame].concat()), 0, &mut out);
        r.push_rtp(1, &rtp(true, 1, 800, &[0xff; 160]), 0, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].time - out[0].time, 2351);
        assert!(out[..2].iter().all(|u| u.data == frame));
        assert_eq!(out[2].data, [0xff; 160]);
    }

    /// A repackager and its MPEG-TS, for feeding packets.
    struct ToTs(Repackager, TsPackager, Vec<Unit>);

    impl ToTs {
        fn new() -> Self {
            let r = Repackager::new(tracks().into_iter().map(Result::ok).collect());
            let ts = TsPackager::new(r.streams());
            Self(r, ts, Vec::new())
        }

        fn push_rtp(&mut self, i: usize, pkt: &[u8], now_ms: u64, out: &mut Vec<u8>) {
            self.0.push_rtp(i, pkt, now_ms, &mut self.2);
            for u in self.2.drain(..) {
                assert!(self.1.write(&u, out));
            }
        }
    }

    fn demux(ts: &[u8]) -> Vec<Pes> {
        let mut d = Demux::default();
        let mut out: Vec<Pes> = ts.chunks(PACKET_LEN).filter_map(|p| d.push(p)).collect();
        out.extend(d.flush());
        assert_eq!(d.errors, 0);
        out
    }

    #[test]
    fn reads_the_tracks_of_a_description() {
        let t = tracks();
        let TrackCodec::Video { codec: Codec::H264, params } = &t[0].as_ref().unwrap().codec else { panic!() };
        assert_eq!(params.len(), 2);
        assert_eq!(params[0][0] & 0x1f, 7);
        assert_eq!(
            t[1].as_ref().unwrap(),
            &TrackInfo {
                codec: TrackCodec::Aac { config: vec![0x11, 0x90], size_bits: 13, index_bits: 3, delta_bits: 3 },
                clock: 48_000
            }
        );
        // PCMU on its static payload type, for HLS and recordings (MPEG-TS leaves it out).
        assert_eq!(t[2].as_ref().unwrap().codec, TrackCodec::G711 { mu_law: true });
        assert_eq!(t[2].as_ref().unwrap().kind(), None);
        let vp8 = "v=0\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 VP8/90000\r\nm=audio 0 RTP/AVP 101\r\n";
        let t: Vec<_> = crate::rtsp::sdp::Sdp::parse(vp8).unwrap().media.iter().map(TrackInfo::from_sdp).collect();
        assert!(t[0].as_ref().unwrap_err().0.contains("VP8"), "{:?}", t[0]);
        assert!(t[1].as_ref().unwrap_err().0.contains("rtpmap"), "{:?}", t[1]);
    }

    #[test]
    fn au_headers_of_several_units() {
        // Two AUs of 5 and 3 bytes, hbr (13 + 3 bits each).
        let p = [0, 32, 0, 5 << 3, 0, 3 << 3, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(au_sizes(&p, 13, 3, 3), Some(AuHeaders { sizes: vec![5, 3], data_at: 6 }));
        assert_eq!(au_sizes(&p[..3], 13, 3, 3), None);
        assert_eq!(au_sizes(&[0, 0], 13, 3, 3), None);
    }

    /// H.264 access units as RTP (FU-A where large), AAC frames as RFC 3640: the TS holds
    /// every unit from the first keyframe on, parameter sets in front of the keyframe, and
    /// audio and video on one timeline.
    #[test]
    fn repackages_video_and_audio() {
        let mut r = ToTs::new();
        let mut out = Vec::new();
        let (mut seq, mut scratch) = (0u16, Vec::new());
        for frame in 0..14u32 {
            let now = 1000 + u64::from(frame) * 40;
            let ts = 5000 + frame * 3600;
            // A P slice first (dropped: no keyframe yet), then an IDR at frame 1.
            let nal: Vec<u8> = if frame == 1 {
                [0x65].iter().chain(&[7u8; 3000]).copied().collect()
            } else {
                vec![0x41, frame as u8, 1, 2]
            };
            let mut pkts = Vec::new();
            crate::codec::annexb::packetize(Codec::H264, &nal, 1200, &mut scratch, |p, last| {
                pkts.push((p.to_vec(), last))
            });
            for (p, last) in pkts {
                seq += 1;
                r.push_rtp(0, &rtp(last, seq, ts, &p), now, &mut out);
            }
            // One AAC frame per 40 ms of RTP time (48 kHz).
            let a = crate::codec::aac::rtp_payload(&[frame as u8; 200]).unwrap();
            r.push_rtp(1, &rtp(true, seq, 77 + frame * 1920, &a), now, &mut out);
            r.push_rtp(2, &rtp(true, seq, 0, &[0; 160]), now, &mut out); // PCMU: not in MPEG-TS
        }
        let pes = demux(&out);
        let video: Vec<&Pes> = pes.iter().filter(|p| p.stream_type == 0x1b).collect();
        // (The last four are held while the stream's reordering is learned.)
        assert_eq!(video.len(), 9, "frames 1..=9");
        let nals: Vec<u8> = crate::codec::annexb::nal_units(&video[0].data).map(|n| n[0] & 0x1f).collect();
        assert_eq!(nals, [9, 7, 8, 5], "AUD, SPS, PPS, IDR");
        assert_eq!(crate::codec::annexb::nal_units(&video[0].data).last().unwrap().len(), 3001);
        let steps: Vec<u64> = video.windows(2).map(|w| w[1].pts.unwrap() - w[0].pts.unwrap()).collect();
        assert!(steps.iter().all(|s| *s == 3600), "{steps:?}");
        let audio: Vec<&Pes> = pes.iter().filter(|p| p.stream_type == 0x0f).collect();
        assert_eq!(audio.len(), 13, "from the keyframe on");
        let frames = crate::codec::aac::adts_frames(&audio[0].data);
        assert_eq!((frames.len(), frames[0].au), (1, &[1u8; 200][..]));
        // Both started at the same arrival time: the audio of frame 1 is at the video's time.
        assert_eq!(audio[0].pts, video[0].pts);
        assert_eq!(r.0.stats.dropped, 3, "frame 0's picture, AAC and G.711");
    }

    /// Three AAC frames in a packet before the first keyframe: the ones due from the
    /// keyframe on go out after it, by their own times; the earlier one is dropped.
    #[test]
    fn audio_held_before_the_first_keyframe_goes_out_by_its_time() {
        let mut r = Repackager::new(tracks().into_iter().map(Result::ok).collect());
        let mut out = Vec::new();
        let a = crate::codec::aac::rtp_payload_of(&[&[1; 50], &[2; 50], &[3; 50]]).unwrap();
        r.push_rtp(1, &rtp(true, 1, 0, &a), 1000, &mut out);
        assert!(out.is_empty(), "no video yet");
        // The keyframe comes 15 ms later: the frames at 21.3 and 42.7 ms are after it.
        r.push_rtp(0, &rtp(true, 1, 0, &[0x65, 1, 2]), 1015, &mut out);
        r.push_rtp(0, &rtp(true, 2, 3600, &[0x41, 1, 2]), 1055, &mut out);
        let video = out.iter().find(|u| u.stream == 0).expect("the keyframe").time;
        let audio: Vec<(i64, u8)> = out.iter().filter(|u| u.stream == 1).map(|u| (u.time - video, u.data[0])).collect();
        assert_eq!(audio, [(1920 - 1350, 2), (3840 - 1350, 3)]);
        assert_eq!(r.stats.dropped, 1, "the frame before the keyframe");
    }

    /// B-frames (RTP times going back in decoding order) get decoding times in the TS that
    /// rise strictly and precede their presentation times: a frame behind for I P B B.
    #[test]
    fn b_frames_get_decoding_times() {
        let mut r = ToTs::new();
        let mut out = Vec::new();
        let order = [0u32, 3, 1, 2, 6, 4, 5, 9, 7, 8, 12, 10, 11];
        for (k, &f) in order.iter().enumerate() {
            let nal = if k == 0 { vec![0x65, 1, 2] } else { vec![0x41, f as u8, 2] };
            r.push_rtp(0, &rtp(true, k as u16, 9000 + f * 3600, &nal), 1000 + k as u64 * 40, &mut out);
        }
        let pes = demux(&out);
        let times: Vec<(u64, u64)> = pes.iter().map(|p| (p.pts.unwrap(), p.dts.unwrap_or(p.pts.unwrap()))).collect();
        assert_eq!(times.len(), order.len() - 4, "four held while the reordering is learned");
        assert!(times.windows(2).all(|w| w[1].1 > w[0].1), "{times:?}");
        assert!(times.iter().all(|(pts, dts)| dts <= pts), "{times:?}");
        assert_eq!(times[1].0 - times[1].1, 3 * 3600, "P3, shown at 3, decoded at 0: the second turn less a frame");
    }

    /// With the source's wall clock known for both tracks, audio joins the timeline where
    /// the source put it, however late it arrives.
    #[test]
    fn sender_reports_place_a_late_track() {
        let mut r = ToTs::new();
        let ntp = 1u64 << 40;
        // Video RTP 90000 and audio RTP 48000 are the same instant.
        r.0.set_clock_map(0, ntp, 90_000);
        r.0.set_clock_map(1, ntp, 48_000);
        let mut out = Vec::new();
        r.push_rtp(0, &rtp(true, 1, 90_000, &[0x65, 1]), 0, &mut out);
        // Audio for half a second later arrives 3 s later.
        let a = crate::codec::aac::rtp_payload(&[1; 20]).unwrap();
        r.push_rtp(1, &rtp(true, 1, 72_000, &a), 3_000, &mut out);
        // (Pictures that let the first out of the reordering.)
        for k in 1..5u16 {
            r.push_rtp(0, &rtp(true, 1 + k, 90_000 + u32::from(k) * 3600, &[0x41, 1]), 3_000, &mut out);
        }
        let pes = demux(&out);
        let first = |stream_type| pes.iter().find(|p| p.stream_type == stream_type).unwrap().pts.unwrap();
        assert_eq!(first(0x0f) - first(0x1b), 45_000);
    }

    proptest! {
        /// Any bytes as packets of any track: no panic, and output in whole packets.
        #[test]
        fn never_panics(pkts in proptest::collection::vec((0usize..4, proptest::collection::vec(any::<u8>(), 0..400)), 0..60)) {
            let mut r = ToTs::new();
            let mut out = Vec::new();
            for (i, (track, mut p)) in pkts.into_iter().enumerate() {
                if p.len() >= 12 {
                    p[0] = 0x80; // mostly RTP
                    if i % 3 == 0 { p[12..].iter_mut().take(1).for_each(|b| *b = 0x65); }
                }
                r.push_rtp(track, &p, i as u64, &mut out);
            }
            prop_assert_eq!(out.len() % PACKET_LEN, 0);
        }

        #[test]
        fn au_headers_never_overrun(p in proptest::collection::vec(any::<u8>(), 0..64), size in 1u8..16, idx in 0u8..4) {
            if let Some(h) = au_sizes(&p, size, idx, idx) {
                prop_assert!(h.data_at <= p.len());
                prop_assert!(h.sizes.iter().all(|s| *s < 1 << size));
            }
        }
    }
}
