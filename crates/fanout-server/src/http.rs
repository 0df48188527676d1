//! The HTTP listener: API requests go to axum; `GET /v1/sessions/{name}/stream` is answered
//! here and its socket is handed to the engine as a sink, so stream bytes never pass
//! through the async runtime.

use crate::api::authorized;
use crate::relay::Relay;
use fanout_proto::http::{classify, Head};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head we look at before deciding.
const MAX_HEAD: usize = 8192;
pub async fn serve(listener: TcpListener, relay: Arc<Relay>, router: axum::Router) {
    let max = relay.cfg.api_max_connections;
    let head_timeout = Duration::from_secs_f64(relay.cfg.request_timeout_s);
    let limit = Arc::new(tokio::sync::Semaphore::new(max));
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
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (relay, router) = (relay.clone(), router.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match stream_request(&stream, head_timeout).await {
                Some(Ok((name, auth, query, head_len))) => {
                    start_stream(stream, &relay, &name, auth.as_deref(), query.as_deref(), head_len).await
                }
                Some(Err(())) => {}
                None => {
                    let svc = TowerToHyperService::new(router);
                    // Every request head, the first and each kept-alive one, must arrive whole
                    // within the timeout: a trickle of bytes does not hold the connection.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(head_timeout)
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                }
            }
        });
    }
}

type Parsed = (String, Option<String>, Option<String>, usize);

/// Peeks at the request head (without consuming it, so hyper can read it if it is not ours).
/// `None`: the API's; `Some(Err(()))`: answered or dropped here.
async fn stream_request(stream: &TcpStream, head_timeout: Duration) -> Option<Result<Parsed, ()>> {
    let mut buf = vec![0u8; MAX_HEAD];
    let deadline = tokio::time::Instant::now() + head_timeout;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Some(Err(())),
            Ok(Ok(n)) => n,
        };
        match classify(&buf[..n], MAX_HEAD) {
            Head::Stream(r) => {
                let p = (
                    r.session.to_string(),
                    r.authorization.map(str::to_string),
                    r.query.map(str::to_string),
                    r.head_len,
                );
                return Some(Ok(p));
            }
            Head::Api => return None,
            // What hyper would answer with an empty body (or not at all): the API's JSON.
            Head::Reject(status, why) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), reject(stream, status, why)).await;
                return Some(Err(()));
            }
            // A peek of bytes already there returns at once: the deadline is checked here.
            Head::Incomplete if tokio::time::Instant::now() >= deadline => return Some(Err(())),
            Head::Incomplete => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Answers `status` with the API's JSON error body and closes.
async fn reject(stream: &TcpStream, status: u16, why: &str) {
    let reason = axum::http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error");
    let body = serde_json::json!({ "error": why, "status": status }).to_string();
    let resp = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
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
    // Closing with unread bytes would reset the connection and could lose the answer: end
    // our side, then read what the client still sends for a moment.
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
    let mut scratch = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(300), async {
        while stream.readable().await.is_ok() {
            match stream.try_read(&mut scratch) {
                Ok(0) => return,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return,
                _ => {}
            }
        }
    })
    .await;
}

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
    let session = if !authorized(relay.cfg.token.as_deref(), auth, query) {
        Err((401, "missing or wrong bearer token".to_string()))
    } else {
        relay.http_session(name).await.map_err(|e| {
            let crate::api::ApiError(status, why) = e.into();
            (status.as_u16(), why)
        })
    };
    let session = match session {
        Ok(s) => s,
        Err((status, why)) => {
            let _ = tokio::time::timeout(Duration::from_secs(1), reject(&stream, status, &why)).await;
            return;
        }
    };
    // No length: the body is the live stream until either side closes.
    let ok = "HTTP/1.1 200 OK\r\nContent-Type: video/mp2t\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
    if stream.write_all(ok.as_bytes()).await.is_err() {
        return;
    }
    let peer = stream.peer_addr().ok();
    match stream.into_std().and_then(|s| session.add_stream_sink(s, true)) {
        Ok(id) => tracing::info!(session = name, sink = id, ?peer, "HTTP subscriber joined"),
        Err(e) => tracing::warn!(session = name, ?peer, "cannot add HTTP subscriber: {e}"),
    }
}
