//! The task that owns the WebRTC port: every peer's `Rtc`, fed datagrams and time, and
//! what each returns sent; a hand-over keeps the peers here on sockets of their own.

use super::*;

pub(super) async fn run(
    socket: tokio::net::UdpSocket,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    tcp: Option<Arc<TcpSide>>,
    mut tcp_in: mpsc::Receiver<(SocketAddr, Vec<u8>)>,
    shared: Arc<Shared>,
    wake: Arc<Notify>,
) {
    let (handed_tx, mut handed_in) = mpsc::channel::<(SocketAddr, Vec<u8>)>(1024);
    let mut port = Port {
        local: socket.local_addr().expect("bound"),
        socket: Some(socket),
        handed: HashMap::new(),
        handed_tx,
        tcp,
        shared,
        viewers: HashMap::new(),
        by_addr: HashMap::new(),
        frames: Vec::new(),
        busy: Vec::new(),
        tick: Instant::now(),
        keyframe_wanted: false,
        batch: Vec::new(),
        gso: fanout_io::gso::GsoSender::new(),
    };
    let mut buf = vec![0u8; 2048];
    loop {
        port.round().await;
        let next = port.next_wake();
        tokio::select! {
            got = recv_from(port.socket.as_ref(), &mut buf) => {
                if let Ok((n, from)) = got {
                    port.receive(Protocol::Udp, from, &buf[..n]);
                }
            }
            Some((from, data)) = handed_in.recv() => port.receive(Protocol::Udp, from, &data),
            Some((from, data)) = tcp_in.recv() => port.receive(Protocol::Tcp, from, &data),
            cmd = cmds.recv() => match cmd {
                Some(Cmd::Add(v)) => {
                    port.busy.push(v.id.clone());
                    port.viewers.insert(v.id.clone(), *v);
                }
                Some(Cmd::Remove(id, done)) => {
                    port.remove(&id);
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                }
                Some(Cmd::HandOver) => port.hand_over(),
                None => return,
            },
            _ = wake.notified() => port.pump(),
            _ = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

/// The WebRTC port's task's state: every peer, and what is to be sent.
struct Port {
    local: SocketAddr,
    /// The port; after a hand-over none, a connected socket per peer instead (`handed`).
    socket: Option<tokio::net::UdpSocket>,
    handed: HashMap<SocketAddr, Handed>,
    handed_tx: mpsc::Sender<(SocketAddr, Vec<u8>)>,
    tcp: Option<Arc<TcpSide>>,
    shared: Arc<Shared>,
    viewers: HashMap<String, Viewer>,
    by_addr: HashMap<SocketAddr, String>,
    frames: Vec<Frame>,
    /// The peers with something to do (input, media, their time): only they are polled.
    busy: Vec<String>,
    /// When the status was last written.
    tick: Instant,
    /// A viewer asked for a keyframe in this round (its path's WHIP publisher is asked).
    keyframe_wanted: bool,
    /// Every datagram the polled peers want sent, sent together after them (`flush`).
    batch: Vec<(SocketAddr, Vec<u8>)>,
    gso: fanout_io::gso::GsoSender,
}

impl Port {
    /// Polls the peers whose time came or that had something, sends what they want sent,
    /// asks WHIP publishers for keyframes, and twice a second writes the status.
    async fn round(&mut self) {
        let now = Instant::now();
        for (id, v) in self.viewers.iter_mut().filter(|(_, v)| now >= v.wake_at) {
            let _ = v.rtc.handle_input(Input::Timeout(now));
            self.busy.push(id.clone());
        }
        self.busy.sort_unstable();
        self.busy.dedup();
        let mut gone = Vec::new();
        // A viewer that just connected shows as playing at once, not at the next tick.
        let mut connected = false;
        for id in std::mem::take(&mut self.busy) {
            if let Some(v) = self.viewers.get_mut(&id) {
                let was = v.connected;
                if !drive(v, self.tcp.as_deref(), &mut self.batch, &mut self.keyframe_wanted) {
                    gone.push(id);
                }
                connected |= v.connected && !was;
            }
        }
        match &self.socket {
            Some(socket) => flush(socket, &mut self.gso, &mut self.batch).await,
            None => flush_handed(&self.handed, &mut self.batch).await,
        }
        // Readers that want a keyframe (WebRTC viewers, RTSP clients) mark their track's
        // session; a WHIP publisher takes the mark and is asked, at most once per
        // KEYFRAME_GAP (a mark inside the gap waits for its end). An RTSP upstream is asked by
        // its own task, an RTSP publisher by the RTSP server's; RTMP and SRT publishers
        // cannot be (a viewer then waits for the source's next keyframe; NACK repairs most
        // loss before it comes to that).
        // (Looked at when a viewer asked, and with the status for RTSP clients' asks.)
        if std::mem::take(&mut self.keyframe_wanted) || self.tick.elapsed() >= STATUS_EVERY {
            for v in self.viewers.values_mut().filter(|v| v.publish.is_some()) {
                ask_keyframe(v, KEYFRAME_GAP, true);
                publish_rates(v);
            }
        }
        if connected || self.tick.elapsed() >= STATUS_EVERY {
            self.tick = Instant::now();
            self.status(&mut gone);
        }
        for id in gone {
            self.remove(&id);
        }
        if self.socket.is_none() {
            let by_addr = &self.by_addr;
            self.handed.retain(|addr, _| by_addr.contains_key(addr));
        }
    }

    /// When the task must run again by itself: a peer's time, or the status's.
    fn next_wake(&self) -> Instant {
        let next = self.viewers.values().map(|v| v.wake_at).min().unwrap_or_else(|| Instant::now() + STATUS_EVERY);
        next.min(self.tick + STATUS_EVERY)
    }

    /// Twice a second: simulcast viewers' encodings, peers that never connected (into
    /// `gone`), and the status the API shows.
    fn status(&mut self, gone: &mut Vec<String>) {
        for v in self.viewers.values_mut().filter(|v| v.connected) {
            let peer = v.from.unwrap_or_else(|| SocketAddr::new([0, 0, 0, 0].into(), 0));
            let Some(sim) = v.outs.iter_mut().find_map(|o| o.sim.as_deref_mut()) else { continue };
            refresh(sim, peer);
            // Probes (padding) for room up to the best encoding, with some to spare.
            let best = sim.encodings[0].bps;
            if best > 0.0 {
                v.rtc.bwe().set_desired_bitrate(str0m::bwe::Bitrate::bps((best * 1.2) as u64));
            }
        }
        let late = self.viewers.values().filter(|v| !v.connected && v.since.elapsed() > CONNECT_WITHIN);
        gone.extend(late.map(|v| v.id.clone()));
        let mut s = self.shared.viewers.lock();
        for v in self.viewers.values() {
            let Some(st) = s.get_mut(&v.id) else { continue };
            st.state = if v.connected { "playing" } else { "connecting" };
            st.since_s = v.since.elapsed().as_secs_f64();
            st.packets = v.packets;
            st.peer = v.from;
            st.last_picture = v.last_picture;
            if let Some(a) = v.adapt {
                st.estimate_bps = a.estimate_bps;
                st.layers = v.outs.iter().filter(|o| o.video).find_map(|o| o.session.sink_status(o.sink?)?.layers);
            }
            if let Some(sim) = v.outs.iter().find_map(|o| o.sim.as_ref()) {
                st.encoding = sim.current.and_then(|k| Some(sim.encodings.get(k)?.rid.clone()));
                st.switches = Some(sim.switches);
            }
        }
    }

    /// A datagram (or an ICE-TCP frame) from `from`, to its peer.
    fn receive(&mut self, proto: Protocol, from: SocketAddr, data: &[u8]) {
        let Ok(contents) = data.try_into() else { return };
        let destination = match (proto, &self.tcp) {
            (Protocol::Tcp, Some(t)) => t.local,
            (Protocol::Tcp, None) => return,
            _ => self.local,
        };
        let input = Input::Receive(Instant::now(), Receive { proto, source: from, destination, contents });
        if let Some(id) = deliver(&mut self.viewers, &mut self.by_addr, from, input) {
            self.busy.push(id);
        }
    }

    fn remove(&mut self, id: &str) {
        remove(&mut self.viewers, &mut self.by_addr, &self.shared, id);
    }

    /// Media came for the viewers: each connected one's queues drained into its `Rtc`.
    fn pump(&mut self) {
        let now = Instant::now();
        for v in self.viewers.values_mut().filter(|v| v.connected && v.publish.is_none()) {
            pump(v, &mut self.frames, now);
            self.busy.push(v.id.clone());
        }
    }

    /// An upgrade's new process takes the port: each peer on UDP keeps a socket of its own
    /// here. (Its last datagrams in the port's queue are lost: the peer's retransmissions
    /// and NACKs repair them.)
    fn hand_over(&mut self) {
        let tcp = self.tcp.clone();
        let on_tcp = |a: &SocketAddr| tcp.as_ref().is_some_and(|t| t.writers.lock().contains_key(a));
        for &peer in self.by_addr.keys().filter(|a| !on_tcp(a)) {
            match Handed::connect(self.local, peer, self.handed_tx.clone()) {
                Ok(h) => {
                    self.handed.insert(peer, h);
                }
                Err(e) => tracing::warn!(%peer, "upgrade: a WebRTC viewer cannot stay: {e}"),
            }
        }
        self.socket = None;
        tracing::info!(
            viewers = self.handed.len(),
            "upgrade: WebRTC viewers stay with this process on sockets of their own"
        );
    }
}

/// How often the status is written (and WHIP publishers asked for keyframes unasked).
const STATUS_EVERY: Duration = Duration::from_millis(500);

/// The task's port, until a hand-over (then never ready).
pub(super) async fn recv_from(
    socket: Option<&tokio::net::UdpSocket>,
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddr)> {
    match socket {
        Some(s) => s.recv_from(buf).await,
        None => std::future::pending().await,
    }
}

/// Binds the WebRTC port so that an upgrade's new process can bind it too while this one
/// keeps its viewers (`SO_REUSEADDR`, which both must set). A first start makes sure no one
/// holds the port — another relay's socket would share it silently.
pub(super) fn bind_port(addr: SocketAddr, beside_old: bool) -> std::io::Result<std::net::UdpSocket> {
    let addr = if beside_old { addr } else { std::net::UdpSocket::bind(addr)?.local_addr()? };
    Ok(on_port(addr)?.into())
}

/// A non-blocking UDP socket bound to `addr` beside the others on it (`SO_REUSEADDR`).
pub(super) fn on_port(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, None)?;
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// A viewer kept after a hand-over: a socket on the WebRTC port connected to its address,
/// and the task that passes what it receives to the viewers' task.
pub(super) struct Handed {
    socket: Arc<tokio::net::UdpSocket>,
    reader: tokio::task::JoinHandle<()>,
}

impl Handed {
    fn connect(local: SocketAddr, peer: SocketAddr, to: mpsc::Sender<(SocketAddr, Vec<u8>)>) -> std::io::Result<Self> {
        let s = on_port(local)?;
        s.connect(&peer.into())?;
        let socket = Arc::new(tokio::net::UdpSocket::from_std(s.into())?);
        let r = socket.clone();
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            loop {
                match r.recv(&mut buf).await {
                    Ok(n) if to.send((peer, buf[..n].to_vec())).await.is_ok() => {}
                    Ok(_) => return,
                    // (An ICMP error from the peer: it may come back; consent freshness decides.)
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                    Err(_) => return,
                }
            }
        });
        Ok(Self { socket, reader })
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// After a hand-over: each datagram on its viewer's own socket (one whose viewer left is
/// dropped).
pub(super) async fn flush_handed(handed: &HashMap<SocketAddr, Handed>, batch: &mut Vec<(SocketAddr, Vec<u8>)>) {
    for (to, d) in batch.drain(..) {
        if let Some(h) = handed.get(&to) {
            let _ = h.socket.send(&d).await;
        }
    }
}

/// Sends the batch from the task's UDP socket: a viewer's consecutive datagrams of one size
/// (a picture's fragments) as one GSO message, all in few `sendmmsg` calls; waits while the
/// socket's buffer is full, as `send_to` did.
pub(super) async fn flush(
    socket: &tokio::net::UdpSocket,
    gso: &mut fanout_io::gso::GsoSender,
    batch: &mut Vec<(SocketAddr, Vec<u8>)>,
) {
    use std::os::fd::AsRawFd;
    let datagrams: Vec<(SocketAddr, &[u8])> = batch.iter().map(|(a, d)| (*a, d.as_slice())).collect();
    let mut done = 0;
    while done < datagrams.len() {
        let sent =
            socket.async_io(tokio::io::Interest::WRITABLE, || gso.send(socket.as_raw_fd(), &datagrams[done..])).await;
        match sent {
            Ok(n) => done += n,
            Err(e) => {
                tracing::warn!("WebRTC send failed: {e}");
                break;
            }
        }
    }
    drop(datagrams);
    batch.clear();
}

/// Polls viewer `v`'s output until it wants time or input: queues its datagrams in `batch`,
/// handles its events. `false`: it is over.
pub(super) fn drive(
    v: &mut Viewer,
    tcp: Option<&TcpSide>,
    batch: &mut Vec<(SocketAddr, Vec<u8>)>,
    keyframe_wanted: &mut bool,
) -> bool {
    loop {
        match v.rtc.poll_output() {
            Ok(Output::Timeout(t)) => {
                v.wake_at = t;
                return v.rtc.is_alive();
            }
            Ok(Output::Transmit(t)) if t.proto == Protocol::Tcp => {
                if let Some(tcp) = tcp {
                    tcp.send(t.destination, &t.contents);
                }
            }
            Ok(Output::Transmit(t)) => batch.push((t.destination, t.contents.into())),
            Ok(Output::Event(Event::Connected)) if v.publish.is_some() => {
                v.connected = true;
                if let Err(why) = start_publishing(v) {
                    tracing::warn!(publisher = %v.id, "WHIP publisher not started: {why}");
                    return false;
                }
            }
            Ok(Output::Event(Event::RtpPacket(p))) => {
                if !publish_rtp(v, &p) {
                    tracing::info!(publisher = %v.id, "WHIP publisher taken over by a new one: closed");
                    return false;
                }
            }
            Ok(Output::Event(Event::Connected)) => viewer_connected(v),
            Ok(Output::Event(Event::EgressBitrateEstimate(kind))) => {
                let estimate = match kind {
                    str0m::bwe::BweKind::Twcc { estimate, .. } | str0m::bwe::BweKind::Remb { estimate, .. } => estimate,
                    _ => continue,
                };
                adapt(v, estimate.as_f64());
            }
            Ok(Output::Event(Event::KeyframeRequest(_))) => {
                // The path's source takes it from the session (a WHIP publisher, an RTSP
                // upstream), at its own pace.
                *keyframe_wanted = true;
                for o in v.outs.iter().filter(|o| o.video) {
                    o.session.want_keyframe();
                }
            }
            Ok(Output::Event(Event::IceConnectionStateChange(IceConnectionState::Disconnected))) => return false,
            Ok(Output::Event(_)) => {}
            Err(e) => {
                tracing::info!(viewer = %v.id, "WebRTC viewer ended: {e}");
                return false;
            }
        }
    }
}

/// A viewer connected: its sinks join the path's sessions now, at the ring's last keyframe
/// (a simulcast viewer's on the encoding its first estimate fits).
fn viewer_connected(v: &mut Viewer) {
    v.connected = true;
    let start = v.adapt.map_or(START_BPS, |a| a.estimate_bps.unwrap_or(a.whole_bps.min(START_BPS)));
    let peer = v.from.unwrap_or_else(|| SocketAddr::new([0, 0, 0, 0].into(), 0));
    for o in &mut v.outs {
        if let Some(sim) = o.sim.as_mut() {
            let rates: Vec<f64> = sim.encodings.iter().map(|e| e.bps).collect();
            let place = fanout_proto::simulcast::pick(&rates, start, sim.encodings.len());
            if place > 0 {
                // Another encoding than the path's has keyframes only when asked
                // (its ring's last one may be minutes old): the viewer joins it
                // live, at the keyframe the switch asks for.
                sim.current = None;
                switch(sim, place, peer);
                continue;
            }
        }
        match o.session.add_channel_sink(peer, o.queue.clone(), false) {
            Ok(id) => o.sink = Some(id),
            Err(e) => tracing::warn!(viewer = %v.id, "cannot add the WebRTC viewer's sink: {e}"),
        }
    }
    if let Some(a) = v.adapt {
        // Probes (padding) for room up to the whole stream, with some to spare.
        v.rtc.bwe().set_desired_bitrate(str0m::bwe::Bitrate::bps((a.whole_bps * 1.2) as u64));
        adapt(v, a.estimate_bps.unwrap_or(a.whole_bps.min(START_BPS)));
    }
    tracing::info!(viewer = %v.id, peer = ?v.from, "WebRTC viewer connected");
}

pub(super) fn remove(
    viewers: &mut HashMap<String, Viewer>,
    by_addr: &mut HashMap<SocketAddr, String>,
    shared: &Shared,
    id: &str,
) {
    let Some(mut v) = viewers.remove(id) else { return };
    for o in &v.outs {
        if let Some(s) = o.sink {
            o.session.remove_sink(s);
        }
        if let Some(n) = o.sim.as_ref().and_then(|s| s.next.as_ref()) {
            n.session.remove_sink(n.sink);
        }
    }
    v.rtc.disconnect();
    if let Some(p) = v.publish.as_ref().filter(|p| p.started) {
        p.publisher.stop(&v.id);
    }
    by_addr.retain(|_, x| x != id);
    shared.viewers.lock().remove(id);
    tracing::info!(viewer = %id, after_s = v.since.elapsed().as_secs_f64(), packets = v.packets, "WebRTC viewer left");
}
