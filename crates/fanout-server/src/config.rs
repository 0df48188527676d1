//! The server's typed configuration: `fanout serve` runs without any; `--config fanout.toml`
//! declares the API address, token, engine sizes and static sessions.

use crate::spec::SessionSpec;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;
use toml::de::DeTable;

/// The configuration as it was loaded (from the file and the flags over it) and how to load
/// it again, for a reload (`crate::reload`).
pub struct Loader {
    pub loaded: Config,
    /// Reads the file again and applies the same flags; every problem, one per line.
    pub load: Box<dyn Fn() -> Result<Config, String> + Send + Sync>,
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
    #[serde(rename = "rtsp_user")]
    pub rtsp_users: Vec<RtspUser>,
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

/// `[[pattern]]`: a path made on demand for the names that match.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatternSpec {
    /// A name, or `~regex` (anchor it to match the whole name).
    #[serde(rename = "match")]
    pub matches: String,
    /// The path's source; `{name}` in its strings becomes the name asked for.
    pub source: crate::spec::SourceSpec,
    /// A command (`sh -c`) run while the path is wanted, with `FANOUT_PATH`,
    /// `FANOUT_RTSP_URL` and `FANOUT_RTMP_URL` set: typically one that publishes to it.
    pub run_on_demand: Option<String>,
    /// Seconds the path stays after its last reader (then its command is stopped).
    #[serde(default = "PatternSpec::default_linger")]
    pub linger_s: f64,
    /// Record the paths it makes, as a session's `record`.
    pub record: Option<crate::spec::RecordSpec>,
    /// The hooks of the paths it makes, as a session's.
    pub run_on_ready: Option<String>,
    pub run_on_not_ready: Option<String>,
    pub run_on_read: Option<String>,
    pub run_on_record_segment_complete: Option<String>,
    /// Its paths' readers at most, and commands per reader, as a session's.
    pub max_readers: Option<usize>,
    pub on_read: Option<Vec<String>>,
    pub on_unread: Option<Vec<String>>,
    pub on_publish: Option<Vec<String>>,
    pub on_unpublish: Option<Vec<String>>,
    /// Paths it keeps at once, at most: each may run a command, and any reader allowed to
    /// read can ask for a new name.
    #[serde(default = "PatternSpec::default_max_paths")]
    pub max_paths: usize,
}

impl PatternSpec {
    fn default_linger() -> f64 {
        10.0
    }

    fn default_max_paths() -> usize {
        32
    }

    pub fn rule(&self) -> Result<fanout_proto::auth::PathRule, String> {
        fanout_proto::auth::PathRule::parse(Some(&self.matches))
    }

    /// The session for `name`: the source with `{name}` put in, checked.
    pub fn session(&self, name: &str) -> Result<SessionSpec, String> {
        fn put(v: &mut serde_json::Value, name: &str) {
            match v {
                serde_json::Value::String(s) => *s = s.replace("{name}", name),
                serde_json::Value::Array(a) => a.iter_mut().for_each(|v| put(v, name)),
                serde_json::Value::Object(o) => o.values_mut().for_each(|v| put(v, name)),
                _ => {}
            }
        }
        let mut v = serde_json::to_value(&self.source).map_err(|e| e.to_string())?;
        put(&mut v, name);
        let source = serde_json::from_value(v).map_err(|e| format!("pattern {:?}: {e}", self.matches))?;
        let mut spec = SessionSpec::new(name, source);
        spec.record = self.record.clone();
        spec.run_on_ready = self.run_on_ready.clone();
        spec.run_on_not_ready = self.run_on_not_ready.clone();
        spec.run_on_read = self.run_on_read.clone();
        spec.run_on_record_segment_complete = self.run_on_record_segment_complete.clone();
        spec.max_readers = self.max_readers;
        spec.on_read = self.on_read.clone();
        spec.on_unread = self.on_unread.clone();
        spec.on_publish = self.on_publish.clone();
        spec.on_unpublish = self.on_unpublish.clone();
        spec.validate().map_err(|e| format!("pattern {:?} for {name:?}: {e}", self.matches))?;
        Ok(spec)
    }
}

