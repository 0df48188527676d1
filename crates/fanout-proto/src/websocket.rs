//! The server's side of WebSocket (RFC 6455) as a one-way stream needs it: the opening
//! handshake's answer, the header of each binary frame sent, and a reader of what the client
//! sends back (its close and pings; any data is skipped, never buffered). Browsers' FLV
//! players (mpegts.js, flv.js) read `ws://…/{name}.flv` this way.

use base64::Engine as _;
use sha1::Digest as _;

/// Opcodes (RFC 6455 §5.2).
pub mod op {
    pub const CONTINUATION: u8 = 0;
    pub const TEXT: u8 = 1;
    pub const BINARY: u8 = 2;
    pub const CLOSE: u8 = 8;
    pub const PING: u8 = 9;
    pub const PONG: u8 = 10;
}

/// Close codes (RFC 6455 §7.4.1).
pub mod close {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const PROTOCOL_ERROR: u16 = 1002;
}

/// The `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key` (§4.2.2).
pub fn accept(key: &str) -> String {
    let mut h = sha1::Sha1::new();
    h.update(key.trim().as_bytes());
    h.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// The answer to an opening handshake with `key`: `101 Switching Protocols`.
pub fn upgrade_response(key: &str) -> String {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        accept(key)
    )
}

/// Longest frame header: 2 bytes, then a 64-bit length (a server's frames are not masked).
pub const MAX_HEADER: usize = 10;

/// The header of one whole (FIN) unmasked frame of `opcode` carrying `len` bytes, as the
/// server sends it: the payload follows as is.
pub fn frame_header(opcode: u8, len: usize) -> ([u8; MAX_HEADER], usize) {
    let mut h = [0u8; MAX_HEADER];
    h[0] = 0x80 | (opcode & 0x0f);
    let n = match len {
        0..=125 => {
            h[1] = len as u8;
            2
        }
        126..=0xffff => {
            h[1] = 126;
            h[2..4].copy_from_slice(&(len as u16).to_be_bytes());
            4
        }
        _ => {
            h[1] = 127;
            h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
            10
        }
    };
    (h, n)
}

/// A whole close frame with `code` (a server's: unmasked).
pub fn close_frame(code: u16) -> Vec<u8> {
    let (h, n) = frame_header(op::CLOSE, 2);
    [&h[..n], &code.to_be_bytes()].concat()
}

/// A whole pong answering a ping's `payload`.
pub fn pong_frame(payload: &[u8]) -> Vec<u8> {
    let (h, n) = frame_header(op::PONG, payload.len());
    [&h[..n], payload].concat()
}

/// What the client said, frame by frame (data frames are skipped unseen).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// It closes, with its code if it gave one.
    Close(Option<u16>),
    /// A ping to answer with its payload.
    Ping(Vec<u8>),
}

/// What breaks the protocol (§5.1–5.5); the connection is closed with 1002.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("a client's frame must be masked")]
    Unmasked,
    #[error("reserved bits or opcode {0} used without an extension")]
    Reserved(u8),
    #[error("a control frame must be whole and at most 125 bytes")]
    BadControl,
}

/// Reads the client's frames from bytes as they come. It keeps at most one header and one
/// control payload ([`Incoming::MAX_KEPT`] bytes); a data frame's payload is counted off.
#[derive(Debug, Default)]
pub struct Incoming {
    kept: Vec<u8>,
    /// Bytes of a data frame's payload still to skip.
    skip: u64,
    closed: bool,
}

impl Incoming {
    /// The most bytes ever kept between calls: a masked header (14) and 125 of control payload.
    pub const MAX_KEPT: usize = 14 + 125;

    /// Takes `bytes`; the events of every frame they complete. After a close, the rest is
    /// ignored.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<Event>, Error> {
        let mut events = Vec::new();
        while !bytes.is_empty() && !self.closed {
            if self.skip > 0 {
                let n = bytes.len().min(usize::try_from(self.skip).unwrap_or(usize::MAX));
                self.skip -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            // Take only what the frame in hand may need, so nothing beyond it is kept.
            let want = self.needed()?.saturating_sub(self.kept.len()).max(1);
            let n = want.min(bytes.len());
            self.kept.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if let Some(e) = self.frame()? {
                events.push(e);
            }
        }
        Ok(events)
    }

    /// Bytes of `kept` the frame in hand needs before it can be decided: its header, and a
    /// control frame's payload.
    fn needed(&self) -> Result<usize, Error> {
        let Some(h) = self.header()? else { return Ok(self.header_len()) };
        Ok(if h.control { h.at + h.len as usize } else { h.at })
    }

    /// The header's length as far as the bytes kept tell it.
    fn header_len(&self) -> usize {
        match self.kept.get(1).map(|b| b & 0x7f) {
            None => 2,
            Some(126) => 2 + 2 + 4,
            Some(127) => 2 + 8 + 4,
            Some(_) => 2 + 4,
        }
    }

