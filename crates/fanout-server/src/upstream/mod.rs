//! A session whose source is an RTSP server: one upstream RTSP session, however many clients.
//!
//! The protocol is `fanout_proto::rtsp::client`'s state machine; this module moves its bytes,
//! owns the UDP ports, and feeds what arrives into the relay. Each media section of the
//! upstream is a relay session (the first is the session itself, the others are created when
//! the description arrives) whose source is a loopback UDP socket. Every upstream RTP packet
//! is checked, rewritten into one continuous stream ([`Restamp`]: the SSRC, sequence numbers
//! and timestamps clients were promised survive reconnects and SSRC changes) and sent once
//! into that socket; from there the engine fans it out on the session's data path. That is
//! one extra datagram per upstream packet, not per client, and it lets UDP and interleaved
//! upstreams, garbage filtering and the kernel data path share one way in.
//!
//! Lifecycle: connect on demand (a DESCRIBE or a sink) or at once (`on_demand = false`);
//! UDP, TCP interleaved, or UDP falling back to TCP when nothing arrives; keep-alives at half
//! the session timeout; receiver reports every 5 s; reconnect with backoff (1 s doubling to
//! 30 s) when the upstream drops or goes silent (`timeout_s`, 10 s); TEARDOWN `linger_s`
//! after the last client.

mod pull;

use pull::connect_once;

use crate::error::UpstreamError;
use crate::spec::RtspTransport;
use crate::track::{track_format, TrackFeed, TrackRef};
use fanout_io::{Inlet, Session};
use fanout_proto::rtp::stats::RecvStats;
use fanout_proto::rtsp::client::{Client, Step, Url};
use fanout_proto::rtsp::sdp::Sdp;
use fanout_proto::rtsp::{self, Limits, Lower, Message};
use parking_lot::Mutex;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A UDP upstream that brings nothing for this long after PLAY is retried over TCP (`auto`).
const UDP_GRACE: Duration = Duration::from_secs(3);
const REPORT_EVERY: Duration = Duration::from_secs(5);
/// At most one keyframe request a track in this time: a camera's encoder is not driven by
/// its viewers' losses faster than this, however many there are.
const KEYFRAME_EVERY: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A DESCRIBE keeps the upstream wanted this long, for the client's SETUP and PLAY.
const SETUP_GRACE: Duration = Duration::from_secs(5);

/// Where a track's receiver reports go over UDP: its RTCP socket and the server's port.
type RtcpOut = (Arc<tokio::net::UdpSocket>, Option<SocketAddr>);

pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Where a pulled upstream (a cluster channel) connects: asked before every (re)connect.
pub trait Origin: Send + Sync {
    /// The URL to connect to now; `failed`: the last attempt (or the stream) failed. `Err`:
    /// nothing serves the stream any more, and the session ends.
    fn next(&self, failed: bool) -> BoxFuture<'_, Result<Url, PullEnds>>;
}

/// Why a pull has nowhere to connect any more (no node serves its stream): the path ends.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct PullEnds(pub String);

impl From<&str> for PullEnds {
    fn from(s: &str) -> Self {
        PullEnds(s.to_string())
    }
}

/// How an upstream is reached and kept (the session's `rtsp` source fields).
pub struct UpstreamOptions {
    pub url: Url,
    /// A cluster pull: the URL comes from here at each connect, and the run ends (the
    /// session with it) when the origin is gone or nobody watched for `linger`.
    pub origin: Option<Arc<dyn Origin>>,
    /// For an `rtsps://` URL: how to check the server.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub mode: RtspTransport,
    pub on_demand: bool,
    /// Torn down this long after the last client left (on demand).
    pub linger: Duration,
    /// Reconnected after this long without RTP.
    pub silence: Duration,
}

