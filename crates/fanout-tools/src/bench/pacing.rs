//! `fanout bench pacing`: subscribers joining a live stream behind thin links, pacing off and
//! on (issue 17; the Oslo thesis's burst-loss case).
//!
//! Topology ([`Topology`], namespaces this run makes and deletes): the relay, a router, and
//! subscriber namespaces each behind a `tc` token bucket on the router (`--factor` × the
//! stream's rate, `--queue-ms` of queue). The first `--subs` namespaces hold one subscriber
//! each and join one after another; the last holds `--shared` subscribers that join at once
//! behind one link of `--shared` × that rate (many receivers behind one bottleneck). The
//! stream is the bundled demo clip replayed by `fanout gen` as RTP/MP2T (340 kbit/s, a
//! keyframe a second): a new subscriber starts at the last keyframe, so it is owed up to a
//! second of media at once. Each subscriber (`bench pacing-sub`, an RTSP client over UDP)
//! records its loss, when its first picture was whole (the keyframe's PES and every packet up
//! to the next video PES, no gap), and its packets per 10 ms after joining.
//! The `kernel` path's rounds, and those whose datagrams carry departure times
//! (`with=txtime`), put `fq` on the relay's egress, which holds them to those times (where
//! this kernel has fq; it says so where not). Each round also counts the relay's wake-ups
//! (its threads' context switches) and CPU while its subscribers play.
//! Writes `pacing.csv` (one row per subscriber and round), `pacing-summary.csv` and
//! `pacing.png`.

use super::layers::Topology;
use super::{Proc, RelayProc};
use anyhow::{bail, Context};
use clap::Args;
use fanout_proto::container::mpegts::{self, PACKET_LEN, SYNC_BYTE};
use fanout_proto::rtp::stats::RecvStats;
use fanout_proto::rtp::RtpView;
use fanout_proto::rtsp::client::Url;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct PacingArgs {
    /// Subscribers with a link each, joining one after another.
    #[arg(long, default_value_t = 6)]
    subs: usize,
    /// Subscribers behind one shared link, joining at once (0: none).
    #[arg(long, default_value_t = 12)]
    shared: usize,
    /// A link's rate as a multiple of the stream's (with IP/UDP/RTP headers).
    #[arg(long, default_value_t = 1.2)]
    factor: f64,
    /// The links' queue, in milliseconds at their rate.
    #[arg(long, default_value_t = 20)]
    queue_ms: u32,
    /// `pace_catchup` of the paced rounds: below --factor, or catching up fills the queue.
    #[arg(long, default_value_t = 1.1)]
    catchup: f64,
    /// `pace_burst_kb` of the paced rounds (0: the relay's default).
    #[arg(long, default_value_t = 2)]
    burst_kb: u64,
    /// Data paths, each run with pacing off and on.
    #[arg(long, value_delimiter = ',', default_value = "shared,kernel")]
    datapaths: Vec<String>,
    /// Seconds each round's subscribers play.
    #[arg(long, default_value_t = 12.0)]
    seconds: f64,
    /// A short run that checks the bench works (one data path, 6 s).
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// (internal) One RTSP subscriber of `bench pacing`.
#[derive(Args)]
pub struct SubArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    seconds: f64,
    #[arg(long)]
    json: PathBuf,
}

/// Bins of the arrival histogram after joining: 10 ms each, 2 s.
const BIN_MS: u64 = 10;
const BINS: usize = 200;

/// What one subscriber saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SubResult {
    expected: u64,
    lost: u64,
    /// From PLAY's answer to the first packet, and to its first whole picture.
    first_packet_ms: Option<f64>,
    first_picture_ms: Option<f64>,
    /// Packets in each 10 ms after the first.
    bins: Vec<u32>,
    /// When (ms after the first packet) gaps in the sequence numbers were seen, and how
    /// many packets each lost (the first 20).
    gaps: Vec<(f64, u16)>,
}

