//! SRT publishers and readers on one UDP port (8890 by default), through libsrt
//! (`fanout-srt`). A caller says what it wants in its stream id
//! ([`fanout_proto::srt`]: `publish:NAME`, `read:NAME`, `#!::r=NAME,m=publish`, with
//! credentials where RTSP has users); the decision is made during SRT's handshake, so a
//! refused caller gets libsrt's reject reason (1400 bad stream id, 1401 credentials, 1404
//! no such path, 1409 already published) and never a connection.
//!
//! A publisher's MPEG-TS becomes the path's RTP tracks (`tsingest`), as an RTMP publisher's
//! FLV does; a reader gets the path's MPEG-TS, the same session HTTP TS players share
//! (the path's own where its source is TS, else its repackaging), through one in-process
//! subscriber queue per path whose thread sends to all of the path's readers. libsrt's
//! sockets block: each connection has a thread (a reader's only waits for its end).

use crate::clients::SrtLink;
use crate::relay::Relay;
use fanout_io::channel::ChannelQueue;
use fanout_proto::auth::Action;
use fanout_proto::srt::{Mode, StreamId};
use fanout_srt::{reject, Buffers, Listener, Settings, Socket};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// SRT connection ids, apart from RTSP's and RTMP's (a publisher is known by its connection).
const CONN_BASE: u64 = 1 << 61;

/// How long after its stream id was let on a caller must arrive as a connection: one that
/// does not was refused by libsrt after it (with a passphrase set: a wrong passphrase).
const ARRIVE_WITHIN: Duration = Duration::from_secs(3);

/// Handshakes let on by their stream id and not yet arrived as connections, per address:
/// libsrt checks the passphrase after the stream id and tells nobody of a wrong one, so a
/// handshake that never arrives is how a guess is seen.
#[derive(Default)]
struct Handshakes(parking_lot::Mutex<Vec<(std::net::IpAddr, Instant)>>);

impl Handshakes {
    fn started(&self, ip: std::net::IpAddr, now: Instant) {
        let mut v = self.0.lock();
        // Bounded: a flood of them keeps the newest.
        if v.len() >= 4096 {
            v.remove(0);
        }
        v.push((ip, now));
    }

    fn arrived(&self, ip: std::net::IpAddr) {
        let mut v = self.0.lock();
        if let Some(k) = v.iter().position(|h| h.0 == ip) {
            v.remove(k);
        }
    }

    /// The addresses of handshakes that did not arrive in time (one entry each).
    fn lost(&self, now: Instant) -> Vec<std::net::IpAddr> {
        let mut v = self.0.lock();
        let lost = v.iter().filter(|h| now.duration_since(h.1) >= ARRIVE_WITHIN).map(|h| h.0).collect();
        v.retain(|h| now.duration_since(h.1) < ARRIVE_WITHIN);
        lost
    }
}

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
            let (u, p) = fanout_proto::auth::query_credentials(query);
            (path, u, p)
        }
    }
}

/// Listens on `addr`, a thread accepting callers, within the tokio runtime of the caller.
pub fn serve(addr: SocketAddr, relay: Arc<Relay>) -> Result<Srt, fanout_srt::Error> {
    let version = fanout_srt::version()?;
    let settings = Settings {
        latency_ms: Some(relay.cfg().srt_latency_ms),
        passphrase: relay.cfg().srt_passphrase.clone(),
        pbkeylen: Some(relay.cfg().srt_pbkeylen),
        ..Settings::default()
    };
    let (judge, handshakes) = (relay.clone(), Arc::new(Handshakes::default()));
    let seen = handshakes.clone();
    let listener = Listener::bind(addr, &settings, move |peer, id| {
        let now = Instant::now();
        let guarded = judge.cfg().srt_passphrase.as_deref().is_some_and(|p| !p.is_empty());
        for ip in seen.lost(now) {
            if guarded {
                judge.books.failed_login("srt", ip);
            }
        }
        let decided = decide(&judge, peer, id);
        if let (Ok(_), Some(p)) = (decided, peer) {
            seen.started(p.ip(), now);
        }
        decided
    })
    .map(Arc::new)
    .map_err(|e| fanout_srt::Error { text: format!("{addr}: {e}"), ..e })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let runtime = tokio::runtime::Handle::current();
    let l = listener.clone();
    std::thread::Builder::new()
        .name("srt-accept".into())
        .spawn(move || accept(&l, &relay, &runtime, &handshakes))
        .map_err(|e| fanout_srt::Error { code: -1, text: format!("the accepting thread: {e}") })?;
    Ok(Srt { addr: bound, version, listener })
}

