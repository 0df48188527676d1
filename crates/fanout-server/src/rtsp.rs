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
}

/// A client's UDP ports (RTP, RTCP) on a track, `None` for an interleaved one.
fn udp_ports(l: &Lower) -> Option<(u16, u16)> {
    match *l {
        Lower::Udp { client_rtp, client_rtcp } => Some((client_rtp, client_rtcp)),
        Lower::Interleaved { .. } => None,
    }
}

fn interleaved_rtp(l: &Lower) -> Option<u8> {
    match *l {
        Lower::Interleaved { rtp, .. } => Some(rtp),
        Lower::Udp { .. } => None,
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

/// Where `[auth]` is configured, whether it lets `req` on: `Some(401)` if not. The request's
/// Basic credentials (the only kind that can be passed on) or its URL's `token` go to it;
/// the stream users are tried first.
async fn external_auth(relay: &Relay, req: &rtsp::Request, ip: IpAddr, secure: bool) -> Option<Response> {
    relay.cfg().auth.as_ref()?;
    let (action, name) = fanout_proto::rtsp::server::auth_action(req)?;
    let basic = req.headers.get("Authorization").and_then(fanout_proto::http::basic_credentials);
    let (user, pass) = basic.as_ref().map_or((None, None), |(u, p)| (Some(u.as_str()), Some(p.as_str())));
    let local = relay.stream_login(user, pass);
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
        let cfg = Config { server_ports: ports, record_ports, interleaved: true, users, ..Config::default() };
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

    /// A sender report for each playing client: where to send it, and the datagram.
    fn sender_reports(&self, relay: &Relay) -> Vec<(ReportTo, Vec<u8>)> {
        let ntp = ntp_now();
        self.clients
            .lock()
            .values()
            .flat_map(|c| {
                let tracks = relay.tracks(&c.resource);
                c.sinks.iter().filter_map(move |p| {
                    let (t, id) = (p.track, p.id);
                    let tr = tracks.get(t)?;
                    let (ssrc, arrived) = tr.session.rtp_now(tr.clock)?;
                    // The RTP time now: from the upstream's own mapping when it sent one,
                    // else from when the packets arrived.
                    let rtp_now = match tr.clock_map {
                        Some((sr_ntp, sr_rtp)) => {
                            let since = ntp.wrapping_sub(sr_ntp) as i64 as f64 / 4_294_967_296.0;
                            sr_rtp.wrapping_add((since * f64::from(tr.clock)) as i64 as u32)
                        }
                        None => arrived,
                    };
                    let sink = p.session.sink_status(id)?;
                    let mut sr = Vec::with_capacity(28);
                    fanout_proto::rtp::rtcp::write_sender_report(
                        &mut sr,
                        ssrc,
                        ntp,
                        rtp_now,
                        sink.packets_sent as u32,
                        sink.bytes_sent as u32,
                    );
                    if let Some(epoch) = &p.srtp {
                        epoch.protect_rtcp(&mut sr);
                    }
                    let to = match c.tracks.iter().find(|x| x.0 == t)?.1 {
                        Lower::Udp { client_rtcp, .. } => ReportTo::Udp(SocketAddr::new(c.peer, client_rtcp)),
                        Lower::Interleaved { rtcp, .. } => ReportTo::Conn(c.conn, rtcp),
                    };
                    Some((to, sr))
                })
            })
            .collect()
    }

    /// RTCP on an interleaved client's RTCP channel.
    fn rtcp_on_conn(&self, relay: &Relay, conn: u64, channel: u8, data: &[u8]) {
        let mut clients = self.clients.lock();
        let found = clients.iter_mut().find_map(|(id, c)| {
            let t = c.tracks.iter().find(|t| matches!(t.1, Lower::Interleaved { rtcp, .. } if rtcp == channel))?.0;
            (c.conn == conn).then_some((id, c, t))
        });
        let Some((id, c, track)) = found else { return };
        self.record_reports(relay, id, c, track, data);
    }

    /// A client's reports keep its session alive; each block goes to the sink of the track
    /// whose SSRC it names, whose layer selector (for layered video) re-estimates. An SRTP
    /// client's reports are SRTCP: read under the key its SETUP gave (`KeyMgmt`), else
    /// (SDES gives us none) they only keep it alive.
    fn record_reports(&self, relay: &Relay, id: &str, c: &mut Client, track: usize, data: &[u8]) {
        // (Only SRTCP is copied, to be decrypted.)
        let plain: std::borrow::Cow<[u8]> = match c.srtcp_in.iter_mut().find(|k| k.0 == track) {
            Some((_, ctx)) => {
                let mut p = data.to_vec();
                if ctx.unprotect_rtcp(&mut p).is_err() {
                    c.srtcp_dropped += 1;
                    return;
                }
                p.into()
            }
            None => data.into(),
        };
        let keyed = matches!(plain, std::borrow::Cow::Owned(_));
        let Ok(reports) = fanout_proto::rtp::rtcp::parse_reports(&plain) else { return };
        c.reports += 1;
        let tracks = relay.tracks(&c.resource);
        let blocks = if c.srtp && !keyed { &[][..] } else { &reports[..] };
        for b in blocks.iter().flat_map(|r| r.blocks.iter()) {
            let sink = c.sinks.iter().find_map(|p| {
                let session = &tracks.get(p.track)?.session;
                (session.rtp_ssrc()? == b.ssrc).then_some((session, p.id))
            });
            let Some((session, sink)) = sink else {
                c.foreign_blocks += 1;
                continue;
            };
            session.sink_report(sink, b.cumulative_lost);
            c.last_report = Some((*b, Instant::now()));
            if let Some(rtt) = fanout_proto::rtp::rtcp::round_trip(b, fanout_proto::rtp::rtcp::ntp_mid32(ntp_now())) {
                c.rtt = Some(rtt);
            }
        }
        // PLI/FIR: the named track's session (else the one whose channel or port it came on)
        // wants a keyframe; its source's side passes that on where it can, at its own pace.
        if !c.srtp || keyed {
            for media in fanout_proto::rtp::rtcp::keyframe_requests(&plain) {
                let named = c.sinks.iter().find_map(|p| {
                    let session = &tracks.get(p.track)?.session;
                    (session.rtp_ssrc()? == media).then_some(session)
                });
                if let Some(session) = named.or_else(|| tracks.get(track).map(|t| &t.session)) {
                    session.want_keyframe();
                    c.keyframe_requests += 1;
                }
            }
        }
        self.server.lock().touch(id, self.now_ms());
    }

    /// A datagram on the RTCP port: a report from a client keeps its session alive.
    fn rtcp_from(&self, relay: &Relay, from: SocketAddr, data: &[u8]) {
        let mut clients = self.clients.lock();
        let found = clients.iter_mut().find_map(|(id, c)| {
            let t = c.tracks.iter().find(|t| udp_ports(&t.1).is_some_and(|p| p.1 == from.port()))?.0;
            (c.peer == from.ip()).then_some((id, c, t))
        });
        let Some((id, c, track)) = found else { return };
        self.record_reports(relay, id, c, track, data);
    }

    /// The SRTP key epoch of `track` for a client on connection `conn`: the one its
    /// description gave, while that runs, else the one a description would give now.
    fn epoch_for(
        &self,
        relay: &Relay,
        conn: u64,
        name: &str,
        track: &fanout_io::Session,
    ) -> std::io::Result<Arc<crate::srtp_out::Epoch>> {
        let given = self.conns.lock().get(&conn).and_then(|c| c.keys.lock().get(track.name()).cloned());
        match given.filter(|e| e.running()) {
            Some(e) => Ok(e),
            None => match relay.path(name) {
                Some(p) => p.srtp.epoch(track, &relay.engine, self.shared_keys()),
                None => Err(std::io::Error::other(format!("no session named {name:?}"))),
            },
        }
    }

    /// A description for an SRTP connection: each track `RTP/SAVP`, with its epoch's key
    /// (SDES, RFC 4568), remembered for the connection's PLAY; `RTP-Info` as the epoch
    /// session places a client (the track's numbers).
    /// `Ok(None)`: no such path (404); an error: no epoch could be had now (503).
    fn keyed(&self, relay: &Relay, conn: u64, name: &str, mut res: Resource) -> std::io::Result<Option<Resource>> {
        let Some(path) = relay.path(name) else { return Ok(None) };
        let Some(me) = self.conns.lock().get(&conn).cloned() else { return Ok(None) };
        for (i, (m, t)) in res.sdp.media.iter_mut().zip(&path.tracks()).enumerate() {
            let epoch = match path.srtp.epoch(&t.session, &relay.engine, self.shared_keys()) {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(resource = name, conn, "no SRTP key: {e}");
                    return Err(e);
                }
            };
            m.proto = "RTP/SAVP".into();
            m.lines.retain(|(k, v)| !(*k == 'a' && (v.starts_with("crypto:") || v.starts_with("key-mgmt:"))));
            // The key twice: SDES for ffmpeg, MIKEY for GStreamer (and MediaMTX's clients).
            m.lines.push(('a', format!("crypto:{}", epoch.crypto.to_value())));
            let ssrc = t.session.rtp_ssrc().unwrap_or(0);
            m.lines.push(('a', format!("key-mgmt:mikey {}", epoch.mikey(ssrc))));
            if let Some(next) = res.next_rtp.get_mut(i) {
                *next = epoch.session.rtp_start().map(|(_, seq, ts)| (seq, ts));
            }
            me.keys.lock().insert(t.session.name().to_string(), epoch);
        }
        Ok(Some(res))
    }

    /// `res` with the first packet's numbers of the key epochs an SRTP client on `conn` joins
    /// at PLAY: the track's numbers, at the keyframe the epoch's ring holds.
    fn epoch_numbers(&self, relay: &Relay, conn: u64, name: &str, mut res: Resource) -> Resource {
        for (next, t) in res.next_rtp.iter_mut().zip(relay.tracks(name)) {
            let epoch = self.epoch_for(relay, conn, name, &t.session).ok().and_then(|e| e.session.rtp_start());
            // An epoch keeps the track's numbers, but its payloads are ciphertext: where the
            // track names the same next packet, its time (which reads AAC frame counts) is used.
            *next = epoch.map(|(_, s, ts)| match t.session.rtp_start() {
                Some((_, plain, plain_ts)) if plain == s => (s, plain_ts),
                _ => (s, ts),
            });
        }
        res
    }

    fn shared_keys(&self) -> bool {
        self.srtp != Some(crate::config::SrtpKeys::PerClient)
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

    fn apply_actions(&self, relay: &Relay, peer: IpAddr, actions: Vec<Action>, refused: &mut Vec<String>) {
        let mut clients = self.clients.lock();
        for a in actions {
            match a {
                Action::Setup { session, resource, lower, track, conn, srtp, client_key } => {
                    let c = clients.entry(session).or_insert_with(|| Client {
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
                    });
                    c.tracks.retain(|t| t.0 != track);
                    c.tracks.push((track, lower));
                    c.srtcp_in.retain(|k| k.0 != track);
                    if let Some(k) = client_key {
                        c.srtcp_in.push((track, k.context()));
                    }
                }
                Action::Play { session } => {
                    let Some(c) = clients.get_mut(&session) else { continue };
                    let tracks = relay.tracks(&c.resource);
                    for &(t, lower) in &c.tracks {
                        let Some(tr) = tracks.get(t) else { continue };
                        // An SRTP client joins the key epoch its description gave it.
                        let epoch = match c.srtp {
                            true => match self.epoch_for(relay, c.conn, &c.resource, &tr.session) {
                                Ok(e) => Some(e),
                                Err(e) => {
                                    tracing::warn!(rtsp_session = %session, "no SRTP for the client: {e}");
                                    continue;
                                }
                            },
                            false => None,
                        };
                        let into = epoch.as_ref().map_or(&tr.session, |e| &e.session).clone();
                        let added = match lower {
                            Lower::Udp { client_rtp, .. } => {
                                into.add_udp_sink_from_shared_port(SocketAddr::new(c.peer, client_rtp))
                            }
                            Lower::Interleaved { rtp, .. } => match self.conns.lock().get(&c.conn) {
                                Some(conn) => {
                                    let wake = conn.clone();
                                    // At most half the ring: a client further behind waits
                                    // in the ring, where it is lapped (and resumes at a
                                    // keyframe) like any slow subscriber.
                                    let cap = INTERLEAVED_QUEUE.min(tr.session.config().ring_capacity / 2);
                                    let q = fanout_io::channel::ChannelQueue::batched(cap, move || {
                                        wake.notify.notify_one()
                                    });
                                    conn.sndbuf
                                        .fetch_max(into.stream_send_buffer(), std::sync::atomic::Ordering::Relaxed);
                                    let mut qs = conn.queues.lock();
                                    qs.retain(|(ch, _)| *ch != rtp);
                                    qs.push((rtp, q.clone()));
                                    into.add_channel_sink(SocketAddr::new(c.peer, 0), q, false)
                                }
                                None => Err(std::io::Error::other("its connection is gone")),
                            },
                        };
                        match added {
                            Ok(id) => {
                                let how = if matches!(lower, Lower::Udp { .. }) { "udp" } else { "interleaved" };
                                tracing::info!(resource = %c.resource, peer = %c.peer, track = t, sink = id, how, srtp = c.srtp, "RTSP client playing");
                                let track_session = tr.session.clone();
                                c.sinks.push(Placed { track: t, id, session: into, srtp: epoch, track_session })
                            }
                            Err(e) => tracing::warn!(rtsp_session = %session, "cannot add the client's sink: {e}"),
                        }
                    }
                    if c.reader.is_none() && !c.sinks.is_empty() {
                        c.reader = self.join_readers(relay, &session, c);
                        if c.reader.is_none() {
                            refused.push(session.clone());
                        }
                    }
                }
                Action::Record { session, resource, sdp, tracks, udp, conn } => {
                    // Taken over: its connection is closed, which ends its RTSP session.
                    let me = self.conns.lock().get(&conn).map(Arc::downgrade);
                    let displaced = Box::new(move || {
                        if let Some(c) = me.and_then(|c| c.upgrade()) {
                            c.displaced.store(true, std::sync::atomic::Ordering::Relaxed);
                            c.notify.notify_one();
                        }
                    });
                    let started = relay
                        .path(&resource)
                        .and_then(|p| p.publisher().cloned())
                        .map(|p| p.start(session.clone(), conn, peer, sdp, &tracks, &udp, &relay.engine, displaced));
                    if let Some(Err(e)) = started {
                        tracing::warn!(%resource, "cannot start the RTSP publisher: {e}");
                    }
                }
                Action::Foreign { session, conn } => {
                    tracing::warn!(%peer, conn, rtsp_session = %session, "RTSP request for a session of another connection: 454 (logged once per connection)");
                }
                // A publisher's end; for a client, Teardown also drops it below, once the state
                // machine forgot it.
                Action::Teardown { session } if self.stop_publisher(relay, &session) => {}
                Action::Pause { session } | Action::Teardown { session } => {
                    let Some(c) = clients.get_mut(&session) else { continue };
                    if !c.sinks.is_empty() {
                        tracing::info!(resource = %c.resource, peer = %c.peer, sinks = c.sinks.len(), "RTSP client stopped");
                    }
                    for p in c.sinks.drain(..) {
                        p.session.remove_sink(p.id);
                    }
                    c.reader = None;
                    if let Some(conn) = self.conns.lock().get(&c.conn) {
                        let channels: Vec<u8> = c.tracks.iter().filter_map(|t| interleaved_rtp(&t.1)).collect();
                        conn.queues.lock().retain(|(ch, _)| !channels.contains(ch));
                    }
                }
            }
        }
        // Sessions the state machine no longer knows are gone for good, once their sinks
        // are: another connection's request may have ended its session in the state machine
        // and not yet applied its Teardown (which then finds it here and removes the sinks).
        let server = self.server.lock();
        clients.retain(|id, c| server.state(id).is_some() || !c.sinks.is_empty());
    }
}

/// Accepts RTSP (and, with a TLS acceptor, RTSPS) connections on `listeners` until aborted.
pub async fn serve(
    listeners: Vec<(TcpListener, Option<tokio_rustls::TlsAcceptor>)>,
    relay: Arc<Relay>,
    rtsp: Arc<Rtsp>,
) {
    /// Stops the expiry task when `serve` is aborted.
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _expiry = AbortOnDrop({
        let (relay, rtsp) = (relay.clone(), rtsp.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let now = rtsp.now_ms();
                let actions = rtsp.server.lock().expire(now);
                if !actions.is_empty() {
                    rtsp.apply(&relay, IpAddr::from([0, 0, 0, 0]), actions);
                }
            }
        })
    });
    let sock = rtsp.rtcp.lock().take().and_then(|s| {
        s.set_nonblocking(true).ok()?;
        tokio::net::UdpSocket::from_std(s).ok().map(Arc::new)
    });
    *rtsp.rtcp_out.lock() = sock.clone();
    let _rtcp = AbortOnDrop({
        let (relay, rtsp, sock) = (relay.clone(), rtsp.clone(), sock.clone());
        tokio::spawn(async move {
            let Some(sock) = sock else { return };
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = sock.recv_from(&mut buf).await {
                rtsp.rtcp_from(&relay, from, &buf[..n]);
            }
        })
    });
    // Publishers' RTP and RTCP over UDP, each datagram taken only from the ports its
    // publisher's SETUP named; their media keeps their RTSP sessions alive.
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
    let _record: Vec<AbortOnDrop> = record
        .into_iter()
        .map(|sock| {
            let (relay, rtsp) = (relay.clone(), rtsp.clone());
            AbortOnDrop(tokio::spawn(async move {
                let mut buf = vec![0u8; 65_536];
                let mut touched = Instant::now();
                while let Ok((n, from)) = sock.recv_from(&mut buf).await {
                    let session = relay.publishers().iter().find_map(|p| p.feed_udp(from, &mut buf[..n]));
                    if let Some(id) = session.filter(|_| touched.elapsed() >= Duration::from_secs(1)) {
                        touched = Instant::now();
                        rtsp.server.lock().touch(&id, rtsp.now_ms());
                    }
                }
            }))
        })
        .collect();
    // Readers' keyframe requests, passed to RTSP publishers (`Publisher::keyframe_requests`).
    let _keyframes = AbortOnDrop({
        let (relay, rtsp) = (relay.clone(), rtsp.clone());
        let reporter = crate::track::random_start().1;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                for (to, rtcp) in relay.publishers().iter().flat_map(|p| p.keyframe_requests(reporter)) {
                    match to {
                        crate::publish::RtcpTo::Udp(addr) => {
                            if let Some(s) = &record_rtcp {
                                let _ = s.send_to(&rtcp, addr).await;
                            }
                        }
                        crate::publish::RtcpTo::Conn(conn, channel) => {
                            if let Some(c) = rtsp.conns.lock().get(&conn) {
                                c.control.lock().push((channel, rtcp));
                                c.notify.notify_one();
                            }
                        }
                    }
                }
            }
        })
    });
    let _reports = AbortOnDrop({
        let (relay, rtsp) = (relay.clone(), rtsp.clone());
        tokio::spawn(async move {
            let Some(sock) = sock else { return };
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                for (to, sr) in rtsp.sender_reports(&relay) {
                    match to {
                        ReportTo::Udp(addr) => {
                            let _ = sock.send_to(&sr, addr).await;
                        }
                        // On the client's connection, written by its task between frames.
                        ReportTo::Conn(conn, channel) => {
                            if let Some(c) = rtsp.conns.lock().get(&conn) {
                                c.control.lock().push((channel, sr));
                                c.notify.notify_one();
                            }
                        }
                    }
                }
            }
        })
    });
    // RTSP and RTSPS share their caps: the connections open, and those per address.
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let next_conn = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let gate = crate::admit::Gate::new("RTSP per-address cap (max_connections_per_ip)", relay.books.clone());
    let loops: Vec<_> = listeners
        .into_iter()
        .map(|(l, tls)| {
            let counts = Counts { open: open.clone(), next_conn: next_conn.clone(), gate: gate.clone() };
            AbortOnDrop(tokio::spawn(accept(l, tls, relay.clone(), rtsp.clone(), counts)))
        })
        .collect();
    // Until aborted; the loops go with it.
    let _loops = loops;
    std::future::pending::<()>().await;
}

