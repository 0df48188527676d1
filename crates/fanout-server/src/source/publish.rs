//! `publish`: RTSP, RTMP and SRT publishers push to the path (served by `crate::rtsp`,
//! `crate::rtmp`, `crate::srt`); their tracks are fed by `crate::publish::Publisher`.
//!
//! With a `fallback` the path is always available: while no one publishes, a file plays
//! into the path's tracks as a publisher of the relay's own (looped, restamped, paced at its
//! own rate), or, with `"freeze"`, the last publisher's last picture is held and its audio
//! silent ([`fanout_proto::freeze`]), or, with `"slate"`, a generated picture stands in for
//! the last publisher's H.264 ([`fanout_media::slate`], at its size; before anyone has
//! published, at 1280×720 with silent AAC); a publisher that comes replaces it at once, and
//! when that one leaves the fallback plays again. Readers stay throughout: the tracks keep
//! one SSRC and numbering, their times joined at each switch as at a takeover.

use super::{Ctx, Feeder, Started, StopOnDrop};
use crate::error::RelayError;
use crate::publish::{Ingest, Publisher};
use fanout_proto::container::mpegts::{Restamper, TsSchedule};
use fanout_proto::container::tsingest::TsIngest;
use fanout_proto::rtsp::sdp::Sdp;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Connection ids of the fallback's runs, apart from every other publisher's.
const CONN_BASE: u64 = 8 << 60;
/// How often the fallback looks whether the path has lost its publisher, and a stop.
const LOOK: Duration = Duration::from_millis(50);

/// What plays while no one publishes.
enum Stand {
    /// A clip: its MPEG-TS, and when each datagram of it is due.
    File(Arc<[u8]>, Arc<TsSchedule>),
    /// The last picture, held (or the slate, where `slate`); silence.
    Freeze { slate: bool },
}

pub async fn start(cx: &Ctx<'_>, takeover: bool, fallback: Option<&std::path::Path>) -> Result<Started, RelayError> {
    let p = Publisher::new(cx.name, cx.session.clone(), takeover)
        .map_err(|e| RelayError::Internal(format!("publish source: {e}")))?;
    let p = Arc::new(p);
    let mut kind =
        if takeover { "publish (RTSP, RTMP, SRT; takeover)" } else { "publish (RTSP, RTMP, SRT)" }.to_string();
    let mut tasks = Vec::new();
    if let Some(path) = fallback {
        let stand = if path == std::path::Path::new(crate::spec::FALLBACK_FREEZE) {
            kind = format!("{kind}; fallback: the last picture, held");
            Stand::Freeze { slate: false }
        } else if path == std::path::Path::new(crate::spec::FALLBACK_SLATE) {
            kind = format!("{kind}; fallback: a slate");
            Stand::Freeze { slate: true }
        } else {
            let clip = super::clip::read_clip(path, &cx.cfg.file_roots, true).await?;
            kind = format!("{kind}; fallback {}", path.display());
            let (ts, schedule) = clip.parts();
            Stand::File(ts, schedule)
        };
        let (weak, host, name) = (Arc::downgrade(&p), cx.host.clone(), cx.name.to_string());
        let stop = Arc::new(AtomicBool::new(false));
        let guard = StopOnDrop(stop.clone());
        // Aborted with the path: the guard's drop stops the thread.
        let task = tokio::spawn(async move {
            let _guard = guard;
            let _ =
                tokio::task::spawn_blocking(move || play_while_unpublished(&weak, &stand, &host, &stop, &name)).await;
        });
        tasks.push(task.abort_handle());
    }
    cx.session.set_source_kind(kind);
    Ok(Started { feeder: Feeder::Publisher(p), tasks })
}

/// Plays the fallback each time the path has no publisher, until `stop` or the path goes.
fn play_while_unpublished(
    p: &Weak<Publisher>,
    stand: &Stand,
    host: &Weak<dyn crate::upstream::Host>,
    stop: &AtomicBool,
    name: &str,
) {
    let mut run = 0u64;
    loop {
        loop {
            let Some(p) = p.upgrade() else { return };
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if p.transport().is_none() {
                break;
            }
            drop(p);
            std::thread::sleep(LOOK);
        }
        let conn = (CONN_BASE | run, name);
        let why = match stand {
            Stand::File(ts, schedule) => Some(play(p, ts, schedule, host, stop, conn)),
            Stand::Freeze { slate } => freeze(p, *slate, host, stop, conn),
        };
        match why {
            Some(why) => {
                tracing::info!(session = name, "fallback: {why}");
                run += 1;
            }
            // (Nothing to hold yet: no one has published.)
            None => std::thread::sleep(LOOK),
        }
    }
}

