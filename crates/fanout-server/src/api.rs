//! The control API (HTTP/JSON): the four OMSS calls and what a person needs around them.
//! `docs/openapi.yaml` describes it.

use crate::readers::{Protocol, Who};
use crate::relay::Relay;
use crate::spec::{SessionSpec, SinkSpec};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

pub use crate::error::ApiError;

type ApiResult<T> = Result<T, ApiError>;

/// The API's routes, with `faces`' (the faces above the relay that answer on the API's
/// port: WHEP and WHIP) behind the same token, limits and error bodies.
pub fn router(relay: Arc<Relay>, faces: Router<Arc<Relay>>) -> Router {
    let max_body = relay.cfg().max_body;
    Router::new()
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route("/v1/sessions/{name}", get(get_session).delete(delete_session))
        .route("/v1/sessions/{name}/sinks", post(add_sink).get(list_sinks).delete(flush_sinks))
        .route("/v1/sessions/{name}/sinks/{id}", get(get_sink).delete(remove_sink))
        .route("/v1/sessions/{name}/sinks/{id}/layers", axum::routing::put(pin_layers))
        .route("/v1/sessions/{name}/readers", get(list_readers))
        .route("/v1/sessions/{name}/readers/{id}", get(get_reader).delete(kick_reader))
        .route("/v1/readers", get(all_readers))
        .route("/v1/sessions/{name}/publisher", get(get_publisher).delete(kick_publisher))
        // GET is taken over before the router (the socket becomes a sink); HEAD answers here.
        .route("/v1/sessions/{name}/stream", get(stream_head))
        .route("/v1/sessions/{name}/hls/{file}", get(hls_file).layer(middleware::map_response(any_origin)))
        .route("/v1/events", get(events))
        .route("/v1/engine", get(engine_status))
        .route("/v1/reload", post(reload))
        .route("/v1/upgrade", post(upgrade))
        .route("/v1/rtsp", get(rtsp_clients))
        .route("/v1/cluster", get(cluster_view))
        .route("/metrics", get(metrics))
        .merge(crate::ui::routes())
        .merge(faces)
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such API path; see docs/openapi.yaml".into()) })
        .layer(middleware::from_fn_with_state(relay.clone(), auth))
        .layer(middleware::map_response(json_errors))
        .layer(middleware::map_response_with_state(relay.clone(), close_after_hand_over))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(relay.clone(), whole_body))
        .with_state(relay)
}

