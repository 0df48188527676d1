//! An RTMP publisher's FLV as RTP tracks, the form every face of the relay reads: H.264 per
//! RFC 6184 or H.265 per RFC 7798 (from AVC/HEVC, plain or Enhanced RTMP), AAC per RFC 3640
//! (AAC-hbr). The tracks are fixed at the first coded frame, from the decoder
//! configurations that came before it (video first, then audio); their SDP carries the
//! parameter sets, and each keyframe carries them in-band too (RTMP sends them once), so a
//! player or a repackaging that starts at any keyframe can decode.

use crate::codec::{aac, annexb::Codec};
use crate::container::flv::{self, Audio, FlvError, Video};

/// RTP payload types of the tracks.
pub const VIDEO_PAYLOAD_TYPE: u8 = 96;
pub const AUDIO_PAYLOAD_TYPE: u8 = 97;
/// The largest RTP payload (NAL units above it are fragmented).
const MAX_PAYLOAD: usize = 1400;
/// The SSRC of the tracks as made here (the relay's restamping gives them their own).
const SSRC: u32 = 0x464c_5631;

#[derive(Debug, Clone)]
struct VideoConfig {
    codec: Codec,
    sets: Vec<Vec<u8>>,
    length_size: usize,
}

#[derive(Debug, Clone, Copy)]
struct AudioConfig {
    asc: [u8; 2],
    rate: u32,
    channels: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Track {
    Video,
    Audio,
}

/// One RTP packet of track `track`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtpPacket {
    pub track: usize,
    pub data: Vec<u8>,
}

#[derive(Debug, Default)]
pub struct Ingest {
    video: Option<VideoConfig>,
    audio: Option<AudioConfig>,
    /// Fixed at the first coded frame.
    tracks: Option<Vec<Track>>,
    seq: [u16; 2],
    /// The next AAC frame's RTP time: frames count 1024 samples each, and RTMP's
    /// millisecond times only correct the count when they drift apart.
    audio_next: Option<u64>,
    scratch: Vec<u8>,
    /// Frames of a codec or track the relay does not carry (dropped).
    pub ignored: u64,
}

impl Ingest {
    /// The SDP of the tracks, once fixed.
    pub fn sdp(&self) -> Option<String> {
        let tracks = self.tracks.as_ref()?;
        let mut s = String::from("v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\ns=RTMP publisher\r\nt=0 0\r\n");
        for (i, t) in tracks.iter().enumerate() {
            match t {
                Track::Video => {
                    let v = self.video.as_ref().expect("a video track has its config");
                    let pt = VIDEO_PAYLOAD_TYPE;
                    let (name, fmtp) = match (v.codec, v.sets.as_slice()) {
                        (Codec::H264, [sps, pps, ..]) => ("H264", crate::rtsp::sdp::h264_fmtp(sps, pps)),
                        (Codec::H265, [vps, sps, pps, ..]) => ("H265", crate::rtsp::sdp::h265_fmtp(vps, sps, pps)),
                        (Codec::H264, _) => ("H264", "packetization-mode=1".into()),
                        (Codec::H265, _) => ("H265", String::new()),
                    };
                    s += &format!("m=video 0 RTP/AVP {pt}\r\na=rtpmap:{pt} {name}/90000\r\n");
                    if !fmtp.is_empty() {
                        s += &format!("a=fmtp:{pt} {fmtp}\r\n");
                    }
                }
                Track::Audio => {
                    let a = self.audio.expect("an audio track has its config");
                    let pt = AUDIO_PAYLOAD_TYPE;
                    s += &format!(
                        "m=audio 0 RTP/AVP {pt}\r\na=rtpmap:{pt} MPEG4-GENERIC/{}/{}\r\na=fmtp:{pt} {}\r\n",
                        a.rate,
                        a.channels,
                        aac::fmtp(a.asc)
                    );
                }
            }
            s += &format!("a=control:trackID={i}\r\n");
        }
        Some(s)
    }

    /// The video codec, once the tracks are fixed with a video track.
    pub fn video_codec(&self) -> Option<Codec> {
        self.tracks.as_ref()?.contains(&Track::Video).then(|| self.video.as_ref().map(|v| v.codec))?
    }

    fn index(&mut self, t: Track) -> Option<usize> {
        let tracks = self.tracks.get_or_insert_with(|| {
            let mut v = Vec::new();
            if self.video.is_some() {
                v.push(Track::Video);
            }
            if self.audio.is_some() {
                v.push(Track::Audio);
            }
            v
        });
        tracks.iter().position(|x| *x == t)
    }