/// What an RTSP connection runs over: TCP, or TLS on TCP (RTSPS).
trait RtspIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {
    fn tcp(&self) -> &TcpStream;
}

impl RtspIo for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl RtspIo for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// What the RTSP listeners count together.
struct Counts {
    open: Arc<std::sync::atomic::AtomicUsize>,
    next_conn: Arc<std::sync::atomic::AtomicU64>,
    gate: Arc<crate::admit::Gate>,
}

/// A refused connection gets a real server's answer if its socket takes it at once, then is
/// closed: no task and no wait per refusal, however many come.
fn refuse(stream: TcpStream) {
    let mut out = Vec::new();
    Response::new(503, None).write(&mut out);
    let _ = stream.try_write(&out);
}

/// Accepts connections on one listener (with `tls`: RTSPS) until aborted.
async fn accept(
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

/// The TLS handshake of an RTSPS connection; a plaintext client (or a failed handshake) is
/// logged and closed.
async fn handshake(
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

/// How long a PLAY waits for a track that has not had a packet yet.
const FIRST_PACKET_WAIT: Duration = Duration::from_secs(2);

/// How long a DESCRIBE waits for an RTSP upstream to connect and play before it is 404.
const UPSTREAM_WAIT: Duration = Duration::from_secs(10);

/// Writes what the connection's interleaved queues and RTCP hold, `$`-framed, with one
/// vectored write of the shared packets: this task is the connection's only writer, so
/// responses never split a frame.
async fn flush_interleaved(
    stream: &mut impl RtspIo,
    me: &Conn,
    packets: &mut Vec<fanout_io::channel::Frame>,
    gather: &mut Gather,
) -> std::io::Result<()> {
    gather.clear();
    for (channel, q) in me.queues.lock().iter() {
        q.drain(packets);
        for (p, seq) in packets.drain(..) {
            gather.packet(*channel, p, seq);
        }
    }
    for (channel, rtcp) in me.control.lock().drain(..) {
        gather.owned(channel, &rtcp);
    }
    let size = me.sndbuf.swap(0, std::sync::atomic::Ordering::Relaxed);
    if size > 0 {
        let _ = socket2::SockRef::from(stream.tcp()).set_send_buffer_size(size);
    }
    gather.write(stream).await
}

/// Interleaved frames gathered for one vectored write: each packet's `$` header (and a
/// layer-dropping client's own sequence number) in `heads`, its bytes where the ring holds
/// them (no copy per client).
#[derive(Default)]
struct Gather {
    heads: Vec<u8>,
    packets: Vec<Arc<fanout_io::packet::Packet>>,
    parts: Vec<Part>,
}

/// A piece of a gathered write.
enum Part {
    Head(std::ops::Range<usize>),
    Packet(usize, std::ops::Range<usize>),
}

/// The most slices one `writev` takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

impl Gather {
    fn clear(&mut self) {
        self.heads.clear();
        self.packets.clear();
        self.parts.clear();
    }

    fn head(&mut self, bytes: &[u8]) {
        let at = self.heads.len();
        self.heads.extend_from_slice(bytes);
        match self.parts.last_mut() {
            // Next to the last head: one slice.
            Some(Part::Head(r)) if r.end == at => r.end += bytes.len(),
            _ => self.parts.push(Part::Head(at..at + bytes.len())),
        }
    }

    /// A packet of the ring on `channel`; with `seq`, the client's own sequence number in
    /// place of the packet's (RTP header bytes 2..4).
    fn packet(&mut self, channel: u8, p: Arc<fanout_io::packet::Packet>, seq: Option<u16>) {
        let len = p.data().len();
        let Ok(len16) = u16::try_from(len) else { return };
        let mut head = [b'$', channel, 0, 0];
        head[2..].copy_from_slice(&len16.to_be_bytes());
        self.head(&head);
        let k = self.packets.len();
        match seq.filter(|_| len >= 4) {
            Some(seq) => {
                self.parts.push(Part::Packet(k, 0..2));
                self.head(&seq.to_be_bytes());
                self.parts.push(Part::Packet(k, 4..len));
            }
            None => self.parts.push(Part::Packet(k, 0..len)),
        }
        self.packets.push(p);
    }

    /// A frame of bytes of its own (RTCP).
    fn owned(&mut self, channel: u8, data: &[u8]) {
        let mut frame = Vec::with_capacity(4 + data.len());
        rtsp::write_interleaved(&mut frame, channel, data);
        self.head(&frame);
    }

    async fn write(&self, stream: &mut (impl tokio::io::AsyncWrite + Unpin)) -> std::io::Result<()> {
        use std::io::IoSlice;
        let mut slices: Vec<IoSlice<'_>> = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Head(r) => IoSlice::new(&self.heads[r.clone()]),
                Part::Packet(k, r) => IoSlice::new(&self.packets[*k].data()[r.clone()]),
            })
            .collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = stream.write_vectored(&rest[..rest.len().min(IOV_MAX)]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
    }
}

async fn connection(
    mut stream: impl RtspIo,
    secure: bool,
    peer: SocketAddr,
    conn: u64,
    (idle, head_timeout): (Duration, Duration),
    relay: &Arc<Relay>,
    rtsp: &Arc<Rtsp>,
) -> std::io::Result<()> {
    /// Forgets the connection's queues when it ends.
    struct Registered<'a>(&'a Rtsp, u64);
    impl Drop for Registered<'_> {
        fn drop(&mut self) {
            self.0.conns.lock().remove(&self.1);
        }
    }
    let me = Arc::new(Conn { secure, ..Conn::default() });
    rtsp.conns.lock().insert(conn, me.clone());
    let _registered = Registered(rtsp, conn);
    let limits = Limits::default();
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let (mut packets, mut frames) = (Vec::new(), Vec::new());
    let mut gather = Gather::default();
    // When the first byte of a message still incomplete arrived: it must end within
    // `head_timeout`, so that a trickle of bytes cannot hold a connection (slowloris).
    let mut partial_since: Option<Instant> = None;
    // The publisher this connection feeds, once it records.
    let mut publishing: Option<Arc<crate::publish::Publisher>> = None;
    let mut last_touch = Instant::now();
    loop {
        // A TLS ClientHello is no RTSP message (and would wait for a line end).
        if crate::tls::looks_like_tls(&buf) {
            tracing::warn!(%peer, "a TLS client on the plain RTSP port (RTSPS has its own): closed");
            return Ok(());
        }
        // Every complete message in the buffer, in order (clients pipeline).
        loop {
            match rtsp::parse(&buf, &limits) {
                Ok(Some((msg, used))) => {
                    buf.drain(..used);
                    let req = match msg {
                        Message::Request(req) => req,
                        // A publisher's media, or a client's RTCP on a channel it set up;
                        // anything else is ignored.
                        Message::Interleaved { channel, mut data } => {
                            match publishing.as_ref().filter(|p| p.is_publishing_on(conn)) {
                                Some(p) => {
                                    p.feed(conn, channel, &mut data);
                                    // Its media keeps its RTSP session alive (publishers send
                                    // no keep-alive requests), checked once a second.
                                    if last_touch.elapsed() >= Duration::from_secs(1) {
                                        last_touch = Instant::now();
                                        if let Some(id) = p.rtsp_session() {
                                            rtsp.server.lock().touch(&id, rtsp.now_ms());
                                        }
                                    }
                                }
                                None => {
                                    publishing = relay.publishers().into_iter().find(|p| p.is_publishing_on(conn));
                                    match &publishing {
                                        Some(p) => p.feed(conn, channel, &mut data),
                                        None => rtsp.rtcp_on_conn(relay, conn, channel, &data),
                                    }
                                }
                            }
                            continue;
                        }
                        Message::Response(_) => continue,
                    };
                    // An address that failed to log in too often is refused for a while.
                    if relay.books.login_banned(peer.ip()) {
                        let resp = Response::new(403, req.headers.cseq());
                        stream.write_all(&answer(resp)).await?;
                        break;
                    }
                    // `[auth]`: asked before the server sees the request (which then checks
                    // no users itself: Config::rtsp_server_users).
                    if let Some(refused) = external_auth(relay, &req, peer.ip(), secure).await {
                        stream.write_all(&answer(refused)).await?;
                        continue;
                    }
                    // A channel this node does not have is pulled from the cluster, or made
                    // by a `[[pattern]]` (which may start a command, or take a publisher),
                    // first; with the directory down the client learns why (503). Only for a
                    // client that authenticates: nobody else sets a pull or a command off.
                    if req.method == "DESCRIBE" || req.method == "ANNOUNCE" {
                        let refused = rtsp.server.lock().challenge(&req, conn, rtsp.now_ms());
                        if let Some(resp) = refused {
                            failed_login(relay, &req, &resp, peer.ip());
                            stream.write_all(&answer(resp)).await?;
                            continue;
                        }
                    }
                    if req.method == "ANNOUNCE" {
                        if let Some((name, _)) = fanout_proto::rtsp::server::split_url(&req.uri) {
                            relay.ensure_publishable(name).await;
                        }
                    }
                    if req.method == "DESCRIBE" {
                        let name = fanout_proto::rtsp::server::split_url(&req.uri).map(|(n, _)| n.to_string());
                        // At its cap, a node sends new players elsewhere (not other nodes'
                        // pulls: the tree's own links are not subscribers).
                        let puller = req.headers.get("User-Agent").is_some_and(|a| a.starts_with("fanout/"));
                        let to = match (&relay.cluster, &name) {
                            (Some(c), Some(n)) if !puller => c.redirect(n).await,
                            _ => None,
                        };
                        if let Some(to) = to {
                            tracing::info!(%peer, uri = %req.uri, %to, "at the subscriber cap: redirected");
                            let mut resp = Response::new(302, req.headers.cseq());
                            resp.headers.set("Location", to);
                            stream.write_all(&answer(resp)).await?;
                            continue;
                        }
                        // (A name found nowhere is the RTSP server's own 404.)
                        // (A name no path has may be a `[[pattern]]`'s, or a cluster's.)
                        let failed = match name {
                            Some(n) if relay.cluster.is_some() || relay.path(&n).is_none() => {
                                relay.ensure(&n).await.err()
                            }
                            _ => None,
                        };
                        if let Some(e) = failed.filter(|e| !matches!(e, crate::relay::RelayError::NotFound(_))) {
                            let status = e.rtsp_status();
                            tracing::warn!(%peer, uri = %req.uri, "DESCRIBE answered {status}: {e}");
                            let mut resp = Response::new(status, req.headers.cseq());
                            resp.body = e.to_string().into_bytes();
                            resp.headers.set("Content-Type", "text/plain");
                            stream.write_all(&answer(resp)).await?;
                            continue;
                        }
                    }
                    // An RTSP upstream connects (on demand) before its description is given.
                    if matches!(req.method.as_str(), "DESCRIBE" | "SETUP" | "PLAY") {
                        let up = fanout_proto::rtsp::server::split_url(&req.uri)
                            .and_then(|(n, _)| relay.path(n))
                            .and_then(|p| p.upstream().cloned());
                        if let Some(up) = up {
                            up.demand(UPSTREAM_WAIT).await;
                        }
                        // A fresh view track (the demo's, just started) gets a moment for its
                        // first packet, so RTP-Info can name it. (An upstream's tracks plan
                        // their first numbers, and a wait would lose the client packets.)
                        // Likewise the SRTP key epochs an RTSPS client's description gave it
                        // (a new epoch's ring fills from the track's last keyframe).
                        if req.method == "PLAY" && secure && rtsp.srtp.is_some() {
                            let epochs: Vec<_> = me.keys.lock().values().cloned().collect();
                            let t0 = Instant::now();
                            while epochs.iter().any(|e| e.running() && e.session.rtp_start().is_none())
                                && t0.elapsed() < FIRST_PACKET_WAIT
                            {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                        if req.method == "PLAY" {
                            let view = fanout_proto::rtsp::server::split_url(&req.uri)
                                .and_then(|(n, _)| relay.path(n))
                                .and_then(|p| p.view().cloned());
                            if let Some(view) = view {
                                let t0 = Instant::now();
                                while view.tracks.iter().any(|t| t.session.rtp_start().is_none())
                                    && t0.elapsed() < FIRST_PACKET_WAIT
                                {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                            }
                        }
                    }
                    // A path at its `max_readers` takes no new reader: 453 Not Enough Bandwidth.
                    if req.method == "DESCRIBE" {
                        let path = fanout_proto::rtsp::server::split_url(&req.uri).and_then(|(n, _)| relay.path(n));
                        if let Some(p) = path.filter(|p| p.readers.full()) {
                            let e = crate::relay::RelayError::Full(format!("{} has its max_readers", p.name));
                            tracing::warn!(%peer, uri = %req.uri, "DESCRIBE refused: {e}");
                            let mut resp = Response::new(e.rtsp_status(), req.headers.cseq());
                            resp.body = e.to_string().into_bytes();
                            resp.headers.set("Content-Type", "text/plain");
                            stream.write_all(&answer(resp)).await?;
                            continue;
                        }
                    }
                    let (resp, actions) = {
                        let srtp = secure && rtsp.srtp.is_some();
                        let method = req.method.as_str();
                        // Why no key could be given, for a 503 instead of the 404.
                        let unkeyed = std::cell::Cell::new(None);
                        let lookup = |name: &str| match relay.path(name).and_then(|p| p.describe()) {
                            Some(res) if srtp && method == "DESCRIBE" && !res.publishable => {
                                rtsp.keyed(relay, conn, name, res).unwrap_or_else(|e| {
                                    unkeyed.set(Some(e));
                                    None
                                })
                            }
                            // RTP-Info where the epochs the client joins will place it.
                            Some(res) if srtp && method == "PLAY" && !res.publishable => {
                                Some(rtsp.epoch_numbers(relay, conn, name, res))
                            }
                            other => other,
                        };
                        let (mut resp, actions) = rtsp.server.lock().handle(&req, conn, rtsp.now_ms(), &lookup);
                        if let Some(e) = unkeyed.take().filter(|_| resp.status == 404) {
                            resp = Response::new(503, req.headers.cseq());
                            resp.headers.set("Retry-After", "2");
                            resp.headers.set("Content-Type", "text/plain");
                            resp.body = format!("no SRTP key now: {e}").into_bytes();
                        }
                        (resp, actions)
                    };
                    rtsp.apply(relay, peer.ip(), actions);
                    failed_login(relay, &req, &resp, peer.ip());
                    stream.write_all(&answer(resp)).await?;
                }
                Ok(None) => break,
                Err(e) => {
                    let mut out = Vec::new();
                    Response::new(e.status(), None).write(&mut out);
                    stream.write_all(&out).await?;
                    return Ok(());
                }
            }
        }
        partial_since = if buf.is_empty() { None } else { partial_since.or(Some(Instant::now())) };
        // A connection that carries interleaved RTP is never idle.
        let idle = if me.queues.lock().is_empty() { idle } else { Duration::MAX / 4 };
        let wait = match partial_since {
            Some(t) => idle.min(head_timeout.saturating_sub(t.elapsed())),
            None => idle,
        };
        tokio::select! {
            // (No timer where the connection is never idle: one per wake was a good part of
            // an interleaved client's cost.)
            r = async {
                match wait >= Duration::MAX / 8 {
                    true => Ok(stream.read(&mut chunk).await),
                    false => tokio::time::timeout(wait, stream.read(&mut chunk)).await,
                }
            } => {
                let n = match r {
                    Ok(r) => r?,
                    Err(_) if partial_since.is_some_and(|t| t.elapsed() >= head_timeout) => {
                        tracing::info!(%peer, "RTSP request incomplete after {head_timeout:?}: closed");
                        let mut out = Vec::new();
                        Response::new(408, None).write(&mut out);
                        let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&out)).await;
                        return Ok(());
                    }
                    Err(_) => return Ok(()),
                };
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            _ = me.notify.notified() => {
                if me.displaced.load(std::sync::atomic::Ordering::Relaxed) {
                    tracing::info!(%peer, "RTSP publisher taken over by a new one: closed");
                    return Ok(());
                }
                if me.ended.load(std::sync::atomic::Ordering::Relaxed) {
                    // Its BYEs first, then the close.
                    frames.clear();
                    for (channel, rtcp) in me.control.lock().drain(..) {
                        rtsp::write_interleaved(&mut frames, channel, &rtcp);
                    }
                    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&frames)).await;
                    tracing::info!(%peer, "RTSP connection closed: its stream ended");
                    return Ok(());
                }
                // The engine fills the queues once per `stream_flush_ms` (as it writes HTTP TS
                // subscribers), and wakes this task once until it drained them.
                flush_interleaved(&mut stream, &me, &mut packets, &mut gather).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Gather, IOV_MAX};
    use fanout_io::packet::Packet;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    /// A writer that takes at most `most` bytes a call, as a full socket buffer would.
    struct Trickle {
        got: Vec<u8>,
        most: usize,
        calls: usize,
    }

    impl tokio::io::AsyncWrite for Trickle {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
            let n = b.len().min(self.most);
            self.got.extend_from_slice(&b[..n]);
            self.calls += 1;
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            assert!(bufs.len() <= IOV_MAX, "{} slices in one writev", bufs.len());
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.most - n);
                self.got.extend_from_slice(&b[..take]);
                n += take;
                if n == self.most {
                    break;
                }
            }
            self.calls += 1;
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn rtp(seq: u16, len: usize) -> Arc<Packet> {
        let mut p = Packet::with_capacity(len);
        let b = p.buf_mut();
        b[0] = 0x80;
        b[2..4].copy_from_slice(&seq.to_be_bytes());
        for (k, x) in b[12..len].iter_mut().enumerate() {
            *x = k as u8;
        }
        p.set_len(len, 12);
        Arc::new(p)
    }

    /// What is gathered goes out byte for byte as the frames one by one would, a client's
    /// own sequence numbers in place, however little each write takes and however many
    /// packets (more slices than one writev may carry).
    #[test]
    fn gathered_frames_are_the_frames_written_one_by_one() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for (packets, most) in [(3usize, 1usize), (700, 1500), (2000, 100_000)] {
            let mut g = Gather::default();
            let mut want = Vec::new();
            for k in 0..packets {
                let p = rtp(k as u16, 20 + k % 1300);
                let own = (k % 3 == 0).then_some(9000 + k as u16);
                let mut data = p.data().to_vec();
                if let Some(seq) = own {
                    data[2..4].copy_from_slice(&seq.to_be_bytes());
                }
                fanout_proto::rtsp::write_interleaved(&mut want, (k % 2 * 2) as u8, &data);
                g.packet((k % 2 * 2) as u8, p, own);
                if k % 50 == 0 {
                    fanout_proto::rtsp::write_interleaved(&mut want, 1, b"rtcp");
                    g.owned(1, b"rtcp");
                }
            }
            let mut w = Trickle { got: Vec::new(), most, calls: 0 };
            rt.block_on(g.write(&mut w)).unwrap();
            assert!(w.got == want, "{packets} packets, {most} bytes a write");
            if most == 100_000 {
                assert!(w.calls < packets / 100, "{} writes for {packets} packets", w.calls);
            }
        }
    }
}
