//! A WebRTC viewer of a relay's WHEP URL, for `fanout sub --read http://…/{path}/whep`: it
//! offers to receive H.264 video, completes ICE (it is the controlling, full agent; the relay
//! is ICE-lite) and DTLS on a UDP socket of its own, and counts the RTP payload bytes that
//! arrive, with `str0m` as the stack (the relay's own, on the other side).

use anyhow::{bail, Context};
use std::net::UdpSocket;
use std::sync::Arc;
use std::time::{Duration, Instant};
use str0m::change::SdpAnswer;
use str0m::media::{Direction, MediaKind};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, Input, Output, Rtc};

/// How long an offer answered 503 or 429 (too many peers connecting, in all or from this
/// address) is made again.
pub const RETRY_FOR: Duration = Duration::from_secs(60);

/// Plays `url` until `stop`: says on `ready` once media flows (or why it cannot); the
/// payload bytes it got.
pub fn play(url: &str, ready: &std::sync::mpsc::Sender<Result<(), String>>, stop: &crate::stop::Stop) -> u64 {
    let turn = stop.connect();
    match connect(url) {
        Ok((rtc, socket)) => run(rtc, &socket, ready, stop, turn),
        Err(e) => {
            let _ = ready.send(Err(format!("{e:#}")));
            0
        }
    }
}

/// A viewer of H.264 video at `local`, and its offer.
fn offerer(
    local: std::net::SocketAddr,
) -> anyhow::Result<(Rtc, str0m::change::SdpOffer, str0m::change::SdpPendingOffer)> {
    let mut rtc = Rtc::builder()
        .set_rtp_mode(true)
        .clear_codecs()
        .enable_h264(true)
        .set_crypto_provider(Arc::new(str0m::crypto::from_feature_flags()))
        .build(Instant::now());
    rtc.add_local_candidate(Candidate::host(local, "udp")?);
    let mut change = rtc.sdp_api();
    change.add_media(MediaKind::Video, Direction::RecvOnly, None, None, None);
    let (offer, pending) = change.apply().context("an offer")?;
    Ok((rtc, offer, pending))
}

/// A viewer's offer as `play` makes it, for a test of the WHEP resource that plays nothing.
pub fn sample_offer() -> anyhow::Result<String> {
    Ok(offerer(([127, 0, 0, 1], 9).into())?.1.to_sdp_string())
}

fn connect(url: &str) -> anyhow::Result<(Rtc, UdpSocket)> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    let (mut rtc, offer, pending) = offerer(socket.local_addr()?)?;
    // A relay with many peers still connecting answers 503 ("try again"), or 429 where this
    // address has many connecting (every viewer of a load shares it): so it does, for a
    // while, after a pause of its own (hundreds of viewers start at once).
    let give_up = Instant::now() + RETRY_FOR;
    let answer = loop {
        let r = ureq::post(url)
            .set("Content-Type", "application/sdp")
            .timeout(Duration::from_secs(10))
            .send_string(&offer.to_sdp_string());
        match r {
            Ok(r) => break r.into_string()?,
            Err(ureq::Error::Status(503 | 429, _)) if Instant::now() < give_up => {
                let jitter = u64::from(std::process::id() ^ socket.local_addr()?.port() as u32) % 400;
                std::thread::sleep(Duration::from_millis(200 + jitter));
            }
            Err(ureq::Error::Status(code, r)) => bail!("{url}: {code} {}", r.into_string().unwrap_or_default()),
            Err(e) => bail!("{url}: {e}"),
        }
    };
    let answer = SdpAnswer::from_sdp_string(&answer).map_err(|e| anyhow::anyhow!("the answer: {e}"))?;
    rtc.sdp_api().accept_answer(pending, answer)?;
    Ok((rtc, socket))
}

fn run(
    mut rtc: Rtc,
    socket: &UdpSocket,
    ready: &std::sync::mpsc::Sender<Result<(), String>>,
    stop: &crate::stop::Stop,
    turn: crate::stop::Connecting<'_>,
) -> u64 {
    let mut turn = Some(turn);
    let local = socket.local_addr().expect("bound");
    let (mut buf, mut bytes, mut told) = (vec![0u8; 2048], 0u64, false);
    let connect_by = Instant::now() + Duration::from_secs(30);
    while !stop.reached() {
        let wait = match rtc.poll_output() {
            Ok(Output::Transmit(t)) => {
                let _ = socket.send_to(&t.contents, t.destination);
                continue;
            }
            Ok(Output::Event(Event::RtpPacket(p))) => {
                bytes += p.payload.len() as u64;
                if !told {
                    told = true;
                    turn.take();
                    let _ = ready.send(Ok(()));
                }
                continue;
            }
            Ok(Output::Event(_)) => continue,
            Ok(Output::Timeout(t)) => t.saturating_duration_since(Instant::now()),
            Err(e) => {
                if !told {
                    let _ = ready.send(Err(e.to_string()));
                }
                return bytes;
            }
        };
        if !told && Instant::now() > connect_by {
            let _ = ready.send(Err("no media within 30 s".into()));
            return bytes;
        }
        let wait = wait.clamp(Duration::from_millis(1), Duration::from_millis(100));
        let _ = socket.set_read_timeout(Some(wait));
        let input = match socket.recv_from(&mut buf) {
            Ok((n, source)) => match buf[..n].try_into() {
                Ok(contents) => Input::Receive(
                    Instant::now(),
                    Receive { proto: Protocol::Udp, source, destination: local, contents },
                ),
                Err(_) => continue,
            },
            Err(_) => Input::Timeout(Instant::now()),
        };
        if rtc.handle_input(input).is_err() {
            break;
        }
    }
    bytes
}
