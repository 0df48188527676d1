//! `forward`: a path pushed to other servers (a platform's ingest, a second relay) over RTMP,
//! RTMPS, RTSP, RTSPS or SRT while it has a stream. Each target is a task of the path's
//! (`relay::forward`): it waits for the stream, connects, publishes, and sends the path's
//! FLV tags (the chunks its RTMP players get, made once per tag), its RTP tracks (as its
//! RTSP players get them, interleaved) or its MPEG-TS (what its SRT and HTTP TS players get)
//! until the stream ends or the target fails; then it connects again, after a backoff (1 s
//! doubling to 30 s) where it failed. A target is one of the path's readers (listed,
//! counted, kicked like any): a slow one falls behind and starts again at a keyframe (RTMP,
//! RTSP) or is cut off and reconnects (SRT, once libsrt's send buffer is full), so it never
//! holds the path or its players back. Here: a target's settings and status, and one
//! connection's push.

use crate::dial::Io;
use crate::readers::Held;
use crate::repack::{FlvTag, Passed, Repack, TagGate};
use crate::write::{write_parts, MAX_PARTS};
use fanout_proto::rtmp::client::{Client, Event, Role, RtmpUrl};
use fanout_proto::rtsp::client::Url as RtspUrl;
use fanout_proto::srt::SrtUrl;
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connecting, the handshake and the publish's answer: within this.
pub(crate) const SETUP: Duration = Duration::from_secs(10);
/// A write that takes longer ends the connection (a target that stopped reading).
const STALL: Duration = Duration::from_secs(10);
/// Tags gather this long before one write (as RTMP players' do).
const FLUSH: Duration = Duration::from_millis(50);
const FLUSH_BYTES: usize = 256 << 10;

/// One target of a path, and what it did.
pub struct Target {
    pub via: Via,
    /// The URL without its secrets (a key's query, a passphrase, a stream id's credentials).
    pub shown: String,
    status: Mutex<Status>,
}

/// How a target is pushed to.
pub enum Via {
    Rtmp { url: RtmpUrl, tls: Option<Arc<rustls::ClientConfig>> },
    Rtsp { url: RtspUrl, tls: Option<Arc<rustls::ClientConfig>> },
    Srt(SrtUrl),
}

/// A target's status, as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    /// The URL, without the key's query.
    pub url: String,
    /// `waiting` (for the path's stream), `connecting`, `pushing` or `retrying`.
    pub state: &'static str,
    /// Bytes pushed, over every connection.
    pub bytes: u64,
    /// Connections that failed (not those the path ended: its stream's end, a kick).
    pub reconnects: u64,
    pub last_error: Option<String>,
    /// Seconds in the current state.
    #[serde(skip)]
    since: Option<Instant>,
    pub state_s: f64,
}

impl Target {
    /// The target `spec` names (checked when the path was made).
    pub fn new(spec: &crate::spec::ForwardSpec) -> Result<Self, crate::error::RelayError> {
        let bad = |e: String| crate::error::RelayError::BadRequest(e);
        let via = match spec.target().map_err(|e| bad(e.0))? {
            crate::spec::ForwardTo::Rtmp(url, verify) => {
                if verify == crate::tls::Verify::Off && url.tls {
                    tracing::warn!(url = %url.shown(), "forward: the server's certificate is not checked (tls_verify = false)");
                }
                let tls = url
                    .tls
                    .then(|| crate::tls::client_config(&verify))
                    .transpose()
                    .map_err(|e| bad(format!("forward: {e:#}")))?;
                Via::Rtmp { url, tls }
            }
            crate::spec::ForwardTo::Rtsp(url, verify) => {
                if verify == crate::tls::Verify::Off && url.tls {
                    tracing::warn!(url = %url.request_url(), "forward: the server's certificate is not checked (tls_verify = false)");
                }
                let tls = url
                    .tls
                    .then(|| crate::tls::client_config(&verify))
                    .transpose()
                    .map_err(|e| bad(format!("forward: {e:#}")))?;
                Via::Rtsp { url, tls }
            }
            crate::spec::ForwardTo::Srt(url) => {
                fanout_srt::version().map_err(|e| crate::error::RelayError::Unsupported(format!("forward: {e}")))?;
                Via::Srt(url)
            }
        };
        let shown = match &via {
            Via::Rtmp { url, .. } => url.shown(),
            Via::Rtsp { url, .. } => url.request_url(),
            Via::Srt(url) => url.shown(),
        };
        let status = Status {
            url: shown.clone(),
            state: "waiting",
            bytes: 0,
            reconnects: 0,
            last_error: None,
            since: Some(Instant::now()),
            state_s: 0.0,
        };
        Ok(Self { via, shown, status: Mutex::new(status) })
    }

