//! HLS as a source: another server's live (or Low-Latency) HLS read as a path's stream.
//! Sans-IO: playlist text and segment bytes in; which URLs to fetch next and the access
//! units, on one timeline, out.
//!
//! - [`parse`] reads a multivariant or media playlist (RFC 8216; the LL-HLS tags are
//!   understood and passed over: whole segments are read, not parts).
//! - [`Multivariant::choose`] picks the variant the relay can carry with the most bandwidth,
//!   and its audio rendition where the audio is a playlist of its own (MediaMTX's fMP4).
//! - [`Follower`] says which segments of a refreshed media playlist are new.
//! - [`ts_units`] and [`fmp4_units`] take the access units out of an MPEG-TS or fMP4
//!   segment (H.264, H.265 in Annex B; AAC with its ADTS header), times on 90 kHz.
//! - [`Merge`] puts the units of a variant and its audio rendition in decoding order and
//!   keeps the timeline going across discontinuities and restarts of the far side.
//!
//! The units are what [`crate::container::tsmux`] takes: the caller muxes them into one
//! MPEG-TS and reads that as an SRT publisher's ([`crate::container::tsingest`]).

use crate::container::mp4ts::{annexb, boxes, child, hvcc};
use crate::container::tsdemux::{Demux, STREAM_TYPE_AAC, STREAM_TYPE_H264, STREAM_TYPE_H265};
use crate::container::tsmux::{adts_header, StreamKind};
use crate::Invalid;
use std::collections::VecDeque;

/// A live playlist is read from this many segments before its end: a segment's worth of
/// time to fetch the next one in, as RFC 8216 §6.3.3 asks (at least three target durations
/// from the end), and the latency a relay adds.
pub const START_BEHIND: usize = 3;
/// A jump of the timeline larger than this (90 kHz) is a discontinuity, smoothed over.
const JUMP_90K: i64 = 5 * 90_000;
/// Units this far (90 kHz) behind the last are late (a rendition behind the variant), not a
/// jump.
const BACK_90K: i64 = 90_000;

#[derive(Debug, Clone, PartialEq)]
pub enum Playlist {
    Multivariant(Multivariant),
    Media(Media),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Multivariant {
    pub variants: Vec<Variant>,
    /// `EXT-X-MEDIA` renditions of `TYPE=AUDIO`.
    pub audio: Vec<Rendition>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Variant {
    pub uri: String,
    pub bandwidth: u64,
    /// Its `CODECS` attribute (empty when not given).
    pub codecs: String,
    /// Its `AUDIO` group.
    pub audio: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rendition {
    pub group: String,
    /// `None`: the audio is in the variant's own segments.
    pub uri: Option<String>,
    pub default: bool,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Media {
    pub target_duration: f64,
    pub segments: Vec<Segment>,
    /// `EXT-X-ENDLIST`: nothing will be added.
    pub ended: bool,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Segment {
    pub uri: String,
    pub sequence: u64,
    pub duration: f64,
    /// The initialization section (`EXT-X-MAP`) it needs: an fMP4 segment.
    pub map: Option<String>,
}

/// An attribute list's value for `key` (quotes taken off).
fn attr<'a>(list: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = list;
    while !rest.is_empty() {
        let (k, after) = rest.split_once('=')?;
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], q[end + 1..].trim_start_matches(','))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], after[end..].trim_start_matches(','))
        };
        if k.trim() == key {
            return Some(v);
        }
        rest = next;
    }
    None
}

