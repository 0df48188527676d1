//! `fanout bench layers`: per-subscriber layer adaptation behind constrained links (issue 6;
//! the Oslo thesis's chapter 5 experiment, with our AIMD selector beside its one-step rule).
//!
//! Topology, all in namespaces this run creates and deletes: the relay and the source in
//! one, each subscriber in its own, joined to the relay's by a veth pair whose relay end has
//! a `tc` token bucket (a link rate; 0 = unlimited). The source is a layered H.264 file looped
//! by `fanout gen` faster than the small links carry. Each subscriber is an RTSP client over
//! UDP (`bench layers-sub`) that sends a receiver report every `--report-ms` and records, per
//! second, what it got: bits, loss (by the sequence numbers it sees, which leave out what the
//! relay dropped on purpose) and the layers. Meanwhile the bench reads each sink's selector
//! from the API twice a second: our AIMD decision, and what the thesis's rule would have
//! decided on the same reports. Writes `layers.csv` (selector samples), `layers-subs.csv`
//! (subscriber seconds), `layers-summary.json` and `layers.png`.

use super::{ip, Proc, RelayProc};
use anyhow::{bail, Context};
use clap::Args;
use fanout_proto::codec::annexb::Codec;
use fanout_proto::codec::layers::{Layer, LayerParser, PacketLayer};
use fanout_proto::rtp::adapt::within;
use fanout_proto::rtp::stats::RecvStats;
use fanout_proto::rtp::RtpView;
use fanout_proto::rtsp::client::Url;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct LayersArgs {
    /// Link rates of the subscribers in kbit/s (0: unlimited).
    #[arg(long, value_delimiter = ',', default_value = "150,600,0")]
    links: Vec<u32>,
    /// Seconds the subscribers play; the last 40% count as "after adaptation".
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// The layered stream (H.264 or HEVC Annex B), looped.
    #[arg(long, default_value = "testdata/video/h264-svc/mediasoup_naluInfo.264")]
    file: PathBuf,
    /// Its frame rate: mediasoup's stream at 60 fps is about 660 kbit/s.
    #[arg(long, default_value_t = 60.0)]
    fps: f64,
    /// How often each subscriber sends a receiver report (RFC 3550's reduced minimum
    /// interval at these rates is about half a second).
    #[arg(long, default_value_t = 500)]
    report_ms: u64,
    /// The relay's data path.
    #[arg(long, default_value = "shared")]
    datapath: String,
    /// A short run (20 s) that checks the bench works; too short for adaptation to settle.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// (internal) One RTSP subscriber that reports and records what it gets.
#[derive(Args)]
pub struct SubArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    seconds: f64,
    #[arg(long)]
    report_ms: u64,
    #[arg(long)]
    json: PathBuf,
}

/// A second of one subscriber's reception.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Second {
    t: f64,
    bits: u64,
    /// Expected and lost so far (RFC 3550, from the sequence numbers it sees).
    expected: u64,
    lost: u64,
    /// The layers (did, qid, tid) its packets carried this second.
    layers: Vec<(u8, u8, u8)>,
}

/// The namespaces and links of one run, deleted when dropped: the relay (10.98.0.1), a
/// router (10.98.0.2; 10.99.i.1 toward subscriber i) whose egress to each subscriber is
/// shaped, and the subscribers (10.99.i.2). The bottleneck is a hop away, as on a real
/// network: a queue on the relay's own interface would push back on its sockets instead of
/// dropping.
pub(super) struct Topology {
    relay: String,
    router: String,
    pub subs: Vec<String>,
}

/// Runs a command inside a namespace.
fn in_ns(ns: &str, cmd: &[&str]) -> anyhow::Result<()> {
    let mut args = vec!["netns", "exec", ns];
    args.extend_from_slice(cmd);
    ip(&args)
}

