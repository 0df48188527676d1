//! The server's typed configuration: `fanout serve` runs without any; `--config fanout.toml`
//! declares the API address, token, engine sizes and static sessions.

mod parse;
mod sections;

pub use sections::*;

use crate::spec::SessionSpec;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;
use toml::de::DeTable;

/// What a configuration leaves open that is allowed but worth a line in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning(pub String);

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every problem of a config file, each a line (`line N: what`), in order of line.
#[derive(Debug, Clone, PartialEq)]
pub struct Problems(pub Vec<String>);

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

impl std::error::Error for Problems {}

impl std::ops::Deref for Problems {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.0
    }
}

/// The configuration as it was loaded (from the file and the flags over it) and how to load
/// it again, for a reload (`crate::reload`).
pub struct Loader {
    pub loaded: Config,
    /// Reads the file again and applies the same flags; every problem, one per line.
    pub load: Box<dyn Fn() -> anyhow::Result<Config> + Send + Sync>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the control API and HTTP streams.
    pub api: SocketAddr,
    /// Address for RTSP clients (`rtsp://HOST:PORT/{session}`); none = no RTSP.
    pub rtsp: Option<SocketAddr>,
    /// Address for RTMP publishers (`rtmp://HOST:PORT/{path}`); `"off"` = no RTMP.
    #[serde(deserialize_with = "addr_or_off")]
    pub rtmp: Option<SocketAddr>,
    /// UDP address for SRT callers (`srt://HOST:PORT?streamid=publish:NAME`); `"off"` = no SRT.
    #[serde(deserialize_with = "addr_or_off")]
    pub srt: Option<SocketAddr>,
    /// SRT's AES passphrase (10 to 79 characters): callers must give the same one; none =
    /// unencrypted SRT.
    pub srt_passphrase: Option<String>,
    /// SRT's AES key length in bytes with a passphrase: 16, 24 or 32.
    pub srt_pbkeylen: u32,
    /// SRT's latency (ms): how long a receiver waits for a retransmission before it gives up.
    pub srt_latency_ms: u32,
    /// UDP address for all WebRTC media (ICE-lite, one port for every viewer); `"off"` = no
    /// WebRTC. Its IP is the candidate offered to viewers unless it is unspecified.
    #[serde(deserialize_with = "addr_or_off")]
    pub webrtc: Option<SocketAddr>,
    /// More addresses to offer WebRTC viewers as candidates, on the `webrtc` port (a public
    /// or LAN address in front of the relay).
    pub webrtc_additional_hosts: Vec<std::net::IpAddr>,
    /// STUN/TURN servers handed to WebRTC clients (`Link: <…>; rel="ice-server"` on the WHEP
    /// and WHIP answers, RFC 9725): for clients behind NAT. The relay itself, ICE-lite, uses none.
    #[serde(rename = "webrtc_ice_server")]
    pub webrtc_ice_servers: Vec<IceServer>,
    /// ICE-TCP (passive) on the `webrtc` address and port, for viewers whose networks block UDP.
    pub webrtc_tcp: bool,
    /// RTSP clients must authenticate (Basic or Digest) as one of these; none = open.
    /// Deprecated: each is a `[[user]]` that may read and publish every path.
    #[serde(rename = "rtsp_user")]
    pub rtsp_users: Vec<RtspUser>,
    /// Users with passwords, addresses and permissions per action and path, on every face.
    #[serde(rename = "user")]
    pub users: Vec<fanout_proto::users::User>,
    /// RTP over UDP multicast for RTSP players that ask for it: one stream per track to a
    /// group of this range, whatever the number of players (none: refused, 461).
    pub rtsp_multicast: Option<RtspMulticast>,
    /// RTSP connections open at once; more are answered 503 and closed.
    pub rtsp_max_connections: usize,
    /// Seconds an RTSP connection may stay silent (unless it carries interleaved RTP).
    pub rtsp_idle_s: f64,
    /// Seconds from a request head's first byte to its end (RTSP and the API's HTTP): a
    /// trickle of bytes does not hold a connection open.
    pub request_timeout_s: f64,
    /// API/HTTP connections open at once.
    pub api_max_connections: usize,
    /// Connections one client address may hold at once on each listener (RTSP with RTSPS,
    /// and the API/HTTP port), so that one address cannot take every slot; 0 = no cap.
    /// Loopback is not exempt: a load tool on the relay's host sets 0.
    pub max_connections_per_ip: usize,
    /// Failed logins (wrong credentials on any face, a wrong SRT passphrase) one address may
    /// make within a minute before it is refused everything for a minute; 0 = never refused.
    pub max_failed_logins: u32,
    /// Run when a client connects to RTSP(S), RTMP(S), SRT or WebRTC (a WHEP or WHIP peer):
    /// a program and its arguments, no shell, with `FANOUT_CONN_PROTOCOL`, `_ID` and `_ADDR`.
    pub on_connect: Option<Vec<String>>,
    /// Run when that connection ends, with the same variables and `FANOUT_CONN_DURATION_S`.
    pub on_disconnect: Option<Vec<String>>,
    /// RTSP clients must authenticate with the API token (user `token`).
    pub rtsp_require_token: bool,
    /// Serve the API or RTSP on a non-loopback address without authentication.
    pub allow_unauthenticated: bool,
    /// Bearer token required on every API call and stream (none = open; the default API
    /// address is loopback-only).
    pub token: Option<String>,
    /// Worker threads of the engine; 0 = one per core.
    pub workers: usize,
    /// Scheduling of the workers and the reactor: "normal", "nice:N" (-20 to 19),
    /// "realtime:N" (SCHED_RR, 1 to 99) or "slice:US" (a time slice of US µs, 100 to
    /// 100000), for hosts where other work may crowd the relay out.
    pub worker_priority: String,
    /// While the classes served wait longer than this for a worker, the lowest class still
    /// served is shed (its sources drop what they read); 0 = never shed.
    pub shed_after_ms: u64,
    /// The egress link all sessions share, in kbit/s (0: not limited): the relay sends no
    /// faster, giving each session its `reserve_kbps` first and what is left to the higher
    /// classes first (Yau & Lam's KT_RC). `shared`, `copy` and `uring` sessions only.
    pub egress_kbps: u64,
    /// Default ring capacity in packets per session.
    pub ring: usize,
    /// Default largest datagram in bytes.
    pub max_datagram: usize,
    /// Sinks per sink-group task: a session's groups are spread over the workers.
    pub sinks_per_group: usize,
    /// TCP/HTTP sinks are written at most once per this many milliseconds (sessions may
    /// override it); fewer, fuller writes for a bounded delay. 0 = at every packet.
    pub stream_flush_ms: u64,
    /// Sinks the `kernel` data path holds, all sessions together (its eBPF array, 100 bytes
    /// each); a sink past it is served from user space, saying why.
    pub kernel_sinks: usize,
    /// Data path of sessions that do not name one. With `kernel`, sessions it cannot serve
    /// (not an IPv4 UDP source, or eBPF unavailable here) fall back to `shared`, logged.
    pub datapath: fanout_io::DataPath,
    /// Create the `demo` session (the built-in test pattern) at start.
    pub demo: bool,
    /// Largest API request body in bytes.
    pub max_body: usize,
    /// Seconds a publisher's session waits for a publisher to come back before it tells its
    /// players the stream ended (RTCP BYE and close, the end of HTTP streams).
    pub publisher_grace_s: f64,
    /// After a binary upgrade, how long the old process serves the connections it has
    /// before it closes them and exits (it exits sooner once they all ended).
    pub upgrade_drain_s: f64,
    /// Directories (or files) a `file` source may be read from, after `..` and links are
    /// resolved; the files the config's own `[[session]]`s name are allowed too. None by
    /// default: an API client cannot make the relay open a file of its choosing.
    pub file_roots: Vec<std::path::PathBuf>,
    /// Where the sessions made through the API (and the sinks added to them) are kept, so
    /// that a restart brings them back; `""` keeps none. Default: `$STATE_DIRECTORY`
    /// (systemd), else `$XDG_STATE_HOME/fanout`, else `~/.local/state/fanout`, with
    /// `sessions.json` in it.
    pub state_file: Option<std::path::PathBuf>,
    /// Reload when the config file's contents change (as SIGHUP does).
    pub watch_config: bool,
    /// Where recordings go (sessions with `record`): `%path` and the UTC `%Y %m %d %H %M %S
    /// %f` of a file's start, all of them, in directories and a file name; `.mp4` is added.
    pub record_path: String,
    /// Static sessions, created at start.
    #[serde(rename = "session")]
    pub sessions: Vec<SessionSpec>,
    /// TLS: HTTPS for the API and HTTP streams, and RTSPS; none = everything plain.
    pub tls: Option<TlsConfig>,
    /// This relay as a node of a tree of relays (see docs/cluster.md); none = alone.
    pub cluster: Option<ClusterConfig>,
    /// External authentication (an HTTP service or JWTs), asked where the local token and
    /// users do not match; none = the local ones alone.
    pub auth: Option<AuthConfig>,
    /// Paths made when a name no session has is asked for, by the first pattern it matches.
    #[serde(rename = "pattern")]
    pub patterns: Vec<PatternSpec>,
}