/// A playlist's text: what it lists, or why it cannot be followed.
pub fn parse(text: &str) -> Result<Playlist, Invalid> {
    let mut lines = text.trim_start_matches('\u{feff}').lines().map(str::trim).filter(|l| !l.is_empty());
    if lines.next() != Some("#EXTM3U") {
        return Err("not an HLS playlist (no #EXTM3U)".into());
    }
    let (mut mv, mut media) = (Multivariant::default(), Media::default());
    let (mut is_media, mut sequence, mut map) = (false, 0u64, None::<String>);
    let mut pending_variant: Option<Variant> = None;
    let mut pending_duration: Option<f64> = None;
    for line in lines {
        if let Some(tag) = line.strip_prefix('#') {
            let (name, value) = tag.split_once(':').unwrap_or((tag, ""));
            match name {
                "EXT-X-STREAM-INF" => {
                    pending_variant = Some(Variant {
                        uri: String::new(),
                        bandwidth: attr(value, "BANDWIDTH").and_then(|b| b.parse().ok()).unwrap_or(0),
                        codecs: attr(value, "CODECS").unwrap_or("").to_string(),
                        audio: attr(value, "AUDIO").map(str::to_string),
                    })
                }
                "EXT-X-MEDIA" if attr(value, "TYPE") == Some("AUDIO") => mv.audio.push(Rendition {
                    group: attr(value, "GROUP-ID").unwrap_or("").to_string(),
                    uri: attr(value, "URI").map(str::to_string),
                    default: attr(value, "DEFAULT") == Some("YES"),
                }),
                "EXT-X-TARGETDURATION" => {
                    is_media = true;
                    media.target_duration =
                        value.parse().map_err(|_| format!("a bad #EXT-X-TARGETDURATION: {value}"))?;
                }
                "EXT-X-MEDIA-SEQUENCE" => {
                    sequence = value.parse().map_err(|_| format!("a bad #EXT-X-MEDIA-SEQUENCE: {value}"))?
                }
                "EXTINF" => {
                    is_media = true;
                    let d = value.split(',').next().unwrap_or("");
                    pending_duration = Some(d.trim().parse().map_err(|_| format!("a bad #EXTINF: {value}"))?);
                }
                "EXT-X-MAP" => {
                    if attr(value, "BYTERANGE").is_some() {
                        return Err("an initialization section given as a byte range is not read".into());
                    }
                    map = Some(attr(value, "URI").ok_or("#EXT-X-MAP without a URI")?.to_string());
                }
                "EXT-X-BYTERANGE" => return Err("segments given as byte ranges are not read".into()),
                "EXT-X-KEY" if attr(value, "METHOD").is_some_and(|m| m != "NONE") => {
                    return Err("encrypted HLS (#EXT-X-KEY) is not read".into())
                }
                "EXT-X-ENDLIST" => media.ended = true,
                // Parts, hints, skips, dates, versions: the whole segments are what is read.
                _ => {}
            }
        } else if let Some(mut v) = pending_variant.take() {
            v.uri = line.to_string();
            mv.variants.push(v);
        } else if let Some(duration) = pending_duration.take() {
            media.segments.push(Segment { uri: line.to_string(), sequence, duration, map: map.clone() });
            sequence += 1;
        }
    }
    if is_media {
        if media.target_duration <= 0.0 && media.segments.is_empty() {
            return Err("a media playlist without #EXT-X-TARGETDURATION".into());
        }
        Ok(Playlist::Media(media))
    } else if mv.variants.is_empty() {
        Err("a playlist with neither variants nor segments".into())
    } else {
        Ok(Playlist::Multivariant(mv))
    }
}

/// Whether a variant's `CODECS` name only what the relay carries (none named: maybe).
fn carried(codecs: &str) -> bool {
    codecs
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .all(|c| ["avc1", "avc3", "hvc1", "hev1", "mp4a.40"].iter().any(|p| c.starts_with(p)))
}

impl Multivariant {
    /// The variant to read (the highest bandwidth among those whose codecs the relay
    /// carries, else the highest), and its audio rendition's playlist where the audio is
    /// not in the variant's own segments.
    pub fn choose(&self) -> Option<(&Variant, Option<&str>)> {
        let best = |ok: &dyn Fn(&Variant) -> bool| self.variants.iter().filter(|v| ok(v)).max_by_key(|v| v.bandwidth);
        let v = best(&|v| carried(&v.codecs)).or_else(|| best(&|_| true))?;
        let audio = v.audio.as_ref().and_then(|g| {
            let group: Vec<&Rendition> = self.audio.iter().filter(|r| &r.group == g).collect();
            let r = group.iter().find(|r| r.default).or(group.first())?;
            r.uri.as_deref()
        });
        Some((v, audio))
    }
}

