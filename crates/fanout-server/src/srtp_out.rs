//! SRTP toward RTSPS clients, encrypted once per packet for many clients (issue 15).
//!
//! A track's SRTP clients share a key: an *epoch*. A task subscribes to the track's session
//! like any UDP sink and feeds its packets into a relay session of its own
//! (`{track}/srtp-N`), whose sinks are the clients. That session judges each packet as
//! plaintext (keyframes, so a client starts at one) and then encrypts it in place, once
//! ([`fanout_proto::rtp::srtp`], through `Session::set_ingest`): the data paths send the same
//! ciphertext to all of its sinks, as they send plain RTP. On the kernel path the task
//! encrypts before it feeds the session, and the program clones the ciphertext.
//!
//! Why epochs and not one key per track: SDES carries no rollover counter, so a client
//! starts counting at ROC 0 from its first packet (RFC 3711 §3.3.1). An epoch numbers its
//! packets itself, from 0 at its first (the track's numbers, shifted): its index space starts
//! there, and a client may join it only while that epoch has not wrapped its sequence
//! numbers, some 61,000 packets. (Numbered as the track, an epoch begun near the track's
//! wrap would have had no room for joiners: each new client got an epoch of its own.) Later joiners get a new epoch, with a new key and its own index
//! space. So the ciphertext is shared within an epoch, each (key, index) is used once, and
//! epochs end a linger after their last client.

use fanout_io::{bind_udp_source, Session};
use fanout_proto::rtp::srtp::{Context, Crypto, MasterKey, Suite};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A joiner needs this many packets of the epoch's first ROC period still ahead (between
/// its DESCRIBE and its first packet).
const JOIN_MARGIN: u32 = 4096;
/// An epoch without clients stops after this long (a DESCRIBE is followed by a PLAY).
const LINGER: Duration = Duration::from_secs(10);

pub struct Epoch {
    pub crypto: Crypto,
    /// The encrypted copy of the track; SRTP clients are its sinks.
    pub session: Session,
    ctx: Arc<Mutex<Context>>,
    counts: Arc<Counts>,
    task: tokio::task::AbortHandle,
}

/// What the encryption saw: packets, the newest sequence number (the epoch's own), and
/// whether the numbers wrapped since the first; the track's number of the first packet.
#[derive(Default)]
struct Counts {
    packets: AtomicU32,
    last_seq: AtomicU32,
    wrapped: AtomicBool,
    base: AtomicU32,
}

impl Epoch {
    /// Whether a new client can start on this key: it runs, and its first ROC period has
    /// room ahead.
    fn joinable(&self) -> bool {
        if self.counts.wrapped.load(Relaxed) || self.task.is_finished() {
            return false;
        }
        // Packets left before the sequence numbers pass 65535.
        65_535 - self.counts.last_seq.load(Relaxed) > JOIN_MARGIN
    }

    /// Protects a sender report for one of its clients (each gets its own SRTCP index).
    pub fn protect_rtcp(&self, sr: &mut Vec<u8>) {
        let _ = self.ctx.lock().protect_rtcp(sr);
    }

    /// The key as a MIKEY message (base64), for the crypto session of `ssrc` from its start.
    pub fn mikey(&self, ssrc: u32) -> String {
        mikey_base64(self.crypto.suite, &self.crypto.key, ssrc)
    }

    pub fn running(&self) -> bool {
        !self.task.is_finished()
    }

    pub fn packets(&self) -> u32 {
        self.counts.packets.load(Relaxed)
    }
}

/// Every track's epochs.
#[derive(Default)]
pub struct SrtpOut {
    epochs: Mutex<HashMap<String, Vec<Arc<Epoch>>>>,
    next: AtomicU32,
}

/// `key` as a MIKEY message (base64) for the crypto session of `ssrc` from its start (ROC 0),
/// stamped now: what `a=key-mgmt` and the `KeyMgmt` header carry.
pub(crate) fn mikey_base64(suite: Suite, key: &MasterKey, ssrc: u32) -> String {
    let mut r = [0u8; 20];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut r);
    let ntp = fanout_proto::rtp::rtcp::ntp_from_unix(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default(),
    );
    fanout_proto::rtp::mikey::Mikey::announce(suite, key, ssrc, r, ntp)
}

pub(crate) fn random_key() -> std::io::Result<MasterKey> {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 30];
    ring::rand::SystemRandom::new().fill(&mut b).map_err(|_| std::io::Error::other("no system randomness"))?;
    Ok(MasterKey::from_concat(&b).expect("30 bytes"))
}

impl SrtpOut {
    /// The epoch a client of `track` joins now: the newest joinable one (with `shared`), or
    /// a new one.
    pub fn epoch(&self, track: &Session, engine: &fanout_io::Engine, shared: bool) -> std::io::Result<Arc<Epoch>> {
        let mut all = self.epochs.lock();
        let list = all.entry(track.name().to_string()).or_default();
        list.retain(|e| e.running());
        if let Some(e) = list.iter().rev().find(|e| shared && e.joinable()) {
            return Ok(e.clone());
        }
        let n = self.next.fetch_add(1, Relaxed);
        let e = start(track, engine, n)?;
        list.push(e.clone());
        Ok(e)
    }

