//! The RTSP server's actions, applied: sinks made and removed, publishers started and
//! stopped, readers joined and left.

use super::*;

impl Rtsp {
    pub(super) fn apply_actions(&self, relay: &Relay, peer: IpAddr, actions: Vec<Action>, refused: &mut Vec<String>) {
        let mut clients = self.clients.lock();
        for a in actions {
            match a {
                Action::Setup { session, resource, lower, track, conn, srtp, client_key } => {
                    let c = clients.entry(session).or_insert_with(|| Client::new(resource, peer, conn, srtp));
                    c.tracks.retain(|t| t.0 != track);
                    c.tracks.push((track, lower));
                    c.srtcp_in.retain(|k| k.0 != track);
                    if let Some(k) = client_key {
                        c.srtcp_in.push((track, k.context()));
                    }
                }
                Action::Play { session } => {
                    let Some(c) = clients.get_mut(&session) else { continue };
                    self.play(relay, &session, c);
                    if c.reader.is_none() && !c.sinks.is_empty() {
                        c.reader = self.join_readers(relay, &session, c);
                        if c.reader.is_none() {
                            refused.push(session.clone());
                        }
                    }
                }
                Action::Record { session, resource, sdp, tracks, udp, conn } => {
                    let started = relay
                        .path(&resource)
                        .and_then(|p| p.publisher().cloned())
                        .map(|p| p.start(session, conn, peer, sdp, &tracks, &udp, &relay.engine, self.displaced(conn)));
                    if let Some(Err(e)) = started {
                        tracing::warn!(%resource, "cannot start the RTSP publisher: {e}");
                    }
                }
                Action::Foreign { session, conn } => {
                    tracing::warn!(%peer, conn, rtsp_session = %session, "RTSP request for a session of another connection: 454 (logged once per connection)");
                }
                // A publisher's end; for a client, Teardown also drops it below, once the state
                // machine forgot it.
                Action::Teardown { session } if self.stop_publisher(relay, &session) => {}
                Action::Pause { session } | Action::Teardown { session } => {
                    if let Some(c) = clients.get_mut(&session) {
                        self.stop(c);
                    }
                }
            }
        }
        // Sessions the state machine no longer knows are gone for good, once their sinks
        // are: another connection's request may have ended its session in the state machine
        // and not yet applied its Teardown (which then finds it here and removes the sinks).
        let server = self.server.lock();
        clients.retain(|id, c| server.state(id).is_some() || !c.sinks.is_empty());
    }

    /// PLAY: a sink for each set-up track, in the track's session or (an SRTP client) in
    /// the key epoch its description gave it.
    fn play(&self, relay: &Relay, session: &str, c: &mut Client) {
        let tracks = relay.tracks(&c.resource);
        for &(t, lower) in &c.tracks {
            let Some(tr) = tracks.get(t) else { continue };
            let epoch = match c.srtp {
                true => match self.epoch_for(relay, c.conn, &c.resource, &tr.session) {
                    Ok(e) => Some(e),
                    Err(e) => {
                        tracing::warn!(rtsp_session = %session, "no SRTP for the client: {e}");
                        continue;
                    }
                },
                false => None,
            };
            let into = epoch.as_ref().map_or(&tr.session, |e| &e.session).clone();
            match self.add_sink(c, lower, &into, &tr.session) {
                Ok(id) => {
                    let how = match lower {
                        Lower::Udp { .. } => "udp",
                        Lower::Interleaved { .. } => "interleaved",
                        Lower::Multicast { .. } => "multicast",
                    };
                    tracing::info!(resource = %c.resource, peer = %c.peer, track = t, sink = id, how, srtp = c.srtp, "RTSP client playing");
                    let track_session = tr.session.clone();
                    c.sinks.push(Placed { track: t, id, session: into, srtp: epoch, track_session })
                }
                Err(e) => tracing::warn!(rtsp_session = %session, "cannot add the client's sink: {e}"),
            }
        }
    }