/// `uri` as seen from the playlist at `base` (RFC 3986 §5.2, for the forms playlists use).
pub fn resolve(base: &str, uri: &str) -> String {
    if uri.contains("://") {
        return uri.to_string();
    }
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    if let Some(rest) = uri.strip_prefix("//") {
        return format!("{}{rest}", &base[..scheme_end]);
    }
    let authority_end = base[scheme_end..].find('/').map_or(base.len(), |i| scheme_end + i);
    if uri.starts_with('/') {
        return format!("{}{uri}", &base[..authority_end]);
    }
    let path = base[..base.find(['?', '#']).unwrap_or(base.len())].to_string();
    let dir = path[authority_end..].rfind('/').map_or(path.len(), |i| authority_end + i + 1);
    if dir == path.len() && !path.ends_with('/') {
        return format!("{path}/{uri}");
    }
    format!("{}{uri}", &path[..dir])
}

/// Where a reader of one media playlist is: the next segment it wants.
#[derive(Debug, Default, Clone)]
pub struct Follower {
    next: Option<u64>,
    /// Segments that went from the playlist before they were read (the reader fell
    /// behind) or a restart of the far side's numbering.
    pub skipped: u64,
}

impl Follower {
    /// The segments of a refreshed playlist not read yet, in order: at first (and after the
    /// far side's numbering started again) the last [`START_BEHIND`] of a live one, every one
    /// of an ended one.
    pub fn due<'a>(&mut self, m: &'a Media) -> &'a [Segment] {
        let (Some(first), Some(last)) = (m.segments.first(), m.segments.last()) else { return &[] };
        let start = |m: &'a Media| {
            let from = if m.ended { 0 } else { m.segments.len().saturating_sub(START_BEHIND) };
            &m.segments[from..]
        };
        let new = match self.next {
            None => start(m),
            // Numbered anew: the far side restarted.
            Some(n) if n > last.sequence + 1 => {
                self.skipped += 1;
                start(m)
            }
            Some(n) if n < first.sequence => {
                self.skipped += first.sequence - n;
                &m.segments[..]
            }
            Some(n) => &m.segments[(n - first.sequence) as usize..],
        };
        if let Some(s) = new.last() {
            self.next = Some(s.sequence + 1);
        }
        new
    }
}

/// One access unit: H.264/H.265 in Annex B (an access unit delimiter first, the parameter
/// sets in front of a keyframe), or an AAC frame with its ADTS header; times on 90 kHz.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub kind: StreamKind,
    pub pts: u64,
    pub dts: u64,
    pub key: bool,
    pub data: Vec<u8>,
}

fn kind_of(stream_type: u8) -> Option<StreamKind> {
    match stream_type {
        STREAM_TYPE_H264 => Some(StreamKind::H264),
        STREAM_TYPE_H265 => Some(StreamKind::H265),
        STREAM_TYPE_AAC => Some(StreamKind::AacAdts),
        _ => None,
    }
}

/// The access units of an MPEG-TS segment, in its order, and how many packets or PES did
/// not parse (a segment starts with its tables, as RFC 8216 §3.2 asks). Streams other than
/// H.264, H.265 and AAC are left out.
pub fn ts_units(seg: &[u8]) -> (Vec<Unit>, u64) {
    let mut demux = Demux::default();
    let mut pes = Vec::new();
    for pkt in seg.chunks_exact(crate::container::mpegts::PACKET_LEN) {
        pes.extend(demux.push(pkt));
    }
    pes.extend(demux.flush());
    let mut errors = demux.errors + u64::from(!seg.len().is_multiple_of(crate::container::mpegts::PACKET_LEN));
    let units = pes
        .into_iter()
        .filter_map(|p| {
            let kind = kind_of(p.stream_type)?;
            let Some(pts) = p.pts else {
                errors += 1;
                return None;
            };
            let key = match kind {
                StreamKind::H264 => {
                    crate::codec::annexb::nal_units(&p.data).any(|n| n.first().is_some_and(|b| b & 0x1f == 5))
                }
                StreamKind::H265 => crate::codec::annexb::nal_units(&p.data)
                    .any(|n| n.first().is_some_and(|b| (16..=23).contains(&((b >> 1) & 0x3f)))),
                StreamKind::AacAdts | StreamKind::Mpa => true,
            };
            Some(Unit { kind, pts, dts: p.dts.unwrap_or(pts), key, data: p.data })
        })
        .collect();
    (units, errors)
}

