//! Recording and playback as a service: a task that keeps every path with `record`
//! recording while it has a stream, retention on a timer, and the playback API (recordings
//! by time, a time range as one fMP4 download or as an HLS VOD playlist, the files with byte
//! ranges), behind the `playback` action.

use crate::error::ApiError;
use crate::record::{self, StoredFile};
use crate::relay::Relay;
use crate::repack::describe;
use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use fanout_proto::container::record::{
    fragment, pick, rfc3339, spans, timescales, vod_playlist, FileIndex, Format, Pick, Recording, Retimer,
};
use fanout_proto::container::recordts::{self, TsRetimer};
use fanout_proto::container::repack::TrackInfo;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub fn routes() -> Router<Arc<Relay>> {
    Router::new()
        .route("/v1/recordings", get(list_paths))
        .route("/v1/recordings/{name}", get(list_path))
        .route("/v1/recordings/{name}/get", get(download))
        .route("/v1/recordings/{name}/index.m3u8", get(playlist))
        .route("/v1/recordings/{name}/fragment.m4s", get(fragment_of))
        .route("/v1/recordings/{name}/fragment.ts", get(fragment_of))
        .route("/v1/recordings/{name}/files/{file}", get(file))
}

/// How often paths that record and have no recording running are looked at.
const SUPERVISE: Duration = Duration::from_secs(1);
/// How often retention runs.
const RETENTION: Duration = Duration::from_secs(5);

/// Keeps recording every path whose settings say so (its repackaging started, and started
/// again after it stopped), and applies retention. Runs for the relay's life.
pub async fn keep_recording(relay: Arc<Relay>) {
    let mut tick = tokio::time::interval(SUPERVISE);
    let mut last_retention = tokio::time::Instant::now() - RETENTION;
    // Paths whose repackaging is being started (an upstream may take seconds to describe).
    let starting: Arc<parking_lot::Mutex<std::collections::HashSet<String>>> = Default::default();
    loop {
        tick.tick().await;
        let recorded: Vec<(String, record::RecordSpec)> =
            relay.paths().into_iter().filter_map(|p| Some((p.session.name().to_string(), p.spec().record?))).collect();
        for (name, _) in &recorded {
            let Some(path) = relay.path(name) else { continue };
            let running = path.repack_running().filter(|r| r.record.is_some());
            // A publisher that came back with other tracks: the repackaging (and the
            // recording) starts again on them (its file is closed first).
            if let (Some(r), Some(sdp)) = (&running, path.sdp()) {
                let now: Vec<TrackInfo> = sdp.media.iter().filter_map(|m| TrackInfo::from_sdp(m).ok()).collect();
                if !now.is_empty() && describe(&now) != r.describes {
                    tracing::info!(
                        path = name,
                        was = r.describes,
                        now = describe(&now),
                        "other tracks: recording them"
                    );
                    r.stop();
                    path.repack_stopped();
                    continue;
                }
            }
            if running.is_some() || !starting.lock().insert(name.clone()) {
                continue;
            }
            let (relay, starting, name) = (relay.clone(), starting.clone(), name.clone());
            tokio::spawn(async move {
                // Nothing published yet is the usual answer: asked again next second.
                if let Err(e) = relay.repack(&name).await {
                    tracing::debug!(path = name, "not recording yet: {e}");
                }
                starting.lock().remove(&name);
            });
        }
        if last_retention.elapsed() >= RETENTION {
            last_retention = tokio::time::Instant::now();
            let store = relay.recordings.clone();
            let run = relay.recordings.disk.run(move || {
                for (name, spec) in &recorded {
                    for gone in store.expire(name, spec) {
                        tracing::info!(path = name, file = store.relative(&gone), "retention deleted a recording");
                    }
                }
            });
            // Disk workers all taken by playback: retention runs at the next turn.
            if let Err(e) = run.await {
                tracing::warn!("retention waits: {e}");
            }
        }
    }
}

