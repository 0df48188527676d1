//! The OMSS evaluation on today's Linux: bulk fan-out, payload size, and overload with
//! priority classes. Each step creates its sessions on a fresh relay API, starts `sub`
//! (which registers the subscribers), meters the relay while `gen` sends, then reads the
//! subscribers' report.

use super::plot::{self, Panel};
use super::wire::WireSinks;
use super::{
    children_cpu_s, ensure_dir, progress, run_tool, start_sub, wait, Meter, Metered, PrivateNetns, Proc, RelayProc,
};
use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
    /// A UDP source, HTTP subscribers.
    Http,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "udp" => Ok(Transport::Udp),
            "tcp" => Ok(Transport::Tcp),
            "http" => Ok(Transport::Http),
            _ => Err(format!("transport {s:?}: expected udp, tcp or http")),
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Http => "http",
        })
    }
}

struct SessionPlan {
    name: String,
    datapath: String,
    priority: u8,
    /// Ring capacity (None: the relay's default).
    ring: Option<usize>,
}

struct StepPlan {
    sessions: Vec<SessionPlan>,
    transport: Transport,
    subscribers: usize,
    rate_kbps: f64,
    payload: usize,
    seconds: f64,
    /// Busy share of each background burner (0 = none).
    background: f64,
    burners: usize,
}

struct StepResult {
    meter: Metered,
    /// Per session, in plan order: the `sub` group report.
    groups: Vec<Value>,
    deliveries: u64,
    /// The busiest of `sub`'s receiving threads, percent of a core.
    sub_busy_pct: f64,
    /// Datagrams dropped at the subscribers' full receive buffers: `sub`'s loss, not the
    /// relay's.
    rcvbuf_errors: u64,
    /// Packets the kernel dropped at full per-CPU backlogs (`/proc/net/softnet_stat`, the
    /// whole machine): where the `kernel` path's clones are lost when one CPU makes them all.
    backlog_drops: u64,
    /// Per session, in plan order: the relay's status of it at the end.
    status: Vec<Value>,
    /// Packets `gen` sent to each session.
    sent_per_stream: u64,
}

impl StepResult {
    fn us_per_delivery(&self) -> f64 {
        self.meter.relay_cpu_s * 1e6 / self.deliveries.max(1) as f64
    }
    fn path_us_per_delivery(&self) -> f64 {
        self.meter.path_cpu_s * 1e6 / self.deliveries.max(1) as f64
    }
    fn loss_pct(&self) -> f64 {
        let (lost, exp) = self.groups.iter().fold((0.0, 0.0), |a, g| {
            (a.0 + g["lost"].as_f64().unwrap_or(0.0), a.1 + g["expected"].as_f64().unwrap_or(0.0))
        });
        if exp > 0.0 {
            100.0 * lost / exp
        } else {
            100.0
        }
    }
    /// Loss of the `k`th session's subscribers against what `gen` sent: a subscriber's own
    /// count misses a tail it never saw (a session shed to the end).
    fn sent_loss_pct(&self, k: usize, subscribers: usize) -> f64 {
        let received = self.groups.get(k).and_then(|g| g["received"].as_u64()).unwrap_or(0);
        let expected = (self.sent_per_stream * subscribers as u64).max(1);
        100.0 * expected.saturating_sub(received) as f64 / expected as f64
    }
    fn worst(&self, key: &str) -> f64 {
        self.groups.iter().filter_map(|g| g[key].as_f64()).fold(0.0, f64::max)
    }
}

