//! A path's audio in the codec other players need, one transcoder per path and direction:
//! its AAC as Opus for WebRTC viewers (browsers take no AAC), started by the first viewer
//! that needs it; its Opus or G.711 as AAC for FLV, MPEG-TS and SRT players (which take
//! neither), started with the path's repackaging. Each stops a linger after its last subscriber left.
//! It reads the source track's ring as an in-process subscriber (as the repackaging does),
//! and hands what it makes into a track session of its own (`{path}/opus`, `{path}/aac`),
//! which readers subscribe to as to any track. Its RTP times are the source's on a 48 kHz
//! clock, so the source's clock map (its sender reports) holds for it too and audio stays in
//! step with the video.

use crate::track::{Inner, TrackRef};
use fanout_io::channel::ChannelQueue;
use fanout_io::{Inlet, Session};
use fanout_media::{AacToOpus, ToAac, OPUS_CLOCK};
use fanout_proto::container::repack::{Repackager, TrackCodec, TrackInfo, Unit};
use fanout_proto::rtsp::sdp::Media;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a transcoder makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum To {
    /// Opus from AAC.
    Opus,
    /// AAC from Opus or G.711.
    Aac,
}

impl To {
    /// The payload type its track's SDP gives (viewers get their own).
    fn pt(self) -> u8 {
        match self {
            To::Opus => 111,
            To::Aac => 97,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            To::Opus => "opus",
            To::Aac => "aac",
        }
    }
}

/// The codec work of one direction: units and their 48 kHz times in, payloads and theirs out.
enum Coder {
    ToOpus(AacToOpus),
    ToAac(ToAac),
}

impl Coder {
    fn push(&mut self, unit: &[u8], time: i64, out: &mut Vec<(Vec<u8>, i64)>) {
        match self {
            Coder::ToOpus(c) => c.push(unit, time, out),
            Coder::ToAac(c) => c.push(unit, time, out),
        }
    }
}

/// A running transcoder: its track, and the SDP section that describes it.
pub struct Transcode {
    pub to: To,
    /// What it transcodes from (`aac`, `opus`, `pcmu`, `pcma`).
    pub from: &'static str,
    pub track: TrackRef,
    pub media: Media,
    task: tokio::task::AbortHandle,
}

impl Transcode {
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Starts transcoding track `source` (its SDP section and its track) of path `name` to
    /// `to`, if it is AAC (to Opus) or Opus or G.711 (to AAC) that can be decoded; runs until
    /// nobody subscribed for `linger`.
    pub fn start(
        name: &str,
        media: &Media,
        source: &TrackRef,
        engine: &fanout_io::Engine,
        linger: Duration,
        to: To,
    ) -> Result<Arc<Self>, String> {
        let info = TrackInfo::from_sdp(media).map_err(|e| e.0)?;
        let pt = to.pt();
        let (coder, sdp, channels, from) = match (&info.codec, to) {
            (TrackCodec::Aac { config, .. }, To::Opus) => {
                let coder = AacToOpus::new(config).map_err(|e| e.to_string())?;
                let channels = coder.channels();
                let sdp = format!(
                    "m=audio 0 RTP/AVP {pt}\r\na=rtpmap:{pt} opus/48000/2\r\na=fmtp:{pt} minptime=10;useinbandfec=1{}\r\n",
                    if channels == 2 { ";stereo=1" } else { "" }
                );
                (Coder::ToOpus(coder), sdp, channels, "aac")
            }
            (TrackCodec::Opus { .. } | TrackCodec::G711 { .. }, To::Aac) => {
                let (coder, from) = match info.codec {
                    TrackCodec::Opus { channels } => {
                        (ToAac::of_opus(usize::from(channels)).map_err(|e| e.to_string())?, "opus")
                    }
                    TrackCodec::G711 { mu_law } => (ToAac::of_g711(mu_law), if mu_law { "pcmu" } else { "pcma" }),
                    _ => unreachable!("matched above"),
                };
                let config: String = coder.config().iter().map(|b| format!("{b:02x}")).collect();
                let channels = coder.channels();
                let sdp = format!(
                    "m=audio 0 RTP/AVP {pt}\r\na=rtpmap:{pt} MPEG4-GENERIC/48000/{channels}\r\n\
                     a=fmtp:{pt} streamtype=5;profile-level-id=1;mode=AAC-hbr;sizelength=13;indexlength=3;\
                     indexdeltalength=3;config={config}\r\n"
                );
                (Coder::ToAac(coder), sdp, channels, from)
            }
            _ => return Err(format!("{} is not what becomes {}", info.name(), to.name())),
        };
        let mut cfg = source.session.config().clone();
        cfg.name = match to {
            To::Opus => Inner::Opus,
            To::Aac => Inner::Aac,
        }
        .name(name);
        let session = Session::new(cfg, engine);
        let into = to.name();
        session.set_source_kind(format!("{name}'s {from} as {into}"));
        let inlet = Inlet::open(&session).map_err(|e| e.to_string())?;
        let scale = |rtp: u32| (u64::from(rtp) * u64::from(OPUS_CLOCK) / u64::from(info.clock.max(1))) as u32;
        let track = TrackRef {
            session: session.clone(),
            clock: OPUS_CLOCK,
            clock_map: source.clock_map.map(|(ntp, rtp)| (ntp, scale(rtp))),
        };
        let media = fanout_proto::rtsp::sdp::Sdp::parse(&format!("v=0\r\ns=-\r\n{sdp}"))
            .map_err(|e| e.to_string())?
            .media
            .remove(0);
        let task = tokio::spawn(run(name.to_string(), source.session.clone(), info, coder, inlet, linger, (from, to)))
            .abort_handle();
        tracing::info!(path = name, channels, "{from} to {into} started");
        Ok(Arc::new(Self { to, from, track, media, task }))
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

/// Transcodes until the Opus track had no subscriber for `linger`; closes it then.
async fn run(
    name: String,
    source: Session,
    info: TrackInfo,
    mut coder: Coder,
    mut inlet: Inlet,
    linger: Duration,
    (from, to): (&'static str, To),
) {
    let into = to.name();
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = wake.clone();
    let queue = ChannelQueue::new(source.config().ring_capacity / 2, move || w.notify_one());
    let sink = match source.add_local_sink("transcoding", queue.clone()) {
        Ok(sink) => sink,
        Err(e) => {
            tracing::warn!(path = name, "{from} to {into} not started: {e}");
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
                for (made, time) in packets.drain(..) {
                    rtp.clear();
                    rtp.resize(12, 0);
                    fanout_proto::rtp::write_header(&mut rtp, to == To::Aac, to.pt(), seq, time as u32, ssrc);
                    match to {
                        To::Opus => rtp.extend_from_slice(&made),
                        // RFC 3640, one access unit a packet (an AU header of 13 + 3 bits).
                        To::Aac => match fanout_proto::codec::aac::rtp_payload(&made) {
                            Some(p) => rtp.extend_from_slice(&p),
                            None => continue,
                        },
                    }
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
    source.remove_sink(sink);
    tracing::info!(path = name, "{from} to {into} stopped: no reader for {linger:?}");
    close(inlet).await;
}

/// Closes the track it made (joins threads: off the runtime).
async fn close(inlet: Inlet) {
    let session = inlet.session().clone();
    drop(inlet);
    let _ = tokio::task::spawn_blocking(move || session.close()).await;
}
