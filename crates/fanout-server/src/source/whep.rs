//! `whep`: the relay views another server's WebRTC output (MediaMTX's `/PATH/whep`, another
//! fanout's, a platform's) and its media becomes the path's tracks as a WHIP publisher's
//! does: H.264, VP8, VP9 or AV1 video and Opus audio, with the same clock map and restamping
//! across reconnections. It offers to receive, POSTs the offer, and once ICE and DTLS are up
//! feeds every RTP packet `str0m` hands it into the publisher side, asking for a keyframe
//! at the start and when a reader wants one. Connected again with backoff (1 s doubling to
//! 30 s) when it goes or falls silent; on demand as an `rtmp` source is. Blocking, on a
//! thread of its own with a UDP socket of its own.

use super::{Ctx, Feeder, Started, StopOnDrop};
use crate::error::RelayError;
use crate::publish::Publisher;
use fanout_proto::whep::WhipUrl;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use str0m::change::SdpAnswer;
use str0m::media::{Direction, KeyframeRequestKind, MediaKind};
use str0m::{Candidate, Event, IceConnectionState, Output, Rtc};

/// Connection ids of WHEP pulls, apart from every other publisher's.
const CONN_BASE: u64 = 6 << 60;
/// The offer's answer, ICE and DTLS: within this.
const SETUP: Duration = Duration::from_secs(10);
/// A keyframe is asked for at most this often for the readers.
const KEYFRAME_GAP: Duration = Duration::from_secs(1);

pub fn start(src: &crate::spec::PullSource, cx: &Ctx) -> Result<Started, RelayError> {
    let bad = |e: String| RelayError::BadRequest(format!("source \"whep\": {e}"));
    let url = WhipUrl::parse(&src.url).map_err(|e| bad(e.0))?;
    let verify = crate::tls::verify_of(&src.tls_ca, &src.tls_fingerprint, src.tls_verify).map_err(|e| bad(e.0))?;
    // (Public roots are ureq's own; a CA, a pin or none go as our TLS settings.)
    let tls = (url.tls && verify != crate::tls::Verify::PublicRoots)
        .then(|| crate::tls::client_config(&verify))
        .transpose()
        .map_err(|e| bad(format!("{e:#}")))?;
    let pulled = if src.on_demand == Some(true) { Publisher::pulled_on_demand } else { Publisher::pulled };
    let p =
        Arc::new(pulled(cx.name, cx.session.clone()).map_err(|e| RelayError::Internal(format!("whep source: {e}")))?);
    cx.session.set_source_kind(format!("whep pull of {}", url.shown()));
    let idle = Duration::from_secs_f64(cx.cfg.rtsp_idle_s.clamp(1.0, 10.0));
    let linger = Duration::from_secs_f64(src.linger_s.unwrap_or(10.0));
    let task = tokio::spawn(pull(url, tls, p.clone(), cx.host.clone(), (idle, linger)));
    Ok(Started { feeder: Feeder::Publisher(p), tasks: vec![task.abort_handle()] })
}

async fn pull(
    url: WhipUrl,
    tls: Option<Arc<rustls::ClientConfig>>,
    p: Arc<Publisher>,
    host: Weak<dyn crate::upstream::Host>,
    times: (Duration, Duration),
) {
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    super::pull_loop(&p, "WHEP", &url.shown(), CONN_BASE, |conn, label| {
        let (url, tls, p, host, stop) = (url.clone(), tls.clone(), p.clone(), host.clone(), stop.clone());
        async move {
            let run = tokio::task::spawn_blocking(move || {
                let mut fed = false;
                let why = view(&url, tls.as_ref(), &p, &host, times, conn, &label, &stop, &mut fed);
                (why, fed)
            });
            run.await.unwrap_or_else(|e| (e.to_string(), false))
        }
    })
    .await
}

/// One session: views the stream into the publisher side until it ends; why it ended.
/// `fed`: set once the stream's tracks started.
#[allow(clippy::too_many_arguments)]
fn view(
    url: &WhipUrl,
    tls: Option<&Arc<rustls::ClientConfig>>,
    p: &Publisher,
    host: &Weak<dyn crate::upstream::Host>,
    times: (Duration, Duration),
    conn: u64,
    label: &str,
    stop: &AtomicBool,
    fed: &mut bool,
) -> String {
    match session(url, tls, p, host, times, conn, label, stop, fed) {
        Ok(never) => match never {},
        Err(why) => why,
    }
}

