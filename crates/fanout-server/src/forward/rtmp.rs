//! A forward over RTMP(S): publish, then the path's FLV tags as the shared chunks its RTMP
//! players get, gathered and written once per flush.

use super::{Target, FLUSH, SETUP, STALL};
use crate::dial::Io;
use crate::readers::Held;
use crate::repack::{FlvTag, Passed, Repack, TagGate};
use crate::write::{write_parts, MAX_PARTS};
use fanout_proto::rtmp::client::{Client, Event, Role, RtmpUrl};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// At most this much is gathered for one write.
const FLUSH_BYTES: usize = 256 << 10;

/// Publishes on `io` and sends the path's tags until the stream ends (`Err` with why: every
/// end is a reason to connect again). `pushed`: set once media went out.
pub(crate) async fn push(
    io: &mut Box<dyn Io>,
    url: &RtmpUrl,
    target: &Target,
    repack: &Repack,
    held: &Held,
    pushed: &mut bool,
) -> Result<std::convert::Infallible, String> {
    let flv = repack.flv.clone().expect("joined with FLV");
    let mut client = Client::new(url.clone(), Role::Publish, crate::dial::seed());
    let mut buf = vec![0u8; 16 << 10];
    crate::dial::rtmp_start(io, &mut client, &mut buf, SETUP).await?;
    tracing::info!(url = %target.shown, "forward: pushing");
    target.set_state("pushing");
    let codec_id = |video: bool| {
        flv.config().iter().find(|(v, _)| *v == video).and_then(|(_, b)| b.first()).map(|b| match video {
            // Enhanced RTMP's extended header carries a FourCC; else the low nibble.
            true if b & 0x80 != 0 => 12.0,
            true => f64::from(b & 0x0f),
            false => f64::from(b >> 4),
        })
    };
    client.metadata(codec_id(true), codec_id(false));
    let mut tags = flv.tags.subscribe();
    let mut gate = TagGate::new(&flv);
    let mut configured = false;
    loop {
        // The first tag (or the server's bytes, or the end), then what else comes within FLUSH.
        let first = tokio::select! {
            why = crate::readers::ended(Some(held)) => {
                client.close();
                let _ = tokio::time::timeout(Duration::from_secs(1), io.write_all(&client.take_output())).await;
                return Err(why);
            }
            r = io.read(&mut buf) => {
                let n = r.map_err(|e| format!("the server went: {e}"))?;
                if n == 0 {
                    return Err("the server closed the connection".into());
                }
                client.input(&buf[..n]).map_err(|e| format!("the server's RTMP: {e}"))?;
                while let Some(e) = client.poll_event() {
                    if let Event::Refused(why) = e {
                        return Err(format!("the server ended the stream: {why}"));
                    }
                }
                None
            }
            t = tags.recv() => Some(t),
        };
        let mut batch = Batch { configured, ..Default::default() };
        if let Some(t) = first {
            batch.take(t, &mut gate, &flv.config(), &mut client, held)?;
            tokio::time::sleep(FLUSH).await;
            while batch.bytes < FLUSH_BYTES && batch.parts.len() < MAX_PARTS - 1 {
                match tags.try_recv() {
                    Ok(t) => batch.take(Ok(t), &mut gate, &flv.config(), &mut client, held)?,
                    Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => batch.take(
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)),
                        &mut gate,
                        &flv.config(),
                        &mut client,
                        held,
                    )?,
                    Err(_) => break,
                }
            }
        }
        batch.own(&mut client);
        configured = batch.configured;
        if batch.bytes == 0 {
            continue;
        }
        match tokio::time::timeout(STALL, write_parts(io, batch.parts.iter().map(Part::bytes))).await {
            Ok(Ok(())) => {
                held.sent(batch.bytes, batch.tags);
                target.sent(batch.bytes);
                *pushed |= batch.tags > 0;
            }
            Ok(Err(e)) => return Err(format!("the server went: {e}")),
            Err(_) => return Err(format!("a write took longer than {STALL:?}: the server does not read")),
        }
    }
}

/// A write's bytes, in order: the client's own (acknowledgements, configurations, tags it
/// chunked itself) and tags' shared chunks.
enum Part {
    Own(Vec<u8>),
    Shared(FlvTag),
}

