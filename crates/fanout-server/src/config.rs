//! The server's typed configuration: `fanout serve` runs without any; `--config fanout.toml`
//! declares the API address, token, engine sizes and static sessions.

use crate::spec::SessionSpec;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the control API and HTTP streams.
    pub api: SocketAddr,
    /// Address for RTSP clients (`rtsp://HOST:PORT/{session}`); none = no RTSP.
    pub rtsp: Option<SocketAddr>,
    /// RTSP clients must authenticate (Basic or Digest) as one of these; none = open.
    #[serde(rename = "rtsp_user")]
    pub rtsp_users: Vec<RtspUser>,
    /// RTSP connections open at once; more are answered 503 and closed.
    pub rtsp_max_connections: usize,
    /// Seconds an RTSP connection may stay silent (unless it carries interleaved RTP).
    pub rtsp_idle_s: f64,
    /// Bearer token required on every API call and stream (none = open; the default API
    /// address is loopback-only).
    pub token: Option<String>,
    /// Worker threads of the engine; 0 = one per core.
    pub workers: usize,
    /// Default ring capacity in packets per session.
    pub ring: usize,
    /// Default largest datagram in bytes.
    pub max_datagram: usize,
    /// Sinks per sink-group task: a session's groups are spread over the workers.
    pub sinks_per_group: usize,
    /// TCP/HTTP sinks are written at most once per this many milliseconds (sessions may
    /// override it); fewer, fuller writes for a bounded delay. 0 = at every packet.
    pub stream_flush_ms: u64,
    /// Data path of sessions that do not name one. With `kernel`, sessions it cannot serve
    /// (not an IPv4 UDP source, or eBPF unavailable here) fall back to `shared`, logged.
    pub datapath: fanout_io::DataPath,
    /// Create the `demo` session (the built-in test pattern) at start.
    pub demo: bool,
    /// Largest API request body in bytes.
    pub max_body: usize,
    /// Static sessions, created at start.
    #[serde(rename = "session")]
    pub sessions: Vec<SessionSpec>,
}

/// See `docs/BENCHMARKS.md` (stream flush): the interval that halves the writes of
/// 256 kbit/s streams.
pub const DEFAULT_STREAM_FLUSH_MS: u64 = 100;

impl Default for Config {
    fn default() -> Self {
        Self {
            api: ([127, 0, 0, 1], 7070).into(),
            rtsp: Some(([127, 0, 0, 1], 8554).into()),
            rtsp_users: Vec::new(),
            rtsp_max_connections: 1024,
            rtsp_idle_s: 60.0,
            token: None,
            workers: 0,
            ring: 1024,
            max_datagram: 2048,
            sinks_per_group: 64,
            datapath: fanout_io::DataPath::Shared,
            stream_flush_ms: DEFAULT_STREAM_FLUSH_MS,
            demo: true,
            max_body: 1024 * 1024,
            sessions: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RtspUser {
    pub name: String,
    pub password: String,
}

impl Config {
    /// Reads and checks a config file; the error names the file, the line and the problem.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let cfg: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        if !(2..=crate::spec::MAX_RING).contains(&cfg.ring) {
            return Err(format!("ring {} is out of range 2..={}", cfg.ring, crate::spec::MAX_RING));
        }
        if !(188..=crate::spec::MAX_DATAGRAM).contains(&cfg.max_datagram) {
            return Err(format!("max_datagram {} is out of range 188..=65535", cfg.max_datagram));
        }
        if cfg.sinks_per_group == 0 {
            return Err("sinks_per_group must be at least 1".into());
        }
        for s in &cfg.sessions {
            s.validate().map_err(|e| format!("session {:?}: {e}", s.name))?;
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn errors_name_the_line() {
        let e = Config::parse("workers = 2\nringg = 5\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("ringg"), "{e}");
        let e = Config::parse("[[session]]\nname = \"x\"\nsource = { udp = \"1.2.3.4\" }\n").unwrap_err();
        assert!(e.contains("line 3"), "{e}");
    }
}