    pub fn status(&self) -> Status {
        let mut s = self.status.lock().clone();
        s.state_s = s.since.map_or(0.0, |t| (t.elapsed().as_secs_f64() * 10.0).round() / 10.0);
        s
    }

    pub(crate) fn set_state(&self, state: &'static str) {
        let mut s = self.status.lock();
        if s.state != state {
            s.state = state;
            s.since = Some(Instant::now());
        }
    }

    /// Why the path's stream cannot be pushed yet.
    pub(crate) fn waiting(&self, why: String) {
        self.status.lock().last_error = Some(why);
    }

    pub(crate) fn failed(&self, why: &str) {
        let mut s = self.status.lock();
        s.reconnects += 1;
        s.last_error = Some(why.to_string());
    }

    fn sent(&self, bytes: usize) {
        self.status.lock().bytes += bytes as u64;
    }
}

/// The time to wait before the next try: 1 s after a connection that pushed (the stream
/// ended, or it broke after a while), else double the last, up to 30 s.
pub(crate) fn next_backoff(last: Duration, pushed: bool) -> Duration {
    if pushed {
        Duration::from_secs(1)
    } else {
        (last * 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }
}

/// Publishes on `io` and sends the path's tags until the stream ends (`Err` with why: every
/// end is a reason to connect again). `pushed`: set once media went out.
pub(crate) async fn push(
    io: &mut Box<dyn Io>,
    url: &RtmpUrl,
    target: &Target,
    repack: &Repack,
    held: &Held,
    pushed: &mut bool,
) -> Result<std::convert::Infallible, String> {
    let flv = repack.flv.clone().expect("joined with FLV");
    let mut client = Client::new(url.clone(), Role::Publish, crate::dial::seed());
    let mut buf = vec![0u8; 16 << 10];
    crate::dial::rtmp_start(io, &mut client, &mut buf, SETUP).await?;
    tracing::info!(url = %target.shown, "forward: pushing");
    target.set_state("pushing");
    let codec_id = |video: bool| {
        flv.config.iter().find(|(v, _)| *v == video).and_then(|(_, b)| b.first()).map(|b| match video {
            // Enhanced RTMP's extended header carries a FourCC; else the low nibble.
            true if b & 0x80 != 0 => 12.0,
            true => f64::from(b & 0x0f),
            false => f64::from(b >> 4),
        })
    };
    client.metadata(codec_id(true), codec_id(false));
    let mut tags = flv.tags.subscribe();
    let mut gate = TagGate::new(&flv);
    let mut configured = false;
    loop {
        // The first tag (or the server's bytes, or the end), then what else comes within FLUSH.
        let first = tokio::select! {
            why = crate::readers::ended(Some(held)) => {
                client.close();
                let _ = tokio::time::timeout(Duration::from_secs(1), io.write_all(&client.take_output())).await;
                return Err(why);
            }
            r = io.read(&mut buf) => {
                let n = r.map_err(|e| format!("the server went: {e}"))?;
                if n == 0 {
                    return Err("the server closed the connection".into());
                }
                client.input(&buf[..n]).map_err(|e| format!("the server's RTMP: {e}"))?;
                while let Some(e) = client.poll_event() {
                    if let Event::Refused(why) = e {
                        return Err(format!("the server ended the stream: {why}"));
                    }
                }
                None
            }
            t = tags.recv() => Some(t),
        };
        let mut batch = Batch { configured, ..Default::default() };
        if let Some(t) = first {
            batch.take(t, &mut gate, &flv.config, &mut client, held)?;
            tokio::time::sleep(FLUSH).await;
            while batch.bytes < FLUSH_BYTES && batch.parts.len() < MAX_PARTS - 1 {
                match tags.try_recv() {
                    Ok(t) => batch.take(Ok(t), &mut gate, &flv.config, &mut client, held)?,
                    Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => batch.take(
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)),
                        &mut gate,
                        &flv.config,
                        &mut client,
                        held,
                    )?,
                    Err(_) => break,
                }
            }
        }
        batch.own(&mut client);
        configured = batch.configured;
        if batch.bytes == 0 {
            continue;
        }
        match tokio::time::timeout(STALL, write_parts(io, batch.parts.iter().map(Part::bytes))).await {
            Ok(Ok(())) => {
                held.sent(batch.bytes, batch.tags);
                target.sent(batch.bytes);
                *pushed |= batch.tags > 0;
            }
            Ok(Err(e)) => return Err(format!("the server went: {e}")),
            Err(_) => return Err(format!("a write took longer than {STALL:?}: the server does not read")),
        }
    }
}

