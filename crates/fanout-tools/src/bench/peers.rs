//! `fanout bench peers`: fanout against MediaMTX on the ways encoders and players use, side by
//! side in one run, each server measured by its own process CPU:
//!
//! - **ingest**: ffmpeg publishes one high-rate clip (H.264 + AAC, `--ingest-kbps`, made once
//!   by ffmpeg) over RTSP, RTMP and SRT, nobody watching; the figure is the server's CPU per
//!   megabyte it took in, and per RTP packet of the stream (the packets fanout's tracks
//!   counted of the same clip at the same rate).
//! - **readers**: ffmpeg publishes a clip over RTSP (`--readers-kbps`, 200 kbit/s unless
//!   told); N RTMP players, N SRT
//!   readers or N WebRTC viewers (WHEP, H.264 only), all in one load process (`fanout sub
//!   --read`); the figure is how many such
//!   readers one core of the server serves: N over the CPU the readers add to the server
//!   (its CPU with the publisher alone is measured in the same round and taken off).
//!
//! Steps alternate between the servers round by round. Writes `peers.csv` and `peers.png`.

use super::{process_cpu_s, progress, start_sub_reporting, wait, Proc, RelayProc};
use anyhow::{bail, Context};
use clap::Args;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct PeersArgs {
    /// Where scripts/install-peers put MediaMTX.
    #[arg(long, default_value = ".peers")]
    peers: PathBuf,
    /// Ways in to measure: rtsp, rtmp, srt.
    #[arg(long, value_delimiter = ',', default_value = "rtsp,rtmp,srt")]
    ingest: Vec<String>,
    /// The ingest clip's bit rate, kbit/s (MediaMTX's SRT input refuses 20 Mbit/s 720p:
    /// "max recorded size exceeded").
    #[arg(long, default_value_t = 8_000)]
    ingest_kbps: u32,
    /// Ways out to measure readers on: rtmp, srt, whep (WebRTC viewers).
    #[arg(long, value_delimiter = ',', default_value = "rtmp,srt,whep")]
    over: Vec<String>,
    /// Readers per step.
    #[arg(long, value_delimiter = ',', default_value = "50,200")]
    readers: Vec<usize>,
    /// The readers' clip's bit rate, kbit/s (a 480p stream at 1500).
    #[arg(long, default_value_t = 200)]
    readers_kbps: u32,
    /// Seconds measured per step.
    #[arg(long, default_value_t = 15.0)]
    seconds: f64,
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    #[arg(long, default_value = "bench-out/peers")]
    out: PathBuf,
    /// Redraw the plot and the summary from `OUT/peers.csv` without measuring.
    #[arg(long)]
    replot: bool,
}

const SERVERS: [&str; 2] = ["fanout", "mediamtx"];

/// A server under test with its ports, and the path name clients use on it.
pub(super) struct Server {
    pub pid: u32,
    pub rtsp: SocketAddr,
    pub rtmp: SocketAddr,
    pub srt: SocketAddr,
    /// The path's WHEP URL.
    pub whep: String,
    /// The path's HLS playlist.
    pub hls: String,
    /// MediaMTX names a path by RTMP's app and key together; fanout by the key.
    pub path: &'static str,
    /// fanout's API, for its counters.
    pub relay: Option<RelayProc>,
    _procs: Vec<Proc>,
}

fn free_tcp() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn free_udp() -> anyhow::Result<SocketAddr> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?)
}

/// fanout on free ports with path `bench` taking publishers: made through the API, or by
/// `config` (which must name it).
pub(super) fn fanout_server(config: Option<&Path>) -> anyhow::Result<Server> {
    let (rtsp, rtmp, srt, media) = (free_tcp()?, free_tcp()?, free_udp()?, free_udp()?);
    let ports = [rtsp.to_string(), rtmp.to_string(), srt.to_string(), media.to_string()];
    let mut args = vec!["--rtsp", &ports[0], "--rtmp", &ports[1], "--srt", &ports[2], "--webrtc", &ports[3]];
    if let Some(c) = config {
        args.extend(["--config", c.to_str().context("a UTF-8 config path")?]);
    }
    let relay = RelayProc::start(&args)?;
    if config.is_none() {
        relay.client().call(
            "POST",
            "/v1/sessions",
            Some(serde_json::json!({ "name": "bench", "source": { "publish": true } })),
        )?;
    }
    let whep = format!("http://{}/bench/whep", relay.api);
    let hls = format!("http://{}/v1/sessions/bench/hls/index.m3u8", relay.api);
    Ok(Server { pid: relay.pid(), rtsp, rtmp, srt, whep, hls, path: "bench", relay: Some(relay), _procs: Vec::new() })
}