/// After an upgrade's hand-over, every answer closes its connection: the client's next
/// request goes to the new process. (Closing idle connections at once instead would drop
/// a request already on its way: clients resend only on a connection they had used.)
async fn close_after_hand_over(State(relay): State<Arc<Relay>>, r: Response) -> Response {
    let mut r = r;
    if relay.handover.handed() {
        r.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    r
}

/// What a request under the API's port is, for `[auth]`: reading a path's HLS or its stream,
/// or an API call.
fn api_action(path: &str) -> (fanout_proto::auth::Action, String, &'static str) {
    use fanout_proto::auth::Action;
    let parts: Vec<&str> = path.split('/').collect();
    // The name as the handler sees it (axum decodes it: `live%2Fcam1` is `live/cam1`).
    let named = |name: &str| fanout_proto::rtsp::client::percent_decode(name);
    match parts.as_slice() {
        ["", "v1", "sessions", name, "hls", _] => (Action::Read, named(name), "hls"),
        ["", "v1", "sessions", name, "stream"] => (Action::Read, named(name), "http"),
        ["", "v1", "recordings", name, ..] => (Action::Playback, named(name), "playback"),
        _ => (Action::Api, String::new(), "api"),
    }
}

/// Every error answer carries the API's JSON body, also those axum makes itself (405 for a
/// method a path does not take, 413, 415).
async fn json_errors(r: Response) -> Response {
    let status = r.status();
    let is_json = r.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024).await.unwrap_or_default();
    let why = match std::str::from_utf8(&text).map(str::trim) {
        Ok(t) if !t.is_empty() => t.to_string(),
        _ => status.canonical_reason().unwrap_or("error").to_ascii_lowercase(),
    };
    let body = json!({ "error": why, "status": status.as_u16() }).to_string();
    parts.headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// `HEAD /v1/sessions/{name}/stream`: what a GET would answer, without the stream.
async fn stream_head(State(relay): State<Arc<Relay>>, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    relay.session(&name)?;
    let headers = [
        (header::CONTENT_TYPE, "video/mp2t"),
        (header::CACHE_CONTROL, "no-cache"),
        (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
    ];
    Ok((headers, ""))
}

/// HLS and the streams may be read from any origin: players on other sites (hls.js over
/// XHR), as an HTTP cache or CDN in front of the relay would serve them.
async fn any_origin(mut r: Response) -> Response {
    r.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, header::HeaderValue::from_static("*"));
    r
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
async fn hls_file(
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

async fn auth(State(relay): State<Arc<Relay>>, req: Request, next: Next) -> Response {
    let h = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    // The dashboard's files are open (the API they call is not); `?token=` is for stream
    // URLs, HLS and the event stream (docs/config.md), which players and browsers' event
    // sources cannot send a header with; API calls send the header.
    let path = req.uri().path();
    // WHEP and WHIP check their own credentials: the token, or the stream users (webrtc.rs).
    if crate::ui::is_ui(path) || is_webrtc_route(path) {
        return next.run(req).await;
    }
    let query = (path.contains("/hls/")
        || path == "/v1/events"
        || path.ends_with("/stream")
        || path.starts_with("/v1/recordings/"))
    .then(|| req.uri().query())
    .flatten();
    let token = relay.cfg().token.clone();
    let local = token.is_some().then(|| fanout_proto::auth::token_given(token.as_deref(), h, query));
    let ip = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    let (action, name, protocol) = api_action(path);
    let ask = fanout_proto::auth::http_request(h, req.uri().query(), ip, action, &name, protocol);
    if relay.permit(local, ask).await {
        next.run(req).await
    } else {
        let mut r = ApiError(StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into()).into_response();
        r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        r
    }
}

/// A WHEP or WHIP route: `/{name}/whep`, `/v1/sessions/{name}/whep`, their resources
/// (`…/whep/{id}`), and the same with `whip`. Matched by shape, not by a suffix: the status
/// of a path named `whep` (`/v1/sessions/whep`) is not one.
fn is_webrtc_route(path: &str) -> bool {
    let s: Vec<&str> = path.split('/').collect();
    let face = |i: usize| s.get(i).is_some_and(|x| *x == "whep" || *x == "whip");
    let named = |i: usize| s.get(i).is_some_and(|x| !x.is_empty());
    match s.len() {
        3 | 4 => s[0].is_empty() && named(1) && face(2) && (s.len() == 3 || named(3)),
        5 | 6 => s[..3] == ["", "v1", "sessions"] && named(3) && face(4) && (s.len() == 5 || named(5)),
        _ => false,
    }
}

/// A request's body arrives whole within `request_timeout_s` of its head, or the request is
/// answered 408 and its connection closed: a body that trickles a byte at a time does not
/// hold an API slot (hyper's own timeout covers the head only).
async fn whole_body(State(relay): State<Arc<Relay>>, req: Request, next: Next) -> Response {
    let h = req.headers();
    let has_body = h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim() != "0");
    if !has_body {
        return next.run(req).await;
    }
    let deadline = Duration::from_secs_f64(relay.cfg().request_timeout_s);
    let (parts, body) = req.into_parts();
    // One byte over the limit tells a body too large from one that fits.
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, relay.cfg().max_body + 1)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await,
        Ok(Err(_)) => {
            ApiError(StatusCode::PAYLOAD_TOO_LARGE, format!("body over max_body ({} bytes)", relay.cfg().max_body))
                .into_response()
        }
        Err(_) => {
            tracing::info!(path = %parts.uri.path(), "request body incomplete after {deadline:?}: 408");
            let mut r = ApiError(StatusCode::REQUEST_TIMEOUT, format!("request body incomplete after {deadline:?}"))
                .into_response();
            r.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
            r
        }
    }
}

async fn create_session(
    State(relay): State<Arc<Relay>>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> ApiResult<impl IntoResponse> {
    let Json(v) = body?;
    let spec = read_spec(v)?;
    if spec.has_hooks() {
        // A command the relay runs is the operator's to set, in the config file.
        let why = "run_on_* commands can be set in the config file only, not through the API";
        return Err(ApiError(StatusCode::FORBIDDEN, why.into()));
    }
    let s = relay.create(spec.clone()).await?;
    if let Some(st) = relay.state.get() {
        st.session_made(&spec);
    }
    Ok((StatusCode::CREATED, Json(session_json(&relay, &s))))
}

/// A session spec from its JSON. A source whose keys parse but do not make one kind with
/// its own settings is a bad request (400), as a value out of range is; what does not
/// parse at all (an unknown field, a bad address) is 422, as the JSON extractor answers.
fn read_spec(v: serde_json::Value) -> ApiResult<SessionSpec> {
    use crate::spec::{SourceFields, SourceSpec};
    if let Some(Ok(fields)) = v.get("source").map(|s| serde_json::from_value::<SourceFields>(s.clone())) {
        SourceSpec::try_from(fields).map_err(|why| ApiError(StatusCode::BAD_REQUEST, why))?;
    }
    // The field's path in the message, as the extractor gives it (`pace_link: unknown variant`).
    serde_path_to_error::deserialize(v).map_err(|e| {
        ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Failed to deserialize the JSON body into the target type: {e}"),
        )
    })
}

