//! Recording: a path's access units into fragmented MP4 files, and those files read back for
//! playback. Sans-IO: units and the wall clock in, file operations out; file bytes in, an
//! index of their fragments, playlists and retimed fragments out.
//!
//! A file is an initialization segment, then one `moof` + `mdat` fragment per fragment
//! duration, each starting at a keyframe. Fragments are appended as they complete, so a file
//! cut short (the process killed) plays up to its last whole fragment, and [`scan`] finds
//! exactly those. Files are named after a [`Layout`] by the UTC time of their first frame.

use crate::container::hls::Segmenter;
use crate::container::repack::{TrackInfo, Unit};
use bytes::Bytes;
use std::collections::HashMap;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

/// What a recording's files hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Fragmented MP4 (`.mp4`): an initialization segment, then `moof` + `mdat` fragments.
    #[default]
    Fmp4,
    /// MPEG-TS (`.ts`), as [`crate::container::recordts`] writes it.
    MpegTs,
}

impl Format {
    /// Its files' extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Fmp4 => "mp4",
            Format::MpegTs => "ts",
        }
    }

    /// The format of a file, by its name's extension.
    pub fn of(file: &str) -> Self {
        if file.ends_with(".ts") {
            Format::MpegTs
        } else {
            Format::Fmp4
        }
    }
}

/// What the recorder asks of its writer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Start a new file for a recording that begins at `start_us` (UTC, µs since the epoch):
    /// `init` is its first bytes.
    Open { start_us: i64, init: Bytes, format: Format },
    /// A whole fragment, to append to the open file.
    Append(Bytes),
    /// The open file is complete.
    Close,
}

/// How far a run's media clock may wander from the wall clock before a new file is named by
/// the wall clock again (a source's clock drifts from ours).
const RESYNC_US: i64 = 1_000_000;

/// The recorder of one path.
pub struct Recorder {
    streams: Vec<TrackInfo>,
    fragment_ms: u32,
    file_us: i64,
    seg: Segmenter,
    /// A stream left out of the files.
    left_out: Option<usize>,
    /// The newest fragment handed out.
    taken: u64,
    /// A 90 kHz time of this run and the wall clock's µs at it.
    anchor: Option<(i64, i64)>,
    /// The open file's start (µs).
    file_start: Option<i64>,
    /// The run's track time scales, and the open file's timeline: each file's times start
    /// at zero, so that it stands alone (players show its own length).
    scales: Option<FileIndex>,
    retimer: Retimer,
}

impl Recorder {
    /// A recorder of a repackager's `streams`, cutting fragments at the first keyframe after
    /// `fragment_ms` and files at the first fragment after `file_s`; `None` if no stream
    /// can go into MP4.
    pub fn new(streams: &[TrackInfo], fragment_ms: u32, file_s: u32) -> Option<Self> {
        Some(Self {
            streams: streams.to_vec(),
            fragment_ms,
            file_us: i64::from(file_s.max(1)) * 1_000_000,
            seg: Segmenter::new(streams, fragment_ms, 1)?,
            left_out: None,
            taken: 0,
            anchor: None,
            file_start: None,
            scales: None,
            retimer: Retimer::default(),
        })
    }

    /// Leaves stream `stream` out of the files (see [`Segmenter::leave_out`]).
    pub fn leave_out(&mut self, stream: usize) {
        self.left_out = Some(stream);
        self.seg.leave_out(stream);
    }

    /// Takes a unit that arrived at `now_us` (wall clock); what to write goes to `out`.
    pub fn push(&mut self, u: &Unit, now_us: i64, out: &mut Vec<Write>) {
        if self.seg.push(u) {
            self.take(Some(u.time), now_us, out);
        }
    }

    /// The stream ended (its publisher left): the last fragment is written and the file
    /// closed. What comes next starts a new file, with the tracks it then describes.
    pub fn finish(&mut self, now_us: i64, out: &mut Vec<Write>) {
        if self.seg.finish() {
            self.take(None, now_us, out);
        }
        if self.file_start.take().is_some() {
            out.push(Write::Close);
        }
        if let Some(seg) = Segmenter::new(&self.streams, self.fragment_ms, 1) {
            self.seg = seg;
            if let Some(i) = self.left_out {
                self.seg.leave_out(i);
            }
        }
        self.taken = 0;
        self.anchor = None;
        self.scales = None;
    }

