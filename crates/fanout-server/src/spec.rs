//! What a user asks for, as the API and the config file spell it. Every type rejects unknown
//! fields and bad values with a message that names the field.

use fanout_io::{DataPath, FailurePolicy, PayloadMode, SourceRecv, UdpSinkMode};
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr};

/// Where a session's packets come from. Exactly one of `udp`, `tcp_listen`, `tcp_connect`,
/// `rtsp`, `file`, `demo = true`, `publish = true` must be given; the other keys qualify it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// Receive UDP datagrams on this address (a multicast group address joins the group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp: Option<SocketAddr>,
    /// For a multicast `udp` source: the local IPv4 address of the interface to join on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<Ipv4Addr>,
    /// Listen on this address for one TCP publisher at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_listen: Option<SocketAddr>,
    /// Connect out to this TCP address and read the stream it sends (reconnects on loss).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_connect: Option<SocketAddr>,
    /// The built-in looped MPEG-TS test pattern, paced at its own bit rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demo: Option<bool>,
    /// Play a recorded MPEG-TS file at its own rate (PCR-paced), restamped seamlessly at
    /// each loop; served over every output like a live source.
    pub file: Option<std::path::PathBuf>,
    /// With `file`: loop it (default `true`); `false` plays it once, then the source is
    /// closed.
    #[serde(rename = "loop")]
    pub looped: Option<bool>,
    /// `true`: RTSP publishers (ffmpeg, GStreamer, OBS) push the stream to
    /// `rtsp://relay/{name}` with ANNOUNCE and RECORD, one at a time, authenticated like
    /// RTSP clients.
    pub publish: Option<bool>,
    /// Pull from an RTSP server: `rtsp://[user:pass@]host[:port]/path`. Every media section
    /// becomes a track; RTSP clients of this session share one upstream session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtsp: Option<String>,
    /// With `rtsp`: `udp`, `tcp` (interleaved), or `auto` (UDP, then TCP when UDP brings
    /// nothing in 3 s). Default `auto`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtsp_transport: Option<RtspTransport>,
    /// With `rtsp`: connect only while someone watches (default `true`); `false` keeps the
    /// upstream session up all the time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_demand: Option<bool>,
    /// With `rtsp` on demand: seconds the upstream session stays after the last client left
    /// (default 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linger_s: Option<f64>,
    /// With `rtsp`: seconds without RTP after which the upstream is reconnected (default 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// With an `rtsps://` source: trust the certificates in this PEM file (instead of the
    /// public roots).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<String>,
    /// With an `rtsps://` source: accept exactly the certificate with this SHA-256
    /// fingerprint (`AB:CD:…`), whoever signed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_fingerprint: Option<String>,
    /// With an `rtsps://` source: `false` checks no certificate at all (logged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_verify: Option<bool>,
}

/// The keys of [`SourceSpec`] (docs/config.md documents each; a test keeps the list whole).
#[cfg(test)]
pub const SOURCE_FIELDS: &[&str] = &[
    "udp",
    "interface",
    "tcp_listen",
    "tcp_connect",
    "demo",
    "file",
    "loop",
    "publish",
    "rtsp",
    "rtsp_transport",
    "on_demand",
    "linger_s",
    "timeout_s",
    "tls_ca",
    "tls_fingerprint",
    "tls_verify",
];

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VideoCodec {
    H264,
    H265,
}

