//! An MPEG-TS from an encoder (SRT's payload) as RTP tracks ([`crate::rtp::tracks`]): the
//! H.264 or H.265 and the AAC (ADTS) streams the PMT names become a video and an audio
//! track; other streams are counted and dropped. The tracks are fixed once every stream
//! the PMT names has its configuration (a keyframe's parameter sets, an ADTS header): what
//! came before waits (bounded), so the first picture is not lost to the order in which a
//! multiplexer finished its PES packets. Sans-IO: datagrams in, RTP packets out.

use crate::codec::aac;
use crate::codec::annexb::{self, Codec};
use crate::container::mpegts::{PACKET_LEN, SYNC_BYTE};
use crate::container::tsdemux::{Demux, Pes, STREAM_TYPE_AAC, STREAM_TYPE_H264, STREAM_TYPE_H265};
use crate::rtp::tracks::{RtpPacket, Tracks};
use std::collections::VecDeque;

/// PES packets held while the tracks wait for their configurations; past it they are fixed
/// with what is known.
const MAX_WAITING: usize = 600;

#[derive(Debug, Default)]
pub struct TsIngest {
    demux: Demux,
    tracks: Tracks,
    /// The start of a TS packet cut by the end of a datagram.
    rest: Vec<u8>,
    /// PES packets held, with the time each completed.
    waiting: VecDeque<(Pes, u64)>,
    /// Bytes skipped to find the next sync byte.
    pub resyncs: u64,
}

fn video_codec(stream_type: u8) -> Option<Codec> {
    match stream_type {
        STREAM_TYPE_H264 => Some(Codec::H264),
        STREAM_TYPE_H265 => Some(Codec::H265),
        _ => None,
    }
}

fn nal_type(codec: Codec, nal: &[u8]) -> u8 {
    match codec {
        Codec::H264 => nal[0] & 0x1f,
        Codec::H265 => (nal[0] >> 1) & 0x3f,
    }
}

impl TsIngest {
    /// The SDP of the tracks, once fixed.
    pub fn sdp(&self) -> Option<String> {
        self.tracks.sdp("SRT publisher")
    }

    /// TS packets that were not, and PES packets that did not parse.
    pub fn errors(&self) -> u64 {
        self.demux.errors + self.resyncs
    }

    /// Frames dropped: streams the relay does not carry, or before a configuration.
    pub fn ignored(&self) -> u64 {
        self.tracks.ignored
    }

    /// A datagram of TS packets (SRT sends seven a message), arrived at `now_ms` (any
    /// monotonic clock): the RTP packets it completes into `out`, each with the time its
    /// frame waited here.
    pub fn push(&mut self, mut data: &[u8], now_ms: u64, out: &mut Vec<RtpPacket>) {
        if !self.rest.is_empty() {
            let need = PACKET_LEN - self.rest.len();
            let take = need.min(data.len());
            self.rest.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.rest.len() < PACKET_LEN {
                return;
            }
            let pkt = std::mem::take(&mut self.rest);
            self.packet(&pkt, now_ms, out);
        }
        while !data.is_empty() {
            if data[0] != SYNC_BYTE {
                // A packet starts where the packets after it (up to seven, a datagram's) start
                // with a sync byte too: a lone 0x47 in the garbage (an RTP header's) is not one.
                let starts = |i: usize| (i..data.len()).step_by(PACKET_LEN).take(7).all(|j| data[j] == SYNC_BYTE);
                let skip = (1..data.len()).find(|&i| starts(i)).unwrap_or(data.len());
                self.resyncs += skip as u64;
                data = &data[skip..];
                continue;
            }
            if data.len() < PACKET_LEN {
                self.rest = data.to_vec();
                return;
            }
            self.packet(&data[..PACKET_LEN], now_ms, out);
            data = &data[PACKET_LEN..];
        }
    }

    fn packet(&mut self, pkt: &[u8], now_ms: u64, out: &mut Vec<RtpPacket>) {
        if let Some(pes) = self.demux.push(pkt) {
            self.pes(pes, now_ms, out);
        }
    }

    fn pes(&mut self, pes: Pes, now_ms: u64, out: &mut Vec<RtpPacket>) {
        self.configure(&pes);
        self.waiting.push_back((pes, now_ms));
        if !self.tracks.fixed() && !self.ready() && self.waiting.len() < MAX_WAITING {
            return;
        }
        while let Some((p, at)) = self.waiting.pop_front() {
            let from = out.len();
            self.emit(&p, out);
            for r in &mut out[from..] {
                r.waited_ms = now_ms.saturating_sub(at);
            }
        }
    }

