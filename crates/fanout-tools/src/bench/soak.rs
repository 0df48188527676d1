//! `fanout bench soak`: a relay run for an hour as people and attackers use it, and whether
//! it stays flat. One path records (with retention) what an ffmpeg publisher sends, and the
//! publisher is replaced every few minutes. Each cycle, players of every face join for the
//! cycle and leave (RTSP over UDP and TCP, HLS, HTTP TS, RTMP, SRT, WebRTC), each load
//! checking what every one of its players got; the config is reloaded; attackers from other
//! loopback addresses stall recording reads, flood RTMP commands without reading, send
//! oversized WHEP offers and names with newlines. Halfway, the binary is upgraded. Every few
//! seconds the relay's RSS, descriptors, threads and the recordings' disk use are sampled.
//!
//! Writes `soak.csv` (the samples), `cycles.csv` (each load's receipt), `soak.png`, and a
//! verdict: no player without data, and resources at the end within bounds of where they
//! stood a cycle after the upgrade. `--quick` is the suite's two-minute form.

use super::peers::{fanout_server, publish, Server};
use super::players::{load_args, receipt, SRS_SOURCE};
use anyhow::{bail, Context};
use clap::Args;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SoakArgs {
    /// Minutes to run.
    #[arg(long, default_value_t = 60.0)]
    minutes: f64,
    /// Seconds of each cycle of players (they join at its start and leave at its end).
    #[arg(long, default_value_t = 60.0)]
    cycle_s: f64,
    /// Seconds between two publishers.
    #[arg(long, default_value_t = 300.0)]
    publisher_s: f64,
    /// The suite's form: six cycles of 15 s (about two minutes with the loads' set-up), a
    /// publisher every 30 s, a quarter of the players.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "bench-out/soak")]
    out: PathBuf,
}

/// Players of each face per cycle: (scenario, players).
const PLAYERS: [(&str, usize); 7] =
    [("rtsp", 40), ("rtsp-tcp", 40), ("hls", 20), ("http", 40), ("rtmp", 20), ("srt", 20), ("webrtc", 10)];

/// One sample of the relay's resources.
struct Sample {
    t: f64,
    pid: u32,
    rss_mb: f64,
    /// Of the RSS: glibc's main heap, and its other arenas (the heaps threads allocate in),
    /// to tell memory held by the allocator from memory in use.
    heap_mb: f64,
    arenas_mb: f64,
    /// What the relay's allocator says it has given out, and what it keeps freed
    /// (`/metrics`), in MB.
    in_use_mb: f64,
    kept_mb: f64,
    fds: usize,
    threads: usize,
    disk_mb: f64,
}

fn sample(t: f64, pid: u32, rec: &Path, metrics: &str) -> Option<Sample> {
    let stat = fanout_io::sys::ProcStat::read(Some(pid)).ok()?;
    let (heap_kb, arenas_kb) = std::fs::read_to_string(format!("/proc/{pid}/smaps")).map_or((0, 0), |m| heaps(&m));
    Some(Sample {
        t,
        pid,
        rss_mb: stat.rss_bytes as f64 / f64::from(1 << 20),
        heap_mb: heap_kb as f64 / 1024.0,
        arenas_mb: arenas_kb as f64 / 1024.0,
        in_use_mb: gauge(metrics, "fanout_malloc_in_use_bytes") / 1e6,
        kept_mb: gauge(metrics, "fanout_malloc_kept_free_bytes") / 1e6,
        threads: stat.threads as usize,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count(),
        disk_mb: disk_bytes(rec) as f64 / 1e6,
    })
}