/// One track of an fMP4 initialization section that the relay carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitTrack {
    pub id: u32,
    pub kind: StreamKind,
    pub timescale: u32,
    /// H.264/H.265: the NAL length size and the parameter sets (Annex B); AAC: 0 and the
    /// AudioSpecificConfig.
    nal_len: usize,
    prefix: Vec<u8>,
    /// `trex` defaults: duration, size, flags.
    defaults: (u32, u32, u32),
}

/// An fMP4 initialization section (`ftyp` + `moov`): its tracks the relay carries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Init {
    pub tracks: Vec<InitTrack>,
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// An `avcC`: the NAL length size and the SPS and PPS in Annex B.
fn avcc(b: &[u8]) -> Option<(usize, Vec<u8>)> {
    let nal_len = usize::from(b.get(4)? & 3) + 1;
    let (mut at, mut prefix) = (5, Vec::new());
    for mask in [0x1f, 0xff] {
        let n = b.get(at)? & mask;
        at += 1;
        for _ in 0..n {
            let l = usize::from(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]));
            prefix.extend_from_slice(&[0, 0, 0, 1]);
            prefix.extend_from_slice(b.get(at + 2..at + 2 + l)?);
            at += 2 + l;
        }
    }
    (!prefix.is_empty()).then_some((nal_len, prefix))
}

/// The AudioSpecificConfig in an `esds` (ISO/IEC 14496-1 descriptors: ES, then decoder
/// configuration, then decoder specific information).
fn esds_asc(b: &[u8]) -> Option<Vec<u8>> {
    // A descriptor's tag and length (up to four bytes of seven bits): where its body starts.
    fn open(b: &[u8], at: usize, tag: u8) -> Option<(usize, usize)> {
        if *b.get(at)? != tag {
            return None;
        }
        let (mut len, mut i) = (0usize, at + 1);
        for _ in 0..4 {
            let c = *b.get(i)?;
            len = (len << 7) | usize::from(c & 0x7f);
            i += 1;
            if c & 0x80 == 0 {
                break;
            }
        }
        Some((i, len))
    }
    let (es, _) = open(b, 4, 0x03)?;
    let flags = *b.get(es + 2)?;
    let mut at = es + 3;
    if flags & 0x80 != 0 {
        at += 2;
    }
    if flags & 0x40 != 0 {
        at += 1 + usize::from(*b.get(at)?);
    }
    if flags & 0x20 != 0 {
        at += 2;
    }
    let (dc, _) = open(b, at, 0x04)?;
    let (dsi, len) = open(b, dc + 13, 0x05)?;
    b.get(dsi..dsi + len).map(<[u8]>::to_vec)
}

/// Reads an initialization section: its H.264, H.265 and AAC tracks (others left out).
pub fn init(bytes: &[u8]) -> Result<Init, Invalid> {
    let moov = child(bytes, b"moov").ok_or("an initialization section without a moov")?;
    let mut trex = Vec::new();
    if let Some(mvex) = child(moov, b"mvex") {
        for (_, t) in boxes(mvex).filter(|b| b.0 == b"trex") {
            if let (Some(id), Some(d), Some(s), Some(f)) = (be32(t, 4), be32(t, 12), be32(t, 16), be32(t, 20)) {
                trex.push((id, (d, s, f)));
            }
        }
    }
    let mut tracks = Vec::new();
    for (_, trak) in boxes(moov).filter(|b| b.0 == b"trak") {
        let track = || -> Option<InitTrack> {
            let tkhd = child(trak, b"tkhd")?;
            let id = be32(tkhd, if *tkhd.first()? == 1 { 20 } else { 12 })?;
            let mdia = child(trak, b"mdia")?;
            let mdhd = child(mdia, b"mdhd")?;
            let timescale = be32(mdhd, if *mdhd.first()? == 1 { 20 } else { 12 })?;
            let stsd = [&b"minf"[..], b"stbl", b"stsd"].iter().try_fold(mdia, |b, k| child(b, k))?;
            let (entry_kind, entry) = boxes(stsd.get(8..)?).next()?;
            let (kind, nal_len, prefix) = match entry_kind {
                b"avc1" | b"avc3" => {
                    let (n, p) = avcc(child(entry.get(78..)?, b"avcC")?)?;
                    (StreamKind::H264, n, p)
                }
                b"hvc1" | b"hev1" => {
                    let (n, p) = hvcc(child(entry.get(78..)?, b"hvcC")?).ok()?;
                    (StreamKind::H265, n, p)
                }
                b"mp4a" => {
                    let asc = esds_asc(child(entry.get(28..)?, b"esds")?)?;
                    adts_header(&asc, 0)?;
                    (StreamKind::AacAdts, 0, asc)
                }
                _ => return None,
            };
            let defaults = trex.iter().find(|t| t.0 == id).map_or((0, 0, 0), |t| t.1);
            (timescale > 0).then_some(InitTrack { id, kind, timescale, nal_len, prefix, defaults })
        };
        tracks.extend(track());
    }
    if tracks.is_empty() {
        return Err("an initialization section with no H.264, H.265 or AAC track".into());
    }
    Ok(Init { tracks })
}

