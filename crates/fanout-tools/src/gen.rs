//! `fanout gen`: the media server emulator. K RTP streams at a given rate and payload size,
//! over UDP or TCP (fixed-size packets back to back), each packet carrying a probe (stream, sequence,
//! send time); or a real MPEG-TS file replayed at its own rate. Bounded by duration or count.

use super::{mono_ns, rtp_ts, RTP_HZ};
use anyhow::{bail, Context};
use clap::Args;
use fanout_proto::codec::annexb::{self, Codec};
use fanout_proto::container::mpegts::{TsSchedule, PCR_HZ};
use fanout_proto::probe::Probe;
use fanout_proto::rtp;
use serde::Serialize;
use std::io::Write;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct GenArgs {
    /// Destination of each stream (repeat, or give one with --sources K to use K
    /// consecutive ports from it).
    #[arg(long, required_unless_present = "rtmp")]
    pub to: Vec<SocketAddr>,
    /// Publish --file over RTMP instead, as an encoder does (`rtmp://host:port/app/name`):
    /// H.264, or H.265 in Enhanced RTMP, with AAC, looped at its own pace for --duration.
    #[arg(long, requires = "file", conflicts_with_all = ["to", "tcp"])]
    pub rtmp: Option<String>,
    /// Number of streams when one --to is given: ports to, to+1, …
    #[arg(long, default_value_t = 1)]
    pub sources: usize,
    /// Bit rate of each stream in kbit/s (of the datagram payload, as the OMSS papers count).
    #[arg(long, default_value_t = 256.0, conflicts_with = "pps")]
    pub rate_kbps: f64,
    /// Packet rate of each stream, instead of --rate-kbps.
    #[arg(long)]
    pub pps: Option<f64>,
    /// Datagram payload size in bytes, RTP header included (at least 36: header + probe).
    #[arg(long, default_value_t = 1400)]
    pub payload: usize,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Stop after this many packets per stream (whichever comes first).
    #[arg(long)]
    pub count: Option<u64>,
    /// Connect over TCP and send the same RTP packets back to back (every packet is
    /// --payload bytes, so a receiver cuts the byte stream at fixed sizes).
    #[arg(long)]
    pub tcp: bool,
    /// Replay a file, looped: MPEG-TS at its own rate (PCR-paced, 7 TS packets per datagram,
    /// RTP-wrapped per RFC 2250 unless --raw), or an H.264 (.264/.h264) or HEVC (.265/.hevc)
    /// Annex B stream packetized into RTP (RFC 6184 / RFC 7798, PT 96) at --fps.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Frame rate of an H.264/HEVC --file.
    #[arg(long, default_value_t = 25.0)]
    pub fps: f64,
    /// RTP payload type of the synthetic probe packets (96 by default; a relay that pulls the
    /// stream over RTSP takes 96 for H.264 and waits for keyframes the probes never carry,
    /// so `bench cluster` sends 33, which nobody reads as video).
    #[arg(long, default_value_t = 96, conflicts_with = "file")]
    pub payload_type: u8,
    /// With --file: send bare TS datagrams, no RTP header.
    #[arg(long, requires = "file")]
    pub raw: bool,
    /// With an H.264/HEVC --file: pack consecutive small NAL units of an access unit into
    /// one aggregation packet (STAP-A / AP) where they fit.
    #[arg(long, requires = "file")]
    pub aggregate: bool,
    /// Send each UDP datagram with its payload in page fragments, as a NIC's driver hands a
    /// received one up, instead of the one linear buffer a local sender's datagram is.
    #[arg(long, conflicts_with = "tcp")]
    pub paged: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct GenReport {
    pub streams: usize,
    pub packets: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Packet rate asked for, per stream.
    pub target_pps: f64,
    /// Packet rate achieved, per stream.
    pub achieved_pps: f64,
    pub achieved_kbps_per_stream: f64,
    /// How late the latest packet left, relative to its schedule.
    pub max_late_us: u64,
    pub send_errors: u64,
}

enum Out {
    Udp(UdpSocket, SocketAddr),
    Tcp(TcpStream),
}

pub fn run(a: GenArgs) -> anyhow::Result<()> {
    if let (Some(url), Some(file)) = (&a.rtmp, &a.file) {
        return crate::rtmp::run(url, file, a.duration);
    }
    let r = generate(&a)?;
    eprintln!(
        "gen: {} streams, {} packets in {:.2} s: {:.1} pkt/s per stream (target {:.1}), {:.1} kbit/s per stream, latest send {} µs late, {} send errors",
        r.streams, r.packets, r.seconds, r.achieved_pps, r.target_pps, r.achieved_kbps_per_stream, r.max_late_us, r.send_errors
    );
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&r)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

pub fn generate(a: &GenArgs) -> anyhow::Result<GenReport> {
    let dests: Vec<SocketAddr> = if a.to.len() == 1 && a.sources > 1 {
        let base = a.to[0];
        (0..a.sources)
            .map(|i| {
                let port = base.port().checked_add(i as u16).context("--sources runs past port 65535")?;
                Ok(SocketAddr::new(base.ip(), port))
            })
            .collect::<anyhow::Result<_>>()?
    } else {
        a.to.clone()
    };
    let media = Media::new(a)?;
    let mut outs: Vec<Out> = dests
        .iter()
        .map(|&d| -> anyhow::Result<Out> {
            if a.tcp {
                let s = TcpStream::connect_timeout(&d, Duration::from_secs(3))
                    .with_context(|| format!("cannot connect to {d} (is the relay's tcp_listen source there?)"))?;
                s.set_nodelay(true)?;
                Ok(Out::Tcp(s))
            } else {
                let bind: SocketAddr = if d.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
                let s = UdpSocket::bind(bind)?;
                if a.paged {
                    super::send_paged(&s).context("asking for paged datagrams (UDP_SEGMENT)")?;
                }
                Ok(Out::Udp(s, d))
            }
        })
        .collect::<anyhow::Result<_>>()?;
    let k = outs.len();
    let pps = media.rate_pps();
    let limit_ns = (a.duration * 1e9) as u64;
    let mut buf = vec![0x5au8; 65_536];
    let ssrc_base = (mono_ns() as u32) & 0xffff_0000;
    let start = mono_ns();
    let (mut packets, mut bytes, mut errors, mut max_late, mut last_sent) = (0u64, 0u64, 0u64, 0u64, start);
    let mut n = 0u64;
    while n < a.count.unwrap_or(u64::MAX) && media.due_ns(n) < limit_ns {
        // Streams are staggered evenly inside a packet interval so K sources do not burst.
        for (i, out) in outs.iter_mut().enumerate() {
            let due = start + media.due_ns(n) + (i as f64 / k as f64 / pps * 1e9) as u64;
            let now = mono_ns();
            if due > now {
                std::thread::sleep(Duration::from_nanos(due - now));
            }
            let sent_ns = mono_ns();
            last_sent = sent_ns;
            max_late = max_late.max(sent_ns.saturating_sub(due));
            let len = media.write(n, i as u32, sent_ns, ssrc_base + i as u32, &mut buf);
            let r = match out {
                Out::Udp(s, d) => s.send_to(&buf[..len], *d).map(|_| ()),
                Out::Tcp(s) => s.write_all(&buf[..len]),
            };
            match r {
                Ok(()) => {
                    packets += 1;
                    bytes += len as u64;
                }
                Err(e) if a.tcp => bail!("stream {i}: the relay closed the connection: {e}"),
                Err(_) => errors += 1,
            }
        }
        n += 1;
    }
    // N packets at rate r span (N - 1) / r: measure the rate over the span between the first
    // and the last send, and the bit rate over the span plus one interval.
    let per_stream = packets as f64 / k as f64;
    let span = (last_sent - start) as f64 / 1e9;
    Ok(GenReport {
        streams: k,
        packets,
        bytes,
        seconds: span,
        target_pps: pps,
        achieved_pps: if span > 0.0 { (per_stream - 1.0) / span } else { 0.0 },
        achieved_kbps_per_stream: bytes as f64 * 8.0 / 1000.0 / k as f64 / (span + 1.0 / pps),
        max_late_us: max_late / 1000,
        send_errors: errors,
    })
}

/// What `gen` sends: synthetic probe packets, a TS file, or an H.264/HEVC file.
enum Media {
    Probe { pps: f64, payload: usize, pt: u8 },
    Ts { ts: Vec<u8>, sched: TsSchedule, raw: bool },
    Video { fps: f64, payloads: Vec<(Vec<u8>, u64, bool)>, aus: u64 },
}

impl Media {
    fn new(a: &GenArgs) -> anyhow::Result<Self> {
        if a.payload > 65_000 {
            bail!("--payload {} is larger than a UDP datagram can be", a.payload);
        }
        let Some(p) = &a.file else {
            if a.payload < rtp::FIXED_HEADER_LEN + fanout_proto::probe::LEN {
                bail!("--payload {} is too small: the RTP header and probe need 36 bytes", a.payload);
            }
            let pps = a.pps.unwrap_or(a.rate_kbps * 1000.0 / 8.0 / a.payload as f64);
            if !(pps > 0.0 && pps.is_finite()) {
                bail!("the packet rate must be positive");
            }
            return Ok(Media::Probe { pps, payload: a.payload, pt: a.payload_type & 0x7f });
        };
        let data = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        let codec = match ext.as_str() {
            "264" | "h264" | "avc" => Some(Codec::H264),
            "265" | "h265" | "hevc" => Some(Codec::H265),
            _ => None,
        };
        let Some(codec) = codec else {
            let sched =
                TsSchedule::new(&data).with_context(|| format!("{} cannot be paced as MPEG-TS", p.display()))?;
            return Ok(Media::Ts { ts: data, sched, raw: a.raw });
        };
        if !(a.fps > 0.0 && a.fps.is_finite()) {
            bail!("--fps must be positive");
        }
        let max = a.payload.max(100) - rtp::FIXED_HEADER_LEN;
        let aus = annexb::access_units(codec, &data);
        if aus.is_empty() {
            bail!("{}: no NAL units found (is it an Annex B byte stream?)", p.display());
        }
        let mut payloads = Vec::new();
        let mut scratch = Vec::new();
        for (k, au) in aus.iter().enumerate() {
            // Runs of NAL units that fit one aggregation packet together (with --aggregate),
            // else one NAL unit each.
            let mut push = |pl: &[u8], end: bool| payloads.push((pl.to_vec(), k as u64, end));
            if a.aggregate {
                annexb::packetize_frame(codec, au, max, &mut scratch, push);
            } else {
                for (j, nal) in au.iter().enumerate() {
                    annexb::packetize(codec, nal, max, &mut scratch, |pl, last| push(pl, last && j + 1 == au.len()));
                }
            }
        }
        Ok(Media::Video { fps: a.fps, payloads, aus: aus.len() as u64 })
    }

    /// Mean packets per second of one stream.
    fn rate_pps(&self) -> f64 {
        match self {
            Media::Probe { pps, .. } => *pps,
            Media::Ts { sched, .. } => sched.len() as f64 * PCR_HZ as f64 / sched.loop_ticks() as f64,
            Media::Video { fps, payloads, aus, .. } => payloads.len() as f64 * fps / *aus as f64,
        }
    }

    /// When packet `n` is due, in ns from the start (files loop).
    fn due_ns(&self, n: u64) -> u64 {
        match self {
            Media::Probe { pps, .. } => (n as f64 / pps * 1e9) as u64,
            Media::Ts { sched, .. } => sched.datagram(n).2 * 1000 / (PCR_HZ / 1_000_000),
            Media::Video { fps, payloads, aus, .. } => {
                let per = payloads.len() as u64;
                let au = (n / per) * aus + payloads[(n % per) as usize].1;
                (au as f64 / fps * 1e9) as u64
            }
        }
    }

    /// Writes packet `n` of stream `stream` into `buf`; returns its length.
    fn write(&self, n: u64, stream: u32, sent_ns: u64, ssrc: u32, buf: &mut [u8]) -> usize {
        let seq = n as u16;
        match self {
            Media::Probe { payload, pt, .. } => {
                let h = rtp::write_header(buf, false, *pt, seq, rtp_ts(sent_ns), ssrc);
                Probe { stream, seq: n, sent_ns }.write_to(&mut buf[h..]);
                *payload
            }
            Media::Ts { ts, sched, raw } => {
                let (off, len, due) = sched.datagram(n);
                if *raw {
                    buf[..len].copy_from_slice(&ts[off..off + len]);
                    return len;
                }
                // 27 MHz PCR ticks / 300 = the 90 kHz RTP clock of MPEG-TS (RFC 2250).
                let h = rtp::write_header(buf, false, 33, seq, (due / 300) as u32, ssrc);
                buf[h..h + len].copy_from_slice(&ts[off..off + len]);
                h + len
            }
            Media::Video { payloads, fps, aus, .. } => {
                let per = payloads.len() as u64;
                let (pl, au, marker) = &payloads[(n % per) as usize];
                let ts = (((n / per) * aus + au) as f64 * RTP_HZ as f64 / fps) as u32;
                let h = rtp::write_header(buf, *marker, 96, seq, ts, ssrc);
                buf[h..h + pl.len()].copy_from_slice(pl);
                h + pl.len()
            }
        }
    }
}