    /// Whether every stream the PMT names that the relay carries has its configuration.
    fn ready(&self) -> bool {
        let (mut video, mut audio) = (false, false);
        for (_, t) in self.demux.streams() {
            video |= video_codec(t).is_some();
            audio |= t == STREAM_TYPE_AAC;
        }
        (video || audio)
            && (!video || self.tracks.configured_video().is_some())
            && (!audio || self.tracks.has_audio_config())
    }

    /// Learns the configuration a PES packet carries: a picture's parameter sets, an ADTS
    /// header.
    fn configure(&mut self, pes: &Pes) {
        if let Some(codec) = video_codec(pes.stream_type) {
            let want: &[u8] = if codec == Codec::H264 { &[7, 8] } else { &[32, 33, 34] };
            let nals: Vec<&[u8]> = annexb::nal_units(&pes.data).filter(|n| !n.is_empty()).collect();
            let sets: Option<Vec<Vec<u8>>> =
                want.iter().map(|t| nals.iter().find(|n| nal_type(codec, n) == *t).map(|n| n.to_vec())).collect();
            if let Some(sets) = sets {
                self.tracks.set_video(codec, sets);
            }
        } else if pes.stream_type == STREAM_TYPE_AAC {
            if let Some(f) = aac::adts_frames(&pes.data).first() {
                let _ = self.tracks.set_audio(f.audio_specific_config());
            }
        }
    }

