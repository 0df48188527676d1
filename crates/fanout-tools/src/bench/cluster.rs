//! `fanout bench cluster`: one origin, edges that pull from it (configured parents, no etcd
//! needed), UDP subscribers spread over 1, 2 and 4 edges. What it shows: the origin's CPU
//! stays flat however many subscribers the edges serve (it serves one pull per edge); the
//! edges carry the fan-out; and each tier adds a little latency (a subscriber of the origin,
//! of a tier-1 edge and of a tier-2 edge, side by side). From the measured costs it projects
//! how many subscribers a tree of N relays serves.

use super::{plot, plot::Panel, process_cpu_s, progress, run_tool, start_sub, wait, Proc, RelayProc};
use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct ClusterArgs {
    /// Edge counts to compare (each step spreads its subscribers over this many edges).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    edges: Vec<usize>,
    /// Total subscriber counts to step through.
    #[arg(long, value_delimiter = ',', default_value = "250,1000,2000,4000")]
    steps: Vec<usize>,
    /// Subscribers per tier in the latency comparison.
    #[arg(long, default_value_t = 50)]
    latency_subscribers: usize,
    #[command(flatten)]
    load: super::Load,
    /// The projection's ceiling on subscribers per edge, whatever its CPU allows. 10,000 is
    /// conservative: one relay's kernel path served 30,000 wire subscribers clean on one
    /// CPU and 40,000 spread over two (`bench bulk --sinks wire`, docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 10_000.0)]
    edge_cap: f64,
    /// A short run (2 steps, 3 s) that checks the tools work; CI runs it.
    #[arg(long)]
    quick: bool,
    /// Folder for the CSVs and PNGs.
    #[arg(long, default_value = "bench-out/cluster")]
    out: PathBuf,
}