    /// A client's sink in `into`: its UDP port, sent from the server's; or a channel its
    /// connection's task drains, at most half the track's ring (a client further behind
    /// waits in the ring, where it is lapped and resumes at a keyframe like any slow one).
    fn add_sink(
        &self,
        c: &Client,
        lower: Lower,
        into: &fanout_io::Session,
        track: &fanout_io::Session,
    ) -> std::io::Result<u64> {
        match lower {
            Lower::Udp { client_rtp, .. } => into.add_udp_sink_from_shared_port(SocketAddr::new(c.peer, client_rtp)),
            Lower::Multicast { group, rtp, .. } => {
                // One sink per group, shared by its players (one that went with its session
                // is made again).
                let to = SocketAddr::new(group.into(), rtp);
                let mut groups = self.groups.lock();
                let key = (to, into.name().to_string());
                if let Some((id, n)) = groups.get_mut(&key).filter(|(id, _)| into.sink_status(*id).is_some()) {
                    *n += 1;
                    return Ok(*id);
                }
                let id = into.add_udp_sink_from_shared_port(to)?;
                groups.insert(key, (id, 1));
                Ok(id)
            }
            Lower::Interleaved { rtp, .. } => {
                let conns = self.conns.lock();
                let conn = conns.get(&c.conn).ok_or_else(|| std::io::Error::other("its connection is gone"))?;
                let wake = conn.clone();
                let cap = INTERLEAVED_QUEUE.min(track.config().ring_capacity / 2);
                let q = fanout_io::channel::ChannelQueue::batched(cap, move || wake.notify.notify_one());
                conn.sndbuf.fetch_max(into.stream_send_buffer(), std::sync::atomic::Ordering::Relaxed);
                let mut qs = conn.queues.lock();
                qs.retain(|(ch, _)| *ch != rtp);
                qs.push((rtp, q.clone()));
                into.add_channel_sink(SocketAddr::new(c.peer, 0), q, false)
            }
        }
    }

    /// What tells an RTSP publisher's connection it was taken over: it closes, which ends
    /// its RTSP session.
    fn displaced(&self, conn: u64) -> Box<dyn FnOnce() + Send> {
        let me = self.conns.lock().get(&conn).map(Arc::downgrade);
        Box::new(move || {
            if let Some(c) = me.and_then(|c| c.upgrade()) {
                c.displaced.store(true, std::sync::atomic::Ordering::Relaxed);
                c.notify.notify_one();
            }
        })
    }

    /// PAUSE or TEARDOWN of a client: its sinks removed, its place among the readers left,
    /// its interleaved queues forgotten.
    fn stop(&self, c: &mut Client) {
        if !c.sinks.is_empty() {
            tracing::info!(resource = %c.resource, peer = %c.peer, sinks = c.sinks.len(), "RTSP client stopped");
        }
        for p in c.sinks.drain(..) {
            let group = c.tracks.iter().find_map(|t| match t.1 {
                Lower::Multicast { group, rtp, .. } if t.0 == p.track => Some(SocketAddr::new(group.into(), rtp)),
                _ => None,
            });
            if let Some(to) = group {
                // A group's sink goes with its last player.
                let mut groups = self.groups.lock();
                let key = (to, p.session.name().to_string());
                match groups.get_mut(&key) {
                    Some((_, n)) if *n > 1 => {
                        *n -= 1;
                        continue;
                    }
                    _ => {
                        groups.remove(&key);
                    }
                }
            }
            p.session.remove_sink(p.id);
        }
        c.reader = None;
        if let Some(conn) = self.conns.lock().get(&c.conn) {
            let channels: Vec<u8> = c.tracks.iter().filter_map(|t| interleaved_rtp(&t.1)).collect();
            conn.queues.lock().retain(|(ch, _)| !channels.contains(ch));
        }
    }
}
