//! A path's stand-in while its publisher is away (`fallback = "freeze"`): the last picture it
//! sent, held, and silence in its audio, as RTP in the publisher's own codecs and parameters
//! (so every reader, HLS's initialization and recordings go on unchanged). Sans-IO: the
//! publisher's description and its last keyframe's packets in; packets and the time each is
//! due out.
//!
//! The picture is a keyframe sent again twice a second with rising times (each a point a
//! player can start at; no encoder is needed for any codec). An H.265 CRA picture (an open
//! GOP's keyframe, x265's default) goes as a BLA, as a splicer would: the same slice syntax,
//! but each starts a new sequence, so its picture order count may repeat. Audio is a silent
//! frame per frame time: AAC (mono or stereo, any rate), Opus, G.711; other audio pauses.
//!
//! With `fallback = "slate"` the picture is a generated one instead (the relay's H.264
//! slate, at the last publisher's picture size): [`slate_size`] finds the size, and
//! [`picture_packets`] makes its NAL units the packets held. Before anyone has published,
//! [`SLATE_SDP`] describes the slate alone, with silent AAC.

use crate::codec::annexb::Codec;
use crate::container::repack::{TrackCodec, TrackInfo};
use crate::rtsp::sdp::Sdp;

/// How often the held picture is sent again (ms): a player joining waits at most this.
pub const PICTURE_EVERY_MS: u64 = 500;

/// What one track sends.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Filler {
    /// A keyframe's RTP packets, sent again each time (their payloads and marker bits kept).
    Picture(Vec<Vec<u8>>),
    /// A silent frame's RTP payload, its payload type, and the ticks it lasts.
    Silence { payload: Vec<u8>, pt: u8, ticks: u32 },
}

#[derive(Debug)]
struct Track {
    index: usize,
    filler: Filler,
    /// Frames (pictures or silent frames) sent, and the RTP numbering.
    sent: u64,
    seq: u16,
    clock: u32,
}

impl Track {
    /// RTP ticks and milliseconds of one frame.
    fn ticks(&self) -> u64 {
        match &self.filler {
            Filler::Picture(_) => u64::from(self.clock) * PICTURE_EVERY_MS / 1000,
            Filler::Silence { ticks, .. } => u64::from(*ticks),
        }
    }

    fn due_ms(&self, frame: u64) -> u64 {
        frame * self.ticks() * 1000 / u64::from(self.clock.max(1))
    }
}

/// The stand-in stream of one publisher's description.
#[derive(Debug)]
pub struct Freeze {
    tracks: Vec<Track>,
    ssrc: u32,
}

impl Freeze {
    /// The stand-in for `sdp`'s tracks: `keyframes[i]` is track i's last keyframe, as RTP
    /// packets (a video track without one, and audio of another codec, send nothing).
    pub fn new(sdp: &Sdp, keyframes: &[Vec<Vec<u8>>], ssrc: u32) -> Self {
        let mut tracks = Vec::new();
        for (index, m) in sdp.media.iter().enumerate() {
            let pt = m.formats.first().and_then(|f| f.parse().ok()).unwrap_or(96);
            let info = TrackInfo::from_sdp(m).ok();
            let clock = match (info.as_ref(), m.formats.first().and_then(|f| m.rtpmap(f))) {
                (Some(i), _) => i.clock,
                (None, Some((_, clock))) => clock,
                (None, None) => continue,
            };
            let filler = if m.kind == "video" {
                match keyframes.get(index) {
                    Some(k) if k.iter().all(|p| p.len() >= crate::rtp::FIXED_HEADER_LEN) && !k.is_empty() => {
                        let mut k = k.clone();
                        if matches!(&info, Some(TrackInfo { codec: TrackCodec::Video { codec: Codec::H265, .. }, .. }))
                        {
                            k.iter_mut().for_each(|p| cra_as_bla(&mut p[crate::rtp::FIXED_HEADER_LEN..]));
                        }
                        Filler::Picture(k)
                    }
                    _ => continue,
                }
            } else {
                match info.map(|i| i.codec) {
                    Some(TrackCodec::Aac { config, size_bits, index_bits, .. }) => {
                        let channels = (config[1] >> 3) & 0x0f;
                        let Some(frame) = crate::codec::aac::silent_frame(channels) else { continue };
                        let Some(payload) = aac_payload(&frame, size_bits, index_bits) else { continue };
                        Filler::Silence { payload, pt, ticks: 1024 }
                    }
                    Some(TrackCodec::Opus { channels }) => {
                        let payload = crate::codec::opus::silent_packet(channels).to_vec();
                        Filler::Silence { payload, pt, ticks: 960 }
                    }
                    Some(TrackCodec::G711 { mu_law }) => {
                        // 20 ms of the code for zero.
                        Filler::Silence { payload: vec![if mu_law { 0xff } else { 0xd5 }; 160], pt, ticks: 160 }
                    }
                    _ => continue,
                }
            };
            tracks.push(Track { index, filler, sent: 0, seq: 0, clock });
        }
        Self { tracks, ssrc }
    }

