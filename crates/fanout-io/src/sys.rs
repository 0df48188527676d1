//! Thin wrappers over the batched and error-queue system calls std does not expose.
//! Every wrapper retries `EINTR` and returns `io::Error` otherwise.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

fn retry<F: FnMut() -> isize>(mut f: F) -> io::Result<usize> {
    loop {
        let r = f();
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A socket address in the C layout, built once per sink and reused for every send.
#[derive(Clone, Copy)]
pub struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawAddr {
    pub fn new(addr: SocketAddr) -> Self {
        let sa = socket2::SockAddr::from(addr);
        // SAFETY: SockAddr holds a valid sockaddr_storage of `len` bytes.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        unsafe {
            std::ptr::copy_nonoverlapping(sa.as_ptr().cast::<u8>(), (&raw mut storage).cast::<u8>(), sa.len() as usize)
        };
        Self { storage, len: sa.len() }
    }
    pub fn is_v6(&self) -> bool {
        i32::from(self.storage.ss_family) == libc::AF_INET6
    }

    fn ptr(&self) -> *const libc::sockaddr {
        (&raw const self.storage).cast()
    }
}

/// `sendto` of one buffer.
/// The wall clock as an NTP timestamp (sender reports, and reading a source's reports
/// against our own clock).
pub fn ntp_now() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    fanout_proto::rtp::rtcp::ntp_from_unix(since)
}

pub fn send_to(fd: RawFd, buf: &[u8], to: &RawAddr) -> io::Result<usize> {
    // SAFETY: buf and the address outlive the call.
    retry(|| unsafe {
        libc::sendto(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL, to.ptr(), to.len)
    })
}

/// `send` of one buffer on a connected socket.
pub fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf outlives the call.
    retry(|| unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) })
}

/// Vectored `sendmsg` on a connected stream socket: returns bytes written.
pub fn send_vectored(fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: the iovecs point into buffers the caller keeps alive for the call.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = iov.as_ptr().cast_mut();
    msg.msg_iovlen = iov.len().min(libc::UIO_MAXIOV as usize) as _;
    retry(|| unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) })
}

/// A `sendmmsg` header for one datagram: `iov` to `to`, or to the connected peer.
/// The iovec and the address must stay put until the header is sent.
pub fn mmsghdr(iov: *mut libc::iovec, to: Option<&RawAddr>) -> libc::mmsghdr {
    // SAFETY: an all-zero mmsghdr is a valid empty header.
    let mut h: libc::mmsghdr = unsafe { zeroed() };
    h.msg_hdr.msg_iov = iov;
    h.msg_hdr.msg_iovlen = 1;
    if let Some(a) = to {
        h.msg_hdr.msg_name = a.ptr().cast_mut().cast();
        h.msg_hdr.msg_namelen = a.len;
    }
    h
}

/// A header for a datagram gathered from `n` consecutive iovecs.
pub fn mmsghdr_n(iov: *mut libc::iovec, n: usize, to: Option<&RawAddr>) -> libc::mmsghdr {
    let mut h = mmsghdr(iov, to);
    h.msg_hdr.msg_iovlen = n as _;
    h
}

/// `sendmmsg` of prepared headers (at most 1024): returns how many datagrams were sent,
/// always a prefix of `hdrs`.
pub fn sendmmsg(fd: RawFd, hdrs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    let n = hdrs.len().min(1024) as libc::c_uint;
    // SAFETY: the headers point at iovecs, buffers and addresses alive for the call.
    retry(|| unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), n, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as isize })
}

/// `sendmmsg` of one datagram per iovec on a connected datagram socket: returns how many
/// datagrams were sent. `hdrs` is caller-owned scratch space, reused between calls.
pub fn send_datagrams(fd: RawFd, iov: &mut [libc::iovec], hdrs: &mut Vec<libc::mmsghdr>) -> io::Result<usize> {
    hdrs.clear();
    hdrs.extend(iov.iter_mut().map(|v| mmsghdr(v, None)));
    sendmmsg(fd, hdrs)
}

/// Outcome of receiving one datagram of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    /// The datagram was larger than the buffer and was cut (`MSG_TRUNC`).
    pub truncated: bool,
}

