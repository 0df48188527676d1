//! A path: everything the relay has for one stream name. Its source (the spec's
//! [`SourceSpec`], started by `crate::source`), its tracks (one relay session each; the
//! first is the path's own session, where UDP and TCP sinks go and HTTP subscribers of a
//! TS source join), its outputs (RTSP/RTSPS clients as sinks of the tracks, each track's
//! SRTP key epochs, the repackaging into MPEG-TS and HLS), its settings and its status. The
//! relay holds one map of paths; the API, RTSP, HTTP and the cluster ask the path.

use crate::publish::Publisher;
use crate::readers::Readers;
use crate::repack::Repack;
use crate::source::Feeder;
use crate::spec::SessionSpec;
use crate::srtp_out::SrtpOut;
use crate::track::{RtspView, TrackRef};
use crate::upstream::Upstream;
use fanout_io::Session;
use fanout_proto::rtsp::sdp::Sdp;
use fanout_proto::rtsp::server::Resource;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::task::AbortHandle;

pub struct Path {
    pub name: String,
    /// What made it; a reload that moves its upstream to another URL changes it in place.
    spec: Mutex<SessionSpec>,
    /// Its first track's session: the stream's own.
    pub session: Session,
    /// What else its source made (an upstream, a publisher's side, a clip's RTP tracks).
    pub feeder: Feeder,
    /// The tasks its source and its sinks run.
    tasks: Vec<AbortHandle>,
    /// The repackaging for HTTP players, while any play.
    repack: Mutex<Option<Arc<Repack>>>,
    /// Its AAC as Opus while WebRTC viewers need it, its Opus as AAC while its repackaging
    /// does: by [`crate::transcode::To`].
    transcodes: Mutex<[Option<Arc<crate::transcode::Transcode>>; 2]>,
    /// SRTP toward RTSPS clients: each track's key epochs.
    pub srtp: SrtpOut,
    /// Who reads it, on every face.
    pub readers: Readers,
    /// The servers it is pushed to (`forward`), and how that goes.
    pub forwards: Vec<Arc<crate::forward::Target>>,
}

impl Path {
    /// Its media as RTP, as RTSP clients, WebRTC and pulls are told it: its tracks' view,
    /// an upstream's media, a publisher's, else one track from the session's payload type.
    pub fn describe(&self) -> Option<Resource> {
        let name = self.name.as_str();
        let h264 = |pt: u8| {
            format!("m=video 0 RTP/AVP {pt}\r\na=rtpmap:{pt} H264/90000\r\na=fmtp:{pt} packetization-mode=1\r\n")
        };
        // A file played out has nothing more to give: 404, not a description of silence.
        let over = self.spec().source.is_file() && self.session.source_state() == fanout_io::SourceState::Closed;
        if over {
            return None;
        }
        if let Some(v) = self.view() {
            let next_rtp = v.tracks.iter().map(|t| t.session.rtp_start().map(|(_, seq, ts)| (seq, ts))).collect();
            return Some(Resource {
                sdp: v.sdp.for_clients(name, 1),
                next_rtp,
                publishable: false,
                busy: false,
                takeover: false,
            });
        }
        if let Some(up) = self.upstream() {
            let sdp = up.sdp()?;
            return Some(Resource {
                sdp: sdp.for_clients(name, 1),
                next_rtp: up.next_rtp(),
                publishable: false,
                busy: false,
                takeover: false,
            });
        }
        if let Some(p) = self.publisher() {
            // Until someone publishes: no media (DESCRIBE answers 404), but ANNOUNCE is welcome.
            let sdp = p.sdp().map_or(Sdp { session: Vec::new(), media: Vec::new() }, |s| s.for_clients(name, 1));
            // An RTMP publisher is one this RTSP server does not know of: a second one is refused
            // (unless the path lets a newcomer take over).
            let busy = p.transport().is_some_and(|t| !t.is_rtsp());
            return Some(Resource {
                sdp,
                next_rtp: p.next_rtp(),
                publishable: p.takes_publishers(),
                busy,
                takeover: p.takes_over(),
            });
        }
        let session = &self.session;
        let (pt, seq, ts) = session.rtp_start()?;
        let media = match pt {
            33 => "m=video 0 RTP/AVP 33\r\na=rtpmap:33 MP2T/90000\r\n".to_string(),
            // A dynamic type: the session's `video` codec, else H.264 (RFC 6184) where its
            // packets look like it; anything else is not described (a puller would wait for
            // keyframes that never come).
            96..=127 => match self.spec().video {
                Some(crate::spec::VideoCodec::H265) => {
                    format!("m=video 0 RTP/AVP {pt}\r\na=rtpmap:{pt} H265/90000\r\n")
                }
                Some(_) => h264(pt),
                None if fanout_proto::codec::annexb::looks_like_h264_rtp(&session.rtp_payload_heads(64)) => h264(pt),
                None => {
                    tracing::info!(session = name, pt, "not described over RTSP: payload type {pt} is not H.264 and the session names no `video` codec");
                    return None;
                }
            },
            _ => return None,
        };
        let sdp = Sdp::parse(&format!("v=0\r\ns={name}\r\n{media}")).ok()?;
        Some(Resource {
            sdp: sdp.for_clients(name, 1),
            next_rtp: vec![Some((seq, ts))],
            publishable: false,
            busy: false,
            takeover: false,
        })
    }

