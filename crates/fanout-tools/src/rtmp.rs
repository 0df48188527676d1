//! An RTMP publisher, as an encoder is one: `fanout gen --rtmp URL --file F` publishes a
//! recording (MPEG-TS or MP4) looped at its own pace, H.264 in FLV's AVC tags or H.265 in
//! Enhanced RTMP's `hvc1` ones (which ffmpeg 5.1 cannot send), with its AAC; `bench ingest`
//! publishes synthetic pictures through the same client, and `fanout sub --read` plays
//! through it (many players in one process, for `bench peers`).

use anyhow::{bail, Context};
use fanout_proto::codec::{aac, annexb};
use fanout_proto::container::tsdemux;
use fanout_proto::rtmp::amf::{self, Amf};
use fanout_proto::rtmp::chunk::{kind, write_message, ChunkReader};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, Instant};

/// Our chunk size, told to the relay before any media: a picture goes in one chunk or few.
const CHUNK: usize = 1 << 16;

/// A publishing or playing RTMP connection.
pub struct Client {
    tcp: TcpStream,
    out: Vec<u8>,
    /// What the server sent, past the messages read (its chunk size kept).
    reader: ChunkReader,
}

/// A media message a player got.
#[derive(Debug, Clone)]
pub struct Played {
    pub video: bool,
    /// Its timestamp, ms.
    pub ms: u32,
    pub body: Vec<u8>,
}

impl Played {
    /// A video keyframe (FLV's frame type 1), not its decoder configuration.
    pub fn key(&self) -> bool {
        self.video && self.body.first().is_some_and(|b| b >> 4 == 1) && self.body.get(1) != Some(&0)
    }
}

impl Client {
    /// Connects to `addr` under `app` and publishes `name`, until the relay says it started.
    pub fn publish(addr: SocketAddr, app: &str, name: &str) -> anyhow::Result<Self> {
        let publish = [Amf::string("publish"), Amf::Number(3.0), Amf::Null, Amf::string(name), Amf::string("live")];
        Self::open(addr, app, &publish, "NetStream.Publish.Start")
    }

    /// The handshake, `connect`, `createStream`, then `command` on the stream, until the
    /// server answers `started`.
    fn open(addr: SocketAddr, app: &str, command_on_stream: &[Amf], started: &str) -> anyhow::Result<Self> {
        let mut tcp = TcpStream::connect(addr).with_context(|| format!("RTMP {addr}"))?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        let _ = tcp.set_nodelay(true);
        let mut hello = vec![3u8];
        hello.resize(1 + 1536, 0);
        tcp.write_all(&hello)?;
        tcp.read_exact(&mut vec![0u8; 1 + 2 * 1536]).context("the RTMP handshake")?;
        let mut out = vec![0u8; 1536]; // C2
        let command = |out: &mut Vec<u8>, stream: u32, v: &[Amf]| {
            write_message(out, 3, kind::COMMAND_AMF0, stream, 0, &amf::encode_all(v), 128)
        };
        let tc_url = format!("rtmp://{addr}/{app}");
        let obj = Amf::object([
            ("app", Amf::string(app)),
            ("type", Amf::string("nonprivate")),
            ("tcUrl", Amf::string(&tc_url)),
        ]);
        command(&mut out, 0, &[Amf::string("connect"), Amf::Number(1.0), obj]);
        command(&mut out, 0, &[Amf::string("createStream"), Amf::Number(2.0), Amf::Null]);
        command(&mut out, 1, command_on_stream);
        write_message(&mut out, 2, kind::SET_CHUNK_SIZE, 0, 0, &(CHUNK as u32).to_be_bytes(), 128);
        tcp.write_all(&out)?;
        let mut r = ChunkReader::default();
        let mut buf = [0u8; 4096];
        loop {
            let n = tcp.read(&mut buf).context("waiting for the server to start the stream")?;
            if n == 0 {
                bail!("the server closed the RTMP connection before the stream started");
            }
            r.push(&buf[..n]);
            while let Some(m) = r.next_message()? {
                if m.kind == kind::SET_CHUNK_SIZE && m.payload.len() >= 4 {
                    r.set_chunk_size(u32::from_be_bytes([m.payload[0], m.payload[1], m.payload[2], m.payload[3]]))?;
                }
                if m.kind != kind::COMMAND_AMF0 {
                    continue;
                }
                let v = amf::decode_all(&m.payload)?;
                let info = v.get(3);
                let code = info.and_then(|i| i.get("code")).and_then(Amf::str).unwrap_or_default();
                if code == started {
                    return Ok(Self { tcp, out: Vec::new(), reader: r });
                }
                if code.ends_with("Failed")
                    || code.ends_with("Unauthorized")
                    || code.ends_with("BadName")
                    || code.ends_with("NotFound")
                {
                    let why = info.and_then(|i| i.get("description")).and_then(Amf::str).unwrap_or_default();
                    bail!("the server refused: {code}: {why}");
                }
            }
        }
    }

