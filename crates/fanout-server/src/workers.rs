//! Bounded pools of threads for blocking work that a client can make slow: disk reads for
//! recordings, the auth service's calls and JWKS fetches. Each pool has its own threads (made
//! as work comes, up to its cap) and a bounded queue: when both are full the work is refused
//! at once (`Busy`) instead of queued without end. So a flood of one kind of work (stalled
//! downloads, a hanging auth service) never takes the threads of another, nor tokio's shared
//! blocking pool, which closes sessions and runs the rest.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

type Job = Box<dyn FnOnce() + Send>;

/// The pool's threads and queue were full: the work was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy(pub &'static str);

impl std::error::Error for Busy {}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the {} workers are all busy and their queue is full: try again later", self.0)
    }
}

pub struct Workers {
    name: &'static str,
    max: usize,
    tx: SyncSender<Job>,
    rx: Arc<Mutex<Receiver<Job>>>,
    threads: AtomicUsize,
    /// Threads waiting for work.
    idle: Arc<AtomicUsize>,
}

impl Workers {
    /// `threads` at most, and at most `queue` jobs waiting for one.
    pub fn new(name: &'static str, threads: usize, queue: usize) -> Self {
        let (tx, rx) = sync_channel(queue);
        Self {
            name,
            max: threads.max(1),
            tx,
            rx: Arc::new(Mutex::new(rx)),
            threads: AtomicUsize::new(0),
            idle: Arc::default(),
        }
    }

    /// Runs `f` on one of the pool's threads, or refuses it at once when the pool is full.
    pub async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, Busy> {
        let (done, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = done.send(f());
        });
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(Busy(self.name)),
            Err(TrySendError::Disconnected(_)) => unreachable!("the pool holds its receiver"),
        }
        self.grow();
        // A job whose thread panicked has no answer: the pool says so as busy, not a hang.
        answer.await.map_err(|_| Busy(self.name))
    }

    /// One more thread when none waits and the cap allows.
    fn grow(&self) {
        if self.idle.load(SeqCst) > 0 {
            return;
        }
        let n = self.threads.load(SeqCst);
        if n >= self.max || self.threads.compare_exchange(n, n + 1, SeqCst, SeqCst).is_err() {
            return;
        }
        let (rx, idle) = (self.rx.clone(), self.idle.clone());
        let spawned = std::thread::Builder::new().name(format!("fanout-{}", self.name)).spawn(move || loop {
            idle.fetch_add(1, SeqCst);
            let job = rx.lock().recv();
            idle.fetch_sub(1, SeqCst);
            match job {
                // A panic ends the job (its caller hears Busy), not the thread.
                Ok(job) => drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))),
                Err(_) => return,
            }
        });
        if let Err(e) = spawned {
            self.threads.fetch_sub(1, SeqCst);
            tracing::warn!("cannot start a {} worker thread: {e}", self.name);
        }
    }

    /// Threads started so far.
    #[cfg(test)]
    fn threads(&self) -> usize {
        self.threads.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn runs_work_and_answers() {
        let w = Workers::new("test", 2, 4);
        assert_eq!(rt().block_on(w.run(|| 6 * 7)), Ok(42));
        assert_eq!(w.threads(), 1);
    }

    #[test]
    fn a_full_pool_refuses_at_once_and_takes_work_again_when_free() {
        let w = Arc::new(Workers::new("test", 2, 3));
        let gate = Arc::new(std::sync::Barrier::new(3));
        let rt = rt();
        rt.block_on(async {
            // Two threads held, three queued: the sixth is refused without waiting.
            let mut held = Vec::new();
            for _ in 0..2 {
                let (w, g) = (w.clone(), gate.clone());
                held.push(tokio::spawn(async move { w.run(move || g.wait()).await }));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut queued = Vec::new();
            for k in 0..3 {
                let w = w.clone();
                queued.push(tokio::spawn(async move { w.run(move || k).await }));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let t0 = std::time::Instant::now();
            assert_eq!(w.run(|| 9).await, Err(Busy("test")));
            assert!(t0.elapsed() < Duration::from_millis(50));
            assert_eq!(w.threads(), 2, "never more threads than the cap");
            gate.wait();
            for h in held {
                h.await.unwrap().unwrap();
            }
            for (k, q) in queued.into_iter().enumerate() {
                assert_eq!(q.await.unwrap(), Ok(k as i32));
            }
            assert_eq!(w.run(|| 9).await, Ok(9));
        });
    }

    #[test]
    fn a_panicking_job_is_busy_and_the_thread_lives_on() {
        let w = Workers::new("test", 1, 1);
        let rt = rt();
        assert_eq!(rt.block_on(w.run(|| -> u8 { panic!("boom") })), Err(Busy("test")));
        assert_eq!(rt.block_on(w.run(|| 1)), Ok(1));
        assert_eq!(w.threads(), 1);
    }
}
