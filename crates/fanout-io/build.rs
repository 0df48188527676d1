//! Compiles the in-kernel data path (bpf/fanout_fwd.bpf.c) with clang. Without clang the
//! relay still builds: the `kernel` data path then reports that it was built without it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/fanout_fwd.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=FANOUT_CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("fanout_fwd.o");
    let arch_include = format!("/usr/include/{}-linux-gnu", std::env::var("CARGO_CFG_TARGET_ARCH").unwrap());
    let candidates = match std::env::var("FANOUT_CLANG") {
        Ok(c) => vec![c],
        Err(_) => {
            ["clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14"].map(String::from).to_vec()
        }
    };
    for clang in candidates {
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .arg(format!("-I{arch_include}"))
            .args(["-c", src, "-o"])
            .arg(&out)
            .status();
        match status {
            Ok(s) if s.success() => return,
            Ok(s) => panic!("{clang} failed to compile {src} ({s})"),
            Err(_) => continue, // not installed under this name
        }
    }
    println!("cargo:warning=clang not found: building without the in-kernel data path");
    // A missing file counts as changed: the next build looks for clang again.
    println!("cargo:rerun-if-changed=/usr/bin/clang");
    std::fs::write(&out, b"").unwrap();
}
