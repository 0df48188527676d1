//! The relay's paths as the control plane sees them: creating one makes its first session
//! and starts its source (`crate::source`), deleting one stops everything it started.

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
                books.set_conn_hooks(cfg.conn_hooks());
                Arc::new(books)
            },
            auth: Default::default(),
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

    /// Makes sure a session named `name` exists: when it does not, the first `[[pattern]]`
    /// it matches makes it; else, where this relay is a cluster node, the channel is looked
    /// up and pulled from the node that serves it best.
    pub async fn ensure(self: &Arc<Self>, name: &str) -> Result<(), RelayError> {
        use crate::cluster::LookupError;
        if let Some(p) = self.path(name) {
            // A pull that just ended (linger) is about to go: it goes now, and a new pull
            // serves the one who asked, instead of a session deleted under it.
            if !p.upstream().is_some_and(|u| u.finished()) {
                return Ok(());
            }
            self.delete_exact(name, &p.session).await;
        }
        if let Some(p) = self.pattern(name) {
            return self.from_pattern(name, p, false).await;
        }
        let Some(cluster) = &self.cluster else {
            return Err(no_such(name));
        };
        let choice = cluster.locate(name).await.map_err(|e| match e {
            LookupError::NotFound(why) => RelayError::NotFound(why),
            LookupError::Down(why) => RelayError::Down(why),
        })?;
        let source = SourceSpec::Rtsp(crate::spec::RtspSource {
            url: choice.url.clone(),
            transport: Some(cluster.cfg.pull_transport),
            on_demand: Some(true),
            linger_s: Some(cluster.cfg.linger_s),
            tls_ca: cluster.cfg.tls_ca.clone(),
            ..Default::default()
        });
        tracing::info!(channel = name, from = %choice.node, url = %choice.url, "pulling a channel");
        cluster.begin_pull(name, &choice);
        match self.create_with(crate::spec::SessionSpec::new(name, source), Some(cluster.origin(name))).await {
            // Someone else's request made it first.
            Ok(_) | Err(RelayError::Conflict(_)) => Ok(()),
            Err(e) => {
                cluster.end_pull(name);
                Err(e)
            }
        }
    }

    /// The first `[[pattern]]` that matches `name`.
    fn pattern(&self, name: &str) -> Option<crate::config::PatternSpec> {
        self.cfg().patterns.iter().find(|p| p.rule().is_ok_and(|r| r.matches(name))).cloned()
    }

    /// Whether a path has `name`, or a pattern would make it.
    pub fn knows(&self, name: &str) -> bool {
        self.path(name).is_some() || self.pattern(name).is_some()
    }

    /// Whether a publisher may make `name`: no path has it, and the first pattern it
    /// matches takes publishers (`source = { publish = true }`).
    pub fn publishable_by_pattern(&self, name: &str) -> bool {
        self.path(name).is_none() && self.pattern(name).is_some_and(|p| matches!(p.source, SourceSpec::Publish { .. }))
    }

    /// Before a publisher's request for `name` (ANNOUNCE, RTMP publish, SRT, WHIP): a name
    /// no path has, which a pattern of publishers matches, is made now (any stream key an
    /// encoder pushes, as MediaMTX's `all_others`). Such a path lasts while it is published
    /// or read, then `linger_s`.
    pub async fn ensure_publishable(self: &Arc<Self>, name: &str) {
        let publish = |p: &crate::config::PatternSpec| matches!(p.source, SourceSpec::Publish { .. });
        let Some(p) = self.pattern(name).filter(|p| publish(p) && self.path(name).is_none()) else { return };
        if let Err(e) = self.from_pattern(name, p, true).await {
            tracing::warn!(path = name, "a publisher's path could not be made: {e}");
        }
    }

    /// Makes `name`'s path from pattern `p`; starts its `run_on_demand` command, and waits
    /// for the publisher that command starts (so that the one who asked gets a stream).
    /// The path goes `linger_s` after its last reader (or, made for a publisher, after its
    /// publisher and last reader left), its command with it.
    async fn from_pattern(
        self: &Arc<Self>,
        name: &str,
        p: crate::config::PatternSpec,
        for_publisher: bool,
    ) -> Result<(), RelayError> {
        let spec = p.session(name).map_err(RelayError::BadRequest)?;
        let count = self.pattern_paths.lock().entry(p.matches.clone()).or_default().clone();
        use std::sync::atomic::Ordering::SeqCst;
        if count.fetch_update(SeqCst, SeqCst, |n| (n < p.max_paths).then_some(n + 1)).is_err() {
            return Err(RelayError::Down(format!(
                "pattern {:?} has its max_paths ({}) paths now; {name:?} can be made when one ends",
                p.matches, p.max_paths
            )));
        }
        let slot = PatternSlot(count);
        let session = match self.create(spec).await {
            Ok(s) => s,
            Err(RelayError::Conflict(_)) => return Ok(()), // another request made it first
            Err(e) => return Err(e),
        };
        tracing::info!(path = name, pattern = p.matches, "path made on demand");
        let hook = match &p.run_on_demand {
            Some(cmd) => match crate::hook::Hook::spawn("run_on_demand", cmd, name, &self.hook_env(name)) {
                Ok(h) => Some(h),
                Err(e) => {
                    self.delete_exact(name, &session).await;
                    return Err(RelayError::Internal(format!("run_on_demand for {name:?}: {e}")));
                }
            },
            None => None,
        };
        if let (Some(_), Some(publisher)) = (&hook, self.path(name).and_then(|p| p.publisher().cloned())) {
            let t0 = std::time::Instant::now();
            while publisher.sdp().is_none() && t0.elapsed() < ON_DEMAND_START {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let linger = Duration::from_secs_f64(p.linger_s);
        let watch = Unwatched { name: name.to_string(), session, hook, linger, slot, for_publisher };
        tokio::spawn(end_unwatched(Arc::downgrade(self), watch));
        Ok(())
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

    /// Caps a sink's layers (see `fanout_io::Session::pin_sink_layers`). The sink is looked
    /// for in the session and, for RTSP clients, in its track sessions.
    pub fn pin_layers(
        &self,
        name: &str,
        id: u64,
        pin: Option<fanout_proto::codec::layers::Layer>,
    ) -> Result<fanout_io::SinkStatus, RelayError> {
        use fanout_io::session::LayerError;
        let mut sessions = vec![self.session(name)?];
        sessions.extend(self.tracks(name).into_iter().map(|t| t.session).filter(|t| t.name() != name));
        let mut not_layered = false;
        for s in sessions {
            match s.pin_sink_layers(id, pin) {
                Ok(()) => return s.sink_status(id).ok_or_else(|| RelayError::NotFound(format!("sink {id} left"))),
                Err(LayerError::NoSink) => {}
                Err(LayerError::NotLayered) => not_layered |= s.sink_status(id).is_some(),
                Err(e) => return Err(RelayError::BadRequest(format!("sink {id}: {e}"))),
            }
        }
        Err(match not_layered {
            true => RelayError::BadRequest(format!("sink {id}: {}", LayerError::NotLayered)),
            false => RelayError::NotFound(format!("session {name:?} has no sink {id}")),
        })
    }

    /// Whether a client may do what it asks. `local`: whether the face's own credentials
    /// (the token, the stream users) matched, `None` where that face has none configured.
    /// They are asked first; then `[auth]`, where configured; with neither, anyone may.
    /// An address that failed too often lately is refused whatever it gives; a request that
    /// gave credentials and is refused counts as a failed login of its address.
    pub async fn permit(&self, local: Option<bool>, req: fanout_proto::auth::Request) -> bool {
        if self.books.login_banned(req.ip) {
            return false;
        }
        if local == Some(true) {
            return true;
        }
        let ok = match &self.cfg().auth {
            Some(a) => self.auth.check(a, &req).await,
            None => local.is_none(),
        };
        // (A first request without credentials, answered with a challenge, is no guess.)
        let gave = !(req.user.is_empty() && req.password.is_empty() && req.token.is_empty());
        if !ok && gave {
            self.books.failed_login(req.protocol, req.ip);
        }
        ok
    }

    /// Whether `user` and `pass` are one of the stream users (RTSP's, which RTMP, SRT and
    /// WebRTC take too, with `token` and the API token where RTSP requires it); `None`
    /// where there are none.
    pub fn stream_login(&self, user: Option<&str>, pass: Option<&str>) -> Option<bool> {
        let users = self.cfg().rtsp_credentials();
        if users.is_empty() {
            return None;
        }
        let (Some(user), Some(pass)) = (user, pass) else { return Some(false) };
        // Every user is compared, so the time taken does not tell which names exist.
        Some(users.iter().fold(false, |ok, (u, p)| {
            let hit = fanout_proto::secret::ct_eq(u.as_bytes(), user.as_bytes())
                & fanout_proto::secret::ct_eq(p.as_bytes(), pass.as_bytes());
            ok | hit
        }))
    }

    /// A path's tracks (none if there is no such path).
    pub fn tracks(&self, name: &str) -> Vec<crate::track::TrackRef> {
        self.path(name).map(|p| p.tracks()).unwrap_or_default()
    }

    /// The session an HTTP subscriber of `name` joins: its MPEG-TS repackaging where it
    /// carries RTP video or audio (started now if need be), else the session itself, whose
    /// payloads go out as they came (an MPEG-TS source, or anything else, udpxy-style).
    pub async fn http_session(self: &Arc<Self>, name: &str) -> Result<Session, RelayError> {
        self.ensure(name).await?;
        let path = self.found(name)?;
        if path.view().is_some() || !path.is_rtp_media() {
            return Ok(path.session.clone());
        }
        self.repack(name).await?.ts.clone().ok_or_else(|| RelayError::Internal("no MPEG-TS output".into()))
    }

    /// The session's repackaging (MPEG-TS for HTTP where its stream URL needs it, HLS where
    /// its tracks allow), started if it is not running.
    pub async fn repack(self: &Arc<Self>, name: &str) -> Result<Arc<crate::repack::Repack>, RelayError> {
        self.ensure(name).await?;
        let path = self.found(name)?;
        if let Some(r) = path.repack_running() {
            return Ok(r);
        }
        let session = &path.session;
        let mut inputs = Vec::new();
        let mut why = Vec::new();
        let mut add = |m: &fanout_proto::rtsp::sdp::Media, t: crate::track::TrackRef| {
            let info = fanout_proto::container::repack::TrackInfo::from_sdp(m).map_err(|e| why.push(e)).ok();
            inputs.push(crate::repack::Input { session: t.session, info, clock_map: t.clock_map });
        };
        if let Some(view) = path.view() {
            view.sdp.media.iter().zip(view.tracks.clone()).for_each(|(m, t)| add(m, t));
        } else if let Some(up) = path.upstream() {
            let Some(sdp) = up.demand(Duration::from_secs(5)).await else {
                return Err(RelayError::Peer(format!(
                    "the upstream of {name:?} did not describe its stream within 5 s ({})",
                    up.status().last_error.unwrap_or_else(|| "no answer".into())
                )));
            };
            sdp.media.iter().zip(up.tracks()).for_each(|(m, t)| add(m, t));
        } else if let Some(p) = path.publisher() {
            let Some(sdp) = p.sdp() else {
                return Err(RelayError::Peer(format!("nothing is published to {name:?} now")));
            };
            sdp.media.iter().zip(p.tracks()).for_each(|(m, t)| add(m, t));
        } else if let Some(video) = path.spec().video {
            let codec = fanout_proto::container::repack::TrackCodec::Video { codec: video.codec(), params: Vec::new() };
            let info = Some(fanout_proto::container::repack::TrackInfo { codec, clock: 90_000 });
            inputs.push(crate::repack::Input { session: session.clone(), info, clock_map: None });
        } else {
            return Err(RelayError::Unsupported(format!(
                "session {name:?} carries datagrams of no known format (set `video` for RTP video); \
                 its stream URL delivers them as they came"
            )));
        }
        if inputs.iter().all(|i| i.info.is_none()) {
            return Err(RelayError::Unsupported(format!(
                "session {name:?} has no track HTTP players can take: {}; play it over RTSP",
                why.join("; ")
            )));
        }
        let linger = Duration::from_secs_f64(path.spec().source.linger_s());
        let tracks_of = {
            let path = Arc::downgrade(&path);
            move || path.upgrade().map(|p| p.tracks().iter().map(|t| t.clock_map).collect()).unwrap_or_default()
        };
        let with_ts = path.view().is_none();
        let record = path.spec().record;
        let weak = Arc::downgrade(&path);
        let on_stop = move || {
            if let Some(path) = weak.upgrade() {
                path.repack_stopped();
            }
        };
        let r = path.keep_repack(|| {
            crate::repack::Repack::start(
                name,
                session.config(),
                &self.engine,
                inputs,
                with_ts,
                record.map(|spec| crate::record::RecordTo {
                    store: self.recordings.clone(),
                    spec,
                    on_complete: path.spec().run_on_record_segment_complete.map(|cmd| (cmd, self.hook_env(name))),
                }),
                tracks_of,
                linger,
                on_stop,
            )
            .map_err(|e| RelayError::Internal(format!("repackaging: {e}")))
        })?;
        for w in &why {
            tracing::info!(session = name, "left out of the repackaging: {w}");
        }
        Ok(r)
    }

    /// The session's data path: the one it names, which must work here, or the server's
    /// default, which falls back to `shared` where it cannot serve the session.
    fn datapath_for(&self, spec: &SessionSpec) -> Result<DataPath, RelayError> {
        let udp4 = spec.source.kernel_capable();
        // The eBPF program spreads a packet's clones over a shared link by EDT departure
        // times, which only the fq qdisc honours: say so where fq is not even loaded.
        let shared_link =
            spec.pace_link == Some(crate::spec::PaceLink::Shared) && spec.pacing == crate::spec::Pacing::On;
        let fq = std::path::Path::new("/sys/module/sch_fq").exists();
        if spec.pace_with == Some(crate::spec::PaceWith::Txtime) && !fq {
            tracing::warn!(
                session = %spec.name,
                "pace_with = \"txtime\": no fq qdisc is loaded, so the departure times are not honoured and paced \
                 datagrams leave up to a quarter of a second early (modprobe sch_fq; tc qdisc replace dev IFACE root fq)"
            );
        }
        let warn_unpaced = |dp: DataPath| {
            if dp == DataPath::Kernel && shared_link && !fq {
                tracing::warn!(
                    session = %spec.name,
                    "pace_link = \"shared\" on the kernel path: no fq qdisc is loaded, so the clones' departure \
                     times are not honoured and they leave back to back (modprobe sch_fq; tc qdisc replace dev IFACE \
                     root fq)"
                );
            }
            dp
        };
        match spec.datapath {
            Some(DataPath::Kernel) => match self.engine.kernel() {
                Ok(_) => Ok(warn_unpaced(DataPath::Kernel)),
                Err(why) => Err(RelayError::Unavailable(why)),
            },
            Some(dp) => Ok(dp),
            None if self.cfg().datapath != DataPath::Kernel => Ok(self.cfg().datapath),
            None => {
                let why = match self.engine.kernel() {
                    Ok(_) if udp4 => return Ok(warn_unpaced(DataPath::Kernel)),
                    Ok(_) => "its source is not IPv4 UDP".to_string(),
                    Err(why) => why,
                };
                tracing::warn!(session = %spec.name, "datapath \"shared\" instead of \"kernel\": {why}");
                Ok(DataPath::Shared)
            }
        }
    }

    /// Creates a session and starts its source; sinks in the spec are added too.
    pub async fn create(self: &Arc<Self>, spec: SessionSpec) -> Result<Session, RelayError> {
        self.create_with(spec, None).await
    }

    /// `origin`: the session pulls a cluster channel; its upstream's URL comes from there,
    /// and the session is deleted when the pull ends.
    async fn create_with(
        self: &Arc<Self>,
        spec: SessionSpec,
        origin: Option<Arc<dyn crate::upstream::Origin>>,
    ) -> Result<Session, RelayError> {
        spec.validate().map_err(RelayError::BadRequest)?;
        if self.paths.read().contains_key(&spec.name) {
            return Err(RelayError::Conflict(format!("a session named {:?} already exists", spec.name)));
        }
        let datapath = self.datapath_for(&spec)?;
        let reserve = spec.reserve_kbps.unwrap_or(0) * 1000 / 8;
        if self.engine.egress().is_some() && matches!(datapath, DataPath::Kernel | DataPath::Daemon) {
            let path = if datapath == DataPath::Kernel { "kernel" } else { "daemon" };
            if reserve > 0 {
                return Err(RelayError::BadRequest(format!(
                    "reserve_kbps: the {path} data path does not send through the shared egress (egress_kbps); \
                     use shared, copy or uring"
                )));
            }
            tracing::warn!(session = %spec.name, "the {path} data path's traffic is not counted by egress_kbps");
        }
        if reserve > 0 {
            let Some(egress) = self.engine.egress() else {
                return Err(RelayError::BadRequest(
                    "reserve_kbps needs a limited egress (the relay's egress_kbps) to reserve from".into(),
                ));
            };
            let (link, reserved) = {
                let e = egress.link.lock();
                (e.rate(), e.reserved())
            };
            if reserved + reserve > link {
                return Err(RelayError::Conflict(format!(
                    "reserve_kbps {}: only {} of the egress's {} kbit/s are not reserved yet",
                    spec.reserve_kbps.unwrap_or(0),
                    (link - reserved) * 8 / 1000,
                    link * 8 / 1000
                )));
            }
        }
        let defaults = self.cfg();
        let max_datagram = spec.max_datagram.unwrap_or(defaults.max_datagram);
        let pacing = spec.pace_config(max_datagram).map_err(RelayError::BadRequest)?;
        let cfg = SessionConfig {
            name: spec.name.clone(),
            // Invariant: validate() checked the range.
            priority: Priority::new(spec.priority).expect("validated"),
            datapath,
            ring_capacity: spec.ring.unwrap_or(defaults.ring),
            max_datagram,
            sinks_per_group: spec.sinks_per_group.unwrap_or(defaults.sinks_per_group),
            payload: spec.payload,
            failed_sinks: spec.failed_sinks,
            udp_sinks: spec.udp_sinks,
            uring_sqpoll: spec.uring_sqpoll,
            kernel_spread: spec.kernel_spread,
            source_recv: spec.source_recv,
            stream_flush: Duration::from_millis(spec.stream_flush_ms.unwrap_or(defaults.stream_flush_ms)),
            pacing,
            reserve,
        };
        let session = Session::new(cfg, &self.engine);
        session.set_rtp_video(spec.video.map(|v| v.codec().into()));
        let mut tasks = Vec::new();
        if spec.failed_sinks == fanout_io::FailurePolicy::Retry {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            session.on_sink_failed(move |id, addr| {
                let _ = tx.send((id, addr));
            });
            tasks.push(tokio::spawn(reconnect_sinks(rx, session.clone())).abort_handle());
        }
        let on_pull_end: Option<Box<dyn FnOnce() + Send + Sync>> = origin.is_some().then(|| {
            let (weak, name, mine) = (Arc::downgrade(self), spec.name.clone(), session.clone());
            // A pull ended: the path goes (on a task of its own, as deleting it aborts the
            // pull's); this path, not a newer pull of the same name a subscriber set off.
            Box::new(move || {
                if let Some(relay) = weak.upgrade() {
                    tokio::spawn(async move { relay.delete_exact(&name, &mine).await });
                }
            }) as _
        });
        let cx = crate::source::Ctx {
            name: &spec.name,
            session: &session,
            engine: &self.engine,
            cfg: &defaults,
            host: Arc::downgrade(self) as _,
            origin,
            on_pull_end,
        };
        let started = match crate::source::start(&spec.source, cx).await {
            Ok(s) => s,
            Err(e) => {
                abort(&tasks);
                close(session).await;
                return Err(e);
            }
        };
        tasks.extend(started.tasks.iter().cloned());
        let mut sinks = Vec::new();
        for s in &spec.sinks {
            match add_sink(&session, s).await {
                Ok(id) => sinks.push((id, s.clone())),
                Err(e) => {
                    abort(&tasks);
                    started.feeder.close_tracks().await;
                    close(session).await;
                    return Err(e);
                }
            }
        }
        let name = spec.name.clone();
        // A file played once and a publisher's stream can end: their players are told.
        if spec.source.can_end() {
            let file = spec.source.is_file();
            tasks.push(tokio::spawn(end_when_over(Arc::downgrade(self), name.clone(), file)).abort_handle());
        }
        let path = Arc::new(Path::new(spec, session.clone(), started.feeder, tasks));
        for (id, s) in &sinks {
            if let Err(full) = sink_reader(&path, &session, *id, s) {
                tracing::warn!(session = %name, sink = id, "a configured sink past max_readers, kept: {full}");
            }
        }
        let inserted = {
            let mut map = self.paths.write();
            let free = !map.contains_key(&name);
            if free {
                map.insert(name.clone(), path.clone());
            }
            free
        };
        if !inserted {
            // Lost a race with a concurrent create of the same name.
            path.close().await;
            return Err(RelayError::Conflict(format!("a session named {name:?} already exists")));
        }
        tracing::info!(session = %name, datapath = ?datapath, "session created");
        Ok(session)
    }

    /// Deletes session `name` if it is still `session` (the generation that asked), not a
    /// newer one of the same name.
    pub async fn delete_exact(&self, name: &str, session: &Session) {
        if self.path(name).is_some_and(|p| p.session.is(session)) {
            let _ = self.delete(name).await;
        }
    }

    pub async fn delete(&self, name: &str) -> Result<(), RelayError> {
        tracing::info!(session = name, "deleting session");
        if let Some(c) = &self.cluster {
            c.end_pull(name);
        }
        let path = self.paths.write().remove(name).ok_or_else(|| no_such(name))?;
        self.api_sinks.lock().list.retain(|(s, _, _)| !s.is(&path.session));
        let rtsp = self.rtsp.lock().clone();
        if let Some(r) = rtsp {
            r.end_resource(name);
        }
        if let Some(w) = self.webrtc.lock().clone() {
            w.end_path(name, true);
        }
        path.close().await;
        Ok(())
    }

    pub async fn add_sink(self: &Arc<Self>, name: &str, spec: &SinkSpec) -> Result<u64, RelayError> {
        spec.validate().map_err(RelayError::BadRequest)?;
        self.ensure(name).await?;
        let path = self.found(name)?;
        if path.readers.full() {
            return Err(RelayError::Full(format!("{name} has its max_readers")));
        }
        let session = path.session.clone();
        let id = add_sink(&session, spec).await?;
        if let Err(full) = sink_reader(&path, &session, id, spec) {
            session.remove_sink(id);
            return Err(full.into());
        }
        tracing::info!(session = name, sink = id, udp = ?spec.udp, tcp = ?spec.tcp, "sink added");
        let mut api = self.api_sinks.lock();
        // Sinks that went (removed, their session replaced) are pruned once the list has
        // doubled: asking each whether it is still there costs a `kernel` sink a syscall,
        // and doing it at every add made adding the nth sink cost n of them (40,000 sinks
        // took minutes).
        if api.list.len() >= 2 * api.pruned_len.max(64) {
            api.list.retain(|(s, id, _)| self.still(s, *id));
            api.pruned_len = api.list.len();
        }
        api.list.push((session, id, spec.clone()));
        Ok(id)
    }

    /// Whether sink `id` of `session` is still there, on a session still serving.
    fn still(&self, session: &Session, id: u64) -> bool {
        self.session(session.name()).is_ok_and(|s| s.is(session)) && session.sink_status(id).is_some()
    }

    /// The sinks added through the API that are still there: (path, sink id, spec).
    pub fn api_sinks(&self) -> Vec<(String, u64, SinkSpec)> {
        let mut api = self.api_sinks.lock();
        api.list.retain(|(s, id, _)| self.still(s, *id));
        api.pruned_len = api.list.len();
        api.list.iter().map(|(s, id, spec)| (s.name().to_string(), *id, spec.clone())).collect()
    }

    /// Makes again the sessions the state file kept (after the config's: a name the config
    /// now gives is the config's), with their sinks; returns how many. One that cannot be
    /// made again (its file gone, its port taken) is logged with its spec, and not kept.
    pub async fn restore(self: &Arc<Self>) -> usize {
        let Some(state) = self.state.get() else { return 0 };
        let mut made = 0;
        for k in state.take() {
            let name = k.spec.name.clone();
            let spec = serde_json::to_string(&k.spec).unwrap_or_default();
            if self.session(&name).is_ok() {
                tracing::warn!(session = name, "a kept session is not made again: the config has one of that name");
                continue;
            }
            if let Err(e) = self.create(k.spec.clone()).await {
                tracing::warn!(session = name, spec, "a kept session could not be made again, and is dropped: {e}");
                continue;
            }
            state.session_made(&k.spec);
            made += 1;
            for sink in k.sinks.values() {
                match self.add_sink(&name, sink).await {
                    Ok(id) => state.sink_added(&name, id, sink),
                    Err(e) => {
                        tracing::warn!(session = name, udp = ?sink.udp, tcp = ?sink.tcp, "a kept sink could not be added again: {e}")
                    }
                }
            }
        }
        state.save();
        made
    }

    pub async fn shutdown(&self) {
        let names: Vec<String> = self.paths.read().keys().cloned().collect();
        for n in names {
            let _ = self.delete(&n).await;
        }
    }
}

/// Watches a session that can end (`file`: a file played once; else a publisher's) and
/// tells its players when it does: a file 1 s after its last packet (the ring's last
/// packets go out first), a publisher's after `publisher_grace_s` without one. A publisher
/// who comes back in time changes nothing for the players.
async fn end_when_over(relay: std::sync::Weak<Relay>, name: String, file: bool) {
    let mut over_since: Option<std::time::Instant> = None;
    let mut told = false;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let Some(relay) = relay.upgrade() else { return };
        let over = match file {
            true => relay.session(&name).is_ok_and(|s| s.source_state() == fanout_io::SourceState::Closed),
            false => relay.path(&name).is_some_and(|p| p.publisher().is_some_and(|p| p.ended())),
        };
        if !over {
            (over_since, told) = (None, false);
            continue;
        }
        let since = *over_since.get_or_insert_with(std::time::Instant::now);
        let wait = if file { Duration::from_secs(1) } else { Duration::from_secs_f64(relay.cfg().publisher_grace_s) };
        if !told && since.elapsed() >= wait {
            relay.end_players(&name);
            told = true;
            if file {
                return;
            }
        }
    }
}

/// How long one who asked for an on-demand path waits for the publisher its command starts.
const ON_DEMAND_START: Duration = Duration::from_secs(15);

/// Watches a path a pattern made: once nobody has read it for `linger` (no sink on any of
/// its tracks: RTSP clients, HTTP subscribers, the repackaging for HLS, RTMP and WebRTC
/// while it runs), it is deleted and its command stopped; the command goes with the path
/// whoever deletes it.
/// A pattern's path, until nobody uses it.
struct Unwatched {
    name: String,
    session: Session,
    hook: Option<crate::hook::Hook>,
    linger: Duration,
    /// Held while the path lives: the pattern's count.
    slot: PatternSlot,
    /// Made for a publisher: its publishing keeps it too.
    for_publisher: bool,
}

async fn end_unwatched(relay: std::sync::Weak<Relay>, w: Unwatched) {
    let Unwatched { name, session, mut hook, linger, slot, for_publisher } = w;
    let mut idle_since = std::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(relay) = relay.upgrade() else { break };
        let Some(path) = relay.path(&name).filter(|p| p.session.is(&session)) else { break };
        if let Some(h) = hook.as_mut() {
            if !h.running() {
                hook = None;
            }
        }
        let readers: usize = path.tracks().iter().map(|t| t.session.sinks().len()).sum();
        let published = for_publisher && path.publisher().is_some_and(|p| p.publishing());
        if readers > 0 || published {
            idle_since = std::time::Instant::now();
        } else if idle_since.elapsed() >= linger {
            tracing::info!(path = name, "on-demand path ends: nobody read it for {linger:?}");
            relay.delete_exact(&name, &session).await;
            break;
        }
    }
    drop(slot);
    if let Some(h) = hook {
        h.stop().await;
    }
}