/// Runs one step: its subscribers are `sub` processes' sockets, or with `wire` the wire
/// sinks (UDP only, see [`WireSinks`]).
fn run_step(
    relay: &RelayProc,
    plan: &StepPlan,
    tmp: &Path,
    mut wire: Option<&mut WireSinks>,
) -> anyhow::Result<StepResult> {
    let api = relay.client();
    let mut sources: Vec<SocketAddr> = Vec::new();
    for s in &plan.sessions {
        // The relay binds a free port itself and says which (no race for a port chosen here).
        let spec = match plan.transport {
            Transport::Udp | Transport::Http => json!({ "udp": "127.0.0.1:0" }),
            Transport::Tcp => json!({ "tcp_listen": "127.0.0.1:0" }),
        };
        let mut body = json!({"name": s.name, "source": spec, "priority": s.priority, "ring": s.ring});
        // `:rps`: lo's receive steering for this step (see `set_lo_rps`), not a session field;
        // `:spread` needs it too.
        let rps = super::has_option(&s.datapath, "rps") || super::has_option(&s.datapath, "spread");
        if rps || s.datapath.starts_with("kernel") {
            super::set_lo_rps(rps)?;
        }
        // `:paged`: how `gen` sends (see `gen --paged`), not a session field either.
        let dp = super::without_options(&s.datapath, &["rps", "paged"]);
        body.as_object_mut().expect("an object").extend(super::datapath_fields(&dp)?);
        let v = api.call("POST", "/v1/sessions", Some(body))?;
        let src =
            v["source"]["addr"].as_str().and_then(|a| a.parse().ok()).context("the relay did not say its address")?;
        sources.push(src);
    }
    let result = (|| -> anyhow::Result<StepResult> {
        let mut sub_args: Vec<String> = vec!["--api".into(), format!("http://{}", relay.api)];
        for s in &plan.sessions {
            sub_args.extend(["--session".into(), s.name.clone()]);
        }
        let kind = match plan.transport {
            Transport::Udp => "--udp",
            Transport::Tcp => "--tcp",
            Transport::Http => "--http",
        };
        sub_args.extend([
            "--record".into(),
            plan.payload.to_string(),
            "--duration".into(),
            (plan.seconds + 60.0).to_string(),
            "--idle-exit".into(),
            "1.5".into(),
        ]);
        // As many `sub` processes as the open-file limit asks for (one socket per subscriber).
        let files = (fanout_io::sys::raise_nofile_limit(0) as usize).saturating_sub(128).max(1);
        let per_proc = (files / plan.sessions.len().max(1)).max(1);
        let procs = plan.subscribers.div_ceil(per_proc).max(1);
        let n = plan.subscribers * plan.sessions.len();
        let mut subs = Vec::new();
        let mut json_paths = Vec::new();
        if let Some(w) = wire.as_deref_mut() {
            w.reset(n)?;
            for (k, s) in plan.sessions.iter().enumerate() {
                for i in 0..plan.subscribers {
                    let addr = WireSinks::addr(k * plan.subscribers + i).to_string();
                    api.call("POST", &format!("/v1/sessions/{}/sinks", s.name), Some(json!({ "udp": addr })))?;
                }
            }
        }
        for p in (0..procs).filter(|_| wire.is_none()) {
            let count = plan.subscribers / procs + usize::from(p < plan.subscribers % procs);
            let json_path = tmp.join(format!("sub-{p}.json"));
            let _ = std::fs::remove_file(&json_path);
            let mut args = sub_args.clone();
            args.extend([kind.into(), count.to_string(), "--json".into(), json_path.display().to_string()]);
            subs.push(start_sub(&args, Duration::from_secs(30 + count as u64 / 50))?);
            json_paths.push(json_path);
        }
        let _burners: Vec<Proc> = if plan.background > 0.0 {
            (0..plan.burners)
                .map(|_| {
                    Command::new(std::env::current_exe()?)
                        .args(["bench", "burn", "--duty", &plan.background.to_string(), "--seconds"])
                        .arg((plan.seconds + 5.0).to_string())
                        .stdout(Stdio::null())
                        .spawn()
                        .map(Proc)
                        .map_err(anyhow::Error::from)
                })
                .collect::<anyhow::Result<_>>()?
        } else {
            Vec::new()
        };
        let mut gen_args: Vec<String> = vec!["gen".into()];
        for s in &sources {
            gen_args.extend(["--to".into(), s.to_string()]);
        }
        gen_args.extend([
            "--rate-kbps".into(),
            plan.rate_kbps.to_string(),
            "--payload".into(),
            plan.payload.to_string(),
            "--duration".into(),
            plan.seconds.to_string(),
        ]);
        if plan.transport == Transport::Tcp {
            gen_args.push("--tcp".into());
        }
        if plan.sessions.iter().any(|s| super::has_option(&s.datapath, "paged")) {
            gen_args.push("--paged".into());
        }
        let gen_json = tmp.join("gen.json");
        gen_args.extend(["--json".into(), gen_json.display().to_string()]);
        let meter = Meter::start(relay.pid())?;
        let backlog0 = backlog_drops();
        // gen is the only child reaped meanwhile: the growth of the children's CPU is its.
        let children0 = children_cpu_s();
        run_tool(&gen_args, Duration::from_secs_f64(plan.seconds + 30.0))?;
        let gen_cpu = children_cpu_s() - children0;
        std::thread::sleep(Duration::from_millis(300));
        let m = meter.stop(gen_cpu)?;
        let backlog_drops = backlog_drops().saturating_sub(backlog0);
        let gen: Value = serde_json::from_slice(&std::fs::read(&gen_json).context("reading gen's report")?)?;
        let _ = std::fs::remove_file(&gen_json);
        let sent_per_stream = gen["packets"].as_u64().unwrap_or(0) / gen["streams"].as_u64().unwrap_or(1).max(1);
        let (mut groups, mut sub_busy_pct, mut rcvbuf_errors) = (Vec::new(), 0.0f64, 0);
        if let Some(w) = wire.as_deref() {
            // Clones still queued at the knee arrive hundreds of ms late: read once the
            // count stops growing.
            let mut c = w.read(n)?;
            for _ in 0..25 {
                std::thread::sleep(Duration::from_millis(200));
                let again = w.read(n)?;
                let settled = again.received == c.received;
                c = again;
                if settled {
                    break;
                }
            }
            let expected = sent_per_stream * n as u64;
            if c.stray > 0 {
                eprintln!("wire sinks: {} datagrams reached the wire for no sink", c.stray);
            }
            if c.reordered > 0 || c.fewest < sent_per_stream {
                eprintln!(
                    "wire sinks: {} datagrams arrived out of order; the fewest one sink got: {} of {sent_per_stream}",
                    c.reordered, c.fewest
                );
            }
            groups.push(json!({
                "received": c.received,
                "expected": expected,
                "lost": expected.saturating_sub(c.received),
                "reordered": c.reordered,
                "fewest_per_sink": c.fewest,
                "latency_p50_us": c.latency_p50_us,
                "latency_p99_us": c.latency_p99_us,
            }));
        }
        for (sub, json_path) in subs.iter_mut().zip(&json_paths) {
            wait(sub, Duration::from_secs(30 + n as u64 / 100))?;
            let report: Value = serde_json::from_slice(&std::fs::read(json_path).context("reading sub's report")?)?;
            // A scratch file: the CSV and the plot are the results.
            let _ = std::fs::remove_file(json_path);
            // Each process's rows count its own subscribers: together, all of them.
            groups.extend(report["groups"].as_array().cloned().unwrap_or_default());
            let busy = report["thread_busy_pct"].as_array().into_iter().flatten().filter_map(Value::as_f64);
            sub_busy_pct = busy.fold(sub_busy_pct, f64::max);
            // The namespace's count, the same for every process.
            rcvbuf_errors = rcvbuf_errors.max(report["rcvbuf_errors"].as_u64().unwrap_or(0));
        }
        let deliveries = groups.iter().filter_map(|g| g["received"].as_u64()).sum();
        Ok(StepResult {
            meter: m,
            groups,
            deliveries,
            sub_busy_pct,
            rcvbuf_errors,
            backlog_drops,
            status: Vec::new(),
            sent_per_stream,
        })
    })();
    let result = result.map(|mut r| {
        let get = |s: &SessionPlan| api.call("GET", &format!("/v1/sessions/{}", s.name), None).unwrap_or(Value::Null);
        r.status = plan.sessions.iter().map(get).collect();
        r
    });
    for s in &plan.sessions {
        let _ = api.call("DELETE", &format!("/v1/sessions/{}", s.name), None);
    }
    result
}