fn bad(why: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, why.into())
}

fn busy(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

/// The address a request came from (the HTTP listener tells every handler).
type Client = Option<Extension<ConnectInfo<SocketAddr>>>;

/// A streaming read for `client` (a download, a file), or 503 where that address, or
/// everyone, streams the most at once.
fn stream_slot(relay: &Relay, client: &Client) -> Result<crate::admit::Held, ApiError> {
    let ip = client.as_ref().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |c| c.0 .0.ip());
    relay.recordings.streams.take(ip).map_err(|why| {
        relay.books.refuse("recording streams (a download or file read at once)", ip);
        busy(format!(
            "{why}: at most {} recording downloads or file reads at once per address, {} in all",
            record::STREAMS_PER_IP,
            record::STREAMS
        ))
    })
}

fn param<'a>(query: &'a Option<String>, key: &str) -> Option<&'a str> {
    query.as_deref()?.split('&').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// What the files' URLs in a playlist carry on: the token.
fn token_query(query: &Option<String>) -> String {
    param(query, "token").map_or(String::new(), |t| format!("?token={t}"))
}

/// A path's files that can be read, indexed, and those that cannot, with why (on the
/// blocking pool: this reads the disk).
type Indexed = (Vec<(StoredFile, Arc<FileIndex>)>, Vec<(StoredFile, String)>);

async fn indexed(relay: &Relay, name: &str) -> Result<Indexed, ApiError> {
    crate::spec::check_path_name(name).map_err(|e| bad(e.0))?;
    let store = relay.recordings.clone();
    let name = name.to_string();
    relay
        .recordings
        .disk
        .run(move || {
            let (mut good, mut bad) = (Vec::new(), Vec::new());
            for (_, f) in store.files(Some(&name)) {
                match store.index(&f.name) {
                    Ok(ix) => good.push((f, ix)),
                    Err(e) => bad.push((f, store.relative(&e.to_string()))),
                }
            }
            (good, bad)
        })
        .await
        .map_err(busy)
}

async fn list_paths(State(relay): State<Arc<Relay>>) -> Result<Json<serde_json::Value>, ApiError> {
    let store = relay.recordings.clone();
    let files = relay.recordings.disk.run(move || store.files(None)).await.map_err(busy)?;
    let mut paths: Vec<serde_json::Value> = Vec::new();
    for group in files.chunk_by(|a, b| a.0 == b.0) {
        let (first, last) = (&group[0].1, &group[group.len() - 1].1);
        paths.push(json!({
            "name": group[0].0,
            "files": group.len(),
            "bytes": group.iter().map(|f| f.1.bytes).sum::<u64>(),
            "first": rfc3339(first.start_us),
            "last_written": rfc3339(last.written_us),
            "recording": relay.path(&group[0].0).is_some_and(|p| p.spec().record.is_some()),
        }));
    }
    Ok(Json(json!({ "paths": paths })))
}

async fn list_path(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (files, unreadable) = indexed(&relay, &name).await?;
    let mut list: Vec<(i64, serde_json::Value)> = files
        .iter()
        .map(|(f, ix)| {
            let v = json!({
                "file": relay.recordings.relative(&f.name),
                "start": rfc3339(f.start_us),
                "duration_s": ix.duration_us() as f64 / 1e6,
                "fragments": ix.fragments.len(),
                "bytes": f.bytes,
                "writing": f.open,
            });
            (f.start_us, v)
        })
        .collect();
    // Files that cannot be read are listed with why (and left out of playback).
    list.extend(unreadable.iter().map(|(f, why)| {
        let v =
            json!({ "file": relay.recordings.relative(&f.name), "start": rfc3339(f.start_us), "bytes": f.bytes, "writing": f.open, "error": why });
        (f.start_us, v)
    }));
    list.sort_by_key(|l| l.0);
    let list: Vec<serde_json::Value> = list.into_iter().map(|l| l.1).collect();
    let times: Vec<(i64, i64)> = files.iter().map(|(f, ix)| (f.start_us, ix.duration_us())).collect();
    let spans: Vec<serde_json::Value> =
        spans(&times).into_iter().map(|(s, d)| json!({ "start": rfc3339(s), "duration_s": d as f64 / 1e6 })).collect();
    Ok(Json(json!({
        "name": name,
        "recording": relay.path(&name).is_some_and(|p| p.spec().record.is_some()),
        "files": list,
        "spans": spans,
    })))
}

