//! A path's UDP/TCP sinks through the API, and the layers of layered video each gets.

use super::*;

pub(super) async fn add_sink(
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

pub(super) async fn list_sinks(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(json!({ "sinks": relay.session(&name)?.sinks() })))
}

pub(super) async fn flush_sinks(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let removed = relay.session(&name)?.remove_all_sinks();
    if let Some(st) = relay.state.get() {
        st.sinks_flushed(&name);
    }
    tracing::info!(session = %name, removed, "sinks flushed");
    Ok(Json(json!({ "removed": removed })))
}

pub(super) fn parse_id(id: &str) -> ApiResult<u64> {
    id.parse().map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("sink id {id:?} is not a number")))
}

pub(super) async fn get_sink(
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

pub(super) async fn remove_sink(
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
pub(super) struct MaxLayer {
    #[serde(default = "all_did")]
    did: u8,
    #[serde(default = "all_qid")]
    qid: u8,
    #[serde(default = "all_tid")]
    tid: u8,
}

pub(super) fn all_did() -> u8 {
    fanout_proto::rtp::adapt::ALL.did
}
pub(super) fn all_qid() -> u8 {
    fanout_proto::rtp::adapt::ALL.qid
}
pub(super) fn all_tid() -> u8 {
    fanout_proto::rtp::adapt::ALL.tid
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PinRequest {
    /// `null` lifts the cap.
    max: Option<MaxLayer>,
}

/// Caps (or uncaps) the scalable layers a sink gets: `{"max": {"did": 0, "tid": 0}}` is the
/// base layer only, `{"max": null}` every layer again. An RTSP client's sinks are listed
/// under `GET /v1/rtsp`; they live in the session's track sessions, searched here too.
pub(super) async fn pin_layers(
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
