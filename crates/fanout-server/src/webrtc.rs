//! WebRTC: playback (WHEP: a browser POSTs an SDP offer for a path and gets the path's H.264
//! and Opus over DTLS-SRTP, milliseconds behind the relay) and publishing (WHIP: an encoder's
//! H.264 and Opus become a `publish` path's tracks).
//!
//! Every viewer's media leaves one UDP port (`webrtc`, ICE-lite: the browser makes the
//! checks, the relay answers them), told apart by the ICE username of its first check and
//! then by its address. The WebRTC stack is `str0m`, sans-IO: one task owns the socket and
//! every viewer's `Rtc`, feeds it datagrams and time, and sends what it returns. A viewer's
//! tracks are sinks of the path's relay sessions like an RTSP client's (starting at the
//! ring's last keyframe), drained into `str0m` as RTP (renumbered per viewer, encrypted
//! with the viewer's own keys). Which track goes on which media section is
//! `fanout_proto::whep::plan`.

use crate::admit::{Gate, Pass};
use crate::clients::{LastPicture, ViewerStatus, WebRtcFace};
use crate::readers::{Registered, Who};
use crate::relay::Relay;
use fanout_io::channel::{ChannelQueue, Frame};
use fanout_io::Session;
use fanout_proto::rtp::RtpView;
use fanout_proto::rtsp::sdp::Sdp;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use str0m::change::SdpOffer;
use str0m::media::Mid;
use str0m::net::{Protocol, Receive};
use str0m::rtp::{RtpWrite, SeqNo};
use str0m::{Candidate, Event, IceConnectionState, Input, Output, Rtc};
use tokio::sync::{mpsc, Notify};

/// A viewer whose ICE and DTLS are not done by then is dropped.
const CONNECT_WITHIN: Duration = Duration::from_secs(15);
/// Viewers connecting (ICE, DTLS) at once; more offers are 503.
const MAX_CONNECTING: usize = 256;
/// Peers connecting at once from one address: a few addresses cannot keep every other
/// viewer out for the 15 s their peers may take to connect.
const MAX_CONNECTING_PER_IP: usize = 16;
/// Largest WHEP/WHIP offer taken: a browser's is a few KiB (many codecs, simulcast, ICE
/// candidates); more is refused (413) before it is read whole or parsed.
pub const MAX_OFFER: usize = 64 << 10;
/// Offers parsed (and peers built) at once, each on a thread of its own, not the control
/// runtime's: the others wait their turn, and the control plane goes on meanwhile.
static NEGOTIATING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Who makes a request of a peer: its address, and a digest of the credentials it gave
/// (its `Authorization`, or its `?token=`): only the same may end or change the peer it made.
#[derive(Clone, Copy, Default)]
pub struct Caller {
    pub ip: Option<IpAddr>,
    pub owner: Option<[u8; 32]>,
}
/// Packets queued for a viewer before the ring holds the rest for it (slowest-sink-drop).
const QUEUE: usize = 1024;

struct Shared {
    /// Viewers by id, for the status and DELETE.
    viewers: Mutex<HashMap<String, ViewerStatus>>,
}

/// The WebRTC face: its UDP port and the task that serves it.
pub struct WebRtc {
    pub addr: SocketAddr,
    /// The candidates offered to viewers.
    hosts: Vec<SocketAddr>,
    /// Whether ICE-TCP listens too (on `addr`'s port): each host is offered over TCP as well.
    tcp: bool,
    cmds: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
    /// Wakes the task when a viewer's queue gets packets.
    wake: Arc<Notify>,
    /// Peers per address (`max_connections_per_ip`), connecting or connected: one address
    /// cannot take every slot.
    gate: Arc<Gate>,
    task: tokio::task::JoinHandle<()>,
    /// An upgrade's new process took the port: no new peers here.
    handed_over: std::sync::atomic::AtomicBool,
    /// ICE-TCP's accept loop.
    tcp_task: Option<tokio::task::JoinHandle<()>>,
}

enum Cmd {
    Add(Box<Viewer>),
    Remove(String),
    /// An upgrade's new process takes the port: keep the viewers here on sockets of their own.
    HandOver,
}

struct Out {
    mid: Mid,
    pt: u8,
    video: bool,
    session: Session,
    queue: Arc<ChannelQueue>,
    sink: Option<u64>,
    /// The viewer's own numbering: the next sequence number (extended).
    next_seq: u64,
    /// H.264: the parameter sets a keyframe that comes without them gets.
    params: Option<fanout_proto::whep::InBandParams>,
    /// Layered video: a packet without a marker, until the next shows where its picture ends.
    held: Option<Arc<fanout_io::packet::Packet>>,
    /// A simulcast publisher's video: the encodings it switches between.
    sim: Option<Box<Sim>>,
    /// Added to the RTP time of what it sends (a simulcast viewer's: each encoding's clock
    /// joined onto the previous one's).
    ts_offset: u32,
}

/// A simulcast publisher's video for one viewer: which encoding it gets, and the one it
/// switches to, whose sink starts live and whose packets wait for a keyframe.
struct Sim {
    publisher: Arc<crate::publish::Publisher>,
    track: usize,
    encodings: Vec<crate::publish::Encoding>,
    /// The one it gets (`None`: one that is gone, until the switch away from it).
    current: Option<usize>,
    next: Option<Next>,
    /// Wakes the task when a switch's queue gets packets.
    wake: Arc<Notify>,
    /// The last picture sent: its RTP time (the viewer's) and when; the time between two.
    last: Option<(u32, Instant)>,
    step: u32,
    /// Switches done (from one encoding it got to another; joining is not one).
    switches: u64,
}

struct Next {
    place: usize,
    session: Session,
    queue: Arc<ChannelQueue>,
    sink: u64,
}

struct Viewer {
    id: String,
    rtc: Rtc,
    outs: Vec<Out>,
    /// Where its checks come from, once one did.
    from: Option<SocketAddr>,
    connected: bool,
    since: Instant,
    wake_at: Instant,
    packets: u64,
    last_picture: Option<LastPicture>,
    /// A WHIP publisher's side (it has no outs).
    publish: Option<Publishing>,
    /// A viewer of layered video: the whole stream's rate (what its bandwidth estimate is
    /// asked to reach), and the newest estimate, which picks the layers it gets.
    adapt: Option<Adapt>,
    /// Its place in its address's count, given back when it goes.
    _pass: Option<Pass>,
    /// Its place among its path's readers (a viewer's), left when it goes.
    _reader: Option<Registered>,
}

/// A viewer as one of its path's readers: counted by the face's status, ended by the face.
struct ViewerReader {
    id: String,
    cmds: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
}

impl crate::readers::Reader for ViewerReader {
    fn counters(&self) -> crate::readers::Counters {
        let packets = self.shared.viewers.lock().get(&self.id).map_or(0, |v| v.packets);
        crate::readers::Counters { packets, ..Default::default() }
    }

    fn close(&self, _reason: &str) {
        let _ = self.cmds.send(Cmd::Remove(self.id.clone()));
    }
}

#[derive(Clone, Copy)]
struct Adapt {
    whole_bps: f64,
    estimate_bps: Option<f64>,
    /// Layers of one stream (else encodings of a simulcast publisher).
    layered: bool,
}

/// A WHIP publisher: its RTP, by payload type, feeds the path's tracks.
struct Publishing {
    relay: std::sync::Weak<Relay>,
    publisher: Arc<crate::publish::Publisher>,
    sdp: Sdp,
    pts: Vec<(u8, usize)>,
    conn: u64,
    started: bool,
    video_ssrc: Option<str0m::rtp::Ssrc>,
    /// A simulcast publisher (its answer receives several RIDs): its encodings.
    simulcast: Option<SimulcastIn>,
    /// Keyframes are asked for every `KEYFRAME_EVERY` (a browser sends one at the start and
    /// on request only), so players joining later start within that.
    asked: Instant,
}

/// A simulcast publisher's encodings of its video track `track`: ranked by
/// `fanout_proto::simulcast::Ranking` (the video waits for that, the audio does not), each
/// told apart by the RID str0m maps its SSRC to.
struct SimulcastIn {
    track: usize,
    codec: &'static str,
    ranking: fanout_proto::simulcast::Ranking,
    ssrcs: Vec<Option<str0m::rtp::Ssrc>>,
    since: Instant,
}

/// What a peer negotiates for: publishing, or viewing (`adapts`: the rate a viewer's
/// bandwidth estimate is asked to reach, where its estimate picks what it gets: the whole of
/// layered video, or a simulcast publisher's best encoding).
#[derive(Clone, Copy)]
enum Role {
    Publisher,
    Viewer { adapts: Option<f64> },
}

