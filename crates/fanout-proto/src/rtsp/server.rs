//! The RTSP server side of the proxy as a state machine, sans-IO: requests and the time go
//! in, a response and the actions for the data path come out. The I/O layer resolves a
//! resource name to what it serves ([`Resource`]), carries out the [`Action`]s (add or
//! remove a client's sinks, start or pause them) and writes the response.
//!
//! States per RTSP session (RFC 2326 Appendix A): `Ready` after the first SETUP, `Playing`
//! after PLAY, back to `Ready` on PAUSE, gone on TEARDOWN, on timeout, or when the connection
//! carrying its interleaved channels closes.
//!
//! Publishing (RFC 2326 §10.11, §10.11): ANNOUNCE gives a publishable resource its
//! description, SETUP with `mode=record` (RTP interleaved on the connection) takes its
//! tracks, RECORD starts it ([`Action::Record`]). One publisher per resource at a time.
//!
//! A session belongs to who made it: requests naming it are served on the connection that
//! set it up, or, for a client taking RTP over UDP (RFC 2326 §3.4 lets it control its session
//! from a new connection), from the same address as the same user. Anyone else is told 454
//! as if it did not exist. Ids are unpredictable ([`IdGen`]).

use crate::rtsp::sdp::{track_of, Sdp};
use crate::rtsp::{digest_params, digest_response, parse_session, parse_transport, Lower, Request, Response};
use crate::secret::{ct_eq, IdGen, NonceCheck, Nonces};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};

/// What a resource (a relay session) offers its clients right now.
#[derive(Debug, Clone)]
pub struct Resource {
    /// The description for clients ([`Sdp::for_clients`]).
    pub sdp: Sdp,
    /// Per track, the RTP sequence number and timestamp the next packet a new client gets
    /// will carry (for `RTP-Info`); `None` until the track has had a packet.
    pub next_rtp: Vec<Option<(u16, u32)>>,
    /// A publisher may ANNOUNCE to it. Until one does, its description has no media, and
    /// DESCRIBE answers 404.
    pub publishable: bool,
    /// Someone this state machine does not know publishes it (over another protocol):
    /// ANNOUNCE answers 455, as for a second RTSP publisher.
    pub busy: bool,
    /// A new publisher takes the resource over from the one publishing (whose connection the
    /// I/O layer closes): ANNOUNCE is not refused for being second.
    pub takeover: bool,
}

/// What the data path must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Prepare sending `track` of `resource` to the client, held until `Play`.
    Setup {
        session: String,
        resource: String,
        track: usize,
        lower: Lower,
        conn: u64,
        /// The client gets SRTP (the connection is RTSPS with SRTP: its description carried
        /// the keys), over UDP or interleaved.
        srtp: bool,
        /// The key of the client's own SRTCP, where its SETUP carried one (`KeyMgmt`).
        client_key: Option<crate::rtp::mikey::Mikey>,
    },
    /// A request from connection `conn` named session `session`, which is not its own: it was
    /// answered 454. Given once per connection, for the log.
    Foreign {
        session: String,
        conn: u64,
    },
    Play {
        session: String,
    },
    Pause {
        session: String,
    },
    /// Remove every sink of the session (or, for a publisher, stop taking its media).
    Teardown {
        session: String,
    },
    /// A publisher starts: `tracks` are (track, interleaved RTP channel) of `sdp`'s media,
    /// `udp` (track, the publisher's RTP port, its RTCP port) for those it sends over UDP
    /// to `record_ports`.
    Record {
        session: String,
        resource: String,
        sdp: Sdp,
        tracks: Vec<(usize, u8)>,
        udp: Vec<(usize, u16, u16)>,
        conn: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Ready,
    Playing,
}

#[derive(Debug, Clone)]
struct RtspSession {
    resource: String,
    tracks: Vec<(usize, Lower)>,
    state: State,
    last_ms: u64,
    conn: u64,
    /// The address and the authenticated user that made it.
    ip: IpAddr,
    user: Option<String>,
    /// A publisher's session (SETUP with `mode=record`).
    record: bool,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Seconds without a request (or RTCP) before a session is torn down; sent in `Session`.
    pub timeout_s: u64,
    /// The ports the proxy sends RTP and RTCP from (for `server_port`).
    pub server_ports: (u16, u16),
    /// The ports publishers send RTP and RTCP over UDP to; (0, 0): publishers must send
    /// interleaved on their connection.
    pub record_ports: (u16, u16),
    /// Sessions the server holds at most.
    pub max_sessions: usize,
    /// Whether RTP over the RTSP connection (`RTP/AVP/TCP`) is offered.
    pub interleaved: bool,
    /// Clients must authenticate (Basic or Digest, RFC 2617) as one of these
    /// `(user, password)`; empty = open.
    pub users: Vec<(String, String)>,
    pub realm: String,
    /// RTP/AVP UDP multicast for players that ask for it: each (resource, track) gets a
    /// group of this range; `None`: refused (461).
    pub multicast: Option<Multicast>,
}

/// Where multicast streams go: groups from `first` on (`count` of them), each track's RTP
/// and RTCP to these ports of its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Multicast {
    pub first: Ipv4Addr,
    pub count: u32,
    pub rtp: u16,
    pub rtcp: u16,
    pub ttl: u8,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            timeout_s: 60,
            server_ports: (0, 0),
            record_ports: (0, 0),
            max_sessions: 10_000,
            interleaved: true,
            users: Vec::new(),
            realm: "fanout".into(),
            multicast: None,
        }
    }
}

pub const METHODS: &str =
    "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, TEARDOWN, GET_PARAMETER, SET_PARAMETER, ANNOUNCE, RECORD";

/// The proxy's RTSP sessions, across connections.
#[derive(Debug)]
pub struct Server {
    cfg: Config,
    sessions: HashMap<String, RtspSession>,
    ids: IdGen,
    nonces: Nonces,
    /// Descriptions announced per resource, by connection, not yet recording.
    announced: HashMap<String, (u64, Sdp)>,
    /// Connections over TLS (RTSPS), and whether their descriptions carry SRTP keys: their
    /// media must stay encrypted, so plain RTP over UDP is refused on them (461); they take
    /// RTP interleaved on the connection, or SRTP (`RTP/SAVP`) over UDP where keyed.
    secure: HashMap<u64, bool>,
    /// Each open connection's peer address (given by [`Server::connection_opened`]).
    peers: HashMap<u64, IpAddr>,
    /// Connections already reported for naming a session not their own.
    foreign: HashSet<u64>,
    /// The multicast group of each (resource, track) that was asked for one, for the
    /// server's life: a group is one stream, whoever plays it.
    groups: HashMap<(String, usize), Ipv4Addr>,
}

/// Who sent a request: its connection, and the user it authenticated as.
struct Asker {
    conn: u64,
    user: Option<String>,
}

/// The resource name and the rest of a request URL: `rtsp://host[:port]/name[/control]`, or
/// an absolute path `/name[/control]`. A name may have steps (`live/cam1`); a last step with
/// `=` in it (`trackID=0`, `streamid=0`, `stream=0`) is a track's control, which no name has.
pub fn split_url(uri: &str) -> Option<(&str, &str)> {
    let path = match uri.strip_prefix("rtsp://").or_else(|| uri.strip_prefix("rtsps://")) {
        Some(rest) => rest.find('/').map_or("", |i| &rest[i..]),
        None if uri.starts_with('/') => uri,
        None => return None,
    };
    let path = path.split(['?', '#']).next().unwrap_or("").trim_matches('/');
    let (name, rest) = match path.rsplit_once('/') {
        Some((name, control)) if control.contains('=') => (name.trim_end_matches('/'), control),
        _ => (path, ""),
    };
    (!name.is_empty()).then_some((name, rest))
}

/// What a request asks of the path it names, for an external check: `None` for those that
/// ask nothing of a path (OPTIONS, GET_PARAMETER, TEARDOWN, …).
pub fn auth_action(req: &Request) -> Option<(crate::auth::Action, &str)> {
    use crate::auth::Action;
    let (name, _) = split_url(&req.uri)?;
    let record = || req.headers.get("Transport").is_some_and(|t| t.to_ascii_lowercase().contains("mode=record"));
    let action = match req.method.as_str() {
        "DESCRIBE" | "PLAY" => Action::Read,
        "ANNOUNCE" | "RECORD" => Action::Publish,
        "SETUP" if record() => Action::Publish,
        "SETUP" => Action::Read,
        _ => return None,
    };
    Some((action, name))
}

fn error(status: u16, cseq: Option<u32>) -> Response {
    Response::new(status, cseq)
}

/// Who a request authenticated as: a configured user, or nobody where none are configured.
#[derive(Debug)]
struct Login(Option<String>);

/// Why a request's credentials were not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unauthorized {
    /// None, or wrong.
    Wrong,
    /// A Digest answer to a nonce that expired: the client may answer the new one at once.
    Stale,
}

impl Server {
    /// `secret`: 32 bytes from a CSPRNG, the keys of session ids and Digest nonces.
    pub fn new(cfg: Config, secret: [u8; 32]) -> Self {
        let (ids, nonces) = secret.split_at(16);
        Self {
            cfg,
            sessions: HashMap::new(),
            ids: IdGen::new(ids.try_into().expect("16 bytes")),
            nonces: Nonces::new(nonces.try_into().expect("16 bytes")),
            announced: HashMap::new(),
            secure: Default::default(),
            peers: HashMap::new(),
            foreign: HashSet::new(),
            groups: HashMap::new(),
        }
    }