#[allow(clippy::too_many_arguments)]
fn session(
    url: &WhipUrl,
    tls: Option<&Arc<rustls::ClientConfig>>,
    p: &Publisher,
    host: &Weak<dyn crate::upstream::Host>,
    (idle, linger): (Duration, Duration),
    conn: u64,
    label: &str,
    stop: &AtomicBool,
    fed: &mut bool,
) -> Result<std::convert::Infallible, String> {
    let (socket, far) = crate::dial::udp_towards(&url.host, url.port)?;
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    let mut rtc = Rtc::builder()
        .set_rtp_mode(true)
        .clear_codecs()
        .enable_h264(true)
        .enable_vp8(true)
        .enable_vp9(true)
        .enable_av1(true)
        .enable_opus(true, false)
        // (Offered though not taken: MediaMTX sends a PCMU track of silence with video alone,
        // and refuses a viewer whose offer has no codec for it.)
        .enable_pcmu(true, false)
        .enable_pcma(true, false)
        .set_crypto_provider(Arc::new(str0m::crypto::from_feature_flags()))
        .build(Instant::now());
    let candidate = Candidate::host(local, "udp").map_err(|e| format!("a candidate at {local}: {e}"))?;
    rtc.add_local_candidate(candidate);
    let mut change = rtc.sdp_api();
    change.add_media(MediaKind::Video, Direction::RecvOnly, None, None, None);
    change.add_media(MediaKind::Audio, Direction::RecvOnly, None, None, None);
    let (offer, pending) = change.apply().ok_or("no offer to make")?;
    // (Held to the end: its drop DELETEs the session.)
    let (_session, answer) = crate::dial::WhipHttp::offer(url, tls, &offer.to_sdp_string(), SETUP)?;
    let described = fanout_proto::rtsp::sdp::Sdp::parse(&answer).map_err(|e| format!("the answer: {e}"))?;
    let ingest = fanout_proto::whep::ingest_pulled(&described)
        .ok_or("the server sends no track the relay takes (H.264, VP8, VP9, AV1 video; Opus audio)")?;
    let tracks_sdp = fanout_proto::rtsp::sdp::Sdp::parse(&ingest.sdp).map_err(|e| e.to_string())?;
    let parsed = SdpAnswer::from_sdp_string(&answer).map_err(|e| format!("the answer: {e}"))?;
    rtc.sdp_api().accept_answer(pending, parsed).map_err(|e| format!("the answer: {e}"))?;
    let (mut buf, mut heard) = (vec![0u8; 2048], Instant::now());
    let (mut video_ssrc, mut asked, mut unwanted_since): (_, Option<Instant>, _) = (None, None, None);
    let mut look = Instant::now();
    loop {
        let wait = loop {
            match rtc.poll_output() {
                Ok(Output::Transmit(t)) => {
                    let _ = socket.send_to(&t.contents, t.destination);
                }
                Ok(Output::Event(Event::Connected)) if !*fed => {
                    let host = host.upgrade().ok_or("the relay is shutting down")?;
                    p.start_stream(
                        crate::publish::Ingest::Webrtc,
                        label.to_string(),
                        conn,
                        far.ip(),
                        tracks_sdp.clone(),
                        host.engine(),
                    )
                    .map_err(|e| format!("its tracks could not start: {e}"))?;
                    p.set_pull_error(None);
                    tracing::info!(url = %url.shown(), "WHEP source viewing");
                    *fed = true;
                }
                Ok(Output::Event(Event::RtpPacket(pkt))) => {
                    let pt = *pkt.header.payload_type;
                    let Some(&(_, track)) = ingest.pts.iter().find(|(x, _)| *x == pt) else { continue };
                    if tracks_sdp.media.get(track).is_some_and(|m| m.kind == "video") {
                        video_ssrc = Some(pkt.header.ssrc);
                    }
                    let h = &pkt.header;
                    let mut data = vec![0u8; 12 + pkt.payload.len()];
                    let n = fanout_proto::rtp::write_header(
                        &mut data,
                        h.marker,
                        96 + track as u8,
                        h.sequence_number,
                        h.timestamp,
                        *h.ssrc,
                    );
                    data[n..].copy_from_slice(&pkt.payload);
                    heard = Instant::now();
                    if !p.feed_rtp(conn, track, &mut data, 0) {
                        return Err("the path took another publisher".into());
                    }
                }
                Ok(Output::Event(Event::IceConnectionStateChange(IceConnectionState::Disconnected))) => {
                    return Err("the WebRTC connection was lost (ICE)".into());
                }
                Ok(Output::Event(_)) => {}
                Ok(Output::Timeout(t)) => break t.saturating_duration_since(Instant::now()),
                Err(e) => return Err(format!("WebRTC: {e}")),
            }
        };
        if stop.load(Ordering::Relaxed) {
            return Err("the path went".into());
        }
        if !rtc.is_alive() {
            return Err("the WebRTC connection ended".into());
        }
        let now = Instant::now();
        if !*fed && now.duration_since(heard) > SETUP {
            return Err(format!("no WebRTC connection within {SETUP:?} (ICE or DTLS)"));
        }
        if *fed && now.duration_since(heard) > idle.max(SETUP) {
            return Err(format!("nothing came for {:?}", idle.max(SETUP)));
        }
        // A keyframe as the video starts, then for the readers, at most once a KEYFRAME_GAP.
        if let Some(ssrc) = video_ssrc {
            let due = asked.is_none_or(|t| now.duration_since(t) >= KEYFRAME_GAP);
            if due && (asked.is_none() || p.take_keyframe_request()) {
                if let Some(rx) = rtc.direct_api().stream_rx(&ssrc) {
                    rx.request_keyframe(KeyframeRequestKind::Pli);
                }
                asked = Some(now);
            }
        }
        if now.duration_since(look) >= Duration::from_secs(1) {
            look = now;
            if p.wanted() {
                unwanted_since = None;
            } else if unwanted_since.get_or_insert(now).elapsed() >= linger {
                return Err(format!("nobody read it for {linger:?} (on demand)"));
            }
        }
        // What the socket brings within the wait (at most 50 ms), else the time.
        let wait = wait.clamp(Duration::from_millis(1), Duration::from_millis(50));
        crate::dial::rtc_input(&mut rtc, &socket, local, &mut buf, wait)?;
    }
}
