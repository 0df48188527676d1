//! A forward over SRT: libsrt as a caller, the path's MPEG-TS in SRT's live payloads.

use super::{Target, FLUSH, SETUP};
use crate::readers::Held;
use fanout_proto::srt::SrtUrl;

/// Publishes the path's MPEG-TS (`session`: what its SRT and HTTP TS players get) to an SRT
/// listener until the stream ends, the target fails or `stop` is set; why it ended. Blocking
/// (libsrt's sockets are): run on a thread of its own. `pushed`: set once media went out.
pub(crate) fn push_srt(
    url: &SrtUrl,
    latency_ms: u32,
    target: &Target,
    session: &fanout_io::Session,
    held: &Held,
    stop: &std::sync::atomic::AtomicBool,
    pushed: &mut bool,
) -> String {
    use std::net::ToSocketAddrs;
    let addr = match (url.host.as_str(), url.port).to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return format!("{} has no address", url.host),
        Err(e) => return format!("{}: {e}", url.host),
    };
    let settings = fanout_srt::Settings {
        latency_ms: url.latency_ms.or(Some(latency_ms)),
        passphrase: url.passphrase.clone(),
        pbkeylen: url.pbkeylen,
        streamid: url.streamid.clone(),
        ..fanout_srt::Settings::default()
    };
    let socket = match fanout_srt::Socket::connect(addr, &settings, SETUP.as_millis() as u32) {
        Ok(s) => s,
        Err(e) => return format!("did not connect: {e}"),
    };
    // A full send buffer is a target behind by its latency and more: cut off, never waited for.
    if let Err(e) = socket.set_nonblocking_send() {
        return e.to_string();
    }
    let queue = fanout_io::channel::ChannelQueue::new(session.config().ring_capacity / 2, || {});
    let sink = match session.add_local_sink("SRT forward", queue.clone()) {
        Ok(id) => id,
        Err(e) => return format!("the path's MPEG-TS: {e}"),
    };
    tracing::info!(url = %target.shown, "forward: pushing");
    target.set_state("pushing");
    let mut frames = Vec::new();
    let why = loop {
        std::thread::sleep(FLUSH);
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break "the path went".to_string();
        }
        if let Some(why) = held.end.ended() {
            break why;
        }
        if socket.state() != fanout_srt::State::Connected {
            break "the server closed the connection".into();
        }
        queue.drain(&mut frames);
        let (mut bytes, mut packets) = (0, 0);
        let sent = frames.iter().flat_map(|(p, _)| p.payload().chunks(fanout_srt::TS_PAYLOAD)).try_for_each(|c| {
            socket.send(c)?;
            bytes += c.len();
            packets += 1;
            Ok::<_, fanout_srt::Error>(())
        });
        frames.clear();
        held.sent(bytes, packets);
        target.sent(bytes);
        *pushed |= bytes > 0;
        if let Err(e) = sent {
            break format!("the server does not take the stream as fast as it comes: {e}");
        }
    };
    session.remove_sink(sink);
    why
}
