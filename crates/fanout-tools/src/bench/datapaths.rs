//! `fanout bench datapaths`: relay CPU per delivered packet for each data path, side by side
//! in one run. The relay runs as its own process (its CPU is read from /proc/<pid>/stat);
//! this process sends the stream (on a thread of its own) and drains the sinks.
//!
//! Fairness beside cost: each packet carries its send time, each sink's socket has the kernel
//! stamp its arrival, and each round reports the spread of the sinks' mean latencies (the
//! share within ±20% of the median; a fixed send order makes the last sink wait for all the
//! others).
//!
//! Two costs per delivered packet: the relay process's CPU, and the path's CPU: the relay's
//! plus the sending thread's plus the kernel's softirq threads'. The second is the fair one
//! for `kernel`, whose fan-out runs in softirq context on the sender's time, not the relay's.

use super::{process_cpu_s, softirqd_cpu_s, thread_cpu_s, PrivateNetns, RelayProc, SysCounts};
use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;
use std::io::Write;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CPU ticks (10 ms) a figure needs: its resolution is then 2% or better.
const MIN_TICKS: f64 = 50.0;

#[derive(Args)]
pub struct BenchArgs {
    /// Data paths to compare, in the order each round runs them; `shared:connected` is the
    /// shared path with a connected socket per UDP sink, `uring:sqpoll` the uring path with
    /// a kernel submission-polling thread. A suffix `@all` or `@t0` sends a layered stream
    /// (SVC NAL units of temporal layers 0, 1, 2 in turn) with every sink capped through the
    /// API: `@all` at every layer (each packet renumbered, none dropped), `@t0` at the
    /// temporal base (two in three dropped); `@none` is the same stream uncapped. An option
    /// `:paged` sends datagrams whose payload lies in page fragments, as a NIC's driver
    /// hands a received one up, instead of the one linear buffer a local sender's is.
    #[arg(long, value_delimiter = ',', default_value = "daemon,copy,shared,shared:connected,uring,uring:sqpoll")]
    datapath: Vec<String>,
    /// UDP sinks of the session.
    #[arg(long, default_value_t = 1000)]
    sinks: usize,
    #[command(flatten)]
    load: super::Load,
    /// Rounds: the data paths alternate, so drift on a noisy machine hits all alike.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A short run (one round of 3 s, 100 sinks) that checks the bench works; CI runs it.
    #[arg(long)]
    quick: bool,
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Another build of `fanout` to measure beside this one: each data path runs on both,
    /// alternating, its rows labelled `… (baseline)`.
    #[arg(long)]
    baseline: Option<PathBuf>,
}

/// What a baseline build's rows are labelled with.
const BASELINE: &str = " (baseline)";

/// Where a packet carries its send time: after the RTP header and SVC prefix of a layered
/// one, and at the same place in a plain one.
const STAMP_AT: usize = 16;