/// Packets dropped at full per-CPU backlogs so far, all CPUs (`/proc/net/softnet_stat`,
/// second column, hexadecimal).
fn backlog_drops() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/net/softnet_stat") else { return 0 };
    s.lines().filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok()).sum()
}

fn csv_file(out: &Path, name: &str, header: &str) -> anyhow::Result<(std::fs::File, PathBuf)> {
    ensure_dir(out)?;
    let p = out.join(name);
    let mut f = std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    writeln!(f, "{header}")?;
    Ok((f, p))
}

#[derive(Args)]
pub struct BulkArgs {
    /// Data paths to sweep, with the session options of `bench datapaths`; two more steer
    /// the bench: `:rps` spreads lo's receive work over the CPUs, `:paged` has `gen` send
    /// datagrams whose payload lies in page fragments (as a NIC hands them up).
    #[arg(long, value_delimiter = ',', default_value = "daemon,copy,shared")]
    datapath: Vec<String>,
    /// Transports to sweep: `udp` and `tcp` (source and sinks alike), `http` (a UDP source,
    /// HTTP subscribers).
    #[arg(long, value_delimiter = ',', default_value = "udp,tcp")]
    transport: Vec<Transport>,
    /// Subscriber counts to step through.
    #[arg(long, value_delimiter = ',', default_value = "100,250,500,1000,2000,4000")]
    steps: Vec<usize>,
    #[command(flatten)]
    load: super::Load,
    /// A data path's sweep stops at the first step with more loss than this (percent).
    #[arg(long, default_value_t = 1.0)]
    max_loss: f64,
    /// The subscribers: `sockets` (`sub` processes on loopback, whose receiving shares the
    /// machine with the relay) or `wire` (UDP only: destinations behind a veth, counted where
    /// the datagrams arrive, no socket; needs root, see bench/wire.rs).
    #[arg(long, value_enum, default_value_t = Sinks::Sockets)]
    sinks: Sinks,
    /// A short run (2 steps, 3 s) that checks the tools work; CI runs it.
    #[arg(long)]
    quick: bool,
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out/bulk")]
    out: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Sinks {
    Sockets,
    Wire,
}

pub fn bulk(mut a: BulkArgs) -> anyhow::Result<()> {
    if a.quick {
        a.steps = vec![20, 60];
        a.load.seconds = 3.0;
    }
    let wire = a.sinks == Sinks::Wire;
    if wire {
        a.transport.retain(|t| *t == Transport::Udp);
        if a.transport.is_empty() {
            anyhow::bail!("--sinks wire counts UDP datagrams: add udp to --transport");
        }
    }
    let most = a.steps.iter().max().copied().unwrap_or(0);
    // Before the relay starts, so it and every tool live in the namespace.
    // `:rps` changes lo's steering: only ever inside the private namespace.
    let _netns = match wire || a.datapath.iter().any(|d| d.starts_with("kernel") || super::has_option(d, "rps")) {
        true => Some(PrivateNetns::enter((most as u64 * 2).max(10_000))?),
        false => None,
    };
    let mut wire = if wire { Some(WireSinks::setup(most)?) } else { None };
    let relay = RelayProc::start(&[])?;
    let (mut csv, csv_path) = csv_file(
        &a.out,
        "bulk.csv",
        "datapath,transport,subscribers,relay_cpu_pct,machine_cpu_pct,cpu_us_per_delivery,deliveries_per_s,loss_pct,latency_p50_us,latency_p99_us,jitter_ms,path_cpu_pct,path_us_per_delivery,sub_busy_pct,sub_rcvbuf_drops,backlog_drops,machine_us_per_delivery,sinks",
    )?;
    // The kernel path clones datagrams: it has no TCP form (its TCP sinks are `shared`'s).
    let combos: Vec<(String, Transport)> = a
        .transport
        .iter()
        .flat_map(|t| a.datapath.iter().map(move |d| (d.clone(), *t)))
        .filter(|(d, t)| !(d.starts_with("kernel") && *t == Transport::Tcp))
        .collect();
    let mut pb = progress((combos.len() * a.steps.len()) as u64, "bench bulk");
    let mut cpu_series = Vec::new();
    let mut per_series = Vec::new();
    let mut path_series = Vec::new();
    let (mut machine_series, mut p99_series) = (Vec::new(), Vec::new());
    let mut loss_series = Vec::new();
    let mut capacity = Vec::new();
    for (k, (dp, t)) in combos.iter().enumerate() {
        let (mut cpu, mut per, mut path_per, mut losses) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut machine_per, mut p99) = (Vec::new(), Vec::new());
        let mut cap = 0;
        for (i, &n) in a.steps.iter().enumerate() {
            pb.set_message(format!("{dp}/{t} {n} subscribers{}", if wire.is_some() { " (wire)" } else { "" }));
            let most = fanout_io::kernel::MAX_SESSION_SINKS;
            if dp.starts_with("kernel") && n > most {
                pb.println(format!(
                    "*** {dp}/{t} {n}: the kernel path holds {most} sinks a session; the other {} are served from \
                     user space, and this step measures both ***",
                    n - most
                ));
            }
            let plan = StepPlan {
                sessions: vec![SessionPlan {
                    name: format!("bulk{k}x{i}"),
                    datapath: dp.clone(),
                    priority: 0,
                    ring: None,
                }],
                transport: *t,
                subscribers: n,
                rate_kbps: a.load.rate_kbps,
                payload: a.load.payload,
                seconds: a.load.seconds,
                background: 0.0,
                burners: 0,
            };
            let r = run_step(&relay, &plan, &a.out, wire.as_mut())?;
            pb.inc(1);
            let loss = r.loss_pct();
            writeln!(
                csv,
                "{dp},{t},{n},{:.2},{:.2},{:.3},{:.0},{:.3},{},{},{:.3},{:.2},{:.3},{:.0},{},{},{:.3},{}",
                r.meter.relay_cpu_pct,
                r.meter.machine_pct,
                r.us_per_delivery(),
                r.deliveries as f64 / a.load.seconds,
                loss,
                r.worst("latency_p50_us"),
                r.worst("latency_p99_us"),
                r.worst("jitter_ms_mean"),
                r.meter.path_cpu_pct,
                r.path_us_per_delivery(),
                r.sub_busy_pct,
                r.rcvbuf_errors,
                r.backlog_drops,
                r.meter.machine_busy_s * 1e6 / r.deliveries.max(1) as f64,
                if wire.is_some() { "wire" } else { "sockets" },
            )?;
            pb.println(format!(
                "{dp}/{t} {n}: loss {loss:.3}%, relay CPU {:.1}%, path {:.3} µs per delivery, machine {:.0}% busy ({:.3} µs per delivery); drops at full backlogs {}, at subscribers' receive buffers {} (sub's busiest thread {:.0}%)",
                r.meter.relay_cpu_pct,
                r.path_us_per_delivery(),
                r.meter.machine_pct,
                r.meter.machine_busy_s * 1e6 / r.deliveries.max(1) as f64,
                r.backlog_drops,
                r.rcvbuf_errors,
                r.sub_busy_pct
            ));
            if r.rcvbuf_errors > 0 || r.sub_busy_pct > 90.0 {
                pb.println(format!("*** {dp}/{t} {n}: the load tool, not the relay, is the limit here ***"));
            } else if r.meter.machine_pct > 95.0 {
                // Receiving sockets cost their softirq work to whichever CPU: no thread of sub's
                // shows it, the machine does.
                pb.println(format!(
                    "*** {dp}/{t} {n}: the machine is {:.0}% busy; the relay shares it with the load tools (--sinks wire leaves them out) ***",
                    r.meter.machine_pct
                ));
            }
            losses.push((n as f64, loss));
            cpu.push((n as f64, r.meter.relay_cpu_pct));
            per.push((n as f64, r.us_per_delivery()));
            path_per.push((n as f64, r.path_us_per_delivery()));
            machine_per.push((n as f64, r.meter.machine_busy_s * 1e6 / r.deliveries.max(1) as f64));
            p99.push((n as f64, r.worst("latency_p99_us") / 1000.0));
            if loss > a.max_loss {
                pb.println(format!("{dp}/{t}: {loss:.2}% loss at {n} subscribers: sweep stops"));
                for _ in i + 1..a.steps.len() {
                    pb.inc(1);
                }
                break;
            }
            cap = n;
        }
        capacity.push(format!("{dp}/{t}: {cap} subscribers with ≤ {}% loss", a.max_loss));
        cpu_series.push((format!("{dp}/{t}"), cpu));
        per_series.push((format!("{dp}/{t}"), per));
        path_series.push((format!("{dp}/{t}"), path_per));
        machine_series.push((format!("{dp}/{t}"), machine_per));
        loss_series.push((format!("{dp}/{t}"), losses));
        p99_series.push((format!("{dp}/{t}"), p99));
    }
    pb.finish_and_clear();
    let png = a.out.join("bulk.png");
    plot::panels(
        &png,
        &format!("Bulk fan-out: 1 source, N subscribers, {} kbit/s, {} B", a.load.rate_kbps, a.load.payload),
        "subscribers",
        false,
        &[
            Panel { y_label: "relay CPU (% of one core)", series: cpu_series, log_y: false },
            Panel { y_label: "relay CPU per delivered packet (µs)", series: per_series, log_y: false },
            Panel { y_label: "path CPU per delivered packet (µs, incl. softirq)", series: path_series, log_y: false },
            Panel { y_label: "whole machine busy per delivered packet (µs)", series: machine_series, log_y: false },
            Panel { y_label: "loss (%)", series: loss_series, log_y: false },
            Panel { y_label: "latency p99 (ms, worst group, log scale)", series: p99_series, log_y: true },
        ],
    )?;
    for c in &capacity {
        println!("{c}");
    }
    println!("CSV: {}\nPNG: {}", csv_path.display(), png.display());
    Ok(())
}