/// `recvmmsg` into `bufs` without blocking: returns the datagrams received (0 on `EAGAIN`).
pub fn recv_datagrams(
    fd: RawFd,
    bufs: &mut [&mut [u8]],
    iov: &mut Vec<libc::iovec>,
    hdrs: &mut Vec<libc::mmsghdr>,
    out: &mut Vec<Received>,
) -> io::Result<usize> {
    iov.clear();
    hdrs.clear();
    out.clear();
    for b in bufs.iter_mut() {
        iov.push(libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() });
    }
    for v in iov.iter_mut() {
        // SAFETY: an all-zero mmsghdr is a valid empty header.
        let mut h: libc::mmsghdr = unsafe { zeroed() };
        h.msg_hdr.msg_iov = v;
        h.msg_hdr.msg_iovlen = 1;
        hdrs.push(h);
    }
    // SAFETY: headers and buffers are alive and exclusively ours for the call.
    let r = retry(|| unsafe {
        libc::recvmmsg(fd, hdrs.as_mut_ptr(), hdrs.len() as _, libc::MSG_DONTWAIT, std::ptr::null_mut()) as isize
    });
    match r {
        Ok(n) => {
            out.extend(hdrs[..n].iter().map(|h| Received {
                len: (h.msg_len as usize).min(iov[0].iov_len),
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            }));
            Ok(n)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

/// Sets a socket option whose value is an int.
pub fn set_int_option(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: plain setsockopt with an int of the size given.
    let r = unsafe { libc::setsockopt(fd, level, name, (&raw const value).cast(), size_of::<libc::c_int>() as _) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks the kernel to queue ICMP errors with the destination they concern, so a socket
/// shared by many sinks can tell which sink failed.
pub fn enable_recv_err(fd: RawFd, v6: bool) -> io::Result<()> {
    let (level, name) =
        if v6 { (libc::IPPROTO_IPV6, libc::IPV6_RECVERR) } else { (libc::IPPROTO_IP, libc::IP_RECVERR) };
    set_int_option(fd, level, name, 1)
}

/// Lets the socket's datagrams carry departure times ([`TxtimeCmsg`], CLOCK_MONOTONIC), which
/// the `fq` qdisc holds them to.
pub fn enable_txtime(fd: RawFd) -> io::Result<()> {
    let cfg = libc::sock_txtime { clockid: libc::CLOCK_MONOTONIC, flags: 0 };
    // SAFETY: setsockopt with a sock_txtime of the size given.
    let r = unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_TXTIME, (&raw const cfg).cast(), size_of_val(&cfg) as _)
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("SO_TXTIME: {e}")));
    }
    Ok(())
}

/// Grows a socket's send buffer to `bytes` (beyond `net.core.wmem_max` where the process may,
/// as root may) and returns what it is: the kernel's figure, which counts each datagram's
/// own overhead too.
pub fn grow_send_buffer(fd: RawFd, bytes: usize) -> io::Result<usize> {
    let v = bytes.min(i32::MAX as usize / 2) as libc::c_int;
    if set_int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
        set_int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v)?;
    }
    let mut got: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into an int of the size given.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&raw mut got).cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(got.max(0) as usize)
}

/// CLOCK_MONOTONIC now, in nanoseconds (what SO_TXTIME stamps are on).
pub fn monotonic_ns() -> u64 {
    let mut ts: libc::timespec = unsafe { zeroed() };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One datagram's departure time as a control message (`SCM_TXTIME`): `CMSG_SPACE(8)` bytes,
/// aligned as the kernel reads them.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct TxtimeCmsg {
    hdr: libc::cmsghdr,
    at: u64,
}

impl TxtimeCmsg {
    pub fn new(at: u64) -> Self {
        // SAFETY: CMSG_LEN is a size computation.
        let len = unsafe { libc::CMSG_LEN(size_of::<u64>() as u32) } as usize;
        // SAFETY: an all-zero cmsghdr is valid; its fields are set below.
        let mut hdr: libc::cmsghdr = unsafe { zeroed() };
        (hdr.cmsg_len, hdr.cmsg_level, hdr.cmsg_type) = (len as _, libc::SOL_SOCKET, libc::SCM_TXTIME);
        Self { hdr, at }
    }

    /// Attaches it to a header; it must stay where it is until the header is sent.
    pub fn attach(&mut self, h: &mut libc::mmsghdr) {
        h.msg_hdr.msg_control = (self as *mut Self).cast();
        h.msg_hdr.msg_controllen = size_of::<Self>() as _;
    }
}

