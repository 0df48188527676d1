//! RTMP publishers and players. OBS, ffmpeg and hardware encoders publish
//! `rtmp://HOST:1935/NAME`, or `rtmp://HOST:1935/APP/NAME` (OBS's "Server" `rtmp://HOST/APP`
//! and "Stream Key" `NAME`), into the path `NAME` if its source is `publish`, as an RTSP
//! publisher would: one publisher at a time, the same tracks and clock map across
//! publishers, the same grace. Players of `rtmp://HOST:1935/[APP/]NAME` get any path whose
//! codecs FLV carries (H.264, H.265 in Enhanced RTMP, AAC), from its repackaging, starting
//! at a keyframe. The app is not part of the path's name. Credentials, where RTSP has users
//! or needs the token, come in the query of the stream key or the app: `?user=U&pass=P` or
//! `?token=T`.
//!
//! RTMPS is the same over TLS (the relay's certificate), on its own port.
//!
//! The protocol is `fanout_proto::rtmp` (sans-IO); this module holds the sockets, the
//! deadlines and the decisions: who may publish or play what.
//!
//! A plain RTMP player that plays at the path's shared chunks is the data plane's once it
//! is told it plays: the tags' chunks go once into the path's `{path}/rtmp` session and its
//! socket (a second descriptor of it) is a stream sink there, as an HTTP TS player's is;
//! its task only reads what the client says and ends it. Over TLS, or before the stream's
//! first keyframe, the task writes the tags itself.

use crate::readers::{Held, Protocol, Registered, Who};
use crate::relay::Relay;
use fanout_proto::rtmp::ingest::Ingest;
use fanout_proto::rtmp::server::{split_query, Event, Server};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// RTMP connection ids, apart from RTSP's (a publisher is known by its connection).
const CONN_BASE: u64 = 1 << 62;

/// Accepts RTMP connections until aborted; RTMPS where `tls` is given (its handshake within
/// `request_timeout_s`).
pub async fn serve(listener: TcpListener, relay: Arc<Relay>, tls: Option<tokio_rustls::TlsAcceptor>) {
    let (what, reason) = match tls {
        Some(_) => ("RTMPS", "RTMPS per-address cap (max_connections_per_ip)"),
        None => ("RTMP", "RTMP per-address cap (max_connections_per_ip)"),
    };
    let gate = crate::admit::Gate::new(reason, relay.books.clone());
    // Until an upgrade's new process takes the socket over.
    let mut listener = relay.handover.listener(listener);
    let next = AtomicU64::new(0);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("{what} accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(pass) = gate.admit(peer.ip()) else { continue };
        let face = if tls.is_some() { "rtmps" } else { "rtmp" };
        let pass = pass.connected(face, peer.to_string(), &tokio::runtime::Handle::current());
        let conn = CONN_BASE | next.fetch_add(1, Ordering::Relaxed);
        let (relay, tls) = (relay.clone(), tls.clone());
        tokio::spawn(async move {
            let _pass = pass;
            let _ = stream.set_nodelay(true);
            let mut c = Conn {
                relay: &relay,
                peer,
                conn,
                publishing: None,
                ingest: Ingest::default(),
                started: false,
                playing: None,
                tls: tls.is_some(),
                sunk: None,
            };
            let end = match tls {
                None => c.run(stream).await,
                Some(tls) => {
                    let limit = Duration::from_secs_f64(relay.cfg().request_timeout_s.max(0.1));
                    match tokio::time::timeout(limit, tls.accept(stream)).await {
                        Ok(Ok(s)) => c.run(s).await,
                        Ok(Err(e)) => Err(Ended::Tls(e.to_string())),
                        Err(_) => Err(Ended::Tls(format!("incomplete after {limit:?}"))),
                    }
                }
            };
            c.stop();
            match end {
                Ok(()) => tracing::debug!(%peer, "{what} connection closed"),
                Err(e) => tracing::info!(%peer, "{what} connection ended: {e}"),
            }
        });
    }
}

