//! Running fanout as a service: the systemd unit (packaging/fanout.service) passes
//! `systemd-analyze verify` with no warning, asks only for the capabilities the kernel path
//! needs; the example config (packaging/fanout.toml) is good by `fanout serve --check`, which
//! refuses a broken one with its lines; scripts/install-service puts everything in place and
//! keeps a config that is there.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn check(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fanout")).args(["serve", "--check", "--config"]).arg(config).output().unwrap()
}

#[test]
fn the_systemd_unit_verifies_and_asks_only_for_what_it_needs() {
    let unit = std::fs::read_to_string(root().join("packaging/fanout.service")).unwrap();
    for line in ["Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict", "User=fanout"] {
        assert!(unit.lines().any(|l| l == line), "{line}");
    }
    let caps = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).unwrap();
    assert_eq!(caps, "CAP_BPF CAP_NET_ADMIN CAP_PERFMON CAP_NET_BIND_SERVICE");
    assert!(unit.contains("ExecStartPre=/usr/local/bin/fanout serve --config /etc/fanout/fanout.toml --check"));
    let Ok(analyze) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("\n*** SKIPPED: systemd-analyze is not installed (Debian: systemd) ***\n");
        return;
    };
    assert!(analyze.status.success());
    // The unit as installed, but with this build's binary where it will be.
    let dir = tmpdir("unit");
    let here = unit.replace("/usr/local/bin/fanout", env!("CARGO_BIN_EXE_fanout"));
    std::fs::write(dir.join("fanout.service"), here).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(dir.join("fanout.service")).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
    // It can fail: a misspelt key is a warning it prints.
    std::fs::write(
        dir.join("bad.service"),
        unit.replace("Restart=", "Restrat=").replace("/usr/local/bin/fanout", env!("CARGO_BIN_EXE_fanout")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(dir.join("bad.service")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Restrat"));
}

#[test]
fn the_example_config_is_good_and_check_refuses_a_broken_one_with_its_lines() {
    let out = check(&root().join("packaging/fanout.toml"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("is good: 1 session(s)"));
    let dir = tmpdir("check");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "api = 7070\nringg = 3\n").unwrap();
    let out = check(&bad);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("line 1") && said.contains("line 2") && said.contains("ringg"), "{said}");
    // A file a session plays, or its fallback, that is not there; "freeze" needs none.
    let gone = dir.join("gone.ts");
    std::fs::write(
        &bad,
        format!(
            "[[session]]\nname = \"a\"\nsource = {{ file = \"{0}\" }}\n\n[[session]]\nname = \"b\"\n\
             source = {{ publish = true, fallback = \"{0}\" }}\n\n[[session]]\nname = \"c\"\n\
             source = {{ publish = true, fallback = \"freeze\" }}\n",
            gone.display()
        ),
    )
    .unwrap();
    let out = check(&bad);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("session \"a\": its file") && said.contains("session \"b\": its file"), "{said}");
    assert!(!said.contains("session \"c\""), "{said}");
}

#[test]
fn install_service_puts_everything_in_place_and_keeps_an_existing_config() {
    let dir = tmpdir("install");
    let run = || {
        Command::new(root().join("scripts/install-service"))
            .env("FANOUT_INSTALL_ROOT", &dir)
            .env("FANOUT_INSTALL_BIN", env!("CARGO_BIN_EXE_fanout"))
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for f in [
        "usr/local/bin/fanout",
        "etc/systemd/system/fanout.service",
        "etc/fanout/fanout.toml",
        "usr/local/share/doc/fanout/config.md",
    ] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir.join("etc/fanout/fanout.toml")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "the config may hold the token");
    // A second run keeps the operator's config.
    std::fs::write(dir.join("etc/fanout/fanout.toml"), "api = \"127.0.0.1:7071\"\n").unwrap();
    let out = run();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("keeping your"));
    assert_eq!(std::fs::read_to_string(dir.join("etc/fanout/fanout.toml")).unwrap(), "api = \"127.0.0.1:7071\"\n");
    // The install holds a copy of the debug binary (hundreds of MB): kept only when a check fails.
    std::fs::remove_dir_all(&dir).unwrap();
}
