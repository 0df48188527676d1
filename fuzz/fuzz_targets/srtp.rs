//! SRTP/SRTCP unprotect, the SDES attribute, MIKEY and KeyMgmt parsers never panic on any
//! bytes; a packet whose tag checks decrypts to the same length minus the tag; and what a
//! context protects from these bytes (when they are RTP) unprotects to them again.
#![no_main]
use fanout_proto::rtp::srtp::{Context, Crypto, MasterKey, Suite};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = MasterKey { key: [7; 16], salt: [9; 14] };
    for suite in [Suite::AesCm128HmacSha1_80, Suite::AesCm128HmacSha1_32] {
        let mut rx = Context::new(suite, &key);
        let mut p = data.to_vec();
        if rx.unprotect_rtp(&mut p).is_ok() {
            assert_eq!(p.len(), data.len() - suite.rtp_tag_len());
        }
        let _ = rx.unprotect_rtcp(&mut data.to_vec());
        let mut tx = Context::new(suite, &key);
        let mut p = data.to_vec();
        if tx.protect_rtp(&mut p).is_ok() {
            Context::new(suite, &key).unprotect_rtp(&mut p).expect("our own packet");
            assert_eq!(p, data);
        }
    }
    // MIKEY: whatever parses writes back to a message that parses the same.
    if let Ok(m) = fanout_proto::rtp::mikey::Mikey::parse(data) {
        assert_eq!(fanout_proto::rtp::mikey::Mikey::parse(&m.write([0; 16], 0)), Ok(m));
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(c) = Crypto::parse(s) {
            assert_eq!(Crypto::parse(&c.to_value()), Ok(c));
        }
        // A client's KeyMgmt header: its message, when it reads, is one MIKEY reads too.
        if let Ok(m) = fanout_proto::rtp::mikey::parse_key_mgmt(s) {
            assert_eq!(fanout_proto::rtp::mikey::Mikey::parse(&m.write([0; 16], 0)), Ok(m));
        }
    }
});