/// RTMP's port.
pub const RTMP_PORT: u16 = 1935;
/// The RTMPS port when `[tls]` names none (MediaMTX's).
pub const RTMPS_PORT: u16 = 1936;
/// SRT's port (UDP), MediaMTX's.
pub const SRT_PORT: u16 = 8890;

/// The WebRTC media port when the config names none (MediaMTX's).
pub const WEBRTC_PORT: u16 = 8189;

/// The RTSPS port when `[tls]` names none (MediaMTX's).
pub const RTSPS_PORT: u16 = 8322;

/// The keys of [`Config`] as the file spells them; a test checks the list against serde's.
#[cfg(test)]
pub const CONFIG_FIELDS: &[&str] = &[
    "api",
    "rtsp",
    "rtmp",
    "srt",
    "srt_passphrase",
    "srt_pbkeylen",
    "srt_latency_ms",
    "webrtc",
    "webrtc_additional_hosts",
    "webrtc_ice_server",
    "webrtc_tcp",
    "rtsp_user",
    "user",
    "rtsp_multicast",
    "rtsp_max_connections",
    "rtsp_idle_s",
    "request_timeout_s",
    "api_max_connections",
    "max_connections_per_ip",
    "max_failed_logins",
    "on_connect",
    "on_disconnect",
    "rtsp_require_token",
    "allow_unauthenticated",
    "token",
    "workers",
    "worker_priority",
    "shed_after_ms",
    "egress_kbps",
    "ring",
    "max_datagram",
    "sinks_per_group",
    "kernel_sinks",
    "stream_flush_ms",
    "datapath",
    "demo",
    "max_body",
    "publisher_grace_s",
    "upgrade_drain_s",
    "file_roots",
    "record_path",
    "watch_config",
    "state_file",
    "session",
    "tls",
    "cluster",
    "auth",
    "pattern",
];

