//! A peer's offer, negotiated: its place counted (per address, connecting at once), its
//! `Rtc` built off the control thread, its tracks' sinks made (a viewer) or its path's
//! publisher taken (WHIP), and the answer.

use super::*;

/// A simulcast publisher, the track it sends on and its encodings.
type Simulcast = (Arc<crate::publish::Publisher>, (usize, Vec<crate::publish::Encoding>));

impl WebRtc {
    /// A WHEP offer for `path`: the answer and the viewer's id.
    pub async fn offer(
        &self,
        relay: &Arc<Relay>,
        path: &str,
        offer: &str,
        caller: Caller,
    ) -> Result<(String, String), Refused> {
        let pass = self.pass(caller.ip)?;
        relay.ensure(path).await.map_err(|e| Refused(e.http_status(), e.to_string()))?;
        let p = relay.path(path).ok_or_else(|| Refused(404, format!("no path {path:?}")))?;
        if let Some(up) = p.upstream().cloned() {
            up.demand(Duration::from_secs(10)).await;
        }
        let mut described = p
            .describe()
            .map(|r| r.sdp)
            .filter(|s| !s.media.is_empty())
            .ok_or_else(|| Refused(404, format!("{path} has nothing to play yet")))?;
        let mut tracks = relay.tracks(path);
        // AAC, which browsers do not take: its Opus, made once for every viewer.
        let transcoded = opus_of_aac(relay, &p, &described, &tracks).map(|(media, track)| {
            described.media.push(media);
            tracks.push(track);
        });
        // Layered video, or a simulcast publisher's encodings: the viewer's congestion
        // feedback picks the layers, or the encoding, it gets.
        let simulcast = p
            .publisher()
            .and_then(|pb| Some((pb.clone(), pb.encodings()?)))
            .filter(|(_, (track, e))| e.len() > 1 && tracks.get(*track).is_some_and(|t| t.session == e[0].session));
        let layered = described
            .media
            .iter()
            .zip(&tracks)
            .filter(|(m, _)| m.kind == "video")
            .find_map(|(_, t)| t.session.layered_bps());
        let whole_bps = layered.or(simulcast.as_ref().map(|(_, (_, e))| e[0].bps.max(START_BPS)));
        let (rtc, answer) = self.negotiate(offer, Role::Viewer { adapts: whole_bps }, caller.ip).await?;
        let parsed = Sdp::parse(&answer).map_err(|e| Refused(500, format!("our answer: {e}")))?;
        let mut plan = fanout_proto::whep::plan(&described, &parsed);
        if transcoded.is_some() {
            // (Its AAC goes, as Opus.)
            plan.left_out.retain(|why| !why.contains("MPEG4-GENERIC"));
        }
        if plan.routes.is_empty() {
            return Err(Refused(
                400,
                format!("nothing of {path} can be sent to this viewer: {}", plan.left_out.join("; ")),
            ));
        }
        let id = crate::readers::new_id();
        let (outs, names) = self.outs(&plan, &tracks, &described, simulcast.as_ref());
        let status = ViewerStatus {
            offered_by: caller.ip,
            owner: caller.owner,
            id: id.clone(),
            path: path.to_string(),
            role: "viewer",
            peer: None,
            state: "connecting",
            since_s: 0.0,
            tracks: names,
            left_out: plan.left_out.clone(),
            packets: 0,
            last_picture: None,
            estimate_bps: None,
            layers: None,
            encoding: None,
            switches: None,
        };
        let adapt = whole_bps.map(|whole_bps| Adapt { whole_bps, estimate_bps: None, layered: layered.is_some() });
        // One of the path's readers, under its WHEP resource's id.
        let who = Who::new(crate::readers::Protocol::Webrtc, caller.ip.map(|ip| SocketAddr::new(ip, 0)), None);
        let reader = Arc::new(ViewerReader { id: id.clone(), cmds: self.cmds.clone(), shared: self.shared.clone() });
        let registered = p.readers.join_as(id.clone(), who, reader).map_err(|f| Refused(503, f.to_string()))?;
        self.admit(status, rtc, outs, None, adapt, (pass, Some(registered)))?;
        tracing::info!(path, viewer = %id, left_out = ?plan.left_out, "WebRTC viewer offered");
        Ok((answer, id))
    }

