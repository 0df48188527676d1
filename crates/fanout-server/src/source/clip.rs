//! `file` and `demo`: a recording (MPEG-TS, or MP4 remuxed; a directory is a playlist) or
//! the built-in test pattern, played at its own rate on the session as MPEG-TS, and its
//! H.264/H.265 and AAC as RTP tracks of their own for RTSP clients and the repackaging.

use super::{Ctx, Feeder, Started};
use crate::error::RelayError;
use crate::track::RtspView;
use fanout_io::{DemoClip, Engine, Session, SessionConfig};
use std::path::{Path, PathBuf};

pub async fn file(path: &Path, looped: bool, cx: &Ctx<'_>) -> Result<Started, RelayError> {
    let clip = read_clip(path, &cx.cfg.file_roots, looped).await?;
    let what = format!("{} {}", if path.is_dir() { "playlist" } else { "file" }, path.display());
    play(clip, &what, cx)
}

pub fn demo(cx: &Ctx) -> Result<Started, RelayError> {
    let clip = DemoClip::new(fanout_io::DEMO_TS).map_err(|e| RelayError::Internal(format!("demo clip: {e}")))?;
    play(clip, "demo", cx)
}

/// The clip on the session, and its tracks (closed again if the session cannot play it).
fn play(clip: DemoClip, what: &str, cx: &Ctx) -> Result<Started, RelayError> {
    let view = demo_view(cx.name, cx.session.config(), &clip, cx.engine)?;
    if let Err(e) = cx.session.attach_clip(clip, what) {
        for t in view.into_iter().flat_map(|v| v.tracks) {
            t.session.close();
        }
        return Err(RelayError::Internal(e.to_string()));
    }
    Ok(Started { feeder: Feeder::Clip(view), tasks: Vec::new() })
}

/// Files larger than this are refused (a `file` source is held in memory); a directory's
/// files together, too.
const MAX_FILE: u64 = 1 << 30;

/// A `file` source's recording, checked: readable, not too large, MPEG-TS with PCRs or an
/// MP4 (remuxed to MPEG-TS here, once, paced by its samples' times). A directory is a
/// playlist: its recordings (`.ts`, `.m2ts`, `.mp4`, `.m4v`, `.mov`) in the order of their
/// names, joined into one stream.
pub(super) async fn read_clip(path: &std::path::Path, roots: &[PathBuf], looped: bool) -> Result<DemoClip, RelayError> {
    let bad = |why: String| RelayError::BadRequest(format!("source file {}: {why}", path.display()));
    let path = &allowed_file(path, roots)?;
    let ts = if tokio::fs::metadata(path).await.is_ok_and(|m| m.is_dir()) {
        let mut names = Vec::new();
        let mut dir = tokio::fs::read_dir(path).await.map_err(|e| bad(e.to_string()))?;
        while let Some(e) = dir.next_entry().await.map_err(|e| bad(e.to_string()))? {
            let p = e.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
            // (A link in the directory is followed only where it stays under a root.)
            if ["ts", "m2ts", "mp4", "m4v", "mov"].contains(&ext.as_str()) && p.is_file() {
                names.push(allowed_file(&p, roots)?);
            }
        }
        names.sort();
        if names.is_empty() {
            return Err(bad("a directory with no recording in it (.ts, .m2ts, .mp4, .m4v, .mov)".into()));
        }
        let (mut list, mut total) = (Vec::new(), 0u64);
        for p in names {
            let ts = read_recording(&p, MAX_FILE - total).await?;
            total += ts.len() as u64;
            list.push((p.file_name().unwrap_or_default().to_string_lossy().into_owned(), ts));
        }
        tokio::task::spawn_blocking(move || fanout_proto::container::playlist::concat(&list))
            .await
            .map_err(|e| RelayError::Internal(e.to_string()))?
            .map_err(|e| bad(e.to_string()))?
    } else {
        read_recording(path, MAX_FILE).await?
    };
    let clip = DemoClip::new(ts).map_err(|e| bad(format!("not a playable MPEG-TS or MP4 ({e})")))?;
    Ok(if looped { clip } else { clip.once() })
}

