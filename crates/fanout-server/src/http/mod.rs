//! The HTTP listener: API requests go to axum; `GET /v1/sessions/{name}/stream` is answered
//! here and its socket is handed to the engine as a sink, so stream bytes never pass
//! through the async runtime; `GET /{name}.flv` is answered here too, by an HTTP-FLV player.

mod flv;
mod tunnel;

use crate::readers::{Held, Protocol, SinkReader, Who};
use crate::relay::Relay;
use crate::tls::Tls;
use fanout_proto::http::{classify, Container, Head};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head we look at before deciding.
const MAX_HEAD: usize = 8192;
pub async fn serve(listener: TcpListener, relay: Arc<Relay>, router: axum::Router, tls: Option<Arc<Tls>>) {
    let max = relay.cfg().api_max_connections;
    let head_timeout = Duration::from_secs_f64(relay.cfg().request_timeout_s);
    let limit = Arc::new(tokio::sync::Semaphore::new(max));
    let gate = crate::admit::Gate::new("HTTP per-address cap (max_connections_per_ip)", relay.books.clone());
    // Until an upgrade's new process takes the socket over.
    let mut listener = relay.handover.listener(listener);
    let mut warned = false;
    loop {
        // At the cap, further connections wait in the kernel's accept queue (then are refused
        // by it) instead of being accepted and served with nothing.
        let permit = match limit.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!("{max} API/HTTP connections open (api_max_connections): new ones wait");
                }
                limit.clone().acquire_owned().await.expect("never closed")
            }
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // One address at its cap is answered at once if its socket takes it, and closed; the
        // slot goes back for the others.
        let Some(pass) = gate.admit(peer.ip()) else {
            let _ =
                stream.try_write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            continue;
        };
        let (relay, router, tls) = (relay.clone(), router.clone(), tls.clone());
        tokio::spawn(async move {
            let _pass = pass;
            match tls {
                Some(tls) => serve_tls(stream, &relay, router, &tls, head_timeout, permit).await,
                None => serve_plain(stream, &relay, router, head_timeout, permit).await,
            }
        });
    }
}

/// One of the `api_max_connections`: an API connection holds it for its life; a stream's
/// player gives it back once it plays (its path's `max_readers` bounds those).
type Slot = tokio::sync::OwnedSemaphorePermit;

async fn serve_plain(stream: TcpStream, relay: &Arc<Relay>, router: axum::Router, head_timeout: Duration, slot: Slot) {
    match stream_request(&stream, head_timeout).await {
        Some(Err(Some(t))) => tunnel::half(stream, relay, t, head_timeout, slot).await,
        Some(Ok(asked)) if asked.container == Container::Ts => {
            start_stream(stream, relay, &asked.name, asked.auth.as_deref(), asked.query.as_deref(), asked.head_len)
                .await
        }
        Some(Ok(asked)) => {
            let mut stream = stream;
            let mut head = vec![0u8; asked.head_len];
            if stream.read_exact(&mut head).await.is_ok() {
                let peer = stream.peer_addr().ok();
                if asked.websocket.is_some() {
                    start_flv(stream, peer, relay, &asked, slot).await;
                } else {
                    start_flv_sink(stream, peer, relay, &asked, slot).await;
                }
            }
        }
        Some(Err(None)) => {}
        None => {
            let _slot = slot;
            let peer = stream.peer_addr().ok();
            serve_api(stream, peer, router, head_timeout).await
        }
    }
}

/// Hands a connection to hyper and the API's router; handlers that count per address (WHEP)
/// find `peer` as `ConnectInfo`.
async fn serve_api<S>(io: S, peer: Option<std::net::SocketAddr>, router: axum::Router, head_timeout: Duration)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let router = match peer {
        Some(p) => router.layer(axum::Extension(axum::extract::ConnectInfo(p))),
        None => router,
    };
    let svc = TowerToHyperService::new(tower::ServiceExt::map_request(router, name_steps_as_one));
    // A response the client does not take (its window stays shut) for as long as a request
    // head may take is given up, and the connection with it: a stalled reader holds no
    // download, no buffer and no slot for longer.
    let mut io = tokio_io_timeout::TimeoutStream::new(io);
    io.set_write_timeout(Some(head_timeout));
    // Every request head, the first and each kept-alive one, must arrive whole within the
    // timeout: a trickle of bytes does not hold the connection.
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(Box::pin(io)), svc)
        .await;
}

