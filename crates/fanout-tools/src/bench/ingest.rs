//! `fanout bench ingest`: what a packet costs the relay on its way in, with nobody watching:
//! an RTSP publisher's RTP (interleaved on its TCP connection, ANNOUNCE/RECORD into a
//! `publish` session), an RTMP publisher's FLV (`rtmp`: H.264 pictures the relay makes ten
//! RTP packets each, counted as those packets) and an RTSP upstream's (the relay pulls over UDP from an origin relay
//! that the bench publishes into), and that pull with one HTTP MPEG-TS subscriber
//! (`pull-http`: the repackaging's way, RTP tracks to a TS session). The figure is the
//! measured relay process's own CPU per packet its session took in. `--baseline BIN` measures another build beside this one
//! (round by round, the builds alternating), so a change is judged in one run.

use super::{process_cpu_s, progress, start_sub, wait, RelayProc};
use anyhow::{bail, Context};
use clap::Args;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct IngestArgs {
    /// Packets per second the publisher sends (steps).
    #[arg(long, value_delimiter = ',', default_value = "5000,20000")]
    pps: Vec<u32>,
    /// RTP payload bytes per packet.
    #[arg(long, default_value_t = 1200)]
    payload: usize,
    /// Seconds measured per step.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Ways in: publish, rtmp, pull, pull-http (`rtmp` on builds that serve RTMP: not on a
    /// baseline from before it).
    #[arg(long, value_delimiter = ',', default_value = "publish,pull,pull-http")]
    kinds: Vec<String>,
    /// Another relay binary to measure beside this one (a build of an earlier commit).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// The sessions' data path.
    #[arg(long, default_value = "shared")]
    datapath: String,
    #[arg(long, default_value = "bench-out/ingest")]
    out: PathBuf,
    /// Redraw the plot and the summary from `OUT/ingest.csv` without measuring.
    #[arg(long)]
    replot: bool,
}

/// An RTSP publisher of synthetic H.264 RTP (one track), interleaved on its connection.
struct Publisher {
    tcp: TcpStream,
    seq: u16,
    sent: u64,
}

/// One RTSP exchange: the request, then the response's head (its body skipped).
fn exchange(tcp: &mut TcpStream, req: &str) -> anyhow::Result<String> {
    tcp.write_all(req.as_bytes())?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut b)? == 0 {
            bail!("the relay closed the connection");
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    if !head.starts_with("RTSP/1.0 200") {
        bail!("{}: {}", req.lines().next().unwrap_or_default(), head.lines().next().unwrap_or_default());
    }
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(Ok(0), |n| n.trim().parse())
        .context("Content-Length")?;
    tcp.read_exact(&mut vec![0u8; len])?;
    Ok(head)
}

/// What pushes the load: `sent` packets so far (RTP packets, as the relay counts them in).
trait Push {
    fn send(&mut self, pps: u32, payload: usize, seconds: f64) -> anyhow::Result<()>;
    fn sent(&self) -> u64;
}

impl Push for Publisher {
    fn send(&mut self, pps: u32, payload: usize, seconds: f64) -> anyhow::Result<()> {
        Publisher::send(self, pps, payload, seconds)
    }
    fn sent(&self) -> u64 {
        self.sent
    }
}

/// An RTMP publisher of synthetic H.264 (FLV AVC): pictures of one NAL unit that the relay's
/// ingest cuts into exactly [`RTMP_PACKETS_PER_PICTURE`] RTP packets.
struct RtmpPublisher {
    client: crate::rtmp::Client,
    pictures: u64,
}

const RTMP_PACKETS_PER_PICTURE: u64 = 10;
/// FU-A body bytes per RTP packet of the relay's ingest (1400 less the two FU bytes).
const FU_BODY: usize = 1398;

impl RtmpPublisher {
    fn connect(rtmp: SocketAddr, name: &str) -> anyhow::Result<Self> {
        let mut client = crate::rtmp::Client::publish(rtmp, "bench", name)?;
        // The AVC decoder configuration: a made-up SPS and PPS.
        let config =
            [0x17, 0, 0, 0, 0, 1, 0x42, 0xc0, 0x1e, 0xff, 0xe1, 0, 4, 0x67, 0x42, 0xc0, 0x1e, 1, 0, 2, 0x68, 0xce];
        client.send(true, 0, &config)?;
        Ok(Self { client, pictures: 0 })
    }
}

