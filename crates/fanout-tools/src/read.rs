//! `fanout sub --read URL --count N`: N players of one RTMP, SRT or WebRTC (WHEP) stream in
//! one process (what a bench puts on a server apart from the server's own CPU). RTMP players
//! set up a few at a time, then are read together by one epoll loop: each one's messages
//! parsed, its tags checked in order, acknowledged as RTMP asks. SRT readers (calling with
//! the URL's stream id) and WebRTC viewers (offer, connect and receive H.264 (`whep`), 32
//! connecting at a time) are a thread each. Prints `sub: ready` once all are playing (one
//! that cannot is an error), reads for `--duration` from then, then prints a JSON line:
//! players, bytes (total, least), and for RTMP the tags and any out of order.

use crate::stop::Stop;
use anyhow::{bail, Context};
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

enum Target {
    Rtmp { addr: std::net::SocketAddr, app: String, name: String },
    Srt { addr: std::net::SocketAddr, settings: fanout_srt::Settings },
    Whep { url: String },
}

fn target(url: &str) -> anyhow::Result<Target> {
    if url.starts_with("rtmp://") {
        let (addr, app, name) = crate::rtmp::parse_url(url)?;
        return Ok(Target::Rtmp { addr, app, name });
    }
    if url.starts_with("srt://") {
        let u = fanout_proto::srt::parse_url(url).map_err(anyhow::Error::msg)?;
        let addr = (u.host.as_str(), u.port).to_socket_addrs()?.next().context("no address")?;
        let settings = fanout_srt::Settings {
            streamid: u.streamid,
            passphrase: u.passphrase,
            pbkeylen: u.pbkeylen,
            latency_ms: u.latency_ms,
            ..fanout_srt::Settings::default()
        };
        return Ok(Target::Srt { addr, settings });
    }
    if (url.starts_with("http://") || url.starts_with("https://")) && url.ends_with("/whep") {
        return Ok(Target::Whep { url: url.to_string() });
    }
    bail!("{url:?}: --read takes rtmp://, srt:// or a WHEP URL (http://…/whep)")
}

/// One player: connects, says so, reads until `until` (a WebRTC viewer until `stop`); its
/// bytes.
fn play(t: &Target, ready: std::sync::mpsc::Sender<Result<(), String>>, until: Instant, stop: &Stop) -> u64 {
    match t {
        Target::Rtmp { addr, app, name } => match crate::rtmp::Client::play(*addr, app, name) {
            Ok(mut c) => {
                let _ = ready.send(Ok(()));
                c.read_all(until).unwrap_or(0)
            }
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                0
            }
        },
        Target::Srt { addr, settings } => match fanout_srt::Socket::connect(*addr, settings, 3000) {
            Ok(s) => {
                let _ = ready.send(Ok(()));
                let _ = s.set_recv_timeout(200);
                let mut buf = [0u8; 1500];
                let mut total = 0u64;
                while Instant::now() < until {
                    match s.recv(&mut buf) {
                        Ok(n) => total += n as u64,
                        Err(e) if e.is_timeout() => {}
                        Err(_) => break,
                    }
                }
                total
            }
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                0
            }
        },
        Target::Whep { url } => crate::whep::play(url, &ready, stop),
    }
}

pub fn run(url: &str, count: usize, duration: f64) -> anyhow::Result<()> {
    let t = std::sync::Arc::new(target(url)?);
    if let Target::Rtmp { addr, app, name } = &*t {
        return rtmp_players(*addr, app, name, count, duration);
    }
    // Connecting takes a moment per player (WebRTC viewers may be told to try again while
    // many connect): the reading starts after, for `duration`.
    let connecting = match *t {
        Target::Whep { .. } => crate::whep::RETRY_FOR + Duration::from_secs(10),
        _ => Duration::from_secs(10),
    };
    let until = Instant::now() + connecting + Duration::from_secs_f64(duration);
    let stop = std::sync::Arc::new(Stop::new(until));
    let (tx, rx) = std::sync::mpsc::channel();
    let players: Vec<_> = (0..count)
        .map(|i| {
            let (t, tx, stop) = (t.clone(), tx.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("read-{i}"))
                .stack_size(256 << 10)
                .spawn(move || play(&t, tx, until, &stop))
        })
        .collect::<Result<_, _>>()?;
    let mut failed = Vec::new();
    for _ in 0..count {
        match rx.recv_timeout(connecting) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed.push(e),
            Err(_) => failed.push("no answer within 10 s".into()),
        }
    }
    // A bench counts on every player playing: one that cannot is an error, not a number.
    if let Some(e) = failed.first() {
        bail!("{} of {count} players could not play {url}: {e}", failed.len());
    }
    stop.set(Instant::now() + Duration::from_secs_f64(duration));
    println!("sub: ready");
    let bytes: Vec<u64> = players.into_iter().map(|p| p.join().unwrap_or(0)).collect();
    let out = serde_json::json!({
        "players": count,
        "bytes": bytes.iter().sum::<u64>(),
        "least_bytes": bytes.iter().min(),
    });
    println!("{out}");
    Ok(())
}

