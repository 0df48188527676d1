//! Coded media as RTP tracks, the form every face of the relay reads: H.264 per RFC 6184 or
//! H.265 per RFC 7798 (a picture's small NAL units in one aggregation packet), AAC per RFC
//! 3640 (AAC-hbr). What an encoder's container carries
//! (RTMP's FLV, SRT's MPEG-TS) comes here as decoder configurations and frames. The tracks
//! are fixed at the first coded frame, from the configurations that came before it (video
//! first, then audio); their SDP carries the parameter sets, and each keyframe carries them
//! in-band too (containers may send them once), so a player or a repackaging that starts at
//! any keyframe can decode.

use crate::codec::{aac, annexb::Codec};

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
}

#[derive(Debug, Clone, Copy)]
struct AudioConfig {
    asc: [u8; 2],
    rate: u32,
    channels: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Video,
    Audio,
}

/// One RTP packet of track `track`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtpPacket {
    pub track: usize,
    pub data: Vec<u8>,
    /// How long its frame waited in the ingest before it was made (a TS ingest holds the
    /// first frames until every track is configured): a receiver that joins streams by
    /// arrival time dates it back by this much.
    pub waited_ms: u64,
}

/// Why an audio configuration was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadAudioConfig;

#[derive(Debug, Default)]
pub struct Tracks {
    video: Option<VideoConfig>,
    audio: Option<AudioConfig>,
    /// Fixed at the first coded frame.
    tracks: Option<Vec<Kind>>,
    seq: [u16; 2],
    /// The next AAC frame's RTP time: frames count 1024 samples each, and the container's
    /// times only correct the count when they drift apart.
    audio_next: Option<u64>,
    scratch: Vec<u8>,
    /// Frames of a codec or track the relay does not carry (dropped).
    pub ignored: u64,
}

impl Tracks {
    /// The SDP of the tracks, once fixed; `title` is its session name.
    pub fn sdp(&self, title: &str) -> Option<String> {
        let tracks = self.tracks.as_ref()?;
        let mut s = format!("v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\ns={title}\r\nt=0 0\r\n");
        for (i, t) in tracks.iter().enumerate() {
            match t {
                Kind::Video => {
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
                Kind::Audio => {
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

    /// Whether the tracks are fixed.
    pub fn fixed(&self) -> bool {
        self.tracks.is_some()
    }

    /// The video codec, once the tracks are fixed with a video track.
    pub fn video_codec(&self) -> Option<Codec> {
        self.tracks.as_ref()?.contains(&Kind::Video).then(|| self.video.as_ref().map(|v| v.codec))?
    }

    /// The video codec configured so far (fixed or not).
    pub fn configured_video(&self) -> Option<Codec> {
        self.video.as_ref().map(|v| v.codec)
    }

    pub fn has_audio_config(&self) -> bool {
        self.audio.is_some()
    }

    fn index(&mut self, t: Kind) -> Option<usize> {
        let tracks = self.tracks.get_or_insert_with(|| {
            let mut v = Vec::new();
            if self.video.is_some() {
                v.push(Kind::Video);
            }
            if self.audio.is_some() {
                v.push(Kind::Audio);
            }
            v
        });
        tracks.iter().position(|x| *x == t)
    }

    /// A video decoder configuration: the parameter sets (H.264: SPS, PPS; H.265: VPS, SPS,
    /// PPS). A new one of the same codec goes on (in-band); another codec cannot change a
    /// fixed track.
    pub fn set_video(&mut self, codec: Codec, sets: Vec<Vec<u8>>) {
        if self.tracks.is_none() || self.video.as_ref().is_some_and(|v| v.codec == codec) {
            self.video = Some(VideoConfig { codec, sets });
        }
    }

    /// A picture of `codec` at `ts` (90 kHz, its presentation time), as NAL units: its RTP
    /// packets into `out`, the parameter sets in front of a keyframe that lacks them.
    pub fn video_frame(&mut self, codec: Codec, ts: u32, keyframe: bool, nals: &[&[u8]], out: &mut Vec<RtpPacket>) {
        // (A frame without its configuration fixes no track.)
        let fits = self.video.as_ref().is_some_and(|v| v.codec == codec);
        let Some(track) = fits.then(|| self.index(Kind::Video)).flatten() else {
            self.ignored += 1;
            return;
        };
        let Self { video: Some(v), seq, scratch, .. } = self else { return };
        let nal_type = |n: &[u8]| match v.codec {
            Codec::H264 => n.first().map(|b| b & 0x1f),
            Codec::H265 => n.first().map(|b| (b >> 1) & 0x3f),
        };
        let sps = if v.codec == Codec::H264 { 7 } else { 33 };
        let inband = keyframe && !nals.iter().any(|n| nal_type(n) == Some(sps));
        let sets: Vec<&[u8]> = if inband { v.sets.iter().map(Vec::as_slice).collect() } else { Vec::new() };
        let all: Vec<&[u8]> = sets.into_iter().chain(nals.iter().copied()).filter(|n| !n.is_empty()).collect();
        // Each payload straight into its RTP packet (small units together): one copy of the
        // picture's bytes.
        crate::codec::annexb::packetize_frame(v.codec, &all, MAX_PAYLOAD, scratch, |p, marker| {
            out.push(rtp(track, &mut seq[track], VIDEO_PAYLOAD_TYPE, ts, marker, p));
        });
    }

    /// An AAC AudioSpecificConfig; taken until the tracks are fixed, and after only where
    /// an audio track exists.
    pub fn set_audio(&mut self, asc: [u8; 2]) -> Result<(), BadAudioConfig> {
        let rate = aac::sample_rate((asc[0] & 0x07) << 1 | asc[1] >> 7).ok_or(BadAudioConfig)?;
        let channels = (asc[1] >> 3) & 0x0f;
        if self.tracks.is_none() || self.audio.is_some() {
            self.audio = Some(AudioConfig { asc, rate, channels });
        }
        Ok(())
    }

    /// The sample rate of the configured audio.
    pub fn audio_rate(&self) -> Option<u32> {
        self.audio.map(|a| a.rate)
    }

    /// One raw AAC frame, which the container places at `said` (in samples): its RTP
    /// packet into `out`. One frame a packet: a live encoder's next frames are not there
    /// yet, and waiting for them would add their 21 ms each to the latency.
    pub fn audio_frame(&mut self, said: u64, frame: &[u8], out: &mut Vec<RtpPacket>) {
        let (Some(_), Some(track)) = (self.audio, self.audio.and_then(|_| self.index(Kind::Audio))) else {
            self.ignored += 1;
            return;
        };
        let Some(payload) = aac::rtp_payload(frame) else {
            self.ignored += 1;
            return;
        };
        let next = match self.audio_next {
            Some(n) if n.abs_diff(said) <= 2048 => n,
            _ => said,
        };
        self.audio_next = Some(next + 1024);
        out.push(rtp(track, &mut self.seq[track], AUDIO_PAYLOAD_TYPE, next as u32, true, &payload));
    }
}

/// One RTP packet of `track` carrying `payload`, numbered by `seq` (counted on).
fn rtp(track: usize, seq: &mut u16, pt: u8, ts: u32, marker: bool, payload: &[u8]) -> RtpPacket {
    let mut data = vec![0u8; 12 + payload.len()];
    let h = crate::rtp::write_header(&mut data, marker, pt, *seq, ts, SSRC);
    data[h..].copy_from_slice(payload);
    *seq = seq.wrapping_add(1);
    RtpPacket { track, data, waited_ms: 0 }
}