    /// Hands out the fragments completed since the last call. `now_90k`: the time of the
    /// unit that arrived at `now_us` (`None`: the end of the newest fragment).
    fn take(&mut self, now_90k: Option<i64>, now_us: i64, out: &mut Vec<Write>) {
        let (Some(last), Some(init)) = (self.seg.last(), self.seg.init()) else { return };
        for sequence in self.taken + 1..=last {
            let Some(s) = self.seg.segment(sequence) else { continue };
            let end = s.start + (s.duration * 90_000.0).round() as i64;
            // This fragment's start as its arrival tells it, and as the run's clock does.
            let here = now_us - (now_90k.unwrap_or(end) - s.start) * 1000 / 90;
            let (t, w) = *self.anchor.get_or_insert((s.start, here));
            let mut start = w + (s.start - t) * 1000 / 90;
            let opening = self.file_start.is_none_or(|f| start - f >= self.file_us);
            if opening {
                if (start - here).abs() > RESYNC_US {
                    self.anchor = Some((s.start, here));
                    start = here;
                }
                if self.file_start.is_some() {
                    out.push(Write::Close);
                }
                out.push(Write::Open { start_us: start, init: init.clone(), format: Format::Fmp4 });
                self.file_start = Some(start);
                self.retimer = Retimer::default();
            }
            let scales =
                self.scales.get_or_insert_with(|| FileIndex { timescales: timescales(&init), ..FileIndex::default() });
            let mut data = s.data.to_vec();
            if let Some((trafs, key)) = data.get(8..).and_then(moof_trafs) {
                let f = Fragment { offset: 0, len: data.len() as u64, key, trafs };
                self.retimer.retime(&mut data, scales, &f, start);
            }
            out.push(Write::Append(data.into()));
        }
        self.taken = last;
    }
}

/// Where recordings go: a pattern of directories and a file name, in which `%path` is the
/// path's name and `%Y %m %d %H %M %S %f` the UTC year, month, day, hour, minute, second and
/// microsecond of the file's start; `.mp4` or `.ts` is added, by the recording's format.
#[derive(Debug, Clone)]
pub struct Layout {
    pattern: String,
    /// The pattern as a regular expression, and which token each of its groups is.
    parse: regex::Regex,
    groups: Vec<&'static str>,
}

const TOKENS: [&str; 8] = ["%path", "%Y", "%m", "%d", "%H", "%M", "%S", "%f"];

impl Layout {
    /// Checks `pattern`: it must name every token (a file's name is all that tells its
    /// start and path) and stay below its own directory (no `..`).
    pub fn new(pattern: &str) -> Result<Self, crate::Invalid> {
        if let Some(t) = TOKENS.iter().find(|t| !pattern.contains(**t)) {
            return Err(format!("record_path {pattern:?} lacks {t}: it needs %path %Y %m %d %H %M %S %f").into());
        }
        if pattern.split('/').any(|c| c == ".." || c == ".") || pattern.ends_with('/') {
            return Err(
                format!("record_path {pattern:?}: no `.` or `..` components, and a file name at its end").into()
            );
        }
        let mut re = String::from("^");
        let mut groups = Vec::new();
        let mut rest = pattern;
        while let Some(at) = rest.find('%') {
            re.push_str(&regex::escape(&rest[..at]));
            rest = &rest[at..];
            match TOKENS.iter().find(|t| rest.starts_with(**t)) {
                Some(t) => {
                    re.push_str(&match *t {
                        "%path" => format!("({}{{1,{}}})", crate::name::CHARS, crate::name::MAX_LEN),
                        "%Y" => "([0-9]{4})".into(),
                        "%f" => "([0-9]{6})".into(),
                        _ => "([0-9]{2})".into(),
                    });
                    groups.push(*t);
                    rest = &rest[t.len()..];
                }
                None => {
                    re.push('%');
                    rest = &rest[1..];
                }
            }
        }
        re.push_str(&regex::escape(rest));
        re.push_str(r"\.(mp4|ts)$");
        let parse = regex::Regex::new(&re).map_err(|e| format!("record_path {pattern:?}: {e}"))?;
        Ok(Self { pattern: pattern.to_string(), parse, groups })
    }

    /// The file of `path`'s recording starting at `start_us`, in `format`.
    pub fn file(&self, path: &str, start_us: i64, format: Format) -> String {
        let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(start_us) * 1000)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let mut s = self.pattern.replace("%path", path);
        for (token, value) in [
            ("%Y", format!("{:04}", t.year().clamp(0, 9999))),
            ("%m", format!("{:02}", u8::from(t.month()))),
            ("%d", format!("{:02}", t.day())),
            ("%H", format!("{:02}", t.hour())),
            ("%M", format!("{:02}", t.minute())),
            ("%S", format!("{:02}", t.second())),
            ("%f", format!("{:06}", t.microsecond())),
        ] {
            s = s.replace(token, &value);
        }
        format!("{s}.{}", format.extension())
    }

    /// The directory every recording is under: the pattern's up to its first token.
    pub fn root(&self) -> &str {
        let fixed = &self.pattern[..self.pattern.find('%').unwrap_or(0)];
        &fixed[..fixed.rfind('/').map_or(0, |i| i + 1)]
    }

    /// The path and start (µs) of a file this layout names, or `None`.
    pub fn parse(&self, file: &str) -> Option<(String, i64)> {
        let caps = self.parse.captures(file)?;
        let mut values: HashMap<&str, &str> = HashMap::new();
        for (k, token) in self.groups.iter().enumerate() {
            let v = caps.get(k + 1)?.as_str();
            // A token named twice must say the same both times.
            if *values.entry(token).or_insert(v) != v {
                return None;
            }
        }
        let n = |t: &str| values.get(t).and_then(|v| v.parse::<u32>().ok());
        let date = Date::from_calendar_date(n("%Y")? as i32, Month::try_from(n("%m")? as u8).ok()?, n("%d")? as u8);
        let time = Time::from_hms_micro(n("%H")? as u8, n("%M")? as u8, n("%S")? as u8, n("%f")?);
        let at = PrimitiveDateTime::new(date.ok()?, time.ok()?).assume_utc();
        let path = values.get("%path").filter(|p| crate::name::check(p).is_ok())?;
        Some((path.to_string(), (at.unix_timestamp_nanos() / 1000) as i64))
    }
}

