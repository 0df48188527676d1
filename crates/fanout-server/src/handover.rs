//! What the listeners share with a binary upgrade (`crate::upgrade`): the moment this
//! process's listening sockets became a new process's, after which it accepts nothing and
//! only serves the connections it has; and the way the API asks for an upgrade.

use std::io;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

/// An upgrade's answer: what was handed over, or why nothing was.
pub type Answer = Result<serde_json::Value, UpgradeFailed>;

/// Why an upgrade made nothing change: the new process could not start, did not serve in
/// time, or could not be told what it may take. This process serves on.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UpgradeFailed(pub String);

impl From<String> for UpgradeFailed {
    fn from(s: String) -> Self {
        UpgradeFailed(s)
    }
}

/// Why an upgrade was not made.
#[derive(Debug)]
pub enum Refused {
    /// Another runs, or this process handed over already.
    Running,
    Failed(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Running => f.write_str("an upgrade is running or this process has handed over: one at a time"),
            Refused::Failed(why) => f.write_str(why),
        }
    }
}

pub struct Handover {
    handed: watch::Sender<bool>,
    /// An upgrade runs (or has handed over): another is refused at once.
    running: std::sync::atomic::AtomicBool,
    requests: mpsc::Sender<oneshot::Sender<Answer>>,
    /// Taken once, by whoever runs upgrades (`serve`).
    pending: parking_lot::Mutex<Option<mpsc::Receiver<oneshot::Sender<Answer>>>>,
}

impl Default for Handover {
    fn default() -> Self {
        let (requests, rx) = mpsc::channel(4);
        Self {
            handed: watch::Sender::new(false),
            running: Default::default(),
            requests,
            pending: parking_lot::Mutex::new(Some(rx)),
        }
    }
}

impl Handover {
    /// The listening sockets are the new process's from now on.
    pub fn hand_over(&self) {
        self.handed.send_replace(true);
    }

    /// Whether they are.
    pub fn handed(&self) -> bool {
        *self.handed.borrow()
    }

    /// `listener`, accepting until the hand-over.
    pub fn listener(&self, listener: TcpListener) -> Listener {
        Listener { inner: Some(listener), handed: self.handed.subscribe() }
    }

    /// Asks for an upgrade; the answer comes when the new process took over or failed. One
    /// at a time: while one runs, or once one handed over, another is refused at once.
    pub async fn request(&self) -> Result<serde_json::Value, Refused> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.running.swap(true, SeqCst) {
            return Err(Refused::Running);
        }
        let (tx, rx) = oneshot::channel();
        let answer = match self.requests.send(tx).await {
            Err(_) => Err(UpgradeFailed("this relay does not upgrade (not run by `fanout serve`)".into())),
            Ok(()) => rx.await.unwrap_or_else(|_| Err(UpgradeFailed("the upgrade was abandoned".into()))),
        };
        // A failed upgrade changed nothing: the next may be tried.
        if answer.is_err() {
            self.running.store(false, SeqCst);
        }
        answer.map_err(|e| Refused::Failed(e.0))
    }

    /// The requests, for the one who runs them.
    pub fn take_requests(&self) -> Option<mpsc::Receiver<oneshot::Sender<Answer>>> {
        self.pending.lock().take()
    }
}

/// A listening socket that stops accepting at the hand-over and closes this process's
/// copy of it: connections waiting in its queue are then the new process's to accept.
pub struct Listener {
    inner: Option<TcpListener>,
    handed: watch::Receiver<bool>,
}

impl Listener {
    pub async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        loop {
            if *self.handed.borrow_and_update() {
                self.inner = None;
            }
            let Some(l) = &self.inner else { return std::future::pending().await };
            tokio::select! {
                got = l.accept() => return got,
                changed = self.handed.changed() => {
                    if changed.is_err() {
                        // (The relay is gone: nothing will be handed over.)
                        return l.accept().await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After the hand-over a listener accepts nothing more, and its socket is closed here.
    #[tokio::test]
    async fn a_listener_stops_at_the_hand_over() {
        let h = Handover::default();
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let mut l = h.listener(socket);
        let _c = TcpStream::connect(addr).await.unwrap();
        assert!(l.accept().await.is_ok());
        assert!(!h.handed());
        h.hand_over();
        let got = tokio::time::timeout(std::time::Duration::from_millis(200), l.accept()).await;
        assert!(got.is_err(), "accepted after the hand-over");
        assert!(TcpStream::connect(addr).await.is_err(), "the socket is still open here");
        assert!(h.handed());
    }
}