pub(super) fn start_server(name: &str, peers: &Path, dir: &Path) -> anyhow::Result<Server> {
    if name == "fanout" {
        return fanout_server(None);
    }
    let (rtsp, rtmp, srt, media) = (free_tcp()?, free_tcp()?, free_udp()?, free_udp()?);
    let bin = peers.join("mediamtx");
    if !bin.exists() {
        bail!("{} is missing: run scripts/install-peers", bin.display());
    }
    // A free even/odd pair for its RTP over UDP, let go before it binds them.
    let pair = {
        let (rtp, _rtcp) = fanout_io::sys::port_pair(std::net::IpAddr::from([127, 0, 0, 1]))?;
        rtp.local_addr()?.port()
    };
    let (http, hls) = (free_tcp()?, free_tcp()?);
    let cfg = format!(
        "logLevel: error\napi: no\nrtspAddress: {rtsp}\nrtspTransports: [udp, tcp]\nrtpAddress: 127.0.0.1:{pair}\n\
         rtcpAddress: 127.0.0.1:{}\nrtmp: yes\nrtmpAddress: {rtmp}\nsrt: yes\nsrtAddress: {srt}\nhls: yes\n\
         hlsAddress: {hls}\nhlsAlwaysRemux: yes\n\
         webrtc: yes\nwebrtcAddress: {http}\nwebrtcLocalUDPAddress: {media}\nwebrtcLocalTCPAddress: ''\n\
         webrtcIPsFromInterfaces: no\nwebrtcAdditionalHosts: [127.0.0.1]\n\
         metrics: no\npprof: no\nplayback: no\npaths:\n  all_others:\n",
        pair + 1
    );
    let yml = dir.join("mediamtx.yml");
    std::fs::write(&yml, cfg)?;
    let p = Proc(Command::new(bin).arg(&yml).stdout(Stdio::null()).spawn()?);
    let t = Instant::now();
    while std::net::TcpStream::connect(rtsp).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("MediaMTX did not start listening on {rtsp}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let whep = format!("http://{http}/live/bench/whep");
    let hls = format!("http://{hls}/live/bench/index.m3u8");
    Ok(Server { pid: p.0.id(), rtsp, rtmp, srt, whep, hls, path: "live/bench", relay: None, _procs: vec![p] })
}

/// ffmpeg publishing `clip` looped to `s` over `how` (rtsp, rtmp, srt).
pub(super) fn publish(s: &Server, how: &str, clip: &Path) -> anyhow::Result<Proc> {
    let (format, url) = match how {
        "rtsp" => ("rtsp", format!("rtsp://{}/{}", s.rtsp, s.path)),
        "rtmp" => ("flv", format!("rtmp://{}/live/bench", s.rtmp)),
        "srt" => ("mpegts", format!("srt://{}?streamid=publish:{}&pkt_size=1316", s.srt, s.path)),
        _ => bail!("{how:?}: rtsp, rtmp or srt"),
    };
    let mut c = Command::new("ffmpeg");
    c.args(["-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i"]).arg(clip);
    c.args(["-t", "3600", "-c", "copy", "-f", format]);
    if how == "rtsp" {
        c.args(["-rtsp_transport", "tcp"]);
    }
    Ok(Proc(c.arg(url).stdout(Stdio::null()).spawn().context("ffmpeg")?))
}

/// A clip made once by ffmpeg: test pattern and tone, `kbps` in all, H.264 without B-frames
/// and AAC in MP4 (every muxer takes it with `-c copy`).
fn clip(dir: &Path, kbps: u32, size: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("clip-{kbps}k.mp4"));
    if path.exists() {
        return Ok(path);
    }
    let video = kbps.saturating_sub(64).max(64);
    let st = Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!("testsrc2=size={size}:rate=25"))
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-t", "10"])
        // No B-frames: a live encoder's stream, and what WebRTC players take.
        .args(["-c:v", "libx264", "-preset", "veryfast", "-bf", "0", "-g", "50", "-b:v", &format!("{video}k")])
        .args(["-maxrate", &format!("{video}k"), "-bufsize", &format!("{}k", video * 2)])
        .args(["-c:a", "aac", "-b:a", "64k"])
        .arg(&path)
        .status()
        .context("ffmpeg (apt-get install ffmpeg)")?;
    if !st.success() {
        bail!("ffmpeg could not make the {kbps} kbit/s clip");
    }
    Ok(path)
}