/// A viewer of layered video: the bandwidth estimate it starts with (libwebrtc's).
const START_BPS: f64 = 300_000.0;

/// How often a WHIP publisher is asked for a keyframe (PLI) unasked.
const KEYFRAME_EVERY: Duration = Duration::from_secs(2);
/// Viewers' keyframe requests (PLI, FIR) reach a WHIP publisher as one per this interval.
const KEYFRAME_GAP: Duration = Duration::from_millis(500);

/// WHIP publishers' connection ids, apart from RTSP's, RTMP's and SRT's.
const CONN_BASE: u64 = 5 << 56;
static NEXT_CONN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl WebRtcFace for WebRtc {
    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn viewers(&self, path: Option<&str>) -> Vec<ViewerStatus> {
        WebRtc::viewers(self, path)
    }

    fn end_path(&self, path: &str, all: bool) {
        WebRtc::end_path(self, path, all)
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// The relay's WebRTC face, as this module's own type.
fn face(relay: &Relay) -> Option<Arc<WebRtc>> {
    relay.webrtc.lock().clone()?.as_any().downcast::<WebRtc>().ok()
}

/// Why a WHEP request is refused: the HTTP status and the message.
pub struct Refused(pub u16, pub String);

impl WebRtc {
    /// Binds `addr` (UDP) and starts serving; `extra_hosts` are offered to viewers too; `gate`
    /// counts the peers of each address.
    /// `beside_old`: an upgrade's new process, whose old one keeps its viewers on the port.
    pub fn start(
        addr: SocketAddr,
        extra_hosts: &[IpAddr],
        gate: Arc<Gate>,
        tcp: bool,
        beside_old: bool,
    ) -> std::io::Result<Arc<Self>> {
        let socket = bind_port(addr, beside_old)?;
        let bound = socket.local_addr()?;
        let socket = tokio::net::UdpSocket::from_std(socket)?;
        let mut hosts: Vec<SocketAddr> = Some(bound.ip())
            .filter(|ip| !ip.is_unspecified())
            .map(|ip| SocketAddr::new(ip, bound.port()))
            .into_iter()
            .collect();
        hosts.extend(extra_hosts.iter().map(|ip| SocketAddr::new(*ip, bound.port())));
        if hosts.is_empty() {
            hosts.push(SocketAddr::new([127, 0, 0, 1].into(), bound.port()));
            tracing::warn!("webrtc listens on {bound}: name the addresses viewers reach in webrtc_additional_hosts (offering 127.0.0.1 only)");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared { viewers: Mutex::new(HashMap::new()) });
        let wake = Arc::new(Notify::new());
        // ICE-TCP on the same address and port number, where asked and where it binds.
        let (tcp_tx, tcp_rx) = mpsc::channel(1024);
        let tcp = if tcp {
            match std::net::TcpListener::bind(bound).and_then(|l| l.set_nonblocking(true).map(|()| l)) {
                Ok(l) => {
                    let listener = tokio::net::TcpListener::from_std(l)?;
                    let side = Arc::new(TcpSide { writers: Mutex::new(HashMap::new()), local: bound });
                    let accept = tokio::spawn(tcp_accept(listener, side.clone(), tcp_tx, gate.clone()));
                    Some((side, accept))
                }
                Err(e) => {
                    tracing::warn!("no ICE-TCP on {bound}: {e}");
                    None
                }
            }
        } else {
            None
        };
        let (tcp_side, tcp_task) = tcp.unzip();
        let task = tokio::spawn(run(socket, rx, tcp_side.clone(), tcp_rx, shared.clone(), wake.clone()));
        Ok(Arc::new(Self {
            addr: bound,
            hosts,
            tcp: tcp_side.is_some(),
            cmds: tx,
            shared,
            wake,
            gate,
            task,
            handed_over: false.into(),
            tcp_task,
        }))
    }

    pub fn stop(&self) {
        self.task.abort();
        if let Some(t) = &self.tcp_task {
            t.abort();
        }
    }

    /// An upgrade's new process takes the port: this one takes no new peers (nor ICE-TCP
    /// connections) and serves the ones it has until they leave, each on a UDP socket
    /// connected to its address on the same port — the kernel gives a connected socket its
    /// peer's datagrams before the new process's.
    pub fn hand_over(&self) {
        self.handed_over.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.cmds.send(Cmd::HandOver);
        if let Some(t) = &self.tcp_task {
            t.abort();
        }
    }

    /// The viewers now, of `path` or of all.
    pub fn viewers(&self, path: Option<&str>) -> Vec<ViewerStatus> {
        let mut v: Vec<ViewerStatus> =
            self.shared.viewers.lock().values().filter(|v| path.is_none_or(|p| v.path == p)).cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// A WHEP offer for `path`: the answer and the viewer's id.
    pub async fn offer(
        &self,
        relay: &Arc<Relay>,
        path: &str,
        offer: &str,
        caller: Caller,
    ) -> Result<(String, String), Refused> {
        let pass = self.pass(caller.ip)?;
        relay.ensure(path).await.map_err(|e| Refused(e.http_status(), e.to_string()))?;
        let p = relay.path(path).ok_or_else(|| Refused(404, format!("no path {path:?}")))?;
        if let Some(up) = p.upstream().cloned() {
            up.demand(Duration::from_secs(10)).await;
        }
        let described = p
            .describe()
            .map(|r| r.sdp)
            .filter(|s| !s.media.is_empty())
            .ok_or_else(|| Refused(404, format!("{path} has nothing to play yet")))?;
        let tracks = relay.tracks(path);
        // Layered video, or a simulcast publisher's encodings: the viewer's congestion
        // feedback picks the layers, or the encoding, it gets.
        let simulcast = p
            .publisher()
            .and_then(|pb| Some((pb.clone(), pb.encodings()?)))
            .filter(|(_, (track, e))| e.len() > 1 && tracks.get(*track).is_some_and(|t| t.session == e[0].session));
        let layered = described
            .media
            .iter()
            .zip(&tracks)
            .filter(|(m, _)| m.kind == "video")
            .find_map(|(_, t)| t.session.layered_bps());
        let whole_bps = layered.or(simulcast.as_ref().map(|(_, (_, e))| e[0].bps.max(START_BPS)));
        let (rtc, answer) = self.negotiate(offer, Role::Viewer { adapts: whole_bps }, caller.ip).await?;
        let parsed = Sdp::parse(&answer).map_err(|e| Refused(500, format!("our answer: {e}")))?;
        let plan = fanout_proto::whep::plan(&described, &parsed);
        if plan.routes.is_empty() {
            return Err(Refused(
                400,
                format!("nothing of {path} can be sent to this viewer: {}", plan.left_out.join("; ")),
            ));
        }
        let id = crate::readers::new_id();
        let first_seq = u64::from(crate::track::random_start().0) + 1;
        let mut outs = Vec::new();
        let mut names = Vec::new();
        for r in &plan.routes {
            let Some(t) = tracks.get(r.track) else { continue };
            let wake = self.wake.clone();
            let queue = ChannelQueue::new(QUEUE, move || wake.notify_one());
            outs.push(Out {
                mid: Mid::from(r.mid.as_str()),
                pt: r.pt,
                video: r.video,
                session: t.session.clone(),
                queue,
                sink: None,
                next_seq: first_seq,
                params: (r.video && !r.params.is_empty()).then(|| fanout_proto::whep::InBandParams::new(&r.params)),
                held: None,
                sim: simulcast.as_ref().filter(|(_, (track, _))| *track == r.track).map(|(publisher, (track, e))| {
                    Box::new(Sim {
                        publisher: publisher.clone(),
                        track: *track,
                        encodings: e.clone(),
                        current: Some(0),
                        next: None,
                        wake: self.wake.clone(),
                        last: None,
                        step: 3000,
                        switches: 0,
                    })
                }),
                ts_offset: 0,
            });
            let m = &described.media[r.track];
            let codec = m.formats.first().and_then(|f| fanout_proto::whep::encoding(m, f)).unwrap_or("?");
            names.push(format!("{} {codec} (pt {})", m.kind, r.pt));
        }
        let status = ViewerStatus {
            offered_by: caller.ip,
            owner: caller.owner,
            id: id.clone(),
            path: path.to_string(),
            role: "viewer",
            peer: None,
            state: "connecting",
            since_s: 0.0,
            tracks: names,
            left_out: plan.left_out.clone(),
            packets: 0,
            last_picture: None,
            estimate_bps: None,
            layers: None,
            encoding: None,
            switches: None,
        };
        let adapt = whole_bps.map(|whole_bps| Adapt { whole_bps, estimate_bps: None, layered: layered.is_some() });
        // One of the path's readers, under its WHEP resource's id.
        let who = Who::new(crate::readers::Protocol::Webrtc, caller.ip.map(|ip| SocketAddr::new(ip, 0)), None);
        let reader = Arc::new(ViewerReader { id: id.clone(), cmds: self.cmds.clone(), shared: self.shared.clone() });
        let registered = p.readers.join_as(id.clone(), who, reader).map_err(|f| Refused(503, f.to_string()))?;
        self.admit(status, rtc, outs, None, adapt, (pass, Some(registered)))?;
        tracing::info!(path, viewer = %id, left_out = ?plan.left_out, "WebRTC viewer offered");
        Ok((answer, id))
    }

    /// A place for one more peer of `client` (`None`: an in-process caller, not counted), or
    /// 429: that address has `max_connections_per_ip` peers already.
    fn pass(&self, client: Option<IpAddr>) -> Result<Option<Pass>, Refused> {
        if self.handed_over.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Refused(503, "this relay process handed its WebRTC port to a new one: try again".into()));
        }
        let Some(ip) = client else { return Ok(None) };
        match self.gate.admit(ip) {
            Some(p) => Ok(Some(p.connected("webrtc", ip.to_string(), &tokio::runtime::Handle::current()))),
            None => {
                Err(Refused(429, format!("{ip} has as many WebRTC peers as one address may (max_connections_per_ip)")))
            }
        }
    }

    /// An `Rtc` for a peer's offer and its answer (see [`Self::build_peer`]), built off the
    /// control runtime's thread and a couple at a time (see [`NEGOTIATING`]), once there is
    /// room for one more connecting peer. Each costs a DTLS identity and holds state until it
    /// connects or times out: a flood of offers that never connect is capped, in all and per
    /// address.
    async fn negotiate(&self, offer: &str, role: Role, ip: Option<IpAddr>) -> Result<(Rtc, String), Refused> {
        let _turn = NEGOTIATING.acquire().await.expect("never closed");
        {
            let viewers = self.shared.viewers.lock();
            let connecting = || viewers.values().filter(|v| v.state == "connecting");
            let all = connecting().count();
            if all >= MAX_CONNECTING {
                return Err(Refused(503, format!("{all} WebRTC peers are still connecting: try again")));
            }
            if let Some(ip) = ip {
                if connecting().filter(|v| v.offered_by == Some(ip)).count() >= MAX_CONNECTING_PER_IP {
                    return Err(Refused(
                        429,
                        format!("{ip} has {MAX_CONNECTING_PER_IP} WebRTC peers connecting: try again once they have"),
                    ));
                }
            }
        }
        match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => self.build_peer(offer, role),
            _ => tokio::task::block_in_place(|| self.build_peer(offer, role)),
        }
    }

    /// ICE-lite on the relay's candidates, RTP mode, the codecs the role takes.
    ///
    /// A publisher gets transport-wide congestion control (its encoder's rate follows our
    /// feedback). A viewer of layered video does too, the other way: its feedback gives a
    /// bandwidth estimate (str0m's, which also paces its sends), and the estimate picks its
    /// layers. A viewer of a stream that is not layered does not negotiate it: there is nothing
    /// to choose, and taking its reports was the largest single cost per viewer (8% of the
    /// relay's CPU at 200 viewers).
    fn build_peer(&self, offer: &str, role: Role) -> Result<(Rtc, String), Refused> {
        let publisher = matches!(role, Role::Publisher);
        // A publisher's video is taken in one codec: the first of `PUBLISHED_VIDEO` offered.
        let taken = publisher.then(|| Sdp::parse(offer).ok().and_then(|o| fanout_proto::whep::publisher_video(&o)));
        let takes = |codec: &str| taken.is_none_or(|t| t.unwrap_or("H264") == codec);
        let offer = SdpOffer::from_sdp_string(offer).map_err(|e| Refused(400, format!("the offer: {e}")))?;
        let mut config = Rtc::builder();
        if let Role::Viewer { adapts } = role {
            use str0m::rtp::Extension;
            config = config
                .clear_extension_map()
                .set_extension(2, Extension::AbsoluteSendTime)
                .set_extension(4, Extension::RtpMid)
                .set_extension(13, Extension::VideoOrientation);
            if let Some(bps) = adapts {
                // It starts with what fits in a cautious first estimate (a browser's own
                // start), and probes up from there in its first seconds.
                config = config
                    .set_extension(3, Extension::TransportSequenceNumber)
                    .enable_bwe(Some(str0m::bwe::Bitrate::bps(bps.min(START_BPS) as u64)));
            }
        }
        let mut rtc = config
            .set_ice_lite(true)
            .set_rtp_mode(true)
            .clear_codecs()
            .enable_h264(takes("H264"))
            .enable_h265(!publisher)
            .enable_vp8(takes("VP8"))
            .enable_vp9(takes("VP9"))
            .enable_av1(takes("AV1"))
            .enable_opus(true, false)
            // G.711 to viewers only: a publisher's audio is taken as Opus.
            .enable_pcmu(!publisher, false)
            .enable_pcma(!publisher, false)
            .set_crypto_provider(Arc::new(str0m::crypto::from_feature_flags()))
            .build(Instant::now());
        for h in &self.hosts {
            if let Ok(c) = Candidate::host(*h, "udp") {
                rtc.add_local_candidate(c);
            }
            // A passive TCP candidate, of lower priority: used where UDP does not get through.
            if self.tcp {
                if let Ok(c) = Candidate::builder().tcp().host(*h).tcptype(str0m::net::TcpType::Passive).build() {
                    rtc.add_local_candidate(c);
                }
            }
        }
        let answer = rtc.sdp_api().accept_offer(offer).map_err(|e| Refused(400, format!("the offer: {e}")))?;
        Ok((rtc, answer.to_sdp_string()))
    }

    /// Hands a negotiated peer to the task, and lists it.
    fn admit(
        &self,
        status: ViewerStatus,
        rtc: Rtc,
        outs: Vec<Out>,
        publish: Option<Publishing>,
        adapt: Option<Adapt>,
        (pass, reader): (Option<Pass>, Option<Registered>),
    ) -> Result<(), Refused> {
        let id = status.id.clone();
        self.shared.viewers.lock().insert(id.clone(), status);
        let now = Instant::now();
        let v = Viewer {
            id: id.clone(),
            rtc,
            outs,
            from: None,
            connected: false,
            since: now,
            wake_at: now,
            packets: 0,
            last_picture: None,
            publish,
            adapt,
            _pass: pass,
            _reader: reader,
        };
        if self.cmds.send(Cmd::Add(Box::new(v))).is_err() {
            self.shared.viewers.lock().remove(&id);
            return Err(Refused(503, "WebRTC is stopping".into()));
        }
        Ok(())
    }

    /// A WHIP offer to publish `path`: the answer and the publisher's id.
    pub async fn publish(
        &self,
        relay: &Arc<Relay>,
        path: &str,
        offer: &str,
        caller: Caller,
    ) -> Result<(String, String), Refused> {
        let pass = self.pass(caller.ip)?;
        relay.ensure_publishable(path).await;
        let publisher =
            relay.path(path).and_then(|p| p.publisher().cloned()).filter(|p| p.takes_publishers()).ok_or_else(
                || Refused(404, format!("no path {path:?} takes publishers (source = {{ publish = true }})")),
            )?;
        if let Some(why) = publisher.refusal() {
            return Err(Refused(409, why));
        }
        let (rtc, answer) = self.negotiate(offer, Role::Publisher, caller.ip).await?;
        let parsed = Sdp::parse(&answer).map_err(|e| Refused(500, format!("our answer: {e}")))?;
        let ingest = fanout_proto::whep::ingest(&parsed).ok_or_else(|| {
            Refused(400, "the offer sends no H.264 (packetization mode 1), VP8, VP9, AV1 or Opus".into())
        })?;
        let sdp = Sdp::parse(&ingest.sdp).map_err(|e| Refused(500, format!("the path's description: {e}")))?;
        let rids = fanout_proto::simulcast::rids(&parsed);
        let simulcast = sdp.media.iter().position(|m| m.kind == "video").filter(|_| rids.len() > 1).map(|track| {
            let codec = fanout_proto::whep::PUBLISHED_VIDEO
                .into_iter()
                .find(|c| sdp.media[track].rtpmap(&sdp.media[track].formats[0]).is_some_and(|(n, _)| n == *c))
                .unwrap_or("H264");
            SimulcastIn {
                track,
                codec,
                ssrcs: vec![None; rids.len()],
                ranking: fanout_proto::simulcast::Ranking::new(rids.clone()),
                since: Instant::now(),
            }
        });
        let id = crate::clients::random_id();
        let status = ViewerStatus {
            offered_by: caller.ip,
            owner: caller.owner,
            id: id.clone(),
            path: path.to_string(),
            role: "publisher",
            peer: None,
            state: "connecting",
            since_s: 0.0,
            tracks: sdp
                .media
                .iter()
                .map(|m| format!("{} {}", m.kind, m.rtpmap(&m.formats[0]).map_or("?", |c| c.0)))
                .collect(),
            left_out: Vec::new(),
            packets: 0,
            last_picture: None,
            estimate_bps: None,
            layers: None,
            encoding: None,
            switches: None,
        };
        let conn = CONN_BASE | NEXT_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let publish = Publishing {
            relay: Arc::downgrade(relay),
            publisher,
            sdp,
            pts: ingest.pts,
            conn,
            started: false,
            video_ssrc: None,
            simulcast,
            asked: Instant::now(),
        };
        self.admit(status, rtc, Vec::new(), Some(publish), None, (pass, None))?;
        tracing::info!(path, publisher = %id, simulcast = ?rids, "WHIP publisher offered");
        Ok((answer, id))
    }

    /// Ends the viewers of `path` (its stream ended), and its publishers too if `all` (the
    /// path is gone).
    pub fn end_path(&self, path: &str, all: bool) {
        let ids: Vec<String> = self
            .shared
            .viewers
            .lock()
            .values()
            .filter(|v| v.path == path && (all || v.role == "viewer"))
            .map(|v| v.id.clone())
            .collect();
        for id in ids {
            let _ = self.cmds.send(Cmd::Remove(id));
        }
    }

    /// Ends peer `id` of `path` in `role` (WHEP's or WHIP's DELETE: a publisher is not
    /// ended through a reader's URL); whether it was there.
    pub fn end(&self, path: &str, id: &str, role: &str, by: Acting) -> bool {
        let found = self.shared.viewers.lock().get(id).is_some_and(|v| v.path == path && v.role == role && owns(v, by));
        if found {
            let _ = self.cmds.send(Cmd::Remove(id.to_string()));
        }
        found
    }
}

