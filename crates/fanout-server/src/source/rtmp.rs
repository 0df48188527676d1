//! `rtmp`: the relay plays a stream from another RTMP(S) server (MediaMTX, SRS, nginx-rtmp,
//! another fanout) and its FLV becomes the path's tracks as an RTMP publisher's does, with
//! the same clock map and restamping across reconnections; the path takes no publisher from
//! outside. Connected again with backoff (1 s doubling to 30 s) when it goes. On demand, it
//! plays only while someone reads (from a reader's ask until `linger_s` after the last).

use super::{Ctx, Feeder, Started};
use crate::error::RelayError;
use crate::publish::Publisher;
use fanout_proto::rtmp::client::{Client, Event, Role, RtmpUrl};
use fanout_proto::rtmp::ingest::Ingest;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Connection ids of RTMP pulls, apart from every other publisher's.
const CONN_BASE: u64 = 5 << 60;
/// Connecting, the handshake and the play's answer: within this.
const SETUP: Duration = Duration::from_secs(10);

pub fn start(src: &crate::spec::PullSource, cx: &Ctx) -> Result<Started, RelayError> {
    let bad = |e: String| RelayError::BadRequest(format!("source \"rtmp\": {e}"));
    let url = RtmpUrl::parse(&src.url).map_err(|e| bad(e.0))?;
    let verify = crate::tls::verify_of(&src.tls_ca, &src.tls_fingerprint, src.tls_verify).map_err(|e| bad(e.0))?;
    let tls = url.tls.then(|| crate::tls::client_config(&verify)).transpose().map_err(|e| bad(format!("{e:#}")))?;
    let on_demand = src.on_demand == Some(true);
    let p = if on_demand { Publisher::pulled_on_demand } else { Publisher::pulled };
    let p = Arc::new(p(cx.name, cx.session.clone()).map_err(|e| RelayError::Internal(format!("rtmp source: {e}")))?);
    cx.session.set_source_kind(format!("rtmp pull of {}", url.shown()));
    let idle = Duration::from_secs_f64(cx.cfg.rtsp_idle_s.clamp(1.0, 10.0));
    let linger = Duration::from_secs_f64(src.linger_s.unwrap_or(10.0));
    let task = tokio::spawn(pull(url, tls, p.clone(), cx.host.clone(), (idle, linger)));
    Ok(Started { feeder: Feeder::Publisher(p), tasks: vec![task.abort_handle()] })
}

async fn pull(
    url: RtmpUrl,
    tls: Option<Arc<rustls::ClientConfig>>,
    p: Arc<Publisher>,
    host: Weak<dyn crate::upstream::Host>,
    times: (Duration, Duration),
) {
    super::pull_loop(&p, "RTMP", &url.shown(), CONN_BASE, |conn, label| {
        let (url, tls, p, host) = (&url, tls.as_ref(), &p, &host);
        async move {
            let mut fed = false;
            let why = play(url, tls, p, host, times, conn, &label, &mut fed).await;
            (why, fed)
        }
    })
    .await
}

/// One connection: plays the stream into the publisher side until it ends; why it ended.
/// `fed`: set once the stream's tracks started.
#[allow(clippy::too_many_arguments)]
async fn play(
    url: &RtmpUrl,
    tls: Option<&Arc<rustls::ClientConfig>>,
    p: &Publisher,
    host: &Weak<dyn crate::upstream::Host>,
    (idle, linger): (Duration, Duration),
    conn: u64,
    label: &str,
    fed: &mut bool,
) -> String {
    let (mut io, peer) = match crate::dial::dial(&url.host, url.port, tls, SETUP).await {
        Ok(c) => c,
        Err(e) => return e,
    };
    let mut client = Client::new(url.clone(), Role::Play, crate::dial::seed());
    let mut buf = vec![0u8; 64 << 10];
    if let Err(e) = crate::dial::rtmp_start(&mut io, &mut client, &mut buf, SETUP).await {
        return e;
    }
    p.set_pull_error(None);
    tracing::info!(url = %url.shown(), "RTMP source playing");
    let mut ingest = Ingest::default();
    let mut packets = Vec::new();
    let (mut heard, mut unwanted_since) = (std::time::Instant::now(), None);
    let mut look = tokio::time::interval(Duration::from_secs(1));
    loop {
        while let Some(e) = client.poll_event() {
            let r = match e {
                Event::Video { timestamp, body } => ingest.video(timestamp, &body, &mut packets),
                Event::Audio { timestamp, body } => ingest.audio(timestamp, &body, &mut packets),
                Event::Refused(why) => return format!("the server ended the stream: {why}"),
                Event::Started => Ok(()),
            };
            if let Err(e) = r {
                tracing::debug!(url = %url.shown(), "RTMP source tag: {e}");
            }
            if !*fed {
                let Some(sdp) = ingest.sdp() else {
                    packets.clear();
                    continue;
                };
                let Some(host) = host.upgrade() else { return "the relay is shutting down".into() };
                let started = fanout_proto::rtsp::sdp::Sdp::parse(&sdp)
                    .map_err(|e| format!("its description: {e}"))
                    .and_then(|sdp| {
                        p.start_stream(
                            crate::publish::Ingest::Rtmp,
                            label.to_string(),
                            conn,
                            peer.ip(),
                            sdp,
                            host.engine(),
                        )
                        .map_err(|e| e.to_string())
                    });
                if let Err(e) = started {
                    return format!("its tracks could not start: {e}");
                }
                *fed = true;
            }
            for mut pkt in packets.drain(..) {
                p.feed_rtp(conn, pkt.track, &mut pkt.data, pkt.waited_ms);
            }
        }
        let out = client.take_output();
        if !out.is_empty() {
            if let Err(e) = tokio::time::timeout(SETUP, tokio::io::AsyncWriteExt::write_all(&mut io, &out))
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
            {
                return format!("the server went: {e}");
            }
        }
        // What comes, looking once a second at the silence and (on demand) at the readers.
        let n = loop {
            tokio::select! {
                r = io.read(&mut buf) => match r {
                    Err(e) => return format!("the server went: {e}"),
                    Ok(0) => return "the server closed the connection".into(),
                    Ok(n) => break n,
                },
                _ = look.tick() => {
                    if heard.elapsed() >= idle {
                        return format!("nothing came for {idle:?}");
                    }
                    if p.wanted() {
                        unwanted_since = None;
                    } else if unwanted_since.get_or_insert_with(std::time::Instant::now).elapsed() >= linger {
                        return format!("nobody read it for {linger:?} (on demand)");
                    }
                }
            }
        };
        heard = std::time::Instant::now();
        if let Err(e) = client.input(&buf[..n]) {
            return format!("the server's RTMP: {e}");
        }
    }
}
