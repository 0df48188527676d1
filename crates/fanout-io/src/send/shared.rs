//! `shared` (and a `kernel` session's user-space sinks): payload sharing and batched sends.
//! Unconnected UDP sinks: every offered datagram of the group in one `sendmmsg` run from the
//! group's socket; a connected UDP sink: `send`, or `sendmmsg` for a backlog; a stream sink:
//! everything offered in one vectored `sendmsg`. All straight from the ring's buffers.

use super::layered::{decide_kept, kept_packet, push_kept};
use super::{account_stream, offered, stream_fd, Batch, GroupFds, Sender};
use crate::engine::WorkerCtx;
use crate::layered::Checkpoint;
use crate::packet::Packet;
use crate::sink::{Sink, SinkIo};
use crate::sys;
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

#[derive(Default)]
pub(super) struct SharedSender {
    plan: Vec<Planned>,
}

/// A sink's share of the group's batched send: its index, the packets offered, how many
/// datagrams that makes, and, for a sink that drops layers, its decision state before this
/// batch and where its kept packets start in `WorkerCtx::picked` (its rewritten bytes in
/// `heads`).
struct Planned {
    sink: usize,
    offered: usize,
    datagrams: usize,
    layered: Option<(Checkpoint, usize)>,
    /// Where its packets' departure times start in the batch's, if stamped.
    departs: Option<usize>,
}

impl Sender for SharedSender {
    fn send(&mut self, b: &mut Batch, ctx: &mut WorkerCtx, failed: &mut Vec<(usize, io::Error)>) {
        send_udp_group(&mut self.plan, b, ctx, false, failed);
        send_udp_group(&mut self.plan, b, ctx, true, failed);
        super::send_each(self, b, ctx, failed, |k| matches!(k.io, SinkIo::Unconnected(_)));
    }

    fn send_to(
        &mut self,
        sink: &mut Sink,
        pending: &[Arc<Packet>],
        _: GroupFds,
        ctx: &mut WorkerCtx,
    ) -> io::Result<()> {
        send_own(sink, pending, ctx)
    }
}

