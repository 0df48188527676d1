//! Repackaging for HTTP players: one task per session reads its RTP tracks' rings as an
//! in-process subscriber of each (the ring's own buffers, no socket), turns them into access
//! units ([`fanout_proto::container::repack`]) and from them MPEG-TS, handed into a relay
//! session of its own (`{name}/ts`, through an [`Inlet`]) that every HTTP subscriber shares,
//! and HLS segments ([`fanout_proto::container::hls`]) that every HLS client shares. FLV
//! tags go to the players that are tasks (a channel) and, as an FLV file's tags and as RTMP
//! chunks, into sessions of their own (`{name}/flv`, `{name}/rtmp`) that plain HTTP-FLV and
//! RTMP players join as HTTP TS players join theirs. It
//! starts with the first subscriber or playlist request and stops a linger after the last.

use fanout_io::channel::ChannelQueue;
use fanout_io::{DataPath, Inlet, Session, SessionConfig};
use fanout_proto::container::hls::{Progress, Segmenter};
use fanout_proto::container::repack::{Repackager, TrackInfo, TsPackager, Unit};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// TS packets per datagram into the TS session, as IPTV sends them.
const PACKETS_PER_DATAGRAM: usize = 7;
/// HLS segment duration aimed at (cut at the first keyframe after it).
pub const HLS_TARGET_MS: u32 = 2000;
/// Low-Latency HLS part duration, at most: a player holds three parts back from live.
pub const HLS_PART_MS: u32 = 500;

/// One input of the repackaging: a track session and how to read it.
pub struct Input {
    pub session: Session,
    pub info: Option<TrackInfo>,
    /// The source's wall clock for this track, when known (see `TrackRef::clock_map`).
    pub clock_map: Option<(u64, u32)>,
    /// Made by the relay from another track for the players that cannot take that one
    /// (a publisher's Opus or G.711 as AAC): not the source's, so not in its description.
    pub derived: bool,
    /// Whether fMP4 (HLS, recordings) carries it: of a pair, the one browsers play (Opus
    /// rather than the AAC made from it, but AAC rather than the G.711 it was made from).
    pub fmp4: bool,
}

/// The HLS side: the segmenter, and a signal for clients waiting on a segment or part.
pub struct Hls {
    seg: Mutex<Segmenter>,
    newest: tokio::sync::watch::Sender<Progress>,
    /// The progress before anything was published.
    start: Progress,
    last_request: Mutex<Instant>,
    /// Its players, by the name each got in its media playlist's URL; times in ms since
    /// `born`.
    players: Mutex<fanout_core::players::Players>,
    born: Instant,
    /// Bytes of segments and parts served, for the status's out rate.
    served: std::sync::atomic::AtomicU64,
    /// Players ended through the API: their reloads are refused (bounded, as ids are).
    kicked: Mutex<std::collections::HashSet<String>>,
}

/// A player that asked for nothing for this long has stopped: players reload the playlist
/// every target duration (or hold a blocking reload for about one).
const PLAYER_WINDOW_MS: u64 = 5 * HLS_TARGET_MS as u64;
/// Players counted per session at most (names are the clients' to invent).
const MAX_PLAYERS: usize = 100_000;

impl Hls {
    /// Notes a client's request: the repackaging lingers from the last one.
    pub fn touch(&self) {
        *self.last_request.lock() = Instant::now();
    }

    /// A request from the player named `id` (see [`fanout_core::players`]).
    pub fn player_seen(&self, id: &str) {
        self.players.lock().seen(id, self.born.elapsed().as_millis() as u64);
    }

    /// Whether the player `id` asked for something lately.
    pub fn player_active(&self, id: &str) -> bool {
        self.players.lock().is_active(id, self.born.elapsed().as_millis() as u64)
    }

    /// Ends the player `id`: its next playlist reload is refused.
    pub fn kick(&self, id: &str) {
        let mut k = self.kicked.lock();
        if k.len() >= MAX_PLAYERS {
            k.clear();
        }
        k.insert(id.to_string());
    }

    pub fn was_kicked(&self, id: &str) -> bool {
        self.kicked.lock().contains(id)
    }

