//! The fanout relay as a library: what `fanout serve` runs (config, control API, RTSP and
//! RTSPS, RTMP and SRT, WebRTC playback, HTTP streams and their repackaging, TLS and SRTP, the cluster, metrics). The
//! `fanout` binary (crate `fanout`) puts it beside the control client and the tools.

mod admit;
mod api;
mod auth;
mod clients;
mod cluster;
mod config;
mod dial;
mod ending;
mod error;
mod forward;
mod handover;
mod hook;
mod http;
mod logline;
mod path;
mod playback;
mod publish;
mod readers;
mod record;
mod relay;
mod reload;
mod repack;
mod rtmp;
mod rtsp;
pub mod serve;
mod source;
pub mod spec;
mod srt;
mod srtp_out;
mod state;
mod tls;
mod track;
mod transcode;
mod tunnel;
mod ui;
mod upgrade;
mod upstream;
mod watch;
mod webrtc;
mod workers;
mod write;
