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

/// The HTTP side of a WHIP or WHEP session the relay starts (a WHIP forward, a WHEP pull):
/// its offer POSTed and answered; the session is DELETEd on the server when this goes.
pub struct WhipHttp {
    agent: ureq::Agent,
    authorization: Option<String>,
    resource: Option<String>,
}

impl WhipHttp {
    /// POSTs `offer` to `url` (its credentials as `Authorization`, `tls` for an `https://`
    /// endpoint checked otherwise than against the public roots): the session, and the
    /// answer's SDP; `Err` with why the server refused or could not be reached.
    pub fn offer(
        url: &fanout_proto::whep::WhipUrl,
        tls: Option<&Arc<rustls::ClientConfig>>,
        offer: &str,
        limit: Duration,
    ) -> Result<(Self, String), String> {
        let mut agent =
            ureq::AgentBuilder::new().timeout(limit).user_agent(concat!("fanout/", env!("CARGO_PKG_VERSION")));
        if let Some(tls) = tls {
            agent = agent.tls_config(tls.clone());
        }
        let agent = agent.build();
        let mut post = agent.post(&url.url).set("Content-Type", "application/sdp");
        if let Some(a) = &url.authorization {
            post = post.set("Authorization", a);
        }
        match post.send_string(offer) {
            Ok(r) => {
                let resource = r.header("Location").map(|l| url.resource(l));
                let answer = r.into_string().map_err(|e| format!("the answer: {e}"))?;
                Ok((Self { agent, authorization: url.authorization.clone(), resource }, answer))
            }
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                Err(format!("the server refused the offer: {code} {}", body.trim()))
            }
            Err(e) => Err(format!("the offer: {e}")),
        }
    }
}

impl Drop for WhipHttp {
    /// The session's end, told to the server, as far as it listens (2 s at most).
    fn drop(&mut self) {
        let Some(r) = self.resource.take() else { return };
        let mut delete = self.agent.delete(&r).timeout(Duration::from_secs(2));
        if let Some(a) = &self.authorization {
            delete = delete.set("Authorization", a);
        }
        let _ = delete.call();
    }
}

/// Hands `rtc` what `socket` (at `local`) brings within `wait`: a datagram, or else the time.
pub fn rtc_input(
    rtc: &mut str0m::Rtc,
    socket: &std::net::UdpSocket,
    local: std::net::SocketAddr,
    buf: &mut [u8],
    wait: Duration,
) -> Result<(), String> {
    use str0m::net::{Protocol, Receive};
    let _ = socket.set_read_timeout(Some(wait));
    let now = std::time::Instant::now();
    let input = match socket.recv_from(buf) {
        Ok((n, source)) => match buf[..n].try_into() {
            Ok(contents) => {
                str0m::Input::Receive(now, Receive { proto: Protocol::Udp, source, destination: local, contents })
            }
            Err(_) => return Ok(()), // (not a datagram str0m reads: dropped)
        },
        Err(_) => str0m::Input::Timeout(now),
    };
    rtc.handle_input(input).map_err(|e| format!("WebRTC: {e}"))
}