/// The first whole keyframe: its PES started (on `pid`) with no gap since.
#[derive(Default)]
struct FirstPicture {
    started: Option<u16>,
    done: Option<f64>,
}

impl FirstPicture {
    /// A datagram's TS packets, arriving at `ms`; `gap`: packets were lost before it.
    fn datagram(&mut self, ts: &[u8], gap: bool, ms: f64) {
        if self.done.is_some() {
            return;
        }
        if gap {
            self.started = None;
        }
        for p in ts.chunks_exact(PACKET_LEN).filter(|p| p[0] == SYNC_BYTE) {
            let Ok(h) = mpegts::parse_header(p, 0) else { continue };
            match self.started {
                Some(pid) if pid == h.pid && h.payload_unit_start => {
                    self.done = Some(ms);
                    return;
                }
                None if mpegts::starts_video_keyframe(p) => self.started = Some(h.pid),
                _ => {}
            }
        }
    }
}

pub fn sub(a: SubArgs) -> anyhow::Result<()> {
    let url = Url::parse(&a.url).map_err(anyhow::Error::msg)?;
    let (mut c, rtp) = super::rtsp::open_player(&url)?;
    let played = Instant::now();
    let (mut stats, mut picture) = (RecvStats::default(), FirstPicture::default());
    let (mut first, mut bins, mut last_seq) = (None::<Instant>, vec![0u32; BINS], None::<u16>);
    let mut gaps = Vec::new();
    let mut buf = vec![0u8; 65536];
    let end = played + Duration::from_secs_f64(a.seconds.clamp(1.0, 600.0));
    while Instant::now() < end {
        let Ok(n) = rtp.recv(&mut buf) else { continue };
        let Ok(v) = RtpView::parse(&buf[..n]) else { continue };
        let now = Instant::now();
        let ns = now.duration_since(played).as_nanos() as u64;
        stats.record(v.sequence_number(), v.timestamp(), (ns / 11_111) as u32, ns);
        let t0 = *first.get_or_insert(now);
        let bin = (now.duration_since(t0).as_millis() as u64 / BIN_MS) as usize;
        if let Some(b) = bins.get_mut(bin) {
            *b += 1;
        }
        let missing = last_seq.map_or(0, |s| v.sequence_number().wrapping_sub(s.wrapping_add(1)));
        let gap = missing != 0 && missing < 0x8000;
        if gap && gaps.len() < 20 {
            gaps.push((now.duration_since(t0).as_secs_f64() * 1e3, missing));
        }
        last_seq = Some(v.sequence_number());
        picture.datagram(v.payload(), gap, ns as f64 / 1e6);
    }
    if let Some(b) = c.client.teardown(0) {
        let _ = c.conn.write_all(&b);
    }
    let r = SubResult {
        expected: stats.expected(),
        lost: stats.lost(),
        first_packet_ms: first.map(|f| f.duration_since(played).as_secs_f64() * 1e3),
        first_picture_ms: picture.done,
        bins,
        gaps,
    };
    std::fs::write(&a.json, serde_json::to_string(&r)?)?;
    Ok(())
}

