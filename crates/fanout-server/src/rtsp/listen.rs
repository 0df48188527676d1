//! The RTSP and RTSPS listeners: admission (per address, in all), TLS handshakes, and the
//! expiry of silent sessions.

use super::*;

/// Accepts RTSP (and, with a TLS acceptor, RTSPS) connections on `listeners` until aborted;
/// the RTSP server's own tasks (expiry, RTCP, publishers' UDP, keyframe requests, sender
/// reports) run as long.
pub async fn serve(
    listeners: Vec<(TcpListener, Option<tokio_rustls::TlsAcceptor>)>,
    relay: Arc<Relay>,
    rtsp: Arc<Rtsp>,
) {
    let sock = rtsp.rtcp.lock().take().and_then(|s| {
        s.set_nonblocking(true).ok()?;
        tokio::net::UdpSocket::from_std(s).ok().map(Arc::new)
    });
    *rtsp.rtcp_out.lock() = sock.clone();
    // Publishers' RTP and RTCP over UDP.
    let record: Vec<Arc<tokio::net::UdpSocket>> = rtsp
        .record
        .lock()
        .take()
        .into_iter()
        .flat_map(|(a, b)| [a, b])
        .filter_map(|s| {
            s.set_nonblocking(true).ok()?;
            tokio::net::UdpSocket::from_std(s).ok().map(Arc::new)
        })
        .collect();
    // Keyframe requests go back to a UDP publisher from the port its RTCP comes to.
    let record_rtcp = (record.len() == 2).then(|| record[1].clone());
    let mut tasks = vec![
        spawn(expire(relay.clone(), rtsp.clone())),
        spawn(keyframe_requests(relay.clone(), rtsp.clone(), record_rtcp)),
    ];
    if let Some(sock) = sock {
        tasks.push(spawn(rtcp_in(relay.clone(), rtsp.clone(), sock.clone())));
        tasks.push(spawn(sender_reports(relay.clone(), rtsp.clone(), sock)));
    }
    tasks.extend(record.into_iter().map(|sock| spawn(publishers_udp(relay.clone(), rtsp.clone(), sock))));
    // RTSP and RTSPS share their caps: the connections open, and those per address.
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let next_conn = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let gate = crate::admit::Gate::new("RTSP per-address cap (max_connections_per_ip)", relay.books.clone());
    for (l, tls) in listeners {
        let counts = Counts { open: open.clone(), next_conn: next_conn.clone(), gate: gate.clone() };
        tasks.push(spawn(accept(l, tls, relay.clone(), rtsp.clone(), counts)));
    }
    // Until aborted; the tasks go with it.
    let _tasks = tasks;
    std::future::pending::<()>().await;
}

/// A task stopped when `serve` is aborted.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn spawn(f: impl std::future::Future<Output = ()> + Send + 'static) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(f))
}

/// Every 5 s, RTSP sessions silent past their timeout are torn down.
async fn expire(relay: Arc<Relay>, rtsp: Arc<Rtsp>) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let actions = rtsp.server.lock().expire(rtsp.now_ms());
        if !actions.is_empty() {
            rtsp.apply(&relay, IpAddr::from([0, 0, 0, 0]), actions);
        }
    }
}

/// Clients' RTCP on the `server_port` pair.
async fn rtcp_in(relay: Arc<Relay>, rtsp: Arc<Rtsp>, sock: Arc<tokio::net::UdpSocket>) {
    let mut buf = [0u8; 2048];
    while let Ok((n, from)) = sock.recv_from(&mut buf).await {
        rtsp.rtcp_from(&relay, from, &buf[..n]);
    }
}

/// Publishers' RTP and RTCP over UDP on one record port, each datagram taken only from the
/// ports its publisher's SETUP named; their media keeps their RTSP sessions alive.
async fn publishers_udp(relay: Arc<Relay>, rtsp: Arc<Rtsp>, sock: Arc<tokio::net::UdpSocket>) {
    let mut buf = vec![0u8; 65_536];
    let mut touched = Instant::now();
    while let Ok((n, from)) = sock.recv_from(&mut buf).await {
        let session = relay.publishers().iter().find_map(|p| p.feed_udp(from, &mut buf[..n]));
        if let Some(id) = session.filter(|_| touched.elapsed() >= Duration::from_secs(1)) {
            touched = Instant::now();
            rtsp.server.lock().touch(&id, rtsp.now_ms());
        }
    }
}

/// Readers' keyframe requests, passed to RTSP publishers (`Publisher::keyframe_requests`):
/// over UDP from the record RTCP port, or on the publisher's connection.
async fn keyframe_requests(relay: Arc<Relay>, rtsp: Arc<Rtsp>, record_rtcp: Option<Arc<tokio::net::UdpSocket>>) {
    let reporter = crate::track::random_start().1;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (to, rtcp) in relay.publishers().iter().flat_map(|p| p.keyframe_requests(reporter)) {
            match to {
                crate::publish::RtcpTo::Udp(addr) => {
                    if let Some(s) = &record_rtcp {
                        let _ = s.send_to(&rtcp, addr).await;
                    }
                }
                crate::publish::RtcpTo::Conn(conn, channel) => on_conn(&rtsp, conn, channel, rtcp),
            }
        }
    }
}

/// Every 5 s, each playing client's sender reports.
async fn sender_reports(relay: Arc<Relay>, rtsp: Arc<Rtsp>, sock: Arc<tokio::net::UdpSocket>) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        for (to, sr) in rtsp.sender_reports(&relay) {
            match to {
                ReportTo::Udp(addr) => {
                    let _ = sock.send_to(&sr, addr).await;
                }
                ReportTo::Conn(conn, channel) => on_conn(&rtsp, conn, channel, sr),
            }
        }
    }
}

