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
    /// How the subscribers watch: udp (TS datagrams), rtsp (RTP over UDP), rtsp-tcp (RTP
    /// interleaved on the RTSP connection), http (TS over HTTP), hls.
    #[arg(long, value_delimiter = ',', default_value = "udp,rtsp,rtsp-tcp,http,hls")]
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
    /// The stream: an MPEG-TS file played in a loop (default: the demo clip, ~350 kbit/s).
    #[arg(long)]
    clip: Option<PathBuf>,
    /// Another build of fanout (its binary) whose relay is measured beside this one's, kind
    /// by kind, its rows labelled `KIND (baseline)`: a change's before and after in one run.
    #[arg(long)]
    baseline: Option<PathBuf>,
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
fn media_playlist(agent: &ureq::Agent, url: &str) -> anyhow::Result<String> {
    let list = agent.get(url).call().context("playlist")?.into_string()?;
    if !list.contains("#EXT-X-STREAM-INF") {
        return Ok(url.to_string());
    }
    let uri = list.lines().find(|l| !l.is_empty() && !l.starts_with('#')).context("a variant in the playlist")?;
    Ok(resolve(url, uri.trim()))
}

/// A media playlist's segments with their media sequence numbers (`#EXT-X-MEDIA-SEQUENCE`
/// counts from the first listed), and its initialization segment's URI.
fn listed(list: &str) -> (Vec<(u64, &str)>, Option<&str>) {
    let mut seq: u64 =
        list.lines().find_map(|l| l.strip_prefix("#EXT-X-MEDIA-SEQUENCE:")?.trim().parse().ok()).unwrap_or(0);
    let map = list.lines().find_map(|l| l.strip_prefix("#EXT-X-MAP:")?.split("URI=\"").nth(1)?.split('"').next());
    let mut out = Vec::new();
    for l in list.lines().map(str::trim) {
        if !l.is_empty() && !l.starts_with('#') {
            out.push((seq, l));
            seq += 1;
        }
    }
    (out, map)
}

/// `uri` as seen from a playlist at `url`.
fn resolve(url: &str, uri: &str) -> String {
    if uri.contains("://") {
        return uri.to_string();
    }
    let base = url.split('?').next().unwrap_or(url);
    let dir = base.rsplit_once('/').map_or(base, |(d, _)| d);
    format!("{dir}/{uri}")
}

pub fn hls_load(a: HlsLoadArgs) -> anyhow::Result<()> {
    let threads = a.threads.clamp(1, a.players.max(1));
    // The init segment, once, as every player starts with it (what the media playlist's
    // `#EXT-X-MAP` names).
    let agent = ureq::agent();
    let media = media_playlist(&agent, &a.url)?;
    let list = agent.get(&media).call().context("media playlist")?.into_string()?;
    let init = resolve(&media, listed(&list).1.context("no #EXT-X-MAP in the media playlist")?);
    let r = agent.get(&init).call().with_context(|| init.clone())?;
    if r.status() != 200 {
        bail!("{init}: HTTP {}", r.status());
    }
    println!("hls-load: ready");
    std::io::stdout().flush()?;
    let end = Instant::now() + Duration::from_secs_f64(a.seconds.min(600.0));
    let per = a.players.div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let url = a.url.clone();
            let n = per.min(a.players.saturating_sub(t * per));
            std::thread::spawn(move || -> anyhow::Result<(u64, u64, u64, u64)> {
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
                                p.media.insert(media_playlist(&agent, &url)?)
                            }
                        };
                        let list = agent.get(media).call().context("playlist")?.into_string()?;
                        requests += 1;
                        bytes += list.len() as u64;
                        let (listed, _) = listed(&list);
                        let newest = listed.iter().map(|s| s.0).max();
                        let from = p.have.map_or(newest, |h| Some(h + 1));
                        for (seg, uri) in listed.iter().filter(|s| from.is_some_and(|f| s.0 >= f)) {
                            let r = agent.get(&resolve(media, uri)).call().context("segment")?;
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
                let starved = players.iter().filter(|p| p.have.is_none()).count() as u64;
                Ok((requests, segments, bytes, starved))
            })
        })
        .collect();
    let (mut requests, mut segments, mut bytes, mut starved) = (0, 0, 0, 0);
    for h in handles {
        let (r, s, b, z) = h.join().map_err(|_| anyhow::anyhow!("a player thread panicked"))??;
        (requests, segments, bytes, starved) = (requests + r, segments + s, bytes + b, starved + z);
    }
    println!("hls-load: requests {requests} segments {segments} bytes {bytes} starved {starved}");
    Ok(())
}

/// What one step delivered: bytes, and the subscribers that got nothing.
struct Delivered {
    bytes: u64,
    silent: u64,
    /// RTP packets missing from the interleaved subscribers' sequence numbers.
    lost: u64,
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
            Ok((cpu, Delivered { bytes: sum("bytes"), silent: sum("silent"), lost: 0 }))
        }
        "rtsp" | "rtsp-tcp" | "hls" => {
            let rtsp = relay.client().call("GET", "/v1/engine", None)?["rtsp"].as_str().unwrap_or("").to_string();
            let args: Vec<String> = if kind.starts_with("rtsp") {
                let mut v = vec!["rtsp-load".into(), "--url".into(), format!("rtsp://{rtsp}/clip")];
                if kind == "rtsp-tcp" {
                    v.push("--tcp".into());
                }
                v.push("--clients".into());
                v
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
            // rtsp-load: "packets N min A max B bytes N [lost L]"; hls-load: "... bytes N".
            let silent = if kind.starts_with("rtsp") { u64::from(field("min") == Some(0)) } else { 0 };
            let lost = field("lost").unwrap_or(0);
            Ok((cpu, Delivered { bytes: field("bytes").context("odd load result")?, silent, lost }))
        }
        other => bail!("kind {other:?}: expected udp, rtsp, rtsp-tcp, http or hls"),
    }
}