    /// Whether it sends anything (a picture or silence).
    pub fn is_empty(&self) -> bool {
        self.tracks.is_empty()
    }

    /// Whether it holds a picture.
    pub fn has_picture(&self) -> bool {
        self.tracks.iter().any(|t| matches!(t.filler, Filler::Picture(_)))
    }

    /// Appends the packets due by `elapsed_ms` after it began, each with its track's index.
    pub fn due(&mut self, elapsed_ms: u64, out: &mut Vec<(usize, Vec<u8>)>) {
        let ssrc = self.ssrc;
        for t in &mut self.tracks {
            while t.due_ms(t.sent) <= elapsed_ms {
                let time = (t.sent * t.ticks()) as u32;
                match &t.filler {
                    Filler::Picture(packets) => {
                        for p in packets {
                            let mut p = p.clone();
                            p[2..4].copy_from_slice(&t.seq.to_be_bytes());
                            p[4..8].copy_from_slice(&time.to_be_bytes());
                            p[8..12].copy_from_slice(&ssrc.to_be_bytes());
                            t.seq = t.seq.wrapping_add(1);
                            out.push((t.index, p));
                        }
                    }
                    Filler::Silence { payload, pt, .. } => {
                        let mut p = vec![0; crate::rtp::FIXED_HEADER_LEN];
                        crate::rtp::write_header(&mut p, true, *pt, t.seq, time, ssrc);
                        p.extend_from_slice(payload);
                        t.seq = t.seq.wrapping_add(1);
                        out.push((t.index, p));
                    }
                }
                t.sent += 1;
            }
        }
    }

    /// When (ms after it began) the next packet is due; `None` if it sends nothing.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.tracks.iter().map(|t| t.due_ms(t.sent)).min()
    }
}

/// The description of a slate played before anyone has published: H.264 (its parameter sets
/// come in band, with each picture) and AAC-LC, 48 kHz stereo, the audio most encoders send.
pub const SLATE_SDP: &str = "v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\ns=slate\r\nt=0 0\r\n\
    m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1\r\n\
    m=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\n\
    a=fmtp:97 streamtype=5;profile-level-id=1;mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config=1190\r\n";

/// RTP payloads of a picture are at most this long (the relay's own packets' size).
const PICTURE_PAYLOAD: usize = 1200;

/// The size a slate is drawn at where nothing says another.
pub const SLATE_SIZE: (u16, u16) = (1280, 720);