impl VideoCodec {
    pub fn codec(self) -> fanout_proto::codec::annexb::Codec {
        match self {
            VideoCodec::H264 => fanout_proto::codec::annexb::Codec::H264,
            VideoCodec::H265 => fanout_proto::codec::annexb::Codec::H265,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RtspTransport {
    #[default]
    Auto,
    Udp,
    Tcp,
}

impl SourceSpec {
    /// How an `rtsps://` source checks its server: at most one of `tls_ca`,
    /// `tls_fingerprint`, `tls_verify = false`; the public roots when none.
    pub fn upstream_verify(&self) -> Result<crate::tls::Verify, String> {
        use crate::tls::Verify;
        match (&self.tls_ca, &self.tls_fingerprint, self.tls_verify) {
            (None, None, None | Some(true)) => Ok(Verify::PublicRoots),
            (Some(ca), None, None | Some(true)) => Ok(Verify::Ca(ca.into())),
            (None, Some(f), None | Some(true)) => crate::tls::parse_fingerprint(f)
                .map(Verify::Pinned)
                .map_err(|e| format!("source \"tls_fingerprint\": {e}")),
            (None, None, Some(false)) => Ok(Verify::Off),
            _ => Err("source: give at most one of \"tls_ca\", \"tls_fingerprint\", \"tls_verify\" = false".into()),
        }
    }

    /// Whether the `kernel` path can serve it: an IPv4 UDP source, or an RTSP upstream
    /// (whose packets enter through a loopback UDP socket).
    pub fn kernel_capable(&self) -> bool {
        self.udp.is_some_and(|a| a.is_ipv4()) || self.rtsp.is_some()
    }

    pub fn validate(&self) -> Result<(), String> {
        let n = [
            self.udp.is_some(),
            self.tcp_listen.is_some(),
            self.tcp_connect.is_some(),
            self.demo == Some(true),
            self.rtsp.is_some(),
            self.file.is_some(),
            self.publish == Some(true),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if n != 1 {
            return Err(format!(
                "source needs exactly one of \"udp\", \"tcp_listen\", \"tcp_connect\", \"rtsp\", \"file\", \"demo\": true, \"publish\": true (got {n})"
            ));
        }
        if self.looped.is_some() && self.file.is_none() {
            return Err("source \"loop\" only applies to a \"file\" source".into());
        }
        let tls_keys = self.tls_ca.is_some() || self.tls_fingerprint.is_some() || self.tls_verify.is_some();
        match &self.rtsp {
            Some(url) => {
                let u = fanout_proto::rtsp::client::Url::parse(url).map_err(|e| format!("source \"rtsp\": {e}"))?;
                if tls_keys && !u.tls {
                    return Err(
                        "source \"tls_ca\", \"tls_fingerprint\" and \"tls_verify\" apply to an rtsps:// source".into(),
                    );
                }
                self.upstream_verify()?;
                if self.linger_s.is_some_and(|l| !(0.0..=86_400.0).contains(&l)) {
                    return Err("source \"linger_s\" must be 0 to 86400".into());
                }
                if self.timeout_s.is_some_and(|t| !(0.1..=3600.0).contains(&t)) {
                    return Err("source \"timeout_s\" must be 0.1 to 3600".into());
                }
            }
            None if self.rtsp_transport.is_some()
                || self.on_demand.is_some()
                || self.linger_s.is_some()
                || self.timeout_s.is_some()
                || tls_keys =>
            {
                return Err("source \"rtsp_transport\", \"on_demand\", \"linger_s\", \"timeout_s\" and \"tls_*\" only apply to an \"rtsp\" source".into());
            }
            None => {}
        }
        if self.interface.is_some() && !self.udp.is_some_and(|a| a.ip().is_multicast()) {
            return Err("source \"interface\" only applies to a multicast \"udp\" address".into());
        }
        Ok(())
    }
}

/// Where a sink sends. Exactly one of `udp`, `tcp`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SinkSpec {
    /// Send each datagram to this UDP address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp: Option<SocketAddr>,
    /// Connect to this TCP address and push the byte stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<SocketAddr>,
}

impl SinkSpec {
    pub fn validate(&self) -> Result<(), String> {
        match (self.udp, self.tcp) {
            (Some(a), None) | (None, Some(a)) if a.port() == 0 => Err(format!("sink address {a} has port 0")),
            (Some(a), None) if a.ip().is_unspecified() => Err(format!("sink address {a} is unspecified")),
            // Sinks send unicast (or multicast); a broadcast would need SO_BROADCAST and
            // would reach every host of the link.
            (Some(std::net::SocketAddr::V4(a)), None) if a.ip().is_broadcast() => {
                Err(format!("sink address {a} is a broadcast address; use a unicast or multicast address"))
            }
            (Some(_), None) | (None, Some(_)) => Ok(()),
            _ => Err("sink needs exactly one of \"udp\" or \"tcp\"".into()),
        }
    }
}

/// A relay session: the OMSS SET_SOURCE call, and a `[[session]]` table in the config.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// Unique name: 1–64 of `A-Z a-z 0-9 _ - .`; the stream URL is `/v1/sessions/{name}/stream`.
    pub name: String,
    pub source: SourceSpec,
    /// Priority class, 0 (lowest) to 7 (highest): higher classes are always served first.
    #[serde(default)]
    pub priority: i64,
    /// `daemon`, `copy`, `shared`, `uring` or `kernel` (default: the server's `datapath`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath: Option<DataPath>,
    /// Ring capacity in packets (default: the server's `ring`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<usize>,
    /// Largest datagram accepted, in bytes (default: the server's `max_datagram`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_datagram: Option<usize>,
    /// `auto` (strip valid RTP headers for HTTP subscribers), `rtp` (drop non-RTP) or `raw`.
    #[serde(default)]
    pub payload: PayloadMode,
    /// `keep` failed sinks listed with their reason (default), `remove` them, or `retry`
    /// (UDP: keep sending and count errors; TCP: reconnect with backoff).
    #[serde(default)]
    pub failed_sinks: FailurePolicy,
    /// `uring` data path: let a kernel thread poll the submission queue (SQPOLL), so sends
    /// need no system call while it is awake. Each sink group gets its own ring and thread.
    #[serde(default)]
    pub uring_sqpoll: bool,
    /// `kernel` data path: spread the fan-out over the CPUs lo's receive steering (RPS)
    /// covers, one shard of the sinks per CPU, instead of making every clone on the CPU the
    /// datagram arrived on (see docs/config.md for what the host must set).
    #[serde(default)]
    pub kernel_spread: bool,
    /// TCP/HTTP sinks (`shared`, `uring`, `kernel`) are written at most once per this many
    /// milliseconds, all that is pending in one write (default: the server's; 0 = at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_flush_ms: Option<u64>,
    /// Sinks per sink-group task (default: the server's): larger groups take fewer system
    /// calls and wake-ups per packet, smaller ones spread a session over more workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sinks_per_group: Option<usize>,
    /// UDP source receive: `recvmmsg` (default) or `uring` (multishot, provided buffers).
    #[serde(default)]
    pub source_recv: SourceRecv,
    /// The video codec of the source's RTP (`h264` or `h265`): new sinks start at a
    /// keyframe, the status shows the rate of each scalable layer, and RTSP clients get it
    /// described. (RTSP sources know it from their upstream's description.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video: Option<VideoCodec>,
    /// Paced egress: `on` (default: no sink is sent faster than the stream's rate times
    /// `pace_catchup`, beyond a burst that keeps a keyframe whole) or `off`.
    #[serde(default)]
    pub pacing: Pacing,
    /// The stream's rate for pacing, in kbit/s (default: measured from the source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_kbps: Option<u64>,
    /// Bytes a sink may get back to back, in KiB (default: the largest picture seen × 1.25;
    /// 200 ms of the stream where pictures are not told apart, as in MPEG-TS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_burst_kb: Option<u64>,
    /// A sink's rate as a multiple of the stream's: how fast a new or lapped sink catches up
    /// (default 1.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_catchup: Option<f64>,
    /// Whether the sinks share a link: `own` (default: each is paced alone) or `shared`
    /// (a sink group is also paced as a whole, at the sum of its sinks' rates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_link: Option<PaceLink>,
    /// Egress reserved for this session, all its sinks together, in kbit/s (needs the
    /// relay's `egress_kbps`): under contention it gets this much before the spare capacity
    /// is shared by class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_kbps: Option<u64>,
    /// How `shared` sends to UDP sinks: `batched` (one `sendmmsg` for the whole group,
    /// default) or `connected` (a connected socket per sink).
    #[serde(default)]
    pub udp_sinks: UdpSinkMode,
    /// Sinks to add at once (config files; the API takes them too).
    #[serde(default, rename = "sink", alias = "sinks", skip_serializing_if = "Vec::is_empty")]
    pub sinks: Vec<SinkSpec>,
}

/// Whether a session's sinks are paced each alone or, as behind one link, together too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PaceLink {
    Own,
    Shared,
}

/// Whether a session paces its sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pacing {
    #[default]
    On,
    Off,
}

