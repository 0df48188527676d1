//! A viewer's media: its sinks drained into its `Rtc` as RTP (renumbered per viewer), the
//! layers or simulcast encoding its bandwidth estimate picks, and keyframes on switches.

use super::*;

/// A bandwidth estimate for viewer `v` (bits per second): its video sinks get the layers
/// that fit.
pub(super) fn adapt(v: &mut Viewer, bps: f64) {
    let Some(a) = v.adapt.as_mut() else { return };
    a.estimate_bps = Some(bps);
    let peer = v.from.unwrap_or_else(|| SocketAddr::new([0, 0, 0, 0].into(), 0));
    for o in v.outs.iter_mut().filter(|o| o.video) {
        if let Some(id) = o.sink {
            o.session.sink_estimate(id, bps);
        }
        if let Some(sim) = o.sim.as_mut().filter(|_| o.sink.is_some()) {
            let rates: Vec<f64> = sim.encodings.iter().map(|e| e.bps).collect();
            let place = fanout_proto::simulcast::pick(&rates, bps, sim.current.unwrap_or(usize::MAX));
            switch(sim, place, peer);
        }
    }
}

/// Starts simulcast viewer `sim`'s switch to encoding `place` (or, if that is the one it
/// gets, calls off a switch under way): a live sink on it, its queue woken as the current
/// one's is, and a keyframe asked for; `pump` switches at that keyframe.
pub(super) fn switch(sim: &mut Sim, place: usize, peer: SocketAddr) {
    if sim.next.as_ref().map(|n| n.place).or(sim.current) == Some(place) {
        return;
    }
    if let Some(n) = sim.next.take() {
        n.session.remove_sink(n.sink);
    }
    let Some(e) = sim.encodings.get(place).filter(|_| sim.current != Some(place)) else { return };
    let wake = sim.wake.clone();
    let queue = ChannelQueue::new(QUEUE, move || wake.notify_one());
    match e.session.add_live_channel_sink(peer, queue.clone()) {
        Ok(sink) => {
            e.session.want_keyframe();
            tracing::debug!(to = %e.rid, "simulcast viewer switching");
            sim.next = Some(Next { place, session: e.session.clone(), queue, sink });
        }
        Err(err) => tracing::warn!("cannot add the simulcast viewer's sink: {err}"),
    }
}

/// A simulcast viewer's encodings anew (their rates; a publisher that changed or left): one
/// it gets that is gone is left for the track's own (the first).
pub(super) fn refresh(sim: &mut Sim, peer: SocketAddr) {
    let now = sim.publisher.encodings().filter(|(t, e)| *t == sim.track && !e.is_empty()).map(|(_, e)| e);
    let same = |e: &Vec<crate::publish::Encoding>| {
        e.len() == sim.encodings.len() && e.iter().zip(&sim.encodings).all(|(a, b)| a.session == b.session)
    };
    match now {
        Some(e) if same(&e) => sim.encodings = e,
        other => {
            let first = sim.encodings[0].clone();
            if let Some(n) = sim.next.take() {
                n.session.remove_sink(n.sink);
            }
            let was = sim.current.map(|k| sim.encodings[k].session.clone());
            sim.encodings = other.unwrap_or_else(|| vec![first]);
            sim.current = sim.encodings.iter().position(|e| Some(&e.session) == was.as_ref());
            if sim.current.is_none() {
                switch(sim, 0, peer);
            }
        }
    }
}

/// Hands a datagram from `from` to its peer: known by its address, else by the ICE
/// username of its check. The peer's id, if there is one.
pub(super) fn deliver(
    viewers: &mut HashMap<String, Viewer>,
    by_addr: &mut HashMap<SocketAddr, String>,
    from: SocketAddr,
    input: Input<'_>,
) -> Option<String> {
    let id = match by_addr.get(&from) {
        Some(id) => Some(id.clone()),
        None => viewers.values().find(|v| v.rtc.accepts(&input)).map(|v| v.id.clone()),
    };
    let v = id.and_then(|id| viewers.get_mut(&id))?;
    if v.from != Some(from) {
        v.from = Some(from);
        by_addr.insert(from, v.id.clone());
    }
    let _ = v.rtc.handle_input(input);
    Some(v.id.clone())
}

