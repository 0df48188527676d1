//! WHEP and WHIP over HTTP: offers, trickle PATCH, DELETE of a resource, CORS and auth.

use super::*;

/// WHEP's routes: `POST` an offer to `/v1/sessions/{name}/whep` (or `/{name}/whep`, as
/// MediaMTX has it), `PATCH` (trickle ICE: the relay is ICE-lite and needs none of the
/// browser's candidates, so it takes and ignores them) and `DELETE` its resource; CORS for
/// pages of any origin.
pub fn routes() -> axum::Router<Arc<Relay>> {
    use axum::routing::post;
    let resource = || post(|| async { StatusCode::METHOD_NOT_ALLOWED }).patch(patch).delete(delete).options(preflight);
    axum::Router::new()
        .route("/v1/sessions/{name}/whep", post(offer).options(preflight))
        .route("/v1/sessions/{name}/whep/{id}", resource())
        .route("/{name}/whep", post(offer).options(preflight))
        .route("/{name}/whep/{id}", resource())
        .route("/v1/sessions/{name}/whip", post(offer).options(preflight))
        .route("/v1/sessions/{name}/whip/{id}", resource())
        .route("/{name}/whip", post(offer).options(preflight))
        .route("/{name}/whip/{id}", resource())
        .route_layer(axum::middleware::map_response(cors))
        .route_layer(axum::extract::DefaultBodyLimit::max(MAX_OFFER))
}

use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;

async fn cors(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, header::HeaderValue::from_static("*"));
    h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, header::HeaderValue::from_static("Location, ETag, Link"));
    r
}

async fn preflight() -> Response {
    let headers = [
        (header::ACCESS_CONTROL_ALLOW_METHODS, "POST, PATCH, DELETE, OPTIONS"),
        (header::ACCESS_CONTROL_ALLOW_HEADERS, "Authorization, Content-Type, If-Match"),
        (header::ACCESS_CONTROL_MAX_AGE, "600"),
    ];
    (StatusCode::NO_CONTENT, headers).into_response()
}

fn text(status: u16, why: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "text/plain")], why).into_response()
}

/// The client's address, where the HTTP listener gave it.
type Client = Option<Extension<ConnectInfo<SocketAddr>>>;

/// A WHEP or WHIP offer (the route says which).
async fn offer(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
    client: Client,
    RawQuery(query): RawQuery,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let what = if uri.path().ends_with("/whip") { "whip" } else { "whep" };
    let caller = Caller { ip: client.map(|c| c.0 .0.ip()), owner: credentials(&headers, query.as_deref()) };
    negotiated(relay, name, caller, headers, query, body, what).await
}

/// A digest of the credentials a request gave (its `Authorization`, else its `?token=`).
fn credentials(headers: &HeaderMap, query: Option<&str>) -> Option<[u8; 32]> {
    let given = match headers.get(header::AUTHORIZATION) {
        Some(v) => v.as_bytes().to_vec(),
        None => query?.split('&').find_map(|kv| kv.strip_prefix("token="))?.as_bytes().to_vec(),
    };
    let d = ring::digest::digest(&ring::digest::SHA256, &given);
    d.as_ref().try_into().ok()
}

/// Who acts on a peer: the holder of the API token on any, anyone else on the ones its
/// credentials made.
fn acting(relay: &Relay, headers: &HeaderMap, query: Option<&str>) -> Acting {
    let token = relay.cfg().token.clone();
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if token.is_some() && fanout_proto::auth::token_given(token.as_deref(), auth, query) {
        return Acting::Admin;
    }
    Acting::As(credentials(headers, query))
}

/// The configured STUN/TURN servers as `Link` headers (RFC 9725 §4.6), for clients behind
/// NAT; config validation keeps quotes and angle brackets out of them.
fn ice_servers(relay: &Relay, h: &mut HeaderMap) {
    for s in &relay.cfg().webrtc_ice_servers {
        let mut link = format!("<{}>; rel=\"ice-server\"", s.url);
        if let (Some(u), Some(c)) = (&s.username, &s.credential) {
            link += &format!("; username=\"{u}\"; credential=\"{c}\"; credential-type=\"password\"");
        }
        if let Ok(v) = header::HeaderValue::from_str(&link) {
            h.append(header::LINK, v);
        }
    }
}