fn no_such(name: &str) -> RelayError {
    RelayError::NotFound(format!("no session named {name:?}"))
}

fn abort(tasks: &[tokio::task::AbortHandle]) {
    for t in tasks {
        t.abort();
    }
}

/// Closing joins the session's threads: keep that off the async runtime.
async fn close(session: Session) {
    let _ = tokio::task::spawn_blocking(move || session.close()).await;
}

/// Whether the kernel routes `addr` as a broadcast (the limited one, or a local subnet's):
/// connecting a socket without SO_BROADCAST there fails with EACCES.
fn is_broadcast_route(addr: std::net::SocketAddr) -> bool {
    addr.is_ipv4()
        && std::net::UdpSocket::bind(("0.0.0.0", 0))
            .and_then(|s| s.connect(addr))
            .is_err_and(|e| e.raw_os_error() == Some(libc::EACCES))
}

/// A UDP or TCP sink as one of its path's readers (there while the sink is).
fn sink_reader(path: &Path, session: &Session, sink: u64, spec: &SinkSpec) -> Result<(), crate::readers::Full> {
    use crate::readers::{Protocol, SinkReader, Who};
    let (protocol, to) = match (spec.udp, spec.tcp) {
        (Some(to), _) => (Protocol::UdpSink, Some(to)),
        (None, to) => (Protocol::TcpSink, to),
    };
    let reader = Arc::new(SinkReader { session: session.clone(), sink });
    path.readers.join(Who::new(protocol, to, None), reader).map(|r| r.detach())
}

