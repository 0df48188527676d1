//! RTSP for clients: every RTP relay session is `rtsp://HOST:PORT/{session}`. The protocol
//! is `fanout_proto::rtsp::server`'s state machine; this module only moves bytes and turns
//! its actions into sinks of the session: a UDP client's RTP port (sent from `server_port`),
//! or, for RTP interleaved on the connection, a channel sink this connection's task drains
//! and frames. RTSP clients share the relay's data paths with every other sink.
//!
//! RTCP on the `server_port` pair: every 5 s each playing client gets a sender report (the
//! stream's SSRC, wall clock and RTP time, what its sink was sent); clients' receiver
//! reports keep their sessions alive and are shown in `GET /v1/rtsp`, with the round trip
//! their LSR/DLSR give.
//!
//! Sessions with an `rtsp://` source (`crate::upstream`) have a track per upstream media
//! section, each a relay session, and the demo has a view of its own (H.264 + AAC); a
//! client's track is a sink of that track's session.

mod actions;
mod conn;
mod keys;
mod listen;
mod rtcp;

use conn::*;
pub use listen::serve;
use listen::*;

use crate::clients::{ClientSink, ClientStatus};
use crate::relay::Relay;
use fanout_io::sys::ntp_now;
use fanout_proto::rtsp::server::{Action, Config, Resource, Server};
use fanout_proto::rtsp::{self, Limits, Lower, Message, Response};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One RTSP client session as the data path sees it.
struct Client {
    resource: String,
    peer: IpAddr,
    /// The RTSP connection it set up on (interleaved tracks are served there).
    conn: u64,
    /// Set-up tracks: the track and its lower transport.
    tracks: Vec<(usize, Lower)>,
    /// The relay sinks while playing.
    sinks: Vec<Placed>,
    /// It gets SRTP (set up on an RTSPS connection whose description carried keys).
    srtp: bool,
    /// Per track, the key of its SRTCP, where its SETUP gave one (`KeyMgmt`).
    srtcp_in: Vec<(usize, fanout_proto::rtp::srtp::Context)>,
    /// Its SRTCP that failed the check under that key: dropped.
    srtcp_dropped: u64,
    reports: u64,
    last_report: Option<(fanout_proto::rtp::rtcp::ReportBlock, Instant)>,
    rtt: Option<Duration>,
    /// Report blocks about a source it is not sent (an unknown SSRC): ignored, counted.
    foreign_blocks: u64,
    /// Keyframes it asked for (PLI, FIR): each marks the track's session as wanting one.
    keyframe_requests: u64,
    /// Its place among its path's readers while it plays.
    reader: Option<crate::readers::Registered>,
}

impl Client {
    fn new(resource: String, peer: IpAddr, conn: u64, srtp: bool) -> Self {
        Client {
            resource,
            peer,
            conn,
            tracks: Vec::new(),
            sinks: Vec::new(),
            srtp,
            srtcp_in: Vec::new(),
            srtcp_dropped: 0,
            reports: 0,
            last_report: None,
            rtt: None,
            foreign_blocks: 0,
            keyframe_requests: 0,
            reader: None,
        }
    }
}

/// One of a client's sinks: its track, and where it lives: the track's session, or for an
/// SRTP client the session of the key epoch it joined.
struct Placed {
    track: usize,
    id: u64,
    session: fanout_io::Session,
    srtp: Option<Arc<crate::srtp_out::Epoch>>,
    /// The track's own session (whose SSRC its RTCP BYE names).
    track_session: fanout_io::Session,
}

/// An RTSP client as one of its path's readers: counted by its sinks, ended by an RTCP BYE
/// and the close of its connection.
struct RtspReader {
    rtsp: std::sync::Weak<Rtsp>,
    session: String,
    /// Its sinks as it started playing (a new PLAY after PAUSE joins anew). (Not read from
    /// `Rtsp.clients`: a registration is dropped under that lock.)
    sinks: Vec<(fanout_io::Session, u64)>,
}

impl crate::readers::Reader for RtspReader {
    fn counters(&self) -> crate::readers::Counters {
        let statuses = self.sinks.iter().filter_map(|(session, id)| session.sink_status(*id));
        statuses.fold(Default::default(), |c, s| crate::readers::Counters {
            bytes: c.bytes + s.bytes_sent,
            packets: c.packets + s.packets_sent,
            skips: c.skips + s.packets_skipped,
        })
    }

    fn close(&self, _reason: &str) {
        if let Some(rtsp) = self.rtsp.upgrade() {
            rtsp.end_clients(|id, _| id == self.session);
        }
    }
}