fn session_json(relay: &Relay, s: &fanout_io::Session) -> serde_json::Value {
    let mut v = serde_json::to_value(s.status()).unwrap_or_default();
    let Some(path) = relay.path(s.name()) else { return v };
    let mut spec = path.spec();
    // Upstream credentials stay in the config: the API shows the URL without them.
    if let crate::spec::SourceSpec::Rtsp(r) = &mut spec.source {
        if let Ok(u) = r.parsed_url() {
            r.url = u.request_url();
        }
    }
    v["spec"] = json!({ "source": spec.source, "payload": spec.payload, "failed_sinks": spec.failed_sinks });
    let counts = path.readers.counts();
    v["readers"] = json!(counts.values().sum::<usize>());
    if let Some(up) = path.upstream() {
        v["upstream"] = json!(up.status());
    }
    if let Some(p) = path.publisher() {
        v["publisher"] = json!(p.status());
    }
    // Where its RTSP clients are sinks, when that is not (only) the session itself: the
    // tracks of an RTSP upstream, the demo's H.264.
    let tracks = path.tracks();
    if tracks.iter().any(|t| t.session.name() != s.name()) {
        v["rtsp_tracks"] = json!(tracks
            .iter()
            .map(|t| {
                let st = t.session.status();
                json!({ "session": t.session.name(), "sinks": st.sinks, "packets_sent": st.packets_sent,
                        "source_packets": st.source.packets, "clock_rate": t.clock })
            })
            .collect::<Vec<_>>());
    }
    if let Some(rtsp) = *relay.rtsp_addr.lock() {
        v["rtsp_url"] = json!(format!("rtsp://{rtsp}/{}", s.name()));
    }
    if let Some(rtsps) = *relay.rtsps_addr.lock() {
        v["rtsps_url"] = json!(format!("rtsps://{rtsps}/{}", s.name()));
    }
    // Where an encoder publishes it over RTMP.
    let open = path.publisher().filter(|p| p.takes_publishers());
    if let Some(rtmp) = open.and(*relay.rtmp_addr.lock()) {
        v["rtmp_publish_url"] = json!(format!("rtmp://{rtmp}/{}", s.name()));
    }
    if let Some(rtmps) = open.and(*relay.rtmps_addr.lock()) {
        v["rtmps_publish_url"] = json!(format!("rtmps://{rtmps}/{}", s.name()));
    }
    // Over SRT: where to publish and read it, and who does now.
    if let Some(srt) = *relay.srt_addr.lock() {
        if open.is_some() {
            v["srt_publish_url"] = json!(format!("srt://{srt}?streamid=publish:{}", s.name()));
        }
        v["srt_read_url"] = json!(format!("srt://{srt}?streamid=read:{}", s.name()));
        let links: Vec<_> = relay.srt_links.lock().iter().filter(|l| l.path == s.name()).map(|l| l.status()).collect();
        v["srt"] = json!(links);
    }
    let http = if relay.cfg().https() { "https" } else { "http" };
    // Over WebRTC: where to POST a WHEP offer, and who watches now.
    if let Some(w) = relay.webrtc.lock().clone() {
        v["whep_url"] = json!(format!("{http}://{}/{}/whep", relay.cfg().api, s.name()));
        v["webrtc"] = json!(w.viewers(Some(s.name())));
    }
    v["stream_url"] = json!(format!("{http}://{}/v1/sessions/{}/stream", relay.cfg().api, s.name()));
    v["stream_format"] = json!(stream_format(&path));
    if let Some(r) = path.repack_running() {
        let ts = r.ts.as_ref().map(|ts| {
            let st = ts.status();
            json!({ "session": ts.name(), "sinks": st.sinks, "datagrams": st.source.packets, "bytes_sent": st.bytes_sent })
        });
        let hls = r.hls.as_ref().map(|h| {
            let players = counts.get(&Protocol::Hls).copied().unwrap_or(0);
            let served = h.bytes_served();
            h.with(
                |s| json!({ "segments": s.last(), "codecs": s.codecs(), "players": players, "bytes_served": served }),
            )
        });
        // RTMP players read its FLV.
        let players = [Protocol::Rtmp, Protocol::Rtmps].iter().filter_map(|p| counts.get(p)).sum::<usize>();
        let rtmp = r.flv.as_ref().map(|_| json!({ "players": players }));
        v["repackaging"] = json!({ "from": r.describes, "ts": ts, "hls": hls, "rtmp": rtmp });
    }
    v
}

/// What the stream URL delivers.
fn stream_format(path: &crate::path::Path) -> &'static str {
    if path.view().is_some() {
        "mpegts"
    } else if path.is_rtp_media() {
        "mpegts (repackaged from its RTP video and audio)"
    } else {
        "payload (each datagram's, as received: MPEG-TS from an MPEG-TS source)"
    }
}

async fn list_sessions(State(relay): State<Arc<Relay>>) -> Json<serde_json::Value> {
    Json(json!({ "sessions": relay.sessions().iter().map(|s| session_json(&relay, s)).collect::<Vec<_>>() }))
}

