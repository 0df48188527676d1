//! The hooks of a path's life: `run_on_ready` runs while the path has its stream (packets
//! came in within the last `QUIET`), `run_on_not_ready` once when the stream goes (or the
//! path with it), `run_on_read` while anyone reads it, `on_read` / `on_unread` once per
//! reader as it comes and goes, `on_publish` / `on_unpublish` once per publisher,
//! `on_forward_start` / `on_forward_stop` once per push of a `forward` target. One task
//! looks at every path twice a second (and sweeps its readers' registry); the commands are
//! `crate::hook`'s.

use crate::hook::Hook;
use crate::relay::Relay;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often paths are looked at.
const TICK: Duration = Duration::from_millis(500);
/// A stream that brought nothing for this long is not ready (a publisher gone, an upstream
/// silent).
const QUIET: Duration = Duration::from_secs(2);

/// What the watcher knows of one path.
#[derive(Default)]
struct Watched {
    /// The packets counted at the last look, and when the count last moved.
    received: Option<u64>,
    moved: Option<Instant>,
    ready: bool,
    on_ready: Option<Hook>,
    on_read: Option<Hook>,
    /// The command that runs when the stream goes, kept for a path that goes with it.
    on_not_ready: Option<String>,
}

impl Watched {
    /// A look at the path's packet count at `now`: whether its stream is ready (the count
    /// moved within `QUIET`). The first look only learns the count.
    fn look(&mut self, received: u64, now: Instant) -> bool {
        if self.received.is_some_and(|r| r != received) {
            self.moved = Some(now);
        }
        self.received = Some(received);
        self.moved.is_some_and(|t| now.duration_since(t) < QUIET)
    }
}

pub async fn run_hooks(relay: Arc<Relay>) {
    let mut watched: HashMap<String, Watched> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    loop {
        tick.tick().await;
        let mut seen = Vec::new();
        for path in relay.paths() {
            path.reader_hooks();
            let spec = path.spec();
            for p in path.publisher().map(|p| p.take_events()).unwrap_or_default() {
                let (kind, cmd) = match p.ended {
                    None => ("on_publish", &spec.on_publish),
                    Some(_) => ("on_unpublish", &spec.on_unpublish),
                };
                if let Some(cmd) = cmd {
                    let mut env = relay.hook_env(&path.name);
                    env.extend(p.env());
                    Hook::once_argv(kind, cmd, &path.name, &env);
                }
            }
            for e in path.forwards.iter().flat_map(|f| f.take_events()) {
                let cmd = if e.ended.is_some() { &spec.on_forward_stop } else { &spec.on_forward_start };
                if let Some(cmd) = cmd {
                    let mut env = relay.hook_env(&path.name);
                    env.extend(e.env());
                    Hook::once_argv(e.kind(), cmd, &path.name, &env);
                }
            }
            if spec.run_on_ready.is_none() && spec.run_on_not_ready.is_none() && spec.run_on_read.is_none() {
                continue;
            }
            let name = path.name.clone();
            seen.push(name.clone());
            let w = watched.entry(name.clone()).or_default();
            w.on_not_ready = spec.run_on_not_ready.clone();
            let ready = w.look(path.received(), Instant::now());
            if ready && !w.ready {
                tracing::info!(path = name, "the stream is ready");
                if let Some(cmd) = &spec.run_on_ready {
                    w.on_ready = start("run_on_ready", cmd, &name, &relay);
                }
            } else if !ready && w.ready {
                tracing::info!(path = name, "the stream is not ready");
                not_ready(w, &name, &relay).await;
            }
            w.ready = ready;
            let reading = path.readers.len() > 0;
            match (&spec.run_on_read, w.on_read.is_some(), reading) {
                (Some(cmd), false, true) => w.on_read = start("run_on_read", cmd, &name, &relay),
                (_, true, false) => {
                    if let Some(h) = w.on_read.take() {
                        h.stop().await;
                    }
                }
                _ => {}
            }
            // A command that ended by itself is not started again until its cause comes
            // again (the stream, a first reader).
            for h in [&mut w.on_ready, &mut w.on_read] {
                if h.as_mut().is_some_and(|h| !h.running()) {
                    *h = None;
                }
            }
        }
        // Paths gone (deleted, reloaded away): their commands stop, and a stream that was
        // ready is not any more.
        let gone: Vec<String> = watched.keys().filter(|k| !seen.contains(k)).cloned().collect();
        for name in gone {
            let mut w = watched.remove(&name).expect("listed");
            if w.ready {
                not_ready(&mut w, &name, &relay).await;
            }
            if let Some(h) = w.on_read.take() {
                h.stop().await;
            }
        }
    }
}

fn start(kind: &'static str, cmd: &str, name: &str, relay: &Relay) -> Option<Hook> {
    Hook::spawn(kind, cmd, name, &relay.hook_env(name))
        .map_err(|e| tracing::warn!(path = name, "{kind} could not start: {e}"))
        .ok()
}

/// The stream went: `run_on_ready` stops, `run_on_not_ready` runs once.
async fn not_ready(w: &mut Watched, name: &str, relay: &Relay) {
    if let Some(h) = w.on_ready.take() {
        h.stop().await;
    }
    if let Some(cmd) = &w.on_not_ready {
        Hook::once("run_on_not_ready", cmd, name, &relay.hook_env(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_ready_while_its_packets_move_and_not_after_a_quiet_spell() {
        let t0 = Instant::now();
        let mut w = Watched::default();
        assert!(!w.look(100, t0), "the first look only learns the count");
        assert!(!w.look(100, t0 + Duration::from_millis(500)), "nothing moved");
        assert!(w.look(180, t0 + Duration::from_secs(1)));
        assert!(w.look(180, t0 + Duration::from_secs(1) + QUIET - Duration::from_millis(1)));
        assert!(!w.look(180, t0 + Duration::from_secs(1) + QUIET), "quiet for QUIET: not ready");
        assert!(w.look(181, t0 + Duration::from_secs(9)), "moving again");
    }
}