impl crate::relay::RtspFront for Rtsp {
    fn end_resource(&self, name: &str) {
        Rtsp::end_resource(self, name)
    }
    fn clients(&self) -> Vec<ClientStatus> {
        Rtsp::clients(self)
    }
    fn set_users(&self, users: Vec<(String, String)>) {
        self.server.lock().set_users(users);
    }
    fn serve_tunnel(
        &self,
        relay: Arc<Relay>,
        tunnel: crate::tunnel::Tunnel,
        peer: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let rtsp = self.me.upgrade();
        Box::pin(async move {
            if let Some(rtsp) = rtsp {
                listen::tunnel(tunnel, peer, relay, rtsp).await;
            }
        })
    }
}

pub struct Rtsp {
    /// Itself, for the readers it registers.
    me: std::sync::Weak<Rtsp>,
    server: Mutex<Server>,
    clients: Mutex<HashMap<String, Client>>,
    started: Instant,
    /// `server_port`: RTP (reserved, clients' NAT-opening packets land and stay there) and
    /// RTCP (read by `serve`).
    _rtp_port: std::net::UdpSocket,
    rtcp: Mutex<Option<std::net::UdpSocket>>,
    /// The same socket once `serve` runs it, for RTCP BYE.
    rtcp_out: Mutex<Option<Arc<tokio::net::UdpSocket>>>,
    /// Where publishers send RTP and RTCP over UDP (`record_ports`), until `serve` reads them.
    record: Mutex<Option<(std::net::UdpSocket, std::net::UdpSocket)>>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// RTSPS clients get SRTP (keys in the description), sharing keys or not.
    srtp: Option<crate::config::SrtpKeys>,
    /// The one sink of each multicast group (by the group's RTP address and the track's
    /// session) and how many players it serves: it goes with the last.
    groups: Mutex<HashMap<(SocketAddr, String), (u64, usize)>>,
}

/// A client's UDP ports (RTP, RTCP) on a track, `None` for an interleaved one.
fn udp_ports(l: &Lower) -> Option<(u16, u16)> {
    match *l {
        Lower::Udp { client_rtp, client_rtcp } => Some((client_rtp, client_rtcp)),
        Lower::Interleaved { .. } | Lower::Multicast { .. } => None,
    }
}

fn interleaved_rtp(l: &Lower) -> Option<u8> {
    match *l {
        Lower::Interleaved { rtp, .. } => Some(rtp),
        Lower::Udp { .. } | Lower::Multicast { .. } => None,
    }
}

/// Packets an interleaved client may have queued before it waits in the ring.
const INTERLEAVED_QUEUE: usize = 2048;

/// An RTSP connection as the data path sees it: the queues of its interleaved tracks (by
/// RTP channel) and the wake-up for the task that writes them.
#[derive(Default)]
struct Conn {
    notify: tokio::sync::Notify,
    queues: Mutex<Vec<(u8, Arc<fanout_io::channel::ChannelQueue>)>>,
    /// RTCP for its interleaved tracks: (channel, packet).
    control: Mutex<Vec<(u8, Vec<u8>)>>,
    /// A send buffer its socket should get, set when a track goes interleaved (0: none new).
    sndbuf: std::sync::atomic::AtomicUsize,
    /// SRTP key epochs its descriptions gave, by track session.
    keys: Mutex<HashMap<String, Arc<crate::srtp_out::Epoch>>>,
    /// Its session was deleted: the connection is closed at the next wake-up.
    ended: std::sync::atomic::AtomicBool,
    /// It published, and a newer publisher took over: closed at the next wake-up.
    displaced: std::sync::atomic::AtomicBool,
    /// Over TLS (RTSPS).
    secure: bool,
}

/// Where a sender report goes: a UDP client's RTCP port, or an interleaved client's RTCP
/// channel on its connection.
enum ReportTo {
    Udp(SocketAddr),
    Conn(u64, u8),
}

/// Where `[auth]` or `[[user]]` is configured, whether `req` may go on: `Some(401)` if not.
/// The request's Basic credentials (the only kind that can be passed on, or checked
/// against a hash) and its URL's `token`: the users are tried first, then `[auth]`.
async fn external_auth(relay: &Relay, req: &rtsp::Request, ip: IpAddr, secure: bool) -> Option<Response> {
    if !relay.cfg().face_checks_rtsp() {
        return None;
    }
    let (action, name) = fanout_proto::rtsp::server::auth_action(req)?;
    let basic = req.headers.get("Authorization").and_then(fanout_proto::http::basic_credentials);
    let (user, pass) = basic.as_ref().map_or((None, None), |(u, p)| (Some(u.as_str()), Some(p.as_str())));
    let local = relay.login(user, pass, ip, action, name, true);
    let query = req.uri.split_once('?').map(|(_, q)| q);
    let mut ask =
        fanout_proto::auth::http_request(None, query, ip, action, name, if secure { "rtsps" } else { "rtsp" });
    (ask.user, ask.password) = (user.unwrap_or_default().into(), pass.unwrap_or_default().into());
    if relay.permit(local, ask).await {
        return None;
    }
    let mut resp = Response::new(401, req.headers.cseq());
    resp.headers.set("WWW-Authenticate", "Basic realm=\"fanout\"");
    Some(resp)
}