#[derive(Args)]
pub struct PayloadArgs {
    /// Data paths to compare.
    #[arg(long, value_delimiter = ',', default_value = "daemon,copy,shared")]
    datapath: Vec<String>,
    /// Payload sizes in bytes (RTP header included).
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512,1024,1400")]
    sizes: Vec<usize>,
    /// UDP subscribers of the session.
    #[arg(long, default_value_t = 800)]
    subscribers: usize,
    /// Bit rate of the stream, kbit/s.
    #[arg(long, default_value_t = 256.0)]
    rate_kbps: f64,
    /// Seconds of sending per step.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// A short run that checks the tools work (under two minutes); CI runs it.
    #[arg(long)]
    quick: bool,
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out/payload")]
    out: PathBuf,
}

pub fn payload(mut a: PayloadArgs) -> anyhow::Result<()> {
    if a.quick {
        a.sizes = vec![64, 1400];
        a.subscribers = 50;
        a.seconds = 3.0;
    }
    let relay = RelayProc::start(&[])?;
    let (mut csv, csv_path) = csv_file(
        &a.out,
        "payload.csv",
        "datapath,payload,subscribers,relay_cpu_pct,machine_cpu_pct,cpu_us_per_delivery,deliveries_per_s,loss_pct,latency_p99_us",
    )?;
    let mut pb = progress((a.datapath.len() * a.sizes.len()) as u64, "bench payload");
    let (mut cpu_series, mut per_series) = (Vec::new(), Vec::new());
    for (k, dp) in a.datapath.iter().enumerate() {
        let (mut cpu, mut per) = (Vec::new(), Vec::new());
        for (i, &size) in a.sizes.iter().enumerate() {
            pb.set_message(format!("{dp} {size} B"));
            let plan = StepPlan {
                sessions: vec![SessionPlan {
                    name: format!("pay{k}x{i}"),
                    datapath: dp.clone(),
                    priority: 0,
                    ring: None,
                }],
                transport: Transport::Udp,
                subscribers: a.subscribers,
                rate_kbps: a.rate_kbps,
                payload: size,
                seconds: a.seconds,
                background: 0.0,
                burners: 0,
            };
            let r = run_step(&relay, &plan, &a.out, None)?;
            pb.inc(1);
            writeln!(
                csv,
                "{dp},{size},{},{:.2},{:.2},{:.3},{:.0},{:.3},{}",
                a.subscribers,
                r.meter.relay_cpu_pct,
                r.meter.machine_pct,
                r.us_per_delivery(),
                r.deliveries as f64 / a.seconds,
                r.loss_pct(),
                r.worst("latency_p99_us")
            )?;
            cpu.push((size as f64, r.meter.relay_cpu_pct));
            per.push((size as f64, r.us_per_delivery()));
        }
        cpu_series.push((dp.clone(), cpu));
        per_series.push((dp.clone(), per));
    }
    pb.finish_and_clear();
    let png = a.out.join("payload.png");
    plot::panels(
        &png,
        &format!("Payload size: 1 source, {} subscribers, {} kbit/s", a.subscribers, a.rate_kbps),
        "payload (bytes, log scale)",
        true,
        &[
            Panel { y_label: "relay CPU (% of one core)", series: cpu_series, log_y: false },
            Panel { y_label: "relay CPU per delivered packet (µs)", series: per_series, log_y: false },
        ],
    )?;
    println!("CSV: {}\nPNG: {}", csv_path.display(), png.display());
    Ok(())
}

