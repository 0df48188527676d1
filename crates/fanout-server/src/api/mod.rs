//! The control API (HTTP/JSON): the four OMSS calls and what a person needs around them.
//! `docs/openapi.yaml` describes it.

mod admin;
mod hls;
mod metrics;
mod paths;
mod sinks;

use admin::*;
use hls::*;
use metrics::*;
use paths::*;
use sinks::*;

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
        ["", "metrics"] => (Action::Metrics, String::new(), "metrics"),
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

/// HLS and the streams may be read from any origin: players on other sites (hls.js over
/// XHR), as an HTTP cache or CDN in front of the relay would serve them.
async fn any_origin(mut r: Response) -> Response {
    r.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, header::HeaderValue::from_static("*"));
    r
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
    let ip = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    let (action, name, protocol) = api_action(path);
    let local = crate::relay::http_login(&relay, h, query, ip, action, &name);
    let ask = fanout_proto::auth::http_request(h, req.uri().query(), ip, action, &name, protocol);
    if relay.permit(local, ask).await {
        next.run(req).await
    } else {
        let users = !relay.cfg().users.is_empty();
        let why = if users {
            "missing or wrong credentials (the token as Bearer, or a user as Basic)"
        } else {
            "missing or wrong bearer token"
        };
        let mut r = ApiError(StatusCode::UNAUTHORIZED, why.into()).into_response();
        let schemes = if users { "Bearer, Basic realm=\"fanout\"" } else { "Bearer" };
        r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static(schemes));
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
