//! `fanout bench`: scenario runners. The relay, `gen` and `sub` run as separate processes;
//! the relay's CPU is read from its own /proc entry, the machine's from /proc/stat. Each
//! scenario writes a CSV and a PNG, with a progress bar while it runs.

pub mod cluster;
pub mod datapaths;
pub mod egress;
pub mod http;
pub mod ingest;
pub mod kpacers;
pub mod layers;
pub mod pacing;
pub mod peers;
pub mod players;
mod plot;
pub mod register;
pub mod repack;
pub mod rtsp;
pub mod scenarios;
pub mod soak;
pub mod splice;
pub mod transcode;
mod wire;

use crate::client::ApiClient;
pub use crate::thread_cpu_s;
use anyhow::{bail, Context};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum BenchCmd {
    /// One UDP session to N UDP sinks per data path, alternating rounds; writes a CSV.
    Datapaths(datapaths::BenchArgs),
    /// Bulk fan-out: subscribers stepped up per data path and transport (OMSS Fig. "bulk").
    Bulk(scenarios::BulkArgs),
    /// Payload size: a 1-to-N session at a fixed bit rate, payloads 64 → 1400 bytes.
    Payload(scenarios::PayloadArgs),
    /// Overload: three sessions in classes 1, 2, 3 while background CPU load is stepped up.
    Overload(scenarios::OverloadArgs),
    /// TCP fan-out in user space (read + write per sink) against splice/tee (kernel pages).
    Splice(splice::SpliceArgs),
    /// N RTSP clients of one upstream through fanout, MediaMTX and the live555 proxy.
    Rtsp(rtsp::RtspArgs),
    /// fanout against MediaMTX: ingest over RTSP, RTMP, SRT; RTMP and SRT readers per core.
    Peers(peers::PeersArgs),
    /// Players per core in the peers' table format (SRS, ZLMediaKit): one 232 kbit/s CBR
    /// source, N players per scenario, fanout and MediaMTX side by side.
    Players(players::PlayersArgs),
    /// An hour of players of every face joining and leaving, publishers replaced, reloads,
    /// an upgrade, a recording with retention and attackers: RSS, descriptors, threads and
    /// disk over time, and whether every player got data.
    Soak(soak::SoakArgs),
    /// Layer adaptation behind tc-shaped links: AIMD against the thesis's rule (needs root).
    Layers(layers::LayersArgs),
    /// Subscribers joining behind thin links, pacing off and on (needs root).
    Pacing(pacing::PacingArgs),
    /// fanout's virtual clock against the kernel's pacers (SO_MAX_PACING_RATE, SO_TXTIME)
    /// behind one thin shared link (needs root and fq).
    KernelPacers(kpacers::KernelPacersArgs),
    /// Five sessions behind one thin egress link: the link's drops against the relay's own
    /// sharing by reserved rate, then class (needs root).
    Egress(egress::EgressArgs),
    /// A tree of relays: subscribers over 1, 2, 4 edges of one origin, latency per tier,
    /// and the projected size of larger trees.
    Cluster(cluster::ClusterArgs),
    /// Sinks added one API call at a time: the time per thousand as the session grows.
    Register(register::RegisterArgs),
    /// Repackaging for HTTP players (MPEG-TS, HLS): CPU per RTP packet, stage by stage.
    Repack(repack::RepackArgs),
    /// A path's AAC as Opus for WebRTC viewers: CPU per second of audio.
    Transcode(transcode::TranscodeArgs),
    /// One session's subscribers by how they watch (TS over UDP, RTP, TS over HTTP, HLS):
    /// relay CPU per subscriber.
    Http(http::HttpArgs),
    /// What a packet costs on its way in (an RTSP publisher's, an RTSP upstream's), nobody
    /// watching; `--baseline` measures another build beside this one.
    Ingest(ingest::IngestArgs),
    /// (internal) N HLS players: playlist polls and segment fetches.
    #[command(hide = true)]
    HlsLoad(http::HlsLoadArgs),
    /// (internal) One RTSP subscriber of `bench pacing`.
    #[command(hide = true)]
    PacingSub(pacing::SubArgs),
    /// (internal) One RTSP subscriber of `bench layers`: reports and records what it gets.
    #[command(hide = true)]
    LayersSub(layers::SubArgs),
    /// (internal) The RTSP load client: N sessions over UDP in one process.
    #[command(hide = true)]
    RtspLoad(rtsp::LoadArgs),
    /// (internal) Burn CPU: busy `duty` of every 10 ms for `seconds`; the overload load.
    #[command(hide = true)]
    Burn {
        #[arg(long)]
        duty: f64,
        #[arg(long)]
        seconds: f64,
    },
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    // The machine a figure comes from, first in every bench's log (helpers excepted): the
    // same bench moves by 2 x between hosts of one kind (issue 35).
    if !matches!(
        cmd,
        BenchCmd::HlsLoad(_)
            | BenchCmd::PacingSub(_)
            | BenchCmd::RtspLoad(_)
            | BenchCmd::LayersSub(_)
            | BenchCmd::Burn { .. }
    ) {
        println!("{}", machine());
    }
    match cmd {
        BenchCmd::Datapaths(a) => datapaths::run(a),
        BenchCmd::Bulk(a) => scenarios::bulk(a),
        BenchCmd::Payload(a) => scenarios::payload(a),
        BenchCmd::Overload(a) => scenarios::overload(a),
        BenchCmd::Splice(a) => splice::run(a),
        BenchCmd::Pacing(a) => pacing::run(a),
        BenchCmd::KernelPacers(a) => kpacers::run(a),
        BenchCmd::Egress(a) => egress::run(a),
        BenchCmd::Register(a) => register::run(a),
        BenchCmd::Cluster(a) => cluster::run(a),
        BenchCmd::Repack(a) => repack::run(a),
        BenchCmd::Transcode(a) => transcode::run(a),
        BenchCmd::Http(a) => http::run(a),
        BenchCmd::Ingest(a) => ingest::run(a),
        BenchCmd::HlsLoad(a) => http::hls_load(a),
        BenchCmd::PacingSub(a) => pacing::sub(a),
        BenchCmd::Rtsp(a) => rtsp::run(a),
        BenchCmd::Peers(a) => peers::run(a),
        BenchCmd::Players(a) => players::run(a),
        BenchCmd::Soak(a) => soak::run(a),
        BenchCmd::RtspLoad(a) => rtsp::load(a),
        BenchCmd::Layers(a) => layers::run(a),
        BenchCmd::LayersSub(a) => layers::sub(a),
        BenchCmd::Burn { duty, seconds } => {
            burn(duty, seconds);
            Ok(())
        }
    }
}

