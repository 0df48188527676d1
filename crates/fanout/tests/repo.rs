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

/// The modules of one crate (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`) and the modules
/// each one names through `crate::…` or `super::…` paths, outside its unit tests, plus its
/// own children (a folder's module uses them by relative paths). A module naming its own
/// ancestor is not counted: a folder's children use what their `mod.rs` holds, and that is
/// the folder's own business.
fn module_arrows(src: &Path) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut all = Vec::new();
    files(src, &mut all);
    let module_of = |p: &Path| -> String {
        let rel = p.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            parts.pop();
        }
        parts.join("::")
    };
    let modules: std::collections::BTreeSet<String> = all.iter().map(|p| module_of(p)).collect();
    // The longest known module a path (`a::b::Item`) starts with.
    let resolve = |path: &[&str]| -> Option<String> {
        (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| modules.contains(m))
    };
    let mut arrows = std::collections::BTreeMap::new();
    for p in &all {
        let me = module_of(p);
        let text = std::fs::read_to_string(p).unwrap();
        // Code only: unit tests (from `#[cfg(test)]` before `mod tests`) and comments left out.
        let tests_at = text
            .match_indices("#[cfg(test)]\n")
            .find(|(at, m)| text[at + m.len()..].lines().next().is_some_and(|l| l.contains("mod tests")))
            .map_or(text.len(), |(at, _)| at);
        let code: String =
            text[..tests_at].lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n");
        let mut targets = std::collections::BTreeSet::new();
        for (at, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
            let base: Vec<&str> = if code[at..].starts_with("crate::") {
                Vec::new()
            } else {
                let mut b: Vec<&str> = if me.is_empty() { Vec::new() } else { me.split("::").collect() };
                // In `a/b.rs` (module a::b), `super` is `a`; in `a/mod.rs` (module a) it is the root.
                b.pop();
                b
            };
            // (Both prefixes are 7 bytes.)
            let rest = &code[at + 7..];
            // `crate::{a, b::c}` names several paths; `crate::a::b` one.
            let items: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 0;
                let end = group
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += i32::from(c == '{') - i32::from(c == '}');
                        depth < 0
                    })
                    .map_or(group.len(), |(i, _)| i);
                let mut items = Vec::new();
                let (mut depth, mut from) = (0, 0);
                for (i, c) in group[..end].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            items.push(group[from..i].to_string());
                            from = i + 1;
                        }
                        _ => {}
                    }
                }
                items.push(group[from..end].to_string());
                items
            } else {
                vec![rest.to_string()]
            };
            for item in items {
                let path: Vec<&str> = item
                    .trim()
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .unwrap_or("")
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .collect();
                let mut base = base.clone();
                let mut path = &path[..];
                while let Some(("super", up)) = path.split_first().map(|(f, r)| (*f, r)) {
                    base.pop();
                    path = up;
                }
                let full: Vec<&str> = base.iter().copied().chain(path.iter().copied()).collect();
                if let Some(t) = resolve(&full) {
                    let ancestor = me == t || t.is_empty() || me.starts_with(&format!("{t}::"));
                    if !ancestor {
                        targets.insert(t);
                    }
                }
            }
        }
        // A folder's module uses its children (by relative paths too).
        targets.extend(modules.iter().filter(|m| m.rsplit_once("::").is_some_and(|(up, _)| up == me)).cloned());
        if me.is_empty() {
            targets.extend(modules.iter().filter(|m| !m.is_empty() && !m.contains("::")).cloned());
        }
        arrows.insert(me, targets);
    }
    arrows
}

/// A circle of imports among `arrows`, if there is one: the modules on it, in order.
fn find_circle(arrows: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        arrows: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        state: &mut std::collections::BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for t in arrows.get(m).into_iter().flatten() {
            match state.get(t).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|p| p == t).unwrap();
                    let mut circle = path[from..].to_vec();
                    circle.push(t.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(t, arrows, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = std::collections::BTreeMap::new();
    for m in arrows.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, arrows, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Issue 31: arrows run down only. No module of any crate imports, through any chain, a
/// module that imports it.
#[test]
fn no_import_circle_in_any_crate() {
    let mut checked = 0;
    for e in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = e.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let arrows = module_arrows(&src);
        checked += arrows.len();
        if let Some(circle) = find_circle(&arrows) {
            panic!("an import circle in {}: {}", src.display(), circle.join(" -> "));
        }
    }
    assert!(checked > 50, "only {checked} modules read");
}

/// The circle finder finds a circle through grouped and `super` imports, and none where
/// arrows only run down.
#[test]
fn the_circle_finder_sees_circles() {
    let dir = std::env::temp_dir().join(format!("fanout-circles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("net")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod net;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{net::wire::Frame, b};\n").unwrap();
    std::fs::write(src.join("b.rs"), "// crate::a in a comment is no arrow\npub struct B;\n").unwrap();
    std::fs::write(src.join("net/mod.rs"), "pub mod wire;\npub fn up() {}\n").unwrap();
    std::fs::write(src.join("net/wire.rs"), "use super::up;\npub struct Frame;\n").unwrap();
    let arrows = module_arrows(&src);
    assert_eq!(arrows["a"].iter().cloned().collect::<Vec<_>>(), ["b", "net::wire"]);
    assert_eq!(arrows["net"].iter().cloned().collect::<Vec<_>>(), ["net::wire"], "a folder uses its children");
    assert!(arrows["net::wire"].is_empty(), "a child naming its parent is no arrow: {arrows:?}");
    assert_eq!(find_circle(&arrows), None);
    std::fs::write(src.join("net/wire.rs"), "pub struct Frame(crate::a::A);\n").unwrap();
    let circle = find_circle(&module_arrows(&src)).expect("a -> net::wire -> a");
    assert!(circle.contains(&"a".to_string()) && circle.contains(&"net::wire".to_string()), "{circle:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