/// An RFC 3339 UTC time of `us` (µs since the epoch), for listings and playlists.
pub fn rfc3339(us: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// µs since the epoch of an RFC 3339 time (a playback request's `start`).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1000).ok()
}

/// A recording file's fragments, as [`scan`] found them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileIndex {
    /// Bytes of the initialization segment (`ftyp` + `moov`), from the start.
    pub init_len: u64,
    /// Per track ID, its time scale.
    pub timescales: Vec<(u32, u32)>,
    pub fragments: Vec<Fragment>,
    pub format: Format,
}

/// One whole fragment (`moof` + `mdat`) of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragment {
    pub offset: u64,
    pub len: u64,
    /// Its first sample (of its first track) is a sync sample.
    pub key: bool,
    pub trafs: Vec<Traf>,
}

/// One track's run in a fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traf {
    pub track: u32,
    /// Its first sample's decoding time, in the track's time scale.
    pub base: u64,
    /// Where that time is written, from the fragment's start, and whether in 8 bytes (else 4).
    pub base_at: usize,
    pub wide: bool,
    /// Its samples' durations, summed.
    pub duration: u64,
}

/// Boxes larger than this are not read whole (a `moov` or `moof` is a few KiB).
const MAX_HEADER_BOX: u64 = 16 << 20;

impl FileIndex {
    fn timescale(&self, track: u32) -> u32 {
        self.timescales.iter().find(|t| t.0 == track).map_or(0, |t| t.1)
    }

    /// A fragment's start and duration in µs on its file's timeline, by its first track.
    pub fn times(&self, f: &Fragment) -> (i64, i64) {
        let Some(t) = f.trafs.first() else { return (0, 0) };
        let scale = i128::from(self.timescale(t.track).max(1));
        let us = |v: u64| (i128::from(v) * 1_000_000 / scale) as i64;
        (us(t.base), us(t.base.saturating_add(t.duration)))
    }

    /// The file's duration (µs): from its first fragment's start to its last's end.
    pub fn duration_us(&self) -> i64 {
        match (self.fragments.first(), self.fragments.last()) {
            (Some(a), Some(b)) => self.times(b).1.saturating_sub(self.times(a).0),
            _ => 0,
        }
    }
}

