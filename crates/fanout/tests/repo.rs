//! The clone stands alone: nothing in it reads or points at files outside the repository, and
//! the peers' installer never stops the suite where a peer cannot be built.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The reference shelf beside the clone, spelled in pieces so this file does not name it.
const OUTSIDE: &str = concat!("..", "/", "shared");

#[test]
fn no_tracked_file_points_outside_the_repository() {
    let out = Command::new("git").args(["ls-files", "-z"]).current_dir(root()).output().unwrap();
    if !out.status.success() {
        eprintln!("\n*** SKIPPED: not a git checkout ***\n");
        return;
    }
    let mut offenders = Vec::new();
    for file in out.stdout.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let file = String::from_utf8_lossy(file);
        let Ok(text) = std::fs::read_to_string(root().join(&*file)) else { continue }; // binary
        for (n, line) in text.lines().enumerate() {
            if line.contains(OUTSIDE) {
                offenders.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(offenders.is_empty(), "files that point outside the clone:\n{}", offenders.join("\n"));
}

#[test]
fn test_data_is_in_the_repository_with_its_provenance() {
    let data = root().join("testdata/video");
    let provenance = std::fs::read_to_string(data.join("PROVENANCE.md")).unwrap();
    for dir in ["h264-svc", "hevc"] {
        for entry in std::fs::read_dir(data.join(dir)).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            assert!(provenance.contains(&format!("`{dir}/{name}`")), "{dir}/{name} has no provenance line");
        }
    }
    assert!(data.join("licenses").read_dir().unwrap().count() >= 2, "licence texts");
}

/// A machine whose Go is too old for MediaMTX (stock Debian 12) and where PyPI is out of
/// reach: install-peers says so loudly, records why, and succeeds, so `cargo test` still runs.
#[test]
fn install_peers_degrades_to_a_loud_skip() {
    let dir = std::env::temp_dir().join(format!("fanout-peers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let old_go = dir.join("go");
    std::fs::write(&old_go, "#!/bin/sh\necho go version go1.19.8 linux/amd64\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&old_go, std::fs::Permissions::from_mode(0o755)).unwrap();
    let peers = dir.join("peers");
    let out = Command::new("bash")
        .arg(root().join("scripts/install-peers"))
        .env("FANOUT_PEERS_DIR", &peers)
        .env("FANOUT_PEERS_GO", &old_go)
        .env("FANOUT_PEERS_NO_PIP", "1")
        .env("FANOUT_PEERS_ONLY", "mediamtx")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "install-peers failed: {stderr}");
    assert!(stderr.contains("mediamtx is NOT available") && stderr.contains("SKIPPED"), "{stderr}");
    let why = std::fs::read_to_string(peers.join("mediamtx.unavailable")).unwrap();
    assert!(why.contains("Go >= 1.25"), "{why}");
    std::fs::remove_dir_all(&dir).unwrap();
}