/// One line naming the machine: CPU model (family/model/stepping, which say the generation
/// where a VM's name is generic), CPUs, hypervisor or not, kernel release.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    machine_line(&cpuinfo, kernel.trim())
}

fn machine_line(cpuinfo: &str, kernel: &str) -> String {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let cpus = cpuinfo.lines().filter(|l| l.split_once(':').is_some_and(|(k, _)| k.trim() == "processor")).count();
    let model = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let virt = field("flags").is_some_and(|f| f.split_whitespace().any(|x| x == "hypervisor"));
    format!(
        "machine: {model} (family {} model {} stepping {}), {cpus} CPUs{}, Linux {kernel}",
        field("cpu family").unwrap_or_else(|| "?".into()),
        field("model").unwrap_or_else(|| "?".into()),
        field("stepping").unwrap_or_else(|| "?".into()),
        if virt { " under a hypervisor" } else { "" },
    )
}

fn burn(duty: f64, seconds: f64) {
    let end = Instant::now() + Duration::from_secs_f64(seconds.min(600.0));
    let period = Duration::from_millis(10);
    let busy = period.mul_f64(duty.clamp(0.0, 1.0));
    while Instant::now() < end {
        let t = Instant::now();
        while t.elapsed() < busy {
            std::hint::spin_loop();
        }
        std::thread::sleep(period.saturating_sub(t.elapsed()));
    }
}

/// The stream every subscriber gets, as the OMSS papers' tests set it.
#[derive(clap::Args, Debug, Clone)]
pub struct Load {
    /// Stream bit rate in kbit/s (the OMSS papers use 256).
    #[arg(long, default_value_t = 256.0)]
    pub rate_kbps: f64,
    /// Datagram payload in bytes, RTP header included (the OMSS papers use 1400).
    #[arg(long, default_value_t = 1400)]
    pub payload: usize,
    /// Seconds of sending per step (per data path and round for `datapaths`).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
}

