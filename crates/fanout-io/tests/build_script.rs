//! The build script's choice: compile the eBPF program, or build without it with a warning
//! (never a panic) when clang or the headers it needs are missing.

#[allow(dead_code)] // its `main` is the build script's
#[path = "../build.rs"]
mod build;

use std::os::unix::fs::PermissionsExt;

/// A clang that runs but searches no system header directory: libbpf and kernel headers
/// look uninstalled to it.
fn clang_without_headers(dir: &std::path::Path) -> Option<String> {
    let real = ["clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14"]
        .into_iter()
        .find(|c| std::process::Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))?;
    let path = dir.join("clang-no-headers");
    std::fs::write(&path, format!("#!/bin/sh\nexec {real} -nostdinc \"$@\"\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Another test thread that forks while the script is open for writing holds it open
    // until its child execs: running it then fails with ETXTBSY. Wait that out.
    for _ in 0..100 {
        match std::process::Command::new(&path).arg("--version").output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            _ => break,
        }
    }
    Some(path.to_string_lossy().into_owned())
}

#[test]
fn missing_clang_builds_without_the_program() {
    let why = build::plan(&["no-such-clang-anywhere".into()], "-I/usr/include").unwrap_err();
    assert!(why.contains("clang not found"), "{why}");
}

#[test]
fn clang_without_libbpf_headers_builds_without_the_program() {
    let dir = std::env::temp_dir().join(format!("fanout-build-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(clang) = clang_without_headers(&dir) else {
        if std::env::var_os("CI").is_some() {
            panic!("clang is missing: scripts/test installs it");
        }
        eprintln!("\n*** SKIPPED: no clang to wrap ***\n");
        return;
    };
    let why = build::plan(&[clang], "-I/nonexistent").unwrap_err();
    assert!(why.contains("bpf/bpf_helpers.h") && why.contains("linux/bpf.h"), "{why}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn clang_with_headers_compiles() {
    let arch = if cfg!(target_arch = "x86_64") { "x86_64" } else { "aarch64" };
    match build::plan(&["clang".into()], &format!("-I/usr/include/{arch}-linux-gnu")) {
        Ok(clang) => assert_eq!(clang, "clang"),
        Err(why) if std::env::var_os("CI").is_none() => eprintln!("\n*** SKIPPED: {why} ***\n"),
        Err(why) => panic!("scripts/test installs clang and libbpf-dev: {why}"),
    }
}
