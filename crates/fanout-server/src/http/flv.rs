//! HTTP-FLV players (`GET /{path}.flv`, as flv.js, mpegts.js and ffmpeg play it): the path's
//! FLV tags, the ones its RTMP players get, framed once for all players (`FlvTag::file_bytes`)
//! at the path's time. A player's tags wait up to `stream_flush_ms` and go out in one
//! vectored write, straight from the shared buffers; one that falls a channel behind skips to
//! the next keyframe, as RTMP players do. Kicked, or at the path's end, the stream ends (the
//! connection closes: the response has no length).
//!
//! WebSocket-FLV (the same URL opened as `ws://`, as browsers' players do) is the same: each
//! write is one binary frame, its header the player's only bytes of its own.

use crate::readers::{Held, Registered, Who};
use crate::relay::Relay;
use crate::repack::{FlvTag, Repack};
use crate::write::{write_parts, MAX_PARTS};
use fanout_proto::websocket::{self as ws, Incoming};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

/// A write gathers at most this much (and at most `MAX_PARTS` tags).
const FLUSH_BYTES: usize = 64 << 10;

/// An HTTP-FLV player, joined to its path, before its first byte.
pub struct Player {
    name: String,
    repack: Arc<Repack>,
    tags: tokio::sync::broadcast::Receiver<FlvTag>,
    video: bool,
    /// From a keyframe on, its configurations first.
    gate: crate::repack::TagGate,
    held: Arc<Held>,
    registered: Registered,
    /// WebSocket-FLV: what the client sends (its pings and close).
    ws: Option<Incoming>,
    /// A close frame went out (nothing may follow it).
    closed: bool,
    /// Its socket's send buffer: a second of the stream.
    send_buffer: usize,
}

/// Joins a player to path `name`'s FLV (made on demand, as for any reader), or says why not
/// (an HTTP status and reason).
pub async fn join(relay: &Arc<Relay>, name: &str, who: Who) -> Result<Player, (u16, String)> {
    let repack = relay.repack(name).await.map_err(|e| {
        let crate::error::ApiError(status, why) = e.into();
        (status.as_u16(), why)
    })?;
    let Some(flv) = repack.flv.clone() else {
        return Err((404, format!("{name}'s tracks do not go in FLV ({}; parameter sets unknown?)", repack.describes)));
    };
    let Some(path) = relay.path(name) else { return Err((404, format!("no path {name}"))) };
    let held = Arc::new(Held::default());
    let registered = path.readers.join(who, held.clone()).map_err(|full| (503, full.to_string()))?;
    let video = flv.video;
    let tags = flv.tags.subscribe();
    Ok(Player {
        name: name.to_string(),
        repack,
        tags,
        video,
        gate: crate::repack::TagGate::new(&flv),
        held,
        registered,
        ws: None,
        closed: false,
        send_buffer: path.session.stream_send_buffer(),
    })
}

/// Where [`to_engine`] left a player.
pub enum Handed {
    /// A sink of the FLV's session: the data plane writes it from now on.
    Playing,
    /// Not yet: the stream's decoder configurations are not known before its first keyframe.
    NotYet(tokio::net::TcpStream),
}

/// Hands a plain HTTP-FLV player of path `name` to the data plane: the response head, the
/// file's header and the decoder configurations go out now (within `stall`), and the player
/// becomes a stream sink of the path's FLV session, from the last keyframe the ring holds
/// (or the next), written once per flush interval straight from the ring, resuming at a
/// keyframe if the ring laps it, as an HTTP TS player is; kicked, its sink goes. Refused
/// (the stream back, an HTTP status and why) as [`join`] refuses.
pub async fn to_engine(
    mut stream: tokio::net::TcpStream,
    relay: &Arc<Relay>,
    name: &str,
    who: Who,
    stall: Duration,
) -> Result<Handed, (tokio::net::TcpStream, (u16, String))> {
    let repack = match relay.repack(name).await {
        Ok(r) => r,
        Err(e) => {
            let crate::error::ApiError(status, why) = e.into();
            return Err((stream, (status.as_u16(), why)));
        }
    };
    let Some(flv) = repack.flv.clone() else {
        let why = format!("{name}'s tracks do not go in FLV ({}; parameter sets unknown?)", repack.describes);
        return Err((stream, (404, why)));
    };
    if flv.config().is_empty() {
        return Ok(Handed::NotYet(stream));
    }
    let Some(path) = relay.path(name) else { return Err((stream, (404, format!("no path {name}")))) };
    // Listed before its first byte goes out; the engine's sink once it has one.
    let held = Arc::new(Held::default());
    let registered = match path.readers.join(who, held.clone()) {
        Ok(r) => r,
        Err(full) => return Err((stream, (503, full.to_string()))),
    };
    let session = match repack.flv_session(&relay.engine, crate::repack::Form::File) {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err((stream, (500, format!("{name}'s FLV session: {e}")))),
        None => return Err((stream, (404, format!("{name}'s tracks do not go in FLV")))),
    };
    let start = [HEAD.as_bytes(), &flv.file_start()].concat();
    if !matches!(tokio::time::timeout(stall, stream.write_all(&start)).await, Ok(Ok(()))) {
        return Ok(Handed::Playing); // (it went before its first byte of media)
    }
    let peer = stream.peer_addr().ok();
    // (A second of the path's stream: the FLV session's own rate is not known at first.)
    let send_buffer = path.session.stream_send_buffer();
    let sink = match stream.into_std().and_then(|s| session.add_stream_sink_sized(s, true, send_buffer)) {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(path = name, ?peer, "cannot add the HTTP-FLV player: {e}");
            return Ok(Handed::Playing);
        }
    };
    // The engine holds the socket now: the reader stays until its sink goes.
    held.handed_to(session, sink);
    tracing::info!(path = name, sink, ?peer, reader = registered.id(), "HTTP-FLV player playing");
    registered.detach();
    Ok(Handed::Playing)
}

