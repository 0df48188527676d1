//! An RTMP publisher's FLV as RTP tracks ([`crate::rtp::tracks`]): H.264 or H.265 from
//! AVC/HEVC, plain or Enhanced RTMP, and AAC; FLV's millisecond times to the tracks' clocks.

use crate::codec::annexb::Codec;
use crate::container::flv::{self, Audio, FlvError, Video};
pub use crate::rtp::tracks::RtpPacket;
use crate::rtp::tracks::Tracks;

#[derive(Debug, Default)]
pub struct Ingest {
    tracks: Tracks,
    /// The length prefix of the video's NAL units (from its configuration record).
    length_size: usize,
    /// A video codec the publisher sends that the relay does not carry (AV1, VP9, ...), and
    /// whether it is yet to be told.
    uncarried: Option<flv::VideoCodec>,
    untold: bool,
}

impl Ingest {
    /// The SDP of the tracks, once fixed.
    pub fn sdp(&self) -> Option<String> {
        self.tracks.sdp("RTMP publisher")
    }

    /// The video codec, once the tracks are fixed with a video track.
    pub fn video_codec(&self) -> Option<Codec> {
        self.tracks.video_codec()
    }

    /// Frames dropped: a codec or track the relay does not carry, or before a configuration.
    pub fn ignored(&self) -> u64 {
        self.tracks.ignored
    }

    /// A video message's body at `timestamp` ms: its RTP packets into `out`.
    pub fn video(&mut self, timestamp: u32, body: &[u8], out: &mut Vec<RtpPacket>) -> Result<(), FlvError> {
        match flv::video(body)? {
            Video::Config { codec, record } => {
                let Some(c) = codec.annexb() else {
                    self.not_carried(codec);
                    return Ok(());
                };
                let (sets, length_size) = flv::parameter_sets(c, record)?;
                self.tracks.set_video(c, sets.into_iter().map(<[u8]>::to_vec).collect());
                if self.tracks.configured_video() == Some(c) {
                    self.length_size = length_size;
                }
            }
            Video::Frames { codec, keyframe, cts, data } => {
                let Some(c) = codec.annexb().filter(|c| self.tracks.configured_video() == Some(*c)) else {
                    match codec.annexb() {
                        None => self.not_carried(codec),
                        Some(_) => self.tracks.ignored += 1,
                    }
                    return Ok(());
                };
                let nals = flv::nal_units(data, self.length_size)?;
                let ts = (i64::from(timestamp) + i64::from(cts)).wrapping_mul(90) as u32;
                self.tracks.video_frame(c, ts, keyframe, &nals, out);
            }
            Video::Unsupported(codec) => self.not_carried(codec),
            Video::Other => {}
        }
        Ok(())
    }

    /// A video codec the relay does not carry, once for each it meets: what the publisher's
    /// connection should say (its frames are dropped, the path keeps its audio).
    pub fn newly_uncarried(&mut self) -> Option<flv::VideoCodec> {
        std::mem::take(&mut self.untold).then_some(self.uncarried).flatten()
    }

    fn not_carried(&mut self, codec: flv::VideoCodec) {
        if self.uncarried != Some(codec) {
            (self.uncarried, self.untold) = (Some(codec), true);
        }
        self.tracks.ignored += 1;
    }

