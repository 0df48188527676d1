//! Sources: where a session's packets come from.

use crate::engine::{Job, WorkerCtx};
use crate::model::{SessionConfig, SourceState};
use crate::packet::{Packet, PacketPool};
use crate::sys;
use fanout_proto::container::mpegts::{Restamper, TsSchedule, PCR_HZ};
use parking_lot::Mutex;
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, ErrorKind, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What a source needs of its session: where its packets go and what it reports. The session
/// implements it, so that this module (below the session) does not import it.
pub(crate) trait Feed: Send + Sync {
    fn cfg(&self) -> &SessionConfig;
    fn is_closed(&self) -> bool;
    /// The engine sheds the session's class now (overload): what arrives is dropped.
    fn is_shed(&self) -> bool;
    fn count_oversized(&self);
    fn count_shed(&self, n: u64);
    /// Judges a received datagram of `len` bytes (RTP or not, keyframe, layer) and rewrites
    /// it as the session's ingest says; whether it goes into the ring.
    fn accept(&self, p: &mut Packet, len: usize) -> bool;
    /// Hands received packets to the session's ring (the vector is emptied; buffers the
    /// ring lets go of return to `pool`).
    fn publish(&self, packets: &mut Vec<Arc<Packet>>, pool: &mut PacketPool);
    fn source_closed(&self, state: SourceState, error: Option<String>);
    /// Marks a video packet that starts a keyframe (an in-process track source's).
    fn mark_video_start(&self, p: &mut Packet);
}

/// Datagrams taken per `recvmmsg`.
const BATCH: usize = 32;
/// Receive calls per task run before other ready tasks get a turn (a work limiter).
const CALLS_PER_RUN: usize = 8;

/// Binds a UDP source socket: unicast, or a multicast group joined on `iface` (IPv4) or the
/// default interface.
pub fn bind_udp_source(addr: SocketAddr, iface: Option<Ipv4Addr>) -> io::Result<UdpSocket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // Only a multicast group may be shared with other receivers: a unicast port bound twice
    // would split the stream between two sessions.
    sock.set_reuse_address(addr.ip().is_multicast())?;
    // Room for bursts while the workers are busy; the force variant needs CAP_NET_ADMIN.
    let size: libc::c_int = 8 << 20;
    if sys::set_int_option(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, size).is_err() {
        let _ = sock.set_recv_buffer_size(size as usize);
    }
    if addr.ip().is_multicast() {
        sock.bind(&addr.into())?;
        match addr.ip() {
            IpAddr::V4(g) => sock.join_multicast_v4(&g, &iface.unwrap_or(Ipv4Addr::UNSPECIFIED))?,
            IpAddr::V6(g) => sock.join_multicast_v6(&g, 0)?,
        }
    } else {
        sock.bind(&addr.into())?;
    }
    Ok(sock.into())
}

pub(crate) enum SourceIo {
    Udp(UdpSocket),
    Tcp(TcpStream),
}

impl SourceIo {
    pub fn fd(&self) -> RawFd {
        match self {
            SourceIo::Udp(s) => s.as_raw_fd(),
            SourceIo::Tcp(s) => s.as_raw_fd(),
        }
    }
    pub fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            SourceIo::Udp(s) => s.set_nonblocking(true),
            SourceIo::Tcp(s) => s.set_nonblocking(true),
        }
    }
}

struct Scratch {
    pool: PacketPool,
    taken: Vec<Arc<Packet>>,
    ready: Vec<Arc<Packet>>,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    got: Vec<sys::Received>,
    /// The `uring` path's multishot receive (UDP sources).
    uring: Option<crate::uring::UringReceiver>,
    /// The session's class was shed at the last run.
    was_shed: bool,
}

// SAFETY: the raw pointers in the iovec/mmsghdr scratch are rebuilt before every call and
// only used by the worker that holds the mutex.
unsafe impl Send for Scratch {}

/// Engine source task: drains the socket in batches into pool buffers and publishes them.
pub(crate) struct SourceJob {
    session: Weak<dyn Feed>,
    io: SourceIo,
    scratch: Mutex<Scratch>,
}

