//! The `uring` data path's sender (Yau & Lam's shared kernel/user rings, on today's Linux):
//! a sink group queues one `IORING_OP_SEND` per packet per sink on the sink's connected
//! socket, straight from the ring's buffer, and submits them all with one system call (none
//! with SQPOLL, whose kernel thread picks them up; its need-wakeup flag is the paper's
//! "eager flag"). A packet stays referenced until its completion is reaped.

use crate::packet::Packet;
use io_uring::{opcode, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock};

/// SQPOLL idle time: the kernel thread sleeps after this long without work.
const SQPOLL_IDLE_MS: u32 = 10;

/// One SQPOLL kernel thread for the whole process: every group's ring attaches to this one's
/// work queue (IORING_SETUP_ATTACH_WQ) instead of starting a polling thread of its own.
fn sqpoll_anchor() -> io::Result<RawFd> {
    static ANCHOR: OnceLock<Result<IoUring, String>> = OnceLock::new();
    let r = ANCHOR.get_or_init(|| IoUring::builder().setup_sqpoll(SQPOLL_IDLE_MS).build(8).map_err(|e| e.to_string()));
    match r {
        Ok(ring) => Ok(ring.as_raw_fd()),
        Err(e) => Err(io::Error::other(format!("io_uring SQPOLL: {e}"))),
    }
}

pub(crate) struct UringSender {
    ring: IoUring,
    /// Packets the kernel may still read, by slot (the SQE's user data), with their sink.
    inflight: Vec<Option<(Arc<Packet>, u64)>>,
    free: Vec<u32>,
    /// Completions the ring can hold: never have more sends in flight than that.
    max_inflight: usize,
    queued: usize,
}

impl UringSender {
    pub fn new(entries: u32, sqpoll: bool) -> io::Result<Self> {
        let mut b = IoUring::builder();
        if sqpoll {
            b.setup_sqpoll(SQPOLL_IDLE_MS).setup_attach_wq(sqpoll_anchor()?);
        }
        let ring = b.build(entries)?;
        let max_inflight = ring.params().cq_entries() as usize;
        Ok(Self { ring, inflight: Vec::new(), free: Vec::new(), max_inflight, queued: 0 })
    }

    fn in_flight(&self) -> usize {
        self.inflight.len() - self.free.len()
    }

    /// Takes every completion: releases its packet; failed sends are reported as
    /// `(sink id, errno)`.
    pub fn reap(&mut self, failed: &mut Vec<(u64, i32)>) {
        for cqe in self.ring.completion() {
            let slot = cqe.user_data() as usize;
            if let Some((_, sink)) = self.inflight.get_mut(slot).and_then(Option::take) {
                self.free.push(slot as u32);
                if cqe.result() < 0 {
                    failed.push((sink, -cqe.result()));
                }
            }
        }
    }

    /// Queues a send of `p` on connected socket `fd`. Returns `false` when no more can be
    /// queued now (the packet stays pending for the next run).
    pub fn queue(&mut self, fd: RawFd, data: &[u8], p: &Arc<Packet>, sink: u64) -> io::Result<bool> {
        if self.in_flight() >= self.max_inflight {
            return Ok(false);
        }
        let slot = match self.free.pop() {
            Some(s) => s as usize,
            None => {
                self.inflight.push(None);
                self.inflight.len() - 1
            }
        };
        let sqe = opcode::Send::new(types::Fd(fd), data.as_ptr(), data.len() as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(slot as u64);
        // SAFETY: the buffer belongs to `p`, which is kept in `inflight` until the completion
        // is reaped, so it outlives the kernel's use of it.
        if unsafe { self.ring.submission().push(&sqe) }.is_err() {
            // Submission queue full: hand what is queued to the kernel and try once more.
            self.ring.submit()?;
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                self.free.push(slot as u32);
                return Ok(false);
            }
        }
        self.inflight[slot] = Some((p.clone(), sink));
        self.queued += 1;
        Ok(true)
    }

    /// Hands everything queued to the kernel (with SQPOLL: only wakes its thread if asleep).
    pub fn submit(&mut self) -> io::Result<()> {
        if self.queued > 0 {
            self.queued = 0;
            self.ring.submit()?;
        }
        Ok(())
    }
}

/// The `uring` path's source receive: one multishot `recv` stays armed on the socket and
/// the kernel picks a buffer from a ring of provided buffers for each datagram, so a run
/// of the source task reaps completions without a system call (the reactor watches the
/// ring's fd); the datagram is copied into a pool buffer and its provided buffer recycled.
pub(crate) struct UringReceiver {
    ring: IoUring,
    sock: RawFd,
    /// The provided-buffer ring (shared with the kernel; mmap'd, page aligned).
    br: *mut types::BufRingEntry,
    br_len: usize,
    bufs: Box<[u8]>,
    buf_size: usize,
    entries: u16,
    tail: u16,
    armed: bool,
    /// Completions taken from the queue this call: (result, flags).
    cqes: Vec<(i32, u32)>,
}