    /// The multicast group of `resource`'s `track`: the one it has, else the next of the
    /// range; `None` when multicast is off or every group of the range is taken.
    fn group(&mut self, resource: &str, track: usize) -> Option<Ipv4Addr> {
        let m = self.cfg.multicast?;
        if let Some(g) = self.groups.get(&(resource.to_string(), track)) {
            return Some(*g);
        }
        let n = u32::try_from(self.groups.len()).ok().filter(|n| *n < m.count)?;
        let g = Ipv4Addr::from(u32::from(m.first).checked_add(n)?);
        self.groups.insert((resource.to_string(), track), g);
        Some(g)
    }

    /// New credentials (a reload): every request from now on is checked against them.
    pub fn set_users(&mut self, users: Vec<(String, String)>) {
        self.cfg.users = users;
    }

    /// A connection from `ip` opened: sessions it makes belong to that address.
    pub fn connection_opened(&mut self, conn: u64, ip: IpAddr) {
        self.peers.insert(conn, ip);
    }

    fn peer(&self, conn: u64) -> IpAddr {
        self.peers.get(&conn).copied().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }

    /// Whether `asker` may act on session `s`: its own connection, or for a client of RTP
    /// over UDP, the same address and the same user on another connection.
    fn owns(&self, s: &RtspSession, asker: &Asker) -> bool {
        if s.conn == asker.conn {
            return true;
        }
        let udp_only =
            !s.record && s.tracks.iter().all(|(_, l)| matches!(l, Lower::Udp { .. } | Lower::Multicast { .. }));
        udp_only && s.ip == self.peer(asker.conn) && s.user == asker.user
    }

    /// Marks a connection as RTSPS (until it closes); `srtp`: its descriptions give SRTP
    /// keys, and its clients get SRTP.
    pub fn set_secure(&mut self, conn: u64, srtp: bool) {
        self.secure.insert(conn, srtp);
    }

    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    pub fn state(&self, session: &str) -> Option<State> {
        self.sessions.get(session).map(|s| s.state)
    }