    /// Connects to `addr` under `app` and plays `name`, until the server says it started;
    /// then [`Client::read_all`] takes what it sends.
    pub fn play(addr: SocketAddr, app: &str, name: &str) -> anyhow::Result<Self> {
        Self::open(
            addr,
            app,
            &[Amf::string("play"), Amf::Number(3.0), Amf::Null, Amf::string(name)],
            "NetStream.Play.Start",
        )
    }

    /// Reads (and drops) what the server sends until `until`, acknowledging as RTMP asks
    /// (every window of bytes); the bytes read.
    pub fn read_all(&mut self, until: Instant) -> anyhow::Result<u64> {
        let mut buf = vec![0u8; 64 << 10];
        let (mut total, mut acked) = (0u64, 0u64);
        self.tcp.set_read_timeout(Some(Duration::from_millis(200)))?;
        while Instant::now() < until {
            match self.tcp.read(&mut buf) {
                Ok(0) => bail!("the server closed the RTMP connection"),
                Ok(n) => total += n as u64,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
            if let Some(ack) = ack_due(total, &mut acked) {
                self.tcp.write_all(&ack)?;
            }
        }
        Ok(total)
    }

    /// The media tags the server sends until `until` (or `max` of them), in order,
    /// acknowledging as [`Client::read_all`] does.
    pub fn read_tags(&mut self, until: Instant, max: usize) -> anyhow::Result<Vec<Played>> {
        let mut buf = vec![0u8; 64 << 10];
        let (mut tags, mut total, mut acked) = (Vec::new(), 0u64, 0u64);
        self.tcp.set_read_timeout(Some(Duration::from_millis(200)))?;
        while Instant::now() < until && tags.len() < max {
            while let Some(m) = self.reader.next_message()? {
                match m.kind {
                    kind::SET_CHUNK_SIZE if m.payload.len() >= 4 => self
                        .reader
                        .set_chunk_size(u32::from_be_bytes([m.payload[0], m.payload[1], m.payload[2], m.payload[3]]))?,
                    kind::VIDEO | kind::AUDIO => {
                        tags.push(Played { video: m.kind == kind::VIDEO, ms: m.timestamp, body: m.payload })
                    }
                    _ => {}
                }
            }
            match self.tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    self.reader.push(&buf[..n]);
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
            if let Some(ack) = ack_due(total, &mut acked) {
                self.tcp.write_all(&ack)?;
            }
        }
        Ok(tags)
    }

    /// The connection and what was read of it past the messages taken, for a reader of many
    /// players at once (`sub --read`'s).
    pub fn into_parts(self) -> (TcpStream, ChunkReader) {
        (self.tcp, self.reader)
    }

    /// This end's address (as the relay lists the reader).
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp.local_addr().expect("a connected socket")
    }

