//! RTCP on RTSP: sender reports to every playing client, clients' receiver reports (their
//! round trip and loss, shown in `GET /v1/rtsp`), and a publisher's reports.

use super::*;

impl Rtsp {
    /// A sender report for each playing client: where to send it, and the datagram.
    pub(super) fn sender_reports(&self, relay: &Relay) -> Vec<(ReportTo, Vec<u8>)> {
        let ntp = ntp_now();
        let mut reports = self
            .clients
            .lock()
            .values()
            .flat_map(|c| {
                let tracks = relay.tracks(&c.resource);
                c.sinks.iter().filter_map(move |p| {
                    let (t, id) = (p.track, p.id);
                    let tr = tracks.get(t)?;
                    let (ssrc, arrived) = tr.session.rtp_now(tr.clock)?;
                    // The RTP time now: from the upstream's own mapping when it sent one,
                    // else from when the packets arrived.
                    let rtp_now = match tr.clock_map {
                        Some((sr_ntp, sr_rtp)) => {
                            let since = ntp.wrapping_sub(sr_ntp) as i64 as f64 / 4_294_967_296.0;
                            sr_rtp.wrapping_add((since * f64::from(tr.clock)) as i64 as u32)
                        }
                        None => arrived,
                    };
                    let sink = p.session.sink_status(id)?;
                    let mut sr = Vec::with_capacity(28);
                    fanout_proto::rtp::rtcp::write_sender_report(
                        &mut sr,
                        ssrc,
                        ntp,
                        rtp_now,
                        sink.packets_sent as u32,
                        sink.bytes_sent as u32,
                    );
                    if let Some(epoch) = &p.srtp {
                        epoch.protect_rtcp(&mut sr);
                    }
                    let to = match c.tracks.iter().find(|x| x.0 == t)?.1 {
                        Lower::Udp { client_rtcp, .. } => ReportTo::Udp(SocketAddr::new(c.peer, client_rtcp)),
                        Lower::Interleaved { rtcp, .. } => ReportTo::Conn(c.conn, rtcp),
                        Lower::Multicast { group, rtcp, .. } => ReportTo::Udp(SocketAddr::new(group.into(), rtcp)),
                    };
                    Some((to, sr))
                })
            })
            .collect::<Vec<_>>();
        // A group's players share its stream and so its report: once per group.
        let mut groups = std::collections::HashSet::new();
        reports.retain(|(to, _)| match to {
            ReportTo::Udp(a) if a.ip().is_multicast() => groups.insert(*a),
            _ => true,
        });
        reports
    }

    /// RTCP on an interleaved client's RTCP channel.
    pub(super) fn rtcp_on_conn(&self, relay: &Relay, conn: u64, channel: u8, data: &[u8]) {
        let mut clients = self.clients.lock();
        let found = clients.iter_mut().find_map(|(id, c)| {
            let t = c.tracks.iter().find(|t| matches!(t.1, Lower::Interleaved { rtcp, .. } if rtcp == channel))?.0;
            (c.conn == conn).then_some((id, c, t))
        });
        let Some((id, c, track)) = found else { return };
        self.record_reports(relay, id, c, track, data);
    }

    /// A client's reports keep its session alive; each block goes to the sink of the track
    /// whose SSRC it names, whose layer selector (for layered video) re-estimates. An SRTP
    /// client's reports are SRTCP: read under the key its SETUP gave (`KeyMgmt`), else
    /// (SDES gives us none) they only keep it alive.
    pub(super) fn record_reports(&self, relay: &Relay, id: &str, c: &mut Client, track: usize, data: &[u8]) {
        // (Only SRTCP is copied, to be decrypted.)
        let plain: std::borrow::Cow<[u8]> = match c.srtcp_in.iter_mut().find(|k| k.0 == track) {
            Some((_, ctx)) => {
                let mut p = data.to_vec();
                if ctx.unprotect_rtcp(&mut p).is_err() {
                    c.srtcp_dropped += 1;
                    return;
                }
                p.into()
            }
            None => data.into(),
        };
        let keyed = matches!(plain, std::borrow::Cow::Owned(_));
        let Ok(reports) = fanout_proto::rtp::rtcp::parse_reports(&plain) else { return };
        c.reports += 1;
        let tracks = relay.tracks(&c.resource);
        let blocks = if c.srtp && !keyed { &[][..] } else { &reports[..] };
        for b in blocks.iter().flat_map(|r| r.blocks.iter()) {
            let sink = c.sinks.iter().find_map(|p| {
                let session = &tracks.get(p.track)?.session;
                (session.rtp_ssrc()? == b.ssrc).then_some((session, p.id))
            });
            let Some((session, sink)) = sink else {
                c.foreign_blocks += 1;
                continue;
            };
            session.sink_report(sink, b.cumulative_lost);
            c.last_report = Some((*b, Instant::now()));
            if let Some(rtt) = fanout_proto::rtp::rtcp::round_trip(b, fanout_proto::rtp::rtcp::ntp_mid32(ntp_now())) {
                c.rtt = Some(rtt);
            }
        }
        // PLI/FIR: the named track's session (else the one whose channel or port it came on)
        // wants a keyframe; its source's side passes that on where it can, at its own pace.
        if !c.srtp || keyed {
            for media in fanout_proto::rtp::rtcp::keyframe_requests(&plain) {
                let named = c.sinks.iter().find_map(|p| {
                    let session = &tracks.get(p.track)?.session;
                    (session.rtp_ssrc()? == media).then_some(session)
                });
                if let Some(session) = named.or_else(|| tracks.get(track).map(|t| &t.session)) {
                    session.want_keyframe();
                    c.keyframe_requests += 1;
                }
            }
        }
        self.server.lock().touch(id, self.now_ms());
    }

    /// A datagram on the RTCP port: a report from a client keeps its session alive.
    pub(super) fn rtcp_from(&self, relay: &Relay, from: SocketAddr, data: &[u8]) {
        let mut clients = self.clients.lock();
        let found = clients.iter_mut().find_map(|(id, c)| {
            let t = c.tracks.iter().find(|t| udp_ports(&t.1).is_some_and(|p| p.1 == from.port()))?.0;
            (c.peer == from.ip()).then_some((id, c, t))
        });
        let Some((id, c, track)) = found else { return };
        self.record_reports(relay, id, c, track, data);
    }
}
