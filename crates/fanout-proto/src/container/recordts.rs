//! Recording as MPEG-TS: a path's access units into `.ts` files (as set-top boxes, IPTV
//! head-ends and `cat` take them), and those files read back for playback. Sans-IO, as
//! [`crate::container::record`] is for fMP4: units and the wall clock in, file operations out;
//! file bytes in, an index of their fragments out; fragments moved onto a playback timeline.
//!
//! A file is transport packets, its first a PAT. A fragment starts at a PAT + PMT followed
//! by the lead stream's random-access PES (the video's keyframe; an audio-only recording's
//! frame once a fragment duration has passed), so any fragment decodes on its own. The
//! times in a file are the run's own (90 kHz, as its TS readers get them): the files of one
//! run follow on from each other, so they play concatenated.

use crate::container::mpegts::{read_pes_ts, Restamper, PACKET_LEN, SYNC_BYTE};
use crate::container::record::{FileIndex, Format, Fragment, Traf, Write};
use crate::container::repack::{TrackInfo, TsPackager, Unit};
use crate::container::tsmux::PCR_LEAD_90K;

const WRAP: i64 = 1 << 33;
/// How far a run's media clock may wander from the wall clock before a new file is named by
/// the wall clock again.
const RESYNC_US: i64 = 1_000_000;

/// The recorder of one path, in MPEG-TS.
pub struct TsRecorder {
    streams: Vec<TrackInfo>,
    pack: TsPackager,
    /// The stream fragments start at (the video, else the first), and its PID.
    lead: usize,
    lead_pid: u16,
    video: bool,
    fragment_90k: i64,
    file_us: i64,
    /// An audio-only recording's last fragment start (90 kHz).
    last_cut: Option<i64>,
    /// A 90 kHz time of this run and the wall clock's µs at it.
    anchor: Option<(i64, i64)>,
    file_start: Option<i64>,
    /// The fragment being gathered, written whole when the next one starts.
    pending: Vec<u8>,
    bytes: Vec<u8>,
}

impl TsRecorder {
    /// A recorder of `streams`, cutting an audio-only recording's fragments every
    /// `fragment_ms` (a video's are its GOPs) and files at the first fragment after `file_s`.
    pub fn new(streams: &[TrackInfo], fragment_ms: u32, file_s: u32) -> Option<Self> {
        let video = streams.iter().position(|s| matches!(s.codec, crate::container::repack::TrackCodec::Video { .. }));
        // The lead: the video, else the first stream MPEG-TS carries (none: nothing to record).
        let lead = video.or_else(|| streams.iter().position(|s| s.kind().is_some()))?;
        let kinds: Vec<_> = streams.iter().filter_map(TrackInfo::kind).collect();
        let in_mux = streams[..lead].iter().filter(|s| s.kind().is_some()).count();
        let lead_pid = crate::container::tsmux::TsMuxer::new(&kinds).pids().nth(in_mux)?;
        Some(Self {
            streams: streams.to_vec(),
            pack: TsPackager::new(streams),
            lead,
            lead_pid,
            video: video.is_some(),
            fragment_90k: i64::from(fragment_ms) * 90,
            file_us: i64::from(file_s.max(1)) * 1_000_000,
            last_cut: None,
            anchor: None,
            file_start: None,
            pending: Vec::new(),
            bytes: Vec::new(),
        })
    }

    /// Takes a unit that arrived at `now_us` (wall clock); what to write goes to `out`.
    pub fn push(&mut self, u: &Unit, now_us: i64, out: &mut Vec<Write>) {
        self.bytes.clear();
        if !self.video && u.stream == self.lead && self.last_cut.is_none_or(|c| u.time - c >= self.fragment_90k) {
            // Audio only: the tables mark where a fragment starts.
            self.last_cut = Some(u.time);
            self.pack.tables(&mut self.bytes);
        }
        if !self.pack.write(u, &mut self.bytes) {
            return;
        }
        let bytes = std::mem::take(&mut self.bytes);
        let mut from = 0;
        for at in cuts(&bytes, self.lead_pid) {
            self.pending.extend_from_slice(&bytes[from..at.0]);
            from = at.0;
            // Where the fragment starts on the wall clock: its decoding time against the
            // unit's that arrived now.
            let time = unwrap_near(at.1 as i64 - PCR_LEAD_90K as i64, u.time);
            let here = now_us - (u.time - time) * 1000 / 90;
            self.cut(time, here, out);
        }
        self.pending.extend_from_slice(&bytes[from..]);
        self.bytes = bytes;
    }