/// What the upstream side of a session settles on.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UpstreamStatus {
    pub url: String,
    /// idle, connecting, playing, retrying
    pub state: &'static str,
    /// The lower transport in use (or last used): udp or tcp.
    pub transport: Option<&'static str>,
    pub connects: u64,
    pub last_error: Option<String>,
    /// Where the last error came from: connect, tls, auth, protocol, describe or io.
    pub last_error_origin: Option<&'static str>,
    /// `rtsps://`: the connection is TLS.
    pub tls: bool,
    /// SRTP/SRTCP packets from the upstream that failed their check: dropped.
    pub srtp_dropped: u64,
    pub tracks: Vec<TrackStatus>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TrackStatus {
    pub session: String,
    pub media: String,
    pub clock_rate: u32,
    pub packets: u64,
    /// Datagrams that were not RTP, or RTP of another payload type: dropped.
    pub dropped: u64,
    /// How often the upstream's stream restarted (reconnects, SSRC changes).
    pub breaks: u64,
    pub lost: u64,
    /// Keyframes asked of the upstream (RTCP PLI) for this track's readers.
    pub keyframes_asked: u64,
}

struct Track {
    feed: TrackFeed,
    media: String,
    pt: Option<u8>,
    stats: RecvStats,
    /// Expected/received at the last receiver report (for its fraction lost).
    last_rr: (u64, u64),
    /// The upstream's last sender report: its SSRC, NTP middle 32 bits, when.
    last_sr: Option<(u32, u32, Instant)>,
    /// The SSRC of its newest RTP packet: what a keyframe request names.
    ssrc: Option<u32>,
    /// When the upstream was last asked for a keyframe, and how often it was.
    last_pli: Option<Instant>,
    keyframes_asked: u64,
}

struct State {
    sdp: Option<Sdp>,
    tracks: Vec<Track>,
    state: &'static str,
    transport: Option<&'static str>,
    connects: u64,
    last_error: Option<String>,
    last_error_origin: Option<&'static str>,
    /// Until when someone wants the stream without being a sink yet (a DESCRIBE).
    wanted_until: Option<Instant>,
    /// SRTP/SRTCP packets from the upstream that failed their check (or were replays).
    srtp_dropped: u64,
}

pub struct Upstream {
    name: String,
    url: Mutex<Url>,
    origin: Option<Arc<dyn Origin>>,
    tls: Option<Arc<rustls::ClientConfig>>,
    mode: RtspTransport,
    on_demand: bool,
    linger: Duration,
    /// A playing upstream silent for this long is reconnected.
    silence: Duration,
    state: Mutex<State>,
    /// Bumped when a description is available (and at every PLAY).
    ready: tokio::sync::watch::Sender<u64>,
    wake: tokio::sync::Notify,
    /// UDP upstreams: per track, the RTCP socket and the server's RTCP address.
    rtcp_out: Mutex<Vec<Option<RtcpOut>>>,
    started: Instant,
    /// Asked to end (its session is deleted): tear the upstream session down and return.
    closing: std::sync::atomic::AtomicBool,
    /// The task returned.
    finished: tokio::sync::watch::Sender<bool>,
    /// A reload changed the URL: the next connect goes there (a playing upstream is torn
    /// down for it at once).
    switch_to: Mutex<Option<Url>>,
}