#[derive(Args)]
pub struct OverloadArgs {
    /// Data path of the three sessions.
    #[arg(long, default_value = "shared")]
    datapath: String,
    /// Relay setups, side by side at every level: `default` (as shipped), `noshed` (no
    /// overload shedding), `shed:MS` (shedding after waits of MS), `nice:N`, `realtime:N`
    /// or `slice:US` (the relay's threads at that priority or time slice), `top:DATAPATH`
    /// (the top class's session on that data path, e.g. `top:kernel`); join several with
    /// `+` (`noshed+realtime:10`).
    #[arg(long, value_delimiter = ',', default_value = "default,realtime:10")]
    setups: Vec<String>,
    /// Subscribers of each of the three sessions.
    #[arg(long, default_value_t = 150)]
    subscribers: usize,
    /// Bit rate of each session: high enough that the background load starves the relay of
    /// the CPU all three sessions need, low enough that the top class alone still fits.
    #[arg(long, default_value_t = 3072.0)]
    rate_kbps: f64,
    /// Datagram payload in bytes, RTP header included.
    #[arg(long, default_value_t = 1400)]
    payload: usize,
    /// Background load levels in percent (busy share of every burner).
    #[arg(long, value_delimiter = ',', default_value = "0,25,50,75,100")]
    levels: Vec<f64>,
    /// Busy processes per core at each level, at the relay's own scheduling priority.
    #[arg(long, default_value_t = 8)]
    burners_per_core: usize,
    /// Nice value of the measuring tools (`gen`, `sub`), so the load they measure is the
    /// relay's and not theirs.
    #[arg(long, default_value_t = -10, allow_hyphen_values = true)]
    tools_nice: i32,
    /// Ring capacity of each session, in packets: what a live stream may buffer before its
    /// slowest sinks skip (128 packets = 0.5 s at 3 Mbit/s).
    #[arg(long, default_value_t = 128)]
    ring: usize,
    /// Seconds of sending per step.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// A short run (no load, then full load, 4 s each, the first setup only); CI runs it.
    #[arg(long)]
    quick: bool,
    /// Measure nothing: draw the PNG again from the CSV an earlier run left in `--out`
    /// (give the run's `--subscribers`, `--rate-kbps` and `--burners-per-core` for the title).
    #[arg(long)]
    replot: bool,
    /// Folder for the CSV and PNG.
    #[arg(long, default_value = "bench-out/overload")]
    out: PathBuf,
}