/// The size a slate standing in for a video track is drawn at: its picture's, from the
/// description's SPS or else one its keyframe's packets carry (alone or aggregated), or
/// [`SLATE_SIZE`] where neither has one. `None` for a track that is not H.264.
pub fn slate_size(m: &crate::rtsp::sdp::Media, keyframe: &[Vec<u8>]) -> Option<(u16, u16)> {
    use crate::codec::annexb::sps_dimensions;
    let Ok(TrackInfo { codec: TrackCodec::Video { codec: Codec::H264, params }, .. }) = TrackInfo::from_sdp(m) else {
        return None;
    };
    let in_band = keyframe.iter().filter_map(|p| p.get(crate::rtp::FIXED_HEADER_LEN..)).flat_map(|payload| {
        let mut nals = Vec::new();
        match payload.first().map(|b| b & 0x1f) {
            // STAP-A: each unit behind its 16-bit size.
            Some(24) => {
                let mut rest = &payload[1..];
                while let [a, b, tail @ ..] = rest {
                    let size = usize::from(u16::from_be_bytes([*a, *b])).min(tail.len());
                    nals.push(&tail[..size]);
                    rest = &tail[size..];
                }
            }
            Some(_) => nals.push(payload),
            None => {}
        }
        nals
    });
    let sps = params.iter().map(Vec::as_slice).chain(in_band).filter(|n| n.first().map(|b| b & 0x1f) == Some(7));
    Some(sps.into_iter().find_map(sps_dimensions).unwrap_or(SLATE_SIZE))
}

/// A picture's NAL units as RTP packets of payload type `pt`, the last one marked (their
/// numbers and times are set as each is sent).
pub fn picture_packets(nals: &[&[u8]], pt: u8) -> Vec<Vec<u8>> {
    let (mut packets, mut scratch) = (Vec::new(), Vec::new());
    crate::codec::annexb::packetize_frame(Codec::H264, nals, PICTURE_PAYLOAD, &mut scratch, |payload, last| {
        let mut p = vec![0; crate::rtp::FIXED_HEADER_LEN];
        crate::rtp::write_header(&mut p, last, pt, 0, 0, 0);
        p.extend_from_slice(payload);
        packets.push(p);
    });
    packets
}

/// H.265 NAL unit types (ITU-T H.265 Table 7-1) and RTP payload structures (RFC 7798).
const CRA: u8 = 21;
const BLA_W_LP: u8 = 16;
const AGGREGATION: u8 = 48;
const FRAGMENT: u8 = 49;

/// Makes the CRA slices in an H.265 RTP payload BLA ones: a single NAL unit, a fragment's
/// (its FU header), or those in an aggregation packet.
fn cra_as_bla(payload: &mut [u8]) {
    let set = |b: &mut u8, shift: u32| {
        if (*b >> shift) & 0x3f == CRA {
            *b = (*b & !(0x3f << shift)) | (BLA_W_LP << shift);
        }
    };
    let Some(&b0) = payload.first() else { return };
    match (b0 >> 1) & 0x3f {
        FRAGMENT => {
            if let Some(fu) = payload.get_mut(2) {
                set(fu, 0);
            }
        }
        AGGREGATION => {
            let mut at = 2;
            while let Some(size) = payload.get(at..at + 2).map(|s| usize::from(u16::from_be_bytes([s[0], s[1]]))) {
                if let Some(nal) = payload.get_mut(at + 2) {
                    set(nal, 1);
                }
                at += 2 + size;
            }
        }
        _ => set(&mut payload[0], 1),
    }
}

