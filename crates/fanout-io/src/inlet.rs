//! Where a source that is not a socket of the session hands its packets in: an RTSP
//! upstream or publisher after restamping, an SRTP key epoch, the MPEG-TS of a repackaging.
//! On the user-space paths the packet is copied once into a pool buffer, judged like a
//! received one ([`crate::session::Inner::accept`]) and published into the ring, on the
//! caller's thread: no socket, no trip through the kernel. The `kernel` path clones what
//! reaches the session's socket inside the kernel, so for it the inlet binds that socket on
//! loopback and sends there: the one hop that remains, because that is where its program is.

use crate::packet::{Packet, PacketPool};
use crate::session::{DataPath, Session};
use crate::source::Feed as _;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;

/// The most packets an inlet holds before it publishes: one call, one wake of the groups.
const BATCH: usize = 32;

pub struct Inlet {
    session: Session,
    way: Way,
}

enum Way {
    /// Straight into the ring.
    Direct { pool: PacketPool, ready: Vec<Arc<Packet>> },
    /// Into the session's source socket (the kernel path).
    Socket { feeder: UdpSocket, into: SocketAddr },
}

impl Inlet {
    /// An inlet into `session`, which then has no other source.
    pub fn open(session: &Session) -> io::Result<Self> {
        let way = if session.config().datapath == DataPath::Kernel {
            let sock = crate::source::bind_udp_source(SocketAddr::from(([127, 0, 0, 1], 0)), None)?;
            let into = sock.local_addr()?;
            // The socket is a detail: the session keeps the kind of source its owner gave.
            let kind = session.inner().source_kind.lock().clone();
            session.attach_udp(sock)?;
            if !kind.is_empty() {
                *session.inner().source_kind.lock() = kind;
            }
            let feeder = UdpSocket::bind("127.0.0.1:0")?;
            feeder.set_nonblocking(true)?;
            Way::Socket { feeder, into }
        } else {
            let cfg = session.config();
            // As a source task's: the ring's worth, so a full ring recycles its own buffers.
            Way::Direct { pool: PacketPool::new(cfg.max_datagram, cfg.ring_capacity + BATCH), ready: Vec::new() }
        };
        Ok(Self { session: session.clone(), way })
    }

    /// An inlet of units ([`Inlet::hold_unit`]) into `session`, whose sinks from now on
    /// start and resume only where a unit is marked. User-space paths only: the kernel
    /// path's socket would carry no marks.
    pub fn open_units(session: &Session) -> io::Result<Self> {
        let inlet = Self::open(session)?;
        if !inlet.is_direct() {
            return Err(io::Error::other("a session of units runs on a user-space data path"));
        }
        session.inner().units.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(inlet)
    }

