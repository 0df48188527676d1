//! One RTSP connection: requests in, answers and interleaved RTP out (one gathered write
//! of the shared packets).

use super::*;

/// Writes what the connection's interleaved queues and RTCP hold, `$`-framed, with one
/// vectored write of the shared packets: this task is the connection's only writer, so
/// responses never split a frame.
pub(super) async fn flush_interleaved(
    stream: &mut impl RtspIo,
    me: &Conn,
    packets: &mut Vec<fanout_io::channel::Frame>,
    gather: &mut Gather,
) -> std::io::Result<()> {
    gather.clear();
    for (channel, q) in me.queues.lock().iter() {
        q.drain(packets);
        for (p, seq) in packets.drain(..) {
            gather.packet(*channel, p, seq);
        }
    }
    for (channel, rtcp) in me.control.lock().drain(..) {
        gather.owned(channel, &rtcp);
    }
    let size = me.sndbuf.swap(0, std::sync::atomic::Ordering::Relaxed);
    if size > 0 {
        crate::write::size_send_buffer(stream, size);
    }
    gather.write(stream).await
}

/// Interleaved frames gathered for one vectored write: each packet's `$` header (and a
/// layer-dropping client's own sequence number) in `heads`, its bytes where the ring holds
/// them (no copy per client).
#[derive(Default)]
pub(super) struct Gather {
    heads: Vec<u8>,
    packets: Vec<Arc<fanout_io::packet::Packet>>,
    parts: Vec<Part>,
}

/// A piece of a gathered write.
pub(super) enum Part {
    Head(std::ops::Range<usize>),
    Packet(usize, std::ops::Range<usize>),
}

/// The most slices one `writev` takes (Linux's `IOV_MAX`).
pub(super) const IOV_MAX: usize = 1024;

impl Gather {
    pub(super) fn clear(&mut self) {
        self.heads.clear();
        self.packets.clear();
        self.parts.clear();
    }

    pub(super) fn head(&mut self, bytes: &[u8]) {
        let at = self.heads.len();
        self.heads.extend_from_slice(bytes);
        match self.parts.last_mut() {
            // Next to the last head: one slice.
            Some(Part::Head(r)) if r.end == at => r.end += bytes.len(),
            _ => self.parts.push(Part::Head(at..at + bytes.len())),
        }
    }

    /// A packet of the ring on `channel`; with `seq`, the client's own sequence number in
    /// place of the packet's (RTP header bytes 2..4).
    pub(super) fn packet(&mut self, channel: u8, p: Arc<fanout_io::packet::Packet>, seq: Option<u16>) {
        let len = p.data().len();
        let Ok(len16) = u16::try_from(len) else { return };
        let mut head = [b'$', channel, 0, 0];
        head[2..].copy_from_slice(&len16.to_be_bytes());
        self.head(&head);
        let k = self.packets.len();
        match seq.filter(|_| len >= 4) {
            Some(seq) => {
                self.parts.push(Part::Packet(k, 0..2));
                self.head(&seq.to_be_bytes());
                self.parts.push(Part::Packet(k, 4..len));
            }
            None => self.parts.push(Part::Packet(k, 0..len)),
        }
        self.packets.push(p);
    }

    /// A frame of bytes of its own (RTCP).
    pub(super) fn owned(&mut self, channel: u8, data: &[u8]) {
        let mut frame = Vec::with_capacity(4 + data.len());
        rtsp::write_interleaved(&mut frame, channel, data);
        self.head(&frame);
    }

    pub(super) async fn write(&self, stream: &mut (impl tokio::io::AsyncWrite + Unpin)) -> std::io::Result<()> {
        use std::io::IoSlice;
        let mut slices: Vec<IoSlice<'_>> = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Head(r) => IoSlice::new(&self.heads[r.clone()]),
                Part::Packet(k, r) => IoSlice::new(&self.packets[*k].data()[r.clone()]),
            })
            .collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = stream.write_vectored(&rest[..rest.len().min(IOV_MAX)]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
    }
}