/// The handshake's decision on a caller's stream id: `Err` with the reason it is refused,
/// else its socket's buffers (a reader's the least libsrt allows: it receives nothing but
/// acknowledgements).
fn decide(relay: &Relay, peer: Option<SocketAddr>, streamid: &str) -> Result<Buffers, i32> {
    let ip = peer.map(|p| p.ip());
    if ip.is_some_and(|ip| relay.books.login_banned(ip)) {
        return Err(reject::UNAUTHORIZED);
    }
    let peer = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
    let id = fanout_proto::srt::parse(streamid).map_err(|e| {
        tracing::warn!(%peer, "SRT caller refused: {e}");
        reject::BAD_REQUEST
    })?;
    let (path, user, pass) = split(&id);
    let mode = if id.mode == Mode::Publish { "publish" } else { "read" };
    let buffers = if id.mode == Mode::Publish { Buffers::default() } else { Buffers::READER };
    let refuse = |code: i32, why: String| {
        tracing::warn!(%peer, path, mode, "SRT caller refused: {why}");
        Err(code)
    };
    // `[auth]` is asked after the handshake (`connection`): a callback that takes its time
    // must not hold the listener, which libsrt runs this on.
    let action = if id.mode == Mode::Publish { Action::Publish } else { Action::Read };
    let ip_or_any = ip.unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
    let local = relay.login(user, pass, ip_or_any, action, path, true);
    if local == Some(false) && relay.cfg().auth.is_none() {
        if let (Some(ip), true) = (ip, user.is_some() || pass.is_some()) {
            relay.books.failed_login("srt", ip);
        }
        return refuse(reject::UNAUTHORIZED, "bad or missing credentials".into());
    }
    // Under `[auth]`, a caller it has not yet let in is told nothing of which paths exist:
    // it is judged after the handshake, and closed there alike for any path.
    if local != Some(true) && relay.cfg().auth.is_some() {
        return Ok(buffers);
    }
    match id.mode {
        // (A path the relay pulls itself takes no publisher, connected or not.)
        Mode::Publish => match relay.path(path).and_then(|p| p.publisher().cloned()).filter(|p| p.takes_publishers()) {
            // (A pattern's path is made after the handshake.)
            None if relay.publishable_by_pattern(path) => Ok(buffers),
            None => {
                refuse(reject::NOT_FOUND, format!("no path {path:?} takes publishers (source = {{ publish = true }})"))
            }
            Some(p) => p.refusal().map_or(Ok(buffers), |why| refuse(reject::CONFLICT, why)),
        },
        // A cluster may pull a path it does not have yet: that is found after the handshake.
        Mode::Read if relay.path(path).is_none() && relay.cluster.is_none() => {
            refuse(reject::NOT_FOUND, format!("no path {path:?}"))
        }
        Mode::Read if relay.path(path).is_some_and(|p| p.readers.full()) => {
            refuse(reject::OVERLOAD, format!("{path} has its max_readers"))
        }
        Mode::Read => Ok(buffers),
    }
}

