//! `fanout bench players`: players per core in the peers' own format. SRS and ZLMediaKit
//! publish their capacity as a table: one CBR source (H.264 200 kbit/s + AAC 32 kbit/s, 25
//! fps, a keyframe every 2 s), N players of one kind, the server's CPU averaged over a long
//! window, its memory, and whether the players got everything.
//!
//! Here each step starts a server (fanout, or MediaMTX from `.peers/`), publishes that
//! source into it with ffmpeg over RTSP, starts N players of one scenario in one load
//! process, and reads the server's own CPU over the window and its RSS at the end. The
//! load process counts what every player got: RTP packets per client and the sequence
//! numbers missing (RTSP over TCP), bytes (HTTP TS, SRT, WebRTC), bytes and tags in order
//! (RTMP), segments (HLS).
//! Servers alternate step by step. Writes `players.csv`, `players.png` and a Markdown table.

use super::peers::{publish, start_server, Server};
use super::{process_cpu_s, progress, Proc};
use anyhow::{bail, Context};
use clap::Args;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The peers' source: H.264 200 kbit/s CBR + AAC 32 kbit/s, 25 fps, 2 s GOP, 10 s looped
/// (made with ffmpeg; testdata/players/PROVENANCE.md).
pub const SRS_SOURCE: &[u8] = include_bytes!("../../../../testdata/players/srs-232k.mp4");

#[derive(Args)]
pub struct PlayersArgs {
    /// Ways of playing: rtsp (RTP over UDP), rtsp-tcp (interleaved), http (MPEG-TS over
    /// HTTP; fanout only), http-flv (fanout only), hls, rtmp, srt, webrtc (WHEP; video only).
    #[arg(long, value_delimiter = ',', default_value = "rtsp,rtsp-tcp,http,hls,rtmp,srt")]
    scenarios: Vec<String>,
    /// Players per step (a UDP RTSP player holds five descriptors in the load process: 3000
    /// fits the usual limit of 20,000).
    #[arg(long, value_delimiter = ',', default_value = "1000,3000")]
    players: Vec<usize>,
    /// Servers to measure: fanout, mediamtx.
    #[arg(long, value_delimiter = ',', default_value = "fanout,mediamtx")]
    servers: Vec<String>,
    /// Seconds the CPU is averaged over, per step.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// 180 s windows, as SRS measures.
    #[arg(long)]
    long: bool,
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Players of a scenario whose load runs a thread per player (srt, webrtc) are capped
    /// here (RTMP's load reads every player in one epoll loop).
    #[arg(long, default_value_t = 500)]
    thread_players: usize,
    /// A short run that checks the bench works: 20 players, 4 s, rtsp, rtsp-tcp, http, hls.
    #[arg(long)]
    quick: bool,
    /// Where scripts/install-peers put MediaMTX.
    #[arg(long, default_value = ".peers")]
    peers: PathBuf,
    /// Another source (any file ffmpeg can loop and publish with `-c copy` over RTSP).
    #[arg(long)]
    clip: Option<PathBuf>,
    /// Where each step's time goes: `perf record -g` of the server for the window's first
    /// 10 s; its samples by object and its hottest functions go to
    /// `OUT/profile-SERVER-SCENARIO-N.txt` (needs perf).
    #[arg(long)]
    profile: bool,
    #[arg(long, default_value = "bench-out/players")]
    out: PathBuf,
}

/// One step's figures.
struct Step {
    cpu_s: f64,
    rss_mb: f64,
    got: Receipt,
}

/// What a load's players got.
pub(super) struct Receipt {
    /// Packets, segments or bytes, as `unit` says.
    pub got: u64,
    pub unit: &'static str,
    /// Players that got nothing.
    pub silent: u64,
    /// RTP packets missing from the players' sequence numbers (RTSP over UDP and TCP), tags
    /// whose time went back (RTMP).
    pub lost: u64,
    /// Datagrams the kernel dropped at the load's own full receive buffers in the window (RTSP
    /// over UDP): missing, but not for the server's want.
    pub overflows: u64,
    /// RTP packets that came after a later one (reordered, not lost).
    pub late: u64,
}

