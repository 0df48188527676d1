//! Paths (`/v1/sessions`): made, shown, deleted; their readers and publisher listed and ended.

use super::*;

pub(super) async fn create_session(
    State(relay): State<Arc<Relay>>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> ApiResult<impl IntoResponse> {
    let Json(v) = body?;
    let spec = read_spec(v)?;
    if spec.has_hooks() {
        // A command the relay runs is the operator's to set, in the config file.
        let why = "run_on_* and on_* commands can be set in the config file only, not through the API";
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
pub(super) fn read_spec(v: serde_json::Value) -> ApiResult<SessionSpec> {
    use crate::spec::{SourceFields, SourceSpec};
    if let Some(Ok(fields)) = v.get("source").map(|s| serde_json::from_value::<SourceFields>(s.clone())) {
        SourceSpec::try_from(fields).map_err(|why| ApiError(StatusCode::BAD_REQUEST, why.0))?;
    }
    // The field's path in the message, as the extractor gives it (`pace_link: unknown variant`).
    serde_path_to_error::deserialize(v).map_err(|e| {
        ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Failed to deserialize the JSON body into the target type: {e}"),
        )
    })
}

pub(super) fn session_json(relay: &Relay, s: &fanout_io::Session) -> serde_json::Value {
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
    // Its AAC as Opus while WebRTC viewers need it, its Opus or G.711 as AAC while its
    // repackaging does.
    let transcodes = path.transcodes_running();
    if !transcodes.is_empty() {
        v["transcoding"] = json!(transcodes
            .iter()
            .map(|t| {
                let (st, from, to) = (t.track.session.status(), t.from, t.to.name());
                json!({ "from": from, "to": to, "session": t.track.session.name(),
                        "subscribers": st.sinks, "packets": st.source.packets })
            })
            .collect::<Vec<_>>());
    }
    if !path.forwards.is_empty() {
        v["forward"] = json!(path.forwards.iter().map(|f| f.status()).collect::<Vec<_>>());
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
    v["flv_url"] = json!(format!("{http}://{}/{}.flv", relay.cfg().api, s.name()));
    // The same URL as a WebSocket (for browsers' FLV players).
    let ws = if relay.cfg().https() { "wss" } else { "ws" };
    v["ws_flv_url"] = json!(format!("{ws}://{}/{}.flv", relay.cfg().api, s.name()));
    v["stream_format"] = json!(stream_format(&path));
    if let Some(r) = repackaging_json(&path, &counts) {
        v["repackaging"] = r;
    }
    v
}

/// What a path's stream is repackaged into while it is (TS, HLS, FLV), and who reads each.
fn repackaging_json(
    path: &crate::path::Path,
    counts: &std::collections::HashMap<Protocol, usize>,
) -> Option<serde_json::Value> {
    let r = path.repack_running()?;
    let ts = r.ts.as_ref().map(|ts| {
        let st = ts.status();
        json!({ "session": ts.name(), "sinks": st.sinks, "datagrams": st.source.packets, "bytes_sent": st.bytes_sent })
    });
    let hls = r.hls.as_ref().map(|h| {
        let players = counts.get(&Protocol::Hls).copied().unwrap_or(0);
        let served = h.bytes_served();
        h.with(|s| {
            let variant = match s.variant() {
                fanout_proto::container::hls::Variant::LowLatency => "low_latency",
                fanout_proto::container::hls::Variant::Fmp4 => "fmp4",
                fanout_proto::container::hls::Variant::MpegTs => "mpegts",
            };
            json!({ "variant": variant, "segments": s.last(), "codecs": s.codecs(), "players": players, "bytes_served": served })
        })
    });
    // RTMP players read its FLV.
    let players = [Protocol::Rtmp, Protocol::Rtmps].iter().filter_map(|p| counts.get(p)).sum::<usize>();
    // Plain HTTP-FLV and RTMP players are sinks of the FLV's sessions.
    let of = |form| {
        r.flv.as_ref().and_then(|f| f.session(form)).map(|s| {
            let st = s.status();
            json!({ "session": s.name(), "sinks": st.sinks, "datagrams": st.source.packets, "bytes_sent": st.bytes_sent })
        })
    };
    let rtmp = r.flv.as_ref().map(|_| json!({ "players": players, "session": of(crate::repack::Form::Rtmp) }));
    let flv = of(crate::repack::Form::File);
    Some(json!({ "from": r.describes, "ts": ts, "hls": hls, "rtmp": rtmp, "flv": flv }))
}

/// What the stream URL delivers.
pub(super) fn stream_format(path: &crate::path::Path) -> &'static str {
    if path.view().is_some() {
        "mpegts"
    } else if path.is_rtp_media() {
        "mpegts (repackaged from its RTP video and audio)"
    } else {
        "payload (each datagram's, as received: MPEG-TS from an MPEG-TS source)"
    }
}

pub(super) async fn list_sessions(State(relay): State<Arc<Relay>>) -> Json<serde_json::Value> {
    Json(json!({ "sessions": relay.sessions().iter().map(|s| session_json(&relay, s)).collect::<Vec<_>>() }))
}

pub(super) async fn get_session(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let s = relay.session(&name)?;
    Ok(Json(session_json(&relay, &s)))
}

/// Every reader of every path.
pub(super) async fn all_readers(State(relay): State<Arc<Relay>>) -> Json<Vec<crate::readers::ReaderStatus>> {
    Json(relay.paths().iter().flat_map(|p| p.readers.list()).collect())
}

pub(super) async fn list_readers(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> ApiResult<Json<Vec<crate::readers::ReaderStatus>>> {
    let path = relay.path(&name).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no path {name}")))?;
    Ok(Json(path.readers.list()))
}

pub(super) fn reader_not_found(name: &str, id: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("{name} has no reader {id}"))
}

pub(super) async fn get_reader(
    State(relay): State<Arc<Relay>>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<Json<crate::readers::ReaderStatus>> {
    let reader = relay.path(&name).and_then(|p| p.readers.get(&id));
    Ok(Json(reader.ok_or_else(|| reader_not_found(&name, &id))?))
}

/// Ends one reader, whatever its protocol: its client is told the end its protocol's way.
pub(super) async fn kick_reader(
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
pub(super) async fn get_publisher(
    State(relay): State<Arc<Relay>>,
    Path(name): Path<String>,
) -> ApiResult<Json<crate::publish::PublisherStatus>> {
    let path = relay.path(&name).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no path {name}")))?;
    let publisher =
        path.publisher().ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("{name} takes no publisher")))?;
    Ok(Json(publisher.status()))
}

/// Ends the path's publisher, whatever its protocol; the path waits for the next one.
pub(super) async fn kick_publisher(State(relay): State<Arc<Relay>>, Path(name): Path<String>) -> ApiResult<StatusCode> {
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

pub(super) async fn delete_session(State(relay): State<Arc<Relay>>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    relay.delete(&name).await?;
    if let Some(st) = relay.state.get() {
        st.session_deleted(&name);
    }
    Ok(StatusCode::NO_CONTENT)
}
