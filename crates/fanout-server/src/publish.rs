//! Publishing into a session (`source = { publish = true }`), over RTSP, RTMP, SRT or
//! WebRTC: an RTSP publisher's ANNOUNCE gives the tracks, its RTP arrives interleaved on its
//! RTSP connection (or over UDP); an RTMP publisher's FLV and an SRT publisher's MPEG-TS are
//! made RTP tracks by `fanout_proto::rtmp::ingest` and `fanout_proto::container::tsingest`; a
//! WHIP publisher's RTP comes through `crate::webrtc`. Each is fed into the tracks' relay sessions like an upstream's (restamped, so clients see one SSRC and
//! unbroken sequence numbers across publishers). A publisher that leaves is an upstream
//! loss: the session waits, its clients stay, and the next publisher continues the stream.

use crate::track::track_format;
use crate::track::{TrackFeed, TrackRef};
use fanout_io::{Inlet, Session};
use fanout_proto::rtsp::sdp::Sdp;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;

/// How a publisher sends: RTP on its RTSP connection or over UDP, or a protocol of its own
/// whose container the relay makes RTP tracks of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ingest {
    Interleaved,
    Udp,
    Rtmp,
    Srt,
    Webrtc,
    /// The relay reading another server's HLS.
    Hls,
    /// The path's `fallback` file, played while no one publishes.
    Fallback,
}

impl Ingest {
    pub fn as_str(self) -> &'static str {
        match self {
            Ingest::Interleaved => "interleaved",
            Ingest::Udp => "udp",
            Ingest::Rtmp => "rtmp",
            Ingest::Srt => "srt",
            Ingest::Webrtc => "webrtc",
            Ingest::Hls => "hls",
            Ingest::Fallback => "fallback",
        }
    }

    /// The protocol it publishes with: `rtsp`, `rtmp`, `srt`, `webrtc` or `hls`.
    pub fn protocol(self) -> &'static str {
        match self {
            Ingest::Interleaved | Ingest::Udp => "rtsp",
            other => other.as_str(),
        }
    }

    /// Whether the RTSP server knows this publisher (its ANNOUNCE, its RTSP session).
    pub fn is_rtsp(self) -> bool {
        self.protocol() == "rtsp"
    }
}

impl std::fmt::Display for Ingest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who publishes now.
struct Active {
    rtsp_session: String,
    conn: u64,
    peer: std::net::IpAddr,
    /// Interleaved channel → (track, is RTCP).
    channels: HashMap<u8, (usize, bool)>,
    /// Where its RTP and RTCP over UDP come from (its address, the ports its SETUP named) →
    /// (track, is RTCP): nothing from elsewhere is taken.
    udp: HashMap<SocketAddr, (usize, bool)>,
    transport: Ingest,
    since: Instant,
    /// Told when a newer publisher takes over (an RTSP publisher's connection is closed by
    /// it; RTMP and SRT publishers learn it from [`Publisher::feed_rtp`]).
    displaced: Option<Box<dyn FnOnce() + Send>>,
}

#[derive(Default)]
struct State {
    sdp: Option<Sdp>,
    tracks: Vec<TrackFeed>,
    active: Option<Active>,
    publishes: u64,
    takeovers: u64,
    /// When each track's RTSP publisher was last asked for a keyframe.
    asked: HashMap<usize, Instant>,
    /// Keyframe requests sent to RTSP publishers.
    keyframes_asked: u64,
    /// A simulcast publisher's encodings of one video track past its best (which feeds the
    /// track): their feeds, kept across publishers as the tracks are.
    alternates: Vec<TrackFeed>,
    /// Which encodings the one publishing sends, while it is a simulcast one.
    simulcast: Option<Simulcast>,
}

/// A simulcast publisher's encodings: of track `track`, best first (the first feeds the
/// track, the others `State::alternates` in order), with their rates.
struct Simulcast {
    track: usize,
    rids: Vec<String>,
    bps: Vec<f64>,
}

/// One encoding of a simulcast publisher's video, for viewers that pick by rate.
#[derive(Clone)]
pub struct Encoding {
    pub rid: String,
    pub session: Session,
    pub bps: f64,
}

