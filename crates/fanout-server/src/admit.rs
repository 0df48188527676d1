//! Who gets a connection: each listener (RTSP, RTSPS, the API/HTTP port) admits at most
//! `max_connections_per_ip` connections from one address at once, counted from the accept,
//! before any request deadline starts; the relay's refusals go into one book that logs the
//! first at once and the rest as counts every 10 s, and shows the totals in `/metrics`.
//! The policy is `fanout_core::admit`; this module holds its locks and the clock. The cap
//! is the relay's, in [`Books`], so a reload changes it for every listener at once.

use fanout_core::admit::{Guesses, PerAddress, Refusals};
use parking_lot::Mutex;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The relay's per-address cap, and its refusals by reason.
pub struct Books {
    refusals: Mutex<Refusals>,
    t0: Instant,
    /// `max_connections_per_ip` (0: no cap), as the running configuration says.
    cap: AtomicUsize,
    /// Connections open now on every listener: what an upgrade's old process waits on.
    open: AtomicUsize,
    /// Failed logins per address (and who is refused for failing too often), and their
    /// totals by face for `/metrics`.
    guesses: Mutex<Guesses>,
    failed: Mutex<Vec<(&'static str, u64)>>,
    /// `on_connect` / `on_disconnect`, as the running configuration says.
    hooks: Mutex<ConnHooks>,
}

/// The commands run when a client connects to a face and when it goes (program and arguments,
/// no shell).
#[derive(Clone, Default)]
struct ConnHooks {
    on_connect: Option<Vec<String>>,
    on_disconnect: Option<Vec<String>>,
}

impl Books {
    pub fn new(cap: usize) -> Self {
        Self {
            refusals: Mutex::default(),
            t0: Instant::now(),
            cap: AtomicUsize::new(cap),
            open: AtomicUsize::new(0),
            guesses: Mutex::new(Guesses::new(fanout_core::admit::DEFAULT_FAILED_LOGINS)),
            failed: Mutex::default(),
            hooks: Mutex::default(),
        }
    }

    /// A reload's (or the start's) `on_connect` / `on_disconnect`, for the next connections.
    pub fn set_conn_hooks(&self, on_connect: Option<Vec<String>>, on_disconnect: Option<Vec<String>>) {
        *self.hooks.lock() = ConnHooks { on_connect, on_disconnect };
    }

    /// A reload's `max_failed_logins`.
    pub fn set_failed_login_limit(&self, limit: u32) {
        self.guesses.lock().set_limit(limit);
    }

    /// A login that failed on `face` (wrong credentials given, a wrong SRT passphrase): counted
    /// by face, told at most once a second per address; too many within a minute and the
    /// address is refused for a minute.
    pub fn failed_login(&self, face: &'static str, ip: IpAddr) {
        {
            let mut failed = self.failed.lock();
            match failed.iter_mut().find(|f| f.0 == face) {
                Some(f) => f.1 += 1,
                None => failed.push((face, 1)),
            }
        }
        let told = self.guesses.lock().fail(ip, self.now_ms());
        match told {
            Some(t) if t.banned => tracing::warn!(
                %ip,
                face,
                failures = t.failures,
                "failed logins: this address is refused for {} s (max_failed_logins)",
                fanout_core::admit::GUESS_BAN_MS / 1000
            ),
            Some(t) => tracing::warn!(%ip, face, failures = t.failures, "failed login"),
            None => {}
        }
    }

    /// Whether `ip` is refused now for failing to log in too often (booked as a refusal).
    pub fn login_banned(&self, ip: IpAddr) -> bool {
        let banned = self.guesses.lock().banned(ip, self.now_ms());
        if banned {
            self.refuse("too many failed logins (max_failed_logins)", ip);
        }
        banned
    }

    /// Failed logins by face so far, and the addresses refused now for them.
    pub fn failed_logins(&self) -> (Vec<(&'static str, u64)>, usize) {
        (self.failed.lock().clone(), self.guesses.lock().banned_count(self.now_ms()))
    }

    /// A reload's new cap, for the next connections of every listener.
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Relaxed);
    }