/// The largest egress a relay may be told it has: 400 Gbit/s.
pub const MAX_EGRESS_KBPS: u64 = 400_000_000;

/// See `docs/BENCHMARKS.md` (stream flush): the interval that halves the writes of
/// 256 kbit/s streams.
pub const DEFAULT_STREAM_FLUSH_MS: u64 = 100;

impl Default for Config {
    fn default() -> Self {
        Self {
            api: ([127, 0, 0, 1], 7070).into(),
            rtsp: Some(([127, 0, 0, 1], 8554).into()),
            rtmp: Some(([127, 0, 0, 1], RTMP_PORT).into()),
            srt: Some(([127, 0, 0, 1], SRT_PORT).into()),
            srt_passphrase: None,
            srt_pbkeylen: 16,
            srt_latency_ms: 120,
            webrtc: Some(([127, 0, 0, 1], WEBRTC_PORT).into()),
            webrtc_additional_hosts: Vec::new(),
            webrtc_ice_servers: Vec::new(),
            webrtc_tcp: false,
            rtsp_users: Vec::new(),
            users: Vec::new(),
            rtsp_multicast: None,
            rtsp_max_connections: default_max_connections(),
            rtsp_idle_s: 60.0,
            request_timeout_s: 10.0,
            api_max_connections: default_max_connections(),
            max_connections_per_ip: 64,
            max_failed_logins: fanout_core::admit::DEFAULT_FAILED_LOGINS,
            on_connect: None,
            on_disconnect: None,
            rtsp_require_token: false,
            allow_unauthenticated: false,
            token: None,
            workers: 0,
            worker_priority: "normal".into(),
            shed_after_ms: DEFAULT_SHED_AFTER_MS,
            egress_kbps: 0,
            ring: 1024,
            max_datagram: 2048,
            // Two groups for 1000 sinks: few system calls per packet, both workers busy.
            sinks_per_group: 512,
            kernel_sinks: fanout_io::kernel::DEFAULT_MAX_SINKS,
            datapath: fanout_io::DataPath::Shared,
            stream_flush_ms: DEFAULT_STREAM_FLUSH_MS,
            demo: true,
            max_body: 1024 * 1024,
            publisher_grace_s: 5.0,
            upgrade_drain_s: 600.0,
            file_roots: Vec::new(),
            record_path: "recordings/%path/%Y-%m-%d_%H-%M-%S-%f".into(),
            watch_config: false,
            state_file: default_state_file(),
            sessions: Vec::new(),
            tls: None,
            cluster: None,
            auth: None,
            patterns: Vec::new(),
        }
    }
}

/// `rtsp_multicast = { ips = "239.255.1.0/24", rtp_port = 8002, rtcp_port = 8003, ttl = 1 }`
/// (MediaMTX's `multicastIPRange`, `multicastRTPPort`, `multicastRTCPPort`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RtspMulticast {
    /// The groups, as a CIDR range of IPv4 multicast addresses: one per (path, track).
    pub ips: String,
    #[serde(default = "default_multicast_rtp")]
    pub rtp_port: u16,
    #[serde(default = "default_multicast_rtcp")]
    pub rtcp_port: u16,
    /// Routers the packets may cross (1: the local network).
    #[serde(default = "default_multicast_ttl")]
    pub ttl: u8,
}

fn default_multicast_rtp() -> u16 {
    8002
}
fn default_multicast_rtcp() -> u16 {
    8003
}
fn default_multicast_ttl() -> u8 {
    1
}