    /// An audio message's body at `timestamp` ms: its RTP packet into `out`.
    pub fn audio(&mut self, timestamp: u32, body: &[u8], out: &mut Vec<RtpPacket>) -> Result<(), FlvError> {
        match flv::audio(body)? {
            Audio::AacConfig(asc) if asc.len() >= 2 => {
                self.tracks.set_audio([asc[0], asc[1]]).map_err(|_| FlvError::BadConfig)?;
            }
            Audio::AacConfig(_) => return Err(FlvError::BadConfig),
            Audio::AacFrame(frame) => {
                let said = self.tracks.audio_rate().map_or(0, |r| u64::from(timestamp) * u64::from(r) / 1000);
                self.tracks.audio_frame(said, frame, out);
            }
            Audio::Other(_) => self.tracks.ignored += 1,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtp::RtpView;

    /// AV1 in Enhanced RTMP (`av01`) and VP6 in plain FLV: dropped, counted, and named once
    /// each for the publisher's log line.
    #[test]
    fn a_video_codec_not_carried_is_named_once() {
        let mut g = Ingest::default();
        let mut out = Vec::new();
        let av1_config = [0x90, b'a', b'v', b'0', b'1', 0x81, 0, 0, 0];
        let av1_frame = [0x93, b'a', b'v', b'0', b'1', 0x12, 0, 0x0a];
        g.video(0, &av1_config, &mut out).unwrap();
        assert_eq!(g.newly_uncarried().map(|c| c.name()), Some("AV1".to_string()));
        g.video(40, &av1_frame, &mut out).unwrap();
        assert_eq!(g.newly_uncarried(), None, "told once");
        g.video(80, &[0x14, 0, 1, 2], &mut out).unwrap();
        assert_eq!(g.newly_uncarried().map(|c| c.name()), Some("FLV codec id 4".to_string()));
        assert!(out.is_empty());
        assert_eq!(g.ignored(), 3);
        assert_eq!(g.video_codec(), None);
    }

    const SPS: [u8; 4] = [0x67, 0x42, 0xc0, 0x1e];
    const PPS: [u8; 3] = [0x68, 0xce, 0x3c];

    fn avc_config() -> Vec<u8> {
        let mut t = vec![0x17, 0, 0, 0, 0, 1, 0x42, 0xc0, 0x1e, 0xff, 0xe1, 0, 4];
        t.extend_from_slice(&SPS);
        t.extend_from_slice(&[1, 0, 3]);
        t.extend_from_slice(&PPS);
        t
    }

    fn frame(key: bool, cts: u8, nals: &[&[u8]]) -> Vec<u8> {
        let mut t = vec![if key { 0x17 } else { 0x27 }, 1, 0, 0, cts];
        for n in nals {
            t.extend_from_slice(&(n.len() as u32).to_be_bytes());
            t.extend_from_slice(n);
        }
        t
    }

    #[test]
    fn h264_and_aac_become_two_described_tracks() {
        let mut g = Ingest::default();
        let mut out = Vec::new();
        g.video(0, &avc_config(), &mut out).unwrap();
        g.audio(0, &[0xaf, 0, 0x11, 0x90], &mut out).unwrap(); // AAC LC, 48 kHz, stereo
        assert!(g.sdp().is_none(), "not fixed before a frame");
        let idr = vec![0x65; 3000];
        g.video(40, &frame(true, 80, &[&idr]), &mut out).unwrap();
        let sdp = g.sdp().unwrap();
        assert!(sdp.contains("a=rtpmap:96 H264/90000") && sdp.contains("sprop-parameter-sets=Z0LAHg==,aM48"), "{sdp}");
        assert!(sdp.contains("MPEG4-GENERIC/48000/2") && sdp.contains("config=1190"), "{sdp}");
        assert!(crate::rtsp::sdp::Sdp::parse(&sdp).is_ok());
        // SPS and PPS in-band, together (STAP-A), then the IDR in three fragments; one
        // timestamp, the marker last.
        assert_eq!(out.len(), 4);
        let views: Vec<RtpView> = out.iter().map(|p| RtpView::parse(&p.data).unwrap()).collect();
        let mut stap = Vec::new();
        crate::codec::annexb::aggregate(crate::codec::annexb::Codec::H264, &[&SPS, &PPS], &mut stap);
        assert_eq!(views[0].payload(), &stap[..]);
        assert!(views.iter().all(|v| v.timestamp() == 120 * 90 && v.payload_type() == 96));
        assert_eq!(views.iter().map(|v| v.marker()).collect::<Vec<_>>(), [false, false, false, true]);
        assert_eq!(views.iter().map(|v| v.sequence_number()).collect::<Vec<_>>(), [0, 1, 2, 3]);

        // AAC frames: 1024 samples apart, whatever the millisecond rounding said.
        out.clear();
        for (i, ms) in [0u32, 21, 43, 64].into_iter().enumerate() {
            g.audio(ms, &[0xaf, 1, i as u8, 2, 3], &mut out).unwrap();
        }
        let ts: Vec<u32> = out.iter().map(|p| RtpView::parse(&p.data).unwrap().timestamp()).collect();
        assert_eq!(ts, [0, 1024, 2048, 3072]);
        assert!(out.iter().all(|p| p.track == 1));
        // A jump (the publisher's clock moved) is followed.
        out.clear();
        g.audio(10_000, &[0xaf, 1, 9], &mut out).unwrap();
        assert_eq!(RtpView::parse(&out[0].data).unwrap().timestamp(), 480_000);
    }

    #[test]
    fn frames_before_their_configuration_fix_no_track() {
        let mut g = Ingest::default();
        let mut out = Vec::new();
        g.video(0, &frame(true, 0, &[&[0x65, 1]]), &mut out).unwrap();
        assert!(out.is_empty() && g.sdp().is_none() && g.ignored() == 1);
        g.video(0, &avc_config(), &mut out).unwrap();
        g.video(40, &frame(true, 0, &[&[0x65, 1]]), &mut out).unwrap();
        assert!(g.sdp().unwrap().contains("m=video"), "the configuration that came next still counts");
    }

    #[test]
    fn a_delta_frame_carries_no_sets_and_other_codecs_are_counted_not_sent() {
        let mut g = Ingest::default();
        let mut out = Vec::new();
        g.video(0, &avc_config(), &mut out).unwrap();
        g.video(0, &frame(false, 0, &[&[0x41, 1, 2]]), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert!(g.sdp().unwrap().contains("m=video") && !g.sdp().unwrap().contains("m=audio"));
        // Audio that came after the tracks were fixed, and MP3: not carried.
        g.audio(0, &[0xaf, 0, 0x11, 0x90], &mut out).unwrap();
        g.audio(0, &[0xaf, 1, 1], &mut out).unwrap();
        g.audio(0, &[0x2f, 1, 1], &mut out).unwrap();
        assert_eq!((out.len(), g.ignored()), (1, 2));
    }
}