/// Who acts on a peer (its `PATCH`, its `DELETE`).
#[derive(Clone, Copy)]
pub enum Acting {
    /// The API token: on every peer.
    Admin,
    /// A caller with these credentials (their digest): on the peers it made.
    As(Option<[u8; 32]>),
}

/// Whether `by` may act on peer `v`: the API token, its maker's credentials, or anyone who
/// knows its id where it was made with none.
fn owns(v: &ViewerStatus, by: Acting) -> bool {
    match by {
        Acting::Admin => true,
        Acting::As(digest) => v.owner.is_none() || v.owner == digest,
    }
}

async fn run(
    socket: tokio::net::UdpSocket,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    tcp: Option<Arc<TcpSide>>,
    mut tcp_in: mpsc::Receiver<(SocketAddr, Vec<u8>)>,
    shared: Arc<Shared>,
    wake: Arc<Notify>,
) {
    let local = socket.local_addr().expect("bound");
    // After a hand-over: no port of its own, a connected socket per viewer instead.
    let mut socket = Some(socket);
    let mut handed: HashMap<SocketAddr, Handed> = HashMap::new();
    let (handed_tx, mut handed_in) = mpsc::channel::<(SocketAddr, Vec<u8>)>(1024);
    let mut viewers: HashMap<String, Viewer> = HashMap::new();
    let mut by_addr: HashMap<SocketAddr, String> = HashMap::new();
    let mut buf = vec![0u8; 2048];
    let mut frames: Vec<Frame> = Vec::new();
    // The peers with something to do (input, media, their time): only they are polled.
    let mut busy: Vec<String> = Vec::new();
    let mut tick = Instant::now();
    // A viewer asked for a keyframe in this round (its path's WHIP publisher is asked).
    let mut keyframe_wanted = false;
    // Every datagram the polled peers want sent, sent together after them (`flush`).
    let mut batch: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
    let mut gso = fanout_io::gso::GsoSender::new();
    loop {
        let now = Instant::now();
        for (id, v) in viewers.iter_mut().filter(|(_, v)| now >= v.wake_at) {
            let _ = v.rtc.handle_input(Input::Timeout(now));
            busy.push(id.clone());
        }
        busy.sort_unstable();
        busy.dedup();
        let mut gone = Vec::new();
        // A viewer that just connected shows as playing at once, not at the next tick.
        let mut connected = false;
        for id in busy.drain(..) {
            if let Some(v) = viewers.get_mut(&id) {
                let was = v.connected;
                if !drive(v, tcp.as_deref(), &mut batch, &mut keyframe_wanted) {
                    gone.push(id);
                }
                connected |= v.connected && !was;
            }
        }
        match &socket {
            Some(socket) => flush(socket, &mut gso, &mut batch).await,
            None => flush_handed(&handed, &mut batch).await,
        }
        // Readers that want a keyframe (WebRTC viewers, RTSP clients) mark their track's
        // session; a WHIP publisher takes the mark and is asked, at most once per
        // KEYFRAME_GAP (a mark inside the gap waits for its end). An RTSP upstream is asked by
        // its own task, an RTSP publisher by the RTSP server's; RTMP and SRT publishers
        // cannot be (a viewer then waits for the source's next keyframe; NACK repairs most
        // loss before it comes to that).
        // (Looked at when a viewer asked, and with the status for RTSP clients' asks.)
        if std::mem::take(&mut keyframe_wanted) || tick.elapsed() >= Duration::from_millis(500) {
            for v in viewers.values_mut().filter(|v| v.publish.is_some()) {
                ask_keyframe(v, KEYFRAME_GAP, true);
                publish_rates(v);
            }
        }
        // Twice a second: the status, simulcast viewers' encodings, and peers that never
        // connected.
        if connected || tick.elapsed() >= Duration::from_millis(500) {
            tick = Instant::now();
            for v in viewers.values_mut().filter(|v| v.connected) {
                let peer = v.from.unwrap_or_else(|| SocketAddr::new([0, 0, 0, 0].into(), 0));
                let Some(sim) = v.outs.iter_mut().find_map(|o| o.sim.as_deref_mut()) else { continue };
                refresh(sim, peer);
                // Probes (padding) for room up to the best encoding, with some to spare.
                let best = sim.encodings[0].bps;
                if best > 0.0 {
                    v.rtc.bwe().set_desired_bitrate(str0m::bwe::Bitrate::bps((best * 1.2) as u64));
                }
            }
            gone.extend(
                viewers.values().filter(|v| !v.connected && v.since.elapsed() > CONNECT_WITHIN).map(|v| v.id.clone()),
            );
            let mut s = shared.viewers.lock();
            for v in viewers.values() {
                if let Some(st) = s.get_mut(&v.id) {
                    st.state = if v.connected { "playing" } else { "connecting" };
                    st.since_s = v.since.elapsed().as_secs_f64();
                    st.packets = v.packets;
                    st.peer = v.from;
                    st.last_picture = v.last_picture;
                    if let Some(a) = v.adapt {
                        st.estimate_bps = a.estimate_bps;
                        st.layers =
                            v.outs.iter().filter(|o| o.video).find_map(|o| o.session.sink_status(o.sink?)?.layers);
                    }
                    if let Some(sim) = v.outs.iter().find_map(|o| o.sim.as_ref()) {
                        st.encoding = sim.current.and_then(|k| Some(sim.encodings.get(k)?.rid.clone()));
                        st.switches = Some(sim.switches);
                    }
                }
            }
        }
        for id in gone {
            remove(&mut viewers, &mut by_addr, &shared, &id);
        }
        if socket.is_none() {
            handed.retain(|addr, _| by_addr.contains_key(addr));
        }
        let next = viewers.values().map(|v| v.wake_at).min().unwrap_or(now + Duration::from_millis(500));
        let next = next.min(tick + Duration::from_millis(500));
        tokio::select! {
            got = recv_from(socket.as_ref(), &mut buf) => {
                let Ok((n, from)) = got else { continue };
                let Ok(contents) = buf[..n].try_into() else { continue };
                let input = Input::Receive(Instant::now(), Receive { proto: Protocol::Udp, source: from, destination: local, contents });
                if let Some(id) = deliver(&mut viewers, &mut by_addr, from, input) {
                    busy.push(id);
                }
            }
            Some((from, data)) = handed_in.recv() => {
                let Ok(contents) = data.as_slice().try_into() else { continue };
                let input = Input::Receive(Instant::now(), Receive { proto: Protocol::Udp, source: from, destination: local, contents });
                if let Some(id) = deliver(&mut viewers, &mut by_addr, from, input) {
                    busy.push(id);
                }
            }
            Some((from, data)) = tcp_in.recv() => {
                let Some(t) = tcp.as_ref() else { continue };
                let Ok(contents) = data.as_slice().try_into() else { continue };
                let input = Input::Receive(Instant::now(), Receive { proto: Protocol::Tcp, source: from, destination: t.local, contents });
                if let Some(id) = deliver(&mut viewers, &mut by_addr, from, input) {
                    busy.push(id);
                }
            }
            cmd = cmds.recv() => match cmd {
                Some(Cmd::Add(v)) => {
                    busy.push(v.id.clone());
                    viewers.insert(v.id.clone(), *v);
                }
                Some(Cmd::Remove(id)) => remove(&mut viewers, &mut by_addr, &shared, &id),
                Some(Cmd::HandOver) => {
                    let on_tcp = |a: &SocketAddr| tcp.as_ref().is_some_and(|t| t.writers.lock().contains_key(a));
                    for &peer in by_addr.keys().filter(|a| !on_tcp(a)) {
                        match Handed::connect(local, peer, handed_tx.clone()) {
                            Ok(h) => {
                                handed.insert(peer, h);
                            }
                            Err(e) => tracing::warn!(%peer, "upgrade: a WebRTC viewer cannot stay: {e}"),
                        }
                    }
                    // (Its last datagrams in the socket's queue are lost: the peer's
                    // retransmissions and NACKs repair them.)
                    socket = None;
                    tracing::info!(viewers = handed.len(), "upgrade: WebRTC viewers stay with this process on sockets of their own");
                }
                None => return,
            },
            _ = wake.notified() => {
                let now = Instant::now();
                for v in viewers.values_mut().filter(|v| v.connected && v.publish.is_none()) {
                    pump(v, &mut frames, now);
                    busy.push(v.id.clone());
                }
            }
            _ = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

/// The task's port, until a hand-over (then never ready).
async fn recv_from(socket: Option<&tokio::net::UdpSocket>, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
    match socket {
        Some(s) => s.recv_from(buf).await,
        None => std::future::pending().await,
    }
}

/// Binds the WebRTC port so that an upgrade's new process can bind it too while this one
/// keeps its viewers (`SO_REUSEADDR`, which both must set). A first start makes sure no one
/// holds the port — another relay's socket would share it silently.
fn bind_port(addr: SocketAddr, beside_old: bool) -> std::io::Result<std::net::UdpSocket> {
    let addr = if beside_old { addr } else { std::net::UdpSocket::bind(addr)?.local_addr()? };
    Ok(on_port(addr)?.into())
}

/// A non-blocking UDP socket bound to `addr` beside the others on it (`SO_REUSEADDR`).
fn on_port(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, None)?;
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// A viewer kept after a hand-over: a socket on the WebRTC port connected to its address,
/// and the task that passes what it receives to the viewers' task.
struct Handed {
    socket: Arc<tokio::net::UdpSocket>,
    reader: tokio::task::JoinHandle<()>,
}

impl Handed {
    fn connect(local: SocketAddr, peer: SocketAddr, to: mpsc::Sender<(SocketAddr, Vec<u8>)>) -> std::io::Result<Self> {
        let s = on_port(local)?;
        s.connect(&peer.into())?;
        let socket = Arc::new(tokio::net::UdpSocket::from_std(s.into())?);
        let r = socket.clone();
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            loop {
                match r.recv(&mut buf).await {
                    Ok(n) if to.send((peer, buf[..n].to_vec())).await.is_ok() => {}
                    Ok(_) => return,
                    // (An ICMP error from the peer: it may come back; consent freshness decides.)
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                    Err(_) => return,
                }
            }
        });
        Ok(Self { socket, reader })
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// After a hand-over: each datagram on its viewer's own socket (one whose viewer left is
/// dropped).
async fn flush_handed(handed: &HashMap<SocketAddr, Handed>, batch: &mut Vec<(SocketAddr, Vec<u8>)>) {
    for (to, d) in batch.drain(..) {
        if let Some(h) = handed.get(&to) {
            let _ = h.socket.send(&d).await;
        }
    }
}

/// Sends the batch from the task's UDP socket: a viewer's consecutive datagrams of one size
/// (a picture's fragments) as one GSO message, all in few `sendmmsg` calls; waits while the
/// socket's buffer is full, as `send_to` did.
async fn flush(
    socket: &tokio::net::UdpSocket,
    gso: &mut fanout_io::gso::GsoSender,
    batch: &mut Vec<(SocketAddr, Vec<u8>)>,
) {
    use std::os::fd::AsRawFd;
    let datagrams: Vec<(SocketAddr, &[u8])> = batch.iter().map(|(a, d)| (*a, d.as_slice())).collect();
    let mut done = 0;
    while done < datagrams.len() {
        let sent =
            socket.async_io(tokio::io::Interest::WRITABLE, || gso.send(socket.as_raw_fd(), &datagrams[done..])).await;
        match sent {
            Ok(n) => done += n,
            Err(e) => {
                tracing::warn!("WebRTC send failed: {e}");
                break;
            }
        }
    }
    drop(datagrams);
    batch.clear();
}

/// Polls viewer `v`'s output until it wants time or input: queues its datagrams in `batch`,
/// handles its events. `false`: it is over.
fn drive(
    v: &mut Viewer,
    tcp: Option<&TcpSide>,
    batch: &mut Vec<(SocketAddr, Vec<u8>)>,
    keyframe_wanted: &mut bool,
) -> bool {
    loop {
        match v.rtc.poll_output() {
            Ok(Output::Timeout(t)) => {
                v.wake_at = t;
                return v.rtc.is_alive();
            }
            Ok(Output::Transmit(t)) if t.proto == Protocol::Tcp => {
                if let Some(tcp) = tcp {
                    tcp.send(t.destination, &t.contents);
                }
            }
            Ok(Output::Transmit(t)) => batch.push((t.destination, t.contents.into())),
            Ok(Output::Event(Event::Connected)) if v.publish.is_some() => {
                v.connected = true;
                if let Err(why) = start_publishing(v) {
                    tracing::warn!(publisher = %v.id, "WHIP publisher not started: {why}");
                    return false;
                }
            }
            Ok(Output::Event(Event::RtpPacket(p))) => {
                if !publish_rtp(v, &p) {
                    tracing::info!(publisher = %v.id, "WHIP publisher taken over by a new one: closed");
                    return false;
                }
            }
            Ok(Output::Event(Event::Connected)) => {
                v.connected = true;
                // Its sinks join the path's sessions now, at the ring's last keyframe (a
                // simulcast viewer's on the encoding its first estimate fits).
                let start = v.adapt.map_or(START_BPS, |a| a.estimate_bps.unwrap_or(a.whole_bps.min(START_BPS)));
                let peer = v.from.unwrap_or_else(|| SocketAddr::new([0, 0, 0, 0].into(), 0));
                for o in &mut v.outs {
                    if let Some(sim) = o.sim.as_mut() {
                        let rates: Vec<f64> = sim.encodings.iter().map(|e| e.bps).collect();
                        let place = fanout_proto::simulcast::pick(&rates, start, sim.encodings.len());
                        if place > 0 {
                            // Another encoding than the path's has keyframes only when asked
                            // (its ring's last one may be minutes old): the viewer joins it
                            // live, at the keyframe the switch asks for.
                            sim.current = None;
                            switch(sim, place, peer);
                            continue;
                        }
                    }
                    match o.session.add_channel_sink(peer, o.queue.clone(), false) {
                        Ok(id) => o.sink = Some(id),
                        Err(e) => tracing::warn!(viewer = %v.id, "cannot add the WebRTC viewer's sink: {e}"),
                    }
                }
                if let Some(a) = v.adapt {
                    // Probes (padding) for room up to the whole stream, with some to spare.
                    v.rtc.bwe().set_desired_bitrate(str0m::bwe::Bitrate::bps((a.whole_bps * 1.2) as u64));
                    adapt(v, a.estimate_bps.unwrap_or(a.whole_bps.min(START_BPS)));
                }
                tracing::info!(viewer = %v.id, peer = ?v.from, "WebRTC viewer connected");
            }
            Ok(Output::Event(Event::EgressBitrateEstimate(kind))) => {
                let estimate = match kind {
                    str0m::bwe::BweKind::Twcc { estimate, .. } | str0m::bwe::BweKind::Remb { estimate, .. } => estimate,
                    _ => continue,
                };
                adapt(v, estimate.as_f64());
            }
            Ok(Output::Event(Event::KeyframeRequest(_))) => {
                // The path's source takes it from the session (a WHIP publisher, an RTSP
                // upstream), at its own pace.
                *keyframe_wanted = true;
                for o in v.outs.iter().filter(|o| o.video) {
                    o.session.want_keyframe();
                }
            }
            Ok(Output::Event(Event::IceConnectionStateChange(IceConnectionState::Disconnected))) => return false,
            Ok(Output::Event(_)) => {}
            Err(e) => {
                tracing::info!(viewer = %v.id, "WebRTC viewer ended: {e}");
                return false;
            }
        }
    }
}

/// A bandwidth estimate for viewer `v` (bits per second): its video sinks get the layers
/// that fit.
fn adapt(v: &mut Viewer, bps: f64) {
    let Some(a) = v.adapt.as_mut() else { return };
    a.estimate_bps = Some(bps);
    let peer = v.from.unwrap_or_else(|| SocketAddr::new([0, 0, 0, 0].into(), 0));
    for o in v.outs.iter_mut().filter(|o| o.video) {
        if let Some(id) = o.sink {
            o.session.sink_estimate(id, bps);
        }
        if let Some(sim) = o.sim.as_mut().filter(|_| o.sink.is_some()) {
            let rates: Vec<f64> = sim.encodings.iter().map(|e| e.bps).collect();
            let place = fanout_proto::simulcast::pick(&rates, bps, sim.current.unwrap_or(usize::MAX));
            switch(sim, place, peer);
        }
    }
}

/// Starts simulcast viewer `sim`'s switch to encoding `place` (or, if that is the one it
/// gets, calls off a switch under way): a live sink on it, its queue woken as the current
/// one's is, and a keyframe asked for; `pump` switches at that keyframe.
fn switch(sim: &mut Sim, place: usize, peer: SocketAddr) {
    if sim.next.as_ref().map(|n| n.place).or(sim.current) == Some(place) {
        return;
    }
    if let Some(n) = sim.next.take() {
        n.session.remove_sink(n.sink);
    }
    let Some(e) = sim.encodings.get(place).filter(|_| sim.current != Some(place)) else { return };
    let wake = sim.wake.clone();
    let queue = ChannelQueue::new(QUEUE, move || wake.notify_one());
    match e.session.add_live_channel_sink(peer, queue.clone()) {
        Ok(sink) => {
            e.session.want_keyframe();
            tracing::debug!(to = %e.rid, "simulcast viewer switching");
            sim.next = Some(Next { place, session: e.session.clone(), queue, sink });
        }
        Err(err) => tracing::warn!("cannot add the simulcast viewer's sink: {err}"),
    }
}

/// A simulcast viewer's encodings anew (their rates; a publisher that changed or left): one
/// it gets that is gone is left for the track's own (the first).
fn refresh(sim: &mut Sim, peer: SocketAddr) {
    let now = sim.publisher.encodings().filter(|(t, e)| *t == sim.track && !e.is_empty()).map(|(_, e)| e);
    let same = |e: &Vec<crate::publish::Encoding>| {
        e.len() == sim.encodings.len() && e.iter().zip(&sim.encodings).all(|(a, b)| a.session == b.session)
    };
    match now {
        Some(e) if same(&e) => sim.encodings = e,
        other => {
            let first = sim.encodings[0].clone();
            if let Some(n) = sim.next.take() {
                n.session.remove_sink(n.sink);
            }
            let was = sim.current.map(|k| sim.encodings[k].session.clone());
            sim.encodings = other.unwrap_or_else(|| vec![first]);
            sim.current = sim.encodings.iter().position(|e| Some(&e.session) == was.as_ref());
            if sim.current.is_none() {
                switch(sim, 0, peer);
            }
        }
    }
}

/// Hands a datagram from `from` to its peer: known by its address, else by the ICE
/// username of its check. The peer's id, if there is one.
fn deliver(
    viewers: &mut HashMap<String, Viewer>,
    by_addr: &mut HashMap<SocketAddr, String>,
    from: SocketAddr,
    input: Input<'_>,
) -> Option<String> {
    let id = match by_addr.get(&from) {
        Some(id) => Some(id.clone()),
        None => viewers.values().find(|v| v.rtc.accepts(&input)).map(|v| v.id.clone()),
    };
    let v = id.and_then(|id| viewers.get_mut(&id))?;
    if v.from != Some(from) {
        v.from = Some(from);
        by_addr.insert(from, v.id.clone());
    }
    let _ = v.rtc.handle_input(input);
    Some(v.id.clone())
}

/// ICE-TCP (RFC 6544), passive, for networks that block UDP. Each connection carries RFC
/// 4571 frames (a 2-byte length, then a STUN message or a DTLS/SRTP datagram); what it brings
/// goes to the task as a datagram would, and what the task sends to its address goes back
/// on it.
struct TcpSide {
    /// Each connection's outgoing frames, by its peer's address.
    writers: Mutex<HashMap<SocketAddr, mpsc::Sender<Vec<u8>>>>,
    local: SocketAddr,
}

/// Frames queued for one ICE-TCP connection; past them, frames are dropped (as UDP would).
const TCP_QUEUE: usize = 512;
/// An ICE-TCP connection silent this long is closed (ICE checks come every few seconds).
const TCP_IDLE: Duration = Duration::from_secs(30);

impl TcpSide {
    fn send(&self, to: SocketAddr, data: &[u8]) {
        let Ok(len) = u16::try_from(data.len()) else { return };
        let mut frame = Vec::with_capacity(2 + data.len());
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(data);
        if let Some(w) = self.writers.lock().get(&to) {
            let _ = w.try_send(frame);
        }
    }
}

async fn tcp_accept(
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
async fn tcp_conn(
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

/// A WHIP publisher is connected: it becomes the path's publisher (or is refused, as any).
fn start_publishing(v: &mut Viewer) -> Result<(), String> {
    let peer = v.from.map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let p = v.publish.as_mut().expect("a publisher");
    let relay = p.relay.upgrade().ok_or("the relay is stopping")?;
    p.publisher
        .start_stream(crate::publish::Ingest::Webrtc, v.id.clone(), p.conn, peer, p.sdp.clone(), &relay.engine)
        .map_err(|e| e.to_string())?;
    p.started = true;
    tracing::info!(publisher = %v.id, ?peer, "WHIP publisher connected");
    Ok(())
}

/// An RTP packet from a WHIP publisher into its track; `false`: it no longer publishes
/// (taken over). Asks it for a keyframe every `KEYFRAME_EVERY`.
fn publish_rtp(v: &mut Viewer, pkt: &str0m::rtp::RtpPacket) -> bool {
    let Some(p) = v.publish.as_mut().filter(|p| p.started) else { return true };
    let pt = *pkt.header.payload_type;
    let Some(&(_, track)) = p.pts.iter().find(|(x, _)| *x == pt) else { return true };
    if track == 0 && p.sdp.media.first().is_some_and(|m| m.kind == "video") {
        p.video_ssrc = Some(pkt.header.ssrc);
    }
    let h = &pkt.header;
    let mut data = vec![0u8; 12 + pkt.payload.len()];
    let n =
        fanout_proto::rtp::write_header(&mut data, h.marker, 96 + track as u8, h.sequence_number, h.timestamp, *h.ssrc);
    data[n..].copy_from_slice(&pkt.payload);
    v.packets += 1;
    let fed = match p.simulcast.as_mut().filter(|s| s.track == track) {
        Some(sc) => {
            // Which encoding: the RID str0m mapped this SSRC to.
            let rid = v.rtc.direct_api().stream_rx(&h.ssrc).and_then(|s| s.rid());
            let Some(i) = rid.and_then(|r| sc.ranking.index(&r)) else { return true };
            sc.ssrcs[i] = Some(h.ssrc);
            if sc.ranking.packet(i, sc.codec, &pkt.payload, sc.since.elapsed().as_millis() as u64) {
                let order = sc.ranking.order().unwrap_or_default();
                let rids = order.iter().map(|&k| sc.ranking.rids()[k].clone()).collect();
                let sizes: Vec<_> = order.iter().map(|&k| sc.ranking.size(k)).collect();
                tracing::info!(publisher = %v.id, ?rids, ?sizes, "simulcast encodings ranked");
                let Some(relay) = p.relay.upgrade() else { return false };
                if let Err(e) = p.publisher.simulcast(p.conn, track, rids, &relay.engine) {
                    tracing::warn!(publisher = %v.id, "simulcast encodings not kept: {e}");
                }
            }
            // Until the ranking is decided, the video waits.
            match sc.ranking.order().and_then(|o| o.iter().position(|&k| k == i)) {
                Some(place) => p.publisher.feed_encoding(p.conn, place, &mut data, 0),
                None => p.publisher.is_publishing_on(p.conn),
            }
        }
        None => p.publisher.feed_rtp(p.conn, track, &mut data, 0),
    };
    if !fed {
        return false;
    }
    ask_keyframe(v, KEYFRAME_EVERY, false);
    true
}

/// Asks WHIP publisher `v` for a keyframe (PLI) unless it was asked less than `gap` ago;
/// `readers`: only if a reader of its tracks wanted one (the mark is taken).
/// A simulcast publisher is asked on each encoding whose readers wanted one (the first's
/// readers are the track's); unasked, on the first only (the path's: the other encodings'
/// readers are WebRTC viewers, which ask when they join or switch, and a keyframe costs a
/// small encoding most).
fn ask_keyframe(v: &mut Viewer, gap: Duration, readers: bool) {
    let Some(p) = v.publish.as_mut().filter(|p| p.started && p.asked.elapsed() >= gap) else { return };
    let wanted = |place: usize| match (readers, place) {
        (false, place) => place == 0,
        (true, 0) => p.publisher.take_keyframe_request(),
        (true, place) => p.publisher.take_encoding_keyframe_request(place),
    };
    let ssrcs: Vec<str0m::rtp::Ssrc> = match p.simulcast.as_ref() {
        Some(sc) => {
            let order = sc.ranking.order().unwrap_or_default();
            order.iter().enumerate().filter(|(place, _)| wanted(*place)).filter_map(|(_, &k)| sc.ssrcs[k]).collect()
        }
        None => p.video_ssrc.filter(|_| wanted(0)).into_iter().collect(),
    };
    if ssrcs.is_empty() {
        return;
    }
    p.asked = Instant::now();
    for ssrc in ssrcs {
        if let Some(rx) = v.rtc.direct_api().stream_rx(&ssrc) {
            rx.request_keyframe(str0m::media::KeyframeRequestKind::Pli);
            // Polled at once: the request goes out now.
            v.wake_at = p.asked;
        }
    }
}

/// A simulcast publisher's encodings' rates, for its viewers' choice.
fn publish_rates(v: &Viewer) {
    let Some((p, sc)) = v.publish.as_ref().and_then(|p| Some((p, p.simulcast.as_ref()?))) else { return };
    if let Some(order) = sc.ranking.order() {
        p.publisher.set_encoding_rates(order.iter().map(|&k| sc.ranking.bps(k)).collect());
    }
}

/// Moves what viewer `v`'s queues hold into its `Rtc`, renumbered as its own stream.
///
/// A viewer of layered video may lose a picture's last packet, the one with the marker, to
/// its layer cap, and a browser's depacketizer waits for that marker: a video packet without
/// one is held until the next shows whether a new picture began (then it ends its own).
///
/// A simulcast viewer switching encodings gets the current one's packets until the next
/// one's first keyframe packet, then the next one's from there, its RTP time joined on.
fn pump(v: &mut Viewer, frames: &mut Vec<Frame>, now: Instant) {
    let hold = v.adapt.is_some_and(|a| a.layered);
    for o in &mut v.outs {
        o.queue.drain(frames);
        send(&mut v.rtc, o, frames, hold, now, &mut v.packets, &mut v.last_picture);
        let Some((ts, mut next_frames)) = o.sim.as_mut().and_then(|sim| next_keyframe(sim)) else { continue };
        // The switch: the current encoding's sink goes, the next one's is the out's.
        let sim = o.sim.as_mut().expect("switching");
        let next = sim.next.take().expect("switching");
        if let Some(id) = o.sink {
            o.session.remove_sink(id);
            sim.switches += 1;
        }
        (o.session, o.queue, o.sink) = (next.session, next.queue, Some(next.sink));
        sim.current = Some(next.place);
        // Its keyframe goes out as the picture after the last one sent, by the time between.
        if let Some((last, at)) = sim.last {
            let pictures = ((now - at).as_secs_f64() * 90_000.0 / f64::from(sim.step)).round().max(1.0) as u32;
            o.ts_offset = last.wrapping_add(pictures * sim.step).wrapping_sub(ts);
        }
        o.held = None;
        tracing::debug!(viewer = %v.id, to = %sim.encodings[next.place].rid, "simulcast viewer switched");
        send(&mut v.rtc, o, &mut next_frames, hold, now, &mut v.packets, &mut v.last_picture);
    }
    v.wake_at = now;
}

/// Writes `frames` (drained) of out `o` into `rtc`; `hold`: layered video, whose packets
/// without a marker wait for the next.
fn send(
    rtc: &mut Rtc,
    o: &mut Out,
    frames: &mut Vec<Frame>,
    hold: bool,
    now: Instant,
    packets: &mut u64,
    last_picture: &mut Option<LastPicture>,
) {
    for (p, _) in frames.drain(..) {
        let Ok(rtp) = RtpView::parse(p.data()) else { continue };
        if hold && o.video {
            if let Some(h) = o.held.take() {
                if let Ok(held) = RtpView::parse(h.data()) {
                    let end = held.timestamp() != rtp.timestamp();
                    write(rtc, o, &held, end, now, packets, last_picture);
                }
            }
            if !rtp.marker() {
                o.held = Some(p);
                continue;
            }
        }
        write(rtc, o, &rtp, false, now, packets, last_picture);
    }
}

/// A simulcast viewer switching: once its next encoding brought a keyframe, that keyframe's
/// RTP time and the packets from it on (those before it are dropped: nothing decodes them).
fn next_keyframe(sim: &mut Sim) -> Option<(u32, Vec<Frame>)> {
    let next = sim.next.as_ref()?;
    let mut got = Vec::new();
    next.queue.drain(&mut got);
    let k = got.iter().position(|(p, _)| p.is_keyframe())?;
    let ts = RtpView::parse(got[k].0.data()).ok()?.timestamp();
    Some((ts, got.split_off(k)))
}

/// Writes RTP packet `rtp` of out `o` into `rtc` as the viewer's own (with the parameter sets a
/// keyframe needs before it), marked as a picture's end if it is or `end`.
fn write(
    rtc: &mut Rtc,
    o: &mut Out,
    rtp: &RtpView<'_>,
    end: bool,
    now: Instant,
    packets: &mut u64,
    last_picture: &mut Option<LastPicture>,
) {
    let mut api = rtc.direct_api();
    let Some(stream) = api.stream_tx_by_mid(o.mid, None) else { return };
    let ts = rtp.timestamp().wrapping_add(o.ts_offset);
    let params = o.params.as_mut().map(|p| p.before(ts, rtp.payload())).unwrap_or_default();
    for nal in params {
        let w = RtpWrite::new(o.pt.into(), SeqNo::from(o.next_seq), ts, now, nal).nackable(true);
        stream.write_rtp(w);
        o.next_seq += 1;
    }
    let marker = rtp.marker() || end;
    let w =
        RtpWrite::new(o.pt.into(), SeqNo::from(o.next_seq), ts, now, rtp.payload()).marker(marker).nackable(o.video);
    stream.write_rtp(w);
    o.next_seq += 1;
    *packets += 1;
    if o.video && marker {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        *last_picture = Some(LastPicture { rtp: ts, unix_ms });
        if let Some(sim) = o.sim.as_mut() {
            // The time between pictures, as the newest two show it (whole frames of it join
            // a switch's keyframe on).
            let step = sim.last.map_or(0, |(last, _)| ts.wrapping_sub(last));
            if (1..90_000).contains(&step) {
                sim.step = step;
            }
            sim.last = Some((ts, now));
        }
    }
}

fn remove(viewers: &mut HashMap<String, Viewer>, by_addr: &mut HashMap<SocketAddr, String>, shared: &Shared, id: &str) {
    let Some(mut v) = viewers.remove(id) else { return };
    for o in &v.outs {
        if let Some(s) = o.sink {
            o.session.remove_sink(s);
        }
        if let Some(n) = o.sim.as_ref().and_then(|s| s.next.as_ref()) {
            n.session.remove_sink(n.sink);
        }
    }
    v.rtc.disconnect();
    if let Some(p) = v.publish.as_ref().filter(|p| p.started) {
        p.publisher.stop(&v.id);
    }
    by_addr.retain(|_, x| x != id);
    shared.viewers.lock().remove(id);
    tracing::info!(viewer = %id, after_s = v.since.elapsed().as_secs_f64(), packets = v.packets, "WebRTC viewer left");
}

/// WHEP's routes: `POST` an offer to `/v1/sessions/{name}/whep` (or `/{name}/whep`, as
/// MediaMTX has it), `PATCH` (trickle ICE: the relay is ICE-lite and needs none of the
/// browser's candidates, so it takes and ignores them) and `DELETE` its resource; CORS for
/// pages of any origin.
pub fn routes() -> axum::Router<Arc<Relay>> {
    use axum::routing::post;
    let resource = || post(|| async { StatusCode::METHOD_NOT_ALLOWED }).patch(patch).delete(delete).options(preflight);
    axum::Router::new()
        .route("/v1/sessions/{name}/whep", post(offer).options(preflight))
        .route("/v1/sessions/{name}/whep/{id}", resource())
        .route("/{name}/whep", post(offer).options(preflight))
        .route("/{name}/whep/{id}", resource())
        .route("/v1/sessions/{name}/whip", post(offer).options(preflight))
        .route("/v1/sessions/{name}/whip/{id}", resource())
        .route("/{name}/whip", post(offer).options(preflight))
        .route("/{name}/whip/{id}", resource())
        .route_layer(axum::middleware::map_response(cors))
        .route_layer(axum::extract::DefaultBodyLimit::max(MAX_OFFER))
}

use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;

async fn cors(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, header::HeaderValue::from_static("*"));
    h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, header::HeaderValue::from_static("Location, ETag, Link"));
    r
}

async fn preflight() -> Response {
    let headers = [
        (header::ACCESS_CONTROL_ALLOW_METHODS, "POST, PATCH, DELETE, OPTIONS"),
        (header::ACCESS_CONTROL_ALLOW_HEADERS, "Authorization, Content-Type, If-Match"),
        (header::ACCESS_CONTROL_MAX_AGE, "600"),
    ];
    (StatusCode::NO_CONTENT, headers).into_response()
}

fn text(status: u16, why: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "text/plain")], why).into_response()
}