/// The response head: no length, the stream until either side closes; any origin may read it.
const HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: video/x-flv\r\nCache-Control: no-cache\r\n\
    Access-Control-Allow-Origin: *\r\nConnection: close\r\n\r\n";

impl Player {
    /// What its socket's send buffer should hold (a second of the stream).
    pub fn send_buffer(&self) -> usize {
        self.send_buffer
    }

    /// Plays into `io` (over WebSocket where the request gave a `websocket` key) until the
    /// client goes, a write takes longer than `stall`, or the player is kicked or its path
    /// ends.
    pub async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        mut self,
        io: &mut S,
        websocket: Option<&str>,
        flush: Duration,
        stall: Duration,
    ) {
        let flv = self.repack.flv.clone().expect("joined with FLV");
        let audio = flv.audio;
        let header = fanout_proto::container::flv::file_header(self.video, audio);
        let start = match websocket {
            Some(key) => {
                self.ws = Some(Incoming::default());
                let (h, n) = ws::frame_header(ws::op::BINARY, header.len());
                [ws::upgrade_response(key).as_bytes(), &h[..n], &header].concat()
            }
            None => [HEAD.as_bytes(), &header].concat(),
        };
        if !matches!(tokio::time::timeout(stall, io.write_all(&start)).await, Ok(Ok(()))) {
            return;
        }
        let kind = if self.ws.is_some() { "WebSocket-FLV" } else { "HTTP-FLV" };
        tracing::info!(path = self.name, reader = self.registered.id(), "{kind} player playing");
        // The client sends nothing but (over WebSocket) pings and its close; its read ending
        // is its leaving, seen at once rather than at the next write.
        let mut heard = [0u8; 512];
        // A write holds at most `FLUSH_BYTES`; what it left waiting goes in the next at once.
        let mut left_waiting = false;
        let why = loop {
            let mut batch = Batch::default();
            if !std::mem::take(&mut left_waiting) {
                let first = tokio::select! {
                    why = crate::readers::ended(Some(&self.held)) => break why,
                    r = io.read(&mut heard) => match self.hear(io, r, &heard, stall).await {
                        Ok(()) => continue,
                        Err(why) => break why,
                    },
                    t = self.tags.recv() => t,
                };
                if let Err(e) = self.take(first, &mut batch, &flv.config()) {
                    break e.to_string();
                }
                // What else comes within the flush interval goes in the same write.
                if !flush.is_zero() {
                    tokio::select! {
                        why = crate::readers::ended(Some(&self.held)) => break why,
                        r = io.read(&mut heard) => if let Err(why) = self.hear(io, r, &heard, stall).await {
                            break why;
                        },
                        _ = tokio::time::sleep(flush) => {}
                    }
                }
            }
            let mut more = Ok(());
            while more.is_ok() {
                if batch.bytes >= FLUSH_BYTES || batch.tags.len() >= MAX_PARTS {
                    left_waiting = true;
                    break;
                }
                let next = match self.tags.try_recv() {
                    Ok(t) => Ok(t),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                    Err(TryRecvError::Closed) => Err(RecvError::Closed),
                };
                more = self.take(next, &mut batch, &flv.config());
            }
            if batch.bytes == 0 {
                match more {
                    Ok(()) => continue,
                    Err(e) => break e.to_string(),
                }
            }
            let frame = self.ws.is_some().then(|| ws::frame_header(ws::op::BINARY, batch.bytes));
            let framing = frame.as_ref().map(|(h, n)| &h[..*n]);
            match tokio::time::timeout(stall, write_parts(io, framing.into_iter().chain(batch.parts()))).await {
                Ok(Ok(())) => self.held.sent(batch.bytes, batch.tags.len() as u64),
                Ok(Err(e)) => break format!("the player went: {e}"),
                Err(_) => break format!("a write took longer than {stall:?}"),
            }
            if let Err(e) = more {
                break e.to_string();
            }
        };
        // A WebSocket is told it ends (unless the client closed it, and was answered).
        if self.ws.is_some() && !self.closed {
            let close = ws::close_frame(ws::close::GOING_AWAY);
            let _ = tokio::time::timeout(Duration::from_secs(1), io.write_all(&close)).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
        tracing::info!(path = self.name, reader = self.registered.id(), "{kind} player ended: {why}");
    }

    /// What the client sent: nothing to do over plain HTTP; over WebSocket a ping answered,
    /// a close answered and the end, a broken frame closed with 1002. `Err`: why it ends.
    async fn hear<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        read: std::io::Result<usize>,
        heard: &[u8],
        stall: Duration,
    ) -> Result<(), String> {
        let n = match read {
            Ok(0) => return Err("the player went".into()),
            Err(e) => return Err(format!("the player went: {e}")),
            Ok(n) => n,
        };
        let Some(incoming) = self.ws.as_mut() else { return Ok(()) };
        let (mut reply, mut end) = (Vec::new(), None);
        match incoming.push(&heard[..n]) {
            Ok(events) => {
                for e in events {
                    match e {
                        ws::Event::Ping(p) => reply.extend(ws::pong_frame(&p)),
                        ws::Event::Close(code) => {
                            reply.extend(ws::close_frame(ws::close::NORMAL));
                            end = Some(format!("the player closed its WebSocket ({code:?})"));
                        }
                    }
                }
            }
            Err(e) => {
                reply = ws::close_frame(ws::close::PROTOCOL_ERROR);
                end = Some(format!("the player broke the WebSocket protocol: {e}"));
            }
        }
        self.closed = end.is_some();
        if !reply.is_empty() && !matches!(tokio::time::timeout(stall, io.write_all(&reply)).await, Ok(Ok(()))) {
            return Err("the player does not read".into());
        }
        end.map_or(Ok(()), Err)
    }

    /// One tag from the channel into `batch`: from a keyframe on (its picture whole), each
    /// decoder configuration before its kind's first tag.
    fn take(
        &mut self,
        tag: Result<FlvTag, RecvError>,
        batch: &mut Batch,
        config: &[(bool, Vec<u8>)],
    ) -> Result<(), StreamEnded> {
        use crate::repack::Passed;
        match self.gate.pass(tag, config) {
            Passed::Tag(owed, tag) => {
                for body in owed {
                    batch.push_owned(fanout_proto::container::flv::file_tag(tag.video, tag.ms, body));
                }
                batch.push(tag);
            }
            Passed::Wait => {}
            Passed::Lagged(n) => {
                tracing::debug!(path = self.name, skipped = n, "HTTP-FLV player fell behind");
                self.held.skipped(n);
            }
            Passed::Closed => return Err(StreamEnded),
        }
        Ok(())
    }
}

