//! `uring`: one `IORING_OP_SEND` per packet per UDP sink on its connected socket, straight
//! from the ring's buffer, all submitted with one call at the end of the run (none with
//! SQPOLL). Stream sinks are written as on `shared`.

use super::{GroupFds, Sender};
use crate::engine::WorkerCtx;
use crate::model::SessionConfig;
use crate::packet::Packet;
use crate::sink::{Sink, SinkIo};
use crate::uring::UringSender;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

pub(super) struct UringPath {
    ring: UringSender,
    /// Failed sends reaped: `(sink id, errno)`.
    reaped: Vec<(u64, i32)>,
}

impl UringPath {
    pub fn new(cfg: &SessionConfig) -> io::Result<Self> {
        Ok(Self { ring: UringSender::new(1024, cfg.uring_sqpoll)?, reaped: Vec::new() })
    }
}

impl Sender for UringPath {
    fn send_to(
        &mut self,
        sink: &mut Sink,
        pending: &[Arc<Packet>],
        _: GroupFds,
        ctx: &mut WorkerCtx,
    ) -> io::Result<()> {
        match &sink.io {
            SinkIo::Connected(sock) => {
                let n = send_udp_uring(&mut self.ring, sock.as_raw_fd(), pending, sink.id)?;
                sink.sent(pending, n);
                Ok(())
            }
            _ => super::shared::send_own(sink, pending, ctx),
        }
    }

    fn reap(&mut self, failed: &mut Vec<(u64, io::Error)>) {
        self.ring.reap(&mut self.reaped);
        failed.extend(self.reaped.drain(..).map(|(id, errno)| (id, io::Error::from_raw_os_error(errno))));
    }

    fn flush(&mut self) -> io::Result<()> {
        self.ring.submit()
    }
}

/// `uring` UDP: queue one send per pending packet; they go to the kernel with the group's
/// single submit. Returns how many were queued.
fn send_udp_uring(u: &mut UringSender, fd: RawFd, pending: &[Arc<Packet>], sink: u64) -> io::Result<usize> {
    for (i, p) in pending.iter().enumerate() {
        if !u.queue(fd, p.data(), p, sink)? {
            return Ok(i);
        }
    }
    Ok(pending.len())
}