/// One run of the frozen picture (or the slate), until a publisher takes the path; why it
/// ended, or `None` where there is nothing to hold (no one has published a picture or audio
/// it can hold).
fn freeze(
    p: &Weak<Publisher>,
    slate: bool,
    host: &Weak<dyn crate::upstream::Host>,
    stop: &AtomicBool,
    (conn, name): (u64, &str),
) -> Option<String> {
    use fanout_proto::freeze::Freeze;
    let label = format!("fallback-{}", conn & !CONN_BASE);
    let publisher = p.upgrade()?;
    let (sdp, keyframes) = stand_in(&publisher, slate)?;
    let mut f = Freeze::new(&sdp, &keyframes, crate::track::random_start().1);
    if f.is_empty() {
        return None;
    }
    let Some(host) = host.upgrade() else { return Some("the relay is shutting down".into()) };
    let peer = std::net::IpAddr::from([0, 0, 0, 0]);
    if let Err(e) = publisher.start_stream(Ingest::Fallback, label.clone(), conn, peer, sdp, host.engine()) {
        return Some(format!("not played: {e}"));
    }
    drop((publisher, host));
    tracing::info!(session = name, picture = f.has_picture(), slate, "no publisher: the picture is held");
    let (t0, mut packets) = (Instant::now(), Vec::new());
    loop {
        let due = t0 + Duration::from_millis(f.next_due_ms().expect("not empty"));
        while let Some(wait) = due.checked_duration_since(Instant::now()) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(wait.min(LOOK));
        }
        let Some(p) = p.upgrade().filter(|_| !stop.load(Ordering::Relaxed)) else {
            if let Some(p) = p.upgrade() {
                p.stop(&label);
            }
            return Some("stopped".into());
        };
        f.due(t0.elapsed().as_millis() as u64, &mut packets);
        for (track, mut pkt) in packets.drain(..) {
            if !p.feed_rtp(conn, track, &mut pkt, 0) {
                return Some("a publisher took the path".into());
            }
        }
    }
}

/// What a held picture starts from: the last publisher's description and each of its tracks'
/// last keyframe, its H.264 pictures replaced by the slate at their size where `slate`;
/// before anyone has published, the slate alone where `slate`, else nothing.
fn stand_in(publisher: &Publisher, slate: bool) -> Option<(Sdp, Vec<Vec<Vec<u8>>>)> {
    use fanout_proto::freeze::{picture_packets, slate_size, SLATE_SDP, SLATE_SIZE};
    let painted = |(w, h): (u16, u16), pt: u8| {
        // (Every size a parameter set can give is painted; a larger one, as the default.)
        let picture =
            fanout_media::slate::slate(w, h).or_else(|| fanout_media::slate::slate(SLATE_SIZE.0, SLATE_SIZE.1));
        picture_packets(&picture.expect("the default size is painted").nal_units(), pt)
    };
    let Some(sdp) = publisher.last_sdp() else {
        let sdp = slate.then(|| Sdp::parse(SLATE_SDP).expect("the slate's description parses"))?;
        return Some((sdp, vec![painted(SLATE_SIZE, 96)]));
    };
    let mut keyframes: Vec<Vec<Vec<u8>>> = publisher.tracks().iter().map(|t| t.session.last_keyframe()).collect();
    if slate {
        keyframes.resize(keyframes.len().max(sdp.media.len()), Vec::new());
        for (m, keyframe) in sdp.media.iter().zip(&mut keyframes) {
            if let Some(size) = slate_size(m, keyframe) {
                let pt = m.formats.first().and_then(|f| f.parse().ok()).unwrap_or(96);
                *keyframe = painted(size, pt);
            }
        }
    }
    Some((sdp, keyframes))
}

/// One run of the fallback, from the clip's start, until a publisher takes the path; why it
/// ended.
fn play(
    p: &Weak<Publisher>,
    ts: &[u8],
    schedule: &TsSchedule,
    host: &Weak<dyn crate::upstream::Host>,
    stop: &AtomicBool,
    (conn, name): (u64, &str),
) -> String {
    let label = format!("fallback-{}", conn & !CONN_BASE);
    let (mut ingest, mut restamp) = (TsIngest::default(), Restamper::default());
    let (mut packets, mut started) = (Vec::new(), false);
    let per_lap = schedule.len().max(1) as u64;
    let t0 = Instant::now();
    for n in 0u64.. {
        let (off, len, due) = schedule.datagram(n);
        let at = t0 + Duration::from_nanos(due.saturating_mul(1000) / 27);
        while let Some(wait) = at.checked_duration_since(Instant::now()) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(wait.min(LOOK));
        }
        let Some(p) = p.upgrade().filter(|_| !stop.load(Ordering::Relaxed)) else {
            if let Some(p) = p.upgrade().filter(|_| started) {
                p.stop(&label);
            }
            return "stopped".into();
        };
        let mut bytes = ts[off..off + len].to_vec();
        restamp.set_offset((n / per_lap) * schedule.loop_ticks() / 300);
        restamp.restamp(&mut bytes);
        ingest.push(&bytes, t0.elapsed().as_millis() as u64, &mut packets);
        if !started {
            let Some(sdp) = ingest.sdp() else {
                packets.clear();
                continue;
            };
            let Some(host) = host.upgrade() else { return "the relay is shutting down".into() };
            let sdp = match fanout_proto::rtsp::sdp::Sdp::parse(&sdp) {
                Ok(sdp) => sdp,
                Err(e) => return format!("its description: {e}"),
            };
            let peer = std::net::IpAddr::from([0, 0, 0, 0]);
            // Refused where a publisher came first: the fallback waits for it to leave.
            if let Err(e) = p.start_stream(Ingest::Fallback, label.clone(), conn, peer, sdp, host.engine()) {
                return format!("not played: {e}");
            }
            tracing::info!(session = name, "no publisher: the fallback plays");
            started = true;
        }
        for mut pkt in packets.drain(..) {
            if !p.feed_rtp(conn, pkt.track, &mut pkt.data, pkt.waited_ms) {
                return "a publisher took the path".into();
            }
        }
    }
    unreachable!("the loop above runs until it returns")
}