/// Where RTCP for an RTSP publisher goes: its RTCP port (from the record ports), or an
/// interleaved channel of its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtcpTo {
    Udp(SocketAddr),
    Conn(u64, u8),
}

/// An RTSP publisher is asked for a keyframe at most this often per track.
const KEYFRAME_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Serialize)]
pub struct PublisherStatus {
    /// `publishing` or `waiting`.
    pub state: &'static str,
    pub peer: Option<std::net::IpAddr>,
    /// How the publisher sends: `interleaved` on its RTSP connection, `udp`, `rtmp`, `srt` or
    /// `webrtc`.
    pub transport: Option<Ingest>,
    pub publishing_s: Option<f64>,
    /// Publishers so far.
    pub publishes: u64,
    /// Whether a new publisher replaces the one publishing (`takeover`).
    pub takeover: bool,
    /// Publishers replaced by a newer one.
    pub takeovers: u64,
    /// Keyframe requests (PLI) sent to RTSP publishers for their readers.
    pub keyframes_asked: u64,
    /// An SRT pull that is not publishing: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull_error: Option<String>,
    pub tracks: Vec<serde_json::Value>,
    /// A simulcast publisher's encodings, best first: the first feeds the path, the others
    /// are there for WebRTC viewers whose link does not carry it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub simulcast: Vec<serde_json::Value>,
}

pub struct Publisher {
    name: String,
    first: Session,
    /// The first track's inlet, until its track is made.
    first_inlet: Mutex<Option<Inlet>>,
    state: Mutex<State>,
    started: Instant,
    /// Whether anyone may publish; not where the relay itself feeds it (an SRT pull).
    open: bool,
    /// Why the relay's own feed (an SRT pull) is not publishing, if it is not.
    pull_error: Mutex<Option<String>>,
    /// A new publisher replaces the one publishing, instead of being refused.
    takeover: bool,
    /// Publishers that came and went, for the `on_publish` / `on_unpublish` hooks.
    events: Mutex<Vec<Publishing>>,
    /// Told each time a publisher comes or goes: who waits for that wakes then, not on a tick.
    changes: tokio::sync::watch::Sender<()>,
    /// A pull that plays only while someone reads (`on_demand`): until when a reader's ask
    /// keeps it wanted, and what wakes the pull.
    on_demand: Option<(Mutex<Option<Instant>>, tokio::sync::Notify)>,
}

/// A reader that asked for an on-demand pull's stream keeps it wanted this long, while the
/// stream comes and the reader's own sinks are made.
const ASKED_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// A publisher that came (`ended` none) or went.
#[derive(Debug, Clone, PartialEq)]
pub struct Publishing {
    pub protocol: &'static str,
    pub peer: std::net::IpAddr,
    /// How long it published, once it went.
    pub ended: Option<std::time::Duration>,
}

impl Publishing {
    /// The hook's environment (besides the path's).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("FANOUT_PUBLISHER_PROTOCOL", self.protocol.to_string()),
            ("FANOUT_PUBLISHER_ADDR", self.peer.to_string()),
        ];
        if let Some(d) = self.ended {
            env.push(("FANOUT_PUBLISHER_DURATION_S", format!("{:.3}", d.as_secs_f64())));
        }
        env
    }
}

/// What a new publisher on connection `new` meets: the path free (or its own connection
/// again, a second RECORD), the one publishing replaced (`takeover`), or a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandOver {
    Start,
    Replace,
    Refuse,
}

/// `publishing`: the connection publishing and whether it is the path's fallback; `fallback`:
/// whether the newcomer is. A publisher always replaces the fallback; the fallback never
/// replaces a publisher.
fn hand_over(publishing: Option<(u64, bool)>, new: u64, fallback: bool, takeover: bool) -> HandOver {
    match publishing {
        Some((old, _)) if old == new => HandOver::Start,
        Some(_) if fallback => HandOver::Refuse,
        Some((_, true)) => HandOver::Replace,
        Some(_) if takeover => HandOver::Replace,
        Some(_) => HandOver::Refuse,
        None => HandOver::Start,
    }
}

