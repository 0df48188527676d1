//! The bench scenarios run (quick mode) and write a CSV and a PNG that parse. In a test
//! binary of its own: the overload scenario's busy processes would disturb timing-sensitive
//! tests running beside it.

mod common;

use std::process::{Command, Output};

fn fanout(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fanout")).args(args).output().unwrap()
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `labels`: the columns that are names, not numbers.
fn check_csv(path: &std::path::Path, min_rows: usize, labels: usize) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let cols = lines.next().unwrap().split(',').count();
    let rows: Vec<&str> = lines.collect();
    assert!(rows.len() >= min_rows, "{}: {text}", path.display());
    for r in rows {
        let f: Vec<&str> = r.split(',').collect();
        assert_eq!(f.len(), cols, "{r}");
        // Every column but the labels is a number.
        assert!(f.iter().filter(|x| x.parse::<f64>().is_ok()).count() >= cols - labels, "{r}");
    }
    let png = std::fs::read(path.with_extension("png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
}

/// Under full background load (32 busy processes per core beside a relay that needs a fifth
/// to a half of a core) the relay sheds the low classes: class 1 loses most, class 3 least, and class 3
/// clearly less than class 1. Generous margins; nothing timed.
fn classes_lose_in_order(csv: &std::path::Path) {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    let (level, class, loss, shed) = (col("background_pct"), col("class"), col("loss_pct"), col("shed_packets"));
    let mut by_class = [(0.0f64, 0u64); 4];
    for row in lines.map(|l| l.split(',').collect::<Vec<_>>()).filter(|r| r[level] == "100") {
        by_class[row[class].parse::<usize>().unwrap()] = (row[loss].parse().unwrap(), row[shed].parse().unwrap());
    }
    let [_, c1, c2, c3] = by_class;
    assert!(c1.0 + 2.0 >= c2.0 && c2.0 + 2.0 >= c3.0, "classes 1/2/3 lost {c1:?} / {c2:?} / {c3:?}\n{text}");
    assert!(c1.0 >= c3.0 + 20.0 && c1.1 > 0, "class 1 was shed and lost clearly more than class 3\n{text}");
}

#[test]
fn bench_quick_modes_run_and_write_csv_and_png() {
    let dir = tmpdir("bench");
    let d = |s: &str| dir.join(s).to_str().unwrap().to_string();
    let out =
        fanout(&["bench", "bulk", "--quick", "--datapath", "shared", "--transport", "udp,tcp", "--out", &d("bulk")]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    check_csv(&dir.join("bulk/bulk.csv"), 4, 3);
    // No terminal here: a plain progress line per step.
    assert!(log.contains("bench bulk [1/4] shared/udp 20 subscribers"), "{log}");
    let out = fanout(&["bench", "payload", "--quick", "--datapath", "copy,shared", "--out", &d("payload")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_csv(&dir.join("payload/payload.csv"), 4, 2);
    // 32 burners a core: a relay that needs a fifth of a core on a fast machine is starved
    // too (at 8 a core it still got what it needed on some: nothing to shed).
    let out = fanout(&["bench", "overload", "--quick", "--burners-per-core", "32", "--out", &d("overload")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_csv(&dir.join("overload/overload.csv"), 6, 2);
    classes_lose_in_order(&dir.join("overload/overload.csv"));
    // A row per thousand sinks (shared needs no privilege).
    let out = fanout(&["bench", "register", "--sinks", "2000", "--datapath", "shared", "--out", &d("register")]);
    let out = match out.status.success() {
        // And the churn rounds, with their memory and open files.
        true => fanout(&[
            "bench",
            "register",
            "--sinks",
            "1000",
            "--churn",
            "2",
            "--churn-sinks",
            "300",
            "--datapath",
            "shared",
            "--out",
            &d("churn"),
        ]),
        false => out,
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_csv(&dir.join("register/register.csv"), 2, 2);
    let churn = std::fs::read_to_string(dir.join("churn/churn-shared.csv")).unwrap();
    assert_eq!(churn.lines().count(), 4, "a header, before, and two rounds: {churn}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("churn of 2 rounds x 300 sinks"), "{out:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The other benches have a quick mode too, and write a CSV and a PNG: the data paths,
/// HTTP, splice and repackaging benches here, the others in tests of their own, so that
/// they run side by side.
#[test]
fn every_bench_has_a_quick_mode_with_csv_and_png() {
    let dir = tmpdir("bench-more");
    let runs: [(&[&str], &str, usize); 4] = [
        // The shared path fed paged datagrams (`:paged`, a NIC's kind) beside copy's linear
        // ones, each also on a `--baseline` build (this one again): four rows a round.
        (
            &[
                "bench",
                "datapaths",
                "--quick",
                "--datapath",
                "copy,shared:paged",
                "--baseline",
                env!("CARGO_BIN_EXE_fanout"),
            ],
            "datapaths/datapaths.csv",
            4,
        ),
        // One step per way of watching: TS over UDP, RTP over UDP and interleaved, TS over
        // HTTP, HLS.
        (&["bench", "http", "--quick"], "http/http.csv", 5),
        (&["bench", "splice", "--quick"], "splice/splice.csv", 2),
        (&["bench", "repack", "--quick"], "repack/repack.csv", 3),
    ];
    quick_benches(&dir, &runs);
    let help = String::from_utf8_lossy(&fanout(&["bench", "layers", "--help"]).stdout).to_string();
    assert!(help.contains("--quick"), "{help}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The benches that start relays of their own or peers: cluster, and RTSP (MediaMTX
/// upstream).
#[test]
fn the_peer_benches_have_a_quick_mode_with_csv_and_png() {
    let dir = tmpdir("bench-peers");
    // A relay already serving RTSP on the default port does not stop a bench (held here
    // when free; otherwise something else holds it, which is the same case).
    let _default_rtsp = std::net::TcpListener::bind("127.0.0.1:8554");
    let peers = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers");
    let runs: [(&[&str], &str, usize); 2] = [
        // 2 edge counts x 2 steps, each subscriber served through an edge's pull.
        (&["bench", "cluster", "--quick"], "cluster/cluster.csv", 4),
        (&["bench", "rtsp", "--quick", "--peers", peers], "rtsp/rtsp.csv", 1),
    ];
    quick_benches(&dir, &runs);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench players`: fanout over RTSP (UDP, TCP), HTTP TS and HLS, MediaMTX over all but
/// HTTP TS, every player's receipt checked (the longest quick bench: a test of its own).
#[test]
fn bench_players_has_a_quick_mode_with_csv_and_png() {
    let dir = tmpdir("bench-players");
    let _default_rtsp = std::net::TcpListener::bind("127.0.0.1:8554");
    let peers = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers");
    quick_benches(&dir, &[(&["bench", "players", "--quick", "--peers", peers], "players/players.csv", 7)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs each bench quick into `dir` and checks its CSV has `rows` rows a round.
fn quick_benches(dir: &std::path::Path, runs: &[(&[&str], &str, usize)]) {
    let d = |s: &str| dir.join(s).to_str().unwrap().to_string();
    let peers = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers");
    for &(args, csv, rows) in runs {
        // bench rtsp's upstream is MediaMTX, bench players measures it: where install-peers
        // could not build it, say so.
        if ["rtsp", "players"].contains(&args[1]) && !std::path::Path::new(peers).join("mediamtx").exists() {
            let why = std::fs::read_to_string(format!("{peers}/mediamtx.unavailable")).unwrap_or_default();
            assert!(!why.is_empty() || std::env::var_os("CI").is_none(), "MediaMTX missing: scripts/test installs it");
            eprintln!("\n*** SKIPPED bench {} --quick: MediaMTX unavailable ({}) ***\n", args[1], why.trim());
            continue;
        }
        let folder = csv.split('/').next().unwrap();
        let mut all = args.to_vec();
        let out_dir = d(folder);
        all.extend(["--out", &out_dir]);
        let out = fanout(&all);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        check_csv(&dir.join(csv), rows, if args[1] == "players" { 3 } else { 2 });
        if args[1] == "http" {
            // Every kind delivered to every subscriber: bytes, nobody silent, nothing missing.
            let csv = std::fs::read_to_string(dir.join(csv)).unwrap();
            for row in csv.lines().skip(1) {
                let f: Vec<&str> = row.split(',').collect();
                assert!(f[7].parse::<u64>().unwrap() > 0 && f[10] == "0" && f[11] == "0", "{row}");
            }
        }
        if args[1] == "players" {
            // Every player of every scenario got something, nothing missing, and the table
            // is there in the peers' columns.
            let csv = std::fs::read_to_string(dir.join(csv)).unwrap();
            for row in csv.lines().skip(1) {
                let f: Vec<&str> = row.split(',').collect();
                assert!(f[9].parse::<u64>().unwrap() > 0 && f[11] == "0" && f[12] == "0", "{row}");
            }
            let table = String::from_utf8_lossy(&out.stdout);
            assert!(table.contains("| Server | Scenario | Clients | CPU | players per core | RSS | loss |"), "{table}");
        }
        if args[1] == "datapaths" {
            // 3 s at 100 sinks is a few CPU ticks: no figure, and the bench says why.
            let table = String::from_utf8_lossy(&out.stdout);
            assert!(table.contains("too short"), "{table}");
        }
    }
}

/// `bench bulk --sinks wire` (root: a namespace, a veth and an eBPF counter) counts every
/// delivery of the kernel path (on one CPU and spread over all), and the shared path, at the
/// far end of the wire: nothing lost, and the kernel path really served its remote sinks
/// (none handed to user space), from linear and from paged (`:paged`) source datagrams
/// alike. A spread session whose shards for other CPUs went nowhere would lose half and
/// more.
#[test]
fn bench_bulk_wire_sinks_count_both_paths_deliveries() {
    if !common::root_or_skip("bench bulk --sinks wire", "network namespace, veth, eBPF") {
        return;
    }
    let dir = tmpdir("bench-wire");
    let out = fanout(&[
        "bench",
        "bulk",
        "--quick",
        "--sinks",
        "wire",
        "--datapath",
        "kernel,kernel:spread,kernel:paged,shared",
        "--transport",
        "udp",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(!log.contains("served from user space"), "the kernel path handed sinks over:\n{log}");
    check_csv(&dir.join("bulk.csv"), 8, 3);
    let csv = std::fs::read_to_string(dir.join("bulk.csv")).unwrap();
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    for row in csv.lines().skip(1).map(|l| l.split(',').collect::<Vec<_>>()) {
        assert_eq!(row[col("sinks")], "wire", "{csv}");
        // 256 kbit/s of 1400 B for 3 s to each of 20 or 60 sinks: ~23 datagrams a second each.
        let n: f64 = row[col("subscribers")].parse().unwrap();
        let rate: f64 = row[col("deliveries_per_s")].parse().unwrap();
        assert!(rate > n * 15.0, "deliveries per second {rate} for {n} sinks:\n{csv}");
        assert!(row[col("loss_pct")].parse::<f64>().unwrap() < 1.0, "{csv}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench pacing --quick` runs (root: it makes namespaces and tc links), writes its CSVs and
/// PNG, and shows what pacing is for: subscribers joining behind thin links of their own lose
/// less with pacing than without (generous: not more).
#[test]
fn bench_pacing_quick_runs_and_pacing_cuts_the_loss_at_joining() {
    if !common::root_or_skip("bench pacing --quick", "network namespaces, tc") {
        return;
    }
    let dir = tmpdir("bench-pacing");
    let out = fanout(&["bench", "pacing", "--quick", "--out", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Quick: 3 subscribers with a link each and 6 behind a shared one, pacing off and on.
    let rows = std::fs::read_to_string(dir.join("pacing.csv")).unwrap();
    assert_eq!(rows.lines().count(), 1 + 2 * 9, "{rows}");
    let png = std::fs::read(dir.join("pacing.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
    let summary = std::fs::read_to_string(dir.join("pacing-summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 1 + 4, "{summary}");
    for r in summary.lines().skip(1) {
        assert!(r.split(',').skip(3).all(|x| x.parse::<f64>().is_ok()), "{r}");
    }
    let loss = |pacing: &str| -> f64 {
        let row = summary.lines().find(|l| l.starts_with(&format!("shared,{pacing},own,"))).expect(pacing);
        row.split(',').nth(4).unwrap().parse().unwrap()
    };
    assert!(loss("on") <= loss("off"), "paced {} % vs unpaced {} %:\n{summary}", loss("on"), loss("off"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench egress --quick` writes its CSV and PNG and shows what a shared egress is for: behind
/// one thin link the top class loses (much) less than when the link drops, and the lowest
/// class more than the top one (generous margins).
#[test]
fn bench_egress_quick_runs_and_the_top_class_is_kept() {
    if !common::root_or_skip("bench egress --quick", "network namespaces, tc") {
        return;
    }
    let dir = tmpdir("bench-egress");
    let out = fanout(&["bench", "egress", "--quick", "--out", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = std::fs::read_to_string(dir.join("egress.csv")).unwrap();
    assert_eq!(rows.lines().count(), 1 + 2 * 5, "{rows}");
    let png = std::fs::read(dir.join("egress.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
    let loss = |round: &str, session: &str| -> f64 {
        let row = rows.lines().find(|l| l.starts_with(&format!("{round},{session},"))).expect(session);
        row.split(',').nth(6).unwrap().parse().unwrap()
    };
    let (top, dropped) = (loss("egress", "class-3"), loss("unlimited", "class-3"));
    assert!(top < 5.0 && top < dropped / 2.0, "class 3: {top} % shared vs {dropped} % dropped by the link:\n{rows}");
    assert!(loss("egress", "class-0") > 50.0, "class 0 gets what is left:\n{rows}");
    std::fs::remove_dir_all(&dir).unwrap();
}