    fn header(&self) -> Result<Option<Header>, Error> {
        let k = &self.kept;
        if k.len() < 2 {
            return Ok(None);
        }
        let (fin, opcode) = (k[0] & 0x80 != 0, k[0] & 0x0f);
        if k[0] & 0x70 != 0 || !matches!(opcode, 0..=2 | 8..=10) {
            return Err(Error::Reserved(opcode));
        }
        if k[1] & 0x80 == 0 {
            return Err(Error::Unmasked);
        }
        let at = self.header_len();
        if k.len() < at {
            return Ok(None);
        }
        let len = match k[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([k[2], k[3]])),
            127 => u64::from_be_bytes(k[2..10].try_into().expect("8 bytes")),
            n => u64::from(n),
        };
        let control = opcode >= op::CLOSE;
        if control && (!fin || len > 125) {
            return Err(Error::BadControl);
        }
        Ok(Some(Header { opcode, len, at, control, mask: k[at - 4..at].try_into().expect("4 bytes") }))
    }

    /// The frame in `kept`, once it is whole enough: a control frame's event, or a data
    /// frame's payload set to be skipped.
    fn frame(&mut self) -> Result<Option<Event>, Error> {
        let Some(h) = self.header()? else { return Ok(None) };
        if !h.control {
            self.skip = h.len;
            self.kept.clear();
            return Ok(None);
        }
        let end = h.at + h.len as usize;
        if self.kept.len() < end {
            return Ok(None);
        }
        let payload: Vec<u8> = self.kept[h.at..end].iter().enumerate().map(|(i, b)| b ^ h.mask[i % 4]).collect();
        self.kept.clear();
        Ok(match h.opcode {
            op::CLOSE => {
                self.closed = true;
                Some(Event::Close(payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]]))))
            }
            op::PING => Some(Event::Ping(payload)),
            _ => None,
        })
    }

    /// Bytes kept now (for the bound's checks).
    pub fn kept(&self) -> usize {
        self.kept.len()
    }
}

struct Header {
    opcode: u8,
    len: u64,
    /// Where the payload starts.
    at: usize,
    control: bool,
    mask: [u8; 4],
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A client's frame: masked with `mask`.
    fn client_frame(fin: bool, opcode: u8, mask: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let (mut h, n) = frame_header(opcode, payload.len());
        if !fin {
            h[0] &= 0x7f;
        }
        h[1] |= 0x80;
        let body = payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]);
        h[..n].iter().copied().chain(mask).chain(body).collect()
    }

    #[test]
    fn the_accept_key_is_rfc_6455s_example() {
        assert_eq!(accept("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(upgrade_response("dGhlIHNhbXBsZSBub25jZQ==")
            .contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
    }

    #[test]
    fn frame_headers_take_the_shortest_length() {
        assert_eq!(frame_header(op::BINARY, 5).0[..2], [0x82, 5]);
        let (h, n) = frame_header(op::BINARY, 300);
        assert_eq!(&h[..n], &[0x82, 126, 1, 44]);
        let (h, n) = frame_header(op::BINARY, 70_000);
        assert_eq!(&h[..n], &[0x82, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]);
        assert_eq!(close_frame(close::NORMAL), [0x88, 2, 0x03, 0xe8]);
    }

    #[test]
    fn reads_pings_and_a_close_and_skips_data() {
        let mut bytes = client_frame(true, op::BINARY, [1, 2, 3, 4], &[7u8; 70_000]);
        bytes.extend(client_frame(true, op::PING, [9, 8, 7, 6], b"hi"));
        bytes.extend(client_frame(true, op::CLOSE, [5, 5, 5, 5], &1001u16.to_be_bytes()));
        bytes.extend(client_frame(true, op::PING, [0; 4], b"after"));
        let mut r = Incoming::default();
        assert_eq!(r.push(&bytes), Ok(vec![Event::Ping(b"hi".to_vec()), Event::Close(Some(1001))]));
    }

    #[test]
    fn refuses_what_breaks_the_protocol() {
        let unmasked = [0x82, 1, 0];
        assert_eq!(Incoming::default().push(&unmasked), Err(Error::Unmasked));
        assert_eq!(Incoming::default().push(&[0xc2, 0x80]), Err(Error::Reserved(2)));
        assert_eq!(Incoming::default().push(&[0x83, 0x80]), Err(Error::Reserved(3)));
        let long_ping = client_frame(true, op::PING, [0; 4], &[0; 126]);
        assert_eq!(Incoming::default().push(&long_ping), Err(Error::BadControl));
        let split_ping = client_frame(false, op::PING, [0; 4], b"x");
        assert_eq!(Incoming::default().push(&split_ping), Err(Error::BadControl));
    }

    proptest! {
        /// However the bytes are cut, the same events come, and no more than a header and
        /// a control payload is ever kept.
        #[test]
        fn cutting_changes_nothing_and_little_is_kept(
            frames in proptest::collection::vec(
                (any::<bool>(), prop_oneof![Just(op::BINARY), Just(op::TEXT), Just(op::PING), Just(op::PONG)],
                 any::<[u8; 4]>(), proptest::collection::vec(any::<u8>(), 0..400)),
                0..8),
            cuts in proptest::collection::vec(1usize..50, 1..20),
        ) {
            let mut bytes = Vec::new();
            for (_, opcode, mask, payload) in &frames {
                let payload = if *opcode >= op::CLOSE { &payload[..payload.len().min(125)] } else { &payload[..] };
                bytes.extend(client_frame(true, *opcode, *mask, payload));
            }
            let whole = Incoming::default().push(&bytes).unwrap();
            let (mut r, mut got, mut at) = (Incoming::default(), Vec::new(), 0);
            for c in cuts.iter().cycle() {
                if at >= bytes.len() {
                    break;
                }
                let end = (at + c).min(bytes.len());
                got.extend(r.push(&bytes[at..end]).unwrap());
                prop_assert!(r.kept() <= Incoming::MAX_KEPT);
                at = end;
            }
            prop_assert_eq!(got, whole);
        }

        #[test]
        fn any_bytes_never_panic_or_grow(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut r = Incoming::default();
            for chunk in bytes.chunks(7) {
                if r.push(chunk).is_err() {
                    break;
                }
                prop_assert!(r.kept() <= Incoming::MAX_KEPT);
            }
        }
    }
}
