//! The traffic tools, apart from the relay they measure: `gen` (a media server emulator),
//! `sub` (a media client emulator), `bench` (the scenarios that run the relay, `gen` and
//! `sub` as separate processes and write CSV + PNG), and the API client they and `fanout
//! ctl` share. The `fanout` binary carries them as subcommands; nothing of the relay's
//! own code is in here.

pub mod bench;
pub mod client;
pub mod gen;
mod read;
pub mod rtmp;
mod stop;
pub mod sub;
mod tls;
pub mod whep;

/// Nanoseconds on the system-wide monotonic clock: comparable between processes on one host.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU seconds the calling thread has used (precise, including softirq work the kernel did
/// on its time, e.g. the in-kernel fan-out of a datagram it sent over loopback).
pub fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// RTP timestamps of `gen`'s streams: a 90 kHz clock, as video uses.
pub const RTP_HZ: u64 = 90_000;

pub fn rtp_ts(ns: u64) -> u32 {
    (ns as u128 * RTP_HZ as u128 / 1_000_000_000) as u32
}

/// Has the kernel build this socket's datagrams with the payload in page fragments: UDP
/// segmentation offload does, and with the largest segment size it sends every datagram
/// whole. A relay fed by a NIC sees such datagrams; one fed over loopback sees linear ones,
/// whose every clone the `kernel` path's unclone step copies whole.
pub fn send_paged(s: &std::net::UdpSocket) -> std::io::Result<()> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
    fanout_io::sys::set_int_option(fd, libc::SOL_UDP, libc::UDP_SEGMENT, libc::c_int::from(u16::MAX))
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;

    /// A paged socket still sends each datagram whole, however large, and its bytes intact.
    #[test]
    fn paged_datagrams_arrive_whole() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        super::send_paged(&tx).unwrap();
        let mut buf = vec![0u8; 65_536];
        for len in [36, 1400, 9000, 60_000] {
            let sent: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            tx.send_to(&sent, rx.local_addr().unwrap()).unwrap();
            let (n, _) = rx.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], &sent[..], "a {len}-byte datagram");
        }
    }
}