impl Upstream {
    /// `first` is the relay session that carries the first media section.
    pub fn new(name: &str, o: UpstreamOptions, first: &Session) -> std::io::Result<Arc<Self>> {
        let UpstreamOptions { url, origin, tls, mode, on_demand, linger, silence } = o;
        let track = Track::new(Inlet::open(first)?, "video".into(), 90_000, None);
        Ok(Arc::new(Self {
            name: name.to_string(),
            url: Mutex::new(url),
            origin,
            tls,
            mode,
            on_demand,
            linger,
            silence,
            state: Mutex::new(State {
                sdp: None,
                tracks: vec![track],
                state: "idle",
                transport: None,
                connects: 0,
                last_error: None,
                last_error_origin: None,
                wanted_until: None,
                srtp_dropped: 0,
            }),
            ready: tokio::sync::watch::channel(0).0,
            wake: tokio::sync::Notify::new(),
            rtcp_out: Mutex::new(Vec::new()),
            started: Instant::now(),
            closing: Default::default(),
            finished: tokio::sync::watch::Sender::new(false),
            switch_to: Default::default(),
        }))
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A cluster pull whose origin is gone: the path's readers learn it ended, and why.
    fn ended(&self, why: String) {
        tracing::warn!(session = %self.name, "pull ends: {why}");
        let mut st = self.state.lock();
        st.last_error = Some(why);
        st.state = "ended";
        drop(st);
        self.ready.send_modify(|g| *g += 1);
    }

    pub fn status(&self) -> UpstreamStatus {
        let url = self.url.lock().clone();
        let st = self.state.lock();
        UpstreamStatus {
            url: url.request_url(),
            state: st.state,
            transport: st.transport,
            connects: st.connects,
            last_error: st.last_error.clone(),
            last_error_origin: st.last_error_origin,
            tls: url.tls,
            srtp_dropped: st.srtp_dropped,
            tracks: st
                .tracks
                .iter()
                .map(|t| TrackStatus {
                    session: t.feed.session.name().to_string(),
                    media: t.media.clone(),
                    clock_rate: t.feed.clock,
                    packets: t.feed.packets,
                    dropped: t.feed.dropped,
                    breaks: t.feed.breaks(),
                    lost: t.stats.lost(),
                    keyframes_asked: t.keyframes_asked,
                })
                .collect(),
        }
    }

    /// The tracks in media order.
    pub fn tracks(&self) -> Vec<TrackRef> {
        let st = self.state.lock();
        st.tracks.iter().map(|t| t.feed.track_ref()).collect()
    }

    /// Per track, the RTP sequence number and timestamp a client joining now gets first:
    /// the session's next packet, or the planned start before any packet arrived.
    pub fn next_rtp(&self) -> Vec<Option<(u16, u32)>> {
        let st = self.state.lock();
        st.tracks.iter().map(|t| t.feed.next_rtp()).collect()
    }

    /// The upstream's description, once known.
    pub fn sdp(&self) -> Option<Sdp> {
        self.state.lock().sdp.clone()
    }

    /// A client asks for the stream: connect if idle, and wait (at most `wait`) for the
    /// description. `None` if it did not come.
    pub async fn demand(&self, wait: Duration) -> Option<Sdp> {
        self.state.lock().wanted_until = Some(Instant::now() + SETUP_GRACE);
        self.wake.notify_one();
        let mut rx = self.ready.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(sdp) = self.sdp() {
                if self.state.lock().state == "playing" {
                    return Some(sdp);
                }
            }
            if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                return self.sdp();
            }
        }
    }

    /// Whether anyone wants the stream now: a sink on any track, or a recent DESCRIBE.
    fn wanted(&self) -> bool {
        let st = self.state.lock();
        !self.on_demand
            || st.wanted_until.is_some_and(|t| t > Instant::now())
            || st.tracks.iter().any(|t| !t.feed.session.sinks().is_empty())
    }

    fn set_state(&self, state: &'static str) {
        let was = std::mem::replace(&mut self.state.lock().state, state);
        if was != state {
            tracing::info!(session = %self.name, from = was, to = state, "upstream state");
        }
    }

    /// The tracks of a (new) description: clock rates, payload types, and a relay session
    /// for every media section past the first.
    fn adopt(&self, sdp: &Sdp, template: &fanout_io::SessionConfig, engine: &fanout_io::Engine) -> std::io::Result<()> {
        let mut st = self.state.lock();
        for (i, m) in sdp.media.iter().enumerate() {
            let pt = m.formats.first().and_then(|f| f.parse::<u8>().ok());
            let (clock, video) = track_format(m);
            if i >= st.tracks.len() {
                let mut cfg = template.clone();
                cfg.name = crate::track::Inner::Track(i).name(&self.name);
                let session = Session::new(cfg, engine);
                session.set_source_kind(format!("track {i} of {}", self.url.lock().request_url()));
                session.set_rtp_video(video);
                st.tracks.push(Track::new(Inlet::open(&session)?, m.kind.clone(), clock, pt));
            } else {
                let t = &mut st.tracks[i];
                t.feed.set_clock(clock);
                (t.media, t.pt) = (m.kind.clone(), pt);
                t.feed.session.set_rtp_video(video);
            }
        }
        // Our clients get what we decrypted: plain RTP, and no upstream keys.
        let mut plain = sdp.clone();
        for m in &mut plain.media {
            m.proto = m.proto.replace("SAVP", "AVP");
            m.lines.retain(|(k, v)| !(*k == 'a' && (v.starts_with("crypto:") || v.starts_with("key-mgmt:"))));
        }
        st.sdp = Some(plain);
        Ok(())
    }

    /// One datagram of track `i` from the upstream: into the relay, or counted and dropped.
    fn feed_rtp(&self, i: usize, data: &mut [u8]) {
        let now = self.now_ms();
        let mut st = self.state.lock();
        let Some(t) = st.tracks.get_mut(i) else { return };
        // One parse: the payload type to check, the upstream's own numbers for the
        // receiver statistics its reports are about.
        let (seq, ts) = match fanout_proto::rtp::RtpView::parse(data) {
            Ok(v) if t.pt.is_none_or(|pt| v.payload_type() == pt) => {
                t.ssrc = Some(v.ssrc());
                (v.sequence_number(), v.timestamp())
            }
            _ => {
                t.feed.dropped += 1;
                return;
            }
        };
        let arrival = (now.wrapping_mul(u64::from(t.feed.clock)) / 1000) as u32;
        t.stats.record(seq, ts, arrival, now * 1_000_000);
        t.feed.rtp(data, now);
    }

    /// An RTCP datagram of track `i` from the upstream: its sender reports feed our RRs.
    /// SRTP (`rtp`) or SRTCP from the upstream: decrypted, then fed as plain; what fails
    /// its check is dropped and counted.
    fn feed_srtp(&self, i: usize, rtp: bool, ctx: &mut fanout_proto::rtp::srtp::Context, data: &mut [u8]) {
        let n = if rtp { ctx.unprotect_rtp_in(data) } else { ctx.unprotect_rtcp_in(data) };
        match n {
            Ok(n) if rtp => self.feed_rtp(i, &mut data[..n]),
            Ok(n) => self.feed_rtcp(i, &data[..n]),
            Err(e) => {
                let mut st = self.state.lock();
                st.srtp_dropped += 1;
                if st.srtp_dropped == 1 {
                    tracing::warn!(session = %self.name, "SRTP from the upstream dropped: {e}");
                }
            }
        }
    }

    fn feed_rtcp(&self, i: usize, data: &[u8]) {
        let Ok(reports) = fanout_proto::rtp::rtcp::parse_reports(data) else { return };
        let mut st = self.state.lock();
        let Some(t) = st.tracks.get_mut(i) else { return };
        if let Some((ssrc, info)) = reports.first().and_then(|r| r.sender_info()) {
            t.last_sr = Some((ssrc, fanout_proto::rtp::rtcp::ntp_mid32(info.ntp), Instant::now()));
            t.feed.sender_report(ssrc, info, fanout_io::sys::ntp_now());
        }
    }

    /// A receiver report per track that has had packets, for the upstream.
    fn receiver_reports(&self, reporter: u32) -> Vec<(usize, Vec<u8>)> {
        let mut st = self.state.lock();
        st.tracks
            .iter_mut()
            .enumerate()
            .filter(|(_, t)| t.feed.packets > 0)
            .map(|(i, t)| {
                let (src, lsr, dlsr) = match t.last_sr {
                    Some((ssrc, mid, at)) => (ssrc, mid, (at.elapsed().as_secs_f64() * 65536.0) as u32),
                    None => (0, 0, 0),
                };
                let block = t.stats.report_block(&mut t.last_rr, src, lsr, dlsr);
                let mut out = Vec::with_capacity(32);
                fanout_proto::rtp::rtcp::write_receiver_report(&mut out, reporter, &block);
                (i, out)
            })
            .collect()
    }

    /// A keyframe request (an empty report and a PLI) per track whose readers want one
    /// (`Session::want_keyframe`: WebRTC viewers, RTSP clients), at most one per track per
    /// `KEYFRAME_EVERY` whatever the number of readers; a request inside that gap waits for
    /// its end.
    fn keyframe_requests(&self, reporter: u32) -> Vec<(usize, Vec<u8>)> {
        let mut st = self.state.lock();
        let now = Instant::now();
        st.tracks
            .iter_mut()
            .enumerate()
            .filter_map(|(i, t)| {
                let media = t.ssrc?;
                if t.last_pli.is_some_and(|at| now - at < KEYFRAME_EVERY) || !t.feed.session.take_keyframe_request() {
                    return None;
                }
                t.last_pli = Some(now);
                t.keyframes_asked += 1;
                let mut out = Vec::with_capacity(20);
                fanout_proto::rtp::rtcp::write_keyframe_request(&mut out, reporter, media);
                Some((i, out))
            })
            .collect()
    }

    fn set_rtcp_out(&self, i: usize, sock: Arc<tokio::net::UdpSocket>, to: Option<SocketAddr>) {
        let mut outs = self.rtcp_out.lock();
        if outs.len() <= i {
            outs.resize_with(i + 1, || None);
        }
        outs[i] = Some((sock, to));
    }

    fn send_udp_rr(&self, i: usize, rr: &[u8]) {
        if let Some(Some((sock, Some(to)))) = self.rtcp_out.lock().get(i) {
            let _ = sock.try_send_to(rr, *to);
        }
    }

    /// Every track's stream restarts with the next packet (a new upstream session).
    fn discontinuity(&self) {
        for t in self.state.lock().tracks.iter_mut() {
            t.feed.new_source();
            t.stats = RecvStats::default();
            t.last_rr = (0, 0);
            t.last_sr = None;
        }
    }

    fn packets(&self) -> u64 {
        self.state.lock().tracks.iter().map(|t| t.feed.packets).sum()
    }

    /// Ends the upstream session politely: a TEARDOWN, so that the server stops sending
    /// (over UDP it would otherwise go on until its own timeout), within `wait`.
    pub async fn close(&self, wait: Duration) {
        self.closing.store(true, std::sync::atomic::Ordering::Relaxed);
        self.wake.notify_waiters();
        if self.state.lock().state != "playing" {
            return; // no upstream session to end
        }
        let mut finished = self.finished.subscribe();
        let _ = tokio::time::timeout(wait, finished.wait_for(|f| *f)).await;
    }

    /// Its run ended (a cluster pull whose origin went or that nobody watched): the session
    /// is about to go.
    pub fn finished(&self) -> bool {
        *self.finished.borrow()
    }

    fn closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Moves to another URL under the same tracks (a reload): the connection ends and the
    /// next is made at once, with the clock map kept as for any reconnect.
    pub fn switch_url(&self, url: Url) {
        *self.switch_to.lock() = Some(url);
        self.wake.notify_waiters();
    }

    /// Returns once a new URL waits (told by `switch_url`'s wake, not found by polling).
    async fn switched(&self) {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            // Registered before the check: a switch between the two still wakes it.
            notified.as_mut().enable();
            if self.switch_to.lock().is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Takes a pending switch: whether there was one.
    fn take_switch(&self) -> bool {
        let Some(url) = self.switch_to.lock().take() else { return false };
        tracing::info!(session = %self.name, url = %url.request_url(), "upstream switches to a new URL");
        *self.url.lock() = url;
        true
    }

    /// Closes the sessions of the tracks past the first (the first belongs to the relay).
    pub fn close_tracks(&self) {
        let extra: Vec<Session> = {
            let tracks = &mut self.state.lock().tracks;
            // (None yet, when it never set up: nothing to close.)
            let first = tracks.len().min(1);
            tracks.drain(first..).map(|t| t.feed.session).collect()
        };
        for s in extra {
            s.close();
        }
    }
}

