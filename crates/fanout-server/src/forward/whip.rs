//! A forward over WHIP: the relay offers to send the path's tracks WebRTC carries (H.264,
//! H.265, VP8, VP9, AV1 video; Opus, G.711 audio), POSTs the offer to the endpoint, and once
//! ICE and DTLS are up writes the tracks' RTP into its `str0m` (renumbered as its own
//! stream, H.264 parameter sets in band), which encrypts and sends it, with sender reports
//! and retransmissions. Blocking, on a thread of its own, with a UDP socket of its own.

use super::{Sinks, Target, SETUP};
use crate::readers::Held;
use fanout_io::channel::{ChannelQueue, Frame};
use fanout_proto::rtp::RtpView;
use fanout_proto::rtsp::sdp::Sdp;
use fanout_proto::whep::{InBandParams, WhipUrl};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use str0m::change::SdpAnswer;
use str0m::media::{Direction, MediaKind, Mid};
use str0m::rtp::{RtpWrite, SeqNo};
use str0m::{Candidate, Event, IceConnectionState, Output, Rtc};

/// One track on its way out: its queue, and the numbering of the stream it becomes.
struct Out {
    mid: Mid,
    pt: u8,
    video: bool,
    queue: Arc<ChannelQueue>,
    next_seq: u64,
    params: Option<InBandParams>,
}

/// Publishes the path's tracks (`sdp`, one session per media section) to WHIP endpoint
/// `url` until the stream ends, the target fails or `stop` is set; why it ended.
/// `pushed`: set once media went out.
#[allow(clippy::too_many_arguments)]
pub(crate) fn push_whip(
    url: &WhipUrl,
    tls: Option<&Arc<rustls::ClientConfig>>,
    sdp: &Sdp,
    tracks: &[fanout_io::Session],
    target: &Target,
    held: &Held,
    stop: &AtomicBool,
    pushed: &mut bool,
) -> String {
    match push(url, tls, sdp, tracks, target, held, stop, pushed) {
        Ok(never) => match never {},
        Err(why) => why,
    }
}

