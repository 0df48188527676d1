//! The relay's RTSP client, as a state machine: responses in, requests out.
//!
//! Playing an upstream: OPTIONS → DESCRIBE → SETUP (every media section) → PLAY. Publishing
//! to a server ([`Client::recorder`], a path's `forward`): OPTIONS → ANNOUNCE (our
//! description) → SETUP (every section, interleaved, `mode=record`) → RECORD. Then a
//! keep-alive (GET_PARAMETER where the server lists it, else OPTIONS) at half the session
//! timeout, and TEARDOWN when the relay lets go. A 401 is answered once with Basic or Digest
//! credentials from the URL. The caller owns the connection, the clock and the UDP ports: it
//! feeds every response to [`Client::on_response`] and sends what comes back.

use crate::rtsp::sdp::Sdp;
use crate::rtsp::{parse_session, Headers, Lower, Request, Response};

/// An `rtsp://[user[:pass]@]host[:port]/path` URL, or `rtsps://` (RTSP over TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// `rtsps://`: the connection is TLS (default port 322, RFC 7826).
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// From the first `/` on (`/` when empty).
    pub path: String,
    pub user: Option<String>,
    pub pass: Option<String>,
}

impl Url {
    pub fn parse(s: &str) -> Result<Self, crate::Invalid> {
        let (tls, rest) = match (s.strip_prefix("rtsp://"), s.strip_prefix("rtsps://")) {
            (Some(r), _) => (false, r),
            (_, Some(r)) => (true, r),
            _ => return Err(format!("{s:?} is not an rtsp:// or rtsps:// URL").into()),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (creds, hostport) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (user, pass) = match creds {
            Some(c) => match c.split_once(':') {
                Some((u, p)) => (Some(percent_decode(u)), Some(percent_decode(p))),
                None => (Some(percent_decode(c)), None),
            },
            None => (None, None),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or("unclosed [ in the URL's host")?;
            (h.to_string(), after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (hostport.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(format!("{s:?} has no host").into());
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| format!("bad port {p:?} in {s:?}"))?,
            None if tls => 322,
            None => 554,
        };
        Ok(Self { tls, host, port, path: path.to_string(), user, pass })
    }

    /// The URL without credentials, as requests name it.
    pub fn request_url(&self) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        let scheme = if self.tls { "rtsps" } else { "rtsp" };
        format!("{scheme}://{host}:{}{}", self.port, self.path)
    }
}

pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where the client is in the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Options,
    Describe,
    /// A recorder's ANNOUNCE.
    Announce,
    /// Waiting for the caller's transports ([`Client::setup`]).
    Described,
    Setup(usize),
    Play,
    Playing,
    TearingDown,
}

/// One set-up media section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Track {
    pub control: String,
    /// What the server answered in `Transport`: its ports (UDP) or the channels (TCP).
    pub server_ports: Option<(u16, u16)>,
    pub lower: Lower,
    /// From `RTP-Info` in the PLAY answer.
    pub rtp_info: Option<(Option<u16>, Option<u32>)>,
}

/// What the caller does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send these bytes on the connection.
    Send(Vec<u8>),
    /// The description arrived: open ports for its media and call [`Client::setup`].
    Described(Sdp),
    /// The stream flows (from the server, or to it: RECORD was answered).
    Playing,
    /// Nothing to do (a keep-alive answered).
    Idle,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{method}: {message}")]
pub struct ClientError {
    pub method: String,
    /// The upstream's status, when it answered one.
    pub status: Option<u16>,
    pub message: String,
}

pub struct Client {
    url: Url,
    user_agent: String,
    cseq: u32,
    phase: Phase,
    /// The request in flight, kept to resend with credentials.
    pending: Option<Request>,
    authorized_retry: bool,
    www_auth: Option<String>,
    get_parameter: bool,
    base: String,
    pub sdp: Option<Sdp>,
    pub tracks: Vec<Track>,
    pub session: Option<String>,
    /// Seconds, from the `Session` header (60 when the server says none: RFC 2326 §12.37).
    pub timeout_s: u64,
    last_sent_ms: u64,
    /// Ask for SRTP (`RTP/SAVP`), e.g. of an RTSPS server whose description gave keys.
    pub savp: bool,
    /// Our own SRTP key for the SRTCP we send, per media section, as a base64 MIKEY message:
    /// sent in SAVP SETUPs as `KeyMgmt` (RFC 4567 §3.3), which MediaMTX requires.
    pub key_mgmt: Vec<String>,
    /// A recorder: the description it announces (it publishes, over interleaved TCP).
    record: Option<Sdp>,
}