/// The range a request asks for: `start` (RFC 3339; default: the first recording) and
/// `duration` (seconds; default: to the end).
fn range(query: &Option<String>, files: &[(StoredFile, Arc<FileIndex>)]) -> Result<(i64, i64), ApiError> {
    let start = match param(query, "start") {
        Some(s) => {
            let s = fanout_proto::rtsp::client::percent_decode(s);
            fanout_proto::container::record::parse_rfc3339(&s)
                .ok_or_else(|| bad(format!("start {s:?}: an RFC 3339 time, as 2026-11-27T10:00:00Z")))?
        }
        None => files.first().map_or(0, |f| f.0.start_us),
    };
    let to = match param(query, "duration") {
        Some(d) => {
            let d: f64 = d
                .parse()
                .ok()
                .filter(|d: &f64| d.is_finite() && *d > 0.0)
                .ok_or_else(|| bad(format!("duration {d:?}: seconds, more than 0")))?;
            start.saturating_add((d * 1e6).min(1e15) as i64)
        }
        None => i64::MAX,
    };
    Ok((start, to))
}

fn recordings(files: &[(StoredFile, Arc<FileIndex>)]) -> Vec<Recording<'_>> {
    files.iter().map(|(f, ix)| Recording { start_us: f.start_us, index: ix.as_ref() }).collect()
}

/// A path's readable files, the fragments of the range `query` asks for, and its start.
async fn ranged(
    relay: &Relay,
    name: &str,
    query: &Option<String>,
) -> Result<(Vec<(StoredFile, Arc<FileIndex>)>, Vec<Pick>, i64), ApiError> {
    let (files, _) = indexed(relay, name).await?;
    let (from, to) = range(query, &files)?;
    let picks = pick(&recordings(&files), from, to);
    if picks.is_empty() {
        return Err(ApiError(StatusCode::NOT_FOUND, format!("{name:?} has no recording from {}", rfc3339(from))));
    }
    Ok((files, picks, from))
}

/// `GET /v1/recordings/{name}/index.m3u8?start=…&duration=…`: the range as an HLS VOD
/// playlist: each MP4 file's initialization segment a byte range of it, each fragment a
/// `fragment.m4s` (`fragment.ts` of a TS file) URL that serves it on the playlist's timeline.
async fn playlist(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (files, picks, _) = ranged(&relay, &name, &query).await?;
    let recs = recordings(&files);
    let token = token_query(&query);
    let and_token = token.replacen('?', "&", 1);
    let shown = |k: usize| fanout_proto::http::percent_encode(&relay.recordings.relative(&files[k].0.name));
    let text = vod_playlist(
        &recs,
        &picks,
        |k| format!("files/{}{token}", shown(k)),
        |p, at| {
            let ix = &files[p.file].1;
            let fr = &ix.fragments[p.fragment];
            let kind = match ix.format {
                Format::Fmp4 => "m4s",
                Format::MpegTs => "ts",
            };
            format!(
                "fragment.{kind}?file={}&init={}&offset={}&len={}&at={at}{and_token}",
                shown(p.file),
                ix.init_len,
                fr.offset,
                fr.len
            )
        },
    );
    Ok(([(header::CONTENT_TYPE, "application/vnd.apple.mpegurl")], text).into_response())
}

