//! Recordings on disk: the writer a path's recorder hands its files to (a thread of its
//! own, so the repackaging never waits on a disk), and the store that finds, indexes and
//! expires the files a [`Layout`] names. The format and the decisions are
//! [`fanout_proto::container::record`]'s; this is the file system.

use fanout_proto::container::record::{self, FileIndex, Format, Layout, Recorder, Write};
use fanout_proto::container::recordts::TsRecorder;
use fanout_proto::container::repack::{TrackInfo, Unit};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

pub use crate::spec::RecordSpec;

/// Where recordings are, which files are being written, and what reading them may take.
pub struct Store {
    pub layout: Layout,
    open: Mutex<HashSet<PathBuf>>,
    /// Threads for the disk work of listings, playback and retention: a client that stops
    /// reading a download never holds one (it waits in async code between two reads).
    pub disk: crate::workers::Workers,
    /// Downloads and file reads streaming at once, per address and in all.
    pub streams: Arc<crate::admit::Quota>,
    /// TS files' indexes by name, with the length and write time they were made at: a TS
    /// file is read through to be indexed (an MP4's box headers are read each time).
    ts_indexes: Mutex<std::collections::HashMap<String, Indexed>>,
}

/// A file's index, with its length and write time (µs) when it was made.
type Indexed = (u64, i64, Arc<FileIndex>);

/// TS indexes kept at most (then they are dropped and made again as asked).
const TS_INDEXES: usize = 10_000;

/// The disk workers: threads, and reads waiting for one.
const DISK_THREADS: usize = 4;
const DISK_QUEUE: usize = 256;
/// Downloads and file reads streaming at once from one address, and from all.
pub const STREAMS_PER_IP: usize = 4;
pub const STREAMS: usize = 64;

/// A recording file found on disk.
#[derive(Debug, Clone)]
pub struct StoredFile {
    /// As the layout names it (the name the API uses).
    pub name: String,
    pub start_us: i64,
    pub bytes: u64,
    /// Its last write, µs since the epoch.
    pub written_us: i64,
    pub open: bool,
}

/// Directory levels walked below the layout's root.
const MAX_DEPTH: usize = 12;
/// Files listed per path at most.
const MAX_FILES: usize = 100_000;

fn micros(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

pub fn now_us() -> i64 {
    micros(std::time::SystemTime::now())
}

impl Store {
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            open: Mutex::new(HashSet::new()),
            disk: crate::workers::Workers::new("disk", DISK_THREADS, DISK_QUEUE),
            streams: crate::admit::Quota::new(STREAMS_PER_IP, STREAMS),
            ts_indexes: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The recordings of `path` (of every path: `None`), oldest first.
    pub fn files(&self, path: Option<&str>) -> Vec<(String, StoredFile)> {
        let root = self.layout.root().to_string();
        let open = self.open.lock().clone();
        let mut out = Vec::new();
        let mut dirs = vec![(root.clone(), 0)];
        while let Some((dir, depth)) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(if dir.is_empty() { "." } else { &dir }) else { continue };
            for e in entries.flatten() {
                let Some(leaf) = e.file_name().to_str().map(String::from) else { continue };
                let name = format!("{dir}{leaf}");
                let Ok(meta) = e.metadata() else { continue };
                if meta.is_dir() {
                    if depth < MAX_DEPTH {
                        dirs.push((name + "/", depth + 1));
                    }
                    continue;
                }
                let Some((of, start_us)) = self.layout.parse(&name) else { continue };
                if path.is_some_and(|p| p != of) || out.len() >= MAX_FILES {
                    continue;
                }
                let file = StoredFile {
                    open: open.contains(&PathBuf::from(&name)),
                    written_us: meta.modified().map_or(0, micros),
                    bytes: meta.len(),
                    start_us,
                    name,
                };
                out.push((of, file));
            }
        }
        out.sort_by(|a, b| (&a.0, a.1.start_us).cmp(&(&b.0, b.1.start_us)));
        out
    }

    /// The file a request names (as listings give it: below the layout's root) if it is one
    /// of `path`'s recordings: a name is taken only when the layout names it so, with no
    /// `.` or `..` step, so no other file can be asked for.
    pub fn file_of(&self, path: &str, name: &str) -> Option<String> {
        if name.split('/').any(|step| step == "." || step == ".." || step.is_empty()) {
            return None;
        }
        let full = format!("{}{name}", self.layout.root());
        self.layout.parse(&full).is_some_and(|(p, _)| p == path).then_some(full)
    }

    /// A file's name (or a message naming it) as a client is shown it: below the layout's
    /// root, which is the host's business.
    pub fn relative(&self, text: &str) -> String {
        match self.layout.root() {
            "" => text.to_string(),
            root => text.replace(root, ""),
        }
    }

    /// Deletes what `spec`'s retention says of `path`'s files; what it deleted.
    pub fn expire(&self, path: &str, spec: &RecordSpec) -> Vec<String> {
        let files: Vec<StoredFile> = self.files(Some(path)).into_iter().map(|f| f.1).collect();
        let stored: Vec<record::Stored> = files
            .iter()
            .map(|f| record::Stored { start_us: f.start_us, written_us: f.written_us, bytes: f.bytes, open: f.open })
            .collect();
        let keep_us = (spec.keep_s > 0).then(|| spec.keep_s.saturating_mul(1_000_000) as i64);
        let keep_bytes = (spec.keep_mb > 0).then(|| spec.keep_mb.saturating_mul(1 << 20));
        let mut gone = Vec::new();
        for k in record::expired(&stored, now_us(), keep_us, keep_bytes) {
            match std::fs::remove_file(&files[k].name) {
                Ok(()) => gone.push(files[k].name.clone()),
                Err(e) => tracing::warn!(path, file = %files[k].name, "retention could not delete a recording: {e}"),
            }
        }
        gone
    }
}

