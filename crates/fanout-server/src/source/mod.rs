//! Where a path's packets come from: one module per kind of [`SourceSpec`], each with a
//! `start` that makes the path's first session receive (binding, accepting, connecting,
//! pulling or reading) and says what else the path now has ([`Feeder`]: an RTSP upstream,
//! a publisher's side, a clip's RTP tracks) and which tasks to stop with it. Sources that
//! are not a socket of the session hand their packets in through `fanout_io::Inlet`.
//! `ARCHITECTURE.md` ("Adding a source") shows how a kind is added.

mod clip;
mod hls;
mod publish;
mod rtmp;
mod rtsp;
mod srt;
mod tcp;
mod udp;
mod whep;

use crate::config::Config;
use crate::error::RelayError;
use crate::spec::SourceSpec;
use crate::track::{RtspView, TrackRef};
use crate::upstream::Upstream;
use fanout_io::{Engine, Session};
use std::sync::{Arc, Weak};
use tokio::task::AbortHandle;

/// What a source needs from the path it starts for.
pub struct Ctx<'a> {
    pub name: &'a str,
    /// The path's first session (its first track): where the source delivers.
    pub session: &'a Session,
    pub engine: &'a Engine,
    pub cfg: &'a Config,
    /// Who runs an RTSP pull (the relay).
    pub host: Weak<dyn crate::upstream::Host>,
    /// A cluster channel pulled from another node: where its URL comes from.
    pub origin: Option<Arc<dyn crate::upstream::Origin>>,
    /// Called when a pull of a cluster channel ends (the path then goes).
    pub on_pull_end: Option<Box<dyn FnOnce() + Send + Sync>>,
}

/// Sets its flag when dropped: a blocking thread (libsrt's) polls it to stop with the task
/// that started it, which is aborted when its path goes.
pub struct StopOnDrop(pub Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A pull's life (`rtmp`, `whep`, `srt`, `hls`): waits for a reader where it is on demand, runs one
/// connection at a time (`connect(conn, label)` says why it ended and whether it fed the
/// tracks), ends the publisher's stream after each, and connects again after a backoff (1 s
/// doubling to 30 s while connections feed nothing), or when a reader comes where nobody
/// wanted it. `kind` names it in the log; `base` sets its connection ids apart.
pub(crate) async fn pull_loop<F, Fut>(p: &crate::publish::Publisher, kind: &str, shown: &str, base: u64, mut connect: F)
where
    F: FnMut(u64, String) -> Fut,
    Fut: std::future::Future<Output = (String, bool)>,
{
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut backoff = std::time::Duration::from_secs(1);
    loop {
        if !p.wanted() {
            p.set_pull_error(Some("on demand: no reader".into()));
            p.until_wanted().await;
        }
        let conn = base | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let label = format!("{}-pull-{}", kind.to_ascii_lowercase(), conn & !base);
        let (why, fed) = connect(conn, label.clone()).await;
        p.stop(&label);
        if fed {
            backoff = std::time::Duration::from_secs(1);
        }
        if !p.wanted() {
            tracing::info!(url = %shown, "{kind} source: {why}; again when a reader comes");
            continue;
        }
        tracing::info!(url = %shown, "{kind} source: {why}; again in {backoff:?}");
        p.set_pull_error(Some(why));
        tokio::time::sleep(backoff).await;
        if !fed {
            backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
        }
    }
}

/// One connection of a pull run on a blocking thread (libsrt's sockets, HLS's HTTP client),
/// for [`pull_loop`]: `work(stop)` until it ends, or (on demand) until nobody read the
/// stream for `linger`: then `stop` is set and the thread waited for. `stop` is also set
/// when the path goes (the task aborted).
pub(crate) async fn on_blocking_thread<W>(
    p: &crate::publish::Publisher,
    linger: std::time::Duration,
    work: W,
) -> (String, bool)
where
    W: FnOnce(Arc<std::sync::atomic::AtomicBool>) -> (String, bool) + Send + 'static,
{
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _guard = StopOnDrop(stop.clone());
    let stop2 = stop.clone();
    let mut run = tokio::task::spawn_blocking(move || work(stop2));
    tokio::select! {
        r = &mut run => r.unwrap_or_else(|e| (e.to_string(), false)),
        () = unwanted_for(p, linger) => {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let fed = run.await.is_ok_and(|r| r.1);
            (format!("nobody read it for {linger:?} (on demand)"), fed)
        }
    }
}

/// Returns once the stream was not wanted for `linger` (never for a pull that is always on).
async fn unwanted_for(p: &crate::publish::Publisher, linger: std::time::Duration) {
    let mut since = None;
    let mut look = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        look.tick().await;
        if p.wanted() {
            since = None;
        } else if since.get_or_insert_with(std::time::Instant::now).elapsed() >= linger {
            return;
        }
    }
}

/// What a path has besides its first session, by the kind of its source.
pub enum Feeder {
    /// Packets arrive on the session itself (UDP, TCP).
    Plain,
    /// An RTSP upstream: its tracks, description and state.
    Upstream(Arc<Upstream>),
    /// RTSP publishers' side: their tracks, description and state.
    Publisher(Arc<crate::publish::Publisher>),
    /// A clip (demo, file): MPEG-TS on the session, and its H.264/H.265 and AAC as RTP
    /// tracks of their own for RTSP clients and the repackaging (none if it has neither).
    Clip(Option<RtspView>),
}