/// The file of `name`'s recordings a request names, or 404.
fn named_file(relay: &Relay, name: &str, file: &str) -> Result<String, ApiError> {
    relay
        .recordings
        .file_of(name, file)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("{file:?} is not a recording of {name:?}")))
}

/// `GET /v1/recordings/{name}/fragment.m4s?file=…&init=…&offset=…&len=…&at=…` (and
/// `fragment.ts` of a TS file, `init=0`): one fragment of a file (as a VOD playlist lists
/// it), its times moved to start `at` µs into the playlist (an MP4 file's own times start at
/// zero, a TS file's are its run's; a player wants one timeline).
async fn fragment_of(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let file = param(&query, "file").map(fanout_proto::rtsp::client::percent_decode).unwrap_or_default();
    let file = named_file(&relay, &name, &file)?;
    let format = Format::of(&file);
    let num =
        |k: &str| param(&query, k).and_then(|v| v.parse::<u64>().ok()).ok_or_else(|| bad(format!("{k}: a number")));
    let (init, offset, len, at) = (num("init")?, num("offset")?, num("len")?, num("at")?);
    if init > MAX_INIT || len > MAX_FRAGMENT {
        return Err(bad("not a fragment of a recording"));
    }
    let read = relay
        .recordings
        .disk
        .run(move || -> std::io::Result<(Vec<u8>, Vec<u8>)> {
            let mut f = std::fs::File::open(&file)?;
            Ok((record::read_at(&mut f, 0, init as usize)?, record::read_at(&mut f, offset, len as usize)?))
        })
        .await
        .map_err(busy)?;
    let (init, mut bytes) =
        read.map_err(|e| ApiError(StatusCode::NOT_FOUND, relay.recordings.relative(&e.to_string())))?;
    let at = at.min(i64::MAX as u64) as i64;
    if format == Format::MpegTs {
        let len = bytes.len() as u64;
        let ix = recordts::scan(len, |o, n| bytes.get(o as usize..).map(|b| b[..n.min(b.len())].to_vec()));
        let Some(fr) = ix.ok().and_then(|ix| ix.fragments.into_iter().next()).filter(|f| f.offset == 0) else {
            return Err(ApiError(StatusCode::NOT_FOUND, "no fragment there (the file changed?)".into()));
        };
        TsRetimer::starting_at(0).retime(&mut bytes, &fr, at);
        return Ok(([(header::CONTENT_TYPE, "video/mp2t")], bytes).into_response());
    }
    let Some(fr) = fragment(&bytes) else {
        return Err(ApiError(StatusCode::NOT_FOUND, "no fragment there (the file changed?)".into()));
    };
    let scales = FileIndex { timescales: timescales(&init), ..FileIndex::default() };
    Retimer::starting_at(0).retime(&mut bytes, &scales, &fr, at);
    Ok(([(header::CONTENT_TYPE, "video/iso.segment")], bytes).into_response())
}

fn content_type(format: Format) -> &'static str {
    match format {
        Format::Fmp4 => "video/mp4",
        Format::MpegTs => "video/mp2t",
    }
}

/// An initialization segment is a few KiB, a fragment at most this (a minute of video).
const MAX_INIT: u64 = 1 << 20;
const MAX_FRAGMENT: u64 = 64 << 20;
/// Bytes of a file read (and held) at once for one request.
const CHUNK: u64 = 256 << 10;

