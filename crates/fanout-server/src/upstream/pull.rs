//! One connection to the upstream, from its dial to its end: the RTSP client's steps
//! answered, the tracks' packets fed into the relay (interleaved or from their UDP ports),
//! keep-alives, receiver reports and keyframe requests sent, and the reasons to end watched.

use super::*;

/// Connects once and plays until the upstream ends, fails or is no longer wanted.
pub(super) async fn connect_once(
    up: &Arc<Upstream>,
    tcp: bool,
    template: &fanout_io::SessionConfig,
    engine: &fanout_io::Engine,
) -> Result<Ended, UpstreamError> {
    let url = up.url.lock().clone();
    let (stream, local, peer) = dial(up, &url).await?;
    let mut pull = Pull {
        up,
        tcp,
        template,
        engine,
        url: url.request_url(),
        client: Client::new(url, concat!("fanout/", env!("CARGO_PKG_VERSION"))),
        stream,
        local,
        peer,
        srtp: Vec::new(),
        srtcp_out: Vec::new(),
        udp: Vec::new(),
        readers: tokio::task::JoinSet::new(),
        reporter: reporter_ssrc(up),
        connected_at: Instant::now(),
        playing_since: None,
        next_report: Instant::now() + REPORT_EVERY,
        last_count: (0, Instant::now()),
        packets_at_play: 0,
        idle: crate::ending::Linger::new(up.linger, Instant::now()),
    };
    let start = pull.client.start(up.now_ms());
    pull.write(&start).await?;
    pull.run().await
}

/// The TCP connection (and over it TLS for `rtsps://`, the certificate checked) with its
/// local and remote addresses.
async fn dial(up: &Upstream, url: &Url) -> Result<(Box<dyn Io>, IpAddr, IpAddr), UpstreamError> {
    use UpstreamError as E;
    let tcp =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect((url.host.as_str(), url.port)))
            .await
            .map_err(|_| E::Connect("timed out after 5 s".into()))?
            .map_err(|e| E::Connect(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let local = tcp.local_addr().map_err(|e| E::Connect(e.to_string()))?.ip();
    let peer = tcp.peer_addr().map_err(|e| E::Connect(e.to_string()))?.ip();
    let stream: Box<dyn Io> = match (&up.tls, url.tls) {
        (_, false) => Box::new(tcp),
        (None, true) => return Err(E::Tls("rtsps:// but no TLS settings for this upstream".into())),
        (Some(cfg), true) => {
            let name = rustls::pki_types::ServerName::try_from(url.host.clone())
                .map_err(|e| E::Tls(format!("{:?} is no server name: {e}", url.host)))?;
            let tls = tokio_rustls::TlsConnector::from(cfg.clone());
            let s = tokio::time::timeout(Duration::from_secs(5), tls.connect(name, tcp))
                .await
                .map_err(|_| E::Tls("the handshake timed out after 5 s".into()))?
                .map_err(|e| E::Tls(e.to_string()))?;
            Box::new(s)
        }
    };
    Ok((stream, local, peer))
}

/// One upstream connection's state.
struct Pull<'a> {
    up: &'a Arc<Upstream>,
    tcp: bool,
    template: &'a fanout_io::SessionConfig,
    engine: &'a fanout_io::Engine,
    /// The URL requested, for the log.
    url: String,
    client: Client,
    stream: Box<dyn Io>,
    local: IpAddr,
    peer: IpAddr,
    /// SRTP from the upstream: the keys its description gave, per track (decrypted once
    /// here, for every client of the path).
    srtp: Vec<Option<fanout_proto::rtp::srtp::Context>>,
    /// Our own key per track for the SRTCP we send back, told to the upstream in SETUP.
    srtcp_out: Vec<fanout_proto::rtp::srtp::Context>,
    /// UDP: each track's RTP and RTCP sockets, from SETUP until PLAY's answer.
    udp: Vec<(tokio::net::UdpSocket, tokio::net::UdpSocket)>,
    /// The tasks reading them, ended with the connection.
    readers: tokio::task::JoinSet<()>,
    reporter: u32,
    connected_at: Instant,
    playing_since: Option<Instant>,
    next_report: Instant,
    /// Packets so far, and when that count last moved.
    last_count: (u64, Instant),
    packets_at_play: u64,
    /// Torn down once nobody wants the stream for the upstream's `linger`.
    idle: crate::ending::Linger,
}