impl RtspMulticast {
    /// The RTSP server's multicast settings, or why these are not.
    pub fn groups(&self) -> Result<fanout_proto::rtsp::server::Multicast, String> {
        let (ip, prefix) = self.ips.split_once('/').unwrap_or((&self.ips, "32"));
        let first: std::net::Ipv4Addr = ip
            .trim()
            .parse()
            .map_err(|_| format!("rtsp_multicast ips {:?}: not an IPv4 range (239.255.1.0/24)", self.ips))?;
        let prefix: u32 = prefix
            .trim()
            .parse()
            .ok()
            .filter(|p| (4..=32).contains(p))
            .ok_or_else(|| format!("rtsp_multicast ips {:?}: the prefix length must be 4 to 32", self.ips))?;
        let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
        let first = std::net::Ipv4Addr::from(u32::from(first) & mask);
        if !first.is_multicast() {
            return Err(format!("rtsp_multicast ips {:?}: not multicast addresses (224.0.0.0/4)", self.ips));
        }
        if self.rtp_port == 0 || self.rtcp_port == 0 || self.rtp_port == self.rtcp_port {
            return Err(format!("rtsp_multicast ports {} and {}: two ports, neither 0", self.rtp_port, self.rtcp_port));
        }
        let count = (!mask).saturating_add(1);
        Ok(fanout_proto::rtsp::server::Multicast {
            first,
            count,
            rtp: self.rtp_port,
            rtcp: self.rtcp_port,
            ttl: self.ttl.max(1),
        })
    }
}

/// A STUN or TURN server for WebRTC clients.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IceServer {
    /// `stun:host:port`, `turn:host:port?transport=udp`, `turns:…`.
    pub url: String,
    /// TURN's long-term credentials.
    pub username: Option<String>,
    pub credential: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RtspUser {
    pub name: String,
    pub password: String,
}

/// Where the state is kept when the config does not say: systemd's `StateDirectory`, else
/// `$XDG_STATE_HOME/fanout`, else `~/.local/state/fanout`; `sessions.json` in it.
fn default_state_file() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = env("STATE_DIRECTORY")
        .or_else(|| env("XDG_STATE_HOME").map(|d| d.join("fanout")))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/fanout")))?;
    Some(dir.join("sessions.json"))
}

/// See `docs/BENCHMARKS.md` (overload): waits of 20–50 ms are a crowded host's scheduling,
/// not overload, and shedding at them cost a class that would have been served whole.
pub const DEFAULT_SHED_AFTER_MS: u64 = 100;
pub const MAX_SHED_AFTER_MS: u64 = 10_000;

/// The limits of the server-wide numbers (also in docs/config.md).
pub const MAX_WORKERS: usize = 256;
pub const KERNEL_SINKS: std::ops::RangeInclusive<usize> = 256..=(1 << 20);
pub const MIN_BODY: usize = 1024;

/// The default cap on RTSP and on API/HTTP connections: what the open-file limit (raised
/// to its hard limit, as the engine does at start) holds at a few descriptors a client
/// (an RTSP client over UDP has its socket and an RTP/RTCP pair a track), at least 1024
/// and at most 65,536. One core serves ten thousand players and more: 1024 was a tenth.
pub fn default_max_connections() -> usize {
    let files = fanout_io::sys::raise_nofile_limit(1 << 20) as usize;
    (files / 8).clamp(1024, 65_536)
}

impl Config {
    /// How the engine runs: its workers, their priority, its shedding.
    pub fn engine_options(&self) -> anyhow::Result<fanout_io::EngineOptions> {
        Ok(fanout_io::EngineOptions {
            workers: self.workers,
            shed_after: (self.shed_after_ms > 0).then(|| std::time::Duration::from_millis(self.shed_after_ms)),
            priority: self.worker_priority.parse().map_err(|e| anyhow::anyhow!("worker_priority {e}"))?,
            egress_rate: (self.egress_kbps > 0).then(|| self.egress_kbps * 1000 / 8),
        })
    }