/// The boxes in `data`: type, where the payload starts (in `data`) and the payload. Stops at
/// the first box that does not fit.
fn boxes(data: &[u8]) -> Vec<([u8; 4], usize, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while data.len().saturating_sub(at) >= 8 {
        let size = u32::from_be_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        let kind: [u8; 4] = data[at + 4..at + 8].try_into().unwrap();
        if size < 8 || size > data.len() - at {
            break;
        }
        out.push((kind, at + 8, &data[at + 8..at + size]));
        at += size;
    }
    out
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

/// The time scales of a `moov`'s tracks.
fn moov_timescales(moov: &[u8]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for (kind, _, trak) in boxes(moov) {
        if &kind != b"trak" {
            continue;
        }
        let (mut id, mut scale) = (None, None);
        for (kind, _, b) in boxes(trak) {
            match &kind {
                b"tkhd" => id = u32_at(b, if b.first() == Some(&1) { 20 } else { 12 }),
                b"mdia" => {
                    for (kind, _, m) in boxes(b) {
                        if &kind == b"mdhd" {
                            scale = u32_at(m, if m.first() == Some(&1) { 20 } else { 12 });
                        }
                    }
                }
                _ => {}
            }
        }
        if let (Some(id), Some(scale)) = (id, scale) {
            out.push((id, scale));
        }
    }
    out
}

/// A `moof`'s runs (offsets from the `moof`'s own start) and whether its first sample is
/// a sync sample; `None` if it is malformed.
fn moof_trafs(moof: &[u8]) -> Option<(Vec<Traf>, bool)> {
    let mut trafs = Vec::new();
    let mut key = None;
    for (kind, at, traf) in boxes(moof) {
        if &kind != b"traf" {
            continue;
        }
        let (mut track, mut base, mut duration, mut first_flags) = (None, None, 0u64, None);
        for (kind, pat, b) in boxes(traf) {
            let abs = 8 + at + pat;
            match &kind {
                b"tfhd" => track = u32_at(b, 4),
                b"tfdt" => {
                    base = match b.first()? {
                        1 => Some((u64_at(b, 4)?, abs + 4, true)),
                        _ => Some((u64::from(u32_at(b, 4)?), abs + 4, false)),
                    }
                }
                b"trun" => {
                    let flags = u32_at(b, 0)? & 0xff_ffff;
                    let count = u32_at(b, 4)? as usize;
                    let mut pos = 8 + if flags & 1 != 0 { 4 } else { 0 };
                    if flags & 4 != 0 {
                        first_flags = u32_at(b, pos);
                        pos += 4;
                    }
                    let fields = [0x100, 0x200, 0x400, 0x800].iter().filter(|f| flags & **f != 0).count();
                    if count.checked_mul(fields * 4)? > b.len().saturating_sub(pos) {
                        return None;
                    }
                    for k in 0..count {
                        let mut p = pos + k * fields * 4;
                        if flags & 0x100 != 0 {
                            duration += u64::from(u32_at(b, p)?);
                            p += 4;
                        }
                        if flags & 0x200 != 0 {
                            p += 4;
                        }
                        if k == 0 && flags & 0x400 != 0 {
                            first_flags = u32_at(b, p);
                        }
                    }
                }
                _ => {}
            }
        }
        let (base, base_at, wide) = base?;
        if key.is_none() {
            // A sync sample has the "non-sync" flag clear.
            key = Some(first_flags.is_some_and(|f| f & 0x0001_0000 == 0));
        }
        trafs.push(Traf { track: track?, base, base_at, wide, duration });
    }
    Some((trafs, key.unwrap_or(false)))
}

/// The fragments of a recording file of `len` bytes, read through `read(offset, len)` (which
/// returns fewer bytes only at the end): box headers and `moov`/`moof` boxes are read, media
/// data is skipped. A fragment cut short at the end (a write the process did not finish) is
/// left out; anything but a recording is an error.
pub fn scan(len: u64, mut read: impl FnMut(u64, usize) -> Option<Vec<u8>>) -> Result<FileIndex, crate::Invalid> {
    let mut index = FileIndex::default();
    let mut at = 0u64;
    let mut pending: Option<(u64, Vec<Traf>, bool)> = None;
    while len.saturating_sub(at) >= 8 {
        let head = read(at, 16).ok_or("read failed")?;
        let (Some(size), Some(kind)) = (u32_at(&head, 0), head.get(4..8)) else { break };
        let (size, header) = match size {
            0 => (len - at, 8),
            1 => (u64_at(&head, 8).ok_or("short box header")?, 16),
            s => (u64::from(s), 8),
        };
        if size < header {
            return Err(format!("bad box size {size} at byte {at}").into());
        }
        if size > len - at {
            // The write in progress, or one the process did not finish.
            break;
        }
        let whole = |read: &mut dyn FnMut(u64, usize) -> Option<Vec<u8>>| {
            if size > MAX_HEADER_BOX {
                return Err(format!("a {size}-byte {} box", String::from_utf8_lossy(kind)));
            }
            read(at, size as usize).filter(|b| b.len() as u64 == size).ok_or_else(|| "read failed".to_string())
        };
        match kind {
            b"ftyp" if at == 0 => {}
            b"moov" => {
                let b = whole(&mut read)?;
                index.timescales = moov_timescales(&b[header as usize..]);
                index.init_len = at + size;
            }
            b"moof" if index.init_len > 0 => {
                let b = whole(&mut read)?;
                let (trafs, key) = moof_trafs(&b[8..]).ok_or_else(|| format!("a malformed moof at byte {at}"))?;
                pending = Some((at, trafs, key));
            }
            b"mdat" => {
                if let Some((offset, trafs, key)) = pending.take() {
                    index.fragments.push(Fragment { offset, len: at + size - offset, key, trafs });
                }
            }
            _ if at == 0 => return Err("not an MP4 file".into()),
            _ => {}
        }
        at += size;
    }
    if index.init_len == 0 {
        return Err("no initialization segment (moov)".into());
    }
    Ok(index)
}

/// One file of a path's recordings: its start (µs) and index.
#[derive(Debug, Clone)]
pub struct Recording<'a> {
    pub start_us: i64,
    pub index: &'a FileIndex,
}

/// A fragment chosen for playback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Which file (of those given) and which of its fragments.
    pub file: usize,
    pub fragment: usize,
    /// Its wall-clock start and duration (µs).
    pub start_us: i64,
    pub duration_us: i64,
}

/// The fragments of `files` (in time order) that play `[from_us, to_us)`: from the one
/// holding `from_us` (it starts with a keyframe at or before it), or the first after it.
pub fn pick(files: &[Recording], from_us: i64, to_us: i64) -> Vec<Pick> {
    let mut all = Vec::new();
    for (k, r) in files.iter().enumerate() {
        let first = r.index.fragments.first().map_or(0, |f| r.index.times(f).0);
        for (j, f) in r.index.fragments.iter().enumerate() {
            let (a, b) = r.index.times(f);
            let start_us = r.start_us.saturating_add(a.saturating_sub(first));
            all.push((Pick { file: k, fragment: j, start_us, duration_us: b.saturating_sub(a) }, f.key));
        }
    }
    // The keyframe fragment the one holding the start begins from, else the first one after it.
    let begin =
        match all.iter().position(|(p, _)| p.start_us <= from_us && from_us < p.start_us.saturating_add(p.duration_us))
        {
            Some(at) => all[..=at].iter().rposition(|(_, key)| *key),
            None => all.iter().position(|(p, key)| *key && p.start_us >= from_us),
        };
    let Some(begin) = begin else { return Vec::new() };
    all[begin..].iter().map(|(p, _)| *p).take_while(|p| p.start_us < to_us).collect()
}

