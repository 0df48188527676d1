//! The engine: pre-spawned worker threads serving strict-priority class queues of ready
//! tasks (OMSS's worker pool and scheduler).
//!
//! A [`Task`] is a source or a sink group. Whoever makes it ready (the reactor on socket
//! readiness, a source after publishing) calls [`Task::schedule`]; a task is queued at most
//! once and run by one worker at a time; if it is made ready again while it runs, it is
//! queued again when it returns, so no wake-up is lost.

use crate::reactor::Reactor;
use crate::sys;
use fanout_core::{ClassQueues, Priority};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const RUNNING: u8 = 2;
const NOTIFIED: u8 = 3;

/// Work a task does when it runs.
pub trait Job: Send + Sync {
    /// Does a bounded amount of work. Returns `true` if work is left (the task is queued
    /// again behind the others of its class).
    fn run(&self, ctx: &mut WorkerCtx) -> bool;
}

/// Who runs a task when it becomes ready.
#[derive(Clone)]
pub enum Runner {
    /// The engine's worker pool.
    Engine(Weak<Shared>),
    /// A dedicated thread (the `daemon` baseline), woken by a signal.
    Thread(Arc<Signal>),
}

pub struct Task {
    state: AtomicU8,
    class: Priority,
    runner: Runner,
    job: Box<dyn Job>,
}

impl Task {
    pub fn new(class: Priority, runner: Runner, job: Box<dyn Job>) -> Arc<Self> {
        Arc::new(Self { state: AtomicU8::new(IDLE), class, runner, job })
    }

    /// Makes the task ready.
    pub fn schedule(self: &Arc<Self>) {
        match &self.runner {
            Runner::Thread(sig) => sig.raise(),
            Runner::Engine(shared) => {
                let mut s = self.state.load(Ordering::Acquire);
                loop {
                    let (to, push) = match s {
                        IDLE => (QUEUED, true),
                        RUNNING => (NOTIFIED, false),
                        _ => return,
                    };
                    match self.state.compare_exchange_weak(s, to, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => {
                            if push {
                                if let Some(shared) = shared.upgrade() {
                                    shared.push(self.clone());
                                }
                            }
                            return;
                        }
                        Err(now) => s = now,
                    }
                }
            }
        }
    }

    /// Runs the job directly (dedicated-thread runners).
    pub fn run_now(&self, ctx: &mut WorkerCtx) -> bool {
        self.job.run(ctx)
    }
}

/// A level-triggered wake-up flag for a dedicated thread.
#[derive(Default)]
pub struct Signal {
    raised: Mutex<bool>,
    cv: Condvar,
}

impl Signal {
    pub fn raise(&self) {
        *self.raised.lock() = true;
        self.cv.notify_one();
    }
    /// Waits until raised (or `timeout`), then lowers the flag. Returns whether it was raised.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let mut r = self.raised.lock();
        if !*r {
            self.cv.wait_for(&mut r, timeout);
        }
        std::mem::replace(&mut *r, false)
    }
}

/// Per-worker scratch space: the send and receive batches are built here and reused, so
/// the per-packet path never allocates.
pub struct WorkerCtx {
    pub iov: Vec<libc::iovec>,
    pub hdrs: Vec<libc::mmsghdr>,
    /// The baselines' per-sink user-space copy goes here.
    pub copy: Vec<u8>,
    /// Layer-dropping sinks' rewritten RTP header starts, and which packets they keep.
    pub heads: Vec<[u8; 4]>,
    pub picked: Vec<usize>,
    /// Beside `picked`: the aggregates rebuilt for the sink (`None`: the ring's packet).
    pub rebuilt: Vec<Option<Arc<crate::packet::Packet>>>,
    /// A send on a group's unconnected socket returned an error: an ICMP error (some sink's)
    /// may wait in its error queue. The group reads and clears it after each run.
    pub send_error: bool,
}

impl Default for WorkerCtx {
    fn default() -> Self {
        Self {
            iov: Vec::with_capacity(1024),
            hdrs: Vec::with_capacity(1024),
            copy: vec![0; 65536],
            heads: Vec::with_capacity(1024),
            picked: Vec::with_capacity(1024),
            rebuilt: Vec::with_capacity(1024),
            send_error: false,
        }
    }
}