    /// A viewer's way out per route of `plan`: its track's queue (numbered from a random
    /// start) and, for a simulcast publisher's video, the encodings it switches between;
    /// with a name per route for the status.
    fn outs(
        &self,
        plan: &fanout_proto::whep::Plan,
        tracks: &[crate::track::TrackRef],
        described: &Sdp,
        simulcast: Option<&Simulcast>,
    ) -> (Vec<Out>, Vec<String>) {
        let first_seq = u64::from(crate::track::random_start().0) + 1;
        let mut outs = Vec::new();
        let mut names = Vec::new();
        for r in &plan.routes {
            let Some(t) = tracks.get(r.track) else { continue };
            let wake = self.wake.clone();
            let queue = ChannelQueue::new(QUEUE, move || wake.notify_one());
            let sim = simulcast.filter(|(_, (track, _))| *track == r.track).map(|(publisher, (track, e))| {
                Box::new(Sim {
                    publisher: publisher.clone(),
                    track: *track,
                    encodings: e.clone(),
                    current: Some(0),
                    next: None,
                    wake: self.wake.clone(),
                    last: None,
                    step: 3000,
                    switches: 0,
                })
            });
            outs.push(Out {
                mid: Mid::from(r.mid.as_str()),
                pt: r.pt,
                video: r.video,
                session: t.session.clone(),
                queue,
                sink: None,
                next_seq: first_seq,
                params: (r.video && !r.params.is_empty()).then(|| fanout_proto::whep::InBandParams::new(&r.params)),
                held: None,
                sim,
                ts_offset: 0,
            });
            let m = &described.media[r.track];
            let codec = m.formats.first().and_then(|f| fanout_proto::whep::encoding(m, f)).unwrap_or("?");
            names.push(format!("{} {codec} (pt {})", m.kind, r.pt));
        }
        (outs, names)
    }