    /// A segment or part of `n` bytes went to a player.
    pub fn served(&self, n: usize) {
        self.served.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn bytes_served(&self) -> u64 {
        self.served.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits (at most `limit`) until part `part` of segment `sequence` (`None`: the whole
    /// segment) exists; whether it does.
    pub async fn wait_for(&self, sequence: u64, part: Option<usize>, limit: Duration) -> bool {
        self.wait(limit, |p| p.has(sequence, part)).await
    }

    /// Waits (at most `limit`) until a first segment is complete; whether it is. Players
    /// that do not know parts (ffmpeg) need one in the playlist.
    pub async fn wait_first(&self, limit: Duration) -> bool {
        self.wait_for(self.start.last + 1, None, limit).await
    }

    async fn wait(&self, limit: Duration, done: impl FnMut(&Progress) -> bool) -> bool {
        let mut rx = self.newest.subscribe();
        tokio::time::timeout(limit, rx.wait_for(done)).await.is_ok_and(|r| r.is_ok())
    }

    /// The stream ended: its last segment is closed and the playlist ends (`#EXT-X-ENDLIST`).
    pub fn finish(&self) {
        let mut seg = self.seg.lock();
        if seg.finish() {
            self.newest.send_replace(seg.progress());
        }
    }

    /// Segments complete and parts of the next.
    pub fn progress(&self) -> Progress {
        *self.newest.borrow()
    }

    pub fn with<T>(&self, f: impl FnOnce(&Segmenter) -> T) -> T {
        f(&self.seg.lock())
    }
}

/// An HLS player as one of its path's readers: there while its reloads come.
pub struct HlsReader {
    pub hls: Arc<Hls>,
    pub id: String,
}

impl crate::readers::Reader for HlsReader {
    fn close(&self, _reason: &str) {
        self.hls.kick(&self.id);
    }

    fn alive(&self, _now: Instant) -> bool {
        self.hls.player_active(&self.id)
    }
}

/// FLV decoder configurations (video's `true`), each a tag's body, as players get them.
pub type Configs = Arc<Vec<(bool, Vec<u8>)>>;

/// The FLV side, for RTMP players: the decoder configurations every player gets first, and
/// the tags as they are made (a player that falls behind the channel resumes at a keyframe).
pub struct Flv {
    /// Set from the description, or (video whose description has no parameter sets, a WHIP
    /// publisher's) from the first keyframe's in-band ones, before any tag is sent; then
    /// from each keyframe's in-band sets, so a player that joins after the stream's
    /// parameters changed (another publisher, a fallback) is configured for what it gets.
    /// Empty while unknown.
    config: Mutex<Configs>,
    /// Whether it carries video, and audio.
    pub video: bool,
    pub audio: bool,
    pub tags: tokio::sync::broadcast::Sender<FlvTag>,
    /// Into its sessions of the data plane (by [`Form`]), once a player asked for each.
    sinks: [Mutex<Option<Inlet>>; 2],
    /// Where a player of its sessions starts, the last keyframe's tag: its time (ms, the
    /// high half) and the last audio tag's before it (the low half). Each decoder
    /// configuration goes before it at its kind's time, so neither kind's times go back.
    start_ms: std::sync::atomic::AtomicU64,
    last_audio_ms: std::sync::atomic::AtomicU32,
}

/// What a reader of the FLV tags (an RTMP or HTTP-FLV player, a forward) does with the
/// next: it starts at a keyframe (and starts again at one after falling behind), and gets
/// each decoder configuration just before the first tag of its kind, at that tag's time, so
/// neither kind's times ever go back (audio may come a little before the first keyframe's).
pub struct TagGate {
    video: bool,
    at_key: bool,
    /// Which kinds' configurations went out.
    configured: [bool; 2],
}

/// What [`TagGate::pass`] decided.
pub enum Passed<'a> {
    /// Sent: the configurations owed first, then the tag.
    Tag(Vec<&'a [u8]>, FlvTag),
    /// Not sent (waiting for a keyframe).
    Wait,
    /// The reader fell this many tags behind the channel: on at the next keyframe.
    Lagged(u64),
    /// The FLV ended (its repackaging stopped).
    Closed,
}

impl TagGate {
    pub fn new(flv: &Flv) -> Self {
        Self { video: flv.video, at_key: flv.video, configured: [false; 2] }
    }

    pub fn pass<'a>(
        &mut self,
        tag: Result<FlvTag, tokio::sync::broadcast::error::RecvError>,
        config: &'a [(bool, Vec<u8>)],
    ) -> Passed<'a> {
        use tokio::sync::broadcast::error::RecvError;
        let tag = match tag {
            Ok(t) => t,
            Err(RecvError::Lagged(n)) => {
                self.at_key = self.video;
                return Passed::Lagged(n);
            }
            Err(RecvError::Closed) => return Passed::Closed,
        };
        if self.at_key {
            if !(tag.video && tag.key) {
                return Passed::Wait;
            }
            self.at_key = false;
        }
        let first = !std::mem::replace(&mut self.configured[usize::from(tag.video)], true);
        let owed = config.iter().filter(|(v, _)| first && *v == tag.video).map(|(_, b)| b.as_slice()).collect();
        Passed::Tag(owed, tag)
    }
}

/// FLV times are the path's timeline plus this lead. The timeline starts at the first packet
/// the repackaging takes, of whichever track comes first; the other tracks' backlog from
/// their rings (video from its last keyframe) can come from before it, and FLV times cannot
/// be negative (clamped, a GOP's pictures would share one time).
const FLV_LEAD_MS: i64 = 30_000;

/// The FLV time (ms) of timeline time `t` (90 kHz).
fn flv_ms(t: i64) -> u32 {
    ((t + FLV_LEAD_MS * 90).max(0) / 90) as u32
}

/// One FLV tag of the stream: video or audio, a keyframe's, its decoding time in ms.
#[derive(Clone)]
pub struct FlvTag {
    pub video: bool,
    pub key: bool,
    pub ms: u32,
    pub body: Arc<Vec<u8>>,
    /// The tag as an FLV file has it, made once for all HTTP-FLV players by the first.
    file: Arc<std::sync::OnceLock<Vec<u8>>>,
    /// The tag as RTMP chunks, made once for all RTMP players by the first.
    chunks: Arc<std::sync::OnceLock<Vec<u8>>>,
}

impl FlvTag {
    pub fn new(video: bool, key: bool, ms: u32, body: Arc<Vec<u8>>) -> Self {
        Self { video, key, ms, body, file: Arc::default(), chunks: Arc::default() }
    }

