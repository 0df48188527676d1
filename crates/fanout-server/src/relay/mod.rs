//! The relay's paths as the control plane sees them: creating one makes its first session
//! and starts its source (`crate::source`), deleting one stops everything it started.

mod access;
mod forward;
pub use access::http_login;
mod life;
mod patterns;
mod repack;
mod sinks;

use life::*;
use sinks::*;

use crate::config::Config;
use crate::path::Path;
use crate::spec::{SessionSpec, SinkSpec, SourceSpec};
use fanout_core::Priority;
use fanout_io::{DataPath, Engine, Session, SessionConfig};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use crate::error::RelayError;

/// The sinks the API added, and how many were left at the last pruning.
#[derive(Default)]
struct ApiSinks {
    list: Vec<(Session, u64, SinkSpec)>,
    pruned_len: usize,
}

pub struct Relay {
    pub engine: Engine,
    /// The running configuration: a reload swaps it (`crate::reload`), so it is read where
    /// it is used, through [`Relay::cfg`].
    cfg: RwLock<Arc<Config>>,
    /// The configuration as loaded (before the start filled in bound ports) and how to load
    /// it again: what a reload compares the new file with (`serve` sets it; the lock keeps
    /// reloads one at a time).
    pub(crate) loader: tokio::sync::Mutex<Option<crate::config::Loader>>,
    /// Every stream, by name.
    paths: RwLock<BTreeMap<String, Arc<Path>>>,
    /// Where RTSP clients connect, once listening.
    pub rtsp_addr: parking_lot::Mutex<Option<std::net::SocketAddr>>,
    /// Where RTSPS listens, once bound.
    pub rtsps_addr: parking_lot::Mutex<Option<std::net::SocketAddr>>,
    /// Where RTMP publishers connect, once bound.
    pub rtmp_addr: parking_lot::Mutex<Option<std::net::SocketAddr>>,
    pub rtmps_addr: parking_lot::Mutex<Option<std::net::SocketAddr>>,
    pub srt_addr: parking_lot::Mutex<Option<std::net::SocketAddr>>,
    /// SRT publishers and readers connected now.
    pub srt_links: parking_lot::Mutex<Vec<Arc<crate::clients::SrtLink>>>,
    /// The WebRTC face, once its port is bound.
    pub webrtc: parking_lot::Mutex<Option<Arc<dyn crate::clients::WebRtcFace>>>,
    /// The RTSP side, once listening.
    pub rtsp: parking_lot::Mutex<Option<Arc<dyn RtspFront>>>,
    /// This relay as a node of a cluster (`[cluster]`).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Connections refused (caps), by reason.
    pub books: Arc<crate::admit::Books>,
    /// `[auth]`'s cached answers and keys.
    pub auth: crate::auth::Auth,
    /// Logins whose slow (Argon2) password was verified: a digest of name, password and hash.
    verified: parking_lot::Mutex<std::collections::HashSet<[u8; 32]>>,
    /// The sessions made through the API, kept across restarts (`state_file`); opened
    /// late by a new process of an upgrade, once the old one let it go.
    pub state: std::sync::OnceLock<crate::state::StateFile>,
    /// The binary upgrade's side of the listeners (`crate::upgrade`).
    pub handover: crate::handover::Handover,
    /// The sinks added through the API (or made again from the state file), with their
    /// session: what an upgrade moves to the new process.
    api_sinks: parking_lot::Mutex<ApiSinks>,
    /// Recordings on disk (`record_path`).
    pub recordings: Arc<crate::record::Store>,
    /// Per `[[pattern]]` (by its `match`), the paths it has now.
    pattern_paths: parking_lot::Mutex<std::collections::HashMap<String, Arc<std::sync::atomic::AtomicUsize>>>,
}

