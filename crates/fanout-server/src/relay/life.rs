//! A path's life: made (its first session, its source started), watched for its end (a
//! file played, a publisher gone, no reader left of an on-demand pull) and deleted.

use super::*;

impl Relay {
    /// The session's data path: the one it names, which must work here, or the server's
    /// default, which falls back to `shared` where it cannot serve the session.
    pub(super) fn datapath_for(&self, spec: &SessionSpec) -> Result<DataPath, RelayError> {
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
    pub(super) async fn create_with(
        self: &Arc<Self>,
        spec: SessionSpec,
        origin: Option<Arc<dyn crate::upstream::Origin>>,
    ) -> Result<Session, RelayError> {
        spec.validate()?;
        if self.paths.read().contains_key(&spec.name) {
            return Err(RelayError::Conflict(format!("a session named {:?} already exists", spec.name)));
        }
        let datapath = self.datapath_for(&spec)?;
        let reserve = self.egress_reserve(&spec, datapath)?;
        let session = Session::new(self.session_config(&spec, datapath, reserve)?, &self.engine);
        session.set_rtp_video(spec.video.map(|v| v.codec().into()));
        let mut tasks = Vec::new();
        if spec.failed_sinks == fanout_io::FailurePolicy::Retry {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            session.on_sink_failed(move |id, addr| {
                let _ = tx.send((id, addr));
            });
            tasks.push(tokio::spawn(reconnect_sinks(rx, session.clone())).abort_handle());
        }
        let defaults = self.cfg();
        let cx = crate::source::Ctx {
            name: &spec.name,
            session: &session,
            engine: &self.engine,
            cfg: &defaults,
            host: Arc::downgrade(self) as _,
            on_pull_end: origin.is_some().then(|| self.on_pull_end(&spec.name, &session)),
            origin,
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
        let mut forwards = Vec::new();
        for f in &spec.forward {
            let target = match crate::forward::Target::new(f) {
                Ok(t) => Arc::new(t),
                Err(e) => {
                    abort(&tasks);
                    started.feeder.close_tracks().await;
                    close(session).await;
                    return Err(e);
                }
            };
            let run = super::forward::run(Arc::downgrade(self), name.clone(), target.clone());
            tasks.push(tokio::spawn(run).abort_handle());
            forwards.push(target);
        }
        let mut path = Path::new(spec, session.clone(), started.feeder, tasks);
        path.forwards = forwards;
        let path = Arc::new(path);
        for (id, s) in &sinks {
            if let Err(full) = sink_reader(&path, &session, *id, s) {
                tracing::warn!(session = %name, sink = id, "a configured sink past max_readers, kept: {full}");
            }
        }
        self.insert(path).await?;
        tracing::info!(session = %name, datapath = ?datapath, "session created");
        Ok(session)
    }

    /// The rate `spec` reserves of the shared egress (bytes a second; 0: none), checked: the
    /// egress must exist and have it free, and its data path must send through it.
    fn egress_reserve(&self, spec: &SessionSpec, datapath: DataPath) -> Result<u64, RelayError> {
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
        if reserve == 0 {
            return Ok(0);
        }
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
        Ok(reserve)
    }

    /// The path's first session's settings: the spec's, else the running configuration's.
    fn session_config(
        &self,
        spec: &SessionSpec,
        datapath: DataPath,
        reserve: u64,
    ) -> Result<SessionConfig, RelayError> {
        let defaults = self.cfg();
        let max_datagram = spec.max_datagram.unwrap_or(defaults.max_datagram);
        Ok(SessionConfig {
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
            pacing: spec.pace_config(max_datagram)?,
            reserve,
        })
    }

    /// What a cluster pull's end does: the path goes (on a task of its own, as deleting it
    /// aborts the pull's); this path, not a newer pull of the same name a subscriber set off.
    fn on_pull_end(self: &Arc<Self>, name: &str, session: &Session) -> Box<dyn FnOnce() + Send + Sync> {
        let (weak, name, mine) = (Arc::downgrade(self), name.to_string(), session.clone());
        Box::new(move || {
            if let Some(relay) = weak.upgrade() {
                tokio::spawn(async move { relay.delete_exact(&name, &mine).await });
            }
        })
    }

    /// Puts a made path in the map, unless a concurrent create of the same name won (then
    /// this one is closed).
    async fn insert(&self, path: Arc<Path>) -> Result<(), RelayError> {
        let inserted = {
            let mut map = self.paths.write();
            let free = !map.contains_key(&path.name);
            if free {
                map.insert(path.name.clone(), path.clone());
            }
            free
        };
        if !inserted {
            path.close().await;
            return Err(RelayError::Conflict(format!("a session named {:?} already exists", path.name)));
        }
        Ok(())
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
}

/// Watches a session that can end (`file`: a file played once; else a publisher's) and
/// tells its players when it does: a file 1 s after its last packet (the ring's last
/// packets go out first), a publisher's after `publisher_grace_s` without one. A publisher
/// who comes back in time changes nothing for the players.
pub(super) async fn end_when_over(relay: std::sync::Weak<Relay>, name: String, file: bool) {
    use crate::ending::{End, EndWatch};
    /// A file's source does not tell its end: it is looked at this often.
    const FILE_LOOK: Duration = Duration::from_millis(250);
    let mut watch = if file { EndWatch::file() } else { EndWatch::publisher(Duration::ZERO) };
    loop {
        let mut changes = {
            let Some(relay) = relay.upgrade() else { return };
            watch.set_wait(Duration::from_secs_f64(relay.cfg().publisher_grace_s));
            let publisher = relay.path(&name).and_then(|p| p.publisher().cloned());
            // (Subscribed before the look, so a change right after it is not missed.)
            let changes = publisher.as_ref().map(|p| p.changes());
            let over = match file {
                true => relay.session(&name).is_ok_and(|s| s.source_state() == fanout_io::SourceState::Closed),
                false => publisher.is_some_and(|p| p.ended()),
            };
            match watch.observe(over, std::time::Instant::now()) {
                End::Not => {}
                End::Tell => relay.end_players(&name),
                End::TellAndStop => return relay.end_players(&name),
            }
            changes
        };
        let timeout = watch.poll_timeout(std::time::Instant::now());
        match (file, changes.as_mut()) {
            (true, _) => tokio::time::sleep(timeout.unwrap_or(FILE_LOOK).min(FILE_LOOK)).await,
            // A publisher's stream: woken when a publisher comes or goes, or its grace ends.
            (false, Some(changes)) => {
                let _ = tokio::time::timeout(timeout.unwrap_or(Duration::MAX), changes.changed()).await;
            }
            // No publisher side (yet): nothing to wait for but a reload.
            (false, None) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// How long one who asked for an on-demand path waits for the publisher its command starts.
pub(super) const ON_DEMAND_START: Duration = Duration::from_secs(15);

/// Watches a path a pattern made: once nobody has read it for `linger` (no sink on any of
/// its tracks: RTSP clients, HTTP subscribers, the repackaging for HLS, RTMP and WebRTC
/// while it runs), it is deleted and its command stopped; the command goes with the path
/// whoever deletes it.
/// A pattern's path, until nobody uses it.
pub(super) struct Unwatched {
    pub(super) name: String,
    pub(super) session: Session,
    pub(super) hook: Option<crate::hook::Hook>,
    pub(super) linger: Duration,
    /// Held while the path lives: the pattern's count.
    pub(super) slot: PatternSlot,
    /// Made for a publisher: its publishing keeps it too.
    pub(super) for_publisher: bool,
}

pub(super) async fn end_unwatched(relay: std::sync::Weak<Relay>, w: Unwatched) {
    let Unwatched { name, session, mut hook, linger, slot, for_publisher } = w;
    let mut use_of = crate::ending::Linger::new(linger, std::time::Instant::now());
    loop {
        // (Sampled, at most every half second: readers come and go on every face.)
        tokio::time::sleep(
            use_of
                .poll_timeout(std::time::Instant::now())
                .clamp(Duration::from_millis(100), Duration::from_millis(500)),
        )
        .await;
        let Some(relay) = relay.upgrade() else { break };
        let Some(path) = relay.path(&name).filter(|p| p.session.is(&session)) else { break };
        if let Some(h) = hook.as_mut() {
            if !h.running() {
                hook = None;
            }
        }
        let readers: usize = path.tracks().iter().map(|t| t.session.sinks().len()).sum();
        let published = for_publisher && path.publisher().is_some_and(|p| p.publishing());
        if use_of.observe(readers > 0 || published, std::time::Instant::now()) {
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

pub(super) fn abort(tasks: &[tokio::task::AbortHandle]) {
    for t in tasks {
        t.abort();
    }
}

/// Closing joins the session's threads: keep that off the async runtime.
pub(super) async fn close(session: Session) {
    let _ = tokio::task::spawn_blocking(move || session.close()).await;
}