/// One RTSP connection until it ends: requests answered in order (clients pipeline), a
/// publisher's interleaved media fed, a reader's interleaved media written.
pub(super) async fn connection(
    stream: impl RtspIo,
    secure: bool,
    peer: SocketAddr,
    conn: u64,
    (idle, head_timeout): (Duration, Duration),
    relay: &Arc<Relay>,
    rtsp: &Arc<Rtsp>,
) -> std::io::Result<()> {
    /// Forgets the connection's queues when it ends.
    struct Registered<'a>(&'a Rtsp, u64);
    impl Drop for Registered<'_> {
        fn drop(&mut self) {
            self.0.conns.lock().remove(&self.1);
        }
    }
    let me = Arc::new(Conn { secure, ..Conn::default() });
    rtsp.conns.lock().insert(conn, me.clone());
    let _registered = Registered(rtsp, conn);
    let mut c =
        Connection { stream, secure, peer, conn, relay, rtsp, me, publishing: None, last_touch: Instant::now() };
    c.run(idle, head_timeout).await
}

/// What one connection's task holds.
struct Connection<'a, S> {
    stream: S,
    secure: bool,
    peer: SocketAddr,
    conn: u64,
    relay: &'a Arc<Relay>,
    rtsp: &'a Arc<Rtsp>,
    me: Arc<Conn>,
    /// The publisher this connection feeds, once it records.
    publishing: Option<Arc<crate::publish::Publisher>>,
    /// When a publisher's media last kept its RTSP session alive.
    last_touch: Instant,
}

