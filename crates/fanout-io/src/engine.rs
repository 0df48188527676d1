//! The engine: pre-spawned worker threads serving strict-priority class queues of ready
//! tasks (OMSS's worker pool and scheduler).
//!
//! A [`Task`] is a source or a sink group. Whoever makes it ready (the reactor on socket
//! readiness, a source after publishing) calls [`Task::schedule`]; a task is queued at most
//! once and run by one worker at a time; if it is made ready again while it runs, it is
//! queued again when it returns, so no wake-up is lost.
//!
//! Every task's wait for a worker is measured; while the classes served keep waiting too
//! long, the lowest is shed ([`fanout_core::Shedder`]): its sources drop what they read,
//! so a crowded host loses the low classes whole instead of lapping every class alike.

use crate::reactor::Reactor;
use crate::sys;
use fanout_core::{ClassQueues, Priority, ShedConfig, Shedder};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

impl Runner {
    /// Whether the engine sheds `class` now (a source of it drops what it reads).
    pub fn is_shed(&self, class: Priority) -> bool {
        match self {
            Runner::Engine(shared) => {
                shared.upgrade().is_some_and(|s| class.get() < s.shed_level.load(Ordering::Relaxed))
            }
            Runner::Thread(_) => false,
        }
    }

    /// Threads that may run a session's tasks at once.
    pub fn workers(&self) -> usize {
        match self {
            Runner::Engine(shared) => shared.upgrade().map_or(1, |s| s.workers),
            Runner::Thread(_) => 1,
        }
    }
}

impl crate::reactor::Wake for Task {
    fn wake(self: Arc<Self>) {
        self.schedule();
    }
}

pub struct Task {
    state: AtomicU8,
    /// When it was last queued, ns since the engine started.
    queued_at: AtomicU64,
    class: Priority,
    runner: Runner,
    job: Box<dyn Job>,
}

impl Task {
    pub fn new(class: Priority, runner: Runner, job: Box<dyn Job>) -> Arc<Self> {
        Arc::new(Self { state: AtomicU8::new(IDLE), queued_at: AtomicU64::new(0), class, runner, job })
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
    /// Departure times of the datagrams in `hdrs`, where stamped.
    pub txtimes: Vec<crate::sys::TxtimeCmsg>,
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
            txtimes: Vec::new(),
            send_error: false,
        }
    }
}

/// The ready tasks, and who judges their waits.
struct Queues {
    ready: ClassQueues<Arc<Task>>,
    shed: Option<Shedder>,
}

pub struct Shared {
    queues: Mutex<Queues>,
    cv: Condvar,
    shutdown: AtomicBool,
    workers: usize,
    started: Instant,
    /// Classes below this are shed.
    shed_level: AtomicU8,
    /// Times the shed level changed, for the status API.
    shed_changes: AtomicU64,
    /// Tasks run, for the status API.
    pub runs: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    fn push(&self, task: Arc<Task>) {
        task.queued_at.store(self.now_ns(), Ordering::Relaxed);
        self.queues.lock().ready.push(task.class, task);
        self.cv.notify_one();
    }

    /// Takes the next task; its wait goes to the shedder.
    fn pop(&self, q: &mut Queues) -> Option<Arc<Task>> {
        let task = q.ready.pop()?;
        if let Some(shed) = q.shed.as_mut() {
            let now = self.now_ns();
            for c in q.ready.waiting() {
                shed.waiting(c, now);
            }
            let level = shed.observe(task.class, now.saturating_sub(task.queued_at.load(Ordering::Relaxed)), now);
            if self.shed_level.swap(level, Ordering::Relaxed) != level {
                self.shed_changes.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    "overload: {}",
                    match level {
                        0 => "every class is served again".to_string(),
                        l => format!("classes below {l} are shed (their sources drop what they read)"),
                    }
                );
            }
        }
        Some(task)
    }
}

/// How the engine is run.
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineOptions {
    /// Worker threads; 0 = one per core.
    pub workers: usize,
    /// Shed the lowest classes while the others wait longer than this (none: never).
    pub shed_after: Option<Duration>,
    /// Scheduling priority of the workers and the reactor.
    pub priority: sys::ThreadPriority,
    /// The egress link all sessions share, in bytes per second (none: not limited): the
    /// relay sends no faster, sharing it by the sessions' reserved rates, then by class.
    pub egress_rate: Option<u64>,
}