pub fn run(mut a: HttpArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.subscribers, a.seconds, a.rounds) = (vec![20], 3.0, 1);
    }
    super::ensure_dir(&a.out)?;
    let tmp = std::env::temp_dir().join(format!("fanout-bench-http-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let clip = tmp.join("clip.ts");
    match &a.clip {
        Some(c) => std::fs::copy(c, &clip).with_context(|| format!("--clip {}", c.display())).map(|_| ())?,
        None => std::fs::write(&clip, fanout_io::DEMO_TS)?,
    }
    let csv_path = a.out.join("http.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "kind,subscribers,round,relay_cpu_s,seconds,core_pct,core_pct_per_1000,bytes,mbit_s,cpu_ms_per_mb,silent,lost"
    )?;
    // Each kind on this build, then on the baseline's.
    let this = std::env::current_exe()?;
    let mut runs: Vec<(String, &str, &std::path::Path)> = Vec::new();
    for kind in &a.kinds {
        runs.push((kind.clone(), kind, &this));
        if let Some(b) = &a.baseline {
            if !b.is_file() {
                bail!("--baseline {}: no such file", b.display());
            }
            runs.push((format!("{kind} (baseline)"), kind, b));
        }
    }
    let steps = (a.rounds * a.subscribers.len() * runs.len()) as u64;
    let mut pb = progress(steps, "bench http");
    let mut results: Vec<(String, usize, f64, f64)> = Vec::new(); // label, n, % per 1000, ms per MB
    for round in 0..a.rounds {
        for &n in &a.subscribers {
            for (label, kind, bin) in &runs {
                let kind = *kind;
                pb.set_message(format!("{label}, {n} subscribers, round {}", round + 1));
                // A fresh relay per step: nothing of the last step's subscribers lingers.
                let relay = RelayProc::start_bin(bin, &["--file-root", &tmp.to_string_lossy()])?;
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
                    "{label},{n},{round},{cpu:.3},{:.1},{pct:.2},{per_1000:.2},{},{mbit:.1},{ms_mb:.3},{},{}",
                    a.seconds, d.bytes, d.silent, d.lost
                )?;
                pb.println(format!(
                    "{label:>8} {n:>5} subscribers: relay {pct:5.1}% of a core ({per_1000:5.2}% per 1000), {mbit:7.1} Mbit/s delivered, {ms_mb:6.2} ms CPU per MB{}{}",
                    if d.silent > 0 { format!(", {} got nothing", d.silent) } else { String::new() },
                    if d.lost > 0 { format!(", {} RTP packets missing", d.lost) } else { String::new() }
                ));
                results.push((label.clone(), n, per_1000, ms_mb));
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
        for (label, ..) in &runs {
            let per_core = 100.0 * 1000.0 / mean(label, n, false);
            println!(
                "  {n:>5} {label:>19}: {:6.2}% per 1000  {:6.2} ms/MB  {per_core:8.0} subscribers per core",
                mean(label, n, false),
                mean(label, n, true)
            );
        }
    }
    let series = |mb: bool| {
        runs.iter()
            .map(|(k, ..)| (k.clone(), a.subscribers.iter().map(|&n| (n as f64, mean(k, n, mb))).collect()))
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

#[cfg(test)]
mod tests {
    use super::{listed, resolve};

    /// fanout's playlists and MediaMTX's (LL-HLS: parts, other names) read alike.
    #[test]
    fn segments_are_numbered_by_the_media_sequence() {
        let fanout = "#EXTM3U\n#EXT-X-MAP:URI=\"init.mp4?token=t\"\n#EXT-X-MEDIA-SEQUENCE:7\n#EXTINF:2.000,\n7.m4s?token=t\n#EXTINF:2.000,\n8.m4s?token=t\n";
        assert_eq!(listed(fanout), (vec![(7, "7.m4s?token=t"), (8, "8.m4s?token=t")], Some("init.mp4?token=t")));
        let mtx = "#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:3\n#EXT-X-MAP:URI=\"a1_init.mp4\"\n#EXT-X-PART:DURATION=0.2,URI=\"a1_part9.mp4\"\n#EXTINF:2.00000,\na1_seg3.mp4\n#EXTINF:2.00000,\na1_seg4.mp4\n#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"a1_part10.mp4\"\n";
        assert_eq!(listed(mtx), (vec![(3, "a1_seg3.mp4"), (4, "a1_seg4.mp4")], Some("a1_init.mp4")));
        assert_eq!(
            resolve("http://h:1/live/bench/stream.m3u8?x=1", "a1_seg3.mp4"),
            "http://h:1/live/bench/a1_seg3.mp4"
        );
        assert_eq!(resolve("http://h/a/index.m3u8", "http://o/x.mp4"), "http://o/x.mp4");
    }
}
