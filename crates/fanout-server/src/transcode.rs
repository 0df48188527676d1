//! A path's AAC as Opus, for WebRTC viewers (browsers take no AAC): one transcoder per path,
//! started by the first viewer that needs it, stopped a linger after the last left. It reads
//! the AAC track's ring as an in-process subscriber (as the repackaging does), and hands the
//! Opus packets into a track session of its own (`{path}/opus`), which viewers subscribe to
//! as to any track. Its RTP times are the AAC's on a 48 kHz clock, so the AAC's clock map
//! (the source's sender reports) holds for it too and audio stays in step with the video.

use crate::track::{Inner, TrackRef};
use fanout_io::channel::ChannelQueue;
use fanout_io::{Inlet, Session};
use fanout_media::{AacToOpus, OPUS_CLOCK};
use fanout_proto::container::repack::{Repackager, TrackCodec, TrackInfo, Unit};
use fanout_proto::rtsp::sdp::Media;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Opus track's payload type, as its SDP says (viewers get their own).
const PT: u8 = 111;

/// A running transcoder: its track, and the SDP section that describes it.
pub struct Transcode {
    pub track: TrackRef,
    pub media: Media,
    task: tokio::task::AbortHandle,
}

impl Transcode {
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Starts transcoding track `aac` (its SDP section and its track) of path `name`, if it
    /// is AAC that can be decoded; runs until nobody subscribed for `linger`.
    pub fn start(
        name: &str,
        media: &Media,
        aac: &TrackRef,
        engine: &fanout_io::Engine,
        linger: Duration,
    ) -> Result<Arc<Self>, String> {
        let info = TrackInfo::from_sdp(media).map_err(|e| e.0)?;
        let TrackCodec::Aac { config, .. } = &info.codec else { return Err("not AAC".into()) };
        let coder = AacToOpus::new(config).map_err(|e| e.to_string())?;
        let mut cfg = aac.session.config().clone();
        cfg.name = Inner::Opus.name(name);
        let session = Session::new(cfg, engine);
        session.set_source_kind(format!("{name}'s AAC as Opus"));
        let inlet = Inlet::open(&session).map_err(|e| e.to_string())?;
        let scale = |rtp: u32| (u64::from(rtp) * u64::from(OPUS_CLOCK) / u64::from(info.clock.max(1))) as u32;
        let track = TrackRef {
            session: session.clone(),
            clock: OPUS_CLOCK,
            clock_map: aac.clock_map.map(|(ntp, rtp)| (ntp, scale(rtp))),
        };
        let sdp = format!(
            "m=audio 0 RTP/AVP {PT}\r\na=rtpmap:{PT} opus/48000/2\r\na=fmtp:{PT} minptime=10;useinbandfec=1{}\r\n",
            if coder.channels() == 2 { ";stereo=1" } else { "" }
        );
        let media = fanout_proto::rtsp::sdp::Sdp::parse(&format!("v=0\r\ns=-\r\n{sdp}"))
            .map_err(|e| e.to_string())?
            .media
            .remove(0);
        let channels = coder.channels();
        let task = tokio::spawn(run(name.to_string(), aac.session.clone(), info, coder, inlet, linger)).abort_handle();
        tracing::info!(path = name, channels, "AAC to Opus started");
        Ok(Arc::new(Self { track, media, task }))
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

/// Transcodes until the Opus track had no subscriber for `linger`; closes it then.
async fn run(name: String, aac: Session, info: TrackInfo, mut coder: AacToOpus, mut inlet: Inlet, linger: Duration) {
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = wake.clone();
    let queue = ChannelQueue::new(aac.config().ring_capacity / 2, move || w.notify_one());
    let sink = match aac.add_local_sink("transcoding", queue.clone()) {
        Ok(sink) => sink,
        Err(e) => {
            tracing::warn!(path = name, "AAC to Opus not started: {e}");
            return close(inlet).await;
        }
    };
    let clock = info.clock.max(1);
    let mut repack = Repackager::new(vec![Some(info)]);
    let started = Instant::now();
    let (mut frames, mut units) = (Vec::new(), Vec::<Unit>::new());
    let (mut packets, mut rtp): (Vec<(Vec<u8>, i64)>, Vec<u8>) = (Vec::new(), Vec::new());
    // The first unit's timeline time and its RTP time at 48 kHz: the Opus RTP times follow.
    let mut origin: Option<(i64, i64)> = None;
    let (mut seq, ssrc) = crate::track::random_start();
    let mut idle_since: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = wake.notified() => {
                queue.drain(&mut frames);
                for (p, _) in frames.drain(..) {
                    let data = p.data();
                    repack.push_rtp(0, data, started.elapsed().as_millis() as u64, &mut units);
                    if let (None, Some(u), Some(ts)) = (origin, units.first(), data.get(4..8)) {
                        let rtp = u32::from_be_bytes(ts.try_into().expect("4 bytes"));
                        origin = Some((u.time, i64::from(rtp) * i64::from(OPUS_CLOCK) / i64::from(clock)));
                    }
                }
                let Some((t0, r0)) = origin else { continue };
                for u in units.drain(..) {
                    coder.push(&u.data, r0 + (u.time - t0) * i64::from(OPUS_CLOCK) / 90_000, &mut packets);
                }
                for (opus, time) in packets.drain(..) {
                    rtp.clear();
                    rtp.resize(12, 0);
                    fanout_proto::rtp::write_header(&mut rtp, false, PT, seq, time as u32, ssrc);
                    rtp.extend_from_slice(&opus);
                    seq = seq.wrapping_add(1);
                    inlet.hold(&rtp);
                }
                inlet.flush();
            }
            _ = tick.tick() => {
                if !inlet.session().sinks().is_empty() {
                    idle_since = None;
                } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= linger {
                    break;
                }
            }
        }
    }
    aac.remove_sink(sink);
    tracing::info!(path = name, "AAC to Opus stopped: no viewer for {linger:?}");
    close(inlet).await;
}

/// Closes the Opus track (joins threads: off the runtime).
async fn close(inlet: Inlet) {
    let session = inlet.session().clone();
    drop(inlet);
    let _ = tokio::task::spawn_blocking(move || session.close()).await;
}