pub struct Shared {
    queues: Mutex<ClassQueues<Arc<Task>>>,
    cv: Condvar,
    shutdown: AtomicBool,
    /// Tasks run, for the status API.
    pub runs: AtomicU64,
}

impl Shared {
    fn push(&self, task: Arc<Task>) {
        self.queues.lock().push(task.class, task);
        self.cv.notify_one();
    }
}

/// The worker pool and the reactor that feeds it.
pub struct Engine {
    shared: Arc<Shared>,
    reactor: Arc<Reactor>,
    workers: Vec<JoinHandle<()>>,
    /// The eBPF program of the `kernel` data path, loaded by the first session that asks.
    kernel: Mutex<Option<Result<Arc<crate::kernel::KernelFanout>, String>>>,
    /// Sink slots the program's array is made with, for all sessions together.
    kernel_sinks: AtomicUsize,
}

impl Engine {
    /// Starts `workers` worker threads (0 = one per core) and the reactor thread.
    pub fn start(workers: usize) -> std::io::Result<Self> {
        // Every TCP/HTTP sink is a socket: as many as the machine allows.
        sys::raise_nofile_limit(1 << 20);
        let n = if workers == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { workers };
        let shared = Arc::new(Shared {
            queues: Mutex::new(ClassQueues::default()),
            cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            runs: AtomicU64::new(0),
        });
        let reactor = Reactor::start()?;
        let workers = (0..n)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new().name(format!("fanout-worker-{i}")).spawn(move || worker(&shared))
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Self {
            shared,
            reactor,
            workers,
            kernel: Mutex::new(None),
            kernel_sinks: AtomicUsize::new(crate::kernel::DEFAULT_MAX_SINKS),
        })
    }

    pub fn runner(&self) -> Runner {
        Runner::Engine(Arc::downgrade(&self.shared))
    }

    pub fn reactor(&self) -> &Arc<Reactor> {
        &self.reactor
    }

    /// How many sinks the `kernel` path holds, all sessions together (before its first use).
    pub fn set_kernel_sinks(&self, n: usize) {
        self.kernel_sinks.store(n, Ordering::Relaxed);
    }

    /// The `kernel` data path, loaded on first use (the answer, good or bad, is kept).
    pub fn kernel(&self) -> Result<Arc<crate::kernel::KernelFanout>, String> {
        self.kernel
            .lock()
            .get_or_insert_with(|| {
                crate::kernel::KernelFanout::load(self.kernel_sinks.load(Ordering::Relaxed)).map_err(|e| e.to_string())
            })
            .clone()
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    pub fn queued(&self) -> usize {
        self.shared.queues.lock().len()
    }

    pub fn runs(&self) -> u64 {
        self.shared.runs.load(Ordering::Relaxed)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.cv.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        self.reactor.stop();
    }
}

fn worker(shared: &Shared) {
    let mut ctx = WorkerCtx::default();
    loop {
        let task = {
            let mut q = shared.queues.lock();
            loop {
                if shared.shutdown.load(Ordering::Acquire) {
                    return;
                }
                if let Some(t) = q.pop() {
                    break t;
                }
                shared.cv.wait(&mut q);
            }
        };
        task.state.store(RUNNING, Ordering::Release);
        let more = task.job.run(&mut ctx);
        shared.runs.fetch_add(1, Ordering::Relaxed);
        let requeue = more || task.state.compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire).is_err();
        if requeue {
            task.state.store(QUEUED, Ordering::Release);
            shared.push(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    struct Count(AtomicU64, u64);
    impl Job for Count {
        fn run(&self, _: &mut WorkerCtx) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst) + 1 < self.1
        }
    }

    #[test]
    fn tasks_run_until_done_and_wakeups_are_not_lost() {
        let engine = Engine::start(2).unwrap();
        let t = Task::new(Priority::new(3).unwrap(), engine.runner(), Box::new(Count(AtomicU64::new(0), 5)));
        t.schedule();
        t.schedule();
        let deadline = Instant::now() + Duration::from_secs(5);
        while engine.runs() < 5 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(engine.runs() >= 5);
    }
}
