//! Elementary streams out of an MPEG-TS (ISO/IEC 13818-1 §2.4.3.6, §2.4.4): the PAT names
//! the PMT, the PMT names each stream's PID and type, and PES packets are reassembled per
//! PID with their PTS/DTS. Enough to take the H.264 out of a transport stream and send it
//! as RTP (RFC 6184) instead of RTP/MP2T; sans-IO, bounded, and fuzzed.

use crate::container::mpegts::{read_pes_ts, PACKET_LEN, SYNC_BYTE};
use std::collections::HashMap;

/// ISO/IEC 13818-1 stream types this crate knows by name.
pub const STREAM_TYPE_H264: u8 = 0x1b;
pub const STREAM_TYPE_H265: u8 = 0x24;
/// AAC in ADTS (ISO/IEC 13818-7).
pub const STREAM_TYPE_AAC: u8 = 0x0f;

/// A PES packet payload larger than this is dropped (a broken stream, not a picture).
const MAX_PES: usize = 4 << 20;

/// One reassembled PES packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pes {
    pub pid: u16,
    pub stream_type: u8,
    /// Presentation and decoding time stamps, 90 kHz.
    pub pts: Option<u64>,
    pub dts: Option<u64>,
    /// The elementary stream bytes (for video: Annex B).
    pub data: Vec<u8>,
}

#[derive(Debug, Default)]
pub struct Demux {
    pmt_pid: Option<u16>,
    /// Elementary PIDs and their stream types, from the PMT.
    streams: HashMap<u16, u8>,
    /// PES bytes gathered per PID since its last unit start.
    partial: HashMap<u16, Vec<u8>>,
    /// Packets that were not TS, had a bad adaptation field, or PES that did not parse.
    pub errors: u64,
}

impl Demux {
    /// Feeds one 188-byte packet; returns the PES packet it completed, if any (a PES packet
    /// ends where the next one on its PID starts).
    pub fn push(&mut self, pkt: &[u8]) -> Option<Pes> {
        if pkt.len() != PACKET_LEN || pkt[0] != SYNC_BYTE {
            self.errors += 1;
            return None;
        }
        let pid = u16::from_be_bytes([pkt[1] & 0x1f, pkt[2]]);
        let start = pkt[1] & 0x40 != 0;
        let mut off = 4;
        if pkt[3] & 0x20 != 0 {
            off += 1 + usize::from(pkt[4]);
        }
        if pkt[3] & 0x10 == 0 || off >= PACKET_LEN {
            if off > PACKET_LEN {
                self.errors += 1;
            }
            return None; // no payload
        }
        let payload = &pkt[off..];
        if pid == 0 {
            if start {
                self.pat(payload);
            }
            return None;
        }
        if Some(pid) == self.pmt_pid {
            if start {
                self.pmt(payload);
            }
            return None;
        }
        let stream_type = *self.streams.get(&pid)?;
        let mut done = None;
        if start {
            if let Some(prev) = self.partial.remove(&pid) {
                done = self.finish(pid, stream_type, &prev);
            }
            self.partial.insert(pid, payload.to_vec());
        } else if let Some(buf) = self.partial.get_mut(&pid) {
            if buf.len() + payload.len() > MAX_PES {
                self.partial.remove(&pid);
                self.errors += 1;
            } else {
                buf.extend_from_slice(payload);
            }
        }
        done
    }

    /// The elementary streams the PMT names: (PID, stream type).
    pub fn streams(&self) -> impl Iterator<Item = (u16, u8)> + '_ {
        self.streams.iter().map(|(p, t)| (*p, *t))
    }

    /// The PES packets still being gathered (at the end of a stream).
    pub fn flush(&mut self) -> Vec<Pes> {
        let mut pids: Vec<u16> = self.partial.keys().copied().collect();
        pids.sort_unstable();
        pids.into_iter()
            .filter_map(|pid| {
                let buf = self.partial.remove(&pid)?;
                let st = *self.streams.get(&pid)?;
                self.finish(pid, st, &buf)
            })
            .collect()
    }

    /// A PSI section after the pointer field: its body without the CRC, if it is whole.
    fn section(payload: &[u8], table_id: u8) -> Option<&[u8]> {
        let p = usize::from(*payload.first()?);
        let s = payload.get(1 + p..)?;
        if *s.first()? != table_id {
            return None;
        }
        let len = usize::from(u16::from_be_bytes([*s.get(1)? & 0x0f, *s.get(2)?]));
        // Header (3 bytes) + len; the last 4 bytes are the CRC.
        s.get(3..3 + len)?.get(..len.checked_sub(4)?)
    }

    fn pat(&mut self, payload: &[u8]) {
        let Some(body) = Self::section(payload, 0x00) else {
            self.errors += 1;
            return;
        };
        // After the 5-byte table header: (program number, PID) pairs; program 0 is the NIT.
        for e in body.get(5..).unwrap_or(&[]).chunks_exact(4) {
            if u16::from_be_bytes([e[0], e[1]]) != 0 {
                self.pmt_pid = Some(u16::from_be_bytes([e[2] & 0x1f, e[3]]));
                return;
            }
        }
    }

    fn pmt(&mut self, payload: &[u8]) {
        let Some(body) = Self::section(payload, 0x02) else {
            self.errors += 1;
            return;
        };
        let Some(info) = body.get(7..9) else { return };
        let mut i = 9 + usize::from(u16::from_be_bytes([info[0] & 0x0f, info[1]]));
        while let Some(e) = body.get(i..i + 5) {
            let pid = u16::from_be_bytes([e[1] & 0x1f, e[2]]);
            self.streams.insert(pid, e[0]);
            i += 5 + usize::from(u16::from_be_bytes([e[3] & 0x0f, e[4]]));
        }
    }

    fn finish(&mut self, pid: u16, stream_type: u8, b: &[u8]) -> Option<Pes> {
        let pes = parse_pes(pid, stream_type, b);
        if pes.is_none() {
            self.errors += 1;
        }
        pes
    }
}

