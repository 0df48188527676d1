//! A binary upgrade without dropping anyone (`fanout ctl upgrade`, `POST /v1/upgrade`,
//! SIGUSR2), the way nginx and pingora do it: the running process starts the binary at its
//! own path again, with the same arguments, and hands it its listening sockets (inherited
//! descriptors, named in the environment). Once the new process serves on them it says
//! `ready`; the old one then stops accepting (its copies closed: what waits in the kernel's
//! queues is the new one's), lets go of what only one process can hold (the SRT and WebRTC
//! ports, the state file and the UDP/TCP sinks it keeps) and answers `released`. The old
//! process then drains: every connection it has (RTSP readers over UDP or TCP, RTSPS,
//! HTTP streams, RTMP) plays on from it, untouched, until it ends or `upgrade_drain_s`
//! passes; then it exits. A new process that fails to start changes nothing.
//!
//! The exchange is two lines on a socket pair: `ready PID` from the new process, then
//! `released {json}` (the SRT and WebRTC addresses to bind again) from the old.

use crate::handover::UpgradeFailed;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

/// Names the inherited listening sockets: `api=5,rtsp=6`.
const LISTENERS_ENV: &str = "FANOUT_UPGRADE_LISTENERS";
/// The new process's end of the socket pair.
const CHANNEL_ENV: &str = "FANOUT_UPGRADE_CHANNEL";
/// How long a new process may take to serve (it loads the eBPF program, binds, starts the
/// config's sessions).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// What the old process let go of, for the new one to take.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Released {
    pub srt: Option<SocketAddr>,
    pub webrtc: Option<SocketAddr>,
    /// Sinks added through the API to the config's sessions (those of the API's own
    /// sessions come with the state file): (path, sink).
    #[serde(default)]
    pub sinks: Vec<(String, crate::spec::SinkSpec)>,
}

