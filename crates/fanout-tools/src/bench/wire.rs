//! `bench bulk --sinks wire`: subscribers at the far end of a veth, counted by an eBPF
//! program where their datagrams arrive (bpf/wire_sink.bpf.c) and dropped there.
//!
//! On loopback, each of 20,000 subscriber sockets costs the machine a socket delivery, a
//! wake-up and a read per datagram: on 2 vCPUs the receivers, not the relay, fill the
//! machine. A real relay's subscribers are on other machines; what the relay owes them is a
//! datagram leaving its interface. Here the relay routes to 10.77.0.0/16 through `fo-relay`,
//! whose peer `fo-wire` (no address, a static neighbour entry) counts every datagram per
//! destination (packets, reordering, one-way latency from the probe `gen` writes) at TC
//! ingress. Only inside the bench's private network namespace.

use super::ip;
use anyhow::{bail, Context};
use aya::maps::{Array, MapData, PerCpuArray};
use aya::programs::{tc, SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader, Pod};
use std::net::{Ipv4Addr, SocketAddrV4};

static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/wire_sink.o"));

/// The program's layout: sinks from 10.77.0.2, ports 10000.., PORTS per address.
const BASE_ADDR: u32 = u32::from_be_bytes([10, 77, 0, 2]);
const BASE_PORT: u16 = 10_000;
const PORTS: usize = 50_000;
/// Two addresses' worth (the program's bound); more than the relay's kernel pool of 65,536.
pub const MAX_SINKS: usize = 2 * PORTS;
const HIST_NS: u64 = 100_000;
const RELAY_IF: &str = "fo-relay";
const SINK_IF: &str = "fo-wire";
const SINK_MAC: &str = "02:00:0a:4d:00:02";

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Count {
    packets: u64,
    highest: u64,
    reordered: u64,
}
// SAFETY: plain integers, the C struct's layout.
unsafe impl Pod for Count {}

/// What the wire sinks saw in one step.
pub struct WireCount {
    pub received: u64,
    pub reordered: u64,
    /// The fewest packets any one sink got.
    pub fewest: u64,
    /// UDP datagrams that reached the wire for no sink (or with no probe).
    pub stray: u64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
}

pub struct WireSinks {
    counts: Array<MapData, Count>,
    latency: PerCpuArray<MapData, u64>,
    stray: PerCpuArray<MapData, u64>,
    /// Holds the attached program.
    _ebpf: Ebpf,
}

impl WireSinks {
    /// Creates the veth and its counter, for up to `max` sinks. Call inside the bench's
    /// private network namespace, before the relay starts (it reads routes as it goes).
    pub fn setup(max: usize) -> anyhow::Result<Self> {
        if PROGRAM.is_empty() {
            bail!("fanout was built without clang, so without the wire-sink counter: install clang and rebuild");
        }
        if max > MAX_SINKS {
            bail!("--sinks wire counts at most {MAX_SINKS} sinks ({max} asked for)");
        }
        ip(&["link", "add", RELAY_IF, "type", "veth", "peer", "name", SINK_IF, "address", SINK_MAC])?;
        ip(&["addr", "add", "10.77.0.1/16", "dev", RELAY_IF])?;
        ip(&["link", "set", RELAY_IF, "up"])?;
        ip(&["link", "set", SINK_IF, "up"])?;
        // The kernel path looks its remote sinks up in the FIB from lo's ingress, which
        // answers only where forwarding is on (this namespace's own setting).
        for knob in ["all", "lo"] {
            let path = format!("/proc/sys/net/ipv4/conf/{knob}/forwarding");
            std::fs::write(&path, "1").with_context(|| format!("writing 1 to {path}"))?;
        }
        for h in 0..max.div_ceil(PORTS).max(1) {
            let a = Ipv4Addr::from(BASE_ADDR + h as u32).to_string();
            ip(&["neigh", "replace", &a, "lladdr", SINK_MAC, "dev", RELAY_IF, "nud", "permanent"])?;
        }
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("COUNTS", max.max(1) as u32)
            .load(PROGRAM)
            .map_err(|e| anyhow::anyhow!("loading the wire-sink counter: {e}"))?;
        let prog: &mut SchedClassifier =
            ebpf.program_mut("wire_sink").context("no wire_sink program")?.try_into().context("not a tc program")?;
        prog.load().context("the verifier refused the wire-sink counter")?;
        // tcx needs no qdisc; on kernels before 6.6 aya attaches through clsact.
        let _ = tc::qdisc_add_clsact(SINK_IF);
        prog.attach(SINK_IF, TcAttachType::Ingress).context("attaching the wire-sink counter")?;
        let take = |e: &mut Ebpf, name: &str| e.take_map(name).with_context(|| format!("map {name} missing"));
        Ok(Self {
            counts: take(&mut ebpf, "COUNTS")?.try_into()?,
            latency: take(&mut ebpf, "LATENCY")?.try_into()?,
            stray: take(&mut ebpf, "STRAY")?.try_into()?,
            _ebpf: ebpf,
        })
    }