    /// Connections open now, on every listener together.
    pub fn open(&self) -> usize {
        self.open.load(Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// One refused connection from `peer`: a line for the first after a quiet time.
    pub fn refuse(&self, reason: &'static str, peer: IpAddr) {
        if let Some(line) = self.refusals.lock().refuse(reason, self.now_ms()) {
            tracing::warn!(%peer, "{line} (the next ones are counted and told every 10 s)");
        }
    }

    /// Logs the counts not yet told, every couple of seconds, until the relay ends.
    pub async fn tell(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let line = self.refusals.lock().summary(self.now_ms());
            if let Some(line) = line {
                tracing::warn!("{line}");
            }
        }
    }

    /// Every reason with its total so far.
    pub fn totals(&self) -> Vec<(&'static str, u64)> {
        self.refusals.lock().totals().collect()
    }
}

/// One listener's count of open connections per address.
pub struct Gate {
    per_ip: Mutex<PerAddress>,
    /// The reason its refusals are booked under.
    reason: &'static str,
    books: Arc<Books>,
}

/// A connection the gate counted, until it is dropped.
pub struct Pass {
    gate: Arc<Gate>,
    ip: IpAddr,
    conn: Option<Conn>,
}

/// A client's connection to a face, told to `on_connect` now and `on_disconnect` at its end.
struct Conn {
    env: Vec<(&'static str, String)>,
    since: Instant,
    on_disconnect: Option<Vec<String>>,
    runtime: tokio::runtime::Handle,
}

impl Pass {
    /// Names this connection (`face`: rtsp, rtmp, srt, webrtc …; `addr`: the client's
    /// address) and runs `on_connect` for it; `on_disconnect` runs when the pass is dropped.
    /// `runtime` runs the hooks (the pass may be dropped on a thread of its own).
    pub fn connected(mut self, face: &'static str, addr: String, runtime: &tokio::runtime::Handle) -> Self {
        let hooks = self.gate.books.hooks.lock().clone();
        if hooks.on_connect.is_none() && hooks.on_disconnect.is_none() {
            return self;
        }
        let env = vec![
            ("FANOUT_CONN_PROTOCOL", face.to_string()),
            ("FANOUT_CONN_ID", crate::readers::new_id()),
            ("FANOUT_CONN_ADDR", addr),
        ];
        if let Some(cmd) = &hooks.on_connect {
            let _in = runtime.enter();
            crate::hook::Hook::once_argv("on_connect", cmd, face, &env);
        }
        self.conn =
            Some(Conn { env, since: Instant::now(), on_disconnect: hooks.on_disconnect, runtime: runtime.clone() });
        self
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.per_ip.lock().close(self.ip);
        self.gate.books.open.fetch_sub(1, Relaxed);
        if let Some(Conn { mut env, since, on_disconnect: Some(cmd), runtime }) = self.conn.take() {
            env.push(("FANOUT_CONN_DURATION_S", format!("{:.3}", since.elapsed().as_secs_f64())));
            let face = env[0].1.clone();
            let _in = runtime.enter();
            crate::hook::Hook::once_argv("on_disconnect", &cmd, &face, &env);
        }
    }
}

impl Gate {
    /// `reason`: how its refusals are told; the cap is the books'.
    pub fn new(reason: &'static str, books: Arc<Books>) -> Arc<Self> {
        Arc::new(Self { per_ip: Mutex::new(PerAddress::default()), reason, books })
    }

    /// Counts a connection from `ip`, or books a refusal: that address is at its cap.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Pass> {
        let mut per_ip = self.per_ip.lock();
        per_ip.set_cap(self.books.cap.load(Relaxed));
        if per_ip.try_open(ip) {
            self.books.open.fetch_add(1, Relaxed);
            return Some(Pass { gate: self.clone(), ip, conn: None });
        }
        self.books.refuse(self.reason, ip);
        None
    }
}

/// A resource that is not a connection (a download, a file read), held at most `per_ip`
/// times by one address and `total` times by all: what one client can take of it is
/// bounded, and so is what all take together.
pub struct Quota {
    per_ip: Mutex<PerAddress>,
    total: usize,
    held: AtomicUsize,
}

/// One use of a [`Quota`], until it is dropped.
pub struct Held {
    quota: Arc<Quota>,
    ip: IpAddr,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.quota.per_ip.lock().close(self.ip);
        self.quota.held.fetch_sub(1, Relaxed);
    }
}

impl Quota {
    pub fn new(per_ip: usize, total: usize) -> Arc<Self> {
        Arc::new(Self { per_ip: Mutex::new(PerAddress::new(per_ip)), total, held: AtomicUsize::new(0) })
    }

    /// A use by `ip`, or why not: that address, or everyone together, holds the most.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Result<Held, &'static str> {
        let mut per_ip = self.per_ip.lock();
        if self.held.load(Relaxed) >= self.total {
            return Err("every slot is taken");
        }
        if !per_ip.try_open(ip) {
            return Err("this address holds its share");
        }
        self.held.fetch_add(1, Relaxed);
        Ok(Held { quota: self.clone(), ip })
    }
}

/// Ends our side and reads what the client still sends for a moment before the socket is
/// dropped: closing with unread bytes would reset the connection (and could lose an answer
/// just written), where a refusal should be a clean close.
pub async fn linger_close(stream: &tokio::net::TcpStream) {
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
    let mut scratch = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(300), async {
        while stream.readable().await.is_ok() {
            match stream.try_read(&mut scratch) {
                Ok(0) => return,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return,
                _ => {}
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_bounds_one_address_and_all_together() {
        let q = Quota::new(2, 3);
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap());
        let a1 = q.take(a).unwrap();
        let _a2 = q.take(a).unwrap();
        assert_eq!(q.take(a).err(), Some("this address holds its share"));
        let _b1 = q.take(b).unwrap();
        assert_eq!(q.take(b).err(), Some("every slot is taken"));
        drop(a1);
        assert!(q.take(b).is_ok(), "a use given back is another's");
    }
}