impl Topology {
    /// Subscriber namespaces behind links of these rates (kbit/s, 0 = unshaped), each with
    /// `queue_ms` of queue.
    pub(super) fn new(links: &[u32], queue_ms: u32) -> anyhow::Result<Self> {
        Self::sweep();
        let tag = std::process::id();
        let mut t =
            Topology { relay: format!("fanout-{tag}-relay"), router: format!("fanout-{tag}-router"), subs: Vec::new() };
        let (r, m) = (t.relay.clone(), t.router.clone());
        for ns in [&r, &m] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&["-n", &r, "link", "add", "up0", "type", "veth", "peer", "name", "down0", "netns", &m])?;
        ip(&["-n", &r, "addr", "add", "10.98.0.1/24", "dev", "up0"])?;
        ip(&["-n", &m, "addr", "add", "10.98.0.2/24", "dev", "down0"])?;
        ip(&["-n", &r, "link", "set", "up0", "up"])?;
        ip(&["-n", &m, "link", "set", "down0", "up"])?;
        ip(&["-n", &r, "route", "add", "10.99.0.0/16", "via", "10.98.0.2"])?;
        // The router forwards; so may the relay's namespace, as the kernel data path's
        // clones of datagrams that arrive on lo are forwarded to the subscribers.
        for ns in [&m, &r] {
            in_ns(ns, &["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])?;
        }
        for (i, &kbps) in links.iter().enumerate() {
            let ns = format!("fanout-{tag}-sub{i}");
            ip(&["netns", "add", &ns])?;
            t.subs.push(ns.clone());
            let (v, w) = (format!("v{i}"), format!("w{i}"));
            ip(&["-n", &m, "link", "add", &v, "type", "veth", "peer", "name", &w, "netns", &ns])?;
            ip(&["-n", &m, "addr", "add", &format!("10.99.{i}.1/24"), "dev", &v])?;
            ip(&["-n", &ns, "addr", "add", &format!("10.99.{i}.2/24"), "dev", &w])?;
            ip(&["-n", &m, "link", "set", &v, "up"])?;
            ip(&["-n", &ns, "link", "set", &w, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &ns, "route", "add", "default", "via", &format!("10.99.{i}.1")])?;
            if kbps > 0 {
                // A token bucket: two full frames of burst, then the queue.
                let (rate, latency) = (format!("{kbps}kbit"), format!("{queue_ms}ms"));
                in_ns(
                    &m,
                    &[
                        "tc", "qdisc", "add", "dev", &v, "root", "tbf", "rate", &rate, "burst", "3028", "latency",
                        &latency,
                    ],
                )
                .with_context(|| format!("shaping link {i} to {kbps} kbit/s"))?;
            }
        }
        Ok(t)
    }

    /// Deletes the namespaces of earlier runs that died without cleaning up (killed): they
    /// are named after a process that is gone.
    fn sweep() {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let ns = line.split_whitespace().next().unwrap_or("");
            let Some(pid) = ns.strip_prefix("fanout-").and_then(|r| r.split('-').next()) else { continue };
            if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = Command::new("ip").args(["netns", "del", ns]).status();
            }
        }
    }

    /// Puts the `fq` qdisc on the relay's egress (`on`), which holds the kernel data path's
    /// clones to their EDT departure times, or takes it off (veth's default: no queue).
    /// Whether fq is there now (this kernel may not have it).
    pub(super) fn egress_fq(&self, on: bool) -> bool {
        let verb: &[&str] = if on { &["replace", "dev", "up0", "root", "fq"] } else { &["del", "dev", "up0", "root"] };
        let done = Command::new("ip")
            .args(["netns", "exec", &self.relay, "tc", "qdisc"])
            .args(verb)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        on && done
    }

    /// `tc -s qdisc show` of the relay's egress.
    pub(super) fn relay_qdisc(&self) -> String {
        tc_show(&self.relay, "up0")
    }

    /// Datagrams the link to subscriber namespace `i` dropped so far (its queue full).
    pub(super) fn link_drops(&self, i: usize) -> u64 {
        qdisc_counter(&tc_show(&self.router, &format!("v{i}")), "dropped")
    }

    /// Moves the calling thread (and what it starts) into the relay's namespace.
    pub(super) fn enter_relay(&self) -> anyhow::Result<()> {
        enter(&self.relay)
    }

    /// Moves the calling thread (and what it starts) into subscriber namespace `i`.
    pub(super) fn enter_sub(&self, i: usize) -> anyhow::Result<()> {
        enter(&self.subs[i])
    }
}

