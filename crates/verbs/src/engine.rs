//! The soft-NIC engine: one progress thread per device context that drives
//! the transport core over the UDP port.
//!
//! The application's calls (post, poll, modify) take the state lock briefly
//! and ring a doorbell; everything that touches the wire happens here. So
//! inbound WRITE, READ and atomic requests are served while the target
//! application makes no call at all — it may be blocked in a TCP read or
//! spinning on its own memory, as perftest's servers are.
//!
//! The thread busy-polls while there is work and for a short grace period
//! after it (latency), then sleeps in epoll on the socket, the doorbell and
//! a timerfd armed to the core's next deadline (an idle device burns no CPU;
//! retransmission timers keep microsecond resolution).

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use softrdma_core::{Endpoint, Event, Nanos, RxMeta};
use softrdma_udp::Port;

use crate::memory::{segment, HostMemory};
use crate::sys::{Epoll, EventFd, TimerFd};

/// How long the progress thread keeps spinning after its last useful work.
const SPIN: Duration = Duration::from_micros(200);
/// After the application last polled, how long the engine thread leaves
/// progress to it.
const APP_GRACE: Duration = Duration::from_micros(500);
/// Packets sent per progress pass before receiving again (fairness).
const TX_BUDGET: usize = 256;

/// An asynchronous event for `ibv_get_async_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    QpFatal(u32),
    QpReqErr(u32),
    QpAccessErr(u32),
    QpLastWqeReached(u32),
    CqErr(u32),
}

/// State behind the lock.
pub(crate) struct State {
    pub ep: Endpoint,
    pub port: Port,
    pub mem: HostMemory,
    /// Completion channel doorbells by CQ.
    pub channels: HashMap<u32, Arc<crate::ChannelInner>>,
    pub async_events: std::collections::VecDeque<AsyncEvent>,
    /// Buffers of deregistered regions, freed once no work queue can still
    /// reference them.
    pub graveyard: Vec<Box<dyn Send>>,
    head: Vec<u8>,
    origin: Instant,
}

impl State {
    fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }

    /// One pass: receive, timers, transmit, events. Returns whether anything
    /// happened.
    fn progress(&mut self, async_fd: &EventFd) -> io::Result<bool> {
        let now = self.now();
        let State { ep, port, mem, .. } = self;
        let mut did = port.recv(|m, bytes| {
            let meta = RxMeta {
                sgid: m.sgid,
                dgid: m.dgid,
                traffic_class: m.traffic_class,
                hop_limit: m.hop_limit,
            };
            ep.handle_packet(now, &meta, bytes, mem);
        })? > 0;
        if ep.poll_timeout().is_some_and(|t| t <= now) {
            ep.handle_timeout(now);
            did = true;
        }
        let mut sent = 0;
        while sent < TX_BUDGET {
            let Some(t) = ep.poll_transmit(now, &mut self.head) else {
                break;
            };
            let mut slices: [&[u8]; softrdma_core::MAX_SGE] = [&[]; softrdma_core::MAX_SGE];
            let segs = t.segs.as_slice();
            for (s, g) in slices.iter_mut().zip(segs) {
                // SAFETY: the core validated each segment against a live
                // memory region; regions outlive queued work (see `retire`).
                *s = unsafe { segment(g.addr, g.len) };
            }
            // SAFETY: the slices stay valid until `flush` below returns:
            // region buffers are only freed by `retire`, under this same lock.
            unsafe {
                port.push(
                    t.dgid,
                    t.src_qpn,
                    &self.head[..t.head_len],
                    &slices[..segs.len()],
                    t.pad,
                )?
            };
            sent += 1;
        }
        port.flush()?;
        did |= sent > 0;
        while let Some(e) = self.ep.poll_event() {
            did = true;
            match e {
                Event::CompNotify(cq) => {
                    if let Some(ch) = self.channels.get(&cq.0) {
                        ch.pending.lock().unwrap().push_back(cq.0);
                        ch.fd.signal();
                    }
                }
                Event::CqErr(cq) => self.raise(AsyncEvent::CqErr(cq.0), async_fd),
                Event::QpReqErr(q) => self.raise(AsyncEvent::QpReqErr(q), async_fd),
                Event::QpAccessErr(q) => self.raise(AsyncEvent::QpAccessErr(q), async_fd),
                Event::QpLastWqeReached(q) => self.raise(AsyncEvent::QpLastWqeReached(q), async_fd),
            }
        }
        self.retire();
        Ok(did)
    }

    fn raise(&mut self, e: AsyncEvent, fd: &EventFd) {
        if self.async_events.len() < 1024 {
            self.async_events.push_back(e);
            fd.signal();
        }
    }

    /// Free deregistered buffers once no queue holds work that might point
    /// into them.
    fn retire(&mut self) {
        if !self.graveyard.is_empty() && self.ep.all_queues_idle() {
            self.graveyard.clear();
        }
    }
}

/// Whether the application's own threads keep a core busy: the process's
/// CPU time minus this thread's, over the last millisecond of wall time.
struct AppCpu {
    at: Instant,
    process: u64,
    me: u64,
    spinning: bool,
}

