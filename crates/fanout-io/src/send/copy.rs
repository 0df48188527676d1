//! The baselines (`daemon`, `copy`): each packet copied into user space, then one `sendto`
//! or `send` per packet per sink.

use super::{account_stream, stream_fd, GroupFds, Sender};
use crate::engine::WorkerCtx;
use crate::packet::Packet;
use crate::sink::{Sink, SinkIo};
use crate::sys::{self, RawAddr};
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

pub(super) struct CopySender;

impl Sender for CopySender {
    fn send_to(
        &mut self,
        sink: &mut Sink,
        pending: &[Arc<Packet>],
        fds: GroupFds,
        ctx: &mut WorkerCtx,
    ) -> io::Result<()> {
        let n = match &sink.io {
            SinkIo::Unconnected(addr) => send_udp_copy(fds.for_addr(addr), addr, pending, ctx)?,
            SinkIo::Connected(sock) => super::shared::send_udp_batched(sock.as_raw_fd(), pending, ctx)?,
            SinkIo::Stream(_) => return send_stream_copy(sink, pending, ctx),
            SinkIo::Channel(_) | SinkIo::Closed => 0,
        };
        sink.sent(pending, n);
        Ok(())
    }
}

/// The baselines' UDP: copy each payload into user space, then one `sendto` per packet.
fn send_udp_copy(fd: RawFd, to: &RawAddr, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<usize> {
    for (i, p) in pending.iter().enumerate() {
        let n = p.len();
        ctx.copy[..n].copy_from_slice(p.data());
        let mut r = sys::send_to(fd, &ctx.copy[..n], to);
        ctx.send_error |= r.is_err();
        if matches!(&r, Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED)) {
            // A pending ICMP error of the shared socket (any sink's) surfaced here; the
            // error queue says whose. This packet was not sent: send it again.
            r = sys::send_to(fd, &ctx.copy[..n], to);
        }
        match r {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(i),
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => return Ok(i),
            Err(e) => return Err(e),
        }
    }
    Ok(pending.len())
}

/// The baselines' stream: copy each packet into user space, one `send` per packet; what the
/// sink owes (the rest of a packet or of a unit it began) first.
fn send_stream_copy(sink: &mut Sink, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<()> {
    let fd = stream_fd(sink);
    let mut i = 0;
    loop {
        let owed = match (&sink.partial, sink.unit_rest.front()) {
            (Some((p, off)), _) => Some((p.clone(), *off)),
            (None, Some(p)) => Some((p.clone(), 0)),
            (None, None) => None,
        };
        let (len, rest) = match &owed {
            Some((p, off)) => {
                let b = &sink.bytes_of(p)[*off..];
                ctx.copy[..b.len()].copy_from_slice(b);
                (b.len(), &[][..])
            }
            None if i < pending.len() => {
                let b = sink.bytes_of(&pending[i]);
                ctx.copy[..b.len()].copy_from_slice(b);
                (b.len(), &pending[i..])
            }
            None => return Ok(()),
        };
        let before = sink.due.cursor.next();
        match sys::send(fd, &ctx.copy[..len]) {
            Ok(w) => {
                let whole = account_stream(sink, rest, w, len);
                i += (sink.due.cursor.next() - before) as usize;
                if !whole {
                    sink.blocked = true;
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                sink.blocked = true;
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
}