    /// A place for one more peer of `client` (`None`: an in-process caller, not counted), or
    /// 429: that address has `max_connections_per_ip` peers already.
    pub(super) fn pass(&self, client: Option<IpAddr>) -> Result<Option<Pass>, Refused> {
        if self.handed_over.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Refused(503, "this relay process handed its WebRTC port to a new one: try again".into()));
        }
        let Some(ip) = client else { return Ok(None) };
        match self.gate.admit(ip) {
            Some(p) => Ok(Some(p.connected("webrtc", ip.to_string(), &tokio::runtime::Handle::current()))),
            None => {
                Err(Refused(429, format!("{ip} has as many WebRTC peers as one address may (max_connections_per_ip)")))
            }
        }
    }

    /// An `Rtc` for a peer's offer and its answer (see [`Self::build_peer`]), built off the
    /// control runtime's thread and a couple at a time (see [`NEGOTIATING`]), once there is
    /// room for one more connecting peer. Each costs a DTLS identity and holds state until it
    /// connects or times out: a flood of offers that never connect is capped, in all and per
    /// address.
    pub(super) async fn negotiate(
        &self,
        offer: &str,
        role: Role,
        ip: Option<IpAddr>,
    ) -> Result<(Rtc, String), Refused> {
        let _turn = NEGOTIATING.acquire().await.expect("never closed");
        {
            let viewers = self.shared.viewers.lock();
            let connecting = || viewers.values().filter(|v| v.state == "connecting");
            let all = connecting().count();
            if all >= MAX_CONNECTING {
                return Err(Refused(503, format!("{all} WebRTC peers are still connecting: try again")));
            }
            if let Some(ip) = ip {
                if connecting().filter(|v| v.offered_by == Some(ip)).count() >= MAX_CONNECTING_PER_IP {
                    return Err(Refused(
                        429,
                        format!("{ip} has {MAX_CONNECTING_PER_IP} WebRTC peers connecting: try again once they have"),
                    ));
                }
            }
        }
        match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => self.build_peer(offer, role),
            _ => tokio::task::block_in_place(|| self.build_peer(offer, role)),
        }
    }

    /// ICE-lite on the relay's candidates, RTP mode, the codecs the role takes.
    ///
    /// A publisher gets transport-wide congestion control (its encoder's rate follows our
    /// feedback). A viewer of layered video does too, the other way: its feedback gives a
    /// bandwidth estimate (str0m's, which also paces its sends), and the estimate picks its
    /// layers. A viewer of a stream that is not layered does not negotiate it: there is nothing
    /// to choose, and taking its reports was the largest single cost per viewer (8% of the
    /// relay's CPU at 200 viewers).
    pub(super) fn build_peer(&self, offer: &str, role: Role) -> Result<(Rtc, String), Refused> {
        let publisher = matches!(role, Role::Publisher);
        // A publisher's video is taken in one codec: the first of `PUBLISHED_VIDEO` offered.
        let taken = publisher.then(|| Sdp::parse(offer).ok().and_then(|o| fanout_proto::whep::publisher_video(&o)));
        let takes = |codec: &str| taken.is_none_or(|t| t.unwrap_or("H264") == codec);
        let offer = SdpOffer::from_sdp_string(offer).map_err(|e| Refused(400, format!("the offer: {e}")))?;
        let mut config = Rtc::builder();
        if let Role::Viewer { adapts } = role {
            use str0m::rtp::Extension;
            config = config
                .clear_extension_map()
                .set_extension(2, Extension::AbsoluteSendTime)
                .set_extension(4, Extension::RtpMid)
                .set_extension(13, Extension::VideoOrientation);
            if let Some(bps) = adapts {
                // It starts with what fits in a cautious first estimate (a browser's own
                // start), and probes up from there in its first seconds.
                config = config
                    .set_extension(3, Extension::TransportSequenceNumber)
                    .enable_bwe(Some(str0m::bwe::Bitrate::bps(bps.min(START_BPS) as u64)));
            }
        }
        let mut rtc = config
            .set_ice_lite(true)
            .set_rtp_mode(true)
            .clear_codecs()
            .enable_h264(takes("H264"))
            .enable_h265(!publisher)
            .enable_vp8(takes("VP8"))
            .enable_vp9(takes("VP9"))
            .enable_av1(takes("AV1"))
            .enable_opus(true, false)
            // G.711 to viewers only: a publisher's audio is taken as Opus.
            .enable_pcmu(!publisher, false)
            .enable_pcma(!publisher, false)
            .set_crypto_provider(Arc::new(str0m::crypto::from_feature_flags()))
            .build(Instant::now());
        for h in &self.hosts {
            if let Ok(c) = Candidate::host(*h, "udp") {
                rtc.add_local_candidate(c);
            }
            // A passive TCP candidate, of lower priority: used where UDP does not get through.
            if self.tcp {
                if let Ok(c) = Candidate::builder().tcp().host(*h).tcptype(str0m::net::TcpType::Passive).build() {
                    rtc.add_local_candidate(c);
                }
            }
        }
        let answer = rtc.sdp_api().accept_offer(offer).map_err(|e| Refused(400, format!("the offer: {e}")))?;
        Ok((rtc, answer.to_sdp_string()))
    }

    /// Hands a negotiated peer to the task, and lists it.
    pub(super) fn admit(
        &self,
        status: ViewerStatus,
        rtc: Rtc,
        outs: Vec<Out>,
        publish: Option<Publishing>,
        adapt: Option<Adapt>,
        (pass, reader): (Option<Pass>, Option<Registered>),
    ) -> Result<(), Refused> {
        let id = status.id.clone();
        self.shared.viewers.lock().insert(id.clone(), status);
        let now = Instant::now();
        let v = Viewer {
            id: id.clone(),
            rtc,
            outs,
            from: None,
            connected: false,
            since: now,
            wake_at: now,
            packets: 0,
            last_picture: None,
            publish,
            adapt,
            _pass: pass,
            _reader: reader,
        };
        if self.cmds.send(Cmd::Add(Box::new(v))).is_err() {
            self.shared.viewers.lock().remove(&id);
            return Err(Refused(503, "WebRTC is stopping".into()));
        }
        Ok(())
    }

    /// A WHIP offer to publish `path`: the answer and the publisher's id.
    pub async fn publish(
        &self,
        relay: &Arc<Relay>,
        path: &str,
        offer: &str,
        caller: Caller,
    ) -> Result<(String, String), Refused> {
        let pass = self.pass(caller.ip)?;
        relay.ensure_publishable(path).await;
        let publisher =
            relay.path(path).and_then(|p| p.publisher().cloned()).filter(|p| p.takes_publishers()).ok_or_else(
                || Refused(404, format!("no path {path:?} takes publishers (source = {{ publish = true }})")),
            )?;
        if let Some(why) = publisher.refusal() {
            return Err(Refused(409, why));
        }
        let (rtc, answer) = self.negotiate(offer, Role::Publisher, caller.ip).await?;
        let parsed = Sdp::parse(&answer).map_err(|e| Refused(500, format!("our answer: {e}")))?;
        let ingest = fanout_proto::whep::ingest(&parsed).ok_or_else(|| {
            Refused(400, "the offer sends no H.264 (packetization mode 1), VP8, VP9, AV1 or Opus".into())
        })?;
        let sdp = Sdp::parse(&ingest.sdp).map_err(|e| Refused(500, format!("the path's description: {e}")))?;
        let rids = fanout_proto::simulcast::rids(&parsed);
        let simulcast = sdp.media.iter().position(|m| m.kind == "video").filter(|_| rids.len() > 1).map(|track| {
            let codec = fanout_proto::whep::PUBLISHED_VIDEO
                .into_iter()
                .find(|c| sdp.media[track].rtpmap(&sdp.media[track].formats[0]).is_some_and(|(n, _)| n == *c))
                .unwrap_or("H264");
            SimulcastIn {
                track,
                codec,
                ssrcs: vec![None; rids.len()],
                ranking: fanout_proto::simulcast::Ranking::new(rids.clone()),
                since: Instant::now(),
            }
        });
        let id = crate::clients::random_id();
        let status = ViewerStatus {
            offered_by: caller.ip,
            owner: caller.owner,
            id: id.clone(),
            path: path.to_string(),
            role: "publisher",
            peer: None,
            state: "connecting",
            since_s: 0.0,
            tracks: sdp
                .media
                .iter()
                .map(|m| format!("{} {}", m.kind, m.rtpmap(&m.formats[0]).map_or("?", |c| c.0)))
                .collect(),
            left_out: Vec::new(),
            packets: 0,
            last_picture: None,
            estimate_bps: None,
            layers: None,
            encoding: None,
            switches: None,
        };
        let conn = CONN_BASE | NEXT_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let publish = Publishing {
            relay: Arc::downgrade(relay),
            publisher,
            sdp,
            pts: ingest.pts,
            conn,
            started: false,
            video_ssrc: None,
            simulcast,
            asked: Instant::now(),
        };
        self.admit(status, rtc, Vec::new(), Some(publish), None, (pass, None))?;
        tracing::info!(path, publisher = %id, simulcast = ?rids, "WHIP publisher offered");
        Ok((answer, id))
    }
}

