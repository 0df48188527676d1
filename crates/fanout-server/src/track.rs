//! One track of a stream that arrives as RTP from a source that comes and goes (an RTSP
//! upstream, an RTSP publisher): written once for both. Each packet is rewritten into one
//! continuous RTP stream for the track's whole life (the SSRC, sequence numbers and
//! timestamps its clients saw first: [`Restamp`]), the source's sender reports are mapped
//! onto that stream's clock ([`ClockMap`], kept across sources, so a publisher change or a
//! failover does not move the clients' clock), and the packet is handed to the track's relay
//! session through its [`Inlet`] (into its ring, on the caller's thread).

use fanout_io::{Inlet, Session};
use fanout_proto::rtp::restamp::Restamp;
use fanout_proto::rtp::rtcp::{ClockMap, SenderInfo};

/// A relay session a path makes besides its own: the one place their names are made (they
/// are shown, logged and labelled in metrics; nothing parses them back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inner {
    /// Track `i` of an upstream or a publisher: `{path}/{i}`.
    Track(usize),
    /// A clip's video or audio: `{path}/video`, `{path}/audio`.
    Clip { video: bool },
    /// A simulcast publisher's encoding `k` (1 and on; 0 is the track) of track `track`:
    /// `{path}/{track}~{k}`.
    Encoding { track: usize, k: usize },
    /// The MPEG-TS repackaging: `{path}/ts`.
    Ts,
    /// The FLV of the repackaging, for HTTP-FLV players: `{path}/flv`.
    Flv,
    /// The same tags as RTMP chunks, for RTMP players: `{path}/rtmp`.
    Rtmp,
    /// The path's AAC as Opus, for WebRTC viewers: `{path}/opus`.
    Opus,
    /// The path's Opus as AAC, for FLV, MPEG-TS and SRT players: `{path}/aac`.
    Aac,
    /// An SRTP key epoch `n` of a track session (named after the track's session, not the
    /// path): `{track}/srtp-{n}`.
    SrtpEpoch(u32),
}

impl Inner {
    /// Its session's name, under `of` (the path's name, or for an epoch its track's session's).
    pub fn name(self, of: &str) -> String {
        match self {
            Inner::Track(i) => format!("{of}/{i}"),
            Inner::Clip { video } => format!("{of}/{}", if video { "video" } else { "audio" }),
            Inner::Encoding { track, k } => format!("{of}/{track}~{k}"),
            Inner::Ts => format!("{of}/ts"),
            Inner::Flv => format!("{of}/flv"),
            Inner::Rtmp => format!("{of}/rtmp"),
            Inner::Opus => format!("{of}/opus"),
            Inner::Aac => format!("{of}/aac"),
            Inner::SrtpEpoch(n) => format!("{of}/srtp-{n}"),
        }
    }
}

/// A track as the RTSP server side sees it.
#[derive(Clone)]
pub struct TrackRef {
    pub session: Session,
    pub clock: u32,
    /// The source's NTP/RTP mapping (from its sender reports), on the track's own RTP
    /// clock: our sender reports keep audio and video in sync as the source had them.
    pub clock_map: Option<(u64, u32)>,
}

/// What RTSP clients of a path get instead of its first session's own RTP (a clip: its
/// H.264 as RFC 6184 while HTTP gets the TS), and what its repackaging reads.
#[derive(Clone)]
pub struct RtspView {
    pub sdp: fanout_proto::rtsp::sdp::Sdp,
    pub tracks: Vec<TrackRef>,
}

pub struct TrackFeed {
    pub session: Session,
    inlet: Inlet,
    pub clock: u32,
    restamp: Restamp,
    clock_map: ClockMap,
    pub packets: u64,
    pub dropped: u64,
    /// The new source's parameter sets, as one RTP payload, to go in front of its first
    /// keyframe: see [`Self::new_source_described`].
    params_due: Option<Vec<u8>>,
    /// A new source's video waits for its first keyframe, until the deadline (ms, on the
    /// packets' clock; set by its first packet).
    await_key: Option<(fanout_proto::codec::annexb::Codec, Option<u64>)>,
}

/// How long a new source's video before its first keyframe is left out at most: a source
/// whose keyframes are not IDR pictures (intra refresh) plays after this.
const KEY_WAIT_MS: u64 = 3000;

impl TrackFeed {
    /// The feeder of `inlet`'s session, whose numbers start on a random RTP clock of `clock` Hz.
    pub fn new(inlet: Inlet, clock: u32) -> Self {
        Self {
            session: inlet.session().clone(),
            inlet,
            clock,
            restamp: Restamp::new(clock, random_start()),
            clock_map: ClockMap::default(),
            packets: 0,
            dropped: 0,
            params_due: None,
            await_key: None,
        }
    }

    /// The source describes the track anew: a clock rate that changed before any packet
    /// came restarts the numbering at that rate (after packets, the clients keep theirs).
    pub fn set_clock(&mut self, clock: u32) {
        if self.clock != clock && self.packets == 0 {
            self.restamp = Restamp::new(clock, random_start());
        }
        self.clock = clock;
    }

