//! Issue 50: `fanout bench soak --quick`, the soak's two-minute form: players of every face
//! joining and leaving, a publisher replaced, reloads, an upgrade, a recording with
//! retention and attackers from other addresses; every player got data, and the relay's
//! memory, descriptors, threads and disk stayed flat. In a binary of its own: its load must
//! not share the machine with other tests.

mod common;

#[test]
fn a_quick_soak_stays_flat_and_every_player_gets_data() {
    if !common::have_ffmpeg() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("fanout-soak-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["bench", "soak", "--quick", "--out", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("flat: every player got data"), "{stdout}");
    // Samples every 2 s over two minutes, with the upgrade's new process among them.
    let samples = std::fs::read_to_string(dir.join("soak.csv")).unwrap();
    let pids: std::collections::BTreeSet<&str> =
        samples.lines().skip(1).map(|l| l.split(',').nth(1).unwrap()).collect();
    assert!(samples.lines().count() > 30, "{samples}");
    assert_eq!(pids.len(), 2, "one upgrade: {samples}");
    // Every face's load, every cycle, nobody silent.
    let cycles = std::fs::read_to_string(dir.join("cycles.csv")).unwrap();
    for face in ["rtsp", "rtsp-tcp", "hls", "http", "rtmp", "srt", "webrtc"] {
        let rows: Vec<&str> = cycles.lines().filter(|l| l.split(',').nth(2) == Some(face)).collect();
        assert!(rows.len() >= 5, "{face}: {cycles}");
        assert!(rows.iter().all(|r| r.split(',').nth(6) == Some("0") && r.split(',').nth(4) != Some("0")), "{cycles}");
    }
    assert_eq!(&std::fs::read(dir.join("soak.png")).unwrap()[..4], b"\x89PNG");
    let _ = std::fs::remove_dir_all(&dir);
}