/// The path's FLV ended (its repackaging stopped).
#[derive(Debug, thiserror::Error)]
#[error("the stream ended")]
struct StreamEnded;

/// The tags of one write: the shared ones, and a player's own (its configuration).
#[derive(Default)]
struct Batch {
    own: Vec<Vec<u8>>,
    tags: Vec<FlvTag>,
    bytes: usize,
}

impl Batch {
    fn push(&mut self, t: FlvTag) {
        self.bytes += t.file_bytes().len();
        self.tags.push(t);
    }

    fn push_owned(&mut self, b: Vec<u8>) {
        self.bytes += b.len();
        self.own.push(b);
    }

    /// Its own bytes (decoder configurations), then the tags: each configuration still
    /// comes before its kind's first tag.
    fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.own.iter().map(Vec::as_slice).chain(self.tags.iter().map(FlvTag::file_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_holds_its_own_bytes_first_and_shared_tags_framed_once() {
        let tag = FlvTag::new(true, true, 40, Arc::new(vec![0x17, 1, 0, 0, 0, 9, 9, 9]));
        let copy = tag.clone();
        let mut b = Batch::default();
        b.push_owned(vec![1, 2, 3]);
        b.push(tag);
        b.push(copy.clone());
        // One framing, shared by the clones (every player's copy of the tag).
        assert!(std::ptr::eq(b.tags[0].file_bytes().as_ptr(), copy.file_bytes().as_ptr()));
        let framed = fanout_proto::container::flv::file_tag(true, 40, &[0x17, 1, 0, 0, 0, 9, 9, 9]);
        let written: Vec<u8> = b.parts().flatten().copied().collect();
        assert_eq!(written, [&[1, 2, 3][..], &framed, &framed].concat());
        assert_eq!(b.bytes, written.len());
    }
}
