//! The config's sections besides the top level: `[[pattern]]`, `[auth]`, `[cluster]`, `[tls]`.

use super::*;

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
    /// Its paths' HLS variant, as a session's `hls_variant`.
    #[serde(default)]
    pub hls_variant: crate::spec::HlsVariant,
    /// Servers its paths are pushed to, as a session's `forward` (`{name}` becomes the name).
    #[serde(default)]
    pub forward: Vec<crate::spec::ForwardSpec>,
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
    pub on_forward_start: Option<Vec<String>>,
    pub on_forward_stop: Option<Vec<String>>,
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

    pub fn rule(&self) -> Result<fanout_proto::auth::PathRule, fanout_proto::Invalid> {
        fanout_proto::auth::PathRule::parse(Some(&self.matches))
    }

    /// The session for `name`: the source with `{name}` put in, checked.
    pub fn session(&self, name: &str) -> Result<SessionSpec, fanout_proto::Invalid> {
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
        spec.hls_variant = self.hls_variant;
        spec.forward = self
            .forward
            .iter()
            .map(|f| crate::spec::ForwardSpec { url: f.url.replace("{name}", name), ..f.clone() })
            .collect();
        spec.run_on_ready = self.run_on_ready.clone();
        spec.run_on_not_ready = self.run_on_not_ready.clone();
        spec.run_on_read = self.run_on_read.clone();
        spec.run_on_record_segment_complete = self.run_on_record_segment_complete.clone();
        spec.max_readers = self.max_readers;
        spec.on_read = self.on_read.clone();
        spec.on_unread = self.on_unread.clone();
        spec.on_publish = self.on_publish.clone();
        spec.on_unpublish = self.on_unpublish.clone();
        spec.on_forward_start = self.on_forward_start.clone();
        spec.on_forward_stop = self.on_forward_stop.clone();
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

    pub fn validate(&self) -> Result<(), fanout_proto::Invalid> {
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
            return Err(format!("[auth] timeout_s {} is out of range 0.1..=30", self.timeout_s).into());
        }
        if !(0.0..=3600.0).contains(&self.cache_s) {
            return Err(format!("[auth] cache_s {} is out of range 0..=3600", self.cache_s).into());
        }
        if !(1.0..=86_400.0).contains(&self.jwks_refresh_s) {
            return Err(format!("[auth] jwks_refresh_s {} is out of range 1..=86400", self.jwks_refresh_s).into());
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
    pub fn validate(&self) -> Result<(), fanout_proto::Invalid> {
        let good = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if self.node.is_empty() || self.node.len() > 64 || !self.node.chars().all(good) {
            return Err(format!("[cluster] node {:?}: 1-64 letters, digits, '.', '_' or '-'", self.node).into());
        }
        if self.etcd.is_empty() && self.parents.is_empty() {
            return Err("[cluster] needs `etcd` endpoints, `parents`, or both".into());
        }
        for p in self.parents.iter().chain(&self.rtsp_url) {
            let u = fanout_proto::rtsp::client::Url::parse(p).map_err(|e| format!("[cluster] {p:?}: {e}"))?;
            if u.path != "/" {
                return Err(format!("[cluster] {p:?}: give the relay's base URL (rtsp://host:port), no path").into());
            }
        }
        if !(1..=300).contains(&self.lease_s) {
            return Err(format!("[cluster] lease_s {}: 1 to 300", self.lease_s).into());
        }
        if !(0.0..=3600.0).contains(&self.linger_s) {
            return Err(format!("[cluster] linger_s {}: 0 to 3600", self.linger_s).into());
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') {
            return Err(format!("[cluster] prefix {:?}: starts with '/', does not end with one", self.prefix).into());
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