/// Writes the real-time clock into the payload (the receive side's kernel stamps use it too).
fn stamp(payload: &mut [u8]) {
    if payload.len() < STAMP_AT + 8 {
        return;
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    payload[STAMP_AT..STAMP_AT + 8].copy_from_slice(&(now.as_nanos() as u64).to_le_bytes());
}

/// The send time a received packet carries.
fn sent_at(p: &[u8]) -> Option<u64> {
    let t = u64::from_le_bytes(p.get(STAMP_AT..STAMP_AT + 8)?.try_into().ok()?);
    // Within a day of now: a real stamp.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as u64;
    (now.abs_diff(t) < 86_400_000_000_000).then_some(t)
}

fn snapshot(lat: &[(AtomicU64, AtomicU64)]) -> Vec<(u64, u64)> {
    lat.iter().map(|(s, c)| (s.load(Ordering::Relaxed), c.load(Ordering::Relaxed))).collect()
}

/// The spread of the sinks' mean latencies over a round.
struct Spread {
    median_us: f64,
    min_us: f64,
    max_us: f64,
    /// The share of sinks whose mean is within ±20% of the median.
    within_20pct: f64,
}

impl Spread {
    fn of(before: &[(u64, u64)], after: &[(u64, u64)]) -> Self {
        let mut means: Vec<f64> = before
            .iter()
            .zip(after)
            .filter(|(b, a)| a.1 > b.1)
            .map(|(b, a)| (a.0 - b.0) as f64 / (a.1 - b.1) as f64 / 1e3)
            .collect();
        if means.is_empty() {
            return Self { median_us: f64::NAN, min_us: f64::NAN, max_us: f64::NAN, within_20pct: 0.0 };
        }
        means.sort_by(f64::total_cmp);
        let median = means[means.len() / 2];
        let within = means.iter().filter(|&&m| (m - median).abs() <= 0.2 * median).count();
        Self {
            median_us: median,
            min_us: means[0],
            max_us: means[means.len() - 1],
            within_20pct: within as f64 / means.len() as f64,
        }
    }
}

pub fn run(mut a: BenchArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.rounds, a.load.seconds, a.sinks) = (1, 3.0, 100);
    }
    let nofile = fanout_io::sys::raise_nofile_limit(a.sinks as u64 + 64);
    if (nofile as usize) < a.sinks + 64 {
        bail!(
            "{} sinks need {} open files; the limit here is {nofile} (raise it with ulimit -n)",
            a.sinks,
            a.sinks + 64
        );
    }
    // Before any thread or process starts, so they all live in the namespace.
    let _netns = match a.datapath.iter().any(|d| d.starts_with("kernel")) {
        true => Some(PrivateNetns::enter((a.sinks as u64 * 2).max(10_000))?),
        false => None,
    };
    let relay = RelayProc::start(&[])?;
    let base = match &a.baseline {
        Some(b) if !b.is_file() => bail!("--baseline {}: no such file", b.display()),
        Some(b) => Some(RelayProc::start_bin(b, &[])?),
        None => None,
    };
    // Each data path on this build, then on the baseline's, in every round.
    let builds: Vec<(&str, &RelayProc)> =
        std::iter::once(("", &relay)).chain(base.iter().map(|b| (BASELINE, b))).collect();
    let labels: Vec<String> =
        a.datapath.iter().flat_map(|dp| builds.iter().map(move |(suffix, _)| format!("{dp}{suffix}"))).collect();

    let receivers: Arc<Vec<UdpSocket>> = Arc::new(
        (0..a.sinks)
            .map(|_| {
                let s = UdpSocket::bind("127.0.0.1:0")?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .collect::<std::io::Result<_>>()?,
    );
    for r in receivers.iter() {
        fanout_io::sys::enable_rx_timestamps(r.as_raw_fd())?;
    }
    let received = Arc::new(AtomicU64::new(0));
    // Per sink: the sum of its packets' latencies (ns) and how many were stamped.
    let latency: Arc<Vec<(AtomicU64, AtomicU64)>> =
        Arc::new((0..a.sinks).map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let drain = {
        let (r, n, lat, stop) = (receivers.clone(), received.clone(), latency.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                let mut got = 0;
                for (s, (sum, count)) in r.iter().zip(lat.iter()) {
                    while let Ok((len, at)) = fanout_io::sys::recv_stamped(s.as_raw_fd(), &mut buf) {
                        got += 1;
                        if let (Some(at), Some(sent)) = (at, sent_at(&buf[..len])) {
                            sum.fetch_add(at.saturating_sub(sent), Ordering::Relaxed);
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                n.fetch_add(got, Ordering::Relaxed);
                if got == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
    };
    let pps = a.load.rate_kbps * 1000.0 / 8.0 / a.load.payload as f64;
    std::fs::create_dir_all(&a.out)?;
    let csv_path = a.out.join("datapaths.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "round,datapath,sinks,packets_sent,deliveries,loss_pct,relay_cpu_s,cpu_us_per_delivery,sender_cpu_s,softirqd_cpu_s,path_cpu_s,path_us_per_delivery,latency_median_us,latency_min_us,latency_max_us,within_20pct,syscalls_per_delivery,ctx_switches_per_s"
    )?;
    // (datapath, relay CPU, path CPU, deliveries, relay system calls, context switches/s)
    let mut results: Vec<(String, f64, f64, f64, Option<u64>, f64)> = Vec::new();
    // Per data path, each sink's mean latency in the last round.
    let mut last_latency: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for round in 1..=a.rounds {
        for (i, name_dp) in labels.iter().enumerate() {
            let on = builds[i % builds.len()].1;
            let (api, pid) = (on.client(), on.pid());
            let bare = name_dp.trim_end_matches(BASELINE);
            let (dp, cap) = match bare.split_once('@') {
                Some((dp, cap)) => (dp, Some(cap)),
                None => (bare, None),
            };
            let paged = super::has_option(dp, "paged");
            let dp = super::without_options(dp, &["paged"]);
            let pin = match cap {
                None | Some("none") => None,
                Some("all") => Some(json!({ "max": {} })),
                Some("t0") => Some(json!({ "max": { "tid": 0 } })),
                Some(c) => bail!("layer cap {c:?}: expected none, all or t0"),
            };
            let name = format!("bench{round}{i}");
            let sinks: Vec<_> =
                receivers.iter().map(|r| r.local_addr().map(|a| json!({ "udp": a }))).collect::<Result<_, _>>()?;
            let mut spec = json!({"name": name, "source": {"udp": "127.0.0.1:0"}, "sinks": sinks});
            spec.as_object_mut().expect("an object").extend(super::datapath_fields(&dp)?);
            if cap.is_some() {
                spec["video"] = json!("h264");
            }
            let v = api.call("POST", "/v1/sessions", Some(spec))?;
            if let Some(pin) = &pin {
                for s in api.call("GET", &format!("/v1/sessions/{name}/sinks"), None)?["sinks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    api.call("PUT", &format!("/v1/sessions/{name}/sinks/{}/layers", s["id"]), Some(pin.clone()))?;
                }
            }
            let src: std::net::SocketAddr = v["source"]["addr"]
                .as_str()
                .and_then(|a| a.parse().ok())
                .context("the relay did not say its address")?;
            std::thread::sleep(Duration::from_millis(300));
            let before_rx = received.load(Ordering::Relaxed);
            let before_lat = snapshot(&latency);
            let before_cpu = process_cpu_s(pid)?;
            let before_softirqd = softirqd_cpu_s();
            let counts = SysCounts::start(pid);
            let n = (pps * a.load.seconds).round() as u64;
            let payload_len = a.load.payload;
            let layered = cap.is_some();
            let sender = std::thread::spawn(move || -> std::io::Result<f64> {
                let tx = UdpSocket::bind("127.0.0.1:0")?;
                if paged {
                    crate::send_paged(&tx)?;
                }
                let mut payload = vec![0x47u8; payload_len];
                let cpu0 = thread_cpu_s();
                let start = Instant::now();
                for k in 0..n {
                    let due = start + Duration::from_secs_f64(k as f64 / pps);
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    if layered {
                        // RTP, then an SVC prefix NAL unit (type 14) of temporal layer k % 3.
                        fanout_proto::rtp::write_header(
                            &mut payload,
                            false,
                            96,
                            k as u16,
                            (k * 3000) as u32,
                            0x5356_4300,
                        );
                        payload[12..16].copy_from_slice(&[0x6e, 0x80, 0x00, ((k % 3) as u8) << 5]);
                    }
                    stamp(&mut payload);
                    tx.send_to(&payload, src)?;
                }
                Ok(thread_cpu_s() - cpu0)
            });
            let sender_cpu = sender.join().map_err(|_| anyhow::anyhow!("the sender thread panicked"))??;
            std::thread::sleep(Duration::from_millis(500));
            let counted = counts.stop();
            let cpu = process_cpu_s(pid)? - before_cpu;
            let softirqd = softirqd_cpu_s() - before_softirqd;
            let path_cpu = cpu + sender_cpu + softirqd;
            let deliveries = received.load(Ordering::Relaxed) - before_rx;
            // `@t0` keeps the packets of temporal layer 0: every third.
            let kept = if cap == Some("t0") { n.div_ceil(3) } else { n };
            let expected = kept * a.sinks as u64;
            let loss = 100.0 * (expected.saturating_sub(deliveries)) as f64 / expected as f64;
            let per = cpu * 1e6 / deliveries.max(1) as f64;
            let path_per = path_cpu * 1e6 / deliveries.max(1) as f64;
            let after_lat = snapshot(&latency);
            let spread = Spread::of(&before_lat, &after_lat);
            if round == a.rounds {
                // Each sink's mean latency in the last round, in the order the sinks were added.
                let mut f = std::fs::File::create(
                    a.out.join(format!("latency-{}.csv", name_dp.replace([':', ' ', '(', ')'], "_"))),
                )?;
                writeln!(f, "sink,mean_latency_us")?;
                let mut pts = Vec::new();
                for (k, (b, x)) in before_lat.iter().zip(&after_lat).enumerate().filter(|(_, (b, x))| x.1 > b.1) {
                    let us = (x.0 - b.0) as f64 / (x.1 - b.1) as f64 / 1e3;
                    writeln!(f, "{k},{us:.1}")?;
                    pts.push((k as f64, us));
                }
                last_latency.push((name_dp.clone(), pts));
            }
            let syscalls = counted.syscalls.map(|c| c as f64 / deliveries.max(1) as f64);
            let calls = syscalls.map_or("".into(), |c| format!("{c:.4}"));
            writeln!(
                csv,
                "{round},{name_dp},{},{n},{deliveries},{loss:.3},{cpu:.3},{per:.3},{sender_cpu:.3},{softirqd:.3},{path_cpu:.3},{path_per:.3},{:.1},{:.1},{:.1},{:.3},{calls},{:.0}",
                a.sinks, spread.median_us, spread.min_us, spread.max_us, spread.within_20pct, counted.switches_per_s
            )?;
            eprintln!(
                "round {round}/{}: {name_dp:>7}: {deliveries} deliveries, loss {loss:.2}%, relay CPU {cpu:.2} s ({per:.3} µs/delivery), path CPU {path_cpu:.2} s ({path_per:.3} µs/delivery); relay system calls per delivery {}, context switches {:.0}/s; sinks' mean latency {:.0}..{:.0} µs, median {:.0}, {:.1}% within ±20%",
                a.rounds, if calls.is_empty() { "? (no perf)" } else { &calls }, counted.switches_per_s, spread.min_us, spread.max_us, spread.median_us, 100.0 * spread.within_20pct
            );
            results.push((name_dp.clone(), cpu, path_cpu, deliveries as f64, counted.syscalls, counted.switches_per_s));
            api.call("DELETE", &format!("/v1/sessions/{name}"), None)?;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = drain.join();
    println!(
        "\n{:>26}  {:>22}  {:>9}  {:>21}  {:>9}  {:>17}  {:>14}",
        "datapath",
        "relay µs per delivery",
        "vs first",
        "path µs per delivery",
        "vs first",
        "syscalls/delivery",
        "ctx switches/s"
    );
    let mut first = None;
    // Too little CPU to measure (short or tiny runs) gives no ratio rather than NaN.
    let ratio = |x: f64, base: f64| if base > 0.0 { format!("{:.2}x", x / base) } else { "-".into() };
    // CPU time comes in 10 ms ticks: below MIN_TICKS a figure would be the tick, not the path.
    let (mut short, mut rows) = (false, Vec::new());
    for dp in &labels {
        let mine: Vec<_> = results.iter().filter(|r| &r.0 == dp).collect();
        let (cpu, path, del) = mine.iter().fold((0.0, 0.0, 0.0), |acc, r| (acc.0 + r.1, acc.1 + r.2, acc.2 + r.3));
        let calls: Option<u64> = mine.iter().map(|r| r.4).sum();
        let calls = calls.map_or("?".into(), |c| format!("{:.4}", c as f64 / del.max(1.0)));
        let switches = mine.iter().map(|r| r.5).sum::<f64>() / mine.len().max(1) as f64;
        let measurable = |s: f64| s * 100.0 >= MIN_TICKS;
        short |= !measurable(cpu) || !measurable(path);
        let per = measurable(cpu).then(|| cpu * 1e6 / del.max(1.0));
        let path_per = measurable(path).then(|| path * 1e6 / del.max(1.0));
        rows.push((dp, per, path_per, calls, switches));
    }
    let fig = |v: Option<f64>| v.map_or("too short".into(), |v| format!("{v:.3}"));
    for (dp, per, path_per, calls, switches) in rows {
        let (b, bp) = *first.get_or_insert((per.unwrap_or(0.0), path_per.unwrap_or(0.0)));
        let r = |v: Option<f64>, base| v.map_or("-".into(), |v| ratio(v, base));
        println!(
            "{dp:>26}  {:>22}  {:>9}  {:>21}  {:>9}  {calls:>17}  {switches:>14.0}",
            fig(per),
            r(per, b),
            fig(path_per),
            r(path_per, bp)
        );
    }
    if base.is_some() {
        // This build against the baseline, per data path: the figure the run is for.
        let per = |label: &str| {
            let mine: Vec<_> = results.iter().filter(|r| r.0 == label).collect();
            let (cpu, del) = mine.iter().fold((0.0, 0.0), |acc, r| (acc.0 + r.1, acc.1 + r.3));
            (cpu * 100.0 >= MIN_TICKS).then(|| cpu * 1e6 / del.max(1.0))
        };
        println!();
        for dp in &a.datapath {
            if let (Some(now), Some(was)) = (per(dp), per(&format!("{dp}{BASELINE}"))) {
                println!("{dp:>26}: relay µs per delivery {now:.3} here, {was:.3} on the baseline: {:.2}x", now / was);
            }
        }
    }
    if short {
        println!(
            "\n\"too short\": under {MIN_TICKS} CPU ticks (10 ms each) in all rounds; run longer (--seconds, --rounds) for a figure"
        );
    }
    // Each data path's cost per round, relay and whole path side by side.
    let series = |path: bool| -> Vec<(String, Vec<(f64, f64)>)> {
        labels
            .iter()
            .map(|dp| {
                let pts = results
                    .iter()
                    .filter(|r| &r.0 == dp)
                    .enumerate()
                    .map(|(i, r)| ((i + 1) as f64, (if path { r.2 } else { r.1 }) * 1e6 / r.3.max(1.0)))
                    .collect();
                (dp.clone(), pts)
            })
            .collect()
    };
    let png = a.out.join("datapaths.png");
    super::plot::panels(
        &png,
        &format!("CPU per delivered packet, {} UDP sinks", a.sinks),
        "round",
        false,
        &[
            super::plot::Panel { y_label: "relay µs per delivery", series: series(false), log_y: false },
            super::plot::Panel { y_label: "path µs per delivery", series: series(true), log_y: false },
        ],
    )?;
    let lat_png = a.out.join("latency.png");
    super::plot::panels(
        &lat_png,
        &format!("Mean latency per sink, {} UDP sinks (last round)", a.sinks),
        "sink",
        false,
        &[super::plot::Panel {
            y_label: "mean latency µs (kernel receive stamp − send time)",
            series: last_latency,
            log_y: false,
        }],
    )?;
    println!("\nCSV: {}\nPNG: {}\n     {}", csv_path.display(), png.display(), lat_png.display());
    drop((relay, base));
    Ok(())
}