/// A gauge's value in Prometheus text (0 where it is not there).
fn gauge(metrics: &str, name: &str) -> f64 {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// Where glibc's allocator keeps a process's memory, from its `smaps`: the resident kB of
/// the main heap (`[heap]`), and of the other arenas' heaps: anonymous read-write mappings
/// starting at a 64 MiB boundary and reserving 64 MiB with the inaccessible part after them
/// (glibc's `HEAP_MAX_SIZE` on 64-bit).
fn heaps(smaps: &str) -> (u64, u64) {
    const HEAP: u64 = 64 << 20;
    // (start, end, perms, path, rss kB) per mapping.
    let mut maps: Vec<(u64, u64, &str, &str, u64)> = Vec::new();
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                let perms = f.next().unwrap_or("");
                let path = f.nth(3).unwrap_or("");
                maps.push((a, b, perms, path, 0));
                continue;
            }
        }
        if first == "Rss:" {
            if let (Some(m), Some(kb)) = (maps.last_mut(), f.next().and_then(|v| v.parse().ok())) {
                m.4 = kb;
            }
        }
    }
    let mut heap = 0;
    let mut arenas = 0;
    for (i, &(start, end, perms, path, rss)) in maps.iter().enumerate() {
        if path == "[heap]" {
            heap += rss;
        } else if perms == "rw-p" && path.is_empty() && start % HEAP == 0 {
            let reserved =
                maps.get(i + 1).filter(|n| n.0 == end && n.2 == "---p" && n.3.is_empty()).map_or(end, |n| n.1);
            if reserved - start == HEAP {
                arenas += rss;
            }
        }
    }
    (heap, arenas)
}

fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => disk_bytes(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    })
}

/// One load of `n` players of `scenario` for `secs`, run to its end: its receipt.
fn load(s: &Server, scenario: &str, n: usize, secs: f64, dir: &Path) -> anyhow::Result<super::players::Receipt> {
    let json = dir.join(format!("sub-{scenario}.json"));
    let _ = std::fs::remove_file(&json);
    let mut child = Command::new(std::env::current_exe()?)
        .args(load_args(s, scenario, n, secs, &json)?)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut out = String::new();
    child.stdout.take().context("load stdout")?.read_to_string(&mut out)?;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = child.wait();
    // (The first line says the players are set up.)
    let rest: String = out.lines().skip(1).collect::<Vec<_>>().join("\n");
    receipt(scenario, &rest, &json).with_context(|| format!("{n} {scenario} players: {} {}", out.trim(), err.trim()))
}

/// A TCP connection from loopback address `from`, with a small receive window.
fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.set_recv_buffer_size(2048)?;
    s.bind(&SocketAddr::from((from, 0)).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(2))?;
    Ok(s.into())
}

/// `n` RTMP `connect` commands, chunked, as a client that floods them sends (every one asks
/// the relay for an answer).
pub fn connect_flood(n: usize) -> Vec<u8> {
    use fanout_proto::rtmp::{amf, chunk};
    let cmd = amf::encode_all(&[
        amf::Amf::string("connect"),
        amf::Amf::Number(1.0),
        amf::Amf::object([("app", amf::Amf::string("live"))]),
    ]);
    let mut flood = Vec::new();
    for _ in 0..n {
        chunk::write_message(&mut flood, 3, 20, 0, 0, &cmd, 128);
    }
    flood
}

