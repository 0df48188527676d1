//! A path's readers, whatever their protocol: one registry per path that every face joins a
//! reader to and that counting, listing, kicking, `max_readers` and the `on_read` /
//! `on_unread` hooks all read. Sans-IO: times are passed in; what a face must do (end its
//! client) it is told through the [`Reader`] it registered, and what the relay must do (run
//! a hook) comes out as [`Event`]s.
//!
//! A reader lives as long as its [`Registered`] guard (a face's task or thread holds it), or,
//! for readers no task of ours holds (an HTTP TS socket handed to the engine, an HLS player
//! known by its requests), until [`Reader::alive`] says it went, which [`Readers::sweep`]
//! asks.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How a reader reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Rtsp,
    Rtsps,
    Webrtc,
    Rtmp,
    Rtmps,
    Srt,
    HttpTs,
    HttpFlv,
    #[serde(rename = "ws_flv")]
    WebSocketFlv,
    Hls,
    UdpSink,
    TcpSink,
    /// A `forward` target: the path pushed to another server.
    Forward,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Rtsp => "rtsp",
            Protocol::Rtsps => "rtsps",
            Protocol::Webrtc => "webrtc",
            Protocol::Rtmp => "rtmp",
            Protocol::Rtmps => "rtmps",
            Protocol::Srt => "srt",
            Protocol::HttpTs => "http_ts",
            Protocol::HttpFlv => "http_flv",
            Protocol::WebSocketFlv => "ws_flv",
            Protocol::Hls => "hls",
            Protocol::UdpSink => "udp_sink",
            Protocol::TcpSink => "tcp_sink",
            Protocol::Forward => "forward",
        }
    }
}

/// What a reader was sent so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub bytes: u64,
    pub packets: u64,
    /// Packets or tags it missed (it fell behind and skipped ahead, or reported them lost).
    pub skips: u64,
}

/// What a face gives the registry for one reader. Its methods are called under the registry's
/// lock (`counters`, `alive`) or right after (`close`): they must not take a lock under which
/// a face drops a [`Registered`].
pub trait Reader: Send + Sync {
    /// Its counters now.
    fn counters(&self) -> Counters {
        Counters::default()
    }
    /// Ends it the protocol's own way (RTCP BYE and close, FLV end, WHEP resource gone, SRT
    /// close, HTTP stream end). Called at most once, without the registry's lock.
    fn close(&self, reason: &str);
    /// Whether it is still there: asked of readers no task holds (see [`Registered::detach`]).
    fn alive(&self, _now: Instant) -> bool {
        true
    }
    /// Where it is one of the engine's sinks: its session and id. Such readers are asked
    /// about in one listing of each session's sinks per sweep or list, not one search each
    /// (thousands of HTTP or UDP sinks would make that quadratic).
    fn sink(&self) -> Option<(&fanout_io::Session, u64)> {
        None
    }
}

/// The sinks of the sessions some readers are sinks of, listed once: by session name, by id.
#[derive(Default)]
struct SinkBook(HashMap<String, HashMap<u64, fanout_io::SinkStatus>>);

impl SinkBook {
    fn of(&mut self, session: &fanout_io::Session, id: u64) -> Option<&fanout_io::SinkStatus> {
        let listed = self
            .0
            .entry(session.name().to_string())
            .or_insert_with(|| session.sinks().into_iter().map(|s| (s.id, s)).collect());
        listed.get(&id)
    }

    fn counters(&mut self, reader: &dyn Reader) -> Counters {
        match reader.sink() {
            Some((session, id)) => self.of(session, id).map_or_else(Counters::default, sink_counters),
            None => reader.counters(),
        }
    }

    fn alive(&mut self, reader: &dyn Reader, now: Instant) -> bool {
        match reader.sink() {
            Some((session, id)) => self.of(session, id).is_some_and(|s| s.state != "failed"),
            None => reader.alive(now),
        }
    }
}

fn sink_counters(s: &fanout_io::SinkStatus) -> Counters {
    Counters { bytes: s.bytes_sent, packets: s.packets_sent, skips: s.packets_skipped }
}

/// Who a reader is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Who {
    pub protocol: Protocol,
    pub addr: Option<SocketAddr>,
    /// The user its credentials named, if any.
    pub user: Option<String>,
}

