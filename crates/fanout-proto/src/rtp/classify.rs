//! What a received datagram carries, decided once when it enters the session ring, so that
//! every HTTP subscriber can be served the bare payload without parsing it again.

use crate::{container::mpegts, rtp::RtpView};

/// Offset of the media payload inside a datagram.
///
/// MPEG-TS sent bare (first byte 0x47) is delivered whole. A valid RTP packet whose payload
/// starts with a TS sync byte (RFC 2250), or carries anything else, is delivered without its
/// RTP header, as udpxy does. Anything else is delivered whole.
pub fn payload_offset(datagram: &[u8]) -> usize {
    if datagram.first() == Some(&mpegts::SYNC_BYTE) {
        return 0;
    }
    match RtpView::parse(datagram) {
        Ok(v) if v.payload_range().end == datagram.len() => v.payload_range().start,
        // RTP with padding is rare for TS; the padding would corrupt a byte stream, so keep it
        // simple and deliver whole rather than trimming both ends.
        _ => 0,
    }
}

/// An RTP video codec whose keyframes the relay finds, so a new subscriber starts at one:
/// H.264/HEVC (whose NAL units also carry layers and parameter sets), VP8, VP9, AV1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtpVideo {
    Nal(crate::codec::annexb::Codec),
    Vp8,
    Vp9,
    Av1,
}

impl RtpVideo {
    /// From an SDP `rtpmap` encoding name (case as it comes); `None` for anything else.
    pub fn from_encoding(name: &str) -> Option<RtpVideo> {
        use crate::codec::annexb::Codec;
        Some(match name.to_ascii_uppercase().as_str() {
            "H264" => RtpVideo::Nal(Codec::H264),
            "H265" => RtpVideo::Nal(Codec::H265),
            "VP8" => RtpVideo::Vp8,
            "VP9" => RtpVideo::Vp9,
            "AV1" => RtpVideo::Av1,
            _ => return None,
        })
    }

    /// The NAL unit codec, for what only H.264/HEVC have (layers, parameter sets).
    pub fn nal(self) -> Option<crate::codec::annexb::Codec> {
        match self {
            RtpVideo::Nal(c) => Some(c),
            _ => None,
        }
    }
}

impl From<crate::codec::annexb::Codec> for RtpVideo {
    fn from(c: crate::codec::annexb::Codec) -> RtpVideo {
        RtpVideo::Nal(c)
    }
}

/// What an RTP video payload starts, for choosing where a new subscriber begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VideoStart {
    /// Parameter sets (H.264 SPS, HEVC VPS): the head of a keyframe access unit. (An HEVC
    /// SPS alone is not: it follows the VPS, often in a packet of its own, and a new sink
    /// that started there would lack the VPS.)
    ParameterSets,
    /// The first packet of an IDR (or HEVC IRAP) picture.
    Idr,
    Other,
}

/// Classifies an RTP payload of H.264 (RFC 6184: single NAL unit, STAP-A, FU-A) or HEVC
/// (RFC 7798: single, AP, FU). Aggregates are looked into; fragments count at their start.
pub fn video_start(codec: crate::codec::annexb::Codec, payload: &[u8]) -> VideoStart {
    use crate::codec::annexb::Codec;
    let kind = |t: u8| match (codec, t) {
        (Codec::H264, 7) | (Codec::H265, 32) => VideoStart::ParameterSets,
        (Codec::H264, 5) | (Codec::H265, 16..=21) => VideoStart::Idr,
        _ => VideoStart::Other,
    };
    let Some(&b0) = payload.first() else { return VideoStart::Other };
    match codec {
        Codec::H264 => match b0 & 0x1f {
            // STAP-A: 16-bit sizes, each followed by a NAL unit.
            24 => aggregated(&payload[1..], |n| kind(n[0] & 0x1f)),
            28 => match payload.get(1) {
                Some(&fu) if fu & 0x80 != 0 => kind(fu & 0x1f),
                _ => VideoStart::Other,
            },
            t => kind(t),
        },
        Codec::H265 => match (b0 >> 1) & 0x3f {
            48 => aggregated(payload.get(2..).unwrap_or(&[]), |n| kind((n[0] >> 1) & 0x3f)),
            49 => match payload.get(2) {
                Some(&fu) if fu & 0x80 != 0 => kind(fu & 0x3f),
                _ => VideoStart::Other,
            },
            t => kind(t),
        },
    }
}

/// The strongest start among the NAL units of an aggregation packet's body.
fn aggregated(mut b: &[u8], kind: impl Fn(&[u8]) -> VideoStart) -> VideoStart {
    let mut best = VideoStart::Other;
    while b.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let Some(nal) = b.get(2..2 + n).filter(|x| !x.is_empty()) else { break };
        match kind(nal) {
            VideoStart::ParameterSets => return VideoStart::ParameterSets,
            VideoStart::Idr => best = VideoStart::Idr,
            VideoStart::Other => {}
        }
        b = &b[2 + n..];
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::annexb::Codec;
    use crate::rtp::write_header;

    #[test]
    fn finds_where_video_keyframes_start() {
        use VideoStart::*;
        // H.264: SPS alone, IDR slice alone, a STAP-A with SPS+PPS, FU-A start/middle of IDR.
        assert_eq!(video_start(Codec::H264, &[0x67, 1]), ParameterSets);
        assert_eq!(video_start(Codec::H264, &[0x65, 1]), Idr);
        assert_eq!(video_start(Codec::H264, &[0x41, 1]), Other);
        assert_eq!(video_start(Codec::H264, &[0x78, 0, 2, 0x67, 1, 0, 1, 0x68]), ParameterSets);
        assert_eq!(video_start(Codec::H264, &[0x7c, 0x85, 9]), Idr);
        assert_eq!(video_start(Codec::H264, &[0x7c, 0x05, 9]), Other);
        // A STAP-A whose size overruns is read no further than it holds.
        assert_eq!(video_start(Codec::H264, &[0x78, 0xff, 0xff, 0x67]), Other);
        // HEVC: VPS, IDR_W_RADL, an AP with a VPS, an FU start of a CRA.
        assert_eq!(video_start(Codec::H265, &[32 << 1, 1]), ParameterSets);
        assert_eq!(video_start(Codec::H265, &[19 << 1, 1]), Idr);
        assert_eq!(video_start(Codec::H265, &[48 << 1, 1, 0, 2, 32 << 1, 1]), ParameterSets);
        assert_eq!(video_start(Codec::H265, &[49 << 1, 1, 0x80 | 21]), Idr);
        assert_eq!(video_start(Codec::H265, &[]), Other);
    }

    #[test]
    fn strips_rtp_keeps_bare_ts() {
        let mut d = vec![0u8; 12];
        write_header(&mut d, false, 33, 1, 2, 3);
        d.extend_from_slice(&[mpegts::SYNC_BYTE; 188]);
        assert_eq!(payload_offset(&d), 12);
        assert_eq!(payload_offset(&d[12..]), 0);
        assert_eq!(payload_offset(b"hello"), 0);
    }
}
