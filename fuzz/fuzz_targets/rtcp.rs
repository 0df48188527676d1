//! RTCP from clients and upstreams (reports, PLI/FIR) never panics on any bytes: every block
//! read lies inside the packet, and a keyframe request names at most one SSRC per 4 bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reports) = fanout_proto::rtp::rtcp::parse_reports(data) {
        let blocks: usize = reports.iter().map(|r| r.blocks.len()).sum();
        assert!(blocks * 24 <= data.len());
    }
    assert!(fanout_proto::rtp::rtcp::keyframe_requests(data).len() <= data.len() / 4);
});
