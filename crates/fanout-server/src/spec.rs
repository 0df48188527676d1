//! What a user asks for, as the API and the config file spell it. Every type rejects unknown
//! fields and bad values with a message that names the field.

use fanout_io::{DataPath, FailurePolicy, PayloadMode, SourceRecv, UdpSinkMode};
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr};

/// The `fallback` that holds the last publisher's last picture (and silence) instead of
/// playing a file.
pub const FALLBACK_FREEZE: &str = "freeze";
/// The `fallback` that shows a generated slate (and silence) instead of playing a file.
pub const FALLBACK_SLATE: &str = "slate";

/// Whether a `fallback` is made by the relay (no file to read).
pub fn fallback_is_generated(path: &std::path::Path) -> bool {
    [FALLBACK_FREEZE, FALLBACK_SLATE].iter().any(|g| path == std::path::Path::new(g))
}

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
    /// one publishing (whose connection is closed), else it is refused. With a `fallback`
    /// recording (or [`FALLBACK_FREEZE`], [`FALLBACK_SLATE`]) the path is always available: it plays while no
    /// one publishes.
    Publish { takeover: bool, fallback: Option<std::path::PathBuf> },
    /// An RTSP server pulled from.
    Rtsp(RtspSource),
    /// An SRT listener called and read (its URL, checked; no `tls_*`: SRT has its own).
    Srt(PullSource),
    /// An RTMP(S) server played from.
    Rtmp(PullSource),
    /// A WHEP endpoint viewed (the relay as another server's WebRTC viewer).
    Whep(PullSource),
    /// Another server's HLS (live or Low-Latency; MPEG-TS or fMP4 segments) read.
    Hls(PullSource),
}