/// RTCP for a client's or publisher's connection, written by its task between frames.
fn on_conn(rtsp: &Rtsp, conn: u64, channel: u8, rtcp: Vec<u8>) {
    if let Some(c) = rtsp.conns.lock().get(&conn) {
        c.control.lock().push((channel, rtcp));
        c.notify.notify_one();
    }
}

/// What an RTSP connection runs over: TCP, or TLS on TCP (RTSPS).
pub(super) trait RtspIo:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + crate::write::OnTcp
{
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + crate::write::OnTcp> RtspIo for S {}

/// What the RTSP listeners count together.
pub(super) struct Counts {
    pub(super) open: Arc<std::sync::atomic::AtomicUsize>,
    pub(super) next_conn: Arc<std::sync::atomic::AtomicU64>,
    pub(super) gate: Arc<crate::admit::Gate>,
}

/// A refused connection gets a real server's answer if its socket takes it at once, then is
/// closed: no task and no wait per refusal, however many come.
pub(super) fn refuse(stream: TcpStream) {
    let mut out = Vec::new();
    Response::new(503, None).write(&mut out);
    let _ = stream.try_write(&out);
}

/// Accepts connections on one listener (with `tls`: RTSPS) until aborted.
pub(super) async fn accept(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    relay: Arc<Relay>,
    rtsp: Arc<Rtsp>,
    Counts { open, next_conn, gate }: Counts,
) {
    let (max, idle) = (relay.cfg().rtsp_max_connections, Duration::from_secs_f64(relay.cfg().rtsp_idle_s.max(0.1)));
    // Until an upgrade's new process takes the socket over.
    let mut listener = relay.handover.listener(listener);
    let head_timeout = Duration::from_secs_f64(relay.cfg().request_timeout_s);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("rtsp accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        use std::sync::atomic::Ordering::Relaxed;
        // The address's own cap first: one address at it cannot take the slots left.
        let Some(pass) = gate.admit(peer.ip()) else {
            refuse(stream);
            continue;
        };
        if open.load(Relaxed) >= max {
            relay.books.refuse("RTSP connection cap (rtsp_max_connections)", peer.ip());
            refuse(stream);
            continue;
        }
        open.fetch_add(1, Relaxed);
        let face = if tls.is_some() { "rtsps" } else { "rtsp" };
        let pass = pass.connected(face, peer.to_string(), &tokio::runtime::Handle::current());
        let conn = next_conn.fetch_add(1, Relaxed) + 1;
        let (relay, rtsp, open, tls) = (relay.clone(), rtsp.clone(), open.clone(), tls.clone());
        rtsp.server.lock().connection_opened(conn, peer.ip());
        tokio::spawn(async move {
            let timeouts = (idle, head_timeout);
            let r = match tls {
                None => connection(stream, false, peer, conn, timeouts, &relay, &rtsp).await,
                Some(tls) => match handshake(stream, peer, &tls, head_timeout).await {
                    Some(s) => {
                        rtsp.server.lock().set_secure(conn, rtsp.srtp.is_some());
                        connection(s, true, peer, conn, timeouts, &relay, &rtsp).await
                    }
                    None => Ok(()),
                },
            };
            if let Err(e) = r {
                tracing::debug!(%peer, "rtsp connection: {e}");
            }
            open.fetch_sub(1, Relaxed);
            drop(pass);
            let actions = rtsp.server.lock().connection_closed(conn);
            rtsp.apply(&relay, peer.ip(), actions);
        });
    }
}

/// Tunnels' connection numbers, apart from the listeners' (which count from 1).
const TUNNEL_CONNS: u64 = 1 << 48;

/// An RTSP-over-HTTP tunnel's connection, served as a listener's is (its caps were the HTTP
/// port's).
pub(super) async fn tunnel(t: crate::tunnel::Tunnel, peer: SocketAddr, relay: Arc<Relay>, rtsp: Arc<Rtsp>) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(TUNNEL_CONNS);
    let conn = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    let idle = Duration::from_secs_f64(relay.cfg().rtsp_idle_s.max(0.1));
    let head_timeout = Duration::from_secs_f64(relay.cfg().request_timeout_s);
    rtsp.server.lock().connection_opened(conn, peer.ip());
    tracing::info!(%peer, "RTSP over HTTP: a tunnel opened");
    if let Err(e) = connection(t, false, peer, conn, (idle, head_timeout), &relay, &rtsp).await {
        tracing::debug!(%peer, "rtsp tunnel: {e}");
    }
    let actions = rtsp.server.lock().connection_closed(conn);
    rtsp.apply(&relay, peer.ip(), actions);
}

/// The TLS handshake of an RTSPS connection; a plaintext client (or a failed handshake) is
/// logged and closed.
pub(super) async fn handshake(
    stream: TcpStream,
    peer: SocketAddr,
    tls: &tokio_rustls::TlsAcceptor,
    timeout: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0u8; 2];
    match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 && !crate::tls::looks_like_tls(&first[..n]) => {
            tracing::warn!(%peer, "plaintext RTSP on the RTSPS port: closed");
            crate::admit::linger_close(&stream).await;
            return None;
        }
        Ok(Ok(n)) if n > 0 => {}
        _ => return None,
    }
    match tokio::time::timeout(timeout, tls.accept(stream)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::info!(%peer, "RTSPS handshake failed: {e}");
            None
        }
        Err(_) => {
            tracing::info!(%peer, "RTSPS handshake incomplete after {timeout:?}: closed");
            None
        }
    }
}
