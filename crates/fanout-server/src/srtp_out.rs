//! SRTP toward RTSPS clients, encrypted once per packet for many clients (issue 15).
//!
//! A track's SRTP clients share a key: an *epoch*. A task reads the track's ring as an
//! in-process subscriber and hands its packets into a relay session of its own
//! (`{track}/srtp-N`, through an [`Inlet`]), whose sinks are the clients. That session
//! judges each packet as plaintext (keyframes, so a client starts at one) and then encrypts
//! it in place, once ([`fanout_proto::rtp::srtp`], through `Session::set_ingest`): the data
//! paths send the same ciphertext to all of its sinks, as they send plain RTP. On the kernel
//! path the task encrypts before it hands the packet in (its inlet is the session's socket,
//! where the program clones), and the session sees ciphertext.
//!
//! An epoch keeps the track's SSRC and sequence numbers: an SRTP client's `RTP-Info` is the
//! track's, as a plain client's is. Why epochs and not one key per track: SDES carries no
//! rollover counter, so a client starts counting at ROC 0 from its first packet (RFC 3711
//! §3.3.1), and so does the epoch's own context from its first packet. A client may join an
//! epoch only while the track's numbers have not wrapped since that epoch began (and have
//! [`JOIN_MARGIN`] packets of room left); later joiners get a new epoch, with a new key and
//! its own index space. So the ciphertext is shared within an epoch, each (key, index) is
//! used once, and epochs end a linger after their last client. The price of the track's
//! numbers: in the last `JOIN_MARGIN` packets before each wrap of the track's numbers (6% of
//! them), a joiner's new epoch takes no other joiner.

use fanout_io::channel::ChannelQueue;
use fanout_io::{Inlet, Session};
use fanout_proto::rtp::srtp::{Context, Crypto, MasterKey, Suite};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A joiner needs this many packets of the epoch's first ROC period still ahead (between
/// its DESCRIBE and its first packet).
const JOIN_MARGIN: u32 = 4096;
/// An epoch without clients stops after this long (a DESCRIBE is followed by a PLAY).
const LINGER: Duration = Duration::from_secs(10);
/// At most this many epochs of a track without a client at once. Each is a relay session
/// (on the kernel path, one of the program's 256); a DESCRIBE makes one wherever no
/// epoch can be joined (per-client keys, or near a wrap), so without a bound a client that
/// only DESCRIBEs could fill the machine. Past it the oldest such epoch ends: honest
/// joiners PLAY within milliseconds of their DESCRIBE, a flood's own epochs go first.
pub const MAX_UNPLAYED: usize = 64;

pub struct Epoch {
    pub crypto: Crypto,
    /// The encrypted copy of the track; SRTP clients are its sinks.
    pub session: Session,
    ctx: Arc<Mutex<Context>>,
    counts: Arc<Counts>,
    task: tokio::task::AbortHandle,
}

/// What the encryption saw: packets, the newest sequence number (the track's), and whether
/// the numbers wrapped since the first.
#[derive(Default)]
struct Counts {
    packets: AtomicU32,
    last_seq: AtomicU32,
    wrapped: AtomicBool,
}

impl Epoch {
    /// Whether a new client can start on this key: it runs, and its first ROC period has
    /// room ahead. `track_next` is the track's number a new epoch would start at (its
    /// last keyframe's): where an epoch has had no packet yet, it will start there.
    fn joinable(&self, track_next: Option<u16>) -> bool {
        let c = &self.counts;
        !self.task.is_finished()
            && has_room(c.packets.load(Relaxed), c.last_seq.load(Relaxed) as u16, c.wrapped.load(Relaxed), track_next)
    }

    /// Protects a sender report for one of its clients (each gets its own SRTCP index).
    pub fn protect_rtcp(&self, sr: &mut Vec<u8>) {
        let _ = self.ctx.lock().protect_rtcp(sr);
    }

    /// The key as a MIKEY message (base64), for the crypto session of `ssrc` from its start.
    pub fn mikey(&self, ssrc: u32) -> String {
        mikey_base64(self.crypto.suite, &self.crypto.key, ssrc)
    }

    fn stop(&self) {
        self.task.abort();
        let s = self.session.clone();
        tokio::task::spawn_blocking(move || s.close());
    }

    pub fn running(&self) -> bool {
        !self.task.is_finished()
    }

    pub fn packets(&self) -> u32 {
        self.counts.packets.load(Relaxed)
    }
}

/// Whether an epoch that has encrypted `packets`, the newest numbered `last_seq` (the
/// track's numbers), `wrapped` or not since its first, has room for a joiner: the first
/// packet the joiner gets must be in the epoch's first ROC period, with [`JOIN_MARGIN`]
/// packets to spare for its DESCRIBE → PLAY. An epoch with no packet yet starts at
/// `track_next`.
fn has_room(packets: u32, last_seq: u16, wrapped: bool, track_next: Option<u16>) -> bool {
    let newest = if packets == 0 { track_next.unwrap_or(0) } else { last_seq };
    !wrapped && 65_535 - u32::from(newest) > JOIN_MARGIN
}

/// What a joiner gets: the newest epoch it can join, else a new one, which past
/// [`MAX_UNPLAYED`] takes the place of the oldest epoch without a client.
#[derive(Debug, PartialEq)]
enum Choice {
    Join(usize),
    New,
    Replace(usize),
}