/// A name of steps (`/live/cam1/whep`) made one step for the router (`/live%2Fcam1/whep`),
/// whose `{name}` takes one; the handlers see `live/cam1`.
fn name_steps_as_one<B>(mut req: axum::http::Request<B>) -> axum::http::Request<B> {
    if let Some(path) = fanout_proto::name::encode_in_http_path(req.uri().path()) {
        let target = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        let mut parts = req.uri().clone().into_parts();
        if let Ok(pq) = target.parse() {
            parts.path_and_query = Some(pq);
            if let Ok(uri) = axum::http::Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
    }
    req
}

/// HTTPS: the handshake, then the same split as plain HTTP, on the decrypted bytes (read,
/// not peeked: what the API's requests began with is handed to hyper before the rest).
async fn serve_tls(
    stream: TcpStream,
    relay: &Arc<Relay>,
    router: axum::Router,
    tls: &Tls,
    head_timeout: Duration,
    slot: Slot,
) {
    let peer = stream.peer_addr().ok();
    let mut first = [0u8; 2];
    match tokio::time::timeout(head_timeout, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 && !crate::tls::looks_like_tls(&first[..n]) => {
            // Like nginx: a plain request on the TLS port is told where to go, in plain.
            tracing::warn!(?peer, "plain HTTP on the HTTPS port: refused");
            let why = "this port speaks HTTPS: use https://";
            let _ = tokio::time::timeout(Duration::from_secs(1), reject(&stream, 400, why)).await;
            return;
        }
        Ok(Ok(n)) if n > 0 => {}
        _ => return,
    }
    let mut tls_stream = match tokio::time::timeout(head_timeout, tls.acceptor().accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(?peer, "TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::info!(?peer, "TLS handshake incomplete after {head_timeout:?}: closed");
            return;
        }
    };
    let deadline = tokio::time::Instant::now() + head_timeout;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        match classify(&buf, MAX_HEAD) {
            Head::Stream(r) => {
                let asked = Asked::from(r);
                match asked.container {
                    Container::Ts => {
                        drop(slot);
                        let (auth, query) = (asked.auth.as_deref(), asked.query.as_deref());
                        start_tls_stream(tls_stream, relay, &asked.name, auth, query).await
                    }
                    Container::Flv => start_flv(tls_stream, peer, relay, &asked, slot).await,
                }
                return;
            }
            Head::Api => {
                let _slot = slot;
                return serve_api(Prefixed { head: buf, at: 0, io: tls_stream }, peer, router, head_timeout).await;
            }
            Head::Reject(status, why) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), reject_on(&mut tls_stream, status, why)).await;
                return;
            }
            Head::Tunnel(_) => {
                let why = "RTSP over HTTP is served on plain HTTP; over TLS, use RTSPS";
                let _ = tokio::time::timeout(Duration::from_secs(1), reject_on(&mut tls_stream, 501, why)).await;
                return;
            }
            Head::Incomplete => {}
        }
        match tokio::time::timeout_at(deadline, tls_stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return,
        }
    }
}

/// A connection whose first bytes were already read: they are read again first.
struct Prefixed<S> {
    head: Vec<u8>,
    at: usize,
    io: S,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.at);
            buf.put_slice(&self.head[self.at..self.at + n]);
            self.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A stream request, owned.
struct Asked {
    name: String,
    container: Container,
    auth: Option<String>,
    query: Option<String>,
    /// WebSocket-FLV: the handshake's key.
    websocket: Option<String>,
    head_len: usize,
}

impl From<fanout_proto::http::StreamRequest<'_>> for Asked {
    fn from(r: fanout_proto::http::StreamRequest<'_>) -> Self {
        Asked {
            name: r.session.to_string(),
            container: r.container,
            auth: r.authorization.map(str::to_string),
            query: r.query.map(str::to_string),
            websocket: r.websocket.map(str::to_string),
            head_len: r.head_len,
        }
    }
}

/// Peeks at the request head (without consuming it, so hyper can read it if it is not ours).
/// `None`: the API's; `Some(Err(Some(_)))`: half of an RTSP tunnel; `Some(Err(None))`:
/// answered or dropped here.
async fn stream_request(stream: &TcpStream, head_timeout: Duration) -> Option<Result<Asked, Option<tunnel::Half>>> {
    let mut buf = vec![0u8; MAX_HEAD];
    let deadline = tokio::time::Instant::now() + head_timeout;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Some(Err(None)),
            Ok(Ok(n)) => n,
        };
        if crate::tls::looks_like_tls(&buf[..n]) {
            tracing::warn!(peer = ?stream.peer_addr().ok(), "a TLS client on the plain HTTP port: closed");
            crate::admit::linger_close(stream).await;
            return Some(Err(None));
        }
        match classify(&buf[..n], MAX_HEAD) {
            Head::Stream(r) => return Some(Ok(Asked::from(r))),
            Head::Tunnel(t) => return Some(Err(Some(tunnel::Half::from(t)))),
            Head::Api => return None,
            // What hyper would answer with an empty body (or not at all): the API's JSON.
            Head::Reject(status, why) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), reject(stream, status, why)).await;
                return Some(Err(None));
            }
            // A peek of bytes already there returns at once: the deadline is checked here.
            Head::Incomplete if tokio::time::Instant::now() >= deadline => return Some(Err(None)),
            Head::Incomplete => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// `status` with the API's JSON error body, closing the connection.