/// A body read step by step on the disk workers: each step is handed a thread, reads at
/// most one chunk or fragment and gives the thread back. Between two steps the body waits
/// in async code for the client to take what it has, so a client that stops reading holds
/// no thread, at most one step's bytes, and is closed by the connection's write deadline.
fn stepped<S: Send + 'static>(
    relay: &Relay,
    state: S,
    held: crate::admit::Held,
    step: fn(&mut S) -> std::io::Result<Option<Vec<u8>>>,
) -> axum::body::Body {
    let store = relay.recordings.clone();
    let body = futures_util::stream::unfold(Some((state, store, held)), move |now| async move {
        let (mut state, store, held) = now?;
        let disk = store.clone();
        let done = disk
            .disk
            .run(move || {
                let r = step(&mut state);
                (state, r)
            })
            .await;
        match done {
            Ok((state, Ok(Some(bytes)))) => Some((Ok(bytes), Some((state, store, held)))),
            Ok((_, Ok(None))) => None,
            Ok((_, Err(e))) => Some((Err(e), None)),
            Err(busy) => Some((Err(std::io::Error::other(busy)), None)),
        }
    });
    axum::body::Body::from_stream(body)
}

/// A download's place: the fragments left, the file open, the timeline so far.
struct Download {
    files: Vec<(StoredFile, Arc<FileIndex>)>,
    picks: std::collections::VecDeque<Pick>,
    open: Option<(usize, std::fs::File)>,
    retimer: Retimer,
    ts_retimer: TsRetimer,
    init: Option<Vec<u8>>,
    /// The first file's: a download is of one format.
    format: Format,
}

impl Download {
    /// The next bytes: the first MP4 file's initialization segment, then one fragment a
    /// step; `None` at the end, or where a file of other tracks or another format than the
    /// first begins.
    fn step(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let Some(p) = self.picks.front().copied() else { return Ok(None) };
        let (f, ix) = &self.files[p.file];
        if ix.format != self.format {
            return Ok(None);
        }
        if ix.format == Format::MpegTs {
            if self.open.as_ref().is_none_or(|o| o.0 != p.file) {
                self.open = Some((p.file, std::fs::File::open(&f.name)?));
            }
            self.picks.pop_front();
            let fr = &ix.fragments[p.fragment];
            let file = &mut self.open.as_mut().expect("opened above").1;
            let mut bytes = record::read_at(file, fr.offset, fr.len as usize)?;
            self.ts_retimer.retime(&mut bytes, fr, p.start_us);
            return Ok(Some(bytes));
        }
        if self.open.as_ref().is_none_or(|o| o.0 != p.file) {
            let mut file = std::fs::File::open(&f.name)?;
            let this_init = record::read_at(&mut file, 0, ix.init_len as usize)?;
            self.open = Some((p.file, file));
            match &self.init {
                None => {
                    self.init = Some(this_init.clone());
                    return Ok(Some(this_init));
                }
                Some(i) if *i != this_init => return Ok(None),
                Some(_) => {}
            }
        }
        self.picks.pop_front();
        let fr = &ix.fragments[p.fragment];
        let file = &mut self.open.as_mut().expect("opened above").1;
        let mut bytes = record::read_at(file, fr.offset, fr.len as usize)?;
        self.retimer.retime(&mut bytes, ix, fr, p.start_us);
        Ok(Some(bytes))
    }
}

/// `GET /v1/recordings/{name}/get?start=…&duration=…`: the range as one fragmented MP4 (one
/// MPEG-TS where the recording is TS), from the keyframe at or before `start`, on one
/// timeline from zero. Fragments are read and sent one at a time; a range across recordings
/// of different tracks or formats ends where they change.
async fn download(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    client: Client,
) -> Result<Response, ApiError> {
    let held = stream_slot(&relay, &client)?;
    let (files, picks, from) = ranged(&relay, &name, &query).await?;
    let format = files[picks[0].file].1.format;
    let state = Download {
        files,
        picks: picks.into(),
        open: None,
        retimer: Retimer::default(),
        ts_retimer: TsRetimer::default(),
        init: None,
        format,
    };
    let filename = format!("{name}-{}.{}", rfc3339(from).replace(':', "-"), format.extension());
    Ok((
        [
            (header::CONTENT_TYPE, content_type(format).to_string()),
            (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{filename}\"")),
        ],
        stepped(&relay, state, held, Download::step),
    )
        .into_response())
}