/// Gives fragments taken from several files (and runs of a recording) one timeline that
/// starts at zero: where a fragment follows on from the last (in its file, or by the wall
/// clock from the last file) each track's times go on exactly; after a gap a track starts
/// again at the fragment's wall-clock offset from the first. The recorder uses one per file,
/// so that each file's times start at zero.
#[derive(Default)]
pub struct Retimer {
    first_us: Option<i64>,
    /// Per track: where its last run ended, as recorded and as rewritten.
    ends: HashMap<u32, (u64, u64)>,
}

impl Retimer {
    /// A timeline whose zero is `first_us` on the wall clock (by default, the first
    /// fragment's start).
    pub fn starting_at(first_us: i64) -> Self {
        Self { first_us: Some(first_us), ends: HashMap::new() }
    }

    /// Rewrites the decoding times of fragment `bytes` (as `f` describes it, of `index`)
    /// starting at `start_us` on the wall clock.
    pub fn retime(&mut self, bytes: &mut [u8], index: &FileIndex, f: &Fragment, start_us: i64) {
        let first = *self.first_us.get_or_insert(start_us);
        let Some(lead) = f.trafs.first() else { return };
        let lead_s = lead.base as f64 / f64::from(index.timescale(lead.track).max(1));
        for t in &f.trafs {
            let scale = f64::from(index.timescale(t.track).max(1));
            let at = start_us.saturating_sub(first) as f64 / 1e6 + t.base as f64 / scale - lead_s;
            let placed = (at.max(0.0) * scale).round() as u64;
            // Where the track's last run ended, if this follows on from it: in the recorded
            // times (the same file), or within 2 ms on the wall clock (the next file).
            let new = match self.ends.get(&t.track) {
                Some(&(old_end, new_end))
                    if old_end == t.base || placed.abs_diff(new_end) as f64 <= scale * FOLLOWS_US as f64 / 1e6 =>
                {
                    new_end
                }
                _ => placed,
            };
            self.ends.insert(t.track, (t.base.saturating_add(t.duration), new.saturating_add(t.duration)));
            match (t.wide, bytes.get_mut(t.base_at..t.base_at + if t.wide { 8 } else { 4 })) {
                (true, Some(b)) => b.copy_from_slice(&new.to_be_bytes()),
                (false, Some(b)) => b.copy_from_slice(&(new as u32).to_be_bytes()),
                _ => {}
            }
        }
    }
}

/// An HLS VOD playlist (RFC 8216) of `picks` out of `files`. Each file's initialization
/// segment is `init_uri(file)` (a byte range of it); each fragment is `fragment_uri(pick, at)`,
/// which must serve the fragment retimed to start at `at` µs on the playlist's timeline (see
/// [`fragment`] and [`Retimer::starting_at`]): files' own times start at zero, players want
/// one timeline. Where a pick does not follow on from the one before (a gap, a new run of
/// the recording, other tracks) the playlist says so with a discontinuity.
pub fn vod_playlist(
    files: &[Recording],
    picks: &[Pick],
    init_uri: impl Fn(usize) -> String,
    fragment_uri: impl Fn(&Pick, i64) -> String,
) -> String {
    let target = picks.iter().map(|p| (p.duration_us as f64 / 1e6).ceil() as u64).max().unwrap_or(1).max(1);
    let mut out = format!(
        "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-TARGETDURATION:{target}\n#EXT-X-PLAYLIST-TYPE:VOD\n\
         #EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-INDEPENDENT-SEGMENTS\n"
    );
    let Some(first) = picks.first() else {
        out.push_str("#EXT-X-ENDLIST\n");
        return out;
    };
    let mut prev: Option<&Pick> = None;
    let mut map: Option<usize> = None;
    for p in picks {
        let r = &files[p.file];
        let follows = prev.is_some_and(|q| {
            q.start_us.saturating_add(q.duration_us).abs_diff(p.start_us) <= FOLLOWS_US
                && files[q.file].index.timescales == r.index.timescales
                && files[q.file].index.format == r.index.format
        });
        if prev.is_some() && !follows {
            out.push_str("#EXT-X-DISCONTINUITY\n");
        }
        // (TS segments carry their tables: no initialization segment.)
        let fmp4 = r.index.format == Format::Fmp4;
        if fmp4 && (map.is_none_or(|m| files[m].index.timescales != r.index.timescales) || !follows) {
            out.push_str(&format!("#EXT-X-MAP:URI=\"{}\",BYTERANGE=\"{}@0\"\n", init_uri(p.file), r.index.init_len));
            map = Some(p.file);
        }
        if !follows {
            out.push_str(&format!("#EXT-X-PROGRAM-DATE-TIME:{}\n", rfc3339(p.start_us)));
        }
        let at = p.start_us.saturating_sub(first.start_us);
        out.push_str(&format!("#EXTINF:{:.6},\n{}\n", p.duration_us as f64 / 1e6, fragment_uri(p, at)));
        prev = Some(p);
    }
    out.push_str("#EXT-X-ENDLIST\n");
    out
}

/// How close (µs) a fragment must start to the last one's end to follow on from it.
const FOLLOWS_US: u64 = 2_000;