/// A 401 to a request that gave credentials (the stream users', checked by the RTSP server)
/// is a failed login of its address.
fn failed_login(relay: &Relay, req: &rtsp::Request, resp: &Response, ip: IpAddr) {
    if resp.status == 401 && req.headers.get("Authorization").is_some() {
        relay.books.failed_login("rtsp", ip);
    }
}

/// A response as it goes out: with our `Server` header, in bytes.
fn answer(mut resp: Response) -> Vec<u8> {
    resp.headers.set("Server", concat!("fanout/", env!("CARGO_PKG_VERSION")));
    let mut out = Vec::new();
    resp.write(&mut out);
    out
}

impl Rtsp {
    /// The `server_port` RTP port: the data path sends from it.
    pub fn rtp_port(&self) -> u16 {
        self._rtp_port.local_addr().map_or(0, |a| a.port())
    }

    pub fn new(
        ip: IpAddr,
        users: Vec<(String, String)>,
        srtp: Option<crate::config::SrtpKeys>,
        multicast: Option<fanout_proto::rtsp::server::Multicast>,
    ) -> std::io::Result<Arc<Self>> {
        let rtcp = fanout_io::sys::port_pair_with(ip, true)?;
        let ports = (rtcp.0.local_addr()?.port(), rtcp.1.local_addr()?.port());
        // Publishers' UDP comes to a pair of its own: the RTP port above is shared with the
        // engine's sending sockets, which would take a share of what arrives there.
        let record = fanout_io::sys::port_pair_with(ip, false)?;
        let record_ports = (record.0.local_addr()?.port(), record.1.local_addr()?.port());
        // The keys of session ids and Digest nonces: nothing a client sees tells another's.
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| std::io::Error::other("no system randomness for RTSP session ids"))?;
        if let Some(m) = multicast {
            // Routers the groups' packets may cross (the RTP port's socket sends them).
            socket2::SockRef::from(&rtcp.0).set_multicast_ttl_v4(u32::from(m.ttl))?;
        }
        let cfg =
            Config { server_ports: ports, record_ports, interleaved: true, users, multicast, ..Config::default() };
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            server: Mutex::new(Server::new(cfg, secret)),
            clients: Mutex::new(HashMap::new()),
            started: Instant::now(),
            _rtp_port: rtcp.0,
            rtcp: Mutex::new(Some(rtcp.1)),
            rtcp_out: Mutex::new(None),
            record: Mutex::new(Some(record)),
            conns: Mutex::new(HashMap::new()),
            srtp,
            groups: Mutex::new(HashMap::new()),
        }))
    }

    /// Ends the stream for every client of a resource (its session was deleted, its file
    /// played out, its publisher gone): each playing track gets an RTCP BYE (RFC 3550 §6.6,
    /// behind an empty receiver report, as a compound packet must start), over UDP or on its
    /// connection, and the connections close: a player sees the end instead of silence.
    pub fn end_resource(&self, name: &str) {
        self.end_clients(|_, c| c.resource == name);
    }

    /// Ends the clients `which` picks (by RTSP session id and client), as
    /// [`Rtsp::end_resource`] does.
    fn end_clients(&self, which: impl Fn(&str, &Client) -> bool) {
        let mut byes = Vec::new();
        let conns: Vec<u64> = {
            let clients = self.clients.lock();
            for c in clients.iter().filter(|(id, c)| which(id, c)).map(|(_, c)| c) {
                for p in &c.sinks {
                    let Some(ssrc) = p.track_session.rtp_ssrc() else { continue };
                    let mut bye = Vec::with_capacity(16);
                    fanout_proto::rtp::rtcp::write_bye(&mut bye, ssrc);
                    if let Some(epoch) = &p.srtp {
                        epoch.protect_rtcp(&mut bye);
                    }
                    match c.tracks.iter().find(|x| x.0 == p.track).map(|x| x.1) {
                        Some(Lower::Udp { client_rtcp, .. }) => byes.push((SocketAddr::new(c.peer, client_rtcp), bye)),
                        // Once to the group, for all its players.
                        Some(Lower::Multicast { group, rtcp, .. }) => {
                            let to = SocketAddr::new(group.into(), rtcp);
                            if !byes.iter().any(|(a, b)| *a == to && *b == bye) {
                                byes.push((to, bye));
                            }
                        }
                        Some(Lower::Interleaved { rtcp, .. }) => {
                            if let Some(conn) = self.conns.lock().get(&c.conn) {
                                conn.control.lock().push((rtcp, bye));
                            }
                        }
                        None => {}
                    }
                }
            }
            clients.iter().filter(|(id, c)| which(id, c)).map(|(_, c)| c.conn).collect()
        };
        if let Some(sock) = self.rtcp_out.lock().as_ref() {
            for (to, bye) in &byes {
                let _ = sock.try_send_to(bye, *to);
            }
        }
        let open = self.conns.lock();
        for c in conns.iter().filter_map(|id| open.get(id)) {
            c.ended.store(true, std::sync::atomic::Ordering::Relaxed);
            c.notify.notify_one();
        }
    }

    pub fn clients(&self) -> Vec<ClientStatus> {
        // Lock order everywhere: clients, then server.
        let clients = self.clients.lock();
        let server = self.server.lock();
        let mut v: Vec<ClientStatus> = clients
            .iter()
            .map(|(id, c)| ClientStatus {
                session: id.clone(),
                resource: c.resource.clone(),
                peer: c.peer,
                rtp_port: c.tracks.iter().find_map(|t| udp_ports(&t.1)).map(|p| p.0),
                interleaved: c.tracks.iter().any(|t| udp_ports(&t.1).is_none()),
                playing: server.state(id) == Some(fanout_proto::rtsp::server::State::Playing),
                rtcp_reports: c.reports,
                fraction_lost: c.last_report.map(|(b, _)| f64::from(b.fraction_lost) / 256.0),
                cumulative_lost: c.last_report.map(|(b, _)| b.cumulative_lost),
                highest_seq: c.last_report.map(|(b, _)| b.highest_seq),
                jitter: c.last_report.map(|(b, _)| b.jitter),
                last_report_ms_ago: c.last_report.map(|(_, t)| t.elapsed().as_millis() as u64),
                rtt_ms: c.rtt.map(|d| d.as_secs_f64() * 1000.0),
                foreign_report_blocks: c.foreign_blocks,
                keyframe_requests: c.keyframe_requests,
                srtp: c.srtp,
                srtcp_keyed: !c.srtcp_in.is_empty(),
                srtcp_dropped: c.srtcp_dropped,
                sinks: c
                    .sinks
                    .iter()
                    .map(|p| {
                        let st = p.session.sink_status(p.id);
                        ClientSink {
                            track: p.track,
                            sink: p.id,
                            session: p.session.name().to_string(),
                            packets_sent: st.as_ref().map(|s| s.packets_sent),
                            path: st.as_ref().map(|s| s.path),
                            layers: st.and_then(|s| s.layers),
                        }
                    })
                    .collect(),
            })
            .collect();
        v.sort_by(|a, b| a.session.cmp(&b.session));
        v
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Ends the publisher of RTSP session `session`, if it is one.
    fn stop_publisher(&self, relay: &Relay, session: &str) -> bool {
        relay.publishers().iter().any(|p| p.stop(session))
    }

    /// Joins a client that starts playing to its path's readers; `None` where the path has
    /// no room (it is then ended) or is gone.
    fn join_readers(&self, relay: &Relay, session: &str, c: &Client) -> Option<crate::readers::Registered> {
        let secure = self.conns.lock().get(&c.conn).is_some_and(|conn| conn.secure);
        let protocol = if secure { crate::readers::Protocol::Rtsps } else { crate::readers::Protocol::Rtsp };
        let who = crate::readers::Who::new(protocol, Some(SocketAddr::new(c.peer, 0)), None);
        let sinks = c.sinks.iter().map(|p| (p.session.clone(), p.id)).collect();
        let reader = Arc::new(RtspReader { rtsp: self.me.clone(), session: session.to_string(), sinks });
        match relay.path(&c.resource)?.readers.join(who, reader) {
            Ok(r) => Some(r),
            Err(full) => {
                tracing::warn!(resource = %c.resource, peer = %c.peer, "RTSP client ended: {full}");
                None
            }
        }
    }

    /// Carries out the state machine's actions on the relay's sessions; clients that cannot
    /// join their path's readers (at its `max_readers`) are ended.
    fn apply(&self, relay: &Relay, peer: IpAddr, actions: Vec<Action>) {
        let mut refused = Vec::new();
        self.apply_actions(relay, peer, actions, &mut refused);
        if !refused.is_empty() {
            self.end_clients(|id, _| refused.iter().any(|r| r == id));
        }
    }
}

/// How long a PLAY waits for a track that has not had a packet yet.
const FIRST_PACKET_WAIT: Duration = Duration::from_secs(2);

/// How long a DESCRIBE waits for an RTSP upstream to connect and play before it is 404.
const UPSTREAM_WAIT: Duration = Duration::from_secs(10);