impl Feeder {
    /// The path's RTP tracks where they are not the session itself.
    pub fn tracks(&self) -> Option<Vec<TrackRef>> {
        match self {
            Feeder::Plain | Feeder::Clip(None) => None,
            Feeder::Upstream(up) => Some(up.tracks()),
            Feeder::Publisher(p) => Some(p.tracks()),
            Feeder::Clip(Some(v)) => Some(v.tracks.clone()),
        }
    }

    /// Closes the track sessions it made besides the path's first; joins threads, so off
    /// the async runtime.
    pub async fn close_tracks(&self) {
        match self {
            Feeder::Plain | Feeder::Clip(None) => {}
            Feeder::Upstream(up) => {
                let up = up.clone();
                let _ = tokio::task::spawn_blocking(move || up.close_tracks()).await;
            }
            Feeder::Publisher(p) => {
                let p = p.clone();
                let _ = tokio::task::spawn_blocking(move || p.close_tracks()).await;
            }
            Feeder::Clip(Some(v)) => {
                for t in v.tracks.clone() {
                    let _ = tokio::task::spawn_blocking(move || t.session.close()).await;
                }
            }
        }
    }
}

/// A started source: what the path keeps of it.
pub struct Started {
    pub feeder: Feeder,
    pub tasks: Vec<AbortHandle>,
}

impl Started {
    fn plain(tasks: Vec<AbortHandle>) -> Self {
        Self { feeder: Feeder::Plain, tasks }
    }
}

/// Starts `spec` for the path `cx` describes. On an error nothing of it keeps running (the
/// caller closes the session).
pub async fn start(spec: &SourceSpec, cx: Ctx<'_>) -> Result<Started, RelayError> {
    match spec {
        SourceSpec::Udp { addr, interface } => udp::start(*addr, *interface, &cx),
        SourceSpec::TcpListen(addr) => tcp::listen(*addr, &cx).await,
        SourceSpec::TcpConnect(addr) => Ok(tcp::connect(*addr, &cx)),
        SourceSpec::Demo => clip::demo(&cx),
        SourceSpec::File { path, looped } => clip::file(path, looped.unwrap_or(true), &cx).await,
        SourceSpec::Publish { takeover, fallback } => publish::start(&cx, *takeover, fallback.as_deref()).await,
        SourceSpec::Rtsp(r) => rtsp::start(r, cx),
        SourceSpec::Srt(r) => srt::start(r, &cx),
        SourceSpec::Rtmp(r) => rtmp::start(r, &cx),
        SourceSpec::Whep(r) => whep::start(r, &cx),
        SourceSpec::Hls(r) => hls::start(r, &cx),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Host(Engine);

    impl crate::upstream::Host for Host {
        fn engine(&self) -> &Engine {
            &self.0
        }
    }

    /// Each kind is matched onto its module, and gives the path what it must ask it later.
    #[tokio::test]
    async fn each_kind_starts_with_its_feeder() {
        let host =
            Arc::new(Host(Engine::start(fanout_io::EngineOptions { workers: 1, ..Default::default() }).unwrap()));
        let cfg = Config::default();
        let start = |spec: SourceSpec, name: &'static str| {
            let (host, cfg) = (host.clone(), cfg.clone());
            async move {
                let first = crate::track::test_session(&host.0, name);
                let cx = Ctx {
                    name,
                    session: &first,
                    engine: &host.0,
                    cfg: &cfg,
                    host: Arc::downgrade(&host) as Weak<dyn crate::upstream::Host>,
                    origin: None,
                    on_pull_end: None,
                };
                let started = start(&spec, cx).await;
                (started, first)
            }
        };
        let (demo, s1) = start(SourceSpec::Demo, "demo").await;
        let demo = demo.ok().unwrap();
        assert!(matches!(demo.feeder, Feeder::Clip(Some(_))), "the demo's H.264 and AAC as tracks");
        assert_eq!(demo.feeder.tracks().map(|t| t.len()), Some(2));
        let (publish, s2) = start(SourceSpec::Publish { takeover: false, fallback: None }, "in").await;
        let publish = publish.ok().unwrap();
        assert!(matches!(publish.feeder, Feeder::Publisher(_)));
        let (udp, s3) = start(SourceSpec::Udp { addr: "127.0.0.1:0".parse().unwrap(), interface: None }, "u").await;
        assert!(matches!(udp.ok().unwrap().feeder, Feeder::Plain), "packets arrive on the session itself");
        let missing = SourceSpec::File { path: "/nonexistent/clip.ts".into(), looped: None };
        let (file, s4) = start(missing, "f").await;
        assert!(file.is_err(), "a file that is not there");
        for t in demo.tasks.iter().chain(&publish.tasks) {
            t.abort();
        }
        demo.feeder.close_tracks().await;
        for s in [s1, s2, s3, s4] {
            tokio::task::spawn_blocking(move || s.close()).await.unwrap();
        }
    }
}