/// A `file` source's path, resolved, if it lies under one of `roots` (`file_roots`, and the
/// files the config's own sessions name) both as written (with `.` and `..` taken out) and
/// as it resolves (a link may lead out of a root). Outside them, the answer is the same
/// whether the file exists or not, and nothing is opened: the API tells a token holder
/// nothing of the host's other files.
fn allowed_file(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, RelayError> {
    let refused = || RelayError::Forbidden(format!("source file {}: not allowed (outside file_roots)", path.display()));
    let lexical = |p: &Path| -> Option<PathBuf> {
        let mut out = PathBuf::new();
        for c in std::path::absolute(p).ok()?.components() {
            match c {
                std::path::Component::ParentDir => {
                    out.pop();
                }
                std::path::Component::CurDir => {}
                c => out.push(c),
            }
        }
        Some(out)
    };
    let named = lexical(path).ok_or_else(refused)?;
    let roots: Vec<PathBuf> = roots.iter().filter_map(|r| lexical(r)).collect();
    if !roots.iter().any(|r| named.starts_with(r)) {
        return Err(refused());
    }
    // (A path under a root by name that does not resolve reaches nothing either: the reads
    // after this say what is wrong with it.)
    let Ok(real) = std::fs::canonicalize(&named) else { return Ok(named) };
    if !roots.iter().filter_map(|r| std::fs::canonicalize(r).ok()).any(|r| real.starts_with(r)) {
        return Err(refused());
    }
    Ok(real)
}

/// One recording as MPEG-TS (an MP4 remuxed), at most `max` bytes of it.
async fn read_recording(path: &std::path::Path, max: u64) -> Result<Vec<u8>, RelayError> {
    let bad = |why: String| RelayError::BadRequest(format!("source file {}: {why}", path.display()));
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    if ["mkv", "webm", "flv", "avi"].contains(&ext.as_str()) {
        return Err(bad(format!(
            "{ext} is not read, MPEG-TS and MP4 are: remux it without re-encoding (ffmpeg -i {0} -c copy -f mpegts {0}.ts)",
            path.display()
        )));
    }
    let meta = tokio::fs::metadata(path).await.map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() || meta.len() > max {
        return Err(bad(format!("not a file, or more than {} MiB of recordings", MAX_FILE >> 20)));
    }
    let bytes = tokio::fs::read(path).await.map_err(|e| bad(e.to_string()))?;
    // An MP4 says so in its first box (`ftyp`), whatever its name.
    if bytes.get(4..8) != Some(b"ftyp") {
        return Ok(bytes);
    }
    tokio::task::spawn_blocking(move || fanout_proto::container::mp4ts::remux(&bytes))
        .await
        .map_err(|e| RelayError::Internal(e.to_string()))?
        .map_err(|e| bad(e.to_string()))
}

/// The demo's face for RTSP clients: its H.264 or H.265 (RFC 6184, 7798) and AAC (RFC 3640)
/// on track sessions of their own (`NAME/video`, `NAME/audio`), described with the clip's
/// codec parameters, paced from one start so they stay in sync.
fn demo_view(
    name: &str,
    template: &SessionConfig,
    clip: &DemoClip,
    engine: &Engine,
) -> Result<Option<RtspView>, RelayError> {
    let (tracks, origin_90k) = clip.rtp_tracks();
    if tracks.is_empty() {
        return Ok(None);
    }
    let mut text = format!("v=0\r\ns={name}\r\nt=0 0\r\n");
    tracks.iter().for_each(|t| text.push_str(&t.media));
    let sdp = fanout_proto::rtsp::sdp::Sdp::parse(&text).map_err(|e| RelayError::Internal(format!("demo SDP: {e}")))?;
    let start = std::time::Instant::now();
    let ntp_start = fanout_proto::rtp::rtcp::ntp_from_unix(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default(),
    );
    let mut refs = Vec::new();
    for t in tracks {
        let mut cfg = template.clone();
        cfg.name = crate::track::Inner::Clip { video: t.codec.is_some() }.name(name);
        let session = Session::new(cfg, engine);
        let clock = t.clock;
        session.attach_demo_track(t, start).map_err(|e| RelayError::Internal(e.to_string()))?;
        // Wall clock against RTP time is known exactly: the clip's origin at `start`.
        let rtp_at_start = (origin_90k * u64::from(clock) / 90_000) as u32;
        refs.push(crate::track::TrackRef { session, clock, clock_map: Some((ntp_start, rtp_at_start)) });
    }
    Ok(Some(RtspView { sdp, tracks: refs }))
}