impl Pull<'_> {
    async fn run(&mut self) -> Result<Ended, UpstreamError> {
        let limits = Limits { max_body: 1 << 20, ..Limits::default() };
        let mut buf: Vec<u8> = Vec::with_capacity(8192);
        let mut chunk = vec![0u8; 65536];
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            // Every complete message in the buffer.
            while let Some((msg, used)) = rtsp::parse(&buf, &limits)
                .map_err(|e| UpstreamError::Protocol(format!("upstream sent garbage: {e}")))?
            {
                buf.drain(..used);
                if let Some(ended) = self.on_message(msg).await? {
                    return Ok(ended);
                }
            }
            tokio::select! {
                r = self.stream.read(&mut chunk) => {
                    let n = r.map_err(io_error)?;
                    if n == 0 {
                        return Err(UpstreamError::Io("the upstream closed the connection".into()));
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                _ = tick.tick() => {
                    if let Some(ended) = self.on_tick(Instant::now()).await? {
                        return Ok(ended);
                    }
                }
            }
        }
    }

    async fn write(&mut self, b: &[u8]) -> Result<(), UpstreamError> {
        self.stream.write_all(b).await.map_err(io_error)
    }

    async fn on_message(&mut self, msg: Message) -> Result<Option<Ended>, UpstreamError> {
        match msg {
            Message::Interleaved { channel, mut data } => {
                // Channels are 2i (RTP) and 2i+1 (RTCP) unless the server moved them; a
                // channel we did not set up is ignored.
                let hit = self.client.tracks.iter().enumerate().find_map(|(i, t)| match t.lower {
                    Lower::Interleaved { rtp, .. } if rtp == channel => Some((i, true)),
                    Lower::Interleaved { rtcp, .. } if rtcp == channel => Some((i, false)),
                    _ => None,
                });
                if let Some((i, rtp)) = hit {
                    match self.srtp.get_mut(i).and_then(Option::as_mut) {
                        Some(ctx) => self.up.feed_srtp(i, rtp, ctx, &mut data),
                        None if rtp => self.up.feed_rtp(i, &mut data),
                        None => self.up.feed_rtcp(i, &data),
                    }
                }
                Ok(None)
            }
            Message::Request(_) => Ok(None), // servers may send OPTIONS/ANNOUNCE: not needed
            Message::Response(resp) => {
                let step = match self.client.on_response(&resp, self.up.now_ms()) {
                    Ok(step) => step,
                    // 461 Unsupported Transport: the server does not do UDP.
                    Err(e) if e.status == Some(461) && !self.tcp && self.up.mode == RtspTransport::Auto => {
                        return Ok(Some(Ended::UseTcp("the upstream refused UDP (461)")));
                    }
                    Err(e) => return Err(UpstreamError::answered(e.status, e.to_string())),
                };
                match step {
                    Step::Send(b) => self.write(&b).await?,
                    Step::Described(sdp) => self.on_described(sdp).await?,
                    Step::Playing => self.on_playing().await,
                    Step::Idle => {}
                }
                Ok(None)
            }
        }
    }

    /// The description: its keys read, its tracks opened, each set up (interleaved, or on a
    /// UDP port pair of ours).
    async fn on_described(&mut self, sdp: Sdp) -> Result<(), UpstreamError> {
        use UpstreamError as E;
        self.srtp = srtp_contexts(&sdp)?;
        self.client.savp = self.srtp.iter().any(Option::is_some);
        if self.client.savp {
            let keys = own_srtcp_keys(sdp.media.len(), self.reporter).map_err(|e| E::Describe(e.to_string()))?;
            (self.srtcp_out, self.client.key_mgmt) = (keys.contexts, keys.mikey);
        }
        self.up
            .adopt(&sdp, self.template, self.engine)
            .map_err(|e| E::Describe(format!("cannot open the tracks: {e}")))?;
        let lowers: Vec<Lower> = if self.tcp {
            (0..sdp.media.len()).map(|i| Lower::Interleaved { rtp: (2 * i) as u8, rtcp: (2 * i + 1) as u8 }).collect()
        } else {
            self.udp = udp_pairs(self.local, sdp.media.len()).map_err(|e| E::Io(e.to_string()))?;
            let port = |s: &tokio::net::UdpSocket| s.local_addr().map_or(0, |x| x.port());
            self.udp.iter().map(|(a, b)| Lower::Udp { client_rtp: port(a), client_rtcp: port(b) }).collect()
        };
        let b = self.client.setup(lowers, self.up.now_ms()).map_err(|e| E::answered(e.status, e.to_string()))?;
        self.write(&b).await
    }

    /// PLAY answered: the path's readers are told, and over UDP each track's ports are read
    /// (and the upstream's RTCP port punched open through a NAT).
    async fn on_playing(&mut self) {
        let up = self.up;
        let transport = if self.tcp { "tcp" } else { "udp" };
        tracing::info!(session = %up.name, url = %self.url, transport, tracks = self.client.tracks.len(), "upstream playing");
        {
            let mut st = up.state.lock();
            st.state = "playing";
            st.transport = Some(transport);
        }
        self.playing_since = Some(Instant::now());
        self.last_count = (up.packets(), Instant::now());
        self.packets_at_play = self.last_count.0;
        let peer = self.peer;
        for (i, (rtp, rtcp)) in std::mem::take(&mut self.udp).into_iter().enumerate() {
            let server = self.client.tracks[i].server_ports;
            // An empty receiver report (SRTCP under our key where the upstream is SRTP).
            if let Some((_, sc)) = server {
                let mut rr = [0x80, 201, 0, 1].to_vec();
                rr.extend_from_slice(&self.reporter.to_be_bytes());
                if self.srtcp_out.get_mut(i).is_none_or(|ctx| ctx.protect_rtcp(&mut rr).is_ok()) {
                    let _ = rtcp.send_to(&rr, (peer, sc)).await;
                }
            }
            let rtcp = Arc::new(rtcp);
            let key = self.srtp.get(i).cloned().flatten();
            self.readers.spawn(read_udp(up.clone(), i, true, peer, Arc::new(rtp), key.clone()));
            self.readers.spawn(read_udp(up.clone(), i, false, peer, rtcp.clone(), key));
            up.set_rtcp_out(i, rtcp, server.map(|(_, c)| SocketAddr::new(peer, c)));
        }
        up.ready.send_modify(|g| *g += 1);
    }

    /// Four times a second: whether to end (closing, a new URL, idle, silent, UDP that brings
    /// nothing), and the keep-alive and RTCP that are due.
    async fn on_tick(&mut self, now: Instant) -> Result<Option<Ended>, UpstreamError> {
        let up = self.up;
        if up.closing() {
            return Ok(Some(self.teardown(Ended::Closed).await));
        }
        if up.switch_to.lock().is_some() {
            return Ok(Some(self.teardown(Ended::Switched).await));
        }
        if let Some(k) = self.client.keepalive(up.now_ms()) {
            self.write(&k).await?;
        }
        if let Some(since) = self.playing_since {
            let count = up.packets();
            if count != self.last_count.0 {
                self.last_count = (count, now);
            }
            // Packets of this connection only: after a reconnect the total is not zero.
            let udp_probe = !self.tcp && up.mode == RtspTransport::Auto && count == self.packets_at_play;
            if udp_probe && now - since > UDP_GRACE {
                return Ok(Some(self.teardown(Ended::UseTcp("nothing arrived over UDP in 3 s")).await));
            }
            // (While UDP is on probation, its grace decides, not the silence timeout.)
            if !udp_probe && now - self.last_count.1 > up.silence {
                return Err(UpstreamError::Io(format!("no RTP from the upstream for {:?}", up.silence)));
            }
            self.send_rtcp(now).await?;
        } else if now - self.connected_at > Duration::from_secs(10) {
            return Err(UpstreamError::Protocol("the upstream did not answer within 10 s".into()));
        }
        if self.idle.observe(up.wanted(), now) {
            return Ok(Some(self.teardown(Ended::Idle).await));
        }
        Ok(None)
    }

    /// Receiver reports when due and keyframe requests for the readers; to an SRTP upstream
    /// as SRTCP under the key we gave it in SETUP.
    async fn send_rtcp(&mut self, now: Instant) -> Result<(), UpstreamError> {
        let mut rtcp = Vec::new();
        if now >= self.next_report {
            self.next_report += REPORT_EVERY;
            rtcp = self.up.receiver_reports(self.reporter);
        }
        rtcp.extend(self.up.keyframe_requests(self.reporter));
        for (i, mut rr) in rtcp {
            if let Some(ctx) = self.srtcp_out.get_mut(i) {
                if ctx.protect_rtcp(&mut rr).is_err() {
                    continue;
                }
            }
            if !self.tcp {
                self.up.send_udp_rr(i, &rr);
            } else if let Lower::Interleaved { rtcp, .. } = self.client.tracks[i].lower {
                let mut out = Vec::with_capacity(rr.len() + 4);
                rtsp::write_interleaved(&mut out, rtcp, &rr);
                self.write(&out).await?;
            }
        }
        Ok(())
    }

    /// TEARDOWN, best effort (its answer is not awaited beyond a short grace), then `ended`.
    async fn teardown(&mut self, ended: Ended) -> Ended {
        if let Some(b) = self.client.teardown(self.up.now_ms()) {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.stream.write_all(&b)).await;
            let mut scratch = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_millis(300), self.stream.read(&mut scratch)).await;
        }
        self.up.rtcp_out.lock().clear();
        ended
    }
}