/// RTMP players set up at once.
const RTMP_SETTING_UP: usize = 16;

/// One RTMP player of the epoll loop.
struct RtmpPlayer {
    tcp: mio::net::TcpStream,
    reader: fanout_proto::rtmp::chunk::ChunkReader,
    bytes: u64,
    acked: u64,
    tags: u64,
    /// The last video and audio timestamps (a tag before its kind's last is out of order).
    last_ms: [Option<u32>; 2],
    out_of_order: u64,
    closed: bool,
}

impl RtmpPlayer {
    /// Reads what is there, takes its messages, acknowledges every 1.25 MB (half the usual
    /// window, as `Client::read_all`).
    fn read(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        use fanout_proto::rtmp::chunk::kind;
        use std::io::{Read, Write};
        loop {
            match self.tcp.read(buf) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => {
                    self.bytes += n as u64;
                    self.reader.push(&buf[..n]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        while let Some(m) = self.reader.next_message()? {
            match m.kind {
                kind::SET_CHUNK_SIZE if m.payload.len() >= 4 => {
                    let size = u32::from_be_bytes([m.payload[0], m.payload[1], m.payload[2], m.payload[3]]);
                    self.reader.set_chunk_size(size)?;
                }
                kind::VIDEO | kind::AUDIO => {
                    self.tags += 1;
                    let last = &mut self.last_ms[usize::from(m.kind == kind::AUDIO)];
                    if last.is_some_and(|l| m.timestamp < l) {
                        self.out_of_order += 1;
                    }
                    *last = Some(m.timestamp);
                }
                _ => {}
            }
        }
        if let Some(ack) = crate::rtmp::ack_due(self.bytes, &mut self.acked) {
            // (A few bytes into an empty send buffer: a short write would be a broken peer.)
            let _ = self.tcp.write(&ack);
        }
        Ok(())
    }
}

/// `count` RTMP players of `app`/`name` at `addr`: set up `RTMP_SETTING_UP` at a time, then
/// read by one epoll loop for `duration`.
fn rtmp_players(addr: std::net::SocketAddr, app: &str, name: &str, count: usize, duration: f64) -> anyhow::Result<()> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let setup = |_| -> anyhow::Result<Vec<RtmpPlayer>> {
        let mut mine = Vec::new();
        while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < count {
            let (tcp, reader) = crate::rtmp::Client::play(addr, app, name)?.into_parts();
            tcp.set_nonblocking(true)?;
            mine.push(RtmpPlayer {
                tcp: mio::net::TcpStream::from_std(tcp),
                reader,
                bytes: 0,
                acked: 0,
                tags: 0,
                last_ms: [None; 2],
                out_of_order: 0,
                closed: false,
            });
        }
        Ok(mine)
    };
    let started = Instant::now();
    let mut players = Vec::with_capacity(count);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..RTMP_SETTING_UP.min(count)).map(|i| s.spawn(move || setup(i))).collect();
        for w in workers {
            let mine = w.join().map_err(|_| anyhow::anyhow!("a setup thread panicked"))?;
            players.extend(mine.with_context(|| format!("an RTMP player of rtmp://{addr}/{app}/{name}"))?);
        }
        Ok(())
    })?;
    eprintln!("sub: {count} RTMP players set up in {:.1} s", started.elapsed().as_secs_f64());
    let mut poll = mio::Poll::new()?;
    for (i, p) in players.iter_mut().enumerate() {
        poll.registry().register(&mut p.tcp, mio::Token(i), mio::Interest::READABLE)?;
    }
    println!("sub: ready");
    // What the players set up first got meanwhile is read first, not counted apart.
    let until = Instant::now() + Duration::from_secs_f64(duration);
    let mut events = mio::Events::with_capacity(1024);
    let mut buf = vec![0u8; 64 << 10];
    for p in &mut players {
        p.read(&mut buf)?;
    }
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        poll.poll(&mut events, Some(left.min(Duration::from_millis(200))))?;
        for e in &events {
            players[e.token().0].read(&mut buf)?;
        }
    }
    let closed = players.iter().filter(|p| p.closed).count();
    let bytes: Vec<u64> = players.iter().map(|p| p.bytes).collect();
    let out = serde_json::json!({
        "players": count,
        "bytes": bytes.iter().sum::<u64>(),
        "least_bytes": bytes.iter().min(),
        "tags": players.iter().map(|p| p.tags).sum::<u64>(),
        "least_tags": players.iter().map(|p| p.tags).min(),
        "out_of_order": players.iter().map(|p| p.out_of_order).sum::<u64>(),
        "closed": closed,
    });
    println!("{out}");
    Ok(())
}
