//! What an SRT caller sends the relay's code, and what a user configures: its stream id,
//! a source URL, (text of its choosing, up to
//! SRT's 512 bytes) and, once publishing, MPEG-TS datagrams for the TS-to-RTP ingest (the
//! SRT protocol itself, handshake and control packets, is libsrt's). Never a panic; a
//! stream id that parses names a path; every RTP packet parses and is of a known track.
#![no_main]
use fanout_proto::container::tsingest::TsIngest;
use fanout_proto::rtp::RtpView;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let id = String::from_utf8_lossy(&data[..data.len().min(600)]);
    if let Ok(s) = fanout_proto::srt::parse(&id) {
        assert!(!s.path.is_empty());
    }
    if let Ok(u) = fanout_proto::srt::parse_url(&id) {
        assert!(u.port != 0 && !u.host.is_empty());
    }
    let mut ingest = TsIngest::default();
    let mut out = Vec::new();
    // In SRT-sized messages, and in odd ones (a sender that cuts packets).
    for cut in [1316, 333] {
        for piece in data.chunks(cut) {
            ingest.push(piece, 0, &mut out);
        }
    }
    let _ = ingest.sdp();
    for p in &out {
        assert!(p.track < 2 && RtpView::parse(&p.data).is_ok());
    }
});
