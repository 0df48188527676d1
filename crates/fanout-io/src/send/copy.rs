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

/// The baselines' stream: copy each packet into user space, one `send` per packet.
fn send_stream_copy(sink: &mut Sink, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<()> {
    let fd = stream_fd(sink);
    if let Some((p, off)) = sink.partial.clone() {
        let rest = &sink.bytes_of(&p)[off..];
        ctx.copy[..rest.len()].copy_from_slice(rest);
        match sys::send(fd, &ctx.copy[..rest.len()]) {
            Ok(w) => {
                if !account_stream(sink, &[], w, rest.len()) {
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
    for (i, p) in pending.iter().enumerate() {
        let b = sink.bytes_of(p);
        ctx.copy[..b.len()].copy_from_slice(b);
        match sys::send(fd, &ctx.copy[..b.len()]) {
            Ok(w) => {
                if !account_stream(sink, &pending[i..i + 1], w, b.len()) {
                    sink.blocked = true;
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                sink.blocked = true;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