    /// The stream ended: the last fragment is written and the file closed; what comes next
    /// starts a new run and a new file.
    pub fn finish(&mut self, _now_us: i64, out: &mut Vec<Write>) {
        if self.file_start.take().is_some() {
            if !self.pending.is_empty() {
                out.push(Write::Append(std::mem::take(&mut self.pending).into()));
            }
            out.push(Write::Close);
        }
        self.pending.clear();
        self.pack = TsPackager::new(&self.streams);
        (self.anchor, self.last_cut) = (None, None);
    }

    /// A fragment starts at 90 kHz `time`, arrived at `here` (µs): the one gathered so far is
    /// written, and a file opened where none is or the open one is long enough. (What came
    /// before the first one, audio ahead of the first keyframe, is the first file's start;
    /// the file is named after the keyframe.)
    fn cut(&mut self, time: i64, here: i64, out: &mut Vec<Write>) {
        let (t, w) = *self.anchor.get_or_insert((time, here));
        let mut start = w + (time - t) * 1000 / 90;
        if self.file_start.is_some() && !self.pending.is_empty() {
            out.push(Write::Append(std::mem::take(&mut self.pending).into()));
        }
        if self.file_start.is_none_or(|f| start - f >= self.file_us) {
            if (start - here).abs() > RESYNC_US {
                self.anchor = Some((time, here));
                start = here;
            }
            if self.file_start.is_some() {
                out.push(Write::Close);
            }
            out.push(Write::Open { start_us: start, init: bytes::Bytes::new(), format: Format::MpegTs });
            self.file_start = Some(start);
        }
    }
}

/// The extended time nearest `near` of a 33-bit TS time.
fn unwrap_near(ts: i64, near: i64) -> i64 {
    near + (ts - near).rem_euclid(WRAP) - if (ts - near).rem_euclid(WRAP) > WRAP / 2 { WRAP } else { 0 }
}

/// Where fragments start in `bytes` (whole packets): each PAT that is followed, after its
/// PMT, by a random-access PES start of `lead`; with that PES's decoding time (33 bits).
fn cuts(bytes: &[u8], lead: u16) -> Vec<(usize, u64)> {
    let packets: Vec<&[u8]> = bytes.chunks_exact(PACKET_LEN).collect();
    let mut out = Vec::new();
    for (k, p) in packets.iter().enumerate() {
        if pid(p) != Some(0) {
            continue;
        }
        // The PMT, then the PES (the muxer writes them together).
        if let Some(dts) = packets.get(k + 2).and_then(|q| random_access_start(q, lead)) {
            out.push((k * PACKET_LEN, dts));
        }
    }
    out
}

fn pid(p: &[u8]) -> Option<u16> {
    (p.len() >= 4 && p[0] == SYNC_BYTE).then(|| u16::from_be_bytes([p[1] & 0x1f, p[2]]))
}

/// The decoding time of the PES packet `p` starts, if it is of `lead` and marked random
/// access.
fn random_access_start(p: &[u8], lead: u16) -> Option<u64> {
    if pid(p)? != lead || p[1] & 0x40 == 0 || p[3] & 0x20 == 0 || p[4] == 0 || p[5] & 0x40 == 0 {
        return None;
    }
    pes_dts(p)
}

