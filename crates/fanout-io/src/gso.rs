//! Many small datagrams to many peers from one unconnected UDP socket, in few system calls:
//! consecutive datagrams to one address with one size (the last may be shorter) go as one
//! UDP GSO message (`UDP_SEGMENT`, Linux 4.18+): the stack is walked once for the run and the
//! datagrams are cut at the device (or at the receiving socket, on loopback). All the
//! messages of a batch go in one `sendmmsg`. A per-viewer encrypted stream (WebRTC) has no
//! shared payload, but a picture's fragments to one viewer are such a run.

use crate::sys::{self, RawAddr};
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::RawFd;

/// The most segments the kernel takes in one GSO message (`UDP_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: usize = 64;
/// The most bytes of one UDP message (IPv4: 65,535 less the IP and UDP headers).
pub const MAX_BYTES: usize = 65_507;

/// Splits datagrams (their address and length, in sending order) into runs that can each
/// go as one message: one address, every datagram but the last of the run exactly as long as
/// the first, the last no longer, at most `MAX_SEGMENTS` and `MAX_BYTES`. Order is kept.
pub fn runs(items: &[(SocketAddr, usize)]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < items.len() {
        let (to, seg) = items[start];
        let mut end = start + 1;
        let mut bytes = seg;
        while seg > 0 && end < items.len() && end - start < MAX_SEGMENTS {
            let (a, len) = items[end];
            // The datagram before must have been a full segment, and this one no longer.
            if a != to || items[end - 1].1 != seg || len > seg || bytes + len > MAX_BYTES {
                break;
            }
            bytes += len;
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    out
}

/// Sends batches of datagrams as GSO runs. GSO is dropped for good the first time the
/// kernel refuses it (an old kernel, a device without checksum offload): the same datagrams
/// then go one by one.
pub struct GsoSender {
    gso: bool,
    iov: Vec<libc::iovec>,
    addrs: Vec<RawAddr>,
    cmsgs: Vec<[u64; 3]>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in the scratch vectors are rebuilt on every call and never kept
// past it.
unsafe impl Send for GsoSender {}

impl Default for GsoSender {
    fn default() -> Self {
        Self::new()
    }
}

impl GsoSender {
    pub fn new() -> Self {
        Self { gso: true, iov: Vec::new(), addrs: Vec::new(), cmsgs: Vec::new(), hdrs: Vec::new() }
    }

    /// Whether runs still go as GSO messages.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Sends a prefix of `batch` with one `sendmmsg` (non-blocking): how many of its
    /// datagrams are done with, sent or refused one by one (a refused datagram is dropped, as
    /// the network would). `WouldBlock` when the socket takes none now.
    pub fn send(&mut self, fd: RawFd, batch: &[(SocketAddr, &[u8])]) -> io::Result<usize> {
        let items: Vec<(SocketAddr, usize)> = batch.iter().map(|(a, d)| (*a, d.len())).collect();
        let mut runs = if self.gso { runs(&items) } else { (0..batch.len()).map(|i| i..i + 1).collect() };
        runs.truncate(1024);
        self.iov.clear();
        self.addrs.clear();
        self.cmsgs.clear();
        self.iov.extend(batch.iter().map(|(_, d)| sys::iovec(d)));
        for r in &runs {
            self.addrs.push(RawAddr::new(batch[r.start].0));
            self.cmsgs.push(segment_cmsg(batch[r.start].1.len()));
        }
        self.hdrs.clear();
        for (i, r) in runs.iter().enumerate() {
            let mut h = sys::mmsghdr_n(self.iov[r.start..].as_mut_ptr(), r.len(), Some(&self.addrs[i]));
            if r.len() > 1 {
                h.msg_hdr.msg_control = self.cmsgs[i].as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = cmsg_space() as _;
            }
            self.hdrs.push(h);
        }
        match sys::sendmmsg(fd, &mut self.hdrs) {
            Ok(n) => Ok(runs[..n].iter().map(|r| r.len()).sum()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(e),
            // The first message was refused: no GSO here, or a datagram the kernel would not
            // take (no route): the run is tried again one by one, or dropped.
            Err(e) => {
                let first = &runs[0];
                if first.len() > 1 && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)) {
                    tracing::warn!("UDP GSO refused ({e}): sending datagram by datagram");
                    self.gso = false;
                    return Ok(0);
                }
                Ok(first.len())
            }
        }
    }
}

fn cmsg_space() -> usize {
    // SAFETY: CMSG_SPACE is arithmetic.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize }
}

/// A control message `UDP_SEGMENT = seg`, in an aligned buffer of `cmsg_space()` bytes.
fn segment_cmsg(seg: usize) -> [u64; 3] {
    let mut buf = [0u64; 3];
    debug_assert!(cmsg_space() <= std::mem::size_of_val(&buf));
    // SAFETY: the buffer is aligned for cmsghdr and large enough for one u16 payload.
    unsafe {
        let c = buf.as_mut_ptr().cast::<libc::cmsghdr>();
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        libc::CMSG_DATA(c).cast::<u16>().write_unaligned(seg.min(u16::MAX as usize) as u16);
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn a(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_pictures_fragments_to_one_peer_are_one_run() {
        let items = [(a(1), 1200), (a(1), 1200), (a(1), 700), (a(1), 1200), (a(2), 1200), (a(2), 1300), (a(1), 100)];
        assert_eq!(runs(&items), vec![0..3, 3..4, 4..5, 5..6, 6..7]);
        assert_eq!(runs(&[(a(1), 0), (a(1), 0)]), vec![0..1, 1..2], "empty datagrams are not segments");
        assert_eq!(runs(&vec![(a(1), 100); 130]), vec![0..64, 64..128, 128..130]);
        assert_eq!(runs(&vec![(a(1), 1400); 60]), vec![0..46, 46..60], "at most 65,507 bytes a message");
    }

    proptest! {
        /// Runs cover every datagram once, in order, and each is a valid GSO message.
        #[test]
        fn runs_cover_all_in_order_and_are_valid(items in prop::collection::vec((0u16..3, 0usize..1500), 0..300)) {
            let items: Vec<(SocketAddr, usize)> = items.into_iter().map(|(p, n)| (a(p), n)).collect();
            let rs = runs(&items);
            let mut next = 0;
            for r in &rs {
                prop_assert_eq!(r.start, next);
                prop_assert!(r.end > r.start && r.len() <= MAX_SEGMENTS);
                next = r.end;
                let seg = items[r.start].1;
                let run = &items[r.clone()];
                prop_assert!(run.iter().all(|(to, _)| *to == items[r.start].0));
                prop_assert!(run[..run.len() - 1].iter().all(|(_, n)| *n == seg));
                prop_assert!(run[run.len() - 1].1 <= seg);
                prop_assert!(run.len() == 1 || run.iter().map(|(_, n)| n).sum::<usize>() <= MAX_BYTES);
            }
            prop_assert_eq!(next, items.len());
        }
    }

    /// Real sockets on loopback: a run sent as one GSO message arrives as its datagrams, each
    /// whole and in order, and a batch to two peers reaches both.
    #[test]
    fn datagrams_sent_as_runs_arrive_one_by_one() {
        use std::os::fd::AsRawFd;
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let rx1 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let rx2 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for r in [&rx1, &rx2] {
            r.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
        }
        let (p1, p2) = (rx1.local_addr().unwrap(), rx2.local_addr().unwrap());
        let data: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; if i == 4 || i == 9 { 300 } else { 1000 }]).collect();
        let to = |i: usize| if i < 5 { p1 } else { p2 };
        let batch: Vec<(SocketAddr, &[u8])> = data.iter().enumerate().map(|(i, d)| (to(i), d.as_slice())).collect();
        let mut s = GsoSender::new();
        let mut done = 0;
        while done < batch.len() {
            done += s.send(tx.as_raw_fd(), &batch[done..]).unwrap();
        }
        assert!(s.gso(), "loopback takes GSO");
        let mut buf = [0u8; 2000];
        for (i, d) in data.iter().enumerate() {
            let rx = if i < 5 { &rx1 } else { &rx2 };
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], d.as_slice(), "datagram {i}");
        }
    }
}
