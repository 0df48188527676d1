//! Where a path's packets come from: one module per kind of [`SourceSpec`], each with a
//! `start` that makes the path's first session receive (binding, accepting, connecting,
//! pulling or reading) and says what else the path now has ([`Feeder`]: an RTSP upstream,
//! a publisher's side, a clip's RTP tracks) and which tasks to stop with it. Sources that
//! are not a socket of the session hand their packets in through `fanout_io::Inlet`.
//! `ARCHITECTURE.md` ("Adding a source") shows how a kind is added.

mod clip;
mod publish;
mod rtsp;
mod srt;
mod tcp;
mod udp;

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
        SourceSpec::Publish { takeover } => publish::start(&cx, *takeover),
        SourceSpec::Rtsp(r) => rtsp::start(r, cx),
        SourceSpec::Srt(url) => srt::start(url, &cx),
    }
}
