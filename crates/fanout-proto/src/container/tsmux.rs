//! An MPEG-TS muxer (ISO/IEC 13818-1): access units of H.264, HEVC and AAC with their 90 kHz
//! times in, 188-byte transport packets out. One program: PAT, a PMT naming each stream,
//! PES packets per access unit, a PCR on the first stream. Sans-IO, bounded by its input.
//!
//! Made for live repackaging: the tables are repeated in front of every video keyframe,
//! which starts a fresh output chunk and carries the random access indicator, so a player
//! (or the relay choosing where a new subscriber begins, [`crate::container::mpegts::starts_video_keyframe`])
//! can start there. A program without video (a radio channel, a microphone) repeats them
//! every half second instead, so a player that joins late finds them.

use crate::container::mpegts::{PACKET_LEN, SYNC_BYTE};

/// What one elementary stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// Access units in Annex B.
    H264,
    H265,
    /// Access units in ADTS framing (header included).
    AacAdts,
    /// MPEG-1/2 audio (MP3) frames, each with its header.
    Mpa,
}

impl StreamKind {
    pub fn stream_type(self) -> u8 {
        match self {
            StreamKind::H264 => crate::container::tsdemux::STREAM_TYPE_H264,
            StreamKind::H265 => crate::container::tsdemux::STREAM_TYPE_H265,
            StreamKind::AacAdts => 0x0f,
            // (ISO/IEC 11172-3 audio; decoders read the layer and rate from each header.)
            StreamKind::Mpa => 0x03,
        }
    }

    pub fn is_video(self) -> bool {
        matches!(self, StreamKind::H264 | StreamKind::H265)
    }

    fn stream_id(self) -> u8 {
        if self.is_video() {
            0xe0
        } else {
            0xc0
        }
    }
}

pub const PMT_PID: u16 = 0x1000;
const FIRST_PID: u16 = 0x100;
/// PTS/DTS and the PCR base are 33-bit counters of 90 kHz.
const WRAP: u64 = 1 << 33;
/// The PCR runs this far behind the times of the PES packets, so that an access unit of a
/// second stream that arrives a little late is still on time for the decoder.
pub const PCR_LEAD_90K: u64 = 18_000;
/// How often a program without video repeats its tables (90 kHz).
const AUDIO_TABLES_EVERY: u64 = 45_000;

struct Stream {
    kind: StreamKind,
    pid: u16,
    cc: u8,
}

/// The muxer of one program.
pub struct TsMuxer {
    streams: Vec<Stream>,
    pat_cc: u8,
    pmt_cc: u8,
    /// The stream whose packets carry the PCR: the first video stream, else the first.
    pcr: usize,
    /// Whether a stream is video (whose keyframes carry the tables).
    video: bool,
    /// The decoding time of the unit the tables last went before.
    tables_at: Option<u64>,
}

/// One access unit for [`TsMuxer::push`].
#[derive(Debug, Clone, Copy)]
pub struct AccessUnit<'a> {
    /// Index of its stream, as given to [`TsMuxer::new`].
    pub stream: usize,
    /// Presentation and decoding times, 90 kHz (any 64-bit value: written modulo 2^33).
    pub pts: u64,
    pub dts: u64,
    /// A video picture a decoder can start at.
    pub key: bool,
    pub data: &'a [u8],
}

impl TsMuxer {
    /// A muxer for these streams, at PIDs 0x100, 0x101, …
    pub fn new(kinds: &[StreamKind]) -> Self {
        let streams =
            (0u16..).zip(kinds).map(|(i, &kind)| Stream { kind, pid: FIRST_PID + i, cc: 0 }).collect::<Vec<_>>();
        let pcr = streams.iter().position(|s| s.kind.is_video()).unwrap_or(0);
        let video = streams.iter().any(|s| s.kind.is_video());
        Self { streams, pat_cc: 0, pmt_cc: 0, pcr, video, tables_at: None }
    }