/// Deletes a temporary file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One round: a data path, pacing off or on.
struct Round {
    datapath: String,
    paced: bool,
    /// Per subscriber: its namespace's kind (`own` or `shared`) and what it saw.
    subs: Vec<(&'static str, SubResult)>,
    /// The relay's context switches and CPU while they played (every round's own session).
    relay_wakeups: u64,
    relay_cpu_ms: f64,
}

pub fn run(mut a: PacingArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.seconds, a.subs, a.shared) = (6.0, 3, 6);
        // The default list's first; a list given is run whole.
        if a.datapaths == ["shared", "kernel"] {
            a.datapaths.truncate(1);
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench pacing makes network namespaces and tc links: it needs root");
    }
    if !(a.factor > 1.0 && a.catchup >= 1.0 && a.seconds >= 4.0 && a.subs + a.shared > 0) {
        bail!("need --factor > 1, --catchup >= 1, --seconds >= 4 and at least one subscriber");
    }
    super::ensure_dir(&a.out)?;
    // The bundled clip, for `gen` to replay (the binary carries it: no repository needed).
    let demo = std::env::temp_dir().join(format!("fanout-pacing-{}.ts", std::process::id()));
    std::fs::write(&demo, fanout_io::DEMO_TS).with_context(|| format!("writing {}", demo.display()))?;
    let _rm = RemoveOnDrop(demo.clone());
    let ts = fanout_io::DEMO_TS;
    // The stream on the wire: TS datagrams of 7 packets, each with RTP, UDP, IP and Ethernet
    // headers, which the links' token buckets count.
    let stream_kbps = mpegts::TsSchedule::new(ts)?.bitrate() / 1000.0 * (1316.0 + 54.0) / 1316.0;
    let link = (a.factor * stream_kbps).ceil() as u32;
    let mut links = vec![link; a.subs];
    if a.shared > 0 {
        links.push(link * a.shared as u32);
    }
    let topo = Topology::new(&links, a.queue_ms)?;
    topo.enter_relay()?;
    // Its network namespace is private to this run: serving it without credentials is safe.
    let relay = RelayProc::start(&["--rtsp", "0.0.0.0:8554", "--allow-unauthenticated"])?;
    let api = relay.client();
    let exe = std::env::current_exe()?;
    println!(
        "stream {stream_kbps:.0} kbit/s on the wire; links {link} kbit/s ({}× ), {} ms queue; shared link {} kbit/s for {} subscribers",
        a.factor,
        a.queue_ms,
        link * a.shared as u32,
        a.shared
    );
    let plan: Vec<(String, bool)> = a.datapaths.iter().flat_map(|d| [(d.clone(), false), (d.clone(), true)]).collect();
    let mut pb = super::progress(plan.len() as u64, "bench pacing");
    let mut rounds = Vec::new();
    for (k, (dp, paced)) in plan.iter().enumerate() {
        pb.set_message(format!("{dp}, pacing {}", if *paced { "on" } else { "off" }));
        // The kernel path's clones and stamped datagrams wait for their departure times in
        // fq; the others are paced in user space and keep veth's default.
        let stamped = dp.starts_with("kernel") || super::has_option(dp, "with=txtime");
        if topo.egress_fq(stamped) != stamped {
            pb.println(format!("{dp}: no fq qdisc here, so departure times are not honoured"));
        }
        let name = format!("p{k}");
        let mut spec = json!({ "name": name, "source": { "udp": "127.0.0.1:0" } });
        let m = spec.as_object_mut().expect("an object");
        m.extend(super::datapath_fields(dp)?);
        m.insert("pacing".into(), if *paced { "on" } else { "off" }.into());
        if !paced {
            m.remove("pace_with"); // nothing to stamp
        }
        if *paced {
            m.insert("pace_catchup".into(), a.catchup.into());
            if a.burst_kb > 0 {
                m.insert("pace_burst_kb".into(), a.burst_kb.into());
            }
        }
        let created = api.call("POST", "/v1/sessions", Some(spec))?;
        let src = created["source"]["addr"].as_str().context("the session's source address")?.to_string();
        let total = a.seconds + 6.0;
        let _gen = Proc(
            Command::new(&exe)
                .args(["gen", "--to", &src, "--file"])
                .arg(&demo)
                .args(["--duration", &total.to_string()])
                .stdout(Stdio::null())
                .spawn()?,
        );
        // A keyframe or two in the ring, and the rate measured.
        std::thread::sleep(Duration::from_millis(2500));
        let url = format!("rtsp://10.98.0.1:8554/{name}");
        let mut subs = Vec::new();
        let start = |ns: &str, kind: &'static str, i: usize| -> anyhow::Result<(Proc, PathBuf, &'static str)> {
            let json = std::env::temp_dir().join(format!("fanout-pacing-{}-{k}-{i}.json", std::process::id()));
            let child = Command::new("ip")
                .args(["netns", "exec", ns])
                .arg(&exe)
                .args(["bench", "pacing-sub", "--url", &url, "--seconds", &a.seconds.to_string(), "--json"])
                .arg(&json)
                .spawn()?;
            Ok((Proc(child), json, kind))
        };
        let pid = relay.proc.0.id();
        let (woken, cpu) = (super::context_switches(pid), super::process_cpu_s(pid)?);
        // Behind the shared link, all at once; then the others, one every 0.4 s (spread over
        // the stream's keyframe interval).
        if a.shared > 0 {
            for i in 0..a.shared {
                subs.push(start(&topo.subs[a.subs], "shared", a.subs + i)?);
            }
        }
        for i in 0..a.subs {
            subs.push(start(&topo.subs[i], "own", i)?);
            std::thread::sleep(Duration::from_millis(400));
        }
        // The pace the relay held its sinks to while they played (the measured stream rate
        // times pace_catchup), against the links' rate.
        if *paced {
            let mut rates = Vec::new();
            let until = Instant::now() + Duration::from_secs_f64(a.seconds);
            while Instant::now() < until {
                let st = api.call("GET", &format!("/v1/sessions/{name}"), None)?;
                if let Some(r) = st["pacing"]["sink_rate_bps"].as_f64() {
                    rates.push(r / 1000.0);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let (Some(lo), Some(hi)) =
                (rates.iter().copied().reduce(f64::min), rates.iter().copied().reduce(f64::max))
            {
                pb.println(format!(
                    "{dp}: sinks paced at {lo:.0}-{hi:.0} kbit/s of payload (links {link} kbit/s with headers)"
                ));
            }
        }
        let mut results = Vec::new();
        for (mut p, json, kind) in subs {
            super::wait(&mut p, Duration::from_secs_f64(a.seconds + 20.0))?;
            let text =
                std::fs::read_to_string(&json).with_context(|| format!("{} (a subscriber failed)", json.display()))?;
            let _ = std::fs::remove_file(&json);
            results.push((kind, serde_json::from_str::<SubResult>(&text)?));
        }
        let relay_wakeups = super::context_switches(pid).saturating_sub(woken);
        if stamped {
            // What fq did with the stamped datagrams (dropped: over its limits).
            let q = topo.relay_qdisc();
            let count = |what| super::layers::qdisc_counter(&q, what);
            pb.println(format!(
                "{dp}: fq on the relay's egress dropped {} ({} over a flow's limit)",
                count("dropped"),
                count("flows_plimit")
            ));
        }
        let relay_cpu_ms = (super::process_cpu_s(pid)? - cpu) * 1e3;
        api.call("DELETE", &format!("/v1/sessions/{name}"), None)?;
        rounds.push(Round { datapath: dp.clone(), paced: *paced, subs: results, relay_wakeups, relay_cpu_ms });
        pb.inc(1);
    }
    pb.finish_and_clear();
    report(&a, &rounds)
}

fn pct(lost: u64, expected: u64) -> f64 {
    if expected == 0 {
        0.0
    } else {
        100.0 * lost as f64 / expected as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(a: &PacingArgs, rounds: &[Round]) -> anyhow::Result<()> {
    let csv_path = a.out.join("pacing.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "datapath,pacing,link,expected,lost,loss_pct,first_packet_ms,first_picture_ms,packets_first_50ms,gaps_ms_lost"
    )?;
    let sum_path = a.out.join("pacing-summary.csv");
    let mut sum = std::fs::File::create(&sum_path)?;
    writeln!(
        sum,
        "datapath,pacing,link,subscribers,loss_pct,median_first_picture_ms,max_packets_first_50ms,relay_wakeups,relay_cpu_ms"
    )?;
    println!(
        "\n{:<28} {:<7} {:<7} {:>5} {:>9} {:>15} {:>14} {:>13} {:>9}",
        "path", "pacing", "link", "subs", "loss %", "1st picture ms", "pkts 1st 50ms", "relay wakeups", "relay ms"
    );
    for r in rounds {
        let pacing = if r.paced { "on" } else { "off" };
        for s in &r.subs {
            let first50: u32 = s.1.bins.iter().take(5).sum();
            let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
            writeln!(
                csv,
                "{},{pacing},{},{},{},{:.4},{},{},{first50},{}",
                r.datapath,
                s.0,
                s.1.expected,
                s.1.lost,
                pct(s.1.lost, s.1.expected),
                opt(s.1.first_packet_ms),
                opt(s.1.first_picture_ms),
                s.1.gaps.iter().map(|(t, n)| format!("{t:.0}:{n}")).collect::<Vec<_>>().join(" ")
            )?;
        }
        for kind in ["own", "shared"] {
            let subs: Vec<&SubResult> = r.subs.iter().filter(|s| s.0 == kind).map(|s| &s.1).collect();
            if subs.is_empty() {
                continue;
            }
            let (lost, expected) = subs.iter().fold((0, 0), |(l, e), s| (l + s.lost, e + s.expected));
            // A subscriber that never saw a whole picture counts as the whole run.
            let firsts = subs.iter().map(|s| s.first_picture_ms.unwrap_or(a.seconds * 1e3)).collect();
            let burst = subs.iter().map(|s| s.bins.iter().take(5).sum::<u32>()).max().unwrap_or(0);
            let (loss, first) = (pct(lost, expected), median(firsts));
            let (woken, cpu) = (r.relay_wakeups, r.relay_cpu_ms);
            writeln!(
                sum,
                "{},{pacing},{kind},{},{loss:.4},{first:.1},{burst},{woken},{cpu:.0}",
                r.datapath,
                subs.len()
            )?;
            println!(
                "{:<28} {:<7} {:<7} {:>5} {:>9.3} {:>15.1} {:>14} {:>13} {:>9.0}",
                r.datapath,
                pacing,
                kind,
                subs.len(),
                loss,
                first,
                burst,
                woken,
                cpu
            );
        }
    }
    let png = a.out.join("pacing.png");
    plot(&png, rounds)?;
    println!("\nCSV: {}\n     {}\nPNG: {}", csv_path.display(), sum_path.display(), png.display());
    Ok(())
}

/// Left: packets received since joining (mean over a round's subscribers: a burst lost at
/// the link is a step that never comes); right: each subscriber's loss.
fn plot(png: &Path, rounds: &[Round]) -> anyhow::Result<()> {
    let label = |r: &Round| format!("{}, pacing {}", r.datapath, if r.paced { "on" } else { "off" });
    let arrivals = rounds
        .iter()
        .map(|r| {
            let n = r.subs.len().max(1) as f64;
            let mut sum = 0.0;
            let pts = (0..BINS)
                .map(|b| {
                    let total: u32 = r.subs.iter().map(|s| s.1.bins.get(b).copied().unwrap_or(0)).sum();
                    sum += f64::from(total) / n;
                    ((b as u64 * BIN_MS) as f64, sum)
                })
                .collect();
            (label(r), pts)
        })
        .collect();
    let losses = rounds
        .iter()
        .map(|r| (label(r), r.subs.iter().enumerate().map(|(i, s)| (i as f64, pct(s.1.lost, s.1.expected))).collect()))
        .collect();
    super::plot::panels(
        png,
        "Joining behind thin links: a burst at join, and the loss it causes, pacing off and on",
        "ms after the first packet (left) / subscriber (right: the shared link's first)",
        false,
        &[
            super::plot::Panel { y_label: "packets received since joining (mean)", series: arrivals, log_y: false },
            super::plot::Panel { y_label: "loss %", series: losses, log_y: false },
        ],
    )
}