/// The access units of an fMP4 segment (one or more `moof` + `mdat`), in decoding order.
pub fn fmp4_units(init: &Init, seg: &[u8]) -> Result<Vec<Unit>, Invalid> {
    let mut units = Vec::new();
    let mut at = 0usize;
    for (kind, body) in boxes(seg) {
        let start = at;
        at += body.len() + (body.as_ptr() as usize - seg[start..].as_ptr() as usize);
        if kind == b"moof" {
            moof(init, body, seg, start, &mut units).ok_or("a moof that does not parse")?;
        }
    }
    if at != seg.len() {
        return Err("a segment cut short".into());
    }
    units.sort_by_key(|u| (u.dts, u.kind == StreamKind::AacAdts));
    Ok(units)
}

/// The samples of one `moof`, at `moof_at` in `seg` (where its data offsets count from,
/// unless a `tfhd` gives its own base).
fn moof(init: &Init, body: &[u8], seg: &[u8], moof_at: usize, units: &mut Vec<Unit>) -> Option<()> {
    for (_, traf) in boxes(body).filter(|b| b.0 == b"traf") {
        let tfhd = child(traf, b"tfhd")?;
        let flags = be32(tfhd, 0)? & 0xff_ffff;
        let Some(t) = init.tracks.iter().find(|t| Some(t.id) == be32(tfhd, 4)) else { continue };
        let mut i = 8;
        let mut base = moof_at;
        if flags & 0x01 != 0 {
            base = usize::try_from(be64(tfhd, i)?).ok()?;
            i += 8;
        }
        if flags & 0x02 != 0 {
            i += 4;
        }
        let (mut dur, mut size, mut sflags) = t.defaults;
        for (bit, v) in [(0x08, &mut dur), (0x10, &mut size), (0x20, &mut sflags)] {
            if flags & bit != 0 {
                *v = be32(tfhd, i)?;
                i += 4;
            }
        }
        let mut dts = match child(traf, b"tfdt") {
            Some(d) if d.first() == Some(&1) => be64(d, 4)?,
            Some(d) => u64::from(be32(d, 4)?),
            None => 0,
        };
        let mut data_at = base;
        for (_, trun) in boxes(traf).filter(|b| b.0 == b"trun") {
            let tf = be32(trun, 0)? & 0xff_ffff;
            let signed = trun[0] == 1;
            let count = be32(trun, 4)? as usize;
            let mut j = 8;
            if tf & 0x01 != 0 {
                data_at = base.checked_add_signed(be32(trun, j)? as i32 as isize)?;
                j += 4;
            }
            let mut first_flags = None;
            if tf & 0x04 != 0 {
                first_flags = Some(be32(trun, j)?);
                j += 4;
            }
            if count > trun.len() {
                return None;
            }
            for k in 0..count {
                let (mut d, mut s, mut f, mut cto) =
                    (dur, size, if k == 0 { first_flags.unwrap_or(sflags) } else { sflags }, 0i64);
                for (bit, v) in [(0x100, &mut d), (0x200, &mut s), (0x400, &mut f)] {
                    if tf & bit != 0 {
                        *v = be32(trun, j)?;
                        j += 4;
                    }
                }
                if tf & 0x800 != 0 {
                    let c = be32(trun, j)?;
                    cto = if signed { i64::from(c as i32) } else { i64::from(c) };
                    j += 4;
                }
                let sample = seg.get(data_at..data_at.checked_add(s as usize)?)?;
                data_at += s as usize;
                let to90 = |v: i128| (v * 90_000 / i128::from(t.timescale)) as i64;
                let (d90, p90) = (to90(i128::from(dts)), to90(i128::from(dts) + i128::from(cto)));
                dts += u64::from(d);
                let mut data = Vec::with_capacity(sample.len() + t.prefix.len() + 16);
                let key = match t.kind {
                    StreamKind::AacAdts => {
                        data.extend_from_slice(&adts_header(&t.prefix, sample.len())?);
                        data.extend_from_slice(sample);
                        true
                    }
                    kind => {
                        let key = f & 0x0001_0000 == 0;
                        match kind {
                            StreamKind::H265 => data.extend_from_slice(&[0, 0, 0, 1, 0x46, 0x01, 0x50]),
                            _ => data.extend_from_slice(&[0, 0, 0, 1, 0x09, 0xf0]),
                        }
                        if key {
                            data.extend_from_slice(&t.prefix);
                        }
                        annexb(sample, t.nal_len, &mut data).ok()?;
                        key
                    }
                };
                units.push(Unit { kind: t.kind, pts: p90.max(0) as u64, dts: d90.max(0) as u64, key, data });
            }
        }
    }
    Some(())
}

