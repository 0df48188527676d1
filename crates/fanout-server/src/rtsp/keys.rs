//! SRTP keys of RTSPS clients: each client's own, or one key shared by every client of a
//! track (then the packets are encrypted once), numbered by epoch.

use super::*;

impl Rtsp {
    /// The SRTP key epoch of `track` for a client on connection `conn`: the one its
    /// description gave, while that runs, else the one a description would give now.
    pub(super) fn epoch_for(
        &self,
        relay: &Relay,
        conn: u64,
        name: &str,
        track: &fanout_io::Session,
    ) -> std::io::Result<Arc<crate::srtp_out::Epoch>> {
        let given = self.conns.lock().get(&conn).and_then(|c| c.keys.lock().get(track.name()).cloned());
        match given.filter(|e| e.running()) {
            Some(e) => Ok(e),
            None => match relay.path(name) {
                Some(p) => p.srtp.epoch(track, &relay.engine, self.shared_keys()),
                None => Err(std::io::Error::other(format!("no session named {name:?}"))),
            },
        }
    }

    /// A description for an SRTP connection: each track `RTP/SAVP`, with its epoch's key
    /// (SDES, RFC 4568), remembered for the connection's PLAY; `RTP-Info` as the epoch
    /// session places a client (the track's numbers).
    /// `Ok(None)`: no such path (404); an error: no epoch could be had now (503).
    pub(super) fn keyed(
        &self,
        relay: &Relay,
        conn: u64,
        name: &str,
        mut res: Resource,
    ) -> std::io::Result<Option<Resource>> {
        let Some(path) = relay.path(name) else { return Ok(None) };
        let Some(me) = self.conns.lock().get(&conn).cloned() else { return Ok(None) };
        for (i, (m, t)) in res.sdp.media.iter_mut().zip(&path.tracks()).enumerate() {
            let epoch = match path.srtp.epoch(&t.session, &relay.engine, self.shared_keys()) {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(resource = name, conn, "no SRTP key: {e}");
                    return Err(e);
                }
            };
            m.proto = "RTP/SAVP".into();
            m.lines.retain(|(k, v)| !(*k == 'a' && (v.starts_with("crypto:") || v.starts_with("key-mgmt:"))));
            // The key twice: SDES for ffmpeg, MIKEY for GStreamer (and MediaMTX's clients).
            m.lines.push(('a', format!("crypto:{}", epoch.crypto.to_value())));
            let ssrc = t.session.rtp_ssrc().unwrap_or(0);
            m.lines.push(('a', format!("key-mgmt:mikey {}", epoch.mikey(ssrc))));
            if let Some(next) = res.next_rtp.get_mut(i) {
                *next = epoch.session.rtp_start().map(|(_, seq, ts)| (seq, ts));
            }
            me.keys.lock().insert(t.session.name().to_string(), epoch);
        }
        Ok(Some(res))
    }

    /// `res` with the first packet's numbers of the key epochs an SRTP client on `conn` joins
    /// at PLAY: the track's numbers, at the keyframe the epoch's ring holds.
    pub(super) fn epoch_numbers(&self, relay: &Relay, conn: u64, name: &str, mut res: Resource) -> Resource {
        for (next, t) in res.next_rtp.iter_mut().zip(relay.tracks(name)) {
            let epoch = self.epoch_for(relay, conn, name, &t.session).ok().and_then(|e| e.session.rtp_start());
            // An epoch keeps the track's numbers, but its payloads are ciphertext: where the
            // track names the same next packet, its time (which reads AAC frame counts) is used.
            *next = epoch.map(|(_, s, ts)| match t.session.rtp_start() {
                Some((_, plain, plain_ts)) if plain == s => (s, plain_ts),
                _ => (s, ts),
            });
        }
        res
    }

    pub(super) fn shared_keys(&self) -> bool {
        self.srtp != Some(crate::config::SrtpKeys::PerClient)
    }
}