impl Push for RtmpPublisher {
    /// Pictures at `pps / 10` a second (a keyframe every 30), a batch a millisecond.
    fn send(&mut self, pps: u32, _payload: usize, seconds: f64) -> anyhow::Result<()> {
        let rate = f64::from(pps) / RTMP_PACKETS_PER_PICTURE as f64;
        let nal_len = 1 + RTMP_PACKETS_PER_PICTURE as usize * FU_BODY;
        let (start, until) = (Instant::now(), Duration::from_secs_f64(seconds));
        let first = self.pictures;
        while start.elapsed() < until {
            let due = first + (start.elapsed().as_secs_f64() * rate) as u64;
            while self.pictures < due {
                let key = self.pictures.is_multiple_of(30);
                let mut body = vec![if key { 0x17 } else { 0x27 }, 1, 0, 0, 0];
                body.extend_from_slice(&(nal_len as u32).to_be_bytes());
                body.push(if key { 0x65 } else { 0x41 });
                body.resize(body.len() + nal_len - 1, 0x5a);
                let ts = (self.pictures as f64 * 1000.0 / rate) as u32;
                self.client.send(true, ts, &body)?;
                self.pictures += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
    fn sent(&self) -> u64 {
        // A keyframe also carries the SPS and PPS in-band: two packets more.
        self.pictures * RTMP_PACKETS_PER_PICTURE + 2 * self.pictures.div_ceil(30)
    }
}

impl Publisher {
    fn connect(rtsp: SocketAddr, name: &str) -> anyhow::Result<Self> {
        let mut tcp = TcpStream::connect(rtsp).context("the relay's RTSP port")?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        let url = format!("rtsp://{rtsp}/{name}");
        let sdp = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=bench\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n\
                   m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1\r\n\
                   a=control:trackID=0\r\n";
        exchange(
            &mut tcp,
            &format!(
                "ANNOUNCE {url} RTSP/1.0\r\nCSeq: 1\r\nContent-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
                sdp.len()
            ),
        )?;
        let head = exchange(
            &mut tcp,
            &format!(
                "SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1;mode=record\r\n\r\n"
            ),
        )?;
        let session = head
            .lines()
            .find_map(|l| l.strip_prefix("Session: "))
            .and_then(|s| s.split(';').next())
            .context("no Session in the SETUP answer")?
            .to_string();
        exchange(&mut tcp, &format!("RECORD {url} RTSP/1.0\r\nCSeq: 3\r\nSession: {session}\r\n\r\n"))?;
        Ok(Self { tcp, seq: 0, sent: 0 })
    }

    /// Sends at `pps` for `seconds`, a batch a millisecond (ten packets a picture, a keyframe
    /// every 30 pictures).
    fn send(&mut self, pps: u32, payload: usize, seconds: f64) -> anyhow::Result<()> {
        let (start, mut buf) = (Instant::now(), Vec::new());
        let until = Duration::from_secs_f64(seconds);
        let mut due_done = 0u64;
        while start.elapsed() < until {
            let due = (start.elapsed().as_secs_f64() * f64::from(pps)) as u64;
            buf.clear();
            for _ in due_done..due {
                let len = 12 + payload;
                buf.extend_from_slice(&[b'$', 0]);
                buf.extend_from_slice(&(len as u16).to_be_bytes());
                let at = buf.len();
                buf.resize(at + len, 0);
                let frame = u32::from(self.seq / 10);
                fanout_proto::rtp::write_header(
                    &mut buf[at..],
                    self.seq % 10 == 9,
                    96,
                    self.seq,
                    frame.wrapping_mul(3000),
                    0xbe4c,
                );
                // A picture a second starts with parameter sets (a keyframe: a sink of the
                // origin starts at one); the rest are non-IDR slices.
                buf[at + 12] = if self.seq.is_multiple_of(300) { 0x67 } else { 0x41 };
                self.seq = self.seq.wrapping_add(1);
            }
            self.tcp.write_all(&buf)?;
            self.sent += due - due_done;
            due_done = due;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

fn rtmp_addr(relay: &RelayProc) -> anyhow::Result<SocketAddr> {
    let v = relay.client().call("GET", "/v1/engine", None)?;
    v["rtmp"]
        .as_str()
        .context("the relay serves no RTMP (a build from before it?)")?
        .parse()
        .context("its RTMP address")
}

fn rtsp_addr(relay: &RelayProc) -> anyhow::Result<SocketAddr> {
    let v = relay.client().call("GET", "/v1/engine", None)?;
    v["rtsp"].as_str().context("the relay has no RTSP port")?.parse().context("its RTSP address")
}

fn packets_in(relay: &RelayProc, name: &str) -> anyhow::Result<u64> {
    let v = relay.client().call("GET", &format!("/v1/sessions/{name}"), None)?;
    v["source"]["packets"].as_u64().context("the session's source packets")
}

/// One step: the relay built as `bin` takes `pps` in by `kind`; its CPU and packets taken.
fn step(bin: &std::path::Path, kind: &str, pps: u32, a: &IngestArgs) -> anyhow::Result<(f64, u64, u64)> {
    // The origin of a pull is this build whatever is measured: it is the load, not the
    // subject. It goes after the relay (a relay that loses its upstream retries, noisily).
    let origin = if kind.starts_with("pull") { Some(RelayProc::start(&[])?) } else { None };
    let extra: &[&str] = if kind == "rtmp" { &["--rtmp", "127.0.0.1:0"] } else { &[] };
    let relay = RelayProc::start_bin(bin, extra)?;
    let mut fields = super::datapath_fields(&a.datapath)?;
    let (mut publisher, name): (Box<dyn Push>, &str) = match (kind, &origin) {
        ("publish" | "rtmp", _) => {
            fields.insert("name".into(), "pub".into());
            fields.insert("source".into(), serde_json::json!({ "publish": true }));
            relay.client().call("POST", "/v1/sessions", Some(fields.into()))?;
            match kind {
                "rtmp" => (Box::new(RtmpPublisher::connect(rtmp_addr(&relay)?, "pub")?), "pub"),
                _ => (Box::new(Publisher::connect(rtsp_addr(&relay)?, "pub")?), "pub"),
            }
        }
        ("pull" | "pull-http", Some(origin)) => {
            let spec = serde_json::json!({ "name": "src", "source": { "publish": true } });
            origin.client().call("POST", "/v1/sessions", Some(spec))?;
            let publisher = Publisher::connect(rtsp_addr(origin)?, "src")?;
            let url = format!("rtsp://{}/src", rtsp_addr(origin)?);
            fields.insert("name".into(), "up".into());
            fields.insert(
                "source".into(),
                serde_json::json!({ "rtsp": url, "rtsp_transport": "udp", "on_demand": false }),
            );
            // Something flows before the upstream is described.
            let mut p = publisher;
            p.send(pps, a.payload, 0.5)?;
            relay.client().call("POST", "/v1/sessions", Some(fields.into()))?;
            (Box::new(p), "up")
        }
        _ => bail!("kind {kind:?}: expected publish, rtmp, pull or pull-http"),
    };
    // One HTTP subscriber of the pull's MPEG-TS, for as long as the step runs.
    let mut sub = match kind {
        "pull-http" => {
            let args: Vec<String> = ["--api", &relay.api.to_string(), "--session", name, "--http", "1"]
                .iter()
                .map(|s| s.to_string())
                .chain(["--duration".to_string(), format!("{}", a.seconds + 3.0)])
                .collect();
            Some(start_sub(&args, Duration::from_secs(20))?)
        }
        _ => None,
    };
    // A second to settle (the pull connects, the first buffers are taken).
    publisher.send(pps, a.payload, 1.0)?;
    let (cpu0, in0, sent0) = (process_cpu_s(relay.pid())?, packets_in(&relay, name)?, publisher.sent());
    publisher.send(pps, a.payload, a.seconds)?;
    let (cpu1, in1) = (process_cpu_s(relay.pid())?, packets_in(&relay, name)?);
    if let Some(sub) = sub.as_mut() {
        wait(sub, Duration::from_secs(30))?;
    }
    Ok((cpu1 - cpu0, in1 - in0, publisher.sent() - sent0))
}

pub fn run(a: IngestArgs) -> anyhow::Result<()> {
    super::ensure_dir(&a.out)?;
    let csv_path = a.out.join("ingest.csv");
    let results = if a.replot { read_csv(&csv_path)? } else { measure(&a, &csv_path)? };
    let has = |build: &str| results.iter().any(|r| r.0 == build);
    let builds: Vec<&str> = ["this", "baseline"].into_iter().filter(|b| has(b)).collect();
    let mean = |build: &str, kind: &str, pps: u32| {
        let v: Vec<f64> = results.iter().filter(|r| r.0 == build && r.1 == kind && r.2 == pps).map(|r| r.3).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    println!("\nrelay CPU per packet taken in, µs (mean of the rounds):");
    for kind in &a.kinds {
        for &pps in &a.pps {
            let now = mean("this", kind, pps);
            match has("baseline") {
                true => {
                    let base = mean("baseline", kind, pps);
                    println!("  {kind:>9} {pps:>6}/s: this {now:6.2}, baseline {base:6.2}, ratio {:.2}", now / base);
                }
                false => println!("  {kind:>9} {pps:>6}/s: {now:6.2}"),
            }
        }
    }
    let series = builds
        .iter()
        .flat_map(|build| a.kinds.iter().map(move |k| (*build, k)))
        .map(|(build, kind)| {
            let pts = a.pps.iter().map(|&p| (f64::from(p), mean(build, kind, p))).collect();
            (format!("{kind}, {build}"), pts)
        })
        .collect();
    let png = a.out.join("ingest.png");
    super::plot::panels(
        &png,
        // (Who watches: nobody, but one HTTP TS player for pull-http; the module says more.)
        "Relay CPU per packet taken in, by way in",
        "packets per second",
        false,
        &[super::plot::Panel { y_label: "µs per packet", series, log_y: false }],
    )?;
    println!("wrote {} and {}", csv_path.display(), png.display());
    Ok(())
}

/// (build, kind, packets per second, µs per packet) of each step.
type Results = Vec<(String, String, u32, f64)>;

fn measure(a: &IngestArgs, csv_path: &std::path::Path) -> anyhow::Result<Results> {
    let this = std::env::current_exe()?;
    let mut builds = vec![("this", this)];
    if let Some(b) = &a.baseline {
        if !b.is_file() {
            bail!("--baseline {}: no such file", b.display());
        }
        builds.push(("baseline", b.clone()));
    }
    let mut csv = std::fs::File::create(csv_path)?;
    writeln!(csv, "build,kind,pps,round,relay_cpu_s,packets_in,packets_sent,us_per_packet")?;
    let runs_on = |k: &String| if k == "rtmp" { 1 } else { builds.len() };
    let steps = (a.rounds * a.pps.len() * a.kinds.iter().map(runs_on).sum::<usize>()) as u64;
    let mut pb = progress(steps, "bench ingest");
    let mut results = Results::new();
    for round in 0..a.rounds {
        for &pps in &a.pps {
            for kind in &a.kinds {
                for (build, bin) in &builds {
                    if kind == "rtmp" && *build == "baseline" {
                        continue; // a build from before RTMP (its kinds are compared on this one)
                    }
                    pb.set_message(format!("{build}: {kind} at {pps} packets/s, round {}", round + 1));
                    let (cpu, taken, sent) = step(bin, kind, pps, a).with_context(|| format!("{build} {kind}"))?;
                    let us = 1e6 * cpu / taken.max(1) as f64;
                    writeln!(csv, "{build},{kind},{pps},{round},{cpu:.3},{taken},{sent},{us:.3}")?;
                    // Packets lost on the way (the pull's UDP hop) are reported, not hidden: the
                    // figure is per packet taken in. (A window can take in a few more than were
                    // sent in it: some of the second before arrive in it.)
                    let lost = 100.0 * (1.0 - taken as f64 / sent.max(1) as f64);
                    pb.println(format!(
                        "{build:>8} {kind:>9} {pps:>6}/s: {taken} packets in ({lost:.1}% of those sent lost), relay {cpu:.2} CPU-s, {us:.2} µs a packet"
                    ));
                    results.push((build.to_string(), kind.clone(), pps, us));
                    pb.inc(1);
                }
            }
        }
    }
    pb.finish_and_clear();
    Ok(results)
}

/// The steps of an earlier run, from its CSV.
fn read_csv(path: &std::path::Path) -> anyhow::Result<Results> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--replot: {}", path.display()))?;
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let bad = || anyhow::anyhow!("{}: odd line {l:?}", path.display());
            Ok((
                f.first().ok_or_else(bad)?.to_string(),
                f.get(1).ok_or_else(bad)?.to_string(),
                f.get(2).and_then(|p| p.parse().ok()).ok_or_else(bad)?,
                f.get(7).and_then(|u| u.parse().ok()).ok_or_else(bad)?,
            ))
        })
        .collect()
}
