//! A path's HLS over the API's port: its playlists and segments, each player joined to the
//! path's readers by its playlist's name; and what a stream's GET would answer.

use super::*;

/// `HEAD /v1/sessions/{name}/stream`: what a GET would answer, without the stream.
pub(super) async fn stream_head(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    relay.session(&name)?;
    let headers = [
        (header::CONTENT_TYPE, "video/mp2t"),
        (header::CACHE_CONTROL, "no-cache"),
        (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
    ];
    Ok((headers, ""))
}

/// `GET /v1/sessions/{name}/hls/{index.m3u8 | init.mp4 | N.m4s | N.K.m4s | N.ts}`: HLS
/// of the path's `hls_variant` (fMP4 in parts, whole fMP4 segments or MPEG-TS segments),
/// from the session's repackaging (started by the request, kept while requests come).
///
/// A new player's `index.m3u8` is a multivariant playlist that names the player in its
/// media playlist's URL (`index.m3u8?player=ID`), which it reloads every target duration:
/// the session counts its HLS players by the names on those reloads. The segments' URLs do
/// not carry the name, so every player asks for the same URLs and a cache in front serves
/// them all. A cluster node at its subscriber cap sends a new player, not a playing one,
/// to a node with room.
pub(super) async fn hls_file(
    State(relay): State<Arc<Relay>>,
    Path((name, file)): Path<(String, String)>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    client: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
) -> ApiResult<Response> {
    let q = HlsQuery(query.unwrap_or_default());
    let player = q.get("player");
    if player.as_deref().is_some_and(|p| !fanout_core::players::valid_id(p)) {
        let why = format!("player: 1 to {} letters, digits, - or _", fanout_core::players::MAX_ID);
        return Err(ApiError(StatusCode::BAD_REQUEST, why));
    }
    // What the files' URLs carry on: the token, or a user and its password (as given, still
    // percent-encoded).
    let token = match (q.get("token"), q.get("user"), q.get("pass")) {
        (Some(t), _, _) => Some(format!("token={t}")),
        (None, Some(u), Some(p)) => Some(format!("user={u}&pass={p}")),
        _ => None,
    };
    let new_player = file == "index.m3u8" && player.is_none() && q.get("_HLS_msn").is_none();
    if new_player {
        if let Some(to) = redirected(&relay, &name, token.as_deref()).await {
            return Ok((StatusCode::FOUND, [(header::LOCATION, to)]).into_response());
        }
    }
    let r = relay.repack(&name).await?;
    let Some(hls) = r.hls.clone() else {
        let why = format!("session {name:?} carries {}: HLS here takes H.264, H.265 and AAC", r.describes);
        return Err(ApiError(StatusCode::UNSUPPORTED_MEDIA_TYPE, why));
    };
    hls.touch();
    if let Some(p) = &player {
        join_player(&relay, &name, &hls, p, &q, client.map(|c| c.0 .0))?;
    }
    let target = Duration::from_millis(u64::from(crate::repack::HLS_TARGET_MS));
    // The first segment takes a keyframe and a target duration to come.
    if !hls.wait_first(3 * target + Duration::from_secs(2)).await {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no HLS segment of {name:?} yet: is its source sending?"),
        ));
    }
    match file.as_str() {
        "index.m3u8" => playlist(&relay, &name, &hls, &q, token.as_deref(), new_player).await,
        "init.mp4" => {
            let Some(init) = hls.with(|s| s.init()) else {
                let why = format!("{name:?} has MPEG-TS segments (hls_variant \"mpegts\"): no init.mp4");
                return Err(ApiError(StatusCode::NOT_FOUND, why));
            };
            Ok(([(header::CONTENT_TYPE, "video/mp4"), (header::CACHE_CONTROL, "no-cache")], init).into_response())
        }
        _ => media_file(&name, &file, &hls).await,
    }
}

/// A part or segment named before it exists (the playlist's preload hint, a blocking
/// reload) is waited for up to this long.
fn hls_wait() -> Duration {
    3 * Duration::from_millis(u64::from(crate::repack::HLS_TARGET_MS))
}

/// An HLS request's query.
struct HlsQuery(String);

impl HlsQuery {
    fn get(&self, k: &str) -> Option<String> {
        self.0.split('&').find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')).map(str::to_string)
    }
}

/// Where a cluster node at its subscriber cap sends a new player (not a playing one).
async fn redirected(relay: &Relay, name: &str, token: Option<&str>) -> Option<String> {
    let to = relay.cluster.as_ref()?.redirect_hls(name).await?;
    tracing::info!(session = name, %to, "at the subscriber cap: HLS player redirected");
    Some(match token {
        Some(t) => format!("{to}?{t}"),
        None => to,
    })
}

