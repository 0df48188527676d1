//! Sans-IO protocol logic for `fanout`.
//!
//! Nothing in this crate opens a socket or reads a clock: it is fed bytes (and, where time
//! matters, timestamps) and returns views and decisions. Every parser here has property
//! tests beside it and a fuzz target in `fuzz/`. Its modules, by concern:
//!
//! - [`rtsp`]: RTSP 1.0 messages, the server's and the upstream client's state machines,
//!   and SDP.
//! - [`rtp`]: the RTP view, RTCP, SRTP and MIKEY, receiver statistics, restamping across
//!   sources, per-subscriber layer adaptation, and what a received datagram carries.
//! - [`codec`]: H.264/HEVC byte streams and parameter sets, AAC, scalable layers, decoding
//!   times.
//! - [`rtmp`]: RTMP: AMF0, the chunk stream, a connection's server side, and a publisher's
//!   FLV as RTP tracks.
//! - [`srt`]: what an SRT caller's stream id asks for (mode, path, credentials).
//! - [`whep`]: which of a path's tracks a WebRTC viewer takes, by the negotiated answer.
//! - [`simulcast`]: a WHIP publisher's encodings: their rank, and which one a viewer gets.
//! - [`container`]: MPEG-TS (packets, PCR pacing, demuxer, an encoder's TS as RTP tracks, muxer), MP4 in, FLV tags,
//!   fragmented MP4 and HLS out, playlists of recordings, and the RTP-to-access-unit
//!   repackaging.
//! - [`directory`]: the cluster's directory and where to pull a channel from.
//! - [`freeze`]: a path's last picture held and its audio silent, while its publisher is away.
//! - [`http`]: recognising an HTTP stream request from its head.
//! - [`name`]: the rule for path names, and where a name ends in an HTTP request path.
//! - [`auth`]: external authentication: the question a face asks, an HTTP callback's body,
//!   JWTs checked against a JWKS and the permissions they carry, the cache of answers.
//! - [`secret`]: secrets on the wire: constant-time comparison, session ids, Digest nonces.
//! - [`probe`]: the traffic tools' probe in each packet's payload.

/// Input that does not parse or does not pass a check, with the reason, for a person: a URL,
/// a name, a rule, a description, a file. Each caller maps it to its own answer (a 400, a
/// refused config line, a refused publisher).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl From<String> for Invalid {
    fn from(s: String) -> Self {
        Invalid(s)
    }
}

impl From<&str> for Invalid {
    fn from(s: &str) -> Self {
        Invalid(s.to_string())
    }
}

pub mod auth;
pub mod codec;
pub mod container;
pub mod directory;
pub mod freeze;
pub mod http;
pub mod name;
pub mod probe;
pub mod rtmp;
pub mod rtp;
pub mod rtsp;
pub mod secret;
pub mod simulcast;
pub mod srt;
pub mod users;
pub mod websocket;
pub mod whep;
