//! RTMP's chunk stream: messages cut into chunks of at most the sender's chunk size, each with
//! a basic header (format and chunk stream id) and as much of the message header as changed
//! since the chunk stream's last chunk. [`ChunkReader`] reassembles messages from bytes as they
//! arrive, within limits a hostile peer cannot raise; [`write_message`] cuts one message.

use thiserror::Error;

/// Chunk size of both sides until one says otherwise (type 1 message).
pub const DEFAULT_CHUNK_SIZE: usize = 128;
/// The largest message reassembled (a keyframe of a high-rate stream fits many times).
pub const MAX_MESSAGE: usize = 8 << 20;
/// Chunk streams one peer may have open at once.
const MAX_STREAMS: usize = 64;
/// Bytes of unfinished messages one peer may hold across its chunk streams.
const MAX_PENDING: usize = 16 << 20;

/// Message type ids (RTMP 1.0, §5.4 and §7.1).
pub mod kind {
    pub const SET_CHUNK_SIZE: u8 = 1;
    pub const ABORT: u8 = 2;
    pub const ACK: u8 = 3;
    pub const USER_CONTROL: u8 = 4;
    pub const WINDOW_ACK_SIZE: u8 = 5;
    pub const SET_PEER_BANDWIDTH: u8 = 6;
    pub const AUDIO: u8 = 8;
    pub const VIDEO: u8 = 9;
    pub const DATA_AMF3: u8 = 15;
    pub const COMMAND_AMF3: u8 = 17;
    pub const DATA_AMF0: u8 = 18;
    pub const COMMAND_AMF0: u8 = 20;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub csid: u32,
    pub kind: u8,
    pub stream_id: u32,
    /// Milliseconds, as the sender counts them (wraps at 2^32).
    pub timestamp: u32,
    pub payload: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChunkError {
    #[error("a chunk continues a chunk stream ({0}) that never started")]
    NoStart(u32),
    #[error("an RTMP message of {0} bytes (at most {MAX_MESSAGE})")]
    TooLarge(usize),
    #[error("more than {MAX_STREAMS} chunk streams at once")]
    TooManyStreams,
    #[error("more than {MAX_PENDING} bytes of unfinished messages")]
    TooMuchPending,
    #[error("chunk size {0} is out of range (1 to 2^31-1)")]
    BadChunkSize(u32),
}

#[derive(Debug, Default, Clone)]
struct StreamState {
    timestamp: u32,
    delta: u32,
    length: usize,
    kind: u8,
    stream_id: u32,
    /// The last chunk's timestamp field was the extended marker (0xFFFFFF).
    extended: bool,
    partial: Vec<u8>,
    started: bool,
}

/// Reassembles the messages of the peer's chunk stream.
#[derive(Debug)]
pub struct ChunkReader {
    buf: Vec<u8>,
    chunk_size: usize,
    streams: std::collections::HashMap<u32, StreamState>,
}

impl Default for ChunkReader {
    fn default() -> Self {
        Self { buf: Vec::new(), chunk_size: DEFAULT_CHUNK_SIZE, streams: Default::default() }
    }
}

impl ChunkReader {
    /// Bytes received from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The peer's Set Chunk Size (its chunks from now on).
    pub fn set_chunk_size(&mut self, size: u32) -> Result<(), ChunkError> {
        if size == 0 || size > 0x7fff_ffff {
            return Err(ChunkError::BadChunkSize(size));
        }
        self.chunk_size = size as usize;
        Ok(())
    }

    /// The peer's Abort: drops what chunk stream `csid` had of an unfinished message.
    pub fn abort(&mut self, csid: u32) {
        if let Some(s) = self.streams.get_mut(&csid) {
            s.partial.clear();
        }
    }

    /// Bytes received but not yet read into a chunk.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next whole message, if its last chunk has arrived.
    pub fn next_message(&mut self) -> Result<Option<Message>, ChunkError> {
        loop {
            let Some((used, done)) = self.chunk()? else { return Ok(None) };
            self.buf.drain(..used);
            if let Some(m) = done {
                return Ok(Some(m));
            }
        }
    }