/// Moves what viewer `v`'s queues hold into its `Rtc`, renumbered as its own stream.
///
/// A viewer of layered video may lose a picture's last packet, the one with the marker, to
/// its layer cap, and a browser's depacketizer waits for that marker: a video packet without
/// one is held until the next shows whether a new picture began (then it ends its own).
///
/// A simulcast viewer switching encodings gets the current one's packets until the next
/// one's first keyframe packet, then the next one's from there, its RTP time joined on.
pub(super) fn pump(v: &mut Viewer, frames: &mut Vec<Frame>, now: Instant) {
    let hold = v.adapt.is_some_and(|a| a.layered);
    for o in &mut v.outs {
        o.queue.drain(frames);
        send(&mut v.rtc, o, frames, hold, now, &mut v.packets, &mut v.last_picture);
        let Some((ts, mut next_frames)) = o.sim.as_mut().and_then(|sim| next_keyframe(sim)) else { continue };
        // The switch: the current encoding's sink goes, the next one's is the out's.
        let sim = o.sim.as_mut().expect("switching");
        let next = sim.next.take().expect("switching");
        if let Some(id) = o.sink {
            o.session.remove_sink(id);
            sim.switches += 1;
        }
        (o.session, o.queue, o.sink) = (next.session, next.queue, Some(next.sink));
        sim.current = Some(next.place);
        // Its keyframe goes out as the picture after the last one sent, by the time between.
        if let Some((last, at)) = sim.last {
            let pictures = ((now - at).as_secs_f64() * 90_000.0 / f64::from(sim.step)).round().max(1.0) as u32;
            o.ts_offset = last.wrapping_add(pictures * sim.step).wrapping_sub(ts);
        }
        o.held = None;
        tracing::debug!(viewer = %v.id, to = %sim.encodings[next.place].rid, "simulcast viewer switched");
        send(&mut v.rtc, o, &mut next_frames, hold, now, &mut v.packets, &mut v.last_picture);
    }
    v.wake_at = now;
}

/// Writes `frames` (drained) of out `o` into `rtc`; `hold`: layered video, whose packets
/// without a marker wait for the next.
pub(super) fn send(
    rtc: &mut Rtc,
    o: &mut Out,
    frames: &mut Vec<Frame>,
    hold: bool,
    now: Instant,
    packets: &mut u64,
    last_picture: &mut Option<LastPicture>,
) {
    for (p, _) in frames.drain(..) {
        let Ok(rtp) = RtpView::parse(p.data()) else { continue };
        if hold && o.video {
            if let Some(h) = o.held.take() {
                if let Ok(held) = RtpView::parse(h.data()) {
                    let end = held.timestamp() != rtp.timestamp();
                    write(rtc, o, &held, end, now, packets, last_picture);
                }
            }
            if !rtp.marker() {
                o.held = Some(p);
                continue;
            }
        }
        write(rtc, o, &rtp, false, now, packets, last_picture);
    }
}

/// A simulcast viewer switching: once its next encoding brought a keyframe, that keyframe's
/// RTP time and the packets from it on (those before it are dropped: nothing decodes them).
pub(super) fn next_keyframe(sim: &mut Sim) -> Option<(u32, Vec<Frame>)> {
    let next = sim.next.as_ref()?;
    let mut got = Vec::new();
    next.queue.drain(&mut got);
    let k = got.iter().position(|(p, _)| p.is_keyframe())?;
    let ts = RtpView::parse(got[k].0.data()).ok()?.timestamp();
    Some((ts, got.split_off(k)))
}

/// Writes RTP packet `rtp` of out `o` into `rtc` as the viewer's own (with the parameter sets a
/// keyframe needs before it), marked as a picture's end if it is or `end`.
pub(super) fn write(
    rtc: &mut Rtc,
    o: &mut Out,
    rtp: &RtpView<'_>,
    end: bool,
    now: Instant,
    packets: &mut u64,
    last_picture: &mut Option<LastPicture>,
) {
    let mut api = rtc.direct_api();
    let Some(stream) = api.stream_tx_by_mid(o.mid, None) else { return };
    let ts = rtp.timestamp().wrapping_add(o.ts_offset);
    let params = o.params.as_mut().map(|p| p.before(ts, rtp.payload())).unwrap_or_default();
    for nal in params {
        let w = RtpWrite::new(o.pt.into(), SeqNo::from(o.next_seq), ts, now, nal).nackable(true);
        stream.write_rtp(w);
        o.next_seq += 1;
    }
    let marker = rtp.marker() || end;
    let w =
        RtpWrite::new(o.pt.into(), SeqNo::from(o.next_seq), ts, now, rtp.payload()).marker(marker).nackable(o.video);
    stream.write_rtp(w);
    o.next_seq += 1;
    *packets += 1;
    if o.video && marker {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        *last_picture = Some(LastPicture { rtp: ts, unix_ms });
        if let Some(sim) = o.sim.as_mut() {
            // The time between pictures, as the newest two show it (whole frames of it join
            // a switch's keyframe on).
            let step = sim.last.map_or(0, |(last, _)| ts.wrapping_sub(last));
            if (1..90_000).contains(&step) {
                sim.step = step;
            }
            sim.last = Some((ts, now));
        }
    }
}
