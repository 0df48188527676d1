//! A command the relay runs for a path (`run_on_demand`, `run_on_ready`, `run_on_read`, …):
//! `sh -c` with the path's names in its environment (or, given as a list, a program and its
//! arguments with no shell: `on_read`, `on_unread`), its output logged line by line under
//! the path and the hook's name, stopped (and reaped) when the path no longer wants it, or
//! waited for (a hook that runs once).

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::io::{AsyncBufReadExt, BufReader};

pub struct Hook {
    child: tokio::process::Child,
    path: String,
    kind: &'static str,
}

/// A hook that runs once is stopped if it takes longer than this.
const ONCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Hooks that run once, at most at a time: readers and publishers that come and go as fast as
/// a client can connect must not make processes as fast (the next are skipped, and told).
const ONCE_AT_ONCE: usize = 64;
static ONCE_RUNNING: AtomicUsize = AtomicUsize::new(0);
static ONCE_SKIPPED: AtomicU64 = AtomicU64::new(0);
static ONCE_TOLD: parking_lot::Mutex<Option<std::time::Instant>> = parking_lot::Mutex::new(None);

/// A place among the hooks running once, given back when dropped.
struct OncePlace;

impl OncePlace {
    fn take() -> Option<OncePlace> {
        let n = ONCE_RUNNING.fetch_add(1, Ordering::Relaxed);
        if n < ONCE_AT_ONCE {
            return Some(OncePlace);
        }
        ONCE_RUNNING.fetch_sub(1, Ordering::Relaxed);
        ONCE_SKIPPED.fetch_add(1, Ordering::Relaxed);
        let mut told = ONCE_TOLD.lock();
        if told.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(10)) {
            *told = Some(std::time::Instant::now());
            let skipped = ONCE_SKIPPED.swap(0, Ordering::Relaxed);
            tracing::warn!(
                skipped,
                "{ONCE_AT_ONCE} hooks already running: the next ones are skipped (told every 10 s)"
            );
        }
        None
    }
}

impl Drop for OncePlace {
    fn drop(&mut self) {
        ONCE_RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Hook {
    /// Starts `cmd`, the hook `kind` of `path`, with `env` set.
    pub fn spawn(kind: &'static str, cmd: &str, path: &str, env: &[(&str, String)]) -> std::io::Result<Hook> {
        Self::spawn_argv(kind, &["sh", "-c", cmd], path, env)
    }

    /// Starts the program `argv[0]` with the rest as its arguments, no shell.
    pub fn spawn_argv<S: AsRef<str>>(
        kind: &'static str,
        argv: &[S],
        path: &str,
        env: &[(&str, String)],
    ) -> std::io::Result<Hook> {
        let (program, args) = argv.split_first().ok_or_else(|| std::io::Error::other("no program"))?;
        let cmd = argv.iter().map(AsRef::as_ref).collect::<Vec<&str>>().join(" ");
        let mut child = tokio::process::Command::new(program.as_ref())
            .args(args.iter().map(AsRef::as_ref))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        tracing::info!(path, pid = child.id(), "{kind} started: {cmd}");
        let out = child.stdout.take().map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
        let err = child.stderr.take().map(|e| Box::new(e) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
        for stream in [out, err].into_iter().flatten() {
            let path = path.to_string();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(path, "{kind}: {line}");
                }
            });
        }
        Ok(Hook { child, path: path.to_string(), kind })
    }

    /// Whether the command still runs (its exit, if it ended, is logged).
    pub fn running(&mut self) -> bool {
        match self.child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                tracing::warn!(path = self.path, "{} ended by itself: {status}", self.kind);
                false
            }
            Err(_) => false,
        }
    }

    /// Stops the command and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
        tracing::info!(path = self.path, "{} stopped", self.kind);
    }

    /// Runs `cmd` once, in the background: its exit is logged; one that runs past
    /// `ONCE_LIMIT` is stopped. Must be called within the runtime.
    pub fn once(kind: &'static str, cmd: &str, path: &str, env: &[(&str, String)]) {
        Self::once_argv(kind, &["sh", "-c", cmd], path, env)
    }

    /// [`Hook::once`] of a program and its arguments, no shell.
    pub fn once_argv<S: AsRef<str>>(kind: &'static str, argv: &[S], path: &str, env: &[(&str, String)]) {
        let Some(place) = OncePlace::take() else { return };
        match Hook::spawn_argv(kind, argv, path, env) {
            Ok(mut h) => {
                tokio::spawn(async move {
                    let _place = place;
                    match tokio::time::timeout(ONCE_LIMIT, h.child.wait()).await {
                        Ok(Ok(status)) if status.success() => tracing::info!(path = h.path, "{kind} done"),
                        Ok(Ok(status)) => tracing::warn!(path = h.path, "{kind} failed: {status}"),
                        Ok(Err(e)) => tracing::warn!(path = h.path, "{kind}: {e}"),
                        Err(_) => {
                            tracing::warn!(path = h.path, "{kind} still ran after {ONCE_LIMIT:?}: stopped");
                            h.stop().await;
                        }
                    }
                });
            }
            Err(e) => tracing::warn!(path, "{kind} could not start: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_more_than_a_bounded_number_of_hooks_run_at_once() {
        let places: Vec<OncePlace> = std::iter::from_fn(OncePlace::take).take(ONCE_AT_ONCE + 10).collect();
        assert_eq!(places.len(), ONCE_AT_ONCE);
        assert!(OncePlace::take().is_none());
        drop(places);
        assert!(OncePlace::take().is_some(), "places are given back");
    }
}