impl Client {
    pub fn new(url: Url, user_agent: &str) -> Self {
        let base = url.request_url();
        Self {
            url,
            user_agent: user_agent.to_string(),
            cseq: 0,
            phase: Phase::Options,
            pending: None,
            authorized_retry: false,
            www_auth: None,
            get_parameter: false,
            base,
            sdp: None,
            tracks: Vec::new(),
            session: None,
            timeout_s: 60,
            last_sent_ms: 0,
            savp: false,
            key_mgmt: Vec::new(),
            record: None,
        }
    }

    /// A client that publishes `sdp`'s media to `url`: its tracks go interleaved, media
    /// section `i` on channels `2i` and `2i + 1` (or those the server moves them to, in
    /// [`Client::tracks`]), once [`Step::Playing`] says RECORD was answered.
    pub fn recorder(url: Url, user_agent: &str, sdp: Sdp) -> Self {
        Self { record: Some(sdp), ..Self::new(url, user_agent) }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The first request (OPTIONS).
    pub fn start(&mut self, now_ms: u64) -> Vec<u8> {
        let url = self.url.request_url();
        self.request("OPTIONS", &url, Headers::default(), now_ms)
    }

    fn request(&mut self, method: &str, uri: &str, headers: Headers, now_ms: u64) -> Vec<u8> {
        self.request_with(method, uri, headers, Vec::new(), now_ms)
    }

    fn request_with(&mut self, method: &str, uri: &str, mut headers: Headers, body: Vec<u8>, now_ms: u64) -> Vec<u8> {
        self.cseq += 1;
        headers.set("CSeq", self.cseq.to_string());
        headers.set("User-Agent", self.user_agent.clone());
        if let Some(s) = &self.session {
            headers.set("Session", s.clone());
        }
        let mut req = Request { method: method.to_string(), uri: uri.to_string(), headers, body };
        if let Some(a) = self.authorize(&req) {
            req.headers.set("Authorization", a);
        }
        let mut out = Vec::new();
        req.write(&mut out);
        self.pending = Some(req);
        self.last_sent_ms = now_ms;
        out
    }

    /// Credentials for `req` once the server asked for them.
    fn authorize(&self, req: &Request) -> Option<String> {
        let challenge = self.www_auth.as_deref()?;
        let user = self.url.user.as_deref()?;
        let pass = self.url.pass.as_deref().unwrap_or("");
        crate::rtsp::authorization(challenge, user, pass, &req.method, &req.uri)
    }

    fn fail(&self, status: Option<u16>, message: impl Into<String>) -> ClientError {
        let method = self.pending.as_ref().map_or("RTSP", |r| r.method.as_str()).to_string();
        ClientError { method, status, message: message.into() }
    }

    /// The control URL of a media section, resolved against the base.
    fn control_url(&self, control: Option<&str>) -> String {
        match control {
            None | Some("*") => self.base.clone(),
            Some(c) if c.starts_with("rtsp://") || c.starts_with("rtsps://") => c.to_string(),
            Some(c) => {
                let sep = if self.base.ends_with('/') { "" } else { "/" };
                format!("{}{sep}{c}", self.base)
            }
        }
    }

    /// The transports to request, one per media section of the description, after
    /// [`Step::Described`]. Returns the first SETUP.
    pub fn setup(&mut self, lowers: Vec<Lower>, now_ms: u64) -> Result<Vec<u8>, ClientError> {
        if self.record.is_some() && self.phase != Phase::Announce {
            return Err(self.fail(None, "a recorder sets up its tracks itself, once announced"));
        }
        let sdp = self.sdp.as_ref().ok_or_else(|| self.fail(None, "SETUP before a description"))?;
        if lowers.len() != sdp.media.len() {
            return Err(self.fail(None, format!("{} transports for {} media", lowers.len(), sdp.media.len())));
        }
        let controls: Vec<String> = sdp
            .media
            .iter()
            .map(|m| m.attr("control").map(str::to_string))
            .map(|c| self.control_url(c.as_deref()))
            .collect();
        self.tracks = controls
            .into_iter()
            .zip(lowers)
            .map(|(control, lower)| Track { control, server_ports: None, lower, rtp_info: None })
            .collect();
        self.phase = Phase::Setup(0);
        Ok(self.setup_request(0, now_ms))
    }

    fn setup_request(&mut self, i: usize, now_ms: u64) -> Vec<u8> {
        let t = &self.tracks[i];
        let profile = if self.savp { "RTP/SAVP" } else { "RTP/AVP" };
        let transport = match t.lower {
            Lower::Udp { client_rtp, client_rtcp } => {
                format!("{profile};unicast;client_port={client_rtp}-{client_rtcp}")
            }
            Lower::Interleaved { rtp, rtcp } => format!("{profile}/TCP;unicast;interleaved={rtp}-{rtcp}"),
            Lower::Multicast { .. } => format!("{profile};multicast"),
        };
        let transport = if self.record.is_some() { format!("{transport};mode=record") } else { transport };
        let mut h = Headers::default();
        h.set("Transport", transport);
        let url = t.control.clone();
        if let Some(data) = self.key_mgmt.get(i).filter(|_| self.savp) {
            h.set("KeyMgmt", format!("prot=mikey; uri=\"{url}\"; data=\"{data}\""));
        }
        self.request("SETUP", &url, h, now_ms)
    }

    /// Feeds one response from the upstream.
    pub fn on_response(&mut self, resp: &Response, now_ms: u64) -> Result<Step, ClientError> {
        let Some(pending) = self.pending.clone() else {
            return Ok(Step::Idle); // unsolicited: ignore
        };
        if resp.headers.cseq().is_some_and(|c| c != self.cseq) {
            return Ok(Step::Idle); // an answer to an older request
        }
        if resp.status == 401 && !self.authorized_retry && self.url.user.is_some() {
            if let Some(ch) = resp.headers.get("WWW-Authenticate") {
                self.www_auth = Some(best_challenge(&resp.headers).unwrap_or(ch).to_string());
                self.authorized_retry = true;
                let uri = pending.uri.clone();
                let mut h = pending.headers.clone();
                h.0.retain(|(n, _)| !n.eq_ignore_ascii_case("Authorization"));
                return Ok(Step::Send(self.request_with(&pending.method, &uri, h, pending.body, now_ms)));
            }
        }
        if resp.status == 401 {
            let why = if self.url.user.is_some() {
                "the credentials were refused"
            } else {
                "the upstream needs credentials (user:pass@ in the URL)"
            };
            return Err(self.fail(Some(401), why));
        }
        self.authorized_retry = false;
        if !(200..300).contains(&resp.status) {
            // A keep-alive OPTIONS/GET_PARAMETER that fails is not fatal: servers differ.
            if self.phase == Phase::Playing {
                return Ok(Step::Idle);
            }
            return Err(self.fail(Some(resp.status), format!("{} {}", resp.status, resp.reason)));
        }
        self.pending = None;
        match self.phase {
            Phase::Options => {
                self.get_parameter = resp
                    .headers
                    .get("Public")
                    .is_some_and(|p| p.split(',').any(|m| m.trim().eq_ignore_ascii_case("GET_PARAMETER")));
                if let Some(sdp) = &self.record {
                    let body = sdp.write().into_bytes();
                    let mut h = Headers::default();
                    h.set("Content-Type", "application/sdp");
                    self.phase = Phase::Announce;
                    let url = self.url.request_url();
                    return Ok(Step::Send(self.request_with("ANNOUNCE", &url, h, body, now_ms)));
                }
                let mut h = Headers::default();
                h.set("Accept", "application/sdp");
                self.phase = Phase::Describe;
                let url = self.url.request_url();
                Ok(Step::Send(self.request("DESCRIBE", &url, h, now_ms)))
            }
            Phase::Describe => {
                let text = String::from_utf8_lossy(&resp.body);
                let sdp = Sdp::parse(&text).map_err(|e| self.fail(Some(resp.status), format!("bad SDP: {e}")))?;
                if sdp.media.is_empty() {
                    return Err(self.fail(Some(resp.status), "the description has no media"));
                }
                if let Some(b) = resp.headers.get("Content-Base").or_else(|| resp.headers.get("Content-Location")) {
                    self.base = b.trim().to_string();
                }
                // A session-level absolute control overrides the base.
                if let Some(c) = sdp.attr("control").filter(|c| c.starts_with("rtsp://")) {
                    self.base = c.to_string();
                }
                self.sdp = Some(sdp.clone());
                self.phase = Phase::Described;
                Ok(Step::Described(sdp))
            }
            Phase::Announce => {
                let sdp = self.record.clone().expect("a recorder announces");
                self.sdp = Some(sdp.clone());
                let lowers = (0..sdp.media.len())
                    .map(|i| Lower::Interleaved { rtp: (2 * i) as u8, rtcp: (2 * i + 1) as u8 })
                    .collect();
                Ok(Step::Send(self.setup(lowers, now_ms)?))
            }
            Phase::Setup(i) => {
                let Some(sess) = resp.headers.get("Session") else {
                    return Err(self.fail(Some(resp.status), "SETUP answer without a Session"));
                };
                let (id, timeout) = parse_session(sess);
                self.session = Some(id);
                if let Some(t) = timeout.filter(|t| *t > 0) {
                    self.timeout_s = t;
                }
                let server_ports = resp.headers.get("Transport").and_then(server_transport);
                let chosen = resp
                    .headers
                    .get("Transport")
                    .and_then(|t| crate::rtsp::parse_transport(t).into_iter().next()?.lower);
                let track = &mut self.tracks[i];
                track.server_ports = server_ports;
                match (track.lower, chosen) {
                    // Servers may move interleaved channels: follow them.
                    (Lower::Interleaved { .. }, Some(l @ Lower::Interleaved { .. })) => track.lower = l,
                    (Lower::Udp { .. }, Some(Lower::Interleaved { .. })) => {
                        return Err(self.fail(Some(resp.status), "asked for UDP, the server answered TCP"))
                    }
                    _ => {}
                }
                if i + 1 < self.tracks.len() {
                    self.phase = Phase::Setup(i + 1);
                    return Ok(Step::Send(self.setup_request(i + 1, now_ms)));
                }
                self.phase = Phase::Play;
                let url = self.base.clone();
                if self.record.is_some() {
                    return Ok(Step::Send(self.request("RECORD", &url, Headers::default(), now_ms)));
                }
                let mut h = Headers::default();
                h.set("Range", "npt=0.000-");
                Ok(Step::Send(self.request("PLAY", &url, h, now_ms)))
            }
            Phase::Play => {
                if let Some(info) = resp.headers.get("RTP-Info") {
                    for entry in info.split(',') {
                        let mut url = None;
                        let (mut seq, mut ts) = (None, None);
                        for p in entry.split(';').map(str::trim) {
                            match p.split_once('=') {
                                Some(("url", v)) => url = Some(v),
                                Some(("seq", v)) => seq = v.trim().parse().ok(),
                                Some(("rtptime", v)) => ts = v.trim().parse().ok(),
                                _ => {}
                            }
                        }
                        let n = self.tracks.len();
                        let hit = url
                            .and_then(|u| {
                                self.tracks
                                    .iter()
                                    .position(|t| t.control == u || t.control.ends_with(u) || u.ends_with(&t.control))
                            })
                            .or((n == 1).then_some(0));
                        if let Some(i) = hit {
                            self.tracks[i].rtp_info = Some((seq, ts));
                        }
                    }
                }
                self.phase = Phase::Playing;
                Ok(Step::Playing)
            }
            Phase::Playing | Phase::TearingDown | Phase::Described => Ok(Step::Idle),
        }
    }

    /// A keep-alive when half the session timeout passed since the last request.
    pub fn keepalive(&mut self, now_ms: u64) -> Option<Vec<u8>> {
        if self.phase != Phase::Playing || now_ms.saturating_sub(self.last_sent_ms) < self.timeout_s * 500 {
            return None;
        }
        let method = if self.get_parameter { "GET_PARAMETER" } else { "OPTIONS" };
        let url = self.base.clone();
        Some(self.request(method, &url, Headers::default(), now_ms))
    }

    /// When the next keep-alive is due (ms, same clock as the calls).
    pub fn keepalive_at(&self) -> u64 {
        self.last_sent_ms + self.timeout_s * 500
    }

    /// TEARDOWN, if a session was set up.
    pub fn teardown(&mut self, now_ms: u64) -> Option<Vec<u8>> {
        self.session.as_ref()?;
        self.phase = Phase::TearingDown;
        let url = self.base.clone();
        Some(self.request("TEARDOWN", &url, Headers::default(), now_ms))
    }
}

/// Digest over Basic when the server offers both.
fn best_challenge(h: &Headers) -> Option<&str> {
    let all: Vec<&str> =
        h.0.iter().filter(|(n, _)| n.eq_ignore_ascii_case("WWW-Authenticate")).map(|(_, v)| v.as_str()).collect();
    all.iter().find(|v| v.trim_start().to_ascii_lowercase().starts_with("digest")).or(all.first()).copied()
}

/// `server_port=a-b` or `interleaved=a-b` of a SETUP answer's Transport.
fn server_transport(t: &str) -> Option<(u16, u16)> {
    t.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        if !k.eq_ignore_ascii_case("server_port") && !k.eq_ignore_ascii_case("interleaved") {
            return None;
        }
        let (a, b) = v.split_once('-').unwrap_or((v, ""));
        let a: u16 = a.trim().parse().ok()?;
        Some((a, b.trim().parse().unwrap_or(a.wrapping_add(1))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtsp::{parse, Limits, Message};

    fn req_of(bytes: &[u8]) -> Request {
        match parse(bytes, &Limits::default()).unwrap().unwrap().0 {
            Message::Request(r) => r,
            m => panic!("not a request: {m:?}"),
        }
    }

    fn resp(status: u16, cseq: u32, headers: &[(&str, &str)], body: &str) -> Response {
        let mut r = Response::new(status, Some(cseq));
        for (n, v) in headers {
            r.headers.0.push((n.to_string(), v.to_string()));
        }
        r.body = body.as_bytes().to_vec();
        r
    }

    fn send(s: Step) -> Request {
        match s {
            Step::Send(b) => req_of(&b),
            s => panic!("expected a request, got {s:?}"),
        }
    }

    const SDP: &str = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=cam\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=control:trackID=0\r\nm=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\na=control:trackID=1\r\n";

    /// Replays a captured exchange: our requests must be the ones we sent then, and the
    /// server's real answers must bring the client to Playing with what they said.
    fn replay(client_txt: &[u8], server_txt: &[u8], url: &str) -> Client {
        let all = |b: &[u8]| {
            let (mut v, mut rest) = (Vec::new(), b);
            while let Ok(Some((m, used))) = parse(rest, &Limits::default()) {
                v.push(m);
                rest = &rest[used..];
            }
            v
        };
        let sent: Vec<Request> = all(client_txt)
            .into_iter()
            .filter_map(|m| if let Message::Request(r) = m { Some(r) } else { None })
            .collect();
        let answers: Vec<Response> = all(server_txt)
            .into_iter()
            .filter_map(|m| if let Message::Response(r) = m { Some(r) } else { None })
            .collect();
        let same = |ours: &Request, theirs: &Request| {
            assert_eq!((&ours.method, &ours.uri), (&theirs.method, &theirs.uri));
            assert_eq!(ours.headers.get("Transport"), theirs.headers.get("Transport"));
            assert_eq!(ours.headers.get("Session"), theirs.headers.get("Session"));
        };
        let mut c = Client::new(Url::parse(url).unwrap(), "fanout/0.1.0");
        same(&req_of(&c.start(0)), &sent[0]);
        for (i, a) in answers.iter().enumerate().take(sent.len() - 1) {
            match c.on_response(a, 0).unwrap() {
                Step::Send(b) => same(&req_of(&b), &sent[i + 1]),
                Step::Described(sdp) => {
                    // The client ports we offered then, from the captured SETUPs.
                    let lowers = sent
                        .iter()
                        .filter(|r| r.method == "SETUP")
                        .map(|r| crate::rtsp::parse_transport(r.headers.get("Transport").unwrap())[0].lower.unwrap())
                        .collect::<Vec<_>>();
                    assert_eq!(lowers.len(), sdp.media.len());
                    same(&req_of(&c.setup(lowers, 0).unwrap()), &sent[i + 1]);
                }
                Step::Playing => {
                    assert_eq!(c.phase(), Phase::Playing);
                    same(&req_of(&c.teardown(0).unwrap()), &sent[i + 1]);
                }
                Step::Idle => panic!("answer {i} left the client idle"),
            }
        }
        c
    }

    #[test]
    fn replays_a_captured_mediamtx_exchange() {
        let c = replay(
            include_bytes!("../../fixtures/rtsp/mediamtx-client.txt"),
            include_bytes!("../../fixtures/rtsp/mediamtx-server.txt"),
            "rtsp://127.0.0.1:28700/live",
        );
        assert_eq!(c.tracks.len(), 2);
        assert_eq!(c.tracks[1].control, "rtsp://127.0.0.1:28700/live/trackID=1");
        assert_eq!(c.tracks[0].server_ports, Some((28000, 28001)));
        // MediaMTX's RTP-Info names the tracks without seq/rtptime.
        assert_eq!(c.tracks[0].rtp_info, Some((None, None)));
        assert_eq!(c.timeout_s, 60);
    }

    #[test]
    fn replays_a_captured_live555_exchange() {
        let c = replay(
            include_bytes!("../../fixtures/rtsp/live555-client.txt"),
            include_bytes!("../../fixtures/rtsp/live555-server.txt"),
            "rtsp://127.0.0.1:28701/cam",
        );
        // live555 names its tracks track1/track2 under a Content-Base on its own port.
        assert_eq!(c.tracks[0].control, "rtsp://127.0.0.1:28600/cam/track1");
        assert_eq!(c.tracks[1].server_ports, Some((6972, 6973)));
        assert_eq!(c.tracks[0].rtp_info, Some((Some(37558), Some(373_488_834))));
        assert_eq!(c.tracks[1].rtp_info, Some((Some(46271), Some(3_193_968_801))));
        assert_eq!(c.timeout_s, 65);
    }

    #[test]
    fn urls() {
        let u = Url::parse("rtsp://me:p%40ss@cam.local:8554/live/main").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("cam.local", 8554, "/live/main"));
        assert_eq!((u.user.as_deref(), u.pass.as_deref()), (Some("me"), Some("p@ss")));
        assert_eq!(u.request_url(), "rtsp://cam.local:8554/live/main");
        let v6 = Url::parse("rtsp://[::1]/x").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 554));
        assert_eq!(v6.request_url(), "rtsp://[::1]:554/x");
        assert!(Url::parse("http://x/").is_err());
        assert!(Url::parse("rtsp://:99/").is_err());
        assert!(Url::parse("rtsp://h:port/").is_err());
    }