async fn get_session(State(relay): State<Arc<Relay>>, Path(name): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let s = relay.session(&name)?;
    Ok(Json(session_json(&relay, &s)))
}

/// Every reader of every path.
async fn all_readers(State(relay): State<Arc<Relay>>) -> Json<Vec<crate::readers::ReaderStatus>> {
    Json(relay.paths().iter().flat_map(|p| p.readers.list()).collect())
}

async fn list_readers(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> ApiResult<Json<Vec<crate::readers::ReaderStatus>>> {
    let path = relay.path(&name).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no path {name}")))?;
    Ok(Json(path.readers.list()))
}

fn reader_not_found(name: &str, id: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("{name} has no reader {id}"))
}

async fn get_reader(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<Json<crate::readers::ReaderStatus>> {
    let reader = relay.path(&name).and_then(|p| p.readers.get(&id));
    Ok(Json(reader.ok_or_else(|| reader_not_found(&name, &id))?))
}

/// Ends one reader, whatever its protocol: its client is told the end its protocol's way.
async fn kick_reader(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    if !relay.path(&name).is_some_and(|p| p.readers.kick(&id, "ended through the API")) {
        return Err(reader_not_found(&name, &id));
    }
    tracing::info!(path = %name, reader = %id, "reader kicked through the API");
    Ok(StatusCode::NO_CONTENT)
}

/// The path's publisher: who publishes now (or that it waits), and its tracks.
async fn get_publisher(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> ApiResult<Json<crate::publish::PublisherStatus>> {
    let path = relay.path(&name).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no path {name}")))?;
    let publisher =
        path.publisher().ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("{name} takes no publisher")))?;
    Ok(Json(publisher.status()))
}

/// Ends the path's publisher, whatever its protocol; the path waits for the next one.
async fn kick_publisher(State(relay): State<Arc<Relay>>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let path = relay.path(&name).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no path {name}")))?;
    let publisher =
        path.publisher().ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("{name} takes no publisher")))?;
    if !publisher.takes_publishers() {
        return Err(ApiError(StatusCode::CONFLICT, format!("{name} is fed by the relay's own pull: delete the path")));
    }
    if !publisher.kick() {
        return Err(ApiError(StatusCode::NOT_FOUND, format!("nobody publishes {name} now")));
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_session(State(relay): State<Arc<Relay>>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    relay.delete(&name).await?;
    if let Some(st) = relay.state.get() {
        st.session_deleted(&name);
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn add_sink(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
    body: Result<Json<SinkSpec>, JsonRejection>,
) -> ApiResult<impl IntoResponse> {
    let Json(spec) = body?;
    let id = relay.add_sink(&name, &spec).await?;
    if let Some(st) = relay.state.get() {
        st.sink_added(&name, id, &spec);
    }
    let s = relay.session(&name)?;
    Ok((StatusCode::CREATED, Json(json!({ "id": id, "sink": s.sink_status(id) }))))
}

async fn list_sinks(State(relay): State<Arc<Relay>>, Path(name): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(json!({ "sinks": relay.session(&name)?.sinks() })))
}

async fn flush_sinks(State(relay): State<Arc<Relay>>, Path(name): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let removed = relay.session(&name)?.remove_all_sinks();
    if let Some(st) = relay.state.get() {
        st.sinks_flushed(&name);
    }
    tracing::info!(session = %name, removed, "sinks flushed");
    Ok(Json(json!({ "removed": removed })))
}

fn parse_id(id: &str) -> ApiResult<u64> {
    id.parse().map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("sink id {id:?} is not a number")))
}

async fn get_sink(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<Json<fanout_io::SinkStatus>> {
    let id = parse_id(&id)?;
    relay
        .session(&name)?
        .sink_status(id)
        .map(Json)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("session {name:?} has no sink {id}")))
}

async fn remove_sink(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let id = parse_id(&id)?;
    if relay.session(&name)?.remove_sink(id) {
        if let Some(st) = relay.state.get() {
            st.sink_removed(&name, id);
        }
        tracing::info!(session = %name, sink = id, "sink removed");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError(StatusCode::NOT_FOUND, format!("session {name:?} has no sink {id}")))
    }
}

/// The highest layer a sink may get; an id left out is not capped.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MaxLayer {
    #[serde(default = "all_did")]
    did: u8,
    #[serde(default = "all_qid")]
    qid: u8,
    #[serde(default = "all_tid")]
    tid: u8,
}

