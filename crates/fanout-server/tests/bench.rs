//! The bench scenarios run (quick mode) and write a CSV and a PNG that parse. In a test
//! binary of its own: the overload scenario's busy processes would disturb timing-sensitive
//! tests running beside it.

use std::process::{Command, Output};

fn fanout(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fanout")).args(args).output().unwrap()
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn check_csv(path: &std::path::Path, min_rows: usize) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let cols = lines.next().unwrap().split(',').count();
    let rows: Vec<&str> = lines.collect();
    assert!(rows.len() >= min_rows, "{}: {text}", path.display());
    for r in rows {
        let f: Vec<&str> = r.split(',').collect();
        assert_eq!(f.len(), cols, "{r}");
        // Every column after the labels is a number.
        assert!(f.iter().filter(|x| x.parse::<f64>().is_ok()).count() >= cols - 2, "{r}");
    }
    let png = std::fs::read(path.with_extension("png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
}

#[test]
fn bench_quick_modes_run_and_write_csv_and_png() {
    let dir = tmpdir("bench");
    let d = |s: &str| dir.join(s).to_str().unwrap().to_string();
    let out =
        fanout(&["bench", "bulk", "--quick", "--datapath", "shared", "--transport", "udp,tcp", "--out", &d("bulk")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_csv(&dir.join("bulk/bulk.csv"), 4);
    let out = fanout(&["bench", "payload", "--quick", "--datapath", "copy,shared", "--out", &d("payload")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_csv(&dir.join("payload/payload.csv"), 4);
    let out = fanout(&["bench", "overload", "--quick", "--out", &d("overload")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_csv(&dir.join("overload/overload.csv"), 6);
    std::fs::remove_dir_all(&dir).unwrap();
}