/// An `rtmp`, `whep`, `srt` or `hls` source: its URL (checked), whether it plays only while read, and
/// how an `rtmps://` or `https://` one checks the server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PullSource {
    pub url: String,
    /// Play only while someone reads (default `false`: always).
    pub on_demand: Option<bool>,
    pub linger_s: Option<f64>,
    pub tls_ca: Option<String>,
    pub tls_fingerprint: Option<String>,
    pub tls_verify: Option<bool>,
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
    /// With `publish`: a recording (as `file` takes) played while no one publishes, so the
    /// path is always available; a publisher replaces it at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<std::path::PathBuf>,
    /// Pull from an RTSP server: `rtsp://[user:pass@]host[:port]/path`. Every media section
    /// becomes a track; RTSP clients of this session share one upstream session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtsp: Option<String>,
    /// Pull from an SRT listener: `srt://host:port?streamid=…[&passphrase=…&pbkeylen=…&latency=MS]`;
    /// its MPEG-TS (H.264/H.265, AAC) becomes the path's tracks, reconnected with backoff.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub srt: Option<String>,
    /// Play from an RTMP(S) server: `rtmp[s]://host[:port]/app/key` (credentials in the
    /// key's query); its FLV (H.264/H.265, AAC) becomes the path's tracks, reconnected with
    /// backoff.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtmp: Option<String>,
    /// View a WHEP endpoint: `http[s]://[user:pass@]host[:port]/…/whep` (another server's
    /// WebRTC output); its H.264/VP8/VP9/AV1 video and Opus audio become the path's tracks,
    /// reconnected with backoff.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whep: Option<String>,
    /// Read another server's HLS: `http[s]://host[:port]/…/index.m3u8` (a multivariant or a
    /// media playlist; live or Low-Latency, MPEG-TS or fMP4 segments); its H.264/H.265 and
    /// AAC become the path's tracks, paced at their own rate, read again with backoff.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hls: Option<String>,
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
    "fallback",
    "rtsp",
    "srt",
    "rtmp",
    "whep",
    "hls",
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
    pub fn upstream_verify(&self) -> Result<crate::tls::Verify, fanout_proto::Invalid> {
        crate::tls::verify_of(&self.tls_ca, &self.tls_fingerprint, self.tls_verify)
            .map_err(|e| fanout_proto::Invalid(format!("source: {e}")))
    }

    /// The URL, parsed (a spec read from JSON or TOML was checked; one made in code, such
    /// as a cluster pull's, is checked here).
    pub fn parsed_url(&self) -> Result<fanout_proto::rtsp::client::Url, fanout_proto::Invalid> {
        fanout_proto::rtsp::client::Url::parse(&self.url)
            .map_err(|e| fanout_proto::Invalid(format!("source \"rtsp\": {e}")))
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
    type Error = fanout_proto::Invalid;

    fn try_from(mut f: SourceFields) -> Result<Self, fanout_proto::Invalid> {
        let n = [
            f.udp.is_some(),
            f.tcp_listen.is_some(),
            f.tcp_connect.is_some(),
            f.demo == Some(true),
            f.rtsp.is_some(),
            f.srt.is_some(),
            f.rtmp.is_some(),
            f.whep.is_some(),
            f.hls.is_some(),
            f.file.is_some(),
            f.publish == Some(true),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if n != 1 {
            return Err(format!(
                "source needs exactly one of \"udp\", \"tcp_listen\", \"tcp_connect\", \"rtsp\", \"srt\", \"rtmp\", \"whep\", \"hls\", \"file\", \"demo\": true, \"publish\": true (got {n})"
            ).into());
        }
        if (f.takeover.is_some() || f.fallback.is_some()) && f.publish != Some(true) {
            return Err("source \"takeover\" and \"fallback\" only apply to a \"publish\" source".into());
        }
        if f.looped.is_some() && f.file.is_none() {
            return Err("source \"loop\" only applies to a \"file\" source".into());
        }
        let pulled = [&f.rtsp, &f.srt, &f.rtmp, &f.whep, &f.hls];
        if pulled.iter().any(|u| u.as_ref().is_some_and(|u| u.chars().any(char::is_control))) {
            return Err("source: a URL with a control character (a newline?)".into());
        }
        let tls_keys = f.tls_ca.is_some() || f.tls_fingerprint.is_some() || f.tls_verify.is_some();
        let rtsp_keys = f.rtsp_transport.is_some() || f.timeout_s.is_some();
        let pull_keys = f.on_demand.is_some() || f.linger_s.is_some();
        let tls_pull = f.rtsp.is_some() || f.rtmp.is_some() || f.whep.is_some() || f.hls.is_some();
        if (rtsp_keys && f.rtsp.is_none()) || (pull_keys && !tls_pull && f.srt.is_none()) || (tls_keys && !tls_pull) {
            return Err("source \"rtsp_transport\" and \"timeout_s\" only apply to an \"rtsp\" source, \"tls_*\" to an \"rtsp\", \"rtmp\", \"whep\" or \"hls\" one, \"on_demand\" and \"linger_s\" to those and \"srt\"".into());
        }
        if f.linger_s.is_some_and(|l| !(0.0..=86_400.0).contains(&l)) {
            return Err("source \"linger_s\" must be 0 to 86400".into());
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
            SourceSpec::Publish { takeover: f.takeover == Some(true), fallback: f.fallback }
        } else if let Some(url) = f.srt {
            fanout_proto::srt::parse_url(&url).map_err(|e| format!("source \"srt\": {e}"))?;
            SourceSpec::Srt(PullSource { url, on_demand: f.on_demand, linger_s: f.linger_s, ..Default::default() })
        } else if let Some(url) = f.rtmp.take() {
            let u = fanout_proto::rtmp::client::RtmpUrl::parse(&url).map_err(|e| format!("source \"rtmp\": {e}"))?;
            SourceSpec::Rtmp(f.pulled(url, u.tls, "an rtmps://")?)
        } else if let Some(url) = f.whep.take() {
            let u = fanout_proto::whep::WhipUrl::parse(&url).map_err(|e| format!("source \"whep\": {e}"))?;
            SourceSpec::Whep(f.pulled(url, u.tls, "an https://")?)
        } else if let Some(url) = f.hls.take() {
            let tls = hls_url(&url).map_err(|e| format!("source \"hls\": {e}"))?;
            SourceSpec::Hls(f.pulled(url, tls, "an https://")?)
        } else if let Some(url) = f.rtsp {
            let u = fanout_proto::rtsp::client::Url::parse(&url).map_err(|e| format!("source \"rtsp\": {e}"))?;
            if tls_keys && !u.tls {
                return Err(
                    "source \"tls_ca\", \"tls_fingerprint\" and \"tls_verify\" apply to an rtsps:// source".into()
                );
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

impl SourceFields {
    /// A pulled source (`rtmp`, `whep`, `hls`) of `url`, checked already: its `tls_*`, which
    /// apply only where `tls` (the URL is `secure`, as the refusal names it).
    fn pulled(&self, url: String, tls: bool, secure: &str) -> Result<PullSource, fanout_proto::Invalid> {
        let tls_keys = self.tls_ca.is_some() || self.tls_fingerprint.is_some() || self.tls_verify.is_some();
        if tls_keys && !tls {
            return Err(
                format!("source \"tls_ca\", \"tls_fingerprint\" and \"tls_verify\" apply to {secure} source").into()
            );
        }
        crate::tls::verify_of(&self.tls_ca, &self.tls_fingerprint, self.tls_verify)
            .map_err(|e| format!("source: {e}"))?;
        Ok(PullSource {
            url,
            on_demand: self.on_demand,
            linger_s: self.linger_s,
            tls_ca: self.tls_ca.clone(),
            tls_fingerprint: self.tls_fingerprint.clone(),
            tls_verify: self.tls_verify,
        })
    }
}

/// Whether an HLS source's URL is `https://` (`Err`: not an `http[s]://host/…` URL).
pub fn hls_url(url: &str) -> Result<bool, String> {
    let (tls, rest) = match url.split_once("://") {
        Some(("http", rest)) => (false, rest),
        Some(("https", rest)) => (true, rest),
        _ => return Err(format!("{url:?} is not an http:// or https:// URL")),
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |h| h.1);
    if host.is_empty() || host.chars().any(char::is_whitespace) {
        return Err(format!("{url:?} names no host"));
    }
    Ok(tls)
}

/// An HLS URL as logs and the status show it: without credentials or query (a token).
pub fn hls_shown(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let authority = authority.rsplit_once('@').map_or(authority, |a| a.1);
    format!("{scheme}://{authority}/{path}")
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
            SourceSpec::Publish { takeover, fallback } => {
                (f.publish, f.takeover, f.fallback) = (Some(true), takeover.then_some(true), fallback);
            }
            SourceSpec::Srt(r) => (f.srt, f.on_demand, f.linger_s) = (Some(r.url), r.on_demand, r.linger_s),
            SourceSpec::Whep(r) => {
                f.whep = Some(r.url);
                (f.on_demand, f.linger_s) = (r.on_demand, r.linger_s);
                (f.tls_ca, f.tls_fingerprint, f.tls_verify) = (r.tls_ca, r.tls_fingerprint, r.tls_verify);
            }
            SourceSpec::Hls(r) => {
                f.hls = Some(r.url);
                (f.on_demand, f.linger_s) = (r.on_demand, r.linger_s);
                (f.tls_ca, f.tls_fingerprint, f.tls_verify) = (r.tls_ca, r.tls_fingerprint, r.tls_verify);
            }
            SourceSpec::Rtmp(r) => {
                f.rtmp = Some(r.url);
                (f.on_demand, f.linger_s) = (r.on_demand, r.linger_s);
                (f.tls_ca, f.tls_fingerprint, f.tls_verify) = (r.tls_ca, r.tls_fingerprint, r.tls_verify);
            }
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
    pub fn validate(&self) -> Result<(), fanout_proto::Invalid> {
        match (self.udp, self.tcp) {
            (Some(a), None) | (None, Some(a)) if a.port() == 0 => Err(format!("sink address {a} has port 0").into()),
            (Some(a), None) if a.ip().is_unspecified() => Err(format!("sink address {a} is unspecified").into()),
            // Sinks send unicast (or multicast); a broadcast would need SO_BROADCAST and
            // would reach every host of the link.
            (Some(std::net::SocketAddr::V4(a)), None) if a.ip().is_broadcast() => {
                Err(format!("sink address {a} is a broadcast address; use a unicast or multicast address").into())
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
    /// Unique name: 1–128 of `A-Z a-z 0-9 _ - .` in steps split by `/` ([`check_path_name`]);
    /// the stream URL is `/v1/sessions/{name}/stream`.
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
    /// How a paced packet waits for its time: `clock` (default: the relay holds it and wakes
    /// when it may leave) or `txtime` (UDP sinks of the group's socket: the relay hands the
    /// kernel up to a quarter of a second ahead, each datagram stamped with its departure time,
    /// `SO_TXTIME`; the `fq` qdisc on the egress holds it). Fewer wake-ups of the relay; needs
    /// fq (without it the stamps are ignored and the packets leave at once) and the `shared`
    /// or `kernel` data path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_with: Option<PaceWith>,
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
    /// Record the path to fragmented MP4 files (`record = {}` takes every default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordSpec>,
    /// Servers the path is pushed to while it has a stream (`rtmp://`, `rtmps://`): each
    /// a URL, or a table with its `url` and how an `rtmps://` one checks the server
    /// (`tls_ca`, `tls_fingerprint`, `tls_verify`, as an `rtsps://` source's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward: Vec<ForwardSpec>,
    /// What its HLS segments are: `low_latency` (fMP4 in parts, default), `fmp4` (whole
    /// segments) or `mpegts` (TS segments, for set-top boxes and players without fMP4).
    #[serde(default, skip_serializing_if = "HlsVariant::is_default")]
    pub hls_variant: HlsVariant,
    /// Commands (`sh -c`) run as the path's life goes (config files only, never the API):
    /// while it has its stream, once when the stream goes, while anyone reads it, and once
    /// per recording file completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_on_ready: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_on_not_ready: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_on_read: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_on_record_segment_complete: Option<String>,
    /// Readers at most, all protocols together: the next is refused with its protocol's
    /// answer (RTSP 453, HTTP 503, RTMP `NetStream.Play.Failed`, SRT rejection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_readers: Option<usize>,
    /// Commands run once per reader as it comes and goes: a program and its arguments, no
    /// shell (config files only). Their environment names the reader (`FANOUT_READER_*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_read: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_unread: Option<Vec<String>>,
    /// Commands run once per publisher as it starts and stops publishing (program and
    /// arguments, no shell; `FANOUT_PUBLISHER_*` in their environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_publish: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_unpublish: Option<Vec<String>>,
    /// Commands run as a `forward` target starts pushing and as that push ends (program and
    /// arguments, no shell; `FANOUT_FORWARD_*` in their environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_forward_start: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_forward_stop: Option<Vec<String>>,
}

/// A server a path is pushed to (`forward`): a URL alone, or a table.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(from = "ForwardFields")]
pub struct ForwardSpec {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_verify: Option<bool>,
}

/// How `forward` entries may be written.
#[derive(Deserialize)]
#[serde(untagged, deny_unknown_fields)]
enum ForwardFields {
    Url(String),
    Table { url: String, tls_ca: Option<String>, tls_fingerprint: Option<String>, tls_verify: Option<bool> },
}

impl From<ForwardFields> for ForwardSpec {
    fn from(f: ForwardFields) -> Self {
        match f {
            ForwardFields::Url(url) => ForwardSpec { url, ..Default::default() },
            ForwardFields::Table { url, tls_ca, tls_fingerprint, tls_verify } => {
                ForwardSpec { url, tls_ca, tls_fingerprint, tls_verify }
            }
        }
    }
}

/// Where a forward goes, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ForwardTo {
    Rtmp(fanout_proto::rtmp::client::RtmpUrl, crate::tls::Verify),
    Rtsp(fanout_proto::rtsp::client::Url, crate::tls::Verify),
    Srt(fanout_proto::srt::SrtUrl),
    Whip(fanout_proto::whep::WhipUrl, crate::tls::Verify),
}

impl ForwardSpec {
    /// The target, checked: an RTMP(S), RTSP(S) or WHIP (`http[s]://`) URL with at most one
    /// way to check its certificate, or an SRT URL (which encrypts with its own passphrase,
    /// not TLS).
    pub fn target(&self) -> Result<ForwardTo, fanout_proto::Invalid> {
        if self.url.chars().any(char::is_control) {
            return Err("forward: a URL with a control character (a newline?)".into());
        }
        let scheme = self.url.split_once("://").map_or("", |(s, _)| s).to_ascii_lowercase();
        match scheme.as_str() {
            "rtmp" | "rtmps" => {
                let url = fanout_proto::rtmp::client::RtmpUrl::parse(&self.url).map_err(|e| format!("forward: {e}"))?;
                let verify = crate::tls::verify_of(&self.tls_ca, &self.tls_fingerprint, self.tls_verify)
                    .map_err(|e| format!("forward {:?}: {e}", url.shown()))?;
                Ok(ForwardTo::Rtmp(url, verify))
            }
            "rtsp" | "rtsps" => {
                let url = fanout_proto::rtsp::client::Url::parse(&self.url).map_err(|e| format!("forward: {e}"))?;
                let verify = crate::tls::verify_of(&self.tls_ca, &self.tls_fingerprint, self.tls_verify)
                    .map_err(|e| format!("forward {:?}: {e}", url.request_url()))?;
                Ok(ForwardTo::Rtsp(url, verify))
            }
            "http" | "https" => {
                let url = fanout_proto::whep::WhipUrl::parse(&self.url).map_err(|e| format!("forward: {e}"))?;
                let verify = crate::tls::verify_of(&self.tls_ca, &self.tls_fingerprint, self.tls_verify)
                    .map_err(|e| format!("forward {:?}: {e}", url.shown()))?;
                Ok(ForwardTo::Whip(url, verify))
            }
            "srt" => {
                let url = fanout_proto::srt::parse_url(&self.url).map_err(|e| format!("forward: {e}"))?;
                if self.tls_ca.is_some() || self.tls_fingerprint.is_some() || self.tls_verify.is_some() {
                    let e = format!(
                        "forward {:?}: tls_* are for rtmps://, rtsps:// and https:// (SRT encrypts with passphrase= in its URL)",
                        url.shown()
                    );
                    return Err(e.into());
                }
                if url.streamid.as_deref().is_some_and(|id| id.starts_with("read:") || id.contains("m=request")) {
                    let e =
                        format!("forward {:?}: its streamid reads; a forward publishes (publish:NAME)", url.shown());
                    return Err(e.into());
                }
                Ok(ForwardTo::Srt(url))
            }
            _ => Err(format!(
                "forward {:?}: targets are rtmp://, rtmps://, rtsp://, rtsps://, srt:// or a WHIP endpoint (http://, https://), not {scheme:?}",
                self.url
            )
            .into()),
        }
    }
}

/// A path's HLS variant (MediaMTX's `hlsVariant`; its `lowLatency` spelling is taken too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HlsVariant {
    #[default]
    #[serde(rename = "low_latency", alias = "lowLatency")]
    LowLatency,
    Fmp4,
    Mpegts,
}

impl HlsVariant {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    pub fn segments(self) -> fanout_proto::container::hls::Variant {
        use fanout_proto::container::hls::Variant;
        match self {
            HlsVariant::LowLatency => Variant::LowLatency,
            HlsVariant::Fmp4 => Variant::Fmp4,
            HlsVariant::Mpegts => Variant::MpegTs,
        }
    }
}

/// Whether a session's sinks are paced each alone or, as behind one link, together too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PaceLink {
    Own,
    Shared,
}

/// What holds a paced packet until it may leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PaceWith {
    Clock,
    Txtime,
}

/// Whether a session paces its sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pacing {
    #[default]
    On,
    Off,
}

/// A hook given as a list must name its program first.
pub fn check_command(key: &str, cmd: &Option<Vec<String>>) -> Result<(), fanout_proto::Invalid> {
    match cmd {
        Some(c) if c.first().is_none_or(|p| p.is_empty()) => {
            Err(format!(r#"{key}: a program and its arguments, as a list: {key} = ["/usr/bin/logger", "a client"]"#)
                .into())
        }
        _ => Ok(()),
    }
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
            pace_with: None,
            reserve_kbps: None,
            sinks: Vec::new(),
            record: None,
            forward: Vec::new(),
            hls_variant: HlsVariant::default(),
            run_on_ready: None,
            run_on_not_ready: None,
            run_on_read: None,
            run_on_record_segment_complete: None,
            max_readers: None,
            on_read: None,
            on_unread: None,
            on_publish: None,
            on_unpublish: None,
            on_forward_start: None,
            on_forward_stop: None,
        }
    }

    /// What its readers' registry applies.
    pub fn reader_settings(&self) -> crate::readers::Settings {
        crate::readers::Settings {
            max_readers: self.max_readers,
            on_read: self.on_read.clone(),
            on_unread: self.on_unread.clone(),
        }
    }

    /// Whether it runs any command (which only a config file may ask for).
    pub fn has_hooks(&self) -> bool {
        self.run_on_ready.is_some()
            || self.run_on_not_ready.is_some()
            || self.run_on_read.is_some()
            || self.run_on_record_segment_complete.is_some()
            || self.on_read.is_some()
            || self.on_unread.is_some()
            || self.on_publish.is_some()
            || self.on_unpublish.is_some()
            || self.on_forward_start.is_some()
            || self.on_forward_stop.is_some()
    }

    pub fn validate(&self) -> Result<(), fanout_proto::Invalid> {
        check_path_name(&self.name)?;
        fanout_core::Priority::new(self.priority).map_err(|e| e.to_string())?;
        if let Some(r) = &self.record {
            r.validate()?;
        }
        for f in &self.forward {
            f.target()?;
        }
        if self.datapath == Some(DataPath::Kernel) && !self.source.kernel_capable() {
            return Err("datapath \"kernel\" needs an IPv4 udp or an rtsp source".into());
        }
        if self.kernel_spread && self.datapath.is_some_and(|d| d != DataPath::Kernel) {
            return Err("kernel_spread spreads the kernel data path: it needs datapath \"kernel\"".into());
        }
        let commands = [
            ("on_read", &self.on_read),
            ("on_unread", &self.on_unread),
            ("on_publish", &self.on_publish),
            ("on_unpublish", &self.on_unpublish),
            ("on_forward_start", &self.on_forward_start),
            ("on_forward_stop", &self.on_forward_stop),
        ];
        for (key, cmd) in commands {
            check_command(key, cmd)?;
        }
        if let Some(ms) = self.stream_flush_ms.filter(|&ms| ms > MAX_STREAM_FLUSH_MS) {
            return Err(format!("stream_flush_ms {ms} is out of range 0..={MAX_STREAM_FLUSH_MS}").into());
        }
        if let Some(n) = self.sinks_per_group.filter(|n| !(1..=MAX_SINKS_PER_GROUP).contains(n)) {
            return Err(format!("sinks_per_group {n} is out of range 1..={}", MAX_SINKS_PER_GROUP).into());
        }
        if let Some(r) = self.ring {
            if !(2..=MAX_RING).contains(&r) {
                return Err(format!("ring {r} is out of range 2..={MAX_RING}").into());
            }
        }
        if let Some(m) = self.max_datagram {
            if !(188..=MAX_DATAGRAM).contains(&m) {
                return Err(format!("max_datagram {m} is out of range 188..={MAX_DATAGRAM}").into());
            }
        }
        if let Some(r) = self.rate_kbps.filter(|r| !RATE_KBPS.contains(r)) {
            return Err(format!(
                "rate_kbps {r} is out of range {}..={} (a stream's rate, to pace by)",
                RATE_KBPS.start(),
                RATE_KBPS.end()
            )
            .into());
        }
        if let Some(r) = self.reserve_kbps.filter(|r| !RATE_KBPS.contains(r)) {
            return Err(format!(
                "reserve_kbps {r} is out of range {}..={} (egress reserved for the session)",
                RATE_KBPS.start(),
                RATE_KBPS.end()
            )
            .into());
        }
        if self.pace_with == Some(PaceWith::Txtime) {
            if self.pacing == Pacing::Off {
                return Err("pace_with \"txtime\" stamps paced packets: it needs pacing \"on\"".into());
            }
            if let Some(d) = self.datapath.filter(|d| !matches!(d, DataPath::Shared | DataPath::Kernel)) {
                let d = serde_json::to_value(d).unwrap_or_default();
                return Err(format!(
                    "pace_with \"txtime\" needs datapath \"shared\" or \"kernel\" (whose UDP sinks send from the group's socket), not {d}"
                ).into());
            }
            if self.udp_sinks == UdpSinkMode::Connected {
                return Err(
                    "pace_with \"txtime\" stamps the group socket's datagrams: it needs udp_sinks \"batched\"".into()
                );
            }
        }
        if self.pace_burst_kb == Some(0) {
            return Err("pace_burst_kb 0 cannot hold one packet".into());
        }
        if let Some(c) = self.pace_catchup.filter(|c| !PACE_CATCHUP.contains(c)) {
            return Err(
                format!("pace_catchup {c} is out of range {}..={}", PACE_CATCHUP.start(), PACE_CATCHUP.end()).into()
            );
        }
        for s in &self.sinks {
            s.validate()?;
        }
        Ok(())
    }

    /// How the session paces, for a largest datagram of `max_datagram` bytes: a burst
    /// allowance that cannot hold one is refused.
    pub fn pace_config(&self, max_datagram: usize) -> Result<Option<fanout_io::PaceConfig>, fanout_proto::Invalid> {
        if self.pacing == Pacing::Off {
            return Ok(None);
        }
        let burst = self.pace_burst_kb.map(|kb| kb * 1024);
        if let Some(b) = burst.filter(|&b| b < max_datagram as u64) {
            return Err(format!(
                "pace_burst_kb {} ({b} bytes) is smaller than one packet (max_datagram {max_datagram})",
                b / 1024
            )
            .into());
        }
        Ok(Some(fanout_io::PaceConfig {
            rate: self.rate_kbps.map(|k| k * 1000 / 8),
            burst,
            catchup: self.pace_catchup.unwrap_or(DEFAULT_PACE_CATCHUP),
            shared_link: self.pace_link == Some(PaceLink::Shared),
            txtime: self.pace_with == Some(PaceWith::Txtime),
        }))
    }
}

#[cfg(test)]
mod tests;

/// A path's recording settings (`record = { … }` of a session).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordSpec {
    /// A file is closed at the first keyframe after this many seconds.
    #[serde(default = "RecordSpec::default_segment")]
    pub segment_s: u32,
    /// Fragments are written at the first keyframe after this many milliseconds: what a
    /// crash can lose, and the steps a playback range starts at.
    #[serde(default = "RecordSpec::default_fragment")]
    pub fragment_ms: u32,
    /// Files last written longer ago than this are deleted (0: kept for ever).
    #[serde(default = "RecordSpec::default_keep")]
    pub keep_s: u64,
    /// The oldest files are deleted while the path's recordings take more MiB (0: no cap).
    #[serde(default)]
    pub keep_mb: u64,
    /// `fmp4` (the default) or `mpegts`.
    #[serde(default, with = "record_format")]
    pub format: fanout_proto::container::record::Format,
}

/// A recording's format as the config names it.
mod record_format {
    use fanout_proto::container::record::Format;

    pub fn serialize<S: serde::Serializer>(f: &Format, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match f {
            Format::Fmp4 => "fmp4",
            Format::MpegTs => "mpegts",
        })
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Format, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(d)?;
        match name.as_str() {
            "fmp4" => Ok(Format::Fmp4),
            "mpegts" => Ok(Format::MpegTs),
            other => Err(serde::de::Error::custom(format!("record.format {other:?}: \"fmp4\" or \"mpegts\""))),
        }
    }
}

impl Default for RecordSpec {
    fn default() -> Self {
        Self {
            segment_s: Self::default_segment(),
            fragment_ms: Self::default_fragment(),
            keep_s: Self::default_keep(),
            keep_mb: 0,
            format: fanout_proto::container::record::Format::Fmp4,
        }
    }
}

impl RecordSpec {
    fn default_segment() -> u32 {
        600
    }
    fn default_fragment() -> u32 {
        1000
    }
    fn default_keep() -> u64 {
        86_400
    }

    pub fn validate(&self) -> Result<(), fanout_proto::Invalid> {
        if !(1..=86_400).contains(&self.segment_s) {
            return Err(format!("record.segment_s {} is out of range 1..=86400", self.segment_s).into());
        }
        if !(100..=60_000).contains(&self.fragment_ms) {
            return Err(format!("record.fragment_ms {} is out of range 100..=60000", self.fragment_ms).into());
        }
        Ok(())
    }
}

/// The one rule for a path's name, on every face, in patterns, recordings and the API
/// ([`fanout_proto::name::check`]: `live/cam1`, not only dots).
pub fn check_path_name(name: &str) -> Result<(), fanout_proto::Invalid> {
    fanout_proto::name::check(name)
}
