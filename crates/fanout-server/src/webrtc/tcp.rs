//! ICE-TCP (passive, RFC 6544 framing) on the WebRTC port, for peers whose networks block UDP.

use super::*;

/// ICE-TCP (RFC 6544), passive, for networks that block UDP. Each connection carries RFC
/// 4571 frames (a 2-byte length, then a STUN message or a DTLS/SRTP datagram); what it brings
/// goes to the task as a datagram would, and what the task sends to its address goes back
/// on it.
pub(super) struct TcpSide {
    /// Each connection's outgoing frames, by its peer's address.
    pub(super) writers: Mutex<HashMap<SocketAddr, mpsc::Sender<Vec<u8>>>>,
    pub(super) local: SocketAddr,
}

/// Frames queued for one ICE-TCP connection; past them, frames are dropped (as UDP would).
pub(super) const TCP_QUEUE: usize = 512;
/// An ICE-TCP connection silent this long is closed (ICE checks come every few seconds).
pub(super) const TCP_IDLE: Duration = Duration::from_secs(30);

impl TcpSide {
    pub(super) fn send(&self, to: SocketAddr, data: &[u8]) {
        let Ok(len) = u16::try_from(data.len()) else { return };
        let mut frame = Vec::with_capacity(2 + data.len());
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(data);
        if let Some(w) = self.writers.lock().get(&to) {
            let _ = w.try_send(frame);
        }
    }
}

pub(super) async fn tcp_accept(
    listener: tokio::net::TcpListener,
    side: Arc<TcpSide>,
    to_task: mpsc::Sender<(SocketAddr, Vec<u8>)>,
    gate: Arc<Gate>,
) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Counted with the address's other WebRTC peers.
        let Some(pass) = gate.admit(peer.ip()) else { continue };
        let _ = stream.set_nodelay(true);
        let (tx, rx) = mpsc::channel(TCP_QUEUE);
        side.writers.lock().insert(peer, tx);
        let (side, to_task) = (side.clone(), to_task.clone());
        tokio::spawn(async move {
            let _pass = pass;
            tcp_conn(stream, peer, rx, to_task).await;
            side.writers.lock().remove(&peer);
        });
    }
}

/// One ICE-TCP connection: its frames in to the task, the task's frames out, until either
/// side ends or it is silent for `TCP_IDLE`.
pub(super) async fn tcp_conn(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    mut out: mpsc::Receiver<Vec<u8>>,
    to_task: mpsc::Sender<(SocketAddr, Vec<u8>)>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut r, mut w) = stream.into_split();
    let writer = async move {
        while let Some(frame) = out.recv().await {
            if w.write_all(&frame).await.is_err() {
                break;
            }
        }
    };
    let reader = async move {
        loop {
            let Ok(Ok(len)) = tokio::time::timeout(TCP_IDLE, r.read_u16()).await else { break };
            let mut data = vec![0u8; usize::from(len)];
            if !matches!(tokio::time::timeout(TCP_IDLE, r.read_exact(&mut data)).await, Ok(Ok(_))) {
                break;
            }
            if to_task.send((peer, data)).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        _ = reader => {}
    }
}