/// `[auth]`: who decides beyond the local token and users.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub method: AuthMethod,
    /// `http`: the service each question is posted to (JSON); 2xx allows.
    pub http_url: Option<String>,
    /// `jwt`: where the keys are (RS256, ES256, EdDSA).
    pub jwks_url: Option<String>,
    /// `jwt`: the claim that lists the allowed actions and paths.
    #[serde(default = "AuthConfig::default_claim")]
    pub jwt_claim: String,
    /// Seconds the service (or the JWKS URL) has to answer; past them, refused.
    #[serde(default = "AuthConfig::default_timeout")]
    pub timeout_s: f64,
    /// Seconds an allowed answer is remembered (0: asked every time).
    #[serde(default = "AuthConfig::default_cache")]
    pub cache_s: f64,
    /// Seconds before the JWKS is fetched again.
    #[serde(default = "AuthConfig::default_refresh")]
    pub jwks_refresh_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMethod {
    Http,
    Jwt,
}

impl AuthConfig {
    fn default_claim() -> String {
        "fanout_permissions".into()
    }
    fn default_timeout() -> f64 {
        2.0
    }
    fn default_cache() -> f64 {
        10.0
    }
    fn default_refresh() -> f64 {
        300.0
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.timeout_s)
    }

    pub fn validate(&self) -> Result<(), String> {
        let url = |key: &str, v: &Option<String>| match v.as_deref() {
            None => Err(format!("[auth] method {:?} needs {key}", self.method)),
            Some(u) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                Err(format!("[auth] {key} {u:?}: an http:// or https:// URL"))
            }
            Some(_) => Ok(()),
        };
        match self.method {
            AuthMethod::Http => url("http_url", &self.http_url)?,
            AuthMethod::Jwt => url("jwks_url", &self.jwks_url)?,
        }
        if !(0.1..=30.0).contains(&self.timeout_s) {
            return Err(format!("[auth] timeout_s {} is out of range 0.1..=30", self.timeout_s));
        }
        if !(0.0..=3600.0).contains(&self.cache_s) {
            return Err(format!("[auth] cache_s {} is out of range 0..=3600", self.cache_s));
        }
        if !(1.0..=86_400.0).contains(&self.jwks_refresh_s) {
            return Err(format!("[auth] jwks_refresh_s {} is out of range 1..=86400", self.jwks_refresh_s));
        }
        if self.jwt_claim.is_empty() {
            return Err("[auth] jwt_claim must not be empty".into());
        }
        Ok(())
    }
}

/// `[cluster]`: who this node is, where the directory is, where it pulls from.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's name, unique in the cluster (letters, digits, `.`, `_`, `-`).
    pub node: String,
    /// etcd endpoints (`host:port`) for membership and the channel directory.
    #[serde(default)]
    pub etcd: Vec<String>,
    /// Relays to pull from, in order of preference (`rtsp://host:port`), health-checked; asked
    /// after the directory (or instead of one).
    #[serde(default)]
    pub parents: Vec<String>,
    /// Where other nodes reach this one's RTSP (`rtsp://host:port`); default: the RTSP
    /// address, if it is not a wildcard.
    #[serde(default)]
    pub rtsp_url: Option<String>,
    /// Where people reach this one's API (`http://host:port`), shown in the directory.
    #[serde(default)]
    pub api_url: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    /// 0 = origin; an edge one more than the nodes it pulls from.
    #[serde(default)]
    pub tier: u32,
    /// Subscribers this node takes: a node at its cap is chosen last by the others.
    #[serde(default)]
    pub max_subscribers: Option<u64>,
    /// At `max_subscribers`, answer a new RTSP client's DESCRIBE with a 302 to a node with
    /// room (from the directory).
    #[serde(default)]
    pub redirect: bool,
    /// Seconds the node's registration outlives its last keep-alive (the etcd lease TTL).
    #[serde(default = "ClusterConfig::default_lease")]
    pub lease_s: u64,
    /// Seconds a pulled channel stays after its last subscriber left.
    #[serde(default = "ClusterConfig::default_linger")]
    pub linger_s: f64,
    /// How pulls carry RTP: `tcp` (interleaved, default), `udp` or `auto`.
    #[serde(default = "ClusterConfig::default_transport")]
    pub pull_transport: crate::spec::RtspTransport,
    /// PEM file of the CA that signed the other nodes' certificates, for `rtsps://` nodes.
    #[serde(default)]
    pub tls_ca: Option<String>,
    /// The etcd key prefix of this cluster.
    #[serde(default = "ClusterConfig::default_prefix")]
    pub prefix: String,
}