/// One AAC access unit as an RFC 3640 payload with the description's AU header sizes (the
/// AU-headers-length, then its size and index 0 in `size_bits + index_bits`, byte-padded).
fn aac_payload(frame: &[u8], size_bits: u8, index_bits: u8) -> Option<Vec<u8>> {
    let bits = u32::from(size_bits) + u32::from(index_bits);
    if bits == 0 || bits > 32 || frame.len() as u64 >= 1 << size_bits {
        return None;
    }
    let header = (frame.len() as u64) << index_bits << (bits.div_ceil(8) * 8 - bits);
    let mut p = (bits as u16).to_be_bytes().to_vec();
    p.extend_from_slice(&header.to_be_bytes()[8 - bits.div_ceil(8) as usize..]);
    p.extend_from_slice(frame);
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::repack::{Repackager, Unit};
    use proptest::prelude::*;

    proptest! {
        /// Any payload (a publisher's bytes): the rewrite never panics, keeps the length and
        /// changes nothing but NAL type bits from CRA to BLA.
        #[test]
        fn the_cra_rewrite_takes_any_bytes(payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut p = payload.clone();
            cra_as_bla(&mut p);
            prop_assert_eq!(p.len(), payload.len());
            for (a, b) in payload.iter().zip(&p) {
                prop_assert!(a == b || a ^ b == (CRA ^ BLA_W_LP) || a ^ b == (CRA ^ BLA_W_LP) << 1);
            }
        }

        /// Any keyframe packets (a publisher's bytes): an H.264 track always gets a slate size
        /// (what an SPS among them says, or the default; the server paints the default where
        /// that size cannot be painted), and reading them never panics.
        #[test]
        fn any_keyframe_gives_a_slate_size(packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..4)) {
            let sdp = Sdp::parse(SDP).unwrap();
            prop_assert!(slate_size(&sdp.media[0], &packets).is_some());
        }

        /// Any keyframe packets (long enough for a header or not) and any clock: packets come
        /// out on time, numbered on one by one per track, never from a track it does not hold.
        #[test]
        fn any_keyframe_packets_come_out_numbered(
            packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..5),
            until in 0u64..3000,
        ) {
            let sdp = Sdp::parse(SDP).unwrap();
            let mut f = Freeze::new(&sdp, std::slice::from_ref(&packets), 9);
            let mut out = Vec::new();
            f.due(until, &mut out);
            let held = !packets.is_empty() && packets.iter().all(|p| p.len() >= 12);
            prop_assert_eq!(out.iter().any(|(t, _)| *t == 0), held);
            prop_assert!(out.iter().all(|(t, p)| *t != 4 && p.len() >= 12));
            let pictures = until / PICTURE_EVERY_MS + 1;
            prop_assert_eq!(out.iter().filter(|(t, _)| *t == 0).count() as u64, if held { pictures * packets.len() as u64 } else { 0 });
        }
    }

    const SDP: &str = "v=0\r\ns=x\r\nt=0 0\r\n\
        m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1\r\n\
        m=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/44100/2\r\n\
        a=fmtp:97 streamtype=5;mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config=1210\r\n\
        m=audio 0 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n\
        m=audio 0 RTP/AVP 0\r\n\
        m=audio 0 RTP/AVP 14\r\n";

    /// An H.264 keyframe as two RTP packets: SPS + PPS (STAP-A), then the IDR.
    fn keyframe() -> Vec<Vec<u8>> {
        let rtp = |marker: bool, seq: u16, payload: &[u8]| {
            let mut p = vec![0; 12];
            crate::rtp::write_header(&mut p, marker, 96, seq, 12_345, 7);
            p.extend_from_slice(payload);
            p
        };
        vec![
            rtp(false, 900, &[24, 0, 4, 0x67, 0x42, 0xc0, 0x1e, 0, 2, 0x68, 0xce]),
            rtp(true, 901, &[0x65, 0x88, 0x84, 0x00, 0x33]),
        ]
    }

    /// Two seconds of it: the picture every 500 ms (both packets, numbered on, 45,000 ticks
    /// apart), AAC every 1,024 samples at 44.1 kHz, Opus and G.711 every 20 ms, MP3 not at
    /// all; every track's numbers and times rise by one frame each, on one SSRC.
    #[test]
    fn pictures_and_silence_at_their_frame_times() {
        let sdp = Sdp::parse(SDP).unwrap();
        let mut f = Freeze::new(&sdp, &[keyframe()], 42);
        assert!(f.has_picture() && !f.is_empty());
        let mut out = Vec::new();
        let mut ms = 0;
        while let Some(next) = f.next_due_ms().filter(|n| *n < 2000) {
            assert!(next >= ms, "due times go back");
            ms = next;
            f.due(ms, &mut out);
        }
        let of = |track: usize| -> Vec<&Vec<u8>> { out.iter().filter(|(t, _)| *t == track).map(|(_, p)| p).collect() };
        let field = |p: &[u8], at: usize| u32::from_be_bytes(p[at..at + 4].try_into().unwrap());
        assert_eq!(of(0).len(), 2 * 4);
        assert_eq!(of(1).len(), 87, "2 s of 1,024 samples at 44.1 kHz");
        assert_eq!((of(2).len(), of(3).len(), of(4).len()), (100, 100, 0));
        for (track, ticks) in [(1, 1024), (2, 960), (3, 160)] {
            let packets = of(track);
            assert!(packets.iter().all(|p| field(p, 8) == 42));
            for (k, w) in packets.windows(2).enumerate() {
                assert_eq!(u16::from_be_bytes([w[1][2], w[1][3]]), k as u16 + 1);
                assert_eq!(field(w[1], 4) - field(w[0], 4), ticks);
            }
        }
        let video = of(0);
        assert_eq!(video[2][12..], keyframe()[0][12..], "the payloads as they came");
        assert_eq!((field(video[3], 4), video[3][1] >> 7, video[2][1] >> 7), (45_000, 1, 0));
        assert_eq!(of(3)[0][12..], [0xff; 160]);
    }

    /// What it sends is what the repackager reads back: the keyframe whole each time, and
    /// AAC units of the silent frame (so HLS and recordings take it as they take the live
    /// stream).
    #[test]
    fn the_repackager_reads_it() {
        let sdp = Sdp::parse(SDP).unwrap();
        let infos: Vec<_> = sdp.media.iter().map(|m| TrackInfo::from_sdp(m).ok()).collect();
        let mut r = Repackager::new(infos);
        let mut f = Freeze::new(&sdp, &[keyframe()], 1);
        let (mut packets, mut units) = (Vec::new(), Vec::<Unit>::new());
        f.due(1600, &mut packets);
        for (track, p) in &packets {
            r.push_rtp(*track, p, 0, &mut units);
        }
        let keys = units.iter().filter(|u| u.stream == 0 && u.key).count();
        assert_eq!(keys, 4, "every picture a keyframe");
        let silence = crate::codec::aac::silent_frame(2).unwrap();
        let aac: Vec<_> = units.iter().filter(|u| u.stream == 1).collect();
        assert!(aac.len() >= 60 && aac.iter().all(|u| u.data == silence), "{} AAC units", aac.len());
    }

    /// A slate's size: the description's SPS first, else one in the keyframe (alone or in a
    /// STAP-A), else the default; no slate for audio or another video codec.
    #[test]
    fn the_slate_is_drawn_at_the_pictures_size() {
        // A 640×360 Constrained Baseline SPS.
        const SPS: [u8; 10] = [0x67, 0x42, 0xc0, 0x1e, 0xda, 0x02, 0x80, 0xbf, 0xe5, 0x40];
        let with = |fmtp: &str| {
            let text = format!("v=0\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n{fmtp}");
            Sdp::parse(&text).unwrap().media.remove(0)
        };
        use base64::Engine;
        let sprop = base64::engine::general_purpose::STANDARD.encode(SPS);
        let described = with(&format!("a=fmtp:96 packetization-mode=1;sprop-parameter-sets={sprop},aM4JGyA=\r\n"));
        assert_eq!(slate_size(&described, &[]), Some((640, 360)));
        let bare = with("");
        assert_eq!(slate_size(&bare, &[]), Some(SLATE_SIZE));
        let mut stap = vec![0; 12];
        stap.extend_from_slice(&[24, 0, SPS.len() as u8]);
        stap.extend_from_slice(&SPS);
        stap.extend_from_slice(&[0, 2, 0x68, 0xce]);
        let mut single = vec![0; 12];
        single.extend_from_slice(&SPS);
        for keyframe in [vec![stap], vec![vec![1; 4], single]] {
            assert_eq!(slate_size(&bare, &keyframe), Some((640, 360)));
        }
        let sdp = Sdp::parse(SDP).unwrap();
        assert!(sdp.media[1..].iter().all(|m| slate_size(m, &[]).is_none()), "audio has no slate");
        let h265 = Sdp::parse("v=0\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H265/90000\r\n").unwrap();
        assert_eq!(slate_size(&h265.media[0], &[]), None);
    }

    /// A picture's units as packets: small ones aggregated, a large one in FU-A fragments,
    /// the last marked, all of the payload type; the description of the slate alone parses
    /// as H.264 and stereo AAC at 48 kHz.
    #[test]
    fn a_picture_becomes_packets() {
        let idr: Vec<u8> = std::iter::once(0x65).chain((0..3000).map(|i| i as u8)).collect();
        let packets = picture_packets(&[&[0x67, 1, 2], &[0x68, 3], &idr], 99);
        assert!(packets.len() >= 4 && packets.iter().all(|p| p[1] & 0x7f == 99 && p.len() <= 12 + PICTURE_PAYLOAD));
        let marked: Vec<bool> = packets.iter().map(|p| p[1] >> 7 == 1).collect();
        assert_eq!(marked.iter().filter(|m| **m).count(), 1);
        assert!(marked[marked.len() - 1]);
        assert_eq!(packets[0][12] & 0x1f, 24, "the parameter sets aggregated");
        assert_eq!((packets[1][12] & 0x1f, packets[1][13]), (28, 0x80 | 5), "the IDR's first fragment");
        let sdp = Sdp::parse(SLATE_SDP).unwrap();
        let infos: Vec<_> = sdp.media.iter().map(|m| TrackInfo::from_sdp(m).unwrap().codec).collect();
        assert!(matches!(infos[0], TrackCodec::Video { codec: Codec::H264, .. }));
        assert!(matches!(&infos[1], TrackCodec::Aac { config, .. } if config == &[0x11, 0x90]));
    }

    /// H.265 CRA slices become BLA ones, whole or in fragments and aggregates (their layer
    /// and temporal id bits kept); other NAL units are left alone.
    #[test]
    fn cra_slices_become_bla() {
        let mut single = [CRA << 1, 1, 0xaa];
        cra_as_bla(&mut single);
        assert_eq!(single, [BLA_W_LP << 1, 1, 0xaa]);
        let mut fu = [FRAGMENT << 1, 1, 0x80 | CRA, 0xaa];
        cra_as_bla(&mut fu);
        assert_eq!(fu, [FRAGMENT << 1, 1, 0x80 | BLA_W_LP, 0xaa]);
        let mut ap = [AGGREGATION << 1, 1, 0, 2, 32 << 1, 1, 0, 3, CRA << 1 | 1, 1, 0xaa];
        cra_as_bla(&mut ap);
        assert_eq!(ap, [AGGREGATION << 1, 1, 0, 2, 32 << 1, 1, 0, 3, BLA_W_LP << 1 | 1, 1, 0xaa]);
        let mut trail = [1 << 1, 1, 0xaa];
        cra_as_bla(&mut trail);
        assert_eq!(trail, [1 << 1, 1, 0xaa]);
        cra_as_bla(&mut []);
    }

    /// Without a keyframe the video sends nothing; AU headers of other sizes are written
    /// as the description says.
    #[test]
    fn no_picture_without_a_keyframe_and_other_header_sizes() {
        let f = Freeze::new(&Sdp::parse(SDP).unwrap(), &[], 1);
        assert!(!f.has_picture() && !f.is_empty());
        assert_eq!(aac_payload(&[9; 4], 6, 2), Some(vec![0, 8, 4 << 2, 9, 9, 9, 9]));
        assert_eq!(aac_payload(&[9; 4], 13, 3), Some(vec![0, 16, 0, 4 << 3, 9, 9, 9, 9]));
        assert_eq!(aac_payload(&[9; 70], 6, 2), None, "too big for its size field");
    }
}
