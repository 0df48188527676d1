//! A path's forwards run as its tasks: each waits for the path's stream, joins it as a
//! reader, and pushes it (`crate::forward`) until it ends or fails, then again after a
//! backoff.

use super::Relay;
use crate::dial::dial;
use crate::forward::{next_backoff, push, Target, SETUP};
use crate::readers::{Held, Protocol, Who};
use crate::repack::Repack;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Pushes path `name` to `target` for as long as the path lives (the task is the path's:
/// it is aborted with it).
///
/// (Boxed, and `Send` said outright: a path made on demand starts its forwards from inside
/// the call that made it, a cycle in which the compiler cannot see the future is `Send`.)
pub fn run(
    relay: Weak<Relay>,
    name: String,
    target: Arc<Target>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(run_target(relay, name, target))
}

async fn run_target(relay: Weak<Relay>, name: String, target: Arc<Target>) {
    let mut backoff = Duration::ZERO;
    loop {
        let Some((repack, held, registered)) = wait_for_stream(&relay, &name, &target).await else { return };
        target.set_state("connecting");
        let shown = target.url.shown();
        let mut pushed = false;
        let why = match dial(&target.url.host, target.url.port, target.tls.as_ref(), SETUP).await {
            Ok((mut io, _)) => {
                let Err(why) = push(&mut io, &target, &repack, &held, &mut pushed).await;
                let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
                why
            }
            Err(e) => e,
        };
        // The path ended the reader (its stream ended, or a kick): not the target's failure.
        let by_path = held.end.ended().is_some();
        drop(registered);
        drop(repack);
        backoff = next_backoff(backoff, pushed || by_path);
        if by_path {
            tracing::info!(path = name, url = %shown, "forward: {why}; again in {backoff:?}");
        } else {
            tracing::warn!(path = name, url = %shown, "forward: {why}; again in {backoff:?}");
            target.failed(&why);
        }
        target.set_state("retrying");
        tokio::time::sleep(backoff).await;
    }
}

/// Waits until the path has a stream FLV carries, and joins it as a reader. `None`: the
/// relay or the path went.
async fn wait_for_stream(
    relay: &Weak<Relay>,
    name: &str,
    target: &Target,
) -> Option<(Arc<Repack>, Arc<Held>, crate::readers::Registered)> {
    loop {
        let changes = {
            let relay = relay.upgrade()?;
            // (The task starts before its path is listed; it is aborted when the path goes.)
            let Some(path) = relay.path(name) else {
                drop(relay);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let publisher = path.publisher().cloned();
            // (Subscribed before the look, so a publisher that comes right after is seen.)
            let changes = publisher.as_ref().map(|p| p.changes());
            let publishing = publisher.as_ref().is_none_or(|p| p.sdp().is_some());
            if publishing {
                let why = match relay.repack(name).await {
                    Ok(r) if r.flv.is_some() => {
                        let held = Arc::new(Held::default());
                        let who = Who::new(Protocol::Forward, None, None);
                        match path.readers.join(who, held.clone()) {
                            Ok(registered) => return Some((r, held, registered)),
                            Err(full) => full.to_string(),
                        }
                    }
                    Ok(r) => format!("the stream's tracks do not go in FLV ({})", r.describes),
                    Err(e) => e.to_string(),
                };
                target.waiting(why);
            }
            changes
        };
        target.set_state("waiting");
        // Woken when a publisher comes or goes; another source is tried again every 5 s.
        match changes {
            Some(mut c) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), c.changed()).await;
            }
            None => tokio::time::sleep(Duration::from_secs(5)).await,
        }
    }
}
