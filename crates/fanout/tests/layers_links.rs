//! Layer adaptation against real links (issue 6): subscribers in network namespaces behind
//! tc-shaped veth links. A test binary of its own, so that cargo runs it alone: the loss it
//! measures is real time, and the decoding tests beside it in `layers.rs` would take the CPU
//! the relay and the shaped links need (they pushed a 600 kbit/s link past 1% loss).

mod common;
use common::*;
use serde_json::json;
use std::process::Command;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/video/");

/// `fanout bench layers` on one data path: subscribers behind 150 kbit/s, 600 kbit/s and
/// unlimited links (namespaces, veth, tc); returns its summary.
fn constrained_links(datapath: &str) -> serde_json::Value {
    let out = std::env::temp_dir().join(format!("fanout-layers-links-{}-{datapath}", std::process::id()));
    let file = format!("{DATA}h264-svc/mediasoup_naluInfo.264");
    let run = Command::new("timeout")
        .arg("180")
        .arg(env!("CARGO_BIN_EXE_fanout"))
        .args(["bench", "layers", "--links", "150,600,0", "--seconds", "75", "--datapath", datapath, "--file", &file])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{datapath}: {}", String::from_utf8_lossy(&run.stderr));
    let summary = std::fs::read_to_string(out.join("layers-summary.json")).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    serde_json::from_str(&summary).unwrap()
}

/// The selector against real links: after adaptation (the last 40% of 75 s), the
/// constrained subscribers lose under 1% of what they are still sent and get fewer layers;
/// the unlimited one gets every layer, without loss. Both the user-space and the kernel
/// path, whose program applies the selector's allowance.
#[test]
fn subscribers_behind_constrained_links_adapt_without_loss() {
    if !common::root_or_skip("subscribers_behind_constrained_links_adapt_without_loss", "namespaces and tc") {
        return;
    }
    if !have_ffmpeg() {
        return;
    }
    // 75 s, not 60: a failed probe costs a loss episode, and the 600 kbit/s link's last
    // probe of d1 t1 came 26-32 s in (four runs); from 60 s the window began at 36 s.
    // One path after the other: run side by side on two cores, the two relays, sources and
    // six subscribers took each other's CPU, sent late and so in bursts, and a burst
    // overflowed the 600 kbit/s link (CI saw 1.03% there).
    for dp in ["shared", "kernel"] {
        let s = constrained_links(dp);
        let links = s["links"].as_array().unwrap();
        let every: Vec<serde_json::Value> =
            [(0, 0, 0), (0, 0, 1), (0, 0, 2), (1, 0, 0), (1, 0, 1), (1, 0, 2)].iter().map(|l| json!(l)).collect();
        let path = if dp == "kernel" { "kernel" } else { "user" };
        for l in links {
            // The margin, for whoever reads a run's output.
            eprintln!(
                "{dp}: link {} kbit/s: loss after adaptation {:.3}%, last loss at {} (window from 45 s)",
                l["link_kbps"],
                100.0 * l["loss_after"].as_f64().unwrap_or(f64::NAN),
                l["last_loss_s"].as_f64().map_or("none".into(), |t| format!("{t:.0} s"))
            );
            assert_eq!(l["sink_path"], path, "{dp}: {l}");
            assert!(l["expected_after"].as_u64().unwrap() > 1000, "{dp}: the subscriber got its stream: {l}");
            assert!(l["loss_after"].as_f64().unwrap() < 0.01, "{dp}: loss after adaptation: {l}");
        }
        let (narrow, mid, open) = (&links[0], &links[1], &links[2]);
        assert_eq!(open["layers_after"].as_array().unwrap(), &every, "{dp}: the unlimited link gets every layer");
        assert_eq!(open["aimd_allowance"], "d1q0t2", "{dp}: {open}");
        let kbps = |l: &serde_json::Value| l["received_kbps_after"].as_f64().unwrap();
        assert!(kbps(narrow) < 150.0 && kbps(mid) < 600.0, "{dp}: within the links: {s}");
        assert!(kbps(narrow) < kbps(mid) && kbps(mid) < kbps(open), "{dp}: {s}");
        assert!(narrow["aimd_allowance"].as_str().unwrap().starts_with("d0"), "{dp}: no enhancement layer at 150k");
    }
}
