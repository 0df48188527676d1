//! A path's source as the config and the API spell it (`source = { rtsp = … }` and the
//! rest), and its checks.

use super::*;

/// Where a path's packets come from: one kind, with the settings that kind has. The API and
/// the config spell it as one object whose key names the kind and whose other keys qualify
/// it (`{"udp": "239.1.1.1:5000", "interface": "10.0.0.2"}`: [`SourceFields`]); it is read
/// into this (checked: exactly one kind, and only its own qualifiers) and written back the
/// same way. Each kind is started by its module in `crate::source`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "SourceFields", into = "SourceFields")]
pub enum SourceSpec {
    /// UDP datagrams on an address (a multicast group joined on `interface`).
    Udp { addr: SocketAddr, interface: Option<Ipv4Addr> },
    /// One TCP publisher at a time, accepted on an address.
    TcpListen(SocketAddr),
    /// The stream a TCP server sends, connected to (again on loss).
    TcpConnect(SocketAddr),
    /// The built-in looped test pattern.
    Demo,
    /// A recording (or a directory of them) played at its own rate.
    File { path: std::path::PathBuf, looped: Option<bool> },
    /// Publishers (RTSP, RTMP, SRT), one at a time; with `takeover` a new one replaces the
    /// one publishing (whose connection is closed), else it is refused.
    Publish { takeover: bool },
    /// An RTSP server pulled from.
    Rtsp(RtspSource),
    /// An SRT listener called and read (its URL, checked).
    Srt(String),
}

/// An `rtsp` source's settings (see [`SourceFields`] for each).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RtspSource {
    pub url: String,
    pub transport: Option<RtspTransport>,
    pub on_demand: Option<bool>,
    pub linger_s: Option<f64>,
    pub timeout_s: Option<f64>,
    pub tls_ca: Option<String>,
    pub tls_fingerprint: Option<String>,
    pub tls_verify: Option<bool>,
}

/// A source as the API and the config spell it. Exactly one of `udp`, `tcp_listen`,
/// `tcp_connect`, `rtsp`, `file`, `demo = true`, `publish = true` must be given; the other
/// keys qualify it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceFields {
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
    /// With `publish`: a new publisher takes the path over from the one publishing, whose
    /// connection is closed (default `false`: the newcomer is refused while one publishes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover: Option<bool>,
    /// Pull from an RTSP server: `rtsp://[user:pass@]host[:port]/path`. Every media section
    /// becomes a track; RTSP clients of this session share one upstream session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtsp: Option<String>,
    /// Pull from an SRT listener: `srt://host:port?streamid=…[&passphrase=…&pbkeylen=…&latency=MS]`;
    /// its MPEG-TS (H.264/H.265, AAC) becomes the path's tracks, reconnected with backoff.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub srt: Option<String>,
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

/// The keys of [`SourceFields`] (docs/config.md documents each; a test keeps the list whole).
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
    "takeover",
    "rtsp",
    "srt",
    "rtsp_transport",
    "on_demand",
    "linger_s",
    "timeout_s",
    "tls_ca",
    "tls_fingerprint",
    "tls_verify",
];

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RtspTransport {
    #[default]
    Auto,
    Udp,
    Tcp,
}

impl RtspSource {
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

    /// The URL, parsed (a spec read from JSON or TOML was checked; one made in code, such
    /// as a cluster pull's, is checked here).
    pub fn parsed_url(&self) -> Result<fanout_proto::rtsp::client::Url, String> {
        fanout_proto::rtsp::client::Url::parse(&self.url).map_err(|e| format!("source \"rtsp\": {e}"))
    }
}

impl SourceSpec {
    /// Whether the `kernel` path can serve it: an IPv4 UDP source, or an RTSP upstream
    /// (whose packets enter the kernel path's loopback socket, `fanout_io::Inlet`).
    pub fn kernel_capable(&self) -> bool {
        match self {
            SourceSpec::Udp { addr, .. } => addr.is_ipv4(),
            SourceSpec::Rtsp(_) => true,
            _ => false,
        }
    }

    /// Seconds an output nobody wants any more stays (an `rtsp` source's `linger_s`).
    pub fn linger_s(&self) -> f64 {
        match self {
            SourceSpec::Rtsp(r) => r.linger_s.unwrap_or(10.0),
            _ => 10.0,
        }
    }

    /// Whether its stream can end, its players then told: a file played once, a publisher's.
    pub fn can_end(&self) -> bool {
        matches!(self, SourceSpec::File { looped: Some(false), .. } | SourceSpec::Publish { .. })
    }

    pub fn is_file(&self) -> bool {
        matches!(self, SourceSpec::File { .. })
    }
}

impl TryFrom<SourceFields> for SourceSpec {
    type Error = String;

