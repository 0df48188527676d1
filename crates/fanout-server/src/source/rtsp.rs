//! `rtsp`: pulled from an RTSP(S) server, one upstream session for every client
//! (`crate::upstream`); each media section is a track of the path.

use super::{Ctx, Feeder, Started};
use crate::error::RelayError;
use crate::spec::RtspSource;
use std::time::Duration;

pub fn start(r: &RtspSource, cx: Ctx) -> Result<Started, RelayError> {
    let url = r.parsed_url()?;
    // An rtsps:// source's certificate check, set up now: a CA file that does not load is
    // the creator's error, not a retry loop's.
    let tls = if url.tls {
        let v = r.upstream_verify()?;
        if v == crate::tls::Verify::Off {
            tracing::warn!(session = cx.name, "rtsps:// upstream without certificate checks (tls_verify = false)");
        }
        let cfg = crate::tls::client_config(&v);
        Some(cfg.map_err(|e| RelayError::BadRequest(format!("source \"tls_ca\": {e:#}")))?)
    } else {
        None
    };
    cx.session.set_source_kind(format!("rtsp {}", url.request_url()));
    let o = crate::upstream::UpstreamOptions {
        tls,
        url,
        origin: cx.origin,
        mode: r.transport.unwrap_or_default(),
        on_demand: r.on_demand.unwrap_or(true),
        linger: Duration::from_secs_f64(r.linger_s.unwrap_or(10.0)),
        silence: Duration::from_secs_f64(r.timeout_s.unwrap_or(10.0)),
    };
    let up = crate::upstream::Upstream::new(cx.name, o, cx.session)
        .map_err(|e| RelayError::Internal(format!("rtsp source: {e}")))?;
    let run = crate::upstream::run(up.clone(), cx.session.config().clone(), cx.host);
    let on_end = cx.on_pull_end;
    let task = tokio::spawn(async move {
        run.await;
        if let Some(f) = on_end {
            f();
        }
    });
    Ok(Started { feeder: Feeder::Upstream(up), tasks: vec![task.abort_handle()] })
}