    fn new_id(&mut self) -> String {
        loop {
            let id = self.ids.next_hex();
            if !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }

    /// A new session of `asker`'s for `resource`.
    fn new_session(&mut self, asker: &Asker, resource: &str, now_ms: u64, record: bool) -> String {
        let id = self.new_id();
        let s = RtspSession {
            resource: resource.to_string(),
            tracks: Vec::new(),
            state: State::Ready,
            last_ms: now_ms,
            conn: asker.conn,
            ip: self.peer(asker.conn),
            user: asker.user.clone(),
            record,
        };
        self.sessions.insert(id.clone(), s);
        id
    }

    /// Handles one request from connection `conn` at `now_ms`; `lookup` names what a
    /// resource serves.
    pub fn handle(
        &mut self,
        req: &Request,
        conn: u64,
        now_ms: u64,
        lookup: &dyn Fn(&str) -> Option<Resource>,
    ) -> (Response, Vec<Action>) {
        let Some(cseq) = req.headers.cseq() else { return (error(400, None), Vec::new()) };
        let user = match req.method.as_str() {
            "OPTIONS" => None,
            _ => match self.authorized(req, conn, now_ms, true) {
                Ok(Login(user)) => user,
                Err(why) => return (self.unauthorized(cseq, conn, now_ms, why == Unauthorized::Stale), Vec::new()),
            },
        };
        let asker = Asker { conn, user };
        let session_hdr = req.headers.get("Session").map(|v| parse_session(v).0);
        let mut actions = Vec::new();
        // A session that is not the asker's is answered as if it did not exist.
        if let Some(id) = &session_hdr {
            if self.sessions.get(id).is_some_and(|s| !self.owns(s, &asker)) {
                if self.foreign.insert(conn) {
                    actions.push(Action::Foreign { session: id.clone(), conn });
                }
                return (error(454, Some(cseq)), actions);
            }
        }
        // Any request naming a live session keeps it alive.
        if let Some(s) = session_hdr.as_ref().and_then(|id| self.sessions.get_mut(id)) {
            s.last_ms = now_ms;
        }
        let mut resp = match req.method.as_str() {
            "OPTIONS" => {
                let mut r = Response::new(200, Some(cseq));
                r.headers.set("Public", METHODS);
                r
            }
            "GET_PARAMETER" | "SET_PARAMETER" => match &session_hdr {
                Some(id) if !self.sessions.contains_key(id) => error(454, Some(cseq)),
                _ => Response::new(200, Some(cseq)),
            },
            "DESCRIBE" => self.describe(req, cseq, lookup),
            "SETUP" => self.setup(req, cseq, &asker, now_ms, session_hdr.as_deref(), lookup, &mut actions),
            "PLAY" | "PAUSE" | "TEARDOWN" => self.control(req, cseq, session_hdr.as_deref(), lookup, &mut actions),
            "ANNOUNCE" => self.announce(req, cseq, conn, lookup),
            "RECORD" => self.record(req, cseq, session_hdr.as_deref(), &mut actions),
            "REDIRECT" => {
                let mut r = error(405, Some(cseq));
                r.headers.set("Allow", METHODS);
                r
            }
            _ => error(501, Some(cseq)),
        };
        if let Some(id) = session_hdr.filter(|id| self.sessions.contains_key(id)) {
            if resp.headers.get("Session").is_none() {
                resp.headers.set("Session", format!("{id};timeout={}", self.cfg.timeout_s));
            }
        }
        (resp, actions)
    }

    /// The 401 for a request that did not authenticate: a Digest challenge (with `stale`
    /// where the nonce had expired) and Basic.
    fn unauthorized(&mut self, cseq: u32, conn: u64, now_ms: u64, stale: bool) -> Response {
        let mut r = error(401, Some(cseq));
        let nonce = self.nonces.issue(now_ms, conn);
        let stale = if stale { ", stale=true" } else { "" };
        let realm = &self.cfg.realm;
        let digest = format!("Digest realm=\"{realm}\", nonce=\"{nonce}\", qop=\"auth\"{stale}");
        r.headers.0.push(("WWW-Authenticate".into(), digest));
        r.headers.0.push(("WWW-Authenticate".into(), format!("Basic realm=\"{realm}\"")));
        r
    }

    /// The 401 `req` will get, if it does not authenticate, without serving it (nothing is
    /// recorded: [`Server::handle`] checks it again). The I/O layer asks this before work a
    /// request would set off for anyone (a cluster pull for an unknown name).
    pub fn challenge(&mut self, req: &Request, conn: u64, now_ms: u64) -> Option<Response> {
        let cseq = req.headers.cseq()?;
        match self.authorized(req, conn, now_ms, false) {
            Err(why) if req.method != "OPTIONS" => {
                Some(self.unauthorized(cseq, conn, now_ms, why == Unauthorized::Stale))
            }
            _ => None,
        }
    }

    /// ANNOUNCE: a publisher's description for a publishable resource nobody publishes to.
    fn announce(&mut self, req: &Request, cseq: u32, conn: u64, lookup: &dyn Fn(&str) -> Option<Resource>) -> Response {
        let Some((name, _)) = split_url(&req.uri) else { return error(400, Some(cseq)) };
        let Some(res) = lookup(name) else { return error(404, Some(cseq)) };
        if !res.publishable {
            let mut r = error(405, Some(cseq));
            r.headers.set("Allow", "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, TEARDOWN, GET_PARAMETER, SET_PARAMETER");
            return r;
        }
        if !res.takeover && (res.busy || self.sessions.values().any(|s| s.record && s.resource == name)) {
            return error(455, Some(cseq)); // someone is publishing already
        }
        let is_sdp = req.headers.get("Content-Type").is_some_and(|t| t.trim().eq_ignore_ascii_case("application/sdp"));
        if !is_sdp {
            return error(415, Some(cseq));
        }
        match std::str::from_utf8(&req.body).ok().and_then(|t| Sdp::parse(t).ok()).filter(|s| !s.media.is_empty()) {
            Some(sdp) => {
                self.announced.insert(name.to_string(), (conn, sdp));
                Response::new(200, Some(cseq))
            }
            None => error(400, Some(cseq)),
        }
    }

    /// SETUP with `mode=record`: a track of the description this connection announced,
    /// interleaved on the connection or over UDP to `record_ports`.
    #[allow(clippy::too_many_arguments)]
    fn setup_record(
        &mut self,
        cseq: u32,
        name: &str,
        rest: &str,
        asker: &Asker,
        now_ms: u64,
        session: Option<&str>,
        lower: Option<Lower>,
    ) -> Response {
        let conn = asker.conn;
        let Some(lower) = lower else { return error(461, Some(cseq)) };
        // A publisher's own control without `=` (`…/live/cam1/track1`) is the last step of
        // what it announced.
        let (name, rest) = match name.rsplit_once('/') {
            Some((up, last)) if rest.is_empty() && !self.announced.contains_key(name) => (up, last),
            _ => (name, rest),
        };
        let Some((by, sdp)) = self.announced.get(name) else { return error(455, Some(cseq)) };
        if *by != conn {
            return error(455, Some(cseq));
        }
        // The track its control attribute names (`streamid=1`, as ffmpeg writes), else
        // `trackID=N` or the only one.
        let control = |m: &crate::rtsp::sdp::Media| m.attr("control").map(|c| c.trim_end_matches('/').to_string());
        let named = sdp.media.iter().position(|m| {
            control(m).is_some_and(|c| !rest.is_empty() && (c == rest || c.ends_with(&format!("/{rest}"))))
        });
        let Some(track) = named.or_else(|| track_of(if rest.is_empty() { name } else { rest }, sdp.media.len())) else {
            return error(404, Some(cseq));
        };
        let id = match session {
            Some(id) => match self.sessions.get(id) {
                Some(s) if s.record && s.resource == name && s.state == State::Ready => id.to_string(),
                Some(_) => return error(455, Some(cseq)),
                None => return error(454, Some(cseq)),
            },
            None => {
                if self.sessions.len() >= self.cfg.max_sessions {
                    return error(503, Some(cseq));
                }
                self.new_session(asker, name, now_ms, true)
            }
        };
        let s = self.sessions.get_mut(&id).expect("present");
        s.tracks.retain(|(t, _)| *t != track);
        s.tracks.push((track, lower));
        let mut r = Response::new(200, Some(cseq));
        let transport = match lower {
            Lower::Interleaved { rtp, rtcp } => format!("RTP/AVP/TCP;unicast;interleaved={rtp}-{rtcp};mode=record"),
            Lower::Udp { client_rtp, client_rtcp } => {
                let (a, b) = self.cfg.record_ports;
                format!("RTP/AVP;unicast;client_port={client_rtp}-{client_rtcp};server_port={a}-{b};mode=record")
            }
            Lower::Multicast { .. } => unreachable!("a publisher's multicast is not taken (setup)"),
        };
        r.headers.set("Transport", transport);
        r.headers.set("Session", format!("{id};timeout={}", self.cfg.timeout_s));
        r
    }

    /// RECORD: the publisher's tracks start.
    fn record(&mut self, req: &Request, cseq: u32, session: Option<&str>, actions: &mut Vec<Action>) -> Response {
        let Some(id) = session else { return error(454, Some(cseq)) };
        let Some(s) = self.sessions.get_mut(id) else { return error(454, Some(cseq)) };
        if !s.record || split_url(&req.uri).is_some_and(|(n, _)| n != s.resource) {
            return error(455, Some(cseq));
        }
        let Some((_, sdp)) = self.announced.remove(&s.resource) else { return error(455, Some(cseq)) };
        s.state = State::Playing;
        let tracks = s
            .tracks
            .iter()
            .filter_map(|(t, l)| match l {
                Lower::Interleaved { rtp, .. } => Some((*t, *rtp)),
                Lower::Udp { .. } | Lower::Multicast { .. } => None,
            })
            .collect();
        let udp = s
            .tracks
            .iter()
            .filter_map(|(t, l)| match *l {
                Lower::Udp { client_rtp, client_rtcp } => Some((*t, client_rtp, client_rtcp)),
                Lower::Interleaved { .. } | Lower::Multicast { .. } => None,
            })
            .collect();
        actions.push(Action::Record {
            session: id.to_string(),
            resource: s.resource.clone(),
            sdp,
            tracks,
            udp,
            conn: s.conn,
        });
        Response::new(200, Some(cseq))
    }

    fn describe(&self, req: &Request, cseq: u32, lookup: &dyn Fn(&str) -> Option<Resource>) -> Response {
        let Some((name, _)) = split_url(&req.uri) else { return error(400, Some(cseq)) };
        let Some(res) = lookup(name).filter(|r| !r.sdp.media.is_empty()) else { return error(404, Some(cseq)) };
        if let Some(accept) = req.headers.get("Accept") {
            if !accept.split(',').any(|a| {
                let a = a.split(';').next().unwrap_or("").trim();
                a == "application/sdp" || a == "*/*" || a == "application/*"
            }) {
                return error(406, Some(cseq));
            }
        }
        let mut r = Response::new(200, Some(cseq));
        let base = base_url(&req.uri, name);
        r.headers.set("Content-Base", base);
        r.headers.set("Content-Type", "application/sdp");
        r.body = res.sdp.write().into_bytes();
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn setup(
        &mut self,
        req: &Request,
        cseq: u32,
        asker: &Asker,
        now_ms: u64,
        session: Option<&str>,
        lookup: &dyn Fn(&str) -> Option<Resource>,
        actions: &mut Vec<Action>,
    ) -> Response {
        let conn = asker.conn;
        let Some((name, rest)) = split_url(&req.uri) else { return error(400, Some(cseq)) };
        let transport = req.headers.get("Transport").unwrap_or("");
        let specs = parse_transport(transport);
        if transport.to_ascii_lowercase().replace('"', "").contains("mode=record") {
            // The first the publisher offers that we take: interleaved, or RTP over UDP where
            // record ports are open and the connection is not RTSPS (its media would leave
            // the TLS).
            let udp_ok = self.cfg.record_ports != (0, 0) && !self.secure.contains_key(&asker.conn);
            let lower = specs.iter().find_map(|s| {
                s.lower.filter(|l| {
                    !s.savp && (matches!(l, Lower::Interleaved { .. }) || (udp_ok && matches!(l, Lower::Udp { .. })))
                })
            });
            return self.setup_record(cseq, name, rest, asker, now_ms, session, lower);
        }
        let Some(res) = lookup(name) else { return error(404, Some(cseq)) };
        let Some(track) = track_of(if rest.is_empty() { name } else { rest }, res.sdp.media.len()) else {
            return error(404, Some(cseq));
        };
        // Plain connections: RTP/AVP (keys for SAVP would travel in clear); RTSPS: no plain
        // RTP over UDP, SRTP over UDP where keyed.
        let srtp = self.secure.get(&conn).copied();
        let usable = |s: &crate::rtsp::TransportSpec| match s.lower {
            Some(Lower::Udp { .. }) => match srtp {
                None => !s.savp,
                Some(keyed) => s.savp && keyed,
            },
            Some(Lower::Interleaved { .. }) => self.cfg.interleaved && (!s.savp || srtp == Some(true)),
            // Plain RTP only (no keys for a group), where groups are configured.
            Some(Lower::Multicast { .. }) => srtp.is_none() && !s.savp && self.cfg.multicast.is_some(),
            None => false,
        };
        let Some(spec) = specs.iter().find(|s| usable(s)) else { return error(461, Some(cseq)) };
        let srtp = srtp == Some(true);
        // An SRTP client's own key for its reports (RFC 4567): one we cannot read is a key
        // management failure, answered as such.
        let client_key = match req.headers.get("KeyMgmt").filter(|_| srtp) {
            Some(h) => match crate::rtp::mikey::parse_key_mgmt(h) {
                Ok(m) => Some(m),
                Err(_) => return error(463, Some(cseq)),
            },
            None => None,
        };
        let mut lower = spec.lower.expect("found usable");
        if let Lower::Interleaved { rtp, rtcp } = lower {
            // Channels another track on this connection already carries: the client gets the
            // lowest free pair instead (RFC 2326 §12.39 lets the server choose), or 461.
            let used: Vec<u8> = self
                .sessions
                .iter()
                .filter(|(_, s)| s.conn == conn)
                .flat_map(|(id, s)| s.tracks.iter().filter(move |(t, _)| session != Some(id.as_str()) || *t != track))
                .flat_map(|(_, l)| match *l {
                    Lower::Interleaved { rtp, rtcp } => vec![rtp, rtcp],
                    Lower::Udp { .. } | Lower::Multicast { .. } => vec![],
                })
                .collect();
            if used.contains(&rtp) || used.contains(&rtcp) {
                match (0..=254u8).step_by(2).find(|c| !used.contains(c) && !used.contains(&(c + 1))) {
                    Some(c) => lower = Lower::Interleaved { rtp: c, rtcp: c + 1 },
                    None => return error(461, Some(cseq)),
                }
            }
        }
        if let Lower::Multicast { .. } = lower {
            // Every group of the range is some track's: not enough bandwidth (453).
            let (Some(group), Some(m)) = (self.group(name, track), self.cfg.multicast) else {
                return error(453, Some(cseq));
            };
            lower = Lower::Multicast { group, rtp: m.rtp, rtcp: m.rtcp };
        }
        let id = match session {
            Some(id) => match self.sessions.get(id) {
                None => return error(454, Some(cseq)),
                Some(s) if s.resource != name => return error(459, Some(cseq)),
                Some(s) if s.record => return error(455, Some(cseq)),
                Some(s) if s.state == State::Playing => return error(455, Some(cseq)),
                Some(_) => id.to_string(),
            },
            None => {
                if self.sessions.len() >= self.cfg.max_sessions {
                    return error(503, Some(cseq));
                }
                self.new_session(asker, name, now_ms, false)
            }
        };
        let s = self.sessions.get_mut(&id).expect("present");
        s.tracks.retain(|(t, _)| *t != track);
        s.tracks.push((track, lower));
        s.last_ms = now_ms;
        actions.push(Action::Setup {
            session: id.clone(),
            resource: name.to_string(),
            track,
            lower,
            conn,
            srtp,
            client_key,
        });
        let mut r = Response::new(200, Some(cseq));
        // The profile as the client named it (ffmpeg names AVP/TCP and decrypts by the keys
        // in the description).
        let profile = if spec.savp { "RTP/SAVP" } else { "RTP/AVP" };
        let transport = match lower {
            Lower::Udp { client_rtp, client_rtcp } => {
                let (a, b) = self.cfg.server_ports;
                format!("{profile};unicast;client_port={client_rtp}-{client_rtcp};server_port={a}-{b}")
            }
            Lower::Interleaved { rtp, rtcp } => format!("{profile}/TCP;unicast;interleaved={rtp}-{rtcp}"),
            Lower::Multicast { group, rtp, rtcp } => {
                let ttl = self.cfg.multicast.map_or(1, |m| m.ttl);
                format!("{profile};multicast;destination={group};port={rtp}-{rtcp};ttl={ttl}")
            }
        };
        r.headers.set("Transport", transport);
        r.headers.set("Session", format!("{id};timeout={}", self.cfg.timeout_s));
        r
    }

    fn control(
        &mut self,
        req: &Request,
        cseq: u32,
        session: Option<&str>,
        lookup: &dyn Fn(&str) -> Option<Resource>,
        actions: &mut Vec<Action>,
    ) -> Response {
        let Some(id) = session else { return error(454, Some(cseq)) };
        let Some(s) = self.sessions.get_mut(id) else { return error(454, Some(cseq)) };
        match req.method.as_str() {
            "PLAY" | "PAUSE" if s.record => error(455, Some(cseq)),
            "PLAY" => {
                let Some(res) = lookup(&s.resource) else { return error(404, Some(cseq)) };
                let mut r = Response::new(200, Some(cseq));
                let base = base_url(&req.uri, &s.resource);
                let mut tracks = s.tracks.clone();
                tracks.sort_by_key(|(t, _)| *t);
                let info: Vec<String> = tracks
                    .iter()
                    .map(|(t, _)| {
                        let mut e = format!("url={base}trackID={t}");
                        if let Some(Some((seq, ts))) = res.next_rtp.get(*t) {
                            e.push_str(&format!(";seq={seq};rtptime={ts}"));
                        }
                        e
                    })
                    .collect();
                r.headers.set("RTP-Info", info.join(","));
                r.headers.set("Range", "npt=0.000-");
                if s.state != State::Playing {
                    s.state = State::Playing;
                    actions.push(Action::Play { session: id.to_string() });
                }
                r
            }
            "PAUSE" => {
                if s.state == State::Playing {
                    s.state = State::Ready;
                    actions.push(Action::Pause { session: id.to_string() });
                }
                Response::new(200, Some(cseq))
            }
            _ => {
                self.sessions.remove(id);
                actions.push(Action::Teardown { session: id.to_string() });
                Response::new(200, Some(cseq))
            }
        }
    }

    /// The user a request authenticates as (`None` where no users are configured), or why
    /// not: [`Unauthorized::Stale`] for a Digest answer to a stale nonce (the challenge says
    /// so, and the client answers the new one without asking its user).
    /// `commit`: record a Digest count as used (`false` to check without serving).
    fn authorized(&mut self, req: &Request, conn: u64, now_ms: u64, commit: bool) -> Result<Login, Unauthorized> {
        if self.cfg.users.is_empty() {
            return Ok(Login(None));
        }
        let Some(auth) = req.headers.get("Authorization") else { return Err(Unauthorized::Wrong) };
        let (scheme, rest) = auth.split_once(' ').unwrap_or((auth, ""));
        if scheme.eq_ignore_ascii_case("Basic") {
            let Some((u, p)) = crate::http::basic_credentials(auth) else { return Err(Unauthorized::Wrong) };
            // Every user is compared, so the time does not tell which names exist.
            let ok = self.cfg.users.iter().fold(false, |ok, (user, pass)| {
                ok | (ct_eq(user.as_bytes(), u.as_bytes()) & ct_eq(pass.as_bytes(), p.as_bytes()))
            });
            return if ok { Ok(Login(Some(u))) } else { Err(Unauthorized::Wrong) };
        }
        if !scheme.eq_ignore_ascii_case("Digest") {
            return Err(Unauthorized::Wrong);
        }
        let params = digest_params(rest);
        let get = |k: &str| params.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str());
        let (Some(user), Some(realm), Some(nonce), Some(uri), Some(response)) =
            (get("username"), get("realm"), get("nonce"), get("uri"), get("response"))
        else {
            return Err(Unauthorized::Wrong);
        };
        // The response signs `uri`: it must be this request's (RFC 2617 §3.2.2.5), or an
        // answer captured for one resource would open another.
        if realm != self.cfg.realm || !same_resource(uri, &req.uri) {
            return Err(Unauthorized::Wrong);
        }
        let Some((_, pass)) = self.cfg.users.iter().find(|(u, _)| u == user) else { return Err(Unauthorized::Wrong) };
        // With `qop=auth` the answer signs a count and the client's nonce too (§3.2.2.1).
        let qop = match get("qop") {
            None => None,
            Some(q) if q.eq_ignore_ascii_case("auth") => {
                let nc = get("nc").filter(|n| n.len() == 8).and_then(|n| u32::from_str_radix(n, 16).ok());
                match (nc, get("cnonce")) {
                    (Some(nc), Some(cnonce)) => Some((nc, cnonce)),
                    _ => return Err(Unauthorized::Wrong),
                }
            }
            Some(_) => return Err(Unauthorized::Wrong),
        };
        let want = match qop {
            None => digest_response(user, realm, pass, nonce, &req.method, uri),
            Some((nc, cnonce)) => {
                crate::rtsp::digest_response_qop(user, realm, pass, nonce, nc, cnonce, &req.method, uri)
            }
        };
        if !ct_eq(want.as_bytes(), response.to_ascii_lowercase().as_bytes()) {
            return Err(Unauthorized::Wrong);
        }
        let nc = qop.map(|q| q.0);
        let fresh =
            if commit { self.nonces.check(nonce, now_ms, conn, nc) } else { self.nonces.peek(nonce, now_ms, conn, nc) };
        match fresh {
            NonceCheck::Fresh => Ok(Login(Some(user.to_string()))),
            NonceCheck::Stale => Err(Unauthorized::Stale),
            NonceCheck::Invalid => Err(Unauthorized::Wrong),
        }
    }

    /// Sessions silent for longer than the timeout, torn down.
    pub fn expire(&mut self, now_ms: u64) -> Vec<Action> {
        let limit = self.cfg.timeout_s * 1000;
        self.end_where(|s| now_ms.saturating_sub(s.last_ms) > limit)
    }

    /// Removes the sessions `dead` picks; their teardowns.
    fn end_where(&mut self, dead: impl Fn(&RtspSession) -> bool) -> Vec<Action> {
        let mut gone = Vec::new();
        self.sessions.retain(|id, s| {
            let d = dead(s);
            if d {
                gone.push(Action::Teardown { session: id.clone() });
            }
            !d
        });
        gone
    }

    /// An RTCP packet (a receiver report) from a client of `session`: it is alive.
    pub fn touch(&mut self, session: &str, now_ms: u64) {
        if let Some(s) = self.sessions.get_mut(session) {
            s.last_ms = now_ms;
        }
    }

    /// A connection closed: its sessions with interleaved tracks cannot be served anymore.
    pub fn connection_closed(&mut self, conn: u64) -> Vec<Action> {
        self.announced.retain(|_, (c, _)| *c != conn);
        self.secure.remove(&conn);
        self.peers.remove(&conn);
        self.foreign.remove(&conn);
        // (A publisher's session ends with its connection, whatever carries its media.)
        self.end_where(|s| {
            s.conn == conn && (s.record || s.tracks.iter().any(|(_, l)| matches!(l, Lower::Interleaved { .. })))
        })
    }
}

/// `rtsp://host:port/name/` for a request URL of the resource `name`.
/// Whether a Digest `uri` names the request's URI: the same, or the same path where one of
/// them is absolute (`rtsp://host:port/path`) and the other only the path.
fn same_resource(signed: &str, request: &str) -> bool {
    let path = |u: &str| -> String {
        let rest = u.strip_prefix("rtsp://").or_else(|| u.strip_prefix("rtsps://"));
        rest.map_or(u, |r| r.find('/').map_or("/", |i| &r[i..])).to_string()
    };
    signed == request || path(signed) == path(request)
}

fn base_url(uri: &str, name: &str) -> String {
    match uri.find(&format!("/{name}")) {
        Some(i) if uri.starts_with("rtsp") => format!("{}/{name}/", &uri[..i]),
        _ => format!("/{name}/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtsp::{hex, Headers};
    use md5::Digest as _;

    fn req(method: &str, uri: &str, cseq: u32, headers: &[(&str, &str)]) -> Request {
        let mut h = Headers::default();
        h.set("CSeq", cseq.to_string());
        for (n, v) in headers {
            h.set(n, *v);
        }
        Request { method: method.into(), uri: uri.into(), headers: h, body: Vec::new() }
    }

    fn demo(name: &str) -> Option<Resource> {
        (name == "demo").then(|| Resource {
            sdp: Sdp::parse("v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\nm=audio 0 RTP/AVP 97\r\na=rtpmap:97 L16/8000\r\n")
                .unwrap()
                .for_clients("demo", 1),
            next_rtp: vec![Some((1000, 90_000)), None],
            publishable: false,
            busy: false,
            takeover: false,
        })
    }

    /// `demo`, and `pub`: publishable, nothing announced yet.
    fn with_pub(name: &str) -> Option<Resource> {
        let empty = Sdp { session: Vec::new(), media: Vec::new() };
        demo(name).or_else(|| {
            (name == "pub").then(|| Resource {
                sdp: empty,
                next_rtp: vec![],
                publishable: true,
                busy: false,
                takeover: false,
            })
        })
    }

    /// ANNOUNCE, SETUP with mode=record, RECORD: one action with the tracks' channels. A
    /// second publisher, UDP, a play resource and a second RECORD are refused.
    #[test]
    fn a_publisher_announces_sets_up_and_records() {
        let mut s = Server::new(Config::default(), [7; 32]);
        let url = "rtsp://127.0.0.1:8554/pub";
        let sdp = "v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=control:streamid=0\r\n\
                   m=audio 0 RTP/AVP 97\r\na=rtpmap:97 MPEG4-GENERIC/48000/2\r\na=control:streamid=1\r\n";
        let mut announce = req("ANNOUNCE", url, 1, &[("Content-Type", "application/sdp")]);
        announce.body = sdp.as_bytes().to_vec();
        assert_eq!(s.handle(&announce, 1, 0, &with_pub).0.status, 200);
        // DESCRIBE is for what is published (the I/O layer gives the media once recording).
        assert_eq!(s.handle(&req("DESCRIBE", url, 2, &[]), 2, 0, &with_pub).0.status, 404);
        let mut announce_demo = announce.clone();
        announce_demo.uri = URL.into();
        assert_eq!(s.handle(&announce_demo, 1, 0, &with_pub).0.status, 405, "demo is not publishable");
        let udp = req(
            "SETUP",
            &format!("{url}/streamid=0"),
            3,
            &[("Transport", "RTP/AVP/UDP;unicast;client_port=5000-5001;mode=record")],
        );
        assert_eq!(s.handle(&udp, 1, 0, &with_pub).0.status, 461);
        let setup = |track: usize, cseq: u32, session: Option<&str>| {
            let t = format!("RTP/AVP/TCP;unicast;interleaved={}-{};mode=record", 2 * track, 2 * track + 1);
            let mut h = vec![("Transport", t.as_str())];
            if let Some(id) = session {
                h.push(("Session", id));
            }
            req("SETUP", &format!("{url}/streamid={track}"), cseq, &h)
        };
        let (r, a) = s.handle(&setup(0, 4, None), 1, 0, &with_pub);
        assert_eq!((r.status, a.len()), (200, 0));
        assert!(r.headers.get("Transport").unwrap().contains("mode=record"));
        let id = r.headers.get("Session").unwrap().split(';').next().unwrap().to_string();
        assert_eq!(s.handle(&setup(1, 5, Some(&id)), 1, 0, &with_pub).0.status, 200);
        // Someone else's SETUP for record on the same resource: not their announcement.
        assert_eq!(s.handle(&setup(0, 6, None), 2, 0, &with_pub).0.status, 455);
        let (r, a) = s.handle(&req("RECORD", url, 7, &[("Session", &id)]), 1, 0, &with_pub);
        assert_eq!(r.status, 200);
        let Some(Action::Record { tracks, resource, sdp, .. }) = a.first() else { panic!("{a:?}") };
        assert_eq!((resource.as_str(), sdp.media.len()), ("pub", 2));
        assert_eq!(tracks, &[(0, 0), (1, 2)]);
        // While it records: a second ANNOUNCE is refused, PLAY on its session too.
        assert_eq!(s.handle(&announce, 2, 0, &with_pub).0.status, 455);
        assert_eq!(s.handle(&req("PLAY", url, 8, &[("Session", &id)]), 1, 0, &with_pub).0.status, 455);
        // Its connection closes: the session ends, and the resource is free again.
        assert_eq!(s.connection_closed(1), vec![Action::Teardown { session: id }]);
        assert_eq!(s.handle(&announce, 2, 0, &with_pub).0.status, 200);
    }

    /// Where the resource takes over (`takeover`): a second connection's ANNOUNCE, SETUP
    /// and RECORD go through while the first still records (the I/O layer then closes the
    /// first, whose session ends with its connection); even a resource another protocol
    /// publishes (`busy`) takes an ANNOUNCE.
    #[test]
    fn a_publisher_takes_over_where_the_resource_allows() {
        let mut s = Server::new(Config::default(), [9; 32]);
        let url = "rtsp://127.0.0.1:8554/pub";
        let open = |name: &str| {
            (name == "pub").then(|| Resource {
                sdp: Sdp { session: Vec::new(), media: Vec::new() },
                next_rtp: vec![],
                publishable: true,
                busy: true,
                takeover: true,
            })
        };
        let sdp = "v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=control:streamid=0\r\n";
        let mut announce = req("ANNOUNCE", url, 1, &[("Content-Type", "application/sdp")]);
        announce.body = sdp.as_bytes().to_vec();
        let t = [("Transport", "RTP/AVP/TCP;unicast;interleaved=0-1;mode=record")];
        let record = |s: &mut Server, conn: u64| {
            assert_eq!(s.handle(&announce, conn, 0, &open).0.status, 200);
            let (r, _) = s.handle(&req("SETUP", &format!("{url}/streamid=0"), 2, &t), conn, 0, &open);
            assert_eq!(r.status, 200);
            let id = r.headers.get("Session").unwrap().split(';').next().unwrap().to_string();
            let (r, a) = s.handle(&req("RECORD", url, 3, &[("Session", &id)]), conn, 0, &open);
            assert_eq!(r.status, 200);
            assert!(matches!(a.first(), Some(Action::Record { conn: c, .. }) if *c == conn), "{a:?}");
            id
        };
        let first = record(&mut s, 1);
        let second = record(&mut s, 2);
        assert_ne!(first, second);
        assert_eq!(s.connection_closed(1), vec![Action::Teardown { session: first }]);
        assert_eq!(s.sessions(), 1);
        // Without takeover the same second ANNOUNCE is 455.
        let closed = |name: &str| open(name).map(|r| Resource { takeover: false, ..r });
        announce.headers.set("CSeq", "9");
        assert_eq!(s.handle(&announce, 3, 0, &closed).0.status, 455);
    }

    /// Issue 30 item 12: with record ports open, a publisher's SETUP of RTP over UDP (ffmpeg's
    /// default) is taken: the answer names the record ports, RECORD gives the publisher's
    /// ports; on RTSPS it stays 461 (the media would leave the TLS); its connection closing
    /// ends it.
    #[test]
    fn a_publisher_may_send_over_udp() {
        let cfg = Config { record_ports: (7000, 7001), ..Config::default() };
        let mut s = Server::new(cfg, [3; 32]);
        let url = "rtsp://127.0.0.1:8554/pub";
        let sdp = "v=0\r\ns=x\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=control:streamid=0\r\n";
        let mut announce = req("ANNOUNCE", url, 1, &[("Content-Type", "application/sdp")]);
        announce.body = sdp.as_bytes().to_vec();
        assert_eq!(s.handle(&announce, 1, 0, &with_pub).0.status, 200);
        let t = [("Transport", "RTP/AVP/UDP;unicast;client_port=5000-5001;mode=record")];
        let (r, _) = s.handle(&req("SETUP", &format!("{url}/streamid=0"), 2, &t), 1, 0, &with_pub);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.headers.get("Transport"),
            Some("RTP/AVP;unicast;client_port=5000-5001;server_port=7000-7001;mode=record")
        );
        let id = parse_session(r.headers.get("Session").unwrap()).0;
        let (r, a) = s.handle(&req("RECORD", url, 3, &[("Session", &id)]), 1, 0, &with_pub);
        assert_eq!(r.status, 200);
        let Some(Action::Record { tracks, udp, .. }) = a.first() else { panic!("{a:?}") };
        assert_eq!((tracks.len(), udp.as_slice()), (0, &[(0, 5000, 5001)][..]));
        assert_eq!(s.connection_closed(1), vec![Action::Teardown { session: id }]);
        // RTSPS: not over UDP.
        s.set_secure(2, true);
        announce.uri = url.into();
        assert_eq!(s.handle(&announce, 2, 0, &with_pub).0.status, 200);
        assert_eq!(s.handle(&req("SETUP", &format!("{url}/streamid=0"), 2, &t), 2, 0, &with_pub).0.status, 461);
    }

    const URL: &str = "rtsp://127.0.0.1:8554/demo";

    fn go(s: &mut Server, r: &Request, now: u64) -> (Response, Vec<Action>) {
        s.handle(r, 1, now, &demo)
    }

    /// A second track asking for channels the first one has gets free ones; port 0 is 461.
    #[test]
    fn colliding_channels_are_reassigned_and_port_zero_refused() {
        let mut s = Server::new(Config { interleaved: true, ..Config::default() }, [1; 32]);
        let setup = |s: &mut Server, track: u32, t: &str, session: Option<&str>, cseq: u32| {
            let mut h = vec![("Transport", t.to_string())];
            if let Some(id) = session {
                h.push(("Session", id.to_string()));
            }
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            s.handle(&req("SETUP", &format!("{URL}/trackID={track}"), cseq, &h), 1, 0, &demo).0
        };
        let a = setup(&mut s, 0, "RTP/AVP/TCP;interleaved=0-1", None, 1);
        assert_eq!(a.status, 200);
        let id = a.headers.get("Session").unwrap().split(';').next().unwrap().to_string();
        let b = setup(&mut s, 1, "RTP/AVP/TCP;interleaved=0-1", Some(&id), 2);
        assert_eq!((b.status, b.headers.get("Transport")), (200, Some("RTP/AVP/TCP;unicast;interleaved=2-3")));
        // Setting the same track up again keeps its own channels.
        let again = setup(&mut s, 0, "RTP/AVP/TCP;interleaved=0-1", Some(&id), 3);
        assert_eq!(again.headers.get("Transport"), Some("RTP/AVP/TCP;unicast;interleaved=0-1"));
        for t in
            ["RTP/AVP;unicast;client_port=0-1", "RTP/AVP;unicast;client_port=5000-0", "RTP/AVP;unicast;client_port=0"]
        {
            assert_eq!(setup(&mut s, 0, t, None, 4).status, 461, "{t}");
        }
    }

    /// On an RTSPS connection plain RTP over UDP would leave the TLS: 461, and the same
    /// client is served interleaved; SRTP over UDP only where the connection is keyed; SAVP
    /// on a plain connection (keys in clear) is refused; closing forgets it.
    #[test]
    fn secure_connections_take_interleaved_or_keyed_srtp_only() {
        let mut s = Server::new(Config { server_ports: (6970, 6971), ..Config::default() }, [3; 32]);
        s.set_secure(1, false);
        s.set_secure(3, true);
        let setup = |s: &mut Server, conn: u64, t: &str| {
            let (r, a) = s.handle(&req("SETUP", &format!("{URL}/trackID=0"), 1, &[("Transport", t)]), conn, 0, &demo);
            let srtp = a.iter().any(|a| matches!(a, Action::Setup { srtp: true, .. }));
            (r.status, r.headers.get("Transport").map(|t| t.split(';').next().unwrap().to_string()), srtp)
        };
        let (udp, savp) = ("RTP/AVP;unicast;client_port=5000-5001", "RTP/SAVP;unicast;client_port=5000-5001");
        assert_eq!(setup(&mut s, 1, udp).0, 461);
        assert_eq!(setup(&mut s, 1, savp).0, 461, "no keys on this connection");
        let both = format!("{udp},RTP/AVP/TCP;interleaved=0-1");
        assert_eq!(setup(&mut s, 1, &both), (200, Some("RTP/AVP/TCP".into()), false));
        assert_eq!(setup(&mut s, 2, udp), (200, Some("RTP/AVP".into()), false));
        assert_eq!(setup(&mut s, 2, savp).0, 461, "SAVP over plain RTSP would send keys in clear");
        assert_eq!(setup(&mut s, 3, udp).0, 461);
        assert_eq!(setup(&mut s, 3, savp), (200, Some("RTP/SAVP".into()), true));
        assert_eq!(setup(&mut s, 3, "RTP/AVP/TCP;interleaved=0-1"), (200, Some("RTP/AVP/TCP".into()), true));
        assert_eq!(setup(&mut s, 3, "RTP/SAVP/TCP;interleaved=0-1"), (200, Some("RTP/SAVP/TCP".into()), true));
        s.connection_closed(1);
        assert_eq!(setup(&mut s, 1, "RTP/AVP;unicast;client_port=5002-5003").0, 200);
    }

    /// An SRTP client's own key (`KeyMgmt`, as GStreamer sends it) comes with the setup; one
    /// that is not a MIKEY message we read is answered 463; a plain client's is not looked at.
    #[test]
    fn an_srtp_clients_own_key_comes_with_its_setup() {
        let mut s = Server::new(Config::default(), [4; 32]);
        s.set_secure(3, true);
        let key = crate::rtp::mikey::Mikey {
            csb_id: 1,
            sessions: vec![(0xabcd, 0)],
            suite: crate::rtp::srtp::Suite::AesCm128HmacSha1_80,
            key: crate::rtp::srtp::MasterKey { key: [3; 16], salt: [4; 14] },
        };
        let setup = |s: &mut Server, conn: u64, t: &str, km: &str| {
            let h = [("Transport", t), ("KeyMgmt", km)];
            let (r, a) = s.handle(&req("SETUP", &format!("{URL}/trackID=0"), 1, &h), conn, 0, &demo);
            let k = a.into_iter().find_map(|a| match a {
                Action::Setup { client_key, .. } => client_key,
                _ => None,
            });
            (r.status, k)
        };
        let good = format!("prot=mikey; uri=\"{URL}/trackID=0\"; data=\"{}\"", key.write_base64([1; 16], 2));
        let savp = "RTP/SAVP;unicast;client_port=5000-5001";
        assert_eq!(setup(&mut s, 3, savp, &good), (200, Some(key)));
        let r = setup(&mut s, 3, savp, "prot=mikey; data=\"bm9ub25zZW5zZQ==\"");
        assert_eq!((r.0, crate::rtsp::reason(r.0)), (463, "Key Management Failure"));
        assert_eq!(setup(&mut s, 2, "RTP/AVP;unicast;client_port=5000-5001", "junk"), (200, None));
    }

    #[test]
    fn a_whole_client_exchange() {
        let mut s = Server::new(Config { server_ports: (6970, 6971), ..Config::default() }, [7; 32]);
        let (r, _) = go(&mut s, &req("OPTIONS", URL, 1, &[]), 0);
        assert_eq!((r.status, r.headers.get("Public")), (200, Some(METHODS)));
        let (r, _) = go(&mut s, &req("DESCRIBE", URL, 2, &[("Accept", "application/sdp")]), 0);
        assert_eq!(r.status, 200);
        assert_eq!(r.headers.get("Content-Base"), Some("rtsp://127.0.0.1:8554/demo/"));
        assert!(String::from_utf8(r.body).unwrap().contains("a=control:trackID=1"));

        let t = [("Transport", "RTP/AVP;unicast;client_port=5000-5001")];
        let (r, a) = go(&mut s, &req("SETUP", &format!("{URL}/trackID=0"), 3, &t), 10);
        assert_eq!(r.status, 200);
        assert_eq!(r.headers.get("Transport"), Some("RTP/AVP;unicast;client_port=5000-5001;server_port=6970-6971"));
        let sid = parse_session(r.headers.get("Session").unwrap()).0;
        assert_eq!(r.headers.get("Session").unwrap(), format!("{sid};timeout=60"));
        assert_eq!(
            a,
            vec![Action::Setup {
                session: sid.clone(),
                resource: "demo".into(),
                track: 0,
                lower: Lower::Udp { client_rtp: 5000, client_rtcp: 5001 },
                conn: 1,
                srtp: false,
                client_key: None,
            }]
        );
        // Second track over TCP, relative URL (Content-Base + control).
        let t = [("Transport", "RTP/AVP/TCP;unicast;interleaved=2-3"), ("Session", sid.as_str())];
        let (r, _) = go(&mut s, &req("SETUP", "rtsp://127.0.0.1:8554/demo/trackID=1", 4, &t), 20);
        assert_eq!(r.headers.get("Transport"), Some("RTP/AVP/TCP;unicast;interleaved=2-3"));

        let (r, a) = go(&mut s, &req("PLAY", &format!("{URL}/"), 5, &[("Session", sid.as_str())]), 30);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.headers.get("RTP-Info"),
            Some("url=rtsp://127.0.0.1:8554/demo/trackID=0;seq=1000;rtptime=90000,url=rtsp://127.0.0.1:8554/demo/trackID=1")
        );
        assert_eq!(a, vec![Action::Play { session: sid.clone() }]);
        assert_eq!(s.state(&sid), Some(State::Playing));

        // Keep-alive, pause, teardown.
        assert_eq!(go(&mut s, &req("GET_PARAMETER", URL, 6, &[("Session", sid.as_str())]), 40).0.status, 200);
        let (_, a) = go(&mut s, &req("PAUSE", URL, 7, &[("Session", sid.as_str())]), 50);
        assert_eq!(a, vec![Action::Pause { session: sid.clone() }]);
        let (r, a) = go(&mut s, &req("TEARDOWN", URL, 8, &[("Session", sid.as_str())]), 60);
        assert_eq!((r.status, a), (200, vec![Action::Teardown { session: sid.clone() }]));
        assert_eq!(s.sessions(), 0);
        assert_eq!(go(&mut s, &req("PLAY", URL, 9, &[("Session", sid.as_str())]), 70).0.status, 454);
    }

    /// Multicast: each track of a resource has one group, whoever asks; the answer says
    /// where; a range used up is 453, SRTP or a publisher's multicast 461, and none
    /// configured 461.
    #[test]
    fn multicast_players_share_one_group_per_track() {
        let m = Multicast { first: Ipv4Addr::new(239, 9, 0, 0), count: 2, rtp: 8002, rtcp: 8003, ttl: 4 };
        let mut s = Server::new(Config { multicast: Some(m), ..Config::default() }, [3; 32]);
        let setup = |s: &mut Server, conn: u64, track: u32, t: &str| {
            let (r, a) = go(s, &req("SETUP", &format!("{URL}/trackID={track}"), 1, &[("Transport", t)]), conn);
            (r.status, r.headers.get("Transport").map(str::to_string), a)
        };
        let (status, t, a) = setup(&mut s, 1, 0, "RTP/AVP;multicast");
        assert_eq!((status, t.as_deref()), (200, Some("RTP/AVP;multicast;destination=239.9.0.0;port=8002-8003;ttl=4")));
        let lower = Lower::Multicast { group: Ipv4Addr::new(239, 9, 0, 0), rtp: 8002, rtcp: 8003 };
        assert!(matches!(a.as_slice(), [Action::Setup { lower: l, .. }] if *l == lower), "{a:?}");
        // Another player of the same track: the same group.
        assert_eq!(setup(&mut s, 2, 0, "RTP/AVP;multicast;port=9000-9001").1, t);
        let audio = setup(&mut s, 2, 1, "RTP/AVP;multicast").1.unwrap();
        assert!(audio.contains("destination=239.9.0.1;"), "{audio}");
        // A client offering multicast first and unicast next gets multicast.
        let (_, both, _) = setup(&mut s, 3, 1, "RTP/AVP;multicast, RTP/AVP;unicast;client_port=5000-5001");
        assert_eq!(both.as_deref(), Some(audio.as_str()));
        let mut other =
            Server::new(Config { multicast: Some(Multicast { count: 1, ..m }), ..Config::default() }, [3; 32]);
        assert_eq!(setup(&mut other, 1, 0, "RTP/AVP;multicast").0, 200);
        assert_eq!(setup(&mut other, 1, 1, "RTP/AVP;multicast").0, 453, "no group left for the second track");
        assert_eq!(setup(&mut s, 4, 0, "RTP/SAVP;multicast").0, 461, "no keys for a group");
        let mut off = Server::new(Config::default(), [3; 32]);
        assert_eq!(setup(&mut off, 1, 0, "RTP/AVP;multicast").0, 461, "no multicast configured");
    }

    #[test]
    fn errors_carry_the_codes_real_servers_use() {
        let mut s = Server::new(Config::default(), [1; 32]);
        let status = |s: &mut Server, r: Request| go(s, &r, 0).0.status;
        let mut no_cseq = req("OPTIONS", URL, 1, &[]);
        no_cseq.headers.0.clear();
        assert_eq!(status(&mut s, no_cseq), 400);
        assert_eq!(status(&mut s, req("FROBNICATE", URL, 1, &[])), 501);
        assert_eq!(status(&mut s, req("REDIRECT", URL, 1, &[])), 405);
        assert_eq!(status(&mut s, req("ANNOUNCE", URL, 1, &[])), 405, "demo takes no publisher");
        assert_eq!(status(&mut s, req("RECORD", URL, 1, &[])), 454);
        assert_eq!(status(&mut s, req("DESCRIBE", "rtsp://h/nothing", 1, &[])), 404);
        assert_eq!(status(&mut s, req("DESCRIBE", URL, 1, &[("Accept", "text/html")])), 406);
        assert_eq!(
            status(&mut s, req("SETUP", &format!("{URL}/trackID=0"), 1, &[("Transport", "RTP/AVP;multicast")])),
            461
        );
        assert_eq!(status(&mut s, req("SETUP", &format!("{URL}/trackID=0"), 1, &[])), 461);
        assert_eq!(status(&mut s, req("SETUP", &format!("{URL}/trackID=9"), 1, &[("Transport", "RTP/AVP/TCP")])), 404);
        let t = [("Transport", "RTP/AVP/TCP"), ("Session", "NOPE")];
        assert_eq!(status(&mut s, req("SETUP", &format!("{URL}/trackID=0"), 1, &t)), 454);
        assert_eq!(status(&mut s, req("PLAY", URL, 1, &[])), 454);
        assert_eq!(status(&mut s, req("TEARDOWN", URL, 1, &[("Session", "NOPE")])), 454);

        // SETUP while playing: 455.
        let (r, _) = go(&mut s, &req("SETUP", &format!("{URL}/trackID=0"), 2, &[("Transport", "RTP/AVP/TCP")]), 0);
        let sid = parse_session(r.headers.get("Session").unwrap()).0;
        go(&mut s, &req("PLAY", URL, 3, &[("Session", sid.as_str())]), 0);
        let t = [("Transport", "RTP/AVP/TCP;interleaved=2-3"), ("Session", sid.as_str())];
        assert_eq!(status(&mut s, req("SETUP", &format!("{URL}/trackID=1"), 4, &t)), 455);
    }

    #[test]
    fn silent_sessions_expire_and_closed_connections_end_their_interleaved_sessions() {
        let mut s = Server::new(Config { timeout_s: 10, ..Config::default() }, [3; 32]);
        let udp = [("Transport", "RTP/AVP;unicast;client_port=5000-5001")];
        let tcp = [("Transport", "RTP/AVP/TCP;unicast;interleaved=0-1")];
        let track = format!("{URL}/trackID=0");
        let a = parse_session(go(&mut s, &req("SETUP", &track, 1, &udp), 0).0.headers.get("Session").unwrap()).0;
        let b = parse_session(go(&mut s, &req("SETUP", &track, 1, &tcp), 0).0.headers.get("Session").unwrap()).0;
        assert_ne!(a, b);
        s.touch(&a, 9_000);
        assert_eq!(s.expire(10_001), vec![Action::Teardown { session: b.clone() }]);
        assert_eq!(s.expire(19_001), vec![Action::Teardown { session: a }]);
        let c = parse_session(go(&mut s, &req("SETUP", &track, 1, &tcp), 20_000).0.headers.get("Session").unwrap()).0;
        assert_eq!(s.connection_closed(2), vec![]);
        assert_eq!(s.connection_closed(1), vec![Action::Teardown { session: c }]);
    }

    #[test]
    fn basic_and_digest_authentication() {
        let users = vec![("alice".to_string(), "s3cret".to_string())];
        let mut s = Server::new(Config { users, ..Config::default() }, [5; 32]);
        let d = |h: &[(&str, &str)]| req("DESCRIBE", URL, 1, h);
        // OPTIONS is open; everything else asks, offering both schemes.
        assert_eq!(go(&mut s, &req("OPTIONS", URL, 1, &[]), 0).0.status, 200);
        let (r, _) = go(&mut s, &d(&[]), 0);
        assert_eq!(r.status, 401);
        let challenges: Vec<&str> =
            r.headers.0.iter().filter(|(n, _)| n == "WWW-Authenticate").map(|(_, v)| v.as_str()).collect();
        assert!(
            challenges[0].starts_with("Digest realm=\"fanout\", nonce=\"") && challenges[1] == "Basic realm=\"fanout\""
        );
        let nonce = nonce_of(challenges[0]);
        assert!(challenges[0].contains("qop=\"auth\"") && !challenges[0].contains("stale"));

        // Basic: base64("alice:s3cret").
        assert_eq!(go(&mut s, &d(&[("Authorization", "Basic YWxpY2U6czNjcmV0")]), 1).0.status, 200);
        assert_eq!(go(&mut s, &d(&[("Authorization", "Basic YWxpY2U6d3Jvbmc=")]), 1).0.status, 401);

        // Digest as a client computes it (RFC 2617 without qop).
        let h = |x: String| hex(&md5::Md5::digest(x.as_bytes()));
        let digest = |pass: &str, nonce: &str| {
            let response = h(format!("{}:{nonce}:{}", h(format!("alice:fanout:{pass}")), h(format!("DESCRIBE:{URL}"))));
            format!("Digest username=\"alice\", realm=\"fanout\", nonce=\"{nonce}\", uri=\"{URL}\", response=\"{response}\"")
        };
        assert_eq!(go(&mut s, &d(&[("Authorization", &digest("s3cret", &nonce))]), 1000).0.status, 200);
        assert_eq!(go(&mut s, &d(&[("Authorization", &digest("wrong", &nonce))]), 1000).0.status, 401);
        // An expired nonce is stale: the challenge says so.
        let (r, _) =
            go(&mut s, &d(&[("Authorization", &digest("s3cret", &nonce))]), crate::secret::NONCE_LIFETIME_MS + 1001);
        assert_eq!(r.status, 401);
        assert!(r.headers.get("WWW-Authenticate").unwrap().ends_with("stale=true"));
        assert_eq!(go(&mut s, &d(&[("Authorization", "Bearer x")]), 1).0.status, 401);
        // Schemes are case-insensitive (RFC 7235 §2.1).
        assert_eq!(go(&mut s, &d(&[("Authorization", "basic YWxpY2U6czNjcmV0")]), 1).0.status, 200);
        let lower = digest("s3cret", &nonce).replacen("Digest", "DIGEST", 1);
        assert_eq!(go(&mut s, &d(&[("Authorization", &lower)]), 1000).0.status, 200);
    }

    #[test]
    fn each_request_asks_to_read_or_to_publish() {
        use crate::auth::Action;
        let a = |m: &str, h: &[(&str, &str)]| {
            auth_action(&req(m, "rtsp://h/cam1/trackID=0?x=1", 1, h)).map(|(a, n)| (a, n.to_string()))
        };
        let (read, publish) = (Some((Action::Read, "cam1".to_string())), Some((Action::Publish, "cam1".to_string())));
        assert_eq!(a("DESCRIBE", &[]), read);
        assert_eq!(a("PLAY", &[]), read);
        assert_eq!(a("SETUP", &[("Transport", "RTP/AVP;unicast;client_port=5000-5001")]), read);
        assert_eq!(a("SETUP", &[("Transport", "RTP/AVP/TCP;interleaved=0-1;Mode=RECORD")]), publish);
        assert_eq!(a("ANNOUNCE", &[]), publish);
        assert_eq!(a("RECORD", &[]), publish);
        assert_eq!(a("OPTIONS", &[]), None);
        assert_eq!(a("TEARDOWN", &[]), None);
        assert!(auth_action(&req("DESCRIBE", "*", 1, &[])).is_none());
    }

    /// Credentials changed by a reload hold from the next request: the old password no
    /// longer opens, the new one does, and with no users left everything is open.
    #[test]
    fn new_users_hold_from_the_next_request() {
        let users = vec![("alice".to_string(), "s3cret".to_string())];
        let mut s = Server::new(Config { users, ..Config::default() }, [5; 32]);
        let d = |h: &[(&str, &str)]| req("DESCRIBE", URL, 1, h);
        let (old, new) = ("Basic YWxpY2U6czNjcmV0", "Basic Ym9iOnB3"); // alice:s3cret, bob:pw
        assert_eq!(go(&mut s, &d(&[("Authorization", old)]), 1).0.status, 200);
        s.set_users(vec![("bob".to_string(), "pw".to_string())]);
        assert_eq!(go(&mut s, &d(&[("Authorization", old)]), 2).0.status, 401);
        assert_eq!(go(&mut s, &d(&[("Authorization", new)]), 3).0.status, 200);
        s.set_users(Vec::new());
        assert_eq!(go(&mut s, &d(&[]), 4).0.status, 200);
    }

    /// A Digest answer signs its `uri`: one made for another resource does not open this one,
    /// while the path-only form of this request's URI does.
    #[test]
    fn digest_checks_the_uri_it_signs() {
        let users = vec![("alice".to_string(), "s3cret".to_string())];
        let mut s = Server::new(Config { users, ..Config::default() }, [5; 32]);
        let (r, _) = go(&mut s, &req("DESCRIBE", URL, 1, &[]), 0);
        let nonce = nonce_of(r.headers.get("WWW-Authenticate").unwrap());
        let answer = |uri: &str| {
            let response = digest_response("alice", "fanout", "s3cret", &nonce, "DESCRIBE", uri);
            format!("Digest username=\"alice\", realm=\"fanout\", nonce=\"{nonce}\", uri=\"{uri}\", response=\"{response}\"")
        };
        let with = |uri: &str, s: &mut Server| {
            go(s, &req("DESCRIBE", URL, 2, &[("Authorization", &answer(uri))]), 1000).0.status
        };
        assert_eq!(with(URL, &mut s), 200);
        assert_eq!(with("/demo", &mut s), 200);
        assert_eq!(with("rtsp://127.0.0.1:8554/other", &mut s), 401);
        assert_eq!(with("/other", &mut s), 401);
    }

    fn nonce_of(challenge: &str) -> String {
        challenge.split("nonce=\"").nth(1).unwrap().split('"').next().unwrap().to_string()
    }

    /// A captured Digest header does not open anything on another connection (without
    /// `qop`), nor a second time (with `qop`: the count must rise); a right answer with a
    /// count that did not rise is told `stale=true`.
    #[test]
    fn a_captured_digest_answer_does_not_replay() {
        let users = vec![("alice".to_string(), "s3cret".to_string())];
        let mut s = Server::new(Config { users, ..Config::default() }, [5; 32]);
        let d = |h: &[(&str, &str)]| req("DESCRIBE", URL, 1, h);
        let nonce = nonce_of(s.handle(&d(&[]), 1, 0, &demo).0.headers.get("WWW-Authenticate").unwrap());
        let legacy = {
            let response = digest_response("alice", "fanout", "s3cret", &nonce, "DESCRIBE", URL);
            format!("Digest username=\"alice\", realm=\"fanout\", nonce=\"{nonce}\", uri=\"{URL}\", response=\"{response}\"")
        };
        assert_eq!(s.handle(&d(&[("Authorization", &legacy)]), 1, 10, &demo).0.status, 200);
        let (r, _) = s.handle(&d(&[("Authorization", &legacy)]), 2, 20, &demo);
        assert_eq!(r.status, 401, "replayed on another connection");
        assert!(r.headers.get("WWW-Authenticate").unwrap().contains("stale=true"));
        let qop = |nc: u32| {
            let response =
                crate::rtsp::digest_response_qop("alice", "fanout", "s3cret", &nonce, nc, "c0ffee", "DESCRIBE", URL);
            format!(
                "Digest username=\"alice\", realm=\"fanout\", nonce=\"{nonce}\", uri=\"{URL}\", qop=auth, nc={nc:08x}, cnonce=\"c0ffee\", response=\"{response}\""
            )
        };
        // A challenge asked first (before a cluster pull) does not spend the count.
        assert!(s.challenge(&d(&[("Authorization", &qop(1))]), 3, 25).is_none());
        assert_eq!(s.challenge(&d(&[]), 3, 25).map(|r| r.status), Some(401));
        assert_eq!(s.handle(&d(&[("Authorization", &qop(1))]), 3, 30, &demo).0.status, 200);
        assert_eq!(s.handle(&d(&[("Authorization", &qop(1))]), 4, 40, &demo).0.status, 401, "the same count again");
        assert_eq!(s.handle(&d(&[("Authorization", &qop(2))]), 3, 50, &demo).0.status, 200);
        // A wrong password with a fresh count is no stale nonce, and burns no count.
        let wrong = qop(3).replace("s3cret", "x");
        let mut bad = wrong.clone();
        bad.replace_range(bad.len() - 3..bad.len() - 1, "00");
        let (r, _) = s.handle(&d(&[("Authorization", &bad)]), 3, 60, &demo);
        assert!(r.status == 401 && !r.headers.get("WWW-Authenticate").unwrap().contains("stale"));
        assert_eq!(s.handle(&d(&[("Authorization", &qop(3))]), 3, 70, &demo).0.status, 200);
    }

    /// Sessions belong to who made them: another connection (another address, another user,
    /// or an interleaved client's or a publisher's session from anywhere but its connection)
    /// gets 454 for every method, reported once; a UDP client's own address and user may
    /// control it from a new connection (RFC 2326).
    #[test]
    fn nobody_controls_another_ones_session() {
        let users = vec![("alice".to_string(), "a".to_string()), ("bob".to_string(), "b".to_string())];
        let mut s = Server::new(Config { users, ..Config::default() }, [9; 32]);
        let (alice, bob) = ("Basic YWxpY2U6YQ==", "Basic Ym9iOmI=");
        let ip = |n: u8| IpAddr::V4(Ipv4Addr::new(10, 0, 0, n));
        s.connection_opened(1, ip(1)); // alice, UDP
        s.connection_opened(2, ip(1)); // alice again, a new connection from the same address
        s.connection_opened(3, ip(1)); // bob from the same address
        s.connection_opened(4, ip(2)); // alice from elsewhere
        s.connection_opened(5, ip(1)); // alice, interleaved
        let track = format!("{URL}/trackID=0");
        let setup = |s: &mut Server, conn: u64, t: &str| {
            let r = s.handle(&req("SETUP", &track, 1, &[("Transport", t), ("Authorization", alice)]), conn, 0, &demo).0;
            parse_session(r.headers.get("Session").unwrap()).0
        };
        let udp = setup(&mut s, 1, "RTP/AVP;unicast;client_port=5000-5001");
        let tcp = setup(&mut s, 5, "RTP/AVP/TCP;unicast;interleaved=0-1");
        let ask = |s: &mut Server, m: &str, id: &str, conn: u64, who: &str| {
            s.handle(&req(m, URL, 2, &[("Session", id), ("Authorization", who)]), conn, 1, &demo)
        };
        for m in ["PLAY", "PAUSE", "TEARDOWN", "GET_PARAMETER", "SET_PARAMETER", "RECORD", "SETUP"] {
            assert_eq!(ask(&mut s, m, &udp, 3, bob).0.status, 454, "{m} by another user");
            assert_eq!(ask(&mut s, m, &udp, 4, alice).0.status, 454, "{m} from another address");
            assert_eq!(ask(&mut s, m, &tcp, 2, alice).0.status, 454, "{m} of an interleaved session elsewhere");
        }
        // Reported once per connection.
        let mut s2 = Server::new(Config::default(), [9; 32]);
        let id = parse_session(
            s2.handle(&req("SETUP", &track, 1, &[("Transport", "RTP/AVP/TCP;interleaved=0-1")]), 1, 0, &demo)
                .0
                .headers
                .get("Session")
                .unwrap(),
        )
        .0;
        let foreign = |s2: &mut Server| s2.handle(&req("TEARDOWN", URL, 3, &[("Session", &id)]), 7, 1, &demo).1;
        assert_eq!(foreign(&mut s2), vec![Action::Foreign { session: id.clone(), conn: 7 }]);
        assert_eq!(foreign(&mut s2), vec![]);
        assert_eq!(s2.sessions(), 1);
        // Both sessions still there, untouched.
        assert_eq!((s.state(&udp), s.state(&tcp)), (Some(State::Ready), Some(State::Ready)));
        // The owner, from its own connection and (UDP) from a new one of the same address.
        assert_eq!(ask(&mut s, "PLAY", &udp, 2, alice).0.status, 200);
        assert_eq!(ask(&mut s, "PLAY", &tcp, 5, alice).0.status, 200);
        assert_eq!(ask(&mut s, "TEARDOWN", &udp, 1, alice).0.status, 200);
    }

    #[test]
    fn urls_in_the_forms_clients_send() {
        assert_eq!(split_url("rtsp://h:8554/demo"), Some(("demo", "")));
        assert_eq!(split_url("rtsp://h/demo/trackID=1"), Some(("demo", "trackID=1")));
        assert_eq!(split_url("rtsp://user:pw@h:8554/demo/?x=1"), Some(("demo", "")));
        assert_eq!(split_url("/demo/trackID=0"), Some(("demo", "trackID=0")));
        assert_eq!(split_url("rtsp://h:8554/"), None);
        assert_eq!(split_url("*"), None);
        assert_eq!(split_url("rtsp://h/live/cam1"), Some(("live/cam1", "")));
        assert_eq!(split_url("rtsp://h/live/cam1/"), Some(("live/cam1", "")));
        assert_eq!(split_url("rtsp://h/live/cam1/trackID=1"), Some(("live/cam1", "trackID=1")));
        assert_eq!(split_url("rtsp://h/live/cam1/stream=0?x"), Some(("live/cam1", "stream=0")));
    }

    proptest::proptest! {
        /// Any sequence of requests (methods, URLs, transports and session ids mixed from
        /// what clients send and what they should not): no panic, every response echoes the
        /// CSeq, the session table stays within its bound, and every session the server
        /// holds was announced by a Setup action and not yet torn down.
        #[test]
        fn any_request_sequence_keeps_the_books(ops in proptest::collection::vec((0usize..9, 0usize..5, 0usize..5, 0usize..4, 0u64..100_000), 1..60)) {
            let methods = ["OPTIONS", "DESCRIBE", "SETUP", "PLAY", "PAUSE", "TEARDOWN", "GET_PARAMETER", "ANNOUNCE", "X"];
            let urls = [URL.to_string(), format!("{URL}/trackID=0"), format!("{URL}/trackID=1"), "rtsp://h/none".into(), "*".into()];
            let transports = ["RTP/AVP;unicast;client_port=5000-5001", "RTP/AVP/TCP;interleaved=0-1", "RTP/AVP;multicast", "", "junk"];
            let mut s = Server::new(Config { max_sessions: 3, timeout_s: 5, ..Config::default() }, [11; 32]);
            let mut ids: Vec<String> = vec!["BOGUS".into()];
            let mut live = std::collections::HashSet::new();
            let mut now = 0;
            for (i, (m, u, t, sid, dt)) in ops.into_iter().enumerate() {
                now += dt;
                let mut h = vec![("Transport", transports[t])];
                let id = ids[sid % ids.len()].clone();
                if sid > 0 {
                    h.push(("Session", id.as_str()));
                }
                let r = req(methods[m], &urls[u], i as u32, &h);
                let (resp, actions) = s.handle(&r, 1, now, &demo);
                proptest::prop_assert_eq!(resp.headers.cseq(), Some(i as u32));
                for a in actions.into_iter().chain(s.expire(now)) {
                    match a {
                        Action::Setup { session, .. } => {
                            if !ids.contains(&session) {
                                ids.push(session.clone());
                            }
                            live.insert(session);
                        }
                        Action::Teardown { session } => {
                            proptest::prop_assert!(live.remove(&session), "teardown of an unknown session");
                        }
                        _ => {}
                    }
                }
                proptest::prop_assert!(s.sessions() <= 3);
                proptest::prop_assert_eq!(s.sessions(), live.len());
            }
        }
    }
}