/// The path's AAC as an Opus track (its SDP section and track), where its audio is AAC and
/// none of it goes over WebRTC as it is; `None` where that is not so, or the AAC cannot be
/// transcoded (said in the log: the viewer gets the video alone).
fn opus_of_aac(
    relay: &Arc<Relay>,
    p: &crate::path::Path,
    described: &Sdp,
    tracks: &[crate::track::TrackRef],
) -> Option<(fanout_proto::rtsp::sdp::Media, crate::track::TrackRef)> {
    let audio = described.media.iter().enumerate().filter(|(_, m)| m.kind == "audio");
    let mut aac = None;
    for (i, m) in audio {
        if fanout_proto::whep::webrtc_codec(m).is_ok() {
            return None;
        }
        let is_aac =
            m.formats.first().and_then(|f| m.rtpmap(f)).is_some_and(|(e, _)| e.eq_ignore_ascii_case("MPEG4-GENERIC"));
        if is_aac && aac.is_none() {
            aac = Some((m, tracks.get(i)?));
        }
    }
    let (m, track) = aac?;
    let linger = Duration::from_secs_f64(p.spec().source.linger_s());
    let to = crate::transcode::To::Opus;
    match p.keep_transcode(to, || crate::transcode::Transcode::start(&p.name, m, track, &relay.engine, linger, to)) {
        Ok(t) => Some((t.media.clone(), t.track.clone())),
        Err(e) => {
            tracing::warn!(path = %p.name, "its AAC cannot go to WebRTC viewers as Opus: {e}");
            None
        }
    }
}
