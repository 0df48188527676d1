//! `tcp_listen` and `tcp_connect`: a byte stream from one TCP publisher at a time, accepted
//! or connected to (again, with backoff, when it goes).

use super::{Ctx, Started};
use crate::error::RelayError;
use fanout_io::Session;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub async fn listen(addr: SocketAddr, cx: &Ctx<'_>) -> Result<Started, RelayError> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| RelayError::Conflict(format!("cannot listen on tcp {addr}: {e}")))?;
    let bound = l.local_addr().unwrap_or(addr);
    cx.session.set_source_kind(format!("tcp listen {bound}"));
    cx.session.set_source_addr(bound);
    Ok(Started::plain(vec![tokio::spawn(accept_publishers(l, cx.session.clone())).abort_handle()]))
}

pub fn connect(addr: SocketAddr, cx: &Ctx) -> Started {
    cx.session.set_source_kind(format!("tcp connect {addr}"));
    Started::plain(vec![tokio::spawn(connect_publisher(addr, cx.session.clone())).abort_handle()])
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
async fn connect_publisher(addr: SocketAddr, session: Session) {
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
