//! The sessions made through the API, and the UDP/TCP sinks added to them, kept in a file
//! (`state_file`) so that a restart brings them back. The config's own sessions, the demo,
//! cluster pulls and players (RTSP, HTTP, HLS) are not kept: they come back by themselves.
//!
//! The file is JSON, rewritten whole (to a temporary file, then renamed) after each change,
//! and locked while the relay runs: a second relay given the same file runs without one
//! (saying so) rather than overwrite the first's.

use crate::spec::{SessionSpec, SinkSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

/// One kept session: what was asked for, and its sinks by their current ids.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Kept {
    pub spec: SessionSpec,
    #[serde(default)]
    pub sinks: BTreeMap<u64, SinkSpec>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Contents {
    /// The file's format; a relay refuses a newer one instead of guessing.
    version: u32,
    sessions: Vec<Kept>,
}

const VERSION: u32 = 1;

/// The state file, locked, and what it holds.
pub struct StateFile {
    path: PathBuf,
    /// Held for the relay's life (the lock goes with it), or until an upgrade's new process
    /// takes the file over ([`StateFile::release`]).
    lock: parking_lot::Mutex<Option<File>>,
    kept: parking_lot::Mutex<BTreeMap<String, Kept>>,
}

impl StateFile {
    /// Opens (or starts) the state at `path` and locks it; what it holds is read with
    /// [`StateFile::take`]. `None` when another relay holds it (logged). An unreadable or
    /// foreign file is an error naming it: the relay does not start on top of state it
    /// cannot read, nor overwrite it.
    pub fn open(path: &Path) -> anyhow::Result<Option<Self>> {
        use anyhow::Context as _;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("state file directory {}", dir.display()))?;
        }
        // The lock is taken on a file beside it, so that the state itself can be replaced
        // by a rename.
        let lock_path = path.with_extension("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("state lock {}", lock_path.display()))?;
        // SAFETY: flock on a descriptor we own; it takes no pointers.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            tracing::warn!(
                "state file {} is in use by another relay: this one keeps no state (give it its own with --state-file)",
                path.display()
            );
            return Ok(None);
        }
        let kept = match std::fs::read(path) {
            Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => BTreeMap::new(),
            Ok(bytes) => parse(&bytes).with_context(|| format!("state file {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e).with_context(|| format!("state file {}", path.display())),
        };
        Ok(Some(Self {
            path: path.to_owned(),
            lock: parking_lot::Mutex::new(Some(lock)),
            kept: parking_lot::Mutex::new(kept),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the file held at start, emptied: the caller makes each again and notes it.
    pub fn take(&self) -> Vec<Kept> {
        std::mem::take(&mut *self.kept.lock()).into_values().collect()
    }

    /// Lets the file go to an upgrade's new process: unlocked, never written again from
    /// here; what it keeps now (whose sinks are the new process's from now on).
    pub fn release(&self) -> Vec<Kept> {
        let mut lock = self.lock.lock();
        let kept = self.kept.lock().values().cloned().collect();
        *lock = None;
        kept
    }

    /// Writes what is kept now: after a restore, what could not be made again is gone from
    /// the file too, as the log says.
    pub fn save(&self) {
        if self.lock.lock().is_none() {
            return;
        }
        if let Err(e) = write(&self.path, &self.kept.lock()) {
            tracing::warn!(file = %self.path.display(), "could not write the state file: {e}");
        }
    }

    pub fn session_made(&self, spec: &SessionSpec) {
        self.change(|k| {
            k.insert(spec.name.clone(), Kept { spec: spec.clone(), sinks: BTreeMap::new() });
        });
    }

    pub fn session_deleted(&self, name: &str) {
        self.change(|k| {
            k.remove(name);
        });
    }

    pub fn sink_added(&self, name: &str, id: u64, spec: &SinkSpec) {
        self.change(|k| {
            if let Some(s) = k.get_mut(name) {
                s.sinks.insert(id, spec.clone());
            }
        });
    }

    pub fn sink_removed(&self, name: &str, id: u64) {
        self.change(|k| {
            if let Some(s) = k.get_mut(name) {
                s.sinks.remove(&id);
            }
        });
    }

    pub fn sinks_flushed(&self, name: &str) {
        self.change(|k| {
            if let Some(s) = k.get_mut(name) {
                s.sinks.clear();
            }
        });
    }

    /// Applies a change and writes the file. A write that fails is logged: the relay runs on
    /// (what it serves does not depend on the file), and the next change tries again.
    fn change(&self, f: impl FnOnce(&mut BTreeMap<String, Kept>)) {
        let held = self.lock.lock();
        if held.is_none() {
            return;
        }
        let mut kept = self.kept.lock();
        let before = kept.clone();
        f(&mut kept);
        if *kept == before {
            return;
        }
        if let Err(e) = write(&self.path, &kept) {
            tracing::warn!(file = %self.path.display(), "could not write the state file: {e}");
        }
    }
}

fn parse(bytes: &[u8]) -> anyhow::Result<BTreeMap<String, Kept>> {
    let c: Contents = serde_json::from_slice(bytes)?;
    if c.version != VERSION {
        anyhow::bail!("format version {} (this relay reads {VERSION})", c.version);
    }
    Ok(c.sessions.into_iter().map(|k| (k.spec.name.clone(), k)).collect())
}

fn render(kept: &BTreeMap<String, Kept>) -> Vec<u8> {
    let c = Contents { version: VERSION, sessions: kept.values().cloned().collect() };
    let mut out = serde_json::to_vec_pretty(&c).expect("plain data serializes");
    out.push(b'\n');
    out
}

/// Whole or not at all: a crash mid-write leaves the old file. Readable by the relay's user
/// only: a pull's URL may carry its credentials.
fn write(path: &Path, kept: &BTreeMap<String, Kept>) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("json.tmp");
    let mut f = File::options().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
    f.write_all(&render(kept))?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SourceSpec;

    fn spec(name: &str) -> SessionSpec {
        SessionSpec::new(name, SourceSpec::Udp { addr: "127.0.0.1:5000".parse().unwrap(), interface: None })
    }

    #[test]
    fn changes_are_kept_and_read_back() {
        let dir = std::env::temp_dir().join(format!("fanout-state-{}", std::process::id()));
        let path = dir.join("sessions.json");
        let _ = std::fs::remove_file(&path);
        {
            let s = StateFile::open(&path).unwrap().unwrap();
            assert!(s.take().is_empty());
            s.session_made(&spec("a"));
            s.session_made(&spec("b"));
            let sink = SinkSpec { udp: Some("127.0.0.1:6000".parse().unwrap()), tcp: None };
            s.sink_added("a", 7, &sink);
            s.sink_added("a", 8, &sink);
            s.sink_removed("a", 7);
            s.session_deleted("b");
            // A second relay on the same file is refused while the first runs.
            assert!(StateFile::open(&path).unwrap().is_none());
        }
        let s = StateFile::open(&path).unwrap().unwrap();
        let kept = s.take();
        // Nothing made again: the file says so once saved.
        s.save();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "the owner's only");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].spec, spec("a"));
        assert_eq!(kept[0].sinks.keys().copied().collect::<Vec<_>>(), vec![8]);
        drop(s);
        let s = StateFile::open(&path).unwrap().unwrap();
        assert!(s.take().is_empty(), "what was not made again is gone from the file");
        drop(s);
        // Released (an upgrade): another relay takes it; this one writes no more.
        let s = StateFile::open(&path).unwrap().unwrap();
        s.session_made(&spec("c"));
        assert_eq!(s.release().len(), 1);
        let next = StateFile::open(&path).unwrap().expect("released");
        s.session_deleted("c");
        assert_eq!(next.take().len(), 1, "the old one changed nothing after the release");
        drop((s, next));
        std::fs::write(&path, b"{\"version\": 9, \"sessions\": []}").unwrap();
        let e = format!("{:#}", StateFile::open(&path).err().unwrap());
        assert!(e.contains("sessions.json") && e.contains("version 9"), "{e}");
        std::fs::write(&path, b"{ not json").unwrap();
        assert!(StateFile::open(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