impl<S: RtspIo> Connection<'_, S> {
    async fn run(&mut self, idle: Duration, head_timeout: Duration) -> std::io::Result<()> {
        let limits = Limits::default();
        let mut buf: Vec<u8> = Vec::with_capacity(4096);
        let mut chunk = [0u8; 4096];
        let (mut packets, mut gather) = (Vec::new(), Gather::default());
        // When the first byte of a message still incomplete arrived: it must end within
        // `head_timeout`, so that a trickle of bytes cannot hold a connection (slowloris).
        let mut partial_since: Option<Instant> = None;
        loop {
            // A TLS ClientHello is no RTSP message (and would wait for a line end).
            if crate::tls::looks_like_tls(&buf) {
                tracing::warn!(peer = %self.peer, "a TLS client on the plain RTSP port (RTSPS has its own): closed");
                return Ok(());
            }
            // Every complete message in the buffer, in order.
            loop {
                match rtsp::parse(&buf, &limits) {
                    Ok(Some((msg, used))) => {
                        buf.drain(..used);
                        match msg {
                            Message::Request(req) => self.on_request(req).await?,
                            Message::Interleaved { channel, mut data } => self.on_interleaved(channel, &mut data),
                            Message::Response(_) => {}
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let mut out = Vec::new();
                        Response::new(e.status(), None).write(&mut out);
                        self.stream.write_all(&out).await?;
                        return Ok(());
                    }
                }
            }
            partial_since = if buf.is_empty() { None } else { partial_since.or(Some(Instant::now())) };
            // A connection that carries interleaved RTP is never idle.
            let idle = if self.me.queues.lock().is_empty() { idle } else { Duration::MAX / 4 };
            let wait = match partial_since {
                Some(t) => idle.min(head_timeout.saturating_sub(t.elapsed())),
                None => idle,
            };
            tokio::select! {
                // (No timer where the connection is never idle: one per wake was a good part
                // of an interleaved client's cost.)
                r = async {
                    match wait >= Duration::MAX / 8 {
                        true => Ok(self.stream.read(&mut chunk).await),
                        false => tokio::time::timeout(wait, self.stream.read(&mut chunk)).await,
                    }
                } => {
                    let n = match r {
                        Ok(r) => r?,
                        Err(_) if partial_since.is_some_and(|t| t.elapsed() >= head_timeout) => {
                            tracing::info!(peer = %self.peer, "RTSP request incomplete after {head_timeout:?}: closed");
                            let mut out = Vec::new();
                            Response::new(408, None).write(&mut out);
                            let _ = tokio::time::timeout(Duration::from_secs(1), self.stream.write_all(&out)).await;
                            return Ok(());
                        }
                        Err(_) => return Ok(()),
                    };
                    if n == 0 {
                        return Ok(());
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                _ = self.me.notify.notified() => {
                    if self.on_wake(&mut packets, &mut gather).await? {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn send(&mut self, resp: Response) -> std::io::Result<()> {
        self.stream.write_all(&answer(resp)).await
    }

    /// A publisher's media, or a client's RTCP on a channel it set up; anything else is
    /// ignored.
    fn on_interleaved(&mut self, channel: u8, data: &mut [u8]) {
        let (conn, rtsp) = (self.conn, self.rtsp);
        match self.publishing.as_ref().filter(|p| p.is_publishing_on(conn)) {
            Some(p) => {
                p.feed(conn, channel, data);
                // Its media keeps its RTSP session alive (publishers send no keep-alive
                // requests), checked once a second.
                if self.last_touch.elapsed() >= Duration::from_secs(1) {
                    self.last_touch = Instant::now();
                    if let Some(id) = p.rtsp_session() {
                        rtsp.server.lock().touch(&id, rtsp.now_ms());
                    }
                }
            }
            None => {
                self.publishing = self.relay.publishers().into_iter().find(|p| p.is_publishing_on(conn));
                match &self.publishing {
                    Some(p) => p.feed(conn, channel, data),
                    None => rtsp.rtcp_on_conn(self.relay, conn, channel, data),
                }
            }
        }
    }

    /// A request: refused before the server sees it, or answered by the server once what it
    /// names is there, and the server's actions applied.
    async fn on_request(&mut self, req: rtsp::Request) -> std::io::Result<()> {
        if let Some(refused) = self.refusal(&req).await {
            return self.send(refused).await;
        }
        self.await_media(&req).await;
        if let Some(full) = self.full(&req) {
            return self.send(full).await;
        }
        let (resp, actions) = self.handle(&req);
        self.rtsp.apply(self.relay, self.peer.ip(), actions);
        failed_login(self.relay, &req, &resp, self.peer.ip());
        self.send(resp).await
    }

    /// Why a request is refused before the server sees it: an address banned for guessing,
    /// `[auth]`'s no (asked first: the server then checks no users), or credentials wrong
    /// for a request that could set a pull, a pattern's command or a publisher's path off.
    async fn refusal(&mut self, req: &rtsp::Request) -> Option<Response> {
        let (relay, ip) = (self.relay, self.peer.ip());
        if relay.books.login_banned(ip) {
            return Some(Response::new(403, req.headers.cseq()));
        }
        if let Some(refused) = external_auth(relay, req, ip, self.secure).await {
            return Some(refused);
        }
        if req.method == "DESCRIBE" || req.method == "ANNOUNCE" {
            let refused = self.rtsp.server.lock().challenge(req, self.conn, self.rtsp.now_ms());
            if let Some(resp) = refused {
                failed_login(relay, req, &resp, ip);
                return Some(resp);
            }
        }
        if req.method == "ANNOUNCE" {
            if let Some((name, _)) = fanout_proto::rtsp::server::split_url(&req.uri) {
                relay.ensure_publishable(name).await;
            }
        }
        if req.method == "DESCRIBE" {
            return self.describe_refusal(req).await;
        }
        None
    }

    /// A DESCRIBE of a name this node does not have: a cluster node at its cap sends new
    /// players elsewhere (302; not other nodes' pulls: the tree's own links are not
    /// subscribers); else the path is pulled from the cluster or made by a `[[pattern]]`,
    /// and where that fails for another reason than "nowhere", the client learns why. (A
    /// name found nowhere is the RTSP server's own 404.)
    async fn describe_refusal(&mut self, req: &rtsp::Request) -> Option<Response> {
        let relay = self.relay;
        let name = fanout_proto::rtsp::server::split_url(&req.uri).map(|(n, _)| n.to_string())?;
        let puller = req.headers.get("User-Agent").is_some_and(|a| a.starts_with("fanout/"));
        let to = match &relay.cluster {
            Some(c) if !puller => c.redirect(&name).await,
            _ => None,
        };
        if let Some(to) = to {
            tracing::info!(peer = %self.peer, uri = %req.uri, %to, "at the subscriber cap: redirected");
            let mut resp = Response::new(302, req.headers.cseq());
            resp.headers.set("Location", to);
            return Some(resp);
        }
        if let (None, Some(path)) = (&relay.cluster, relay.path(&name)) {
            // (An on-demand pull is woken, and waited for.)
            if let Some(p) = path.publisher().cloned() {
                p.demand(std::time::Duration::from_secs(10)).await;
            }
            return None;
        }
        match relay.ensure(&name).await {
            Err(e) if !matches!(e, crate::relay::RelayError::NotFound(_)) => {
                tracing::warn!(peer = %self.peer, uri = %req.uri, "DESCRIBE answered {}: {e}", e.rtsp_status());
                Some(error_answer(&e, req))
            }
            _ => None,
        }
    }

    /// A path at its `max_readers` takes no new reader: 453 Not Enough Bandwidth.
    fn full(&self, req: &rtsp::Request) -> Option<Response> {
        if req.method != "DESCRIBE" {
            return None;
        }
        let path = fanout_proto::rtsp::server::split_url(&req.uri).and_then(|(n, _)| self.relay.path(n))?;
        if !path.readers.full() {
            return None;
        }
        let e = crate::relay::RelayError::Full(format!("{} has its max_readers", path.name));
        tracing::warn!(peer = %self.peer, uri = %req.uri, "DESCRIBE refused: {e}");
        Some(error_answer(&e, req))
    }

    /// Before the server answers DESCRIBE, SETUP or PLAY: an RTSP upstream connects (on
    /// demand), and at PLAY a fresh track gets a moment for its first packet so RTP-Info can
    /// name it: the SRTP key epochs an RTSPS client's description gave it (a new epoch's ring
    /// fills from the track's last keyframe), a view's tracks (the demo's, just started). An
    /// upstream's tracks plan their first numbers: a wait there would lose the client packets.
    async fn await_media(&self, req: &rtsp::Request) {
        if !matches!(req.method.as_str(), "DESCRIBE" | "SETUP" | "PLAY") {
            return;
        }
        let path = fanout_proto::rtsp::server::split_url(&req.uri).and_then(|(n, _)| self.relay.path(n));
        if let Some(up) = path.as_ref().and_then(|p| p.upstream().cloned()) {
            up.demand(UPSTREAM_WAIT).await;
        }
        if req.method != "PLAY" {
            return;
        }
        if self.secure && self.rtsp.srtp.is_some() {
            let epochs: Vec<_> = self.me.keys.lock().values().cloned().collect();
            let sessions = epochs.iter().filter(|e| e.running()).map(|e| e.session.clone()).collect();
            first_packets(sessions).await;
        }
        if let Some(view) = path.as_ref().and_then(|p| p.view().cloned()) {
            first_packets(view.tracks.iter().map(|t| t.session.clone()).collect()).await;
        }
    }

    /// The server's answer and actions; an RTSPS client's description carries its SRTP key
    /// epochs' keys, and its RTP-Info where those epochs will place it.
    fn handle(&self, req: &rtsp::Request) -> (Response, Vec<Action>) {
        let (relay, rtsp, conn) = (self.relay, self.rtsp, self.conn);
        let srtp = self.secure && rtsp.srtp.is_some();
        let method = req.method.as_str();
        // Why no key could be given, for a 503 instead of the 404.
        let unkeyed = std::cell::Cell::new(None);
        let lookup = |name: &str| match relay.path(name).and_then(|p| p.describe()) {
            Some(res) if srtp && method == "DESCRIBE" && !res.publishable => {
                rtsp.keyed(relay, conn, name, res).unwrap_or_else(|e| {
                    unkeyed.set(Some(e));
                    None
                })
            }
            Some(res) if srtp && method == "PLAY" && !res.publishable => {
                Some(rtsp.epoch_numbers(relay, conn, name, res))
            }
            other => other,
        };
        let (mut resp, actions) = rtsp.server.lock().handle(req, conn, rtsp.now_ms(), &lookup);
        if let Some(e) = unkeyed.take().filter(|_| resp.status == 404) {
            resp = Response::new(503, req.headers.cseq());
            resp.headers.set("Retry-After", "2");
            resp.headers.set("Content-Type", "text/plain");
            resp.body = format!("no SRTP key now: {e}").into_bytes();
        }
        (resp, actions)
    }

    /// The connection's queues or state changed: `true` where it ends (its publisher taken
    /// over; its stream ended, told by its BYEs first), else what its queues hold is written.
    async fn on_wake(
        &mut self,
        packets: &mut Vec<fanout_io::channel::Frame>,
        gather: &mut Gather,
    ) -> std::io::Result<bool> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.me.displaced.load(Relaxed) {
            tracing::info!(peer = %self.peer, "RTSP publisher taken over by a new one: closed");
            return Ok(true);
        }
        if self.me.ended.load(Relaxed) {
            let mut frames = Vec::new();
            for (channel, rtcp) in self.me.control.lock().drain(..) {
                rtsp::write_interleaved(&mut frames, channel, &rtcp);
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), self.stream.write_all(&frames)).await;
            tracing::info!(peer = %self.peer, "RTSP connection closed: its stream ended");
            return Ok(true);
        }
        // The engine fills the queues once per `stream_flush_ms` (as it writes HTTP TS
        // subscribers), and wakes this task once until it drained them.
        flush_interleaved(&mut self.stream, &self.me, packets, gather).await?;
        Ok(false)
    }
}

/// A relay error as an RTSP answer: its status, its reason as the body.
fn error_answer(e: &crate::relay::RelayError, req: &rtsp::Request) -> Response {
    let mut resp = Response::new(e.rtsp_status(), req.headers.cseq());
    resp.body = e.to_string().into_bytes();
    resp.headers.set("Content-Type", "text/plain");
    resp
}

/// Waits until each session has had its first packet, `FIRST_PACKET_WAIT` at most.
async fn first_packets(sessions: Vec<fanout_io::Session>) {
    let t0 = Instant::now();
    while sessions.iter().any(|s| s.rtp_start().is_none()) && t0.elapsed() < FIRST_PACKET_WAIT {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{Gather, IOV_MAX};
    use fanout_io::packet::Packet;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    /// A writer that takes at most `most` bytes a call, as a full socket buffer would.
    struct Trickle {
        got: Vec<u8>,
        most: usize,
        calls: usize,
    }

    impl tokio::io::AsyncWrite for Trickle {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
            let n = b.len().min(self.most);
            self.got.extend_from_slice(&b[..n]);
            self.calls += 1;
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            assert!(bufs.len() <= IOV_MAX, "{} slices in one writev", bufs.len());
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.most - n);
                self.got.extend_from_slice(&b[..take]);
                n += take;
                if n == self.most {
                    break;
                }
            }
            self.calls += 1;
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn rtp(seq: u16, len: usize) -> Arc<Packet> {
        let mut p = Packet::with_capacity(len);
        let b = p.buf_mut();
        b[0] = 0x80;
        b[2..4].copy_from_slice(&seq.to_be_bytes());
        for (k, x) in b[12..len].iter_mut().enumerate() {
            *x = k as u8;
        }
        p.set_len(len, 12);
        Arc::new(p)
    }

    /// What is gathered goes out byte for byte as the frames one by one would, a client's
    /// own sequence numbers in place, however little each write takes and however many
    /// packets (more slices than one writev may carry).
    #[test]
    fn gathered_frames_are_the_frames_written_one_by_one() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for (packets, most) in [(3usize, 1usize), (700, 1500), (2000, 100_000)] {
            let mut g = Gather::default();
            let mut want = Vec::new();
            for k in 0..packets {
                let p = rtp(k as u16, 20 + k % 1300);
                let own = (k % 3 == 0).then_some(9000 + k as u16);
                let mut data = p.data().to_vec();
                if let Some(seq) = own {
                    data[2..4].copy_from_slice(&seq.to_be_bytes());
                }
                fanout_proto::rtsp::write_interleaved(&mut want, (k % 2 * 2) as u8, &data);
                g.packet((k % 2 * 2) as u8, p, own);
                if k % 50 == 0 {
                    fanout_proto::rtsp::write_interleaved(&mut want, 1, b"rtcp");
                    g.owned(1, b"rtcp");
                }
            }
            let mut w = Trickle { got: Vec::new(), most, calls: 0 };
            rt.block_on(g.write(&mut w)).unwrap();
            assert!(w.got == want, "{packets} packets, {most} bytes a write");
            if most == 100_000 {
                assert!(w.calls < packets / 100, "{} writes for {packets} packets", w.calls);
            }
        }
    }
}
