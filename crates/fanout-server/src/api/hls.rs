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

/// `GET /v1/sessions/{name}/hls/{index.m3u8 | init.mp4 | N.m4s}`: HLS with fMP4 segments,
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
    let param = |k: &str| {
        let q = query.as_deref().unwrap_or("");
        q.split('&').find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')).map(str::to_string)
    };
    let player = param("player");
    if player.as_deref().is_some_and(|p| !fanout_core::players::valid_id(p)) {
        let why = format!("player: 1 to {} letters, digits, - or _", fanout_core::players::MAX_ID);
        return Err(ApiError(StatusCode::BAD_REQUEST, why));
    }
    // What the files' URLs carry on: the token.
    let token = param("token").map(|t| format!("token={t}"));
    let new_player = file == "index.m3u8" && player.is_none() && param("_HLS_msn").is_none();
    if new_player {
        if let Some(c) = &relay.cluster {
            if let Some(to) = c.redirect_hls(&name).await {
                tracing::info!(session = name, %to, "at the subscriber cap: HLS player redirected");
                let to = match &token {
                    Some(t) => format!("{to}?{t}"),
                    None => to,
                };
                return Ok((StatusCode::FOUND, [(header::LOCATION, to)]).into_response());
            }
        }
    }
    let r = relay.repack(&name).await?;
    let Some(hls) = r.hls.clone() else {
        let why = format!("session {name:?} carries {}: HLS here takes H.264, H.265 and AAC", r.describes);
        return Err(ApiError(StatusCode::UNSUPPORTED_MEDIA_TYPE, why));
    };
    hls.touch();
    if let Some(p) = &player {
        let path = relay.path(&name).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no path {name}")))?;
        if hls.was_kicked(p) {
            return Err(ApiError(StatusCode::GONE, format!("player {p} of {name} was ended")));
        }
        hls.player_seen(p);
        // A player joins its path's readers at its first media playlist request (also one
        // named by an earlier process, after an upgrade), and stays while its reloads come.
        if !path.readers.has(p) {
            let user = fanout_proto::auth::query_credentials(query.as_deref().unwrap_or("")).0;
            let who = Who::new(Protocol::Hls, client.map(|c| c.0 .0), user);
            let reader = Arc::new(crate::repack::HlsReader { hls: hls.clone(), id: p.clone() });
            path.readers.join_as(p.clone(), who, reader).map_err(crate::error::RelayError::from)?.detach();
        }
    }
    let target = Duration::from_millis(u64::from(crate::repack::HLS_TARGET_MS));
    // The first segment takes a keyframe and a target duration to come.
    if !hls.wait_first(3 * target + Duration::from_secs(2)).await {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no HLS segment of {name:?} yet: is its source sending?"),
        ));
    }
    // A part or segment named before it exists (the playlist's preload hint, a blocking
    // reload) is waited for up to this long.
    let wait = 3 * target;
    let cache = |v: &'static str| (header::CACHE_CONTROL, v);
    if file == "index.m3u8" {
        // Blocking playlist reload (RFC 8216bis §6.2.5.2): `_HLS_msn=N` waits for segment N,
        // with `_HLS_part=K` for its part K.
        if let Some(msn) = param("_HLS_msn").and_then(|n| n.parse::<u64>().ok()) {
            let part = param("_HLS_part").and_then(|n| n.parse::<usize>().ok());
            let now = hls.progress();
            if msn > now.last + 2 {
                let last = now.last;
                return Err(ApiError(StatusCode::BAD_REQUEST, format!("_HLS_msn {msn} is too far ahead of {last}")));
            }
            hls.wait_for(msn, part, wait).await;
        }
        let text = if new_player {
            if relay.path(&name).is_some_and(|p| p.readers.full()) {
                return Err(crate::error::RelayError::Full(format!("{name} has its max_readers")).into());
            }
            let mut uri = format!("index.m3u8?player={}", crate::readers::new_id());
            if let Some(t) = &token {
                uri = format!("{uri}&{t}");
            }
            hls.with(|s| s.multivariant(&uri))
        } else {
            hls.with(|s| s.playlist(&token.as_ref().map_or(String::new(), |t| format!("?{t}"))))
        };
        let headers = [(header::CONTENT_TYPE, "application/vnd.apple.mpegurl"), cache("no-cache")];
        return Ok((headers, text.unwrap_or_default()).into_response());
    }
    if file == "init.mp4" {
        let init = hls.with(|s| s.init()).unwrap_or_default();
        return Ok(([(header::CONTENT_TYPE, "video/mp4"), cache("no-cache")], init).into_response());
    }
    // `N.m4s` is a segment, `N.K.m4s` part K of segment N.
    let name_of = file.strip_suffix(".m4s").and_then(|f| match f.split_once('.') {
        None => Some((f.parse::<u64>().ok()?, None)),
        Some((n, k)) => Some((n.parse::<u64>().ok()?, Some(k.parse::<usize>().ok()?))),
    });
    let Some((n, part)) = name_of else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no HLS file {file:?}: index.m3u8, init.mp4, N.m4s or N.K.m4s"),
        ));
    };
    let now = hls.progress();
    // The next part or segment (and the one after, for a player a little ahead) is held for.
    let soon = match part {
        None => n > now.last && n <= now.last + 2,
        Some(k) => (n == now.last + 1 && k <= now.parts + 1) || (n == now.last + 2 && k == 0),
    };
    if soon {
        hls.wait_for(n, part, wait).await;
    }
    let found = hls.with(|s| match part {
        None => s.segment(n).map(|seg| seg.data),
        Some(k) => s.part(n, k).map(|p| p.data),
    });
    match found {
        Some(data) => {
            // Segments and parts never change (numbers are not reused: they start from the clock).
            let etag = format!("\"{}\"", file.trim_end_matches(".m4s"));
            let headers = [
                (header::CONTENT_TYPE, "video/mp4".to_string()),
                (header::CACHE_CONTROL, "public, max-age=3600, immutable".to_string()),
                (header::ETAG, etag),
            ];
            hls.served(data.len());
            // (A reference to the segmenter's bytes, not a copy per player.)
            Ok((headers, data).into_response())
        }
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "{} {n} of {name:?} is not in the window (the newest complete segment is {})",
                part.map_or("segment".to_string(), |k| format!("part {k} of segment")),
                hls.progress().last
            ),
        )),
    }
}