fn cpu_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl AppCpu {
    fn new() -> AppCpu {
        AppCpu {
            at: Instant::now(),
            process: cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID),
            me: cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID),
            spinning: false,
        }
    }

    fn app_spinning(&mut self) -> bool {
        let wall = self.at.elapsed();
        if wall >= Duration::from_millis(1) {
            let process = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
            let me = cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID);
            let others = (process - self.process).saturating_sub(me - self.me);
            self.spinning = others as f64 > 0.5 * wall.as_nanos() as f64;
            *self = AppCpu {
                at: Instant::now(),
                process,
                me,
                spinning: self.spinning,
            };
        }
        self.spinning
    }
}

pub(crate) struct Engine {
    state: Mutex<State>,
    doorbell: EventFd,
    pub async_fd: EventFd,
    sleeping: AtomicBool,
    stop: AtomicBool,
    /// Until when (ns since `origin`) the application is expected to keep
    /// driving progress itself, so the engine thread stands back.
    app_until: AtomicU64,
    origin: Instant,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    pub fn start(ep: Endpoint, port: Port) -> io::Result<Arc<Engine>> {
        let e = Arc::new(Engine {
            state: Mutex::new(State {
                ep,
                port,
                mem: HostMemory,
                channels: HashMap::new(),
                async_events: Default::default(),
                graveyard: Vec::new(),
                head: vec![0; 4096 + 256],
                origin: Instant::now(),
            }),
            doorbell: EventFd::new(true)?,
            async_fd: EventFd::new(true)?,
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            app_until: AtomicU64::new(0),
            origin: Instant::now(),
            thread: Mutex::new(None),
        });
        let me = e.clone();
        let h = std::thread::Builder::new()
            .name("softrdma-engine".into())
            .spawn(move || {
                if let Err(err) = me.run() {
                    eprintln!("softrdma: engine stopped: {err}");
                }
            })?;
        *e.thread.lock().unwrap() = Some(h);
        Ok(e)
    }

    /// Lock the state for a command.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Progress driven by the application thread (from `poll_cq`): the
    /// application is spinning anyway, so it does the engine's work and the
    /// engine thread stands back instead of competing for a core.
    pub fn app_progress(&self, st: &mut State) {
        let now = self.origin.elapsed().as_nanos() as u64;
        self.app_until
            .store(now + APP_GRACE.as_nanos() as u64, Ordering::Relaxed);
        if let Err(e) = st.progress(&self.async_fd) {
            eprintln!("softrdma: progress failed: {e}");
        }
    }

    /// How long the application is still expected to drive progress.
    fn app_grace_left(&self) -> Option<Duration> {
        let until = self.app_until.load(Ordering::Relaxed);
        let now = self.origin.elapsed().as_nanos() as u64;
        (until > now).then(|| Duration::from_nanos(until - now))
    }

    /// Tell the progress thread there is new work.
    pub fn ring(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.doorbell.signal();
        }
    }

    fn run(&self) -> io::Result<()> {
        let epoll = Epoll::new()?;
        let timer = TimerFd::new()?;
        epoll.add(self.lock().port.as_raw_fd())?;
        epoll.add(self.doorbell.as_raw_fd())?;
        epoll.add(timer.as_raw_fd())?;
        let mut last_work = Instant::now();
        let mut app_cpu = AppCpu::new();
        let few_cores = std::thread::available_parallelism().map_or(1, |n| n.get()) <= 2;
        while !self.stop.load(Ordering::SeqCst) {
            if let Some(left) = self.app_grace_left() {
                // The application drives progress from poll_cq; look again
                // when its grace ends (each poll extends it).
                std::thread::sleep(left);
                continue;
            }
            if self.lock().progress(&self.async_fd)? {
                last_work = Instant::now();
                continue;
            }
            // Spin for a while after work — unless, on a small host, the
            // application is itself spinning without calling us (a perftest
            // target waiting on its own memory). Then spinning here only
            // takes turns with it in scheduler slices of milliseconds;
            // sleeping in epoll lets the kernel wake this thread when a
            // packet arrives, which preempts the spinner at once.
            let spin = if few_cores && app_cpu.app_spinning() {
                Duration::ZERO
            } else {
                SPIN
            };
            if last_work.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            // Going to sleep: announce it, then look once more so a post
            // that raced with the announcement is not missed.
            self.sleeping.store(true, Ordering::SeqCst);
            let (did, deadline) = {
                let mut s = self.lock();
                let did = s.progress(&self.async_fd)?;
                let now = s.now();
                (did, s.ep.poll_timeout().map(|t| t.saturating_sub(now)))
            };
            if did {
                self.sleeping.store(false, Ordering::SeqCst);
                last_work = Instant::now();
                continue;
            }
            match deadline {
                Some(ns) => timer.set_relative(ns.max(1)),
                None => timer.set_relative(0),
            }
            epoll.wait(-1)?;
            self.sleeping.store(false, Ordering::SeqCst);
            let _ = self.doorbell.drain();
            timer.drain();
            last_work = Instant::now();
        }
        Ok(())
    }

    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.doorbell.signal();
        if let Some(h) = self.thread.lock().unwrap().take() {
            let _ = h.join();
        }
    }
}