fn rejection(status: u16, why: &str) -> String {
    let reason = axum::http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error");
    let body = serde_json::json!({ "error": why, "status": status }).to_string();
    // A redirect's `why` is where to.
    let location = if (300..400).contains(&status) { format!("Location: {why}\r\n") } else { String::new() };
    format!(
        "HTTP/1.1 {status} {reason}\r\n{location}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Answers `status` over TLS and closes.
async fn reject_on<S: tokio::io::AsyncWrite + Unpin>(io: &mut S, status: u16, why: &str) {
    if io.write_all(rejection(status, why).as_bytes()).await.is_ok() {
        let _ = io.shutdown().await;
    }
}

/// Answers `status` with the API's JSON error body and closes.
async fn reject(stream: &TcpStream, status: u16, why: &str) {
    let resp = rejection(status, why);
    let mut out = resp.as_bytes();
    while !out.is_empty() {
        if stream.writable().await.is_err() {
            return;
        }
        match stream.try_write(out) {
            Ok(n) => out = &out[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
    crate::admit::linger_close(stream).await;
}

/// Whether a stream request may read `name` (the token, a `[[user]]`, `[auth]`): else 401.
async fn may_read(
    relay: &Arc<Relay>,
    peer: std::net::IpAddr,
    name: &str,
    auth: Option<&str>,
    query: Option<&str>,
) -> Result<(), (u16, String)> {
    let action = fanout_proto::auth::Action::Read;
    let local = crate::relay::http_login(relay, auth, query, peer, action, name);
    let ask = fanout_proto::auth::http_request(auth, query, peer, action, name, "http");
    match relay.permit(local, ask).await {
        true => Ok(()),
        false => Err((401, "missing or wrong credentials".to_string())),
    }
}

/// An HTTP-FLV (or WebSocket-FLV) player on `io` (plain or TLS), once it may read; refused
/// with the API's JSON error otherwise.
async fn start_flv<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + crate::write::OnTcp>(
    mut io: S,
    peer: Option<std::net::SocketAddr>,
    relay: &Arc<Relay>,
    asked: &Asked,
    slot: Slot,
) {
    let (name, auth, query) = (asked.name.as_str(), asked.auth.as_deref(), asked.query.as_deref());
    let ip = peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    match may_read(relay, ip, name, auth, query).await {
        Ok(()) => play_flv(io, peer, relay, asked, slot).await,
        Err((status, why)) => {
            tracing::info!(path = name, ?peer, "HTTP-FLV player refused: {why}");
            let _ = tokio::time::timeout(Duration::from_secs(1), reject_on(&mut io, status, &why)).await;
        }
    }
}

/// A plain HTTP-FLV player (not WebSocket) on `stream`, once it may read: handed to the data
/// plane as a sink of the path's FLV session, where every player's bytes are the ring's;
/// before the stream's first keyframe (its decoder configurations unknown) it is played by
/// a task instead, as a TLS or WebSocket player is.
async fn start_flv_sink(
    stream: TcpStream,
    peer: Option<std::net::SocketAddr>,
    relay: &Arc<Relay>,
    asked: &Asked,
    slot: Slot,
) {
    let (name, auth, query) = (asked.name.as_str(), asked.auth.as_deref(), asked.query.as_deref());
    let ip = peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let who = Who::new(Protocol::HttpFlv, peer, Some(&user_of(auth, query, ip)));
    let stall = Duration::from_secs_f64(relay.cfg().request_timeout_s.max(1.0));
    let handed = match may_read(relay, ip, name, auth, query).await {
        Ok(()) => flv::to_engine(stream, relay, name, who, stall).await,
        Err(refused) => Err((stream, refused)),
    };
    match handed {
        Ok(flv::Handed::Playing) => {}
        Ok(flv::Handed::NotYet(stream)) => play_flv(stream, peer, relay, asked, slot).await,
        Err((stream, (status, why))) => {
            tracing::info!(path = name, ?peer, "HTTP-FLV player refused: {why}");
            let _ = tokio::time::timeout(Duration::from_secs(1), reject(&stream, status, &why)).await;
        }
    }
}

/// An HTTP-FLV (or WebSocket-FLV) player on `io` that may read, played by a task of its own.
async fn play_flv<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + crate::write::OnTcp>(
    mut io: S,
    peer: Option<std::net::SocketAddr>,
    relay: &Arc<Relay>,
    asked: &Asked,
    slot: Slot,
) {
    let (name, auth, query) = (asked.name.as_str(), asked.auth.as_deref(), asked.query.as_deref());
    let ip = peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let protocol = if asked.websocket.is_some() { Protocol::WebSocketFlv } else { Protocol::HttpFlv };
    let who = Who::new(protocol, peer, Some(&user_of(auth, query, ip)));
    match flv::join(relay, name, who).await {
        Ok(player) => {
            drop(slot);
            crate::write::size_send_buffer(&io, player.send_buffer());
            let cfg = relay.cfg();
            let flush = Duration::from_millis(cfg.stream_flush_ms);
            let stall = Duration::from_secs_f64(cfg.request_timeout_s.max(1.0));
            drop(cfg);
            player.run(&mut io, asked.websocket.as_deref(), flush, stall).await;
        }
        Err((status, why)) => {
            tracing::info!(path = name, ?peer, "HTTP-FLV player refused: {why}");
            let _ = tokio::time::timeout(Duration::from_secs(1), reject_on(&mut io, status, &why)).await;
        }
    }
}

/// The session a stream request is for, or the status and reason to refuse it with.
async fn stream_session(
    relay: &Arc<Relay>,
    peer: std::net::IpAddr,
    name: &str,
    auth: Option<&str>,
    query: Option<&str>,
) -> Result<fanout_io::Session, (u16, String)> {
    may_read(relay, peer, name, auth, query).await?;
    // At its cap, a cluster node sends new players to a node with room (the token with them).
    if let Some(c) = &relay.cluster {
        if let Some(to) = c.redirect_http(name).await {
            tracing::info!(session = name, %to, "at the subscriber cap: HTTP player redirected");
            return Err((302, query.map_or(to.clone(), |q| format!("{to}?{q}"))));
        }
    }
    relay.http_session(name).await.map_err(|e| {
        let crate::error::ApiError(status, why) = e.into();
        (status.as_u16(), why)
    })
}

/// No length: the body is the live stream until either side closes. Any origin may read it
/// (a web player on another site, as from a CDN).
const STREAM_OK: &str = "HTTP/1.1 200 OK\r\nContent-Type: video/mp2t\r\nCache-Control: no-cache\r\n\
    Access-Control-Allow-Origin: *\r\nConnection: close\r\n\r\n";

async fn start_stream(
    mut stream: TcpStream,
    relay: &Arc<Relay>,
    name: &str,
    auth: Option<&str>,
    query: Option<&str>,
    head_len: usize,
) {
    let mut head = vec![0u8; head_len];
    if stream.read_exact(&mut head).await.is_err() {
        return;
    }
    let ip = stream.peer_addr().map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let session = match stream_session(relay, ip, name, auth, query).await {
        Ok(s) => s,
        Err((status, why)) => {
            let _ = tokio::time::timeout(Duration::from_secs(1), reject(&stream, status, &why)).await;
            return;
        }
    };
    let Some(readers) = readers_with_room(relay, name) else {
        let _ = tokio::time::timeout(Duration::from_secs(1), reject(&stream, 503, &full(name))).await;
        return;
    };
    if stream.write_all(STREAM_OK.as_bytes()).await.is_err() {
        return;
    }
    let peer = stream.peer_addr().ok();
    let sink = match stream.into_std().and_then(|s| session.add_stream_sink(s, true)) {
        Ok(id) => id,
        Err(e) => return tracing::warn!(session = name, ?peer, "cannot add HTTP subscriber: {e}"),
    };
    let who = Who::new(Protocol::HttpTs, peer, Some(&user_of(auth, query, ip)));
    // The engine holds the socket now: the reader stays until its sink goes.
    match readers.join(who, Arc::new(SinkReader { session: session.clone(), sink })) {
        Ok(r) => {
            tracing::info!(session = name, sink, ?peer, reader = r.id(), "HTTP subscriber joined");
            r.detach();
        }
        Err(f) => {
            tracing::info!(session = name, ?peer, "HTTP subscriber refused: {f}");
            session.remove_sink(sink);
        }
    }
}

/// The user a stream request's credentials name (Basic, or `user=` in its query), or "".
fn user_of(auth: Option<&str>, query: Option<&str>, ip: std::net::IpAddr) -> String {
    use fanout_proto::auth::{http_request, query_credentials, Action};
    let basic = http_request(auth, query, ip, Action::Read, "", "http").user;
    if basic.is_empty() {
        query_credentials(query.unwrap_or("")).0.unwrap_or_default().to_string()
    } else {
        basic
    }
}

/// The path's readers, if it has room for one more.
fn readers_with_room(relay: &Relay, name: &str) -> Option<crate::readers::Readers> {
    relay.path(name).map(|p| p.readers.clone()).filter(|r| !r.full())
}

fn full(name: &str) -> String {
    format!("{name} has its max_readers")
}

/// Packets an HTTPS subscriber may have queued before it waits in the ring (where a reader
/// that stays behind is lapped like any slow sink).
const HTTPS_QUEUE: usize = 1024;

/// An HTTPS subscriber: TLS encrypts per connection, so its packets go through a queue this
/// task drains into the TLS stream (the plain path hands the socket to the engine instead).
async fn start_tls_stream(
    mut io: tokio_rustls::server::TlsStream<TcpStream>,
    relay: &Arc<Relay>,
    name: &str,
    auth: Option<&str>,
    query: Option<&str>,
) {
    let ip = io.get_ref().0.peer_addr().map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let session = match stream_session(relay, ip, name, auth, query).await {
        Ok(s) => s,
        Err((status, why)) => {
            let _ = tokio::time::timeout(Duration::from_secs(1), reject_on(&mut io, status, &why)).await;
            return;
        }
    };
    let peer = io.get_ref().0.peer_addr().unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
    let who = Who::new(Protocol::HttpTs, Some(peer), Some(&user_of(auth, query, ip)));
    let held = Arc::new(Held::default());
    let joined = readers_with_room(relay, name).map(|r| r.join(who, held.clone()));
    let Some(Ok(_registered)) = joined else {
        let _ = tokio::time::timeout(Duration::from_secs(1), reject_on(&mut io, 503, &full(name))).await;
        return;
    };
    if io.write_all(STREAM_OK.as_bytes()).await.is_err() {
        return;
    }
    crate::write::size_send_buffer(&io, session.stream_send_buffer());
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = wake.clone();
    let cap = HTTPS_QUEUE.min(session.config().ring_capacity / 2);
    let queue = fanout_io::channel::ChannelQueue::new(cap, move || w.notify_one());
    let id = match session.add_channel_sink(peer, queue.clone(), true) {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(session = name, %peer, "cannot add HTTPS subscriber: {e}");
            return;
        }
    };
    tracing::info!(session = name, sink = id, %peer, "HTTPS subscriber joined");
    let (mut packets, mut out) = (Vec::new(), Vec::new());
    let mut scratch = [0u8; 512];
    loop {
        tokio::select! {
            _ = wake.notified() => {
                queue.drain(&mut packets);
                out.clear();
                let n = packets.len() as u64;
                for (p, _) in packets.drain(..) {
                    out.extend_from_slice(p.payload());
                }
                if io.write_all(&out).await.is_err() {
                    break;
                }
                held.sent(out.len(), n);
            }
            // Kicked, or the path went: the stream ends.
            _ = held.end.wait() => break,
            // The client sends nothing more; a read that ends is its leaving.
            r = io.read(&mut scratch) => if !matches!(r, Ok(n) if n > 0) { break },
        }
    }
    session.remove_sink(id);
    tracing::info!(session = name, sink = id, %peer, "HTTPS subscriber left");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_steps_is_one_route_segment() {
        let req = |uri: &str| axum::http::Request::builder().uri(uri).body(()).unwrap();
        let out = name_steps_as_one(req("/v1/sessions/live/cam1/hls/index.m3u8?token=t"));
        assert_eq!(out.uri().path(), "/v1/sessions/live%2Fcam1/hls/index.m3u8");
        assert_eq!(out.uri().query(), Some("token=t"));
        let out = name_steps_as_one(req("/v1/sessions/cam/readers"));
        assert_eq!(out.uri().path(), "/v1/sessions/cam/readers", "a one-step name is left alone");
    }

    #[test]
    fn a_stream_reader_is_named_by_basic_or_the_query() {
        let ip = std::net::IpAddr::from([127, 0, 0, 1]);
        let basic = "Basic YW5uOnB3"; // ann:pw
        assert_eq!(user_of(Some(basic), Some("user=bob&pass=x"), ip), "ann");
        assert_eq!(user_of(None, Some("user=bob&pass=x"), ip), "bob");
        assert_eq!(user_of(None, None, ip), "");
    }
}