/// Takes one queued ICMP error: the destination it concerns and the error.
pub fn recv_error(fd: RawFd) -> Option<(SocketAddr, io::Error)> {
    let mut name: libc::sockaddr_storage = unsafe { zeroed() };
    let mut control = [0u64; 64];
    let mut data = [0u8; 64];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // SAFETY: all pointers are to locals alive for the call.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&raw mut name).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as _;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; 64]>() as _;
    let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
    if r < 0 {
        return None;
    }
    let mut errno = libc::ECONNREFUSED;
    // SAFETY: walking the control buffer the kernel filled, with its own macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let (l, t) = ((*c).cmsg_level, (*c).cmsg_type);
            if (l == libc::IPPROTO_IP && t == libc::IP_RECVERR) || (l == libc::IPPROTO_IPV6 && t == libc::IPV6_RECVERR)
            {
                let e = libc::CMSG_DATA(c).cast::<libc::sock_extended_err>().read_unaligned();
                errno = e.ee_errno as i32;
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let addr = match name.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: family says this is a sockaddr_in.
            let a = unsafe { *(&raw const name).cast::<libc::sockaddr_in>() };
            SocketAddr::V4(SocketAddrV4::new(u32::from_be(a.sin_addr.s_addr).into(), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: family says this is a sockaddr_in6.
            let a = unsafe { *(&raw const name).cast::<libc::sockaddr_in6>() };
            SocketAddr::V6(SocketAddrV6::new(a.sin6_addr.s6_addr.into(), u16::from_be(a.sin6_port), 0, a.sin6_scope_id))
        }
        _ => return Some((SocketAddr::from(([0, 0, 0, 0], 0)), io::Error::from_raw_os_error(errno))),
    };
    Some((addr, io::Error::from_raw_os_error(errno)))
}

/// What this process's allocator holds, in bytes: `(in use, free but kept)`; glibc only
/// (`None` elsewhere). Memory freed by threads stays in their arenas for reuse, so RSS can
/// grow while `in use` does not: the two tell a leak from the allocator's keeping.
pub fn malloc_figures() -> Option<(u64, u64)> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters (taking its arenas' locks).
        let m = unsafe { libc::mallinfo2() };
        Some(((m.uordblks + m.hblkhd) as u64, m.fordblks as u64))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Gives the allocator's freed-but-kept pages back to the kernel (`malloc_trim`: every
/// arena's free chunks, whole pages of them, by `MADV_DONTNEED`); whether any went back.
/// glibc keeps what its (up to 8 × cores) thread arenas freed for reuse, so a relay whose
/// threads take turns at bursts of allocation (players joining, downloads, offers) would
/// otherwise hold its high-water mark in every arena.
pub fn malloc_trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only takes the allocator's locks and returns free pages.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// A process's figures from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcStat {
    /// User + system CPU time, in seconds.
    pub cpu_s: f64,
    pub threads: u64,
    /// Resident memory, in bytes.
    pub rss_bytes: u64,
}

impl ProcStat {
    /// Reads it for `pid` (`None`: this process).
    pub fn read(pid: Option<u32>) -> std::io::Result<Self> {
        let path = pid.map_or_else(|| "/proc/self/stat".to_string(), |p| format!("/proc/{p}/stat"));
        // SAFETY: sysconf has no preconditions.
        let (hz, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        Self::parse(&std::fs::read_to_string(path)?, hz.max(1) as f64, page.max(1) as u64)
            .ok_or_else(|| std::io::Error::other("an odd /proc stat line"))
    }

    /// Parses a stat line, with `hz` clock ticks a second and pages of `page` bytes.
    pub fn parse(stat: &str, hz: f64, page: u64) -> Option<Self> {
        // The fields after the command name (which may hold spaces and parentheses) start
        // at the state, field 3 of proc(5).
        let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
        Some(Self {
            cpu_s: (field(14)? + field(15)?) as f64 / hz,
            threads: field(20)?,
            rss_bytes: field(24)?.saturating_mul(page),
        })
    }
}

/// Raises the open-file limit to the hard limit, and the hard limit to `want` where that is
/// higher and the process may (CAP_SYS_RESOURCE; at most `fs.nr_open`); returns the new soft
/// limit.
pub fn raise_nofile_limit(want: u64) -> u64 {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|s| s.trim().parse::<u64>().ok());
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut l: libc::rlimit = zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 0;
        }
        let hard = l.rlim_max;
        if hard < want {
            let raised = libc::rlimit { rlim_cur: want, rlim_max: want };
            let raised = nr_open.map_or(raised, |n| libc::rlimit { rlim_cur: want.min(n), rlim_max: want.min(n) });
            // Refused without the privilege: the hard limit stays.
            libc::setrlimit(libc::RLIMIT_NOFILE, &raised);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        }
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur
    }
}

