//! What the soak watches in each process: resident memory and open file
//! descriptors, read from `/proc/self`.
//!
//! "Flat" is checked against the warm-up: the first samples (while
//! allocators, socket buffers and the engine's tables reach their working
//! size) set a baseline, the largest value seen then; every later sample
//! must stay within a stated margin of it. Descriptors get no margin at all:
//! nothing the soak does after warm-up (registrations, QP resets) may open
//! one for good.
//!
//! One cost grows by design and is allowed for exactly: a device never
//! issues a memory key twice, and remembers every key it issued in 2 to 4
//! bytes (`crates/core/src/mr/keys.rs`), two keys per registration. So the
//! RSS bound rises by [`KEY_RECORD_BYTES`] per registration made after the
//! warm-up; anything else must stay within the margin.

use std::io;
use std::time::Duration;

/// One reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Seconds since the run started.
    pub at_s: u64,
    /// `VmRSS` in KiB.
    pub rss_kib: u64,
    /// Entries in `/proc/self/fd`.
    pub fds: u64,
    /// Memory registrations this process had made by then.
    pub regs: u64,
}

/// The most a registration may cost for the device's lifetime: two keys
/// (lkey and rkey) of at most 4 bytes each in the issued-key record.
pub const KEY_RECORD_BYTES: u64 = 8;

/// `VmRSS` of this process, in KiB.
pub fn rss_kib() -> io::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| io::Error::other("/proc/self/status has no VmRSS line"))
}

/// Open file descriptors of this process (the directory handle used to
/// count them excluded).
pub fn fd_count() -> io::Result<u64> {
    Ok(std::fs::read_dir("/proc/self/fd")?
        .count()
        .saturating_sub(1) as u64)
}

/// Read RSS and descriptors now; `regs` is the caller's registration count.
pub fn sample(at: Duration, regs: u64) -> io::Result<Sample> {
    Ok(Sample {
        at_s: at.as_secs(),
        rss_kib: rss_kib()?,
        fds: fd_count()?,
        regs,
    })
}

/// The bound: after `warmup`, RSS may exceed the warm-up maximum by at most
/// `rss_margin_kib` plus [`KEY_RECORD_BYTES`] per registration since the
/// end of the warm-up, and descriptors may not exceed theirs.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub warmup: Duration,
    pub rss_margin_kib: u64,
}

impl Bound {
    /// The first sample that breaks the bound, described; `None` if the
    /// series is flat (or too short to tell, which the caller rules out).
    pub fn violation(&self, series: &[Sample]) -> Option<String> {
        let w = self.warmup.as_secs();
        // The warm-up's own last sample (taken at its end, see the soak's
        // sampler) belongs to the baseline: resources a run opens lazily
        // during warm-up (send sockets, say) are in it. Without it a run
        // sampled less often than its warm-up had only the sample at 0 s as
        // its baseline (a 1-hour run failed so, with 18 descriptors from
        // 300 s to 3600 s against a "maximum" of 14 taken before traffic).
        let (warm, after): (Vec<&Sample>, Vec<&Sample>) = series.iter().partition(|s| s.at_s <= w);
        let rss0 = warm.iter().map(|s| s.rss_kib).max()?;
        let fd0 = warm.iter().map(|s| s.fds).max()?;
        let regs0 = warm.iter().map(|s| s.regs).max()?;
        after.iter().find_map(|s| {
            let keys = s.regs.saturating_sub(regs0) * KEY_RECORD_BYTES / 1024;
            if s.rss_kib > rss0 + self.rss_margin_kib + keys {
                Some(format!(
                    "RSS {} KiB at {} s is more than {} KiB (margin) + {keys} KiB (key records of {} registrations) above the warm-up maximum {} KiB",
                    s.rss_kib, s.at_s, self.rss_margin_kib, s.regs - regs0, rss0
                ))
            } else if s.fds > fd0 {
                Some(format!(
                    "{} open descriptors at {} s, more than the warm-up maximum {}",
                    s.fds, s.at_s, fd0
                ))
            } else {
                None
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at_s: u64, rss_kib: u64, fds: u64) -> Sample {
        Sample {
            at_s,
            rss_kib,
            fds,
            regs: at_s * 1024,
        }
    }

    #[test]
    fn reads_this_process() {
        let _fds = crate::FD_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let x = sample(Duration::ZERO, 0).unwrap();
        assert!(x.rss_kib > 0 && x.fds >= 3, "{x:?}");
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(fd_count().unwrap(), x.fds + 1);
        drop(f);
    }

    #[test]
    fn bound_compares_against_the_warm_up_maximum() {
        let b = Bound {
            warmup: Duration::from_secs(10),
            rss_margin_kib: 100,
        };
        // 1024 registrations a second: 8 KiB of key records a second.
        let flat = [s(0, 900, 9), s(5, 1000, 10), s(20, 1180, 10), s(30, 950, 8)];
        assert_eq!(b.violation(&flat), None);
        let grew = [s(0, 1000, 10), s(5, 1000, 10), s(20, 1221, 10)];
        assert!(b.violation(&grew).unwrap().contains("RSS 1221 KiB at 20 s"));
        let fd = [s(0, 1000, 10), s(20, 1000, 11)];
        assert!(b.violation(&fd).unwrap().contains("11 open descriptors"));
        // The sample at the end of warm-up is part of the baseline.
        let lazy = [
            s(0, 900, 14),
            s(10, 1000, 18),
            s(20, 1000, 18),
            s(30, 1000, 18),
        ];
        assert_eq!(b.violation(&lazy), None);
        let leak = [s(0, 900, 14), s(10, 1000, 18), s(20, 1000, 19)];
        assert!(b
            .violation(&leak)
            .unwrap()
            .contains("19 open descriptors at 20 s"));
    }
}