/// Whether a WHEP/WHIP request may go on. WebRTC is a stream face on the API's port: it takes
/// the API token (`Authorization: Bearer`, or `?token=` for players that cannot set a
/// header) and the stream users RTSP, RTMP and SRT take (`rtsp_user`, the token as user
/// `token` where `rtsp_require_token`), as HTTP Basic; then `[auth]` where configured. With
/// none of them, it is open. `publish`: a WHIP request.
async fn allowed(
    relay: &Relay,
    headers: &HeaderMap,
    query: Option<&str>,
    ip: Option<IpAddr>,
    name: &str,
    publish: bool,
) -> bool {
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let token = relay.cfg().token.clone();
    let by_token = token.as_ref().map(|_| fanout_proto::auth::token_given(token.as_deref(), auth, query));
    let basic = auth.and_then(fanout_proto::http::basic_credentials);
    use fanout_proto::auth::Action;
    let action = if publish { Action::Publish } else { Action::Read };
    let ip = ip.unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let (user, pass) = basic.as_ref().map_or((None, None), |b| (Some(b.0.as_str()), Some(b.1.as_str())));
    let by_user = relay.login(user, pass, ip, action, name, true);
    let local = match (by_token, by_user) {
        (None, None) => None,
        (a, b) => Some(a == Some(true) || b == Some(true)),
    };
    relay.permit(local, fanout_proto::auth::http_request(auth, query, ip, action, name, "webrtc")).await
}

/// 401, with the schemes this relay takes.
fn unauthorized(relay: &Relay) -> Response {
    let mut schemes = Vec::new();
    if relay.cfg().token.is_some() {
        schemes.push("Bearer");
    }
    if !relay.cfg().login_users(true).is_empty() {
        schemes.push("Basic realm=\"fanout\"");
    }
    let mut r = text(401, "missing or wrong credentials (the API token as Bearer, or a stream user as Basic)".into());
    if let Ok(v) = header::HeaderValue::from_str(&schemes.join(", ")) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// A WHEP (`whep`) or WHIP (`whip`) offer: `201` with the answer and the peer's resource,
/// or the refusal with its reason.
async fn negotiated(
    relay: Arc<Relay>,
    name: String,
    caller: Caller,
    headers: HeaderMap,
    query: Option<String>,
    body: String,
    what: &str,
) -> Response {
    let client = caller.ip;
    if !allowed(&relay, &headers, query.as_deref(), client, &name, what == "whip").await {
        tracing::info!(path = %name, ?client, "{} offer refused (401): no valid credentials", what.to_uppercase());
        return unauthorized(&relay);
    }
    let Some(w) = face(&relay) else {
        return text(503, "WebRTC is off on this relay (webrtc = \"off\", or its port was taken)".into());
    };
    let sdp = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/sdp"));
    if !sdp {
        return text(415, format!("a {} offer is Content-Type: application/sdp", what.to_uppercase()));
    }
    let done = match what {
        "whip" => w.publish(&relay, &name, &body, caller).await,
        _ => w.offer(&relay, &name, &body, caller).await,
    };
    match done {
        Ok((answer, id)) => {
            let location = format!("/v1/sessions/{name}/{what}/{id}");
            let headers = [(header::CONTENT_TYPE, "application/sdp".to_string()), (header::LOCATION, location)];
            let mut r = (StatusCode::CREATED, headers, answer).into_response();
            ice_servers(&relay, r.headers_mut());
            r
        }
        Err(Refused(status, why)) => {
            tracing::info!(path = %name, "{} offer refused ({status}): {why}", what.to_uppercase());
            text(status, why)
        }
    }
}

/// A request on a peer's resource (`PATCH`, `DELETE`): who asks, once allowed on the path,
/// and for which of its peers' roles; `Err`: the answer already.
struct ResourceRequest {
    role: &'static str,
    by: Acting,
}

impl ResourceRequest {
    async fn of(
        relay: &Relay,
        name: &str,
        query: Option<&str>,
        client: Client,
        uri: &axum::http::Uri,
        headers: &HeaderMap,
    ) -> Result<Self, Response> {
        let ip = client.map(|c| c.0 .0.ip());
        let publish = uri.path().contains("/whip/");
        if !allowed(relay, headers, query, ip, name, publish).await {
            return Err(unauthorized(relay));
        }
        let role = if publish { "publisher" } else { "viewer" };
        Ok(Self { role, by: acting(relay, headers, query) })
    }
}

/// Another's peer is answered as one that is not there: its id tells nothing.
fn no_peer(name: &str, id: &str) -> Response {
    text(404, format!("no WebRTC viewer {id} of {name}"))
}

async fn patch(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    client: Client,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let r = match ResourceRequest::of(&relay, &name, query.as_deref(), client, &uri, &headers).await {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    let mine = |v: &ViewerStatus| v.id == id && v.role == r.role && owns(v, r.by);
    match face(&relay).filter(|w| w.viewers(Some(&name)).iter().any(mine)) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => no_peer(&name, &id),
    }
}

async fn delete(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    client: Client,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let r = match ResourceRequest::of(&relay, &name, query.as_deref(), client, &uri, &headers).await {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    match face(&relay) {
        Some(w) if w.end(&name, &id, r.role, r.by).await => StatusCode::OK.into_response(),
        _ => no_peer(&name, &id),
    }
}