impl SourceJob {
    pub fn new(session: Weak<dyn Feed>, io: SourceIo) -> Self {
        let (buf, ring) = session.upgrade().map_or((2048, 1024), |s| (s.cfg().max_datagram, s.cfg().ring_capacity));
        let want_uring = session.upgrade().is_some_and(|s| s.cfg().source_recv == crate::SourceRecv::Uring);
        let uring = match &io {
            SourceIo::Udp(sock) if want_uring => {
                match crate::uring::UringReceiver::new(sock.as_raw_fd(), 256, buf + 1) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::warn!("io_uring receive unavailable, using recvmmsg: {e}");
                        None
                    }
                }
            }
            _ => None,
        };
        Self {
            session,
            io,
            scratch: Mutex::new(Scratch {
                pool: PacketPool::new(buf, ring + 2 * BATCH),
                taken: Vec::with_capacity(BATCH),
                ready: Vec::with_capacity(BATCH),
                iov: Vec::with_capacity(BATCH),
                hdrs: Vec::with_capacity(BATCH),
                got: Vec::with_capacity(BATCH),
                uring,
                was_shed: false,
            }),
        }
    }
}

impl SourceJob {
    /// The descriptor whose readiness means "run me": the socket, or the io_uring.
    pub fn watch_fd(&self) -> RawFd {
        self.scratch.lock().uring.as_ref().map_or(self.io.fd(), |u| u.fd())
    }

    pub fn uses_uring(&self) -> bool {
        self.scratch.lock().uring.is_some()
    }
}

impl Job for SourceJob {
    fn run(&self, _ctx: &mut WorkerCtx) -> bool {
        let Some(s) = self.session.upgrade() else { return false };
        if s.is_closed() {
            return false;
        }
        let mut guard = self.scratch.lock();
        let sc = &mut *guard;
        // A class served again after shedding first drops what queued in the socket while
        // it was shed: a live relay drops stale media rather than sending it seconds late.
        let shed = s.is_shed();
        let drain = std::mem::replace(&mut sc.was_shed, shed)
            && !shed
            && sc.uring.is_none()
            && matches!(self.io, SourceIo::Udp(_));
        let mut calls = 0;
        while calls < CALLS_PER_RUN || drain {
            calls += 1;
            match &self.io {
                SourceIo::Udp(_) if sc.uring.is_some() => {
                    let Scratch { pool, ready, uring, .. } = sc;
                    let u = uring.as_mut().expect("checked");
                    let r = u.recv(BATCH, |data, truncated| {
                        if truncated {
                            s.count_oversized();
                            return;
                        }
                        let mut p = pool.take();
                        let pm = Arc::get_mut(&mut p).expect("pool buffers are unique");
                        pm.buf_mut()[..data.len()].copy_from_slice(data);
                        if s.accept(pm, data.len()) {
                            ready.push(p);
                        } else {
                            pool.give(p);
                        }
                    });
                    s.publish(ready, pool);
                    match r {
                        Ok(n) if n < BATCH => return false,
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(session = %s.cfg().name, "io_uring receive failed: {e}");
                            return false;
                        }
                    }
                }
                SourceIo::Udp(sock) => {
                    while sc.taken.len() < BATCH {
                        let p = sc.pool.take();
                        sc.taken.push(p);
                    }
                    let r = {
                        // Invariant: the pool hands out uniquely held buffers.
                        let mut bufs: [&mut [u8]; BATCH] = std::array::from_fn(|_| <&mut [u8]>::default());
                        for (b, p) in bufs.iter_mut().zip(sc.taken.iter_mut()) {
                            *b = Arc::get_mut(p).expect("pool buffers are unique").buf_mut();
                        }
                        sys::recv_datagrams(sock.as_raw_fd(), &mut bufs, &mut sc.iov, &mut sc.hdrs, &mut sc.got)
                    };
                    let n = match r {
                        Ok(n) => n,
                        Err(e) => {
                            tracing::warn!(session = %s.cfg().name, "receive failed: {e}");
                            return false;
                        }
                    };
                    if drain {
                        // The buffers stay taken for the next call.
                        s.count_shed(n as u64);
                        if n < BATCH {
                            return false;
                        }
                        continue;
                    }
                    // Keep the datagrams we got (in order); the untouched buffers stay taken
                    // for the next call (drained in place: no allocation per batch).
                    for (mut p, got) in sc.taken.drain(..n).zip(sc.got.iter()) {
                        let pm = Arc::get_mut(&mut p).expect("pool buffers are unique");
                        if got.truncated {
                            s.count_oversized();
                            sc.pool.give(p);
                        } else if s.accept(pm, got.len) {
                            sc.ready.push(p);
                        } else {
                            sc.pool.give(p);
                        }
                    }
                    s.publish(&mut sc.ready, &mut sc.pool);
                    if n < BATCH {
                        return false;
                    }
                }
                SourceIo::Tcp(stream) => {
                    let mut p = sc.pool.take();
                    let pm = Arc::get_mut(&mut p).expect("pool buffers are unique");
                    match (&*stream).read(pm.buf_mut()) {
                        Ok(0) => {
                            s.source_closed(SourceState::Closed, None);
                            return false;
                        }
                        Ok(n) => {
                            pm.set_chunk_len(n);
                            sc.ready.push(p);
                            s.publish(&mut sc.ready, &mut sc.pool);
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            sc.pool.give(p);
                            return false;
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => sc.pool.give(p),
                        Err(e) => {
                            s.source_closed(SourceState::Closed, Some(format!("publisher connection: {e}")));
                            return false;
                        }
                    }
                }
            }
        }
        // The work limit was reached with data still waiting: run again after the others.
        true
    }
}