impl Part {
    fn bytes(&self) -> &[u8] {
        match self {
            Part::Own(b) => b,
            Part::Shared(t) => t.rtmp_chunks(),
        }
    }
}

#[derive(Default)]
struct Batch {
    parts: Vec<Part>,
    bytes: usize,
    tags: u64,
    /// The decoder configurations went out (on this connection).
    configured: bool,
}

impl Batch {
    /// What the client has to send, in its place.
    fn own(&mut self, client: &mut Client) {
        let out = client.take_output();
        if !out.is_empty() {
            self.bytes += out.len();
            self.parts.push(Part::Own(out));
        }
    }

    /// One tag from the channel: from a keyframe on. Unlike a player, the target gets every
    /// decoder configuration before the first tag (a server fixes its tracks at the first
    /// frame, from the configurations that came before it).
    fn take(
        &mut self,
        tag: Result<FlvTag, tokio::sync::broadcast::error::RecvError>,
        gate: &mut TagGate,
        config: &[(bool, Vec<u8>)],
        client: &mut Client,
        held: &Held,
    ) -> Result<(), String> {
        match gate.pass(tag, config) {
            Passed::Tag(_, tag) => {
                if !std::mem::replace(&mut self.configured, true) {
                    for (video, body) in config {
                        client.media(*video, tag.ms, body);
                    }
                }
                self.tags += 1;
                if client.takes_shared_media() {
                    self.own(client);
                    self.bytes += tag.rtmp_chunks().len();
                    self.parts.push(Part::Shared(tag));
                } else {
                    client.media(tag.video, tag.ms, &tag.body);
                }
            }
            Passed::Wait => {}
            Passed::Lagged(n) => held.skipped(n),
            Passed::Closed => return Err("the stream ended".into()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_batch_keeps_the_clients_bytes_in_their_place_among_the_shared_tags() {
        let url = RtmpUrl::parse("rtmp://h/live/k").unwrap();
        let mut client = Client::new(url, Role::Publish, 1);
        let mut server = fanout_proto::rtmp::server::Server::new(2);
        // Through to a started publish, against our own server.
        for _ in 0..8 {
            server.input(&client.take_output()).unwrap();
            while let Some(e) = server.poll_event() {
                if let fanout_proto::rtmp::server::Event::Publish { stream_id, name } = e {
                    server.accept_publish(stream_id, &name);
                }
            }
            client.input(&server.take_output()).unwrap();
        }
        assert!(client.takes_shared_media());
        let flv = crate::repack::Flv::new(vec![(true, vec![0x17, 0, 0, 0, 0, 1])], 4);
        let mut gate = TagGate::new(&flv);
        let held = Held::default();
        let mut batch = Batch::default();
        let delta = FlvTag::new(true, false, 0, Arc::new(vec![0x27, 1, 0, 0, 0, 5]));
        let key = FlvTag::new(true, true, 40, Arc::new(vec![0x17, 1, 0, 0, 0, 6]));
        let next = FlvTag::new(true, false, 80, Arc::new(vec![0x27, 1, 0, 0, 0, 7]));
        for t in [delta, key.clone(), next.clone()] {
            batch.take(Ok(t), &mut gate, &flv.config(), &mut client, &held).unwrap();
        }
        batch.own(&mut client);
        // The configuration (the client's own bytes) before the keyframe; the delta before
        // it was waited past; the tags are the shared chunks themselves.
        assert_eq!(batch.tags, 2);
        assert!(matches!(&batch.parts[..], [Part::Own(_), Part::Shared(_), Part::Shared(_)]));
        assert!(std::ptr::eq(batch.parts[1].bytes().as_ptr(), key.rtmp_chunks().as_ptr()), "shared, not copied");
        let written: Vec<u8> = batch.parts.iter().flat_map(|p| p.bytes().to_vec()).collect();
        assert_eq!(written.len(), batch.bytes);
        server.input(&written).unwrap();
        let got: Vec<_> = std::iter::from_fn(|| server.poll_event()).collect();
        use fanout_proto::rtmp::server::Event as S;
        assert_eq!(
            got,
            vec![
                S::Video { timestamp: 40, body: vec![0x17, 0, 0, 0, 0, 1] },
                S::Video { timestamp: 40, body: vec![0x17, 1, 0, 0, 0, 6] },
                S::Video { timestamp: 80, body: vec![0x27, 1, 0, 0, 0, 7] },
            ]
        );
    }
}