/// `unplayed`: the epochs without a client, oldest first.
fn choose(joinable: Option<usize>, unplayed: &[usize]) -> Choice {
    match (joinable, unplayed.first()) {
        (Some(i), _) => Choice::Join(i),
        (None, Some(&oldest)) if unplayed.len() >= MAX_UNPLAYED => Choice::Replace(oldest),
        _ => Choice::New,
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
        let track_next = track.rtp_start().map(|(_, seq, _)| seq);
        let joinable = list.iter().rposition(|e| shared && e.joinable(track_next));
        let unplayed: Vec<usize> = (0..list.len()).filter(|&i| list[i].session.sinks().is_empty()).collect();
        match choose(joinable, &unplayed) {
            Choice::Join(i) => return Ok(list[i].clone()),
            Choice::Replace(i) => {
                let old = list.remove(i);
                tracing::warn!(
                    session = old.session.name(),
                    "{MAX_UNPLAYED} SRTP key epochs without a client: the oldest ends"
                );
                old.stop();
            }
            Choice::New => {}
        }
        let n = self.next.fetch_add(1, Relaxed);
        let e = start(track, engine, n)?;
        list.push(e.clone());
        Ok(e)
    }

    /// Stops every epoch (at shutdown).
    pub fn stop_all(&self) {
        for e in self.epochs.lock().drain().flat_map(|(_, v)| v) {
            e.stop();
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
    cfg.name = crate::track::Inner::SrtpEpoch(n).name(track.name());
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
    session.set_source_kind(format!("SRTP of {}", track.name()));
    let inlet = Inlet::open(&session)?;
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = wake.clone();
    // Half the ring: an epoch that falls that far behind resumes at a keyframe.
    let queue = ChannelQueue::new(track.config().ring_capacity / 2, move || w.notify_one());
    let input = track.add_local_sink("SRTP key epoch", queue.clone())?;
    let (track_run, out) = (track.clone(), session.clone());
    let task = tokio::spawn(async move {
        run(&wake, &queue, inlet, feed_enc).await;
        track_run.remove_sink(input);
        tokio::task::spawn_blocking(move || out.close());
    })
    .abort_handle();
    tracing::info!(track = track.name(), epoch = n, "SRTP encryption started");
    Ok(Arc::new(Epoch { crypto, session, ctx: enc.ctx, counts: enc.counts, task }))
}

/// An epoch's encryption: the track's packets protected in place, once each.
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
        let seq = u16::from_be_bytes([buf[2], buf[3]]);
        let first = counts.packets.fetch_add(1, Relaxed) == 0;
        let last = counts.last_seq.swap(u32::from(seq), Relaxed) as u16;
        if !first && seq < last && last - seq > 0x8000 {
            counts.wrapped.store(true, Relaxed);
        }
        self.ctx.lock().protect_rtp_in(buf, len).ok()
    }
}

/// Hands the track's packets to the epoch's session (encrypted first with `enc`) until it
/// has had no client for `LINGER`.
async fn run(wake: &tokio::sync::Notify, queue: &ChannelQueue, mut inlet: Inlet, enc: Option<Encrypt>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut idle_since: Option<Instant> = None;
    let (mut frames, mut buf) = (Vec::new(), vec![0u8; 65_536]);
    loop {
        tokio::select! {
            _ = wake.notified() => {
                queue.drain(&mut frames);
                for (p, _) in frames.drain(..) {
                    let data = p.data();
                    // What the session refuses it counts.
                    match &enc {
                        Some(enc) => {
                            buf[..data.len()].copy_from_slice(data);
                            if let Some(n) = enc.apply(&mut buf, data.len()) {
                                inlet.hold(&buf[..n]);
                            }
                        }
                        None => _ = inlet.hold(data),
                    }
                }
                inlet.flush();
            }
            _ = tick.tick() => {
                if !inlet.session().sinks().is_empty() {
                    idle_since = None;
                } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= LINGER {
                    break;
                }
            }
        }
    }
    let out = inlet.session();
    tracing::info!(session = out.name(), "SRTP encryption stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joiner_needs_room_before_the_tracks_numbers_wrap() {
        assert!(has_room(10, 1000, false, None));
        assert!(!has_room(10, 1000, true, None), "wrapped since its first packet: ROC 1");
        assert!(!has_room(10, 65_000, false, None), "too close to the wrap");
        assert!(has_room(10, 65_535 - JOIN_MARGIN as u16 - 1, false, None));
        // An epoch with no packet yet starts where the track is, not at 0.
        assert!(!has_room(0, 0, false, Some(64_000)));
        assert!(has_room(0, 0, false, Some(100)));
    }

    #[test]
    fn epochs_without_clients_are_bounded_but_joining_never_is() {
        let waiting: Vec<usize> = (2..2 + MAX_UNPLAYED).collect();
        assert_eq!(choose(None, &[]), Choice::New);
        assert_eq!(choose(None, &waiting[..MAX_UNPLAYED - 1]), Choice::New);
        assert_eq!(choose(None, &waiting), Choice::Replace(2), "a DESCRIBE flood replaces its own oldest");
        assert_eq!(choose(Some(7), &waiting), Choice::Join(7), "sharing costs nothing");
    }
}
