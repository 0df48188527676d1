//! A publisher's audio as the transcoders take it: any AAC AudioSpecificConfig (from its SDP
//! or FLV) and access units (from its RTP) through `AacToOpus`, any Opus packets or G.711
//! payloads through `ToAac`: refused or transcoded without a panic, and the times made never
//! run back.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        // The transcoder catches a panic of Symphonia's decoder on a malformed unit; the
        // fuzzer's hook would abort on it first. A panic anywhere else still fails the run.
        std::panic::set_hook(Box::new(|_| {}));
    },
    |data: &[u8]| {
    // A first byte of 0xff: Opus packets (a WHIP publisher's), 0xfe or 0xfd: G.711 µ-law or
    // A-law payloads (a camera's), through `ToAac`, whose AAC units' times never run back
    // either.
    if let Some((&first @ 0xfd..=0xff, rest)) = data.split_first() {
        let made = match first {
            0xff => fanout_media::ToAac::of_opus(2),
            law => Ok(fanout_media::ToAac::of_g711(law == 0xfe)),
        };
        let Ok(mut t) = made else { return };
        let mut out = Vec::new();
        for (k, packet) in rest.split(|b| *b == 0xa5).take(64).enumerate() {
            t.push(packet, k as i64 * 960, &mut out);
        }
        assert!(out.windows(2).all(|w| w[1].1 > w[0].1), "AAC unit times ran back");
        return;
    }
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