/// What the `sub` processes of a step saw, all together.
struct Seen {
    received: u64,
    lost: f64,
    expected: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Starts an edge whose parent is `parent` (an `rtsp://host:port`).
fn edge(name: &str, tier: u32, parent: &str, dir: &Path) -> anyhow::Result<RelayProc> {
    let cfg = dir.join(format!("{name}.toml"));
    let toml = format!("[cluster]\nnode = \"{name}\"\ntier = {tier}\nlinger_s = 1\nparents = [\"{parent}\"]\n");
    std::fs::write(&cfg, toml)?;
    RelayProc::start(&["--config", cfg.to_str().context("a UTF-8 path")?])
}

fn rtsp_of(r: &RelayProc) -> anyhow::Result<String> {
    let v = r.client().call("GET", "/v1/engine", None)?;
    Ok(format!("rtsp://{}", v["rtsp"].as_str().context("the relay has no RTSP address")?))
}

/// Runs `gen` into the origin's session while `sub` processes subscribe on `targets`
/// (relay, subscriber count); returns what they saw and the CPU seconds of `watch` (pids).
fn step(
    source: &str,
    targets: &[(&RelayProc, usize)],
    load: &super::Load,
    out: &Path,
    watch: &[u32],
) -> anyhow::Result<(Seen, Vec<f64>, f64)> {
    let mut subs: Vec<(Proc, PathBuf)> = Vec::new();
    for (i, (r, n)) in targets.iter().enumerate().filter(|(_, (_, n))| *n > 0) {
        let json_path = out.join(format!("sub-{i}.json"));
        let _ = std::fs::remove_file(&json_path);
        let args: Vec<String> = [
            "--api",
            &format!("http://{}", r.api),
            "--session",
            "ch",
            "--udp",
            &n.to_string(),
            "--record",
            &load.payload.to_string(),
            "--duration",
            &(load.seconds + 60.0).to_string(),
            "--idle-exit",
            "1.5",
            "--json",
            &json_path.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        subs.push((start_sub(&args, Duration::from_secs(30 + *n as u64 / 50))?, json_path));
    }
    // The edges' pulls connect when their first sink arrives: give them a moment.
    std::thread::sleep(Duration::from_millis(500));
    let cpu0: Vec<f64> = watch.iter().map(|p| process_cpu_s(*p)).collect::<anyhow::Result<_>>()?;
    let t0 = Instant::now();
    let gen: Vec<String> = [
        "gen",
        "--to",
        source,
        "--rate-kbps",
        &load.rate_kbps.to_string(),
        "--payload",
        &load.payload.to_string(),
        "--duration",
        &load.seconds.to_string(),
        "--payload-type",
        "33",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    run_tool(&gen, Duration::from_secs_f64(load.seconds + 30.0))?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu: Vec<f64> =
        watch.iter().zip(&cpu0).map(|(p, c0)| Ok(process_cpu_s(*p)? - c0)).collect::<anyhow::Result<_>>()?;
    let mut seen = Seen { received: 0, lost: 0.0, expected: 0.0, p50_us: 0.0, p99_us: 0.0 };
    for (mut p, path) in subs {
        wait(&mut p, Duration::from_secs(60))?;
        let report: Value = serde_json::from_slice(&std::fs::read(&path).context("reading sub's report")?)?;
        let _ = std::fs::remove_file(&path);
        for g in report["groups"].as_array().into_iter().flatten() {
            seen.received += g["received"].as_u64().unwrap_or(0);
            seen.lost += g["lost"].as_f64().unwrap_or(0.0);
            seen.expected += g["expected"].as_f64().unwrap_or(0.0);
            seen.p50_us = seen.p50_us.max(g["latency_p50_us"].as_f64().unwrap_or(0.0));
            seen.p99_us = seen.p99_us.max(g["latency_p99_us"].as_f64().unwrap_or(0.0));
        }
    }
    Ok((seen, cpu, secs))
}

pub fn run(mut a: ClusterArgs) -> anyhow::Result<()> {
    if a.quick {
        a.steps = vec![20, 60];
        a.edges = vec![1, 2];
        a.latency_subscribers = 5;
        a.load.seconds = 3.0;
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    // The edges' config files: scratch, not results.
    let scratch = std::env::temp_dir().join(format!("fanout-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let max_edges = a.edges.iter().copied().max().unwrap_or(1);
    let origin = RelayProc::start(&[])?;
    let body = json!({"name": "ch", "source": {"udp": "127.0.0.1:0"}});
    let v = origin.client().call("POST", "/v1/sessions", Some(body))?;
    let source = v["source"]["addr"].as_str().context("the origin did not say its source address")?.to_string();
    // A few packets first, so that the origin can describe the session to its first pull.
    let prime: Vec<String> =
        ["gen", "--to", &source, "--count", "5", "--payload-type", "33"].iter().map(|s| s.to_string()).collect();
    run_tool(&prime, Duration::from_secs(10))?;
    let parent = rtsp_of(&origin)?;
    let edges: Vec<RelayProc> =
        (0..max_edges).map(|i| edge(&format!("edge{i}"), 1, &parent, &scratch)).collect::<anyhow::Result<_>>()?;

    let csv_path = a.out.join("cluster.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "edges,subscribers,origin_cpu_pct,edges_cpu_pct,edge_max_cpu_pct,edge_us_per_delivery,loss_pct,latency_p50_us,latency_p99_us"
    )?;
    let mut pb = progress((a.edges.len() * a.steps.len() + 1) as u64, "bench cluster");
    let (mut origin_series, mut edge_series, mut loss_series) = (Vec::new(), Vec::new(), Vec::new());
    let mut costs: Vec<(f64, f64)> = Vec::new(); // (origin % per pull, edge µs per delivery)
    for &e in &a.edges {
        let (mut o, mut ed, mut l) = (Vec::new(), Vec::new(), Vec::new());
        for &n in &a.steps {
            pb.set_message(format!("{e} edges, {n} subscribers"));
            let targets: Vec<(&RelayProc, usize)> =
                edges[..e].iter().enumerate().map(|(i, r)| (r, n / e + usize::from(i < n % e))).collect();
            let mut watch = vec![origin.pid()];
            watch.extend(edges[..e].iter().map(RelayProc::pid));
            let (seen, cpu, secs) = step(&source, &targets, &a.load, &a.out, &watch)?;
            let origin_pct = 100.0 * cpu[0] / secs;
            let edge_pcts: Vec<f64> = cpu[1..].iter().map(|c| 100.0 * c / secs).collect();
            let edges_pct: f64 = edge_pcts.iter().sum();
            let per = cpu[1..].iter().sum::<f64>() * 1e6 / seen.received.max(1) as f64;
            let loss = if seen.expected > 0.0 { 100.0 * seen.lost / seen.expected } else { 100.0 };
            writeln!(
                csv,
                "{e},{n},{origin_pct:.2},{edges_pct:.2},{:.2},{per:.3},{loss:.3},{:.0},{:.0}",
                edge_pcts.iter().copied().fold(0.0, f64::max),
                seen.p50_us,
                seen.p99_us
            )?;
            pb.println(format!(
                "{e} edges, {n} subscribers: origin CPU {origin_pct:.1}%, edges {edges_pct:.1}% ({per:.2} µs per delivery), loss {loss:.3}%"
            ));
            o.push((n as f64, origin_pct));
            ed.push((n as f64, edges_pct));
            l.push((n as f64, loss));
            costs.push((origin_pct / e as f64, per));
            pb.inc(1);
        }
        origin_series.push((format!("origin, {e} edges"), o));
        edge_series.push((format!("edges, {e} edges"), ed));
        loss_series.push((format!("{e} edges"), l));
    }

    // Latency per tier: subscribers of the origin, of a tier-1 edge and of a tier-2 edge at once.
    pb.set_message("latency per tier".into());
    let tier2 = edge("tier2", 2, &rtsp_of(&edges[0])?, &scratch)?;
    let lat_path = a.out.join("cluster-latency.csv");
    let mut lat_csv = std::fs::File::create(&lat_path)?;
    writeln!(lat_csv, "tier,subscribers,latency_p50_us,latency_p99_us,loss_pct")?;
    let mut tiers = Vec::new();
    for (tier, r) in [(0, &origin), (1, &edges[0]), (2, &tier2)] {
        let (seen, _, _) = step(&source, &[(r, a.latency_subscribers)], &a.load, &a.out, &[r.pid()])?;
        let loss = if seen.expected > 0.0 { 100.0 * seen.lost / seen.expected } else { 100.0 };
        writeln!(lat_csv, "{tier},{},{:.0},{:.0},{loss:.3}", a.latency_subscribers, seen.p50_us, seen.p99_us)?;
        pb.println(format!("tier {tier}: latency p50 {:.0} µs, p99 {:.0} µs", seen.p50_us, seen.p99_us));
        tiers.push((tier as f64, seen.p50_us / 1000.0, seen.p99_us / 1000.0));
    }
    pb.inc(1);

    let png = a.out.join("cluster.png");
    let title = format!("One origin, N edges: {} kbit/s, {} B, UDP subscribers", a.load.rate_kbps, a.load.payload);
    plot::panels(
        &png,
        &title,
        "subscribers (all edges)",
        false,
        &[
            Panel { y_label: "origin CPU (% of one core)", series: origin_series, log_y: false },
            Panel { y_label: "edges' CPU together (% of one core)", series: edge_series, log_y: false },
            Panel { y_label: "loss (%)", series: loss_series, log_y: false },
        ],
    )?;
    let lat_png = a.out.join("cluster-latency.png");
    plot::panels(
        &lat_png,
        "Latency per tier (origin = 0)",
        "tier",
        false,
        &[Panel {
            y_label: "latency (ms)",
            series: vec![
                ("p50".into(), tiers.iter().map(|t| (t.0, t.1)).collect()),
                ("p99".into(), tiers.iter().map(|t| (t.0, t.2)).collect()),
            ],
            log_y: false,
        }],
    )?;
    let proj = project(&costs, a.edge_cap, &a.out)?;
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "CSV: {}\nCSV: {}\nPNG: {}\nPNG: {}\n{proj}",
        csv_path.display(),
        lat_path.display(),
        png.display(),
        lat_png.display()
    );
    Ok(())
}

/// How many subscribers a tree of N two-core relays serves, from the measured costs: an
/// edge serves subscribers until 80% of its two cores go to them (at the largest step's CPU
/// per delivery, which includes its pull), at most `edge_cap`; a relay feeds pulls until 80% of its cores go to
/// them (at the origin's CPU per pull); the tree is as wide as that allows at each level, and
/// only its leaves serve subscribers.
fn project(costs: &[(f64, f64)], edge_cap: f64, out: &Path) -> anyhow::Result<String> {
    let pull_pct = costs.iter().map(|c| c.0).fold(0.0, f64::max).max(0.1);
    let us_per_delivery = costs.last().map_or(1.0, |c| c.1).max(0.01);
    let budget_pct = 160.0; // 80% of two cores
    let pps = 256_000.0 / 8.0 / 1400.0; // a 256 kbit/s stream of 1400 B packets
    let by_cpu = (budget_pct / 100.0 * 1e6 / us_per_delivery / pps).floor();
    let per_edge = by_cpu.min(edge_cap);
    let fanout = (budget_pct / pull_pct).floor().max(2.0);
    let csv_path = out.join("cluster-projection.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(csv, "relays,depth,leaves,subscribers")?;
    let mut series = Vec::new();
    for n in [1u64, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000] {
        // A tree of n relays with up to `fanout` children each: leaves and depth.
        let (mut placed, mut level, mut depth) = (1u64, 1u64, 0u32);
        while placed < n {
            level = (level * fanout as u64).min(n - placed);
            placed += level;
            depth += 1;
        }
        // Every relay but the root hangs from a full (or the last) internal one.
        let leaves = n - (n - 1).div_ceil(fanout as u64);
        let subs = leaves as f64 * per_edge;
        writeln!(csv, "{n},{depth},{leaves},{subs:.0}")?;
        series.push((n as f64, subs));
    }
    plot::panels(
        &out.join("cluster-projection.png"),
        &format!("Projected: subscribers of a tree of N two-core relays ({per_edge:.0} per edge, {fanout:.0} pulls per relay)"),
        "relays (log scale)",
        true,
        &[Panel { y_label: "subscribers", series: vec![("projected".into(), series)], log_y: false }],
    )?;
    Ok(format!(
        "projection: {per_edge:.0} subscribers per edge ({by_cpu:.0} by CPU at {us_per_delivery:.2} µs per delivery, \
         capped at {edge_cap:.0}), {fanout:.0} pulls per relay ({pull_pct:.2}% of a core each); CSV: {}",
        csv_path.display()
    ))
}