/// A connected UDP sink or a stream sink, the sharing way (the `uring` path's streams too).
pub(super) fn send_own(sink: &mut Sink, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<()> {
    match &sink.io {
        SinkIo::Connected(sock) => {
            let n = send_udp_batched(sock.as_raw_fd(), pending, ctx)?;
            sink.sent(pending, n);
            Ok(())
        }
        SinkIo::Stream(_) => send_stream_vectored(sink, pending, ctx),
        // Unconnected sinks go in the group's batch; channel sinks are served alike.
        _ => Ok(()),
    }
}

/// `shared` UDP: one datagram with `send`, a backlog with `sendmmsg`, straight from the ring.
/// Returns how many were sent; stops quietly when the socket is full (the rest stays pending).
pub(super) fn send_udp_batched(fd: RawFd, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<usize> {
    if let [one] = pending {
        return match sys::send(fd, one.data()) {
            Ok(_) => Ok(1),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        };
    }
    let mut sent = 0;
    for chunk in pending.chunks(1024) {
        ctx.iov.clear();
        ctx.iov.extend(chunk.iter().map(|p| sys::iovec(p.data())));
        match sys::send_datagrams(fd, &mut ctx.iov, &mut ctx.hdrs) {
            Ok(n) => {
                sent += n;
                if n < chunk.len() {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if sent == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(sent)
}

/// Sends the offered datagrams of the batch's unconnected sinks of one address family (`v6`)
/// in one `sendmmsg` run (1024 datagrams a call), from that family's socket, in the offers'
/// order, straight from the ring. A sink that drops layers takes part with the packets it
/// keeps, each in two pieces (see [`layered`](super::layered)). A sink whose destination the
/// kernel refuses at once (no route, ...) goes into `refused` with the error, and the rest
/// of its datagrams are skipped (counted as skipped) so the sinks after it still get theirs.
fn send_udp_group(
    plan: &mut Vec<Planned>,
    b: &mut Batch,
    ctx: &mut WorkerCtx,
    v6: bool,
    refused: &mut Vec<(usize, io::Error)>,
) {
    let fd = if v6 { b.fds.v6 } else { b.fds.v4 };
    if fd < 0 {
        return;
    }
    let Batch { sinks, snapshot, start, offers, departs, .. } = b;
    let (snapshot, start) = (*snapshot, *start);
    plan.clear();
    ctx.heads.clear();
    ctx.picked.clear();
    ctx.rebuilt.clear();
    // Decide first (the rewritten bytes must not move once iovecs point at them).
    for o in offers.iter() {
        let (i, sink) = (o.sink, &mut sinks[o.sink]);
        if !matches!(&sink.io, SinkIo::Unconnected(a) if a.is_v6() == v6) || o.count == 0 {
            continue;
        }
        let pending = offered(snapshot, start, sink, o.count);
        let layered = sink.layered();
        match sink.layers.as_deref_mut().filter(|_| layered) {
            None => {
                plan.push(Planned { sink: i, offered: o.count, datagrams: o.count, layered: None, departs: o.departs })
            }
            Some(lay) => {
                let (saved, first) = (lay.checkpoint(), ctx.picked.len());
                decide_kept(lay, pending, ctx);
                plan.push(Planned {
                    sink: i,
                    offered: o.count,
                    datagrams: ctx.picked.len() - first,
                    layered: Some((saved, first)),
                    departs: o.departs,
                });
            }
        }
    }
    ctx.iov.clear();
    for e in plan.iter() {
        let pending = offered(snapshot, start, &sinks[e.sink], e.offered);
        match e.layered {
            None => ctx.iov.extend(pending.iter().map(|p| sys::iovec(p.data()))),
            Some((_, first)) => {
                let kept = first..first + e.datagrams;
                push_kept(
                    &mut ctx.iov,
                    pending,
                    &ctx.heads[kept.clone()],
                    &ctx.picked[kept.clone()],
                    &ctx.rebuilt[kept],
                );
            }
        }
    }
    // Headers point into ctx.iov, which is not touched again until they are sent.
    ctx.hdrs.clear();
    let mut k = 0;
    for e in plan.iter() {
        let SinkIo::Unconnected(addr) = &sinks[e.sink].io else { continue };
        let pieces = if e.layered.is_some() { 2 } else { 1 };
        for _ in 0..e.datagrams {
            ctx.hdrs.push(sys::mmsghdr_n(&mut ctx.iov[k], pieces, Some(addr)));
            k += pieces;
        }
    }
    // Departure times (SO_TXTIME), each datagram its packet's; attached once all are made,
    // so none moves after its header points at it.
    ctx.txtimes.clear();
    for e in plan.iter() {
        let Some(at) = e.departs else { continue };
        for k in 0..e.datagrams {
            // A layered sink's k-th datagram is the packet it kept k-th.
            let packet = e.layered.map_or(k, |(_, first)| ctx.picked[first + k]);
            ctx.txtimes.push(sys::TxtimeCmsg::new(departs[at + packet]));
        }
    }
    if !ctx.txtimes.is_empty() {
        let (mut k, mut t) = (0, 0);
        for e in plan.iter() {
            if e.departs.is_some() {
                for h in &mut ctx.hdrs[k..k + e.datagrams] {
                    ctx.txtimes[t].attach(h);
                    t += 1;
                }
            }
            k += e.datagrams;
        }
    }
    let total = ctx.hdrs.len();
    // Datagrams [0, pos) are done: sent, or skipped for a refused sink (plan entry, first
    // datagram not sent).
    let mut pos = 0;
    let mut skipped: Vec<(usize, usize)> = Vec::new();
    let mut retries = 0;
    while pos < total {
        let r = sys::sendmmsg(fd, &mut ctx.hdrs[pos..]);
        ctx.send_error |= r.is_err();
        match r {
            Ok(0) => break,
            Ok(n) => pos += n,
            // A queued ICMP error (its sink is found through the error queue) stopped the
            // batch; the datagram it stopped at was not sent: go on from there (bounded).
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) && retries < 16 => retries += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) => break,
            Err(e) => {
                // The datagram at `pos` cannot go to its sink at all: skip that sink's rest.
                let mut end = 0;
                let entry = plan.iter().position(|e| {
                    end += e.datagrams;
                    pos < end
                });
                let Some(entry) = entry else { break };
                skipped.push((entry, pos));
                refused.push((plan[entry].sink, e));
                pos = end;
            }
        }
    }
    let refused_before = refused.len();
    let mut first_datagram = 0;
    for (entry, e) in plan.iter().enumerate() {
        let stop = skipped.iter().find(|&&(x, _)| x == entry).map_or(pos, |&(_, at)| at);
        let done = stop.clamp(first_datagram, first_datagram + e.datagrams) - first_datagram;
        first_datagram += e.datagrams;
        let sink = &mut sinks[e.sink];
        let pending = offered(snapshot, start, sink, e.offered);
        let consumed = match e.layered {
            None => {
                sink.bytes += pending[..done].iter().map(|p| p.len() as u64).sum::<u64>();
                done
            }
            Some((saved, first)) => {
                let kept = &ctx.picked[first..first + e.datagrams];
                let rebuilt = &ctx.rebuilt[first..first + e.datagrams];
                sink.bytes += (0..done).map(|k| kept_packet(pending, kept, rebuilt, k).len() as u64).sum::<u64>();
                if done == e.datagrams {
                    e.offered
                } else {
                    // Consumed up to its first unsent packet: decide the rest again later.
                    sink.layers.as_deref_mut().expect("a layered sink").replay(saved, &pending[..kept[done]]);
                    kept[done]
                }
            }
        };
        sink.due.cursor.advance(consumed as u64);
    }
    // A refused sink (kept under `retry`): what it could not be sent counts as skipped.
    let head = start + snapshot.len() as u64;
    for (i, _) in &refused[refused_before..] {
        sinks[*i].due.cursor.catch_up(head);
    }
}

/// `shared` stream: everything pending (and the rest of a partial packet) in one `sendmsg`.
fn send_stream_vectored(sink: &mut Sink, pending: &[Arc<Packet>], ctx: &mut WorkerCtx) -> io::Result<()> {
    let fd = stream_fd(sink);
    let max = libc::UIO_MAXIOV as usize;
    ctx.iov.clear();
    if let Some((p, off)) = &sink.partial {
        ctx.iov.push(sys::iovec(&sink.bytes_of(p)[*off..]));
    }
    ctx.iov.extend(sink.unit_rest.iter().take(max / 2).map(|p| sys::iovec(sink.bytes_of(p))));
    // (The unit's rest first, whole, before anything of the ring.)
    let room = if sink.unit_rest.len() > max / 2 { 0 } else { max - ctx.iov.len() };
    let pending = &pending[..pending.len().min(room)];
    ctx.iov.extend(pending.iter().map(|p| sys::iovec(sink.bytes_of(p))));
    let offered: usize = ctx.iov.iter().map(|v| v.iov_len).sum();
    if offered == 0 {
        sink.due.cursor.advance(pending.len() as u64);
        return Ok(());
    }
    match sys::send_vectored(fd, &ctx.iov) {
        Ok(w) => {
            if !account_stream(sink, pending, w, offered) {
                sink.blocked = true;
            }
            Ok(())
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            sink.blocked = true;
            Ok(())
        }
        Err(e) => Err(e),
    }
}