    /// Its RTMP chunks at the path's time (`rtmp::server::media_chunks`): the same bytes for
    /// every RTMP player that takes them.
    pub fn rtmp_chunks(&self) -> &[u8] {
        self.chunks.get_or_init(|| fanout_proto::rtmp::server::media_chunks(self.video, self.ms, &self.body))
    }

    /// Its bytes in an FLV file (header, body, size), at the path's time: the same bytes for
    /// every HTTP-FLV player.
    pub fn file_bytes(&self) -> &[u8] {
        self.file.get_or_init(|| fanout_proto::container::flv::file_tag(self.video, self.ms, &self.body))
    }
}

/// The forms of the FLV's sessions of the data plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// An FLV file's tags, for plain HTTP-FLV players.
    File = 0,
    /// RTMP chunks on message stream 1, for plain RTMP players.
    Rtmp = 1,
}

/// Tags an RTMP or HTTP-FLV player may be behind before it skips to the next keyframe.
const FLV_BACKLOG: usize = 1024;

impl Flv {
    /// An FLV with these decoder configurations (video's `true`), for tests of its players.
    #[cfg(test)]
    pub fn new(config: Vec<(bool, Vec<u8>)>, backlog: usize) -> Self {
        let (video, audio) = (config.iter().any(|c| c.0), config.iter().any(|c| !c.0));
        Self {
            config: Mutex::new(Arc::new(config)),
            video,
            audio,
            tags: tokio::sync::broadcast::channel(backlog).0,
            sinks: Default::default(),
            start_ms: Default::default(),
            last_audio_ms: Default::default(),
        }
    }

    /// The FLV of those of `streams` FLV carries (H.264, H.265, AAC), if there are any.
    fn of(streams: &[TrackInfo]) -> Option<Self> {
        let carried: Vec<&TrackInfo> = streams.iter().filter(|s| s.kind().is_some()).collect();
        if carried.is_empty() {
            return None;
        }
        let flv = Self {
            config: Default::default(),
            video: carried.iter().any(|s| s.is_video()),
            audio: carried.iter().any(|s| !s.is_video()),
            tags: tokio::sync::broadcast::channel(FLV_BACKLOG).0,
            sinks: Default::default(),
            start_ms: Default::default(),
            last_audio_ms: Default::default(),
        };
        // Known now unless the video's parameter sets come in band (see `Outputs::flv`).
        if let Some(config) = Self::configs(&carried, &[]) {
            *flv.config.lock() = Arc::new(config);
        }
        Some(flv)
    }

    /// The decoder configurations of `carried`, the video's parameter sets from `keyframe`
    /// (Annex B) or else the description; `None` while they are unknown.
    fn configs(carried: &[&TrackInfo], keyframe: &[u8]) -> Option<Vec<(bool, Vec<u8>)>> {
        use fanout_proto::container::{flv, repack::TrackCodec};
        carried
            .iter()
            // (MP3 has no decoder configuration in FLV.)
            .filter(|s| s.codec != TrackCodec::Mpa)
            .map(|s| match &s.codec {
                TrackCodec::Video { codec, params } => {
                    let mut sets: Vec<&[u8]> = fanout_proto::codec::annexb::nal_units(keyframe)
                        .filter(|n| fanout_proto::codec::annexb::is_parameter_set(*codec, n))
                        .collect();
                    if sets.is_empty() {
                        sets = params.iter().map(Vec::as_slice).collect();
                    }
                    (!sets.is_empty()).then(|| (true, flv::video_config(*codec, &sets)))
                }
                TrackCodec::Aac { config, .. } => Some((false, flv::aac_config(config))),
                _ => None,
            })
            .collect()
    }