#[allow(clippy::too_many_arguments)]
fn push(
    url: &WhipUrl,
    tls: Option<&Arc<rustls::ClientConfig>>,
    sdp: &Sdp,
    tracks: &[fanout_io::Session],
    target: &Target,
    held: &Held,
    stop: &AtomicBool,
    pushed: &mut bool,
) -> Result<std::convert::Infallible, String> {
    let carried: Vec<(&str, bool)> = sdp
        .media
        .iter()
        .filter_map(|m| fanout_proto::whep::webrtc_codec(m).ok().map(|c| (c, m.kind == "video")))
        .collect();
    if carried.is_empty() {
        return Err("the stream has no track WebRTC carries (H.264, H.265, VP8, VP9, AV1, Opus, G.711)".into());
    }
    let (socket, _) = crate::dial::udp_towards(&url.host, url.port)?;
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    let takes = |c: &str| carried.iter().any(|(x, _)| *x == c);
    let mut rtc = Rtc::builder()
        .set_rtp_mode(true)
        .clear_codecs()
        .enable_h264(takes("H264"))
        .enable_h265(takes("H265"))
        .enable_vp8(takes("VP8"))
        .enable_vp9(takes("VP9"))
        .enable_av1(takes("AV1"))
        .enable_opus(takes("OPUS"), false)
        .enable_pcmu(takes("PCMU"), false)
        .enable_pcma(takes("PCMA"), false)
        .set_crypto_provider(Arc::new(str0m::crypto::from_feature_flags()))
        .build(Instant::now());
    let candidate = Candidate::host(local, "udp").map_err(|e| format!("a candidate at {local}: {e}"))?;
    rtc.add_local_candidate(candidate);
    let mut change = rtc.sdp_api();
    for (_, video) in &carried {
        let kind = if *video { MediaKind::Video } else { MediaKind::Audio };
        change.add_media(kind, Direction::SendOnly, None, None, None);
    }
    let (offer, pending) = change.apply().ok_or("no offer to make")?;
    // (Held to the end: its drop DELETEs the session.)
    let (_session, answer) = crate::dial::WhipHttp::offer(url, tls, &offer.to_sdp_string(), SETUP)?;
    let described = Sdp::parse(&answer).map_err(|e| format!("the answer: {e}"))?;
    let plan = fanout_proto::whep::plan_push(sdp, &described);
    let parsed = SdpAnswer::from_sdp_string(&answer).map_err(|e| format!("the answer: {e}"))?;
    rtc.sdp_api().accept_answer(pending, parsed).map_err(|e| format!("the answer: {e}"))?;
    if plan.routes.is_empty() {
        return Err(format!("the server takes none of the tracks: {}", plan.left_out.join("; ")));
    }
    if !plan.left_out.is_empty() {
        tracing::info!(url = %target.shown, left_out = ?plan.left_out, "forward: tracks WHIP does not carry");
    }
    let first_seq = u64::from(crate::track::random_start().0) + 1;
    let mut outs = Vec::new();
    let mut sinks = Sinks(Vec::new());
    let mut buf = vec![0u8; 2048];
    let mut frames: Vec<Frame> = Vec::new();
    let connect_by = Instant::now() + SETUP;
    loop {
        // What str0m has to send, its events, and when it next wants time.
        let wait = loop {
            match rtc.poll_output() {
                Ok(Output::Transmit(t)) => {
                    let _ = socket.send_to(&t.contents, t.destination);
                }
                Ok(Output::Event(Event::Connected)) if outs.is_empty() => {
                    // Media from each track's keyframe on, once it can go.
                    for r in &plan.routes {
                        let Some(track) = tracks.get(r.track) else { continue };
                        let queue = ChannelQueue::new(track.config().ring_capacity / 2, || {});
                        let id = track.add_local_sink("WHIP forward", queue.clone()).map_err(|e| e.to_string())?;
                        sinks.0.push((track.clone(), id));
                        let params = (r.video && !r.params.is_empty()).then(|| InBandParams::new(&r.params));
                        let mid = Mid::from(r.mid.as_str());
                        outs.push(Out { mid, pt: r.pt, video: r.video, queue, next_seq: first_seq, params });
                    }
                    tracing::info!(url = %target.shown, "forward: pushing");
                    target.set_state("pushing");
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
        if let Some(why) = held.end.ended() {
            return Err(why);
        }
        if !rtc.is_alive() {
            return Err("the WebRTC connection ended".into());
        }
        if outs.is_empty() && Instant::now() > connect_by {
            return Err(format!("no WebRTC connection within {SETUP:?} (ICE or DTLS)"));
        }
        let (bytes, packets) = send(&mut rtc, &mut outs, &mut frames);
        if packets > 0 {
            held.sent(bytes, packets);
            target.sent(bytes);
            *pushed = true;
            continue; // (str0m has packets to send now)
        }
        // What the socket brings within the wait (at most 10 ms), else the time.
        let wait = wait.clamp(Duration::from_millis(1), Duration::from_millis(10));
        crate::dial::rtc_input(&mut rtc, &socket, local, &mut buf, wait)?;
    }
}

/// Writes what the tracks' queues hold into `rtc`, each track as its own numbered stream;
/// the payload bytes and packets written.
fn send(rtc: &mut Rtc, outs: &mut [Out], frames: &mut Vec<Frame>) -> (usize, u64) {
    let (mut bytes, mut packets) = (0, 0);
    let now = Instant::now();
    for o in outs {
        o.queue.drain(frames);
        let mut api = rtc.direct_api();
        let Some(stream) = api.stream_tx_by_mid(o.mid, None) else {
            frames.clear();
            continue;
        };
        for (p, _) in frames.drain(..) {
            let Ok(rtp) = RtpView::parse(p.data()) else { continue };
            let ts = rtp.timestamp();
            for nal in o.params.as_mut().map(|x| x.before(ts, rtp.payload())).unwrap_or_default() {
                stream.write_rtp(RtpWrite::new(o.pt.into(), SeqNo::from(o.next_seq), ts, now, nal).nackable(true));
                o.next_seq += 1;
            }
            let write = RtpWrite::new(o.pt.into(), SeqNo::from(o.next_seq), ts, now, rtp.payload());
            stream.write_rtp(write.marker(rtp.marker()).nackable(o.video));
            o.next_seq += 1;
            bytes += rtp.payload().len();
            packets += 1;
        }
    }
    (bytes, packets)
}