/// One round of attacks from 127.0.0.2-4; the connections it holds (stalled) until dropped.
fn attack(api: SocketAddr, rtmp: SocketAddr, rtsp: SocketAddr) -> Vec<TcpStream> {
    let mut held = Vec::new();
    // Recording reads never read: at most four an address are served, then closed at the
    // write deadline.
    let newest = ureq::get(&format!("http://{api}/v1/recordings/bench"))
        .call()
        .ok()
        .and_then(|r| r.into_json::<serde_json::Value>().ok())
        .and_then(|v| {
            v["files"].as_array()?.iter().rev().find(|f| f["writing"] == false)?["file"].as_str().map(String::from)
        });
    if let Some(file) = newest {
        let file = file.replace('/', "%2F");
        for _ in 0..8 {
            if let Ok(mut c) = connect_from([127, 0, 0, 2], api) {
                let _ = c
                    .write_all(format!("GET /v1/recordings/bench/files/{file} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
                held.push(c);
            }
        }
    }
    // RTMP: a handshake, then commands as fast as they go, no answer read.
    let flood = connect_flood(2000);
    for _ in 0..4 {
        let Ok(mut c) = connect_from([127, 0, 0, 3], rtmp) else { continue };
        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = c.set_write_timeout(Some(Duration::from_millis(500)));
        let mut s = vec![0u8; 1 + 1536 * 2];
        if c.write_all(&[3]).and_then(|()| c.write_all(&[0u8; 1536])).and_then(|()| c.read_exact(&mut s)).is_ok() {
            let _ = c.write_all(&s[1..1537]);
            let _ = c.write_all(&flood);
        }
        held.push(c);
    }
    // Oversized WHEP offers (refused unread) and names with a newline and ESC.
    let offer = "v=0\r\n".repeat(200_000);
    for _ in 0..4 {
        let _ =
            ureq::post(&format!("http://{api}/bench/whep")).set("Content-Type", "application/sdp").send_string(&offer);
    }
    if let Ok(mut c) = connect_from([127, 0, 0, 4], rtsp) {
        let _ = c.write_all(format!("DESCRIBE rtsp://{rtsp}/x%0AFORGED\x1b[2J RTSP/1.0\r\nCSeq: 1\r\n\r\n").as_bytes());
        held.push(c);
    }
    held
}

/// The relay's config: the path records with retention; reloads flip `max_failed_logins`.
fn config(dir: &Path, quick: bool, flip: bool) -> String {
    let (segment, keep) = if quick { (4, 20) } else { (10, 120) };
    format!(
        "rtsp_max_connections = 100000\napi_max_connections = 100000\nrequest_timeout_s = 5\nupgrade_drain_s = 5\n\
         max_failed_logins = {}\nrecord_path = \"{}/rec/%path/%Y-%m-%d_%H-%M-%S-%f\"\n\n\
         [[session]]\nname = \"bench\"\nsource = {{ publish = true }}\nrecord = {{ segment_s = {segment}, keep_s = {keep} }}\n",
        if flip { 30 } else { 20 },
        dir.display()
    )
}

pub fn run(mut a: SoakArgs) -> anyhow::Result<()> {
    if a.quick {
        (a.minutes, a.cycle_s, a.publisher_s) = (1.5, 15.0, 30.0);
    }
    if a.cycle_s < 10.0 || a.minutes * 60.0 < a.cycle_s * 3.0 {
        bail!("a soak needs cycles of 10 s or more and at least three of them");
    }
    super::ensure_dir(&a.out)?;
    let dir = std::env::temp_dir().join(format!("fanout-bench-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let clip = dir.join("source.mp4");
    std::fs::write(&clip, SRS_SOURCE)?;
    let cfg = dir.join("soak.toml");
    std::fs::write(&cfg, config(&dir, a.quick, false))?;
    let s = fanout_server(Some(&cfg))?;
    let api = s.relay.as_ref().context("fanout")?.api;
    let client = ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build();
    let mut publisher = publish(&s, "rtsp", &clip)?;
    let mut published_at = Instant::now();
    let t0 = Instant::now();
    let total = Duration::from_secs_f64(a.minutes * 60.0);
    let cycles = (total.as_secs_f64() / a.cycle_s).floor() as usize;
    let upgrade_at = cycles / 2;
    let mut pid = s.pid;
    let mut upgraded_at: Option<f64> = None;
    let mut samples: Vec<Sample> = Vec::new();
    let mut cycles_csv = String::from("cycle,t_s,scenario,players,got,unit,silent,lost\n");
    let mut silent_total = 0u64;
    let mut players_total = 0usize;
    let mut bar = super::progress(cycles as u64, "bench soak");
    std::thread::sleep(Duration::from_secs(if a.quick { 6 } else { 10 }));
    for cycle in 0..cycles {
        let start = t0.elapsed().as_secs_f64();
        bar.set_message(format!("cycle {} of {cycles} · pid {pid}", cycle + 1));
        if cycle == upgrade_at {
            let r: serde_json::Value =
                client.post(&format!("http://{api}/v1/upgrade")).call().context("POST /v1/upgrade")?.into_json()?;
            pid = r["new_pid"].as_u64().context("the upgrade's new pid")? as u32;
            upgraded_at = Some(start);
            bar.println(format!("{start:6.0} s: upgraded, pid {pid}"));
            // The publisher's connection drains with the old process: it comes back, as an
            // encoder would, to the new one.
            std::thread::sleep(Duration::from_secs(6));
            drop(std::mem::replace(&mut publisher, publish(&s, "rtsp", &clip)?));
            published_at = Instant::now();
            std::thread::sleep(Duration::from_secs(3));
        }
        if published_at.elapsed().as_secs_f64() >= a.publisher_s {
            drop(publisher);
            publisher = publish(&s, "rtsp", &clip)?;
            published_at = Instant::now();
            bar.println(format!("{start:6.0} s: a new publisher"));
            std::thread::sleep(Duration::from_secs(3));
        }
        std::fs::write(&cfg, config(&dir, a.quick, cycle % 2 == 1))?;
        let reload = client.post(&format!("http://{api}/v1/reload")).call();
        if let Err(e) = reload {
            bar.println(format!("{start:6.0} s: the reload failed: {e}"));
        }
        // The cycle: loads and attackers side by side, samples meanwhile.
        let secs = a.cycle_s - 2.0;
        let results = std::thread::scope(|sc| {
            let loads: Vec<_> = PLAYERS
                .iter()
                .map(|&(scenario, n)| {
                    let n = if a.quick { n / 4 } else { n };
                    let (s, dir) = (&s, &dir);
                    (scenario, n, sc.spawn(move || load(s, scenario, n, secs, dir)))
                })
                .collect();
            let held = attack(api, s.rtmp, s.rtsp);
            let until = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < until {
                let metrics = client
                    .get(&format!("http://{api}/metrics"))
                    .call()
                    .ok()
                    .and_then(|r| r.into_string().ok())
                    .unwrap_or_default();
                if let Some(x) = sample(t0.elapsed().as_secs_f64(), pid, &dir.join("rec"), &metrics) {
                    samples.push(x);
                }
                std::thread::sleep(Duration::from_secs(if a.quick { 2 } else { 5 }));
            }
            drop(held);
            loads.into_iter().map(|(sc, n, h)| (sc, n, h.join().expect("a load thread"))).collect::<Vec<_>>()
        });
        for (scenario, n, r) in results {
            players_total += n;
            match r {
                Ok(r) => {
                    silent_total += r.silent;
                    cycles_csv +=
                        &format!("{cycle},{start:.0},{scenario},{n},{},{},{},{}\n", r.got, r.unit, r.silent, r.lost);
                    if r.silent > 0 {
                        bar.println(format!("{start:6.0} s: {} of {n} {scenario} players got nothing", r.silent));
                    }
                }
                Err(e) => {
                    silent_total += n as u64;
                    cycles_csv += &format!("{cycle},{start:.0},{scenario},{n},0,-,{n},0\n");
                    bar.println(format!("{start:6.0} s: {n} {scenario} players failed: {e:#}"));
                }
            }
        }
        std::fs::write(a.out.join("cycles.csv"), &cycles_csv)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    drop(publisher);
    // The upgraded process is not the bench's child: stopped here.
    // SAFETY: kill(2) on the relay the bench started (through its upgrade).
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
    report(&a, &samples, upgraded_at, silent_total, players_total)
}

/// The samples as CSV and PNG, and the verdict.
fn report(
    a: &SoakArgs,
    samples: &[Sample],
    upgraded_at: Option<f64>,
    silent: u64,
    players: usize,
) -> anyhow::Result<()> {
    let mut csv =
        String::from("t_s,pid,rss_mb,heap_mb,arenas_mb,malloc_in_use_mb,malloc_kept_mb,fds,threads,disk_mb\n");
    for x in samples {
        csv += &format!(
            "{:.1},{},{:.1},{:.1},{:.1},{:.1},{:.1},{},{},{:.1}\n",
            x.t, x.pid, x.rss_mb, x.heap_mb, x.arenas_mb, x.in_use_mb, x.kept_mb, x.fds, x.threads, x.disk_mb
        );
    }
    std::fs::write(a.out.join("soak.csv"), csv)?;
    let line =
        |name: &str, f: fn(&Sample) -> f64| (name.to_string(), samples.iter().map(|x| (x.t / 60.0, f(x))).collect());
    let series = |f: fn(&Sample) -> f64| vec![line("fanout", f)];
    let png = a.out.join("soak.png");
    super::plot::panels(
        &png,
        &format!(
            "Soak: {:.0} min of players joining and leaving, publishers replaced, reloads, an upgrade, attacks",
            a.minutes
        ),
        "minutes",
        false,
        &[
            super::plot::Panel {
                y_label: "RSS (MB)",
                series: vec![
                    line("all", |x| x.rss_mb),
                    line("malloc main heap", |x| x.heap_mb),
                    line("malloc thread arenas", |x| x.arenas_mb),
                    line("malloc: in use", |x| x.in_use_mb),
                    line("malloc: freed, kept", |x| x.kept_mb),
                ],
                log_y: false,
            },
            super::plot::Panel { y_label: "open descriptors", series: series(|x| x.fds as f64), log_y: false },
            super::plot::Panel { y_label: "threads", series: series(|x| x.threads as f64), log_y: false },
            super::plot::Panel { y_label: "recordings on disk (MB)", series: series(|x| x.disk_mb), log_y: false },
        ],
    )?;
    // Flat: from a cycle after the upgrade (the new process warmed) to the end.
    let from = upgraded_at.unwrap_or(0.0) + a.cycle_s;
    let after: Vec<&Sample> = samples.iter().filter(|x| x.t >= from).collect();
    let (Some(first), Some(last)) = (after.first(), after.last()) else { bail!("no samples after the upgrade") };
    let peak_disk = samples.iter().map(|x| x.disk_mb).fold(0.0, f64::max);
    println!("players: {players} in all, {silent} got nothing");
    println!(
        "from {:.0} s to {:.0} s: RSS {:.1} -> {:.1} MB (malloc's thread arenas {:.1} -> {:.1}, in use {:.1} -> {:.1}, freed and kept {:.1} -> {:.1}), descriptors {} -> {}, threads {} -> {}, disk {:.1} -> {:.1} MB (peak {peak_disk:.1})",
        first.t, last.t, first.rss_mb, last.rss_mb, first.arenas_mb, last.arenas_mb, first.in_use_mb, last.in_use_mb, first.kept_mb, last.kept_mb, first.fds, last.fds, first.threads, last.threads, first.disk_mb, last.disk_mb
    );
    println!("CSV: {}\nPNG: {}", a.out.join("soak.csv").display(), png.display());
    let mut wrong = Vec::new();
    if silent > 0 {
        wrong.push(format!("{silent} players got nothing"));
    }
    if last.rss_mb > first.rss_mb * 1.3 + 30.0 {
        wrong.push(format!("RSS grew {:.1} -> {:.1} MB", first.rss_mb, last.rss_mb));
    }
    if last.fds > first.fds + 64 {
        wrong.push(format!("descriptors grew {} -> {}", first.fds, last.fds));
    }
    if last.threads > first.threads + 16 {
        wrong.push(format!("threads grew {} -> {}", first.threads, last.threads));
    }
    // Retention holds the disk near its keep window; it never grows without end.
    if last.disk_mb > peak_disk.max(1.0) * 0.999 && samples.len() > 10 && last.disk_mb > first.disk_mb * 2.0 + 5.0 {
        wrong.push(format!("the recordings grew {:.1} -> {:.1} MB", first.disk_mb, last.disk_mb));
    }
    if !wrong.is_empty() {
        bail!("not flat: {}", wrong.join("; "));
    }
    println!("flat: every player got data; RSS, descriptors, threads and disk stayed within bounds");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn gauges_are_read_by_their_whole_name() {
        let m = "# HELP a_bytes x\na_bytes_total 9\na_bytes 1.5e6\nb 2\n";
        assert_eq!((super::gauge(m, "a_bytes"), super::gauge(m, "b"), super::gauge(m, "c")), (1.5e6, 2.0, 0.0));
    }

    #[test]
    fn heaps_tells_the_main_heap_and_thread_arenas_from_the_rest() {
        let smaps = "\
55d0c0000000-55d0c0400000 rw-p 00000000 00:00 0                          [heap]
Size:               4096 kB
Rss:                1000 kB
7f0c00000000-7f0c02000000 rw-p 00000000 00:00 0 
Size:              32768 kB
Rss:                3000 kB
7f0c02000000-7f0c04000000 ---p 00000000 00:00 0 
Size:              32768 kB
Rss:                   0 kB
7f0c04001000-7f0c04100000 rw-p 00000000 00:00 0 
Size:               1020 kB
Rss:                 500 kB
7f0c08000000-7f0c08100000 rw-p 00000000 00:00 0 
Rss:                 200 kB
7f0c08100000-7f0c0a000000 ---p 00000000 00:00 0 
Rss:                   0 kB
7f0c10000000-7f0c10100000 r-xp 00000000 08:01 1234                       /usr/lib/libc.so.6
Rss:                 900 kB
";
        // The second arena reserves 32 MiB only: not one of glibc's heaps.
        assert_eq!(super::heaps(smaps), (1000, 3000));
    }
}