    /// Its decoder configurations now (none while they are not known: no tag has gone out).
    pub fn config(&self) -> Configs {
        self.config.lock().clone()
    }

    /// Tag `tag` to the players' channel and into its sessions, where they have players.
    fn send(&self, tag: FlvTag) {
        use std::sync::atomic::Ordering::Relaxed;
        if tag.video && tag.key {
            self.start_ms.store(u64::from(tag.ms) << 32 | u64::from(self.last_audio_ms.load(Relaxed)), Relaxed);
        } else if !tag.video {
            self.last_audio_ms.store(tag.ms, Relaxed);
        }
        // A player starts at a keyframe's tag; in audio alone, at any tag.
        let key = tag.key || !self.video;
        for form in [Form::File, Form::Rtmp] {
            if let Some(inlet) = self.sinks[form as usize].lock().as_mut() {
                let bytes = match form {
                    Form::File => tag.file_bytes(),
                    Form::Rtmp => tag.rtmp_chunks(),
                };
                inlet.hold_unit(bytes, key);
            }
        }
        if self.tags.receiver_count() > 0 {
            let _ = self.tags.send(tag);
        }
    }

    /// Whether a session of it was made (players of the data plane may come and go).
    fn has_sessions(&self) -> bool {
        self.sinks.iter().any(|s| s.lock().is_some())
    }

    /// Publishes what its sessions were handed since the last call.
    fn flush(&self) {
        for s in &self.sinks {
            if let Some(inlet) = s.lock().as_mut() {
                inlet.flush();
            }
        }
    }

    /// The time a decoder configuration of `video`'s kind goes at, for a player of its
    /// sessions (which starts at the last keyframe's tag): no later than that kind's first
    /// tag after it (audio may come a little before the keyframe's time).
    pub fn config_ms(&self, video: bool) -> u32 {
        let start = self.start_ms.load(std::sync::atomic::Ordering::Relaxed);
        if video {
            (start >> 32) as u32
        } else {
            start as u32
        }
    }

    /// What a player of its session gets before the ring's bytes: the file's header and
    /// the decoder configurations, each at its kind's time ([`Flv::config_ms`]).
    pub fn file_start(&self) -> Vec<u8> {
        use fanout_proto::container::flv;
        let mut out = flv::file_header(self.video, self.audio).to_vec();
        for (video, body) in self.config().iter() {
            out.extend(flv::file_tag(*video, self.config_ms(*video), body));
        }
        out
    }

    /// Its session of the data plane in `form`, if a player made it.
    pub fn session(&self, form: Form) -> Option<Session> {
        self.sinks[form as usize].lock().as_ref().map(|i| i.session().clone())
    }
}

/// What streams carry, for the status and to tell a publisher's new tracks: "H.264 + AAC".
pub fn describe(streams: &[TrackInfo]) -> String {
    streams.iter().map(TrackInfo::name).collect::<Vec<_>>().join(" + ")
}

/// A running repackaging.
pub struct Repack {
    /// The MPEG-TS session HTTP subscribers join, where the session's stream URL is ours.
    pub ts: Option<Session>,
    /// Its sessions' template, for the FLV's, made when first asked.
    template: SessionConfig,
    pub hls: Option<Arc<Hls>>,
    pub flv: Option<Arc<Flv>>,
    /// The path's recording, where it is recorded.
    pub record: Option<Arc<crate::record::Recording>>,
    /// What it carries, for the status: "H.264 + AAC".
    pub describes: String,
    task: tokio::task::AbortHandle,
}

