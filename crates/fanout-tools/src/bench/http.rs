//! `fanout bench http`: what a subscriber costs the relay by how it watches one session (the
//! demo clip as a looped `file` source, H.264 + AAC in MPEG-TS, ~350 kbit/s): its TS over UDP
//! (`sub --udp`), its H.264 and AAC as RTP over UDP (RTSP clients, `bench rtsp-load`), its TS
//! over HTTP (`sub --http`, repackaged nowhere: the file is TS), and HLS (`bench hls-load`:
//! players polling the playlist and fetching each new fMP4 segment). Each load tool is its
//! own process; the figure is the relay's own CPU over the window, per subscriber.

use super::{process_cpu_s, progress, start_sub, wait, Proc, RelayProc};
use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct HttpArgs {
    /// How the subscribers watch: udp (TS datagrams), rtsp (RTP over UDP), http (TS over
    /// HTTP), hls.
    #[arg(long, value_delimiter = ',', default_value = "udp,rtsp,http,hls")]
    kinds: Vec<String>,
    /// Subscriber counts to step through.
    #[arg(long, value_delimiter = ',', default_value = "250,1000")]
    subscribers: Vec<usize>,
    /// Seconds measured per kind and step.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Rounds: the kinds alternate, so drift on a noisy machine hits all alike.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// A short run (20 subscribers of each kind, 3 s, one round) that checks the bench works.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "bench-out/http")]
    out: PathBuf,
}

/// (internal) N HLS players in one process: each polls the playlist once a second and
/// fetches every segment it lists that the player has not had (from the newest at start),
/// over `threads` keep-alive connections.
#[derive(Args)]
pub struct HlsLoadArgs {
    /// The playlist's URL (`…/hls/index.m3u8`).
    #[arg(long)]
    url: String,
    #[arg(long)]
    players: usize,
    #[arg(long)]
    seconds: f64,
    /// Threads (each with one connection) the players are spread over.
    #[arg(long, default_value_t = 32)]
    threads: usize,
}

/// One player: its media playlist's URL (named for it by the relay's multivariant playlist)
/// and the newest segment number it has.
struct Player {
    media: Option<String>,
    have: Option<u64>,
}

/// The media playlist a playlist at `url` leads to: its variant's URI, resolved, or `url`
/// itself when it is a media playlist.
fn media_playlist(agent: &ureq::Agent, url: &str, base: &str) -> anyhow::Result<String> {
    let list = agent.get(url).call().context("playlist")?.into_string()?;
    if !list.contains("#EXT-X-STREAM-INF") {
        return Ok(url.to_string());
    }
    let uri = list.lines().find(|l| !l.is_empty() && !l.starts_with('#')).context("a variant in the playlist")?;
    Ok(if uri.contains("://") { uri.to_string() } else { format!("{base}/{uri}") })
}

pub fn hls_load(a: HlsLoadArgs) -> anyhow::Result<()> {
    let base = a.url.rsplit_once('/').map(|(b, _)| b.to_string()).context("a playlist URL")?;
    let threads = a.threads.clamp(1, a.players.max(1));
    // The init segment, once, as every player starts with it.
    let init = ureq::get(&format!("{base}/init.mp4")).call().context("init.mp4")?;
    if init.status() != 200 {
        bail!("init.mp4: HTTP {}", init.status());
    }
    println!("hls-load: ready");
    std::io::stdout().flush()?;
    let end = Instant::now() + Duration::from_secs_f64(a.seconds.min(600.0));
    let per = a.players.div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (url, base) = (a.url.clone(), base.clone());
            let n = per.min(a.players.saturating_sub(t * per));
            std::thread::spawn(move || -> anyhow::Result<(u64, u64, u64)> {
                let agent = ureq::agent();
                let mut players: Vec<Player> = (0..n).map(|_| Player { media: None, have: None }).collect();
                let (mut requests, mut segments, mut bytes) = (0u64, 0u64, 0u64);
                // Each player polls once a second, the thread's players spread over it.
                let gap = Duration::from_secs_f64(1.0 / n.max(1) as f64);
                let mut next = Instant::now();
                'run: while Instant::now() < end {
                    for p in players.iter_mut() {
                        if Instant::now() >= end {
                            break 'run;
                        }
                        let media: &str = match p.media {
                            Some(ref m) => m,
                            None => {
                                requests += 1;
                                p.media.insert(media_playlist(&agent, &url, &base)?)
                            }
                        };
                        let list = agent.get(media).call().context("playlist")?.into_string()?;
                        requests += 1;
                        bytes += list.len() as u64;
                        // Segment URIs: `N.m4s`, with a query after it where the relay wants a token.
                        let listed: Vec<(u64, &str)> = list
                            .lines()
                            .filter(|l| !l.starts_with('#'))
                            .filter_map(|l| {
                                let (file, _) = l.split_once('?').unwrap_or((l, ""));
                                Some((file.strip_suffix(".m4s")?.rsplit('/').next()?.parse().ok()?, l))
                            })
                            .collect();
                        let newest = listed.iter().map(|s| s.0).max();
                        let from = p.have.map_or(newest, |h| Some(h + 1));
                        for (seg, uri) in listed.iter().filter(|s| from.is_some_and(|f| s.0 >= f)) {
                            let r = agent.get(&format!("{base}/{uri}")).call().context("segment")?;
                            let mut body = Vec::new();
                            std::io::Read::read_to_end(&mut r.into_reader(), &mut body)?;
                            requests += 1;
                            segments += 1;
                            bytes += body.len() as u64;
                            p.have = Some(*seg);
                        }
                        next += gap;
                        if let Some(d) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(d);
                        }
                    }
                }
                Ok((requests, segments, bytes))
            })
        })
        .collect();
    let (mut requests, mut segments, mut bytes) = (0, 0, 0);
    for h in handles {
        let (r, s, b) = h.join().map_err(|_| anyhow::anyhow!("a player thread panicked"))??;
        (requests, segments, bytes) = (requests + r, segments + s, bytes + b);
    }
    println!("hls-load: requests {requests} segments {segments} bytes {bytes}");
    Ok(())
}

