//! `fanout sub --read URL --count N`: N players of one RTMP, SRT or WebRTC (WHEP) stream in
//! one process, a thread each (what a bench puts on a server apart from the server's own
//! CPU). RTMP players play and acknowledge; SRT readers call with the URL's stream id; WebRTC
//! viewers offer, connect and receive H.264 (`whep`), 32 connecting at a time. Prints
//! `sub: ready` once all are playing (one that cannot is an error), reads for `--duration`
//! from then, then prints a JSON line: players, bytes (total, least).

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