/// One line of `overload.csv`, as much of it as the plot shows.
struct OverloadPoint {
    setup: String,
    level: f64,
    burners: usize,
    class: u8,
    loss_pct: f64,
    p99_us: f64,
}

/// Reads the points of an `overload.csv` (by its header's names, so columns may be added).
fn read_overload_csv(path: &Path) -> anyhow::Result<Vec<OverloadPoint>> {
    use anyhow::Context as _;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let col = |name: &str| {
        head.iter().position(|h| *h == name).with_context(|| format!("{}: no column {name:?}", path.display()))
    };
    let (setup, level, burners, class, loss, p99) = (
        col("setup")?,
        col("background_pct")?,
        col("burners")?,
        col("class")?,
        col("loss_pct")?,
        col("latency_p99_us")?,
    );
    let mut points = Vec::new();
    for (n, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let bad = || format!("{} line {}: {line:?}", path.display(), n + 2);
        let get = |k: usize| f.get(k).copied().with_context(bad);
        points.push(OverloadPoint {
            setup: get(setup)?.to_string(),
            level: get(level)?.parse().with_context(bad)?,
            burners: get(burners)?.parse().with_context(bad)?,
            class: get(class)?.parse().with_context(bad)?,
            loss_pct: get(loss)?.parse().with_context(bad)?,
            p99_us: get(p99)?.parse().with_context(bad)?,
        });
    }
    anyhow::ensure!(!points.is_empty(), "{}: no measurements in it", path.display());
    Ok(points)
}

/// The overload plot: per setup, each class's loss by background level; then the top
/// class's p99 of every setup on a log scale.
fn plot_overload(a: &OverloadArgs, points: &[OverloadPoint]) -> anyhow::Result<PathBuf> {
    let mut setups: Vec<&str> = Vec::new();
    for p in points {
        if !setups.contains(&p.setup.as_str()) {
            setups.push(&p.setup);
        }
    }
    let series = |f: &dyn Fn(&OverloadPoint) -> bool, y: &dyn Fn(&OverloadPoint) -> f64| -> Vec<(f64, f64)> {
        points.iter().filter(|p| f(p)).map(|p| (p.level, y(p))).collect()
    };
    let titles: Vec<String> = setups.iter().map(|s| format!("loss (%), relay {s}")).collect();
    let mut panels: Vec<Panel> = setups
        .iter()
        .zip(&titles)
        .map(|(s, t)| Panel {
            y_label: t,
            series: [1u8, 2, 3]
                .iter()
                .map(|&c| (format!("class {c}"), series(&|p| p.setup == *s && p.class == c, &|p| p.loss_pct)))
                .collect(),
            log_y: false,
        })
        .collect();
    let top_p99 = setups
        .iter()
        .map(|s| (s.to_string(), series(&|p| p.setup == *s && p.class == 3, &|p| p.p99_us / 1000.0)))
        .collect();
    panels.push(Panel { y_label: "class 3 latency p99 (ms, log scale)", series: top_p99, log_y: true });
    let png = a.out.join("overload.png");
    plot::panels(
        &png,
        &format!(
            "Overload: 3 × 1-to-{} sessions at {} kbit/s, {} busy processes per core",
            a.subscribers, a.rate_kbps, a.burners_per_core
        ),
        &format!("busy share of each of {} background processes (%)", points[0].burners),
        false,
        &panels,
    )?;
    Ok(png)
}