    /// The whole exchange as MediaMTX answers it: two tracks over UDP, RTP-Info, keep-alive.
    #[test]
    fn options_describe_setup_play_keepalive_teardown() {
        let mut c = Client::new(Url::parse("rtsp://127.0.0.1:8554/cam").unwrap(), "fanout-test");
        let r = req_of(&c.start(0));
        assert_eq!((r.method.as_str(), r.uri.as_str()), ("OPTIONS", "rtsp://127.0.0.1:8554/cam"));
        let public = [("Public", "DESCRIBE, ANNOUNCE, SETUP, PLAY, RECORD, PAUSE, GET_PARAMETER, TEARDOWN")];
        let r = send(c.on_response(&resp(200, 1, &public, ""), 1).unwrap());
        assert_eq!(r.method, "DESCRIBE");
        let base = [("Content-Base", "rtsp://127.0.0.1:8554/cam/")];
        let Step::Described(sdp) = c.on_response(&resp(200, 2, &base, SDP), 2).unwrap() else { panic!() };
        assert_eq!(sdp.media.len(), 2);
        let lowers = vec![
            Lower::Udp { client_rtp: 5000, client_rtcp: 5001 },
            Lower::Udp { client_rtp: 5002, client_rtcp: 5003 },
        ];
        let r = req_of(&c.setup(lowers, 3).unwrap());
        assert_eq!(r.uri, "rtsp://127.0.0.1:8554/cam/trackID=0");
        assert_eq!(r.headers.get("Transport"), Some("RTP/AVP;unicast;client_port=5000-5001"));
        let t = [
            ("Transport", "RTP/AVP;unicast;client_port=5000-5001;server_port=8000-8001"),
            ("Session", "abc;timeout=30"),
        ];
        let r = send(c.on_response(&resp(200, 3, &t, ""), 4).unwrap());
        assert_eq!((r.uri.as_str(), r.headers.get("Session")), ("rtsp://127.0.0.1:8554/cam/trackID=1", Some("abc")));
        let t = [
            ("Transport", "RTP/AVP;unicast;client_port=5002-5003;server_port=8002-8003"),
            ("Session", "abc;timeout=30"),
        ];
        let r = send(c.on_response(&resp(200, 4, &t, ""), 5).unwrap());
        assert_eq!((r.method.as_str(), r.uri.as_str()), ("PLAY", "rtsp://127.0.0.1:8554/cam/"));
        let info = [(
            "RTP-Info",
            "url=rtsp://127.0.0.1:8554/cam/trackID=0;seq=7;rtptime=900,url=rtsp://127.0.0.1:8554/cam/trackID=1;seq=9",
        )];
        assert_eq!(c.on_response(&resp(200, 5, &info, ""), 6).unwrap(), Step::Playing);
        assert_eq!(c.tracks[0].server_ports, Some((8000, 8001)));
        assert_eq!(c.tracks[0].rtp_info, Some((Some(7), Some(900))));
        assert_eq!(c.tracks[1].rtp_info, Some((Some(9), None)));
        assert_eq!(c.timeout_s, 30);
        assert_eq!(c.keepalive(14_000), None);
        assert_eq!(c.keepalive_at(), 15_005);
        let k = req_of(&c.keepalive(15_005).unwrap());
        assert_eq!((k.method.as_str(), k.headers.get("Session")), ("GET_PARAMETER", Some("abc")));
        // A failed keep-alive is not fatal.
        assert_eq!(c.on_response(&resp(405, 6, &[], ""), 15_007).unwrap(), Step::Idle);
        let t = req_of(&c.teardown(20_000).unwrap());
        assert_eq!(t.method, "TEARDOWN");
    }

