//! What the API shows of the RTSP server's clients, SRT links and WebRTC peers: the faces
//! fill it in, the relay and the API pass it on (the faces live above the relay; these
//! types and the `WebRtcFace` trait let the relay hold them without importing them).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// A client as `GET /v1/rtsp` shows it.
#[derive(serde::Serialize)]
pub struct ClientStatus {
    pub session: String,
    pub resource: String,
    pub peer: IpAddr,
    pub rtp_port: Option<u16>,
    /// RTP on its RTSP connection.
    pub interleaved: bool,
    pub playing: bool,
    pub rtcp_reports: u64,
    /// From its last receiver report.
    pub fraction_lost: Option<f64>,
    pub cumulative_lost: Option<i32>,
    pub highest_seq: Option<u32>,
    pub jitter: Option<u32>,
    pub last_report_ms_ago: Option<u64>,
    /// From the report's LSR/DLSR against our sender reports.
    pub rtt_ms: Option<f64>,
    /// Report blocks about an SSRC it is not sent: ignored.
    pub foreign_report_blocks: u64,
    /// Keyframes it asked for (RTCP PLI or FIR), passed to the track's source where it can
    /// take them (an RTSP upstream, a WHIP publisher).
    pub keyframe_requests: u64,
    /// It gets SRTP (RTSPS with keys in the description).
    pub srtp: bool,
    /// Its reports are SRTCP under a key it gave us (`KeyMgmt`): read like plain ones.
    pub srtcp_keyed: bool,
    /// Its SRTCP that failed the check: dropped.
    pub srtcp_dropped: u64,
    /// Its sinks while playing: the track (media section) and the sink id in that track's
    /// session (for `PUT /v1/sessions/{name}/sinks/{id}/layers`).
    pub sinks: Vec<ClientSink>,
}

#[derive(serde::Serialize)]
pub struct ClientSink {
    pub track: usize,
    pub sink: u64,
    /// The relay session the sink is in: the track's, or its SRTP epoch's.
    pub session: String,
    pub packets_sent: Option<u64>,
    /// Who sends to it: `kernel` (the eBPF program) or `user` (the engine's workers).
    pub path: Option<&'static str>,
    /// Its layer adaptation (layered video tracks, once a report or pin started it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<fanout_io::layered::SinkLayerStatus>,
}

/// An SRT connection, publishing or reading, as the API shows it: the SRT side registers
/// it, the API asks its socket for libsrt's counters.
pub struct SrtLink {
    pub path: String,
    /// `publish` or `read`.
    pub mode: &'static str,
    pub peer: Option<std::net::SocketAddr>,
    pub since: std::time::Instant,
    pub socket: std::sync::Arc<fanout_srt::Socket>,
    /// Set when the path's stream ended (or the link was kicked): a reader is then closed,
    /// a publisher stopped.
    pub ended: std::sync::atomic::AtomicBool,
    /// A reader's counts, and why it was ended.
    pub held: crate::readers::Held,
}

impl SrtLink {
    pub fn new(path: &str, mode: &'static str, peer: Option<SocketAddr>, socket: Arc<fanout_srt::Socket>) -> Self {
        SrtLink {
            path: path.to_string(),
            mode,
            peer,
            since: std::time::Instant::now(),
            socket,
            ended: Default::default(),
            held: Default::default(),
        }
    }

    /// The path's stream ended.
    pub fn end(&self) {
        crate::readers::Reader::close(self, "the stream ended: its publisher left");
    }

    /// Why it was ended, if it was.
    pub fn has_ended(&self) -> Option<String> {
        self.held.end.ended()
    }

    pub fn status(&self) -> serde_json::Value {
        let s = self.socket.stats().unwrap_or_default();
        serde_json::json!({
            "mode": self.mode,
            "peer": self.peer,
            "connected_s": self.since.elapsed().as_secs_f64(),
            "packets_received": s.packets_received,
            "packets_sent": s.packets_sent,
            "lost": s.lost,
            "retransmitted": s.retransmitted,
            "dropped": s.dropped,
            "undecrypted": s.undecrypted,
            "rtt_ms": s.rtt_ms,
        })
    }
}

impl crate::readers::Reader for SrtLink {
    fn counters(&self) -> crate::readers::Counters {
        let dropped = self.socket.stats().map_or(0, |s| s.dropped);
        crate::readers::Counters { skips: dropped, ..self.held.counters() }
    }

    fn close(&self, reason: &str) {
        self.held.end.end(reason);
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A viewer as the status shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ViewerStatus {
    /// The address its offer came from, and a digest of the credentials it gave: who may
    /// end it (not shown).
    #[serde(skip)]
    pub offered_by: Option<std::net::IpAddr>,
    #[serde(skip)]
    pub owner: Option<[u8; 32]>,
    pub id: String,
    pub path: String,
    /// `viewer` (WHEP) or `publisher` (WHIP).
    pub role: &'static str,
    /// Where its media goes (or comes from), once its first ICE check came.
    pub peer: Option<SocketAddr>,
    /// `connecting` (ICE, DTLS) or `playing`.
    pub state: &'static str,
    pub since_s: f64,
    /// What it gets: `video H264 (pt 102)`, ...
    pub tracks: Vec<String>,
    /// Tracks of the path it does not get, and why.
    pub left_out: Vec<String>,
    pub packets: u64,
    /// The newest video picture sent: its RTP time and when (Unix ms), by which a player
    /// that knows when it showed that RTP time measures how far behind it plays.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_picture: Option<LastPicture>,
    /// A viewer of layered video: the bandwidth estimate from its congestion feedback
    /// (bits per second), and the layers it gets by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate_bps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<fanout_io::layered::SinkLayerStatus>,
    /// A viewer of a simulcast publisher: the encoding (RID) it gets by its estimate, and
    /// how many times it was switched to another.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switches: Option<u64>,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct LastPicture {
    pub rtp: u32,
    pub unix_ms: f64,
}

/// The WebRTC face (`crate::webrtc`) as the relay and the API see it.
pub trait WebRtcFace: Send + Sync {
    /// Its UDP port for media.
    fn addr(&self) -> SocketAddr;
    /// Its peers, of `path` or of all.
    fn viewers(&self, path: Option<&str>) -> Vec<ViewerStatus>;
    /// Ends the viewers of `path` (its stream ended), and its publishers if `all`.
    fn end_path(&self, path: &str, all: bool);
    /// Itself, for its own module to take back as its type.
    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// A new name (an HLS player's, a WebRTC peer's): 16 random hex digits.
pub fn random_id() -> String {
    let mut b = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_16_hex_digits_and_differ() {
        let (a, b) = (super::random_id(), super::random_id());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
