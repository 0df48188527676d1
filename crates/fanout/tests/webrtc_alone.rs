//! WebRTC tests that count frames over many seconds, alone in their binary and one at a
//! time: pion viewers behind a lossy link (NACK and RTX) and a narrow one (layered video
//! adapted per viewer, issue 6 and the Oslo thesis). Beside the other WebRTC tests'
//! browsers and decoders on two cores, each failed on CI in ways the machine explains.

mod common;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// One of these tests at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Layered video (mediasoup's H.264 SVC: two spatial × three temporal layers, ~570 kbit/s at
/// 50 fps) to two pion viewers at once: one behind a link of half the stream's rate (a 100 ms
/// drop-tail queue, in pion, before its transport-wide congestion feedback), one with no
/// limit. The first one's feedback brings its estimate under the link's rate and its sink down
/// to the base spatial layer: in the second half of its run the link drops (almost) nothing,
/// and it still assembles its frames whole (a dropped layer's marker is moved to the kept
/// packets). The other gets every layer.
#[test]
fn a_viewer_behind_a_narrow_link_gets_the_layers_that_fit() {
    let Some(pion) = peer("pion-peer") else { return };
    let _alone = alone();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/h264-svc/mediasoup_naluInfo.264");
    let relay = Relay::start(&["--no-demo"]);
    let src =
        create_on_free_port(&relay, json!({ "name": "svc", "source": { "udp": "127.0.0.1:0" }, "video": "h264" }));
    let _gen = gen_file(src, file, 50, 40);
    // The stream's rate, once every layer has one.
    let whole = || {
        let l = &relay.ok("GET", "/v1/sessions/svc", None)["layers"];
        let layers = l["layers"].as_array().cloned().unwrap_or_default();
        let sum: f64 = layers.iter().map(|x| x["bps"].as_f64().unwrap()).sum();
        (layers.len() == 6).then_some(sum + l["not_layered_bps"].as_f64().unwrap_or(0.0))
    };
    assert!(wait_for(Duration::from_secs(10), || whole().is_some_and(|b| b > 400_000.0)), "{:?}", whole());
    std::thread::sleep(Duration::from_secs(2));
    let whole = whole().unwrap();
    let link_kbps = (whole / 2000.0).round();
    let dir = scratch_dir("pion-layers");
    let spawn = |extra: &[&str], out: &str| {
        std::process::Command::new(&pion)
            .args(["whep", &relay.url("/svc/whep"), "-seconds", "20", "-h264"])
            .arg(dir.join(out))
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let narrow = spawn(&["-kbps", &link_kbps.to_string()], "narrow.h264");
    let wide = spawn(&[], "wide.h264");
    // Their statuses, sampled: the narrow one is the one whose estimate stays under the link.
    let mut samples: Vec<(f64, Vec<Value>)> = Vec::new();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(19) {
        let v = relay.ok("GET", "/v1/sessions/svc", None)["webrtc"].as_array().cloned().unwrap_or_default();
        samples.push((t0.elapsed().as_secs_f64(), v));
        std::thread::sleep(Duration::from_millis(500));
    }
    let narrow = pion_report(narrow);
    let wide = pion_report(wide);
    eprintln!("the stream {whole:.0} bit/s, the link {link_kbps} kbit/s\nnarrow: {narrow}\nwide: {wide}");
    for (t, v) in samples.iter().step_by(4) {
        let brief: Vec<String> =
            v.iter().map(|x| format!("{} {}", x["estimate_bps"], x["layers"]["allowance"])).collect();
        eprintln!("{t:5.1} s: {}", brief.join(" | "));
    }
    for r in [&narrow, &wide] {
        assert_eq!(r["connected"], true, "{r}");
        assert_eq!(r["starts_with_keyframe"], true, "{r}");
        assert!(r["frames_expected"].as_u64().unwrap() >= 900, "18+ s at 50 fps: {r}");
    }
    // Neither loses (almost) a frame it was sent. Upper temporal layers left out on purpose
    // are not loss, but a few only: on CI's two cores a stalled pion looked like congestion
    // to the estimate and left them out for a second (4% of the frames), once for either.
    for r in [&narrow, &wide] {
        let of = |k: &str| r[k].as_f64().unwrap();
        let expected = of("frames_expected");
        assert!((of("frames_lost") - of("frames_skipped")) / expected < 0.02, "frames lost: {r}");
        assert!(of("frames_skipped") / expected < 0.1, "frames left out: {r}");
    }
    // The narrow link: no sustained loss once adapted.
    let link = &narrow["link"];
    let (passed, late) = (link["passed"].as_f64().unwrap(), link["dropped_second_half"].as_f64().unwrap());
    assert!(late <= 0.01 * passed, "the link still drops in the second half: {link}");
    assert!(link["kbps_second_half"].as_f64().unwrap() > 0.2 * link_kbps, "{link}");
    // By the status: in the second half, one viewer at the base spatial layer with an
    // estimate under the stream's rate, and the other one at some point with every layer.
    // (Most samples: a stall of the machine may lift the narrow one for a moment, as above.)
    let late_samples: Vec<_> = samples.iter().filter(|(t, _)| *t > 10.0).collect();
    let did = |x: &Value| x["layers"]["allowance"]["did"].as_u64();
    let mut narrow_ids = std::collections::BTreeSet::new();
    let mut with_low = 0;
    for (_, v) in &late_samples {
        assert_eq!(v.len(), 2, "{v:?}");
        let low: Vec<&Value> = v.iter().filter(|x| did(x) == Some(0)).collect();
        with_low += usize::from(!low.is_empty());
        for x in low {
            assert!(x["estimate_bps"].as_f64().unwrap() < whole, "{x}");
            narrow_ids.insert(x["id"].as_str().unwrap().to_string());
        }
    }
    assert!(
        with_low * 4 >= late_samples.len() * 3,
        "{with_low} of {} samples with a viewer at the base spatial layer",
        late_samples.len()
    );
    assert_eq!(narrow_ids.len(), 1, "always the same viewer: {narrow_ids:?}");
    let full = samples.iter().flat_map(|(_, v)| v).any(|x| {
        !narrow_ids.contains(x["id"].as_str().unwrap_or(""))
            && did(x) == Some(1)
            && x["layers"]["allowance"]["tid"] == 2
    });
    assert!(full, "the viewer with no limit never had every layer");
}

/// Pion plays the demo over WHEP: it starts at a keyframe, loses no frame, and ffmpeg decodes
/// every frame it assembled. A second pion drops 5% of the video packets on arrival, as a lossy
/// link would: the relay resends them (RTX) when asked (NACK), so fewer than 0.5% of its frames
/// are lost. A third is killed without a word: the relay drops it once its ICE checks stop
/// (within the consent-freshness window, 30 s) and its sinks are gone.
#[test]
fn pion_plays_over_whep_and_lost_packets_are_resent() {
    let Some(pion) = peer("pion-peer") else { return };
    let _alone = alone();
    if !have_ffmpeg() {
        return;
    }
    let relay = Relay::start(&[]);
    let whep = relay.url("/demo/whep");
    let dir = scratch_dir("pion-whep");
    let (clean_h264, lossy_h264) = (dir.join("clean.h264"), dir.join("lossy.h264"));
    // The sinks on the path's tracks' sessions.
    let sinks = || {
        let s = relay.ok("GET", "/v1/sessions/demo", None);
        s["rtsp_tracks"].as_array().unwrap().iter().map(|t| t["sinks"].as_u64().unwrap()).sum::<u64>()
    };
    let before = sinks();
    let playing = || {
        let s = relay.ok("GET", "/v1/sessions/demo", None);
        s["webrtc"].as_array().map_or(0, |v| v.iter().filter(|v| v["state"] == "playing").count())
    };
    // The one to be killed first: its id, then no more of it.
    let mut doomed = pion_play(&pion, &whep, 120, 0.0, &dir.join("doomed.h264"), 0);
    assert!(wait_for(Duration::from_secs(15), || playing() == 1), "{}", relay.ok("GET", "/v1/sessions/demo", None));
    let id = relay.ok("GET", "/v1/sessions/demo", None)["webrtc"][0]["id"].as_str().unwrap().to_string();
    doomed.kill().unwrap();
    let _ = doomed.wait();
    let status = relay.url("/v1/sessions/demo");
    let gone = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(40) {
            let s: Value = ureq::get(&status).call().unwrap().into_json().unwrap();
            if !s["webrtc"].as_array().unwrap().iter().any(|v| v["id"] == id.as_str()) {
                return t0.elapsed().as_secs_f64();
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        f64::INFINITY
    });
    let clean = pion_play(&pion, &whep, 12, 0.0, &clean_h264, 0);
    let lossy = pion_play(&pion, &whep, 20, 0.05, &lossy_h264, 0);

    let clean = pion_report(clean);
    eprintln!("pion, no loss: {clean}");
    assert_eq!(clean["connected"], true, "{clean}");
    assert_eq!(clean["starts_with_keyframe"], true, "{clean}");
    let frames = clean["frames_complete"].as_u64().unwrap();
    assert!(frames >= 250, "12 s at 25 fps: {clean}");
    assert_eq!(clean["frames_lost"], 0, "{clean}");
    assert_eq!(h264_file_frames(&clean_h264), frames, "ffmpeg decodes every frame pion assembled");

    let lossy = pion_report(lossy);
    eprintln!("pion, 5% of video packets dropped: {lossy}");
    let (packets, dropped) = (lossy["video_packets"].as_f64().unwrap(), lossy["dropped"].as_f64().unwrap());
    assert!(dropped >= 0.03 * (packets + dropped), "the link lost packets: {lossy}");
    assert!(lossy["nacks_sent"].as_u64().unwrap() > 0, "{lossy}");
    assert!(lossy["frames_expected"].as_u64().unwrap() >= 450, "{lossy}");
    assert!(lossy["lost_fraction"].as_f64().unwrap() < 0.005, "frames lost to the viewer: {lossy}");
    assert_eq!(h264_file_frames(&lossy_h264), lossy["frames_complete"].as_u64().unwrap());

    // The killed viewer: gone within the consent window; with the others ended, no sink is left
    // once the path's AAC-to-Opus transcoder (a sink on the audio track) has lingered its
    // `linger_s` (10 s) without a viewer and stopped.
    let after = gone.join().unwrap();
    eprintln!("a viewer that stopped answering was dropped {after:.1} s later");
    assert!(after < 30.0, "{after:.1} s");
    assert!(wait_for(Duration::from_secs(5), || playing() == 0), "{}", relay.ok("GET", "/v1/sessions/demo", None));
    assert!(
        wait_for(Duration::from_secs(20), || sinks() == before
            && relay.ok("GET", "/v1/sessions/demo", None)["transcoding"].is_null()),
        "{}",
        relay.ok("GET", "/v1/sessions/demo", None)
    );
}