    /// Who can reach what without credentials. `Err`: the API or RTSP listens beyond
    /// loopback with nothing to authenticate and `allow_unauthenticated` is not set. `Ok`:
    /// the warnings to log at start.
    pub fn exposure(&self) -> Result<Vec<Warning>, fanout_proto::Invalid> {
        let mut open = Vec::new();
        // ([auth] decides for every face.)
        let external = self.auth.is_some();
        let api_users =
            self.users.iter().any(|u| fanout_proto::auth::permits(&u.permissions, fanout_proto::auth::Action::Api, ""));
        if !self.api.ip().is_loopback() && self.token.is_none() && !external && !api_users {
            open.push(format!("the API on {} has no token", self.api));
        }
        let rtsp_auth = !self.rtsp_users.is_empty() || !self.users.is_empty() || self.rtsp_require_token || external;
        for r in [self.rtsp_plain(), self.rtsps()].into_iter().flatten() {
            if !r.ip().is_loopback() && !rtsp_auth {
                open.push(format!("RTSP on {r} has no rtsp_user and no rtsp_require_token"));
            }
        }
        // RTMP publishers authenticate as RTSP's users.
        if let Some(r) = self.rtmp.filter(|r| !r.ip().is_loopback() && !rtsp_auth) {
            open.push(format!("RTMP on {r} has no rtsp_user and no rtsp_require_token"));
        }
        if let Some(r) = self.rtmps().filter(|r| !r.ip().is_loopback() && !rtsp_auth) {
            open.push(format!("RTMPS on {r} has no rtsp_user and no rtsp_require_token"));
        }
        if let Some(r) = self.srt.filter(|r| !r.ip().is_loopback() && !rtsp_auth) {
            open.push(format!("SRT on {r} has no rtsp_user and no rtsp_require_token"));
        }
        if !open.is_empty() && !self.allow_unauthenticated {
            return Err(fanout_proto::Invalid(format!(
                "refusing to serve anyone who can reach it: {}; set a token / rtsp_user (docs/config.md), \
                 bind to 127.0.0.1, or set allow_unauthenticated = true (--allow-unauthenticated)",
                open.join("; ")
            )));
        }
        let mut warnings: Vec<Warning> =
            open.into_iter().map(|o| Warning(format!("UNAUTHENTICATED: {o} (allow_unauthenticated)"))).collect();
        if !self.rtsp_users.is_empty() {
            warnings.push(Warning(
                "rtsp_user is deprecated: each one reads and publishes every path; write [[user]] with its \
                 permissions instead (docs/config.md)"
                    .into(),
            ));
        }
        if self.token.is_some() && self.rtsp.is_some() && !rtsp_auth {
            warnings.push(Warning(
                "the API token does not protect RTSP: any RTSP client can play; set rtsp_require_token = true \
                 or add [[rtsp_user]]"
                    .into(),
            ));
        }
        Ok(warnings)
    }

    /// Where plain RTSP listens: nowhere when `[tls] encryption = "strict"`.
    pub fn rtsp_plain(&self) -> Option<SocketAddr> {
        match &self.tls {
            Some(t) if t.encryption == Encryption::Strict => None,
            _ => self.rtsp,
        }
    }

    /// Where RTSPS listens: `[tls] rtsps`, else the RTSP host on port 8322; none without TLS.
    pub fn rtsps(&self) -> Option<SocketAddr> {
        let t = self.tls.as_ref()?;
        t.rtsps.or_else(|| Some(SocketAddr::new(self.rtsp.map_or(self.api.ip(), |r| r.ip()), RTSPS_PORT)))
    }

    /// Where RTMPS listens: `[tls] rtmps`, else the RTMP host on port 1936; none without TLS
    /// or where RTMP is off and no `rtmps` is named.
    pub fn rtmps(&self) -> Option<SocketAddr> {
        let t = self.tls.as_ref()?;
        t.rtmps.or_else(|| self.rtmp.map(|r| SocketAddr::new(r.ip(), RTMPS_PORT)))
    }

    /// How RTSPS clients get SRTP, if they do.
    pub fn srtp(&self) -> Option<SrtpKeys> {
        self.tls.as_ref().filter(|t| t.srtp).map(|t| t.srtp_keys)
    }

    /// Whether the API port speaks HTTPS.
    pub fn https(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.https)
    }

    /// The users the RTSP server checks itself (Basic or Digest, which needs the password
    /// in the clear): the RTSP users, with `token` as user "token" when `rtsp_require_token`
    /// is set; none where `[auth]` or `[[user]]` decides (the RTSP face then checks Basic
    /// credentials, with the request's path and action, before the server sees it).
    pub fn rtsp_server_users(&self) -> Vec<(String, String)> {
        if self.face_checks_rtsp() {
            Vec::new()
        } else {
            self.rtsp_credentials()
        }
    }

    /// Whether the RTSP face decides each request's credentials itself.
    pub fn face_checks_rtsp(&self) -> bool {
        self.auth.is_some() || !self.users.is_empty()
    }

    /// The users of the stream faces (RTSP, RTMP, SRT, WebRTC): the `[[user]]`s, the RTSP
    /// users (reading and publishing everything) and the token as user `token` where
    /// `rtsp_require_token`; the HTTP faces (TS, FLV, HLS, playback, the API, metrics) take
    /// the `[[user]]`s alone, as they took no RTSP user before.
    pub fn login_users(&self, stream_face: bool) -> Vec<fanout_proto::users::User> {
        let mut users = self.users.clone();
        if stream_face {
            users.extend(self.rtsp_credentials().iter().map(|(n, p)| fanout_proto::users::User::legacy(n, p)));
        }
        users
    }

    pub fn rtsp_credentials(&self) -> Vec<(String, String)> {
        let mut users: Vec<(String, String)> =
            self.rtsp_users.iter().map(|u| (u.name.clone(), u.password.clone())).collect();
        if let (true, Some(t)) = (self.rtsp_require_token, &self.token) {
            users.push(("token".into(), t.clone()));
        }
        users
    }
}