/// The server's resident memory, MB.
fn rss_mb(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    Ok(kb / 1024.0)
}

/// The load's command line for `scenario` on server `s`.
pub(super) fn load_args(
    s: &Server,
    scenario: &str,
    n: usize,
    seconds: f64,
    json: &Path,
) -> anyhow::Result<Vec<String>> {
    let n = n.to_string();
    let secs = seconds.to_string();
    let rtsp = format!("rtsp://{}/{}", s.rtsp, s.path);
    let v: Vec<String> = match scenario {
        "rtsp" => vec!["bench", "rtsp-load", "--url", &rtsp, "--clients", &n, "--seconds", &secs]
            .into_iter()
            .map(String::from)
            .collect(),
        "rtsp-tcp" => vec!["bench", "rtsp-load", "--tcp", "--url", &rtsp, "--clients", &n, "--seconds", &secs]
            .into_iter()
            .map(String::from)
            .collect(),
        "hls" => vec!["bench", "hls-load", "--url", &s.hls, "--players", &n, "--seconds", &secs]
            .into_iter()
            .map(String::from)
            .collect(),
        "http" | "http-flv" => {
            let Some(relay) = &s.relay else { bail!("{scenario}: MPEG-TS and FLV over HTTP are fanout's only") };
            let api = format!("http://{}", relay.api);
            ["sub", "--api", &api, "--session", "bench", "--http", &n, "--record", "1316", "--duration", &secs]
                .into_iter()
                .map(String::from)
                .chain((scenario == "http-flv").then(|| "--flv".to_string()))
                .chain(["--json".into(), json.to_string_lossy().into_owned()])
                .collect()
        }
        "rtmp" | "srt" | "webrtc" => {
            let url = match scenario {
                "rtmp" => format!("rtmp://{}/live/bench", s.rtmp),
                "srt" => format!("srt://{}?streamid=read:{}", s.srt, s.path),
                _ => s.whep.clone(),
            };
            ["sub", "--read", &url, "--count", &n, "--duration", &secs].into_iter().map(String::from).collect()
        }
        other => bail!("scenario {other:?}: rtsp, rtsp-tcp, http, http-flv, hls, rtmp, srt or webrtc"),
    };
    Ok(v)
}

/// The word after `name` in a load's result line.
fn field(words: &[&str], name: &str) -> Option<u64> {
    words.iter().position(|w| *w == name).and_then(|i| words.get(i + 1)?.trim_matches(',').parse().ok())
}

/// One step: `n` players of `scenario` on a fresh `server` for `seconds`.
fn step(server: &str, scenario: &str, n: usize, seconds: f64, a: &PlayersArgs, dir: &Path) -> anyhow::Result<Step> {
    let s = start_server(server, &a.peers, dir)?;
    let _publisher = publish(&s, "rtsp", &dir.join("source.mp4"))?;
    // The first HLS segments are cut after a GOP or two.
    std::thread::sleep(Duration::from_secs(if scenario == "hls" { 7 } else { 3 }));
    let json = dir.join("sub.json");
    let _ = std::fs::remove_file(&json);
    let mut child = Command::new(std::env::current_exe()?)
        .args(load_args(&s, scenario, n, seconds, &json)?)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("load stdout")?).lines();
    let mut p = Proc(child);
    // Every load says it is ready (all its players set up) on a line of its own first.
    if !lines.next().and_then(Result::ok).is_some_and(|l| l.trim_end().ends_with("ready")) {
        let mut err = String::new();
        if let Some(mut e) = p.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        bail!("{n} {scenario} players of {server} did not get ready: {}", err.trim());
    }
    let cpu0 = process_cpu_s(s.pid)?;
    let started = std::time::Instant::now();
    let profile = a.profile.then(|| Profile::start(s.pid, seconds, &dir.join(format!("{server}-{scenario}-{n}.perf"))));
    // The result: the rest of the load's output (sub's JSON report may span lines).
    let mut rss = 0.0;
    let mut out = String::new();
    for l in lines.map_while(Result::ok) {
        if rss == 0.0 {
            // Taken as the window ends (the load's first result line).
            rss = rss_mb(s.pid)?;
        }
        out.push_str(&l);
        out.push('\n');
    }
    let cpu = process_cpu_s(s.pid)? - cpu0;
    let elapsed = started.elapsed().as_secs_f64();
    let _ = p.0.wait();
    if let Some(profile) = profile {
        let text = profile?.report()?;
        std::fs::write(a.out.join(format!("profile-{server}-{scenario}-{n}.txt")), text)?;
    }
    if elapsed < seconds * 0.9 {
        bail!("{n} {scenario} players of {server}: the load ended after {elapsed:.1} s: {out}");
    }
    Ok(Step { cpu_s: cpu, rss_mb: rss, got: receipt(scenario, &out, &json)? })
}