/// The listening sockets this process serves on, by name: duplicates kept to hand over.
#[derive(Default)]
pub struct Sockets(parking_lot::Mutex<Vec<(&'static str, OwnedFd)>>);

impl Sockets {
    pub fn keep(&self, name: &'static str, l: &tokio::net::TcpListener) {
        match l.as_fd().try_clone_to_owned() {
            Ok(fd) => self.0.lock().push((name, fd)),
            Err(e) => tracing::warn!("the {name} listener cannot be kept for an upgrade: {e}"),
        }
    }
}

/// A new process, started and serving, waiting for `released`.
pub struct NewProcess {
    pub pid: u32,
    channel: tokio::net::UnixStream,
}

/// Starts the binary at this process's path with its arguments and `sockets`, and waits
/// until it serves. Its log goes where this one's goes.
pub async fn start(sockets: &Sockets) -> Result<NewProcess, UpgradeFailed> {
    let exe = executable()?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| format!("socket pair: {e}"))?;
    let fds: Vec<(&'static str, RawFd)> = sockets.0.lock().iter().map(|(n, fd)| (*n, fd.as_raw_fd())).collect();
    let names = fds.iter().map(|(n, fd)| format!("{n}={fd}")).collect::<Vec<_>>().join(",");
    let mut inherit: Vec<RawFd> = fds.iter().map(|(_, fd)| *fd).collect();
    inherit.push(theirs.as_raw_fd());
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(std::env::args_os().skip(1))
        .env(LISTENERS_ENV, names)
        .env(CHANNEL_ENV, theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null());
    // SAFETY: between fork and exec, only fcntl (async-signal-safe) on descriptors this
    // process owns: they stay open across the exec, as the child's copies.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            for fd in &inherit {
                if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    drop(theirs);
    let pid = child.id();
    tracing::info!(pid, binary = %exe.display(), "upgrade: the new process started; waiting until it serves");
    ours.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut channel = tokio::net::UnixStream::from_std(ours).map_err(|e| e.to_string())?;
    let line = tokio::time::timeout(READY_WITHIN, read_line(&mut channel)).await;
    match line {
        Ok(Some(l)) if l.starts_with("ready ") => Ok(NewProcess { pid, channel }),
        other => {
            // One that said nothing in time is ended; one that closed the channel is ending.
            if other.is_err() {
                let _ = child.kill();
            }
            let status =
                tokio::time::timeout(Duration::from_secs(5), tokio::task::spawn_blocking(move || child.wait()));
            let status = status.await.ok().and_then(Result::ok).and_then(Result::ok);
            let why = match other {
                Err(_) => format!("it did not serve within {READY_WITHIN:?}"),
                _ => format!("it ended ({}); its log says why", status.map_or("?".to_string(), |s| s.to_string())),
            };
            Err(format!("the new process {pid} did not take over, this one serves on: {why}").into())
        }
    }
}

impl NewProcess {
    /// Tells the new process what it may take now.
    pub async fn released(mut self, what: &Released) -> Result<(), UpgradeFailed> {
        let line = format!("released {}\n", serde_json::to_string(what).expect("plain data"));
        self.channel
            .write_all(line.as_bytes())
            .await
            .map_err(|e| UpgradeFailed(format!("telling the new process: {e}")))
    }
}

/// The path this process was started from, as it was started (see [`remember_binary`]).
static STARTED_AS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Notes the path this process was started from, before anything can move it: the path
/// it was run by (a symlink stays a symlink), made absolute; where it was found on `PATH`,
/// the binary the kernel ran. Call at the start.
pub fn remember_binary() {
    let by_name = std::env::args_os().next().map(std::path::PathBuf::from).filter(|p| p.components().count() > 1);
    let path = match by_name {
        Some(p) if p.is_absolute() => Some(p),
        Some(p) => std::env::current_dir().ok().map(|d| d.join(p)),
        None => std::env::current_exe().ok(),
    };
    if let Some(p) = path {
        let _ = STARTED_AS.set(p);
    }
}

/// This process's binary: the file at the path it was started from, which a package
/// upgrade has replaced (or an operator moved aside and put another in its place: the
/// kernel's name for this process's binary follows the moved file, this does not).
fn executable() -> Result<std::path::PathBuf, UpgradeFailed> {
    if let Some(p) = STARTED_AS.get() {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let s = exe.to_string_lossy();
    Ok(s.strip_suffix(" (deleted)").map_or(exe.clone(), std::path::PathBuf::from))
}

async fn read_line(c: &mut tokio::net::UnixStream) -> Option<String> {
    let mut line = String::new();
    let n = BufReader::new(c).read_line(&mut line).await.ok()?;
    (n > 0).then(|| line.trim_end().to_string())
}

/// The new process's side: what the old one handed over.
pub struct Inherited {
    listeners: HashMap<String, OwnedFd>,
    channel: Option<std::os::unix::net::UnixStream>,
}

impl Inherited {
    /// Read from the environment (then cleared, so hooks do not see it): nothing for a
    /// process that is not an upgrade. Call before any thread starts.
    pub fn from_env() -> Self {
        let mut listeners = HashMap::new();
        let mut channel = None;
        if let Ok(names) = std::env::var(LISTENERS_ENV) {
            for (name, fd) in names.split(',').filter_map(|p| p.split_once('=')) {
                if let Some(fd) = fd.parse::<RawFd>().ok().and_then(owned) {
                    listeners.insert(name.to_string(), fd);
                }
            }
        }
        if let Some(fd) = std::env::var(CHANNEL_ENV).ok().and_then(|f| f.parse::<RawFd>().ok()).and_then(owned) {
            channel = Some(std::os::unix::net::UnixStream::from(fd));
        }
        std::env::remove_var(LISTENERS_ENV);
        std::env::remove_var(CHANNEL_ENV);
        Self { listeners, channel }
    }

    /// Whether this process takes over from another.
    pub fn upgrading(&self) -> bool {
        self.channel.is_some()
    }

    /// The inherited listener `name`, if the configuration still puts it where it was (the
    /// same address, or any port where port 0 is asked for); else `None`, and it is bound
    /// anew (the old one's closes with it).
    pub fn listener(&mut self, name: &str, wanted: SocketAddr) -> Option<tokio::net::TcpListener> {
        let fd = self.listeners.remove(name)?;
        let l = std::net::TcpListener::from(fd);
        let at = l.local_addr().ok()?;
        if at != wanted && !(wanted.port() == 0 && at.ip() == wanted.ip()) {
            tracing::info!(name, %at, %wanted, "upgrade: the listener moved; the old address is let go");
            return None;
        }
        l.set_nonblocking(true).ok()?;
        tokio::net::TcpListener::from_std(l).ok()
    }

    /// Tells the old process this one serves, and waits (bounded) for what it lets go.
    pub async fn ready(&mut self) -> Released {
        // A listener the configuration no longer has is closed here too (its connections
        // would wait in a queue nobody accepts from).
        self.listeners.clear();
        let Some(c) = self.channel.take() else { return Released::default() };
        let talk = async move {
            c.set_nonblocking(true).ok()?;
            let mut c = tokio::net::UnixStream::from_std(c).ok()?;
            c.write_all(format!("ready {}\n", std::process::id()).as_bytes()).await.ok()?;
            let line = read_line(&mut c).await?;
            serde_json::from_str::<Released>(line.strip_prefix("released ")?).ok()
        };
        match tokio::time::timeout(Duration::from_secs(30), talk).await {
            Ok(Some(r)) => r,
            _ => {
                tracing::warn!("upgrade: the old process did not say what it let go; binding as configured");
                Released::default()
            }
        }
    }
}

/// `fd` as owned, close-on-exec again (hooks and commands do not get it), if it is open.
fn owned(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: fcntl on a descriptor number; F_GETFD fails on one that is not open.
    unsafe {
        if libc::fcntl(fd, libc::F_GETFD) < 0 {
            return None;
        }
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        Some(OwnedFd::from_raw_fd(fd))
    }
}

/// Tells systemd (when it started us with `NotifyAccess=`) that this process is the
/// service's main process now and serving.
pub fn notify_main_pid() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else { return };
    let msg = format!("MAINPID={}\nREADY=1\n", std::process::id());
    if let Err(e) = sock.send_to(msg.as_bytes(), &path) {
        tracing::warn!("telling systemd the new main process: {e}");
    }
}

/// The old process's drain: until no client is left (no connection open, no HTTP stream
/// or sink on any session), or `drain` passed.
pub async fn drain(relay: &crate::relay::Relay, drain: Duration) {
    let until = tokio::time::Instant::now() + drain;
    let mut told = tokio::time::Instant::now();
    let mut left = clients(relay);
    while left.0 > 0 && tokio::time::Instant::now() < until {
        if told.elapsed() >= Duration::from_secs(10) {
            told = tokio::time::Instant::now();
            tracing::info!(left = left.0, "upgrade: draining: {}", left.1);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = clients(relay);
    }
    match left.0 {
        0 => tracing::info!("upgrade: drained, every client left; exiting"),
        n => tracing::info!(left = n, "upgrade: upgrade_drain_s passed; closing the rest and exiting: {}", left.1),
    }
}

/// How many clients this process serves: connections open, and sinks on every session
/// (HTTP streams outlive their accepting task; UDP and TCP sinks have no connection), but
/// not the relay's own (repackaging); and where they are, for the log.
pub fn clients(relay: &crate::relay::Relay) -> (usize, String) {
    let mut per_path = Vec::new();
    let mut sinks = 0;
    for p in relay.paths() {
        let mut sessions: Vec<fanout_io::Session> = p.tracks().into_iter().map(|t| t.session).collect();
        if !sessions.iter().any(|s| s.is(&p.session)) {
            sessions.push(p.session.clone());
        }
        let n: usize = sessions
            .iter()
            .map(|s| s.sinks().iter().filter(|k| !matches!(k.target, fanout_io::SinkTarget::Local(_))).count())
            .sum();
        if n > 0 {
            per_path.push(format!("{} {n}", p.name));
        }
        sinks += n;
    }
    let open = relay.books.open();
    (open + sinks, format!("{open} connections; sinks: {}", per_path.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener the old process handed over, as the new one inherits it.
    fn inherited(name: &str) -> (Inherited, SocketAddr) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let listeners = HashMap::from([(name.to_string(), OwnedFd::from(l))]);
        (Inherited { listeners, channel: None }, at)
    }

    #[tokio::test]
    async fn an_inherited_listener_is_taken_where_the_config_still_puts_it() {
        let (mut i, at) = inherited("api");
        assert!(!i.upgrading(), "no channel: not an upgrade");
        assert_eq!(i.listener("api", at).unwrap().local_addr().unwrap(), at);
        assert!(i.listener("api", at).is_none(), "taken once");
        let (mut i, at) = inherited("rtmp");
        let any_port = SocketAddr::new(at.ip(), 0);
        assert_eq!(i.listener("rtmp", any_port).unwrap().local_addr().unwrap(), at, "port 0: the one it has");
        let (mut i, at) = inherited("rtsp");
        let moved = SocketAddr::new(at.ip(), at.port().wrapping_add(1).max(1));
        assert!(i.listener("rtsp", moved).is_none(), "moved: bound anew, the old one let go");
        assert!(i.listener("srt", at).is_none(), "none handed over under that name");
    }
}