    /// The `i`th sink's address.
    pub fn addr(i: usize) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(BASE_ADDR + (i / PORTS) as u32), BASE_PORT + (i % PORTS) as u16)
    }

    /// Zeroes the first `n` sinks' counts and the latency and stray counters.
    pub fn reset(&mut self, n: usize) -> anyhow::Result<()> {
        for i in 0..n as u32 {
            self.counts.set(i, Count::default(), 0)?;
        }
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        for m in [&mut self.latency, &mut self.stray] {
            for i in 0..m.len() {
                m.set(i, aya::maps::PerCpuValues::try_from(vec![0u64; cpus])?, 0)?;
            }
        }
        Ok(())
    }

    /// What the first `n` sinks got since [`reset`](Self::reset).
    pub fn read(&self, n: usize) -> anyhow::Result<WireCount> {
        let (mut received, mut reordered, mut fewest) = (0, 0, u64::MAX);
        for i in 0..n as u32 {
            let c = self.counts.get(&i, 0)?;
            received += c.packets;
            reordered += c.reordered;
            fewest = fewest.min(c.packets);
        }
        let sum = |m: &PerCpuArray<MapData, u64>, i: u32| m.get(&i, 0).map(|v| v.iter().sum::<u64>());
        let hist = (0..self.latency.len()).map(|i| sum(&self.latency, i)).collect::<Result<Vec<u64>, _>>()?;
        let stray = sum(&self.stray, 0)?;
        Ok(WireCount {
            received,
            reordered,
            fewest: if n == 0 { 0 } else { fewest },
            stray,
            latency_p50_us: quantile_us(&hist, 0.50),
            latency_p99_us: quantile_us(&hist, 0.99),
        })
    }
}

/// The upper edge of the bucket holding quantile `q` (0 for an empty histogram).
fn quantile_us(hist: &[u64], q: f64) -> f64 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let want = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (b, &c) in hist.iter().enumerate() {
        seen += c;
        if seen >= want {
            return ((b as u64 + 1) * HIST_NS) as f64 / 1000.0;
        }
    }
    (hist.len() as u64 * HIST_NS) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_addresses_follow_the_programs_layout() {
        assert_eq!(WireSinks::addr(0), "10.77.0.2:10000".parse().unwrap());
        assert_eq!(WireSinks::addr(PORTS - 1), "10.77.0.2:59999".parse().unwrap());
        assert_eq!(WireSinks::addr(PORTS), "10.77.0.3:10000".parse().unwrap());
    }

    #[test]
    fn quantiles_are_bucket_upper_edges() {
        let mut h = vec![0u64; 10];
        h[0] = 50;
        h[3] = 49;
        h[9] = 1;
        assert_eq!(quantile_us(&h, 0.5), 100.0);
        assert_eq!(quantile_us(&h, 0.99), 400.0);
        assert_eq!(quantile_us(&h, 1.0), 1000.0);
        assert_eq!(quantile_us(&[0; 4], 0.5), 0.0);
    }
}