fn io_error(e: std::io::Error) -> UpstreamError {
    UpstreamError::Io(format!("upstream connection: {e}"))
}

/// Reads one track's RTP (`rtp`) or RTCP port, taking only what comes from the upstream's
/// address, until the connection's readers are dropped.
async fn read_udp(
    up: Arc<Upstream>,
    i: usize,
    rtp: bool,
    peer: IpAddr,
    sock: Arc<tokio::net::UdpSocket>,
    mut key: Option<fanout_proto::rtp::srtp::Context>,
) {
    let mut b = vec![0u8; if rtp { 65536 } else { 2048 }];
    while let Ok((n, from)) = sock.recv_from(&mut b).await {
        if from.ip() != peer {
            continue;
        }
        match (key.as_mut(), rtp) {
            (Some(ctx), _) => up.feed_srtp(i, rtp, ctx, &mut b[..n]),
            (None, true) => up.feed_rtp(i, &mut b[..n]),
            (None, false) => up.feed_rtcp(i, &b[..n]),
        }
    }
}

/// The UDP port pairs of the tracks (RTP even, RTCP odd) on the local address of the control
/// connection.
fn udp_pairs(ip: IpAddr, n: usize) -> std::io::Result<Vec<(tokio::net::UdpSocket, tokio::net::UdpSocket)>> {
    (0..n)
        .map(|_| {
            let (a, b) = fanout_io::sys::port_pair(ip)?;
            // RTP: a few Mbit/s for a second, so a busy moment of the task that reads it
            // loses nothing (the default holds some 150 packets: 8 ms at 20,000 a second).
            let _ = socket2::SockRef::from(&a).set_recv_buffer_size(4 << 20);
            a.set_nonblocking(true)?;
            b.set_nonblocking(true)?;
            Ok((tokio::net::UdpSocket::from_std(a)?, tokio::net::UdpSocket::from_std(b)?))
        })
        .collect()
}