/// An iovec over a byte slice the caller keeps alive while the iovec is used.
pub fn iovec(buf: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: buf.as_ptr().cast_mut().cast(), iov_len: buf.len() }
}

/// Asks the kernel to stamp each datagram `fd` receives with its arrival time
/// (`SO_TIMESTAMPNS`, the real-time clock), read by [`recv_stamped`].
pub fn enable_rx_timestamps(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

/// Receives one datagram (non-blocking sockets: `WouldBlock` when none) with the kernel's
/// arrival time in nanoseconds of the real-time clock, if the socket stamps them.
pub fn recv_stamped(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
    let mut iov = iovec(buf);
    iov.iov_base = buf.as_mut_ptr().cast();
    let mut control = [0u64; 8];
    // SAFETY: zeroed msghdr is valid; the pointers below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at live buffers of the sizes it names.
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut at = None;
    // SAFETY: the CMSG macros walk the control buffer the kernel filled, within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                at = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, at))
}

/// A consecutive even/odd UDP port pair on `ip` (RTP/RTCP convention).
pub fn port_pair(ip: std::net::IpAddr) -> std::io::Result<(std::net::UdpSocket, std::net::UdpSocket)> {
    port_pair_with(ip, false)
}

/// A port pair; `shared_rtp`: the RTP one with SO_REUSEPORT, so the data path's sending
/// sockets can bind its port too.
pub fn port_pair_with(
    ip: std::net::IpAddr,
    shared_rtp: bool,
) -> std::io::Result<(std::net::UdpSocket, std::net::UdpSocket)> {
    let bind = |port: u16, reuse: bool| -> std::io::Result<std::net::UdpSocket> {
        let s = socket2::Socket::new(socket2::Domain::for_address((ip, port).into()), socket2::Type::DGRAM, None)?;
        if reuse {
            s.set_reuse_port(true)?;
        }
        s.bind(&std::net::SocketAddr::new(ip, port).into())?;
        Ok(s.into())
    };
    for _ in 0..64 {
        let a = bind(0, shared_rtp)?;
        let port = a.local_addr()?.port();
        if port % 2 == 1 || port == u16::MAX {
            continue;
        }
        if let Ok(b) = bind(port + 1, false) {
            return Ok((a, b));
        }
    }
    Err(std::io::Error::other("no free even/odd UDP port pair"))
}

/// How the relay's own threads (workers, reactor) are scheduled beside the rest of the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ThreadPriority {
    /// As the process was started.
    #[default]
    Normal,
    /// A nice value, -20 (most CPU) to 19: the scheduler's share of the CPU.
    Nice(i32),
    /// `SCHED_RR` at this real-time priority (1-99): runs before every normal thread (the
    /// kernel's real-time throttling still leaves the others 5%).
    Realtime(i32),
    /// The normal policy and share, with a time slice of this many microseconds (100 to
    /// 100,000; Linux 6.12+): EEVDF gives a thread that asks for short slices an earlier
    /// deadline, so on waking it runs before threads with longer ones, in its fair share.
    Slice(u32),
}

impl std::fmt::Display for ThreadPriority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ThreadPriority::Normal => write!(f, "normal"),
            ThreadPriority::Nice(n) => write!(f, "nice:{n}"),
            ThreadPriority::Realtime(p) => write!(f, "realtime:{p}"),
            ThreadPriority::Slice(us) => write!(f, "slice:{us}"),
        }
    }
}

