//! RTP parsing, payload classification, layer judgement (and VP8/VP9 keyframes), reassembly
//! and aggregate filtering never panic, and ranges stay inside the buffer.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = fanout_proto::rtp::RtpView::parse(data) {
        let r = v.payload_range();
        assert!(r.start <= r.end && r.end <= data.len());
        // The layer of its payload, as H.264/SVC and as HEVC, twice (state carries over).
        let mut layers = fanout_proto::codec::layers::LayerParser::default();
        for codec in [fanout_proto::codec::annexb::Codec::H264, fanout_proto::codec::annexb::Codec::H265] {
            let _ = layers.packet(codec, &data[r.clone()]);
            let _ = layers.packet(codec, &data[r.clone()]);
            // Reassembly (aggregates, a lone fragment) yields only bytes of the payload.
            let mut d = fanout_proto::codec::annexb::Depacketizer::default();
            d.push_all(codec, &data[r.clone()], |nal| assert!(nal.len() <= data.len()));
            // An aggregate rebuilt for a capped sink only ever loses NAL units.
            if let Some(out) = fanout_proto::codec::layers::filter_aggregate(codec, &data[r.clone()], |l| l.tid == 0) {
                assert!(out.len() < r.len());
            }
        }
        let _ = (v.sequence_number(), v.timestamp(), v.ssrc(), v.marker(), v.payload_type());
        // VP8/VP9 keyframe starts; flagging VP9's inter frames touches only the P bit.
        let _ = fanout_proto::codec::vpx::vp8_keyframe_start(&data[r.clone()]);
        let _ = fanout_proto::codec::av1::av1_keyframe_start(&data[r.clone()]);
        let mut vp9 = fanout_proto::codec::vpx::Vp9Predicted::default();
        let mut p = data[r.clone()].to_vec();
        assert_eq!(vp9.packet(&mut p), fanout_proto::codec::vpx::vp9_keyframe_start(&data[r.clone()]));
        assert!(p.iter().zip(&data[r.clone()]).skip(1).all(|(a, b)| a == b));
    }
    assert!(fanout_proto::rtp::classify::payload_offset(data) <= data.len());
    // Restamping rewrites a valid packet in place, refuses anything else untouched.
    let mut r = fanout_proto::rtp::restamp::Restamp::new(90_000, (1, 2));
    let mut copy = data.to_vec();
    match r.apply(&mut copy, 5) {
        Ok(()) => assert_eq!(copy[12..], data[12..]),
        Err(_) => assert_eq!(copy, data),
    }
});