async fn add_sink(session: &Session, spec: &SinkSpec) -> Result<u64, RelayError> {
    if let Some(addr) = spec.udp {
        if is_broadcast_route(addr) {
            return Err(RelayError::BadRequest(format!(
                "udp sink {addr} is a broadcast address here; use a unicast or multicast address"
            )));
        }
        return session.add_udp_sink(addr).map_err(|e| match e.raw_os_error() {
            // A connected socket per sink (uring, udp_sinks = "connected") checks the route.
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH) => {
                RelayError::BadRequest(format!("udp sink {addr} cannot be reached from here: {e}"))
            }
            _ => RelayError::Internal(format!("cannot add udp sink {addr}: {e}")),
        });
    }
    // Invariant: validate() checked that one of the two is set.
    let addr = spec.tcp.expect("validated");
    let stream = tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| RelayError::Peer(format!("tcp sink {addr}: connect timed out after 3 s")))?
        .map_err(|e| RelayError::Peer(format!("tcp sink {addr}: cannot connect: {e}")))?;
    let std = stream.into_std().map_err(|e| RelayError::Internal(e.to_string()))?;
    session.add_stream_sink(std, false).map_err(|e| RelayError::Internal(e.to_string()))
}

/// Reconnects TCP sinks that failed under `failed_sinks = "retry"`, with backoff (1 s doubling
/// to 10 s), until they are back or removed.
async fn reconnect_sinks(
    mut failed: tokio::sync::mpsc::UnboundedReceiver<(u64, std::net::SocketAddr)>,
    session: Session,
) {
    let mut retries = tokio::task::JoinSet::new();
    while let Some((id, addr)) = failed.recv().await {
        let session = session.clone();
        retries.spawn(async move {
            let mut backoff = Duration::from_secs(1);
            loop {
                tokio::time::sleep(backoff).await;
                if session.sink_status(id).is_none() {
                    return;
                }
                if let Ok(Ok(s)) =
                    tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr)).await
                {
                    match s.into_std().and_then(|s| session.reattach_stream(id, s)) {
                        Ok(_) => return,
                        Err(e) => tracing::warn!(session = session.name(), sink = id, "cannot reattach: {e}"),
                    }
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        });
        // Reap finished retries so the set does not grow.
        while retries.try_join_next().is_some() {}
    }
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