/// `perf record -g` of one process for the first part of a step's window.
struct Profile {
    perf: Proc,
    data: PathBuf,
}

impl Profile {
    /// Samples `pid` (999 a second, with call chains) for up to 10 s of a `seconds` window.
    fn start(pid: u32, seconds: f64, data: &Path) -> anyhow::Result<Self> {
        let secs = format!("{:.0}", seconds.clamp(1.0, 10.0));
        let perf = Command::new("perf")
            .args(["record", "-q", "-F", "999", "-g", "-p", &pid.to_string(), "-o"])
            .arg(data)
            .args(["--", "sleep", &secs])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("perf (Debian: linux-perf)")?;
        Ok(Self { perf: Proc(perf), data: data.to_path_buf() })
    }

    /// Its samples by object (kernel, the server, libc, libsrt), then by function (the 25
    /// hottest, self time), as `perf report` prints them.
    fn report(mut self) -> anyhow::Result<String> {
        self.perf.0.wait()?;
        let mut text = String::new();
        for sort in [["--sort", "dso"], ["--sort", "dso,sym"]] {
            let out = Command::new("perf")
                .args(["report", "--stdio", "--no-children", "-g", "none", "--percent-limit", "0.5", "-i"])
                .arg(&self.data)
                .args(sort)
                .output()?;
            let lines = String::from_utf8_lossy(&out.stdout);
            let rows = lines.lines().filter(|l| !l.trim().is_empty() && (!l.starts_with('#') || l.contains("Samples")));
            text.extend(rows.take(if sort[1] == "dso" { 12 } else { 26 }).map(|l| format!("{l}\n")));
            text.push('\n');
        }
        let _ = std::fs::remove_file(&self.data);
        Ok(text)
    }
}