/// The `daemon` baseline's receive thread: one blocking receive per packet.
pub(crate) fn daemon_receiver(session: Weak<dyn Feed>, io: SourceIo) {
    let (buf, ring) = match session.upgrade() {
        Some(s) => (s.cfg().max_datagram, s.cfg().ring_capacity),
        None => return,
    };
    let mut pool = PacketPool::new(buf, ring + 4);
    let mut ready = Vec::with_capacity(1);
    // Blocking reads with a timeout (so a closed session is noticed): a socket handed over
    // from the async runtime arrives non-blocking, which would turn this loop into a spin.
    let timeout = Some(Duration::from_millis(100));
    let _ = match &io {
        SourceIo::Udp(s) => s.set_nonblocking(false).and_then(|()| s.set_read_timeout(timeout)),
        SourceIo::Tcp(s) => s.set_nonblocking(false).and_then(|()| s.set_read_timeout(timeout)),
    };
    loop {
        let Some(s) = session.upgrade() else { return };
        if s.is_closed() {
            return;
        }
        let mut p = pool.take();
        let pm = Arc::get_mut(&mut p).expect("pool buffers are unique");
        let r = match &io {
            SourceIo::Udp(sock) => {
                // MSG_TRUNC makes recv return the real length, so oversize is visible.
                let b = pm.buf_mut();
                // SAFETY: b is a valid writable buffer for the call.
                let n = unsafe { libc::recv(sock.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_TRUNC) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else if n as usize > b.len() {
                    s.count_oversized();
                    Err(io::Error::from(ErrorKind::Interrupted))
                } else {
                    Ok(n as usize)
                }
            }
            SourceIo::Tcp(stream) => match (&*stream).read(pm.buf_mut()) {
                Ok(0) => {
                    s.source_closed(SourceState::Closed, None);
                    return;
                }
                r => r,
            },
        };
        match r {
            Ok(n) => {
                let keep = match &io {
                    SourceIo::Udp(_) => s.accept(pm, n),
                    SourceIo::Tcp(_) => {
                        pm.set_chunk_len(n);
                        true
                    }
                };
                if keep {
                    ready.push(p);
                    s.publish(&mut ready, &mut pool);
                } else {
                    pool.give(p);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                pool.give(p)
            }
            Err(e) => {
                s.source_closed(SourceState::Failed, Some(format!("receive failed: {e}")));
                return;
            }
        }
    }
}

/// A recorded MPEG-TS clip and the schedule that plays it at its own rate: the built-in
/// demo, or a `file` source.
#[derive(Clone)]
pub struct DemoClip {
    ts: Arc<[u8]>,
    schedule: Arc<TsSchedule>,
    /// Played once, not looped.
    pub(crate) once: bool,
}

impl DemoClip {
    pub fn new(ts: impl Into<Arc<[u8]>>) -> Result<Self, fanout_proto::container::mpegts::TsError> {
        let mut ts = ts.into();
        let mut schedule = TsSchedule::new(&ts)?;
        if let Some(span) = fanout_proto::container::tsdemux::media_span_90k(&ts) {
            schedule.fit_to_media(span);
        }
        // What runs past one lap (the audio's last frame) would repeat the next lap's first
        // timestamp: it goes, so the loop is seamless on every face.
        if let Some(trimmed) = fanout_proto::container::mpegts::trimmed_to_lap(&ts, schedule.loop_ticks() / 300) {
            ts = trimmed.into();
        }
        let schedule = Arc::new(schedule);
        Ok(Self { ts, schedule, once: false })
    }

    /// Plays it once: the source ends (state `closed`) after its last datagram.
    pub fn once(mut self) -> Self {
        self.once = true;
        self
    }

    /// Its bytes and the schedule that plays them (for a player of the relay's own).
    pub fn parts(&self) -> (Arc<[u8]>, Arc<TsSchedule>) {
        (self.ts.clone(), self.schedule.clone())
    }

    /// One lap, in seconds.
    pub fn duration_s(&self) -> f64 {
        self.schedule.loop_ticks() as f64 / 27e6
    }
    pub fn bitrate(&self) -> f64 {
        self.schedule.bitrate()
    }
}

/// One RTP track of the demo clip for RTSP clients, prepared once: every packet's payload
/// with its due time, RTP timestamp and marker. Video is the clip's H.264 per RFC 6184 or
/// H.265 per RFC 7798 (single NAL units and fragments, at most 1400 bytes), audio its AAC
/// per RFC 3640 (AAC-hbr).
#[derive(Clone)]
pub struct DemoTrack {
    /// The SDP media section, without a control attribute.
    pub media: String,
    pub clock: u32,
    /// The video's codec (`None`: the audio track).
    pub codec: Option<fanout_proto::codec::annexb::Codec>,
    pt: u8,
    packets: Arc<Vec<DemoPacket>>,
    /// One lap of the clip, 90 kHz (its PCR span), so laps continue each other's time.
    lap_90k: u64,
    once: bool,
}

/// (due, 90 kHz after the clip's start; RTP timestamp, in the track's clock; payload; marker)
type DemoPacket = (u64, u64, Vec<u8>, bool);

/// AAC frames per RTP packet of the demo at most (three are about 64 ms): a third of the
/// packets.
const AAC_PER_PACKET: usize = 3;

/// RTP payload types of the demo's RTSP tracks.
pub const DEMO_VIDEO_PAYLOAD_TYPE: u8 = 96;
pub const DEMO_AAC_PAYLOAD_TYPE: u8 = 97;

impl DemoClip {
    /// The clip's H.264 or H.265 and its AAC as RTP tracks (what the clip has of them), and
    /// the media time (90 kHz) their due times count from.
    pub fn rtp_tracks(&self) -> (Vec<DemoTrack>, u64) {
        use annexb::Codec;
        use fanout_proto::{codec::aac, codec::annexb, container::tsdemux};
        let mut d = tsdemux::Demux::default();
        let mut pes: Vec<_> =
            self.ts.chunks(fanout_proto::container::mpegts::PACKET_LEN).filter_map(|p| d.push(p)).collect();
        pes.extend(d.flush());
        let lap_90k = self.schedule.loop_ticks() / 300;
        let codec_of = |stream_type| match stream_type {
            tsdemux::STREAM_TYPE_H264 => Some(Codec::H264),
            tsdemux::STREAM_TYPE_H265 => Some(Codec::H265),
            _ => None,
        };
        // The first video stream's codec; its PES.
        let codec = pes.iter().find_map(|p| codec_of(p.stream_type));
        let video: Vec<_> =
            pes.iter().filter(|p| codec.is_some() && codec_of(p.stream_type) == codec && p.pts.is_some()).collect();
        let audio: Vec<_> = pes.iter().filter(|p| p.stream_type == 0x0f && p.pts.is_some()).collect();
        // Audio and video share one origin, so they stay in sync.
        let origin = video
            .iter()
            .map(|p| p.dts.or(p.pts).unwrap_or(0))
            .chain(audio.iter().map(|p| p.pts.unwrap_or(0)))
            .min()
            .unwrap_or(0);
        let mut tracks = Vec::new();
        let nal_type = |n: &[u8]| match codec {
            Some(Codec::H265) => n.first().map(|b| (b >> 1) & 0x3f),
            _ => n.first().map(|b| b & 0x1f),
        };
        let nal = |t: u8| video.iter().flat_map(|p| annexb::nal_units(&p.data)).find(|n| nal_type(n) == Some(t));
        // The parameter sets, which the description carries: SPS and PPS; H.265's VPS first.
        let sets: Option<Vec<&[u8]>> = match codec {
            Some(Codec::H264) => [7, 8].into_iter().map(nal).collect(),
            Some(Codec::H265) => [32, 33, 34].into_iter().map(nal).collect(),
            None => None,
        };
        if let (Some(codec), Some(sets)) = (codec, sets) {
            let mut packets = Vec::new();
            let mut scratch = Vec::new();
            for p in &video {
                let (due, pts) = (p.dts.or(p.pts).unwrap_or(0) - origin, p.pts.unwrap_or(0));
                let nals: Vec<&[u8]> = annexb::nal_units(&p.data).filter(|n| !n.is_empty()).collect();
                annexb::packetize_frame(codec, &nals, 1400, &mut scratch, |payload, end| {
                    packets.push((due, pts, payload.to_vec(), end));
                });
            }
            let pt = DEMO_VIDEO_PAYLOAD_TYPE;
            let (name, fmtp) = match codec {
                Codec::H264 => ("H264", fanout_proto::rtsp::sdp::h264_fmtp(sets[0], sets[1])),
                Codec::H265 => ("H265", fanout_proto::rtsp::sdp::h265_fmtp(sets[0], sets[1], sets[2])),
            };
            let media = format!("m=video 0 RTP/AVP {pt}\r\na=rtpmap:{pt} {name}/90000\r\na=fmtp:{pt} {fmtp}\r\n");
            tracks.push(DemoTrack {
                media,
                clock: 90_000,
                codec: Some(codec),
                pt,
                packets: Arc::new(packets),
                lap_90k,
                once: self.once,
            });
        }
        let first = audio.iter().find_map(|p| aac::adts_frames(&p.data).first().copied());
        if let Some(rate) = first.and_then(|f| f.sample_rate()) {
            let first = first.expect("checked");
            // Up to AAC_PER_PACKET frames of a PES in one packet, due at the first: the clip
            // is all there, so sending the next frames early costs no wait.
            let mut packets = Vec::new();
            for p in &audio {
                let pts = p.pts.unwrap_or(0);
                let aus: Vec<&[u8]> = aac::adts_frames(&p.data).iter().map(|f| f.au).collect();
                let mut k = 0;
                while k < aus.len() {
                    let n = aac::frames_per_packet(&aus[k..], AAC_PER_PACKET, 1400);
                    // AAC frames hold 1024 samples each.
                    let offset = k as u64 * 1024;
                    let due = pts - origin + offset * 90_000 / u64::from(rate);
                    let ts = pts * u64::from(rate) / 90_000 + offset;
                    if let Some(payload) = aac::rtp_payload_of(&aus[k..k + n]) {
                        packets.push((due, ts, payload, true));
                    }
                    k += n;
                }
            }
            let (pt, ch) = (DEMO_AAC_PAYLOAD_TYPE, first.channels);
            let media = format!(
                "m=audio 0 RTP/AVP {pt}\r\na=rtpmap:{pt} MPEG4-GENERIC/{rate}/{ch}\r\na=fmtp:{pt} {}\r\n",
                aac::fmtp(first.audio_specific_config())
            );
            tracks.push(DemoTrack {
                media,
                clock: rate,
                codec: None,
                pt,
                packets: Arc::new(packets),
                lap_90k,
                once: self.once,
            });
        }
        (tracks, origin)
    }
}

impl DemoTrack {
    /// Its packets of one lap, as RTP (payload type, `seq` counting from 0, the given SSRC),
    /// with when each is due (90 kHz from the clip's start): for benches and tests that want
    /// the demo's RTP without its pacing.
    pub fn rtp_packets(&self, ssrc: u32) -> Vec<(u64, Vec<u8>)> {
        self.packets
            .iter()
            .enumerate()
            .map(|(n, (due, ts, payload, marker))| {
                let mut p = vec![0u8; 12 + payload.len()];
                let h = fanout_proto::rtp::write_header(&mut p, *marker, self.pt, n as u16, *ts as u32, ssrc);
                p[h..].copy_from_slice(payload);
                (*due, p)
            })
            .collect()
    }

    /// One lap, 90 kHz.
    pub fn lap_90k(&self) -> u64 {
        self.lap_90k
    }
}

/// A demo RTSP track's thread: publishes each packet when it is due (`start` is shared by
/// the clip's tracks, so they stay in sync), lap after lap.
pub(crate) fn demo_track_source(session: Weak<dyn Feed>, track: DemoTrack, start: Instant) {
    let mut pool = PacketPool::new(1500, 256);
    let mut ready = Vec::with_capacity(64);
    let n_packets = track.packets.len() as u64;
    if n_packets == 0 {
        return;
    }
    // The video keeps the demo's SSRC ("FANO"); the audio is the next one.
    let ssrc = if track.codec.is_some() { DEMO_SSRC } else { DEMO_SSRC + 1 };
    let mut seq: u16 = 0;
    for n in 0u64.. {
        let lap = n / n_packets;
        if track.once && lap == 1 {
            if let Some(s) = session.upgrade() {
                s.publish(&mut ready, &mut pool);
                s.source_closed(SourceState::Closed, None);
            }
            return;
        }
        let (due, ts, ref payload, marker) = track.packets[(n % n_packets) as usize];
        let due = Duration::from_micros((due + lap * track.lap_90k) * 100 / 9);
        // Publish what is ready once the next packet is not due yet; sleep in steps of at
        // most 100 ms, so a closed session is noticed.
        loop {
            let Some(s) = session.upgrade() else { return };
            if s.is_closed() {
                return;
            }
            let wait = due.saturating_sub(start.elapsed());
            if wait.is_zero() {
                break;
            }
            s.publish(&mut ready, &mut pool);
            drop(s);
            std::thread::sleep(wait.min(Duration::from_millis(100)));
        }
        let Some(s) = session.upgrade() else { return };
        let ts = (ts + lap * track.lap_90k * u64::from(track.clock) / 90_000) as u32;
        let mut p = pool.take();
        let pm = Arc::get_mut(&mut p).expect("pool buffers are unique");
        let h = fanout_proto::rtp::write_header(pm.buf_mut(), marker, track.pt, seq, ts, ssrc);
        pm.buf_mut()[h..h + payload.len()].copy_from_slice(payload);
        pm.set_len(h + payload.len(), h);
        s.mark_video_start(pm);
        seq = seq.wrapping_add(1);
        ready.push(p);
        if ready.len() == ready.capacity() {
            s.publish(&mut ready, &mut pool);
        }
    }
}

/// The demo source thread: publishes each 1316-byte datagram of the looped clip when due.
/// RTP payload type of MPEG-TS (RFC 3551 static type 33) and the demo's fixed SSRC.
pub const DEMO_PAYLOAD_TYPE: u8 = 33;
pub const DEMO_SSRC: u32 = 0x4641_4e4f; // "FANO"

pub(crate) fn demo_source(session: Weak<dyn Feed>, clip: DemoClip) {
    let buf = session.upgrade().map_or(2048, |s| s.cfg().max_datagram.max(1316 + 12));
    let mut pool = PacketPool::new(buf, 64);
    let mut ready = Vec::with_capacity(8);
    // Each lap's PCR/PTS/DTS continue from the last one's, and continuity counters run on.
    let mut restamper = Restamper::default();
    let per_lap = clip.schedule.len() as u64;
    let start = Instant::now();
    let mut n: u64 = 0;
    loop {
        let Some(s) = session.upgrade() else { return };
        if s.is_closed() {
            return;
        }
        // Publish everything due, then sleep until the next datagram (at most 100 ms, so a
        // closed session is noticed).
        let now = start.elapsed();
        loop {
            let (off, len, due_pcr) = clip.schedule.datagram(n);
            let due = Duration::from_nanos(due_pcr * 1000 / (PCR_HZ / 1_000_000));
            if due > now {
                break;
            }
            if n.is_multiple_of(per_lap) {
                if clip.once && n > 0 {
                    s.publish(&mut ready, &mut pool);
                    s.source_closed(SourceState::Closed, None);
                    return;
                }
                restamper.set_offset((n / per_lap) * clip.schedule.loop_ticks() / 300);
            }
            let mut p = pool.take();
            let pm = Arc::get_mut(&mut p).expect("pool buffers are unique");
            // RTP/MP2T (RFC 2250): UDP and RTSP clients get RTP, HTTP ones the bare TS.
            let ts90 = (due_pcr / 300) as u32;
            let h = fanout_proto::rtp::write_header(pm.buf_mut(), false, DEMO_PAYLOAD_TYPE, n as u16, ts90, DEMO_SSRC);
            pm.buf_mut()[h..h + len].copy_from_slice(&clip.ts[off..off + len]);
            restamper.restamp(&mut pm.buf_mut()[h..h + len]);
            pm.set_len(h + len, h);
            ready.push(p);
            n += 1;
            if ready.len() == ready.capacity() {
                s.publish(&mut ready, &mut pool);
            }
        }
        s.publish(&mut ready, &mut pool);
        let (_, _, next) = clip.schedule.datagram(n);
        let next = Duration::from_nanos(next * 1000 / (PCR_HZ / 1_000_000));
        drop(s);
        std::thread::sleep(next.saturating_sub(start.elapsed()).min(Duration::from_millis(100)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 35: the demo's RTSP face sends fewer, fuller packets: a picture's delimiter
    /// and two small slices share one (STAP-A), three AAC frames share one (RFC 3640): about
    /// the rate of its TS face's datagrams, where one packet per unit sent 133 a second.
    #[test]
    fn the_demos_rtsp_face_sends_about_one_packet_a_picture() {
        let clip = DemoClip::new(crate::DEMO_TS).unwrap();
        let (tracks, _) = clip.rtp_tracks();
        let secs = tracks[0].lap_90k as f64 / 90_000.0;
        let (video, audio) = (tracks[0].packets.len() as f64 / secs, tracks[1].packets.len() as f64 / secs);
        let ts = clip.schedule.len() as f64 / secs;
        eprintln!("demo per second: RTP video {video:.1}, audio {audio:.1}; TS datagrams {ts:.1}");
        assert!(video < 30.0, "{video} video packets a second at 25 pictures a second");
        assert!(audio < 20.0, "{audio} audio packets a second at 47 frames a second");
        assert!(video + audio < 1.5 * ts, "RTP {} a second, TS {ts}", video + audio);
    }

    /// Issue 30 item 10: the demo looped five times has strictly rising timestamps on every
    /// face: its RTSP tracks (audio each packet, video each picture), and the TS that HTTP
    /// and UDP get (each stream's PES, as a player's demuxer reads them).
    #[test]
    fn the_demo_loops_with_rising_timestamps() {
        let clip = DemoClip::new(crate::DEMO_TS).unwrap();
        let (tracks, _) = clip.rtp_tracks();
        assert_eq!(tracks.len(), 2);
        for t in &tracks {
            let laps = (0..5u64)
                .flat_map(|lap| t.packets.iter().map(move |p| p.1 + lap * t.lap_90k * u64::from(t.clock) / 90_000));
            let ts: Vec<u64> = laps.collect();
            let (kind, rising) = match t.codec {
                None => ("audio", ts.windows(2).all(|w| w[0] < w[1])),
                // A picture's packets share its time; pictures are in decoding order, so
                // only the laps' seams are checked here: the next lap starts after the last.
                Some(_) => ("video", (1..5).all(|k| ts[k * t.packets.len()] > ts[k * t.packets.len() - 1])),
            };
            assert!(rising, "{kind}: a timestamp did not rise across laps");
        }
        // The TS: five laps through the restamper, demuxed.
        let mut restamper = fanout_proto::container::mpegts::Restamper::default();
        let per_lap = clip.schedule.len() as u64;
        let mut demux = fanout_proto::container::tsdemux::Demux::default();
        let mut pes = Vec::new();
        for n in 0..5 * per_lap {
            if n.is_multiple_of(per_lap) {
                restamper.set_offset((n / per_lap) * clip.schedule.loop_ticks() / 300);
            }
            let (off, len, _) = clip.schedule.datagram(n);
            let mut d = clip.ts[off..off + len].to_vec();
            restamper.restamp(&mut d);
            pes.extend(d.chunks(fanout_proto::container::mpegts::PACKET_LEN).filter_map(|p| demux.push(p)));
        }
        // Each ADTS frame's time (a PES holds several: 1024 samples at 48 kHz apart).
        let audio: Vec<u64> = pes
            .iter()
            .filter(|p| p.stream_type == 0x0f)
            .flat_map(|p| {
                let n = fanout_proto::codec::aac::adts_frames(&p.data).len() as u64;
                (0..n).map(move |k| p.pts.unwrap_or(0) + k * 1920)
            })
            .collect();
        let video: Vec<u64> = pes.iter().filter(|p| p.stream_type != 0x0f).filter_map(|p| p.dts.or(p.pts)).collect();
        assert!(audio.len() > 4 * 370 && video.len() > 4 * 190, "{} {}", audio.len(), video.len());
        assert!(audio.windows(2).all(|w| w[0] < w[1]), "TS audio frames' times did not rise");
        assert!(video.windows(2).all(|w| w[0] < w[1]), "TS video DTS did not rise");
    }
}
