//! SRT publishers and readers on one UDP port (8890 by default), through libsrt
//! (`fanout-srt`). A caller says what it wants in its stream id
//! ([`fanout_proto::srt`]: `publish:NAME`, `read:NAME`, `#!::r=NAME,m=publish`, with
//! credentials where RTSP has users); the decision is made during SRT's handshake, so a
//! refused caller gets libsrt's reject reason (1400 bad stream id, 1401 credentials, 1404
//! no such path, 1409 already published) and never a connection.
//!
//! A publisher's MPEG-TS becomes the path's RTP tracks (`tsingest`), as an RTMP publisher's
//! FLV does; a reader gets the path's MPEG-TS, the same session HTTP TS players share
//! (the path's own where its source is TS, else its repackaging), through an in-process
//! subscriber queue. libsrt's sockets block: each connection has a thread.

use crate::clients::SrtLink;
use crate::relay::Relay;
use fanout_io::channel::ChannelQueue;
use fanout_proto::srt::{Mode, StreamId};
use fanout_srt::{reject, Listener, Settings, Socket};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// SRT connection ids, apart from RTSP's and RTMP's (a publisher is known by its connection).
const CONN_BASE: u64 = 1 << 61;
/// SRT's live payload: seven TS packets.
const PAYLOAD: usize = 1316;

/// The running SRT listener.
pub struct Srt {
    pub addr: SocketAddr,
    /// libsrt's version.
    pub version: String,
    listener: Arc<Listener>,
}

impl Srt {
    /// Stops accepting (connections in progress end with their peers).
    pub fn stop(self) {
        self.listener.close();
    }
}

/// The path and credentials of a stream id (credentials in the id, else in a query on the
/// path, RTMP's way).
fn split(id: &StreamId) -> (&str, Option<&str>, Option<&str>) {
    let (path, query) = id.path.split_once('?').unwrap_or((&id.path, ""));
    match (&id.user, &id.pass) {
        (Some(u), Some(p)) => (path, Some(u.as_str()), Some(p.as_str())),
        _ => {
            let (u, p) = crate::rtmp::query_credentials(query);
            (path, u, p)
        }
    }
}

/// Listens on `addr`, a thread accepting callers, within the tokio runtime of the caller.
pub fn serve(addr: SocketAddr, relay: Arc<Relay>) -> Result<Srt, String> {
    let version = fanout_srt::version().map_err(|e| e.to_string())?;
    let settings = Settings {
        latency_ms: Some(relay.cfg.srt_latency_ms),
        passphrase: relay.cfg.srt_passphrase.clone(),
        pbkeylen: Some(relay.cfg.srt_pbkeylen),
        ..Settings::default()
    };
    let judge = relay.clone();
    let listener = Listener::bind(addr, &settings, move |peer, id| decide(&judge, peer, id))
        .map(Arc::new)
        .map_err(|e| format!("{addr}: {e}"))?;
    let bound = listener.local_addr().unwrap_or(addr);
    let runtime = tokio::runtime::Handle::current();
    let l = listener.clone();
    std::thread::Builder::new()
        .name("srt-accept".into())
        .spawn(move || accept(&l, &relay, &runtime))
        .map_err(|e| e.to_string())?;
    Ok(Srt { addr: bound, version, listener })
}

/// The handshake's decision on a caller's stream id: `Err` with the reason it is refused.
fn decide(relay: &Relay, peer: Option<SocketAddr>, streamid: &str) -> Result<(), i32> {
    let peer = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
    let id = fanout_proto::srt::parse(streamid).map_err(|e| {
        tracing::warn!(%peer, "SRT caller refused: {e}");
        reject::BAD_REQUEST
    })?;
    let (path, user, pass) = split(&id);
    let mode = if id.mode == Mode::Publish { "publish" } else { "read" };
    let refuse = |code: i32, why: String| {
        tracing::warn!(%peer, path, mode, "SRT caller refused: {why}");
        Err(code)
    };
    if !relay.stream_login_ok(user, pass) {
        return refuse(reject::UNAUTHORIZED, "bad or missing credentials".into());
    }
    match id.mode {
        Mode::Publish => match relay.path(path).and_then(|p| p.publisher().cloned()) {
            None => {
                refuse(reject::NOT_FOUND, format!("no path {path:?} takes publishers (source = {{ publish = true }})"))
            }
            Some(p) if p.is_active() => refuse(reject::CONFLICT, format!("{path} is being published")),
            Some(_) => Ok(()),
        },
        // A cluster may pull a path it does not have yet: that is found after the handshake.
        Mode::Read if relay.path(path).is_none() && relay.cluster.is_none() => {
            refuse(reject::NOT_FOUND, format!("no path {path:?}"))
        }
        Mode::Read => Ok(()),
    }
}