    /// A video message's body at `timestamp` ms: its RTP packets into `out`.
    pub fn video(&mut self, timestamp: u32, body: &[u8], out: &mut Vec<RtpPacket>) -> Result<(), FlvError> {
        match flv::video(body)? {
            Video::Config { codec, record } => {
                let Some(c) = codec.annexb() else {
                    self.ignored += 1;
                    return Ok(());
                };
                let (sets, length_size) = flv::parameter_sets(c, record)?;
                let sets = sets.into_iter().map(<[u8]>::to_vec).collect();
                // A new configuration of the same codec goes on (in-band); another codec
                // cannot change a fixed track.
                if self.tracks.is_none() || self.video.as_ref().is_some_and(|v| v.codec == c) {
                    self.video = Some(VideoConfig { codec: c, sets, length_size });
                }
            }
            Video::Frames { codec, keyframe, cts, data } => {
                // (A frame without its configuration fixes no track.)
                let fits = self.video.as_ref().is_some_and(|v| Some(v.codec) == codec.annexb());
                let Some(track) = fits.then(|| self.index(Track::Video)).flatten() else {
                    self.ignored += 1;
                    return Ok(());
                };
                let Self { video: Some(v), seq, scratch, .. } = self else { return Ok(()) };
                let nals = flv::nal_units(data, v.length_size)?;
                let nal_type = |n: &[u8]| match v.codec {
                    Codec::H264 => n.first().map(|b| b & 0x1f),
                    Codec::H265 => n.first().map(|b| (b >> 1) & 0x3f),
                };
                let sps = if v.codec == Codec::H264 { 7 } else { 33 };
                let inband = keyframe && !nals.iter().any(|n| nal_type(n) == Some(sps));
                let sets: Vec<&[u8]> = if inband { v.sets.iter().map(Vec::as_slice).collect() } else { Vec::new() };
                let all: Vec<&[u8]> = sets.into_iter().chain(nals).filter(|n| !n.is_empty()).collect();
                let ts = (i64::from(timestamp) + i64::from(cts)).wrapping_mul(90) as u32;
                // Each payload straight into its RTP packet: one copy of the picture's bytes.
                for (i, n) in all.iter().enumerate() {
                    crate::codec::annexb::packetize(v.codec, n, MAX_PAYLOAD, scratch, |p, last| {
                        let marker = last && i + 1 == all.len();
                        out.push(rtp(track, &mut seq[track], VIDEO_PAYLOAD_TYPE, ts, marker, p));
                    });
                }
            }
            Video::Other => {}
        }
        Ok(())
    }

    /// An audio message's body at `timestamp` ms: its RTP packet into `out`.
    pub fn audio(&mut self, timestamp: u32, body: &[u8], out: &mut Vec<RtpPacket>) -> Result<(), FlvError> {
        match flv::audio(body)? {
            Audio::AacConfig(asc) if asc.len() >= 2 => {
                let rate = aac::sample_rate((asc[0] & 0x07) << 1 | asc[1] >> 7).ok_or(FlvError::BadConfig)?;
                let channels = (asc[1] >> 3) & 0x0f;
                if self.tracks.is_none() || self.audio.is_some() {
                    self.audio = Some(AudioConfig { asc: [asc[0], asc[1]], rate, channels });
                }
            }
            Audio::AacConfig(_) => return Err(FlvError::BadConfig),
            Audio::AacFrame(frame) => {
                let (Some(a), Some(track)) = (self.audio, self.audio.and_then(|_| self.index(Track::Audio))) else {
                    self.ignored += 1;
                    return Ok(());
                };
                let Some(payload) = aac::rtp_payload(frame) else {
                    self.ignored += 1;
                    return Ok(());
                };
                let said = u64::from(timestamp) * u64::from(a.rate) / 1000;
                let next = match self.audio_next {
                    Some(n) if n.abs_diff(said) <= 2048 => n,
                    _ => said,
                };
                self.audio_next = Some(next + 1024);
                out.push(rtp(track, &mut self.seq[track], AUDIO_PAYLOAD_TYPE, next as u32, true, &payload));
            }
            Audio::Other(_) => self.ignored += 1,
        }
        Ok(())
    }
}

/// One RTP packet of `track` carrying `payload`, numbered by `seq` (counted on).
fn rtp(track: usize, seq: &mut u16, pt: u8, ts: u32, marker: bool, payload: &[u8]) -> RtpPacket {
    let mut data = vec![0u8; 12 + payload.len()];
    let h = crate::rtp::write_header(&mut data, marker, pt, *seq, ts, SSRC);
    data[h..].copy_from_slice(payload);
    *seq = seq.wrapping_add(1);
    RtpPacket { track, data }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtp::RtpView;

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
        // SPS, PPS in-band, then the IDR in three fragments; one timestamp, the marker last.
        assert_eq!(out.len(), 5);
        let views: Vec<RtpView> = out.iter().map(|p| RtpView::parse(&p.data).unwrap()).collect();
        assert_eq!(views[0].payload(), &SPS);
        assert_eq!(views[1].payload(), &PPS);
        assert!(views.iter().all(|v| v.timestamp() == 120 * 90 && v.payload_type() == 96));
        assert_eq!(views.iter().map(|v| v.marker()).collect::<Vec<_>>(), [false, false, false, false, true]);
        assert_eq!(views.iter().map(|v| v.sequence_number()).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);

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
        assert!(out.is_empty() && g.sdp().is_none() && g.ignored == 1);
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
        assert_eq!((out.len(), g.ignored), (1, 2));
    }
}