fn all_did() -> u8 {
    fanout_proto::rtp::adapt::ALL.did
}
fn all_qid() -> u8 {
    fanout_proto::rtp::adapt::ALL.qid
}
fn all_tid() -> u8 {
    fanout_proto::rtp::adapt::ALL.tid
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PinRequest {
    /// `null` lifts the cap.
    max: Option<MaxLayer>,
}

/// Caps (or uncaps) the scalable layers a sink gets: `{"max": {"did": 0, "tid": 0}}` is the
/// base layer only, `{"max": null}` every layer again. An RTSP client's sinks are listed
/// under `GET /v1/rtsp`; they live in the session's track sessions, searched here too.
async fn pin_layers(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
    body: Result<Json<PinRequest>, JsonRejection>,
) -> ApiResult<Json<fanout_io::SinkStatus>> {
    let id = parse_id(&id)?;
    let Json(req) = body?;
    let pin = req.max.map(|m| fanout_proto::codec::layers::Layer { did: m.did, qid: m.qid, tid: m.tid });
    if pin.is_some_and(|l| l.did > 7 || l.qid > 15 || l.tid > 7) {
        return Err(ApiError(StatusCode::BAD_REQUEST, "did is 0-7, qid 0-15, tid 0-7".into()));
    }
    Ok(Json(relay.pin_layers(&name, id, pin)?))
}

async fn rtsp_clients(State(relay): State<Arc<Relay>>) -> Json<serde_json::Value> {
    let clients = relay.rtsp.lock().as_ref().map(|r| r.clients()).unwrap_or_default();
    let epochs: Vec<_> = relay
        .paths()
        .iter()
        .flat_map(|p| p.srtp.status())
        .map(|(track, clients, packets)| json!({ "track": track, "clients": clients, "packets_encrypted": packets }))
        .collect();
    Json(json!({
        "listening": *relay.rtsp_addr.lock(),
        "listening_rtsps": *relay.rtsps_addr.lock(),
        "clients": clients,
        "srtp_epochs": epochs,
    }))
}

/// This node, the directory as it reads now, and what it pulls from whom.
async fn cluster_view(State(relay): State<Arc<Relay>>) -> Result<Json<crate::cluster::ClusterView>, ApiError> {
    match &relay.cluster {
        Some(c) => Ok(Json(c.view().await)),
        None => {
            Err(ApiError(StatusCode::NOT_FOUND, "this relay is not a cluster node (no [cluster] in its config)".into()))
        }
    }
}

/// Starts this relay's binary again and hands it the listeners (`crate::upgrade`); answers
/// once the new process took over (this one then drains), or why it did not.
async fn upgrade(State(relay): State<Arc<Relay>>) -> ApiResult<Json<serde_json::Value>> {
    use crate::handover::Refused;
    relay.handover.request().await.map(Json).map_err(|e| match e {
        Refused::Running => ApiError(StatusCode::CONFLICT, e.to_string()),
        Refused::Failed(why) => ApiError(StatusCode::SERVICE_UNAVAILABLE, why),
    })
}

/// Loads the config file again and applies the difference (`crate::reload`): what changed,
/// or 400 with every problem where it is refused (and nothing changed).
async fn reload(State(relay): State<Arc<Relay>>) -> ApiResult<Json<crate::reload::Plan>> {
    crate::reload::reload(&relay).await.map(Json).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))
}

async fn engine_status(State(relay): State<Arc<Relay>>) -> Json<serde_json::Value> {
    Json(engine_json(&relay))
}

fn engine_json(relay: &Relay) -> serde_json::Value {
    let (shed_below, shed_changes) = relay.engine.shed();
    json!({
        // Which process answers (an upgrade replaces it) and which binary.
        "pid": std::process::id(),
        "version": env!("CARGO_PKG_VERSION"),
        "workers": relay.engine.workers(),
        "queued_tasks": relay.engine.queued(),
        "task_runs": relay.engine.runs(),
        "shed_below_class": shed_below,
        "shed_changes": shed_changes,
        "rtsp": *relay.rtsp_addr.lock(),
        "rtsps": *relay.rtsps_addr.lock(),
        "rtmp": *relay.rtmp_addr.lock(),
        "rtmps": *relay.rtmps_addr.lock(),
        "srt": *relay.srt_addr.lock(),
        "webrtc": relay.webrtc.lock().as_ref().map(|w| w.addr()),
        "egress": relay.engine.egress().map(|e| {
            let link = e.link.lock();
            json!({ "rate_kbps": link.rate() * 8 / 1000, "reserved_kbps": link.reserved() * 8 / 1000 })
        }),
    })
}

/// Sinks listed per session in an event (the status counts them all).
const EVENT_SINKS: usize = 100;

