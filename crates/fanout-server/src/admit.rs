//! Who gets a connection: each listener (RTSP, RTSPS, the API/HTTP port) admits at most
//! `max_connections_per_ip` connections from one address at once, counted from the accept,
//! before any request deadline starts; the relay's refusals go into one book that logs the
//! first at once and the rest as counts every 10 s, and shows the totals in `/metrics`.
//! The policy is `fanout_core::admit`; this module holds its locks and the clock. The cap
//! is the relay's, in [`Books`], so a reload changes it for every listener at once.

use fanout_core::admit::{PerAddress, Refusals};
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
}

impl Books {
    pub fn new(cap: usize) -> Self {
        Self { refusals: Mutex::default(), t0: Instant::now(), cap: AtomicUsize::new(cap), open: AtomicUsize::new(0) }
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
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.per_ip.lock().close(self.ip);
        self.gate.books.open.fetch_sub(1, Relaxed);
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
            return Some(Pass { gate: self.clone(), ip });
        }
        self.books.refuse(self.reason, ip);
        None
    }
}