/// The client's address, where the HTTP listener gave it.
type Client = Option<Extension<ConnectInfo<SocketAddr>>>;

/// A WHEP or WHIP offer (the route says which).
async fn offer(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
    client: Client,
    RawQuery(query): RawQuery,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let what = if uri.path().ends_with("/whip") { "whip" } else { "whep" };
    let caller = Caller { ip: client.map(|c| c.0 .0.ip()), owner: credentials(&headers, query.as_deref()) };
    negotiated(relay, name, caller, headers, query, body, what).await
}

/// A digest of the credentials a request gave (its `Authorization`, else its `?token=`).
fn credentials(headers: &HeaderMap, query: Option<&str>) -> Option<[u8; 32]> {
    let given = match headers.get(header::AUTHORIZATION) {
        Some(v) => v.as_bytes().to_vec(),
        None => query?.split('&').find_map(|kv| kv.strip_prefix("token="))?.as_bytes().to_vec(),
    };
    let d = ring::digest::digest(&ring::digest::SHA256, &given);
    d.as_ref().try_into().ok()
}

/// Who acts on a peer: the holder of the API token on any, anyone else on the ones its
/// credentials made.
fn acting(relay: &Relay, headers: &HeaderMap, query: Option<&str>) -> Acting {
    let token = relay.cfg().token.clone();
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if token.is_some() && fanout_proto::auth::token_given(token.as_deref(), auth, query) {
        return Acting::Admin;
    }
    Acting::As(credentials(headers, query))
}

