//! The few Linux primitives the engine sleeps on: eventfd (doorbells and
//! completion channels), timerfd (microsecond retransmission deadlines) and
//! epoll. Each wrapper owns its descriptor.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An eventfd counter: `signal` adds one, `drain` reads and resets.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new(nonblocking: bool) -> io::Result<EventFd> {
        let flags = libc::EFD_CLOEXEC | if nonblocking { libc::EFD_NONBLOCK } else { 0 };
        // SAFETY: eventfd has no pointer arguments; the result is checked.
        let fd = cvt(unsafe { libc::eventfd(0, flags) })?;
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Whether the one was added (a full counter refuses it: harmless,
    /// the reader wakes anyway).
    pub fn signal(&self) -> bool {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) == 8 }
    }

    /// Read the counter (blocking if the fd is blocking and it is zero).
    pub fn drain(&self) -> io::Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64.
        let r = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if r == 8 {
            Ok(v)
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl std::os::fd::AsFd for EventFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A monotonic timerfd armed to absolute nanosecond deadlines.
#[derive(Debug)]
pub struct TimerFd(OwnedFd);

impl TimerFd {
    pub fn new() -> io::Result<TimerFd> {
        // SAFETY: no pointer arguments; result checked.
        let fd = cvt(unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
            )
        })?;
        // SAFETY: fresh descriptor we own.
        Ok(TimerFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Fire after `ns` nanoseconds (0 disarms).
    pub fn set_relative(&self, ns: u64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec; the old value is not wanted.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Fire every `ns` nanoseconds from now on.
    pub fn set_periodic(&self, ns: u64) {
        let t = libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: t,
            it_value: t,
        };
        // SAFETY: `spec` is a valid itimerspec; the old value is not wanted.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Consume expirations; returns how many there were (0 if none).
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN leaves it 0.
        let r = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if r == 8 {
            v
        } else {
            0
        }
    }
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// An epoll set of read-readiness interests.
#[derive(Debug)]
pub struct Epoll(OwnedFd);

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: no pointer arguments; result checked.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: fresh descriptor we own.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn add(&self, fd: RawFd) -> io::Result<()> {
        self.add_with(fd, libc::EPOLLIN as u32)
    }

    /// Add with explicit event flags (e.g. `EPOLLIN | EPOLLET`).
    pub fn add_with(&self, fd: RawFd, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
        Ok(())
    }

    /// Change the events an added fd is watched for (0: none).
    pub fn modify(&self, fd: RawFd, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut ev) })?;
        Ok(())
    }

    /// Wait until one of the fds is readable or `timeout_ms` passes (-1:
    /// forever; 0: only look). Returns which fds are ready, so the caller
    /// reads only those: a read of an eventfd or timerfd that has nothing
    /// is a system call for an `EAGAIN`.
    pub fn wait(&self, timeout_ms: i32) -> io::Result<Ready> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; READY_MAX];
        // SAFETY: `evs` has room for the READY_MAX events we allow.
        let r = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                evs.as_mut_ptr(),
                READY_MAX as libc::c_int,
                timeout_ms,
            )
        };
        let mut ready = Ready {
            fds: [-1; READY_MAX],
            n: 0,
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(ready);
            }
            return Err(e);
        }
        for ev in &evs[..r as usize] {
            ready.fds[ready.n] = ev.u64 as RawFd;
            ready.n += 1;
        }
        Ok(ready)
    }
}

/// Most events one `Epoll::wait` reports. More ready descriptors than this
/// are not lost: the doorbells and timers are level-triggered (the next
/// wait reports them again) and every pass drains the edge-triggered
/// sockets whether or not they were reported.
const READY_MAX: usize = 16;

/// The descriptors one [`Epoll::wait`] found ready (each added with its own
/// number as the event's data).
#[derive(Debug, Clone, Copy)]
pub struct Ready {
    fds: [RawFd; READY_MAX],
    n: usize,
}

impl Ready {
    /// Whether `fd` was reported ready.
    pub fn has(&self, fd: RawFd) -> bool {
        self.fds[..self.n].contains(&fd)
    }

    /// How many descriptors were reported ready.
    pub fn len(&self) -> usize {
        self.n
    }
}