    /// A new source (another publisher, a new upstream session): a new SSRC, numbering and
    /// wall clock, joined onto the ones the clients have.
    pub fn new_source(&mut self) {
        self.restamp.discontinuity();
        self.clock_map.new_source();
    }

    /// A new source described by `m`: as [`Self::new_source`]; H.264 or H.265 video of it
    /// starts at its first keyframe (what comes before refers to pictures no reader has,
    /// or has from the last source), and where its description gives parameter sets, they
    /// go in band in front of that keyframe. Every reader's decoder, the repackaging (HLS,
    /// FLV, TS, recordings) and players that took the last source's sets in band then
    /// decode this one's pictures with its own, where a publisher sends them only out of
    /// band (an RTMP encoder, ffmpeg over RTSP) and the last one (another encoder, a
    /// fallback, the slate) had others.
    pub fn new_source_described(&mut self, m: &fanout_proto::rtsp::sdp::Media) {
        use fanout_proto::container::repack::{TrackCodec, TrackInfo};
        self.new_source();
        self.params_due = None;
        self.await_key = None;
        let Ok(TrackInfo { codec: TrackCodec::Video { codec, params }, .. }) = TrackInfo::from_sdp(m) else { return };
        self.await_key = Some((codec, None));
        let nals: Vec<&[u8]> = params.iter().map(Vec::as_slice).collect();
        let mut scratch = Vec::new();
        fanout_proto::codec::annexb::packetize_frame(codec, &nals, usize::MAX, &mut scratch, |payload, _| {
            self.params_due = Some(payload.to_vec());
        });
    }

    /// An RTP packet of the source, at `now_ms`: rewritten in place and handed to the
    /// track's session; whether it went.
    pub fn rtp(&mut self, data: &mut [u8], now_ms: u64) -> bool {
        use fanout_proto::rtp::classify::{video_start, VideoStart};
        if let Some((codec, deadline)) = &mut self.await_key {
            let payload = fanout_proto::rtp::RtpView::parse(data).map(|p| p.payload()).unwrap_or_default();
            let late = now_ms >= *deadline.get_or_insert(now_ms + KEY_WAIT_MS);
            if video_start(*codec, payload) == VideoStart::Other && !late {
                // (Left out on purpose; counted with the dropped.)
                self.dropped += 1;
                return false;
            }
            self.await_key = None;
        }
        if let Some(params) = self.params_due.take() {
            // One packet before the first, numbered just before it, at its time.
            if let Ok(p) = fanout_proto::rtp::RtpView::parse(data) {
                let mut sets = vec![0; fanout_proto::rtp::FIXED_HEADER_LEN];
                fanout_proto::rtp::write_header(
                    &mut sets,
                    false,
                    p.payload_type(),
                    p.sequence_number().wrapping_sub(1),
                    p.timestamp(),
                    p.ssrc(),
                );
                sets.extend_from_slice(&params);
                self.rtp(&mut sets, now_ms);
            }
        }
        if self.restamp.apply(data, now_ms).is_err() {
            self.dropped += 1;
            return false;
        }
        self.packets += 1;
        if !self.inlet.send(data) {
            self.dropped += 1;
            return false;
        }
        true
    }

    /// A sender report of the source's SSRC `ssrc`, received at `now_ntp`.
    pub fn sender_report(&mut self, ssrc: u32, info: SenderInfo, now_ntp: u64) {
        if let Some(rtp) = self.restamp.map_ts(ssrc, info.rtp) {
            self.clock_map.report(info.ntp, rtp, now_ntp);
        }
    }

    /// The source's own SSRC for this track, once it sent.
    pub fn source_ssrc(&self) -> Option<u32> {
        self.restamp.source_ssrc()
    }

    /// Restamping breaks: packets whose numbers jumped and were joined on.
    pub fn breaks(&self) -> u64 {
        self.restamp.breaks
    }

    pub fn track_ref(&self) -> TrackRef {
        TrackRef { session: self.session.clone(), clock: self.clock, clock_map: self.clock_map.get() }
    }

    /// The RTP sequence number and timestamp a client joining now gets first: the session's
    /// next packet, or the planned start before any packet arrived.
    pub fn next_rtp(&self) -> Option<(u16, u32)> {
        self.session.rtp_start().map(|(_, seq, ts)| (seq, ts)).or(self.restamp.planned_start())
    }
}

/// A random-enough RTP start (RFC 3550 §5.1): clock nanoseconds mixed with the process id.
pub fn random_start() -> (u16, u32) {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let x = (t ^ u64::from(std::process::id()) << 32).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((x >> 48) as u16, (x >> 8) as u32)
}