    pub fn new(spec: SessionSpec, session: Session, feeder: Feeder, tasks: Vec<AbortHandle>) -> Self {
        Self {
            name: spec.name.clone(),
            readers: Readers::new(&spec.name, spec.reader_settings()),
            spec: Mutex::new(spec),
            session,
            feeder,
            tasks,
            repack: Mutex::new(None),
            transcodes: Mutex::new([None, None]),
            srtp: SrtpOut::default(),
            forwards: Vec::new(),
        }
    }

    pub fn spec(&self) -> SessionSpec {
        self.spec.lock().clone()
    }

    pub fn set_spec(&self, spec: SessionSpec) {
        self.readers.set(spec.reader_settings());
        *self.spec.lock() = spec;
    }

    pub fn upstream(&self) -> Option<&Arc<Upstream>> {
        match &self.feeder {
            Feeder::Upstream(up) => Some(up),
            _ => None,
        }
    }

    pub fn publisher(&self) -> Option<&Arc<Publisher>> {
        match &self.feeder {
            Feeder::Publisher(p) => Some(p),
            _ => None,
        }
    }

    /// What RTSP clients get instead of the first session's RTP (a clip's tracks).
    pub fn view(&self) -> Option<&RtspView> {
        match &self.feeder {
            Feeder::Clip(v) => v.as_ref(),
            _ => None,
        }
    }

    /// Its tracks, one relay session each: the source's, or the first session alone (as
    /// 90 kHz RTP).
    pub fn tracks(&self) -> Vec<TrackRef> {
        self.feeder
            .tracks()
            .unwrap_or_else(|| vec![TrackRef { session: self.session.clone(), clock: 90_000, clock_map: None }])
    }

    /// Its description, where its source gives one.
    pub fn sdp(&self) -> Option<Sdp> {
        match &self.feeder {
            Feeder::Upstream(up) => up.sdp(),
            Feeder::Publisher(p) => p.sdp(),
            Feeder::Clip(v) => v.as_ref().map(|v| v.sdp.clone()),
            Feeder::Plain => None,
        }
    }

    /// Whether its media is RTP video/audio of known tracks (an RTSP upstream or publisher,
    /// or a source with `video` set), which HTTP players get repackaged.
    pub fn is_rtp_media(&self) -> bool {
        matches!(self.feeder, Feeder::Upstream(_) | Feeder::Publisher(_)) || self.spec.lock().video.is_some()
    }

    /// Its sessions: its tracks', and its own where that is not one of them.
    fn sessions(&self) -> Vec<fanout_io::Session> {
        let mut all: Vec<fanout_io::Session> = self.tracks().into_iter().map(|t| t.session).collect();
        if !all.iter().any(|s| s.is(&self.session)) {
            all.push(self.session.clone());
        }
        all
    }

    /// Packets its source has brought in so far, all tracks together.
    pub fn received(&self) -> u64 {
        self.sessions().iter().map(|s| s.status().ring_head).sum()
    }

    /// Its running repackaging, if any.
    pub fn repack_running(&self) -> Option<Arc<Repack>> {
        self.repack.lock().as_ref().filter(|r| r.is_running()).cloned()
    }