/// `GET /v1/events`: server-sent events, one `status` a second: the engine, every session
/// (with its first sinks) and the RTSP clients, for the dashboard and anyone who watches.
async fn events(
    State(relay): State<Arc<Relay>>,
) -> axum::response::Sse<impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>>
{
    let tick = tokio::time::interval(Duration::from_secs(1));
    let stream = futures_util::stream::unfold((relay, tick), |(relay, mut tick)| async move {
        tick.tick().await;
        let sessions: Vec<serde_json::Value> = relay
            .sessions()
            .iter()
            .map(|s| {
                let mut v = session_json(&relay, s);
                v["sinks_list"] = json!(s.sinks().into_iter().take(EVENT_SINKS).collect::<Vec<_>>());
                v
            })
            .collect();
        let clients = relay.rtsp.lock().as_ref().map(|r| r.clients()).unwrap_or_default();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let snap = json!({ "time_ms": now.as_millis() as u64, "engine": engine_json(&relay),
                           "sessions": sessions, "rtsp_clients": clients });
        let event = axum::response::sse::Event::default().event("status").data(snap.to_string());
        Some((Ok(event), (relay, tick)))
    });
    axum::response::Sse::new(stream).keep_alive(axum::response::sse::KeepAlive::default())
}

/// Writes one metric family: its HELP and TYPE lines, then its samples as (labels, value).
fn family(m: &mut String, name: &str, kind: &str, help: &str, samples: impl IntoIterator<Item = (String, u64)>) {
    let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(m, "{name}{labels} {v}");
    }
}

/// A Prometheus label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The node's place in its cluster: the directory, its pulls, its parents.
fn cluster_metrics(m: &mut String, c: &crate::cluster::Cluster) {
    let node = label(&c.cfg.node);
    let d = c.directory_state();
    let up = u64::from(d.state == "connected");
    let help = "1 while the node is registered in the cluster directory (etcd).";
    family(m, "fanout_cluster_directory_up", "gauge", help, [(format!("{{node=\"{node}\"}}"), up)]);
    let help = "Registrations in the directory (a new one after etcd came back).";
    family(
        m,
        "fanout_cluster_registrations_total",
        "counter",
        help,
        [(format!("{{node=\"{node}\"}}"), d.registrations)],
    );
    let pulls = c.pulls();
    let help = "Channels pulled from another node (1 per channel, labelled with the node).";
    let samples =
        pulls.iter().map(|p| (format!("{{channel=\"{}\",from=\"{}\"}}", label(&p.channel), label(&p.from)), 1));
    family(m, "fanout_cluster_pull", "gauge", help, samples);
    let help = "Moves of a pull to another node (failovers).";
    let samples = pulls.iter().map(|p| (format!("{{channel=\"{}\"}}", label(&p.channel)), p.switches));
    family(m, "fanout_cluster_pull_switches_total", "counter", help, samples);
    let help = "1 while a configured parent answers its health check.";
    let samples = c
        .parent_status()
        .into_iter()
        .map(|p| (format!("{{parent=\"{}\"}}", label(&p.url)), u64::from(p.health == "up")));
    family(m, "fanout_cluster_parent_up", "gauge", help, samples);
}

/// Prometheus text exposition of the same counters the status calls show.
/// The process's own figures from /proc (Prometheus' conventional `process_*` names).
fn process_metrics(m: &mut String) {
    if let Ok(s) = fanout_io::sys::ProcStat::read(None) {
        let _ = writeln!(m, "# HELP process_cpu_seconds_total User and system CPU time.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}", s.cpu_s);
        let _ = writeln!(m, "# HELP process_resident_memory_bytes Resident memory.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}", s.rss_bytes);
        let _ =
            writeln!(m, "# HELP process_threads Threads.\n# TYPE process_threads gauge\nprocess_threads {}", s.threads);
    }
    if let Some((in_use, kept)) = fanout_io::sys::malloc_figures() {
        let _ = writeln!(m, "# HELP fanout_malloc_in_use_bytes Memory the allocator has given out and not had back.\n# TYPE fanout_malloc_in_use_bytes gauge\nfanout_malloc_in_use_bytes {in_use}");
        let _ = writeln!(m, "# HELP fanout_malloc_kept_free_bytes Memory in free chunks the allocator keeps for reuse (resident until given back: the relay trims every 30 s).\n# TYPE fanout_malloc_kept_free_bytes gauge\nfanout_malloc_kept_free_bytes {kept}");
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        let _ = writeln!(
            m,
            "# HELP process_open_fds Open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {}",
            fds.count()
        );
    }
}

