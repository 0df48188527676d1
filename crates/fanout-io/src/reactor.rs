//! The reactor: one thread waiting on socket readiness (epoll through mio, edge-triggered)
//! and turning it into ready tasks. It never reads or writes a socket itself.

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use parking_lot::Mutex;
use slab::Slab;
use std::collections::BinaryHeap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

const WAKER: Token = Token(usize::MAX);

/// What the reactor wakes when its socket is ready or its time has come: the engine's tasks
/// (the engine, above this module, implements it).
pub trait Wake: Send + Sync {
    fn wake(self: Arc<Self>);
}

type Task = dyn Wake;

/// Readiness flags a sink group reads when it runs.
#[derive(Debug, Default)]
pub struct IoFlags {
    pub writable: AtomicBool,
    pub readable: AtomicBool,
}

#[derive(Clone)]
enum Handler {
    /// Schedule the task (a source).
    Ready(Arc<Task>),
    /// Record readiness and schedule the sink's group.
    Sink(Arc<Task>, Arc<IoFlags>),
}

/// A task to schedule at a time (min-heap order: earliest first).
struct Timer {
    at: Instant,
    task: Arc<Task>,
}

impl PartialEq for Timer {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timer {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.at.cmp(&self.at)
    }
}

pub struct Reactor {
    registry: Registry,
    handlers: Mutex<Slab<Handler>>,
    timers: Mutex<BinaryHeap<Timer>>,
    waker: Waker,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A registration; deregister it with [`Reactor::deregister`] before closing the fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    token: Token,
    fd: RawFd,
}

impl Reactor {
    pub fn start(priority: crate::sys::ThreadPriority) -> std::io::Result<Arc<Self>> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let r = Arc::new(Self {
            registry,
            handlers: Mutex::new(Slab::new()),
            timers: Mutex::new(BinaryHeap::new()),
            waker,
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let me = r.clone();
        let t = crate::sys::spawn_with_priority("fanout-reactor".into(), priority, move || me.run(poll))?;
        *r.thread.lock() = Some(t);
        Ok(r)
    }

    /// Schedules `task` whenever `fd` becomes readable.
    pub fn register_source(&self, fd: RawFd, task: Arc<Task>) -> std::io::Result<Registration> {
        self.register(fd, Interest::READABLE, Handler::Ready(task))
    }

    /// Sets the sink's flags and schedules its group when `fd` becomes writable or readable
    /// (a stream sink: readable means the peer sent something or closed).
    pub fn register_sink(&self, fd: RawFd, task: Arc<Task>, flags: Arc<IoFlags>) -> std::io::Result<Registration> {
        self.register(fd, Interest::READABLE | Interest::WRITABLE, Handler::Sink(task, flags))
    }

    fn register(&self, fd: RawFd, interest: Interest, h: Handler) -> std::io::Result<Registration> {
        let token = Token(self.handlers.lock().insert(h));
        if let Err(e) = self.registry.register(&mut SourceFd(&fd), token, interest) {
            self.handlers.lock().remove(token.0);
            return Err(e);
        }
        Ok(Registration { token, fd })
    }

    /// Schedules `task` at `at` (at once if that has passed).
    pub fn schedule_at(&self, task: Arc<Task>, at: Instant) {
        let mut timers = self.timers.lock();
        let earliest = timers.peek().is_none_or(|t| at < t.at);
        timers.push(Timer { at, task });
        drop(timers);
        if earliest {
            let _ = self.waker.wake();
        }
    }

    pub fn deregister(&self, reg: Registration) {
        let _ = self.registry.deregister(&mut SourceFd(&reg.fd));
        self.handlers.lock().try_remove(reg.token.0);
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    fn run(&self, mut poll: Poll) {
        let mut events = Events::with_capacity(1024);
        let mut ready: Vec<Handler> = Vec::with_capacity(1024);
        while !self.stop.load(Ordering::Acquire) {
            let timeout = self.timers.lock().peek().map(|t| t.at.saturating_duration_since(Instant::now()));
            if let Err(e) = poll.poll(&mut events, timeout) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!("reactor poll failed: {e}");
                }
                continue;
            }
            {
                let handlers = self.handlers.lock();
                for ev in events.iter().filter(|e| e.token() != WAKER) {
                    let Some(h) = handlers.get(ev.token().0) else { continue };
                    if let Handler::Sink(_, flags) = h {
                        if ev.is_writable() {
                            flags.writable.store(true, Ordering::Release);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            flags.readable.store(true, Ordering::Release);
                        }
                    }
                    ready.push(h.clone());
                }
            }
            {
                let now = Instant::now();
                let mut timers = self.timers.lock();
                while timers.peek().is_some_and(|t| t.at <= now) {
                    let t = timers.pop().expect("peeked");
                    ready.push(Handler::Ready(t.task));
                }
            }
            // Schedule outside the lock: pushing takes the queue lock.
            for h in ready.drain(..) {
                match h {
                    Handler::Ready(t) | Handler::Sink(t, _) => t.wake(),
                }
            }
        }
    }
}