    /// Publishing: ANNOUNCE carries the description (again, with credentials, after a 401),
    /// every track is set up interleaved for recording, then RECORD.
    #[test]
    fn a_recorder_announces_sets_up_for_record_and_records() {
        let sdp = Sdp::parse(SDP).unwrap().for_clients("cam", 1);
        let mut c = Client::recorder(Url::parse("rtsp://u:pw@127.0.0.1:8554/live/cam").unwrap(), "t", sdp.clone());
        assert!(c.setup(Vec::new(), 0).is_err(), "a recorder sets up its own tracks");
        assert_eq!(req_of(&c.start(0)).method, "OPTIONS");
        let r = send(c.on_response(&resp(200, 1, &[], ""), 1).unwrap());
        assert_eq!((r.method.as_str(), r.uri.as_str()), ("ANNOUNCE", "rtsp://127.0.0.1:8554/live/cam"));
        assert_eq!(r.headers.get("Content-Type"), Some("application/sdp"));
        assert_eq!(Sdp::parse(&String::from_utf8_lossy(&r.body)).unwrap(), sdp);
        let challenge = [("WWW-Authenticate", "Digest realm=\"m\", nonce=\"n\"")];
        let again = send(c.on_response(&resp(401, 2, &challenge, ""), 2).unwrap());
        assert_eq!(again.method, "ANNOUNCE");
        assert_eq!(again.body, r.body, "the description goes again with the credentials");
        assert!(again.headers.get("Authorization").is_some_and(|a| a.starts_with("Digest ")));
        let r = send(c.on_response(&resp(200, 3, &[], ""), 3).unwrap());
        assert_eq!((r.method.as_str(), r.uri.as_str()), ("SETUP", "rtsp://127.0.0.1:8554/live/cam/trackID=0"));
        assert_eq!(r.headers.get("Transport"), Some("RTP/AVP/TCP;unicast;interleaved=0-1;mode=record"));
        let t = [("Transport", "RTP/AVP/TCP;unicast;interleaved=0-1"), ("Session", "s1")];
        let r = send(c.on_response(&resp(200, 4, &t, ""), 4).unwrap());
        assert_eq!(r.headers.get("Transport"), Some("RTP/AVP/TCP;unicast;interleaved=2-3;mode=record"));
        // The server moves the second track's channels: followed.
        let t = [("Transport", "RTP/AVP/TCP;unicast;interleaved=6-7"), ("Session", "s1")];
        let r = send(c.on_response(&resp(200, 5, &t, ""), 5).unwrap());
        assert_eq!((r.method.as_str(), r.headers.get("Session")), ("RECORD", Some("s1")));
        assert_eq!(c.on_response(&resp(200, 6, &[], ""), 6).unwrap(), Step::Playing);
        assert_eq!(c.tracks[1].lower, Lower::Interleaved { rtp: 6, rtcp: 7 });
        // A server that refuses the stream is an error naming it.
        let mut c = Client::recorder(Url::parse("rtsp://h/x").unwrap(), "t", sdp);
        c.start(0);
        c.on_response(&resp(200, 1, &[], ""), 1).unwrap();
        let e = c.on_response(&resp(400, 2, &[], ""), 2).unwrap_err();
        assert_eq!((e.method.as_str(), e.status), ("ANNOUNCE", Some(400)));
    }