fn accept(listener: &Listener, relay: &Arc<Relay>, runtime: &tokio::runtime::Handle, handshakes: &Handshakes) {
    let gate = crate::admit::Gate::new("SRT per-address cap (max_connections_per_ip)", relay.books.clone());
    let next = AtomicU64::new(0);
    let groups = Groups::default();
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
        if let Some(p) = peer {
            handshakes.arrived(p.ip());
        }
        let pass = match peer.and_then(|p| Some((p, gate.admit(p.ip())?))) {
            Some((p, pass)) => pass.connected("srt", p.to_string(), runtime),
            None => continue, // over the cap (booked and logged by the gate): dropped, closed
        };
        let n = next.fetch_add(1, Ordering::Relaxed);
        let (relay, runtime, groups) = (relay.clone(), runtime.clone(), groups.clone());
        // A reader's thread only waits for its end: a small stack.
        let spawned = std::thread::Builder::new().name(format!("srt-{n}")).stack_size(512 << 10).spawn(move || {
            let _pass = pass;
            let _in_runtime = runtime.enter();
            connection(Arc::new(socket), peer, CONN_BASE | n, &relay, &runtime, &groups);
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
    groups: &Groups,
) {
    // The handshake already judged it; read again what it asked for.
    let Ok(id) = fanout_proto::srt::parse(&socket.streamid()) else { return };
    let (path, user, pass) = split(&id);
    let action = if id.mode == Mode::Publish { Action::Publish } else { Action::Read };
    let ip = peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |p| p.ip());
    let local = relay.login(user, pass, ip, action, path, true);
    if local != Some(true) && relay.cfg().auth.is_some() {
        let ask = fanout_proto::auth::Request {
            user: user.unwrap_or_default().to_string(),
            password: pass.unwrap_or_default().to_string(),
            token: String::new(),
            ip,
            action,
            path: path.to_string(),
            protocol: "srt",
            query: String::new(),
        };
        if !runtime.block_on(relay.permit(local, ask)) {
            tracing::warn!(?peer, path, "SRT caller refused by [auth]: the connection is closed");
            return;
        }
    }
    let mode = if id.mode == Mode::Publish { "publish" } else { "read" };
    let link = Arc::new(SrtLink::new(path, mode, peer, socket.clone()));
    relay.srt_links.lock().push(link.clone());
    let peer_s = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
    let ended = match id.mode {
        Mode::Publish => {
            runtime.block_on(relay.ensure_publishable(path));
            publish(&socket, &link, conn, path, relay)
        }
        Mode::Read => read(&socket, &link, user, relay, runtime, groups),
    };
    relay.srt_links.lock().retain(|l| !Arc::ptr_eq(l, &link));
    let s = socket.stats().unwrap_or_default();
    tracing::info!(peer = %peer_s, path, mode = link.mode, lost = s.lost, retransmitted = s.retransmitted,
        dropped = s.dropped, "SRT connection ended: {ended}");
}

/// Feeds a publisher's MPEG-TS into the path until it stops, falls silent or its link is
/// ended (an upgrade lets the port go); why it ended.
fn publish(socket: &Socket, link: &SrtLink, conn: u64, path: &str, relay: &Relay) -> String {
    let Some(publisher) = relay.path(path).and_then(|p| p.publisher().cloned()).filter(|p| p.takes_publishers()) else {
        return format!("the path {path} went away");
    };
    let ip = socket.peer_addr().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |p| p.ip());
    tracing::info!(peer = %ip, path, "SRT publisher connected");
    let idle = Duration::from_secs_f64(relay.cfg().rtsp_idle_s);
    let label = format!("srt-{}", conn & !CONN_BASE);
    publisher.run_ts(socket, &label, conn, ip, &relay.engine, idle, &link.ended)
}

/// A reader of a path's SRT group: its socket, and where to say why it ended.
struct Member {
    socket: Arc<Socket>,
    link: Arc<SrtLink>,
    done: std::sync::mpsc::Sender<String>,
}

/// The SRT readers of each path: one thread per path sends the path's MPEG-TS to all of its
/// readers, every `stream_flush_ms` (5 to 50 ms), rather than a thread woken per datagram
/// per reader (the context switches were most of a reader's cost).
type Groups = Arc<parking_lot::Mutex<std::collections::HashMap<String, Arc<parking_lot::Mutex<Vec<Member>>>>>>;

