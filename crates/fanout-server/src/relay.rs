//! The relay's sessions as the control plane sees them: creating a session wires its source
//! (binding, accepting or connecting on tokio, then handing the socket to the engine) and
//! deleting one stops everything it started.

use crate::config::Config;
use crate::spec::{SessionSpec, SinkSpec};
use crate::upstream::Upstream;
use fanout_core::Priority;
use fanout_io::{bind_udp_source, DataPath, DemoClip, Engine, Session, SessionConfig};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::AbortHandle;

pub use crate::error::RelayError;

struct Entry {
    session: Session,
    spec: SessionSpec,
    tasks: Vec<AbortHandle>,
}

pub struct Relay {
    pub engine: Engine,
    pub cfg: Config,
    sessions: RwLock<BTreeMap<String, Entry>>,
    /// Where RTSP clients connect, once listening.
    pub rtsp_addr: parking_lot::Mutex<Option<std::net::SocketAddr>>,
    /// Where RTSPS listens, once bound.
    pub rtsps_addr: parking_lot::Mutex<Option<std::net::SocketAddr>>,
    /// The RTSP side, once listening.
    pub rtsp: parking_lot::Mutex<Option<Arc<dyn RtspFront>>>,
    /// Sessions with an `rtsp://` source.
    upstreams: RwLock<BTreeMap<String, Arc<Upstream>>>,
    /// Sessions RTSP publishers push to.
    publishers: RwLock<BTreeMap<String, Arc<crate::publish::Publisher>>>,
    /// Sessions whose RTSP clients get other tracks than the session itself (the demo:
    /// its H.264 as RFC 6184 while HTTP gets the TS).
    views: RwLock<BTreeMap<String, RtspView>>,
    /// Sessions repackaged for HTTP players (MPEG-TS, HLS), while any play.
    repacks: parking_lot::Mutex<BTreeMap<String, Arc<crate::repack::Repack>>>,
    /// SRTP toward RTSPS clients: each track's key epochs.
    pub srtp: crate::srtp_out::SrtpOut,
    /// This relay as a node of a cluster (`[cluster]`).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Connections refused (caps), by reason.
    pub books: Arc<crate::admit::Books>,
    /// The sessions made through the API, kept across restarts (`state_file`).
    pub state: Option<crate::state::StateFile>,
}

/// The RTSP server as the relay and the API see it. It sits above the relay (it asks the
/// relay for sessions) and implements this, so the relay does not import it.
pub trait RtspFront: Send + Sync {
    /// Ends the stream for every client of `name`: an RTCP BYE on each track, then the
    /// connection closes.
    fn end_resource(&self, relay: &Relay, name: &str);
    /// Its clients, as `GET /v1/rtsp` shows them.
    fn clients(&self) -> Vec<crate::clients::ClientStatus>;
}

impl crate::upstream::Host for Relay {
    fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// What RTSP clients of a session get instead of the session's own RTP.
#[derive(Clone)]
pub struct RtspView {
    pub sdp: fanout_proto::rtsp::sdp::Sdp,
    pub tracks: Vec<crate::track::TrackRef>,
}

impl Relay {
    pub fn new(cfg: Config) -> anyhow::Result<Arc<Self>> {
        let engine = Engine::start(cfg.engine_options()?)?;
        engine.set_kernel_sinks(cfg.kernel_sinks);
        let cluster = cfg.cluster.clone().map(|c| crate::cluster::Cluster::new(c, cfg.rtsp)).transpose()?;
        let state = match cfg.state_file.as_deref().filter(|p| !p.as_os_str().is_empty()) {
            Some(p) => crate::state::StateFile::open(p)?,
            None => None,
        };
        Ok(Arc::new(Self {
            state,
            cluster,
            books: Default::default(),
            engine,
            cfg,
            sessions: RwLock::new(BTreeMap::new()),
            rtsp_addr: Default::default(),
            rtsps_addr: Default::default(),
            rtsp: Default::default(),
            upstreams: Default::default(),
            publishers: Default::default(),
            views: Default::default(),
            repacks: Default::default(),
            srtp: Default::default(),
        }))
    }

