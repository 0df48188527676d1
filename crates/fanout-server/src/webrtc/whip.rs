//! A WHIP publisher's side of its peer: its RTP fed into the path's tracks, keyframes asked
//! for its readers.

use super::*;

/// A WHIP publisher is connected: it becomes the path's publisher (or is refused, as any).
pub(super) fn start_publishing(v: &mut Viewer) -> std::io::Result<()> {
    let peer = v.from.map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let p = v.publish.as_mut().expect("a publisher");
    let relay = p.relay.upgrade().ok_or_else(|| std::io::Error::other("the relay is stopping"))?;
    p.publisher.start_stream(
        crate::publish::Ingest::Webrtc,
        v.id.clone(),
        p.conn,
        peer,
        p.sdp.clone(),
        &relay.engine,
    )?;
    p.started = true;
    tracing::info!(publisher = %v.id, ?peer, "WHIP publisher connected");
    Ok(())
}

/// An RTP packet from a WHIP publisher into its track; `false`: it no longer publishes
/// (taken over). Asks it for a keyframe every `KEYFRAME_EVERY`.
pub(super) fn publish_rtp(v: &mut Viewer, pkt: &str0m::rtp::RtpPacket) -> bool {
    let Some(p) = v.publish.as_mut().filter(|p| p.started) else { return true };
    let pt = *pkt.header.payload_type;
    let Some(&(_, track)) = p.pts.iter().find(|(x, _)| *x == pt) else { return true };
    if track == 0 && p.sdp.media.first().is_some_and(|m| m.kind == "video") {
        p.video_ssrc = Some(pkt.header.ssrc);
    }
    let h = &pkt.header;
    let mut data = vec![0u8; 12 + pkt.payload.len()];
    let n =
        fanout_proto::rtp::write_header(&mut data, h.marker, 96 + track as u8, h.sequence_number, h.timestamp, *h.ssrc);
    data[n..].copy_from_slice(&pkt.payload);
    v.packets += 1;
    let fed = match p.simulcast.as_mut().filter(|s| s.track == track) {
        Some(sc) => {
            // Which encoding: the RID str0m mapped this SSRC to.
            let rid = v.rtc.direct_api().stream_rx(&h.ssrc).and_then(|s| s.rid());
            let Some(i) = rid.and_then(|r| sc.ranking.index(&r)) else { return true };
            sc.ssrcs[i] = Some(h.ssrc);
            if sc.ranking.packet(i, sc.codec, &pkt.payload, sc.since.elapsed().as_millis() as u64) {
                let order = sc.ranking.order().unwrap_or_default();
                let rids = order.iter().map(|&k| sc.ranking.rids()[k].clone()).collect();
                let sizes: Vec<_> = order.iter().map(|&k| sc.ranking.size(k)).collect();
                tracing::info!(publisher = %v.id, ?rids, ?sizes, "simulcast encodings ranked");
                let Some(relay) = p.relay.upgrade() else { return false };
                if let Err(e) = p.publisher.simulcast(p.conn, track, rids, &relay.engine) {
                    tracing::warn!(publisher = %v.id, "simulcast encodings not kept: {e}");
                }
            }
            // Until the ranking is decided, the video waits.
            match sc.ranking.order().and_then(|o| o.iter().position(|&k| k == i)) {
                Some(place) => p.publisher.feed_encoding(p.conn, place, &mut data, 0),
                None => p.publisher.is_publishing_on(p.conn),
            }
        }
        None => p.publisher.feed_rtp(p.conn, track, &mut data, 0),
    };
    if !fed {
        return false;
    }
    ask_keyframe(v, KEYFRAME_EVERY, false);
    true
}

/// Asks WHIP publisher `v` for a keyframe (PLI) unless it was asked less than `gap` ago;
/// `readers`: only if a reader of its tracks wanted one (the mark is taken).
/// A simulcast publisher is asked on each encoding whose readers wanted one (the first's
/// readers are the track's); unasked, on the first only (the path's: the other encodings'
/// readers are WebRTC viewers, which ask when they join or switch, and a keyframe costs a
/// small encoding most).
pub(super) fn ask_keyframe(v: &mut Viewer, gap: Duration, readers: bool) {
    let Some(p) = v.publish.as_mut().filter(|p| p.started && p.asked.elapsed() >= gap) else { return };
    let wanted = |place: usize| match (readers, place) {
        (false, place) => place == 0,
        (true, 0) => p.publisher.take_keyframe_request(),
        (true, place) => p.publisher.take_encoding_keyframe_request(place),
    };
    let ssrcs: Vec<str0m::rtp::Ssrc> = match p.simulcast.as_ref() {
        Some(sc) => {
            let order = sc.ranking.order().unwrap_or_default();
            order.iter().enumerate().filter(|(place, _)| wanted(*place)).filter_map(|(_, &k)| sc.ssrcs[k]).collect()
        }
        None => p.video_ssrc.filter(|_| wanted(0)).into_iter().collect(),
    };
    if ssrcs.is_empty() {
        return;
    }
    p.asked = Instant::now();
    for ssrc in ssrcs {
        if let Some(rx) = v.rtc.direct_api().stream_rx(&ssrc) {
            rx.request_keyframe(str0m::media::KeyframeRequestKind::Pli);
            // Polled at once: the request goes out now.
            v.wake_at = p.asked;
        }
    }
}

/// A simulcast publisher's encodings' rates, for its viewers' choice.
pub(super) fn publish_rates(v: &Viewer) {
    let Some((p, sc)) = v.publish.as_ref().and_then(|p| Some((p, p.simulcast.as_ref()?))) else { return };
    if let Some(order) = sc.ranking.order() {
        p.publisher.set_encoding_rates(order.iter().map(|&k| sc.ranking.bps(k)).collect());
    }
}