/// A setup of `bench overload`: the relay's command-line flags, and the top class's data
/// path where it is not the bench's `--datapath`.
struct Setup {
    flags: Vec<String>,
    top_datapath: Option<String>,
}

impl Setup {
    /// Whether the top class is served by the kernel path (in softirq, not the relay's threads).
    fn top_on_kernel(&self) -> bool {
        self.top_datapath.as_deref().is_some_and(|d| d.starts_with("kernel"))
    }

    fn parse(setup: &str) -> anyhow::Result<Self> {
        let mut s = Setup { flags: Vec::new(), top_datapath: None };
        for part in setup.split('+') {
            if let Some(dp) = part.strip_prefix("top:") {
                s.top_datapath = Some(dp.to_string());
                continue;
            }
            match part {
                "default" => {}
                "noshed" => s.flags.extend(["--shed-after-ms".into(), "0".into()]),
                p if p.strip_prefix("shed:").is_some_and(|ms| ms.parse::<u64>().is_ok()) => {
                    s.flags.extend(["--shed-after-ms".into(), p["shed:".len()..].to_string()])
                }
                p if p.parse::<fanout_io::ThreadPriority>().is_ok() => {
                    s.flags.extend(["--worker-priority".into(), p.to_string()])
                }
                p => {
                    anyhow::bail!(
                        "setup {p:?}: expected default, noshed, shed:MS, nice:N, realtime:N, slice:US or top:DATAPATH"
                    )
                }
            }
        }
        Ok(s)
    }
}