    /// Whether packets go straight into the ring (not through a socket).
    pub fn is_direct(&self) -> bool {
        matches!(self.way, Way::Direct { .. })
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Hands in one packet, published at once; whether the session took it (it may judge it
    /// malformed, or its ingest may refuse it; an oversized one is counted and dropped).
    pub fn send(&mut self, data: &[u8]) -> bool {
        self.hold(data) && {
            self.flush();
            true
        }
    }

    /// Hands in one packet to publish with the next [`Inlet::flush`] (or once a batch is
    /// held): for a caller with several at once, one wake of the sinks for all of them.
    pub fn hold(&mut self, data: &[u8]) -> bool {
        let inner = self.session.inner();
        match &mut self.way {
            Way::Socket { feeder, into } => feeder.send_to(data, *into).is_ok(),
            Way::Direct { pool, ready } => {
                if inner.is_closed() {
                    return false;
                }
                if data.len() > inner.cfg.max_datagram {
                    inner.count_oversized();
                    return false;
                }
                let mut p = pool.take();
                let pm = Arc::get_mut(&mut p).expect("pool buffers are unique");
                pm.buf_mut()[..data.len()].copy_from_slice(data);
                if !inner.accept(pm, data.len()) {
                    pool.give(p);
                    return false;
                }
                ready.push(p);
                if ready.len() >= BATCH {
                    inner.publish(ready, pool);
                }
                true
            }
        }
    }

    /// Hands in one unit of a byte stream (an FLV tag) in pieces of at most a datagram, to
    /// publish with the next [`Inlet::flush`]; its first piece is marked as a place a sink may
    /// start at where `resume_here` (a keyframe's tag). Whether it took every piece (not
    /// into a closed session, nor through an inlet not opened by [`Inlet::open_units`]).
    pub fn hold_unit(&mut self, unit: &[u8], resume_here: bool) -> bool {
        let inner = self.session.inner();
        let Way::Direct { pool, ready } = &mut self.way else { return false };
        if !inner.units.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        if inner.is_closed() {
            return false;
        }
        let size = inner.cfg.max_datagram.max(1);
        // A unit's pieces are published together: a sink that sees its first sees them all.
        if ready.len() + unit.len().div_ceil(size) > BATCH {
            inner.publish(ready, pool);
        }
        for (i, piece) in unit.chunks(size).enumerate() {
            let mut p = pool.take();
            let pm = Arc::get_mut(&mut p).expect("pool buffers are unique");
            pm.buf_mut()[..piece.len()].copy_from_slice(piece);
            pm.set_len(piece.len(), 0);
            // (Only its own marks: a piece that looks like an MPEG-TS keyframe is not one.)
            pm.set_keyframe(i == 0 && resume_here);
            if i > 0 {
                pm.set_continues();
            }
            ready.push(p);
        }
        true
    }

    /// Publishes what [`Inlet::hold`] kept.
    pub fn flush(&mut self) {
        if let Way::Direct { pool, ready } = &mut self.way {
            self.session.inner().publish(ready, pool);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, EngineOptions, SessionConfig};
    use std::time::Duration;

    fn rtp(seq: u16) -> Vec<u8> {
        let mut p = vec![0u8; 112];
        fanout_proto::rtp::write_header(&mut p, false, 96, seq, u32::from(seq) * 3000, 7);
        p
    }

    fn session(datapath: DataPath) -> (Engine, Session) {
        let engine = Engine::start(EngineOptions { workers: 1, ..Default::default() }).unwrap();
        let cfg = SessionConfig {
            name: "in".into(),
            priority: fanout_core::Priority::new(3).unwrap(),
            datapath,
            ring_capacity: 64,
            max_datagram: 1500,
            sinks_per_group: 64,
            payload: crate::PayloadMode::Rtp,
            failed_sinks: crate::FailurePolicy::Remove,
            udp_sinks: crate::UdpSinkMode::default(),
            uring_sqpoll: false,
            kernel_spread: false,
            stream_flush: Duration::ZERO,
            source_recv: crate::SourceRecv::default(),
            pacing: None,
            reserve: 0,
        };
        let s = Session::new(cfg, &engine);
        (engine, s)
    }

    #[test]
    fn packets_go_into_the_ring_without_a_socket_and_reach_a_sink() {
        let (_engine, s) = session(DataPath::Shared);
        let mut inlet = Inlet::open(&s).unwrap();
        assert!(inlet.is_direct());
        assert!(s.status().source.addr.is_none(), "no socket was bound");
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.add_udp_sink(rx.local_addr().unwrap()).unwrap();
        for seq in 100..110 {
            assert!(inlet.send(&rtp(seq)));
        }
        let mut buf = [0u8; 2048];
        for seq in 100..110 {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(n, 112);
            assert_eq!(u16::from_be_bytes([buf[2], buf[3]]), seq, "in order, unchanged");
        }
        assert_eq!(s.status().source.packets, 10);
        s.close();
    }

    #[test]
    fn held_packets_wait_for_the_flush_and_bad_ones_are_counted() {
        let (_engine, s) = session(DataPath::Shared);
        let mut inlet = Inlet::open(&s).unwrap();
        assert!(inlet.hold(&rtp(1)) && inlet.hold(&rtp(2)));
        assert_eq!(s.status().source.packets, 0, "held, not yet published");
        inlet.flush();
        assert_eq!(s.status().source.packets, 2);
        assert!(!inlet.send(&[0x80, 96, 0]), "too short to be RTP");
        assert!(!inlet.send(&vec![0x80; s.config().max_datagram + 1]), "larger than a datagram may be");
        let st = s.status().source;
        assert_eq!((st.packets, st.malformed, st.oversized), (2, 1, 1));
        s.close();
        assert!(!inlet.send(&rtp(3)), "a closed session takes nothing");
    }

    #[test]
    fn a_full_ring_recycles_the_inlets_buffers() {
        let (_engine, s) = session(DataPath::Shared);
        let mut inlet = Inlet::open(&s).unwrap();
        let cap = s.config().ring_capacity;
        for seq in 0..(3 * cap) as u16 {
            assert!(inlet.send(&rtp(seq)));
        }
        let Way::Direct { pool, .. } = &inlet.way else { unreachable!() };
        assert_eq!(pool.allocated, (cap + BATCH) as u64, "no buffer allocated past the pool's own");
        s.close();
    }

    #[test]
    fn a_kernel_session_gets_a_socket_to_clone_from() {
        let (_engine, s) = session(DataPath::Kernel);
        match Inlet::open(&s) {
            Ok(inlet) => {
                assert!(!inlet.is_direct());
                assert!(s.status().source.addr.is_some_and(|a| a.ip().is_loopback()));
            }
            // Without the kernel path here (no privilege, no BPF) the session says so.
            Err(e) => assert!(e.to_string().contains("kernel data path"), "{e}"),
        }
        s.close();
    }
    /// A stream of units (FLV tags) cut into datagram-sized pieces: a stream sink gets whole
    /// units from a marked one on, whether it joined before any mark (it waits) or later (it
    /// starts at the last mark the ring holds), never a piece from inside a unit.
    #[test]
    fn a_stream_sink_of_units_starts_at_a_marked_units_first_piece() {
        use std::io::Read;
        let (_engine, s) = session(DataPath::Shared);
        let mut inlet = Inlet::open_units(&s).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let connect = || {
            let c = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let (served, _) = listener.accept().unwrap();
            (c, served)
        };
        // Unit k: 4000 bytes of k (three pieces of at most 1500); 1 and 3 are keyframes.
        let unit = |k: u8| vec![k; 4000];
        let (mut early, served) = connect();
        s.add_stream_sink(served, true).unwrap();
        for k in 0..4u8 {
            assert!(inlet.hold_unit(&unit(k), k % 2 == 1));
        }
        inlet.flush();
        let (mut late, served) = connect();
        s.add_stream_sink(served, true).unwrap();
        assert!(inlet.hold_unit(&unit(4), false));
        inlet.flush();
        // Which units came, in order (each whole: 4000 bytes of one value).
        let units_read = |c: &mut std::net::TcpStream, n: usize| {
            let mut got = vec![0u8; n * 4000];
            c.read_exact(&mut got).unwrap();
            got.chunks(4000)
                .map(|u| if u.iter().all(|b| *b == u[0]) { i32::from(u[0]) } else { -1 })
                .collect::<Vec<_>>()
        };
        assert_eq!(units_read(&mut early, 4), [1, 2, 3, 4], "waited for the first mark");
        assert_eq!(units_read(&mut late, 2), [3, 4], "from the last mark held");
        assert_eq!(s.status().source.packets, 15, "five units of three pieces");
        s.close();
    }
}
