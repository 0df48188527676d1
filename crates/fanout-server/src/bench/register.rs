//! `bench register`: sinks added to one session one API call at a time, as `sub` and an
//! operator's scripts add them. Each thousand must take as long as the first: a cost that
//! grew with the sinks already there would make tens of thousands take minutes.

use super::{ensure_dir, progress, PrivateNetns, RelayProc};
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
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out/register")]
    out: PathBuf,
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
    for (k, dp) in a.datapath.iter().enumerate() {
        let name = format!("register{k}");
        let mut spec = json!({ "name": name, "source": { "udp": "127.0.0.1:0" } });
        spec.as_object_mut().expect("an object").extend(super::datapath_fields(dp)?);
        api.call("POST", "/v1/sessions", Some(spec))?;
        pb.set_message(format!("{dp}"));
        let (mut total, mut per) = (Vec::new(), Vec::new());
        let t0 = Instant::now();
        let mut last = t0;
        for i in 0..a.sinks {
            api.call("POST", &format!("/v1/sessions/{name}/sinks"), Some(json!({ "udp": sink_addr(i) })))?;
            if (i + 1) % 1000 == 0 || i + 1 == a.sinks {
                let now = Instant::now();
                let (s, ms) = ((now - t0).as_secs_f64(), (now - last).as_secs_f64() * 1e3 * 1000.0 / ((i % 1000) + 1) as f64);
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
            super::plot::Panel { y_label: "seconds so far", series: total_series },
            super::plot::Panel { y_label: "ms per thousand sinks", series: per_series },
        ],
    )?;
    println!("CSV: {}\nPNG: {}", csv_path.display(), png.display());
    Ok(())
}