fn tc_show(ns: &str, dev: &str) -> String {
    let out = Command::new("ip").args(["netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}

/// A counter from `tc -s qdisc show`'s text (`dropped 12,`), summed over its qdiscs.
pub(super) fn qdisc_counter(text: &str, name: &str) -> u64 {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0].trim_start_matches('(') == name)
        .filter_map(|w| w[1].trim_end_matches([',', ')']).parse::<u64>().ok())
        .sum()
}

fn enter(ns: &str) -> anyhow::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    // SAFETY: setns on a valid namespace fd affects only the calling thread.
    if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into {ns}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.subs.iter().chain([&self.router, &self.relay]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// The rate (bits per second) a subscriber allowed `max` gets, from the session's status.
fn cumulative(session: &Value, max: Option<Layer>) -> f64 {
    let l = &session["layers"];
    let base = l["not_layered_bps"].as_f64().unwrap_or(0.0);
    let layers = l["layers"].as_array().cloned().unwrap_or_default();
    base + layers
        .iter()
        .filter(|x| {
            let at = |k: &str| x[k].as_u64().unwrap_or(0) as u8;
            max.is_none_or(|m| within(Layer { did: at("did"), qid: at("qid"), tid: at("tid") }, m))
        })
        .filter_map(|x| x["bps"].as_f64())
        .sum::<f64>()
}

fn layer_of(v: &Value) -> Option<Layer> {
    serde_json::from_value(v.clone()).ok()
}

fn name(l: Option<Layer>) -> String {
    l.map_or("all".into(), |l| format!("d{}q{}t{}", l.did, l.qid, l.tid))
}

/// One selector sample of one link.
struct Sample {
    t: f64,
    link: usize,
    /// Who sends to the sink: `user` or `kernel`; and its last error, if any (such as why
    /// the kernel path handed it to user space).
    path: String,
    reason: Option<String>,
    aimd: Option<Layer>,
    aimd_est: f64,
    aimd_kbps: f64,
    thesis: Option<Layer>,
    thesis_est: f64,
    thesis_kbps: f64,
}

pub fn run(mut a: LayersArgs) -> anyhow::Result<()> {
    if a.quick {
        a.seconds = 20.0;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench layers makes network namespaces and tc links: it needs root");
    }
    if !a.file.exists() {
        bail!("{} is missing (the shared layered test streams)", a.file.display());
    }
    if !(a.seconds >= 4.0 && a.seconds <= 600.0) {
        bail!("--seconds must be within 4..600");
    }
    super::ensure_dir(&a.out)?;
    let video = match a.file.extension().and_then(|e| e.to_str()) {
        Some("265" | "h265" | "hevc") => "h265",
        _ => "h264",
    };
    let topo = Topology::new(&a.links, 100)?;
    topo.enter_relay()?;
    // Its network namespace is private to this run: serving it without credentials is safe.
    let relay = RelayProc::start(&["--rtsp", "0.0.0.0:8554", "--allow-unauthenticated"])?;
    let api = relay.client();
    let mut spec = json!({ "name": "svc", "source": { "udp": "127.0.0.1:0" }, "video": video });
    spec.as_object_mut().unwrap().extend(super::datapath_fields(&a.datapath)?);
    let created = api.call("POST", "/v1/sessions", Some(spec))?;
    let src = created["source"]["addr"].as_str().context("the session's source address")?.to_string();
    let exe = std::env::current_exe()?;
    let total = a.seconds + 4.0;
    let _gen = Proc(
        Command::new(&exe)
            .args(["gen", "--to", &src, "--fps", &a.fps.to_string(), "--duration", &total.to_string()])
            .arg("--file")
            .arg(&a.file)
            .stdout(Stdio::null())
            .spawn()?,
    );
    // The layer rates settle over a second before the first subscriber reports.
    std::thread::sleep(Duration::from_millis(1500));
    let mut subs = Vec::new();
    for (i, ns) in topo.subs.iter().enumerate() {
        let json = std::env::temp_dir().join(format!("fanout-layers-{}-sub{i}.json", std::process::id()));
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&exe)
            .args(["bench", "layers-sub", "--url", "rtsp://10.98.0.1:8554/svc"])
            .args(["--seconds", &a.seconds.to_string(), "--report-ms", &a.report_ms.to_string(), "--json"])
            .arg(&json)
            .spawn()?;
        subs.push((Proc(child), json));
    }
    let mut pb = super::progress(a.seconds as u64, "bench layers");
    let t0 = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    // Until just before the subscribers leave.
    while t0.elapsed().as_secs_f64() < a.seconds - 0.5 {
        std::thread::sleep(Duration::from_millis(500));
        pb.set_position(t0.elapsed().as_secs());
        let (Ok(clients), Ok(sinks), Ok(session)) = (
            api.call("GET", "/v1/rtsp", None),
            api.call("GET", "/v1/sessions/svc/sinks", None),
            api.call("GET", "/v1/sessions/svc", None),
        ) else {
            continue;
        };
        let t = t0.elapsed().as_secs_f64();
        for c in clients["clients"].as_array().into_iter().flatten() {
            let Some(link) = c["peer"].as_str().and_then(|p| p.parse::<IpAddr>().ok()).and_then(link_of) else {
                continue;
            };
            let Some(id) = c["sinks"][0]["sink"].as_u64() else { continue };
            let Some(sink) = sinks["sinks"].as_array().into_iter().flatten().find(|s| s["id"] == id) else {
                continue;
            };
            let l = &sink["layers"];
            let (aimd, thesis) = (layer_of(&l["allowance"]), layer_of(&l["thesis_allowance"]));
            samples.push(Sample {
                t,
                link,
                path: sink["path"].as_str().unwrap_or("?").to_string(),
                reason: sink["reason"].as_str().map(String::from),
                aimd,
                aimd_est: l["estimate_bps"].as_f64().unwrap_or(f64::NAN) / 1000.0,
                aimd_kbps: cumulative(&session, aimd) / 1000.0,
                thesis,
                thesis_est: l["thesis_estimate_bps"].as_f64().unwrap_or(f64::NAN) / 1000.0,
                thesis_kbps: cumulative(&session, thesis) / 1000.0,
            });
        }
    }
    pb.finish_and_clear();
    let mut seconds: Vec<Vec<Second>> = Vec::new();
    for (mut p, json) in subs {
        super::wait(&mut p, Duration::from_secs(15))?;
        let text =
            std::fs::read_to_string(&json).with_context(|| format!("{} (a subscriber failed)", json.display()))?;
        let _ = std::fs::remove_file(&json);
        seconds.push(serde_json::from_str(&text)?);
    }
    write_outputs(&a, &samples, &seconds)
}

/// Link i's subscriber is 10.99.i.2.
fn link_of(ip: IpAddr) -> Option<usize> {
    match ip {
        IpAddr::V4(v) if v.octets()[..2] == [10, 99] && v.octets()[3] == 2 => Some(usize::from(v.octets()[2])),
        _ => None,
    }
}

fn write_outputs(a: &LayersArgs, samples: &[Sample], subs: &[Vec<Second>]) -> anyhow::Result<()> {
    let csv_path = a.out.join("layers.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(csv, "t,link_kbps,aimd_allowance,aimd_estimate_kbps,aimd_allowance_kbps,thesis_allowance,thesis_estimate_kbps,thesis_allowance_kbps")?;
    for s in samples {
        writeln!(
            csv,
            "{:.2},{},{},{:.1},{:.1},{},{:.1},{:.1}",
            s.t,
            a.links[s.link],
            name(s.aimd),
            s.aimd_est,
            s.aimd_kbps,
            name(s.thesis),
            s.thesis_est,
            s.thesis_kbps
        )?;
    }
    let subs_path = a.out.join("layers-subs.csv");
    let mut sc = std::fs::File::create(&subs_path)?;
    writeln!(sc, "link_kbps,t,kbps,expected,lost,layers")?;
    let mut summary = Vec::new();
    for (i, secs) in subs.iter().enumerate() {
        for s in secs {
            let layers: Vec<String> = s.layers.iter().map(|l| format!("d{}q{}t{}", l.0, l.1, l.2)).collect();
            writeln!(
                sc,
                "{},{:.0},{:.1},{},{},{}",
                a.links[i],
                s.t,
                s.bits as f64 / 1000.0,
                s.expected,
                s.lost,
                layers.join(" ")
            )?;
        }
        // After adaptation: the last 40%.
        let after: Vec<&Second> = secs.iter().filter(|s| s.t > a.seconds * 0.6).collect();
        let (first, last) = (after.first(), after.last());
        let (expected, lost) = match (first, last) {
            (Some(f), Some(l)) => (l.expected - f.expected, l.lost.saturating_sub(f.lost)),
            _ => (0, 0),
        };
        let layers: BTreeSet<(u8, u8, u8)> = after.iter().flat_map(|s| s.layers.iter().copied()).collect();
        let kbps = after.iter().map(|s| s.bits as f64).sum::<f64>() / 1000.0 / after.len().max(1) as f64;
        let last_sample = samples.iter().rev().find(|s| s.link == i);
        // When it last lost a packet: a failed probe of a higher layer, or the start.
        let last_loss = secs.windows(2).rev().find(|w| w[1].lost > w[0].lost).map(|w| w[1].t);
        summary.push(json!({
            "link_kbps": a.links[i],
            "received_kbps_after": kbps,
            "loss_after": if expected > 0 { lost as f64 / expected as f64 } else { 0.0 },
            "expected_after": expected,
            "last_loss_s": last_loss,
            "layers_after": layers,
            "aimd_allowance": last_sample.map(|s| name(s.aimd)),
            "sink_path": last_sample.map(|s| s.path.clone()),
            "sink_reason": last_sample.map(|s| s.reason.clone()),
            "thesis_allowance": last_sample.map(|s| name(s.thesis)),
        }));
    }
    let summary =
        json!({ "file": a.file, "fps": a.fps, "seconds": a.seconds, "datapath": a.datapath, "links": summary });
    std::fs::write(a.out.join("layers-summary.json"), serde_json::to_string_pretty(&summary)?)?;
    for l in summary["links"].as_array().into_iter().flatten() {
        println!(
            "link {:>4} kbit/s: received {:6.1} kbit/s after adaptation, loss {:.2}% (last lost at {}), layers {}, AIMD {} / thesis {}",
            l["link_kbps"],
            l["received_kbps_after"].as_f64().unwrap_or(0.0),
            100.0 * l["loss_after"].as_f64().unwrap_or(0.0),
            l["last_loss_s"].as_f64().map_or("no time".into(), |t| format!("{t:.0} s")),
            l["layers_after"],
            l["aimd_allowance"],
            l["thesis_allowance"],
        );
    }
    let png = a.out.join("layers.png");
    plot(&png, a, samples, subs)?;
    println!("\nCSV: {}\n     {}\nPNG: {}", csv_path.display(), subs_path.display(), png.display());
    Ok(())
}

fn plot(png: &Path, a: &LayersArgs, samples: &[Sample], subs: &[Vec<Second>]) -> anyhow::Result<()> {
    let labels: Vec<String> = a
        .links
        .iter()
        .map(|&k| if k > 0 { format!("kbit/s, {k} kbit/s link") } else { "kbit/s, unlimited link".into() })
        .collect();
    let panels: Vec<super::plot::Panel> = a
        .links
        .iter()
        .enumerate()
        .map(|(i, &kbps)| {
            let of = |f: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
                samples.iter().filter(|s| s.link == i && f(s).is_finite()).map(|s| (s.t, f(s))).collect()
            };
            let mut series = vec![
                ("AIMD: allowance's rate".to_string(), of(|s| s.aimd_kbps)),
                ("AIMD: estimate".to_string(), of(|s| s.aimd_est)),
                ("thesis rule: allowance's rate".to_string(), of(|s| s.thesis_kbps)),
                ("thesis rule: estimate".to_string(), of(|s| s.thesis_est)),
                (
                    "received (RTP)".to_string(),
                    subs.get(i).into_iter().flatten().map(|s| (s.t, s.bits as f64 / 1000.0)).collect(),
                ),
            ];
            if kbps > 0 {
                let end = samples.last().map_or(a.seconds, |s| s.t);
                series.push(("link (L2)".to_string(), vec![(0.0, f64::from(kbps)), (end, f64::from(kbps))]));
            }
            super::plot::Panel { y_label: &labels[i], series, log_y: false }
        })
        .collect();
    super::plot::panels(
        png,
        "Layer selection per subscriber: AIMD (applied) and the thesis's rule (same reports)",
        "s",
        false,
        &panels,
    )
}

/// The subscriber: plays the URL's first track over UDP, reports, records per second.
pub fn sub(a: SubArgs) -> anyhow::Result<()> {
    let url = Url::parse(&a.url).map_err(anyhow::Error::msg)?;
    let (mut c, rtp) = super::rtsp::open_player(&url)?;
    let rtcp_port = c.client.tracks.first().and_then(|t| t.server_ports).map(|p| p.1).context("no server_port")?;
    let server: IpAddr = url.host.parse().context("the URL's host must be an address")?;
    let rtcp_to = SocketAddr::new(server, rtcp_port);
    let h265 = c.client.sdp.as_ref().and_then(|s| s.media.first()).is_some_and(|m| {
        m.formats.first().and_then(|f| m.rtpmap(f)).is_some_and(|(enc, _)| enc.eq_ignore_ascii_case("H265"))
    });
    let codec = if h265 { Codec::H265 } else { Codec::H264 };
    let (mut stats, mut parser, mut last_rr) = (RecvStats::default(), LayerParser::default(), (0u64, 0u64));
    let t0 = Instant::now();
    let report_every = Duration::from_millis(a.report_ms.max(100));
    let mut next_report = t0 + report_every;
    let mut seconds: Vec<Second> = Vec::new();
    let mut cur = Second { t: 1.0, bits: 0, expected: 0, lost: 0, layers: Vec::new() };
    let (mut ssrc, mut buf) = (0u32, vec![0u8; 65536]);
    let end = t0 + Duration::from_secs_f64(a.seconds.min(600.0));
    while Instant::now() < end {
        if let Ok(n) = rtp.recv(&mut buf) {
            if let Ok(v) = RtpView::parse(&buf[..n]) {
                ssrc = v.ssrc();
                let ns = t0.elapsed().as_nanos() as u64;
                stats.record(v.sequence_number(), v.timestamp(), (ns / 11_111) as u32, ns);
                cur.bits += 8 * n as u64;
                if let PacketLayer::Media { layer, .. } = parser.packet(codec, v.payload()) {
                    let id = (layer.did, layer.qid, layer.tid);
                    if !cur.layers.contains(&id) {
                        cur.layers.push(id);
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= next_report && ssrc != 0 {
            next_report += report_every;
            let block = stats.report_block(&mut last_rr, ssrc, 0, 0);
            let mut rr = Vec::with_capacity(32);
            fanout_proto::rtp::rtcp::write_receiver_report(&mut rr, 0x6c61_7972, &block);
            let _ = c.rtcp[0].send_to(&rr, rtcp_to);
        }
        if now.duration_since(t0).as_secs_f64() >= cur.t {
            cur.expected = stats.expected();
            cur.lost = stats.lost();
            cur.layers.sort_unstable();
            let t = cur.t + 1.0;
            seconds.push(std::mem::replace(&mut cur, Second { t, bits: 0, expected: 0, lost: 0, layers: Vec::new() }));
        }
    }
    if let Some(b) = c.client.teardown(0) {
        let _ = c.conn.write_all(&b);
    }
    std::fs::write(&a.json, serde_json::to_string(&seconds)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn qdisc_counters_are_read_from_tcs_text() {
        let fq = "qdisc fq 8001: root refcnt 2 limit 10000p flow_limit 100p\n Sent 1239 bytes 12 pkt (dropped 7, overlimits 0 requeues 0)\n  flows 3 (inactive 2 throttled 0)\n  gc 0 highprio 0 throttled 5 flows_plimit 7";
        assert_eq!(super::qdisc_counter(fq, "dropped"), 7);
        assert_eq!(super::qdisc_counter(fq, "flows_plimit"), 7);
        assert_eq!(super::qdisc_counter("nothing here", "dropped"), 0);
    }
}
