//! The server side of one RTMP connection, sans-IO: bytes in ([`Server::input`]), bytes out
//! ([`Server::take_output`]) and events ([`Server::poll_event`]) for the relay to decide on
//! (who may publish what). It does the handshake (the plain one: S1 carries no digest, which
//! ffmpeg, OBS's librtmp and GStreamer's rtmp2 accept), the protocol control messages
//! (chunk size, acknowledgements, pings), and the NetConnection/NetStream commands of a
//! publisher: connect, createStream, publish, deleteStream.

use super::amf::{self, Amf, AmfError};
use super::chunk::{self, kind, ChunkError, ChunkReader};
use std::collections::VecDeque;
use thiserror::Error;

const HANDSHAKE_LEN: usize = 1536;
/// Our chunk size, told to the peer after its connect.
pub(super) const OUT_CHUNK_SIZE: usize = 4096;
/// The acknowledgement window we ask of the peer and the bandwidth we tell it.
const WINDOW: u32 = 2_500_000;
/// The message stream a client's createStream gets.
pub const STREAM_ID: u32 = 1;
/// Chunk streams of what we send: protocol control, commands, a stream's status.
const CSID_CONTROL: u8 = 2;
const CSID_COMMAND: u8 = 3;
const CSID_STATUS: u8 = 5;
const CSID_AUDIO: u8 = 4;
const CSID_VIDEO: u8 = 6;