/// A named player's request: refused once it was ended; else it is seen, and joins its
/// path's readers at its first media playlist request (also one named by an earlier
/// process, after an upgrade), staying while its reloads come.
fn join_player(
    relay: &Relay,
    name: &str,
    hls: &Arc<crate::repack::Hls>,
    p: &str,
    q: &HlsQuery,
    client: Option<std::net::SocketAddr>,
) -> ApiResult<()> {
    let path = relay.path(name).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no path {name}")))?;
    if hls.was_kicked(p) {
        return Err(ApiError(StatusCode::GONE, format!("player {p} of {name} was ended")));
    }
    hls.player_seen(p);
    if !path.readers.has(p) {
        let user = fanout_proto::auth::query_credentials(&q.0).0;
        let who = Who::new(Protocol::Hls, client, user);
        let reader = Arc::new(crate::repack::HlsReader { hls: hls.clone(), id: p.to_string() });
        path.readers.join_as(p.to_string(), who, reader).map_err(crate::error::RelayError::from)?.detach();
    }
    Ok(())
}

/// `index.m3u8`: a new player's multivariant playlist (naming it), else the media
/// playlist, after a blocking reload's wait (RFC 8216bis §6.2.5.2: `_HLS_msn=N` waits for
/// segment N, with `_HLS_part=K` for its part K).
async fn playlist(
    relay: &Relay,
    name: &str,
    hls: &crate::repack::Hls,
    q: &HlsQuery,
    token: Option<&str>,
    new_player: bool,
) -> ApiResult<Response> {
    if let Some(msn) = q.get("_HLS_msn").and_then(|n| n.parse::<u64>().ok()) {
        let part = q.get("_HLS_part").and_then(|n| n.parse::<usize>().ok());
        let last = hls.progress().last;
        if msn > last + 2 {
            return Err(ApiError(StatusCode::BAD_REQUEST, format!("_HLS_msn {msn} is too far ahead of {last}")));
        }
        hls.wait_for(msn, part, hls_wait()).await;
    }
    let text = if new_player {
        if relay.path(name).is_some_and(|p| p.readers.full()) {
            return Err(crate::error::RelayError::Full(format!("{name} has its max_readers")).into());
        }
        let mut uri = format!("index.m3u8?player={}", crate::readers::new_id());
        if let Some(t) = token {
            uri = format!("{uri}&{t}");
        }
        hls.with(|s| s.multivariant(&uri))
    } else {
        hls.with(|s| s.playlist(&token.map_or(String::new(), |t| format!("?{t}"))))
    };
    let headers = [(header::CONTENT_TYPE, "application/vnd.apple.mpegurl"), (header::CACHE_CONTROL, "no-cache")];
    Ok((headers, text.unwrap_or_default()).into_response())
}

/// `N.m4s` (`N.ts`), segment N, or `N.K.m4s`, part K of it; the next part or segment (and
/// the one after, for a player a little ahead) is waited for.
async fn media_file(name: &str, file: &str, hls: &crate::repack::Hls) -> ApiResult<Response> {
    let (ext, content_type) = hls.with(|s| s.variant()).segment_file();
    let name_of = file.strip_suffix(ext).and_then(|f| f.strip_suffix('.')).and_then(|f| match f.split_once('.') {
        None => Some((f.parse::<u64>().ok()?, None)),
        Some((n, k)) if ext == "m4s" => Some((n.parse::<u64>().ok()?, Some(k.parse::<usize>().ok()?))),
        Some(_) => None,
    });
    let Some((n, part)) = name_of else {
        let files = if ext == "ts" { "index.m3u8 or N.ts" } else { "index.m3u8, init.mp4, N.m4s or N.K.m4s" };
        return Err(ApiError(StatusCode::NOT_FOUND, format!("no HLS file {file:?} of {name:?}: {files}")));
    };
    let now = hls.progress();
    let soon = match part {
        None => n > now.last && n <= now.last + 2,
        Some(k) => (n == now.last + 1 && k <= now.parts + 1) || (n == now.last + 2 && k == 0),
    };
    if soon {
        hls.wait_for(n, part, hls_wait()).await;
    }
    let found = hls.with(|s| match part {
        None => s.segment(n).map(|seg| seg.data),
        Some(k) => s.part(n, k).map(|p| p.data),
    });
    let Some(data) = found else {
        let what = part.map_or("segment".to_string(), |k| format!("part {k} of segment"));
        let last = hls.progress().last;
        let why = format!("{what} {n} of {name:?} is not in the window (the newest complete segment is {last})");
        return Err(ApiError(StatusCode::NOT_FOUND, why));
    };
    // Segments and parts never change (numbers are not reused: they start from the clock).
    let etag = format!("\"{}\"", file.trim_end_matches(&format!(".{ext}")));
    let headers = [
        (header::CONTENT_TYPE, content_type.to_string()),
        (header::CACHE_CONTROL, "public, max-age=3600, immutable".to_string()),
        (header::ETAG, etag),
    ];
    hls.served(data.len());
    // (A reference to the segmenter's bytes, not a copy per player.)
    Ok((headers, data).into_response())
}