struct Conn<'a> {
    relay: &'a Arc<Relay>,
    peer: SocketAddr,
    conn: u64,
    /// The path it publishes, once accepted.
    publishing: Option<(String, Arc<crate::publish::Publisher>)>,
    ingest: Ingest,
    /// Its tracks are described to the path.
    started: bool,
    /// What it plays, once accepted.
    playing: Option<Player>,
    /// Over TLS (RTMPS).
    tls: bool,
    /// Its player's socket handed to the engine: the sink it is, of this session.
    sunk: Option<(fanout_io::Session, u64)>,
}

/// Why an RTMP connection ended (logged; what the client was told went out before).
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("its setup took longer than request_timeout_s, or a publisher fell silent")]
    TimedOut,
    #[error("it stopped reading: closed")]
    NotReading,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(#[from] fanout_proto::rtmp::server::RtmpError),
    #[error("TLS handshake: {0}")]
    Tls(String),
    /// A publish or play refused (the client was told why).
    #[error("refused: {0}")]
    Refused(String),
    /// Its stream ended, it was kicked, or the path went.
    #[error("{0}")]
    Stream(String),
    #[error("its publisher could not start: {0}")]
    Publisher(String),
    #[error("taken over by a new publisher")]
    TakenOver,
}

/// An RTMP player: the path's FLV tags as they come, from a keyframe on.
struct Player {
    /// The path's tags (none once the engine plays it).
    tags: Option<tokio::sync::broadcast::Receiver<crate::repack::FlvTag>>,
    /// Just told it plays: the engine may take it now.
    fresh: bool,
    /// A second of the path's stream, for its socket's send buffer.
    stream_buffer: usize,
    /// From a keyframe on, its configurations first.
    gate: crate::repack::TagGate,
    /// Tags waiting for the next write, as their shared chunks (a player that takes them).
    pending: Vec<crate::repack::FlvTag>,
    pending_bytes: usize,
    /// Its socket's send buffer, until set (a second of the stream).
    send_buffer: Option<usize>,
    /// The repackaging, held while it plays.
    repack: Arc<crate::repack::Repack>,
    /// Its place among the path's readers, and what it was sent.
    held: Arc<Held>,
    _registered: Registered,
}

/// The path a publish or play names, and the query its credentials come in (the key's, else
/// the app's). The name is app and key joined (`rtmp://host/live/cam1` is `live/cam1`, as
/// MediaMTX names it); where no path or pattern `known` has that and one has the key alone,
/// the key (`rtmp://HOST/[APP/]{path}`, as before names had steps).
fn target<'a>(app: &'a str, name: &'a str, known: impl Fn(&str) -> bool) -> (String, &'a str) {
    let ((key, key_query), (app, app_query)) = (split_query(name), split_query(app));
    let (key, app) = (key.trim_matches('/'), app.trim_matches('/'));
    let query = if key_query.is_empty() { app_query } else { key_query };
    let full = match (app.is_empty(), key.is_empty()) {
        (_, true) => app.to_string(),
        (true, false) => key.to_string(),
        (false, false) => format!("{app}/{key}"),
    };
    if !key.is_empty() && full != key && !known(&full) && known(key) {
        return (key.to_string(), query);
    }
    (full, query)
}

/// Output one write gathers at most (the rest waits for the next).
const FLUSH_BYTES: usize = 64 << 10;

