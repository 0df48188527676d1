//! A path's repackaging (HLS, HTTP TS), made once for all its readers.

use super::*;
use fanout_proto::container::repack::TrackCodec;

impl Relay {
    /// A path's tracks (none if there is no such path).
    pub fn tracks(&self, name: &str) -> Vec<crate::track::TrackRef> {
        self.path(name).map(|p| p.tracks()).unwrap_or_default()
    }

    /// The session an HTTP subscriber of `name` joins: its MPEG-TS repackaging where it
    /// carries RTP video or audio (started now if need be), else the session itself, whose
    /// payloads go out as they came (an MPEG-TS source, or anything else, udpxy-style).
    pub async fn http_session(self: &Arc<Self>, name: &str) -> Result<Session, RelayError> {
        self.ensure(name).await?;
        let path = self.found(name)?;
        if path.view().is_some() || !path.is_rtp_media() {
            return Ok(path.session.clone());
        }
        let r = self.repack(name).await?;
        r.ts.clone().ok_or_else(|| {
            RelayError::Unsupported(format!(
                "{name:?} carries {}, which MPEG-TS does not; play it over HLS, WebRTC or RTSP",
                r.describes
            ))
        })
    }

    /// The session's repackaging (MPEG-TS for HTTP where its stream URL needs it, HLS where
    /// its tracks allow), started if it is not running.
    pub async fn repack(self: &Arc<Self>, name: &str) -> Result<Arc<crate::repack::Repack>, RelayError> {
        self.ensure(name).await?;
        let path = self.found(name)?;
        if let Some(r) = path.repack_running() {
            return Ok(r);
        }
        let session = &path.session;
        let mut inputs = Vec::new();
        let mut why = Vec::new();
        // The first Opus or G.711 track (its input's index), and whether there is AAC: FLV,
        // MPEG-TS and SRT players get a publisher's Opus or a camera's G.711 as AAC.
        let (mut to_aac, mut aac) = (None, false);
        let mut add = |m: &fanout_proto::rtsp::sdp::Media, t: crate::track::TrackRef| {
            let info = fanout_proto::container::repack::TrackInfo::from_sdp(m).map_err(|e| why.push(e.0)).ok();
            match info.as_ref().map(|i| &i.codec) {
                Some(TrackCodec::Opus { .. } | TrackCodec::G711 { .. }) if to_aac.is_none() => {
                    to_aac = Some((inputs.len(), m.clone(), t.clone()))
                }
                Some(TrackCodec::Aac { .. }) => aac = true,
                _ => {}
            }
            let (session, clock_map) = (t.session, t.clock_map);
            inputs.push(crate::repack::Input { session, info, clock_map, derived: false, fmp4: true });
        };
        if let Some(view) = path.view() {
            view.sdp.media.iter().zip(view.tracks.clone()).for_each(|(m, t)| add(m, t));
        } else if let Some(up) = path.upstream() {
            let Some(sdp) = up.demand(Duration::from_secs(5)).await else {
                return Err(RelayError::Peer(format!(
                    "the upstream of {name:?} did not describe its stream within 5 s ({})",
                    up.status().last_error.unwrap_or_else(|| "no answer".into())
                )));
            };
            sdp.media.iter().zip(up.tracks()).for_each(|(m, t)| add(m, t));
        } else if let Some(p) = path.publisher() {
            let Some(sdp) = p.sdp() else {
                return Err(RelayError::Peer(format!("nothing is published to {name:?} now")));
            };
            sdp.media.iter().zip(p.tracks()).for_each(|(m, t)| add(m, t));
        } else if let Some(video) = path.spec().video {
            let codec = TrackCodec::Video { codec: video.codec(), params: Vec::new() };
            let info = Some(fanout_proto::container::repack::TrackInfo { codec, clock: 90_000 });
            inputs.push(crate::repack::Input {
                session: session.clone(),
                info,
                clock_map: None,
                derived: false,
                fmp4: true,
            });
        } else {
            return Err(RelayError::Unsupported(format!(
                "session {name:?} carries datagrams of no known format (set `video` for RTP video); \
                 its stream URL delivers them as they came"
            )));
        }
        if inputs.iter().all(|i| i.info.is_none()) {
            return Err(RelayError::Unsupported(format!(
                "session {name:?} has no track HTTP players can take: {}; play it over RTSP",
                why.join("; ")
            )));
        }
        let linger = Duration::from_secs_f64(path.spec().source.linger_s());
        if let Some((i, m, t)) = to_aac.filter(|_| !aac && path.view().is_none()) {
            let to = crate::transcode::To::Aac;
            match path.keep_transcode(to, || crate::transcode::Transcode::start(name, &m, &t, &self.engine, linger, to))
            {
                Ok(made) => {
                    // fMP4 keeps Opus, which browsers play, and takes AAC for G.711, which
                    // they do not.
                    let opus = made.from == "opus";
                    inputs[i].fmp4 = opus;
                    inputs.push(crate::repack::Input {
                        session: made.track.session.clone(),
                        info: fanout_proto::container::repack::TrackInfo::from_sdp(&made.media).ok(),
                        clock_map: made.track.clock_map,
                        derived: true,
                        fmp4: !opus,
                    })
                }
                Err(e) => why.push(format!("its audio cannot become AAC for FLV, MPEG-TS and SRT players: {e}")),
            }
        }
        let tracks_of = {
            let path = Arc::downgrade(&path);
            move || path.upgrade().map(|p| p.tracks().iter().map(|t| t.clock_map).collect()).unwrap_or_default()
        };
        let with_ts = path.view().is_none();
        let record = path.spec().record;
        let hls_variant = path.spec().hls_variant.segments();
        let weak = Arc::downgrade(&path);
        let on_stop = move || {
            if let Some(path) = weak.upgrade() {
                path.repack_stopped();
            }
        };
        let r = path.keep_repack(|| {
            crate::repack::Repack::start(
                name,
                session.config(),
                &self.engine,
                inputs,
                with_ts,
                hls_variant,
                record.map(|spec| crate::record::RecordTo {
                    store: self.recordings.clone(),
                    spec,
                    on_complete: path.spec().run_on_record_segment_complete.map(|cmd| (cmd, self.hook_env(name))),
                }),
                tracks_of,
                linger,
                on_stop,
            )
            .map_err(|e| RelayError::Internal(format!("repackaging: {e}")))
        })?;
        for w in &why {
            tracing::info!(session = name, "left out of the repackaging: {w}");
        }
        Ok(r)
    }
}