/// A media section's RTP clock rate (90 kHz where it names none) and video codec, if one
/// whose keyframes the relay finds (H.264, HEVC, VP8, VP9, AV1): what a track's relay session
/// needs to know.
pub fn track_format(m: &fanout_proto::rtsp::sdp::Media) -> (u32, Option<fanout_proto::rtp::classify::RtpVideo>) {
    let rtpmap = m.formats.first().and_then(|f| m.rtpmap(f));
    let video = rtpmap.and_then(|(enc, _)| fanout_proto::rtp::classify::RtpVideo::from_encoding(enc));
    (rtpmap.map_or(90_000, |(_, c)| c), video)
}

/// A plain relay session for unit tests (`name`, the shared data path, a small ring).
#[cfg(test)]
pub fn test_session(engine: &fanout_io::Engine, name: &str) -> fanout_io::Session {
    let cfg = fanout_io::SessionConfig {
        name: name.into(),
        priority: fanout_core::Priority::new(3).expect("a class"),
        datapath: fanout_io::DataPath::Shared,
        ring_capacity: 256,
        max_datagram: 1500,
        sinks_per_group: 64,
        payload: fanout_io::PayloadMode::Rtp,
        failed_sinks: fanout_io::FailurePolicy::Remove,
        udp_sinks: fanout_io::UdpSinkMode::default(),
        uring_sqpoll: false,
        kernel_spread: false,
        stream_flush: std::time::Duration::ZERO,
        source_recv: fanout_io::SourceRecv::default(),
        pacing: None,
        reserve: 0,
    };
    fanout_io::Session::new(cfg, engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_sessions_are_named_under_their_path() {
        assert_eq!(Inner::Track(1).name("live/cam"), "live/cam/1");
        assert_eq!(Inner::Clip { video: true }.name("demo"), "demo/video");
        assert_eq!(Inner::Clip { video: false }.name("demo"), "demo/audio");
        assert_eq!(Inner::Encoding { track: 0, k: 2 }.name("in"), "in/0~2");
        assert_eq!(Inner::Ts.name("cam"), "cam/ts");
        assert_eq!(Inner::SrtpEpoch(3).name("cam/0"), "cam/0/srtp-3");
    }

    /// A new publisher's H.264: what comes before its first keyframe is left out, and its
    /// description's parameter sets go in band in front of that keyframe, at its time; a
    /// source whose keyframes are not found plays after the wait.
    #[test]
    fn a_new_source_starts_at_its_keyframe_with_its_parameter_sets() {
        let engine = fanout_io::Engine::start(fanout_io::EngineOptions { workers: 1, ..Default::default() }).unwrap();
        let session = test_session(&engine, "cam");
        session.set_rtp_video(Some(fanout_proto::codec::annexb::Codec::H264.into()));
        let mut feed = TrackFeed::new(Inlet::open(&session).unwrap(), 90_000);
        let sdp = "v=0\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n\
                   a=fmtp:96 packetization-mode=1;sprop-parameter-sets=Z0LAHg==,aM4=\r\n";
        let m = fanout_proto::rtsp::sdp::Sdp::parse(sdp).unwrap().media.remove(0);
        let packet = |seq: u16, ts: u32, nal: &[u8]| {
            let mut p = vec![0; 12];
            fanout_proto::rtp::write_header(&mut p, true, 96, seq, ts, 5);
            p.extend_from_slice(nal);
            p
        };
        feed.new_source_described(&m);
        assert!(!feed.rtp(&mut packet(10, 3000, &[0x41, 1]), 0), "a picture before the keyframe");
        assert!(feed.rtp(&mut packet(11, 6000, &[0x65, 2]), 40));
        assert!(feed.rtp(&mut packet(12, 9000, &[0x41, 3]), 80));
        assert_eq!((feed.packets, feed.dropped), (3, 1), "the parameter sets, the keyframe and the next");
        let key = session.last_keyframe();
        assert_eq!(key.len(), 2);
        // A STAP-A (type 24, the NRI of its units) of the SPS and the PPS.
        assert_eq!(key[0][12..], [0x78, 0, 4, 0x67, 0x42, 0xc0, 0x1e, 0, 2, 0x68, 0xce]);
        assert_eq!((key[0][1] >> 7, key[0][4..8] == key[1][4..8]), (0, true), "unmarked, at the keyframe's time");
        assert_eq!(key[1][12..], [0x65, 2]);
        let seq = |p: &[u8]| u16::from_be_bytes([p[2], p[3]]);
        assert_eq!(seq(&key[1]), seq(&key[0]).wrapping_add(1));

        // Another source whose keyframes are never found: it plays once the wait is over.
        feed.new_source_described(&m);
        assert!(!feed.rtp(&mut packet(500, 0, &[0x41, 4]), 1000));
        assert!(!feed.rtp(&mut packet(501, 3000, &[0x41, 5]), 1000 + KEY_WAIT_MS - 1));
        assert!(feed.rtp(&mut packet(502, 6000, &[0x41, 6]), 1000 + KEY_WAIT_MS));
    }
}