    /// The PIDs of the streams, in order.
    pub fn pids(&self) -> impl Iterator<Item = u16> + '_ {
        self.streams.iter().map(|s| s.pid)
    }

    /// Appends the transport packets of one access unit to `out` (a multiple of 188 bytes).
    /// A keyframe (and the very first unit) is preceded by the PAT and PMT; without video,
    /// the first unit every half second (or after time went back).
    ///
    /// # Panics
    /// If `au.stream` is not a stream of this muxer.
    pub fn push(&mut self, au: &AccessUnit<'_>, out: &mut Vec<u8>) {
        let due = match self.tables_at {
            None => true,
            Some(_) if self.video => au.key && self.streams[au.stream].kind.is_video(),
            Some(at) => au.dts.wrapping_sub(at) % WRAP >= AUDIO_TABLES_EVERY,
        };
        if due {
            self.tables_at = Some(au.dts);
            self.tables(out);
        }
        let s = &self.streams[au.stream];
        let pes = pes_header(s.kind, au);
        let pcr = (au.stream == self.pcr).then(|| au.dts.wrapping_sub(PCR_LEAD_90K) % WRAP);
        let random_access = au.key || !s.kind.is_video();
        let (pid, mut cc) = (s.pid, s.cc);
        let mut body = pes.iter().chain(au.data).copied();
        let mut left = pes.len() + au.data.len();
        let mut start = true;
        while left > 0 {
            let at = out.len();
            out.resize(at + PACKET_LEN, 0xff);
            let p = &mut out[at..];
            p[0] = SYNC_BYTE;
            p[1] = (u8::from(start) << 6) | (pid >> 8) as u8;
            p[2] = pid as u8;
            // The adaptation field: flags (random access, PCR) on the first packet, and
            // stuffing where the payload does not fill the last one.
            let mut af = Vec::with_capacity(8);
            if start && (random_access || pcr.is_some()) {
                let mut flags = 0u8;
                if random_access {
                    flags |= 0x40;
                }
                af.push(flags);
                if let Some(base) = pcr {
                    af[0] |= 0x10;
                    // 33-bit base, 6 reserved bits, 9-bit extension (0).
                    af.extend_from_slice(&[
                        (base >> 25) as u8,
                        (base >> 17) as u8,
                        (base >> 9) as u8,
                        (base >> 1) as u8,
                        ((base & 1) as u8) << 7 | 0x7e,
                        0,
                    ]);
                }
            }
            // Stuffing: the adaptation field grows by what the payload leaves unfilled (an
            // empty field is its length byte alone).
            let mut af_total = if af.is_empty() { 0 } else { 1 + af.len() };
            let missing = (PACKET_LEN - 4 - af_total).saturating_sub(left);
            if missing > 0 {
                if af_total == 0 && missing >= 2 {
                    af.push(0);
                }
                af_total += missing;
                af.resize(af_total - 1, 0xff);
            }
            let head = if af_total == 0 {
                p[3] = 0x10 | cc;
                4
            } else {
                p[3] = 0x30 | cc;
                p[4] = af.len() as u8;
                p[5..5 + af.len()].copy_from_slice(&af);
                4 + af_total
            };
            let n = PACKET_LEN - head;
            debug_assert!(n <= left);
            for (dst, b) in p[head..].iter_mut().zip(body.by_ref().take(n)) {
                *dst = b;
            }
            left -= n;
            cc = (cc + 1) & 0x0f;
            start = false;
        }
        self.streams[au.stream].cc = cc;
    }

    /// The PAT and PMT, one packet each (written by [`TsMuxer::push`] first and in front of
    /// every video keyframe; a caller starting a chunk elsewhere writes them itself).
    pub fn tables(&mut self, out: &mut Vec<u8>) {
        // PAT: program 1 at the PMT's PID.
        let mut pat = Vec::with_capacity(16);
        pat.extend_from_slice(&[0x00, 0xb0, 13, 0x00, 0x01, 0xc1, 0x00, 0x00]);
        pat.extend_from_slice(&[0x00, 0x01, 0xe0 | (PMT_PID >> 8) as u8, PMT_PID as u8]);
        self.pat_cc = section_packet(0, self.pat_cc, &mut pat, out);
        // PMT: the PCR's PID, no program info, one entry per stream.
        let pcr_pid = self.streams.get(self.pcr).map_or(0x1fff, |s| s.pid);
        let len = 13 + 5 * self.streams.len();
        let mut pmt = Vec::with_capacity(3 + len);
        pmt.extend_from_slice(&[0x02, 0xb0 | (len >> 8) as u8, len as u8, 0x00, 0x01, 0xc1, 0x00, 0x00]);
        pmt.extend_from_slice(&[0xe0 | (pcr_pid >> 8) as u8, pcr_pid as u8, 0xf0, 0x00]);
        for s in &self.streams {
            pmt.extend_from_slice(&[s.kind.stream_type(), 0xe0 | (s.pid >> 8) as u8, s.pid as u8, 0xf0, 0x00]);
        }
        self.pmt_cc = section_packet(PMT_PID, self.pmt_cc, &mut pmt, out);
    }
}

