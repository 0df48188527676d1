//! Packet buffers: one received datagram (or TCP chunk), stored once in the session ring and
//! shared by refcount with every sink that sends it (OMSS payload sharing: the page with a
//! user count). Buffers come back to the source's pool when the ring replaces them and no
//! sink holds them any more, so steady-state relaying allocates nothing.

use fanout_proto::codec::annexb::Codec;
use fanout_proto::codec::layers::PacketLayer;
use std::sync::Arc;

#[derive(Debug)]
pub struct Packet {
    buf: Box<[u8]>,
    len: usize,
    /// Where the media payload starts (after an RTP header), for HTTP subscribers.
    payload_off: usize,
    /// Starts an MPEG-TS video keyframe: a good first packet for a new sink.
    keyframe: bool,
    /// A piece of a unit after its first (see [`crate::Inlet::hold_unit`]): a stream sink
    /// that wrote the unit's start takes it with it, so a lap never cuts the unit.
    continues: bool,
    /// Its scalable layer (RTP video of a known codec), for per-sink layer dropping.
    layer: PacketLayer,
    /// An aggregation packet (STAP-A, AP) of this codec: a capped sink may get it rebuilt
    /// without the NAL units above its cap.
    aggregate: Option<Codec>,
}

impl Packet {
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            buf: vec![0; cap].into_boxed_slice(),
            len: 0,
            payload_off: 0,
            keyframe: false,
            continues: false,
            layer: PacketLayer::NotLayered,
            aggregate: None,
        }
    }
    /// The whole datagram as received.
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    /// The media payload (the datagram without its RTP header, if it had one).
    pub fn payload(&self) -> &[u8] {
        &self.buf[self.payload_off..self.len]
    }
    /// The media payload, to rewrite in place (its length stays).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.payload_off..self.len]
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
    /// Sets the datagram's length and payload offset, and notes whether its payload starts
    /// an MPEG-TS video keyframe.
    pub fn set_len(&mut self, len: usize, payload_off: usize) {
        self.len = len.min(self.buf.len());
        self.payload_off = payload_off.min(self.len);
        self.layer = PacketLayer::NotLayered;
        self.aggregate = None;
        self.continues = false;
        let payload = &self.buf[self.payload_off..self.len];
        self.keyframe = payload.first() == Some(&fanout_proto::container::mpegts::SYNC_BYTE)
            && fanout_proto::container::mpegts::starts_video_keyframe(payload);
    }

    pub fn is_keyframe(&self) -> bool {
        self.keyframe
    }

    /// Whether `next`, the packet right after this one, belongs to this one's video access
    /// unit (RTP, same source and timestamp, no marker bit here, not MPEG-TS): a keyframe
    /// marked at `next` (its parameter sets) then starts here (at its delimiter, say).
    pub fn same_access_unit(&self, next: &Packet) -> bool {
        let (a, b) = (self.data(), next.data());
        self.is_rtp()
            && next.is_rtp()
            && next.payload().first() != Some(&fanout_proto::container::mpegts::SYNC_BYTE)
            && a[1] & 0x80 == 0
            && a[4..12] == b[4..12]
    }

    /// Whether an access unit may end here: an RTP packet with the marker bit, or anything
    /// that is not RTP (no pictures to keep whole).
    pub fn ends_access_unit(&self) -> bool {
        !self.is_rtp() || self.data()[1] & 0x80 != 0
    }

    /// Marks it as a good first packet for a new sink (RTP video, judged by the session).
    pub fn mark_keyframe(&mut self) {
        self.keyframe = true;
    }

    /// Marks it as a good first packet for a new sink, or not (a unit's start, judged by
    /// whoever cut the units).
    pub fn set_keyframe(&mut self, key: bool) {
        self.keyframe = key;
    }

    /// Whether it is a piece of a unit after the unit's first.
    pub fn continues(&self) -> bool {
        self.continues
    }

    /// Marks it as a piece of a unit after the unit's first.
    pub fn set_continues(&mut self) {
        self.continues = true;
    }

    pub fn layer(&self) -> PacketLayer {
        self.layer
    }

    /// Records its layer (judged by the session, which knows the codec).
    pub fn set_layer(&mut self, layer: PacketLayer) {
        self.layer = layer;
    }

    pub fn aggregate(&self) -> Option<Codec> {
        self.aggregate
    }

    /// Notes that it is an aggregation packet of `codec`.
    pub fn set_aggregate(&mut self, codec: Codec) {
        self.aggregate = Some(codec);
    }

    /// The same RTP header (without padding) over another payload: an aggregate rebuilt for
    /// one sink.
    pub fn with_payload(&self, payload: &[u8]) -> Packet {
        let off = self.payload_off;
        let mut q = Packet::with_capacity(off + payload.len());
        q.buf[..off].copy_from_slice(&self.buf[..off]);
        q.buf[0] &= !0x20; // no padding follows the new payload
        q.buf[off..].copy_from_slice(payload);
        q.len = off + payload.len();
        q.payload_off = off;
        q.layer = self.layer;
        q
    }

    /// Whether it has an RTP header (whose sequence number a sink may rewrite).
    pub fn is_rtp(&self) -> bool {
        self.payload_off >= 12
    }

    /// Changes the length only (what the bytes are stays judged as it was): for a transform
    /// that rewrites a packet in place, such as encryption adding its tag.
    pub fn set_len_only(&mut self, len: usize) {
        self.len = len.min(self.buf.len());
        self.payload_off = self.payload_off.min(self.len);
    }

    /// Sets the length of a stream chunk (TCP): no packet boundaries, so no keyframe marks.
    pub fn set_chunk_len(&mut self, len: usize) {
        self.len = len.min(self.buf.len());
        self.payload_off = 0;
        self.keyframe = false;
        self.layer = PacketLayer::NotLayered;
    }
}

/// Buffers owned by one source, each uniquely held (so it can be written).
#[derive(Debug)]
pub struct PacketPool {
    free: Vec<Arc<Packet>>,
    buf_size: usize,
    /// Buffers allocated because every pooled one was still held by a slow sink.
    pub allocated: u64,
}

impl PacketPool {
    pub fn new(buf_size: usize, prealloc: usize) -> Self {
        Self {
            free: (0..prealloc).map(|_| Arc::new(Packet::with_capacity(buf_size))).collect(),
            buf_size,
            allocated: prealloc as u64,
        }
    }

    /// A uniquely held buffer.
    pub fn take(&mut self) -> Arc<Packet> {
        self.free.pop().unwrap_or_else(|| {
            self.allocated += 1;
            Arc::new(Packet::with_capacity(self.buf_size))
        })
    }

    /// Returns a buffer; it is kept only if nobody else holds it any more.
    pub fn give(&mut self, mut p: Arc<Packet>) {
        if Arc::get_mut(&mut p).is_some() && self.free.len() < 4096 {
            self.free.push(p);
        }
    }
}