async fn metrics(State(relay): State<Arc<Relay>>) -> impl IntoResponse {
    let mut m = String::new();
    let sessions = relay.sessions();
    family(
        &mut m,
        "fanout_engine_task_runs_total",
        "counter",
        "Tasks run by the engine's workers.",
        [(String::new(), relay.engine.runs())],
    );
    family(
        &mut m,
        "fanout_engine_shed_below_class",
        "gauge",
        "Sessions of a class below this are shed for overload (0: none).",
        [(String::new(), u64::from(relay.engine.shed().0))],
    );
    family(&mut m, "fanout_sessions", "gauge", "Sessions configured.", [(String::new(), sessions.len() as u64)]);
    family(
        &mut m,
        "fanout_connections_refused_total",
        "counter",
        "Connections refused at accept, by reason (a cap per address or per listener).",
        relay.books.totals().into_iter().map(|(why, n)| (format!("{{reason=\"{}\"}}", label(why)), n)),
    );
    let (failed, banned) = relay.books.failed_logins();
    family(
        &mut m,
        "fanout_failed_logins_total",
        "counter",
        "Logins that failed (wrong credentials given; a wrong SRT passphrase), by face.",
        failed.into_iter().map(|(face, n)| (format!("{{face=\"{}\"}}", label(face)), n)),
    );
    family(
        &mut m,
        "fanout_banned_addresses",
        "gauge",
        "Addresses refused now for failing to log in too often (max_failed_logins).",
        [(String::new(), banned as u64)],
    );
    family(
        &mut m,
        "fanout_build_info",
        "gauge",
        "The running build (always 1).",
        [(format!("{{version=\"{}\"}}", env!("CARGO_PKG_VERSION")), 1)],
    );
    let rtsp_clients = relay.rtsp.lock().as_ref().map(|r| r.clients());
    if let Some(clients) = rtsp_clients {
        family(
            &mut m,
            "fanout_rtsp_clients",
            "gauge",
            "RTSP client sessions.",
            [(String::new(), clients.len() as u64)],
        );
        let playing = clients.iter().filter(|c| c.playing).map(|c| c.sinks.len() as u64).sum();
        family(&mut m, "fanout_rtsp_tracks_playing", "gauge", "RTSP tracks being played.", [(String::new(), playing)]);
    }
    // Readers, every face's, from each path's registry: by protocol, and (the older
    // families) by face.
    let mut by_protocol: std::collections::BTreeMap<(String, Protocol), u64> = Default::default();
    for p in relay.paths() {
        for (protocol, n) in p.readers.counts() {
            by_protocol.insert((p.name.clone(), protocol), n as u64);
        }
    }
    let of = |protocols: &[Protocol]| {
        let mut n: std::collections::BTreeMap<&str, u64> = Default::default();
        for ((path, p), k) in &by_protocol {
            if protocols.contains(p) {
                *n.entry(path.as_str()).or_default() += k;
            }
        }
        n.into_iter().map(|(path, n)| (format!("{{session=\"{}\"}}", label(path)), n)).collect::<Vec<_>>()
    };
    let help = "HLS players of the session: names with a playlist request in the last 10 s.";
    family(&mut m, "fanout_hls_players", "gauge", help, of(&[Protocol::Hls]));
    let help = "RTMP players of the session.";
    family(&mut m, "fanout_rtmp_players", "gauge", help, of(&[Protocol::Rtmp, Protocol::Rtmps]));
    family(&mut m, "fanout_srt_readers", "gauge", "SRT readers of the session.", of(&[Protocol::Srt]));
    let help = "WebRTC (WHEP) viewers of the session.";
    family(&mut m, "fanout_webrtc_viewers", "gauge", help, of(&[Protocol::Webrtc]));
    let readers = by_protocol.iter().map(|((path, protocol), n)| {
        (format!("{{session=\"{}\",protocol=\"{}\"}}", label(path), protocol.as_str()), *n)
    });
    let help = "Readers of the session by protocol, from its readers' registry (every face).";
    family(&mut m, "fanout_readers", "gauge", help, readers);
    // Publish sessions: who publishes now, over what; how many have.
    let pubs: Vec<_> = relay.paths().iter().filter_map(|p| Some((p.name.clone(), p.publisher()?.status()))).collect();
    let publishing = pubs.iter().filter(|(_, st)| st.state == "publishing").map(|(n, st)| {
        let protocol = st.transport.map_or("rtsp", |t| t.protocol());
        (format!("{{session=\"{}\",protocol=\"{protocol}\"}}", label(n)), 1)
    });
    let help = "1 while the session's publisher publishes, by protocol (rtsp, rtmp, srt).";
    family(&mut m, "fanout_publishing", "gauge", help, publishing);
    let publishes = pubs.iter().map(|(n, st)| (format!("{{session=\"{}\"}}", label(n)), st.publishes));
    family(&mut m, "fanout_publishes_total", "counter", "Publishers the session has had.", publishes);
    process_metrics(&mut m);
    if let Some(c) = &relay.cluster {
        cluster_metrics(&mut m, c);
    }
    let statuses: Vec<_> = sessions.iter().map(|s| (s.status(), s.sinks())).collect();
    type SessionFn = fn(&fanout_io::SessionStatus) -> u64;
    let per_session: [(&str, &str, &str, SessionFn); 10] = [
        (
            "fanout_delivered_packets_total",
            "counter",
            "Packets delivered to the session's sinks, removed ones too.",
            |s| s.delivered_packets_total,
        ),
        ("fanout_delivered_bytes_total", "counter", "Bytes delivered to the session's sinks, removed ones too.", |s| {
            s.delivered_bytes_total
        }),
        ("fanout_source_packets_total", "counter", "Packets received from the source.", |s| s.source.packets),
        ("fanout_source_bytes_total", "counter", "Bytes received from the source.", |s| s.source.bytes),
        ("fanout_source_oversized_total", "counter", "Datagrams dropped as larger than max_datagram.", |s| {
            s.source.oversized
        }),
        ("fanout_source_malformed_total", "counter", "Datagrams dropped as empty or not RTP.", |s| s.source.malformed),
        (
            "fanout_source_shed_total",
            "counter",
            "Packets dropped on arrival while the session's class was shed.",
            |s| s.source.shed,
        ),
        ("fanout_ring_used", "gauge", "Packets held in the session ring.", |s| s.ring_used as u64),
        ("fanout_session_sinks", "gauge", "Sinks of the session.", |s| s.sinks as u64),
        ("fanout_session_sinks_failed", "gauge", "Sinks of the session marked failed.", |s| s.sinks_failed as u64),
    ];
    for (name, kind, help, f) in per_session {
        let samples = statuses.iter().map(|(s, _)| (format!("{{session=\"{}\"}}", s.name), f(s)));
        family(&mut m, name, kind, help, samples);
    }
    type SinkFn = fn(&fanout_io::SinkStatus) -> u64;
    let per_sink: [(&str, &str, &str, SinkFn); 5] = [
        ("fanout_sink_packets_total", "counter", "Packets sent to the sink.", |k| k.packets_sent),
        ("fanout_sink_bytes_total", "counter", "Bytes sent to the sink.", |k| k.bytes_sent),
        ("fanout_sink_skipped_total", "counter", "Packets the sink skipped by slowest-sink-drop.", |k| {
            k.packets_skipped
        }),
        ("fanout_sink_errors_total", "counter", "Send errors seen by the sink.", |k| k.errors),
        ("fanout_sink_lag", "gauge", "Packets published but not yet handed to the sink.", |k| k.lag),
    ];
    for (name, kind, help, f) in per_sink {
        let samples = statuses.iter().flat_map(|(s, sinks)| {
            sinks
                .iter()
                .map(move |k| (format!("{{session=\"{}\",sink=\"{}\",path=\"{}\"}}", s.name, k.id, k.path), f(k)))
        });
        family(&mut m, name, kind, help, samples);
    }
    type KernelFn = fn(&fanout_io::kernel::KernelSessionStats) -> u64;
    let per_kernel: [(&str, &str, &str, KernelFn); 3] = [
        ("fanout_kernel_packets_total", "counter", "Source datagrams the eBPF program fanned out.", |k| k.packets),
        ("fanout_kernel_unhandled_total", "counter", "Source datagrams the eBPF program could not fan out.", |k| {
            k.unhandled
        }),
        ("fanout_kernel_sinks", "gauge", "Sinks served by the eBPF program.", |k| k.sinks as u64),
    ];
    for (name, kind, help, f) in per_kernel {
        let samples = statuses
            .iter()
            .filter_map(|(s, _)| s.kernel.as_ref().map(|k| (format!("{{session=\"{}\"}}", s.name), f(k))));
        family(&mut m, name, kind, help, samples);
    }
    let rtsp = relay.rtsp.lock().as_ref().map(|r| r.clients()).unwrap_or_default();
    family(&mut m, "fanout_rtsp_clients", "gauge", "RTSP client sessions.", [(String::new(), rtsp.len() as u64)]);
    type ClientFn = fn(&crate::clients::ClientStatus) -> Option<u64>;
    let per_client: [(&str, &str, &str, ClientFn); 3] = [
        ("fanout_rtsp_rtcp_reports_total", "counter", "RTCP reports from the client.", |c| Some(c.rtcp_reports)),
        ("fanout_rtsp_cumulative_lost", "gauge", "Packets the client reports lost since it started.", |c| {
            c.cumulative_lost.map(|v| v.max(0) as u64)
        }),
        ("fanout_rtsp_jitter", "gauge", "Interarrival jitter the client reports (RTP units).", |c| {
            c.jitter.map(u64::from)
        }),
    ];
    for (name, kind, help, f) in per_client {
        let samples = rtsp.iter().filter_map(|c| {
            f(c).map(|v| (format!("{{resource=\"{}\",rtsp_session=\"{}\"}}", c.resource, c.session), v))
        });
        family(&mut m, name, kind, help, samples);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m)
}

#[cfg(test)]
mod tests {
    #[test]
    fn webrtc_routes_are_told_by_their_shape() {
        use super::is_webrtc_route as w;
        for yes in ["/cam/whep", "/cam/whip", "/cam/whep/abc", "/v1/sessions/cam/whep", "/v1/sessions/cam/whip/abc"] {
            assert!(w(yes), "{yes}");
        }
        for no in ["/v1/sessions/whep", "/v1/sessions/whep/sinks", "/whep", "//whep", "/cam/whep/", "/a/b/whep"] {
            assert!(!w(no), "{no}");
        }
    }
}
