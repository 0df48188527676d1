//! RTP and what rides with it. Here: the RTP fixed header (RFC 3550 §5.1), parsed once and
//! viewed without copying. Beside it:
//!
//! - [`rtcp`]: sender and receiver reports: loss, jitter, round-trip time; BYE.
//! - [`srtp`]: SRTP and SRTCP (RFC 3711), and [`mikey`], the keys RTSP carries for them.
//! - [`stats`]: receiver statistics for one stream (RFC 3550 §6.4.1, appendix A).
//! - [`arrival`]: a track's RTP time now from its packets' arrival (sources without reports).
//! - [`restamp`]: one continuous stream (SSRC, sequence, timestamps) across sources.
//! - [`adapt`]: per-subscriber layer adaptation from layer rates and reports.
//! - [`classify`]: what a received datagram carries, decided once when it enters the ring.
//! - [`tracks`]: coded frames from a container (FLV, MPEG-TS) as RTP tracks and their SDP.

pub mod adapt;
pub mod arrival;
pub mod classify;
pub mod mikey;
pub mod restamp;
pub mod rtcp;
pub mod srtp;
pub mod stats;
pub mod tracks;

use thiserror::Error;

/// Length of the fixed RTP header, before CSRCs and extensions.
pub const FIXED_HEADER_LEN: usize = 12;

/// Why a buffer is not a valid RTP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RtpError {
    #[error("RTP packet too short: {len} bytes, the header needs {need}")]
    TooShort { len: usize, need: usize },
    #[error("RTP version {0}, expected 2")]
    BadVersion(u8),
    #[error("RTP padding length {padding} exceeds the {available} payload bytes")]
    BadPadding { padding: usize, available: usize },
}

/// A validated view of an RTP packet. The payload is `buf[payload_start..payload_end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtpView<'a> {
    buf: &'a [u8],
    payload_start: usize,
    payload_end: usize,
}

impl<'a> RtpView<'a> {
    /// Validates `buf` as one RTP packet: version 2, CSRC list, header extension and
    /// padding all inside the buffer.
    pub fn parse(buf: &'a [u8]) -> Result<Self, RtpError> {
        if buf.len() < FIXED_HEADER_LEN {
            return Err(RtpError::TooShort { len: buf.len(), need: FIXED_HEADER_LEN });
        }
        let version = buf[0] >> 6;
        if version != 2 {
            return Err(RtpError::BadVersion(version));
        }
        let csrc_count = usize::from(buf[0] & 0x0f);
        let mut start = FIXED_HEADER_LEN + 4 * csrc_count;
        if buf[0] & 0x10 != 0 {
            // Extension: 16-bit profile-defined id, 16-bit length in 32-bit words.
            let need = start + 4;
            if buf.len() < need {
                return Err(RtpError::TooShort { len: buf.len(), need });
            }
            let words = usize::from(u16::from_be_bytes([buf[start + 2], buf[start + 3]]));
            start = need + 4 * words;
        }
        if buf.len() < start {
            return Err(RtpError::TooShort { len: buf.len(), need: start });
        }
        let mut end = buf.len();
        if buf[0] & 0x20 != 0 {
            let padding = usize::from(buf[end - 1]);
            let available = end - start;
            if padding == 0 || padding > available {
                return Err(RtpError::BadPadding { padding, available });
            }
            end -= padding;
        }
        Ok(Self { buf, payload_start: start, payload_end: end })
    }

    pub fn marker(&self) -> bool {
        self.buf[1] & 0x80 != 0
    }
    pub fn payload_type(&self) -> u8 {
        self.buf[1] & 0x7f
    }
    pub fn sequence_number(&self) -> u16 {
        u16::from_be_bytes([self.buf[2], self.buf[3]])
    }
    pub fn timestamp(&self) -> u32 {
        u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]])
    }
    pub fn ssrc(&self) -> u32 {
        u32::from_be_bytes([self.buf[8], self.buf[9], self.buf[10], self.buf[11]])
    }
    /// Byte range of the payload inside the packet.
    pub fn payload_range(&self) -> std::ops::Range<usize> {
        self.payload_start..self.payload_end
    }
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[self.payload_start..self.payload_end]
    }
}

/// Writes a 12-byte RTP header (no CSRC, no extension) into `out`; returns its length.
/// The caller owns the buffer, so building a packet allocates nothing.
pub fn write_header(out: &mut [u8], marker: bool, payload_type: u8, seq: u16, ts: u32, ssrc: u32) -> usize {
    out[0] = 0x80;
    out[1] = (u8::from(marker) << 7) | (payload_type & 0x7f);
    out[2..4].copy_from_slice(&seq.to_be_bytes());
    out[4..8].copy_from_slice(&ts.to_be_bytes());
    out[8..12].copy_from_slice(&ssrc.to_be_bytes());
    FIXED_HEADER_LEN
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_plain_header() {
        let mut p = [0u8; 20];
        write_header(&mut p, true, 33, 0xbeef, 90_000, 0x1234_5678);
        let v = RtpView::parse(&p).unwrap();
        assert!(v.marker());
        assert_eq!(v.payload_type(), 33);
        assert_eq!(v.sequence_number(), 0xbeef);
        assert_eq!(v.timestamp(), 90_000);
        assert_eq!(v.ssrc(), 0x1234_5678);
        assert_eq!(v.payload_range(), 12..20);
    }

    #[test]
    fn csrc_extension_and_padding_are_skipped() {
        // 1 CSRC, extension of 1 word, 3 bytes of padding.
        let mut p = vec![0xb1, 96, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2];
        p.extend_from_slice(&[9, 9, 9, 9]); // CSRC
        p.extend_from_slice(&[0xbe, 0xde, 0, 1, 7, 7, 7, 7]); // extension
        p.extend_from_slice(b"media");
        p.extend_from_slice(&[0, 0, 3]);
        let v = RtpView::parse(&p).unwrap();
        assert_eq!(v.payload(), b"media");
    }

    #[test]
    fn rejects_bad_input_with_reason() {
        assert_eq!(RtpView::parse(&[0x80; 5]), Err(RtpError::TooShort { len: 5, need: 12 }));
        assert_eq!(RtpView::parse(&[0x40; 12]), Err(RtpError::BadVersion(1)));
        let mut p = [0u8; 12];
        p[0] = 0x8f; // 15 CSRCs announced, none present
        assert!(matches!(RtpView::parse(&p), Err(RtpError::TooShort { need: 72, .. })));
        let mut p = [0u8; 14];
        p[0] = 0xa0; // padding bit with pad length 200
        p[13] = 200;
        assert!(matches!(RtpView::parse(&p), Err(RtpError::BadPadding { .. })));
    }

    proptest! {
        #[test]
        fn never_panics_and_range_is_inside(buf in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(v) = RtpView::parse(&buf) {
                let r = v.payload_range();
                prop_assert!(r.start >= FIXED_HEADER_LEN && r.start <= r.end && r.end <= buf.len());
            }
        }

        #[test]
        fn header_round_trips(m: bool, pt in 0u8..128, seq: u16, ts: u32, ssrc: u32,
                              payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut p = vec![0u8; 12];
            write_header(&mut p, m, pt, seq, ts, ssrc);
            p.extend_from_slice(&payload);
            let v = RtpView::parse(&p).unwrap();
            prop_assert_eq!((v.marker(), v.payload_type(), v.sequence_number(), v.timestamp(), v.ssrc()),
                            (m, pt, seq, ts, ssrc));
            prop_assert_eq!(v.payload(), &payload[..]);
        }
    }
}
