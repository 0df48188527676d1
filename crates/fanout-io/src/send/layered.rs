//! What every path sends alike: sinks that drop layers (each kept packet in two pieces, its
//! rewritten first bytes and the rest from the ring, in `sendmmsg` batches), and channel
//! sinks (a queue another task drains).

use super::GroupFds;
use crate::engine::WorkerCtx;
use crate::layered::SinkLayers;
use crate::packet::Packet;
use crate::sink::{Sink, SinkIo};
use crate::sys::{self, RawAddr};
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

/// Serves a layer-dropping or channel sink; `None` for the path's own kinds.
pub(super) fn send_alike(
    sink: &mut Sink,
    pending: &[Arc<Packet>],
    fds: GroupFds,
    ctx: &mut WorkerCtx,
) -> Option<io::Result<()>> {
    if sink.layered() {
        let Sink { layers: Some(lay), io, .. } = sink else { unreachable!("layered") };
        let r = match io {
            SinkIo::Connected(sock) => send_udp_layered(sock.as_raw_fd(), None, lay, pending, ctx),
            SinkIo::Unconnected(addr) => send_udp_layered(fds.for_addr(addr), Some(addr), lay, pending, ctx),
            SinkIo::Channel(q) => Ok(q.push_layered(pending, |p| lay.decide(p).map(|seq| (seq, lay.rebuild(p))))),
            // The control plane gives an allowance to RTP datagram sinks only.
            SinkIo::Stream(_) | SinkIo::Closed => Ok((0, 0)),
        };
        return Some(r.map(|(n, bytes)| {
            sink.bytes += bytes;
            sink.due.cursor.advance(n as u64);
        }));
    }
    if let SinkIo::Channel(q) = &sink.io {
        let n = q.push(pending);
        sink.sent(pending, n);
        return Some(Ok(()));
    }
    None
}

/// UDP to a sink that drops layers: each packet the allowance keeps goes out as two pieces,
/// its first four bytes with the sink's own sequence number (a copy) and the rest straight
/// from the ring, in `sendmmsg` batches (on the `uring` path too: the rewritten bytes must
/// outlive the call, which a batch gives for free). Returns the packets consumed (sent or
/// dropped) and the bytes sent. When the socket takes only part of a batch, the decisions
/// are replayed up to the first unsent packet, which is decided again next time.
fn send_udp_layered(
    fd: RawFd,
    to: Option<&RawAddr>,
    lay: &mut SinkLayers,
    pending: &[Arc<Packet>],
    ctx: &mut WorkerCtx,
) -> io::Result<(usize, u64)> {
    const BATCH: usize = 512;
    let saved = lay.checkpoint();
    let (mut consumed, mut bytes) = (0, 0u64);
    for chunk in pending.chunks(BATCH) {
        // Decide first, so `ctx.heads` is complete (and never moves) before iovecs point in.
        ctx.heads.clear();
        ctx.picked.clear();
        ctx.rebuilt.clear();
        decide_kept(lay, chunk, ctx);
        ctx.iov.clear();
        push_kept(&mut ctx.iov, chunk, &ctx.heads, &ctx.picked, &ctx.rebuilt);
        ctx.hdrs.clear();
        for k in 0..ctx.picked.len() {
            ctx.hdrs.push(sys::mmsghdr_n(&mut ctx.iov[2 * k], 2, to));
        }
        let (mut sent, mut failure, mut retries) = (0, None, 0);
        while sent < ctx.hdrs.len() {
            let r = sys::sendmmsg(fd, &mut ctx.hdrs[sent..]);
            ctx.send_error |= to.is_some() && r.is_err();
            match r {
                Ok(0) => break,
                Ok(n) => sent += n,
                // The group socket's queued ICMP error, another sink's (as in send_udp_group).
                Err(e) if to.is_some() && e.raw_os_error() == Some(libc::ECONNREFUSED) && retries < 16 => retries += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) => break,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        bytes += (0..sent).map(|k| kept_packet(chunk, &ctx.picked, &ctx.rebuilt, k).len() as u64).sum::<u64>();
        if sent == ctx.picked.len() && failure.is_none() {
            consumed += chunk.len();
            continue;
        }
        if let (Some(e), 0, 0) = (failure, sent, consumed) {
            lay.restore(saved);
            return Err(e);
        }
        // Partly sent: consumed up to the first unsent packet; decide the rest again later.
        let upto = consumed + ctx.picked[sent];
        lay.replay(saved, &pending[..upto]);
        return Ok((upto, bytes));
    }
    Ok((consumed, bytes))
}

/// Decides `pending` for a layer-dropping sink: for each packet it keeps, the first four
/// bytes it goes out with (its own sequence number) into `heads` and its index into `picked`.
pub(super) fn decide_kept(lay: &mut SinkLayers, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) {
    for (i, p) in pending.iter().enumerate() {
        if let Some(seq) = lay.decide(p) {
            let d = p.data();
            ctx.heads.push(if p.is_rtp() { [d[0], d[1], (seq >> 8) as u8, seq as u8] } else { [0; 4] });
            ctx.picked.push(i);
            ctx.rebuilt.push(lay.rebuild(p));
        }
    }
}

/// The `k`th kept packet: rebuilt for the sink, or the ring's.
pub(super) fn kept_packet<'a>(
    pending: &'a [Arc<Packet>],
    picked: &[usize],
    rebuilt: &'a [Option<Arc<Packet>>],
    k: usize,
) -> &'a Packet {
    rebuilt[k].as_deref().unwrap_or(&pending[picked[k]])
}

/// Two iovecs per kept packet: its rewritten first four bytes and the rest (from the ring,
/// or from its rebuilt aggregate); a packet without an RTP header whole, and an empty piece.
pub(super) fn push_kept(
    iov: &mut Vec<libc::iovec>,
    pending: &[Arc<Packet>],
    heads: &[[u8; 4]],
    picked: &[usize],
    rebuilt: &[Option<Arc<Packet>>],
) {
    for (k, head) in heads.iter().enumerate() {
        let p = kept_packet(pending, picked, rebuilt, k);
        let d = p.data();
        if p.is_rtp() {
            iov.push(sys::iovec(head));
            iov.push(sys::iovec(&d[4..]));
        } else {
            iov.push(sys::iovec(d));
            iov.push(sys::iovec(&[]));
        }
    }
}
