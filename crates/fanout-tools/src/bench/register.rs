//! `bench register`: sinks added to one session one API call at a time, as `sub` and an
//! operator's scripts add them. Each thousand must take as long as the first: a cost that
//! grew with the sinks already there would make tens of thousands take minutes. With
//! `--churn`, then rounds of thousands of additions and removals while a stream flows: the
//! relay's memory and open files must stay flat.

use super::{ensure_dir, progress, PrivateNetns, Proc, RelayProc};
use anyhow::Context;
use clap::Args;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct RegisterArgs {
    /// Sinks to add to each session.
    #[arg(long, default_value_t = 20_000)]
    sinks: usize,
    /// Data paths to compare (`kernel` runs in a private network namespace: root).
    #[arg(long, value_delimiter = ',', default_value = "kernel,shared")]
    datapath: Vec<String>,
    /// Rounds of churn after the timing: each adds `--churn-sinks` sinks one call at a time
    /// and removes them again, while a 256 kbit/s stream flows (0: none).
    #[arg(long, default_value_t = 0)]
    churn: usize,
    #[arg(long, default_value_t = 5_000)]
    churn_sinks: usize,
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out/register")]
    out: PathBuf,
}

/// The relay's resident memory (KiB) and open file descriptors.
fn footprint(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("the relay is gone")?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok((rss, fds))
}

