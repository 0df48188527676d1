//! `srt`: the relay calls a remote SRT listener (an encoder, a contribution link, another
//! relay) and reads its MPEG-TS, again with backoff (1 s doubling to 30 s) when it goes. Its
//! stream becomes the path's tracks as an SRT publisher's does; the path takes no publisher
//! from outside. On demand, it calls only while someone reads (from a reader's ask until
//! `linger_s` after the last).

use super::{Ctx, Feeder, Started, StopOnDrop};
use crate::error::RelayError;
use crate::publish::Publisher;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    cx.session.set_source_kind(format!("srt pull of srt://{}:{}", u.host, u.port));
    let settings = fanout_srt::Settings {
        latency_ms: u.latency_ms.or(Some(cx.cfg.srt_latency_ms)),
        passphrase: u.passphrase.clone(),
        pbkeylen: u.pbkeylen,
        streamid: u.streamid.clone(),
        ..fanout_srt::Settings::default()
    };
    let idle = Duration::from_secs_f64(cx.cfg.rtsp_idle_s.min(10.0));
    let linger = Duration::from_secs_f64(src.linger_s.unwrap_or(10.0));
    let task = tokio::spawn(pull(u, settings, p.clone(), cx.host.clone(), (idle, linger)));
    Ok(Started { feeder: Feeder::Publisher(p), tasks: vec![task.abort_handle()] })
}

async fn pull(
    u: fanout_proto::srt::SrtUrl,
    settings: fanout_srt::Settings,
    p: Arc<Publisher>,
    host: std::sync::Weak<dyn crate::upstream::Host>,
    (idle, linger): (Duration, Duration),
) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut backoff = Duration::from_secs(1);
    loop {
        if !p.wanted() {
            p.set_pull_error(Some("on demand: no reader".into()));
            p.until_wanted().await;
        }
        // This connection's end: set when the path goes (the task aborted) or, on demand,
        // a linger after the last reader.
        let stop = Arc::new(AtomicBool::new(false));
        let _guard = StopOnDrop(stop.clone());
        let (u2, settings, p2, host, stop2) = (u.clone(), settings.clone(), p.clone(), host.clone(), stop.clone());
        let mut run = tokio::task::spawn_blocking(move || {
            let host = host.upgrade().ok_or("the relay is shutting down")?;
            let addr = (u2.host.as_str(), u2.port)
                .to_socket_addrs()
                .map_err(|e| e.to_string())?
                .next()
                .ok_or_else(|| format!("{} has no address", u2.host))?;
            let socket = fanout_srt::Socket::connect(addr, &settings, 3000).map_err(|e| e.to_string())?;
            p2.set_pull_error(None);
            tracing::info!(url = %format!("srt://{}:{}", u2.host, u2.port), "SRT source connected");
            let conn = CONN_BASE | NEXT.fetch_add(1, Ordering::Relaxed);
            let label = format!("srt-pull-{}", conn & !CONN_BASE);
            Ok::<_, String>(p2.run_ts(&socket, &label, conn, addr.ip(), host.engine(), idle, &stop2))
        });
        let run = tokio::select! {
            r = &mut run => r,
            () = unwanted_for(&p, linger) => {
                stop.store(true, Ordering::Relaxed);
                let _ = run.await;
                tracing::info!(url = %format!("srt://{}:{}", u.host, u.port), "SRT source: nobody read it for {linger:?} (on demand)");
                continue;
            }
        };
        let why = match run {
            Ok(Ok(ended)) => {
                backoff = Duration::from_secs(1);
                format!("ended: {ended}")
            }
            Ok(Err(e)) => e,
            Err(e) => e.to_string(),
        };
        tracing::info!(url = %format!("srt://{}:{}", u.host, u.port), "SRT source: {why}; again in {backoff:?}");
        p.set_pull_error(Some(why));
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// Returns once the stream was not wanted for `linger` (never for a pull that is always on).
async fn unwanted_for(p: &Publisher, linger: Duration) {
    let mut since = None;
    let mut look = tokio::time::interval(Duration::from_secs(1));
    loop {
        look.tick().await;
        if p.wanted() {
            since = None;
        } else if since.get_or_insert_with(std::time::Instant::now).elapsed() >= linger {
            return;
        }
    }
}