impl Who {
    pub fn new(protocol: Protocol, addr: Option<SocketAddr>, user: Option<&str>) -> Self {
        Who { protocol, addr, user: user.filter(|u| !u.is_empty()).map(str::to_string) }
    }
}

/// A path's settings the registry applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Readers at most; the next is refused.
    pub max_readers: Option<usize>,
    /// Commands (program and arguments, no shell) run when a reader comes and goes.
    pub on_read: Option<Vec<String>>,
    pub on_unread: Option<Vec<String>>,
}

/// Something the relay must act on: a hook to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub path: String,
    pub id: String,
    pub who: Who,
    pub what: Happened,
    /// The command to run for it, if the path has one.
    pub command: Option<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Happened {
    Read,
    Unread { duration: Duration, counters: Counters, reason: String },
}

impl Event {
    /// The hook's environment.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("FANOUT_PATH", self.path.clone()),
            ("FANOUT_READER_ID", self.id.clone()),
            ("FANOUT_READER_PROTOCOL", self.who.protocol.as_str().to_string()),
            ("FANOUT_READER_ADDR", self.who.addr.map(|a| a.to_string()).unwrap_or_default()),
            ("FANOUT_READER_USER", self.who.user.clone().unwrap_or_default()),
        ];
        if let Happened::Unread { duration, counters, reason } = &self.what {
            env.push(("FANOUT_READER_DURATION_S", format!("{:.3}", duration.as_secs_f64())));
            env.push(("FANOUT_READER_BYTES", counters.bytes.to_string()));
            env.push(("FANOUT_READER_PACKETS", counters.packets.to_string()));
            env.push(("FANOUT_READER_REASON", reason.clone()));
        }
        env
    }

    pub fn kind(&self) -> &'static str {
        match self.what {
            Happened::Read => "on_read",
            Happened::Unread { .. } => "on_unread",
        }
    }
}

/// A reader as the API shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReaderStatus {
    pub id: String,
    pub path: String,
    pub protocol: Protocol,
    pub addr: Option<SocketAddr>,
    pub user: Option<String>,
    /// When it started reading (Unix seconds).
    pub since_unix_s: u64,
    pub duration_s: f64,
    #[serde(flatten)]
    pub counters: Counters,
}

/// Why a reader was not let in.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path} has its {max} readers (max_readers)")]
pub struct Full {
    pub path: String,
    pub max: usize,
}

struct Entry {
    who: Who,
    since: Instant,
    since_wall: SystemTime,
    reader: Arc<dyn Reader>,
    /// No task holds it: [`Reader::alive`] is asked.
    detached: bool,
}

/// One path's readers: the state machine behind [`Readers`].
pub struct Registry {
    path: String,
    settings: Settings,
    entries: HashMap<String, Entry>,
    events: Vec<Event>,
    /// When detached readers were last asked whether they went.
    checked: Option<Instant>,
}

/// Detached readers are asked whether they went at most this often (a path of thousands of
/// sinks lists them each time).
const CHECK_EVERY: Duration = Duration::from_secs(2);

impl Registry {
    pub fn new(path: &str, settings: Settings) -> Self {
        Registry { path: path.to_string(), settings, entries: HashMap::new(), events: Vec::new(), checked: None }
    }

    /// Lets a reader in under `id`, unless the path has `max_readers` already.
    pub fn admit(&mut self, id: String, who: Who, reader: Arc<dyn Reader>, now: Instant) -> Result<(), Full> {
        if let Some(max) = self.settings.max_readers.filter(|&m| self.entries.len() >= m) {
            return Err(Full { path: self.path.clone(), max });
        }
        self.events.push(Event {
            path: self.path.clone(),
            id: id.clone(),
            who: who.clone(),
            what: Happened::Read,
            command: self.settings.on_read.clone(),
        });
        let entry = Entry { who, since: now, since_wall: SystemTime::now(), reader, detached: false };
        self.entries.insert(id, entry);
        Ok(())
    }

    /// The reader `id` left (or was made to): its `Unread`, once; what to tell it, if
    /// `close` (a kick).
    pub fn leave(&mut self, id: &str, reason: &str, now: Instant) -> Option<Arc<dyn Reader>> {
        let e = self.entries.remove(id)?;
        self.events.push(Event {
            path: self.path.clone(),
            id: id.to_string(),
            what: Happened::Unread {
                duration: now.saturating_duration_since(e.since),
                counters: e.reader.counters(),
                reason: reason.to_string(),
            },
            who: e.who,
            command: self.settings.on_unread.clone(),
        });
        Some(e.reader)
    }