fn accept(listener: &Listener, relay: &Arc<Relay>, runtime: &tokio::runtime::Handle) {
    let gate = crate::admit::Gate::new(
        relay.cfg.max_connections_per_ip,
        "SRT per-address cap (max_connections_per_ip)",
        relay.books.clone(),
    );
    let next = AtomicU64::new(0);
    loop {
        let socket = match listener.accept() {
            Ok(s) => s,
            Err(e) => {
                // Closed at shutdown, or libsrt's trouble: either way, no more callers.
                tracing::info!("SRT listener stopped: {e}");
                return;
            }
        };
        let peer = socket.peer_addr();
        let pass = match peer.map(|p| gate.admit(p.ip())) {
            Some(Some(pass)) => pass,
            _ => continue, // over the cap (booked and logged by the gate): dropped, closed
        };
        let n = next.fetch_add(1, Ordering::Relaxed);
        let (relay, runtime) = (relay.clone(), runtime.clone());
        let spawned = std::thread::Builder::new().name(format!("srt-{n}")).spawn(move || {
            let _pass = pass;
            let _in_runtime = runtime.enter();
            connection(Arc::new(socket), peer, CONN_BASE | n, &relay, &runtime);
        });
        if let Err(e) = spawned {
            tracing::warn!("SRT connection thread: {e}");
        }
    }
}

fn connection(
    socket: Arc<Socket>,
    peer: Option<SocketAddr>,
    conn: u64,
    relay: &Arc<Relay>,
    runtime: &tokio::runtime::Handle,
) {
    // The handshake already judged it; read again what it asked for.
    let Ok(id) = fanout_proto::srt::parse(&socket.streamid()) else { return };
    let (path, _, _) = split(&id);
    let link = Arc::new(SrtLink {
        path: path.to_string(),
        mode: if id.mode == Mode::Publish { "publish" } else { "read" },
        peer,
        since: Instant::now(),
        socket: socket.clone(),
    });
    relay.srt_links.lock().push(link.clone());
    let peer_s = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
    let ended = match id.mode {
        Mode::Publish => publish(&socket, conn, path, relay),
        Mode::Read => read(&socket, path, relay, runtime),
    };
    relay.srt_links.lock().retain(|l| !Arc::ptr_eq(l, &link));
    let s = socket.stats().unwrap_or_default();
    tracing::info!(peer = %peer_s, path, mode = link.mode, lost = s.lost, retransmitted = s.retransmitted,
        dropped = s.dropped, "SRT connection ended: {ended}");
}

/// Feeds a publisher's MPEG-TS into the path until it stops or falls silent; why it ended.
fn publish(socket: &Socket, conn: u64, path: &str, relay: &Relay) -> String {
    let Some(publisher) = relay.path(path).and_then(|p| p.publisher().cloned()) else {
        return format!("the path {path} went away");
    };
    let ip = socket.peer_addr().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |p| p.ip());
    tracing::info!(peer = %ip, path, "SRT publisher connected");
    let idle = Duration::from_secs_f64(relay.cfg.rtsp_idle_s);
    let label = format!("srt-{}", conn & !CONN_BASE);
    publisher.run_ts(socket, &label, conn, ip, &relay.engine, idle, &std::sync::atomic::AtomicBool::new(false))
}

/// Sends the path's MPEG-TS to a reader until it goes; why it ended.
fn read(socket: &Socket, path: &str, relay: &Arc<Relay>, runtime: &tokio::runtime::Handle) -> String {
    let session = match runtime.block_on(relay.http_session(path)) {
        Ok(s) => s,
        Err(e) => return format!("nothing to read: {e}"),
    };
    // A reader that cannot take the stream for a second is cut off (the queue keeps the rest).
    if let Err(e) = socket.set_send_timeout(1000) {
        return e.to_string();
    }
    let me = std::thread::current();
    let queue = ChannelQueue::new(session.config().ring_capacity / 2, move || me.unpark());
    let sink = match session.add_local_sink("SRT reader", queue.clone()) {
        Ok(id) => id,
        Err(e) => return e.to_string(),
    };
    tracing::info!(peer = ?socket.peer_addr(), path, "SRT reader reading");
    let mut frames = Vec::new();
    let why = 'out: loop {
        std::thread::park_timeout(Duration::from_millis(200));
        queue.drain(&mut frames);
        for (p, _) in frames.drain(..) {
            for chunk in p.data().chunks(PAYLOAD) {
                if let Err(e) = socket.send(chunk) {
                    break 'out e.to_string();
                }
            }
        }
        if socket.state() != fanout_srt::State::Connected {
            break "the reader left".to_string();
        }
    };
    session.remove_sink(sink);
    why
}