/// A child process killed (and reaped) when dropped: every run cleans up what it started.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The relay under test, started from this same binary.
pub struct RelayProc {
    pub proc: Proc,
    pub api: SocketAddr,
}

impl RelayProc {
    pub fn start(extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_bin(&std::env::current_exe()?, extra)
    }

    /// A relay of the build at `bin` (another commit's, to compare with).
    pub fn start_bin(bin: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        // RTSP on a free port unless asked otherwise: a relay running beside the bench keeps
        // its 8554.
        let rtsp: &[&str] = if extra.contains(&"--rtsp") { &[] } else { &["--rtsp", "127.0.0.1:0"] };
        // Thousands of players: no cap on connections, unless a bench brings its own config.
        let caps = std::env::temp_dir().join(format!("fanout-bench-caps-{}.toml", std::process::id()));
        std::fs::write(&caps, "rtsp_max_connections = 1000000\napi_max_connections = 1000000\n")?;
        let caps = caps.to_str().context("a UTF-8 temp path")?.to_string();
        let config: Vec<&str> = if extra.contains(&"--config") { vec![] } else { vec!["--config", &caps] };
        let mut child = Command::new(bin)
            // The load comes from this host's one address: no per-address cap.
            .args(["serve", "--no-demo", "--api", "127.0.0.1:0", "--max-connections-per-ip", "0"])
            .args(rtsp)
            .args(config)
            .args(extra)
            // A measured relay keeps no state: nothing from before, nothing after.
            .args(["--state-file", ""])
            .env("FANOUT_RTMP", "off")
            .env("FANOUT_SRT", "off")
            // (Several relays side by side would each try the one default WebRTC port.)
            .env("FANOUT_WEBRTC", "off")
            .env("FANOUT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the relay")?;
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().context("relay stdout")?);
        out.read_line(&mut line)?;
        // Keep reading what else it prints, so it never writes into a closed pipe.
        std::thread::spawn(move || for _ in out.lines() {});
        let api = line
            .trim()
            .strip_prefix("fanout: API http://")
            .and_then(|l| l.strip_suffix("/v1/sessions"))
            .context("the relay did not start (see its message above)")?
            .parse()?;
        Ok(Self { proc: Proc(child), api })
    }

    pub fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    pub fn client(&self) -> ApiClient {
        ApiClient::new(&format!("http://{}", self.api), None)
    }
}