    /// Stops every epoch (at shutdown).
    pub fn stop_all(&self) {
        for e in self.epochs.lock().drain().flat_map(|(_, v)| v) {
            e.task.abort();
            let s = e.session.clone();
            tokio::task::spawn_blocking(move || s.close());
        }
    }

    /// Epochs running: (track, clients, packets encrypted), for `GET /v1/rtsp`.
    pub fn status(&self) -> Vec<(String, usize, u32)> {
        let all = self.epochs.lock();
        let mut v: Vec<_> = all
            .iter()
            .flat_map(|(t, es)| {
                es.iter().filter(|e| e.running()).map(move |e| (t.clone(), e.session.sinks().len(), e.packets()))
            })
            .collect();
        v.sort();
        v
    }
}

fn start(track: &Session, engine: &fanout_io::Engine, n: u32) -> std::io::Result<Arc<Epoch>> {
    let key = random_key()?;
    let crypto = Crypto { tag: 1, suite: Suite::AesCm128HmacSha1_80, key };
    let mut cfg = track.config().clone();
    cfg.name = format!("{}/srtp-{n}", track.name());
    let session = Session::new(cfg, engine);
    let enc = Encrypt { ctx: Arc::new(Mutex::new(Context::new(crypto.suite, &crypto.key))), counts: Arc::default() };
    // Where the epoch's packets are encrypted. On the user-space paths, where the session
    // receives them: it judges each as plaintext first (keyframes, so a client starts at
    // one). On the kernel path the program clones what reaches the session's socket, so the
    // feeding task encrypts before it sends; the session then sees ciphertext and judges no
    // video (a client starts at the next packet, and its decoder waits for a keyframe).
    let kernel = session.config().datapath == fanout_io::DataPath::Kernel;
    let feed_enc = if kernel {
        Some(enc.clone())
    } else {
        session.set_rtp_video(track.rtp_video());
        let enc = enc.clone();
        session.set_ingest(move |buf, len| enc.apply(buf, len));
        None
    };
    let source = bind_udp_source(SocketAddr::from(([127, 0, 0, 1], 0)), None)?;
    let into = source.local_addr()?;
    session.attach_udp(source)?;
    session.set_source_kind(format!("SRTP of {}", track.name()));
    let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
    // A second of a few Mbit/s: the relay hop is never the one that loses packets.
    let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(4 << 20);
    sock.set_nonblocking(true)?;
    let input = track.add_udp_sink(sock.local_addr()?)?;
    let sock = tokio::net::UdpSocket::from_std(sock)?;
    let (track_run, out) = (track.clone(), session.clone());
    let task = tokio::spawn(async move {
        run(sock, into, &out, feed_enc).await;
        track_run.remove_sink(input);
        tokio::task::spawn_blocking(move || out.close());
    })
    .abort_handle();
    tracing::info!(track = track.name(), epoch = n, "SRTP encryption started");
    Ok(Arc::new(Epoch { crypto, session, ctx: enc.ctx, counts: enc.counts, task }))
}

/// An epoch's encryption: the track's packets renumbered into the epoch's own numbers and
/// protected in place, once each.
#[derive(Clone)]
struct Encrypt {
    ctx: Arc<Mutex<Context>>,
    counts: Arc<Counts>,
}

impl Encrypt {
    /// Encrypts the RTP packet in `buf[..len]` (the tag goes after it); the protected length.
    fn apply(&self, buf: &mut [u8], len: usize) -> Option<usize> {
        if len < 12 {
            return None;
        }
        let counts = &self.counts;
        let track_seq = u16::from_be_bytes([buf[2], buf[3]]);
        let first = counts.packets.fetch_add(1, Relaxed) == 0;
        if first {
            counts.base.store(u32::from(track_seq), Relaxed);
        }
        let seq = track_seq.wrapping_sub(counts.base.load(Relaxed) as u16);
        buf[2..4].copy_from_slice(&seq.to_be_bytes());
        let last = counts.last_seq.swap(u32::from(seq), Relaxed) as u16;
        if !first && seq < last && last - seq > 0x8000 {
            counts.wrapped.store(true, Relaxed);
        }
        self.ctx.lock().protect_rtp_in(buf, len).ok()
    }
}

/// Feeds the track's packets to the epoch's session (encrypted first with `enc`) until it
/// has had no client for `LINGER`.
async fn run(sock: tokio::net::UdpSocket, into: SocketAddr, out: &Session, enc: Option<Encrypt>) {
    let feeder = match tokio::net::UdpSocket::bind("127.0.0.1:0").await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("SRTP encryption: {e}");
            return;
        }
    };
    let mut buf = vec![0u8; 65_536];
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut idle_since: Option<Instant> = None;
    loop {
        tokio::select! {
            r = sock.recv(&mut buf) => {
                let Ok(mut n) = r else { break };
                if let Some(enc) = &enc {
                    let Some(m) = enc.apply(&mut buf, n) else { continue };
                    n = m;
                }
                // Loopback into the engine: a failure here is the engine's to count.
                let _ = feeder.send_to(&buf[..n], into).await;
            }
            _ = tick.tick() => {
                if !out.sinks().is_empty() {
                    idle_since = None;
                } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= LINGER {
                    break;
                }
            }
        }
    }
    tracing::info!(session = out.name(), "SRTP encryption stopped");
}
