//! `forward`: a path pushed to other servers (a platform's ingest, a second relay) over RTMP,
//! RTMPS, RTSP, RTSPS, SRT or WHIP while it has a stream. Each target is a task of the
//! path's (`relay::forward`): it waits for the stream, connects, publishes, and sends the
//! path's FLV tags (the chunks its RTMP players get, made once per tag), its RTP tracks (as
//! its RTSP players get them, interleaved; as a WebRTC peer's, over WHIP) or its MPEG-TS
//! (what its SRT and HTTP TS players get) until the stream ends or the target fails; then it connects again, after a backoff (1 s
//! doubling to 30 s) where it failed. A target is one of the path's readers (listed,
//! counted, kicked like any): a slow one falls behind and starts again at a keyframe (RTMP,
//! RTSP, WHIP) or is cut off and reconnects (SRT, once libsrt's send buffer is full), so it never
//! holds the path or its players back. Here: a target's settings and status, and one
//! connection's push.

mod rtmp;
mod rtsp;
mod srt;
mod whip;

pub(crate) use rtmp::push;
pub(crate) use rtsp::push_rtsp;
pub(crate) use srt::push_srt;
pub(crate) use whip::push_whip;

use fanout_proto::rtmp::client::RtmpUrl;
use fanout_proto::rtsp::client::Url as RtspUrl;
use fanout_proto::srt::SrtUrl;
use fanout_proto::whep::WhipUrl;
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connecting, the handshake and the publish's answer: within this.
pub(crate) const SETUP: Duration = Duration::from_secs(10);
/// A write that takes longer ends the connection (a target that stopped reading).
const STALL: Duration = Duration::from_secs(10);
/// Media gathers this long before one write (as players' does).
const FLUSH: Duration = Duration::from_millis(50);

/// One target of a path, and what it did.
pub struct Target {
    pub via: Via,
    /// The URL without its secrets (a key's query, a passphrase, a stream id's credentials).
    pub shown: String,
    status: Mutex<Status>,
    /// Pushes started and ended, for the `on_forward_start` / `on_forward_stop` hooks, and
    /// whether one is under way.
    events: Mutex<(Vec<Event>, bool)>,
}

/// A push that started or ended, as the hooks are told.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub url: String,
    /// `None` for a start; for an end, why, and whether the target failed (not the path's
    /// stream ending or a kick).
    pub ended: Option<(String, bool)>,
    pub bytes: u64,
}

impl Event {
    pub fn kind(&self) -> &'static str {
        if self.ended.is_some() {
            "on_forward_stop"
        } else {
            "on_forward_start"
        }
    }

    /// The hook's environment.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("FANOUT_FORWARD_URL", self.url.clone()), ("FANOUT_FORWARD_BYTES", self.bytes.to_string())];
        if let Some((why, failed)) = &self.ended {
            env.push(("FANOUT_FORWARD_REASON", why.clone()));
            env.push(("FANOUT_FORWARD_FAILED", if *failed { "1" } else { "0" }.to_string()));
        }
        env
    }
}

/// How a target is pushed to.
pub enum Via {
    Rtmp { url: RtmpUrl, tls: Option<Arc<rustls::ClientConfig>> },
    Rtsp { url: RtspUrl, tls: Option<Arc<rustls::ClientConfig>> },
    Srt(SrtUrl),
    Whip { url: WhipUrl, tls: Option<Arc<rustls::ClientConfig>> },
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
            crate::spec::ForwardTo::Whip(url, verify) => {
                if verify == crate::tls::Verify::Off && url.tls {
                    tracing::warn!(url = %url.shown(), "forward: the server's certificate is not checked (tls_verify = false)");
                }
                // (Public roots are ureq's own; a CA, a pin or none go as our TLS settings.)
                let tls = (url.tls && verify != crate::tls::Verify::PublicRoots)
                    .then(|| crate::tls::client_config(&verify))
                    .transpose()
                    .map_err(|e| bad(format!("forward: {e:#}")))?;
                Via::Whip { url, tls }
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
            Via::Whip { url, .. } => url.shown(),
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
        Ok(Self { via, shown, status: Mutex::new(status), events: Mutex::new((Vec::new(), false)) })
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
        if state == "pushing" {
            let mut e = self.events.lock();
            if !std::mem::replace(&mut e.1, true) {
                e.0.push(Event { url: self.shown.clone(), ended: None, bytes: s.bytes });
            }
        }
    }

    /// A connection ended, `failed` or by the path: a push under way is told to end.
    pub(crate) fn ended(&self, why: &str, failed: bool) {
        let bytes = self.status.lock().bytes;
        let mut e = self.events.lock();
        if std::mem::replace(&mut e.1, false) {
            e.0.push(Event { url: self.shown.clone(), ended: Some((why.to_string(), failed)), bytes });
        }
    }

    /// The pushes started and ended since the last call.
    pub fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut self.events.lock().0)
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
}