/// The egress link the sessions share ([`fanout_core::egress`]), and the epoch of its clock.
pub struct SharedEgress {
    pub link: Mutex<fanout_core::Egress>,
    pub epoch: Instant,
}

/// A session's place on the shared egress, given up when the session goes.
pub struct EgressSeat {
    pub egress: Arc<SharedEgress>,
    pub slot: fanout_core::Slot,
}

impl Drop for EgressSeat {
    fn drop(&mut self) {
        self.egress.link.lock().leave(self.slot);
    }
}

impl SharedEgress {
    /// A link of `rate` bytes per second that takes 100 ms of itself back to back (at least
    /// 64 KiB: a keyframe to a few sinks).
    fn new(rate: u64) -> Result<Self, fanout_core::BadPace> {
        let burst = (rate / 10).max(64 * 1024);
        Ok(Self { link: Mutex::new(fanout_core::Egress::new(rate, burst)?), epoch: Instant::now() })
    }

    /// A session of `class` takes a place, with `reserve` bytes per second of the link
    /// (0: none) of which 100 ms (at least 64 KiB) may go back to back.
    pub fn join(self: &Arc<Self>, class: Priority, reserve: u64) -> Result<EgressSeat, fanout_core::Overbooked> {
        let slot = self.link.lock().join(class, reserve, (reserve / 10).max(64 * 1024))?;
        Ok(EgressSeat { egress: self.clone(), slot })
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
    egress: Option<Arc<SharedEgress>>,
}

impl Engine {
    /// Starts the worker threads and the reactor thread.
    pub fn start(opts: EngineOptions) -> std::io::Result<Self> {
        // Every TCP/HTTP sink is a socket: as many as the machine allows.
        sys::raise_nofile_limit(1 << 20);
        let n = match opts.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues {
                ready: ClassQueues::default(),
                shed: opts.shed_after.map(|d| Shedder::new(ShedConfig::after_ms(d.as_millis() as u64))),
            }),
            cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            workers: n,
            started: Instant::now(),
            shed_level: AtomicU8::new(0),
            shed_changes: AtomicU64::new(0),
            runs: AtomicU64::new(0),
        });
        let egress = match opts.egress_rate {
            Some(rate) => Some(Arc::new(SharedEgress::new(rate).map_err(std::io::Error::other)?)),
            None => None,
        };
        let reactor = Reactor::start(opts.priority)?;
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let sh = shared.clone();
            match sys::spawn_with_priority(format!("fanout-worker-{i}"), opts.priority, move || worker(&sh)) {
                Ok(t) => workers.push(t),
                Err(e) => {
                    shared.shutdown.store(true, Ordering::Release);
                    shared.cv.notify_all();
                    workers.into_iter().for_each(|w| drop(w.join()));
                    reactor.stop();
                    return Err(e);
                }
            }
        }
        Ok(Self {
            shared,
            reactor,
            workers,
            kernel: Mutex::new(None),
            kernel_sinks: AtomicUsize::new(crate::kernel::DEFAULT_MAX_SINKS),
            egress,
        })
    }

    /// The egress link the sessions share, if it is limited.
    pub fn egress(&self) -> Option<&Arc<SharedEgress>> {
        self.egress.as_ref()
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
        self.shared.queues.lock().ready.len()
    }

    /// Classes below this are shed now (0: none), and how often that changed.
    pub fn shed(&self) -> (u8, u64) {
        (self.shared.shed_level.load(Ordering::Relaxed), self.shared.shed_changes.load(Ordering::Relaxed))
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
                if let Some(t) = shared.pop(&mut q) {
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

    struct Count(AtomicU64, u64);
    impl Job for Count {
        fn run(&self, _: &mut WorkerCtx) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst) + 1 < self.1
        }
    }

    #[test]
    fn tasks_run_until_done_and_wakeups_are_not_lost() {
        let engine = Engine::start(EngineOptions { workers: 2, ..Default::default() }).unwrap();
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
