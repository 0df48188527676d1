//! RTMP, the protocol OBS, ffmpeg and hardware encoders publish with (Adobe's RTMP 1.0, with
//! Enhanced RTMP's codecs): sans-IO, bytes in and out.
//!
//! - [`amf`]: AMF0 values, the encoding of commands and metadata.
//! - [`chunk`]: the chunk stream: messages cut into chunks and put back together.
//! - [`server`]: one connection's server side: handshake, control messages, the commands of
//!   a publisher, and events for the relay to decide on.
//! - [`client`]: one connection's client side, for pushing a path to another server and
//!   pulling one from it.
//! - [`ingest`]: a publisher's FLV video and audio as RTP tracks with their SDP.

pub mod amf;
pub mod chunk;
pub mod client;
pub mod ingest;
pub mod server;
