//! The client side of one RTMP connection, sans-IO: what the relay speaks when it pushes a
//! path to another server (`forward`) or pulls one from it (an `rtmp` source). Bytes in
//! ([`Client::input`]), bytes out ([`Client::take_output`]), events ([`Client::poll_event`]).
//!
//! It does the plain handshake (C1 without a digest, as ffmpeg and OBS send it), then
//! `connect`, `createStream` and `publish` or `play`, one command after the answer to the
//! one before; it answers pings and acknowledges what it reads. A publisher's media goes on
//! the stream the server gave, in chunks of [`OUT_CHUNK_SIZE`](super::server) told first: on
//! stream 1 those are the bytes `server::media_chunks` made once for the path's players.

use super::amf::{self, Amf};
use super::chunk::{self, kind, ChunkReader};
use super::server::{control, hello_bytes, media_chunks, Control, RtmpError, OUT_CHUNK_SIZE, STREAM_ID};
use std::collections::VecDeque;

const HANDSHAKE_LEN: usize = 1536;
/// The acknowledgement window we tell the server (what it may send before our ack).
const WINDOW: u32 = 2_500_000;
/// Chunk streams of what we send, as ffmpeg numbers them.
const CSID_CONTROL: u8 = 2;
const CSID_COMMAND: u8 = 3;
const CSID_STREAM: u8 = 8;
const CSID_AUDIO: u8 = 4;
const CSID_VIDEO: u8 = 6;

/// What the connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Publish,
    Play,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The server started the stream: a publisher sends media now, a player gets it.
    Started,
    /// The server refused a command or ended the stream (an `_error`, an onStatus error or a
    /// stop): its code and description. The connection is of no more use.
    Refused(String),
    /// A played stream's FLV video or audio tag body, at `timestamp` ms.
    Video {
        timestamp: u32,
        body: Vec<u8>,
    },
    Audio {
        timestamp: u32,
        body: Vec<u8>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// C0 and C1 sent; waiting for S0, S1 and S2.
    Hello,
    /// connect sent.
    Connecting,
    /// createStream sent.
    Creating,
    /// publish or play sent, on the stream the server gave.
    Asking,
    Started,
    Ended,
}

/// Where a URL says to connect and what to ask for: `rtmp[s]://host[:port]/app/key?query`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtmpUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Everything between the host and the last path segment (`live`, `app/instance`).
    pub app: String,
    /// The last segment with the query: the stream key (credentials may ride in its query).
    pub stream: String,
}

impl RtmpUrl {
    /// Parses `url`; one segment is the app, as `rtmp://host/cam` names MediaMTX's `cam` and
    /// fanout's.
    pub fn parse(url: &str) -> Result<Self, crate::Invalid> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("rtmps://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("rtmp://") {
            (false, r)
        } else {
            return Err(format!("{url:?} is not an rtmp:// or rtmps:// URL").into());
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.contains('@') {
            return Err("RTMP takes credentials in the stream key's query (?user=&pass=), not before the host".into());
        }
        let default_port = if tls { 443 } else { 1935 };
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (h, rest) = v6.split_once(']').ok_or_else(|| format!("{url:?}: an unclosed [IPv6] host"))?;
                (h, rest.strip_prefix(':'))
            }
            None => authority.split_once(':').map_or((authority, None), |(h, p)| (h, Some(p))),
        };
        let port = match port {
            None => default_port,
            Some(p) => p.parse().map_err(|_| format!("{url:?}: a bad port {p:?}"))?,
        };
        if host.is_empty() {
            return Err(format!("{url:?} names no host").into());
        }
        let (segments, query) = path.split_once('?').map_or((path, None), |(p, q)| (p, Some(q)));
        let segments = segments.trim_end_matches('/');
        if segments.is_empty() {
            return Err(format!("{url:?} names no application (rtmp://host/app/key)").into());
        }
        let (app, key) = segments.rsplit_once('/').unwrap_or((segments, ""));
        let stream = match query {
            Some(q) => format!("{key}?{q}"),
            None => key.to_string(),
        };
        Ok(Self { tls, host: host.to_string(), port, app: app.to_string(), stream })
    }

    /// The tcUrl a connect names: the URL up to the app.
    pub fn tc_url(&self) -> String {
        let scheme = if self.tls { "rtmps" } else { "rtmp" };
        format!("{scheme}://{}:{}/{}", self.host, self.port, self.app)
    }

    /// The URL without the stream key's query (which may carry a password): for logs and
    /// the status.
    pub fn shown(&self) -> String {
        let key = self.stream.split_once('?').map_or(self.stream.as_str(), |(k, _)| k);
        let sep = if key.is_empty() { "" } else { "/" };
        format!("{}{sep}{key}", self.tc_url())
    }
}