    #[test]
    fn digest_challenge_is_answered_once() {
        let mut c = Client::new(Url::parse("rtsp://u:pw@h/s").unwrap(), "t");
        c.start(0);
        let ch = [("WWW-Authenticate", "Basic realm=\"x\""), ("WWW-Authenticate", "Digest realm=\"x\", nonce=\"n1\"")];
        let r = send(c.on_response(&resp(401, 1, &ch, ""), 1).unwrap());
        assert_eq!(r.method, "OPTIONS");
        let auth = r.headers.get("Authorization").unwrap();
        assert!(
            auth.starts_with("Digest ") && auth.contains("nonce=\"n1\"") && auth.contains("username=\"u\""),
            "{auth}"
        );
        // Later requests carry credentials without another round trip.
        let r = send(c.on_response(&resp(200, 2, &[], ""), 2).unwrap());
        assert!(r.headers.get("Authorization").is_some());
        // Refused again: an error, not a loop.
        send(c.on_response(&resp(401, 3, &ch, ""), 3).unwrap());
        let e = c.on_response(&resp(401, 4, &ch, ""), 4).unwrap_err();
        assert_eq!((e.status, e.method.as_str()), (Some(401), "DESCRIBE"));
    }

    #[test]
    fn no_credentials_and_errors() {
        let mut c = Client::new(Url::parse("rtsp://h/s").unwrap(), "t");
        c.start(0);
        let e = c.on_response(&resp(401, 1, &[("WWW-Authenticate", "Basic realm=\"x\"")], ""), 1).unwrap_err();
        assert!(e.message.contains("credentials"), "{e}");
        let mut c = Client::new(Url::parse("rtsp://h/s").unwrap(), "t");
        c.start(0);
        c.on_response(&resp(200, 1, &[], ""), 1).unwrap();
        let e = c.on_response(&resp(404, 2, &[], ""), 2).unwrap_err();
        assert_eq!((e.status, e.method.as_str()), (Some(404), "DESCRIBE"));
        // A stale answer (old CSeq) changes nothing.
        assert_eq!(c.on_response(&resp(200, 1, &[], ""), 3).unwrap(), Step::Idle);
    }

