//! Compiles the in-kernel data path (bpf/fanout_fwd.bpf.c) with clang. Without clang, or
//! without the headers it needs (libbpf's `bpf/*.h`, the kernel's `linux/*.h`), the relay
//! still builds: the `kernel` data path then reports that it was built without it.
//! fanout-tools' build script compiles its own program (the bench's wire sinks) with
//! [`compile`] from here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The headers the program includes; each must be found for its compilation to be meaningful.
const HEADERS: &[&str] = &[
    "linux/bpf.h",
    "linux/if_ether.h",
    "linux/in.h",
    "linux/ip.h",
    "linux/pkt_cls.h",
    "linux/udp.h",
    "bpf/bpf_endian.h",
    "bpf/bpf_helpers.h",
];

/// The clang to compile with, or why the program cannot be built here (then the relay is
/// built without it). `include` is the `-I` of the architecture's kernel headers.
pub fn plan(candidates: &[String], include: &str) -> Result<String, String> {
    let runs = |c: &String| {
        Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    let Some(clang) = candidates.iter().find(|c| runs(c)) else {
        return Err("clang not found (apt-get install clang libbpf-dev)".into());
    };
    let missing = missing_headers(clang, include);
    if !missing.is_empty() {
        return Err(format!("{clang} cannot find {} (apt-get install libbpf-dev linux-libc-dev)", missing.join(", ")));
    }
    Ok(clang.clone())
}

/// The headers clang cannot find for the BPF target.
fn missing_headers(clang: &str, include: &str) -> Vec<&'static str> {
    HEADERS
        .iter()
        .copied()
        .filter(|h| {
            let probe = Command::new(clang)
                .args(["-target", "bpf", "-E", "-x", "c", "-o", "/dev/null", include, "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .and_then(|mut child| {
                    use std::io::Write;
                    // linux/*.h headers need the types of linux/types.h first.
                    let src = format!("#include <linux/types.h>\n#include <{h}>\n");
                    child.stdin.take().unwrap().write_all(src.as_bytes())?;
                    child.wait()
                });
            !probe.is_ok_and(|s| s.success())
        })
        .collect()
}

/// Builds without the program: an empty object the loader recognises, and a warning.
fn without(out: &Path, why: &str, what: &str) {
    println!("cargo:warning={why}: building without {what}");
    // Look again once clang or the headers may have come: a package's files keep the
    // package's old mtimes, but the directories they land in change when they do (a missing
    // one counts as changed).
    println!("cargo:rerun-if-changed=/usr/bin");
    println!("cargo:rerun-if-changed=/usr/include/bpf");
    std::fs::write(out, b"").unwrap();
}

fn main() {
    compile("bpf/fanout_fwd.bpf.c", "fanout_fwd.o", "the in-kernel data path");
}

/// Compiles `src` to `$OUT_DIR/obj`, or writes an empty `obj` (the loader's "built without
/// `what`") when clang or a header is missing.
pub fn compile(src: &str, obj: &str, what: &str) {
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=FANOUT_CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join(obj);
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    let include = format!("-I/usr/include/{arch}-linux-gnu");
    let candidates = match std::env::var("FANOUT_CLANG") {
        Ok(c) => vec![c],
        Err(_) => {
            ["clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14"].map(String::from).to_vec()
        }
    };
    let clang = match plan(&candidates, &include) {
        Ok(clang) => clang,
        Err(why) => return without(&out, &why, what),
    };
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", &include, "-c", src, "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("{clang}: {e}"));
    // With clang and every header present, a failure is a defect of the program: stop.
    assert!(status.success(), "{clang} failed to compile {src} ({status})");
}