impl Repack {
    /// Starts repackaging `inputs` of session `name`, into MPEG-TS (a new session named
    /// `{name}/ts`) if `with_ts`, and HLS of `hls_variant` where the tracks allow. `clock_maps` is asked once
    /// a second for the tracks' wall clocks (they come with sender reports). With `record`,
    /// the path is recorded too, and the repackaging runs until it is stopped.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        name: &str,
        template: &SessionConfig,
        engine: &fanout_io::Engine,
        inputs: Vec<Input>,
        with_ts: bool,
        hls_variant: fanout_proto::container::hls::Variant,
        record: Option<crate::record::RecordTo>,
        clock_maps: impl Fn() -> Vec<Option<(u64, u32)>> + Send + 'static,
        linger: Duration,
        on_stop: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Arc<Self>> {
        let repack = Repackager::new(inputs.iter().map(|i| i.info.clone()).collect());
        let taken = || inputs.iter().filter(|i| i.info.is_some());
        let derived = taken().position(|i| i.derived);
        let fmp4_skip = taken().position(|i| !i.fmp4);
        // (HTTP TS only where MPEG-TS carries a track: VP9, AV1 and Opus alone go to HLS.)
        let ts = if with_ts && repack.streams().iter().any(|s| s.kind().is_some()) {
            let mut cfg = template.clone();
            cfg.name = crate::track::Inner::Ts.name(name);
            // Its subscribers are TCP: user space serves them on every data path.
            if cfg.datapath == DataPath::Kernel {
                cfg.datapath = DataPath::Shared;
            }
            let session = Session::new(cfg, engine);
            session.set_source_kind(format!("MPEG-TS repackaged from {name}"));
            Some(Inlet::open(&session)?)
        } else {
            None
        };
        // Segment numbers from the clock in half-seconds: a restarted repackaging starts past
        // every number the last one used (it made at most one per 2 s).
        let first = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64 / 500);
        let hls = Segmenter::of(hls_variant, repack.streams(), HLS_TARGET_MS, HLS_PART_MS, first).map(|mut seg| {
            if let Some(i) = fmp4_skip.filter(|_| hls_variant != fanout_proto::container::hls::Variant::MpegTs) {
                seg.leave_out(i);
            }
            let start = seg.progress();
            Arc::new(Hls {
                seg: Mutex::new(seg),
                newest: tokio::sync::watch::channel(start).0,
                start,
                last_request: Mutex::new(Instant::now()),
                players: Mutex::new(fanout_core::players::Players::new(PLAYER_WINDOW_MS, MAX_PLAYERS)),
                born: Instant::now(),
                served: Default::default(),
                kicked: Default::default(),
            })
        });
        // (What the source carries: a track made from another is not the source's.)
        let source: Vec<TrackInfo> =
            repack.streams().iter().enumerate().filter(|(i, _)| Some(*i) != derived).map(|(_, s)| s.clone()).collect();
        let describes = describe(&source);
        let ts_session = ts.as_ref().map(|i| i.session().clone());
        let flv = Flv::of(repack.streams()).map(Arc::new);
        let mut template = template.clone();
        // Its subscribers are TCP: user space serves them on every data path.
        if template.datapath == DataPath::Kernel {
            template.datapath = DataPath::Shared;
        }
        let record =
            record.and_then(|to| crate::record::Recording::start(to, name, repack.streams(), fmp4_skip)).map(Arc::new);
        let flv_times = repack.streams().iter().map(|_| fanout_proto::codec::dts::DecodingTimes::default()).collect();
        let out = Outputs {
            ts,
            ts_mux: TsPackager::new(repack.streams()),
            hls: hls.clone(),
            flv: flv.clone(),
            flv_times,
            record: record.clone(),
        };
        let run = run(name.to_string(), repack, inputs, out, clock_maps, linger);
        let task = tokio::spawn(async move {
            if let Err(e) = run.await {
                tracing::warn!("repackaging stopped: {e}");
            }
            on_stop();
        })
        .abort_handle();
        Ok(Arc::new(Self { ts: ts_session, template, hls, flv, record, describes, task }))
    }

    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// The FLV's session of the data plane in `form` (`{name}/flv`, `{name}/rtmp`), made now
    /// if need be: its ring holds every tag once, as an FLV file's bytes or as RTMP chunks,
    /// each keyframe's tag marked where a player may start or resume; a player is a stream
    /// sink of it, written once per flush interval straight from the ring. `None` where the
    /// stream has nothing FLV carries.
    pub fn flv_session(&self, engine: &fanout_io::Engine, form: Form) -> Option<std::io::Result<Session>> {
        let flv = self.flv.as_ref()?;
        let mut sinks = flv.sinks[form as usize].lock();
        if let Some(inlet) = sinks.as_ref() {
            return Some(Ok(inlet.session().clone()));
        }
        let mut cfg = self.template.clone();
        let (inner, what) = match form {
            Form::File => (crate::track::Inner::Flv, "FLV"),
            Form::Rtmp => (crate::track::Inner::Rtmp, "RTMP chunks"),
        };
        cfg.name = inner.name(self.template.name.as_str());
        // The bytes as they come: nothing in them is RTP.
        cfg.payload = fanout_io::PayloadMode::Raw;
        let session = Session::new(cfg, engine);
        session.set_source_kind(format!("{what} repackaged from {}", self.template.name));
        Some(match Inlet::open_units(&session) {
            Ok(inlet) => {
                *sinks = Some(inlet);
                Ok(session)
            }
            Err(e) => {
                session.close();
                Err(e)
            }
        })
    }

    /// The sessions it made (MPEG-TS, FLV), which its owner closes once it stops.
    pub fn sessions(&self) -> Vec<Session> {
        let flv = self.flv.as_ref().map(|f| [Form::File, Form::Rtmp].map(|form| f.session(form)));
        self.ts.iter().cloned().chain(flv.into_iter().flatten().flatten()).collect()
    }

    /// Stops it (a recording's last fragment is written first); closing its sessions
    /// ([`Repack::sessions`]) is the caller's (it joins threads).
    pub fn stop(&self) {
        if let Some(r) = &self.record {
            r.finish();
        }
        self.task.abort();
    }
}

