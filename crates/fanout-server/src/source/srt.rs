//! `srt`: the relay calls a remote SRT listener (an encoder, a contribution link, another
//! relay) and reads its MPEG-TS, again with backoff (1 s doubling to 30 s) when it goes. Its
//! stream becomes the path's tracks as an SRT publisher's does; the path takes no publisher
//! from outside. On demand, it calls only while someone reads (from a reader's ask until
//! `linger_s` after the last).

use super::{Ctx, Feeder, Started};
use crate::error::RelayError;
use crate::publish::Publisher;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

/// Connection ids of pulls, apart from the listener's publishers.
const CONN_BASE: u64 = 3 << 60;

pub fn start(src: &crate::spec::PullSource, cx: &Ctx) -> Result<Started, RelayError> {
    let u =
        fanout_proto::srt::parse_url(&src.url).map_err(|e| RelayError::BadRequest(format!("source \"srt\": {e}")))?;
    fanout_srt::version().map_err(|e| RelayError::Unsupported(format!("source \"srt\": {e}")))?;
    let pulled = if src.on_demand == Some(true) { Publisher::pulled_on_demand } else { Publisher::pulled };
    let p =
        Arc::new(pulled(cx.name, cx.session.clone()).map_err(|e| RelayError::Internal(format!("srt source: {e}")))?);
    let shown = format!("srt://{}:{}", u.host, u.port);
    cx.session.set_source_kind(format!("srt pull of {shown}"));
    let settings = fanout_srt::Settings {
        latency_ms: u.latency_ms.or(Some(cx.cfg.srt_latency_ms)),
        passphrase: u.passphrase.clone(),
        pbkeylen: u.pbkeylen,
        streamid: u.streamid.clone(),
        ..fanout_srt::Settings::default()
    };
    let idle = Duration::from_secs_f64(cx.cfg.rtsp_idle_s.min(10.0));
    let linger = Duration::from_secs_f64(src.linger_s.unwrap_or(10.0));
    let (p2, host) = (p.clone(), cx.host.clone());
    let task = tokio::spawn(async move {
        super::pull_loop(&p2, "SRT", &shown.clone(), CONN_BASE, |conn, label| {
            let (u, settings, p, host, shown) = (u.clone(), settings.clone(), p2.clone(), host.clone(), shown.clone());
            let p3 = p2.clone();
            async move {
                super::on_blocking_thread(&p3, linger, move |stop| {
                    let run = || {
                        let host = host.upgrade().ok_or("the relay is shutting down")?;
                        let addr = (u.host.as_str(), u.port)
                            .to_socket_addrs()
                            .map_err(|e| e.to_string())?
                            .next()
                            .ok_or_else(|| format!("{} has no address", u.host))?;
                        let socket = fanout_srt::Socket::connect(addr, &settings, 3000).map_err(|e| e.to_string())?;
                        p.set_pull_error(None);
                        tracing::info!(url = %shown, "SRT source connected");
                        Ok::<_, String>(p.run_ts(&socket, &label, conn, addr.ip(), host.engine(), idle, &stop))
                    };
                    match run() {
                        Ok(ended) => (format!("ended: {ended}"), true),
                        Err(e) => (e, false),
                    }
                })
                .await
            }
        })
        .await
    });
    Ok(Started { feeder: Feeder::Publisher(p), tasks: vec![task.abort_handle()] })
}