    #[test]
    fn interleaved_setup_follows_the_servers_channels() {
        let mut c = Client::new(Url::parse("rtsp://h/s").unwrap(), "t");
        c.start(0);
        c.on_response(&resp(200, 1, &[], ""), 0).unwrap();
        let one = "v=0\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n";
        c.on_response(&resp(200, 2, &[], one), 0).unwrap();
        let r = req_of(&c.setup(vec![Lower::Interleaved { rtp: 0, rtcp: 1 }], 0).unwrap());
        // No control attribute: the track is the base URL.
        assert_eq!(r.uri, "rtsp://h:554/s");
        assert_eq!(r.headers.get("Transport"), Some("RTP/AVP/TCP;unicast;interleaved=0-1"));
        let t = [("Transport", "RTP/AVP/TCP;unicast;interleaved=4-5"), ("Session", "z")];
        send(c.on_response(&resp(200, 3, &t, ""), 0).unwrap());
        assert_eq!(c.tracks[0].lower, Lower::Interleaved { rtp: 4, rtcp: 5 });
        assert_eq!(c.on_response(&resp(200, 4, &[], ""), 0).unwrap(), Step::Playing);
        assert_eq!(c.tracks[0].rtp_info, None);
        // No GET_PARAMETER in Public: keep-alive with OPTIONS, every 30 s by default.
        assert_eq!(req_of(&c.keepalive(30_000).unwrap()).method, "OPTIONS");
    }
    /// SRTP: SETUP asks for RTP/SAVP and carries our key as `KeyMgmt` for its track's URL;
    /// without SRTP no key travels.
    #[test]
    fn a_savp_setup_carries_our_mikey_key() {
        let mut c = Client::new(Url::parse("rtsps://h/s").unwrap(), "t");
        c.start(0);
        c.on_response(&resp(200, 1, &[], ""), 0).unwrap();
        let two =
            "v=0\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/SAVP 96\r\na=control:v\r\nm=audio 0 RTP/SAVP 97\r\na=control:a\r\n";
        c.on_response(&resp(200, 2, &[], two), 0).unwrap();
        c.savp = true;
        c.key_mgmt = vec!["AQA=".into(), "AQB=".into()];
        let r = req_of(
            &c.setup(vec![Lower::Interleaved { rtp: 0, rtcp: 1 }, Lower::Interleaved { rtp: 2, rtcp: 3 }], 0).unwrap(),
        );
        assert_eq!(r.headers.get("Transport"), Some("RTP/SAVP/TCP;unicast;interleaved=0-1"));
        assert_eq!(r.headers.get("KeyMgmt"), Some("prot=mikey; uri=\"rtsps://h:322/s/v\"; data=\"AQA=\""));
        let t = [("Transport", "RTP/SAVP/TCP;unicast;interleaved=0-1"), ("Session", "z")];
        let r = send(c.on_response(&resp(200, 3, &t, ""), 0).unwrap());
        assert_eq!(r.headers.get("KeyMgmt"), Some("prot=mikey; uri=\"rtsps://h:322/s/a\"; data=\"AQB=\""));
        c.savp = false;
        assert_eq!(req_of(&c.setup_request(0, 0)).headers.get("KeyMgmt"), None);
    }
}