pub fn overload(mut a: OverloadArgs) -> anyhow::Result<()> {
    if a.replot {
        let png = plot_overload(&a, &read_overload_csv(&a.out.join("overload.csv"))?)?;
        println!("PNG: {}", png.display());
        return Ok(());
    }
    if a.quick {
        // Still a real overload (CI asserts the classes lose in order), but short.
        a.levels = vec![0.0, 100.0];
        a.seconds = 4.0;
        a.setups.truncate(1);
    }
    // The top class's need is measured with nothing in the background.
    anyhow::ensure!(
        a.levels.first() == Some(&0.0),
        "--levels must start at 0: what the top class alone needs is measured there"
    );
    anyhow::ensure!(
        a.levels.iter().all(|l| (0.0..=100.0).contains(l)),
        "--levels are busy shares in percent, 0 to 100"
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    super::set_tools_nice(a.tools_nice);
    let setups = a.setups.iter().map(|s| Setup::parse(s)).collect::<anyhow::Result<Vec<_>>>()?;
    // The kernel path attaches to lo: a private namespace's, entered before the relays start.
    let kernel = a.datapath.starts_with("kernel") || setups.iter().any(Setup::top_on_kernel);
    let _netns = if kernel { Some(super::PrivateNetns::enter(10_000)?) } else { None };
    let relays = setups
        .iter()
        .map(|s| RelayProc::start(&s.flags.iter().map(String::as_str).collect::<Vec<_>>()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (mut csv, csv_path) = csv_file(
        &a.out,
        "overload.csv",
        "setup,background_pct,burners,class,subscribers,loss_pct,latency_p50_us,latency_p99_us,jitter_ms,relay_cpu_pct,machine_cpu_pct,top_class_need_pct,shed_packets,sub_rcvbuf_errors",
    )?;
    let mut pb = progress((a.levels.len() * relays.len()) as u64, "bench overload");
    // What the top class alone needs, % of a core, per setup: its share of the first level's
    // deliveries times the relay's CPU there (the first level is 0%: all delivered).
    let mut top_need: Vec<Option<f64>> = vec![None; relays.len()];
    let classes = [1u8, 2, 3];
    let mut points = Vec::new();
    let mut order_broken = 0;
    for (i, &level) in a.levels.iter().enumerate() {
        for (si, (setup, relay)) in a.setups.iter().zip(&relays).enumerate() {
            pb.set_message(format!("background {level}%, {setup}"));
            let plan = StepPlan {
                sessions: classes
                    .iter()
                    .map(|&c| SessionPlan {
                        name: format!("ov{i}c{c}"),
                        datapath: match &setups[si].top_datapath {
                            Some(dp) if c == 3 => dp.clone(),
                            _ => a.datapath.clone(),
                        },
                        priority: c,
                        ring: Some(a.ring),
                    })
                    .collect(),
                transport: Transport::Udp,
                subscribers: a.subscribers,
                rate_kbps: a.rate_kbps,
                payload: a.payload,
                seconds: a.seconds,
                background: level / 100.0,
                burners: a.burners_per_core * cores,
            };
            let r = run_step(relay, &plan, &a.out, None)?;
            let shed: Vec<u64> = r.status.iter().map(|s| s["source"]["shed"].as_u64().unwrap_or(0)).collect();
            pb.inc(1);
            // (A top class on the kernel path costs the relay's threads nothing: softirq serves it.)
            let need = *top_need[si].get_or_insert_with(|| {
                if setups[si].top_on_kernel() {
                    return 0.0;
                }
                let top = r.groups.get(2).and_then(|g| g["received"].as_f64()).unwrap_or(0.0);
                r.meter.relay_cpu_pct * top / (r.deliveries.max(1) as f64)
            });
            let losses: Vec<f64> = (0..classes.len()).map(|k| r.sent_loss_pct(k, a.subscribers)).collect();
            // Whenever a class loses, the lower ones lose more. Equal losses pass only when
            // they are nil, or both total (over 99.9%: no class can lose more than
            // everything, and a few packets may pass before the first shed).
            let ordered = losses.windows(2).all(|w| w[0] > w[1] || w[0] + w[1] < 0.01 || w[0].min(w[1]) > 99.9);
            order_broken += usize::from(!ordered);
            let p99_ms = r.groups.get(2).and_then(|g| g["latency_p99_us"].as_f64()).unwrap_or(0.0) / 1000.0;
            pb.println(format!(
                "{setup}, background {level}%: the relay got {:.1}% of a core, the top class alone needs {need:.1}%; \
                 loss by class 1/2/3: {} (shed at the source: {}); top class p99 {p99_ms:.1} ms; {}",
                r.meter.relay_cpu_pct,
                losses.iter().map(|l| format!("{l:.2}%")).collect::<Vec<_>>().join(" / "),
                shed.iter().map(u64::to_string).collect::<Vec<_>>().join(" / "),
                if ordered { "in order" } else { "*** NOT in class order ***" }
            ));
            if r.rcvbuf_errors > 0 {
                pb.println(format!(
                    "  {} datagrams were lost at the subscribers' full receive buffers: `sub`, not the relay, \
                     was a limit here",
                    r.rcvbuf_errors
                ));
            }
            for (k, g) in r.groups.iter().enumerate() {
                let l = losses[k];
                let p99 = g["latency_p99_us"].as_f64().unwrap_or(0.0);
                writeln!(
                    csv,
                    "{setup},{level},{},{},{},{l:.3},{},{p99},{:.3},{:.2},{:.2},{need:.2},{},{}",
                    plan.burners,
                    classes[k],
                    a.subscribers,
                    g["latency_p50_us"],
                    g["jitter_ms_mean"].as_f64().unwrap_or(0.0),
                    r.meter.relay_cpu_pct,
                    r.meter.machine_pct,
                    shed.get(k).copied().unwrap_or(0),
                    r.rcvbuf_errors
                )?;
                points.push(OverloadPoint {
                    setup: setup.clone(),
                    level,
                    burners: plan.burners,
                    class: classes[k],
                    loss_pct: l,
                    p99_us: p99,
                });
            }
        }
    }
    pb.finish_and_clear();
    let png = plot_overload(&a, &points)?;
    if order_broken > 0 {
        println!("{order_broken} step(s) lost out of class order (see above)");
    }
    println!("CSV: {}\nPNG: {}", csv_path.display(), png.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{read_overload_csv, Setup};

    /// `--replot` reads a run's CSV by column name, and says which line is bad.
    #[test]
    fn overload_csv_is_read_back_by_column() {
        let dir = std::env::temp_dir().join(format!("fanout-replot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("overload.csv");
        std::fs::write(
            &csv,
            "setup,background_pct,burners,class,subscribers,loss_pct,latency_p50_us,latency_p99_us\n\
             default,0,16,3,150,0.000,380,906\ndefault,100,16,1,150,99.5,380,1400000\n",
        )
        .unwrap();
        let p = read_overload_csv(&csv).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!((p[1].setup.as_str(), p[1].level, p[1].class, p[1].loss_pct), ("default", 100.0, 1, 99.5));
        assert_eq!((p[0].burners, p[0].p99_us), (16, 906.0));
        std::fs::write(&csv, "setup,background_pct,burners,class,loss_pct,latency_p99_us\nx,zero,1,1,0,0\n").unwrap();
        let e = format!("{:#}", read_overload_csv(&csv).err().unwrap());
        assert!(e.contains("line 2"), "{e}");
        std::fs::write(&csv, "setup,class\n").unwrap();
        assert!(format!("{:#}", read_overload_csv(&csv).err().unwrap()).contains("background_pct"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn overload_setups_join_relay_flags_and_a_top_class_data_path() {
        let s = Setup::parse("noshed+realtime:10+top:kernel").unwrap();
        assert_eq!(s.flags, ["--shed-after-ms", "0", "--worker-priority", "realtime:10"]);
        assert_eq!(Setup::parse("shed:50").unwrap().flags, ["--shed-after-ms", "50"]);
        assert!(Setup::parse("shed:x").is_err());
        assert_eq!(s.top_datapath.as_deref(), Some("kernel"));
        let d = Setup::parse("default").unwrap();
        assert!(d.flags.is_empty() && d.top_datapath.is_none());
        let e = Setup::parse("default+fast").err().unwrap().to_string();
        assert!(e.contains("\"fast\"") && e.contains("top:DATAPATH"), "{e}");
    }
}