struct Outputs {
    /// Into the TS session.
    ts: Option<Inlet>,
    ts_mux: TsPackager,
    hls: Option<Arc<Hls>>,
    flv: Option<Arc<Flv>>,
    /// Per stream, the decoding times of its pictures (RTP gives presentation times only).
    flv_times: Vec<fanout_proto::codec::dts::DecodingTimes<(bool, Vec<u8>)>>,
    record: Option<Arc<crate::record::Recording>>,
}

impl Outputs {
    /// Whether anyone still wants the output (a recording always does).
    fn wanted(&self, linger: Duration) -> bool {
        self.record.is_some()
            || self.ts.as_ref().is_some_and(|i| !i.session().sinks().is_empty())
            || self.hls.as_ref().is_some_and(|h| h.last_request.lock().elapsed() < linger)
            || self.flv.as_ref().is_some_and(|f| {
                f.tags.receiver_count() > 0
                    || [Form::File, Form::Rtmp]
                        .iter()
                        .any(|&form| f.session(form).is_some_and(|s| !s.sinks().is_empty()))
            })
    }

    /// Access unit `u` to every output: the recording, RTMP players, the TS session (held,
    /// flushed once per wake), the HLS segmenter. `false`: TS could not frame it.
    fn unit(&mut self, u: &Unit, streams: &[TrackInfo], bytes: &mut Vec<u8>) -> bool {
        if let Some(r) = &self.record {
            r.push(u);
        }
        self.flv(u, streams);
        let mut framed = true;
        if let Some(inlet) = self.ts.as_mut() {
            framed = self.ts_mux.write(u, bytes);
            for d in bytes.chunks(PACKETS_PER_DATAGRAM * fanout_proto::container::mpegts::PACKET_LEN) {
                // What the session refuses it counts.
                inlet.hold(d);
            }
            bytes.clear();
        }
        if let Some(h) = &self.hls {
            let mut seg = h.seg.lock();
            if seg.push(u) {
                h.newest.send_replace(seg.progress());
            }
        }
        framed
    }

    /// Unit `u` as FLV for the RTMP and HTTP-FLV players, if any.
    fn flv(&mut self, u: &Unit, codecs: &[TrackInfo]) {
        use fanout_proto::container::{flv, repack::TrackCodec};
        let Some(f) = self.flv.as_ref().filter(|f| f.tags.receiver_count() > 0 || f.has_sessions()) else {
            return;
        };
        // Each video keyframe configures the players that join from it; nothing goes out
        // before the first brings the parameter sets.
        if u.key && codecs[u.stream].is_video() {
            let carried: Vec<&TrackInfo> = codecs.iter().filter(|s| s.kind().is_some()).collect();
            if let Some(config) = Flv::configs(&carried, &u.data) {
                let mut now = f.config.lock();
                if **now != config {
                    *now = Arc::new(config);
                }
            }
        }
        if f.config.lock().is_empty() {
            return;
        }
        match &codecs[u.stream].codec {
            TrackCodec::Video { codec, .. } => {
                let codec = *codec;
                self.flv_times[u.stream].push(u.time, (u.key, u.data.clone()), |pts, dts, (key, data)| {
                    let body = flv::video_frame(codec, key, ((pts - dts) / 90) as i32, &data);
                    f.send(FlvTag::new(true, key, flv_ms(dts), Arc::new(body)));
                });
            }
            TrackCodec::Aac { .. } | TrackCodec::Mpa => {
                let body = match &codecs[u.stream].codec {
                    TrackCodec::Aac { .. } => flv::aac_frame(&u.data),
                    _ => flv::mp3_frame(&u.data),
                };
                f.send(FlvTag::new(false, false, flv_ms(u.time), Arc::new(body)));
            }
            _ => {} // not in FLV
        }
    }
}