    /// Reads one chunk from the buffer if it is all there: the bytes it took, and the message
    /// it completed.
    fn chunk(&mut self) -> Result<Option<(usize, Option<Message>)>, ChunkError> {
        let b = &self.buf;
        let Some(&b0) = b.first() else { return Ok(None) };
        let fmt = b0 >> 6;
        let (csid, mut pos) = match b0 & 0x3f {
            0 if b.len() >= 2 => (64 + u32::from(b[1]), 2),
            1 if b.len() >= 3 => (64 + u32::from(b[1]) + 256 * u32::from(b[2]), 3),
            0 | 1 => return Ok(None),
            c => (u32::from(c), 1),
        };
        let header = [11, 7, 3, 0][fmt as usize];
        if b.len() < pos + header {
            return Ok(None);
        }
        let h = &b[pos..pos + header];
        pos += header;
        let u24 = |x: &[u8]| u32::from_be_bytes([0, x[0], x[1], x[2]]);
        if !self.streams.contains_key(&csid) {
            if fmt != 0 {
                return Err(ChunkError::NoStart(csid));
            }
            if self.streams.len() >= MAX_STREAMS {
                return Err(ChunkError::TooManyStreams);
            }
        }
        let prev = self.streams.get(&csid).cloned().unwrap_or_default();
        let mut s = prev.clone();
        if fmt <= 1 {
            // A new message header: whatever was unfinished on this chunk stream is abandoned.
            s.partial.clear();
        }
        let field = match fmt {
            0 => {
                s.length = u24(&h[3..6]) as usize;
                s.kind = h[6];
                s.stream_id = u32::from_le_bytes([h[7], h[8], h[9], h[10]]);
                Some(u24(&h[0..3]))
            }
            1 => {
                s.length = u24(&h[3..6]) as usize;
                s.kind = h[6];
                Some(u24(&h[0..3]))
            }
            2 => Some(u24(&h[0..3])),
            _ => None,
        };
        s.extended = match field {
            Some(f) => f == 0xff_ffff,
            None => prev.extended,
        };
        let ext = if s.extended {
            if b.len() < pos + 4 {
                return Ok(None);
            }
            let e = u32::from_be_bytes([b[pos], b[pos + 1], b[pos + 2], b[pos + 3]]);
            pos += 4;
            Some(e)
        } else {
            None
        };
        if s.length > MAX_MESSAGE {
            return Err(ChunkError::TooLarge(s.length));
        }
        // A chunk that starts a message sets its time: absolute (format 0), or the last plus
        // a delta (the delta of a type-3 chunk is the last one given; after a type-0 chunk,
        // its timestamp, as §5.3.1.2.4 says).
        let starts = s.partial.is_empty();
        if starts {
            match (fmt, ext.or(field)) {
                (0, Some(t)) => {
                    s.timestamp = t;
                    s.delta = t;
                }
                (1 | 2, Some(d)) => {
                    s.delta = d;
                    s.timestamp = s.timestamp.wrapping_add(d);
                }
                _ if prev.started => s.timestamp = s.timestamp.wrapping_add(s.delta),
                _ => {}
            }
        }
        s.started = true;
        let want = s.length.saturating_sub(s.partial.len()).min(self.chunk_size);
        if b.len() < pos + want {
            return Ok(None);
        }
        let pending: usize =
            self.streams.iter().filter(|(&c, _)| c != csid).map(|(_, s)| s.partial.len()).sum::<usize>();
        if pending + s.partial.len() + want > MAX_PENDING {
            return Err(ChunkError::TooMuchPending);
        }
        s.partial.extend_from_slice(&b[pos..pos + want]);
        pos += want;
        let done = (s.partial.len() == s.length).then(|| Message {
            csid,
            kind: s.kind,
            stream_id: s.stream_id,
            timestamp: s.timestamp,
            payload: std::mem::take(&mut s.partial),
        });
        self.streams.insert(csid, s);
        Ok(Some((pos, done)))
    }
}

/// Appends `payload` as one message on chunk stream `csid` (2 to 63), cut at `chunk_size`:
/// a type-0 chunk, then type-3 ones.
pub fn write_message(
    out: &mut Vec<u8>,
    csid: u8,
    kind: u8,
    stream_id: u32,
    timestamp: u32,
    payload: &[u8],
    chunk_size: usize,
) {
    debug_assert!((2..64).contains(&csid));
    let ext = timestamp >= 0xff_ffff;
    let field = if ext { 0xff_ffff } else { timestamp };
    out.push(csid);
    out.extend_from_slice(&field.to_be_bytes()[1..]);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.extend_from_slice(&stream_id.to_le_bytes());
    for (i, c) in payload.chunks(chunk_size.max(1)).enumerate() {
        if i > 0 {
            out.push(0xc0 | csid);
        }
        if ext {
            out.extend_from_slice(&timestamp.to_be_bytes());
        }
        out.extend_from_slice(c);
    }
    if payload.is_empty() && ext {
        out.extend_from_slice(&timestamp.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read_all(r: &mut ChunkReader) -> Vec<Message> {
        let mut v = Vec::new();
        while let Some(m) = r.next_message().unwrap() {
            v.push(m);
        }
        v
    }

    #[test]
    fn messages_cut_into_chunks_come_back_whole_byte_by_byte() {
        let mut wire = Vec::new();
        let big: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        write_message(&mut wire, 6, kind::VIDEO, 1, 40, &big, 128);
        write_message(&mut wire, 4, kind::AUDIO, 1, 0x0100_0000, b"aac", 128);
        let mut r = ChunkReader::default();
        let mut got = Vec::new();
        for b in &wire {
            r.push(std::slice::from_ref(b));
            got.extend(read_all(&mut r));
        }
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].csid, got[0].kind, got[0].stream_id, got[0].timestamp), (6, kind::VIDEO, 1, 40));
        assert_eq!(got[0].payload, big);
        assert_eq!((got[1].timestamp, got[1].payload.as_slice()), (0x0100_0000, &b"aac"[..]), "extended time");
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn deltas_of_type_1_2_and_3_chunks_add_up() {
        // csid 4: type 0 at t=100 (3 bytes), type 2 delta 20, then a type 3 (same delta again).
        let mut wire = vec![0x04, 0, 0, 100, 0, 0, 3, 8, 1, 0, 0, 0, b'a', b'b', b'c'];
        wire.extend_from_slice(&[0x84, 0, 0, 20, b'd', b'e', b'f']);
        wire.extend_from_slice(&[0xc4, b'g', b'h', b'i']);
        // Type 1: new length and type, delta 5.
        wire.extend_from_slice(&[0x44, 0, 0, 5, 0, 0, 1, 9, b'j']);
        let mut r = ChunkReader::default();
        r.push(&wire);
        let t: Vec<(u32, u8)> = read_all(&mut r).iter().map(|m| (m.timestamp, m.kind)).collect();
        assert_eq!(t, [(100, 8), (120, 8), (140, 8), (145, 9)]);
    }

    #[test]
    fn a_bigger_chunk_size_and_a_two_byte_chunk_stream_id() {
        let mut r = ChunkReader::default();
        r.set_chunk_size(4096).unwrap();
        let payload = vec![7u8; 3000];
        let mut wire = vec![0x00, 200 - 64]; // fmt 0, csid 200 in the 2-byte form
        wire.extend_from_slice(&[0, 0, 1, 0, 0x0b, 0xb8, 9, 1, 0, 0, 0]);
        wire.extend_from_slice(&payload);
        r.push(&wire);
        let m = r.next_message().unwrap().unwrap();
        assert_eq!((m.csid, m.payload.len()), (200, 3000));
        assert_eq!(r.set_chunk_size(0), Err(ChunkError::BadChunkSize(0)));
    }

    #[test]
    fn a_peer_cannot_make_the_reader_hold_without_bound() {
        let mut r = ChunkReader::default();
        r.push(&[0xc5, 1, 2, 3]);
        assert_eq!(r.next_message(), Err(ChunkError::NoStart(5)));
        let mut r = ChunkReader::default();
        r.push(&[0x04, 0, 0, 0, 0xff, 0xff, 0xff, 9, 1, 0, 0, 0]);
        assert_eq!(r.next_message(), Err(ChunkError::TooLarge(0xff_ffff)));
        // 65 chunk streams, each starting a message it never finishes.
        let mut r = ChunkReader::default();
        for c in 0..65u8 {
            r.push(&[0x00, c, 0, 0, 0, 0, 1, 0, 9, 1, 0, 0, 0]);
            r.push(&[0u8; 128]);
        }
        assert_eq!(r.next_message(), Err(ChunkError::TooManyStreams));
    }

    proptest! {
        #[test]
        fn written_messages_read_back_at_any_chunk_size_and_split(
            msgs in proptest::collection::vec((2u8..64, 1u8..21, any::<u32>(), proptest::collection::vec(any::<u8>(), 0..600)), 1..8),
            chunk in 1usize..700,
            cut in 1usize..50,
        ) {
            let mut wire = Vec::new();
            // A stream's messages in order: one chunk stream per message, so deltas don't apply.
            let mut seen = std::collections::HashSet::new();
            let msgs: Vec<_> = msgs.into_iter().filter(|m| seen.insert(m.0)).collect();
            for (csid, kind, ts, p) in &msgs {
                write_message(&mut wire, *csid, *kind, 1, *ts, p, chunk);
            }
            let mut r = ChunkReader::default();
            r.set_chunk_size(chunk as u32).unwrap();
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                r.push(piece);
                got.extend(read_all(&mut r));
            }
            prop_assert_eq!(got.len(), msgs.len());
            for (m, (csid, kind, ts, p)) in got.iter().zip(&msgs) {
                prop_assert_eq!((m.csid, m.kind, m.timestamp), (u32::from(*csid), *kind, *ts));
                prop_assert_eq!(&m.payload, p);
            }
        }

        #[test]
        fn any_bytes_read_or_fail_without_panic(b in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut r = ChunkReader::default();
            r.push(&b);
            while let Ok(Some(_)) = r.next_message() {}
        }
    }
}