impl ClusterConfig {
    fn default_lease() -> u64 {
        4
    }
    fn default_linger() -> f64 {
        10.0
    }
    fn default_transport() -> crate::spec::RtspTransport {
        crate::spec::RtspTransport::Tcp
    }
    fn default_prefix() -> String {
        "/fanout".into()
    }

    /// Checks what serde cannot: names, URLs, ranges.
    pub fn validate(&self) -> Result<(), String> {
        let good = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if self.node.is_empty() || self.node.len() > 64 || !self.node.chars().all(good) {
            return Err(format!("[cluster] node {:?}: 1-64 letters, digits, '.', '_' or '-'", self.node));
        }
        if self.etcd.is_empty() && self.parents.is_empty() {
            return Err("[cluster] needs `etcd` endpoints, `parents`, or both".into());
        }
        for p in self.parents.iter().chain(&self.rtsp_url) {
            let u = fanout_proto::rtsp::client::Url::parse(p).map_err(|e| format!("[cluster] {p:?}: {e}"))?;
            if u.path != "/" {
                return Err(format!("[cluster] {p:?}: give the relay's base URL (rtsp://host:port), no path"));
            }
        }
        if !(1..=300).contains(&self.lease_s) {
            return Err(format!("[cluster] lease_s {}: 1 to 300", self.lease_s));
        }
        if !(0.0..=3600.0).contains(&self.linger_s) {
            return Err(format!("[cluster] linger_s {}: 0 to 3600", self.linger_s));
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') {
            return Err(format!("[cluster] prefix {:?}: starts with '/', does not end with one", self.prefix));
        }
        Ok(())
    }
}

/// `[tls]`: the certificate and where it is used.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain (the server's first) and PEM private key; re-read on SIGHUP.
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// The API, /metrics and HTTP streams speak HTTPS on `api` (plain HTTP is refused there).
    #[serde(default = "yes")]
    pub https: bool,
    /// RTSP over TLS (`rtsps://`); default: the RTSP address's host, port 8322.
    #[serde(default)]
    pub rtsps: Option<SocketAddr>,
    /// RTMP over TLS (`rtmps://`); default: the RTMP address's host, port 1936 (none where
    /// RTMP is off).
    #[serde(default)]
    pub rtmps: Option<SocketAddr>,
    /// `optional`: plain RTSP beside RTSPS; `strict`: RTSPS only (no plain RTSP listener).
    #[serde(default)]
    pub encryption: Encryption,
    /// RTSPS descriptions carry SRTP keys (SDES): clients get SRTP, over UDP (`RTP/SAVP`)
    /// or interleaved; off: RTSPS clients take plain RTP interleaved in the TLS only.
    #[serde(default = "yes")]
    pub srtp: bool,
    /// `shared`: a track's SRTP clients share a key epoch, each packet encrypted once;
    /// `per-client`: each client its own key, its packets encrypted for it alone.
    #[serde(default)]
    pub srtp_keys: SrtpKeys,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SrtpKeys {
    #[default]
    Shared,
    PerClient,
}

fn yes() -> bool {
    true
}