/// Publishes the path's MPEG-TS (`session`: what its SRT and HTTP TS players get) to an SRT
/// listener until the stream ends, the target fails or `stop` is set; why it ended. Blocking
/// (libsrt's sockets are): run on a thread of its own. `pushed`: set once media went out.
pub(crate) fn push_srt(
    url: &SrtUrl,
    latency_ms: u32,
    target: &Target,
    session: &fanout_io::Session,
    held: &Held,
    stop: &std::sync::atomic::AtomicBool,
    pushed: &mut bool,
) -> String {
    use std::net::ToSocketAddrs;
    let addr = match (url.host.as_str(), url.port).to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return format!("{} has no address", url.host),
        Err(e) => return format!("{}: {e}", url.host),
    };
    let settings = fanout_srt::Settings {
        latency_ms: url.latency_ms.or(Some(latency_ms)),
        passphrase: url.passphrase.clone(),
        pbkeylen: url.pbkeylen,
        streamid: url.streamid.clone(),
        ..fanout_srt::Settings::default()
    };
    let socket = match fanout_srt::Socket::connect(addr, &settings, SETUP.as_millis() as u32) {
        Ok(s) => s,
        Err(e) => return format!("did not connect: {e}"),
    };
    // A full send buffer is a target behind by its latency and more: cut off, never waited for.
    if let Err(e) = socket.set_nonblocking_send() {
        return e.to_string();
    }
    let queue = fanout_io::channel::ChannelQueue::new(session.config().ring_capacity / 2, || {});
    let sink = match session.add_local_sink("SRT forward", queue.clone()) {
        Ok(id) => id,
        Err(e) => return format!("the path's MPEG-TS: {e}"),
    };
    tracing::info!(url = %target.shown, "forward: pushing");
    target.set_state("pushing");
    let mut frames = Vec::new();
    let why = loop {
        std::thread::sleep(FLUSH);
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break "the path went".to_string();
        }
        if let Some(why) = held.end.ended() {
            break why;
        }
        if socket.state() != fanout_srt::State::Connected {
            break "the server closed the connection".into();
        }
        queue.drain(&mut frames);
        let (mut bytes, mut packets) = (0, 0);
        let sent = frames.iter().flat_map(|(p, _)| p.data().chunks(fanout_srt::TS_PAYLOAD)).try_for_each(|c| {
            socket.send(c)?;
            bytes += c.len();
            packets += 1;
            Ok::<_, fanout_srt::Error>(())
        });
        frames.clear();
        held.sent(bytes, packets);
        target.sent(bytes);
        *pushed |= bytes > 0;
        if let Err(e) = sent {
            break format!("the server does not take the stream as fast as it comes: {e}");
        }
    };
    session.remove_sink(sink);
    why
}