/// A byte range of a file still to send.
struct Span {
    file: std::fs::File,
    at: u64,
    end: u64,
}

impl Span {
    fn step(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.at >= self.end {
            return Ok(None);
        }
        let bytes = record::read_at(&mut self.file, self.at, CHUNK.min(self.end - self.at) as usize)?;
        if bytes.is_empty() {
            // The file was cut short since its length was read: the body ends short.
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the recording shrank"));
        }
        self.at += bytes.len() as u64;
        Ok(Some(bytes))
    }
}

/// `GET /v1/recordings/{name}/files/{file}`: a recording file as it is, with one byte range
/// (RFC 9110: what the VOD playlist's segments are; several ranges or another unit are
/// answered with the whole file). Only a name the layout gives `name` is served; it is
/// sent a chunk at a time.
async fn file(
    State(relay): State<Arc<Relay>>,
    Path((name, file)): Path<(String, String)>,
    headers: HeaderMap,
    client: Client,
) -> Result<Response, ApiError> {
    let file = named_file(&relay, &name, &file)?;
    let kind = content_type(Format::of(&file));
    let held = stream_slot(&relay, &client)?;
    let opened = relay
        .recordings
        .disk
        .run(move || -> std::io::Result<(std::fs::File, u64)> {
            let f = std::fs::File::open(&file)?;
            let len = f.metadata()?.len();
            Ok((f, len))
        })
        .await
        .map_err(busy)?;
    let (f, len) = opened.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ApiError(StatusCode::NOT_FOUND, "no such recording (deleted?)".into()),
        _ => ApiError(StatusCode::INTERNAL_SERVER_ERROR, relay.recordings.relative(&e.to_string())),
    })?;
    let asked = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let range = match fanout_proto::http::byte_range(asked, len) {
        Err(()) => {
            return Ok((StatusCode::RANGE_NOT_SATISFIABLE, [(header::CONTENT_RANGE, format!("bytes */{len}"))])
                .into_response())
        }
        Ok(r) => r,
    };
    let (a, b) = range.unwrap_or((0, len.saturating_sub(1)));
    let end = if len == 0 { 0 } else { b + 1 };
    let body = stepped(&relay, Span { file: f, at: a, end }, held, Span::step);
    let mut r = ([(header::CONTENT_TYPE, kind.to_string()), (header::ACCEPT_RANGES, "bytes".to_string())], body)
        .into_response();
    r.headers_mut().insert(header::CONTENT_LENGTH, header::HeaderValue::from(end - a));
    // 206 only for a range served as asked.
    if range.is_some() {
        *r.status_mut() = StatusCode::PARTIAL_CONTENT;
        r.headers_mut().insert(
            header::CONTENT_RANGE,
            header::HeaderValue::from_str(&format!("bytes {a}-{b}/{len}")).expect("ascii"),
        );
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_a_start_and_a_duration_or_a_clear_400() {
        let q = |s: &str| Some(s.to_string());
        let start = fanout_proto::container::record::parse_rfc3339("2026-11-27T10:00:00Z").unwrap();
        let (from, to) = range(&q("start=2026-11-27T10:00:00Z&duration=60"), &[]).ok().unwrap();
        assert_eq!((from, to), (start, start + 60_000_000));
        let (from, to) = range(&q("start=2026-11-27T10%3A00%3A00Z"), &[]).ok().unwrap();
        assert_eq!((from, to), (start, i64::MAX), "percent-encoded, and to the end");
        assert_eq!(range(&None, &[]).ok().unwrap(), (0, i64::MAX), "no files: from the beginning of time");
        for bad in ["start=yesterday", "duration=0", "duration=-3", "duration=NaN", "duration=x"] {
            let e = range(&q(bad), &[]).err().unwrap();
            assert_eq!(e.0, StatusCode::BAD_REQUEST, "{bad}: {}", e.1);
        }
    }
}