/// Sends the path's MPEG-TS to a reader until it goes; why it ended.
fn read(
    socket: &Arc<Socket>,
    link: &Arc<SrtLink>,
    user: Option<&str>,
    relay: &Arc<Relay>,
    runtime: &tokio::runtime::Handle,
    groups: &Groups,
) -> String {
    let path = link.path.as_str();
    // (Started here, outside the groups' lock: the repackaging may take a moment.)
    let session = match runtime.block_on(relay.http_session(path)) {
        Ok(s) => s,
        Err(e) => return format!("nothing to read: {e}"),
    };
    let Some(registry) = relay.path(path).map(|p| p.readers.clone()) else {
        return format!("the path {path} went away");
    };
    let who = crate::readers::Who::new(crate::readers::Protocol::Srt, link.peer, user);
    // (The handshake refused a reader of a full path; this is for one that raced it.)
    let _registered = match registry.join(who, link.clone()) {
        Ok(r) => r,
        Err(full) => return full.to_string(),
    };
    // A reader whose send buffer is full is behind by all of it: it is cut off, never waited for.
    if let Err(e) = socket.set_nonblocking_send() {
        return e.to_string();
    }
    let (done, ended) = std::sync::mpsc::channel();
    let member = Member { socket: socket.clone(), link: link.clone(), done };
    {
        let mut g = groups.lock();
        match g.get(path) {
            Some(members) => members.lock().push(member),
            None => {
                let members = Arc::new(parking_lot::Mutex::new(vec![member]));
                g.insert(path.to_string(), members.clone());
                let tick = Duration::from_millis(relay.cfg().stream_flush_ms.clamp(5, 50));
                let (path, groups) = (path.to_string(), groups.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("srt-readers-{path}"))
                    .spawn(move || send_to_readers(&path, &session, &members, &groups, tick));
                if let Err(e) = spawned {
                    g.remove(link.path.as_str());
                    return e.to_string();
                }
            }
        }
    }
    tracing::info!(peer = ?socket.peer_addr(), path, "SRT reader reading");
    ended.recv().unwrap_or_else(|_| "the relay stopped".into())
}

/// A path's readers' thread: the TS session's packets to every reader, until none is left.
fn send_to_readers(
    path: &str,
    session: &fanout_io::Session,
    members: &parking_lot::Mutex<Vec<Member>>,
    groups: &Groups,
    tick: Duration,
) {
    let queue = ChannelQueue::new(session.config().ring_capacity / 2, || {});
    let sink = match session.add_local_sink("SRT readers", queue.clone()) {
        Ok(id) => id,
        Err(e) => {
            groups.lock().remove(path);
            for m in members.lock().drain(..) {
                let _ = m.done.send(e.to_string());
            }
            return;
        }
    };
    let mut frames = Vec::new();
    loop {
        std::thread::sleep(tick);
        queue.drain(&mut frames);
        let mut ms = members.lock();
        ms.retain(|m| {
            let why = if let Some(why) = m.link.has_ended() {
                Some(why)
            } else if m.socket.state() != fanout_srt::State::Connected {
                Some("the reader left".to_string())
            } else {
                let mut chunks = frames.iter().flat_map(|(p, _)| p.payload().chunks(fanout_srt::TS_PAYLOAD));
                let sent = |c: &[u8]| m.socket.send(c).map(|_| m.link.held.sent(c.len(), 1));
                chunks.find_map(|c| sent(c).err()).map(|e| format!("it fell behind or went: {e}"))
            };
            match why {
                Some(w) => {
                    let _ = m.done.send(w);
                    false
                }
                None => true,
            }
        });
        frames.clear();
        if ms.is_empty() {
            drop(ms);
            // Gone for good only under the groups' lock: a reader joining now waits for it.
            let mut g = groups.lock();
            if members.lock().is_empty() {
                g.remove(path);
                break;
            }
        }
    }
    session.remove_sink(sink);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_that_never_arrives_is_lost_once() {
        let h = Handshakes::default();
        let (a, b): (std::net::IpAddr, std::net::IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        h.started(a, t0);
        h.started(b, t0);
        h.started(a, t0 + Duration::from_secs(1));
        h.arrived(b);
        assert!(h.lost(t0 + Duration::from_secs(2)).is_empty(), "not yet");
        assert_eq!(h.lost(t0 + ARRIVE_WITHIN), vec![a], "the first of a's; b's arrived");
        assert_eq!(h.lost(t0 + ARRIVE_WITHIN * 2), vec![a]);
        assert!(h.lost(t0 + ARRIVE_WITHIN * 3).is_empty(), "each told once");
    }
}