impl std::str::FromStr for ThreadPriority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{s:?} is not a thread priority: \"normal\", \"nice:N\" (-20 to 19), \"realtime:N\" (1 to 99) or \"slice:US\" (100 to 100000 µs)"
            )
        };
        let num = |v: &str, r: std::ops::RangeInclusive<i32>| v.parse::<i32>().ok().filter(|n| r.contains(n));
        match s.split_once(':') {
            None if s == "normal" => Ok(ThreadPriority::Normal),
            Some(("nice", v)) => num(v, -20..=19).map(ThreadPriority::Nice).ok_or_else(bad),
            Some(("realtime", v)) => num(v, 1..=99).map(ThreadPriority::Realtime).ok_or_else(bad),
            Some(("slice", v)) => num(v, 100..=100_000).map(|us| ThreadPriority::Slice(us as u32)).ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

impl ThreadPriority {
    /// Applies to the calling thread.
    fn apply(self) -> io::Result<()> {
        // SAFETY: plain scheduling calls on the calling thread (tid 0 / pid 0 = self).
        let r = unsafe {
            match self {
                ThreadPriority::Normal => 0,
                ThreadPriority::Nice(n) => libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, n),
                ThreadPriority::Realtime(p) => {
                    let param = libc::sched_param { sched_priority: p };
                    libc::sched_setscheduler(0, libc::SCHED_RR, &param)
                }
                ThreadPriority::Slice(us) => {
                    let attr = SchedAttr {
                        size: std::mem::size_of::<SchedAttr>() as u32,
                        policy: libc::SCHED_OTHER as u32,
                        // The thread's nice value stays as it is.
                        nice: libc::getpriority(libc::PRIO_PROCESS, 0),
                        runtime: u64::from(us) * 1000,
                        ..Default::default()
                    };
                    libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) as i32
                }
            }
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            let why = match self {
                ThreadPriority::Slice(_) => "it needs Linux 6.12 or later",
                _ => "it needs CAP_SYS_NICE",
            };
            return Err(io::Error::new(e.kind(), format!("cannot run threads at priority {self}: {e} ({why})")));
        }
        Ok(())
    }
}