// SAFETY: the raw pointer is to memory this value owns; it moves between worker threads
// with the value, never shared.
unsafe impl Send for UringReceiver {}

const BUF_GROUP: u16 = 0;

impl UringReceiver {
    /// `entries`: a power of two; `buf_size`: the largest datagram accepted, plus one (a
    /// datagram that fills the buffer was truncated).
    pub fn new(sock: RawFd, entries: u16, buf_size: usize) -> io::Result<Self> {
        assert!(entries.is_power_of_two());
        let ring = IoUring::builder().setup_cqsize(u32::from(entries) * 2).setup_coop_taskrun().build(8)?;
        let br_len = usize::from(entries) * std::mem::size_of::<types::BufRingEntry>();
        // SAFETY: a fresh anonymous mapping; checked below.
        let br = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                br_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_ANONYMOUS | libc::MAP_PRIVATE,
                -1,
                0,
            )
        };
        if br == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut me = Self {
            ring,
            sock,
            br: br.cast(),
            br_len,
            bufs: vec![0u8; usize::from(entries) * buf_size].into_boxed_slice(),
            buf_size,
            entries,
            tail: 0,
            armed: false,
            cqes: Vec::with_capacity(usize::from(entries)),
        };
        // SAFETY: br is page aligned and holds `entries` entries; it outlives the ring's use
        // of it (unregistered with the ring when dropped).
        unsafe { me.ring.submitter().register_buf_ring_with_flags(br as u64, entries, BUF_GROUP, 0)? };
        for bid in 0..entries {
            me.give(bid);
        }
        me.publish_tail();
        me.arm()?;
        Ok(me)
    }

    /// The fd to watch for completions.
    pub fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    fn give(&mut self, bid: u16) {
        let addr = self.bufs.as_ptr() as u64 + u64::from(bid) * self.buf_size as u64;
        // SAFETY: the index is masked into the ring; user space owns entries past the tail.
        let e = unsafe { &mut *self.br.add(usize::from(self.tail & (self.entries - 1))) };
        e.set_addr(addr);
        e.set_len(self.buf_size as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish_tail(&self) {
        // SAFETY: the tail field lives in the first entry; the kernel reads it concurrently.
        unsafe {
            let t = types::BufRingEntry::tail(self.br) as *const std::sync::atomic::AtomicU16;
            (*t).store(self.tail, std::sync::atomic::Ordering::Release);
        }
    }

    fn arm(&mut self) -> io::Result<()> {
        let sqe = opcode::RecvMulti::new(types::Fd(self.sock), BUF_GROUP).build().user_data(1);
        // SAFETY: the SQE refers to no user memory (the buffers are the registered ring's).
        unsafe { self.ring.submission().push(&sqe) }.map_err(|_| io::Error::other("io_uring submission queue full"))?;
        self.ring.submit()?;
        self.armed = true;
        Ok(())
    }

    /// Hands each received datagram (at most `max`) to `f` as `(bytes, truncated)`; returns
    /// how many. Re-arms the receive if the kernel ended it (e.g. out of buffers).
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(&[u8], bool)) -> io::Result<usize> {
        self.cqes.clear();
        self.cqes.extend(self.ring.completion().take(max).map(|c| (c.result(), c.flags())));
        let mut n = 0;
        let mut fault = None;
        for i in 0..self.cqes.len() {
            let (res, flags) = self.cqes[i];
            if !io_uring::cqueue::more(flags) {
                self.armed = false;
            }
            let bid = io_uring::cqueue::buffer_select(flags);
            if res >= 0 {
                if let Some(bid) = bid {
                    let len = res as usize;
                    let off = usize::from(bid) * self.buf_size;
                    f(&self.bufs[off..off + len], len >= self.buf_size);
                    n += 1;
                }
            } else if -res != libc::ENOBUFS {
                fault = Some(io::Error::from_raw_os_error(-res));
            }
            if let Some(bid) = bid {
                self.give(bid);
            }
        }
        self.publish_tail();
        if let Some(e) = fault {
            return Err(e);
        }
        if !self.armed {
            self.arm()?;
        }
        Ok(n)
    }
}

impl Drop for UringReceiver {
    fn drop(&mut self) {
        let _ = self.ring.submitter().unregister_buf_ring(BUF_GROUP);
        // SAFETY: the mapping made in new(), no longer registered with the kernel.
        unsafe { libc::munmap(self.br.cast(), self.br_len) };
    }
}