pub const MAX_RING: usize = 1 << 20;
pub const MAX_SINKS_PER_GROUP: usize = 4096;
pub const RATE_KBPS: std::ops::RangeInclusive<u64> = 8..=10_000_000;
pub const PACE_CATCHUP: std::ops::RangeInclusive<f64> = 1.0..=8.0;
pub const DEFAULT_PACE_CATCHUP: f64 = 1.5;
pub const MAX_STREAM_FLUSH_MS: u64 = 1000;
pub const MAX_DATAGRAM: usize = 65_535;

impl SessionSpec {
    /// A spec with every optional field at its default.
    pub fn new(name: impl Into<String>, source: SourceSpec) -> Self {
        Self {
            name: name.into(),
            source,
            priority: 0,
            datapath: None,
            ring: None,
            max_datagram: None,
            payload: PayloadMode::default(),
            failed_sinks: FailurePolicy::default(),
            udp_sinks: UdpSinkMode::default(),
            uring_sqpoll: false,
            kernel_spread: false,
            stream_flush_ms: None,
            sinks_per_group: None,
            source_recv: SourceRecv::default(),
            video: None,
            pacing: Pacing::default(),
            rate_kbps: None,
            pace_burst_kb: None,
            pace_catchup: None,
            pace_link: None,
            reserve_kbps: None,
            sinks: Vec::new(),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        let ok_name = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !ok_name {
            return Err(format!("session name {:?} must be 1-64 characters of A-Z a-z 0-9 _ - .", self.name));
        }
        // URL paths resolve these away: such a session could never be addressed.
        if self.name == "." || self.name == ".." {
            return Err(format!("session name {:?} cannot be addressed in a URL", self.name));
        }
        fanout_core::Priority::new(self.priority).map_err(|e| e.to_string())?;
        self.source.validate()?;
        if self.datapath == Some(DataPath::Kernel) && !self.source.kernel_capable() {
            return Err("datapath \"kernel\" needs an IPv4 udp or an rtsp source".into());
        }
        if self.kernel_spread && self.datapath.is_some_and(|d| d != DataPath::Kernel) {
            return Err("kernel_spread spreads the kernel data path: it needs datapath \"kernel\"".into());
        }
        if let Some(ms) = self.stream_flush_ms.filter(|&ms| ms > MAX_STREAM_FLUSH_MS) {
            return Err(format!("stream_flush_ms {ms} is out of range 0..={MAX_STREAM_FLUSH_MS}"));
        }
        if let Some(n) = self.sinks_per_group.filter(|n| !(1..=MAX_SINKS_PER_GROUP).contains(n)) {
            return Err(format!("sinks_per_group {n} is out of range 1..={}", MAX_SINKS_PER_GROUP));
        }
        if let Some(r) = self.ring {
            if !(2..=MAX_RING).contains(&r) {
                return Err(format!("ring {r} is out of range 2..={MAX_RING}"));
            }
        }
        if let Some(m) = self.max_datagram {
            if !(188..=MAX_DATAGRAM).contains(&m) {
                return Err(format!("max_datagram {m} is out of range 188..={MAX_DATAGRAM}"));
            }
        }
        if let Some(r) = self.rate_kbps.filter(|r| !RATE_KBPS.contains(r)) {
            return Err(format!(
                "rate_kbps {r} is out of range {}..={} (a stream's rate, to pace by)",
                RATE_KBPS.start(),
                RATE_KBPS.end()
            ));
        }
        if let Some(r) = self.reserve_kbps.filter(|r| !RATE_KBPS.contains(r)) {
            return Err(format!(
                "reserve_kbps {r} is out of range {}..={} (egress reserved for the session)",
                RATE_KBPS.start(),
                RATE_KBPS.end()
            ));
        }
        if self.pace_burst_kb == Some(0) {
            return Err("pace_burst_kb 0 cannot hold one packet".into());
        }
        if let Some(c) = self.pace_catchup.filter(|c| !PACE_CATCHUP.contains(c)) {
            return Err(format!("pace_catchup {c} is out of range {}..={}", PACE_CATCHUP.start(), PACE_CATCHUP.end()));
        }
        for s in &self.sinks {
            s.validate()?;
        }
        Ok(())
    }

    /// How the session paces, for a largest datagram of `max_datagram` bytes: a burst
    /// allowance that cannot hold one is refused.
    pub fn pace_config(&self, max_datagram: usize) -> Result<Option<fanout_io::PaceConfig>, String> {
        if self.pacing == Pacing::Off {
            return Ok(None);
        }
        let burst = self.pace_burst_kb.map(|kb| kb * 1024);
        if let Some(b) = burst.filter(|&b| b < max_datagram as u64) {
            return Err(format!(
                "pace_burst_kb {} ({b} bytes) is smaller than one packet (max_datagram {max_datagram})",
                b / 1024
            ));
        }
        Ok(Some(fanout_io::PaceConfig {
            rate: self.rate_kbps.map(|k| k * 1000 / 8),
            burst,
            catchup: self.pace_catchup.unwrap_or(DEFAULT_PACE_CATCHUP),
            shared_link: self.pace_link == Some(PaceLink::Shared),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(j: &str) -> Result<SessionSpec, String> {
        let s: SessionSpec = serde_json::from_str(j).map_err(|e| e.to_string())?;
        s.validate()?;
        Ok(s)
    }

    #[test]
    fn accepts_the_documented_example() {
        let s = parse(r#"{"name":"tv1","source":{"udp":"127.0.0.1:5004"},"priority":3,"datapath":"shared"}"#).unwrap();
        assert_eq!(s.priority, 3);
        assert_eq!(s.datapath, Some(DataPath::Shared));
    }

    #[test]
    fn source_fields_list_is_complete() {
        let e = serde_json::from_str::<SourceSpec>(r#"{"nope":1}"#).unwrap_err().to_string();
        for key in SOURCE_FIELDS {
            assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
        }
        assert_eq!(e.matches('`').count() / 2 - 1, SOURCE_FIELDS.len(), "{e}");
    }

    #[test]
    fn rejects_with_reasons() {
        let cases = [
            (r#"{"name":"a","source":{"udp":"127.0.0.1:5004"},"colour":1}"#, "unknown field `colour`"),
            (r#"{"name":"a","source":{"udp":"nowhere"}}"#, "invalid socket address"),
            (r#"{"name":"a b","source":{"demo":true}}"#, "must be 1-64"),
            (r#"{"name":"a","source":{"demo":true},"priority":9}"#, "out of range"),
            (r#"{"name":"a","source":{}}"#, "exactly one"),
            (r#"{"name":"a","source":{"demo":true},"datapath":"warp"}"#, "unknown variant `warp`"),
            (r#"{"name":"a","source":{"demo":true},"ring":1}"#, "ring 1"),
            (r#"{"name":"a","source":{"demo":true},"sinks":[{"udp":"127.0.0.1:0"}]}"#, "port 0"),
            (r#"{"name":"a","source":{"udp":"127.0.0.1:5","interface":"127.0.0.1"}}"#, "multicast"),
            (r#"{"name":".","source":{"demo":true}}"#, "cannot be addressed"),
            (r#"{"name":"..","source":{"demo":true}}"#, "cannot be addressed"),
            (r#"{"name":"a","source":{"demo":true},"sinks":[{"udp":"255.255.255.255:5000"}]}"#, "broadcast"),
        ];
        for (j, want) in cases {
            let e = parse(j).unwrap_err();
            assert!(e.contains(want), "{j}: {e}");
        }
    }
}