/// Sleeps until `at`, or forever where there is nothing to flush.
/// Writes `out` whole by `until`: a client that stops reading (its window shut) is closed
/// then, in its setup as after it, instead of holding its task, buffers and slot.
async fn write_by(
    stream: &mut (impl tokio::io::AsyncWrite + Unpin),
    out: &[u8],
    until: tokio::time::Instant,
) -> Result<(), Ended> {
    match tokio::time::timeout_at(until, stream.write_all(out)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(Ended::NotReading),
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// A tag already waiting for the player, as `recv` would give it; `None` if none is.
fn try_next_tag(
    rx: &mut Option<tokio::sync::broadcast::Receiver<crate::repack::FlvTag>>,
) -> Option<Result<crate::repack::FlvTag, tokio::sync::broadcast::error::RecvError>> {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    match rx.as_mut()?.try_recv() {
        Ok(t) => Some(Ok(t)),
        Err(TryRecvError::Lagged(n)) => Some(Err(RecvError::Lagged(n))),
        Err(TryRecvError::Closed) => Some(Err(RecvError::Closed)),
        Err(TryRecvError::Empty) => None,
    }
}

/// The next tag for `player`, or never if there is none.
async fn next_tag(
    player: &mut Option<Player>,
) -> Result<crate::repack::FlvTag, tokio::sync::broadcast::error::RecvError> {
    match player.as_mut().and_then(|p| p.tags.as_mut()) {
        Some(tags) => tags.recv().await,
        None => std::future::pending().await,
    }
}

impl Conn<'_> {
    /// When a write must be done by: the setup's deadline until it publishes or plays,
    /// then the idle time from now.
    fn write_until(&self, setup_until: tokio::time::Instant, idle: Duration) -> tokio::time::Instant {
        match (&self.publishing, &self.playing) {
            (None, None) => setup_until,
            _ => tokio::time::Instant::now() + idle,
        }
    }

    /// What the player is owed, in one write: the server's own output (commands, the
    /// decoder configuration), then the shared chunks of the tags waiting.
    async fn write_out(
        &mut self,
        stream: &mut (impl tokio::io::AsyncWrite + Unpin),
        server: &mut Server,
        setup_until: tokio::time::Instant,
        idle: Duration,
    ) -> Result<(), Ended> {
        let until = self.write_until(setup_until, idle);
        let own = server.take_output();
        let tags = match self.playing.as_mut() {
            Some(p) => {
                p.pending_bytes = 0;
                std::mem::take(&mut p.pending)
            }
            None => Vec::new(),
        };
        let parts = std::iter::once(&own[..]).chain(tags.iter().map(crate::repack::FlvTag::rtmp_chunks));
        match tokio::time::timeout_at(until, crate::write::write_parts(stream, parts)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(Ended::NotReading),
        }
    }

    /// Until it publishes or plays, the whole setup has one deadline (a slow trickle does
    /// not hold a slot); then a publisher's silence for the idle time ends it (a player may
    /// be silent: it only acknowledges now and then). A player's reads need no timer: one
    /// per read was a good part of its cost.
    fn read_until(&self, setup_until: tokio::time::Instant, idle: Duration) -> Option<tokio::time::Instant> {
        match (&self.publishing, &self.playing) {
            (Some(_), _) => Some(tokio::time::Instant::now() + idle),
            (_, Some(_)) => None,
            _ => Some(setup_until),
        }
    }

    async fn run(
        &mut self,
        mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + crate::write::OnTcp,
    ) -> Result<(), Ended> {
        let mut server = Server::new(self.conn ^ u64::from(self.peer.port()) << 32);
        let mut app = String::new();
        let mut buf = vec![0u8; 64 << 10];
        // The handshake and the commands up to publish: within `request_timeout_s`.
        let setup = Duration::from_secs_f64(self.relay.cfg().request_timeout_s.max(0.1));
        let setup_until = tokio::time::Instant::now() + setup;
        let idle = Duration::from_secs_f64(self.relay.cfg().rtsp_idle_s.max(1.0));
        let mut packets = Vec::new();
        let flush_every = Duration::from_millis(self.relay.cfg().stream_flush_ms);
        let mut flush_at: Option<tokio::time::Instant> = None;
        loop {
            let until = self.read_until(setup_until, idle);
            let read = async {
                match until {
                    Some(u) => tokio::time::timeout_at(u, stream.read(&mut buf)).await,
                    None => Ok(stream.read(&mut buf).await),
                }
            };
            let held = self.playing.as_ref().map(|p| p.held.clone());
            let n = tokio::select! {
                // Kicked, or the path went: told as the stream's end.
                why = crate::readers::ended(held.as_deref()) => {
                    if let Some((session, sink)) = self.sunk.take() {
                        session.remove_sink(sink);
                        return Err(Ended::Stream(why));
                    }
                    // The tags waiting go first: nothing follows the end.
                    self.write_out(&mut stream, &mut server, setup_until, idle).await?;
                    server.end_play(&why);
                    self.write_out(&mut stream, &mut server, setup_until, idle).await?;
                    return Err(Ended::Stream(why));
                }
                read = read => match read {
                    Err(_) => return Err(Ended::TimedOut),
                    Ok(Err(e)) => return Err(e.into()),
                    Ok(Ok(0)) => return Ok(()),
                    Ok(Ok(n)) => n,
                },
                // Writes are held up to `stream_flush_ms` (as for HTTP TS subscribers), and
                // meanwhile the player is not woken per tag: at the flush, every tag waiting
                // goes into one write. What the player is told goes out before an end closes it.
                tag = next_tag(&mut self.playing), if flush_at.is_none() => {
                    let played = self.play_waiting(&mut server, tag);
                    if played.is_err() || flush_every.is_zero() {
                        self.write_out(&mut stream, &mut server, setup_until, idle).await?;
                    } else {
                        flush_at = Some(tokio::time::Instant::now() + flush_every);
                    }
                    played?;
                    continue;
                }
                // Everything waiting goes, a write of at most `FLUSH_BYTES` after another: a
                // stream faster than a write an interval is not held back (and lapped).
                _ = sleep_until(flush_at) => {
                    flush_at = None;
                    loop {
                        let next = self.playing.as_mut().and_then(|p| try_next_tag(&mut p.tags));
                        let last = next.is_none();
                        let played = next.map_or(Ok(()), |tag| self.play_waiting(&mut server, tag));
                        self.write_out(&mut stream, &mut server, setup_until, idle).await?;
                        played?;
                        if last {
                            break;
                        }
                    }
                    continue;
                }
            };
            let r = server.input(&buf[..n]);
            let mut close = r.err().map(Ended::from);
            if let Some(why) = self.on_events(&mut server, &mut app, &mut packets).await {
                close = Some(why);
            }
            if let Some(bytes) = self.playing.as_mut().and_then(|p| p.send_buffer.take()) {
                crate::write::size_send_buffer(&stream, bytes);
            }
            let out = server.take_output();
            // (The engine writes a player it took: what the server would say now is left out.)
            if !out.is_empty() && self.sunk.is_none() {
                write_by(&mut stream, &out, self.write_until(setup_until, idle)).await?;
            }
            if self.playing.as_mut().is_some_and(|p| std::mem::take(&mut p.fresh)) {
                self.hand_to_engine(&mut stream, &mut server, self.write_until(setup_until, idle)).await?;
                if self.sunk.is_some() {
                    // From now on it reads acknowledgements only: a small buffer will do.
                    buf = vec![0u8; 4 << 10];
                }
            }
            if let Some(why) = close {
                return Err(why);
            }
        }
    }

    /// A player just told it plays becomes the data plane's where it can (plain RTMP, at
    /// the shared chunks, the decoder configurations known): they go out now, each at its
    /// kind's time (`Flv::config_ms`), and a second descriptor of its socket becomes a stream sink of the
    /// path's RTMP session, from the last keyframe the ring holds; this task goes on reading.
    async fn hand_to_engine(
        &mut self,
        stream: &mut (impl tokio::io::AsyncWrite + Unpin + crate::write::OnTcp),
        server: &mut Server,
        until: tokio::time::Instant,
    ) -> Result<(), Ended> {
        use std::os::fd::AsFd;
        let Some(p) = self.playing.as_mut() else { return Ok(()) };
        let Some(flv) = p.repack.flv.clone() else { return Ok(()) };
        if self.tls || !server.takes_shared_media() || flv.config().is_empty() {
            return Ok(());
        }
        let session = match p.repack.flv_session(&self.relay.engine, crate::repack::Form::Rtmp) {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::warn!(peer = %self.peer, "RTMP player stays off the data plane: {e}");
                return Ok(());
            }
            None => return Ok(()),
        };
        for (video, body) in flv.config().iter() {
            server.media(*video, flv.config_ms(*video), body);
        }
        write_by(stream, &server.take_output(), until).await?;
        let second = stream.tcp().as_fd().try_clone_to_owned()?;
        let id = session.add_stream_sink_sized(std::net::TcpStream::from(second), true, p.stream_buffer)?;
        p.held.handed_to(session.clone(), id);
        p.tags = None;
        tracing::debug!(peer = %self.peer, sink = id, "RTMP player played by the data plane");
        self.sunk = Some((session, id));
        Ok(())
    }

    /// What the client's bytes said, in order: its app, a publish or a play decided, media
    /// fed; the last reason to end the connection, if any.
    async fn on_events(
        &mut self,
        server: &mut Server,
        app: &mut String,
        packets: &mut Vec<fanout_proto::rtmp::ingest::RtpPacket>,
    ) -> Option<Ended> {
        let mut close = None;
        while let Some(e) = server.poll_event() {
            match e {
                Event::Connect { app: a, .. } => *app = a,
                Event::Publish { stream_id, name } => {
                    if let Err(why) = self.publish(server, stream_id, app, &name).await {
                        close = Some(why);
                    }
                }
                Event::Play { stream_id, name } => {
                    if let Err(why) = self.play(server, stream_id, app, &name).await {
                        close = Some(why);
                    }
                }
                Event::Video { timestamp, body } => {
                    if let Err(e) = self.ingest.video(timestamp, &body, packets) {
                        tracing::debug!(peer = %self.peer, "RTMP video tag: {e}");
                    }
                    if let Some(c) = self.ingest.newly_uncarried() {
                        let path = self.publishing.as_ref().map_or("", |p| p.0.as_str());
                        tracing::warn!(peer = %self.peer, path, "RTMP publisher's video is {}: not carried (H.264 and H.265 are), dropped; the path gets its audio only", c.name());
                    }
                    if let Err(why) = self.feed(packets) {
                        close = Some(why);
                    }
                }
                Event::Audio { timestamp, body } => {
                    if let Err(e) = self.ingest.audio(timestamp, &body, packets) {
                        tracing::debug!(peer = %self.peer, "RTMP audio tag: {e}");
                    }
                    if let Err(why) = self.feed(packets) {
                        close = Some(why);
                    }
                }
                Event::Unpublish => self.stop(),
            }
        }
        close
    }

    /// Decides on a publish of `name` (stream key, with its query) under app `app`.
    async fn publish(&mut self, server: &mut Server, stream_id: u32, app: &str, name: &str) -> Result<(), Ended> {
        let (path_name, query) = target(app, name, |n| self.relay.knows(n));
        let path_name = path_name.as_str();
        let refuse = |server: &mut Server, code: &str, why: String| {
            server.refuse(stream_id, code, &why);
            Err(Ended::Refused(why))
        };
        if !self.authorized(query, fanout_proto::auth::Action::Publish, path_name).await {
            tracing::warn!(peer = %self.peer, path = %path_name, "RTMP publish refused: bad or missing credentials");
            return refuse(server, "NetStream.Publish.Unauthorized", "bad or missing credentials".into());
        }
        self.relay.ensure_publishable(path_name).await;
        let publisher =
            self.relay.path(path_name).and_then(|p| p.publisher().cloned()).filter(|p| p.takes_publishers());
        let Some(publisher) = publisher else {
            let why = format!("no path {path_name:?} takes publishers (create it with source = {{ publish = true }})");
            tracing::warn!(peer = %self.peer, "RTMP publish refused: {why}");
            return refuse(server, "NetStream.Publish.BadName", why);
        };
        if let Some(why) = publisher.refusal() {
            tracing::warn!(peer = %self.peer, "RTMP publish refused: {why}");
            return refuse(server, "NetStream.Publish.BadName", why);
        }
        server.accept_publish(stream_id, path_name);
        tracing::info!(peer = %self.peer, path = %path_name, "RTMP publisher connected");
        self.publishing = Some((path_name.to_string(), publisher));
        Ok(())
    }

    /// Decides on a play of `name` under app `app`: the path's FLV, from its repackaging.
    async fn play(&mut self, server: &mut Server, stream_id: u32, app: &str, name: &str) -> Result<(), Ended> {
        let (path_name, query) = target(app, name, |n| self.relay.knows(n));
        let path_name = path_name.as_str();
        let mut refuse = |code: &str, why: String| {
            tracing::warn!(peer = %self.peer, path = %path_name, "RTMP play refused: {why}");
            server.refuse(stream_id, code, &why);
            Err(Ended::Refused(why))
        };
        if self.playing.is_some() || self.publishing.is_some() {
            return refuse("NetStream.Play.Failed", "one stream per connection".into());
        }
        if !self.authorized(query, fanout_proto::auth::Action::Read, path_name).await {
            return refuse("NetStream.Play.Unauthorized", "bad or missing credentials".into());
        }
        let repack = match self.relay.repack(path_name).await {
            Ok(r) => r,
            Err(e) => return refuse("NetStream.Play.StreamNotFound", e.to_string()),
        };
        let Some(flv) = repack.flv.clone() else {
            let why = format!("{path_name}'s tracks do not go in FLV ({}; parameter sets unknown?)", repack.describes);
            return refuse("NetStream.Play.StreamNotFound", why);
        };
        let protocol = if self.tls { Protocol::Rtmps } else { Protocol::Rtmp };
        let user = fanout_proto::auth::query_credentials(query).0;
        let held = Arc::new(Held::default());
        let Some(path) = self.relay.path(path_name) else {
            return refuse("NetStream.Play.StreamNotFound", format!("no path {path_name}"));
        };
        let send_buffer = Some(path.session.stream_send_buffer());
        let joined = path.readers.join(Who::new(protocol, Some(self.peer), user), held.clone());
        let registered = match joined {
            Ok(r) => r,
            Err(full) => return refuse("NetStream.Play.Failed", full.to_string()),
        };
        server.accept_play(stream_id, path_name);
        tracing::info!(peer = %self.peer, path = %path_name, reader = registered.id(), "RTMP player playing");
        let tags = flv.tags.subscribe();
        self.playing = Some(Player {
            tags: Some(tags),
            fresh: true,
            stream_buffer: path.session.stream_send_buffer(),
            gate: crate::repack::TagGate::new(&flv),
            pending: Vec::new(),
            pending_bytes: 0,
            send_buffer,
            repack,
            held,
            _registered: registered,
        });
        Ok(())
    }

    /// `tag` and every tag waiting behind it (at most [`FLUSH_BYTES`] of output), for the
    /// player.
    fn play_waiting(
        &mut self,
        server: &mut Server,
        tag: Result<crate::repack::FlvTag, tokio::sync::broadcast::error::RecvError>,
    ) -> Result<(), Ended> {
        self.play_tag(server, tag)?;
        let room = |p: &Player, server: &Server| {
            server.pending_output() + p.pending_bytes < FLUSH_BYTES && p.pending.len() < crate::write::MAX_PARTS
        };
        while self.playing.as_ref().is_some_and(|p| room(p, server)) {
            let Some(more) = self.playing.as_mut().and_then(|p| try_next_tag(&mut p.tags)) else { break };
            self.play_tag(server, more)?;
        }
        Ok(())
    }

    /// A tag for the player: sent from a keyframe on, at the path's time, after the decoder
    /// configuration. A player that takes shared chunks gets the tag's (made once for all);
    /// another has it chunked for itself.
    fn play_tag(
        &mut self,
        server: &mut Server,
        tag: Result<crate::repack::FlvTag, tokio::sync::broadcast::error::RecvError>,
    ) -> Result<(), Ended> {
        use crate::repack::Passed;
        let Some(p) = self.playing.as_mut() else { return Ok(()) };
        let config = p.repack.flv.as_ref().map(|f| f.config()).unwrap_or_default();
        let tag = match p.gate.pass(tag, &config) {
            Passed::Tag(owed, tag) => {
                for body in owed {
                    server.media(tag.video, tag.ms, body);
                }
                tag
            }
            Passed::Wait => return Ok(()),
            // It fell a channel behind: on at the next keyframe, its picture whole.
            Passed::Lagged(n) => {
                tracing::debug!(peer = %self.peer, skipped = n, "RTMP player fell behind");
                p.held.skipped(n);
                return Ok(());
            }
            Passed::Closed => return Err(Ended::Stream("the stream ended".into())),
        };
        p.held.sent(tag.body.len(), 1);
        if server.takes_shared_media() {
            p.pending_bytes += tag.rtmp_chunks().len();
            p.pending.push(tag);
        } else {
            server.media(tag.video, tag.ms, &tag.body);
        }
        Ok(())
    }

    /// Whether `query` carries credentials RTSP would take (`user`/`pass`, or `token`), or
    /// `[auth]` allows `action` on `path` (anyone, where neither is configured).
    async fn authorized(&self, query: &str, action: fanout_proto::auth::Action, path: &str) -> bool {
        let (user, pass) = fanout_proto::auth::query_credentials(query);
        let local = self.relay.login(user, pass, self.peer.ip(), action, path, true);
        let param = |k: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .map(fanout_proto::rtsp::client::percent_decode)
        };
        let rest: Vec<&str> = query
            .split('&')
            .filter(|kv| !kv.is_empty() && !["user=", "pass=", "token=", "jwt="].iter().any(|k| kv.starts_with(k)))
            .collect();
        let ask = fanout_proto::auth::Request {
            user: param("user").unwrap_or_default(),
            password: param("pass").unwrap_or_default(),
            token: param("token").or_else(|| param("jwt")).unwrap_or_default(),
            ip: self.peer.ip(),
            action,
            path: path.to_string(),
            protocol: "rtmp",
            query: rest.join("&"),
        };
        self.relay.permit(local, ask).await
    }

    /// Hands the ingest's packets to the path, describing its tracks at the first; an error
    /// ends the connection (its tracks cannot start).
    fn feed(&mut self, packets: &mut Vec<fanout_proto::rtmp::ingest::RtpPacket>) -> Result<(), Ended> {
        let Some((name, publisher)) = &self.publishing else {
            packets.clear();
            return Ok(());
        };
        if !self.started {
            let Some(sdp) = self.ingest.sdp() else {
                packets.clear();
                return Ok(());
            };
            let label = format!("rtmp-{}", self.conn & !CONN_BASE);
            let started = fanout_proto::rtsp::sdp::Sdp::parse(&sdp)
                .map_err(|e| format!("its description: {e}"))
                .and_then(|sdp| {
                    publisher
                        .start_stream(
                            crate::publish::Ingest::Rtmp,
                            label,
                            self.conn,
                            self.peer.ip(),
                            sdp,
                            &self.relay.engine,
                        )
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = started {
                tracing::warn!(path = %name, peer = %self.peer, "RTMP publisher not started: {e}");
                packets.clear();
                return Err(Ended::Publisher(e));
            }
            self.started = true;
        }
        if !packets.drain(..).all(|mut p| publisher.feed_rtp(self.conn, p.track, &mut p.data, p.waited_ms)) {
            tracing::info!(path = %name, peer = %self.peer, "RTMP publisher taken over by a new one: closed");
            return Err(Ended::TakenOver);
        }
        Ok(())
    }

    /// The publisher stopped or went away: the path waits for the next one; a player the
    /// engine played leaves it.
    fn stop(&mut self) {
        if let Some((session, sink)) = self.sunk.take() {
            session.remove_sink(sink);
        }
        if let Some((_, publisher)) = self.publishing.take() {
            if self.started {
                publisher.stop(&format!("rtmp-{}", self.conn & !CONN_BASE));
            }
        }
        self.started = false;
        self.ingest = Ingest::default();
    }
}

#[cfg(test)]
mod tests {
    use super::target;

    #[test]
    fn app_and_key_name_the_path() {
        let known = |names: &'static [&'static str]| move |n: &str| names.contains(&n);
        // (app, key, the names paths and patterns have, (the path, the query)).
        type Case = (&'static str, &'static str, &'static [&'static str], (&'static str, &'static str));
        let cases: [Case; 8] = [
            ("live", "cam1", &["live/cam1"], ("live/cam1", "")),
            ("live", "cam1", &["cam1"], ("cam1", "")),
            ("live", "cam1", &["cam1", "live/cam1"], ("live/cam1", "")),
            ("live", "cam1", &[], ("live/cam1", "")),
            ("cam1", "", &[], ("cam1", "")),
            ("", "cam1?user=u&pass=p", &[], ("cam1", "user=u&pass=p")),
            ("live?token=t", "a/b", &["live/a/b"], ("live/a/b", "token=t")),
            ("live/", "/cam1", &[], ("live/cam1", "")),
        ];
        for (app, key, names, (path, query)) in cases {
            let (p, q) = target(app, key, known(names));
            assert_eq!((p.as_str(), q), (path, query), "app {app:?} key {key:?} with {names:?}");
        }
    }
}
