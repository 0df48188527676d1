//! Sans-IO protocol logic for `fanout`.
//!
//! Nothing in this crate opens a socket or reads a clock: it is fed bytes (and, where time
//! matters, timestamps) and returns views and decisions. Every parser here has property
//! tests beside it and a fuzz target in `fuzz/`.
//!
//! - [`rtp`]: a validated, borrowed view of an RTP packet (RFC 3550 §5.1) and the payload
//!   range a relay strips down to when it delivers RTP-carried MPEG-TS over HTTP.
//! - [`mpegts`]: MPEG-TS packet headers and PCRs (ISO/IEC 13818-1 §2.4.3), and the schedule
//!   that paces a recorded transport stream at its own rate.
//! - [`adapt`]: per-subscriber layer adaptation: layer rates, the selector, sequence
//!   numbers without deliberate drops.
//! - [`aac`]: ADTS frames and the MPEG4-GENERIC (RFC 3640) RTP payload.
//! - [`annexb`]: H.264/HEVC byte streams: NAL units, access units, RTP packetization.
//! - [`layers`]: the scalable layer (H.264, SVC, HEVC) of an RTP packet, for layer dropping.
//! - [`http`]: recognising an HTTP stream request from its head.
//! - [`rtcp`]: RTCP sender/receiver reports: loss, jitter, round-trip time.
//! - [`rtsp`]: RTSP 1.0 messages: the incremental connection parser (requests, responses,
//!   interleaved frames), the writer, `Transport` and `Session` headers.
//! - [`rtsp_server`]: the proxy's RTSP server as a state machine (requests in, responses
//!   and data-path actions out), with session timeouts.
//! - [`rtsp_client`]: the proxy's RTSP client to an upstream as a state machine
//!   (OPTIONS/DESCRIBE/SETUP/PLAY, credentials, keep-alive, TEARDOWN).
//! - [`restamp`]: one continuous RTP stream (SSRC, sequence, timestamps) across upstream
//!   reconnects.
//! - [`secret`]: comparing secrets in constant time.
//! - [`sdp`]: session descriptions: an upstream's parsed, the proxy's own written.
//! - [`tsdemux`]: elementary streams (with PTS/DTS) out of an MPEG-TS.
//! - [`mp4ts`]: an MP4 recording (H.264/H.265, AAC) remuxed into MPEG-TS.
//! - [`playlist`]: recordings one after the other as one MPEG-TS (a directory as a source).
//! - [`classify`]: what a received datagram carries, decided once when it enters the ring.

pub mod aac;
pub mod adapt;
pub mod annexb;
pub mod classify;
pub mod directory;
pub mod dts;
pub mod fmp4;
pub mod hevc;
pub mod hls;
pub mod http;
pub mod layers;
pub mod mikey;
pub mod mp4ts;
pub mod mpegts;
pub mod playlist;
pub mod probe;
pub mod repack;
pub mod restamp;
pub mod rtcp;
pub mod rtp;
pub mod rtpstats;
pub mod rtsp;
pub mod rtsp_client;
pub mod rtsp_server;
pub mod sdp;
pub mod secret;
pub mod srtp;
pub mod tsdemux;
pub mod tsmux;