pub struct Client {
    role: Role,
    phase: Phase,
    url: RtmpUrl,
    /// Handshake bytes received, until S0, S1 and S2 are whole.
    hello: Vec<u8>,
    reader: ChunkReader,
    out: Vec<u8>,
    events: VecDeque<Event>,
    /// The message stream the server gave.
    stream_id: u32,
    /// Bytes received, and at our last acknowledgement; the server's window for them.
    received: u64,
    acked: u64,
    window: u32,
}

impl Client {
    /// A connection to `url` for `role`; C0 and C1 wait in the output. `seed`: any varying
    /// number, for C1's random bytes.
    pub fn new(url: RtmpUrl, role: Role, seed: u64) -> Self {
        let mut out = Vec::with_capacity(1 + HANDSHAKE_LEN);
        out.push(3);
        hello_bytes(&mut out, seed);
        Self {
            role,
            phase: Phase::Hello,
            url,
            hello: Vec::new(),
            reader: ChunkReader::default(),
            out,
            events: VecDeque::new(),
            stream_id: 0,
            received: 0,
            acked: 0,
            window: 0,
        }
    }

    /// Bytes from the server. An error ends the connection.
    pub fn input(&mut self, mut bytes: &[u8]) -> Result<(), RtmpError> {
        self.received += bytes.len() as u64;
        if self.phase == Phase::Hello {
            let n = (1 + 2 * HANDSHAKE_LEN - self.hello.len()).min(bytes.len());
            self.hello.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.hello.first().is_some_and(|v| *v != 3) {
                return Err(RtmpError::Version(self.hello[0]));
            }
            if self.hello.len() < 1 + 2 * HANDSHAKE_LEN {
                return Ok(());
            }
            // C2: S1 echoed. Then our chunk size and window, and connect.
            let s1 = self.hello[1..1 + HANDSHAKE_LEN].to_vec();
            self.out.extend_from_slice(&s1);
            self.hello = Vec::new();
            self.send(CSID_CONTROL, kind::SET_CHUNK_SIZE, 0, &(OUT_CHUNK_SIZE as u32).to_be_bytes());
            self.send(CSID_CONTROL, kind::WINDOW_ACK_SIZE, 0, &WINDOW.to_be_bytes());
            let mut props = vec![
                ("app", Amf::string(&self.url.app)),
                ("type", Amf::string("nonprivate")),
                ("flashVer", Amf::string("FMLE/3.0 (compatible; fanout)")),
                ("tcUrl", Amf::string(&self.url.tc_url())),
            ];
            if self.role == Role::Play {
                props.push(("fpad", Amf::Bool(false)));
                props.push(("audioCodecs", Amf::Number(3575.0)));
                props.push(("videoCodecs", Amf::Number(252.0)));
            }
            self.command(0, &[Amf::string("connect"), Amf::Number(1.0), Amf::object(props)]);
            self.phase = Phase::Connecting;
        }
        self.reader.push(bytes);
        while let Some(m) = self.reader.next_message()? {
            self.message(m)?;
        }
        if self.window > 0 && self.received - self.acked >= u64::from(self.window) {
            self.acked = self.received;
            self.send(CSID_CONTROL, kind::ACK, 0, &(self.received as u32).to_be_bytes());
        }
        Ok(())
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Bytes to send to the server.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Whether the stream started (and not ended).
    pub fn started(&self) -> bool {
        self.phase == Phase::Started
    }

    /// Whether a publisher's media may go as [`media_chunks`] made them (once per tag for
    /// every player and forward): the server gave stream 1, and our chunk size is theirs.
    pub fn takes_shared_media(&self) -> bool {
        self.started() && self.role == Role::Publish && self.stream_id == STREAM_ID
    }

    /// One FLV tag body to publish, at `timestamp` ms (nothing before the stream started).
    pub fn media(&mut self, video: bool, timestamp: u32, body: &[u8]) {
        if !self.started() || self.role != Role::Publish {
            return;
        }
        if self.stream_id == STREAM_ID {
            self.out.extend_from_slice(&media_chunks(video, timestamp, body));
        } else {
            let (csid, k) = if video { (CSID_VIDEO, kind::VIDEO) } else { (CSID_AUDIO, kind::AUDIO) };
            chunk::write_message(&mut self.out, csid, k, self.stream_id, timestamp, body, OUT_CHUNK_SIZE);
        }
    }

    /// The stream's metadata (`@setDataFrame onMetaData`), which some servers want before
    /// media: the FLV codec ids of the decoder configurations to come.
    pub fn metadata(&mut self, video_codec: Option<f64>, audio_codec: Option<f64>) {
        if !self.started() || self.role != Role::Publish {
            return;
        }
        let mut props = Vec::new();
        if let Some(v) = video_codec {
            props.push(("videocodecid", Amf::Number(v)));
        }
        if let Some(a) = audio_codec {
            props.push(("audiocodecid", Amf::Number(a)));
        }
        let body = amf::encode_all(&[
            Amf::string("@setDataFrame"),
            Amf::string("onMetaData"),
            Amf::EcmaArray(props.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
        ]);
        chunk::write_message(&mut self.out, CSID_STREAM, kind::DATA_AMF0, self.stream_id, 0, &body, OUT_CHUNK_SIZE);
    }

    /// Ends a publish politely (FCUnpublish, deleteStream); the caller closes afterwards.
    pub fn close(&mut self) {
        if self.phase == Phase::Started && self.role == Role::Publish {
            let key = Amf::string(self.url.stream.split('?').next().unwrap_or(""));
            self.command(0, &[Amf::string("FCUnpublish"), Amf::Number(6.0), Amf::Null, key]);
            let id = Amf::Number(f64::from(self.stream_id));
            self.command(0, &[Amf::string("deleteStream"), Amf::Number(7.0), Amf::Null, id]);
        }
        self.phase = Phase::Ended;
    }

    fn send(&mut self, csid: u8, kind: u8, stream_id: u32, payload: &[u8]) {
        chunk::write_message(&mut self.out, csid, kind, stream_id, 0, payload, OUT_CHUNK_SIZE);
    }

    fn command(&mut self, stream_id: u32, values: &[Amf]) {
        let csid = if stream_id == 0 { CSID_COMMAND } else { CSID_STREAM };
        self.send(csid, kind::COMMAND_AMF0, stream_id, &amf::encode_all(values));
    }

    fn end(&mut self, why: String) {
        if self.phase != Phase::Ended {
            self.phase = Phase::Ended;
            self.events.push_back(Event::Refused(why));
        }
    }

    fn message(&mut self, m: chunk::Message) -> Result<(), RtmpError> {
        if let Some(c) = control(&mut self.reader, &m)? {
            match c {
                Control::Applied => {}
                Control::Window(w) => self.window = w,
                Control::Pong(pong) => self.send(CSID_CONTROL, kind::USER_CONTROL, 0, &pong),
            }
            return Ok(());
        }
        match m.kind {
            kind::VIDEO | kind::AUDIO if self.phase == Phase::Started && self.role == Role::Play => {
                let (timestamp, body) = (m.timestamp, m.payload);
                self.events.push_back(match m.kind {
                    kind::VIDEO => Event::Video { timestamp, body },
                    _ => Event::Audio { timestamp, body },
                });
            }
            kind::COMMAND_AMF0 => self.on_command(&m.payload)?,
            kind::COMMAND_AMF3 if !m.payload.is_empty() => self.on_command(&m.payload[1..])?,
            _ => {}
        }
        Ok(())
    }

    fn on_command(&mut self, payload: &[u8]) -> Result<(), RtmpError> {
        let v = amf::decode_all(payload)?;
        let name = v.first().and_then(Amf::str).ok_or(RtmpError::Protocol("a command without a name"))?;
        let info = |i: usize| {
            let o = v.get(i);
            let field = |k| o.and_then(|o| o.get(k)).and_then(Amf::str).unwrap_or("");
            (field("level").to_string(), field("code").to_string(), field("description").to_string())
        };
        match (name, self.phase) {
            ("_result", Phase::Connecting) => {
                if self.role == Role::Publish {
                    let key = Amf::string(self.url.stream.split('?').next().unwrap_or(""));
                    self.command(0, &[Amf::string("releaseStream"), Amf::Number(2.0), Amf::Null, key.clone()]);
                    self.command(0, &[Amf::string("FCPublish"), Amf::Number(3.0), Amf::Null, key]);
                }
                self.command(0, &[Amf::string("createStream"), Amf::Number(4.0), Amf::Null]);
                self.phase = Phase::Creating;
            }
            // Answers to releaseStream and FCPublish (either may be an error: some servers
            // have neither) are not waited for.
            ("_result" | "_error", Phase::Creating) if matches!(v.get(1).and_then(Amf::number), Some(2.0 | 3.0)) => {}
            ("_result", Phase::Creating) => {
                let id = v.get(3).and_then(Amf::number).ok_or(RtmpError::Protocol("createStream gave no stream"))?;
                if !(0.0..=f64::from(u32::MAX)).contains(&id) {
                    return Err(RtmpError::Protocol("createStream gave a bad stream id"));
                }
                self.stream_id = id as u32;
                let stream = Amf::string(&self.url.stream);
                match self.role {
                    Role::Publish => {
                        let live = Amf::string("live");
                        self.command(
                            self.stream_id,
                            &[Amf::string("publish"), Amf::Number(5.0), Amf::Null, stream, live],
                        );
                    }
                    Role::Play => {
                        self.command(
                            self.stream_id,
                            &[Amf::string("play"), Amf::Number(5.0), Amf::Null, stream, Amf::Number(-2000.0)],
                        );
                        // SetBufferLength: a short buffer asks for the stream at once.
                        let mut b = vec![0, 3];
                        b.extend_from_slice(&self.stream_id.to_be_bytes());
                        b.extend_from_slice(&1000u32.to_be_bytes());
                        self.send(CSID_CONTROL, kind::USER_CONTROL, 0, &b);
                    }
                }
                self.phase = Phase::Asking;
            }
            ("_error", Phase::Connecting | Phase::Creating) => {
                let (_, code, description) = info(3);
                self.end(format!("{code}: {description}"));
            }
            ("onStatus", _) => {
                let (level, code, description) = info(3);
                let start = match self.role {
                    Role::Publish => code == "NetStream.Publish.Start",
                    Role::Play => code == "NetStream.Play.Start",
                };
                let stop = matches!(
                    code.as_str(),
                    "NetStream.Play.Stop" | "NetStream.Play.UnpublishNotify" | "NetStream.Unpublish.Success"
                );
                if level == "error" || (stop && self.phase == Phase::Started) {
                    self.end(format!("{code}: {description}"));
                } else if start && self.phase == Phase::Asking {
                    self.phase = Phase::Started;
                    self.events.push_back(Event::Started);
                }
            }
            ("close" | "onDisconnect", _) => self.end("the server closed the connection".into()),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtmp::server::{self, Server};
    use proptest::prelude::*;

    /// Runs a client against our own server until neither has anything to say; the server
    /// accepts what it is asked. Returns the client's events and the server's.
    fn converse(client: &mut Client, server: &mut Server, piece: usize) -> (Vec<Event>, Vec<server::Event>) {
        let (mut ce, mut se) = (Vec::new(), Vec::new());
        for _ in 0..64 {
            let to_server = client.take_output();
            let mut moved = !to_server.is_empty();
            for p in to_server.chunks(piece.max(1)) {
                server.input(p).expect("the server takes the client");
            }
            while let Some(e) = server.poll_event() {
                match &e {
                    server::Event::Publish { stream_id, name } => server.accept_publish(*stream_id, name),
                    server::Event::Play { stream_id, name } => server.accept_play(*stream_id, name),
                    _ => {}
                }
                se.push(e);
            }
            let to_client = server.take_output();
            moved |= !to_client.is_empty();
            for p in to_client.chunks(piece.max(1)) {
                client.input(p).expect("the client takes the server");
            }
            while let Some(e) = client.poll_event() {
                ce.push(e);
            }
            if !moved {
                break;
            }
        }
        (ce, se)
    }

    fn url(s: &str) -> RtmpUrl {
        RtmpUrl::parse(s).unwrap()
    }

    #[test]
    fn urls_name_the_app_and_the_key() {
        let u = url("rtmp://a.rtmp.youtube.com/live2/abcd-efgh");
        assert_eq!(
            (u.host.as_str(), u.port, u.app.as_str(), u.stream.as_str()),
            ("a.rtmp.youtube.com", 1935, "live2", "abcd-efgh")
        );
        assert_eq!(u.tc_url(), "rtmp://a.rtmp.youtube.com:1935/live2");
        let u = url("rtmps://h:8443/app/inst/key?user=a&pass=secret");
        assert!(u.tls);
        assert_eq!((u.app.as_str(), u.stream.as_str()), ("app/inst", "key?user=a&pass=secret"));
        assert!(!u.shown().contains("secret"), "{}", u.shown());
        assert_eq!(url("rtmps://h/x").port, 443);
        let u = url("rtmp://[::1]:1936/cam");
        assert_eq!((u.host.as_str(), u.port, u.app.as_str(), u.stream.as_str()), ("::1", 1936, "cam", ""));
        for bad in ["http://h/a/b", "rtmp://h", "rtmp://h/", "rtmp://u:p@h/a/b", "rtmp://h:x/a", "rtmp://:1935/a"] {
            assert!(RtmpUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_publisher_is_started_by_our_server_and_its_media_arrives_as_sent() {
        let mut c = Client::new(url("rtmp://127.0.0.1/live/cam1?user=u&pass=p"), Role::Publish, 7);
        let mut s = Server::new(3);
        let (ce, se) = converse(&mut c, &mut s, 1000);
        assert_eq!(ce, vec![Event::Started]);
        assert!(
            se.contains(&server::Event::Connect { app: "live".into(), tc_url: "rtmp://127.0.0.1:1935/live".into() })
        );
        assert!(se.contains(&server::Event::Publish { stream_id: 1, name: "cam1?user=u&pass=p".into() }), "{se:?}");
        assert!(c.takes_shared_media());
        c.metadata(Some(7.0), Some(10.0));
        let big = vec![0x17; 10_000];
        c.media(true, 40, &big);
        c.media(false, 43, &[0xaf, 1, 2]);
        let (_, se) = converse(&mut c, &mut s, 333);
        assert_eq!(
            se,
            vec![
                server::Event::Video { timestamp: 40, body: big },
                server::Event::Audio { timestamp: 43, body: vec![0xaf, 1, 2] },
            ]
        );
        c.close();
        let (_, se) = converse(&mut c, &mut s, 1000);
        assert_eq!(se, vec![server::Event::Unpublish]);
    }

    #[test]
    fn a_player_is_started_and_gets_the_servers_media() {
        let mut c = Client::new(url("rtmp://127.0.0.1:1936/cam"), Role::Play, 9);
        let mut s = Server::new(4);
        let (ce, se) = converse(&mut c, &mut s, 4096);
        assert_eq!(ce, vec![Event::Started]);
        assert!(se.contains(&server::Event::Play { stream_id: 1, name: String::new() }), "{se:?}");
        s.media(true, 0, &[0x17, 0, 0, 0, 0]);
        s.media(false, 21, &[0xaf, 0, 0x12, 0x10]);
        s.end_play("gone");
        let (ce, _) = converse(&mut c, &mut s, 7);
        assert_eq!(
            ce,
            vec![
                Event::Video { timestamp: 0, body: vec![0x17, 0, 0, 0, 0] },
                Event::Audio { timestamp: 21, body: vec![0xaf, 0, 0x12, 0x10] },
                Event::Refused("NetStream.Play.UnpublishNotify: gone".into()),
            ]
        );
        assert!(!c.started());
    }

    #[test]
    fn a_refusal_is_an_event_with_the_servers_words() {
        let mut c = Client::new(url("rtmp://h/live/x"), Role::Publish, 1);
        let mut s = Server::new(2);
        // Our server refuses instead of accepting.
        for _ in 0..8 {
            s.input(&c.take_output()).unwrap();
            while let Some(e) = s.poll_event() {
                if let server::Event::Publish { stream_id, .. } = e {
                    s.refuse(stream_id, "NetStream.Publish.BadName", "no path x");
                }
            }
            c.input(&s.take_output()).unwrap();
        }
        assert_eq!(c.poll_event(), Some(Event::Refused("NetStream.Publish.BadName: no path x".into())));
        assert_eq!(c.poll_event(), None);
        c.media(true, 0, &[1, 2, 3]);
        assert!(c.take_output().is_empty(), "nothing is sent on a refused stream");
    }

    #[test]
    fn a_server_that_is_not_rtmp_is_told_at_its_first_byte() {
        let mut c = Client::new(url("rtmp://h/a/b"), Role::Play, 1);
        assert!(matches!(c.input(b"HTTP/1.1 400"), Err(RtmpError::Version(b'H'))));
    }

    #[test]
    fn what_is_read_is_acknowledged_within_the_servers_window() {
        let mut c = Client::new(url("rtmp://h/a/b"), Role::Play, 1);
        let mut s = Server::new(2);
        converse(&mut c, &mut s, 4096);
        // The server asked for acks every 2,500,000 bytes.
        for i in 0..700u32 {
            s.media(true, i, &[0x27; 4000]);
        }
        let out = s.take_output();
        c.input(&out).unwrap();
        let acks = c.take_output();
        let mut r = ChunkReader::default();
        r.set_chunk_size(OUT_CHUNK_SIZE as u32).unwrap();
        r.push(&acks);
        let m = r.next_message().unwrap().expect("an acknowledgement");
        assert_eq!(m.kind, kind::ACK);
        assert!(u32::from_be_bytes(m.payload[..4].try_into().unwrap()) >= 2_500_000);
    }

    proptest! {
        /// Any way the server's bytes are cut, the conversation ends the same.
        #[test]
        fn pieces_of_any_size_make_the_same_conversation(piece in 1usize..5000, seed in any::<u64>()) {
            let mut c = Client::new(url("rtmp://h/live/k"), Role::Play, seed);
            let mut s = Server::new(seed);
            let (ce, _) = converse(&mut c, &mut s, piece);
            prop_assert_eq!(ce, vec![Event::Started]);
            s.media(false, 5, &[0xaf, 1]);
            let (ce, _) = converse(&mut c, &mut s, piece);
            prop_assert_eq!(ce, vec![Event::Audio { timestamp: 5, body: vec![0xaf, 1] }]);
        }

        /// Arbitrary bytes after a good handshake never panic the client.
        #[test]
        fn arbitrary_bytes_are_an_error_or_nothing(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            let mut c = Client::new(url("rtmp://h/live/k"), Role::Play, 1);
            let mut hello = vec![3u8];
            hello.resize(1 + 2 * HANDSHAKE_LEN, 0);
            c.input(&hello).unwrap();
            let _ = c.input(&data);
            while c.poll_event().is_some() {}
        }
    }
}