/// The fragment `bytes` hold: one `moof` and the `mdat` after it, exactly; `None` for
/// anything else.
pub fn fragment(bytes: &[u8]) -> Option<Fragment> {
    let b = boxes(bytes);
    match b.as_slice() {
        [(moof, _, m), (mdat, at, d)] if moof == b"moof" && mdat == b"mdat" && at + d.len() == bytes.len() => {
            let (trafs, key) = moof_trafs(m)?;
            Some(Fragment { offset: 0, len: bytes.len() as u64, key, trafs })
        }
        _ => None,
    }
}

/// The track time scales of an initialization segment (`ftyp` + `moov`).
pub fn timescales(init: &[u8]) -> Vec<(u32, u32)> {
    boxes(init).into_iter().find(|b| &b.0 == b"moov").map_or_else(Vec::new, |b| moov_timescales(b.2))
}

/// Stretches of recorded time: `(start, duration)` of each file (µs, in time order) merged
/// where one starts within a second of the last one's end.
pub fn spans(files: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = Vec::new();
    for &(start, duration) in files {
        match out.last_mut() {
            Some((s, d)) if start <= *s + *d + RESYNC_US && start >= *s => *d = (*d).max(start + duration - *s),
            _ => out.push((start, duration)),
        }
    }
    out
}

/// A stored recording file, as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub start_us: i64,
    /// Its last write (µs): where it ends.
    pub written_us: i64,
    pub bytes: u64,
    /// The file being written: never deleted.
    pub open: bool,
}