impl Drop for RelayProc {
    /// SIGTERM first, as an operator stops it: the relay tears its upstream sessions down,
    /// so an upstream serving the next target does not go on sending to this one's ports
    /// (which the next load client may be given). SIGKILL (by `Proc`) after 5 s.
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end && matches!(self.proc.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// CPU seconds (user + system, all threads) a process has used.
pub fn process_cpu_s(pid: u32) -> anyhow::Result<f64> {
    Ok(fanout_io::sys::ProcStat::read(Some(pid)).context("the relay is gone")?.cpu_s)
}

/// Seconds all CPUs have been idle (idle + iowait), and the number of CPUs. Busy time is
/// the wall time of all CPUs less this: with a tickless idle kernel, idle time is measured
/// exactly, while the busy fields are sampled at ticks that an idle CPU woken to run a
/// softirq (the spread kernel path's other CPU) never takes.
pub fn machine_idle() -> anyhow::Result<(f64, usize)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    let cpus =
        stat.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((idle as f64 / hz, cpus.max(1)))
}

/// A CPU meter over an interval: relay CPU seconds and machine busy share.
pub struct Meter {
    pid: u32,
    relay0: f64,
    softirqd0: f64,
    machine0: (f64, usize),
    t0: Instant,
}

#[derive(Debug, Clone, Copy)]
pub struct Metered {
    pub relay_cpu_s: f64,
    /// Relay CPU as a percentage of one core.
    pub relay_cpu_pct: f64,
    /// The path's CPU: the relay's, the source sender's (softirq work on its time, such as
    /// the `kernel` path's fan-out) and the softirq threads'.
    pub path_cpu_s: f64,
    pub path_cpu_pct: f64,
    /// Whole machine busy, percent of all cores.
    pub machine_pct: f64,
    /// Whole machine busy, CPU seconds (all cores).
    pub machine_busy_s: f64,
}

impl Meter {
    pub fn start(pid: u32) -> anyhow::Result<Self> {
        Ok(Self {
            pid,
            relay0: process_cpu_s(pid)?,
            softirqd0: softirqd_cpu_s(),
            machine0: machine_idle()?,
            t0: Instant::now(),
        })
    }
    /// `sender_cpu_s`: what the source's sender used meanwhile.
    pub fn stop(&self, sender_cpu_s: f64) -> anyhow::Result<Metered> {
        let relay = process_cpu_s(self.pid)? - self.relay0;
        let path = relay + sender_cpu_s + (softirqd_cpu_s() - self.softirqd0);
        let (idle, cpus) = machine_idle()?;
        let seconds = self.t0.elapsed().as_secs_f64();
        let wall = seconds * cpus as f64;
        let busy = (wall - (idle - self.machine0.0)).clamp(0.0, wall);
        Ok(Metered {
            relay_cpu_s: relay,
            relay_cpu_pct: 100.0 * relay / seconds,
            path_cpu_s: path,
            path_cpu_pct: 100.0 * path / seconds,
            machine_pct: 100.0 * busy / wall.max(1e-9),
            machine_busy_s: busy,
        })
    }
}

/// CPU seconds of this process's children that have exited and been reaped.
pub fn children_cpu_s() -> f64 {
    // SAFETY: ru is a valid rusage to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs `fanout <args>` to completion within `limit`, failing with its stderr.
/// Nice value the measuring tools (`gen`, `sub`) run at: a bench that crowds the relay on
/// purpose keeps its own instruments out of the crowd (0: as the bench runs).
static TOOLS_NICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

pub fn set_tools_nice(n: i32) {
    TOOLS_NICE.store(n, std::sync::atomic::Ordering::Relaxed);
}

/// `fanout` as a measuring tool, at the tools' nice value.
fn tool_command() -> anyhow::Result<Command> {
    let mut c = Command::new(std::env::current_exe()?);
    let nice = TOOLS_NICE.load(std::sync::atomic::Ordering::Relaxed);
    if nice != 0 {
        use std::os::unix::process::CommandExt;
        // SAFETY: setpriority is async-signal-safe; it only changes the child itself.
        unsafe {
            c.pre_exec(move || match libc::setpriority(libc::PRIO_PROCESS, 0, nice) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            });
        }
    }
    Ok(c)
}

pub fn run_tool(args: &[String], limit: Duration) -> anyhow::Result<()> {
    let child = tool_command()?.args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let mut p = Proc(child);
    let t = Instant::now();
    loop {
        if let Some(st) = p.0.try_wait()? {
            if st.success() {
                return Ok(());
            }
            let mut err = String::new();
            if let Some(mut e) = p.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            bail!("fanout {} failed: {}", args.first().map_or("", |s| s.as_str()), err.trim());
        }
        if t.elapsed() > limit {
            bail!("fanout {} did not finish within {limit:?}", args.first().map_or("", |s| s.as_str()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `fanout sub …` and waits until its subscribers are registered.
pub fn start_sub(args: &[String], limit: Duration) -> anyhow::Result<Proc> {
    start_sub_reporting(args, limit).map(|(p, _)| p)
}

/// [`start_sub`], with the rest of its output (its result, once it ends) to be had from the
/// receiver.
pub fn start_sub_reporting(
    args: &[String],
    limit: Duration,
) -> anyhow::Result<(Proc, std::sync::mpsc::Receiver<String>)> {
    let mut child = tool_command()?.arg("sub").args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let out = child.stdout.take().context("sub stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let (rest_tx, rest) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        let ready = lines.next().and_then(Result::ok).is_some_and(|l| l.trim() == "sub: ready");
        let _ = tx.send(ready);
        let _ = rest_tx.send(lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"));
    });
    let mut p = Proc(child);
    match rx.recv_timeout(limit) {
        Ok(true) => Ok((p, rest)),
        _ => {
            let _ = p.0.kill();
            let mut err = String::new();
            if let Some(mut e) = p.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            bail!("fanout sub did not get ready within {limit:?}: {}", err.trim())
        }
    }
}

/// Waits for a started process to end within `limit`.
pub fn wait(p: &mut Proc, limit: Duration) -> anyhow::Result<()> {
    let t = Instant::now();
    while p.0.try_wait()?.is_none() {
        if t.elapsed() > limit {
            bail!("a tool did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A bench's progress: a bar on a terminal, else a plain line per step on stderr (CI logs,
/// a run under `nohup`).
pub struct Progress {
    bar: ProgressBar,
    plain: bool,
    what: String,
    len: u64,
    pos: u64,
}

pub fn progress(steps: u64, what: &str) -> Progress {
    use std::io::IsTerminal as _;
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    let plain = !std::io::stderr().is_terminal();
    if plain {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    Progress { bar, plain, what: what.into(), len: steps, pos: 0 }
}

impl Progress {
    /// What the next step is; without a terminal, its line.
    pub fn set_message(&self, msg: String) {
        if self.plain {
            eprintln!("{} [{}/{}] {msg}", self.what, self.pos + 1, self.len);
        }
        self.bar.set_message(msg);
    }

    pub fn inc(&mut self, n: u64) {
        self.pos += n;
        self.bar.inc(n);
    }

    /// For time-based progress (seconds): without a terminal, a line every 10.
    pub fn set_position(&mut self, pos: u64) {
        if self.plain && pos / 10 > self.pos / 10 {
            eprintln!("{} {pos}/{} s", self.what, self.len);
        }
        self.pos = pos;
        self.bar.set_position(pos);
    }

    pub fn println(&self, line: String) {
        if self.plain {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    pub fn finish_and_clear(&self) {
        self.bar.finish_and_clear();
        if self.plain {
            eprintln!("{}: done", self.what);
        }
    }
}

pub fn ensure_dir(p: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))
}

/// A session spec's data path fields from a bench name: `PATH[:OPTION]...`, options
/// `connected` (UDP sinks on a connected socket each), `sqpoll` (uring's polling thread),
/// `flush=MS` (the stream sinks' write interval), `recv=uring|recvmmsg` (UDP source receive),
/// `pace=on|off` (paced egress, on by default), `link=own|shared` (`pace_link`),
/// `with=clock|txtime` (`pace_with`: held by the relay or stamped for fq), `rate=KBPS`
/// (`rate_kbps`, the rate to pace by instead of the measured one), `group=N` (sinks per
/// group task), `spread` (`kernel_spread`: the kernel path's clones made on every CPU).
pub fn datapath_fields(name: &str) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut parts = name.split(':');
    let mut m = serde_json::Map::new();
    m.insert("datapath".into(), parts.next().unwrap_or_default().into());
    for o in parts {
        match o.split_once('=') {
            None if o == "connected" => m.insert("udp_sinks".into(), "connected".into()),
            None if o == "sqpoll" => m.insert("uring_sqpoll".into(), true.into()),
            None if o == "spread" => m.insert("kernel_spread".into(), true.into()),
            Some(("recv", r)) => m.insert("source_recv".into(), r.into()),
            Some(("pace", p)) => m.insert("pacing".into(), p.into()),
            Some(("link", l)) => m.insert("pace_link".into(), l.into()),
            Some(("with", w)) => m.insert("pace_with".into(), w.into()),
            Some(("rate", k)) => m.insert("rate_kbps".into(), k.parse::<u64>().context("rate=KBPS")?.into()),
            Some(("group", n)) => m.insert("sinks_per_group".into(), n.parse::<u64>().context("group=N")?.into()),
            Some(("flush", ms)) => m.insert("stream_flush_ms".into(), ms.parse::<u64>().context("flush=MS")?.into()),
            _ => bail!(
                "data path option {o:?}: expected connected, sqpoll, spread, flush=MS, pace=on|off, link=own|shared, with=clock|txtime, rate=KBPS, group=N or recv=uring|recvmmsg"
            ),
        };
    }
    Ok(m)
}

/// Whether a data path name (`path:opt:opt…`) carries the option `opt`.
pub(crate) fn has_option(name: &str, opt: &str) -> bool {
    name.split(':').skip(1).any(|o| o == opt)
}

/// A data path name without the options a bench reads itself (`rps`, `paged`), for
/// [`datapath_fields`].
pub(crate) fn without_options(name: &str, bench_own: &[&str]) -> String {
    name.split(':')
        .enumerate()
        .filter(|(i, o)| *i == 0 || !bench_own.contains(o))
        .map(|(_, o)| o)
        .collect::<Vec<_>>()
        .join(":")
}

/// CPU seconds the kernel's softirq threads (`ksoftirqd/N`) have used: packet work the
/// kernel defers there is nobody's process time.
pub fn softirqd_cpu_s() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0.0 };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with("ksoftirqd/")))
        .filter_map(|pid| process_cpu_s(pid).ok())
        .sum()
}

/// Moves this process (the calling thread, and every thread and process it starts after)
/// into a private network namespace with its own `lo`, where the `kernel` data path may
/// attach its program. Meanwhile raises two machine-wide knobs (restored when dropped):
/// `net.core.netdev_max_backlog` (the clones of a datagram queue on one CPU; too small a
/// backlog drops them) and `net.core.netdev_budget` (packets one softirq run handles before
/// handing the rest to ksoftirqd).
pub struct PrivateNetns {
    saved: Vec<(std::fs::File, String)>,
}

impl PrivateNetns {
    pub fn enter(backlog: u64) -> anyhow::Result<Self> {
        let mut saved = Vec::new();
        for (knob, want) in [("netdev_max_backlog", backlog), ("netdev_budget", backlog.min(3000))] {
            if let Some(s) = raise_sysctl(&format!("/proc/sys/net/core/{knob}"), want)? {
                saved.push(s);
            }
        }
        // SAFETY: unshare affects only the calling thread's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            bail!(
                "the kernel data path is benchmarked in a private network namespace, which needs root: {}",
                std::io::Error::last_os_error()
            );
        }
        let st = Command::new("ip").args(["link", "set", "lo", "up"]).status().context("running ip")?;
        if !st.success() {
            bail!("ip link set lo up failed in the private namespace");
        }
        // A sysfs of this namespace (in a private mount namespace), so lo's receive queue can
        // be steered (`set_lo_rps`); /sys otherwise shows the machine's devices.
        // SAFETY: unshare and mount with valid C strings; they affect this thread (and the
        // processes it starts) only.
        let mounted = unsafe {
            libc::unshare(libc::CLONE_NEWNS) == 0
                && libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == 0
                && libc::mount(c"sysfs".as_ptr(), c"/sys".as_ptr(), c"sysfs".as_ptr(), 0, std::ptr::null()) == 0
        };
        // perf finds its tracepoints there, under the new sysfs.
        // SAFETY: as above.
        if mounted
            && unsafe {
                libc::mount(
                    c"tracefs".as_ptr(),
                    c"/sys/kernel/tracing".as_ptr(),
                    c"tracefs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            } != 0
        {
            eprintln!(
                "kernel data path: tracefs not mounted ({}): no system call counts",
                std::io::Error::last_os_error()
            );
        }
        if !mounted {
            eprintln!(
                "kernel data path: no sysfs of the private namespace ({}): RPS cannot be set",
                std::io::Error::last_os_error()
            );
        }
        eprintln!(
            "kernel data path: running in a private network namespace (netdev_max_backlog {backlog}, netdev_budget {})",
            backlog.min(3000)
        );
        Ok(Self { saved })
    }
}

/// Runs `ip` (iproute2), failing with what it printed.
pub(crate) fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Steers lo's received packets over every CPU by flow hash (RPS), or not: with it, the
/// clones the `kernel` path sends through lo are delivered on all CPUs instead of the one
/// that made them. Only inside [`PrivateNetns`], whose lo this is.
pub fn set_lo_rps(on: bool) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).min(64);
    let mask = if on { format!("{:x}", u64::MAX >> (64 - cpus)) } else { "0".into() };
    let path = "/sys/class/net/lo/queues/rx-0/rps_cpus";
    std::fs::write(path, &mask).with_context(|| format!("writing {mask} to {path}"))?;
    // A spread session's copies for other CPUs lose the sender's route: their clones to
    // local sinks are routed afresh, which lo refuses without these (the relay checks).
    for knob in ["accept_local", "route_localnet"] {
        let path = format!("/proc/sys/net/ipv4/conf/lo/{knob}");
        std::fs::write(&path, if on { "1" } else { "0" }).with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}

/// Raises a numeric sysctl to `to` if lower; returns it opened (here, in the machine's
/// namespace, so it can be restored from inside ours) with its old value.
fn raise_sysctl(path: &str, to: u64) -> anyhow::Result<Option<(std::fs::File, String)>> {
    use std::io::{Read, Seek, Write};
    let Ok(mut f) = std::fs::OpenOptions::new().read(true).write(true).open(path) else { return Ok(None) };
    let mut old = String::new();
    f.read_to_string(&mut old)?;
    if !old.trim().parse::<u64>().is_ok_and(|v| v < to) {
        return Ok(None);
    }
    f.rewind()?;
    f.write_all(to.to_string().as_bytes()).with_context(|| format!("raising {path}"))?;
    Ok(Some((f, old.trim().to_string())))
}

impl Drop for PrivateNetns {
    fn drop(&mut self) {
        use std::io::{Seek, Write};
        for (f, old) in &mut self.saved {
            let _ = f.rewind();
            let _ = f.write_all(old.as_bytes());
        }
    }
}

/// A process's system calls (perf counting the `raw_syscalls:sys_enter` tracepoint on each of
/// its threads; `None` without perf) and context switches (`/proc/PID/task/*/status`) over an
/// interval, read from the kernel's own counters.
pub struct SysCounts {
    pid: u32,
    perf: Option<(Proc, std::path::PathBuf)>,
    switches0: u64,
    t0: Instant,
}

/// What [`SysCounts`] counted.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    pub syscalls: Option<u64>,
    pub switches_per_s: f64,
}

impl SysCounts {
    pub fn start(pid: u32) -> Self {
        let out = std::env::temp_dir().join(format!("fanout-perf-{}-{pid}.csv", std::process::id()));
        let perf = Command::new("perf")
            .args(["stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", &pid.to_string(), "-o"])
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
            .map(|c| (Proc(c), out));
        // perf attaches to the threads after it starts: give it a moment.
        std::thread::sleep(Duration::from_millis(200));
        Self { pid, perf, switches0: context_switches(pid), t0: Instant::now() }
    }

    pub fn stop(mut self) -> Counted {
        let switches = context_switches(self.pid).saturating_sub(self.switches0);
        let switches_per_s = switches as f64 / self.t0.elapsed().as_secs_f64();
        let syscalls = self.perf.take().and_then(|(mut p, out)| {
            // SIGINT makes perf stat print its counts and exit.
            // SAFETY: kill on our own child's pid.
            unsafe { libc::kill(p.0.id() as i32, libc::SIGINT) };
            let _ = p.0.wait();
            let text = std::fs::read_to_string(&out).ok();
            let _ = std::fs::remove_file(&out);
            text?.lines().find(|l| l.contains("raw_syscalls:sys_enter"))?.split(',').next()?.parse().ok()
        });
        Counted { syscalls, switches_per_s }
    }
}

/// Voluntary and involuntary context switches of every thread of a process so far.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_options_are_read_and_left_out_of_the_session() {
        assert!(has_option("kernel:spread:paged", "paged"));
        assert!(!has_option("paged", "paged"), "a path name is not an option");
        assert_eq!(without_options("kernel:rps:spread:paged", &["rps", "paged"]), "kernel:spread");
        let m = datapath_fields(&without_options("shared:paged:group=8", &["paged"])).unwrap();
        assert_eq!((m["datapath"].as_str(), m["sinks_per_group"].as_u64()), (Some("shared"), Some(8)));
        assert!(datapath_fields("shared:paged").is_err(), "paged is the bench's, not a session field");
    }

    #[test]
    fn the_machine_line_names_model_cpus_and_kernel() {
        let info = "processor\t: 0\ncpu family\t: 6\nmodel\t\t: 167\nmodel name\t: Intel(R) Xeon(R) Processor\nstepping\t: 1\nflags\t\t: fpu hypervisor avx\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor\n";
        assert_eq!(
            machine_line(info, "6.1.0"),
            "machine: Intel(R) Xeon(R) Processor (family 6 model 167 stepping 1), 2 CPUs under a hypervisor, Linux 6.1.0"
        );
        assert_eq!(
            machine_line("", "6.1.0"),
            "machine: unknown CPU (family ? model ? stepping ?), 0 CPUs, Linux 6.1.0"
        );
    }
}
