//! MPEG-TS packets and PCR timing (ISO/IEC 13818-1 §2.4.3), and the schedule that plays a
//! recorded transport stream at its own rate, 7 packets (1316 bytes) per datagram as IPTV does.

use thiserror::Error;

pub const PACKET_LEN: usize = 188;
pub const SYNC_BYTE: u8 = 0x47;
/// Seven TS packets: the payload of one IPTV datagram.
pub const PACKETS_PER_DATAGRAM: usize = 7;
pub const DATAGRAM_LEN: usize = PACKET_LEN * PACKETS_PER_DATAGRAM;
/// PCR ticks per second.
pub const PCR_HZ: u64 = 27_000_000;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TsError {
    #[error("TS packet at byte {offset}: sync byte is {found:#04x}, expected 0x47")]
    BadSync { offset: usize, found: u8 },
    #[error("TS stream is {len} bytes, not a whole number of 188-byte packets")]
    Ragged { len: usize },
    #[error("TS stream has {found} PCRs on its PCR PID; pacing needs at least two increasing ones")]
    TooFewPcrs { found: usize },
    #[error("TS packet at byte {offset}: adaptation field length {len} runs past the packet")]
    BadAdaptation { offset: usize, len: usize },
}

/// The parts of a TS packet header a relay needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsHeader {
    pub pid: u16,
    pub payload_unit_start: bool,
    pub continuity_counter: u8,
    /// Program clock reference in 27 MHz ticks, when the adaptation field carries one.
    pub pcr: Option<u64>,
}

/// Parses one 188-byte packet's header; `offset` is only used to locate errors.
pub fn parse_header(pkt: &[u8], offset: usize) -> Result<TsHeader, TsError> {
    if pkt.len() < PACKET_LEN {
        return Err(TsError::Ragged { len: pkt.len() });
    }
    if pkt[0] != SYNC_BYTE {
        return Err(TsError::BadSync { offset, found: pkt[0] });
    }
    let pid = u16::from_be_bytes([pkt[1] & 0x1f, pkt[2]]);
    let adaptation = pkt[3] & 0x20 != 0;
    let mut pcr = None;
    if adaptation {
        let len = usize::from(pkt[4]);
        if len > PACKET_LEN - 5 {
            return Err(TsError::BadAdaptation { offset, len });
        }
        // PCR flag; the PCR takes 6 bytes after the flags byte.
        if len >= 7 && pkt[5] & 0x10 != 0 {
            let b = &pkt[6..12];
            let base = (u64::from(b[0]) << 25)
                | (u64::from(b[1]) << 17)
                | (u64::from(b[2]) << 9)
                | (u64::from(b[3]) << 1)
                | (u64::from(b[4]) >> 7);
            let ext = (u64::from(b[4] & 1) << 8) | u64::from(b[5]);
            pcr = Some(base * 300 + ext);
        }
    }
    Ok(TsHeader { pid, payload_unit_start: pkt[1] & 0x40 != 0, continuity_counter: pkt[3] & 0x0f, pcr })
}

/// Whether a run of TS packets holds the start of a video keyframe: a packet with the
/// random access indicator set that starts a video PES packet (stream id 0xE0–0xEF). A new
/// subscriber that starts there decodes a picture at once. Audio frames (which muxers also
/// mark as random access points) do not count.
pub fn starts_video_keyframe(packets: &[u8]) -> bool {
    packets.chunks_exact(PACKET_LEN).any(|p| {
        if p[0] != SYNC_BYTE || p[1] & 0x40 == 0 || p[3] & 0x20 == 0 {
            return false;
        }
        let af_len = usize::from(p[4]);
        if af_len == 0 || p[5] & 0x40 == 0 || p[3] & 0x10 == 0 {
            return false;
        }
        let pes = 5 + af_len;
        p.get(pes..pes + 4).is_some_and(|h| h[..3] == [0, 0, 1] && (0xe0..=0xef).contains(&h[3]))
    })
}

/// 33-bit wrap of PTS, DTS and the PCR base (90 kHz units).
const TS_WRAP: u64 = 1 << 33;

/// A PES header's 33-bit PTS or DTS from its 5 bytes.
pub(crate) fn read_pes_ts(b: &[u8]) -> u64 {
    ((u64::from(b[0]) >> 1) & 7) << 30
        | u64::from(b[1]) << 22
        | (u64::from(b[2]) >> 1) << 15
        | u64::from(b[3]) << 7
        | u64::from(b[4]) >> 1
}