impl Track {
    fn new(inlet: Inlet, media: String, clock: u32, pt: Option<u8>) -> Self {
        Self {
            feed: TrackFeed::new(inlet, clock),
            media,
            pt,
            stats: RecvStats::default(),
            last_rr: (0, 0),
            last_sr: None,
            ssrc: None,
            last_pli: None,
            keyframes_asked: 0,
        }
    }
}

/// How one upstream session ended.
pub(super) enum Ended {
    /// Torn down: nobody wants the stream.
    Idle,
    /// UDP brought nothing or was refused: try TCP next.
    UseTcp(&'static str),
    /// Torn down: the session is being deleted.
    Closed,
    /// Torn down: the URL changed.
    Switched,
}

/// What an upstream needs of the relay it feeds: the engine its track sessions run on. The
/// relay implements it, so this module (below the relay) does not import it.
pub trait Host: Send + Sync {
    fn engine(&self) -> &fanout_io::Engine;
}

/// Runs the upstream for the relay session's lifetime (the task is aborted with it). A
/// cluster pull returns when its origin is gone or nobody watched for `linger`; the caller
/// then ends the session.
pub async fn run(up: Arc<Upstream>, template: fanout_io::SessionConfig, relay: std::sync::Weak<dyn Host>) {
    struct CloseTracks(Arc<Upstream>);
    impl Drop for CloseTracks {
        fn drop(&mut self) {
            self.0.close_tracks();
            self.0.finished.send_replace(true);
        }
    }
    let _guard = CloseTracks(up.clone());
    let mut retry = Retry::new(up.mode);
    loop {
        while !up.wanted() {
            if up.closing() {
                return;
            }
            up.take_switch();
            up.set_state("idle");
            let _ = tokio::time::timeout(Duration::from_millis(500), up.wake.notified()).await;
        }
        let before = up.url.lock().request_url();
        if let Some(origin) = &up.origin {
            match origin.next(retry.failed).await {
                Ok(url) => *up.url.lock() = url,
                Err(why) => return up.ended(why.0),
            }
            // Another node: at once, from UDP again where that is the mode.
            if retry.failed && up.url.lock().request_url() != before {
                retry.reset();
            }
        }
        // (A reload's new URL cuts a failed upstream's wait short.)
        let _ = tokio::time::timeout(retry.wait(), up.switched()).await;
        if up.take_switch() {
            retry.reset();
        }
        up.set_state("connecting");
        up.state.lock().connects += 1;
        let Some(r) = relay.upgrade() else { return };
        let url = up.url.lock().request_url();
        match connect_once(&up, retry.tcp, &template, r.engine()).await {
            Ok(Ended::Closed) => return,
            Ok(Ended::Switched) => {}
            Ok(Ended::Idle) => {
                tracing::info!(session = %up.name, "upstream torn down: no clients for {:?}", up.linger);
                (retry.backoff, retry.failed) = (Duration::from_secs(1), false);
                if up.origin.is_some() {
                    return;
                }
            }
            Ok(Ended::UseTcp(why)) => {
                tracing::warn!(session = %up.name, "{why}: switching to TCP interleaved");
                up.state.lock().last_error = Some(format!("{why}: switched to TCP interleaved"));
                (retry.tcp, retry.failed) = (true, false);
            }
            Err(e) => {
                tracing::warn!(session = %up.name, %url, "upstream: {e}; retrying");
                {
                    let mut st = up.state.lock();
                    st.last_error = Some(e.to_string());
                    st.last_error_origin = Some(e.origin());
                    st.state = "retrying";
                }
                up.ready.send_modify(|g| *g += 1); // waiting DESCRIBEs learn it failed
                retry.failed();
            }
        }
        up.discontinuity();
    }
}

/// How the next connection is made: after what wait, over TCP or not. Failures back off,
/// doubling up to `MAX_BACKOFF`; `Auto` tries UDP again after each.
#[derive(Debug)]
struct Retry {
    mode: RtspTransport,
    backoff: Duration,
    tcp: bool,
    /// The last connection failed.
    failed: bool,
}

impl Retry {
    fn new(mode: RtspTransport) -> Self {
        Self { mode, backoff: Duration::from_secs(1), tcp: mode == RtspTransport::Tcp, failed: false }
    }