/// What a load's players got, from its output (and `sub --http`'s report at `json`).
pub(super) fn receipt(scenario: &str, out: &str, json: &Path) -> anyhow::Result<Receipt> {
    let words: Vec<&str> =
        out.split(|c: char| c.is_whitespace() || c == ':' || c == '"').filter(|w| !w.is_empty()).collect();
    Ok(match scenario {
        "rtsp" | "rtsp-tcp" => Receipt {
            got: field(&words, "packets").context("rtsp-load's result")?,
            unit: "RTP packets",
            silent: u64::from(field(&words, "min") == Some(0)),
            lost: field(&words, "lost").unwrap_or(0),
            overflows: field(&words, "overflows").unwrap_or(0),
            late: field(&words, "late").unwrap_or(0),
        },
        "hls" => Receipt {
            got: field(&words, "segments").context("hls-load's result")?,
            unit: "segments",
            silent: field(&words, "starved").context("hls-load's result")?,
            lost: 0,
            overflows: 0,
            late: 0,
        },
        "http" | "http-flv" => {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(json).context("sub's report")?).context("sub's report")?;
            let groups = v["groups"].as_array().cloned().unwrap_or_default();
            let sum = |k: &str| groups.iter().filter_map(|g| g[k].as_u64()).sum();
            Receipt { got: sum("bytes"), unit: "bytes", silent: sum("silent"), lost: 0, overflows: 0, late: 0 }
        }
        _ => {
            let v: serde_json::Value =
                serde_json::from_str(out.lines().last().unwrap_or("")).context("sub --read's result")?;
            let least = v["least_bytes"].as_u64().unwrap_or(0);
            // RTMP: a player with no tag is silent too, and one out of order is counted lost.
            let no_tags = v["least_tags"].as_u64() == Some(0);
            Receipt {
                got: v["bytes"].as_u64().unwrap_or(0),
                unit: "bytes",
                silent: u64::from(least == 0 || no_tags),
                lost: v["out_of_order"].as_u64().unwrap_or(0),
                overflows: 0,
                late: 0,
            }
        }
    })
}

/// A row of the table: server, scenario, players, round, and the step's figures.
type Row = (String, String, usize, usize, f64, f64, f64, u64, String, u64, u64);

pub fn run(mut a: PlayersArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.players, a.seconds, a.rounds) = (vec![20], 4.0, 1);
        a.scenarios.retain(|s| ["rtsp", "rtsp-tcp", "http", "hls"].contains(&s.as_str()));
    } else if a.long {
        a.seconds = 180.0;
    }
    if !a.peers.join("mediamtx").exists() && a.servers.iter().any(|s| s == "mediamtx") {
        eprintln!("*** MediaMTX is not in {} (scripts/install-peers): fanout alone ***", a.peers.display());
        a.servers.retain(|s| s != "mediamtx");
    }
    super::ensure_dir(&a.out)?;
    let dir = std::env::temp_dir().join(format!("fanout-bench-players-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    match &a.clip {
        Some(c) => {
            std::fs::copy(c, dir.join("source.mp4")).with_context(|| format!("--clip {}", c.display())).map(drop)?
        }
        None => std::fs::write(dir.join("source.mp4"), SRS_SOURCE)?,
    }
    let plan: Vec<(usize, usize, &String, &String)> = (0..a.rounds)
        .flat_map(|round| a.players.iter().map(move |&n| (round, n)))
        .flat_map(|(round, n)| a.scenarios.iter().map(move |sc| (round, n, sc)))
        .flat_map(|(round, n, sc)| a.servers.iter().map(move |sv| (round, n, sc, sv)))
        .filter(|(_, _, sc, sv)| !(["http", "http-flv"].contains(&sc.as_str()) && sv.as_str() != "fanout"))
        .map(|(round, n, sc, sv)| {
            let n = if ["srt", "webrtc"].contains(&sc.as_str()) { n.min(a.thread_players) } else { n };
            (round, n, sc, sv)
        })
        .collect();
    let mut bar = progress(plan.len() as u64, "bench players");
    let csv_path = a.out.join("players.csv");
    let mut csv = String::from(
        "server,scenario,players,round,cpu_s,seconds,core_pct,players_per_core,rss_mb,got,unit,silent,lost\n",
    );
    let mut rows: Vec<Row> = Vec::new();
    for (round, n, scenario, server) in plan {
        bar.set_message(format!("round {} · {server} · {n} {scenario} players", round + 1));
        // A step that fails (a server that cannot take so many) is said and left out; the
        // run goes on.
        let st = match step(server, scenario, n, a.seconds, &a, &dir) {
            Ok(st) => st,
            Err(e) if !a.quick => {
                bar.println(format!("{server:>8} {scenario:>8} × {n:>5}: FAILED: {e:#}"));
                bar.inc(1);
                continue;
            }
            Err(e) => return Err(e.context(format!("{server}, {n} {scenario}"))),
        };
        let core = st.cpu_s / a.seconds;
        let per_core = n as f64 / core.max(1e-9);
        csv += &format!(
            "{server},{scenario},{n},{round},{:.2},{:.0},{:.1},{per_core:.0},{:.1},{},{},{},{}\n",
            st.cpu_s,
            a.seconds,
            100.0 * core,
            st.rss_mb,
            st.got.got,
            st.got.unit,
            st.got.silent,
            st.got.lost
        );
        bar.println(format!(
            "{server:>8} {scenario:>8} × {n:>5}: {:5.1}% of a core, {per_core:7.0} players per core, RSS {:6.1} MB, {} {}{}{}",
            100.0 * core,
            st.rss_mb,
            st.got.got,
            st.got.unit,
            if st.got.silent > 0 { format!(", {} got nothing", st.got.silent) } else { String::new() },
            if st.got.lost > 0 { format!(", {} {}", st.got.lost, lost_what(scenario)) } else { String::new() },
        ));
        if st.got.overflows > 0 || st.got.late > 0 {
            bar.println(format!(
                "{:>27} {} came out of order (late, not missing); the load's own full receive buffers dropped {}",
                "", st.got.late, st.got.overflows
            ));
        }
        rows.push((
            server.clone(),
            scenario.clone(),
            n,
            round,
            st.cpu_s,
            100.0 * core,
            st.rss_mb,
            st.got.got,
            st.got.unit.to_string(),
            st.got.silent,
            st.got.lost,
        ));
        std::fs::write(&csv_path, &csv)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);
    report(&a, &rows)?;
    println!("\nCSV: {}", csv_path.display());
    Ok(())
}

