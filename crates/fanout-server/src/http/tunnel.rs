//! RTSP over HTTP on the API's port: each half of a tunnel as it comes; the `GET` waits for
//! its `POST` (by `x-sessioncookie`, for up to `request_timeout_s`), then the pair is the
//! RTSP face's connection (see `crate::tunnel`).

use super::*;
use crate::tunnel::{Pairing, Tunnel};

/// The GETs waiting for their POST.
static PAIRING: std::sync::LazyLock<Pairing> = std::sync::LazyLock::new(Pairing::default);

/// One half of a tunnel, as its head asked.
pub(super) struct Half {
    post: bool,
    cookie: String,
    head_len: usize,
}

impl From<fanout_proto::http::TunnelRequest<'_>> for Half {
    fn from(t: fanout_proto::http::TunnelRequest<'_>) -> Self {
        Half { post: t.post, cookie: t.cookie.to_string(), head_len: t.head_len }
    }
}

/// Serves one half: a POST is handed to its GET; a GET answers 200 and, once its POST came,
/// is served as an RTSP connection until it ends. Neither holds an API connection slot once
/// paired (the RTSP connection is bounded by the per-address cap it came in under).
pub(super) async fn half(mut stream: TcpStream, relay: &Arc<Relay>, h: Half, head_timeout: Duration, slot: Slot) {
    let peer = stream.peer_addr().ok();
    let mut head = vec![0u8; h.head_len];
    if stream.read_exact(&mut head).await.is_err() {
        return;
    }
    if h.post {
        drop(slot);
        // A client may send its POST without waiting for the GET's answer: its GET may not
        // be waiting yet. A second is given for it.
        let mut post = PAIRING.post(&h.cookie, stream);
        for _ in 0..20 {
            let Err(up) = post else { break };
            tokio::time::sleep(Duration::from_millis(50)).await;
            post = PAIRING.post(&h.cookie, up);
        }
        if let Err(up) = post {
            tracing::info!(?peer, "RTSP over HTTP: a POST whose x-sessioncookie no GET waits with");
            let why = "no tunnel GET waits with this x-sessioncookie";
            let _ = tokio::time::timeout(Duration::from_secs(1), reject(&up, 404, why)).await;
        }
        return;
    }
    let Some(front) = relay.rtsp.lock().clone() else {
        let _ = tokio::time::timeout(Duration::from_secs(1), reject(&stream, 404, "RTSP is off")).await;
        return;
    };
    let Some(mut waiting) = PAIRING.wait(&h.cookie) else {
        let why = "this x-sessioncookie is in use (or too many tunnels wait for their POST)";
        let _ = tokio::time::timeout(Duration::from_secs(1), reject(&stream, 409, why)).await;
        return;
    };
    let ok = "HTTP/1.0 200 OK\r\nServer: fanout\r\nConnection: close\r\nCache-Control: no-store\r\n\
              Pragma: no-cache\r\nContent-Type: application/x-rtsp-tunnelled\r\n\r\n";
    if stream.write_all(ok.as_bytes()).await.is_err() {
        return;
    }
    let up = match tokio::time::timeout(head_timeout, waiting.post()).await {
        Ok(Some(up)) => up,
        _ => {
            tracing::info!(?peer, "RTSP over HTTP: no POST came within {head_timeout:?}: closed");
            return;
        }
    };
    drop((waiting, slot));
    let Some(peer) = peer else { return };
    front.serve_tunnel(relay.clone(), Tunnel::new(stream, up), peer).await;
}
