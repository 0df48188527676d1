//! RTP parsing and payload classification never panic, and ranges stay inside the buffer.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = fanout_proto::rtp::RtpView::parse(data) {
        let r = v.payload_range();
        assert!(r.start <= r.end && r.end <= data.len());
        let _ = (v.sequence_number(), v.timestamp(), v.ssrc(), v.marker(), v.payload_type());
    }
    assert!(fanout_proto::classify::payload_offset(data) <= data.len());
});
