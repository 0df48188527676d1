//! A path's forwards run as its tasks: each waits for the path's stream, joins it as a
//! reader, and pushes it (`crate::forward`) until it ends or fails, then again after a
//! backoff.

use super::Relay;
use crate::dial::dial;
use crate::forward::{next_backoff, push, push_rtsp, push_srt, push_whip, Target, Via, SETUP};
use crate::readers::{Held, Protocol, Who};
use crate::repack::Repack;
use crate::source::StopOnDrop;
use std::sync::atomic::AtomicBool;
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
        let Some(Joined { media, held, registered }) = wait_for_stream(&relay, &name, &target).await else { return };
        target.set_state("connecting");
        let shown = target.shown.clone();
        let mut pushed = false;
        let why = match (&target.via, media) {
            (Via::Rtmp { url, tls }, Media::Flv(repack)) => {
                match dial(&url.host, url.port, tls.as_ref(), SETUP).await {
                    Ok((mut io, _)) => {
                        let Err(why) = push(&mut io, url, &target, &repack, &held, &mut pushed).await;
                        let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
                        why
                    }
                    Err(e) => e,
                }
            }
            (Via::Rtsp { url, tls }, Media::Rtp { sdp, tracks }) => {
                match dial(&url.host, url.port, tls.as_ref(), SETUP).await {
                    Ok((mut io, _)) => {
                        let Err(why) = push_rtsp(&mut io, url, sdp, &tracks, &target, &held, &mut pushed).await;
                        let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
                        why
                    }
                    Err(e) => e,
                }
            }
            (Via::Srt(url), Media::Ts(session)) => {
                let latency = relay.upgrade().map_or(120, |r| r.cfg().srt_latency_ms);
                let (url, target, held) = (url.clone(), target.clone(), held.clone());
                blocking(&mut pushed, move |stop, pushed| {
                    push_srt(&url, latency, &target, &session, &held, stop, pushed)
                })
                .await
            }
            (Via::Whip { url, tls }, Media::Rtp { sdp, tracks }) => {
                let (url, tls, target, held) = (url.clone(), tls.clone(), target.clone(), held.clone());
                blocking(&mut pushed, move |stop, pushed| {
                    push_whip(&url, tls.as_ref(), &sdp, &tracks, &target, &held, stop, pushed)
                })
                .await
            }
            _ => unreachable!("a target joins with the media it pushes"),
        };
        // The path ended the reader (its stream ended, or a kick): not the target's failure.
        let by_path = held.end.ended().is_some();
        target.ended(&why, !by_path);
        drop(registered);
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

/// Runs a push that blocks (libsrt's sockets; WHIP's HTTP and its own socket) on a thread of
/// its own, told to stop if the path (this task) goes; why it ended.
async fn blocking(pushed: &mut bool, push: impl FnOnce(&AtomicBool, &mut bool) -> String + Send + 'static) -> String {
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let run = tokio::task::spawn_blocking(move || {
        let mut pushed = false;
        (push(&stop, &mut pushed), pushed)
    });
    match run.await {
        Ok((why, p)) => {
            *pushed = p;
            why
        }
        Err(e) => e.to_string(),
    }
}

/// What a target pushes: the path's FLV tags (RTMP), its RTP tracks and their description
/// (RTSP, WHIP) or its MPEG-TS (SRT).
enum Media {
    Flv(Arc<Repack>),
    Rtp { sdp: fanout_proto::rtsp::sdp::Sdp, tracks: Vec<fanout_io::Session> },
    Ts(fanout_io::Session),
}

/// A target joined to the path's stream as one of its readers.
struct Joined {
    media: Media,
    held: Arc<Held>,
    registered: crate::readers::Registered,
}

/// Waits until the path has a stream the target's protocol carries, and joins it as a
/// reader. `None`: the relay or the path went.
async fn wait_for_stream(relay: &Weak<Relay>, name: &str, target: &Target) -> Option<Joined> {
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
                let media = match &target.via {
                    Via::Rtmp { .. } => match relay.repack(name).await {
                        Ok(r) if r.flv.is_some() => Ok(Media::Flv(r)),
                        Ok(r) => Err(format!("the stream's tracks do not go in FLV ({})", r.describes)),
                        Err(e) => Err(e.to_string()),
                    },
                    Via::Rtsp { .. } | Via::Whip { .. } => described(&path).await,
                    Via::Srt(_) => relay.http_session(name).await.map(Media::Ts).map_err(|e| e.to_string()),
                };
                let why = match media {
                    Ok(media) => {
                        let held = Arc::new(Held::default());
                        let who = Who::new(Protocol::Forward, None, None);
                        match path.readers.join(who, held.clone()) {
                            Ok(registered) => return Some(Joined { media, held, registered }),
                            Err(full) => full.to_string(),
                        }
                    }
                    Err(why) => why,
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

/// The path's RTP tracks and their description, as its RTSP players get them (an upstream
/// pulled on demand is asked for its stream).
async fn described(path: &crate::path::Path) -> Result<Media, String> {
    if let Some(up) = path.upstream() {
        up.demand(Duration::from_secs(5)).await;
    }
    let res = path.describe().filter(|r| !r.sdp.media.is_empty()).ok_or("the stream has no description yet")?;
    Ok(Media::Rtp { sdp: res.sdp, tracks: path.tracks().into_iter().map(|t| t.session).collect() })
}
