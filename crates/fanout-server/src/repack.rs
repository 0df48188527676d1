//! MPEG-TS for the HTTP subscribers of a session that carries RTP video and audio: one
//! repackager per session subscribes to its tracks like any UDP sink would, muxes them
//! ([`fanout_proto::repack`]) and feeds a relay session of its own, `{name}/ts`, whose
//! HTTP subscribers share that one output. It starts with the first HTTP subscriber and
//! stops a linger after the last one left.

use fanout_io::{bind_udp_source, DataPath, Session, SessionConfig};
use fanout_proto::repack::{Repackager, TrackInfo};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

/// TS packets per datagram into the TS session, as IPTV sends them.
const PACKETS_PER_DATAGRAM: usize = 7;

/// One input of the repackager: a track session and how to read it.
pub struct Input {
    pub session: Session,
    pub info: Option<TrackInfo>,
    /// The source's wall clock for this track, when known (see `TrackRef::clock_map`).
    pub clock_map: Option<(u64, u32)>,
}

/// A running repackager: the session HTTP subscribers join.
pub struct TsView {
    pub session: Session,
    /// What it carries, for the status: "H.264 + AAC".
    pub describes: String,
    task: tokio::task::AbortHandle,
}

impl TsView {
    /// Starts repackaging `inputs` into a new session named `{name}/ts`. `clock_maps` is
    /// asked once a second for the tracks' wall clocks (they come with sender reports).
    pub fn start(
        name: &str,
        template: &SessionConfig,
        engine: &fanout_io::Engine,
        inputs: Vec<Input>,
        clock_maps: impl Fn() -> Vec<Option<(u64, u32)>> + Send + 'static,
        linger: Duration,
        on_stop: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Arc<Self>> {
        let mut cfg = template.clone();
        cfg.name = format!("{name}/ts");
        // Its subscribers are TCP: user space serves them on every data path.
        if cfg.datapath == DataPath::Kernel {
            cfg.datapath = DataPath::Shared;
        }
        let session = Session::new(cfg, engine);
        let sock = bind_udp_source(SocketAddr::from(([127, 0, 0, 1], 0)), None)?;
        let into = sock.local_addr()?;
        session.attach_udp(sock)?;
        session.set_source_kind(format!("MPEG-TS repackaged from {name}"));
        let describes = inputs
            .iter()
            .filter_map(|i| i.info.as_ref())
            .map(|i| match &i.codec {
                fanout_proto::repack::TrackCodec::Video { codec: fanout_proto::annexb::Codec::H264, .. } => "H.264",
                fanout_proto::repack::TrackCodec::Video { .. } => "H.265",
                fanout_proto::repack::TrackCodec::Aac { .. } => "AAC",
            })
            .collect::<Vec<_>>()
            .join(" + ");
        let run = run(name.to_string(), session.clone(), into, inputs, clock_maps, linger);
        let task = tokio::spawn(async move {
            if let Err(e) = run.await {
                tracing::warn!("MPEG-TS repackaging stopped: {e}");
            }
            on_stop();
        })
        .abort_handle();
        Ok(Arc::new(Self { session, describes, task }))
    }

    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Stops it; closing the session is the caller's (it joins threads).
    pub fn stop(&self) {
        self.task.abort();
    }
}

/// Subscribes to every input, repackages until the TS session has had no subscriber for
/// `linger`, then unsubscribes and closes the TS session.
async fn run(
    name: String,
    ts: Session,
    into: SocketAddr,
    inputs: Vec<Input>,
    clock_maps: impl Fn() -> Vec<Option<(u64, u32)>>,
    linger: Duration,
) -> std::io::Result<()> {
    let mut repack = Repackager::new(inputs.iter().map(|i| i.info.clone()).collect());
    for (k, i) in inputs.iter().enumerate() {
        if let Some((ntp, rtp)) = i.clock_map {
            repack.set_clock_map(k, ntp, rtp);
        }
    }
    // One socket per repackaged track, subscribed as a UDP sink of its session.
    let mut subs: Vec<(usize, Arc<UdpSocket>, Session, u64)> = Vec::new();
    let unsubscribe = |subs: &[(usize, Arc<UdpSocket>, Session, u64)]| {
        for (_, _, session, id) in subs {
            session.remove_sink(*id);
        }
    };
    for (k, i) in inputs.iter().enumerate() {
        if i.info.is_none() {
            continue;
        }
        let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
        // A second of a few Mbit/s: the muxer is never the one that loses packets.
        let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(4 << 20);
        sock.set_nonblocking(true)?;
        let at = sock.local_addr()?;
        match i.session.add_udp_sink(at) {
            Ok(id) => subs.push((k, Arc::new(UdpSocket::from_std(sock)?), i.session.clone(), id)),
            Err(e) => {
                unsubscribe(&subs);
                return Err(e);
            }
        }
    }
    tracing::info!(session = %name, tracks = subs.len(), "MPEG-TS repackaging started");
    let feeder = UdpSocket::bind("127.0.0.1:0").await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(usize, Vec<u8>, u64)>(1024);
    let started = Instant::now();
    let readers: Vec<_> = subs
        .iter()
        .map(|(k, sock, _, _)| {
            let (k, sock, tx) = (*k, sock.clone(), tx.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65_536];
                while let Ok(n) = sock.recv(&mut buf).await {
                    let now = started.elapsed().as_millis() as u64;
                    if tx.send((k, buf[..n].to_vec(), now)).await.is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut idle_since: Option<Instant> = None;
    let mut out = Vec::new();
    let result = loop {
        tokio::select! {
            got = rx.recv() => {
                let Some((k, pkt, now)) = got else { break Ok(()) };
                repack.push_rtp(k, &pkt, now, &mut out);
                for d in out.chunks(PACKETS_PER_DATAGRAM * fanout_proto::mpegts::PACKET_LEN) {
                    // Loopback into the engine: a failure here is the engine's to count.
                    let _ = feeder.send_to(d, into).await;
                }
                out.clear();
            }
            _ = tick.tick() => {
                for (k, map) in clock_maps().into_iter().enumerate() {
                    if let Some((ntp, rtp)) = map {
                        repack.set_clock_map(k, ntp, rtp);
                    }
                }
                if ts.sinks().is_empty() {
                    if idle_since.get_or_insert_with(Instant::now).elapsed() >= linger {
                        break Ok(());
                    }
                } else {
                    idle_since = None;
                }
            }
        }
    };
    for r in readers {
        r.abort();
    }
    unsubscribe(&subs);
    let s = repack.stats;
    tracing::info!(session = %name, packets = s.packets, units = s.units, bad = s.bad, dropped = s.dropped, "MPEG-TS repackaging stopped");
    result
}