impl Publisher {
    /// The publisher side of session `first` (its first track).
    pub fn new(name: &str, first: Session, takeover: bool) -> std::io::Result<Self> {
        Ok(Self {
            name: name.to_string(),
            first_inlet: Mutex::new(Some(Inlet::open(&first)?)),
            first,
            state: Mutex::new(State::default()),
            started: Instant::now(),
            open: true,
            pull_error: Mutex::new(None),
            takeover,
            events: Mutex::new(Vec::new()),
            changes: tokio::sync::watch::Sender::new(()),
            on_demand: None,
        })
    }

    /// The publisher side of a path the relay feeds itself (an SRT pull): the same tracks,
    /// clock map and restamping across reconnections, and no publisher from outside.
    pub fn pulled(name: &str, first: Session) -> std::io::Result<Self> {
        Ok(Self { open: false, ..Self::new(name, first, false)? })
    }

    /// As [`Publisher::pulled`], for a pull that plays only while someone reads.
    pub fn pulled_on_demand(name: &str, first: Session) -> std::io::Result<Self> {
        Ok(Self { on_demand: Some((Mutex::new(None), tokio::sync::Notify::new())), ..Self::pulled(name, first)? })
    }

    /// A reader asks for the stream: an on-demand pull is woken, and this waits (at most
    /// `wait`) until the stream is there. Nothing for any other publisher side.
    pub async fn demand(&self, wait: std::time::Duration) {
        let Some((asked, wake)) = &self.on_demand else { return };
        *asked.lock() = Some(Instant::now() + ASKED_GRACE);
        wake.notify_one();
        let mut changes = self.changes();
        let deadline = tokio::time::Instant::now() + wait;
        while self.sdp().is_none() {
            if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
                return;
            }
        }
    }

    /// Whether anyone wants the stream: always, unless the pull is on demand; then a reader
    /// asked lately, or one of its tracks has a sink (a reader, the repackaging).
    pub fn wanted(&self) -> bool {
        let Some((asked, _)) = &self.on_demand else { return true };
        asked.lock().is_some_and(|t| t > Instant::now()) || self.tracks().iter().any(|t| !t.session.sinks().is_empty())
    }

    /// Returns once the stream is wanted.
    pub async fn until_wanted(&self) {
        while !self.wanted() {
            let Some((_, wake)) = &self.on_demand else { return };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), wake.notified()).await;
        }
    }

    /// Whether RTSP, RTMP, SRT and WebRTC publishers may publish here.
    pub fn takes_publishers(&self) -> bool {
        self.open
    }

    /// Whether a new publisher replaces the one publishing.
    pub fn takes_over(&self) -> bool {
        self.takeover
    }

    /// Why a new publisher would be refused now: someone publishes, and the path does not
    /// let a newcomer take over.
    pub fn refusal(&self) -> Option<String> {
        let st = self.state.lock();
        let a = st.active.as_ref().filter(|a| !self.takeover && a.transport != Ingest::Fallback)?;
        // (Not from where: the newcomer is told this.)
        Some(format!("{} is being published (over {})", self.name, a.transport))
    }

    /// Notes why the relay's own feed is not publishing (`None`: it is again).
    pub fn set_pull_error(&self, e: Option<String>) {
        *self.pull_error.lock() = e;
    }

    /// Feeds an MPEG-TS arriving on SRT `socket` into the tracks, as publisher `label` on
    /// connection `conn`, until the peer goes, stays silent for `idle`, or `stop` is set;
    /// why it ended.
    #[allow(clippy::too_many_arguments)]
    pub fn run_ts(
        &self,
        socket: &fanout_srt::Socket,
        label: &str,
        conn: u64,
        peer: std::net::IpAddr,
        engine: &fanout_io::Engine,
        idle: std::time::Duration,
        stop: &std::sync::atomic::AtomicBool,
    ) -> String {
        // Short waits, so that `stop` is seen within a second.
        if let Err(e) = socket.set_recv_timeout(1000) {
            return e.to_string();
        }
        let mut ingest = fanout_proto::container::tsingest::TsIngest::default();
        let (mut packets, mut buf) = (Vec::new(), vec![0u8; 1500]);
        let (mut started, mut heard) = (false, Instant::now());
        let why = loop {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                break "stopped".to_string();
            }
            let n = match socket.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.is_timeout() && heard.elapsed() < idle => continue,
                Err(e) if e.is_timeout() => break format!("silent for {:.0} s", idle.as_secs_f64()),
                Err(e) => break e.to_string(),
            };
            heard = Instant::now();
            ingest.push(&buf[..n], self.started.elapsed().as_millis() as u64, &mut packets);
            if !started {
                let Some(sdp) = ingest.sdp() else {
                    packets.clear();
                    continue;
                };
                let begun = Sdp::parse(&sdp).map_err(|e| format!("its description: {e}")).and_then(|sdp| {
                    self.start_stream(Ingest::Srt, label.into(), conn, peer, sdp, engine).map_err(|e| e.to_string())
                });
                if let Err(e) = begun {
                    tracing::warn!(session = %self.name, %peer, "SRT publisher not started: {e}");
                    return e;
                }
                started = true;
            }
            if !packets.drain(..).all(|mut p| self.feed_rtp(conn, p.track, &mut p.data, p.waited_ms)) {
                break "taken over by a new publisher".to_string();
            }
        };
        if started {
            self.stop(label);
        }
        format!("{why} (TS errors {}, frames not carried {})", ingest.errors(), ingest.ignored())
    }

    /// The current description, while someone publishes.
    pub fn sdp(&self) -> Option<Sdp> {
        let st = self.state.lock();
        st.active.as_ref().and(st.sdp.clone())
    }

    /// The last description a publisher (or the fallback) gave, whether or not it still
    /// publishes.
    pub fn last_sdp(&self) -> Option<Sdp> {
        self.state.lock().sdp.clone()
    }

    pub fn tracks(&self) -> Vec<TrackRef> {
        let st = self.state.lock();
        st.tracks.iter().map(|t| t.track_ref()).collect()
    }

    /// Per track, the RTP numbers a client joining now gets first.
    pub fn next_rtp(&self) -> Vec<Option<(u16, u32)>> {
        let st = self.state.lock();
        st.tracks.iter().map(|t| t.next_rtp()).collect()
    }

    /// A publisher's RECORD: its description, its (track, RTP channel) pairs, and its
    /// (track, RTP port, RTCP port) over UDP. Tracks of an earlier publisher are reused in
    /// order, continuing their numbering. `displaced` is called if a newer publisher takes
    /// over.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &self,
        rtsp_session: String,
        conn: u64,
        peer: std::net::IpAddr,
        sdp: Sdp,
        channels: &[(usize, u8)],
        udp: &[(usize, u16, u16)],
        engine: &fanout_io::Engine,
        displaced: Box<dyn FnOnce() + Send>,
    ) -> std::io::Result<()> {
        let map = channels.iter().flat_map(|&(t, ch)| [(ch, (t, false)), (ch.wrapping_add(1), (t, true))]).collect();
        let from = |port| SocketAddr::new(peer, port);
        let udp_map =
            udp.iter().flat_map(|&(t, rtp, rtcp)| [(from(rtp), (t, false)), (from(rtcp), (t, true))]).collect();
        let transport = if udp.is_empty() { Ingest::Interleaved } else { Ingest::Udp };
        let a = Active {
            rtsp_session,
            conn,
            peer,
            channels: map,
            udp: udp_map,
            transport,
            since: Instant::now(),
            displaced: Some(displaced),
        };
        self.begin(a, sdp, engine)
    }

    /// A publisher on its own connection (RTMP, SRT, WHIP), whose container the caller made
    /// RTP tracks described by `sdp`; its packets come by [`Self::feed_rtp`].
    pub fn start_stream(
        &self,
        transport: Ingest,
        label: String,
        conn: u64,
        peer: std::net::IpAddr,
        sdp: Sdp,
        engine: &fanout_io::Engine,
    ) -> std::io::Result<()> {
        let a = Active {
            rtsp_session: label,
            conn,
            peer,
            channels: HashMap::new(),
            udp: HashMap::new(),
            transport,
            since: Instant::now(),
            displaced: None,
        };
        self.begin(a, sdp, engine)
    }

    /// Makes `a` the publisher: one at a time, whatever protocol each speaks; with
    /// `takeover`, the one publishing gives way (and is told), else `a` is refused.
    fn begin(&self, a: Active, sdp: Sdp, engine: &fanout_io::Engine) -> std::io::Result<()> {
        let mut st = self.state.lock();
        let fallback = a.transport == Ingest::Fallback;
        let decided = hand_over(
            st.active.as_ref().map(|o| (o.conn, o.transport == Ingest::Fallback)),
            a.conn,
            fallback,
            self.takeover,
        );
        if decided == HandOver::Refuse {
            drop(st);
            return Err(std::io::Error::other(self.refusal().unwrap_or_else(|| "a publisher came first".into())));
        }
        if decided == HandOver::Replace {
            let mut old = st.active.take().expect("checked");
            self.went(&old);
            if old.transport != Ingest::Fallback {
                st.takeovers += 1;
            }
            tracing::info!(session = %self.name, peer = %old.peer, how = %old.transport, by = %a.peer, by_how = %a.transport,
                           after_s = old.since.elapsed().as_secs_f64(), "publisher taken over");
            if let Some(tell) = old.displaced.take() {
                tell();
            }
        }
        for (i, m) in sdp.media.iter().enumerate() {
            let (clock, video) = track_format(m);
            if i >= st.tracks.len() {
                let inlet = match self.first_inlet.lock().take() {
                    Some(first) if i == 0 => first,
                    _ => {
                        let mut cfg = self.first.config().clone();
                        cfg.name = crate::track::Inner::Track(i).name(&self.name);
                        let session = Session::new(cfg, engine);
                        session.set_source_kind(format!("track {i} of the publisher of {}", self.name));
                        Inlet::open(&session)?
                    }
                };
                st.tracks.push(TrackFeed::new(inlet, clock));
            }
            let t = &mut st.tracks[i];
            t.set_clock(clock);
            // A new publisher: a new SSRC, numbering and wall clock, joined into the ones the
            // clients have.
            t.new_source_described(m);
            t.session.set_rtp_video(video);
        }
        st.simulcast = None;
        let (peer, how, tracks) = (a.peer, a.transport, sdp.media.len());
        st.sdp = Some(sdp);
        if !fallback {
            st.publishes += 1;
        }
        if !fallback {
            self.events.lock().push(Publishing { protocol: a.transport.protocol(), peer: a.peer, ended: None });
        }
        st.active = Some(a);
        drop(st);
        self.changes.send_replace(());
        tracing::info!(session = %self.name, %peer, tracks, %how, "publisher started");
        Ok(())
    }

    /// How the publisher sends now, if one publishes.
    pub fn transport(&self) -> Option<Ingest> {
        self.state.lock().active.as_ref().map(|a| a.transport)
    }

    /// An RTP packet of track `track` from the publisher on connection `conn` (an RTMP or
    /// SRT publisher's, made from its container, after it waited `waited_ms` there),
    /// restamped in place; `false`: `conn` does not publish here (any more: a newer publisher
    /// took over).
    pub fn feed_rtp(&self, conn: u64, track: usize, data: &mut [u8], waited_ms: u64) -> bool {
        let mut st = self.state.lock();
        let ours = st.active.as_ref().is_some_and(|a| a.conn == conn);
        if ours {
            self.feed_track(&mut st, track, false, data, waited_ms);
        }
        ours
    }

    /// The publisher on `conn` sends track `track` as the encodings `rids`, best first: the
    /// first feeds the track, each other one a session of its own beside it
    /// ([`Self::feed_encoding`]).
    pub fn simulcast(
        &self,
        conn: u64,
        track: usize,
        rids: Vec<String>,
        engine: &fanout_io::Engine,
    ) -> std::io::Result<()> {
        let mut st = self.state.lock();
        if st.active.as_ref().is_none_or(|a| a.conn != conn) || track >= st.tracks.len() {
            return Ok(());
        }
        let video = st.sdp.as_ref().and_then(|s| s.media.get(track)).and_then(|m| track_format(m).1);
        for k in 1..rids.len() {
            if k > st.alternates.len() {
                let mut cfg = self.first.config().clone();
                cfg.name = crate::track::Inner::Encoding { track, k }.name(&self.name);
                let session = Session::new(cfg, engine);
                session.set_source_kind(format!("simulcast encoding {k} of the publisher of {}", self.name));
                st.alternates.push(TrackFeed::new(Inlet::open(&session)?, 90_000));
            }
            let alt = &mut st.alternates[k - 1];
            alt.new_source();
            alt.session.set_rtp_video(video);
        }
        tracing::info!(session = %self.name, track, encodings = ?rids, "simulcast publisher: the first feeds the path");
        st.simulcast = Some(Simulcast { track, bps: vec![0.0; rids.len()], rids });
        Ok(())
    }

    /// An RTP packet of encoding `place` (of [`Self::simulcast`]'s order) from the publisher
    /// on `conn`, restamped in place; `false`: `conn` does not publish here (any more).
    pub fn feed_encoding(&self, conn: u64, place: usize, data: &mut [u8], waited_ms: u64) -> bool {
        let mut st = self.state.lock();
        if st.active.as_ref().is_none_or(|a| a.conn != conn) {
            return false;
        }
        let Some(track) = st.simulcast.as_ref().map(|s| s.track) else { return true };
        if place == 0 {
            self.feed_track(&mut st, track, false, data, waited_ms);
        } else if let Some(alt) = st.alternates.get_mut(place - 1) {
            alt.rtp(data, self.arrival_ms(waited_ms));
        }
        true
    }

    /// The simulcast encodings' rates now (bits per second, in their order).
    pub fn set_encoding_rates(&self, bps: Vec<f64>) {
        if let Some(s) = self.state.lock().simulcast.as_mut() {
            s.bps = bps;
        }
    }

    /// While a simulcast publisher publishes: its video track and the encodings, best first.
    pub fn encodings(&self) -> Option<(usize, Vec<Encoding>)> {
        let st = self.state.lock();
        let s = st.simulcast.as_ref()?;
        let sessions = st.tracks.get(s.track).into_iter().chain(&st.alternates).map(|t| t.session.clone());
        let encodings = s
            .rids
            .iter()
            .zip(sessions)
            .zip(&s.bps)
            .map(|((rid, session), &bps)| Encoding { rid: rid.clone(), session, bps })
            .collect();
        Some((s.track, encodings))
    }

    /// Whether a reader of simulcast encoding `place` (past the first: the track's own
    /// readers mark the track) wanted a keyframe since the last call.
    pub fn take_encoding_keyframe_request(&self, place: usize) -> bool {
        let st = self.state.lock();
        place.checked_sub(1).and_then(|k| st.alternates.get(k)).is_some_and(|a| a.session.take_keyframe_request())
    }

    /// Whether someone publishes now.
    pub fn publishing(&self) -> bool {
        self.state.lock().active.is_some()
    }

    /// A publisher was here and left (none publishes now).
    pub fn ended(&self) -> bool {
        let st = self.state.lock();
        st.active.is_none() && st.publishes > 0
    }

    /// Whether connection `conn` publishes here.
    pub fn is_publishing_on(&self, conn: u64) -> bool {
        self.state.lock().active.as_ref().is_some_and(|a| a.conn == conn)
    }

    /// The RTSP session of the publisher, if one publishes.
    pub fn rtsp_session(&self) -> Option<String> {
        self.state.lock().active.as_ref().map(|a| a.rtsp_session.clone())
    }

    /// An interleaved frame from the publisher's connection (restamped in place).
    pub fn feed(&self, conn: u64, channel: u8, data: &mut [u8]) {
        let mut st = self.state.lock();
        let Some(&(i, rtcp)) = st.active.as_ref().filter(|a| a.conn == conn).and_then(|a| a.channels.get(&channel))
        else {
            return;
        };
        self.feed_track(&mut st, i, rtcp, data, 0);
    }

    /// A datagram to the record ports from `from`: the publisher's RTP or RTCP over UDP
    /// (restamped in place), and then its RTSP session; `None` when it is not from this
    /// publisher's ports.
    pub fn feed_udp(&self, from: SocketAddr, data: &mut [u8]) -> Option<String> {
        let mut st = self.state.lock();
        let a = st.active.as_ref()?;
        let (&(i, rtcp), session) = (a.udp.get(&from)?, a.rtsp_session.clone());
        self.feed_track(&mut st, i, rtcp, data, 0);
        Some(session)
    }

    /// A packet of track `i`; `waited_ms`: how long it waited since it arrived (the track
    /// joins a new publisher's stream by arrival time).
    fn feed_track(&self, st: &mut State, i: usize, rtcp: bool, data: &mut [u8], waited_ms: u64) {
        let now = self.arrival_ms(waited_ms);
        let Some(t) = st.tracks.get_mut(i) else { return };
        if rtcp {
            // A sender report: the publisher's wall clock against its RTP time.
            let reports = fanout_proto::rtp::rtcp::parse_reports(data).unwrap_or_default();
            if let Some((ssrc, info)) = reports.first().and_then(|r| r.sender_info()) {
                t.sender_report(ssrc, info, fanout_io::sys::ntp_now());
            }
            return;
        }
        t.rtp(data, now);
    }

    /// When a packet that waited `waited_ms` since it arrived came, on the publisher's clock
    /// (milliseconds since it was made).
    fn arrival_ms(&self, waited_ms: u64) -> u64 {
        (self.started.elapsed().as_millis() as u64).saturating_sub(waited_ms)
    }

    /// The publisher of RTSP session `rtsp_session` left (TEARDOWN, its connection closed,
    /// or it timed out): the session waits for the next one.
    pub fn stop(&self, rtsp_session: &str) -> bool {
        let mut st = self.state.lock();
        if st.active.as_ref().is_none_or(|a| a.rtsp_session != rtsp_session) {
            return false;
        }
        let a = st.active.take().expect("checked");
        st.simulcast = None;
        self.went(&a);
        tracing::info!(session = %self.name, peer = %a.peer, how = %a.transport, after_s = a.since.elapsed().as_secs_f64(), "publisher left");
        true
    }

    /// Ends the publisher publishing now, whatever its protocol (`false`: none publishes):
    /// an RTSP publisher's connection is closed, a stream publisher's ends at its next packet
    /// (as one taken over), and the path waits for the next one.
    pub fn kick(&self) -> bool {
        let mut st = self.state.lock();
        let Some(mut a) = st.active.take() else { return false };
        st.simulcast = None;
        drop(st);
        self.went(&a);
        tracing::info!(session = %self.name, peer = %a.peer, how = %a.transport, "publisher ended through the API");
        if let Some(tell) = a.displaced.take() {
            tell();
        }
        true
    }

    fn went(&self, a: &Active) {
        // (The fallback is not a publisher to the hooks.)
        if a.transport != Ingest::Fallback {
            let ended = Some(a.since.elapsed());
            self.events.lock().push(Publishing { protocol: a.transport.protocol(), peer: a.peer, ended });
        }
        self.changes.send_replace(());
    }

    /// Changes from now on: the receiver's `changed()` returns when a publisher comes or goes
    /// (or the publisher side is dropped).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changes.subscribe()
    }

    /// Publishers that came and went since the last call.
    pub fn take_events(&self) -> Vec<Publishing> {
        std::mem::take(&mut self.events.lock())
    }

    /// Keyframe requests for an RTSP publisher (over UDP or interleaved): for each video track
    /// a reader marked (`Session::want_keyframe`: WebRTC viewers, RTSP clients' PLI/FIR),
    /// an empty receiver report and a PLI naming the publisher's SSRC, at most one per track
    /// per `KEYFRAME_EVERY`; a mark inside that gap waits for its end. A publisher of another
    /// kind leaves the marks alone (a WHIP publisher's task takes them; RTMP and SRT cannot
    /// be asked). `reporter`: our SSRC in the report.
    pub fn keyframe_requests(&self, reporter: u32) -> Vec<(RtcpTo, Vec<u8>)> {
        let mut st = self.state.lock();
        let st = &mut *st;
        let Some(a) = st.active.as_ref().filter(|a| a.transport.is_rtsp()) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut out = Vec::new();
        for (i, t) in st.tracks.iter().enumerate() {
            let video = st.sdp.as_ref().and_then(|s| s.media.get(i)).is_some_and(|m| m.kind == "video");
            let Some(media) = t.source_ssrc().filter(|_| video) else { continue };
            if st.asked.get(&i).is_some_and(|at| now - *at < KEYFRAME_EVERY) || !t.session.take_keyframe_request() {
                continue;
            }
            let to =
                a.udp.iter().find(|(_, v)| **v == (i, true)).map(|(addr, _)| RtcpTo::Udp(*addr)).or_else(|| {
                    a.channels.iter().find(|(_, v)| **v == (i, true)).map(|(ch, _)| RtcpTo::Conn(a.conn, *ch))
                });
            let Some(to) = to else { continue };
            st.asked.insert(i, now);
            st.keyframes_asked += 1;
            let mut rtcp = Vec::with_capacity(20);
            fanout_proto::rtp::rtcp::write_keyframe_request(&mut rtcp, reporter, media);
            out.push((to, rtcp));
        }
        out
    }

    /// Whether a reader of one of its tracks wanted a keyframe since the last call (WebRTC
    /// viewers, RTSP clients' PLI/FIR): a publisher that can be asked (WHIP) takes it.
    pub fn take_keyframe_request(&self) -> bool {
        let st = self.state.lock();
        st.tracks.iter().fold(false, |any, t| t.session.take_keyframe_request() | any)
    }

    pub fn status(&self) -> PublisherStatus {
        let st = self.state.lock();
        let a = st.active.as_ref();
        PublisherStatus {
            pull_error: self.pull_error.lock().clone(),
            state: if a.is_some() { "publishing" } else { "waiting" },
            peer: a.map(|a| a.peer),
            transport: a.map(|a| a.transport),
            publishing_s: a.map(|a| a.since.elapsed().as_secs_f64()),
            publishes: st.publishes,
            takeover: self.takeover,
            takeovers: st.takeovers,
            keyframes_asked: st.keyframes_asked,
            tracks: st
                .tracks
                .iter()
                .map(|t| {
                    serde_json::json!({ "session": t.session.name(), "clock_rate": t.clock,
                                        "packets": t.packets, "dropped": t.dropped })
                })
                .collect(),
            simulcast: st
                .simulcast
                .iter()
                .flat_map(|s| s.rids.iter().zip(&s.bps).enumerate())
                .map(|(place, (rid, bps))| {
                    serde_json::json!({ "rid": rid, "bps": bps.round(), "feeds_the_path": place == 0 })
                })
                .collect(),
        }
    }

    /// Closes the sessions of the tracks past the first (the first belongs to the relay).
    pub fn close_tracks(&self) {
        let extra: Vec<Session> = {
            let mut st = self.state.lock();
            // (None yet, when it never set up: nothing to close.)
            let first = st.tracks.len().min(1);
            let alternates: Vec<Session> = st.alternates.drain(..).map(|t| t.session).collect();
            st.tracks.drain(first..).map(|t| t.session).chain(alternates).collect()
        };
        for s in extra {
            s.close();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_publisher_at_a_time_or_the_newest_with_takeover() {
        use super::{hand_over, HandOver::*};
        assert_eq!(hand_over(None, 7, false, false), Start);
        assert_eq!(hand_over(Some((7, false)), 7, false, false), Start, "its own connection again");
        assert_eq!(hand_over(Some((3, false)), 7, false, false), Refuse);
        assert_eq!(hand_over(Some((3, false)), 7, false, true), Replace);
        assert_eq!(hand_over(None, 7, false, true), Start);
        // The fallback gives way to any publisher, and takes no one's place.
        assert_eq!(hand_over(Some((3, true)), 7, false, false), Replace);
        assert_eq!(hand_over(Some((3, false)), 7, true, true), Refuse);
        assert_eq!(hand_over(None, 7, true, false), Start);
    }

    use super::Ingest;

    /// The status and metrics name each as the API always did.
    #[test]
    fn ingest_names_as_the_api_shows_them() {
        for (i, name, protocol) in [
            (Ingest::Interleaved, "interleaved", "rtsp"),
            (Ingest::Udp, "udp", "rtsp"),
            (Ingest::Rtmp, "rtmp", "rtmp"),
            (Ingest::Srt, "srt", "srt"),
            (Ingest::Webrtc, "webrtc", "webrtc"),
            (Ingest::Hls, "hls", "hls"),
        ] {
            assert_eq!(serde_json::to_value(i).unwrap(), name);
            assert_eq!((i.to_string().as_str(), i.protocol(), i.is_rtsp()), (name, protocol, protocol == "rtsp"));
        }
    }
}
