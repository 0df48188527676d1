//! The relay as a whole: its engine, RTSP clients, cluster, events and upgrade.

use super::*;

pub(super) async fn rtsp_clients(State(relay): State<Arc<Relay>>) -> Json<serde_json::Value> {
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
pub(super) async fn cluster_view(
    State(relay): State<Arc<Relay>>,
) -> Result<Json<crate::cluster::ClusterView>, ApiError> {
    match &relay.cluster {
        Some(c) => Ok(Json(c.view().await)),
        None => {
            Err(ApiError(StatusCode::NOT_FOUND, "this relay is not a cluster node (no [cluster] in its config)".into()))
        }
    }
}

/// Starts this relay's binary again and hands it the listeners (`crate::upgrade`); answers
/// once the new process took over (this one then drains), or why it did not.
pub(super) async fn upgrade(State(relay): State<Arc<Relay>>) -> ApiResult<Json<serde_json::Value>> {
    use crate::handover::Refused;
    relay.handover.request().await.map(Json).map_err(|e| match e {
        Refused::Running => ApiError(StatusCode::CONFLICT, e.to_string()),
        Refused::Failed(why) => ApiError(StatusCode::SERVICE_UNAVAILABLE, why),
    })
}

pub(super) async fn engine_status(State(relay): State<Arc<Relay>>) -> Json<serde_json::Value> {
    Json(engine_json(&relay))
}

pub(super) fn engine_json(relay: &Relay) -> serde_json::Value {
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
pub(super) const EVENT_SINKS: usize = 100;

/// `GET /v1/events`: server-sent events, one `status` a second: the engine, every session
/// (with its first sinks) and the RTSP clients, for the dashboard and anyone who watches.
pub(super) async fn events(
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