    /// Caps the kernel's receive buffer (and so the window the server may fill): a player
    /// that stops reading is seen as one sooner.
    pub fn shrink_receive_buffer(&self, bytes: usize) -> anyhow::Result<()> {
        socket2::SockRef::from(&self.tcp).set_recv_buffer_size(bytes)?;
        Ok(())
    }

    /// Sends one video (`video`) or audio tag body at `ts` ms.
    pub fn send(&mut self, video: bool, ts: u32, body: &[u8]) -> anyhow::Result<()> {
        self.out.clear();
        let (csid, k) = if video { (6, kind::VIDEO) } else { (4, kind::AUDIO) };
        write_message(&mut self.out, csid, k, 1, ts, body, CHUNK);
        self.tcp.write_all(&self.out)?;
        Ok(())
    }
}

/// The acknowledgement a player owes for `total` bytes read, once half the usual 2.5 MB
/// window came since `acked` (moved on): servers that wait for acknowledgements never do.
pub(crate) fn ack_due(total: u64, acked: &mut u64) -> Option<Vec<u8>> {
    (total - *acked >= 1_250_000).then(|| {
        *acked = total;
        let mut out = Vec::new();
        write_message(&mut out, 2, kind::ACK, 0, 0, &(total as u32).to_be_bytes(), 128);
        out
    })
}

/// `rtmp://host[:port]/app/name` (or `/name`: the app is the name too).
pub fn parse_url(url: &str) -> anyhow::Result<(SocketAddr, String, String)> {
    let rest = url.strip_prefix("rtmp://").with_context(|| format!("{url:?}: not an rtmp:// URL"))?;
    let (host, path) = rest.split_once('/').with_context(|| format!("{url:?}: no path (rtmp://host/app/name)"))?;
    let host = if host.contains(':') { host.to_string() } else { format!("{host}:1935") };
    let addr = host.to_socket_addrs()?.next().with_context(|| format!("{host}: no address"))?;
    let (app, name) = match path.split_once('/') {
        Some((app, name)) => (app, name),
        None => (path, path),
    };
    Ok((addr, app.to_string(), name.to_string()))
}

/// One FLV tag: whether video, its decoding time in ms, and its body.
type Tag = (bool, u64, Vec<u8>);

