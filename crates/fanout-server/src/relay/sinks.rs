//! The sinks added through the API (UDP, TCP): made, listed, kept in the state file and
//! made again after a restart, each one of its path's readers.

use super::*;

impl Relay {
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

    pub async fn add_sink(self: &Arc<Self>, name: &str, spec: &SinkSpec) -> Result<u64, RelayError> {
        spec.validate()?;
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
    pub(super) fn still(&self, session: &Session, id: u64) -> bool {
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
}

/// Whether the kernel routes `addr` as a broadcast (the limited one, or a local subnet's):
/// connecting a socket without SO_BROADCAST there fails with EACCES.
pub(super) fn is_broadcast_route(addr: std::net::SocketAddr) -> bool {
    addr.is_ipv4()
        && std::net::UdpSocket::bind(("0.0.0.0", 0))
            .and_then(|s| s.connect(addr))
            .is_err_and(|e| e.raw_os_error() == Some(libc::EACCES))
}

/// A UDP or TCP sink as one of its path's readers (there while the sink is).
pub(super) fn sink_reader(
    path: &Path,
    session: &Session,
    sink: u64,
    spec: &SinkSpec,
) -> Result<(), crate::readers::Full> {
    use crate::readers::{Protocol, SinkReader, Who};
    let (protocol, to) = match (spec.udp, spec.tcp) {
        (Some(to), _) => (Protocol::UdpSink, Some(to)),
        (None, to) => (Protocol::TcpSink, to),
    };
    let reader = Arc::new(SinkReader { session: session.clone(), sink });
    path.readers.join(Who::new(protocol, to, None), reader).map(|r| r.detach())
}

pub(super) async fn add_sink(session: &Session, spec: &SinkSpec) -> Result<u64, RelayError> {
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
pub(super) async fn reconnect_sinks(
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