    fn detach(&mut self, id: &str) {
        if let Some(e) = self.entries.get_mut(id) {
            e.detached = true;
        }
    }

    /// Detached readers that went.
    pub fn gone(&self, now: Instant) -> Vec<String> {
        let mut book = SinkBook::default();
        let detached = self.entries.iter().filter(|(_, e)| e.detached);
        detached.filter(|(_, e)| !book.alive(e.reader.as_ref(), now)).map(|(id, _)| id.clone()).collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn ids(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    pub fn status(&self, id: &str, now: Instant) -> Option<ReaderStatus> {
        self.status_with(id, now, &mut SinkBook::default())
    }

    /// Every reader's status, longest-reading first.
    pub fn statuses(&self, now: Instant) -> Vec<ReaderStatus> {
        let mut book = SinkBook::default();
        let mut all: Vec<ReaderStatus> =
            self.entries.keys().filter_map(|id| self.status_with(id, now, &mut book)).collect();
        all.sort_by(|a, b| b.duration_s.total_cmp(&a.duration_s));
        all
    }

    /// How many read, by protocol.
    pub fn counts(&self) -> HashMap<Protocol, usize> {
        let mut n = HashMap::new();
        for e in self.entries.values() {
            *n.entry(e.who.protocol).or_default() += 1;
        }
        n
    }

    fn status_with(&self, id: &str, now: Instant, book: &mut SinkBook) -> Option<ReaderStatus> {
        let e = self.entries.get(id)?;
        Some(ReaderStatus {
            id: id.to_string(),
            path: self.path.clone(),
            protocol: e.who.protocol,
            addr: e.who.addr,
            user: e.who.user.clone(),
            since_unix_s: e.since_wall.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            duration_s: now.saturating_duration_since(e.since).as_secs_f64(),
            counters: book.counters(e.reader.as_ref()),
        })
    }

    pub fn set(&mut self, settings: Settings) {
        self.settings = settings;
    }

    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
}

/// A path's registry, shared by its faces.
#[derive(Clone)]
pub struct Readers(Arc<Mutex<Registry>>);

impl Readers {
    pub fn new(path: &str, settings: Settings) -> Self {
        Readers(Arc::new(Mutex::new(Registry::new(path, settings))))
    }

    /// Joins a reader; the guard that keeps it registered, or why not.
    pub fn join(&self, who: Who, reader: Arc<dyn Reader>) -> Result<Registered, Full> {
        self.join_as(new_id(), who, reader)
    }

    /// Joins a reader under an id it already has (an HLS player's, from [`new_id`]).
    pub fn join_as(&self, id: String, who: Who, reader: Arc<dyn Reader>) -> Result<Registered, Full> {
        self.0.lock().admit(id.clone(), who, reader, Instant::now())?;
        Ok(Registered { readers: self.clone(), id })
    }

    pub fn has(&self, id: &str) -> bool {
        self.0.lock().entries.contains_key(id)
    }

    /// Ends the reader `id` (its client is told `reason`); whether there was one.
    pub fn kick(&self, id: &str, reason: &str) -> bool {
        let reader = self.0.lock().leave(id, &format!("kicked: {reason}"), Instant::now());
        reader.map(|r| r.close(reason)).is_some()
    }

    /// Ends every reader (the path went).
    pub fn close_all(&self, reason: &str) -> usize {
        let ids = self.0.lock().ids();
        ids.iter().filter(|id| self.end(id, reason)).count()
    }

    /// Ends every reader but those of `keep` (HLS players read a stream's end in the
    /// playlist, and then stop asking).
    pub fn close_all_but(&self, reason: &str, keep: Protocol) -> usize {
        let ids: Vec<String> = {
            let reg = self.0.lock();
            reg.entries.iter().filter(|(_, e)| e.who.protocol != keep).map(|(id, _)| id.clone()).collect()
        };
        ids.iter().filter(|id| self.end(id, reason)).count()
    }

    fn end(&self, id: &str, reason: &str) -> bool {
        let reader = self.0.lock().leave(id, reason, Instant::now());
        reader.map(|r| r.close(reason)).is_some()
    }

    /// Forgets detached readers that went (asked every [`CHECK_EVERY`]); the events since
    /// the last sweep.
    pub fn sweep(&self, now: Instant) -> Vec<Event> {
        let mut reg = self.0.lock();
        if reg.checked.is_none_or(|t| now.saturating_duration_since(t) >= CHECK_EVERY) {
            reg.checked = Some(now);
            for id in reg.gone(now) {
                reg.leave(&id, "gone", now);
            }
        }
        reg.take_events()
    }

    pub fn len(&self) -> usize {
        self.0.lock().len()
    }

    /// Whether the next reader would be refused.
    pub fn full(&self) -> bool {
        let reg = self.0.lock();
        reg.settings.max_readers.is_some_and(|m| reg.entries.len() >= m)
    }

    pub fn list(&self) -> Vec<ReaderStatus> {
        self.0.lock().statuses(Instant::now())
    }

    /// How many read, by protocol (no counters asked: cheap for a path of thousands).
    pub fn counts(&self) -> HashMap<Protocol, usize> {
        self.0.lock().counts()
    }

    pub fn get(&self, id: &str) -> Option<ReaderStatus> {
        self.0.lock().status(id, Instant::now())
    }

    pub fn set(&self, settings: Settings) {
        self.0.lock().set(settings);
    }
}

/// A registered reader: it leaves when this is dropped (its face's task ended).
pub struct Registered {
    readers: Readers,
    id: String,
}

impl Registered {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// No task of ours holds this reader: it stays until [`Reader::alive`] says it went.
    pub fn detach(self) {
        self.readers.0.lock().detach(&self.id);
        std::mem::forget(self);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.readers.0.lock().leave(&self.id, "gone", Instant::now());
    }
}

/// An unguessable reader id: 128 random bits as 32 hex digits.
pub fn new_id() -> String {
    let mut b = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A reader's end told through a flag its face polls (and a wake for its task).
#[derive(Default)]
pub struct EndSignal {
    reason: Mutex<Option<String>>,
    wake: tokio::sync::Notify,
}

impl EndSignal {
    pub fn end(&self, reason: &str) {
        self.reason.lock().get_or_insert_with(|| reason.to_string());
        self.wake.notify_waiters();
        self.wake.notify_one();
    }

    pub fn ended(&self) -> Option<String> {
        self.reason.lock().clone()
    }

    /// Returns once ended, with the reason.
    pub async fn wait(&self) -> String {
        loop {
            let notified = self.wake.notified();
            if let Some(r) = self.ended() {
                return r;
            }
            notified.await;
        }
    }
}

/// A reader a face's task holds: counted by the task as it sends, ended through a signal the
/// task waits on.
#[derive(Default)]
pub struct Held {
    bytes: std::sync::atomic::AtomicU64,
    packets: std::sync::atomic::AtomicU64,
    skips: std::sync::atomic::AtomicU64,
    pub end: EndSignal,
    /// The engine's sink its task handed the socket to (an RTMP player's, once it plays
    /// from the data plane): counted by the engine from then on.
    sink: std::sync::OnceLock<(fanout_io::Session, u64)>,
}

impl Held {
    pub fn sent(&self, bytes: usize, packets: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.bytes.fetch_add(bytes as u64, Relaxed);
        self.packets.fetch_add(packets, Relaxed);
    }

    /// Its socket is the engine's sink `id` of `session` from now on (what it was sent
    /// before is not carried over: the sink counts from its start); ending it removes the
    /// sink. One ended meanwhile has its sink removed at once.
    pub fn handed_to(&self, session: fanout_io::Session, id: u64) {
        if self.end.ended().is_some() {
            session.remove_sink(id);
        } else {
            let _ = self.sink.set((session, id));
        }
    }

    pub fn skipped(&self, n: u64) {
        self.skips.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Reader for Held {
    fn counters(&self) -> Counters {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some((session, id)) = self.sink.get() {
            return counters_of_sink(session, *id);
        }
        Counters {
            bytes: self.bytes.load(Relaxed),
            packets: self.packets.load(Relaxed),
            skips: self.skips.load(Relaxed),
        }
    }

    fn close(&self, reason: &str) {
        self.end.end(reason);
        if let Some((session, id)) = self.sink.get() {
            session.remove_sink(*id);
        }
    }

    fn alive(&self, _now: Instant) -> bool {
        self.sink.get().is_none_or(|(s, id)| sink_alive(s, *id))
    }

    fn sink(&self) -> Option<(&fanout_io::Session, u64)> {
        self.sink.get().map(|(s, id)| (s, *id))
    }
}

/// A reader that is one of the engine's sinks (an HTTP TS socket handed over, a UDP or TCP
/// sink): counted by the engine, ended by removing the sink (its socket closes).
pub struct SinkReader {
    pub session: fanout_io::Session,
    pub sink: u64,
}

impl Reader for SinkReader {
    fn counters(&self) -> Counters {
        counters_of_sink(&self.session, self.sink)
    }

    fn sink(&self) -> Option<(&fanout_io::Session, u64)> {
        Some((&self.session, self.sink))
    }

    fn close(&self, _reason: &str) {
        self.session.remove_sink(self.sink);
    }

    fn alive(&self, _now: Instant) -> bool {
        sink_alive(&self.session, self.sink)
    }
}

/// An engine sink's counters now (none once it went).
fn counters_of_sink(session: &fanout_io::Session, id: u64) -> Counters {
    session.sink_status(id).as_ref().map_or_else(Counters::default, sink_counters)
}

/// Whether an engine sink is still there and sending.
fn sink_alive(session: &fanout_io::Session, id: u64) -> bool {
    session.sink_status(id).is_some_and(|s| s.state != "failed")
}

/// Waits for a held reader's end (never, without one).
pub async fn ended(held: Option<&Held>) -> String {
    match held {
        Some(h) => h.end.wait().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    #[derive(Default)]
    struct Fake {
        closed: Mutex<Vec<String>>,
        bytes: AtomicU64,
        there: AtomicBool,
    }

    impl Reader for Fake {
        fn counters(&self) -> Counters {
            Counters { bytes: self.bytes.load(Ordering::Relaxed), packets: 1, skips: 0 }
        }
        fn close(&self, reason: &str) {
            self.closed.lock().push(reason.to_string());
        }
        fn alive(&self, _: Instant) -> bool {
            self.there.load(Ordering::Relaxed)
        }
    }

    fn who(p: Protocol) -> Who {
        Who::new(p, Some("127.0.0.1:5000".parse().unwrap()), Some("ann"))
    }

    #[test]
    fn a_reader_reads_until_its_guard_goes_and_each_hook_fires_once() {
        let settings =
            Settings { on_read: Some(vec!["r".into()]), on_unread: Some(vec!["u".into()]), ..Default::default() };
        let readers = Readers::new("live/cam", settings);
        let fake = Arc::new(Fake::default());
        let guard = readers.join(who(Protocol::Rtmp), fake.clone()).unwrap();
        assert_eq!(guard.id().len(), 32);
        assert_eq!(readers.len(), 1);
        fake.bytes.store(4096, Ordering::Relaxed);
        let listed = readers.list();
        assert_eq!(listed[0].counters.bytes, 4096);
        assert_eq!(listed[0].user.as_deref(), Some("ann"));
        drop(guard);
        assert_eq!(readers.len(), 0);
        let events = readers.sweep(Instant::now());
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].what, Happened::Read);
        assert_eq!(events[0].command, Some(vec!["r".to_string()]));
        let Happened::Unread { counters, reason, .. } = &events[1].what else { panic!("{events:?}") };
        assert_eq!((counters.bytes, reason.as_str()), (4096, "gone"));
        assert!(events[1].env().contains(&("FANOUT_READER_BYTES", "4096".to_string())));
        // A dropped guard told nobody to close: the client went by itself.
        assert!(fake.closed.lock().is_empty());
        assert!(readers.sweep(Instant::now()).is_empty());
    }

    #[test]
    fn a_kick_closes_the_reader_once_and_its_guard_then_leaves_quietly() {
        let readers = Readers::new("a", Settings::default());
        let fake = Arc::new(Fake::default());
        let guard = readers.join(who(Protocol::Rtsp), fake.clone()).unwrap();
        let id = guard.id().to_string();
        assert!(readers.get(&id).is_some());
        assert!(readers.kick(&id, "by the operator"));
        assert!(!readers.kick(&id, "again"));
        assert_eq!(*fake.closed.lock(), vec!["by the operator".to_string()]);
        assert!(readers.get(&id).is_none());
        drop(guard);
        let events = readers.sweep(Instant::now());
        assert_eq!(events.len(), 2, "one read, one unread: {events:?}");
        let Happened::Unread { reason, .. } = &events[1].what else { panic!() };
        assert_eq!(reason, "kicked: by the operator");
        assert!(!readers.kick("not-an-id", "x"));
    }

    #[test]
    fn max_readers_refuses_the_next_and_a_leaver_makes_room() {
        let readers = Readers::new("a", Settings { max_readers: Some(2), ..Default::default() });
        let a = readers.join(who(Protocol::Hls), Arc::new(Fake::default())).unwrap();
        let _b = readers.join(who(Protocol::Srt), Arc::new(Fake::default())).unwrap();
        let full = readers.join(who(Protocol::Webrtc), Arc::new(Fake::default())).err().unwrap();
        assert_eq!(full, Full { path: "a".into(), max: 2 });
        drop(a);
        assert!(readers.join(who(Protocol::Webrtc), Arc::new(Fake::default())).is_ok());
        // A refused reader fires no hook.
        let reads = readers.sweep(Instant::now()).iter().filter(|e| e.what == Happened::Read).count();
        assert_eq!(reads, 3);
    }

    #[test]
    fn a_detached_reader_stays_until_it_is_gone() {
        let readers = Readers::new("a", Settings::default());
        let fake = Arc::new(Fake::default());
        fake.there.store(true, Ordering::Relaxed);
        readers.join(who(Protocol::HttpTs), fake.clone()).unwrap().detach();
        assert_eq!(readers.sweep(Instant::now()).len(), 1);
        assert_eq!(readers.len(), 1);
        fake.there.store(false, Ordering::Relaxed);
        // Asked again only once `CHECK_EVERY` passed.
        let t0 = Instant::now();
        assert!(readers.sweep(t0).is_empty());
        assert_eq!(readers.len(), 1);
        let events = readers.sweep(t0 + CHECK_EVERY);
        assert_eq!(readers.len(), 0);
        assert!(matches!(events[0].what, Happened::Unread { .. }));
    }

    #[test]
    fn close_all_ends_every_reader_with_the_reason() {
        let readers = Readers::new("a", Settings::default());
        let fakes: Vec<Arc<Fake>> = (0..3).map(|_| Arc::new(Fake::default())).collect();
        let guards: Vec<Registered> =
            fakes.iter().map(|f| readers.join(who(Protocol::Rtmp), f.clone()).unwrap()).collect();
        let _hls = readers.join(who(Protocol::Hls), Arc::new(Fake::default())).unwrap();
        assert_eq!(readers.close_all_but("the stream ended", Protocol::Hls), 3);
        assert_eq!(readers.len(), 1, "the HLS player stays");
        assert!(fakes.iter().all(|f| *f.closed.lock() == vec!["the stream ended".to_string()]));
        drop(guards);
        let unread = readers.sweep(Instant::now()).iter().filter(|e| e.what != Happened::Read).count();
        assert_eq!(unread, 3);
        assert_eq!(readers.close_all("the path went"), 1);
    }

    #[test]
    fn ids_are_unguessable_and_distinct() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|i| i.len() == 32 && i.bytes().all(|b| b.is_ascii_hexdigit())));
    }

    #[test]
    fn a_held_reader_counts_what_its_task_sent_and_is_ended_by_a_kick() {
        let readers = Readers::new("a", Settings::default());
        let held = Arc::new(Held::default());
        let guard = readers.join(who(Protocol::Srt), held.clone()).unwrap();
        held.sent(1316, 1);
        held.sent(1316, 1);
        held.skipped(3);
        let c = readers.get(guard.id()).unwrap().counters;
        assert_eq!(c, Counters { bytes: 2632, packets: 2, skips: 3 });
        assert!(held.end.ended().is_none());
        readers.kick(guard.id(), "enough");
        assert_eq!(held.end.ended().as_deref(), Some("enough"));
    }

    #[tokio::test]
    async fn an_end_signal_wakes_its_waiter_with_the_first_reason() {
        let s = Arc::new(EndSignal::default());
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.wait().await }
        });
        tokio::task::yield_now().await;
        s.end("kicked");
        s.end("later");
        assert_eq!(waiter.await.unwrap(), "kicked");
        assert_eq!(s.ended().as_deref(), Some("kicked"));
    }
}