/// What a scenario's `lost` counts.
fn lost_what(scenario: &str) -> &'static str {
    if scenario == "rtmp" {
        "tags out of order"
    } else {
        "RTP packets missing"
    }
}

/// The table in the peers' columns, and the plot: players per core by scenario.
fn report(a: &PlayersArgs, rows: &[Row]) -> anyhow::Result<()> {
    println!("\n| Server | Scenario | Clients | CPU | players per core | RSS | loss |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | --- |");
    for r in rows {
        let what = lost_what(&r.1);
        let loss = match (r.9, r.10) {
            (0, 0) => "0".to_string(),
            (s, 0) => format!("{s} players got nothing"),
            (0, l) => format!("{l} {what}"),
            (s, l) => format!("{s} silent, {l} {what}"),
        };
        let per_core = r.2 as f64 * 100.0 / r.5.max(1e-9);
        println!("| {} | {} | {} | {:.1}% | {per_core:.0} | {:.0} MB | {loss} |", r.0, r.1, r.2, r.5, r.6);
    }
    let series = a
        .servers
        .iter()
        .flat_map(|s| a.scenarios.iter().map(move |sc| (s, sc)))
        .filter_map(|(s, sc)| {
            let mine: Vec<&Row> = rows.iter().filter(|r| &r.0 == s && &r.1 == sc).collect();
            let mut ns: Vec<usize> = mine.iter().map(|r| r.2).collect();
            ns.sort_unstable();
            ns.dedup();
            let pts: Vec<(f64, f64)> = ns
                .iter()
                .map(|&n| {
                    let v: Vec<f64> =
                        mine.iter().filter(|r| r.2 == n).map(|r| n as f64 * 100.0 / r.5.max(1e-9)).collect();
                    (n as f64, v.iter().sum::<f64>() / v.len() as f64)
                })
                .collect();
            (!pts.is_empty()).then(|| (format!("{s}, {sc}"), pts))
        })
        .collect();
    let png = a.out.join("players.png");
    super::plot::panels(
        &png,
        "Players per core: one 232 kbit/s stream, N players of one kind",
        "players",
        true,
        &[super::plot::Panel { y_label: "players per core", series, log_y: true }],
    )?;
    println!("PNG: {}", png.display());
    Ok(())
}