/// What one step delivered: bytes, and the subscribers that got nothing.
struct Delivered {
    bytes: u64,
    silent: u64,
}

/// Runs `kind` with `n` subscribers for `seconds`; the relay's CPU seconds and what arrived.
fn step(
    relay: &RelayProc,
    kind: &str,
    n: usize,
    seconds: f64,
    tmp: &std::path::Path,
) -> anyhow::Result<(f64, Delivered)> {
    let api = format!("http://{}", relay.api);
    match kind {
        "udp" | "http" => {
            let json = tmp.join("sub.json");
            let _ = std::fs::remove_file(&json);
            // TS records as the file sends them (7 × 188 B); HTTP subscribers cut the stream
            // into records of the same size (`--record` counts an RTP header they do not get).
            let args: Vec<String> = [
                "--api",
                &api,
                "--session",
                "clip",
                &format!("--{kind}"),
                &n.to_string(),
                "--record",
                "1328",
                "--duration",
                &seconds.to_string(),
                "--json",
                json.to_str().context("temp path")?,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let mut sub = start_sub(&args, Duration::from_secs(30 + n as u64 / 50))?;
            let cpu0 = process_cpu_s(relay.pid())?;
            wait(&mut sub, Duration::from_secs_f64(seconds + 60.0))?;
            let cpu = process_cpu_s(relay.pid())? - cpu0;
            let report: Value = serde_json::from_slice(&std::fs::read(&json).context("sub's report")?)?;
            let groups = report["groups"].as_array().cloned().unwrap_or_default();
            let sum = |k: &str| groups.iter().filter_map(|g| g[k].as_u64()).sum();
            Ok((cpu, Delivered { bytes: sum("bytes"), silent: sum("silent") }))
        }
        "rtsp" | "hls" => {
            let rtsp = relay.client().call("GET", "/v1/engine", None)?["rtsp"].as_str().unwrap_or("").to_string();
            let args: Vec<String> = if kind == "rtsp" {
                vec!["rtsp-load".into(), "--url".into(), format!("rtsp://{rtsp}/clip"), "--clients".into()]
            } else {
                vec![
                    "hls-load".into(),
                    "--url".into(),
                    format!("{api}/v1/sessions/clip/hls/index.m3u8"),
                    "--players".into(),
                ]
            };
            let mut child = Command::new(std::env::current_exe()?)
                .arg("bench")
                .args(args)
                .args([n.to_string(), "--seconds".into(), seconds.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            let mut lines = BufReader::new(child.stdout.take().context("load stdout")?).lines();
            let mut p = Proc(child);
            if !lines.next().and_then(Result::ok).is_some_and(|l| l.ends_with(": ready")) {
                let mut err = String::new();
                if let Some(mut e) = p.0.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                bail!("the {kind} load did not get ready: {}", err.trim());
            }
            let cpu0 = process_cpu_s(relay.pid())?;
            let result = lines.next().and_then(Result::ok).context("the load ended without a result")?;
            let cpu = process_cpu_s(relay.pid())? - cpu0;
            wait(&mut p, Duration::from_secs(30))?;
            let words: Vec<&str> = result.split_whitespace().collect();
            let field = |name: &str| words.iter().position(|w| *w == name).and_then(|i| words.get(i + 1)?.parse().ok());
            // rtsp-load: "packets N min A max B bytes N"; hls-load: "... bytes N".
            let silent = if kind == "rtsp" { u64::from(field("min") == Some(0)) } else { 0 };
            Ok((cpu, Delivered { bytes: field("bytes").context("odd load result")?, silent }))
        }
        other => bail!("kind {other:?}: expected udp, rtsp, http or hls"),
    }
}

pub fn run(mut a: HttpArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.subscribers, a.seconds, a.rounds) = (vec![20], 3.0, 1);
    }
    super::ensure_dir(&a.out)?;
    let tmp = std::env::temp_dir().join(format!("fanout-bench-http-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let clip = tmp.join("demo.ts");
    std::fs::write(&clip, fanout_io::DEMO_TS)?;
    let csv_path = a.out.join("http.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "kind,subscribers,round,relay_cpu_s,seconds,core_pct,core_pct_per_1000,bytes,mbit_s,cpu_ms_per_mb,silent"
    )?;
    let steps = (a.rounds * a.subscribers.len() * a.kinds.len()) as u64;
    let mut pb = progress(steps, "bench http");
    let mut results: Vec<(String, usize, f64, f64)> = Vec::new(); // kind, n, % per 1000, ms per MB
    for round in 0..a.rounds {
        for &n in &a.subscribers {
            for kind in &a.kinds {
                pb.set_message(format!("{kind}, {n} subscribers, round {}", round + 1));
                // A fresh relay per step: nothing of the last step's subscribers lingers.
                let relay = RelayProc::start(&["--file-root", &tmp.to_string_lossy()])?;
                let spec = serde_json::json!({ "name": "clip", "source": { "file": clip } });
                relay.client().call("POST", "/v1/sessions", Some(spec))?;
                if kind == "hls" {
                    // The first segment is cut 2 s after the first keyframe.
                    std::thread::sleep(Duration::from_secs(5));
                }
                let (cpu, d) = step(&relay, kind, n, a.seconds, &tmp).with_context(|| format!("{kind} with {n}"))?;
                let pct = 100.0 * cpu / a.seconds;
                let per_1000 = pct * 1000.0 / n as f64;
                let mbit = d.bytes as f64 * 8.0 / 1e6 / a.seconds;
                let ms_mb = 1e3 * cpu / (d.bytes.max(1) as f64 / 1e6);
                writeln!(
                    csv,
                    "{kind},{n},{round},{cpu:.3},{:.1},{pct:.2},{per_1000:.2},{},{mbit:.1},{ms_mb:.3},{}",
                    a.seconds, d.bytes, d.silent
                )?;
                pb.println(format!(
                    "{kind:>5} {n:>5} subscribers: relay {pct:5.1}% of a core ({per_1000:5.2}% per 1000), {mbit:7.1} Mbit/s delivered, {ms_mb:6.2} ms CPU per MB{}",
                    if d.silent > 0 { format!(", {} got nothing", d.silent) } else { String::new() }
                ));
                results.push((kind.clone(), n, per_1000, ms_mb));
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    let _ = std::fs::remove_dir_all(&tmp);
    let mean = |kind: &str, n: usize, mb: bool| {
        let v: Vec<f64> =
            results.iter().filter(|r| r.0 == kind && r.1 == n).map(|r| if mb { r.3 } else { r.2 }).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    println!("\nmean relay CPU, % of a core per 1000 subscribers, and ms of CPU per delivered MB:");
    for &n in &a.subscribers {
        for kind in &a.kinds {
            println!("  {n:>5} {kind:>5}: {:6.2}% per 1000  {:6.2} ms/MB", mean(kind, n, false), mean(kind, n, true));
        }
    }
    let series = |mb: bool| {
        a.kinds
            .iter()
            .map(|k| (k.clone(), a.subscribers.iter().map(|&n| (n as f64, mean(k, n, mb))).collect()))
            .collect()
    };
    let png = a.out.join("http.png");
    super::plot::panels(
        &png,
        "One session's subscribers by how they watch: relay CPU",
        "subscribers",
        false,
        &[
            super::plot::Panel { y_label: "% of a core per 1000 subscribers", series: series(false), log_y: false },
            super::plot::Panel { y_label: "CPU ms per delivered MB", series: series(true), log_y: false },
        ],
    )?;
    println!("\nCSV: {}\nPNG: {}", csv_path.display(), png.display());
    Ok(())
}
