//! What a received datagram carries, decided once when it enters the session ring, so that
//! every HTTP subscriber can be served the bare payload without parsing it again.

use crate::{mpegts, rtp::RtpView};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtp::write_header;

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
