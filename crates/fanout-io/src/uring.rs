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
