//! RTMP publishers: OBS, ffmpeg and hardware encoders publish `rtmp://HOST:1935/NAME`, or
//! `rtmp://HOST:1935/APP/NAME` (OBS's "Server" `rtmp://HOST/APP` and "Stream Key" `NAME`),
//! into the path `NAME` if its source is `publish`, as an RTSP publisher would: one
//! publisher at a time, the same tracks and clock map across publishers, the same grace.
//! The app is not part of the path's name. Credentials, where RTSP has users or needs the
//! token, come in the query of the stream key or the app: `?user=U&pass=P` or `?token=T`.
//!
//! The protocol is `fanout_proto::rtmp` (sans-IO); this module holds the sockets, the
//! deadlines and the decisions: who may publish where.

use crate::relay::Relay;
use fanout_proto::rtmp::ingest::Ingest;
use fanout_proto::rtmp::server::{split_query, Event, Server};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// RTMP connection ids, apart from RTSP's (a publisher is known by its connection).
const CONN_BASE: u64 = 1 << 62;

/// Accepts RTMP connections until aborted.
pub async fn serve(listener: TcpListener, relay: Arc<Relay>) {
    let gate = crate::admit::Gate::new(
        relay.cfg.max_connections_per_ip,
        "RTMP per-address cap (max_connections_per_ip)",
        relay.books.clone(),
    );
    let next = AtomicU64::new(0);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("RTMP accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(pass) = gate.admit(peer.ip()) else { continue };
        let conn = CONN_BASE | next.fetch_add(1, Ordering::Relaxed);
        let relay = relay.clone();
        tokio::spawn(async move {
            let _pass = pass;
            let _ = stream.set_nodelay(true);
            let mut c = Conn { relay: &relay, peer, conn, publishing: None, ingest: Ingest::default(), started: false };
            let end = c.run(stream).await;
            c.stop();
            match end {
                Ok(()) => tracing::debug!(%peer, "RTMP connection closed"),
                Err(e) => tracing::info!(%peer, "RTMP connection ended: {e}"),
            }
        });
    }
}

struct Conn<'a> {
    relay: &'a Arc<Relay>,
    peer: SocketAddr,
    conn: u64,
    /// The path it publishes, once accepted.
    publishing: Option<(String, Arc<crate::publish::Publisher>)>,
    ingest: Ingest,
    /// Its tracks are described to the path.
    started: bool,
}

