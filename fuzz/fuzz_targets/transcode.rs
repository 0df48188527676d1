//! A publisher's AAC as the transcoder takes it (`fanout_media::AacToOpus`): any
//! AudioSpecificConfig (from its SDP or FLV) and any access units (from its RTP) are
//! refused or transcoded without a panic, and Opus packet times never run back.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        // The transcoder catches a panic of Symphonia's decoder on a malformed unit; the
        // fuzzer's hook would abort on it first. A panic anywhere else still fails the run.
        std::panic::set_hook(Box::new(|_| {}));
    },
    |data: &[u8]| {
    let (config, rest) = data.split_at(data.len().min(2));
    let Ok(mut t) = fanout_media::AacToOpus::new(config) else { return };
    let mut out = Vec::new();
    // Each unit 1024 samples at the AAC's rate after the last, as a publisher sends them.
    let step = 1024 * 48_000 / i64::from(t.input_rate());
    for (k, au) in rest.split(|b| *b == 0xa5).take(64).enumerate() {
        t.push(au, k as i64 * step, &mut out);
    }
    assert!(out.windows(2).all(|w| w[1].1 > w[0].1), "Opus packet times ran back");
    }
);
