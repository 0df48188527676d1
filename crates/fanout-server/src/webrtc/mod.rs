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

mod http;
mod negotiate;
mod send;
mod task;
mod tcp;
mod whip;

pub use http::routes;
use send::*;
use task::*;
use tcp::*;
use whip::*;

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
    /// Ends a peer; told once it is gone (its address's place given back) where asked.
    Remove(String, Option<tokio::sync::oneshot::Sender<()>>),
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
        let _ = self.cmds.send(Cmd::Remove(self.id.clone(), None));
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
            let _ = self.cmds.send(Cmd::Remove(id, None));
        }
    }

    /// Ends peer `id` of `path` in `role` (WHEP's or WHIP's DELETE: a publisher is not
    /// ended through a reader's URL); whether it was there. Returns once the peer is gone,
    /// so the caller's next offer finds its place free.
    pub async fn end(&self, path: &str, id: &str, role: &str, by: Acting) -> bool {
        let found = self.shared.viewers.lock().get(id).is_some_and(|v| v.path == path && v.role == role && owns(v, by));
        if found {
            let (done, gone) = tokio::sync::oneshot::channel();
            if self.cmds.send(Cmd::Remove(id.to_string(), Some(done))).is_ok() {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), gone).await;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_acted_on_by_the_token_or_its_makers_credentials() {
        let mut v = ViewerStatus {
            offered_by: None,
            owner: None,
            id: "v".into(),
            path: "cam".into(),
            role: "viewer",
            peer: None,
            state: "playing",
            since_s: 0.0,
            tracks: Vec::new(),
            left_out: Vec::new(),
            packets: 0,
            last_picture: None,
            estimate_bps: None,
            layers: None,
            encoding: None,
            switches: None,
        };
        assert!(owns(&v, Acting::Admin));
        assert!(owns(&v, Acting::As(Some([1; 32]))), "made without credentials: whoever knows its id");
        v.owner = Some([1; 32]);
        assert!(owns(&v, Acting::As(Some([1; 32]))));
        assert!(!owns(&v, Acting::As(Some([2; 32]))), "another caller's credentials");
        assert!(!owns(&v, Acting::As(None)));
        assert!(owns(&v, Acting::Admin));
    }
}