/// `struct sched_attr` (SCHED_ATTR_SIZE_VER1); for the normal policy `runtime` is the slice.
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Spawns a named thread that runs at `priority`; fails if the priority cannot be set.
pub fn spawn_with_priority<F: FnOnce() + Send + 'static>(
    name: String,
    priority: ThreadPriority,
    f: F,
) -> io::Result<std::thread::JoinHandle<()>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let t = std::thread::Builder::new().name(name).spawn(move || {
        let r = priority.apply();
        let ok = r.is_ok();
        let _ = tx.send(r);
        if ok {
            f();
        }
    })?;
    rx.recv().unwrap_or_else(|_| Err(io::Error::other("thread died at start")))?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    /// 64 MiB allocated show in use, and freed are no longer counted there (tried a few
    /// times: other tests allocate in this process meanwhile).
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn malloc_figures_follow_an_allocation() {
        let _alone = MEMORY_TESTS.lock();
        const N: u64 = 64 << 20;
        let seen = (0..5).any(|_| {
            let (before, _) = super::malloc_figures().unwrap();
            let block = std::hint::black_box(vec![1u8; N as usize]);
            let (during, _) = super::malloc_figures().unwrap();
            drop(block);
            let (after, _) = super::malloc_figures().unwrap();
            during >= before + N / 2 && after + N / 2 <= during
        });
        assert!(seen, "an allocation of 64 MiB never showed in use, or never left when freed");
    }

    /// The tests that read the process's memory run one at a time (each allocates tens of MiB).
    static MEMORY_TESTS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    /// 31.5 MiB freed in small blocks between blocks still in use stay resident (the
    /// allocator keeps them: only the free top of a heap goes back by itself) until trimmed.
    /// Every 64th block is kept, so no free top can form whatever the heap's layout (a pin
    /// allocated after the blocks could be placed below them, in a chunk freed earlier).
    /// Tried up to 20 times, 50 ms apart: the RSS is the whole process's, and the other tests
    /// allocate and free meanwhile.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn trimming_gives_kept_memory_back() {
        let _alone = MEMORY_TESTS.lock();
        let rss = || super::ProcStat::read(None).unwrap().rss_bytes;
        let seen = (0..20).any(|i| {
            if i > 0 {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let blocks: Vec<Vec<u8>> = (0..4096).map(|_| vec![1u8; 8 << 10]).collect();
            let during = rss();
            let pins: Vec<Vec<u8>> = std::hint::black_box(blocks)
                .into_iter()
                .enumerate()
                .filter(|(k, _)| k % 64 == 0)
                .map(|b| b.1)
                .collect();
            let kept = rss();
            super::malloc_trim();
            let trimmed = rss();
            drop(std::hint::black_box(pins));
            kept + (8 << 20) >= during && trimmed + (16 << 20) <= kept
        });
        assert!(seen, "32 MiB freed were given back without a trim, or not with one");
    }

    #[test]
    fn a_stat_line_is_read_past_a_command_with_spaces_and_parentheses() {
        let line = "4242 (fan (out) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 7 0 100 \
                    123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = super::ProcStat::parse(line, 100.0, 4096).unwrap();
        assert_eq!(s, super::ProcStat { cpu_s: 3.25, threads: 7, rss_bytes: 300 * 4096 });
        assert_eq!(super::ProcStat::parse("4242 (x) S 1", 100.0, 4096), None);
        assert!(super::ProcStat::read(None).unwrap().threads >= 1);
    }

    /// A departure time rides in the control message the kernel expects (`CMSG_SPACE(8)`,
    /// its data where `CMSG_DATA` says), and `sendmmsg` takes it: here, without fq, the
    /// datagrams leave at once and arrive whole.
    #[test]
    fn datagrams_carry_departure_times() {
        use std::os::fd::AsRawFd;
        let c = super::TxtimeCmsg::new(42);
        // SAFETY: a size computation.
        let space = unsafe { libc::CMSG_SPACE(8) } as usize;
        assert_eq!(std::mem::size_of::<super::TxtimeCmsg>(), space);
        // SAFETY: reading the header and data CMSG_DATA locates, inside `c`.
        let data = unsafe { libc::CMSG_DATA(&c.hdr).cast::<u64>().read_unaligned() };
        assert_eq!(data, 42);

        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        super::enable_txtime(tx.as_raw_fd()).unwrap();
        let to = super::RawAddr::new(rx.local_addr().unwrap());
        let payload = *b"stamped";
        let mut iov = [super::iovec(&payload), super::iovec(&payload)];
        let mut hdrs: Vec<libc::mmsghdr> = iov.iter_mut().map(|v| super::mmsghdr(v, Some(&to))).collect();
        // Now, and long past.
        let mut stamps = [super::TxtimeCmsg::new(super::monotonic_ns()), c];
        for (h, t) in hdrs.iter_mut().zip(stamps.iter_mut()) {
            t.attach(h);
        }
        assert_eq!(super::sendmmsg(tx.as_raw_fd(), &mut hdrs).unwrap(), 2);
        let mut buf = [0u8; 16];
        for _ in 0..2 {
            assert_eq!(rx.recv(&mut buf).unwrap(), payload.len());
        }
    }

    use super::ThreadPriority;

    #[test]
    fn thread_priorities_parse_and_print_alike() {
        for s in ["normal", "nice:-20", "nice:19", "realtime:1", "realtime:99", "slice:100", "slice:100000"] {
            assert_eq!(s.parse::<ThreadPriority>().unwrap().to_string(), s);
        }
        for s in ["", "nice", "nice:20", "realtime:0", "rr:10", "nice:x", "slice:99", "slice:100001"] {
            assert!(s.parse::<ThreadPriority>().is_err(), "{s}");
        }
    }

    /// A priority the thread may take (a higher nice value needs no privilege) is applied
    /// before the thread's work starts.
    #[test]
    fn a_spawned_thread_runs_at_its_priority() {
        let t = super::spawn_with_priority("nice".into(), ThreadPriority::Nice(5), || {
            // SAFETY: reads the calling thread's nice value.
            let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
            assert_eq!(n, 5);
        })
        .unwrap();
        t.join().unwrap();
    }

    /// The calling thread's time slice in microseconds, as the kernel reports it.
    fn current_slice_us() -> u64 {
        let mut attr = super::SchedAttr::default();
        // SAFETY: sched_getattr fills at most `size` bytes of `attr` for the calling thread.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut attr as *mut super::SchedAttr,
                std::mem::size_of::<super::SchedAttr>(),
                0,
            )
        };
        assert_eq!(r, 0, "sched_getattr: {}", std::io::Error::last_os_error());
        attr.runtime / 1000
    }

    /// A short slice needs no privilege and keeps the thread's nice value.
    #[test]
    fn a_spawned_thread_gets_its_slice() {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
        if (v.next().unwrap_or(0), v.next().unwrap_or(0)) < (6, 12) {
            eprintln!("SKIPPED: custom time slices need Linux 6.12+, this is {}", release.trim());
            return;
        }
        let t = super::spawn_with_priority("slice".into(), ThreadPriority::Slice(300), || {
            assert_eq!(current_slice_us(), 300);
            // SAFETY: reads the calling thread's nice value.
            let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
            assert_eq!(n, 0);
        })
        .unwrap();
        t.join().unwrap();
    }
}