    /// Its running repackaging, or the one `start` makes now (under the lock: two players
    /// asking at once start one).
    pub fn keep_repack<E>(&self, start: impl FnOnce() -> Result<Arc<Repack>, E>) -> Result<Arc<Repack>, E> {
        let mut kept = self.repack.lock();
        if let Some(running) = kept.as_ref().filter(|k| k.is_running()) {
            return Ok(running.clone());
        }
        let r = start()?;
        *kept = Some(r.clone());
        Ok(r)
    }

    /// Its transcoders that run.
    pub fn transcodes_running(&self) -> Vec<Arc<crate::transcode::Transcode>> {
        self.transcodes.lock().iter().flatten().filter(|t| t.is_running()).cloned().collect()
    }

    /// Its transcoder to `to` (the running one, or the one `start` makes now, under the lock).
    pub fn keep_transcode(
        &self,
        to: crate::transcode::To,
        start: impl FnOnce() -> Result<Arc<crate::transcode::Transcode>, String>,
    ) -> Result<Arc<crate::transcode::Transcode>, String> {
        let mut kept = self.transcodes.lock();
        let slot = &mut kept[to as usize];
        if let Some(running) = slot.as_ref().filter(|k| k.is_running()) {
            return Ok(running.clone());
        }
        let t = start()?;
        *slot = Some(t.clone());
        Ok(t)
    }

    /// The repackaging stopped: forgotten, its sessions (TS, FLV) closed.
    pub fn repack_stopped(&self) {
        let gone = self.repack.lock().take();
        for s in gone.map(|r| r.sessions()).unwrap_or_default() {
            tokio::task::spawn_blocking(move || s.close());
        }
    }

    /// Readers gone (their faces dropped them or they stopped reading) leave, and each reader
    /// that came or went runs its hook, if the path has one. Must be called within the runtime.
    pub fn reader_hooks(&self) {
        for e in self.readers.sweep(std::time::Instant::now()) {
            if let Some(cmd) = &e.command {
                crate::hook::Hook::once_argv(e.kind(), cmd, &e.path, &e.env());
            }
        }
    }

    /// Stops everything it started: its outputs, its source, its sessions (after the
    /// source, so nothing is fed into a closed session).
    pub async fn close(&self) {
        self.readers.close_all("the path went");
        self.reader_hooks();
        self.srtp.stop_all();
        let transcodes = std::mem::take(&mut *self.transcodes.lock());
        for t in transcodes.into_iter().flatten() {
            t.stop();
            let s = t.track.session.clone();
            let _ = tokio::task::spawn_blocking(move || s.close()).await;
        }
        let repack = self.repack.lock().take();
        if let Some(r) = repack {
            r.stop();
            for s in r.sessions() {
                let _ = tokio::task::spawn_blocking(move || s.close()).await;
            }
        }
        // An upstream is torn down first (a TEARDOWN, a second at most), so its server stops
        // sending to our ports now rather than at its own timeout.
        if let Some(up) = self.upstream() {
            up.close(std::time::Duration::from_secs(2)).await;
        }
        for t in &self.tasks {
            t.abort();
        }
        self.feeder.close_tracks().await;
        let s = self.session.clone();
        let _ = tokio::task::spawn_blocking(move || s.close()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_plain_path_is_its_first_session_and_closes_with_its_readers_told() {
        let engine = fanout_io::Engine::start(fanout_io::EngineOptions { workers: 1, ..Default::default() }).unwrap();
        let session = crate::track::test_session(&engine, "cam");
        let spec = SessionSpec::new("cam", crate::spec::SourceSpec::Demo);
        let path = Path::new(spec, session.clone(), Feeder::Plain, Vec::new());
        let tracks = path.tracks();
        assert_eq!(tracks.len(), 1);
        assert!(tracks[0].session.is(&session) && tracks[0].clock == 90_000, "the first session, as 90 kHz RTP");
        assert!(path.sdp().is_none() && !path.is_rtp_media() && path.publisher().is_none());
        assert_eq!(path.received(), 0);
        let reader = Arc::new(crate::readers::Held::default());
        let who = crate::readers::Who::new(crate::readers::Protocol::HttpTs, None, None);
        let _kept = path.readers.join(who, reader.clone()).ok().unwrap();
        path.close().await;
        assert_eq!(reader.end.ended().as_deref(), Some("the path went"), "its readers are told");
        assert!(path.readers.list().is_empty());
    }
}