impl Store {
    /// The fragments of a recording file (MP4 or TS, by its name).
    pub fn index(&self, name: &str) -> std::io::Result<Arc<FileIndex>> {
        let mut f = std::fs::File::open(name)?;
        let meta = f.metadata()?;
        let (len, written) = (meta.len(), meta.modified().map_or(0, micros));
        let invalid =
            |e: fanout_proto::Invalid| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{name}: {e}"));
        if Format::of(name) == Format::Fmp4 {
            return record::scan(len, |at, n| read_at(&mut f, at, n).ok()).map(Arc::new).map_err(invalid);
        }
        if let Some((l, w, ix)) = self.ts_indexes.lock().get(name) {
            if (*l, *w) == (len, written) {
                return Ok(ix.clone());
            }
        }
        let ix = Arc::new(
            fanout_proto::container::recordts::scan(len, |at, n| read_at(&mut f, at, n).ok()).map_err(invalid)?,
        );
        let mut cache = self.ts_indexes.lock();
        if cache.len() >= TS_INDEXES {
            cache.clear();
        }
        cache.insert(name.to_string(), (len, written, ix.clone()));
        Ok(ix)
    }
}

/// Up to `n` bytes of `f` from `at` (fewer only at its end).
pub fn read_at(f: &mut std::fs::File, at: u64, n: usize) -> std::io::Result<Vec<u8>> {
    f.seek(SeekFrom::Start(at))?;
    let mut buf = Vec::with_capacity(n);
    f.take(n as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Where and how a path is recorded.
pub struct RecordTo {
    pub store: Arc<Store>,
    pub spec: RecordSpec,
    /// `run_on_record_segment_complete` and the path's hook environment.
    pub on_complete: Option<(String, Vec<(&'static str, String)>)>,
}

/// A path's recorder, as its repackaging holds it: units go in; its writer thread writes.
pub struct Recording {
    rec: Mutex<(Rec, Vec<Write>)>,
    tx: std::sync::mpsc::Sender<Write>,
}

impl Recording {
    /// Starts recording `path`'s `streams` as `to` says; `None` where its format carries
    /// none of them. Its `on_complete` command runs on the runtime this is called on.
    /// `fmp4_skip`: a stream fMP4 files leave out (of a source track and the one the relay
    /// made from it, the one browsers do not play).
    pub fn start(to: RecordTo, path: &str, streams: &[TrackInfo], fmp4_skip: Option<usize>) -> Option<Self> {
        let (fragment_ms, segment_s) = (to.spec.fragment_ms, to.spec.segment_s);
        let rec = match to.spec.format {
            Format::Fmp4 => {
                let mut r = Recorder::new(streams, fragment_ms, segment_s)?;
                if let Some(i) = fmp4_skip {
                    r.leave_out(i);
                }
                Rec::Fmp4(Box::new(r))
            }
            Format::MpegTs => Rec::Ts(Box::new(TsRecorder::new(streams, fragment_ms, segment_s)?)),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let (store, path) = (to.store, path.to_string());
        let hook = to.on_complete.map(|h| (h, tokio::runtime::Handle::current()));
        std::thread::Builder::new()
            .name("fanout-record".into())
            .spawn(move || write_files(&store, &path, rx, hook))
            .ok()?;
        Some(Self { rec: Mutex::new((rec, Vec::new())), tx })
    }

    pub fn push(&self, u: &Unit) {
        let mut guard = self.rec.lock();
        let (rec, out) = &mut *guard;
        match rec {
            Rec::Fmp4(r) => r.push(u, now_us(), out),
            Rec::Ts(r) => r.push(u, now_us(), out),
        }
        for w in out.drain(..) {
            let _ = self.tx.send(w);
        }
    }

    /// The stream ended: the file is completed; the next publisher starts a new one.
    pub fn finish(&self) {
        let mut guard = self.rec.lock();
        let (rec, out) = &mut *guard;
        match rec {
            Rec::Fmp4(r) => r.finish(now_us(), out),
            Rec::Ts(r) => r.finish(now_us(), out),
        }
        for w in out.drain(..) {
            let _ = self.tx.send(w);
        }
    }
}

/// The recorder of a recording's format.
enum Rec {
    Fmp4(Box<Recorder>),
    Ts(Box<TsRecorder>),
}

/// A command run for each completed file, its environment, and the runtime it runs on.
type OnComplete = ((String, Vec<(&'static str, String)>), tokio::runtime::Handle);

/// The writer: opens, appends to and closes the files `rx` asks for, until the recording
/// is dropped. Each fragment is written whole with one call, so a file cut short by a
/// crash holds whole fragments up to its last; a failing disk is logged once a file.
fn write_files(store: &Store, path: &str, rx: std::sync::mpsc::Receiver<Write>, hook: Option<OnComplete>) {
    use std::io::Write as _;
    let mut file: Option<(String, Option<std::fs::File>)> = None;
    let close = |file: &mut Option<(String, Option<std::fs::File>)>| {
        let Some((name, written)) = file.take() else { return };
        store.open.lock().remove(&PathBuf::from(&name));
        tracing::info!(path, file = %name, "recording file complete");
        if let (Some(((cmd, env), rt)), Some(_)) = (&hook, written) {
            let duration = store.index(&name).map_or(0.0, |ix| ix.duration_us() as f64 / 1e6);
            let start = store.layout.parse(&name).map_or(0, |(_, s)| s);
            let mut env = env.clone();
            env.push(("FANOUT_SEGMENT_PATH", name.clone()));
            env.push(("FANOUT_SEGMENT_START", record::rfc3339(start)));
            env.push(("FANOUT_SEGMENT_DURATION", format!("{duration:.3}")));
            let (cmd, path) = (cmd.clone(), path.to_string());
            rt.spawn(async move { crate::hook::Hook::once("run_on_record_segment_complete", &cmd, &path, &env) });
        }
    };
    for w in rx {
        match w {
            Write::Open { start_us, init, format } => {
                close(&mut file);
                let name = store.layout.file(path, start_us, format);
                let made = std::path::Path::new(&name)
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::OpenOptions::new().create_new(true).append(true).open(&name))
                    .and_then(|mut f| f.write_all(&init).map(|()| f));
                match made {
                    Ok(f) => {
                        store.open.lock().insert(PathBuf::from(&name));
                        file = Some((name, Some(f)));
                    }
                    Err(e) => {
                        tracing::warn!(path, file = %name, "cannot record: {e}");
                        file = Some((name, None));
                    }
                }
            }
            Write::Append(data) => {
                if let Some((name, Some(f))) = file.as_mut() {
                    if let Err(e) = f.write_all(&data) {
                        tracing::warn!(path, file = %name, "recording stopped writing this file: {e}");
                        file.as_mut().expect("open").1 = None;
                    }
                }
            }
            Write::Close => close(&mut file),
        }
    }
    close(&mut file);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_lists_a_paths_files_by_their_names_and_retention_deletes_the_oldest() {
        let root = std::env::temp_dir().join(format!("fanout-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let layout = Layout::new(&format!("{}/%path/%Y-%m-%d_%H-%M-%S-%f", root.display())).unwrap();
        let t0 = record::parse_rfc3339("2026-11-27T10:00:00Z").unwrap();
        let write = |path: &str, t: i64, bytes: usize| {
            let name = layout.file(path, t, Format::Fmp4);
            std::fs::create_dir_all(std::path::Path::new(&name).parent().unwrap()).unwrap();
            std::fs::write(&name, vec![0u8; bytes]).unwrap();
            name
        };
        let first = write("live/cam1", t0, 2 << 20);
        let second = write("live/cam1", t0 + 60_000_000, 2 << 20);
        write("other", t0, 10);
        std::fs::write(root.join("live/cam1/notes.txt"), b"not a recording").unwrap();
        let store = Store::new(layout);
        let cam: Vec<String> = store.files(Some("live/cam1")).into_iter().map(|f| f.1.name).collect();
        assert_eq!(cam, vec![first.clone(), second.clone()], "oldest first, and only the layout's names");
        assert_eq!(store.files(None).len(), 3);
        let shown = store.relative(&second);
        assert_eq!(shown, "live/cam1/2026-11-27_10-01-00-000000.mp4", "below the root, which is the host's");
        assert_eq!(store.file_of("live/cam1", &shown), Some(second.clone()));
        assert_eq!(store.file_of("other", &shown), None, "another path's file");
        assert_eq!(store.file_of("live/cam1", "live/cam1/../other/x.mp4"), None);
        let spec = RecordSpec { keep_s: 0, keep_mb: 3, ..RecordSpec::default() };
        assert_eq!(store.expire("live/cam1", &spec), vec![first.clone()], "over 3 MB: the oldest goes");
        assert!(!std::path::Path::new(&first).exists() && std::path::Path::new(&second).exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
