//! A forward over RTSP(S): the RTSP client as a recorder, then the path's RTP tracks
//! interleaved on the connection, each from its keyframe.

use super::{Sinks, Target, SETUP, STALL, USER_AGENT};
use crate::dial::Io;
use crate::readers::Held;
use fanout_proto::rtsp::client::Url as RtspUrl;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Publishes the path's RTP tracks (`sdp`, one session per media section) to an RTSP server
/// (ANNOUNCE, SETUP for recording, RECORD), interleaved on the connection, until the stream
/// ends or the target fails (`Err` with why). Each track starts at the keyframe its ring
/// holds, as an RTSP player's does. `pushed`: set once media went out.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn push_rtsp(
    io: &mut Box<dyn Io>,
    url: &RtspUrl,
    sdp: fanout_proto::rtsp::sdp::Sdp,
    tracks: &[fanout_io::Session],
    target: &Target,
    held: &Held,
    pushed: &mut bool,
) -> Result<std::convert::Infallible, String> {
    use fanout_proto::rtsp::{self, client::Step, Lower, Message};
    let started = Instant::now();
    let now = || started.elapsed().as_millis() as u64;
    let limits = rtsp::Limits { max_body: 64 << 10, ..rtsp::Limits::default() };
    let mut client = fanout_proto::rtsp::client::Client::recorder(url.clone(), USER_AGENT, sdp);
    let (mut inbox, mut buf) = (Vec::new(), vec![0u8; 16 << 10]);
    // The server's messages: answers go to the client (`Ok(true)` once RECORD is answered);
    // its RTCP (interleaved) is not needed.
    async fn answer(
        io: &mut Box<dyn Io>,
        client: &mut fanout_proto::rtsp::client::Client,
        inbox: &mut Vec<u8>,
        limits: &rtsp::Limits,
        now: u64,
    ) -> Result<bool, String> {
        let mut recording = false;
        while let Some((msg, used)) = rtsp::parse(inbox, limits).map_err(|e| format!("the server's RTSP: {e}"))? {
            inbox.drain(..used);
            if let Message::Response(r) = msg {
                match client.on_response(&r, now).map_err(|e| format!("the server refused the stream: {e}"))? {
                    Step::Send(b) => io.write_all(&b).await.map_err(|e| format!("the server went: {e}"))?,
                    Step::Playing => recording = true,
                    _ => {}
                }
            }
        }
        Ok(recording)
    }
    async fn read_into(io: &mut Box<dyn Io>, inbox: &mut Vec<u8>, buf: &mut [u8]) -> Result<(), String> {
        match io.read(buf).await {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                inbox.extend_from_slice(&buf[..n]);
                Ok(())
            }
            Err(e) => Err(format!("the server went: {e}")),
        }
    }
    io.write_all(&client.start(now())).await.map_err(|e| format!("the server went: {e}"))?;
    let setup = async {
        loop {
            read_into(io, &mut inbox, &mut buf).await?;
            if answer(io, &mut client, &mut inbox, &limits, now()).await? {
                return Ok::<_, String>(());
            }
        }
    };
    tokio::time::timeout(SETUP, setup).await.map_err(|_| format!("did not start the stream within {SETUP:?}"))??;
    tracing::info!(url = %target.shown, "forward: pushing");
    target.set_state("pushing");
    // A queue per track, filled once per the path's flush interval; one wake for all.
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut sinks = Sinks(Vec::new());
    let mut queues = Vec::new();
    for (track, t) in tracks.iter().zip(&client.tracks) {
        let Lower::Interleaved { rtp, .. } = t.lower else { continue };
        let w = wake.clone();
        let q = fanout_io::channel::ChannelQueue::batched(track.config().ring_capacity / 2, move || w.notify_one());
        let id = track.add_local_sink("RTSP forward", q.clone()).map_err(|e| format!("the path's track: {e}"))?;
        sinks.0.push((track.clone(), id));
        queues.push((rtp, q));
    }
    let (mut frames, mut out) = (Vec::new(), Vec::new());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            why = crate::readers::ended(Some(held)) => {
                if let Some(b) = client.teardown(now()) {
                    let _ = tokio::time::timeout(Duration::from_secs(1), io.write_all(&b)).await;
                }
                return Err(why);
            }
            r = read_into(io, &mut inbox, &mut buf) => {
                r?;
                answer(io, &mut client, &mut inbox, &limits, now()).await?;
            }
            _ = tick.tick() => {
                if let Some(b) = client.keepalive(now()) {
                    out.extend_from_slice(&b);
                }
            }
            _ = wake.notified() => {}
        }
        let mut packets = 0;
        for (channel, q) in &queues {
            q.drain(&mut frames);
            for (p, seq) in frames.drain(..) {
                let data = p.data();
                if data.len() > usize::from(u16::MAX) {
                    continue;
                }
                let at = out.len();
                rtsp::write_interleaved(&mut out, *channel, data);
                // A layer-dropping sink's own sequence numbers.
                if let Some(seq) = seq.filter(|_| data.len() >= 4) {
                    out[at + 6..at + 8].copy_from_slice(&seq.to_be_bytes());
                }
                packets += 1;
            }
        }
        if out.is_empty() {
            continue;
        }
        match tokio::time::timeout(STALL, io.write_all(&out)).await {
            Ok(Ok(())) => {
                held.sent(out.len(), packets);
                target.sent(out.len());
                *pushed |= packets > 0;
                out.clear();
            }
            Ok(Err(e)) => return Err(format!("the server went: {e}")),
            Err(_) => return Err(format!("a write took longer than {STALL:?}: the server does not read")),
        }
    }
}