/// Publishes the path's RTP tracks (`sdp`, one session per media section) to an RTSP server
/// (ANNOUNCE, SETUP for recording, RECORD), interleaved on the connection, until the stream
/// ends or the target fails (`Err` with why). Each track starts at the keyframe its ring
/// holds, as an RTSP player's does. `pushed`: set once media went out.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn push_rtsp(
    io: &mut Box<dyn Io>,
    url: &RtspUrl,
    sdp: fanout_proto::rtsp::sdp::Sdp,
    tracks: &[fanout_io::Session],
    target: &Target,
    held: &Held,
    pushed: &mut bool,
) -> Result<std::convert::Infallible, String> {
    use fanout_proto::rtsp::{self, client::Step, Lower, Message};
    let started = Instant::now();
    let now = || started.elapsed().as_millis() as u64;
    let limits = rtsp::Limits { max_body: 64 << 10, ..rtsp::Limits::default() };
    let mut client = fanout_proto::rtsp::client::Client::recorder(url.clone(), USER_AGENT, sdp);
    let (mut inbox, mut buf) = (Vec::new(), vec![0u8; 16 << 10]);
    // The server's messages: answers go to the client (`Ok(true)` once RECORD is answered);
    // its RTCP (interleaved) is not needed.
    async fn answer(
        io: &mut Box<dyn Io>,
        client: &mut fanout_proto::rtsp::client::Client,
        inbox: &mut Vec<u8>,
        limits: &rtsp::Limits,
        now: u64,
    ) -> Result<bool, String> {
        let mut recording = false;
        while let Some((msg, used)) = rtsp::parse(inbox, limits).map_err(|e| format!("the server's RTSP: {e}"))? {
            inbox.drain(..used);
            if let Message::Response(r) = msg {
                match client.on_response(&r, now).map_err(|e| format!("the server refused the stream: {e}"))? {
                    Step::Send(b) => io.write_all(&b).await.map_err(|e| format!("the server went: {e}"))?,
                    Step::Playing => recording = true,
                    _ => {}
                }
            }
        }
        Ok(recording)
    }
    async fn read_into(io: &mut Box<dyn Io>, inbox: &mut Vec<u8>, buf: &mut [u8]) -> Result<(), String> {
        match io.read(buf).await {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                inbox.extend_from_slice(&buf[..n]);
                Ok(())
            }
            Err(e) => Err(format!("the server went: {e}")),
        }
    }
    io.write_all(&client.start(now())).await.map_err(|e| format!("the server went: {e}"))?;
    let setup = async {
        loop {
            read_into(io, &mut inbox, &mut buf).await?;
            if answer(io, &mut client, &mut inbox, &limits, now()).await? {
                return Ok::<_, String>(());
            }
        }
    };
    tokio::time::timeout(SETUP, setup).await.map_err(|_| format!("did not start the stream within {SETUP:?}"))??;
    tracing::info!(url = %target.shown, "forward: pushing");
    target.set_state("pushing");
    // A queue per track, filled once per the path's flush interval; one wake for all.
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut sinks = Sinks(Vec::new());
    let mut queues = Vec::new();
    for (track, t) in tracks.iter().zip(&client.tracks) {
        let Lower::Interleaved { rtp, .. } = t.lower else { continue };
        let w = wake.clone();
        let q = fanout_io::channel::ChannelQueue::batched(track.config().ring_capacity / 2, move || w.notify_one());
        let id = track.add_local_sink("RTSP forward", q.clone()).map_err(|e| format!("the path's track: {e}"))?;
        sinks.0.push((track.clone(), id));
        queues.push((rtp, q));
    }
    let (mut frames, mut out) = (Vec::new(), Vec::new());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            why = crate::readers::ended(Some(held)) => {
                if let Some(b) = client.teardown(now()) {
                    let _ = tokio::time::timeout(Duration::from_secs(1), io.write_all(&b)).await;
                }
                return Err(why);
            }
            r = read_into(io, &mut inbox, &mut buf) => {
                r?;
                answer(io, &mut client, &mut inbox, &limits, now()).await?;
            }
            _ = tick.tick() => {
                if let Some(b) = client.keepalive(now()) {
                    out.extend_from_slice(&b);
                }
            }
            _ = wake.notified() => {}
        }
        let mut packets = 0;
        for (channel, q) in &queues {
            q.drain(&mut frames);
            for (p, seq) in frames.drain(..) {
                let data = p.data();
                if data.len() > usize::from(u16::MAX) {
                    continue;
                }
                let at = out.len();
                rtsp::write_interleaved(&mut out, *channel, data);
                // A layer-dropping sink's own sequence numbers.
                if let Some(seq) = seq.filter(|_| data.len() >= 4) {
                    out[at + 6..at + 8].copy_from_slice(&seq.to_be_bytes());
                }
                packets += 1;
            }
        }
        if out.is_empty() {
            continue;
        }
        match tokio::time::timeout(STALL, io.write_all(&out)).await {
            Ok(Ok(())) => {
                held.sent(out.len(), packets);
                target.sent(out.len());
                *pushed |= packets > 0;
                out.clear();
            }
            Ok(Err(e)) => return Err(format!("the server went: {e}")),
            Err(_) => return Err(format!("a write took longer than {STALL:?}: the server does not read")),
        }
    }
}

const USER_AGENT: &str = concat!("fanout/", env!("CARGO_PKG_VERSION"));

/// A push's sinks in the path's sessions, removed when it ends.
struct Sinks(Vec<(fanout_io::Session, u64)>);

impl Drop for Sinks {
    fn drop(&mut self) {
        for (session, id) in self.0.drain(..) {
            session.remove_sink(id);
        }
    }
}

/// A write's bytes, in order: the client's own (acknowledgements, configurations, tags it
/// chunked itself) and tags' shared chunks.
enum Part {
    Own(Vec<u8>),
    Shared(FlvTag),
}

impl Part {
    fn bytes(&self) -> &[u8] {
        match self {
            Part::Own(b) => b,
            Part::Shared(t) => t.rtmp_chunks(),
        }
    }
}