/// The upstream connection: TCP, or TLS on TCP (`rtsps://`).
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Per media section, an SRTP context where the description gives it `RTP/SAVP` with an
/// SDES or MIKEY key; an error where it is SRTP with no key we can read.
fn srtp_contexts(
    sdp: &fanout_proto::rtsp::sdp::Sdp,
) -> Result<Vec<Option<fanout_proto::rtp::srtp::Context>>, UpstreamError> {
    sdp.media
        .iter()
        .map(|m| {
            if !m.proto.to_ascii_uppercase().contains("SAVP") {
                return Ok(None);
            }
            let attr = |name: &str| m.lines.iter().filter(|(k, _)| *k == 'a').find_map(|(_, v)| v.strip_prefix(name));
            // SDES first (its key is the stream's as is), else MIKEY.
            match (attr("crypto:"), attr("key-mgmt:").and_then(|v| v.trim().strip_prefix("mikey "))) {
                (Some(c), _) => match fanout_proto::rtp::srtp::Crypto::parse(c) {
                    Ok(c) => Ok(Some(fanout_proto::rtp::srtp::Context::new(c.suite, &c.key))),
                    Err(e) => Err(UpstreamError::Describe(format!("the upstream's SRTP key (a=crypto): {e}"))),
                },
                (None, Some(b64)) => match fanout_proto::rtp::mikey::Mikey::parse_base64(b64) {
                    // (A stream that ran before we came starts at the ROC the message says.)
                    Ok(k) => Ok(Some(k.context())),
                    Err(e) => Err(UpstreamError::Describe(format!("the upstream's SRTP key (a=key-mgmt): {e}"))),
                },
                (None, None) => {
                    Err(UpstreamError::Describe(format!("the upstream's {} section is RTP/SAVP without a key", m.kind)))
                }
            }
        })
        .collect()
}

