//! Probe parsing and receiver statistics never panic on arbitrary packets.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|packets: Vec<(Vec<u8>, u32)>| {
    let mut stats = fanout_proto::rtp::stats::RecvStats::default();
    for (p, arrival) in packets {
        if let Ok(v) = fanout_proto::rtp::RtpView::parse(&p) {
            let _ = fanout_proto::probe::Probe::parse(v.payload());
            stats.record(v.sequence_number(), v.timestamp(), arrival, u64::from(arrival));
        }
    }
});