#[derive(Default)]
struct Batch {
    parts: Vec<Part>,
    bytes: usize,
    tags: u64,
    /// The decoder configurations went out (on this connection).
    configured: bool,
}

impl Batch {
    /// What the client has to send, in its place.
    fn own(&mut self, client: &mut Client) {
        let out = client.take_output();
        if !out.is_empty() {
            self.bytes += out.len();
            self.parts.push(Part::Own(out));
        }
    }

    /// One tag from the channel: from a keyframe on. Unlike a player, the target gets every
    /// decoder configuration before the first tag (a server fixes its tracks at the first
    /// frame, from the configurations that came before it).
    fn take(
        &mut self,
        tag: Result<FlvTag, tokio::sync::broadcast::error::RecvError>,
        gate: &mut TagGate,
        config: &[(bool, Vec<u8>)],
        client: &mut Client,
        held: &Held,
    ) -> Result<(), String> {
        match gate.pass(tag, config) {
            Passed::Tag(_, tag) => {
                if !std::mem::replace(&mut self.configured, true) {
                    for (video, body) in config {
                        client.media(*video, tag.ms, body);
                    }
                }
                self.tags += 1;
                if client.takes_shared_media() {
                    self.own(client);
                    self.bytes += tag.rtmp_chunks().len();
                    self.parts.push(Part::Shared(tag));
                } else {
                    client.media(tag.video, tag.ms, &tag.body);
                }
            }
            Passed::Wait => {}
            Passed::Lagged(n) => held.skipped(n),
            Passed::Closed => return Err("the stream ended".into()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_while_nothing_is_pushed_and_starts_again_after() {
        let mut b = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..7 {
            b = next_backoff(b, false);
            seen.push(b.as_secs());
        }
        assert_eq!(seen, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(next_backoff(b, true), Duration::from_secs(1));
    }

    #[test]
    fn a_batch_keeps_the_clients_bytes_in_their_place_among_the_shared_tags() {
        let url = RtmpUrl::parse("rtmp://h/live/k").unwrap();
        let mut client = Client::new(url, Role::Publish, 1);
        let mut server = fanout_proto::rtmp::server::Server::new(2);
        // Through to a started publish, against our own server.
        for _ in 0..8 {
            server.input(&client.take_output()).unwrap();
            while let Some(e) = server.poll_event() {
                if let fanout_proto::rtmp::server::Event::Publish { stream_id, name } = e {
                    server.accept_publish(stream_id, &name);
                }
            }
            client.input(&server.take_output()).unwrap();
        }
        assert!(client.takes_shared_media());
        let flv = crate::repack::Flv {
            config: vec![(true, vec![0x17, 0, 0, 0, 0, 1])],
            tags: tokio::sync::broadcast::channel(4).0,
        };
        let mut gate = TagGate::new(&flv);
        let held = Held::default();
        let mut batch = Batch::default();
        let delta = FlvTag::new(true, false, 0, Arc::new(vec![0x27, 1, 0, 0, 0, 5]));
        let key = FlvTag::new(true, true, 40, Arc::new(vec![0x17, 1, 0, 0, 0, 6]));
        let next = FlvTag::new(true, false, 80, Arc::new(vec![0x27, 1, 0, 0, 0, 7]));
        for t in [delta, key.clone(), next.clone()] {
            batch.take(Ok(t), &mut gate, &flv.config, &mut client, &held).unwrap();
        }
        batch.own(&mut client);
        // The configuration (the client's own bytes) before the keyframe; the delta before
        // it was waited past; the tags are the shared chunks themselves.
        assert_eq!(batch.tags, 2);
        assert!(matches!(&batch.parts[..], [Part::Own(_), Part::Shared(_), Part::Shared(_)]));
        assert!(std::ptr::eq(batch.parts[1].bytes().as_ptr(), key.rtmp_chunks().as_ptr()), "shared, not copied");
        let written: Vec<u8> = batch.parts.iter().flat_map(|p| p.bytes().to_vec()).collect();
        assert_eq!(written.len(), batch.bytes);
        server.input(&written).unwrap();
        let got: Vec<_> = std::iter::from_fn(|| server.poll_event()).collect();
        use fanout_proto::rtmp::server::Event as S;
        assert_eq!(
            got,
            vec![
                S::Video { timestamp: 40, body: vec![0x17, 0, 0, 0, 0, 1] },
                S::Video { timestamp: 40, body: vec![0x17, 1, 0, 0, 0, 6] },
                S::Video { timestamp: 80, body: vec![0x27, 1, 0, 0, 0, 7] },
            ]
        );
    }
}