/// The decoding (else presentation) time of a PES header at the start of packet `p`.
fn pes_dts(p: &[u8]) -> Option<u64> {
    let mut start = 4;
    if p[3] & 0x20 != 0 {
        start = 5 + usize::from(*p.get(4)?);
    }
    let pes = p.get(start..)?;
    if pes.len() < 14 || pes[..3] != [0, 0, 1] {
        return None;
    }
    match pes[7] >> 6 {
        3 if pes.len() >= 19 => Some(read_pes_ts(&pes[14..19])),
        2 | 3 => Some(read_pes_ts(&pes[9..14])),
        _ => None,
    }
}

/// How much of a file is read at once while it is scanned.
const SCAN_CHUNK: usize = PACKET_LEN * 2048;

/// The fragments of a TS recording file of `len` bytes, read through `read(offset, len)`
/// (fewer bytes only at its end): the file is read through, packet by packet. A packet cut
/// short at the end is left out; anything but transport packets is an error. Each fragment
/// has one run: the lead stream's (PID, 90 kHz), its time the unwrapped decoding time of the
/// fragment's first PES of it.
pub fn scan(len: u64, mut read: impl FnMut(u64, usize) -> Option<Vec<u8>>) -> Result<FileIndex, crate::Invalid> {
    let whole = len - len % PACKET_LEN as u64;
    let (mut pmt, mut lead): (Option<u16>, Option<u16>) = (None, None);
    // Fragment starts (offset, decoding time, random access); the last PAT seen; the lead's
    // newest decoding time and the step before it (a last fragment's length).
    let mut starts: Vec<(u64, Option<i64>, bool)> = Vec::new();
    let mut pat_at: Option<u64> = None;
    let (mut newest, mut step): (Option<i64>, i64) = (None, 0);
    let mut at = 0u64;
    while at < whole {
        let chunk = read(at, SCAN_CHUNK.min((whole - at) as usize)).ok_or("the file cannot be read")?;
        let usable = chunk.len() - chunk.len() % PACKET_LEN;
        if usable == 0 {
            break;
        }
        for (k, p) in chunk[..usable].chunks_exact(PACKET_LEN).enumerate() {
            let offset = at + (k * PACKET_LEN) as u64;
            let Some(id) = pid(p) else {
                return Err(format!("not MPEG-TS: no sync byte at byte {offset}").into());
            };
            let unit_start = p[1] & 0x40 != 0;
            let body = if p[3] & 0x20 != 0 { p.get(5 + usize::from(p[4])..).unwrap_or(&[]) } else { &p[4..] };
            match id {
                0 => {
                    pat_at = Some(offset);
                    if starts.is_empty() {
                        starts.push((offset, None, false));
                    }
                    // The PMT's PID, from the PAT's first program.
                    let section = body.first().and_then(|&pointer| body.get(1 + usize::from(pointer)..));
                    if let Some(s) = section.filter(|s| unit_start && s.len() >= 12) {
                        pmt = Some(u16::from_be_bytes([s[10] & 0x1f, s[11]]));
                    }
                }
                id if Some(id) == pmt && unit_start && lead.is_none() => lead = pmt_lead(body),
                id if Some(id) == lead && unit_start => {
                    let Some(dts) = pes_dts(p) else { continue };
                    let dts = match newest {
                        Some(n) => unwrap_near(dts as i64, n),
                        None => dts as i64,
                    };
                    if let Some(n) = newest.filter(|n| dts > *n) {
                        step = dts - n;
                    }
                    newest = Some(newest.map_or(dts, |n| n.max(dts)));
                    let random = p[3] & 0x20 != 0 && p[4] > 0 && p[5] & 0x40 != 0;
                    match starts.last_mut() {
                        // The file's first PES of the lead: its first fragment's time.
                        Some(s) if s.1.is_none() => *s = (s.0, Some(dts), random),
                        _ if random && pat_at.is_some_and(|a| offset - a <= 2 * PACKET_LEN as u64) => {
                            starts.push((pat_at.expect("checked"), Some(dts), true));
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        at += usable as u64;
    }
    if whole > 0 && starts.is_empty() {
        return Err("not a TS recording: no PAT".into());
    }
    let lead = u32::from(lead.unwrap_or(0));
    let end_time = newest.map(|n| n + step);
    let mut fragments = Vec::new();
    for (k, (offset, time, key)) in starts.iter().enumerate() {
        let Some(time) = *time else { continue };
        let (next_at, next_time) = match starts.get(k + 1) {
            Some((o, t, _)) => (*o, t.or(end_time)),
            None => (at, end_time),
        };
        let duration = next_time.map_or(0, |n| (n - time).max(0)) as u64;
        let base = time.rem_euclid(WRAP * 4) as u64;
        let trafs = vec![Traf { track: lead, base, base_at: 0, wide: false, duration }];
        fragments.push(Fragment { offset: *offset, len: next_at - offset, key: *key, trafs });
    }
    Ok(FileIndex { init_len: 0, timescales: vec![(lead, 90_000)], fragments, format: Format::MpegTs })
}

/// The lead PID a PMT section names: its first video stream, else its first stream.
fn pmt_lead(body: &[u8]) -> Option<u16> {
    let s = body.get(1 + usize::from(*body.first()?)..)?;
    let section_len = usize::from(u16::from_be_bytes([*s.get(1)? & 0x0f, *s.get(2)?]));
    let info_len = usize::from(u16::from_be_bytes([*s.get(10)? & 0x0f, *s.get(11)?]));
    let end = (3 + section_len).saturating_sub(4).min(s.len());
    let mut at = 12 + info_len;
    let mut first = None;
    while at + 5 <= end {
        let (kind, id) = (s[at], u16::from_be_bytes([s[at + 1] & 0x1f, s[at + 2]]));
        if matches!(kind, 0x01 | 0x02 | 0x1b | 0x24 | 0x10) {
            return Some(id);
        }
        first.get_or_insert(id);
        at += 5 + usize::from(u16::from_be_bytes([s[at + 3] & 0x0f, s[at + 4]]));
    }
    first
}

/// Moves TS fragments taken from several files (and runs) onto one timeline: each is
/// shifted so that it plays `start_us` (its wall-clock start) after the first one, from
/// zero plus the muxer's PCR lead. Where a fragment follows on (its shift within 2 ms of the
/// last one's) the last shift is kept, so a run's fragments keep their exact spacing; the
/// continuity counters run on across all of them.
#[derive(Default)]
pub struct TsRetimer {
    first_us: Option<i64>,
    shift: Option<i64>,
    restamp: Restamper,
}

impl TsRetimer {
    /// A timeline whose zero is `first_us` on the wall clock.
    pub fn starting_at(first_us: i64) -> Self {
        Self { first_us: Some(first_us), ..Self::default() }
    }

    /// Rewrites fragment `bytes` (as `f` describes it) to start at `start_us`.
    pub fn retime(&mut self, bytes: &mut [u8], f: &Fragment, start_us: i64) {
        let first = *self.first_us.get_or_insert(start_us);
        let base = f.trafs.first().map_or(0, |t| t.base as i64);
        let wanted = start_us.saturating_sub(first) * 9 / 100 + PCR_LEAD_90K as i64 - base;
        let shift = match self.shift {
            Some(s) if (s - wanted).abs() <= 180 => s,
            _ => wanted,
        };
        self.shift = Some(shift);
        self.restamp.set_offset(shift.rem_euclid(WRAP) as u64);
        self.restamp.restamp(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::hls::tests::{demo_units, streams};
    use proptest::prelude::*;

    const T0_US: i64 = 1_700_000_000_000_000;

    /// Units as files: each `Open` starts one, of its start and bytes.
    fn record(r: &mut TsRecorder, units: &[Unit]) -> Vec<(i64, Vec<u8>)> {
        let mut out = Vec::new();
        let t0 = units[0].time;
        for u in units {
            r.push(u, T0_US + (u.time - t0) * 1000 / 90, &mut out);
        }
        r.finish(0, &mut out);
        let files = crate::container::record::tests::files_of(out, Format::MpegTs);
        assert!(files.iter().all(|f| f.1.is_empty() || f.1[0] == SYNC_BYTE));
        files
    }

    fn index(b: &[u8]) -> FileIndex {
        scan(b.len() as u64, |at, n| Some(b[at as usize..(at as usize + n).min(b.len())].to_vec())).unwrap()
    }

    /// The files tile the run: each starts with a PAT and a keyframe, their fragments are
    /// the GOPs, one after the other on the run's clock, and the files' names follow its
    /// times; together they hold every picture, once.
    #[test]
    fn files_tile_the_run_each_from_a_keyframe() {
        let units = demo_units();
        let mut r = TsRecorder::new(&streams(), 1000, 3).unwrap();
        let files = record(&mut r, &units);
        assert!(files.len() >= 2, "{} files", files.len());
        let mut last_end: Option<(i64, u64)> = None;
        let mut pictures = 0;
        for (start, bytes) in &files {
            assert_eq!(bytes.len() % PACKET_LEN, 0);
            assert_eq!(pid(bytes), Some(0), "a file starts with the PAT");
            let ix = index(bytes);
            assert!(!ix.fragments.is_empty() && ix.fragments.iter().all(|f| f.key), "fragments at keyframes");
            assert_eq!(ix.fragments[0].offset, 0);
            for w in ix.fragments.windows(2) {
                assert_eq!(w[0].offset + w[0].len, w[1].offset, "fragments tile the file");
                assert_eq!(w[0].trafs[0].base + w[0].trafs[0].duration, w[1].trafs[0].base);
            }
            let (first, last) = (&ix.fragments[0].trafs[0], &ix.fragments.last().unwrap().trafs[0]);
            if let Some((end_us, end_90k)) = last_end {
                assert_eq!(first.base, end_90k, "a file goes on where the last ended");
                assert!((start - end_us).abs() <= 1000, "named by its start: {start} after {end_us}");
            }
            last_end = Some((start + ix.duration_us(), last.base + last.duration));
            let mut d = crate::container::tsdemux::Demux::default();
            let mut pes: Vec<_> = bytes.chunks(PACKET_LEN).filter_map(|p| d.push(p)).collect();
            pes.extend(d.flush());
            pictures += pes.iter().filter(|p| p.stream_type == crate::container::tsdemux::STREAM_TYPE_H264).count();
        }
        let first_key = units.iter().position(|u| u.stream == 0 && u.key).unwrap();
        assert_eq!(pictures, units[first_key..].iter().filter(|u| u.stream == 0).count(), "every picture once");
    }

    /// An audio-only recording is cut into fragments of about the fragment duration.
    #[test]
    fn audio_alone_is_cut_every_fragment_duration() {
        let audio: Vec<Unit> =
            demo_units().into_iter().filter(|u| u.stream == 1).map(|u| Unit { stream: 0, ..u }).collect();
        let mut r = TsRecorder::new(&streams()[1..], 500, 3600).unwrap();
        let files = record(&mut r, &audio);
        assert_eq!(files.len(), 1);
        let ix = index(&files[0].1);
        assert!(ix.fragments.len() >= 8, "{} fragments", ix.fragments.len());
        for f in &ix.fragments[..ix.fragments.len() - 1] {
            let ms = f.trafs[0].duration / 90;
            assert!((500..560).contains(&ms), "a fragment of {ms} ms");
        }
    }

    /// A file cut anywhere (the process killed mid-write) scans to the fragments it holds
    /// whole, and the last one as far as it goes.
    #[test]
    fn a_file_cut_anywhere_scans_to_what_it_holds() {
        let mut r = TsRecorder::new(&streams(), 1000, 3600).unwrap();
        let files = record(&mut r, &demo_units());
        let bytes = &files[0].1;
        let whole = index(bytes);
        for cut in (PACKET_LEN..bytes.len()).step_by(9973) {
            let ix = index(&bytes[..cut]);
            let n = whole.fragments.iter().take_while(|f| f.offset + f.len <= cut as u64).count();
            assert_eq!(ix.fragments[..n.min(ix.fragments.len())], whole.fragments[..n.min(ix.fragments.len())]);
            assert!(ix.fragments.iter().all(|f| f.offset + f.len <= cut as u64));
        }
        assert!(scan(4, |_, _| Some(vec![0; 4])).unwrap().fragments.is_empty(), "less than a packet");
        assert!(scan(188, |_, _| Some(vec![0; 188])).is_err(), "not TS");
    }

    /// Fragments of two runs (their clocks unrelated) retimed onto one timeline: the first
    /// starts at the PCR lead, the second run's at its wall-clock distance, and a run's
    /// fragments keep their own spacing.
    #[test]
    fn retimed_fragments_play_on_one_timeline() {
        let units = demo_units();
        let mut r = TsRecorder::new(&streams(), 1000, 3600).unwrap();
        let run = record(&mut r, &units).remove(0).1;
        let ix = index(&run);
        let mut t = TsRetimer::default();
        let mut firsts = Vec::new();
        for (k, f) in ix.fragments.iter().take(3).enumerate() {
            let mut b = run[f.offset as usize..(f.offset + f.len) as usize].to_vec();
            // The third as if from another run, 60 s later.
            let start = if k == 2 {
                T0_US + 60_000_000
            } else {
                T0_US + (f.trafs[0].base - ix.fragments[0].trafs[0].base) as i64 * 100 / 9
            };
            t.retime(&mut b, f, start);
            firsts.push(cuts(&b, 0x100).first().map(|c| c.1).unwrap());
        }
        let lead = PCR_LEAD_90K;
        assert_eq!(firsts[0], lead);
        assert_eq!(firsts[1], lead + ix.fragments[0].trafs[0].duration, "a run's spacing kept");
        assert_eq!(firsts[2], lead + 60 * 90_000);
    }

    /// Inputs the fuzzer found: they scan and retime without a panic.
    #[test]
    fn odd_files_scan() {
        let found: &[&[u8]] = &[&[
            71, 64, 0, 0, 255, 16, 0, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 48, 48, 54, 93,
            54, 54, 47, 54, 54, 54, 54, 54, 54, 54, 54, 54, 54, 54, 54, 0, 0, 0, 7, 0, 0, 0, 0, 255, 255, 0, 0, 255,
            255, 255, 255, 255, 255, 54, 54, 54, 53, 109, 21, 0, 0, 0, 54, 54, 54, 54, 54, 54, 54, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 109, 112, 52, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 48, 2, 216, 3, 255, 255,
            255, 54, 54, 54, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 65, 96, 109, 21, 0, 0, 0, 0, 0, 0, 0, 112, 1, 0, 0, 0, 54, 54, 54, 54, 54, 54, 51, 51, 51, 115,
            231, 231, 231, 48, 48, 48, 54, 93, 54, 54, 47, 54, 54, 54, 54, 54, 54, 54, 54, 54, 54, 54, 54, 54,
        ]];
        for data in found {
            if let Ok(ix) =
                scan(data.len() as u64, |at, n| data.get(at as usize..).map(|d| d[..n.min(d.len())].to_vec()))
            {
                for f in &ix.fragments {
                    TsRetimer::default().retime(
                        &mut data[f.offset as usize..(f.offset + f.len) as usize].to_vec(),
                        f,
                        1_000_000,
                    );
                }
            }
        }
    }

    proptest! {
        #[test]
        fn scan_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2000), sync in any::<bool>()) {
            let mut data = data;
            if sync {
                for p in data.chunks_mut(PACKET_LEN) { p[0] = SYNC_BYTE; }
            }
            if let Ok(ix) = scan(data.len() as u64, |at, n| Some(data[at as usize..(at as usize + n).min(data.len())].to_vec())) {
                for f in &ix.fragments {
                    prop_assert!(f.offset + f.len <= data.len() as u64);
                    let mut b = data[f.offset as usize..(f.offset + f.len) as usize].to_vec();
                    TsRetimer::default().retime(&mut b, f, 0);
                }
            }
        }
    }
}