/// One PSI section (its CRC appended here) in one packet; returns the next continuity counter.
fn section_packet(pid: u16, cc: u8, section: &mut Vec<u8>, out: &mut Vec<u8>) -> u8 {
    let crc = crc32_mpeg2(section);
    section.extend_from_slice(&crc.to_be_bytes());
    let at = out.len();
    out.resize(at + PACKET_LEN, 0xff);
    let p = &mut out[at..];
    p[..5].copy_from_slice(&[SYNC_BYTE, 0x40 | (pid >> 8) as u8, pid as u8, 0x10 | cc, 0]);
    p[5..5 + section.len()].copy_from_slice(section);
    (cc + 1) & 0x0f
}

/// The PES header of an access unit: PTS, and DTS where it differs.
fn pes_header(kind: StreamKind, au: &AccessUnit<'_>) -> Vec<u8> {
    let (pts, dts) = (au.pts % WRAP, au.dts % WRAP);
    let with_dts = pts != dts;
    let hdr_data = if with_dts { 10 } else { 5 };
    // Video may say 0 (unbounded); audio says its length.
    let len = 3 + hdr_data + au.data.len();
    let pes_len = if kind.is_video() || len > 0xffff { 0 } else { len as u16 };
    let mut h = Vec::with_capacity(9 + hdr_data);
    h.extend_from_slice(&[0, 0, 1, kind.stream_id()]);
    h.extend_from_slice(&pes_len.to_be_bytes());
    h.extend_from_slice(&[0x80, if with_dts { 0xc0 } else { 0x80 }, hdr_data as u8]);
    h.extend_from_slice(&timestamp(if with_dts { 0x3 } else { 0x2 }, pts));
    if with_dts {
        h.extend_from_slice(&timestamp(0x1, dts));
    }
    h
}

/// A 33-bit PES time stamp behind its 4-bit prefix, with marker bits.
fn timestamp(prefix: u8, v: u64) -> [u8; 5] {
    [
        prefix << 4 | (((v >> 30) & 7) as u8) << 1 | 1,
        (v >> 22) as u8,
        (((v >> 15) & 0x7f) as u8) << 1 | 1,
        (v >> 7) as u8,
        ((v & 0x7f) as u8) << 1 | 1,
    ]
}

/// CRC-32/MPEG-2 (polynomial 0x04C11DB7, not reflected, initial all ones) of a PSI section.
/// Bitwise: sections are a few dozen bytes, once per keyframe. (The crc32 crates at hand
/// compute the reflected IEEE variant, not this one.)
pub fn crc32_mpeg2(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 { (crc << 1) ^ 0x04c1_1db7 } else { crc << 1 };
        }
    }
    crc
}