/// Our SRTCP keys, one per track.
struct OwnKeys {
    /// What protects the reports we send.
    contexts: Vec<fanout_proto::rtp::srtp::Context>,
    /// The MIKEY messages (base64) that tell them to the upstream (`KeyMgmt` in SETUP, RFC
    /// 4567), each crypto session our reporter SSRC.
    mikey: Vec<String>,
}

fn own_srtcp_keys(tracks: usize, reporter: u32) -> std::io::Result<OwnKeys> {
    let suite = fanout_proto::rtp::srtp::Suite::AesCm128HmacSha1_80;
    let mut keys = OwnKeys { contexts: Vec::new(), mikey: Vec::new() };
    for _ in 0..tracks {
        let key = crate::srtp_out::random_key()?;
        keys.mikey.push(crate::srtp_out::mikey_base64(suite, &key, reporter));
        keys.contexts.push(fanout_proto::rtp::srtp::Context::new(suite, &key));
    }
    Ok(keys)
}

/// A reporter SSRC for our receiver reports: differs per process and connection.
fn reporter_ssrc(up: &Upstream) -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    t ^ std::process::id().rotate_left(16) ^ up.state.lock().connects as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_proto::rtp::srtp::{Context, Crypto, MasterKey, Suite};

    /// An upstream's SRTP keys: SDES, else MIKEY; SAVP without a usable key is an error that
    /// says which.
    #[test]
    fn srtp_keys_come_from_sdes_or_mikey() {
        let key = MasterKey { key: [5; 16], salt: [6; 14] };
        let suite = Suite::AesCm128HmacSha1_80;
        let mikey = fanout_proto::rtp::mikey::Mikey { csb_id: 1, sessions: vec![(7, 0)], suite, key: key.clone() };
        let mikey = mikey.write_base64([0; 16], 0);
        let sdes = Crypto { tag: 1, suite, key: key.clone() }.to_value();
        let sdp = |attrs: &str| {
            let text = format!(
                "v=0\r\ns=x\r\nm=video 0 RTP/SAVP 96\r\na=rtpmap:96 H264/90000\r\n{attrs}m=audio 0 RTP/AVP 0\r\n"
            );
            Sdp::parse(&text).unwrap()
        };
        for attrs in [format!("a=crypto:{sdes}\r\n"), format!("a=key-mgmt:mikey {mikey}\r\n")] {
            let mut ctxs = srtp_contexts(&sdp(&attrs)).unwrap();
            assert!(ctxs[1].is_none(), "the plain section stays plain");
            // It decrypts what a context of the same key protected.
            let mut p = vec![0x80, 96, 0, 1, 0, 0, 0, 9, 0, 0, 0, 7, 1, 2, 3];
            Context::new(suite, &key).protect_rtp(&mut p).unwrap();
            ctxs[0].as_mut().unwrap().unprotect_rtp(&mut p).unwrap();
            assert_eq!(p[12..], [1, 2, 3]);
        }
        assert!(srtp_contexts(&sdp("")).unwrap_err().to_string().contains("without a key"));
        assert!(srtp_contexts(&sdp("a=key-mgmt:mikey AAAA\r\n")).unwrap_err().to_string().contains("key-mgmt"));
    }
}