    /// Makes sure a session named `name` exists: when it does not and this relay is a
    /// cluster node, the channel is looked up and pulled from the node that serves it best.
    pub async fn ensure(self: &Arc<Self>, name: &str) -> Result<(), RelayError> {
        use crate::cluster::LookupError;
        let here = self.sessions.read().get(name).map(|e| e.session.clone());
        if let Some(s) = here {
            // A pull that just ended (linger) is about to go: it goes now, and a new pull
            // serves the one who asked, instead of a session deleted under it.
            if !self.upstream(name).is_some_and(|u| u.finished()) {
                return Ok(());
            }
            self.delete_exact(name, &s).await;
        }
        let Some(cluster) = &self.cluster else {
            return Err(RelayError::NotFound(format!("no session named {name:?}")));
        };
        let choice = cluster.locate(name).await.map_err(|e| match e {
            LookupError::NotFound(why) => RelayError::NotFound(why),
            LookupError::Down(why) => RelayError::Down(why),
        })?;
        let source = crate::spec::SourceSpec {
            rtsp: Some(choice.url.clone()),
            rtsp_transport: Some(cluster.cfg.pull_transport),
            on_demand: Some(true),
            linger_s: Some(cluster.cfg.linger_s),
            tls_ca: cluster.cfg.tls_ca.clone(),
            ..Default::default()
        };
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

    pub fn session(&self, name: &str) -> Result<Session, RelayError> {
        self.sessions
            .read()
            .get(name)
            .map(|e| e.session.clone())
            .ok_or_else(|| RelayError::NotFound(format!("no session named {name:?}")))
    }

    pub fn sessions(&self) -> Vec<Session> {
        self.sessions.read().values().map(|e| e.session.clone()).collect()
    }

    pub fn rtsp_view(&self, name: &str) -> Option<RtspView> {
        self.views.read().get(name).cloned()
    }

    /// Every session's publisher side.
    pub fn publishers(&self) -> Vec<Arc<crate::publish::Publisher>> {
        self.publishers.read().values().cloned().collect()
    }

    /// The publisher side of a session with a `publish` source.
    pub fn publisher(&self, name: &str) -> Option<Arc<crate::publish::Publisher>> {
        self.publishers.read().get(name).cloned()
    }

    /// The stream of `name` ended (a file played once, a publisher gone past its grace):
    /// RTSP clients get an RTCP BYE and their connections close, HTTP stream subscribers'
    /// connections close (the end of the stream). The session stays (a publisher may come
    /// back; the file's status says it ended).
    pub fn end_players(&self, name: &str) {
        let rtsp = self.rtsp.lock().clone();
        if let Some(r) = rtsp {
            r.end_resource(self, name);
        }
        let repack = self.repack_running(name);
        if let Some(hls) = repack.as_ref().and_then(|r| r.hls.clone()) {
            hls.finish();
        }
        let ts = repack.and_then(|r| r.ts.clone());
        let mut http = 0;
        for s in self.session(name).ok().into_iter().chain(ts) {
            for k in s.sinks().into_iter().filter(|k| matches!(k.target, fanout_io::SinkTarget::Http(_))) {
                http += usize::from(s.remove_sink(k.id));
            }
        }
        tracing::info!(session = name, http, "the stream ended: its players were told");
    }

    /// The upstream of a session with an `rtsp://` source.
    pub fn upstream(&self, name: &str) -> Option<Arc<Upstream>> {
        self.upstreams.read().get(name).cloned()
    }

    /// The relay sessions a name stands for, one per track: an RTSP upstream's media
    /// sections, or the session alone (90 kHz).
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

    pub fn tracks(&self, name: &str) -> Vec<crate::track::TrackRef> {
        if let Some(v) = self.rtsp_view(name) {
            return v.tracks;
        }
        if let Some(p) = self.publisher(name) {
            return p.tracks();
        }
        match self.upstream(name) {
            Some(up) => up.tracks(),
            None => self
                .session(name)
                .map(|session| vec![crate::track::TrackRef { session, clock: 90_000, clock_map: None }])
                .unwrap_or_default(),
        }
    }

    /// The session an HTTP subscriber of `name` joins: its MPEG-TS repackaging where it
    /// carries RTP video or audio (started now if need be), else the session itself, whose
    /// payloads go out as they came (an MPEG-TS source, or anything else, udpxy-style).
    pub async fn http_session(self: &Arc<Self>, name: &str) -> Result<Session, RelayError> {
        self.ensure(name).await?;
        let session = self.session(name)?;
        if self.rtsp_view(name).is_some() || !self.is_rtp_media(name) {
            return Ok(session);
        }
        self.repack(name).await?.ts.clone().ok_or_else(|| RelayError::Internal("no MPEG-TS output".into()))
    }

    /// Whether the session's media is RTP video/audio of known tracks (an RTSP upstream, or
    /// a source with `video` set), which HTTP players get repackaged.
    fn is_rtp_media(&self, name: &str) -> bool {
        self.upstream(name).is_some()
            || self.publisher(name).is_some()
            || self.spec(name).is_some_and(|s| s.video.is_some())
    }

    /// The session's repackaging (MPEG-TS for HTTP where its stream URL needs it, HLS where
    /// its tracks allow), started if it is not running.
    pub async fn repack(self: &Arc<Self>, name: &str) -> Result<Arc<crate::repack::Repack>, RelayError> {
        self.ensure(name).await?;
        let session = self.session(name)?;
        if let Some(r) = self.repack_running(name) {
            return Ok(r);
        }
        let spec = self.spec(name).ok_or_else(|| RelayError::NotFound(format!("no session named {name:?}")))?;
        let mut inputs = Vec::new();
        let mut why = Vec::new();
        let mut add = |m: &fanout_proto::rtsp::sdp::Media, t: crate::track::TrackRef| {
            let info = fanout_proto::container::repack::TrackInfo::from_sdp(m).map_err(|e| why.push(e)).ok();
            inputs.push(crate::repack::Input { session: t.session, info, clock_map: t.clock_map });
        };
        if let Some(view) = self.rtsp_view(name) {
            view.sdp.media.iter().zip(view.tracks).for_each(|(m, t)| add(m, t));
        } else if let Some(up) = self.upstream(name) {
            let Some(sdp) = up.demand(Duration::from_secs(5)).await else {
                return Err(RelayError::Peer(format!(
                    "the upstream of {name:?} did not describe its stream within 5 s ({})",
                    up.status().last_error.unwrap_or_else(|| "no answer".into())
                )));
            };
            sdp.media.iter().zip(up.tracks()).for_each(|(m, t)| add(m, t));
        } else if let Some(p) = self.publisher(name) {
            let Some(sdp) = p.sdp() else {
                return Err(RelayError::Peer(format!("nothing is published to {name:?} now")));
            };
            sdp.media.iter().zip(p.tracks()).for_each(|(m, t)| add(m, t));
        } else if let Some(video) = spec.video {
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
        let mut running = self.repacks.lock();
        if let Some(r) = running.get(name).filter(|r| r.is_running()) {
            return Ok(r.clone());
        }
        let linger = Duration::from_secs_f64(spec.source.linger_s.unwrap_or(10.0));
        let (weak, key) = (Arc::downgrade(self), name.to_string());
        let tracks_of = {
            let weak = Arc::downgrade(self);
            let name = name.to_string();
            move || weak.upgrade().map(|r| r.tracks(&name).iter().map(|t| t.clock_map).collect()).unwrap_or_default()
        };
        let with_ts = self.rtsp_view(name).is_none();
        let on_stop = move || {
            if let Some(relay) = weak.upgrade() {
                let gone = relay.repacks.lock().remove(&key);
                if let Some(ts) = gone.and_then(|r| r.ts.clone()) {
                    tokio::task::spawn_blocking(move || ts.close());
                }
            }
        };
        let r = crate::repack::Repack::start(
            name,
            session.config(),
            &self.engine,
            inputs,
            with_ts,
            tracks_of,
            linger,
            on_stop,
        )
        .map_err(|e| RelayError::Internal(format!("repackaging: {e}")))?;
        for w in &why {
            tracing::info!(session = name, "left out of the repackaging: {w}");
        }
        running.insert(name.to_string(), r.clone());
        Ok(r)
    }

    /// The session's running repackaging, if any.
    pub fn repack_running(&self, name: &str) -> Option<Arc<crate::repack::Repack>> {
        self.repacks.lock().get(name).filter(|r| r.is_running()).cloned()
    }

    pub fn spec(&self, name: &str) -> Option<SessionSpec> {
        self.sessions.read().get(name).map(|e| e.spec.clone())
    }

    /// The session's data path: the one it names, which must work here, or the server's
    /// default, which falls back to `shared` where it cannot serve the session.
    fn datapath_for(&self, spec: &SessionSpec) -> Result<DataPath, RelayError> {
        let udp4 = spec.source.kernel_capable();
        // The eBPF program's clones leave back to back: spacing them needs an EDT qdisc (fq)
        // honouring per-packet departure times, which fanout does not use (see BENCHMARKS).
        let shared_link = spec.pace_link == Some(crate::spec::PaceLink::Shared);
        const CLONES_UNPACED: &str = "pace_link = \"shared\": the kernel data path's clones of a packet leave \
             back to back and cannot be spread over a shared link; use datapath \"shared\"";
        match spec.datapath {
            Some(DataPath::Kernel) if shared_link => Err(RelayError::BadRequest(CLONES_UNPACED.into())),
            Some(DataPath::Kernel) => match self.engine.kernel() {
                Ok(_) => Ok(DataPath::Kernel),
                Err(why) => Err(RelayError::Unavailable(why)),
            },
            Some(dp) => Ok(dp),
            None if self.cfg.datapath != DataPath::Kernel => Ok(self.cfg.datapath),
            None => {
                let why = match self.engine.kernel() {
                    Ok(_) if shared_link => CLONES_UNPACED.to_string(),
                    Ok(_) if udp4 => return Ok(DataPath::Kernel),
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
        if self.sessions.read().contains_key(&spec.name) {
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
        let max_datagram = spec.max_datagram.unwrap_or(self.cfg.max_datagram);
        let pacing = spec.pace_config(max_datagram).map_err(RelayError::BadRequest)?;
        // An rtsps:// source's certificate check, set up now: a CA file that does not load is
        // the creator's error, not a retry loop's.
        let upstream_tls = match spec.source.rtsp.as_deref().map(fanout_proto::rtsp::client::Url::parse) {
            Some(Ok(u)) if u.tls => {
                let v = spec.source.upstream_verify().map_err(RelayError::BadRequest)?;
                if v == crate::tls::Verify::Off {
                    tracing::warn!(session = %spec.name, "rtsps:// upstream without certificate checks (tls_verify = false)");
                }
                let cfg = crate::tls::client_config(&v);
                Some(cfg.map_err(|e| RelayError::BadRequest(format!("source \"tls_ca\": {e:#}")))?)
            }
            _ => None,
        };
        let cfg = SessionConfig {
            name: spec.name.clone(),
            // Invariant: validate() checked the range.
            priority: Priority::new(spec.priority).expect("validated"),
            datapath,
            ring_capacity: spec.ring.unwrap_or(self.cfg.ring),
            max_datagram,
            sinks_per_group: spec.sinks_per_group.unwrap_or(self.cfg.sinks_per_group),
            payload: spec.payload,
            failed_sinks: spec.failed_sinks,
            udp_sinks: spec.udp_sinks,
            uring_sqpoll: spec.uring_sqpoll,
            kernel_spread: spec.kernel_spread,
            source_recv: spec.source_recv,
            stream_flush: Duration::from_millis(spec.stream_flush_ms.unwrap_or(self.cfg.stream_flush_ms)),
            pacing,
            reserve,
        };
        let session = Session::new(cfg, &self.engine);
        session.set_rtp_video(spec.video.map(|v| v.codec()));
        let mut tasks = Vec::new();
        if spec.failed_sinks == fanout_io::FailurePolicy::Retry {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            session.on_sink_failed(move |id, addr| {
                let _ = tx.send((id, addr));
            });
            tasks.push(tokio::spawn(reconnect_sinks(rx, session.clone())).abort_handle());
        }
        let src = &spec.source;
        let mut upstream = None;
        let mut publisher = None;
        let mut view = None;
        let started = if let Some(url) = &src.rtsp {
            // Invariant: validate() parsed the URL.
            let url = fanout_proto::rtsp::client::Url::parse(url).expect("validated");
            session.set_source_kind(format!("rtsp {}", url.request_url()));
            let pulled = origin.is_some();
            let o = crate::upstream::UpstreamOptions {
                tls: upstream_tls,
                url,
                origin,
                mode: src.rtsp_transport.unwrap_or_default(),
                on_demand: src.on_demand.unwrap_or(true),
                linger: Duration::from_secs_f64(src.linger_s.unwrap_or(10.0)),
                silence: Duration::from_secs_f64(src.timeout_s.unwrap_or(10.0)),
            };
            Upstream::new(&spec.name, o, &session)
                .map(|up| {
                    let run = crate::upstream::run(up.clone(), session.config().clone(), Arc::downgrade(self) as _);
                    let (weak, name, mine) = (Arc::downgrade(self), spec.name.clone(), session.clone());
                    let run = async move {
                        run.await;
                        // A pull ended: the session goes (on a task of its own, as deleting
                        // it aborts this one); this session, not a newer pull of the same
                        // name a subscriber set off meanwhile.
                        if let Some(relay) = weak.upgrade().filter(|_| pulled) {
                            tokio::spawn(async move { relay.delete_exact(&name, &mine).await });
                        }
                    };
                    tasks.push(tokio::spawn(run).abort_handle());
                    upstream = Some(up);
                })
                .map_err(|e| RelayError::Internal(format!("rtsp source: {e}")))
        } else if let Some(addr) = src.udp {
            bind_udp_source(addr, src.interface)
                .and_then(|s| session.attach_udp(s))
                .map_err(|e| RelayError::Conflict(format!("cannot receive on udp {addr}: {e}")))
        } else if let Some(addr) = src.tcp_listen {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => {
                    let bound = l.local_addr().unwrap_or(addr);
                    session.set_source_kind(format!("tcp listen {bound}"));
                    session.set_source_addr(bound);
                    tasks.push(tokio::spawn(accept_publishers(l, session.clone())).abort_handle());
                    Ok(())
                }
                Err(e) => Err(RelayError::Conflict(format!("cannot listen on tcp {addr}: {e}"))),
            }
        } else if let Some(addr) = src.tcp_connect {
            session.set_source_kind(format!("tcp connect {addr}"));
            tasks.push(tokio::spawn(connect_publisher(addr, session.clone())).abort_handle());
            Ok(())
        } else if src.publish == Some(true) {
            session.set_source_kind("rtsp publish (ANNOUNCE/RECORD)".into());
            crate::publish::Publisher::new(&spec.name, session.clone())
                .map(|p| publisher = Some(Arc::new(p)))
                .map_err(|e| RelayError::Internal(format!("publish source: {e}")))
        } else if let Some(path) = &src.file {
            read_clip(path, &self.cfg.file_roots, src.looped.unwrap_or(true)).await.and_then(|c| {
                view = demo_view(&spec.name, session.config(), &c, &self.engine)?;
                session
                    .attach_clip(c, &format!("{} {}", if path.is_dir() { "playlist" } else { "file" }, path.display()))
                    .map_err(|e| RelayError::Internal(e.to_string()))
            })
        } else {
            DemoClip::new(fanout_io::DEMO_TS).map_err(|e| RelayError::Internal(format!("demo clip: {e}"))).and_then(
                |c| {
                    view = demo_view(&spec.name, session.config(), &c, &self.engine)?;
                    session.attach_demo(c).map_err(|e| RelayError::Internal(e.to_string()))
                },
            )
        };
        if let Err(e) = started {
            close_view(view).await;
            close(session).await;
            return Err(e);
        }
        for s in &spec.sinks {
            if let Err(e) = add_sink(&session, s).await {
                for t in &tasks {
                    t.abort();
                }
                close(session).await;
                return Err(e);
            }
        }
        let name = spec.name.clone();
        // A file played once and a publisher's session can end: their players are told.
        if (src.file.is_some() && src.looped == Some(false)) || src.publish == Some(true) {
            let file = src.file.is_some();
            tasks.push(tokio::spawn(end_when_over(Arc::downgrade(self), name.clone(), file)).abort_handle());
        }
        let inserted = {
            let mut map = self.sessions.write();
            let free = !map.contains_key(&name);
            if free {
                map.insert(name.clone(), Entry { session: session.clone(), spec, tasks: tasks.clone() });
                if let Some(up) = upstream {
                    self.upstreams.write().insert(name.clone(), up);
                }
                if let Some(p) = publisher.take() {
                    self.publishers.write().insert(name.clone(), p);
                }
                if let Some(v) = view.take() {
                    self.views.write().insert(name.clone(), v);
                }
            }
            free
        };
        if !inserted {
            // Lost a race with a concurrent create of the same name.
            for t in &tasks {
                t.abort();
            }
            close(session).await;
            return Err(RelayError::Conflict(format!("a session named {name:?} already exists")));
        }
        tracing::info!(session = %name, datapath = ?datapath, "session created");
        Ok(session)
    }

    /// Deletes session `name` if it is still `session` (the generation that asked), not a
    /// newer one of the same name.
    pub async fn delete_exact(&self, name: &str, session: &Session) {
        if self.sessions.read().get(name).is_some_and(|e| e.session.is(session)) {
            let _ = self.delete(name).await;
        }
    }

    pub async fn delete(&self, name: &str) -> Result<(), RelayError> {
        tracing::info!(session = name, "deleting session");
        if let Some(c) = &self.cluster {
            c.end_pull(name);
        }
        let e = self
            .sessions
            .write()
            .remove(name)
            .ok_or_else(|| RelayError::NotFound(format!("no session named {name:?}")))?;
        let up = self.upstreams.write().remove(name);
        let rtsp = self.rtsp.lock().clone();
        if let Some(r) = rtsp {
            r.end_resource(self, name);
        }
        let publisher = self.publishers.write().remove(name);
        if let Some(p) = publisher {
            let _ = tokio::task::spawn_blocking(move || p.close_tracks()).await;
        }
        let view = self.views.write().remove(name);
        close_view(view).await;
        let repack = self.repacks.lock().remove(name);
        if let Some(r) = repack {
            r.stop();
            if let Some(ts) = r.ts.clone() {
                close(ts).await;
            }
        }
        // The upstream session is torn down first (a TEARDOWN, a second at most), so its
        // server stops sending to our ports now rather than at its own timeout.
        if let Some(up) = &up {
            up.close(Duration::from_secs(2)).await;
        }
        for t in e.tasks {
            t.abort();
        }
        if let Some(up) = up {
            let _ = tokio::task::spawn_blocking(move || up.close_tracks()).await;
        }
        close(e.session).await;
        Ok(())
    }

    pub async fn add_sink(self: &Arc<Self>, name: &str, spec: &SinkSpec) -> Result<u64, RelayError> {
        spec.validate().map_err(RelayError::BadRequest)?;
        self.ensure(name).await?;
        let session = self.session(name)?;
        let id = add_sink(&session, spec).await?;
        tracing::info!(session = name, sink = id, udp = ?spec.udp, tcp = ?spec.tcp, "sink added");
        Ok(id)
    }

    /// Makes again the sessions the state file kept (after the config's: a name the config
    /// now gives is the config's), with their sinks; returns how many. One that cannot be
    /// made again (its file gone, its port taken) is logged with its spec, and not kept.
    pub async fn restore(self: &Arc<Self>) -> usize {
        let Some(state) = &self.state else { return 0 };
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
        self.srtp.stop_all();
        let names: Vec<String> = self.sessions.read().keys().cloned().collect();
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
            false => relay.publisher(&name).is_some_and(|p| p.ended()),
        };
        if !over {
            (over_since, told) = (None, false);
            continue;
        }
        let since = *over_since.get_or_insert_with(std::time::Instant::now);
        let wait = if file { Duration::from_secs(1) } else { Duration::from_secs_f64(relay.cfg.publisher_grace_s) };
        if !told && since.elapsed() >= wait {
            relay.end_players(&name);
            told = true;
            if file {
                return;
            }
        }
    }
}

/// Files larger than this are refused (a `file` source is held in memory); a directory's
/// files together, too.
const MAX_FILE: u64 = 1 << 30;

/// A `file` source's recording, checked: readable, not too large, MPEG-TS with PCRs or an
/// MP4 (remuxed to MPEG-TS here, once, paced by its samples' times). A directory is a
/// playlist: its recordings (`.ts`, `.m2ts`, `.mp4`, `.m4v`, `.mov`) in the order of their
/// names, joined into one stream.
async fn read_clip(path: &std::path::Path, roots: &[PathBuf], looped: bool) -> Result<DemoClip, RelayError> {
    let bad = |why: String| RelayError::BadRequest(format!("source file {}: {why}", path.display()));
    let path = &allowed_file(path, roots)?;
    let ts = if tokio::fs::metadata(path).await.is_ok_and(|m| m.is_dir()) {
        let mut names = Vec::new();
        let mut dir = tokio::fs::read_dir(path).await.map_err(|e| bad(e.to_string()))?;
        while let Some(e) = dir.next_entry().await.map_err(|e| bad(e.to_string()))? {
            let p = e.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
            // (A link in the directory is followed only where it stays under a root.)
            if ["ts", "m2ts", "mp4", "m4v", "mov"].contains(&ext.as_str()) && p.is_file() {
                names.push(allowed_file(&p, roots)?);
            }
        }
        names.sort();
        if names.is_empty() {
            return Err(bad("a directory with no recording in it (.ts, .m2ts, .mp4, .m4v, .mov)".into()));
        }
        let (mut list, mut total) = (Vec::new(), 0u64);
        for p in names {
            let ts = read_recording(&p, MAX_FILE - total).await?;
            total += ts.len() as u64;
            list.push((p.file_name().unwrap_or_default().to_string_lossy().into_owned(), ts));
        }
        tokio::task::spawn_blocking(move || fanout_proto::container::playlist::concat(&list))
            .await
            .map_err(|e| RelayError::Internal(e.to_string()))?
            .map_err(|e| bad(e.to_string()))?
    } else {
        read_recording(path, MAX_FILE).await?
    };
    let clip = DemoClip::new(ts).map_err(|e| bad(format!("not a playable MPEG-TS or MP4 ({e})")))?;
    Ok(if looped { clip } else { clip.once() })
}

/// A `file` source's path, resolved, if it lies under one of `roots` (`file_roots`, and the
/// files the config's own sessions name) both as written (with `.` and `..` taken out) and
/// as it resolves (a link may lead out of a root). Outside them, the answer is the same
/// whether the file exists or not, and nothing is opened: the API tells a token holder
/// nothing of the host's other files.
fn allowed_file(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, RelayError> {
    let refused = || RelayError::Forbidden(format!("source file {}: not allowed (outside file_roots)", path.display()));
    let lexical = |p: &Path| -> Option<PathBuf> {
        let mut out = PathBuf::new();
        for c in std::path::absolute(p).ok()?.components() {
            match c {
                std::path::Component::ParentDir => {
                    out.pop();
                }
                std::path::Component::CurDir => {}
                c => out.push(c),
            }
        }
        Some(out)
    };
    let named = lexical(path).ok_or_else(refused)?;
    let roots: Vec<PathBuf> = roots.iter().filter_map(|r| lexical(r)).collect();
    if !roots.iter().any(|r| named.starts_with(r)) {
        return Err(refused());
    }
    // (A path under a root by name that does not resolve reaches nothing either: the reads
    // after this say what is wrong with it.)
    let Ok(real) = std::fs::canonicalize(&named) else { return Ok(named) };
    if !roots.iter().filter_map(|r| std::fs::canonicalize(r).ok()).any(|r| real.starts_with(r)) {
        return Err(refused());
    }
    Ok(real)
}

/// One recording as MPEG-TS (an MP4 remuxed), at most `max` bytes of it.
async fn read_recording(path: &std::path::Path, max: u64) -> Result<Vec<u8>, RelayError> {
    let bad = |why: String| RelayError::BadRequest(format!("source file {}: {why}", path.display()));
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    if ["mkv", "webm", "flv", "avi"].contains(&ext.as_str()) {
        return Err(bad(format!(
            "{ext} is not read, MPEG-TS and MP4 are: remux it without re-encoding (ffmpeg -i {0} -c copy -f mpegts {0}.ts)",
            path.display()
        )));
    }
    let meta = tokio::fs::metadata(path).await.map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() || meta.len() > max {
        return Err(bad(format!("not a file, or more than {} MiB of recordings", MAX_FILE >> 20)));
    }
    let bytes = tokio::fs::read(path).await.map_err(|e| bad(e.to_string()))?;
    // An MP4 says so in its first box (`ftyp`), whatever its name.
    if bytes.get(4..8) != Some(b"ftyp") {
        return Ok(bytes);
    }
    tokio::task::spawn_blocking(move || fanout_proto::container::mp4ts::remux(&bytes))
        .await
        .map_err(|e| RelayError::Internal(e.to_string()))?
        .map_err(|e| bad(e.to_string()))
}

/// The demo's face for RTSP clients: its H.264 or H.265 (RFC 6184, 7798) and AAC (RFC 3640)
/// on track sessions of their own (`NAME/video`, `NAME/audio`), described with the clip's
/// codec parameters, paced from one start so they stay in sync.
fn demo_view(
    name: &str,
    template: &SessionConfig,
    clip: &DemoClip,
    engine: &Engine,
) -> Result<Option<RtspView>, RelayError> {
    let (tracks, origin_90k) = clip.rtp_tracks();
    if tracks.is_empty() {
        return Ok(None);
    }
    let mut text = format!("v=0\r\ns={name}\r\nt=0 0\r\n");
    tracks.iter().for_each(|t| text.push_str(&t.media));
    let sdp = fanout_proto::rtsp::sdp::Sdp::parse(&text).map_err(|e| RelayError::Internal(format!("demo SDP: {e}")))?;
    let start = std::time::Instant::now();
    let ntp_start = fanout_proto::rtp::rtcp::ntp_from_unix(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default(),
    );
    let mut refs = Vec::new();
    for t in tracks {
        let mut cfg = template.clone();
        cfg.name = format!("{name}/{}", if t.codec.is_some() { "video" } else { "audio" });
        let session = Session::new(cfg, engine);
        let clock = t.clock;
        session.attach_demo_track(t, start).map_err(|e| RelayError::Internal(e.to_string()))?;
        // Wall clock against RTP time is known exactly: the clip's origin at `start`.
        let rtp_at_start = (origin_90k * u64::from(clock) / 90_000) as u32;
        refs.push(crate::track::TrackRef { session, clock, clock_map: Some((ntp_start, rtp_at_start)) });
    }
    Ok(Some(RtspView { sdp, tracks: refs }))
}

async fn close_view(view: Option<RtspView>) {
    for t in view.into_iter().flat_map(|v| v.tracks) {
        close(t.session).await;
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

/// One TCP publisher at a time; a second one is refused while the first is connected.
async fn accept_publishers(listener: tokio::net::TcpListener, session: Session) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else { continue };
        if session.source_connected() {
            tracing::warn!(session = session.name(), %peer, "refused a second publisher");
            continue;
        }
        tracing::info!(session = session.name(), %peer, "publisher connected");
        let r = stream.into_std().and_then(|s| session.attach_stream(s));
        if let Err(e) = r {
            tracing::warn!(session = session.name(), %peer, "cannot use publisher: {e}");
        }
    }
}

/// Connects to the publisher, and again with backoff (1 s doubling to 10 s) when it goes.
async fn connect_publisher(addr: std::net::SocketAddr, session: Session) {
    let closed = Arc::new(tokio::sync::Notify::new());
    let n = closed.clone();
    session.on_source_closed(move || n.notify_one());
    let mut backoff = Duration::from_secs(1);
    loop {
        match tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => match s.into_std().and_then(|s| session.attach_stream(s)) {
                Ok(()) => {
                    tracing::info!(session = session.name(), %addr, "connected to publisher");
                    backoff = Duration::from_secs(1);
                    closed.notified().await;
                    tracing::info!(session = session.name(), %addr, "publisher closed; reconnecting");
                }
                Err(e) => tracing::warn!(session = session.name(), %addr, "cannot use publisher: {e}"),
            },
            Ok(Err(e)) => tracing::debug!(session = session.name(), %addr, "connect failed: {e}"),
            Err(_) => tracing::debug!(session = session.name(), %addr, "connect timed out"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
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
        let names: Vec<String> = self.sessions.read().keys().cloned().collect();
        names
            .into_iter()
            .map(|name| {
                let sdp = match (self.rtsp_view(&name), self.upstream(&name), self.publisher(&name)) {
                    (Some(v), _, _) => Some(v.sdp),
                    (_, Some(up), _) => up.sdp(),
                    (_, _, Some(p)) => p.sdp(),
                    _ => None,
                };
                let mut codecs: Vec<String> = sdp
                    .iter()
                    .flat_map(|s| &s.media)
                    .filter_map(|m| m.formats.first().and_then(|f| m.rtpmap(f)).map(|(e, c)| format!("{e}/{c}")))
                    .collect();
                if codecs.is_empty() {
                    codecs
                        .extend(self.spec(&name).and_then(|s| s.video).map(|v| format!("{v:?}/90000").to_uppercase()));
                }
                let playing = self.upstream(&name).is_some_and(|u| u.status().state == "playing");
                let bytes_in = self.session(&name).map(|s| s.status().source.bytes).unwrap_or(0);
                crate::cluster::LocalChannel { name, codecs, bytes_in, playing }
            })
            .collect()
    }

    fn counters(&self) -> (u64, u64, u64) {
        let sessions = self.sessions();
        let mut all: BTreeMap<String, Session> = sessions.iter().map(|s| (s.name().to_string(), s.clone())).collect();
        for s in &sessions {
            for t in self.tracks(s.name()) {
                all.entry(t.session.name().to_string()).or_insert(t.session);
            }
        }
        let (subscribers, bytes) = all
            .values()
            .map(|s| s.status())
            .fold((0, 0), |(n, b), st| (n + st.sinks as u64, b + st.delivered_bytes_total));
        // A repackaging's sinks on its tracks are the relay's own; HLS players hold no sink
        // and count by their requests.
        let (own, players) =
            self.repacks.lock().values().filter(|r| r.is_running()).fold((0, 0), |(o, p), r| {
                (o + r.track_sinks as u64, p + r.hls.as_ref().map_or(0, |h| h.players() as u64))
            });
        (sessions.len() as u64, subscribers.saturating_sub(own) + players, bytes)
    }
}