/// The configured STUN/TURN servers as `Link` headers (RFC 9725 §4.6), for clients behind
/// NAT; config validation keeps quotes and angle brackets out of them.
fn ice_servers(relay: &Relay, h: &mut HeaderMap) {
    for s in &relay.cfg().webrtc_ice_servers {
        let mut link = format!("<{}>; rel=\"ice-server\"", s.url);
        if let (Some(u), Some(c)) = (&s.username, &s.credential) {
            link += &format!("; username=\"{u}\"; credential=\"{c}\"; credential-type=\"password\"");
        }
        if let Ok(v) = header::HeaderValue::from_str(&link) {
            h.append(header::LINK, v);
        }
    }
}

/// Whether a WHEP/WHIP request may go on. WebRTC is a stream face on the API's port: it takes
/// the API token (`Authorization: Bearer`, or `?token=` for players that cannot set a
/// header) and the stream users RTSP, RTMP and SRT take (`rtsp_user`, the token as user
/// `token` where `rtsp_require_token`), as HTTP Basic; then `[auth]` where configured. With
/// none of them, it is open. `publish`: a WHIP request.
async fn allowed(
    relay: &Relay,
    headers: &HeaderMap,
    query: Option<&str>,
    ip: Option<IpAddr>,
    name: &str,
    publish: bool,
) -> bool {
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let token = relay.cfg().token.clone();
    let by_token = token.as_ref().map(|_| fanout_proto::auth::token_given(token.as_deref(), auth, query));
    let basic = auth.and_then(fanout_proto::http::basic_credentials);
    let by_user = relay.stream_login(basic.as_ref().map(|b| b.0.as_str()), basic.as_ref().map(|b| b.1.as_str()));
    let local = match (by_token, by_user) {
        (None, None) => None,
        (a, b) => Some(a == Some(true) || b == Some(true)),
    };
    use fanout_proto::auth::Action;
    let action = if publish { Action::Publish } else { Action::Read };
    let ip = ip.unwrap_or(IpAddr::from([0, 0, 0, 0]));
    relay.permit(local, fanout_proto::auth::http_request(auth, query, ip, action, name, "webrtc")).await
}