/// Rounds of `n` additions and removals, one API call each, while `gen` streams into the
/// session; the relay's footprint after each round.
fn churn(relay: &RelayProc, name: &str, rounds: usize, n: usize) -> anyhow::Result<Vec<(u64, u64)>> {
    let api = relay.client();
    let st = api.call("GET", &format!("/v1/sessions/{name}"), None)?;
    let src = st["source"]["addr"].as_str().context("the relay did not say its source address")?.to_string();
    let _gen = Proc(
        std::process::Command::new(std::env::current_exe()?)
            .args(["gen", "--to", &src, "--rate-kbps", "256", "--duration", "3600"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?,
    );
    let mut at = vec![footprint(relay.pid())?];
    for _ in 0..rounds {
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let v = api.call("POST", &format!("/v1/sessions/{name}/sinks"), Some(json!({ "udp": sink_addr(i) })))?;
            ids.push(v["id"].as_u64().context("no sink id")?);
        }
        for id in ids {
            api.call("DELETE", &format!("/v1/sessions/{name}/sinks/{id}"), None)?;
        }
        at.push(footprint(relay.pid())?);
    }
    Ok(at)
}

/// Where the `i`th sink is: nobody listens, only the bookkeeping is measured.
fn sink_addr(i: usize) -> String {
    format!("127.0.{}.{}:{}", 1 + i / 62_500, 2 + (i / 250) % 250, 10_000 + i % 250)
}

pub fn run(a: RegisterArgs) -> anyhow::Result<()> {
    // Before the relay starts, so it lives in the namespace.
    let _netns = match a.datapath.iter().any(|d| d.starts_with("kernel")) {
        true => Some(PrivateNetns::enter(10_000)?),
        false => None,
    };
    let relay = RelayProc::start(&[])?;
    let api = relay.client();
    ensure_dir(&a.out)?;
    let csv_path = a.out.join("register.csv");
    let mut csv = std::fs::File::create(&csv_path).with_context(|| format!("creating {}", csv_path.display()))?;
    writeln!(csv, "datapath,sinks,seconds,ms_per_1000")?;
    let mut pb = progress((a.datapath.len() * a.sinks) as u64, "bench register");
    let (mut total_series, mut per_series, mut lines) = (Vec::new(), Vec::new(), Vec::new());
    let (mut churn_rss, mut churn_fds) = (Vec::new(), Vec::new());
    for (k, dp) in a.datapath.iter().enumerate() {
        let name = format!("register{k}");
        let mut spec = json!({ "name": name, "source": { "udp": "127.0.0.1:0" } });
        spec.as_object_mut().expect("an object").extend(super::datapath_fields(dp)?);
        api.call("POST", "/v1/sessions", Some(spec))?;
        pb.set_message(dp.clone());
        let (mut total, mut per) = (Vec::new(), Vec::new());
        let t0 = Instant::now();
        let mut last = t0;
        for i in 0..a.sinks {
            api.call("POST", &format!("/v1/sessions/{name}/sinks"), Some(json!({ "udp": sink_addr(i) })))?;
            if (i + 1) % 1000 == 0 || i + 1 == a.sinks {
                let now = Instant::now();
                let (s, ms) =
                    ((now - t0).as_secs_f64(), (now - last).as_secs_f64() * 1e3 * 1000.0 / ((i % 1000) + 1) as f64);
                writeln!(csv, "{dp},{},{s:.3},{ms:.1}", i + 1)?;
                total.push(((i + 1) as f64, s));
                per.push(((i + 1) as f64, ms));
                last = now;
                pb.set_position((k * a.sinks + i + 1) as u64);
            }
        }
        let st = api.call("GET", &format!("/v1/sessions/{name}"), None)?;
        let first = per.first().map_or(0.0, |p| p.1);
        let end = per.last().map_or(0.0, |p| p.1);
        lines.push(format!(
            "{dp:>8}: {} sinks one API call at a time in {:.2} s; the first thousand {first:.0} ms, the last {end:.0} ms ({} in the kernel)",
            st["sinks"],
            t0.elapsed().as_secs_f64(),
            st["kernel"]["sinks"].as_u64().unwrap_or(0)
        ));
        if a.churn > 0 {
            // A session of its own, empty: the churn alone shows in the footprint.
            let churned = format!("churn{k}");
            let mut spec = json!({ "name": churned, "source": { "udp": "127.0.0.1:0" } });
            spec.as_object_mut().expect("an object").extend(super::datapath_fields(dp)?);
            api.call("POST", "/v1/sessions", Some(spec))?;
            pb.set_message(format!("{dp}: churn, {} rounds of {} sinks", a.churn, a.churn_sinks));
            let at = churn(&relay, &churned, a.churn, a.churn_sinks)?;
            let mut f = std::fs::File::create(a.out.join(format!("churn-{dp}.csv")))?;
            writeln!(f, "round,rss_kib,fds")?;
            for (r, (rss, fds)) in at.iter().enumerate() {
                writeln!(f, "{r},{rss},{fds}")?;
            }
            let (first, last) = (at[1], at[at.len() - 1]);
            lines.push(format!(
                "{dp:>8}: churn of {} rounds x {} sinks added and removed under a stream: relay memory {} -> {} KiB after round 1 -> {} KiB, open files {} -> {} -> {}",
                a.churn, a.churn_sinks, at[0].0, first.0, last.0, at[0].1, first.1, last.1
            ));
            churn_rss.push((dp.clone(), at.iter().enumerate().map(|(r, x)| (r as f64, x.0 as f64 / 1024.0)).collect()));
            churn_fds.push((dp.clone(), at.iter().enumerate().map(|(r, x)| (r as f64, x.1 as f64)).collect()));
            api.call("DELETE", &format!("/v1/sessions/{churned}"), None)?;
        }
        api.call("DELETE", &format!("/v1/sessions/{name}"), None)?;
        total_series.push((dp.clone(), total));
        per_series.push((dp.clone(), per));
    }
    pb.finish_and_clear();
    for l in &lines {
        println!("{l}");
    }
    let png = a.out.join("register.png");
    super::plot::panels(
        &png,
        "Sinks added one API call at a time",
        "sinks in the session",
        false,
        &[
            super::plot::Panel { y_label: "seconds so far", series: total_series, log_y: false },
            super::plot::Panel { y_label: "ms per thousand sinks", series: per_series, log_y: false },
        ],
    )?;
    println!("CSV: {}\nPNG: {}", csv_path.display(), png.display());
    if a.churn > 0 {
        let png = a.out.join("churn.png");
        super::plot::panels(
            &png,
            &format!("{} sinks added and removed per round, one API call each, under a stream", a.churn_sinks),
            "round",
            false,
            &[
                super::plot::Panel { y_label: "relay resident memory (MiB)", series: churn_rss, log_y: false },
                super::plot::Panel { y_label: "relay open files", series: churn_fds, log_y: false },
            ],
        )?;
        println!("PNG: {}", png.display());
    }
    Ok(())
}