impl TlsConfig {
    pub fn new(cert: std::path::PathBuf, key: std::path::PathBuf) -> Self {
        Self {
            cert,
            key,
            https: true,
            rtsps: None,
            rtmps: None,
            encryption: Encryption::Optional,
            srtp: true,
            srtp_keys: SrtpKeys::Shared,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encryption {
    #[default]
    Optional,
    Strict,
}

/// RTMP's port.
pub const RTMP_PORT: u16 = 1935;
/// The RTMPS port when `[tls]` names none (MediaMTX's).
pub const RTMPS_PORT: u16 = 1936;
/// SRT's port (UDP), MediaMTX's.
pub const SRT_PORT: u16 = 8890;

/// The WebRTC media port when the config names none (MediaMTX's).
pub const WEBRTC_PORT: u16 = 8189;

/// An address, or `"off"`.
fn addr_or_off<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    match s.as_str() {
        "off" => Ok(None),
        a => a.parse().map(Some).map_err(|e| serde::de::Error::custom(format!("{a:?}: {e} (an address, or \"off\")"))),
    }
}

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
            rtsp_max_connections: default_max_connections(),
            rtsp_idle_s: 60.0,
            request_timeout_s: 10.0,
            api_max_connections: default_max_connections(),
            max_connections_per_ip: 64,
            max_failed_logins: crate::admit::DEFAULT_FAILED_LOGINS,
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

/// Where in the file a span is: its line, and the message to show with it.
type LineOf<'a> = dyn Fn(Option<std::ops::Range<usize>>, &str) -> (usize, String) + 'a;

/// A field's message that names its key (serde's type errors do not).
fn named(key: &str, msg: &str) -> String {
    if msg.contains(key) {
        msg.to_string()
    } else {
        format!("{key}: {msg}")
    }
}

/// A parser's message, with what a person should write instead where it is not plain.
fn explain(msg: &str) -> String {
    if msg.contains("invalid socket address syntax") {
        return format!("{msg}: expected \"IP:PORT\", e.g. \"127.0.0.1:5000\" or \"[::1]:5000\"");
    }
    if msg.contains("invalid float") || msg.contains("invalid integer") || msg.contains("invalid number") {
        return format!(
            "{msg} (an address, a URL or a name is a string: put it in quotes, e.g. api = \"127.0.0.1:7070\")"
        );
    }
    msg.to_string()
}

/// Every field error of one `[[session]]`: each of its keys deserialized on its own, beside
/// a name and a source that are right, so that a typo in its source does not hide a
/// misspelt key after it.
fn session_field_errors(s: &toml::Spanned<toml::de::DeValue<'_>>, at: &LineOf<'_>) -> Vec<(usize, String)> {
    // A session that is right but for the key tried: its name and source where it lacks them.
    const STAND_IN: &str = "name = \"x\"\nsource = { demo = true }\n";
    let Some(table) = s.get_ref().as_table() else {
        let e = SessionSpec::deserialize(toml::de::ValueDeserializer::from(s.clone())).err();
        return e.map(|e| at(e.span().or(Some(s.span())), e.message())).into_iter().collect();
    };
    let stand_in = DeTable::parse(STAND_IN).expect("a constant").into_inner();
    let mut errors = Vec::new();
    for (key, value) in table.iter() {
        let mut one = stand_in.clone();
        one.remove(key.get_ref().as_ref());
        one.insert(key.clone(), value.clone());
        let de = toml::de::Deserializer::from(toml::Spanned::new(value.span(), one));
        if let Err(e) = SessionSpec::deserialize(de) {
            errors.push(at(e.span().or(Some(key.span())), &named(key.get_ref(), e.message())));
        }
    }
    // Its name checked too (the rest of it waits for its fields to be mended).
    if let Some((key, name)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == "name") {
        let mut one = stand_in.clone();
        one.remove("name");
        one.insert(key.clone(), name.clone());
        let de = toml::de::Deserializer::from(toml::Spanned::new(name.span(), one));
        if let Err(why) = SessionSpec::deserialize(de).map(|spec| spec.validate()).unwrap_or(Ok(())) {
            errors.push(at(Some(key.span()), &why));
        }
    }
    if errors.is_empty() {
        // Wrong only as a whole (a key missing): say that.
        if let Err(e) = SessionSpec::deserialize(toml::de::ValueDeserializer::from(s.clone())) {
            errors.push(at(e.span().or(Some(s.span())), e.message()));
        }
    }
    errors
}

impl Config {
    /// Reads and checks a config file; every problem is reported, each with the file and the
    /// line it is on.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|errors| {
            let file = path.display();
            anyhow::anyhow!("{}", errors.iter().map(|e| format!("{file}:{e}")).collect::<Vec<_>>().join("\n"))
        })
    }

    /// Parses and checks a config; on failure, every problem found as `line N: what`, in
    /// order of line: syntax, then each key's type (each key of each session on its own),
    /// then the ranges of everything else, so one pass shows them all.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let line = |offset: usize| text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1;
        let at = |span: Option<std::ops::Range<usize>>, msg: &str| match span {
            Some(s) => (line(s.start), explain(msg.trim())),
            None => (0, explain(msg.trim())),
        };
        let (doc, syntax) = DeTable::parse_recoverable(text);
        let mut errors: Vec<(usize, String)> = syntax.iter().map(|e| at(e.span(), e.message())).collect();
        // One syntax error a line: the one that says what is wrong ("invalid …") over what
        // followed from it ("number overflowed").
        let said: Vec<usize> = errors.iter().filter(|(_, m)| m.starts_with("invalid")).map(|(l, _)| *l).collect();
        errors.retain(|(l, m)| m.starts_with("invalid") || !said.contains(l));
        let (fields, good) = Self::field_errors(doc.get_ref(), &at);
        // (A value the syntax error already named is not told of again.)
        let syntax_lines: Vec<usize> = errors.iter().map(|(l, _)| *l).collect();
        errors.extend(fields.into_iter().filter(|(l, _)| !syntax_lines.contains(l)));
        // The keys (and sessions) that deserialize, checked for their ranges.
        let de = toml::de::Deserializer::from(toml::Spanned::new(0..text.len(), good.clone()));
        match Config::deserialize(de) {
            Ok(cfg) => errors.extend(cfg.range_errors(&good, &line)),
            Err(e) => errors.push(at(e.span(), e.message())),
        }
        if errors.is_empty() {
            return Ok(toml::from_str(text).expect("parsed above"));
        }
        errors.sort();
        errors.dedup();
        Err(errors.into_iter().map(|(l, m)| if l > 0 { format!("line {l}: {m}") } else { m }).collect())
    }

    /// Type and unknown-field errors, each top-level key and each key of each session
    /// deserialized on its own so that one bad field does not hide the next; and the document
    /// without the keys and sessions that had one.
    fn field_errors<'i>(doc: &DeTable<'i>, at: &LineOf<'_>) -> (Vec<(usize, String)>, DeTable<'i>) {
        let mut errors = Vec::new();
        let mut good = DeTable::new();
        for (key, value) in doc.iter() {
            if key.get_ref().as_ref() == "session" {
                if let Some(sessions) = value.get_ref().as_array() {
                    let mut kept = toml::de::DeArray::new();
                    for s in sessions.iter() {
                        let de = toml::de::ValueDeserializer::from(s.clone());
                        if SessionSpec::deserialize(de).is_ok() {
                            kept.push(s.clone());
                        } else {
                            errors.extend(session_field_errors(s, at));
                        }
                    }
                    let span = value.span();
                    good.insert(key.clone(), toml::Spanned::new(span, toml::de::DeValue::Array(kept)));
                    continue;
                }
            }
            let mut one = DeTable::new();
            one.insert(key.clone(), value.clone());
            let de = toml::de::Deserializer::from(toml::Spanned::new(value.span(), one));
            match Config::deserialize(de) {
                Ok(_) => {
                    good.insert(key.clone(), value.clone());
                }
                Err(e) => errors.push(at(e.span().or(Some(key.span())), &named(key.get_ref(), e.message()))),
            }
        }
        (errors, good)
    }

    /// Values of the right type but out of their range, each at the line of its key.
    fn range_errors(&self, doc: &DeTable, line: &dyn Fn(usize) -> usize) -> Vec<(usize, String)> {
        let key_line =
            |key: &str| doc.iter().find(|(k, _)| k.get_ref().as_ref() == key).map_or(0, |(k, _)| line(k.span().start));
        let mut errors = Vec::new();
        let mut check = |ok: bool, key: &'static str, msg: String| {
            if !ok {
                errors.push((key_line(key), msg));
            }
        };
        let max_ring = crate::spec::MAX_RING;
        check(
            (2..=max_ring).contains(&self.ring),
            "ring",
            format!("ring {} is out of range 2..={max_ring}", self.ring),
        );
        let max_dg = crate::spec::MAX_DATAGRAM;
        check(
            (188..=max_dg).contains(&self.max_datagram),
            "max_datagram",
            format!("max_datagram {} is out of range 188..={max_dg}", self.max_datagram),
        );
        check(
            (1..=crate::spec::MAX_SINKS_PER_GROUP).contains(&self.sinks_per_group),
            "sinks_per_group",
            format!(
                "sinks_per_group {} is out of range 1..={}",
                self.sinks_per_group,
                crate::spec::MAX_SINKS_PER_GROUP
            ),
        );
        check(
            KERNEL_SINKS.contains(&self.kernel_sinks),
            "kernel_sinks",
            format!(
                "kernel_sinks {} is out of range {}..={}",
                self.kernel_sinks,
                KERNEL_SINKS.start(),
                KERNEL_SINKS.end()
            ),
        );
        check(
            self.workers <= MAX_WORKERS,
            "workers",
            format!("workers {} is out of range 0..={MAX_WORKERS}", self.workers),
        );
        if let Err(e) = self.worker_priority.parse::<fanout_io::ThreadPriority>() {
            check(false, "worker_priority", format!("worker_priority {e}"));
        }
        check(
            self.shed_after_ms <= MAX_SHED_AFTER_MS,
            "shed_after_ms",
            format!("shed_after_ms {} is out of range 0..={MAX_SHED_AFTER_MS}", self.shed_after_ms),
        );
        check(
            self.egress_kbps == 0 || (8..=MAX_EGRESS_KBPS).contains(&self.egress_kbps),
            "egress_kbps",
            format!("egress_kbps {} is out of range 8..={MAX_EGRESS_KBPS} (0: not limited)", self.egress_kbps),
        );
        check(self.rtsp_max_connections >= 1, "rtsp_max_connections", "rtsp_max_connections must be at least 1".into());
        check(
            (1.0..=86_400.0).contains(&self.rtsp_idle_s),
            "rtsp_idle_s",
            format!("rtsp_idle_s {} is out of range 1..=86400", self.rtsp_idle_s),
        );
        for (key, cmd) in [("on_connect", &self.on_connect), ("on_disconnect", &self.on_disconnect)] {
            if let Err(e) = crate::spec::check_command(key, cmd) {
                check(false, key, e);
            }
        }
        let pass_len = self.srt_passphrase.as_ref().map_or(10, |p| p.chars().count());
        check(
            (10..=79).contains(&pass_len),
            "srt_passphrase",
            format!("srt_passphrase has {pass_len} characters: SRT takes 10 to 79"),
        );
        check(
            matches!(self.srt_pbkeylen, 16 | 24 | 32),
            "srt_pbkeylen",
            format!("srt_pbkeylen {}: 16, 24 or 32 (AES-128, -192, -256)", self.srt_pbkeylen),
        );
        check(
            (20..=10_000).contains(&self.srt_latency_ms),
            "srt_latency_ms",
            format!("srt_latency_ms {} is out of range 20..=10000", self.srt_latency_ms),
        );
        check(
            (0.0..=86_400.0).contains(&self.publisher_grace_s),
            "publisher_grace_s",
            format!("publisher_grace_s {} is out of range 0..=86400", self.publisher_grace_s),
        );
        check(
            (0.0..=604_800.0).contains(&self.upgrade_drain_s),
            "upgrade_drain_s",
            format!("upgrade_drain_s {} is out of range 0..=604800", self.upgrade_drain_s),
        );
        let layout = fanout_proto::container::record::Layout::new(&self.record_path);
        check(layout.is_ok(), "record_path", layout.err().unwrap_or_default());
        check(
            (0.5..=600.0).contains(&self.request_timeout_s),
            "request_timeout_s",
            format!("request_timeout_s {} is out of range 0.5..=600", self.request_timeout_s),
        );
        check(self.api_max_connections >= 1, "api_max_connections", "api_max_connections must be at least 1".into());
        check(
            !self.rtsp_require_token || self.token.is_some(),
            "rtsp_require_token",
            "rtsp_require_token needs a token".into(),
        );
        let max_flush = crate::spec::MAX_STREAM_FLUSH_MS;
        check(
            self.stream_flush_ms <= max_flush,
            "stream_flush_ms",
            format!("stream_flush_ms {} is out of range 0..={max_flush}", self.stream_flush_ms),
        );
        check(self.max_body >= MIN_BODY, "max_body", format!("max_body {} is below {MIN_BODY}", self.max_body));
        check(
            self.token.as_ref().is_none_or(|t| !t.is_empty()),
            "token",
            "token must not be empty (leave it out for an open API)".into(),
        );
        if let Some(c) = &self.cluster {
            if let Err(e) = c.validate() {
                check(false, "cluster", e);
            }
        }
        if let Some(a) = &self.auth {
            if let Err(e) = a.validate() {
                check(false, "auth", e);
            }
        }
        for p in &self.patterns {
            if let Err(e) = p.rule() {
                check(false, "pattern", format!("pattern {e}"));
            }
            check(
                (0.0..=3600.0).contains(&p.linger_s),
                "pattern",
                format!("pattern {:?}: linger_s {} is out of range 0..=3600", p.matches, p.linger_s),
            );
            check(
                (1..=10_000).contains(&p.max_paths),
                "pattern",
                format!("pattern {:?}: max_paths {} is out of range 1..=10000", p.matches, p.max_paths),
            );
            // The template as a name would make it (the pattern's text as the name).
            if let Err(e) = p.session("x") {
                check(false, "pattern", e);
            }
        }
        for ice in &self.webrtc_ice_servers {
            let scheme = ice.url.split(':').next().unwrap_or("");
            let quoted = |v: &Option<String>| v.as_deref().is_none_or(|v| !v.contains(['"', '\\', '\r', '\n']));
            check(
                matches!(scheme, "stun" | "stuns" | "turn" | "turns")
                    && !ice.url.contains(['<', '>', ' ', '"', '\r', '\n'])
                    && quoted(&ice.username)
                    && quoted(&ice.credential)
                    && (scheme.starts_with("turn") == (ice.username.is_some() && ice.credential.is_some())),
                "webrtc_ice_server",
                format!(
                    "webrtc_ice_server {:?}: a stun:, stuns:, turn: or turns: URL (no spaces, quotes or angle brackets); a TURN server needs username and credential, a STUN server neither",
                    ice.url
                ),
            );
        }
        for u in &self.rtsp_users {
            check(
                !u.name.is_empty() && !u.name.contains(':'),
                "rtsp_user",
                format!("rtsp_user name {:?} must be non-empty, without ':'", u.name),
            );
        }
        // A session's problem is at the line of the field it names, else of its table.
        let sessions =
            doc.iter().find(|(k, _)| k.get_ref().as_ref() == "session").and_then(|(_, v)| v.get_ref().as_array());
        for (i, s) in self.sessions.iter().enumerate() {
            let Err(e) = s.validate() else { continue };
            let table = sessions.and_then(|a| a.get(i));
            let l = table.map_or(0, |t| {
                let mut keys = Vec::new();
                collect_keys(t, &mut keys);
                keys.iter()
                    .filter(|(k, _)| e.contains(k.as_str()))
                    .max_by_key(|(k, _)| k.len())
                    .map_or(line(t.span().start), |(_, off)| line(*off))
            });
            errors.push((l, format!("session {:?}: {e}", s.name)));
        }
        // Names are what a reload tells sessions apart by: each once.
        for (i, s) in self.sessions.iter().enumerate() {
            if self.sessions[..i].iter().any(|o| o.name == s.name) {
                let l = sessions.and_then(|a| a.get(i)).map_or(0, |t| line(t.span().start));
                errors.push((l, format!("session {:?} is named twice", s.name)));
            }
        }
        errors
    }
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
    pub fn exposure(&self) -> Result<Vec<String>, String> {
        let mut open = Vec::new();
        // ([auth] decides for every face.)
        let external = self.auth.is_some();
        if !self.api.ip().is_loopback() && self.token.is_none() && !external {
            open.push(format!("the API on {} has no token", self.api));
        }
        let rtsp_auth = !self.rtsp_users.is_empty() || self.rtsp_require_token || external;
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
            return Err(format!(
                "refusing to serve anyone who can reach it: {}; set a token / rtsp_user (docs/config.md), \
                 bind to 127.0.0.1, or set allow_unauthenticated = true (--allow-unauthenticated)",
                open.join("; ")
            ));
        }
        let mut warnings: Vec<String> =
            open.into_iter().map(|o| format!("UNAUTHENTICATED: {o} (allow_unauthenticated)")).collect();
        if self.token.is_some() && self.rtsp.is_some() && !rtsp_auth {
            warnings.push(
                "the API token does not protect RTSP: any RTSP client can play; set rtsp_require_token = true \
                 or add [[rtsp_user]]"
                    .into(),
            );
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

    /// The RTSP users, with `token` as user "token" when `rtsp_require_token` is set.
    /// The users the RTSP server checks itself: none where `[auth]` decides (the RTSP face
    /// then checks Basic credentials before the server sees the request).
    pub fn conn_hooks(&self) -> crate::admit::ConnHooks {
        crate::admit::ConnHooks { on_connect: self.on_connect.clone(), on_disconnect: self.on_disconnect.clone() }
    }

    pub fn rtsp_server_users(&self) -> Vec<(String, String)> {
        if self.auth.is_some() {
            Vec::new()
        } else {
            self.rtsp_credentials()
        }
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

/// Every key of a table and of the tables within it, with its offset.
fn collect_keys(value: &toml::Spanned<toml::de::DeValue>, out: &mut Vec<(String, usize)>) {
    match value.get_ref() {
        toml::de::DeValue::Table(t) => {
            for (k, v) in t.iter() {
                out.push((k.get_ref().to_string(), k.span().start));
                collect_keys(v, out);
            }
        }
        toml::de::DeValue::Array(a) => a.iter().for_each(|v| collect_keys(v, out)),
        _ => {}
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
        assert!(c.exposure().unwrap_err().contains("the API on 0.0.0.0:7070 has no token"));
        c.token = Some("t".into());
        let w = c.exposure().unwrap();
        assert!(w.len() == 1 && w[0].contains("does not protect RTSP"), "{w:?}");
        c.rtsp = Some("[::]:8554".parse().unwrap());
        assert!(c.exposure().unwrap_err().contains("RTSP on [::]:8554"));
        c.allow_unauthenticated = true;
        assert!(c.exposure().unwrap().iter().any(|w| w.starts_with("UNAUTHENTICATED: RTSP")));
        c.allow_unauthenticated = false;
        c.rtsp_require_token = true;
        assert_eq!(c.exposure(), Ok(vec![]));
        assert_eq!(c.rtsp_credentials(), vec![("token".to_string(), "t".to_string())]);
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
        let doc = include_str!("../../../docs/config.md");
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
        assert_eq!(e, vec!["line 5: session \"a\" is named twice".to_string()]);
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