/// One in-process subscriber per repackaged track: its input, a queue of the ring's
/// packets, and the sink that fills it.
type Sub = (usize, Arc<ChannelQueue>, Session, u64);

fn unsubscribe(subs: &[Sub]) {
    for (_, _, session, id) in subs {
        session.remove_sink(*id);
    }
}

/// The subscribers of every input that can be repackaged, each waking `wake`; at half the
/// ring a repackaging that falls that far behind resumes at a keyframe.
fn subscribe(inputs: &[Input], wake: &Arc<tokio::sync::Notify>) -> std::io::Result<Vec<Sub>> {
    let mut subs = Vec::new();
    for (k, i) in inputs.iter().enumerate().filter(|(_, i)| i.info.is_some()) {
        let w = wake.clone();
        let queue = ChannelQueue::new(i.session.config().ring_capacity / 2, move || w.notify_one());
        match i.session.add_local_sink("repackaging", queue.clone()) {
            Ok(id) => subs.push((k, queue, i.session.clone(), id)),
            Err(e) => {
                unsubscribe(&subs);
                return Err(e);
            }
        }
    }
    Ok(subs)
}

/// Subscribes to every input and repackages until nobody has wanted the output for
/// `linger`, then unsubscribes.
async fn run(
    name: String,
    mut repack: Repackager,
    inputs: Vec<Input>,
    mut out: Outputs,
    clock_maps: impl Fn() -> Vec<Option<(u64, u32)>>,
    linger: Duration,
) -> std::io::Result<()> {
    for (k, i) in inputs.iter().enumerate() {
        if let Some((ntp, rtp)) = i.clock_map {
            repack.set_clock_map(k, ntp, rtp);
        }
    }
    let wake = Arc::new(tokio::sync::Notify::new());
    let subs = subscribe(&inputs, &wake)?;
    tracing::info!(
        session = %name,
        tracks = subs.len(),
        ts = out.ts.is_some(),
        hls = out.hls.is_some(),
        record = out.record.is_some(),
        "repackaging started"
    );
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut idle_since: Option<Instant> = None;
    let (mut units, mut bytes, mut frames): (Vec<Unit>, Vec<u8>, Vec<_>) = (Vec::new(), Vec::new(), Vec::new());
    let mut unframed = 0u64;
    loop {
        tokio::select! {
            _ = wake.notified() => {
                let now = started.elapsed().as_millis() as u64;
                for (k, queue, _, _) in &subs {
                    queue.drain(&mut frames);
                    for (p, _) in frames.drain(..) {
                        repack.push_rtp(*k, p.data(), now, &mut units);
                    }
                }
                for u in units.drain(..) {
                    if !out.unit(&u, repack.streams(), &mut bytes) {
                        unframed += 1;
                    }
                }
                if let Some(inlet) = out.ts.as_mut() {
                    inlet.flush();
                }
                if let Some(f) = &out.flv {
                    f.flush();
                }
            }
            _ = tick.tick() => {
                for (k, map) in clock_maps().into_iter().enumerate() {
                    if let Some((ntp, rtp)) = map {
                        repack.set_clock_map(k, ntp, rtp);
                    }
                }
                if out.wanted(linger) {
                    idle_since = None;
                } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= linger {
                    break;
                }
            }
        }
    }
    unsubscribe(&subs);
    let s = repack.stats;
    tracing::info!(session = %name, packets = s.packets, units = s.units, bad = s.bad, dropped = s.dropped, unframed, "repackaging stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A GOP's pictures from before the timeline's start (a ring's backlog behind the first
    /// track's first packet) keep their 40 ms spacing in FLV, as the ones after it do.
    #[test]
    fn pictures_from_before_the_timeline_start_keep_their_spacing() {
        let times: Vec<u32> = (-75..5).map(|k| super::flv_ms(k * 3600)).collect();
        assert!(times.windows(2).all(|w| w[1] == w[0] + 40), "{times:?}");
    }

    /// A reader starts at a keyframe, each configuration just before its kind's first tag;
    /// fallen behind, it waits for the next keyframe again (its configurations not resent).
    #[test]
    fn a_reader_starts_at_a_keyframe_with_each_configuration_before_its_kind() {
        use super::{FlvTag, Passed, TagGate};
        use tokio::sync::broadcast::error::RecvError;
        let flv = super::Flv::new(vec![(true, vec![1]), (false, vec![2])], 1);
        let tag = |video, key| Ok(FlvTag::new(video, key, 40, std::sync::Arc::new(vec![0])));
        let mut g = TagGate::new(&flv);
        let owed = |p: Passed<'_>| match p {
            Passed::Tag(owed, _) => Some(owed.into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()),
            _ => None,
        };
        assert_eq!(owed(g.pass(tag(false, false), &flv.config())), None, "audio before the first keyframe waits");
        assert_eq!(owed(g.pass(tag(true, false), &flv.config())), None);
        assert_eq!(owed(g.pass(tag(true, true), &flv.config())), Some(vec![vec![1]]));
        assert_eq!(owed(g.pass(tag(true, false), &flv.config())), Some(vec![]));
        assert_eq!(owed(g.pass(tag(false, false), &flv.config())), Some(vec![vec![2]]));
        assert!(matches!(g.pass(Err(RecvError::Lagged(3)), &flv.config()), Passed::Lagged(3)));
        assert_eq!(owed(g.pass(tag(false, false), &flv.config())), None, "after a lag: the next keyframe");
        assert_eq!(owed(g.pass(tag(true, true), &flv.config())), Some(vec![]));
        assert!(matches!(g.pass(Err(RecvError::Closed), &flv.config()), Passed::Closed));
    }

    use fanout_proto::container::repack::TrackInfo;

    /// Every player's copy of a tag (a broadcast clones it per receiver) shares one RTMP
    /// chunking and one FLV framing, made by the first player that asks.
    #[test]
    fn a_tag_is_chunked_and_framed_once_whatever_the_players() {
        let tag = super::FlvTag::new(true, true, 0x0123_4567, std::sync::Arc::new(vec![0x17; 9000]));
        let players: Vec<super::FlvTag> = (0..100).map(|_| tag.clone()).collect();
        let first = players[0].rtmp_chunks().as_ptr();
        assert!(players.iter().all(|p| std::ptr::eq(p.rtmp_chunks().as_ptr(), first)));
        assert_eq!(
            players[7].rtmp_chunks(),
            fanout_proto::rtmp::server::media_chunks(true, 0x0123_4567, &[0x17; 9000])
        );
        let framed = players[3].file_bytes().as_ptr();
        assert!(players.iter().all(|p| std::ptr::eq(p.file_bytes().as_ptr(), framed)));
    }

    /// A WHIP publisher's H.264 has no parameter sets in its description: the FLV knows it
    /// carries video and audio at once, and its configurations come with the first keyframe
    /// that brings them in band.
    #[test]
    fn flv_configures_from_the_first_keyframe_when_the_description_has_no_parameter_sets() {
        use fanout_proto::codec::annexb::Codec;
        use fanout_proto::container::repack::TrackCodec;
        let streams = [
            TrackInfo { codec: TrackCodec::Video { codec: Codec::H264, params: vec![] }, clock: 90_000 },
            TrackInfo { codec: TrackCodec::Opus { channels: 2 }, clock: 48_000 },
            TrackInfo {
                codec: TrackCodec::Aac { config: vec![0x11, 0x90], size_bits: 13, index_bits: 3, delta_bits: 3 },
                clock: 48_000,
            },
        ];
        let flv = super::Flv::of(&streams).unwrap();
        assert!(flv.video && flv.audio && flv.config().is_empty());
        let carried: Vec<&TrackInfo> = streams.iter().filter(|s| s.kind().is_some()).collect();
        assert_eq!(super::Flv::configs(&carried, &[0, 0, 0, 1, 0x65, 0x88]), None, "a keyframe without them");
        let key = [&[0, 0, 0, 1, 0x67, 0x64, 0, 0x1f, 0xac][..], &[0, 0, 0, 1, 0x68, 0xeb], &[0, 0, 0, 1, 0x65, 0x88]]
            .concat();
        let config = super::Flv::configs(&carried, &key).unwrap();
        assert_eq!(config.len(), 2);
        assert!(config[0].0 && !config[1].0, "video, then the AAC; Opus is not in FLV");
    }

    #[test]
    fn streams_are_described_by_their_codecs() {
        let sdp = fanout_proto::rtsp::sdp::Sdp::parse(
            "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n\
             m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n\
             m=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\n\
             a=fmtp:97 streamtype=5;profile-level-id=1;mode=AAC-hbr;sizelength=13;indexlength=3;indexdeltalength=3;config=1190\r\n",
        )
        .unwrap();
        let streams: Vec<TrackInfo> = sdp.media.iter().filter_map(|m| TrackInfo::from_sdp(m).ok()).collect();
        assert_eq!(super::describe(&streams), "H.264 + AAC");
        assert_eq!(super::describe(&[]), "");
    }
}