    fn emit(&mut self, pes: &Pes, out: &mut Vec<RtpPacket>) {
        let Some(pts) = pes.pts else {
            self.tracks.ignored += 1;
            return;
        };
        if let Some(codec) = video_codec(pes.stream_type) {
            // Access unit delimiters stay behind: RTP marks a picture's end itself.
            let aud = if codec == Codec::H264 { 9 } else { 35 };
            let nals: Vec<&[u8]> =
                annexb::nal_units(&pes.data).filter(|n| !n.is_empty() && nal_type(codec, n) != aud).collect();
            let key = nals.iter().any(|n| match codec {
                Codec::H264 => nal_type(codec, n) == 5,
                Codec::H265 => (16..=23).contains(&nal_type(codec, n)),
            });
            self.tracks.video_frame(codec, pts as u32, key, &nals, out);
        } else if pes.stream_type == STREAM_TYPE_AAC {
            let Some(rate) = self.tracks.audio_rate() else {
                self.tracks.ignored += 1;
                return;
            };
            let first = pts * u64::from(rate) / 90_000;
            for (i, f) in aac::adts_frames(&pes.data).iter().enumerate() {
                self.tracks.audio_frame(first + 1024 * i as u64, f.au, out);
            }
        } else {
            self.tracks.ignored += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtp::RtpView;
    use proptest::prelude::*;

    const DEMO: &[u8] = include_bytes!("../../../../assets/demo.ts");

    fn ingest(ts: &[u8], chunk: usize) -> (TsIngest, Vec<RtpPacket>) {
        let mut g = TsIngest::default();
        let mut out = Vec::new();
        for (i, c) in ts.chunks(chunk).enumerate() {
            g.push(c, i as u64, &mut out);
        }
        (g, out)
    }

    /// TS behind 12 bytes of something else in each datagram (an RTP header, which may hold
    /// a 0x47) is found again at its packets' starts: the same packets as the TS alone.
    #[test]
    fn a_sync_byte_in_garbage_is_not_taken_for_a_packet() {
        let (_, clean) = ingest(DEMO, 1316);
        let mut g = TsIngest::default();
        let mut out = Vec::new();
        for (i, c) in DEMO.chunks(1316).enumerate() {
            let mut d = vec![0x80, 0x21, 0x47, 0x47, 0, 0x47, 0, 0, 0x47, 0, 0, 1];
            d.extend_from_slice(c);
            g.push(&d, i as u64, &mut out);
        }
        let first_diff = out.iter().zip(&clean).position(|(a, b)| a != b);
        assert_eq!((out.len(), first_diff), (clean.len(), None), "the packets differ");
        assert_eq!(g.demux.errors, 0);
    }

    /// The demo (H.264 + AAC, 8 s at 25 pictures a second) as SRT sends it: two described
    /// tracks, every picture's marker, the audio 1024 samples a frame; cut anywhere, the
    /// same packets.
    #[test]
    fn the_demo_becomes_h264_and_aac_tracks() {
        let (g, out) = ingest(DEMO, 1316);
        assert_eq!(g.errors(), 0);
        let sdp = g.sdp().unwrap();
        assert!(sdp.contains("H264/90000") && sdp.contains("sprop-parameter-sets="), "{sdp}");
        assert!(sdp.contains("MPEG4-GENERIC/"), "{sdp}");
        assert!(crate::rtsp::sdp::Sdp::parse(&sdp).is_ok());
        let video: Vec<RtpView> =
            out.iter().filter(|p| p.track == 0).map(|p| RtpView::parse(&p.data).unwrap()).collect();
        let pictures = video.iter().filter(|v| v.marker()).count();
        // The last PES of each stream completes only with the next one (the stream goes on).
        assert!((198..=200).contains(&pictures), "{pictures} pictures");
        // The first picture's small units (delimiter, SPS, PPS, SEI) share its first packet.
        let mut first = Vec::new();
        crate::codec::annexb::Depacketizer::default()
            .push_all(Codec::H264, video[0].payload(), |n| first.push(n[0] & 0x1f));
        assert!(first.contains(&7) && first.contains(&8), "the first packet holds the SPS and PPS: {first:?}");
        // A picture of two slices of ~400 bytes is one packet: about one packet a picture.
        assert!(video.len() < 2 * pictures, "{} packets for {pictures} pictures", video.len());
        let audio: Vec<u32> =
            out.iter().filter(|p| p.track == 1).map(|p| RtpView::parse(&p.data).unwrap().timestamp()).collect();
        assert!(audio.len() > 300 && audio.windows(2).all(|w| w[1].wrapping_sub(w[0]) == 1024));
        let (_, odd) = ingest(DEMO, 1000);
        let data = |v: &[RtpPacket]| v.iter().map(|p| (p.track, p.data.clone())).collect::<Vec<_>>();
        assert_eq!(data(&odd), data(&out), "datagrams that cut TS packets change nothing");
    }

    /// Audio that completes before the first keyframe waits for it, and is not lost; what
    /// waited says for how long (a TS packet a millisecond here), what did not, nothing.
    #[test]
    fn nothing_before_the_configurations_is_lost() {
        let (_, out) = ingest(DEMO, 188);
        assert!(out[0].waited_ms > 0, "the first picture waited for the audio's header");
        assert!(out[0].waited_ms > out[out.len() / 2].waited_ms);
        assert_eq!(out.last().unwrap().waited_ms, 0);
        let first_audio = out.iter().position(|p| p.track == 1).unwrap();
        assert!(first_audio > 0, "the video's first picture fixed nothing before the audio had its header");
        let audio_ts = RtpView::parse(&out[first_audio].data).unwrap().timestamp();
        let mut d = Demux::default();
        let first_pts =
            DEMO.chunks(188).filter_map(|p| d.push(p)).find(|p| p.stream_type == STREAM_TYPE_AAC).unwrap().pts.unwrap();
        assert_eq!(u64::from(audio_ts), (first_pts * 48_000 / 90_000) & 0xffff_ffff, "the first audio frame is there");
    }

    #[test]
    fn garbage_between_packets_is_skipped() {
        let mut ts = vec![1u8, 2, 3];
        ts.extend_from_slice(&DEMO[..188 * 50]);
        ts.extend_from_slice(&[9, 9]);
        ts.extend_from_slice(&DEMO[188 * 50..188 * 400]);
        let (g, out) = ingest(&ts, 1316);
        assert_eq!(g.resyncs, 5);
        assert!(!out.is_empty());
    }

    proptest! {
        /// Any bytes, cut anywhere: no panic, and what comes out is RTP of a known track.
        #[test]
        fn any_input_is_survived(data in proptest::collection::vec(any::<u8>(), 0..4000), cut in 1usize..1500) {
            let (_, out) = ingest(&data, cut);
            prop_assert!(out.iter().all(|p| p.track < 2 && RtpView::parse(&p.data).is_ok()));
        }

        /// The demo with bytes overwritten anywhere: no panic.
        #[test]
        fn a_damaged_demo_is_survived(hits in proptest::collection::vec((0usize..300 * 188, any::<u8>()), 0..64)) {
            let mut ts = DEMO[..300 * 188].to_vec();
            for (at, v) in hits {
                ts[at] = v;
            }
            let (_, out) = ingest(&ts, 1316);
            prop_assert!(out.iter().all(|p| p.track < 2));
        }
    }
}
