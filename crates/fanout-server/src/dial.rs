//! A TCP connection to another server, and TLS over it where asked (the certificate checked
//! as the client configuration says): what RTMP forwards and RTMP pulls connect with; and
//! an RTMP client's start on it.

use fanout_proto::rtmp::client::{Client, Event};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// An RTMP client's C1 random bytes: any varying number.
pub fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Connects to `host:port` within `limit` (and does the TLS handshake within it again).
pub async fn dial(
    host: &str,
    port: u16,
    tls: Option<&Arc<rustls::ClientConfig>>,
    limit: Duration,
) -> Result<(Box<dyn Io>, std::net::SocketAddr), String> {
    let tcp = tokio::time::timeout(limit, tokio::net::TcpStream::connect((host, port)))
        .await
        .map_err(|_| format!("connecting timed out after {limit:?}"))?
        .map_err(|e| format!("connecting: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let peer = tcp.peer_addr().map_err(|e| format!("connecting: {e}"))?;
    let Some(cfg) = tls else { return Ok((Box::new(tcp), peer)) };
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is no server name: {e}"))?;
    let tls = tokio::time::timeout(limit, tokio_rustls::TlsConnector::from(cfg.clone()).connect(name, tcp))
        .await
        .map_err(|_| format!("the TLS handshake timed out after {limit:?}"))?
        .map_err(|e| format!("TLS: {e}"))?;
    Ok((Box::new(tls), peer))
}

/// The RTMP handshake, connect, createStream and publish or play on `io`, until the server
/// starts the stream (within `limit`), or why not.
pub async fn rtmp_start(
    io: &mut Box<dyn Io>,
    client: &mut Client,
    buf: &mut [u8],
    limit: Duration,
) -> Result<(), String> {
    let started = tokio::time::timeout(limit, async {
        loop {
            let out = client.take_output();
            io.write_all(&out).await.map_err(|e| format!("the server went: {e}"))?;
            let n = io.read(buf).await.map_err(|e| format!("the server went: {e}"))?;
            if n == 0 {
                return Err("the server closed the connection before the stream started".to_string());
            }
            client.input(&buf[..n]).map_err(|e| format!("the server's RTMP: {e}"))?;
            while let Some(e) = client.poll_event() {
                match e {
                    Event::Started => return Ok(()),
                    Event::Refused(why) => return Err(format!("refused: {why}")),
                    _ => {}
                }
            }
        }
    })
    .await;
    started.map_err(|_| format!("the server did not start the stream within {limit:?}"))?
}

/// A UDP socket on the address this machine reaches `host` from (a WebRTC peer's candidate),
/// and the address it reaches.
pub fn udp_towards(host: &str, port: u16) -> Result<(std::net::UdpSocket, std::net::SocketAddr), String> {
    use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
    let far: SocketAddr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))?;
    let any: SocketAddr =
        if far.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let probe = UdpSocket::bind(any).map_err(|e| e.to_string())?;
    probe.connect(far).map_err(|e| format!("no route to {far}: {e}"))?;
    let ip = probe.local_addr().map_err(|e| e.to_string())?.ip();
    let socket = UdpSocket::bind((ip, 0)).map_err(|e| format!("a UDP socket on {ip}: {e}"))?;
    Ok((socket, far))
}
