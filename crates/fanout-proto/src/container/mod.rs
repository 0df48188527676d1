//! Containers: MPEG-TS in and out, MP4 in, fragmented MP4 and HLS out, and the
//! repackaging of RTP tracks into access units that feeds them.
//!
//! - [`mpegts`]: packet headers, PCRs, and the schedule that paces a recording at its rate.
//! - [`tsdemux`]: elementary streams (with PTS/DTS) out of an MPEG-TS.
//! - [`tsingest`]: an encoder's MPEG-TS (SRT's payload) as RTP tracks.
//! - [`tsmux`]: access units of H.264, HEVC and AAC into MPEG-TS.
//! - [`mp4ts`]: an MP4 recording remuxed into MPEG-TS.
//! - [`flv`]: FLV audio and video tag bodies (as RTMP carries them, Enhanced RTMP too).
//! - [`playlist`]: recordings one after the other as one MPEG-TS.
//! - [`repack`]: RTP H.264/HEVC/AAC tracks to access units on one timeline.
//! - [`fmp4`]: fragmented MP4 initialization and media segments.
//! - [`hls`]: HLS (and Low-Latency HLS) segments, parts and playlists.
//! - [`hlsin`]: another server's HLS read as a source.
//! - [`record`]: recording into fragmented MP4 files, and reading them back for playback.

pub mod flv;
pub mod fmp4;
pub mod hls;
pub mod hlsin;
pub mod mp4ts;
pub mod mpegts;
pub mod playlist;
pub mod record;
pub mod recordts;
pub mod repack;
pub mod tsdemux;
pub mod tsingest;
pub mod tsmux;