/// 401, with the schemes this relay takes.
fn unauthorized(relay: &Relay) -> Response {
    let mut schemes = Vec::new();
    if relay.cfg().token.is_some() {
        schemes.push("Bearer");
    }
    if !relay.cfg().rtsp_credentials().is_empty() {
        schemes.push("Basic realm=\"fanout\"");
    }
    let mut r = text(401, "missing or wrong credentials (the API token as Bearer, or a stream user as Basic)".into());
    if let Ok(v) = header::HeaderValue::from_str(&schemes.join(", ")) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// A WHEP (`whep`) or WHIP (`whip`) offer: `201` with the answer and the peer's resource,
/// or the refusal with its reason.
async fn negotiated(
    relay: Arc<Relay>,
    name: String,
    caller: Caller,
    headers: HeaderMap,
    query: Option<String>,
    body: String,
    what: &str,
) -> Response {
    let client = caller.ip;
    if !allowed(&relay, &headers, query.as_deref(), client, &name, what == "whip").await {
        tracing::info!(path = %name, ?client, "{} offer refused (401): no valid credentials", what.to_uppercase());
        return unauthorized(&relay);
    }
    let Some(w) = face(&relay) else {
        return text(503, "WebRTC is off on this relay (webrtc = \"off\", or its port was taken)".into());
    };
    let sdp = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/sdp"));
    if !sdp {
        return text(415, format!("a {} offer is Content-Type: application/sdp", what.to_uppercase()));
    }
    let done = match what {
        "whip" => w.publish(&relay, &name, &body, caller).await,
        _ => w.offer(&relay, &name, &body, caller).await,
    };
    match done {
        Ok((answer, id)) => {
            let location = format!("/v1/sessions/{name}/{what}/{id}");
            let headers = [(header::CONTENT_TYPE, "application/sdp".to_string()), (header::LOCATION, location)];
            let mut r = (StatusCode::CREATED, headers, answer).into_response();
            ice_servers(&relay, r.headers_mut());
            r
        }
        Err(Refused(status, why)) => {
            tracing::info!(path = %name, "{} offer refused ({status}): {why}", what.to_uppercase());
            text(status, why)
        }
    }
}

async fn patch(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    client: Client,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let ip = client.map(|c| c.0 .0.ip());
    let publish = uri.path().contains("/whip/");
    if !allowed(&relay, &headers, query.as_deref(), ip, &name, publish).await {
        return unauthorized(&relay);
    }
    let role = if publish { "publisher" } else { "viewer" };
    let by = acting(&relay, &headers, query.as_deref());
    let mine = |v: &ViewerStatus| v.id == id && v.role == role && owns(v, by);
    match face(&relay).filter(|w| w.viewers(Some(&name)).iter().any(mine)) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => text(404, format!("no WebRTC viewer {id} of {name}")),
    }
}

async fn delete(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    client: Client,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let ip = client.map(|c| c.0 .0.ip());
    let publish = uri.path().contains("/whip/");
    if !allowed(&relay, &headers, query.as_deref(), ip, &name, publish).await {
        return unauthorized(&relay);
    }
    let role = if publish { "publisher" } else { "viewer" };
    // Another's peer is answered as one that is not there: its id tells nothing.
    let by = acting(&relay, &headers, query.as_deref());
    match face(&relay).filter(|w| w.end(&name, &id, role, by)) {
        Some(_) => StatusCode::OK.into_response(),
        None => text(404, format!("no WebRTC viewer {id} of {name}")),
    }
}