/// Which of a path's `files` (in time order) retention deletes at `now_us`: those last
/// written more than `keep_us` ago, then the oldest until the rest take at most
/// `keep_bytes`; never the open one.
pub fn expired(files: &[Stored], now_us: i64, keep_us: Option<i64>, keep_bytes: Option<u64>) -> Vec<usize> {
    let mut gone: Vec<usize> = (0..files.len())
        .filter(|&k| !files[k].open && keep_us.is_some_and(|keep| now_us - files[k].written_us > keep))
        .collect();
    if let Some(cap) = keep_bytes {
        let mut total: u64 = (0..files.len()).filter(|k| !gone.contains(k)).map(|k| files[k].bytes).sum();
        for (k, f) in files.iter().enumerate() {
            if total <= cap {
                break;
            }
            if !f.open && !gone.contains(&k) {
                total -= f.bytes;
                gone.push(k);
            }
        }
    }
    gone.sort_unstable();
    gone
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::container::hls::tests::{demo_units, streams};
    use proptest::prelude::*;

    /// The demo as files: each `Open` starts one, of its start and bytes.
    fn record(units: &[Unit], fragment_ms: u32, file_s: u32) -> Vec<(i64, Vec<u8>)> {
        let mut r = Recorder::new(&streams(), fragment_ms, file_s).unwrap();
        let mut out = Vec::new();
        let t0 = units[0].time;
        for u in units {
            r.push(u, 1_700_000_000_000_000 + (u.time - t0) * 1000 / 90, &mut out);
        }
        r.finish(1_700_000_000_000_000 + (units.last().unwrap().time - t0) * 1000 / 90, &mut out);
        files_of(out, Format::Fmp4)
    }

    /// What a writer would make of `writes`: each file's start and bytes; every file opened
    /// after the last closed, in `format`, and closed at the end.
    pub(crate) fn files_of(writes: Vec<Write>, format: Format) -> Vec<(i64, Vec<u8>)> {
        let mut files: Vec<(i64, Vec<u8>)> = Vec::new();
        let mut open = false;
        for w in writes {
            match w {
                Write::Open { start_us, init, format: f } => {
                    assert!(!open, "a file opened before the last closed");
                    assert_eq!(f, format);
                    open = true;
                    files.push((start_us, init.to_vec()));
                }
                Write::Append(b) => {
                    assert!(open);
                    files.last_mut().unwrap().1.extend_from_slice(&b);
                }
                Write::Close => {
                    assert!(open);
                    open = false;
                }
            }
        }
        assert!(!open, "the last file was left open");
        files
    }

    fn index(b: &[u8]) -> FileIndex {
        scan(b.len() as u64, |at, n| Some(b[at as usize..(at as usize + n).min(b.len())].to_vec())).unwrap()
    }

    #[test]
    fn files_tile_the_recording_and_each_starts_at_a_keyframe() {
        let units = demo_units();
        let files = record(&units, 1000, 3);
        assert!(files.len() >= 2, "{} files", files.len());
        let mut total = 0;
        let mut last: Option<(i64, i64)> = None;
        for (start, bytes) in &files {
            let ix = index(bytes);
            assert_eq!(ix.timescales.len(), 2);
            assert!(!ix.fragments.is_empty());
            assert!(ix.fragments.iter().all(|f| f.key), "every fragment starts at a keyframe");
            // Each file's times start at zero, its fragments following on; no gap at a file
            // boundary: it starts where the last file ended.
            assert_eq!(ix.fragments[0].trafs[0].base, 0);
            for w in ix.fragments.windows(2) {
                for (a, b) in w[0].trafs.iter().zip(&w[1].trafs) {
                    assert_eq!(a.base + a.duration, b.base);
                }
            }
            if let Some((last_start, last_duration)) = last {
                assert!((start - last_start - last_duration).abs() <= 1000, "{start} after {last_start}");
            }
            last = Some((*start, ix.duration_us()));
            total += ix.duration_us();
        }
        let mut pictures: Vec<i64> = units.iter().filter(|u| u.stream == 0).map(|u| u.time).collect();
        pictures.sort_unstable();
        let frame = pictures.windows(2).map(|w| w[1] - w[0]).min().unwrap() * 1000 / 90;
        let first_key = units.iter().find(|u| u.stream == 0 && u.key).unwrap().time;
        // Recorded: from the first keyframe to the last picture, plus its one frame; the
        // files' durations sum to it within a frame.
        let span = (pictures.last().unwrap() - first_key) * 1000 / 90 + frame;
        assert!((total - span).abs() <= frame, "recorded {total} µs of {span}");
    }

    #[test]
    fn a_file_cut_anywhere_scans_to_its_whole_fragments() {
        let files = record(&demo_units(), 500, 3600);
        let bytes = &files[0].1;
        let whole = index(bytes);
        for cut in (whole.init_len as usize..bytes.len()).step_by(997) {
            let ix = index(&bytes[..cut]);
            let n = whole.fragments.iter().take_while(|f| f.offset + f.len <= cut as u64).count();
            assert_eq!(ix.fragments, whole.fragments[..n]);
        }
        assert!(scan(10, |_, _| Some(b"0123456789".to_vec())).is_err());
    }

    #[test]
    fn a_range_starts_at_a_keyframe_at_or_before_it_and_plays_on_one_timeline() {
        let files = record(&demo_units(), 1000, 4);
        let indexes: Vec<FileIndex> = files.iter().map(|f| index(&f.1)).collect();
        let recs: Vec<Recording> =
            files.iter().zip(&indexes).map(|(f, ix)| Recording { start_us: f.0, index: ix }).collect();
        let first = recs[0].start_us;
        let from = first + 2_300_000;
        let picks = pick(&recs, from, from + 3_000_000);
        assert!(picks[0].start_us <= from && picks[0].start_us + picks[0].duration_us > from);
        let end = picks.last().unwrap();
        assert!(end.start_us + end.duration_us >= from + 3_000_000);
        // Before the recording: from its start. After it: nothing.
        assert_eq!(pick(&recs, first - 9_000_000, first + 1)[0].start_us, first);
        assert!(pick(&recs, first + 3_600_000_000, first + 3_700_000_000).is_empty());
        // Retimed: the first fragment at zero, each following on from the last.
        let mut rt = Retimer::default();
        let mut next = 0;
        for p in &picks {
            let ix = &indexes[p.file];
            let f = &ix.fragments[p.fragment];
            let mut b = files[p.file].1[f.offset as usize..(f.offset + f.len) as usize].to_vec();
            rt.retime(&mut b, ix, f, p.start_us);
            let moved = index(&[&files[p.file].1[..ix.init_len as usize], &b[..]].concat());
            assert_eq!(moved.fragments[0].trafs[0].base, next);
            next += f.trafs[0].duration;
        }
        let list =
            vod_playlist(&recs, &picks, |f| format!("{f}.mp4"), |p, at| format!("{}.{}?at={at}", p.file, p.fragment));
        assert!(list.contains("#EXT-X-MAP:URI=\"") && list.ends_with("#EXT-X-ENDLIST\n"));
        // One run: its fragments follow on, files or not; the playlist's times go on too.
        assert!(picks.windows(2).any(|w| w[0].file != w[1].file));
        assert!(!list.contains("DISCONTINUITY"), "{list}");
        let last = picks.last().unwrap();
        assert!(list.contains(&format!("?at={}\n", last.start_us - picks[0].start_us)));
        // Each fragment as a URI serves it: it parses alone, and retimed to its place.
        for p in &picks {
            let ix = &indexes[p.file];
            let f = &ix.fragments[p.fragment];
            let mut b = files[p.file].1[f.offset as usize..(f.offset + f.len) as usize].to_vec();
            let alone = fragment(&b).unwrap();
            assert_eq!(alone.trafs.len(), f.trafs.len());
            let scales = FileIndex { timescales: timescales(&files[p.file].1), ..FileIndex::default() };
            Retimer::starting_at(picks[0].start_us).retime(&mut b, &scales, &alone, p.start_us);
            let at = fragment(&b).unwrap().trafs[0].base as i64;
            assert!((at - (p.start_us - picks[0].start_us) * 90 / 1000).abs() <= 1, "{at}");
        }
        assert!(fragment(&files[0].1).is_none());
        // A gap (the later files ten seconds on): one discontinuity, where it is.
        let shifted: Vec<Recording> = recs
            .iter()
            .enumerate()
            .map(|(k, r)| Recording { start_us: r.start_us + if k > 0 { 10_000_000 } else { 0 }, index: r.index })
            .collect();
        let all = pick(&shifted, first, i64::MAX);
        let list = vod_playlist(&shifted, &all, |f| format!("{f}.mp4"), |p, _| format!("{}.{}", p.file, p.fragment));
        assert_eq!(list.matches("#EXT-X-DISCONTINUITY\n#EXT-X-MAP").count(), 1, "{list}");
        assert_eq!(list.matches("#EXTINF").count(), all.len());
    }

    #[test]
    fn a_new_run_after_finish_starts_a_new_file() {
        let units = demo_units();
        let mut r = Recorder::new(&streams(), 1000, 3600).unwrap();
        let mut out = Vec::new();
        let half = units.len() / 2;
        for u in &units[..half] {
            r.push(u, u.time * 1000 / 90, &mut out);
        }
        r.finish(units[half].time * 1000 / 90, &mut out);
        assert_eq!(out.last(), Some(&Write::Close));
        let opens = |o: &[Write]| o.iter().filter(|w| matches!(w, Write::Open { .. })).count();
        assert_eq!(opens(&out), 1);
        for u in &units[half..] {
            r.push(u, u.time * 1000 / 90 + 10_000_000, &mut out);
        }
        assert_eq!(opens(&out), 2);
    }

    #[test]
    fn layout_names_and_reads_back() {
        let l = Layout::new("rec/%path/%Y/%m/%d/%H-%M-%S-%f").unwrap();
        let t = parse_rfc3339("2026-11-27T02:03:04.000005Z").unwrap();
        assert_eq!(l.file("cam1", t, Format::Fmp4), "rec/cam1/2026/11/27/02-03-04-000005.mp4");
        assert_eq!(l.file("cam1", t, Format::MpegTs), "rec/cam1/2026/11/27/02-03-04-000005.ts");
        assert_eq!(l.parse("rec/cam1/2026/11/27/02-03-04-000005.ts"), Some(("cam1".into(), t)));
        assert_eq!(Format::of("rec/cam1/2026/11/27/02-03-04-000005.ts"), Format::MpegTs);
        assert_eq!(l.root(), "rec/");
        assert_eq!(l.parse("rec/cam1/2026/11/27/02-03-04-000005.mp4"), Some(("cam1".into(), t)));
        assert_eq!(l.parse("rec/cam1/2026/11/27/02-03-04-000005.mp4.tmp"), None);
        assert_eq!(l.parse("rec/../2026/11/27/02-03-04-000005.mp4"), None);
        assert_eq!(l.parse("rec/cam1/2026/13/27/02-03-04-000005.mp4"), None);
        assert!(Layout::new("rec/%path/%Y-%m-%d").is_err());
        assert!(Layout::new("../%path/%Y%m%d%H%M%S%f").is_err());
        assert_eq!(Layout::new("%path_%Y%m%d%H%M%S%f").unwrap().root(), "");
        assert_eq!(rfc3339(t), "2026-11-27T02:03:04.000005Z");
    }

    #[test]
    fn spans_merge_what_follows_on() {
        assert_eq!(spans(&[(0, 10), (10, 10), (5_000_000, 10)]), vec![(0, 20), (5_000_000, 10)]);
        assert_eq!(spans(&[]), vec![]);
    }

    proptest! {
        #[test]
        fn layout_round_trips(name in "[A-Za-z0-9_.-]{1,20}(/[A-Za-z0-9_.-]{1,20}){0,3}", us in 0i64..253_402_300_799_000_000) {
            prop_assume!(crate::name::check(&name).is_ok());
            let l = Layout::new("r/%path/%Y-%m-%d_%H-%M-%S-%f").unwrap();
            prop_assert_eq!(l.parse(&l.file(&name, us, Format::Fmp4)), Some((name, us)));
        }

        #[test]
        fn scan_never_panics(data in proptest::collection::vec(any::<u8>(), 0..600), len_extra in 0u64..4) {
            let len = data.len() as u64 + len_extra;
            let _ = scan(len, |at, n| data.get(at as usize..).map(|d| d[..n.min(d.len())].to_vec()));
        }

        #[test]
        fn retention_keeps_the_open_file_and_deletes_oldest_first(
            sizes in proptest::collection::vec((1u64..1000, 0i64..100), 1..30),
            open_last in any::<bool>(),
            keep_us in proptest::option::of(0i64..100),
            keep_bytes in proptest::option::of(0u64..20_000),
        ) {
            let n = sizes.len();
            let files: Vec<Stored> = sizes.iter().enumerate().map(|(k, (b, age))| Stored {
                start_us: k as i64, written_us: 100 - age, bytes: *b, open: open_last && k == n - 1,
            }).collect();
            let gone = expired(&files, 100, keep_us, keep_bytes);
            prop_assert!(gone.iter().all(|&k| !files[k].open));
            let kept: Vec<usize> = (0..n).filter(|k| !gone.contains(k)).collect();
            if let Some(keep) = keep_us {
                prop_assert!(kept.iter().all(|&k| files[k].open || 100 - files[k].written_us <= keep));
            }
            if let Some(cap) = keep_bytes {
                let total: u64 = kept.iter().filter(|&&k| !files[k].open).map(|&k| files[k].bytes).sum();
                prop_assert!(total <= cap);
                // Nothing was deleted for size that fits: a kept file is never older than a
                // file deleted only for size.
                for &g in &gone {
                    let aged = keep_us.is_some_and(|keep| 100 - files[g].written_us > keep);
                    if !aged {
                        prop_assert!(kept.iter().all(|&k| k > g || files[k].open));
                    }
                }
            }
        }
    }
}