/// An ADTS header (7 bytes, no CRC) for one raw AAC access unit of `len` bytes, from the
/// stream's AudioSpecificConfig; `None` if the config is not one ADTS can say (an object
/// type above 4, an explicit sample rate) or the frame is too long for its 13 bits.
pub fn adts_header(config: &[u8], len: usize) -> Option<[u8; 7]> {
    let c = u16::from_be_bytes([*config.first()?, *config.get(1)?]);
    let (object, rate, channels) = ((c >> 11) as u8, ((c >> 7) & 0x0f) as u8, ((c >> 3) & 0x0f) as u8);
    if !(1..=4).contains(&object) || rate > 12 || channels > 7 {
        return None;
    }
    let total = len + 7;
    if total >= 1 << 13 {
        return None;
    }
    Some([
        0xff,
        0xf1, // MPEG-4, layer 0, no CRC
        (object - 1) << 6 | rate << 2 | channels >> 2,
        (channels & 3) << 6 | (total >> 11) as u8,
        (total >> 3) as u8,
        ((total & 7) as u8) << 5 | 0x1f,
        0xfc, // buffer fullness 0x7ff (VBR), one raw data block
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::tsdemux::Demux;
    use proptest::prelude::*;

    fn demux(ts: &[u8]) -> (Vec<crate::container::tsdemux::Pes>, u64) {
        let mut d = Demux::default();
        let mut out: Vec<_> = ts.chunks(PACKET_LEN).filter_map(|p| d.push(p)).collect();
        out.extend(d.flush());
        (out, d.errors)
    }

    #[test]
    fn the_crc_is_the_one_real_muxers_write() {
        // The demo clip's PAT (made by ffmpeg): its last four section bytes are the CRC.
        let ts = include_bytes!("../../../../assets/demo.ts");
        let pat = ts.chunks(PACKET_LEN).find(|p| p[1] & 0x1f == 0 && p[2] == 0).unwrap();
        let s = &pat[5..];
        let len = 3 + usize::from(u16::from_be_bytes([s[1] & 0x0f, s[2]]));
        let (body, crc) = s[..len].split_at(len - 4);
        assert_eq!(crc32_mpeg2(body).to_be_bytes(), crc);
        // And a section with its CRC appended checks to zero.
        assert_eq!(crc32_mpeg2(&s[..len]), 0);
    }

    #[test]
    fn adts_headers_parse_back() {
        // AAC LC, 48 kHz, stereo: the config ffmpeg writes as 1190.
        let au = [7u8; 300];
        let mut frame = adts_header(&[0x11, 0x90], au.len()).unwrap().to_vec();
        frame.extend_from_slice(&au);
        let frames = crate::codec::aac::adts_frames(&frame);
        assert_eq!(frames.len(), 1);
        assert_eq!((frames[0].au, frames[0].sample_rate(), frames[0].channels), (&au[..], Some(48_000), 2));
        assert_eq!(frames[0].audio_specific_config(), [0x11, 0x90]);
        assert_eq!(adts_header(&[0x11], 10), None);
        assert_eq!(adts_header(&[0x11, 0x90], 9000), None);
    }

    #[test]
    fn a_keyframe_starts_with_the_tables_and_is_marked() {
        let mut m = TsMuxer::new(&[StreamKind::H264, StreamKind::AacAdts]);
        let mut out = Vec::new();
        m.push(&AccessUnit { stream: 1, pts: 100, dts: 100, key: false, data: &[1; 50] }, &mut out);
        let at = out.len();
        m.push(&AccessUnit { stream: 0, pts: 3000, dts: 3000, key: true, data: &[0, 0, 0, 1, 0x65, 1, 2] }, &mut out);
        let key = &out[at..];
        assert_eq!(key.len(), 3 * PACKET_LEN, "PAT, PMT, one PES packet");
        assert_eq!((key[1] & 0x1f, key[2]), (0, 0));
        assert!(crate::container::mpegts::starts_video_keyframe(key));
        assert!(!crate::container::mpegts::starts_video_keyframe(&out[..at]), "audio is no video keyframe");
        // The PCR is on the video PID, behind its DTS.
        let h = crate::container::mpegts::parse_header(&key[2 * PACKET_LEN..], 0).unwrap();
        assert_eq!(h.pcr, Some((3000 + WRAP - PCR_LEAD_90K) * 300));
    }

    /// Audio alone: the tables come again each half second of its time (and where time went
    /// back), so a player that joins late finds them; with video only at its keyframes.
    #[test]
    fn a_program_without_video_repeats_its_tables() {
        let tables_before = |kinds: &[StreamKind], times: &[u64]| -> Vec<bool> {
            let mut m = TsMuxer::new(kinds);
            let stream = kinds.len() - 1;
            times
                .iter()
                .map(|&t| {
                    let mut out = Vec::new();
                    m.push(&AccessUnit { stream, pts: t, dts: t, key: false, data: &[1; 50] }, &mut out);
                    out[1] & 0x1f == 0 && out[2] == 0
                })
                .collect()
        };
        // AAC frames 1,920 ticks apart (1,024 samples at 48 kHz), then time back to 0.
        let times: Vec<u64> = (0..50).map(|k| k * 1920).chain([0]).collect();
        let audio = tables_before(&[StreamKind::AacAdts], &times);
        let with: Vec<usize> = (0..times.len()).filter(|&k| audio[k]).collect();
        assert_eq!(with, [0, 24, 48, 50]);
        let with_video = tables_before(&[StreamKind::H264, StreamKind::AacAdts], &times);
        assert_eq!(with_video.iter().filter(|t| **t).count(), 1, "only before the first unit");
    }

    fn kinds() -> impl Strategy<Value = Vec<StreamKind>> {
        proptest::collection::vec(
            prop_oneof![Just(StreamKind::H264), Just(StreamKind::H265), Just(StreamKind::AacAdts)],
            1..4,
        )
    }

    proptest! {
        /// Whatever the sizes and times: whole packets, continuity counters that step by one
        /// per PID, and every access unit demuxed back with its times and bytes.
        #[test]
        fn what_goes_in_comes_back_out(
            kinds in kinds(),
            units in proptest::collection::vec((0usize..4, any::<u64>(), 0u64..20_000, any::<bool>(), 1usize..3000, any::<u8>()), 1..40),
        ) {
            let mut m = TsMuxer::new(&kinds);
            let mut out = Vec::new();
            let mut want = Vec::new();
            for (s, pts, lag, key, len, fill) in units {
                let stream = s % kinds.len();
                let data = vec![fill; len];
                let dts = pts.wrapping_sub(lag);
                m.push(&AccessUnit { stream, pts, dts, key, data: &data }, &mut out);
                want.push((stream, pts % WRAP, dts % WRAP, data));
            }
            prop_assert_eq!(out.len() % PACKET_LEN, 0);
            let mut cc: std::collections::HashMap<u16, u8> = Default::default();
            for p in out.chunks(PACKET_LEN) {
                let h = crate::container::mpegts::parse_header(p, 0).unwrap();
                if let Some(prev) = cc.insert(h.pid, h.continuity_counter) {
                    prop_assert_eq!(h.continuity_counter, (prev + 1) & 0x0f, "pid {}", h.pid);
                }
            }
            let (pes, errors) = demux(&out);
            prop_assert_eq!(errors, 0);
            // PES come back per PID in order; compare stream by stream.
            let pids: Vec<u16> = m.pids().collect();
            for (i, pid) in pids.iter().enumerate() {
                let got: Vec<_> = pes.iter().filter(|p| p.pid == *pid).map(|p| (p.pts.unwrap(), p.dts.or(p.pts).unwrap(), p.data.clone())).collect();
                let exp: Vec<_> = want.iter().filter(|w| w.0 == i).map(|w| (w.1, w.2, w.3.clone())).collect();
                prop_assert_eq!(got, exp);
            }
        }
    }
}