    /// Starts afresh (a new URL or node): at once, from UDP again where that is the mode.
    fn reset(&mut self) {
        *self = Self::new(self.mode);
    }

    /// How long to wait before the next connection.
    fn wait(&self) -> Duration {
        if self.failed {
            self.backoff
        } else {
            Duration::ZERO
        }
    }

    fn failed(&mut self) {
        self.backoff = if self.failed {
            (self.backoff * 2).clamp(Duration::from_secs(1), MAX_BACKOFF)
        } else {
            Duration::from_secs(1)
        };
        self.failed = true;
        if self.mode == RtspTransport::Auto {
            self.tcp = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_to_the_most_and_a_fresh_start_is_at_once() {
        let mut r = Retry::new(RtspTransport::Auto);
        assert_eq!(r.wait(), Duration::ZERO, "the first connection at once");
        let waits: Vec<u64> = (0..7)
            .map(|_| {
                r.failed();
                r.wait().as_secs()
            })
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        r.tcp = true; // (a UDP upstream that sent nothing: TCP interleaved)
        r.failed();
        assert!(!r.tcp, "auto tries UDP again after a failure");
        r.reset();
        assert_eq!((r.wait(), r.tcp), (Duration::ZERO, false));
        let mut t = Retry::new(RtspTransport::Tcp);
        t.failed();
        assert!(t.tcp, "a TCP upstream stays on TCP");
        t.reset();
        assert!(t.tcp);
    }
}