fn parse_pes(pid: u16, stream_type: u8, b: &[u8]) -> Option<Pes> {
    if b.get(..3)? != [0, 0, 1] {
        return None;
    }
    let flags = *b.get(7)?;
    let hdr = 9 + usize::from(*b.get(8)?);
    let pts = (flags & 0x80 != 0).then(|| b.get(9..14).map(read_pes_ts)).flatten();
    let dts = (flags & 0x40 != 0).then(|| b.get(14..19).map(read_pes_ts)).flatten();
    // A video PES may say length 0 (unbounded): take everything gathered.
    let declared = usize::from(u16::from_be_bytes([b[4], b[5]]));
    let end = if declared == 0 { b.len() } else { (6 + declared).min(b.len()) };
    let data = b.get(hdr..end)?.to_vec();
    Some(Pes { pid, stream_type, pts, dts, data })
}

/// How long a recording lasts by its media: from its first picture's decoding time to the
/// end of its last (its time plus the step before it), 90 kHz; by the audio frames where
/// there is no video. What a loop must be long for the next lap to follow without a seam.
pub fn media_span_90k(ts: &[u8]) -> Option<u64> {
    let mut d = Demux::default();
    let mut pes: Vec<Pes> = ts.chunks(crate::container::mpegts::PACKET_LEN).filter_map(|p| d.push(p)).collect();
    pes.extend(d.flush());
    let video = |st| st == STREAM_TYPE_H264 || st == STREAM_TYPE_H265;
    let pid = pes.iter().find(|p| video(p.stream_type)).or(pes.iter().find(|p| p.stream_type == 0x0f))?.pid;
    let mut t: Vec<u64> = pes.iter().filter(|p| p.pid == pid).filter_map(|p| p.dts.or(p.pts)).collect();
    t.sort_unstable();
    let step = t.windows(2).last().map(|w| w[1] - w[0])?;
    Some(t.last()? - t.first()? + step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn demux_all(ts: &[u8]) -> (Vec<Pes>, Demux) {
        let mut d = Demux::default();
        let mut out: Vec<Pes> = ts.chunks(PACKET_LEN).filter_map(|p| d.push(p)).collect();
        out.extend(d.flush());
        (out, d)
    }

    /// The demo is 8 s of 25 pictures a second; the byte rate between its PCRs says
    /// 8.0001 s, and a TS our muxer wrote of it (as for MP4s and playlists) 8.05 s: looped by
    /// that, every lap would leave a gap. Its media span is the 8 s exactly, and the
    /// schedule takes it.
    #[test]
    fn the_media_span_is_what_a_loop_lasts() {
        let ts = include_bytes!("../../../../assets/demo.ts");
        assert_eq!(media_span_90k(ts), Some(8 * 90_000));
        let remuxed = crate::container::playlist::concat(&[("demo".into(), ts.to_vec())]).unwrap();
        assert_eq!(media_span_90k(&remuxed), Some(8 * 90_000));
        let mut s = crate::container::mpegts::TsSchedule::new(&remuxed).unwrap();
        assert!(s.loop_ticks().abs_diff(8 * 27_000_000) > 27_000_000 / 100, "the byte rate's estimate is off");
        s.fit_to_media(8 * 90_000);
        assert_eq!(s.loop_ticks(), 8 * 27_000_000);
        // A span far from the PCRs' (a stray timestamp) is not taken.
        s.fit_to_media(80 * 90_000);
        assert_eq!(s.loop_ticks(), 8 * 27_000_000);
        assert_eq!(media_span_90k(&ts[..188 * 4]), None, "no two pictures, no step to end on");
    }

    #[test]
    fn takes_the_h264_out_of_the_demo_clip() {
        let ts = include_bytes!("../../../../assets/demo.ts");
        let (pes, d) = demux_all(ts);
        assert_eq!(d.errors, 0);
        let video: Vec<&Pes> = pes.iter().filter(|p| p.stream_type == STREAM_TYPE_H264).collect();
        // 8 s at 25 fps (ffprobe: 480x270, 25 fps).
        assert!((195..=205).contains(&video.len()), "{} video PES", video.len());
        assert!(video.iter().all(|p| p.pts.is_some()));
        // Every one is an access unit in Annex B; the first has SPS, PPS and an IDR slice.
        let first: Vec<u8> = crate::codec::annexb::nal_units(&video[0].data).map(|n| n[0] & 0x1f).collect();
        assert!(first.contains(&7) && first.contains(&8) && first.contains(&5), "{first:?}");
        // Audio (AAC, stream type 0x0f) comes out too.
        assert!(pes.iter().any(|p| p.stream_type == 0x0f));
    }

    proptest! {
        /// The demo clip's first packets with bytes overwritten anywhere (tables, adaptation
        /// fields, PES headers): no panic, and PES payloads stay within the cap.
        #[test]
        fn corrupted_streams_never_panic(hits in proptest::collection::vec((0usize..300 * PACKET_LEN, any::<u8>()), 0..64)) {
            let mut ts = include_bytes!("../../../../assets/demo.ts")[..300 * PACKET_LEN].to_vec();
            for (at, v) in hits {
                ts[at] = v;
            }
            let mut d = Demux::default();
            for p in ts.chunks(PACKET_LEN) {
                if let Some(pes) = d.push(p) {
                    prop_assert!(pes.data.len() <= MAX_PES);
                }
            }
            let _ = d.flush();
        }
    }
}