/// fanout's counters of the path: bytes and RTP packets its tracks took in.
fn fanout_in(relay: &RelayProc) -> anyhow::Result<(u64, u64)> {
    let s = relay.client().call("GET", "/v1/sessions/bench", None)?;
    let tracks = s["publisher"]["tracks"].as_array().cloned().unwrap_or_default();
    let packets = tracks.iter().filter_map(|t| t["packets"].as_u64()).sum();
    Ok((s["source"]["bytes"].as_u64().unwrap_or(0), packets))
}

/// One ingest step: (CPU s, packets fanout counted or 0) over `seconds`.
fn ingest_step(server: &str, how: &str, clip: &Path, a: &PeersArgs, dir: &Path) -> anyhow::Result<(f64, u64)> {
    let s = start_server(server, &a.peers, dir)?;
    let _p = publish(&s, how, clip)?;
    std::thread::sleep(Duration::from_secs(4));
    let before = s.relay.as_ref().map(fanout_in).transpose()?;
    if before.is_some_and(|b| b.1 == 0) {
        bail!("fanout took nothing in over {how} in 4 s");
    }
    let c0 = process_cpu_s(s.pid)?;
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    let cpu = process_cpu_s(s.pid)? - c0;
    let after = s.relay.as_ref().map(fanout_in).transpose()?;
    let packets = match (before, after) {
        (Some(b), Some(a)) => a.1 - b.1,
        _ => 0,
    };
    Ok((cpu, packets))
}

/// One readers step: the server's CPU fraction of a core with `n` readers over `how` (all
/// of them playing: `fanout sub --read` is ready only then; each got bytes, or the step
/// fails).
fn readers_step(server: &str, how: &str, n: usize, clip: &Path, a: &PeersArgs, dir: &Path) -> anyhow::Result<f64> {
    let s = start_server(server, &a.peers, dir)?;
    let _p = publish(&s, "rtsp", clip)?;
    std::thread::sleep(Duration::from_secs(3));
    let url = match how {
        "rtmp" => format!("rtmp://{}/live/bench", s.rtmp),
        "srt" => format!("srt://{}?streamid=read:{}", s.srt, s.path),
        "whep" => s.whep.clone(),
        _ => bail!("{how:?}: rtmp, srt or whep"),
    };
    let mut sub = None;
    if n > 0 {
        let args: Vec<String> =
            ["--read", &url, "--count", &n.to_string(), "--duration", &(a.seconds + 4.0).to_string()]
                .iter()
                .map(|s| s.to_string())
                .collect();
        // Connecting is paced (WebRTC viewers a few dozen at a time): more time for more.
        let limit = Duration::from_secs(60 + n as u64 / 20);
        sub = Some(start_sub_reporting(&args, limit).with_context(|| format!("{n} {how} readers of {server}"))?);
    }
    std::thread::sleep(Duration::from_secs(2));
    let c0 = process_cpu_s(s.pid)?;
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    let cpu = process_cpu_s(s.pid)? - c0;
    if let Some((p, result)) = sub.as_mut() {
        wait(p, Duration::from_secs_f64(a.seconds + 30.0))?;
        let out = result.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or(""))
            .with_context(|| format!("{n} {how} readers of {server}: the load's result {out:?}"))?;
        if v["least_bytes"].as_u64().unwrap_or(0) == 0 {
            bail!("{n} {how} readers of {server}: one got nothing ({v})");
        }
    }
    Ok(cpu / a.seconds)
}

/// (part, server, way, readers, round, value): ingest rows carry CPU µs per packet, readers
/// rows the CPU fraction of a core.
type Row = (String, String, String, usize, usize, f64);

pub fn run(a: PeersArgs) -> anyhow::Result<()> {
    super::ensure_dir(&a.out)?;
    let csv = a.out.join("peers.csv");
    let rows = if a.replot { read_csv(&csv)? } else { measure(&a, &csv)? };
    report(&a, &rows)
}