/// An address, or `"off"`.
fn addr_or_off<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    match s.as_str() {
        "off" => Ok(None),
        a => a.parse().map(Some).map_err(|e| serde::de::Error::custom(format!("{a:?}: {e} (an address, or \"off\")"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposure_refuses_open_public_listeners_and_warns() {
        let mut c = Config::default();
        assert_eq!(c.exposure(), Ok(vec![]));
        c.api = "0.0.0.0:7070".parse().unwrap();
        assert!(c.exposure().unwrap_err().0.contains("the API on 0.0.0.0:7070 has no token"));
        c.token = Some("t".into());
        let w = c.exposure().unwrap();
        assert!(w.len() == 1 && w[0].0.contains("does not protect RTSP"), "{w:?}");
        c.rtsp = Some("[::]:8554".parse().unwrap());
        assert!(c.exposure().unwrap_err().0.contains("RTSP on [::]:8554"));
        c.allow_unauthenticated = true;
        assert!(c.exposure().unwrap().iter().any(|w| w.0.starts_with("UNAUTHENTICATED: RTSP")));
        c.allow_unauthenticated = false;
        c.rtsp_require_token = true;
        assert_eq!(c.exposure(), Ok(vec![]));
        assert_eq!(c.rtsp_credentials(), vec![("token".to_string(), "t".to_string())]);
    }

    /// `[[user]]`s guard the faces beyond loopback (one with `api` the API, without a token),
    /// and RTSP then checks them in the face; an `rtsp_user` is a user with a warning.
    #[test]
    fn users_guard_the_faces_and_rtsp_users_are_deprecated() {
        let c = Config::parse(
            "api = \"0.0.0.0:7070\"\nrtsp = \"0.0.0.0:8554\"\n[[user]]\nname = \"ops\"\npassword = \"p\"\n\
             permissions = [{ action = \"api\" }, { action = \"read\" }]\n",
        )
        .unwrap();
        assert_eq!(c.exposure(), Ok(vec![]));
        assert!(c.face_checks_rtsp() && c.rtsp_server_users().is_empty());
        assert_eq!(c.login_users(false).len(), 1);
        let old = Config::parse("[[rtsp_user]]\nname = \"u\"\npassword = \"p\"\n").unwrap();
        assert!(old.exposure().unwrap().iter().any(|w| w.0.starts_with("rtsp_user is deprecated")));
        assert!(!old.face_checks_rtsp() && old.rtsp_server_users().len() == 1);
        // The stream faces take it, reading and publishing everything; the HTTP faces do not.
        assert_eq!((old.login_users(true).len(), old.login_users(false).len()), (1, 0));
        // Problems are named: no permissions, a name twice, a name both ways.
        let e = Config::parse(
            "[[user]]\nname = \"a\"\npassword = \"p\"\npermissions = []\n\
             [[user]]\nname = \"a\"\npassword = \"p\"\npermissions = [{ action = \"read\" }]\n\
             [[rtsp_user]]\nname = \"a\"\npassword = \"p\"\n",
        )
        .unwrap_err()
        .join("\n");
        for why in ["no permissions", "given twice", "both an rtsp_user and a [[user]]"] {
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn empty_config_is_the_default() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.api, Config::default().api);
        assert!(c.demo);
    }

    #[test]
    fn sessions_and_sinks_parse() {
        let c = Config::parse(
            r#"
            token = "s3cret"
            [[session]]
            name = "tv1"
            source = { udp = "127.0.0.1:5004" }
            priority = 3
            [[session.sink]]
            udp = "127.0.0.1:6000"
            "#,
        )
        .unwrap();
        assert_eq!(c.sessions[0].sinks.len(), 1);
        assert_eq!(c.token.as_deref(), Some("s3cret"));
    }

    #[test]
    fn a_bad_cluster_table_is_refused_with_the_reason() {
        let ok = Config::parse("[cluster]\nnode = \"e1\"\nparents = [\"rtsp://10.0.0.1:8554\"]\n").unwrap();
        assert_eq!(ok.cluster.unwrap().lease_s, 4);
        for (body, why) in [
            ("node = \"a b\"\nparents = [\"rtsp://h:1\"]", "letters, digits"),
            ("node = \"e\"", "needs `etcd` endpoints, `parents`"),
            ("node = \"e\"\nparents = [\"rtsp://h:1/cam\"]", "no path"),
            ("node = \"e\"\nparents = [\"http://h:1\"]", "http://h:1"),
            ("node = \"e\"\netcd = [\"h:2379\"]\nlease_s = 0", "lease_s 0"),
            ("node = \"e\"\netcd = [\"h:2379\"]\nprefix = \"x/\"", "prefix"),
            ("node = \"e\"\netcd = [\"h:2379\"]\nweight = 1", "weight"),
        ] {
            let e = Config::parse(&format!("[cluster]\n{body}\n")).unwrap_err().join("\n");
            assert!(e.contains(why), "{body}: {e}");
        }
    }

    /// `rtsp_multicast`: a range of groups, or the reason it is not one.
    #[test]
    fn rtsp_multicast_is_a_range_of_groups() {
        let c = Config::parse("rtsp_multicast = { ips = \"239.255.7.9/28\", ttl = 3 }\n").unwrap();
        let m = c.rtsp_multicast.unwrap().groups().unwrap();
        assert_eq!((m.first, m.count, m.rtp, m.rtcp, m.ttl), ("239.255.7.0".parse().unwrap(), 16, 8002, 8003, 3));
        for (text, why) in [
            ("ips = \"10.0.0.0/8\"", "not multicast"),
            ("ips = \"239.0.0.0/40\"", "prefix length"),
            ("ips = \"cam\"", "not an IPv4 range"),
            ("ips = \"239.1.1.1\", rtp_port = 5000, rtcp_port = 5000", "two ports"),
        ] {
            let e = Config::parse(&format!("rtsp_multicast = {{ {text} }}\n")).unwrap_err();
            assert!(e.iter().any(|e| e.contains(why) && e.contains("rtsp_multicast")), "{text}: {e:?}");
        }
    }

    #[test]
    fn ice_servers_are_checked() {
        let ok = "[[webrtc_ice_server]]\nurl = \"stun:stun.example.net:3478\"\n\
                  [[webrtc_ice_server]]\nurl = \"turn:turn.example.net?transport=udp\"\nusername = \"u\"\ncredential = \"p\"\n";
        assert_eq!(Config::parse(ok).unwrap().webrtc_ice_servers.len(), 2);
        for bad in [
            "url = \"http://x\"",
            "url = \"turn:x\"",
            "url = \"stun:x\"\nusername = \"u\"\ncredential = \"p\"",
            "url = \"turn:x\"\nusername = \"u\\\"\"\ncredential = \"p\"",
            "url = \"stun:x>; rel=evil\"",
        ] {
            let e = Config::parse(&format!("[[webrtc_ice_server]]\n{bad}\n")).unwrap_err().join("\n");
            assert!(e.contains("webrtc_ice_server"), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_line() {
        let e = Config::parse("workers = 2\nringg = 5\n").unwrap_err().join("\n");
        assert!(e.contains("line 2") && e.contains("ringg"), "{e}");
        let e = Config::parse("[[session]]\nname = \"x\"\nsource = { udp = \"1.2.3.4\" }\n").unwrap_err().join("\n");
        assert!(e.contains("line 3"), "{e}");
    }

    #[test]
    fn worker_priority_and_shedding_are_checked() {
        let c = Config::parse("worker_priority = \"realtime:10\"\nshed_after_ms = 0\n").unwrap();
        let o = c.engine_options().unwrap();
        assert_eq!(o.priority, fanout_io::ThreadPriority::Realtime(10));
        assert_eq!(o.shed_after, None);
        assert_eq!(
            Config::default().engine_options().unwrap().shed_after,
            Some(std::time::Duration::from_millis(DEFAULT_SHED_AFTER_MS))
        );
        for bad in ["\"fast\"", "\"nice:-21\"", "\"realtime:0\"", "\"realtime\""] {
            let e = Config::parse(&format!("worker_priority = {bad}\n")).unwrap_err().join("\n");
            assert!(e.contains("line 1") && e.contains("not a thread priority"), "{bad}: {e}");
        }
        let e = Config::parse("shed_after_ms = 20000\n").unwrap_err().join("\n");
        assert!(e.contains("shed_after_ms 20000 is out of range"), "{e}");
    }

    #[test]
    fn range_errors_name_the_line_and_all_are_reported() {
        let text = "demo = true\nring = 1\nworkers = 2\nmax_datagram = 9\n\n[[session]]\nname = \"a\"\n\
                    source = { demo = true }\npriority = 9\n\n[[session]]\nname = \"b\"\nsource = { demo = true }\n\
                    stream_flush_ms = 5000\n";
        let e = Config::parse(text).unwrap_err();
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(e[0].starts_with("line 2: ring 1"), "{e:#?}");
        assert!(e[1].starts_with("line 4: max_datagram 9"), "{e:#?}");
        assert!(e[2].starts_with("line 9: session \"a\"") && e[2].contains("priority"), "{e:#?}");
        assert!(e[3].starts_with("line 14: session \"b\": stream_flush_ms 5000"), "{e:#?}");
    }

    /// Issue 30 item 15: nine mistakes of one file in one report, each at its line, naming
    /// the key and what is expected.
    #[test]
    fn nine_mistakes_in_one_report() {
        let text = "api = 127.0.0.1:7170\nring = 1\nworkers = \"two\"\nmax_datagram = 9\n\
                    [[session]]\nname = \"bad name!\"\npriorty = 2\nsource = { udp = \"127.0.0.1\", lop = true }\n\
                    [[session]]\nname = \"ok\"\nsource = { demo = true }\nstream_flush_ms = 5000\n";
        let e = Config::parse(text).unwrap_err();
        let has = |line: usize, words: &[&str]| {
            e.iter().any(|m| m.starts_with(&format!("line {line}:")) && words.iter().all(|w| m.contains(w)))
        };
        assert!(has(1, &["in quotes", "api = \"127.0.0.1:7070\""]), "{e:#?}");
        assert!(has(2, &["ring 1"]), "{e:#?}");
        assert!(has(3, &["workers"]), "{e:#?}");
        assert!(has(4, &["max_datagram 9"]), "{e:#?}");
        assert!(has(6, &["bad name!"]), "{e:#?}");
        assert!(has(7, &["priorty"]), "{e:#?}");
        assert!(has(8, &["IP:PORT"]) || has(8, &["lop"]), "{e:#?}");
        assert!(has(12, &["stream_flush_ms 5000"]), "{e:#?}");
        assert!(e.len() >= 8, "{e:#?}");
    }

    #[test]
    fn every_field_error_is_reported() {
        let text = "ringg = 5\nworkers = \"two\"\ndemo = true\n[[session]]\nname = \"a\"\nsource = { demo = true }\ncolour = 1\n";
        let e = Config::parse(text).unwrap_err();
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(e[0].starts_with("line 1:") && e[0].contains("ringg"), "{e:#?}");
        assert!(e[1].starts_with("line 2:") && e[1].contains("invalid type"), "{e:#?}");
        assert!(e[2].starts_with("line 7:") && e[2].contains("colour"), "{e:#?}");
    }

    #[test]
    fn syntax_errors_are_all_reported() {
        let e = Config::parse("ring = \nworkers = 2\ndemo = tru\n").unwrap_err();
        assert!(e.len() >= 2 && e[0].starts_with("line 1") && e.iter().any(|l| l.starts_with("line 3")), "{e:#?}");
    }

    /// Every field of the config and of a session is documented in docs/config.md.
    #[test]
    fn every_field_is_documented() {
        let doc = include_str!("../../../../docs/config.md");
        let fields = serde_json::to_value(crate::spec::SessionSpec::new("x", crate::spec::SourceSpec::Demo)).unwrap();
        let mut missing: Vec<String> = Vec::new();
        let mut need = |key: &str| {
            if !doc.contains(&format!("`{key}`")) {
                missing.push(key.to_string());
            }
        };
        for key in CONFIG_FIELDS {
            need(key);
        }
        for key in fields.as_object().unwrap().keys() {
            need(key);
        }
        for key in ["ring", "max_datagram", "datapath", "stream_flush_ms", "video", "sink", "FANOUT_LOG"] {
            need(key);
        }
        for key in crate::spec::SOURCE_FIELDS {
            need(key);
        }
        assert!(missing.is_empty(), "docs/config.md does not document: {missing:?}");
    }

    #[test]
    fn a_pattern_puts_the_name_in_its_source_and_is_checked() {
        let c = Config::parse(
            "[[pattern]]\nmatch = \"~^cam[0-9]+$\"\nsource = { rtsp = \"rtsp://10.0.0.5/{name}\", on_demand = true }\n",
        )
        .unwrap();
        let p = &c.patterns[0];
        assert!(p.rule().unwrap().matches("cam12") && !p.rule().unwrap().matches("cam"));
        let spec = p.session("cam12").unwrap();
        assert_eq!(spec.name, "cam12");
        let crate::spec::SourceSpec::Rtsp(r) = &spec.source else { panic!("{spec:?}") };
        assert_eq!(r.url, "rtsp://10.0.0.5/cam12");
        // A bad rule, a linger out of range: named.
        let e = Config::parse("[[pattern]]\nmatch = \"~(\"\nsource = { demo = true }\nlinger_s = -1\n").unwrap_err();
        assert!(
            e.iter().any(|l| l.contains("pattern path \"~(\"")) && e.iter().any(|l| l.contains("linger_s -1")),
            "{e:?}"
        );
    }

    #[test]
    fn a_session_named_twice_is_an_error_at_the_second() {
        let text = "[[session]]\nname = \"a\"\nsource = { demo = true }\n\n[[session]]\nname = \"a\"\nsource = { demo = true }\n";
        let e = Config::parse(text).unwrap_err();
        assert_eq!(e.0, vec!["line 5: session \"a\" is named twice".to_string()]);
    }

    /// Keeps CONFIG_FIELDS in step with the struct: a config naming every listed field
    /// parses, and one more made-up field does not.
    #[test]
    fn config_fields_list_is_complete() {
        let err = Config::parse("no_such_field = 1\n").unwrap_err().join("");
        for key in CONFIG_FIELDS {
            assert!(err.contains(&format!("`{key}`")), "CONFIG_FIELDS lists {key}, serde does not: {err}");
        }
        let listed = err.matches('`').count() / 2 - 1; // minus the unknown field itself
        assert_eq!(listed, CONFIG_FIELDS.len(), "serde knows more fields than CONFIG_FIELDS: {err}");
    }
}