/// The recording's decoder configurations, its frames in decoding order, and one lap's
/// length in ms.
fn tags(file: &Path) -> anyhow::Result<(Vec<Tag>, Vec<Tag>, u64)> {
    let bytes = std::fs::read(file).with_context(|| format!("{}", file.display()))?;
    let ts = match bytes.get(4..8) {
        Some(b"ftyp") => {
            fanout_proto::container::mp4ts::remux(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?
        }
        _ => bytes,
    };
    let mut d = tsdemux::Demux::default();
    let mut pes: Vec<_> = ts.chunks(fanout_proto::container::mpegts::PACKET_LEN).filter_map(|p| d.push(p)).collect();
    pes.extend(d.flush());
    let origin = pes.iter().filter_map(|p| p.dts.or(p.pts)).min().unwrap_or(0);
    let ms = |t: u64| t.saturating_sub(origin) / 90;
    let (mut config, mut frames): (Vec<Tag>, Vec<Tag>) = (Vec::new(), Vec::new());
    let (mut video_config, mut audio_config) = (false, false);
    for p in &pes {
        let (Some(pts), dts) = (p.pts, p.dts.or(p.pts).unwrap_or(0)) else { continue };
        let codec = match p.stream_type {
            tsdemux::STREAM_TYPE_H264 => Some(annexb::Codec::H264),
            tsdemux::STREAM_TYPE_H265 => Some(annexb::Codec::H265),
            _ => None,
        };
        if let Some(codec) = codec {
            let nals: Vec<&[u8]> = annexb::nal_units(&p.data).filter(|n| !n.is_empty()).collect();
            let kind = |n: &[u8]| match codec {
                annexb::Codec::H264 => n[0] & 0x1f,
                annexb::Codec::H265 => (n[0] >> 1) & 0x3f,
            };
            let key = nals.iter().any(|n| match codec {
                annexb::Codec::H264 => kind(n) == 5,
                annexb::Codec::H265 => (16..=21).contains(&kind(n)),
            });
            if !video_config {
                let want: &[u8] = if codec == annexb::Codec::H264 { &[7, 8] } else { &[32, 33, 34] };
                let sets: Option<Vec<&[u8]>> =
                    want.iter().map(|t| nals.iter().find(|n| kind(n) == *t).copied()).collect();
                if let Some(sets) = sets {
                    config.push((true, ms(dts), fanout_proto::container::flv::video_config(codec, &sets)));
                    video_config = true;
                }
            }
            let cts = (pts as i64 - dts as i64) / 90;
            let mut body = match codec {
                annexb::Codec::H264 => vec![if key { 0x17 } else { 0x27 }, 1],
                // Enhanced RTMP: IsExHeader, the frame type, packet type 1 (coded frames).
                annexb::Codec::H265 => {
                    let mut b = vec![0x80 | if key { 0x10 } else { 0x20 } | 1];
                    b.extend_from_slice(b"hvc1");
                    b
                }
            };
            body.extend_from_slice(&(cts as i32).to_be_bytes()[1..]);
            for n in nals.iter().filter(|n| codec != annexb::Codec::H264 || kind(n) != 9) {
                body.extend_from_slice(&(n.len() as u32).to_be_bytes());
                body.extend_from_slice(n);
            }
            frames.push((true, ms(dts), body));
        } else if p.stream_type == 0x0f {
            for (k, f) in aac::adts_frames(&p.data).into_iter().enumerate() {
                let Some(rate) = f.sample_rate() else { continue };
                if !audio_config {
                    let mut body = vec![0xaf, 0];
                    body.extend_from_slice(&f.audio_specific_config());
                    config.push((false, ms(pts), body));
                    audio_config = true;
                }
                let mut body = vec![0xaf, 1];
                body.extend_from_slice(f.au);
                frames.push((false, ms(pts) + k as u64 * 1024 * 1000 / u64::from(rate), body));
            }
        }
    }
    if frames.is_empty() {
        bail!("{}: no H.264, H.265 or AAC found", file.display());
    }
    frames.sort_by_key(|t| t.1);
    // A lap: the last decoding time and one frame more (25 fps if nothing says otherwise).
    let lap = frames.last().map_or(0, |t| t.1) + 40;
    Ok((config, frames, lap))
}

/// Publishes `file` to `url`, looped, for `seconds`.
pub fn run(url: &str, file: &Path, seconds: f64) -> anyhow::Result<()> {
    let (configs, frames, lap) = tags(file)?;
    let (addr, app, name) = parse_url(url)?;
    let mut c = Client::publish(addr, &app, &name)?;
    let (start, until) = (Instant::now(), Duration::from_secs_f64(seconds));
    for (video, _, body) in &configs {
        c.send(*video, 0, body)?;
    }
    let mut sent = 0u64;
    'laps: for lap_n in 0u64.. {
        for (video, ms, body) in &frames {
            let at = lap_n * lap + ms;
            if Duration::from_millis(at) >= until {
                break 'laps;
            }
            if let Some(wait) = (start + Duration::from_millis(at)).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            c.send(*video, at as u32, body)?;
            sent += 1;
        }
    }
    eprintln!("gen: {sent} RTMP tags to {url} in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_app_and_the_path() {
        assert_eq!(parse_url("rtmp://127.0.0.1:1935/live/cam").unwrap().1, "live");
        assert_eq!(parse_url("rtmp://127.0.0.1:1935/live/cam").unwrap().2, "cam");
        assert_eq!(parse_url("rtmp://127.0.0.1/cam").unwrap().0.port(), 1935);
        assert_eq!(parse_url("rtmp://127.0.0.1/cam").unwrap().2, "cam");
        assert!(parse_url("http://h/x").is_err() && parse_url("rtmp://h").is_err());
    }
}