impl Conn<'_> {
    async fn run(&mut self, mut stream: TcpStream) -> Result<(), String> {
        let mut server = Server::new(self.conn ^ u64::from(self.peer.port()) << 32);
        let mut app = String::new();
        let mut buf = vec![0u8; 64 << 10];
        // The handshake and the commands up to publish: within `request_timeout_s`.
        let setup = Duration::from_secs_f64(self.relay.cfg.request_timeout_s.max(0.1));
        let setup_until = tokio::time::Instant::now() + setup;
        let idle = Duration::from_secs_f64(self.relay.cfg.rtsp_idle_s.max(1.0));
        let mut packets = Vec::new();
        loop {
            // Until it publishes, the whole setup has one deadline (a slow trickle does not
            // hold a slot); then silence for the idle time ends it.
            let until = if self.publishing.is_some() { tokio::time::Instant::now() + idle } else { setup_until };
            let n = match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
                Err(_) => return Err("timed out".into()),
                Ok(Err(e)) => return Err(e.to_string()),
                Ok(Ok(0)) => return Ok(()),
                Ok(Ok(n)) => n,
            };
            let r = server.input(&buf[..n]);
            let mut close = r.as_ref().err().map(|e| e.to_string());
            while let Some(e) = server.poll_event() {
                match e {
                    Event::Connect { app: a, .. } => app = a,
                    Event::Publish { stream_id, name } => {
                        if let Err(why) = self.publish(&mut server, stream_id, &app, &name) {
                            close = Some(why);
                        }
                    }
                    Event::Play { stream_id, name } => {
                        let why = "playing over RTMP is not served (yet): play over RTSP, HLS or HTTP";
                        server.refuse(stream_id, "NetStream.Play.StreamNotFound", why);
                        close = Some(format!("asked to play {name}: refused"));
                    }
                    Event::Video { timestamp, body } => {
                        if let Err(e) = self.ingest.video(timestamp, &body, &mut packets) {
                            tracing::debug!(peer = %self.peer, "RTMP video tag: {e}");
                        }
                        if let Err(why) = self.feed(&mut packets) {
                            close = Some(why);
                        }
                    }
                    Event::Audio { timestamp, body } => {
                        if let Err(e) = self.ingest.audio(timestamp, &body, &mut packets) {
                            tracing::debug!(peer = %self.peer, "RTMP audio tag: {e}");
                        }
                        if let Err(why) = self.feed(&mut packets) {
                            close = Some(why);
                        }
                    }
                    Event::Unpublish => self.stop(),
                }
            }
            let out = server.take_output();
            if !out.is_empty() {
                stream.write_all(&out).await.map_err(|e| e.to_string())?;
            }
            if let Some(why) = close {
                return Err(why);
            }
        }
    }

    /// Decides on a publish of `name` (stream key, with its query) under app `app`.
    fn publish(&mut self, server: &mut Server, stream_id: u32, app: &str, name: &str) -> Result<(), String> {
        let (key, key_query) = split_query(name);
        let (app, app_query) = split_query(app);
        let path_name = if key.is_empty() { app } else { key };
        let query = if key_query.is_empty() { app_query } else { key_query };
        let refuse = |server: &mut Server, code: &str, why: String| {
            server.refuse(stream_id, code, &why);
            Err(why)
        };
        if !self.authorized(query) {
            tracing::warn!(peer = %self.peer, path = %path_name, "RTMP publish refused: bad or missing credentials");
            return refuse(server, "NetStream.Publish.Unauthorized", "bad or missing credentials".into());
        }
        let publisher = self.relay.path(path_name).and_then(|p| p.publisher().cloned());
        let Some(publisher) = publisher else {
            let why = format!("no path {path_name:?} takes publishers (create it with source = {{ publish = true }})");
            tracing::warn!(peer = %self.peer, "RTMP publish refused: {why}");
            return refuse(server, "NetStream.Publish.BadName", why);
        };
        if publisher.is_active() {
            let why = format!("{path_name} is being published");
            tracing::warn!(peer = %self.peer, "RTMP publish refused: {why}");
            return refuse(server, "NetStream.Publish.BadName", why);
        }
        server.accept_publish(stream_id, path_name);
        tracing::info!(peer = %self.peer, path = %path_name, "RTMP publisher connected");
        self.publishing = Some((path_name.to_string(), publisher));
        Ok(())
    }

    /// Whether `query` carries credentials RTSP would take (anyone, where RTSP is open).
    fn authorized(&self, query: &str) -> bool {
        let users = self.relay.cfg.rtsp_credentials();
        if users.is_empty() {
            return true;
        }
        let param = |k: &str| query.split('&').find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='));
        let (user, pass) = match (param("user"), param("pass"), param("token")) {
            (Some(u), Some(p), _) => (u, p),
            (_, _, Some(t)) => ("token", t),
            _ => return false,
        };
        // Every user is compared, so the time taken does not tell which names exist.
        users.iter().fold(false, |ok, (u, p)| {
            let hit = fanout_proto::secret::ct_eq(u.as_bytes(), user.as_bytes())
                & fanout_proto::secret::ct_eq(p.as_bytes(), pass.as_bytes());
            ok | hit
        })
    }

    /// Hands the ingest's packets to the path, describing its tracks at the first; an error
    /// ends the connection (its tracks cannot start).
    fn feed(&mut self, packets: &mut Vec<fanout_proto::rtmp::ingest::RtpPacket>) -> Result<(), String> {
        let Some((name, publisher)) = &self.publishing else {
            packets.clear();
            return Ok(());
        };
        if !self.started {
            let Some(sdp) = self.ingest.sdp() else {
                packets.clear();
                return Ok(());
            };
            let label = format!("rtmp-{}", self.conn & !CONN_BASE);
            let started = fanout_proto::rtsp::sdp::Sdp::parse(&sdp)
                .map_err(|e| format!("its description: {e}"))
                .and_then(|sdp| {
                    publisher
                        .start_rtmp(label, self.conn, self.peer.ip(), sdp, &self.relay.engine)
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = started {
                tracing::warn!(path = %name, peer = %self.peer, "RTMP publisher not started: {e}");
                packets.clear();
                return Err(e);
            }
            self.started = true;
        }
        for mut p in packets.drain(..) {
            publisher.feed_rtp(self.conn, p.track, &mut p.data);
        }
        Ok(())
    }

    /// The publisher stopped or went away: the path waits for the next one.
    fn stop(&mut self) {
        if let Some((_, publisher)) = self.publishing.take() {
            if self.started {
                publisher.stop(&format!("rtmp-{}", self.conn & !CONN_BASE));
            }
        }
        self.started = false;
        self.ingest = Ingest::default();
    }
}