fn measure(a: &PeersArgs, csv: &Path) -> anyhow::Result<Vec<Row>> {
    let dir = std::env::temp_dir().join(format!("fanout-bench-peers-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let big = clip(&dir, a.ingest_kbps, "1280x720")?;
    let size = if a.readers_kbps >= 1000 { "854x480" } else { "426x240" };
    let small = clip(&dir, a.readers_kbps, size)?;
    let steps = a.rounds * SERVERS.len() * (a.ingest.len() + a.over.len() * (a.readers.len() + 1));
    let mut bar = progress(steps as u64, "bench peers");
    let mut rows = Vec::new();
    let mut w = String::from("part,server,way,readers,round,value\n");
    for round in 0..a.rounds {
        for how in &a.ingest {
            // fanout's packet count of this clip over this way, for both servers' rows.
            let mut packets = 0;
            for server in SERVERS {
                bar.set_message(format!("round {} ingest {how} {server}", round + 1));
                let (cpu, n) = ingest_step(server, how, &big, a, &dir)?;
                if server == "fanout" {
                    packets = n;
                }
                let us = cpu * 1e6 / packets.max(1) as f64;
                rows.push(("ingest".into(), server.into(), how.clone(), 0, round, us));
                bar.inc(1);
            }
        }
        for how in &a.over {
            for server in SERVERS {
                for &n in std::iter::once(&0).chain(&a.readers) {
                    bar.set_message(format!("round {} {n} {how} readers {server}", round + 1));
                    let frac = readers_step(server, how, n, &small, a, &dir)?;
                    rows.push(("readers".into(), server.into(), how.clone(), n, round, frac));
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    for r in &rows {
        w += &format!("{},{},{},{},{},{:.6}\n", r.0, r.1, r.2, r.3, r.4, r.5);
    }
    std::fs::write(csv, w)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rows)
}

fn read_csv(path: &Path) -> anyhow::Result<Vec<Row>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            if f.len() != 6 {
                bail!("{}: bad line {l:?}", path.display());
            }
            Ok((f[0].into(), f[1].into(), f[2].into(), f[3].parse()?, f[4].parse()?, f[5].parse()?))
        })
        .collect()
}

fn report(a: &PeersArgs, rows: &[Row]) -> anyhow::Result<()> {
    let mean = |part: &str, server: &str, way: &str, n: usize| {
        let v: Vec<f64> =
            rows.iter().filter(|r| r.0 == part && r.1 == server && r.2 == way && r.3 == n).map(|r| r.5).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    println!("\nserver CPU per RTP packet taken in, µs (nobody watching; mean of the rounds):");
    for how in &a.ingest {
        let (f, m) = (mean("ingest", "fanout", how, 0), mean("ingest", "mediamtx", how, 0));
        println!("  {how:>5}: fanout {f:6.2}, MediaMTX {m:6.2}, fanout/MediaMTX {:.2}", f / m);
    }
    // Readers per core: N over what N readers add to the server's CPU.
    let per_core = |server: &str, how: &str, n: usize| {
        let added = mean("readers", server, how, n) - mean("readers", server, how, 0);
        if added > 0.0 {
            n as f64 / added
        } else {
            f64::NAN
        }
    };
    println!("\nreaders one core serves ({} kbit/s; mean of the rounds):", a.readers_kbps);
    for how in &a.over {
        for &n in &a.readers {
            let (f, m) = (per_core("fanout", how, n), per_core("mediamtx", how, n));
            println!("  {how:>5} × {n:>4}: fanout {f:8.0}, MediaMTX {m:8.0}, fanout/MediaMTX {:.2}", f / m);
        }
    }
    let ingest = SERVERS
        .iter()
        .map(|s| {
            let pts = a.ingest.iter().enumerate().map(|(i, how)| (i as f64, mean("ingest", s, how, 0))).collect();
            (s.to_string(), pts)
        })
        .collect();
    let readers = SERVERS
        .iter()
        .flat_map(|s| a.over.iter().map(move |how| (s, how)))
        .map(|(s, how)| {
            let pts = a.readers.iter().map(|&n| (n as f64, per_core(s, how, n))).collect();
            (format!("{s}, {how}"), pts)
        })
        .collect();
    let png = a.out.join("peers.png");
    super::plot::panels(
        &png,
        &format!("fanout and MediaMTX: ingest ({}), readers per core", a.ingest.join(" · ")),
        "ingest: way in (0, 1, 2 as listed) / readers: readers",
        false,
        &[
            super::plot::Panel { y_label: "µs CPU per RTP packet in", series: ingest, log_y: false },
            super::plot::Panel { y_label: "readers per core", series: readers, log_y: false },
        ],
    )?;
    println!("wrote {} and {}", a.out.join("peers.csv").display(), png.display());
    Ok(())
}