/// The units of a variant and its audio rendition (each a *source* of the merge), in
/// decoding order on one timeline that keeps going: a jump of the far side's clock (a
/// discontinuity, its restart) is taken out, so the stream's times never go back or leap.
#[derive(Debug)]
pub struct Merge {
    queues: Vec<VecDeque<Unit>>,
    /// Added to the far side's times (90 kHz).
    offset: i64,
    last: Option<u64>,
    /// How far (90 kHz) one source may run ahead while another has nothing: past it the
    /// silent one is not waited for.
    patience_90k: u64,
}

impl Merge {
    pub fn new(sources: usize, patience_90k: u64) -> Self {
        Self { queues: vec![VecDeque::new(); sources], offset: 0, last: None, patience_90k }
    }

    /// A segment's units from `source`.
    pub fn push(&mut self, source: usize, units: Vec<Unit>) {
        self.queues[source].extend(units);
    }

    /// The next unit in decoding order, retimed; `None` while a source with nothing queued
    /// may still bring an earlier one.
    pub fn pop(&mut self) -> Option<Unit> {
        let heads: Vec<Option<u64>> = self.queues.iter().map(|q| q.front().map(|u| u.dts)).collect();
        let (src, dts) = heads.iter().enumerate().filter_map(|(i, d)| d.map(|d| (i, d))).min_by_key(|p| p.1)?;
        if heads.iter().any(Option::is_none) {
            let span =
                |q: &VecDeque<Unit>| q.back().map_or(0, |b| b.dts.saturating_sub(q.front().map_or(b.dts, |f| f.dts)));
            if self.queues.iter().map(span).max().unwrap_or(0) < self.patience_90k {
                return None;
            }
        }
        let mut u = self.queues[src].pop_front()?;
        let at = dts as i64 + self.offset;
        if let Some(last) = self.last {
            // (A far side's decoding times never go back: over a second back is a jump too.)
            if at > last as i64 + JUMP_90K || at < last as i64 - BACK_90K {
                // Follow on one frame (40 ms) after the last unit.
                self.offset = last as i64 + 3_600 - dts as i64;
            }
        }
        let shift = |t: u64| (t as i64 + self.offset).max(0) as u64;
        (u.dts, u.pts) = (shift(u.dts), shift(u.pts));
        self.last = Some(self.last.map_or(u.dts, |l| l.max(u.dts)));
        Some(u)
    }

    /// The kinds of the units queued: a video kind first (one of each at most).
    pub fn kinds(&self) -> Vec<StreamKind> {
        let mut kinds: Vec<StreamKind> = Vec::new();
        for u in self.queues.iter().flatten() {
            let video = u.kind != StreamKind::AacAdts;
            if !kinds.iter().any(|k| (*k != StreamKind::AacAdts) == video) {
                kinds.push(u.kind);
            }
        }
        kinds.sort_by_key(|k| *k == StreamKind::AacAdts);
        kinds
    }

    /// Units queued, over all sources.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests;