fn write_pes_ts(b: &mut [u8], v: u64) {
    b[0] = (b[0] & 0xf0) | (((v >> 30) & 7) as u8) << 1 | 1;
    b[1] = (v >> 22) as u8;
    b[2] = (((v >> 15) & 0x7f) as u8) << 1 | 1;
    b[3] = (v >> 7) as u8;
    b[4] = ((v & 0x7f) as u8) << 1 | 1;
}

/// A looped clip whose every stream ends within one lap. A clip's audio often runs a frame
/// past its video's span (the demo: 376 AAC frames of 21.3 ms against 200 pictures of 40 ms),
/// and that frame would carry the next lap's first timestamp, which players report as a
/// timestamp that did not rise. So each PES that starts `lap_90k` or more after its stream's
/// first is nulled, and the ADTS frames of one that starts before but runs past are cut from
/// it (the PES written again into the same packets). Null packets keep the bytes and so the
/// PCR pacing as they were; the [`Restamper`] numbers the stream's continuity counters past
/// them. `None` when nothing reaches that far, or when a packet to change carries a PCR.
pub fn trimmed_to_lap(ts: &[u8], lap_90k: u64) -> Option<Vec<u8>> {
    /// Where a packet's payload starts, if it has one.
    fn payload_at(p: &[u8]) -> Option<usize> {
        let at = if p[3] & 0x20 != 0 { 5 + usize::from(p[4]) } else { 4 };
        (p[3] & 0x10 != 0 && at < PACKET_LEN).then_some(at)
    }
    let has_pcr = |p: &[u8]| p[3] & 0x20 != 0 && p[4] >= 7 && p[5] & 0x10 != 0;
    // Each PID's PES units: the packets from a unit start to the next.
    let mut units: Vec<(u16, Vec<usize>)> = Vec::new();
    let mut open = std::collections::HashMap::<u16, usize>::new();
    for (i, p) in ts.chunks_exact(PACKET_LEN).enumerate() {
        let pid = u16::from_be_bytes([p[1] & 0x1f, p[2]]);
        if p[0] != SYNC_BYTE || payload_at(p).is_none() || pid == 0x1fff {
            continue;
        }
        if p[1] & 0x40 != 0 {
            units.push((pid, vec![i]));
            open.insert(pid, units.len() - 1);
        } else if let Some(&u) = open.get(&pid) {
            units[u].1.push(i);
        }
    }
    let mut first = std::collections::HashMap::<u16, u64>::new();
    let mut out: Option<Vec<u8>> = None;
    for (pid, packets) in &units {
        let packet = |i: usize| &ts[i * PACKET_LEN..(i + 1) * PACKET_LEN];
        let pes: Vec<u8> =
            packets.iter().flat_map(|&i| &packet(i)[payload_at(packet(i)).expect("kept")..]).copied().collect();
        if pes.len() < 14 || pes[..3] != [0, 0, 1] || pes[7] & 0x80 == 0 {
            continue;
        }
        let pts = read_pes_ts(&pes[9..14]);
        let f = *first.entry(*pid).or_insert(pts);
        let Some(end) = pts.checked_sub(f).map(|_| f + lap_90k) else { continue };
        // How much of the PES stays: none, or up to its first ADTS frame due at the end.
        let keep = if pts >= end {
            0
        } else {
            let mut at = 9 + usize::from(pes[8]);
            let rate = crate::codec::aac::adts_frames(&pes[at.min(pes.len())..]).first().and_then(|f| f.sample_rate());
            let Some(rate) = rate else { continue };
            let mut k = 0u64;
            while at + 7 <= pes.len() && pes[at] == 0xff && pes[at + 1] & 0xf6 == 0xf0 {
                if pts + k * 1024 * 90_000 / u64::from(rate) >= end {
                    break;
                }
                at +=
                    usize::from(pes[at + 3] & 3) << 11 | usize::from(pes[at + 4]) << 3 | usize::from(pes[at + 5] >> 5);
                k += 1;
            }
            if at >= pes.len() {
                continue;
            }
            at
        };
        if packets.iter().any(|&i| has_pcr(packet(i))) {
            return None;
        }
        let o = out.get_or_insert_with(|| ts.to_vec());
        let mut pes = pes[..keep].to_vec();
        if pes.len() >= 6 && (pes[4], pes[5]) != (0, 0) {
            let len = u16::try_from(pes.len() - 6).expect("shorter than it was");
            pes[4..6].copy_from_slice(&len.to_be_bytes());
        }
        // The kept bytes into the unit's packets (stuffing in the last one's adaptation
        // field), null packets after them.
        let mut rest = &pes[..];
        for &i in packets {
            let p = &mut o[i * PACKET_LEN..(i + 1) * PACKET_LEN];
            if rest.is_empty() {
                p.fill(0xff);
                p[..4].copy_from_slice(&[SYNC_BYTE, 0x1f, 0xff, 0x10]);
                continue;
            }
            let n = rest.len().min(PACKET_LEN - 4);
            let start = p[1] & 0x40;
            p[1] = start | (p[1] & 0x1f);
            if n < PACKET_LEN - 4 {
                p[3] = (p[3] & 0x0f) | 0x30;
                let afl = PACKET_LEN - 5 - n;
                p[4] = afl as u8;
                if afl > 0 {
                    p[5] = 0;
                    p[6..5 + afl].fill(0xff);
                }
            } else {
                p[3] = (p[3] & 0x0f) | 0x10;
            }
            p[PACKET_LEN - n..].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
    }
    out
}

/// Makes a looped recording one continuous stream: shifts PCR, PTS and DTS by a loop
/// offset and renumbers continuity counters per PID, so a player sees neither a timestamp
/// jump nor a continuity error where the clip starts again.
#[derive(Debug, Clone)]
pub struct Restamper {
    offset_90k: u64,
    /// Next continuity counter per PID (0x10 = not seen yet).
    cc: Box<[u8; 8192]>,
}

impl Default for Restamper {
    fn default() -> Self {
        Self { offset_90k: 0, cc: Box::new([0x10; 8192]) }
    }
}

impl Restamper {
    /// Timestamps from now on are shifted by `offset_90k` (90 kHz units).
    pub fn set_offset(&mut self, offset_90k: u64) {
        self.offset_90k = offset_90k % TS_WRAP;
    }

    /// Rewrites every 188-byte packet of `packets` in place; anything malformed is left as is.
    pub fn restamp(&mut self, packets: &mut [u8]) {
        for p in packets.chunks_exact_mut(PACKET_LEN) {
            if p[0] != SYNC_BYTE {
                continue;
            }
            let pid = usize::from(u16::from_be_bytes([p[1] & 0x1f, p[2]]));
            let (adaptation, payload) = (p[3] & 0x20 != 0, p[3] & 0x10 != 0);
            // A packet with payload takes the next counter; one without repeats the last
            // (ISO/IEC 13818-1 §2.4.3.3), which is what decoders check.
            if payload {
                let cc = if self.cc[pid] > 0x0f { p[3] & 0x0f } else { self.cc[pid] };
                p[3] = (p[3] & 0xf0) | cc;
                self.cc[pid] = (cc + 1) & 0x0f;
            } else if self.cc[pid] <= 0x0f {
                p[3] = (p[3] & 0xf0) | (self.cc[pid].wrapping_sub(1) & 0x0f);
            }
            let mut start = 4;
            if adaptation {
                let len = usize::from(p[4]);
                if len > PACKET_LEN - 5 {
                    continue;
                }
                if len >= 7 && p[5] & 0x10 != 0 {
                    let b = &mut p[6..12];
                    let base = (u64::from(b[0]) << 25)
                        | (u64::from(b[1]) << 17)
                        | (u64::from(b[2]) << 9)
                        | (u64::from(b[3]) << 1)
                        | (u64::from(b[4]) >> 7);
                    let base = (base + self.offset_90k) % TS_WRAP;
                    b[0] = (base >> 25) as u8;
                    b[1] = (base >> 17) as u8;
                    b[2] = (base >> 9) as u8;
                    b[3] = (base >> 1) as u8;
                    b[4] = (b[4] & 0x7f) | ((base as u8 & 1) << 7);
                }
                start = 5 + len;
            }
            // A PES header with PTS (and DTS) at the start of the payload.
            let unit_start = p[1] & 0x40 != 0;
            let pes = &mut p[start..];
            if !unit_start || !payload || pes.len() < 14 || pes[..3] != [0, 0, 1] {
                continue;
            }
            let flags = pes[7] >> 6;
            if flags & 2 != 0 {
                let v = (read_pes_ts(&pes[9..14]) + self.offset_90k) % TS_WRAP;
                write_pes_ts(&mut pes[9..14], v);
            }
            if flags == 3 && pes.len() >= 19 {
                let v = (read_pes_ts(&pes[14..19]) + self.offset_90k) % TS_WRAP;
                write_pes_ts(&mut pes[14..19], v);
            }
        }
    }
}

/// When each datagram of a recorded transport stream is due, derived from its PCRs.
#[derive(Debug, Clone)]
pub struct TsSchedule {
    /// `(byte offset, length, due time in 27 MHz ticks from the start of one loop)`.
    chunks: Vec<(usize, usize, u64)>,
    /// Length of one loop of the clip in 27 MHz ticks.
    loop_ticks: u64,
}

impl TsSchedule {
    /// Builds the schedule for `ts`: the PCRs of the first PID that carries them are
    /// interpolated by packet index, so datagrams between PCRs are spread evenly.
    pub fn new(ts: &[u8]) -> Result<Self, TsError> {
        if ts.is_empty() || !ts.len().is_multiple_of(PACKET_LEN) {
            return Err(TsError::Ragged { len: ts.len() });
        }
        let packets = ts.len() / PACKET_LEN;
        let mut pcr_pid = None;
        let mut points: Vec<(usize, u64)> = Vec::new();
        for i in 0..packets {
            let h = parse_header(&ts[i * PACKET_LEN..(i + 1) * PACKET_LEN], i * PACKET_LEN)?;
            if let Some(pcr) = h.pcr {
                if *pcr_pid.get_or_insert(h.pid) == h.pid {
                    // Keep only increasing PCRs (a wrap or a splice would break the pace).
                    if points.last().is_none_or(|&(_, last)| pcr > last) {
                        points.push((i, pcr));
                    }
                }
            }
        }
        if points.len() < 2 {
            return Err(TsError::TooFewPcrs { found: points.len() });
        }
        let (first_i, first_pcr) = points[0];
        let (last_i, last_pcr) = points[points.len() - 1];
        let ticks_per_packet = (last_pcr - first_pcr) as f64 / (last_i - first_i) as f64;
        let time_of = |i: usize| -> u64 {
            // Interpolate between the surrounding PCRs; extrapolate at the ends.
            let k = points.partition_point(|&(pi, _)| pi <= i);
            let t = if k == 0 || k == points.len() {
                let (pi, pcr) = if k == 0 { points[0] } else { points[k - 1] };
                pcr as f64 + (i as f64 - pi as f64) * ticks_per_packet
            } else {
                let (i0, p0) = points[k - 1];
                let (i1, p1) = points[k];
                p0 as f64 + (p1 - p0) as f64 * (i - i0) as f64 / (i1 - i0) as f64
            };
            (t - (first_pcr as f64 - first_i as f64 * ticks_per_packet)).max(0.0) as u64
        };
        let chunks = (0..packets)
            .step_by(PACKETS_PER_DATAGRAM)
            .map(|i| {
                let len = PACKETS_PER_DATAGRAM.min(packets - i) * PACKET_LEN;
                (i * PACKET_LEN, len, time_of(i))
            })
            .collect();
        let loop_ticks = (packets as f64 * ticks_per_packet).round().max(1.0) as u64;
        Ok(Self { chunks, loop_ticks })
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
    /// `(offset, len)` of datagram `n` of the endless loop, and when it is due in ticks
    /// from the start of the first loop.
    pub fn datagram(&self, n: u64) -> (usize, usize, u64) {
        let per_loop = self.chunks.len() as u64;
        let (off, len, due) = self.chunks[(n % per_loop) as usize];
        (off, len, due + (n / per_loop) * self.loop_ticks)
    }
    pub fn loop_ticks(&self) -> u64 {
        self.loop_ticks
    }
    /// Makes one loop as long as the media (`span_90k`, see
    /// [`crate::container::tsdemux::media_span_90k`]) where that is within 5% of what the byte rate
    /// between the PCRs says: the next lap's pictures then follow the last one's at their own
    /// step, whatever the packets at the clip's ends.
    pub fn fit_to_media(&mut self, span_90k: u64) {
        let ticks = span_90k.saturating_mul(300);
        if ticks.abs_diff(self.loop_ticks) * 20 <= self.loop_ticks {
            self.loop_ticks = ticks.max(1);
        }
    }
    /// Average bit rate of the clip.
    pub fn bitrate(&self) -> f64 {
        let bytes: usize = self.chunks.iter().map(|c| c.1).sum();
        bytes as f64 * 8.0 * PCR_HZ as f64 / self.loop_ticks as f64
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The demo's audio runs one frame past its 8 s of video: that frame is nulled, nothing
    /// else, and the clip keeps its size (so its pacing); a clip within its lap is left alone.
    #[test]
    fn what_runs_past_a_lap_is_nulled() {
        let ts = include_bytes!("../../../../assets/demo.ts");
        // ADTS frames and pictures, as a demuxer reads them.
        let count = |ts: &[u8]| {
            let mut d = crate::container::tsdemux::Demux::default();
            let mut pes: Vec<_> = ts.chunks(PACKET_LEN).filter_map(|p| d.push(p)).collect();
            pes.extend(d.flush());
            let audio = pes.iter().filter(|p| p.stream_type == 0x0f);
            let frames: usize = audio.clone().map(|p| crate::codec::aac::adts_frames(&p.data).len()).sum();
            (frames, pes.len() - audio.count())
        };
        assert_eq!(count(ts), (376, 200));
        let trimmed = trimmed_to_lap(ts, 720_000).expect("the audio's last frame");
        assert_eq!((trimmed.len(), count(&trimmed)), (ts.len(), (375, 200)));
        assert_eq!(trimmed_to_lap(ts, 730_000), None);
        // Cut at 4 s, the video's packets that carry the PCRs would go: left alone.
        assert_eq!(trimmed_to_lap(ts, 360_000), None);
    }

    /// A TS packet on `pid`, with a PCR when given.
    pub fn packet(pid: u16, pcr: Option<u64>) -> [u8; PACKET_LEN] {
        let mut p = [0xffu8; PACKET_LEN];
        p[0] = SYNC_BYTE;
        p[1] = (pid >> 8) as u8 & 0x1f;
        p[2] = pid as u8;
        p[3] = 0x10;
        if let Some(pcr) = pcr {
            p[3] = 0x30;
            p[4] = 7;
            p[5] = 0x10;
            let (base, ext) = (pcr / 300, pcr % 300);
            p[6] = (base >> 25) as u8;
            p[7] = (base >> 17) as u8;
            p[8] = (base >> 9) as u8;
            p[9] = (base >> 1) as u8;
            p[10] = ((base as u8 & 1) << 7) | 0x7e | ((ext >> 8) as u8 & 1);
            p[11] = ext as u8;
        }
        p
    }

    #[test]
    fn finds_video_keyframes_in_the_demo_clip() {
        let ts = include_bytes!("../../../../assets/demo.ts");
        let keys = ts.chunks(DATAGRAM_LEN).filter(|d| starts_video_keyframe(d)).count();
        // 8 s at 25 fps with a keyframe every 25 frames (and the encoder may add scene cuts).
        assert!((8..=10).contains(&keys), "{keys}");
        assert!(!starts_video_keyframe(&packet(256, Some(1))));
    }

    #[test]
    fn restamped_loops_of_the_demo_clip_are_continuous() {
        let clip = include_bytes!("../../../../assets/demo.ts");
        let sched = TsSchedule::new(clip).unwrap();
        let mut r = Restamper::default();
        let (mut last_pcr, mut cc) = (None::<u64>, std::collections::HashMap::new());
        for lap in 0..3u64 {
            r.set_offset(lap * sched.loop_ticks() / 300);
            let mut copy = clip.to_vec();
            r.restamp(&mut copy);
            for (i, p) in copy.chunks(PACKET_LEN).enumerate() {
                let h = parse_header(p, i * PACKET_LEN).unwrap();
                if let Some(pcr) = h.pcr {
                    assert!(last_pcr.is_none_or(|l| pcr > l), "PCR went back at lap {lap}, packet {i}");
                    last_pcr = Some(pcr);
                }
                // As decoders check: +1 with payload, unchanged without.
                let step = u8::from(p[3] & 0x10 != 0);
                if let Some(prev) = cc.insert(h.pid, h.continuity_counter) {
                    assert_eq!(h.continuity_counter, (prev + step) & 0x0f, "CC jump, PID {} packet {i}", h.pid);
                }
            }
        }
        // Laps 2 and 3 carry the same PTS as lap 1 plus whole loop lengths.
        let mut a = clip.to_vec();
        let mut b = clip.to_vec();
        Restamper::default().restamp(&mut a);
        let mut r2 = Restamper::default();
        r2.set_offset(sched.loop_ticks() / 300);
        r2.restamp(&mut b);
        // The PTS of the first PES header in the clip (after any adaptation field).
        let pts_at = |p: &[u8]| -> Option<usize> {
            let start = if p[3] & 0x20 != 0 { 5 + usize::from(p[4]) } else { 4 };
            (p[1] & 0x40 != 0 && p.get(start..start + 3) == Some(&[0, 0, 1][..]) && p[start + 7] & 0x80 != 0)
                .then_some(start + 9)
        };
        let (k, off) =
            a.chunks(PACKET_LEN).enumerate().find_map(|(k, p)| pts_at(p).map(|o| (k, o))).expect("a PES with PTS");
        let pa = read_pes_ts(&a[k * PACKET_LEN + off..]);
        let pb = read_pes_ts(&b[k * PACKET_LEN + off..]);
        assert_eq!(pb - pa, sched.loop_ticks() / 300);
    }

    #[test]
    fn pes_timestamps_round_trip() {
        for v in [0u64, 1, 90_000, (1 << 33) - 1, 0x1_2345_6789] {
            let mut b = [0x21u8, 0, 0, 0, 0];
            write_pes_ts(&mut b, v);
            assert_eq!(read_pes_ts(&b), v);
            assert_eq!(b[0] & 0xf0, 0x20);
        }
    }

    #[test]
    fn reads_pcr() {
        let h = parse_header(&packet(256, Some(123_456_789)), 0).unwrap();
        assert_eq!(h.pid, 256);
        assert_eq!(h.pcr, Some(123_456_789));
    }

    #[test]
    fn schedule_follows_pcr() {
        // 70 packets, a PCR every 14 packets, 1 ms (27_000 ticks) apart.
        let mut ts = Vec::new();
        for i in 0..70u64 {
            let pcr = (i % 14 == 0).then(|| 1_000_000 + i / 14 * 27_000);
            ts.extend_from_slice(&packet(100, pcr));
        }
        let s = TsSchedule::new(&ts).unwrap();
        assert_eq!(s.len(), 10);
        assert_eq!(s.datagram(0), (0, DATAGRAM_LEN, 0));
        assert_eq!(s.datagram(2).2, 27_000);
        // Packet 70 would be 5 PCR intervals in: one loop lasts 5 ms.
        assert_eq!(s.loop_ticks(), 135_000);
        assert_eq!(s.datagram(12).2, 135_000 + 27_000);
        let expected_bps = 70.0 * 188.0 * 8.0 / 0.005;
        assert!((s.bitrate() - expected_bps).abs() < 1.0);
    }

    #[test]
    fn rejects_streams_it_cannot_pace() {
        assert!(matches!(TsSchedule::new(&[0x47; 100]), Err(TsError::Ragged { len: 100 })));
        let mut ts = packet(100, None).to_vec();
        ts.extend_from_slice(&packet(100, Some(5)));
        assert_eq!(TsSchedule::new(&ts).unwrap_err(), TsError::TooFewPcrs { found: 1 });
        ts[188] = 0;
        assert_eq!(TsSchedule::new(&ts).unwrap_err(), TsError::BadSync { offset: 188, found: 0 });
    }

    proptest! {
        #[test]
        fn header_never_panics(buf in proptest::collection::vec(any::<u8>(), 188)) {
            let _ = parse_header(&buf, 0);
            let _ = starts_video_keyframe(&buf);
            let mut b = buf.clone();
            let mut r = Restamper::default();
            r.set_offset(12345);
            r.restamp(&mut b);
        }

        #[test]
        fn schedule_is_monotonic(pcrs in proptest::collection::vec(0u64..1_000_000, 2..20)) {
            let mut ts = Vec::new();
            for (k, p) in pcrs.iter().enumerate() {
                ts.extend_from_slice(&packet(7, Some(k as u64 * 1_000_000 + p)));
                ts.extend_from_slice(&packet(8, None));
            }
            let s = TsSchedule::new(&ts).unwrap();
            let mut last = 0;
            for n in 0..(2 * s.len() as u64) {
                let due = s.datagram(n).2;
                prop_assert!(due >= last);
                last = due;
            }
        }
    }
}