/// One of a pattern's paths, counted while it lives.
struct PatternSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for PatternSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The RTSP server as the relay and the API see it. It sits above the relay (it asks the
/// relay for sessions) and implements this, so the relay does not import it.
pub trait RtspFront: Send + Sync {
    /// Ends the stream for every client of `name`: an RTCP BYE on each track, then the
    /// connection closes.
    fn end_resource(&self, name: &str);
    /// Its clients, as `GET /v1/rtsp` shows them.
    fn clients(&self) -> Vec<crate::clients::ClientStatus>;
    /// The users requests are checked against from now on (a reload).
    fn set_users(&self, users: Vec<(String, String)>);
    /// Serves an RTSP-over-HTTP tunnel's connection until it ends.
    fn serve_tunnel(
        &self,
        relay: Arc<Relay>,
        tunnel: crate::tunnel::Tunnel,
        peer: std::net::SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

impl crate::upstream::Host for Relay {
    fn engine(&self) -> &Engine {
        &self.engine
    }
}

impl Relay {
    pub fn new(cfg: Config) -> anyhow::Result<Arc<Self>> {
        let engine = Engine::start(cfg.engine_options()?)?;
        engine.set_kernel_sinks(cfg.kernel_sinks);
        let cluster = cfg.cluster.clone().map(|c| crate::cluster::Cluster::new(c, cfg.rtsp)).transpose()?;
        let layout = fanout_proto::container::record::Layout::new(&cfg.record_path).map_err(anyhow::Error::msg)?;
        let relay = Arc::new(Self {
            state: Default::default(),
            handover: Default::default(),
            api_sinks: Default::default(),
            recordings: Arc::new(crate::record::Store::new(layout)),
            pattern_paths: Default::default(),
            cluster,
            books: {
                let books = crate::admit::Books::new(cfg.max_connections_per_ip);
                books.set_failed_login_limit(cfg.max_failed_logins);
                books.set_conn_hooks(cfg.on_connect.clone(), cfg.on_disconnect.clone());
                Arc::new(books)
            },
            auth: Default::default(),
            verified: Default::default(),
            engine,
            cfg: RwLock::new(Arc::new(cfg)),
            loader: Default::default(),
            paths: RwLock::new(BTreeMap::new()),
            rtsp_addr: Default::default(),
            rtsps_addr: Default::default(),
            rtmp_addr: Default::default(),
            rtmps_addr: Default::default(),
            srt_addr: Default::default(),
            srt_links: Default::default(),
            webrtc: Default::default(),
            rtsp: Default::default(),
        });
        if let Some(p) = relay.cfg().state_file.as_deref() {
            relay.open_state(p)?;
        }
        Ok(relay)
    }

    /// Opens (and locks) the state file at `path` ('' keeps none); another relay holding
    /// it leaves this one without (logged).
    pub fn open_state(&self, path: &std::path::Path) -> anyhow::Result<()> {
        if path.as_os_str().is_empty() {
            return Ok(());
        }
        if let Some(st) = crate::state::StateFile::open(path)? {
            let _ = self.state.set(st);
        }
        Ok(())
    }

    /// The running configuration.
    pub fn cfg(&self) -> Arc<Config> {
        self.cfg.read().clone()
    }

    pub(crate) fn set_cfg(&self, cfg: Config) {
        *self.cfg.write() = Arc::new(cfg);
    }

    /// What a path's hooks find in their environment: its name, and where to publish it
    /// or play it.
    pub fn hook_env(&self, name: &str) -> Vec<(&'static str, String)> {
        let rtsp = self.rtsp_addr.lock().map(|a| format!("rtsp://{a}/{name}")).unwrap_or_default();
        let rtmp = self.rtmp_addr.lock().map(|a| format!("rtmp://{a}/live/{name}")).unwrap_or_default();
        vec![("FANOUT_PATH", name.to_string()), ("FANOUT_RTSP_URL", rtsp), ("FANOUT_RTMP_URL", rtmp)]
    }

    /// The path of a stream name.
    pub fn path(&self, name: &str) -> Option<Arc<Path>> {
        self.paths.read().get(name).cloned()
    }

    pub fn paths(&self) -> Vec<Arc<Path>> {
        self.paths.read().values().cloned().collect()
    }

    /// The path of a stream name, or why not.
    fn found(&self, name: &str) -> Result<Arc<Path>, RelayError> {
        self.path(name).ok_or_else(|| no_such(name))
    }

    /// A path's first session.
    pub fn session(&self, name: &str) -> Result<Session, RelayError> {
        self.found(name).map(|p| p.session.clone())
    }

    pub fn sessions(&self) -> Vec<Session> {
        self.paths.read().values().map(|p| p.session.clone()).collect()
    }

    /// Every path's publisher side.
    pub fn publishers(&self) -> Vec<Arc<crate::publish::Publisher>> {
        self.paths.read().values().filter_map(|p| p.publisher().cloned()).collect()
    }

    /// The stream of `name` ended (a file played once, a publisher gone past its grace):
    /// every reader is told its protocol's way (RTSP clients an RTCP BYE and the close, HTTP
    /// streams their end, RTMP players the play's end, SRT and WebRTC the close), HLS players
    /// by the playlist's end, and the recording's file completes. The path stays (a publisher
    /// may come back; the file's status says it ended).
    pub fn end_players(&self, name: &str) {
        let Some(path) = self.path(name) else { return };
        let repack = path.repack_running();
        if let Some(hls) = repack.as_ref().and_then(|r| r.hls.clone()) {
            hls.finish();
        }
        if let Some(r) = repack.as_ref().and_then(|r| r.record.clone()) {
            r.finish();
        }
        let told = path.readers.close_all_but("the stream ended", crate::readers::Protocol::Hls);
        tracing::info!(session = name, readers = told, "the stream ended: its readers were told");
    }

    pub async fn shutdown(&self) {
        let names: Vec<String> = self.paths.read().keys().cloned().collect();
        for n in names {
            let _ = self.delete(&n).await;
        }
    }
}

fn no_such(name: &str) -> RelayError {
    RelayError::NotFound(format!("no session named {name:?}"))
}

/// What the cluster learns of this relay: its sessions as channels, and its load.
impl crate::cluster::Local for Relay {
    fn channels(&self) -> Vec<crate::cluster::LocalChannel> {
        self.paths()
            .into_iter()
            .map(|p| {
                let mut codecs: Vec<String> = p
                    .sdp()
                    .iter()
                    .flat_map(|s| &s.media)
                    .filter_map(|m| m.formats.first().and_then(|f| m.rtpmap(f)).map(|(e, c)| format!("{e}/{c}")))
                    .collect();
                if codecs.is_empty() {
                    codecs.extend(p.spec().video.map(|v| format!("{v:?}/90000").to_uppercase()));
                }
                let playing = p.upstream().is_some_and(|u| u.status().state == "playing");
                let bytes_in = p.session.status().source.bytes;
                crate::cluster::LocalChannel { name: p.name.clone(), codecs, bytes_in, playing }
            })
            .collect()
    }

    fn counters(&self) -> (u64, u64, u64) {
        let paths = self.paths();
        let mut all: BTreeMap<String, Session> =
            paths.iter().map(|p| (p.session.name().to_string(), p.session.clone())).collect();
        for p in &paths {
            for t in p.tracks() {
                all.entry(t.session.name().to_string()).or_insert(t.session);
            }
        }
        let bytes = all.values().map(|s| s.status().delivered_bytes_total).sum();
        // Subscribers are the paths' readers, every face's (the relay's own sinks, a
        // repackaging's or an SRTP epoch's, are none).
        let subscribers = paths.iter().map(|p| p.readers.len() as u64).sum();
        (paths.len() as u64, subscribers, bytes)
    }
}