    fn try_from(f: SourceFields) -> Result<Self, String> {
        let n = [
            f.udp.is_some(),
            f.tcp_listen.is_some(),
            f.tcp_connect.is_some(),
            f.demo == Some(true),
            f.rtsp.is_some(),
            f.srt.is_some(),
            f.file.is_some(),
            f.publish == Some(true),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if n != 1 {
            return Err(format!(
                "source needs exactly one of \"udp\", \"tcp_listen\", \"tcp_connect\", \"rtsp\", \"srt\", \"file\", \"demo\": true, \"publish\": true (got {n})"
            ));
        }
        if f.takeover.is_some() && f.publish != Some(true) {
            return Err("source \"takeover\" only applies to a \"publish\" source".into());
        }
        if f.looped.is_some() && f.file.is_none() {
            return Err("source \"loop\" only applies to a \"file\" source".into());
        }
        let tls_keys = f.tls_ca.is_some() || f.tls_fingerprint.is_some() || f.tls_verify.is_some();
        let rtsp_keys = f.rtsp_transport.is_some()
            || f.on_demand.is_some()
            || f.linger_s.is_some()
            || f.timeout_s.is_some()
            || tls_keys;
        if rtsp_keys && f.rtsp.is_none() {
            return Err("source \"rtsp_transport\", \"on_demand\", \"linger_s\", \"timeout_s\" and \"tls_*\" only apply to an \"rtsp\" source".into());
        }
        if f.interface.is_some() && !f.udp.is_some_and(|a| a.ip().is_multicast()) {
            return Err("source \"interface\" only applies to a multicast \"udp\" address".into());
        }
        Ok(if let Some(addr) = f.udp {
            SourceSpec::Udp { addr, interface: f.interface }
        } else if let Some(a) = f.tcp_listen {
            SourceSpec::TcpListen(a)
        } else if let Some(a) = f.tcp_connect {
            SourceSpec::TcpConnect(a)
        } else if let Some(path) = f.file {
            SourceSpec::File { path, looped: f.looped }
        } else if f.publish == Some(true) {
            SourceSpec::Publish { takeover: f.takeover == Some(true) }
        } else if let Some(url) = f.srt {
            fanout_proto::srt::parse_url(&url).map_err(|e| format!("source \"srt\": {e}"))?;
            SourceSpec::Srt(url)
        } else if let Some(url) = f.rtsp {
            let u = fanout_proto::rtsp::client::Url::parse(&url).map_err(|e| format!("source \"rtsp\": {e}"))?;
            if tls_keys && !u.tls {
                return Err(
                    "source \"tls_ca\", \"tls_fingerprint\" and \"tls_verify\" apply to an rtsps:// source".into()
                );
            }
            if f.linger_s.is_some_and(|l| !(0.0..=86_400.0).contains(&l)) {
                return Err("source \"linger_s\" must be 0 to 86400".into());
            }
            if f.timeout_s.is_some_and(|t| !(0.1..=3600.0).contains(&t)) {
                return Err("source \"timeout_s\" must be 0.1 to 3600".into());
            }
            let r = RtspSource {
                url,
                transport: f.rtsp_transport,
                on_demand: f.on_demand,
                linger_s: f.linger_s,
                timeout_s: f.timeout_s,
                tls_ca: f.tls_ca,
                tls_fingerprint: f.tls_fingerprint,
                tls_verify: f.tls_verify,
            };
            r.upstream_verify()?;
            SourceSpec::Rtsp(r)
        } else {
            SourceSpec::Demo
        })
    }
}

impl From<SourceSpec> for SourceFields {
    fn from(s: SourceSpec) -> Self {
        let mut f = SourceFields::default();
        match s {
            SourceSpec::Udp { addr, interface } => (f.udp, f.interface) = (Some(addr), interface),
            SourceSpec::TcpListen(a) => f.tcp_listen = Some(a),
            SourceSpec::TcpConnect(a) => f.tcp_connect = Some(a),
            SourceSpec::Demo => f.demo = Some(true),
            SourceSpec::File { path, looped } => (f.file, f.looped) = (Some(path), looped),
            SourceSpec::Publish { takeover } => (f.publish, f.takeover) = (Some(true), takeover.then_some(true)),
            SourceSpec::Srt(url) => f.srt = Some(url),
            SourceSpec::Rtsp(r) => {
                f.rtsp = Some(r.url);
                f.rtsp_transport = r.transport;
                f.on_demand = r.on_demand;
                f.linger_s = r.linger_s;
                f.timeout_s = r.timeout_s;
                f.tls_ca = r.tls_ca;
                f.tls_fingerprint = r.tls_fingerprint;
                f.tls_verify = r.tls_verify;
            }
        }
        f
    }
}