/// One FLV tag body as the chunks a player on [`STREAM_ID`] gets, at `timestamp` ms: what
/// [`Server::media`] writes for a client that [`Server::takes_shared_media`]. Every chunk
/// stands alone (a full header, then continuations that need no earlier state), so the bytes
/// are the same for every such player.
pub fn media_chunks(video: bool, timestamp: u32, body: &[u8]) -> Vec<u8> {
    let (csid, k) = if video { (CSID_VIDEO, kind::VIDEO) } else { (CSID_AUDIO, kind::AUDIO) };
    let mut out = Vec::with_capacity(body.len() + 16 + body.len() / OUT_CHUNK_SIZE * 5);
    chunk::write_message(&mut out, csid, k, STREAM_ID, timestamp, body, OUT_CHUNK_SIZE);
    out
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RtmpError {
    #[error("RTMP version {0} (only 3 is spoken)")]
    Version(u8),
    #[error(transparent)]
    Chunk(#[from] ChunkError),
    #[error("a command: {0}")]
    Amf(#[from] AmfError),
    #[error("{0}")]
    Protocol(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The client connected to an application (`rtmp://host/APP`), as its tcUrl names it.
    Connect {
        app: String,
        tc_url: String,
    },
    /// The client asks to publish `name` (with its `?query`, if any) on a message stream:
    /// answer with [`Server::accept_publish`] or [`Server::refuse`].
    Publish {
        stream_id: u32,
        name: String,
    },
    /// The client asks to play `name`: answer with [`Server::accept_play`] and then
    /// [`Server::media`], or [`Server::refuse`].
    Play {
        stream_id: u32,
        name: String,
    },
    /// An FLV video or audio tag body of the published stream, at `timestamp` ms.
    Video {
        timestamp: u32,
        body: Vec<u8>,
    },
    Audio {
        timestamp: u32,
        body: Vec<u8>,
    },
    /// The publisher stopped (deleteStream, FCUnpublish, closeStream).
    Unpublish,
}

enum Phase {
    /// Waiting for C0 and C1.
    Hello,
    /// S0, S1, S2 sent; waiting for C2.
    Echo,
    Ready,
}

pub struct Server {
    phase: Phase,
    /// Handshake bytes not yet used.
    hello: Vec<u8>,
    reader: ChunkReader,
    out: Vec<u8>,
    out_chunk: usize,
    events: VecDeque<Event>,
    /// Bytes received, and at the last acknowledgement; the peer's window for them.
    received: u64,
    acked: u64,
    peer_window: u32,
    publishing: Option<u32>,
    /// The message stream a player plays on, once accepted.
    playing: Option<u32>,
    seed: u64,
}

impl Server {
    /// `seed`: any varying number, for S1's random bytes (they need not be secret).
    pub fn new(seed: u64) -> Self {
        Self {
            phase: Phase::Hello,
            hello: Vec::new(),
            reader: ChunkReader::default(),
            out: Vec::new(),
            out_chunk: chunk::DEFAULT_CHUNK_SIZE,
            events: VecDeque::new(),
            received: 0,
            acked: 0,
            peer_window: 0,
            publishing: None,
            playing: None,
            seed,
        }
    }

    /// Bytes from the client. An error ends the connection (the caller closes it).
    pub fn input(&mut self, mut bytes: &[u8]) -> Result<(), RtmpError> {
        self.received += bytes.len() as u64;
        loop {
            match self.phase {
                Phase::Hello => {
                    let n = (1 + HANDSHAKE_LEN - self.hello.len()).min(bytes.len());
                    self.hello.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    // The version byte is judged as soon as it comes (an HTTP or TLS client
                    // on this port is told at its first byte, not after 1,537).
                    if self.hello.first().is_some_and(|v| *v != 3) {
                        return Err(RtmpError::Version(self.hello[0]));
                    }
                    if self.hello.len() < 1 + HANDSHAKE_LEN {
                        return Ok(());
                    }
                    self.out.push(3);
                    // S1: time, zero, random bytes.
                    hello_bytes(&mut self.out, self.seed);
                    // S2: C1 echoed.
                    self.out.extend_from_slice(&self.hello[1..]);
                    self.hello.clear();
                    self.phase = Phase::Echo;
                }
                Phase::Echo => {
                    let n = (HANDSHAKE_LEN - self.hello.len()).min(bytes.len());
                    self.hello.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if self.hello.len() < HANDSHAKE_LEN {
                        return Ok(());
                    }
                    self.hello = Vec::new();
                    self.phase = Phase::Ready;
                }
                Phase::Ready => break,
            }
        }
        self.reader.push(bytes);
        while let Some(m) = self.reader.next_message()? {
            self.message(m)?;
        }
        if self.peer_window > 0 && self.received - self.acked >= u64::from(self.peer_window) {
            self.acked = self.received;
            let seq = (self.received as u32).to_be_bytes();
            self.send(CSID_CONTROL, kind::ACK, 0, &seq);
        }
        Ok(())
    }

    /// The next event for the relay.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Bytes to send to the client.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Whether the client publishes now.
    pub fn is_publishing(&self) -> bool {
        self.publishing.is_some()
    }

    /// Lets the client's publish go on: it starts sending media.
    pub fn accept_publish(&mut self, stream_id: u32, name: &str) {
        self.publishing = Some(stream_id);
        let description = format!("{name} is now published");
        self.status(stream_id, "status", "NetStream.Publish.Start", &description);
    }

    /// Lets the client's play go on: the stream begins, and [`Server::media`] sends it.
    pub fn accept_play(&mut self, stream_id: u32, name: &str) {
        self.playing = Some(stream_id);
        let mut begin = vec![0, 0]; // StreamBegin
        begin.extend_from_slice(&stream_id.to_be_bytes());
        self.send(CSID_CONTROL, kind::USER_CONTROL, 0, &begin);
        self.status(stream_id, "status", "NetStream.Play.Reset", &format!("playing and resetting {name}"));
        self.status(stream_id, "status", "NetStream.Play.Start", &format!("started playing {name}"));
    }

    /// Whether the playing client takes [`media_chunks`] as they are (it plays on
    /// [`STREAM_ID`] and was told our chunk size): then a relay writes the same bytes to
    /// every such player, made once per tag.
    pub fn takes_shared_media(&self) -> bool {
        self.playing == Some(STREAM_ID) && self.out_chunk == OUT_CHUNK_SIZE
    }

    /// One FLV video (`video`) or audio tag body for the playing client, at `timestamp` ms.
    pub fn media(&mut self, video: bool, timestamp: u32, body: &[u8]) {
        let Some(stream_id) = self.playing else { return };
        let (csid, k) = if video { (CSID_VIDEO, kind::VIDEO) } else { (CSID_AUDIO, kind::AUDIO) };
        chunk::write_message(&mut self.out, csid, k, stream_id, timestamp, body, self.out_chunk);
    }

    /// Tells the player its stream ended (StreamEOF, `NetStream.Play.UnpublishNotify`,
    /// `NetStream.Play.Stop`); the caller closes the connection after sending it.
    pub fn end_play(&mut self, description: &str) {
        let Some(stream_id) = self.playing.take() else { return };
        let mut eof = vec![0, 1]; // StreamEOF
        eof.extend_from_slice(&stream_id.to_be_bytes());
        self.send(CSID_CONTROL, kind::USER_CONTROL, 0, &eof);
        self.status(stream_id, "status", "NetStream.Play.UnpublishNotify", description);
        self.status(stream_id, "status", "NetStream.Play.Stop", description);
    }

    /// Bytes waiting to be sent (a player that does not read lets them grow).
    pub fn pending_output(&self) -> usize {
        self.out.len()
    }

    /// Refuses a publish or play with an onStatus error (`code` such as
    /// `NetStream.Publish.BadName`); the caller closes the connection after sending it.
    pub fn refuse(&mut self, stream_id: u32, code: &str, description: &str) {
        self.status(stream_id, "error", code, description);
    }

    fn status(&mut self, stream_id: u32, level: &str, code: &str, description: &str) {
        let info = Amf::object([
            ("level", Amf::string(level)),
            ("code", Amf::string(code)),
            ("description", Amf::string(description)),
        ]);
        let body = amf::encode_all(&[Amf::string("onStatus"), Amf::Number(0.0), Amf::Null, info]);
        self.send(CSID_STATUS, kind::COMMAND_AMF0, stream_id, &body);
    }

    fn send(&mut self, csid: u8, kind: u8, stream_id: u32, payload: &[u8]) {
        chunk::write_message(&mut self.out, csid, kind, stream_id, 0, payload, self.out_chunk);
    }

    fn result(&mut self, txn: f64, values: Vec<Amf>) {
        let mut all = vec![Amf::string("_result"), Amf::Number(txn)];
        all.extend(values);
        let body = amf::encode_all(&all);
        self.send(CSID_COMMAND, kind::COMMAND_AMF0, 0, &body);
    }

    fn message(&mut self, m: chunk::Message) -> Result<(), RtmpError> {
        if let Some(c) = control(&mut self.reader, &m)? {
            match c {
                Control::Applied => {}
                Control::Window(w) => self.peer_window = w,
                Control::Pong(pong) => self.send(CSID_CONTROL, kind::USER_CONTROL, 0, &pong),
            }
            return Ok(());
        }
        match m.kind {
            kind::VIDEO if self.publishing == Some(m.stream_id) => {
                self.events.push_back(Event::Video { timestamp: m.timestamp, body: m.payload })
            }
            kind::AUDIO if self.publishing == Some(m.stream_id) => {
                self.events.push_back(Event::Audio { timestamp: m.timestamp, body: m.payload })
            }
            kind::COMMAND_AMF0 => self.command(m.stream_id, &m.payload)?,
            // An AMF3 command is an AMF0 one after a format byte.
            kind::COMMAND_AMF3 if !m.payload.is_empty() => self.command(m.stream_id, &m.payload[1..])?,
            // Metadata (@setDataFrame/onMetaData), acknowledgements, bandwidth: nothing to do.
            _ => {}
        }
        Ok(())
    }

    fn command(&mut self, stream_id: u32, payload: &[u8]) -> Result<(), RtmpError> {
        let v = amf::decode_all(payload)?;
        let name = v.first().and_then(Amf::str).ok_or(RtmpError::Protocol("a command without a name"))?;
        let txn = v.get(1).and_then(Amf::number).unwrap_or(0.0);
        // The first argument after the command object.
        let arg = || v.get(3).and_then(Amf::str).unwrap_or("").to_string();
        match name {
            "connect" => {
                let obj = v.get(2);
                let field = |k| obj.and_then(|o| o.get(k)).and_then(Amf::str).unwrap_or("").to_string();
                let (app, tc_url) = (field("app"), field("tcUrl"));
                self.send(CSID_CONTROL, kind::WINDOW_ACK_SIZE, 0, &WINDOW.to_be_bytes());
                let mut bw = WINDOW.to_be_bytes().to_vec();
                bw.push(2); // dynamic
                self.send(CSID_CONTROL, kind::SET_PEER_BANDWIDTH, 0, &bw);
                self.send(CSID_CONTROL, kind::SET_CHUNK_SIZE, 0, &(OUT_CHUNK_SIZE as u32).to_be_bytes());
                self.out_chunk = OUT_CHUNK_SIZE;
                let props =
                    Amf::object([("fmsVer", Amf::string("FMS/3,0,1,123")), ("capabilities", Amf::Number(31.0))]);
                let info = Amf::object([
                    ("level", Amf::string("status")),
                    ("code", Amf::string("NetConnection.Connect.Success")),
                    ("description", Amf::string("Connection succeeded.")),
                    ("objectEncoding", Amf::Number(0.0)),
                ]);
                self.result(txn, vec![props, info]);
                self.events.push_back(Event::Connect { app, tc_url });
            }
            "createStream" => self.result(txn, vec![Amf::Null, Amf::Number(f64::from(STREAM_ID))]),
            "releaseStream" | "FCPublish" if txn != 0.0 => self.result(txn, vec![Amf::Null, Amf::Undefined]),
            "publish" => {
                if self.publishing.is_some() {
                    return Err(RtmpError::Protocol("a second publish on one connection"));
                }
                self.events.push_back(Event::Publish { stream_id, name: arg() });
            }
            "play" => self.events.push_back(Event::Play { stream_id, name: arg() }),
            "deleteStream" | "FCUnpublish" | "closeStream" if self.publishing.take().is_some() => {
                self.events.push_back(Event::Unpublish);
            }
            _ => {}
        }
        Ok(())
    }
}

/// C1 or S1 after the version byte: a zero time, zeros, and bytes that need only vary.
pub(super) fn hello_bytes(out: &mut Vec<u8>, seed: u64) {
    out.extend_from_slice(&[0; 8]);
    let mut x = seed | 1;
    for _ in 0..(HANDSHAKE_LEN - 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(x as u8);
    }
}

/// A protocol control message, handled alike on both sides.
pub(super) enum Control {
    /// A chunk size or an abort, applied to the chunk reader.
    Applied,
    /// The peer's acknowledgement window, for the caller to keep.
    Window(u32),
    /// A ping request's answer, for the caller to send.
    Pong(Vec<u8>),
}

/// Handles `m` if it is a protocol control message (`None` if not).
pub(super) fn control(reader: &mut ChunkReader, m: &chunk::Message) -> Result<Option<Control>, RtmpError> {
    let u32_at = |p: &[u8]| p.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    Ok(Some(match m.kind {
        kind::SET_CHUNK_SIZE => {
            let size = u32_at(&m.payload).ok_or(RtmpError::Protocol("a short Set Chunk Size"))?;
            reader.set_chunk_size(size & 0x7fff_ffff)?;
            Control::Applied
        }
        kind::ABORT => {
            if let Some(csid) = u32_at(&m.payload) {
                reader.abort(csid);
            }
            Control::Applied
        }
        kind::WINDOW_ACK_SIZE => Control::Window(u32_at(&m.payload).unwrap_or(0)),
        // A ping request: answered with the same timestamp.
        kind::USER_CONTROL if m.payload.len() >= 6 && m.payload[..2] == [0, 6] => {
            Control::Pong([&[0, 7][..], &m.payload[2..6]].concat())
        }
        _ => return Ok(None),
    }))
}

/// A publish name or tcUrl split at its query: `cam1?user=a&pass=b` → (`cam1`, `user=a&pass=b`).
pub fn split_query(name: &str) -> (&str, &str) {
    name.split_once('?').unwrap_or((name, ""))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A client's side, just enough to drive a server: the handshake and commands.
    pub(crate) struct Client {
        pub reader: ChunkReader,
    }

    impl Client {
        pub fn hello() -> Vec<u8> {
            let mut c = vec![3];
            c.extend((0..HANDSHAKE_LEN).map(|i| i as u8));
            c
        }

        pub fn command(values: &[Amf], stream_id: u32) -> Vec<u8> {
            let mut out = Vec::new();
            chunk::write_message(&mut out, 3, kind::COMMAND_AMF0, stream_id, 0, &amf::encode_all(values), 128);
            out
        }

        /// Every command the server sent: (name, values after the name).
        pub fn commands(&mut self, bytes: &[u8]) -> Vec<(String, Vec<Amf>)> {
            self.reader.push(bytes);
            let mut v = Vec::new();
            while let Some(m) = self.reader.next_message().unwrap() {
                if m.kind == kind::SET_CHUNK_SIZE {
                    self.reader.set_chunk_size(u32::from_be_bytes(m.payload[..4].try_into().unwrap())).unwrap();
                }
                if m.kind == kind::COMMAND_AMF0 {
                    let mut a = amf::decode_all(&m.payload).unwrap();
                    let name = a.remove(0).str().unwrap().to_string();
                    v.push((name, a));
                }
            }
            v
        }
    }

    /// A server past connect, createStream and publish of `name`.
    pub(crate) fn publishing(name: &str) -> (Server, Client) {
        let mut s = Server::new(7);
        let hello = Client::hello();
        s.input(&hello).unwrap();
        let out = s.take_output();
        assert_eq!(out.len(), 1 + 2 * HANDSHAKE_LEN);
        assert_eq!(&out[1 + HANDSHAKE_LEN..], &hello[1..], "S2 echoes C1");
        s.input(&out[1..1 + HANDSHAKE_LEN]).unwrap(); // C2
        let mut c = Client { reader: ChunkReader::default() };
        let connect = Client::command(
            &[
                Amf::string("connect"),
                Amf::Number(1.0),
                Amf::object([("app", Amf::string("live")), ("tcUrl", Amf::string("rtmp://h/live"))]),
            ],
            0,
        );
        s.input(&connect).unwrap();
        let got = c.commands(&s.take_output());
        assert_eq!(got[0].0, "_result");
        assert_eq!(got[0].1[2].get("code").and_then(Amf::str), Some("NetConnection.Connect.Success"));
        assert_eq!(s.poll_event(), Some(Event::Connect { app: "live".into(), tc_url: "rtmp://h/live".into() }));
        s.input(&Client::command(&[Amf::string("createStream"), Amf::Number(4.0), Amf::Null], 0)).unwrap();
        let got = c.commands(&s.take_output());
        assert_eq!(got[0].1, vec![Amf::Number(4.0), Amf::Null, Amf::Number(1.0)]);
        let publish = [Amf::string("publish"), Amf::Number(5.0), Amf::Null, Amf::string(name), Amf::string("live")];
        s.input(&Client::command(&publish, STREAM_ID)).unwrap();
        assert_eq!(s.poll_event(), Some(Event::Publish { stream_id: STREAM_ID, name: name.into() }));
        (s, c)
    }

    #[test]
    fn a_publisher_connects_publishes_and_its_media_comes_out_as_events() {
        let (mut s, mut c) = publishing("cam1?user=a&pass=b");
        // Nothing it sends counts before the relay accepts.
        let mut video = Vec::new();
        chunk::write_message(&mut video, 6, kind::VIDEO, STREAM_ID, 40, &[0x17, 1, 0, 0, 0], 128);
        s.input(&video).unwrap();
        assert_eq!(s.poll_event(), None);
        s.accept_publish(STREAM_ID, "cam1");
        let got = c.commands(&s.take_output());
        assert_eq!(got[0].0, "onStatus");
        assert_eq!(got[0].1[2].get("code").and_then(Amf::str), Some("NetStream.Publish.Start"));
        s.input(&video).unwrap();
        assert_eq!(s.poll_event(), Some(Event::Video { timestamp: 40, body: vec![0x17, 1, 0, 0, 0] }));
        s.input(&Client::command(&[Amf::string("deleteStream"), Amf::Number(6.0), Amf::Null, Amf::Number(1.0)], 0))
            .unwrap();
        assert_eq!(s.poll_event(), Some(Event::Unpublish));
        assert_eq!(split_query("cam1?user=a&pass=b"), ("cam1", "user=a&pass=b"));
    }

    #[test]
    fn a_refusal_is_an_error_status_and_pings_are_answered() {
        let (mut s, mut c) = publishing("cam1");
        s.refuse(STREAM_ID, "NetStream.Publish.BadName", "cam1 is being published");
        let got = c.commands(&s.take_output());
        assert_eq!(got[0].1[2].get("level").and_then(Amf::str), Some("error"));
        let mut ping = Vec::new();
        chunk::write_message(&mut ping, 2, kind::USER_CONTROL, 0, 0, &[0, 6, 0, 0, 1, 2], 128);
        s.input(&ping).unwrap();
        let mut r = ChunkReader::default();
        r.set_chunk_size(OUT_CHUNK_SIZE as u32).unwrap();
        r.push(&s.take_output());
        let m = r.next_message().unwrap().unwrap();
        assert_eq!((m.kind, m.payload), (kind::USER_CONTROL, vec![0, 7, 0, 0, 1, 2]));
    }

    #[test]
    fn a_player_is_told_the_stream_began_and_gets_media() {
        let mut s = Server::new(3);
        s.input(&Client::hello()).unwrap();
        s.input(&[0; HANDSHAKE_LEN]).unwrap();
        s.take_output();
        let mut c = Client { reader: ChunkReader::default() };
        s.input(&Client::command(&[Amf::string("connect"), Amf::Number(1.0), Amf::object([])], 0)).unwrap();
        c.commands(&s.take_output());
        s.input(&Client::command(&[Amf::string("play"), Amf::Number(0.0), Amf::Null, Amf::string("cam")], STREAM_ID))
            .unwrap();
        assert!(matches!(s.poll_event(), Some(Event::Connect { .. })));
        assert_eq!(s.poll_event(), Some(Event::Play { stream_id: STREAM_ID, name: "cam".into() }));
        s.media(true, 0, b"not yet");
        assert_eq!(s.pending_output(), 0, "no media before the play is accepted");
        assert!(!s.takes_shared_media(), "not playing yet");
        s.accept_play(STREAM_ID, "cam");
        assert!(s.takes_shared_media());
        // What this player is written is what every player's shared bytes are, whatever the
        // size (continuations) and time (the extended timestamp past 0xffffff ms).
        for (len, ms) in [(5, 40), (10_000, 80), (9000, 0x0100_0000)] {
            let body: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let before = s.pending_output();
            s.media(true, ms, &body);
            assert_eq!(s.out[before..], media_chunks(true, ms, &body)[..], "{len} bytes at {ms} ms");
            s.out.truncate(before);
        }
        s.media(true, 40, &[0x17, 1, 0, 0, 0]);
        let out = s.take_output();
        let codes: Vec<String> = c
            .commands(&out)
            .iter()
            .filter_map(|(_, v)| v.get(2).and_then(|i| i.get("code")).and_then(Amf::str).map(String::from))
            .collect();
        assert_eq!(codes, ["NetStream.Play.Reset", "NetStream.Play.Start"]);
        let mut r = ChunkReader::default();
        r.set_chunk_size(OUT_CHUNK_SIZE as u32).unwrap();
        r.push(&out);
        let mut kinds = Vec::new();
        while let Some(m) = r.next_message().unwrap() {
            kinds.push((m.kind, m.stream_id, m.timestamp));
        }
        assert_eq!(kinds.first(), Some(&(kind::USER_CONTROL, 0, 0)), "StreamBegin first");
        assert_eq!(kinds.last(), Some(&(kind::VIDEO, STREAM_ID, 40)));
        // The end: StreamEOF, then the player is told why, and gets no more media.
        s.end_play("the stream ended");
        s.media(true, 80, &[0x27, 1, 0, 0, 0]);
        let out = s.take_output();
        let mut r = ChunkReader::default();
        r.set_chunk_size(OUT_CHUNK_SIZE as u32).unwrap();
        r.push(&out);
        let first = r.next_message().unwrap().unwrap();
        assert_eq!((first.kind, &first.payload[..2]), (kind::USER_CONTROL, &[0u8, 1][..]), "StreamEOF");
        let codes: Vec<String> = c
            .commands(&out)
            .iter()
            .filter_map(|(_, v)| v.get(2).and_then(|i| i.get("code")).and_then(Amf::str).map(String::from))
            .collect();
        assert_eq!(codes, ["NetStream.Play.UnpublishNotify", "NetStream.Play.Stop"]);
        assert!(!out.windows(5).any(|w| w == [0x27, 1, 0, 0, 0]), "no media after the end");
    }

    #[test]
    fn a_wrong_version_and_garbage_end_the_connection() {
        let mut s = Server::new(1);
        let mut hello = Client::hello();
        hello[0] = 6; // RTMPE
        assert_eq!(s.input(&hello), Err(RtmpError::Version(6)));
        let mut s = Server::new(1);
        s.input(&Client::hello()).unwrap();
        s.input(&[0; HANDSHAKE_LEN]).unwrap();
        assert!(s.input(&[0xc9, 1, 2, 3]).is_err(), "a chunk stream that never started");
    }

    /// A corpus of malformed handshakes and first chunks, each fed whole and byte by byte:
    /// refused with an error or waiting for more, never a panic, never an event, and a
    /// refused connection stays refused.
    #[test]
    fn malformed_handshakes_are_refused_or_wait() {
        let hello = Client::hello();
        let mut good = hello.clone();
        good.extend_from_slice(&[0; HANDSHAKE_LEN]);
        let with = |tail: &[u8]| [good.as_slice(), tail].concat();
        let corpus: Vec<(&str, Vec<u8>, bool)> = vec![
            ("empty", vec![], false),
            ("C0 alone", vec![3], false),
            ("C0C1 cut short", hello[..700].to_vec(), false),
            ("RTMPE (version 6)", [&[6u8][..], &hello[1..]].concat(), true),
            ("version 0", [&[0u8][..], &hello[1..]].concat(), true),
            ("version 255 with no C1", vec![255], true),
            ("an HTTP request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), true),
            ("a TLS ClientHello", [&[0x16u8, 3, 1, 0, 200][..], &[0; 200][..]].concat(), true),
            ("a chunk of stream 0 type 3 first", with(&[0xc0, 0, 0]), true),
            ("a chunk continuing nothing", with(&[0xc9, 1, 2, 3]), true),
            ("a message of 16 MB", with(&[0x03, 0, 0, 0, 0xff, 0xff, 0xff, 20, 0, 0, 0, 0]), true),
            ("a chunk size of 0", with(&[0x02, 0, 0, 0, 0, 0, 4, 1, 0, 0, 0, 0, 0, 0, 0, 0]), true),
            ("a command that is not AMF", with(&[0x03, 0, 0, 0, 0, 0, 3, 20, 0, 0, 0, 0, 0xff, 0xff, 0xff]), true),
        ];
        for (what, bytes, refused) in corpus {
            for pieces in [bytes.len().max(1), 1] {
                let mut s = Server::new(1);
                let r: Result<(), RtmpError> = bytes.chunks(pieces).try_for_each(|p| s.input(p));
                assert_eq!(r.is_err(), refused, "{what} in pieces of {pieces}: {r:?}");
                assert!(
                    !matches!(s.poll_event(), Some(Event::Publish { .. } | Event::Play { .. })),
                    "{what}: an event"
                );
            }
        }
    }

    #[test]
    fn acknowledgements_follow_the_peers_window() {
        let (mut s, _) = publishing("x");
        s.take_output();
        let mut w = Vec::new();
        chunk::write_message(&mut w, 2, kind::WINDOW_ACK_SIZE, 0, 0, &1000u32.to_be_bytes(), 128);
        s.input(&w).unwrap();
        s.input(&Client::command(&[Amf::string("noop"), Amf::Number(0.0), Amf::string(&"x".repeat(1200))], 0)).unwrap();
        let mut r = ChunkReader::default();
        r.set_chunk_size(OUT_CHUNK_SIZE as u32).unwrap();
        r.push(&s.take_output());
        // One when the window was set (the handshake and commands passed it), one after
        // another window's worth; each names the bytes received so far.
        let mut acks = Vec::new();
        while let Some(m) = r.next_message().unwrap() {
            assert_eq!(m.kind, kind::ACK);
            acks.push(u64::from(u32::from_be_bytes(m.payload[..4].try_into().unwrap())));
        }
        assert_eq!(acks.len(), 2, "{acks:?}");
        assert_eq!(acks[1], s.received);
        assert!(acks[1] - acks[0] >= 1000);
    }
}
