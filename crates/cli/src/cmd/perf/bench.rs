//! The measured loops, as perftest runs them: the client keeps `tx_depth`
//! work requests in flight per QP, signals one in `cq_mod`, and times from
//! the first post to the last completion; latency tests ping-pong one
//! message at a time and time consecutive posts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use softrdma_verbs::*;
use std::result::Result;

use super::report::{BwResult, LatResult};
use super::setup::{inc, pattern, Res};
use super::{AtomicType, Params, Verb};

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// The latency loops' clock: the CPU's time-stamp counter where it ticks
/// at a constant rate, as perftest's `get_cycles()` and ucx_perftest's
/// `ucs_get_time()` read it, scaled to nanoseconds by a calibration
/// against the monotonic clock (`quanta`); the monotonic clock elsewhere.
/// Each iteration stamps on the critical path, as theirs do, so the stamp
/// must cost what theirs costs: a vDSO `clock_gettime` is 25 ns on the VM
/// of `docs/PERFORMANCE.md`, a `rdtsc` 9.5 — on a shared-memory
/// `write_lat` of ~90 ns, the difference was ours alone.
pub fn clock() -> &'static quanta::Clock {
    static CLOCK: std::sync::LazyLock<quanta::Clock> = std::sync::LazyLock::new(quanta::Clock::new);
    &CLOCK
}

fn check_wc(c: &Completion, side: &str) -> R<()> {
    if c.status != WcStatus::Success {
        return Err(format!(
            " Completion with error at {side}\n Failed status {}: wr_id {} ({})",
            c.status as u32, c.wr_id, c.status
        )
        .into());
    }
    Ok(())
}

/// The completion channel of `cq` (`-e`): the receive CQ has its own.
fn channel_of<'a>(r: &'a Res, cq: &Cq) -> Option<&'a CompChannel> {
    if r.rcq.as_ref().is_some_and(|q| q.id() == cq.id()) {
        r.rchan.as_ref()
    } else {
        r.chan.as_ref()
    }
}

/// Wait for completions: poll, or (with -e) sleep on the channel first.
fn poll(r: &Res, cq: &Cq, p: &Params, out: &mut [Completion]) -> R<usize> {
    if p.events {
        if let Some(ch) = channel_of(r, cq) {
            cq.req_notify(false)?;
            let n = cq.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            ch.get_event(Some(Duration::from_secs(60)))?
                .ok_or(" Timed out waiting for a completion event")?;
        }
    }
    Ok(cq.poll(out)?)
}

/// Wait for one completion the way perftest's latency tests do with `-e`
/// (`ctx_notify_events`, then one poll): sleep for the CQ's event, re-arm,
/// poll. The CQ is armed once per event (first by [`arm_for_events`]), so
/// no event is left over to wake a later wait for nothing — except after a
/// `fresh` wait's first poll took a completion whose event was already
/// queued: the next wait then wakes at once, finds nothing and waits again.
/// Without `-e`, a poll.
fn wait_one(r: &Res, cq: &Cq, p: &Params, out: &mut [Completion], fresh: bool) -> R<usize> {
    if !p.events {
        return Ok(cq.poll(out)?);
    }
    let ch = channel_of(r, cq).ok_or(" -e without a completion channel")?;
    // A completion that came before the first arm raises no event: look
    // first, on the first wait only (a poll of an empty CQ is a pass over
    // the socket, system calls perftest's loop does not make).
    if fresh {
        let n = cq.poll(out)?;
        if n > 0 {
            return Ok(n);
        }
    }
    ch.get_event(Some(Duration::from_secs(60)))?
        .ok_or(" Timed out waiting for a completion event")?;
    cq.req_notify(false)?;
    Ok(cq.poll(out)?)
}

/// Arm the CQs once before a latency loop that uses [`wait_one`].
fn arm_for_events(r: &Res, p: &Params) -> R<()> {
    if p.events {
        r.scq.req_notify(false)?;
        if let Some(q) = &r.rcq {
            q.req_notify(false)?;
        }
    }
    Ok(())
}

/// Stop waiting for progress that will not come.
///
/// It reads the clock only once every [`Watchdog::SPINS`] empty polls:
/// perftest's loops read no clock while they poll, and a clock read per
/// poll was 7 % of `send_lat`'s samples over shared memory (a vDSO
/// `clock_gettime` on this VM costs a good part of an empty poll).
struct Watchdog {
    last: Instant,
    spins: u32,
    moved: bool,
}

impl Watchdog {
    const SPINS: u32 = 4096;
    fn new() -> Self {
        Watchdog {
            last: Instant::now(),
            spins: 0,
            moved: false,
        }
    }
    fn progress(&mut self) {
        self.moved = true;
    }
    fn check(&mut self) -> R<()> {
        self.spins += 1;
        if self.spins < Self::SPINS {
            return Ok(());
        }
        self.spins = 0;
        let now = Instant::now();
        if std::mem::take(&mut self.moved) {
            self.last = now;
        } else if now.duration_since(self.last) > Duration::from_secs(120) {
            return Err(" Did not get Message for 120 Seconds, exiting..".into());
        }
        Ok(())
    }
}

fn op_for(r: &Res, p: &Params, i: usize, roff: u64) -> SendOp {
    let t = &r.theirs[i];
    match p.test.verb() {
        Verb::Send => SendOp::Send,
        Verb::Write => SendOp::Write {
            remote_addr: t.vaddr + roff,
            rkey: t.rkey,
        },
        Verb::Read => SendOp::Read {
            remote_addr: t.vaddr + roff,
            rkey: t.rkey,
        },
        Verb::Atomic => match p.atomic {
            AtomicType::FetchAndAdd => SendOp::FetchAdd {
                remote_addr: t.vaddr + roff,
                rkey: t.rkey,
                add: 1,
            },
            AtomicType::CmpAndSwap => SendOp::CompareSwap {
                remote_addr: t.vaddr + roff,
                rkey: t.rkey,
                compare: 0,
                swap: 0,
            },
        },
    }
}

/// The number of address slots the bandwidth loop cycles through.
fn cycle_slots(r: &Res, size: u64) -> u64 {
    if size as usize <= r.cycle / 2 {
        (r.cycle / inc(size as usize, r.cache_line)) as u64
    } else {
        1
    }
}

/// Receive slots for `len`-byte receives (a UD receive holds the 40-byte
/// GRH too): laid out by what they hold, so a message's GRH never lands on
/// the payload of the one before it.
fn recv_slots(r: &Res, len: u64) -> (u64, u64) {
    (cycle_slots(r, len), inc(len as usize, r.cache_line) as u64)
}

/// The client side of the bandwidth tests (and of send_bw).
pub fn bw_client(r: &Res, p: &Params, size: u64) -> R<BwResult> {
    bw_both(r, p, size, None)
}

/// The posting loop of every bandwidth test; with `rx`, the receiving half
/// of a bidirectional send test runs in the same loop (perftest's
/// `run_iter_bi`), and the loop ends when both halves are done. The result
/// is what this side sent.
pub fn bw_both(r: &Res, p: &Params, size: u64, mut rx: Option<&mut RecvSide<'_>>) -> R<BwResult> {
    let n = r.qps.len();
    let iters = p.iters;
    // UD sends cycle through slots laid out as the receiver's (which also
    // hold the GRH), so a receive slot is only ever rewritten with the same
    // bytes and `--check` holds however far the receiver lags.
    let ud = if p.conn == QpType::Ud { 40 } else { 0 };
    let (slots, step) = recv_slots(r, size + ud);
    let mut posted = vec![0u64; n];
    let mut done = vec![0u64; n];
    let mut slot = vec![0u64; n];
    let mut to_signal = vec![p.cq_mod.max(1) as u64; n];
    // What every post of a QP carries alike, worked out once (built per
    // post, the UD destination cost a store-forwarding stall each time).
    let uds: Vec<Option<UdDest>> = (0..n)
        .map(|i| (p.conn == QpType::Ud).then(|| r.ud_dest(i)))
        .collect();
    let inline = p.inline > 0 && size <= p.inline as u64;
    let total_target = if p.duration.is_some() {
        u64::MAX
    } else {
        iters * n as u64
    };
    // perftest stamps every post and every completion for its peak; the
    // peak only ever looks at about 2 000 posts (`peak_bw`), so only those
    // are stamped here, and each completion once for all the messages it
    // covers. A clock read per post was most of the tool's own cost at 8
    // bytes over shared memory (a vDSO `clock_gettime` is ~40 ns on the VM
    // this was measured on, a lane post ~30 ns).
    let stamp_every = if p.duration.is_some() {
        1024
    } else {
        1 + total_target / PEAK_SAMPLES
    };
    let mut tposted: Vec<(u64, u64)> = Vec::with_capacity(if p.no_peak {
        0
    } else {
        (total_target / stamp_every + 1).min(1 << 20) as usize
    });
    let mut tcompleted: Vec<(u64, u64)> = Vec::with_capacity(if p.no_peak {
        0
    } else {
        (total_target / p.cq_mod.max(1) as u64 + 1).min(1 << 20) as usize
    });
    let mut posted_total = 0u64;
    let mut wcs = [Completion::default(); 16];
    let start = Instant::now();
    let ns = |t: Instant| t.duration_since(start).as_nanos() as u64;
    let deadline = p.duration.map(|d| start + Duration::from_secs(d));
    let margin = p.duration.map(|d| duration_margin(d, p.margin));
    let mut sample: Option<(Instant, u64)> = None;
    let mut sample_end: Option<(Instant, u64)> = None;
    let mut completed_total = 0u64;
    let mut dog = Watchdog::new();
    // QPs that may have room to post: all at first, then those a completion
    // made room on, so that a pass costs per QP with work, not per QP (at
    // 10,000 QPs a scan of every QP for each batch of completions was the
    // benchmark's own cost, not the device's).
    // -l: the WRs of the list being built (posted by one call when full).
    let list = p.post_list.max(1) as u64;
    let mut batch: Vec<(Sge, SendOp, SendFlags)> = Vec::with_capacity(list as usize);
    let mut ready: std::collections::VecDeque<usize> = (0..n).collect();
    let mut queued = vec![true; n];
    let mut finished = 0usize;
    // When this side's last send completed (a bidirectional run goes on
    // until the peer's have all arrived).
    let mut sent_at: Option<Instant> = None;
    loop {
        // Post while there is room.
        let mut progress = false;
        while let Some(i) = ready.pop_front() {
            queued[i] = false;
            // What QP i may post now, decided once for the batch (the
            // deadline too: a batch is at most the TX depth).
            let mut room = (p.tx_depth as u64).saturating_sub(posted[i] - done[i]);
            if p.duration.is_none() {
                room = room.min(iters - posted[i]);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                room = 0;
            }
            // -l: whole lists only (perftest posts while a list fits).
            room -= room % list;
            let base = r.local_off(i);
            let qp = &r.qps[i];
            let ud = uds[i];
            let (mut k, mut at, mut to_sig) = (posted[i], slot[i], to_signal[i]);
            for _ in 0..room {
                // k % slots and (k + 1) % cq_mod, kept as counters: two
                // divisions per post were a good part of the loop's own
                // cost at 8 bytes over shared memory.
                let off = at * step;
                at += 1;
                if at == slots {
                    at = 0;
                }
                to_sig -= 1;
                let moderated = to_sig == 0;
                if moderated {
                    to_sig = p.cq_mod.max(1) as u64;
                }
                let sge = [r.mr.sge(base + off as usize, size as u32)];
                let last = p.duration.is_none() && k + 1 == iters;
                let mut flags = if moderated || last {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::default()
                };
                if inline {
                    flags = flags | SendFlags::INLINE;
                }
                let wr = SendWr {
                    wr_id: i as u64,
                    op: op_for(r, p, i, off),
                    sgl: &sge,
                    flags,
                    ud,
                };
                if !p.no_peak && posted_total.is_multiple_of(stamp_every) {
                    tposted.push((posted_total, ns(Instant::now())));
                }
                if list == 1 {
                    qp.post_send(&wr)?;
                } else {
                    batch.push((sge[0], wr.op, wr.flags));
                    if batch.len() as u64 == list {
                        post_list(qp, i, ud, &batch)?;
                        batch.clear();
                    }
                }
                k += 1;
                posted_total += 1;
            }
            progress |= room > 0;
            (posted[i], slot[i], to_signal[i]) = (k, at, to_sig);
        }
        // Reap.
        let got = poll(r, &r.scq, p, &mut wcs)?;
        for c in &wcs[..got] {
            check_wc(c, "client")?;
            let i = c.wr_id as usize;
            let mut k = p.cq_mod as u64;
            if p.duration.is_none() && done[i] + k > iters {
                k = iters - done[i];
            }
            done[i] += k;
            completed_total += k;
            if p.duration.is_none() && done[i] >= iters && k > 0 {
                finished += 1;
                if finished == n {
                    sent_at = Some(Instant::now());
                }
            }
            if !queued[i] {
                queued[i] = true;
                ready.push_back(i);
            }
            if !p.no_peak && k > 0 {
                tcompleted.push((completed_total, ns(Instant::now())));
            }
        }
        if let Some(rx) = rx.as_deref_mut() {
            progress |= rx.pump()? > 0;
        }
        if got > 0 || progress {
            dog.progress();
        } else {
            dog.check()?;
        }
        if let (Some(d), Some(m)) = (deadline, margin) {
            let now = Instant::now();
            if sample.is_none() && now >= start + m {
                sample = Some((now, completed_total));
            }
            if sample_end.is_none() && now >= d - m {
                sample_end = Some((now, completed_total));
            }
            if now >= d {
                break; // what is still in flight is flushed when the QPs go
            }
        } else if finished == n && rx.as_deref().is_none_or(RecvSide::done) {
            break;
        }
    }
    let end = sent_at.unwrap_or_else(Instant::now);
    let (t, count) = match (sample, sample_end) {
        (Some((a, ca)), Some((b, cb))) => ((b - a).as_secs_f64(), cb - ca),
        _ => {
            let t = if p.no_peak {
                (end - start).as_secs_f64()
            } else {
                (tcompleted.last().map_or(1, |c| c.1) - tposted.first().map_or(0, |p| p.1)) as f64
                    / 1e9
            };
            (t, completed_total)
        }
    };
    let t = t.max(1e-9);
    let avg = size as f64 * count as f64 / t;
    let peak = if p.no_peak {
        0.0
    } else {
        let t0 = thread_cpu_ns();
        let peak = peak_bw(&tposted, &tcompleted, p.cq_mod as usize, size);
        PEAK_CPU_NS.fetch_add(thread_cpu_ns().saturating_sub(t0), Ordering::Relaxed);
        peak
    };
    Ok(BwResult {
        size,
        // perftest's `#iterations`: the messages of every QP (`iters ×
        // num_of_qps`), or those counted in duration mode.
        iters: if p.duration.is_some() {
            count
        } else {
            iters * n as u64
        },
        peak,
        avg,
        msg_rate: count as f64 / t,
    })
}

/// The margin a `-D` run leaves out at each end of its measured interval:
/// `-f`'s, or perftest's default `duration / 4` in whole seconds (so -D 2
/// and -D 3 measure the whole run and -D 5 leaves 1 s, not 1.25 s, at
/// each end). The parser made sure that `secs > 2 * margin`.
fn duration_margin(secs: u64, margin: Option<u64>) -> Duration {
    Duration::from_secs(margin.unwrap_or(secs / 4))
}

/// perftest's duration mode for latency tests (`-D`): its `SIGALRM`
/// state machine — a warm-up margin, the measured window, a cool-down
/// margin, the end — kept by a thread that sleeps until each boundary,
/// so the loop's only cost is a relaxed load of the phase per iteration
/// (perftest's is a load of `user_param->state`).
struct Phases {
    phase: std::sync::Arc<std::sync::atomic::AtomicU8>,
    timer: Option<std::thread::JoinHandle<Duration>>,
}

const WARMUP: u8 = 0;
const SAMPLE: u8 = 1;
const END: u8 = 3;

impl Phases {
    fn start(secs: u64, margin: Option<u64>) -> Phases {
        use std::sync::atomic::Ordering::Relaxed;
        let phase = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(WARMUP));
        let ph = phase.clone();
        let m = duration_margin(secs, margin);
        let t0 = Instant::now();
        let sleep_until =
            |t: Instant| std::thread::sleep(t.saturating_duration_since(Instant::now()));
        let timer = std::thread::spawn(move || {
            sleep_until(t0 + m);
            let from = Instant::now();
            ph.store(SAMPLE, Relaxed);
            sleep_until(t0 + Duration::from_secs(secs) - m);
            let window = from.elapsed();
            ph.store(SAMPLE + 1, Relaxed);
            sleep_until(t0 + Duration::from_secs(secs));
            ph.store(END, Relaxed);
            window
        });
        Phases {
            phase,
            timer: Some(timer),
        }
    }

    fn now(&self) -> u8 {
        self.phase.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn ended(&self) -> bool {
        self.now() == END
    }

    /// perftest's `print_report_lat_duration`: the window over the
    /// iterations started in it, halved for a ping-pong (`rtt_factor`),
    /// and the iterations per second.
    fn result(mut self, size: u64, n: u64, rtt_factor: f64) -> R<LatResult> {
        let window = self
            .timer
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| " the -D timer thread failed")?;
        if n == 0 {
            return Err(" No iteration started in the measured window of -D".into());
        }
        let us = window.as_secs_f64() * 1e6;
        Ok(LatResult {
            size,
            iters: n,
            avg: us / rtt_factor / n as f64,
            tps: Some(n as f64 / window.as_secs_f64()),
            ..Default::default()
        })
    }
}

/// What a latency loop measures: with `-n`, the stamp of every post
/// (perftest's intervals); with `-D`, how many posts started in the
/// measured window of perftest's phases.
struct LatRun {
    phases: Option<Phases>,
    clock: &'static quanta::Clock,
    iters: u64,
    stamps: Vec<u64>,
    sampled: u64,
}

impl LatRun {
    fn new(p: &Params) -> LatRun {
        let phases = p.duration.map(|d| Phases::start(d, p.margin));
        let stamps = Vec::with_capacity(if phases.is_some() {
            0
        } else {
            p.iters as usize
        });
        LatRun {
            phases,
            clock: clock(),
            iters: p.iters,
            stamps,
            sampled: 0,
        }
    }

    /// Whether the loop goes on after `k` iterations: `-n` of them, or
    /// with `-D` until its end.
    fn more(&self, k: u64) -> bool {
        match &self.phases {
            Some(ph) => !ph.ended(),
            None => k < self.iters,
        }
    }

    /// `-D`'s end has come (never with `-n`): a wait for the peer stops,
    /// as it may have stopped first.
    fn ended(&self) -> bool {
        self.phases.as_ref().is_some_and(Phases::ended)
    }

    fn timed(&self) -> bool {
        self.phases.is_some()
    }

    /// An iteration posts now: its stamp (on the critical path, as
    /// perftest's), or its count if it starts in `-D`'s window.
    fn stamp(&mut self) {
        match &self.phases {
            Some(ph) => self.sampled += u64::from(ph.now() == SAMPLE),
            None => self.stamps.push(self.clock.raw()),
        }
    }

    /// The result, halving round trips by `rtt_factor`.
    fn finish(self, size: u64, rtt_factor: f64, cycles: Option<f64>) -> R<LatResult> {
        match self.phases {
            Some(ph) => ph.result(size, self.sampled, rtt_factor),
            None => Ok(lat_stats(
                size,
                self.iters,
                &self.stamps,
                rtt_factor,
                cycles,
            )),
        }
    }
}

/// One post list (`-l`): the WRs chained into a single `post_send` call, as
/// perftest posts its `wr[]` chain.
fn post_list(qp: &Qp, i: usize, ud: Option<UdDest>, batch: &[(Sge, SendOp, SendFlags)]) -> R<()> {
    let sges: Vec<[Sge; 1]> = batch.iter().map(|b| [b.0]).collect();
    let wrs: Vec<SendWr<'_>> = batch
        .iter()
        .zip(&sges)
        .map(|(b, sgl)| SendWr {
            wr_id: i as u64,
            op: b.1,
            sgl,
            flags: b.2,
            ud,
        })
        .collect();
    qp.post_send_list(&wrs).map_err(|(k, e)| {
        format!("Couldn't post send: qp {i}, entry {k} of a post list: {e}").into()
    })
}

/// Posts the peak looks at (perftest's own bound on its work: every
/// `1 + n / 2000`-th post).
const PEAK_SAMPLES: u64 = 2000;

/// CPU time this process spent in [`peak_bw`]: perftest's peak pairs each
/// sampled post with every completion after it (2 000 × n pairs with
/// `cq_mod` 1, which perftest and we take above 8 KiB), after the transfer
/// — ~5 % of a 64 KiB `write_bw`'s CPU (0.03 s/GB). Not CPU spent moving
/// data: the loopback run's CPU per GB leaves it out (see `loopback`).
pub static PEAK_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// This thread's CPU time, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    (super::cpu_seconds(libc::RUSAGE_THREAD) * 1e9) as u64
}

/// perftest's peak: the best per-message time over post→completion windows
/// on the completion-moderation grid. `tp`: (index of the post, time) for
/// the sampled posts; `tc`: (messages completed in all, time) for each
/// completion, so message `j` completed at the first entry whose count
/// exceeds `j`.
fn peak_bw(tp: &[(u64, u64)], tc: &[(u64, u64)], cq_mod: usize, size: u64) -> f64 {
    let n = tc.last().map_or(0, |c| c.0);
    let (Some(&(_, t0)), Some(&(_, c0))) = (tp.first(), tc.first()) else {
        return 0.0;
    };
    let stride = cq_mod.max(1) as u64;
    let mut best = c0.saturating_sub(t0).max(1);
    for &(i, ti) in tp.iter().filter(|p| p.0 < n) {
        let mut j = ((i + 1).div_ceil(stride) * stride).max(1) - 1;
        // The completion that covers message j, and the later ones in turn.
        let mut e = tc.partition_point(|c| c.0 <= j);
        while j < n && e < tc.len() {
            while tc[e].0 <= j {
                e += 1;
            }
            let d = tc[e].1.saturating_sub(ti) / (j - i + 1);
            if d > 0 && d < best {
                best = d;
            }
            j += stride;
        }
    }
    size as f64 * 1e9 / best as f64
}

/// Post `count` receives per QP, cycling over the receive slice.
pub fn post_receives(r: &Res, p: &Params, size: u64, count: u32) -> R<()> {
    let ud = if p.conn == QpType::Ud { 40 } else { 0 };
    let (slots, step) = recv_slots(r, size + ud as u64);
    for (i, qp) in r.qps.iter().enumerate() {
        for k in 0..count as u64 {
            let off = r.target_off(i) + ((k % slots) * step) as usize;
            let sge = [r.mr.sge(off, size as u32 + ud)];
            qp.post_recv(&RecvWr {
                wr_id: i as u64 | (k << 32),
                sgl: &sge,
            })?;
        }
    }
    Ok(())
}

/// The send_bw server: receive iters per QP, reposting as it goes. Returns
/// the receive-side rate and whether every message checked out.
pub fn send_bw_server(r: &Res, p: &Params, size: u64) -> R<(BwResult, bool)> {
    let mut rx = RecvSide::new(r, p, size);
    let mut dog = Watchdog::new();
    let deadline = p.duration.map(|d| Instant::now() + Duration::from_secs(d));
    loop {
        if rx.pump()? == 0 {
            dog.check()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            continue;
        }
        dog.progress();
        if rx.done() {
            break;
        }
    }
    Ok(rx.result())
}

/// The receiving half of a send test: takes each message off the receive
/// CQ, checks it (`--check`) and posts the receive again while more are to
/// come. The server's whole loop, and half of a bidirectional one.
pub struct RecvSide<'a> {
    r: &'a Res,
    p: &'a Params,
    size: u64,
    recvd: Vec<u64>,
    posted: Vec<u64>,
    ud: u32,
    slots: u64,
    step: u64,
    wcs: [Completion; 16],
    first: Option<Instant>,
    ok: bool,
    total: u64,
    msg: Vec<u8>,
}

impl<'a> RecvSide<'a> {
    /// After [`post_receives`] posted `p.rx_depth` receives per QP.
    pub fn new(r: &'a Res, p: &'a Params, size: u64) -> RecvSide<'a> {
        let n = r.qps.len();
        let ud = if p.conn == QpType::Ud { 40 } else { 0 };
        let (slots, step) = recv_slots(r, size + ud as u64);
        RecvSide {
            r,
            p,
            size,
            recvd: vec![0; n],
            posted: vec![p.rx_depth as u64; n],
            ud,
            slots,
            step,
            wcs: [Completion::default(); 16],
            first: None,
            ok: true,
            total: 0,
            msg: vec![0u8; size as usize],
        }
    }

    /// One poll of the receive CQ: the messages it took.
    pub fn pump(&mut self) -> R<usize> {
        let (r, p, size, ud) = (self.r, self.p, self.size, self.ud);
        let (slots, step, n) = (self.slots, self.step, r.qps.len());
        let cq = r.rcq.as_ref().expect("send tests have a receive CQ");
        let got = poll(r, cq, p, &mut self.wcs)?;
        if got > 0 {
            self.first.get_or_insert_with(Instant::now);
        }
        for c in &self.wcs[..got] {
            check_wc(c, "server")?;
            let i = (c.wr_id & 0xffff_ffff) as usize;
            let k = c.wr_id >> 32;
            let off = r.target_off(i) + ((k % slots) * step) as usize;
            if p.check {
                let want_len = size as u32 + ud;
                r.mr.read(off + ud as usize, &mut self.msg);
                // The sender's slot of the same index (see `bw_client`).
                let sent = ((k % slots) * step) as usize;
                let good = c.byte_len == want_len
                    && self
                        .msg
                        .iter()
                        .enumerate()
                        .all(|(o, &b)| b == pattern(i, sent + o));
                if !good {
                    eprintln!(
                        " --check: message {} on QP {i} differs (byte_len {}; {})",
                        self.recvd[i],
                        c.byte_len,
                        whose(&self.msg, i, n, slots, step, k % slots)
                    );
                }
                self.ok &= good;
            }
            self.recvd[i] += 1;
            self.total += 1;
            if p.duration.is_some() || self.posted[i] < p.iters {
                let sge = [r.mr.sge(off, size as u32 + ud)];
                let nk = self.posted[i];
                r.qps[i].post_recv(&RecvWr {
                    wr_id: i as u64 | ((nk % slots) << 32),
                    sgl: &sge,
                })?;
                self.posted[i] += 1;
            }
        }
        Ok(got)
    }

    /// Every QP has its `-n` messages (never, in duration mode).
    pub fn done(&self) -> bool {
        self.p.duration.is_none() && self.recvd.iter().all(|&c| c >= self.p.iters)
    }

    /// Whether every message so far was as sent (`--check`).
    pub fn verified(&self) -> bool {
        self.ok
    }

    /// What arrived, from the first message on, and whether all of it was
    /// as sent.
    pub fn result(&self) -> (BwResult, bool) {
        let t = self
            .first
            .map_or(1e-9, |f| f.elapsed().as_secs_f64())
            .max(1e-9);
        let total = self.total;
        (
            BwResult {
                size: self.size,
                iters: if self.p.duration.is_some() {
                    total
                } else {
                    self.p.iters * self.recvd.len() as u64
                },
                peak: 0.0,
                avg: self.size as f64 * total as f64 / t,
                msg_rate: total as f64 / t,
            },
            self.ok,
        )
    }
}

/// What a received message that failed `--check` holds instead: the
/// sender's QP and slot whose bytes it matches, if any.
fn whose(msg: &[u8], qp: usize, qps: usize, slots: u64, step: u64, want: u64) -> String {
    for q in std::iter::once(qp).chain((0..qps).filter(|&q| q != qp)) {
        for s in 0..slots {
            let base = (s * step) as usize;
            if msg
                .iter()
                .enumerate()
                .all(|(o, &b)| b == pattern(q, base + o))
            {
                return format!("holds QP {q}'s slot {s}, expected slot {want}");
            }
        }
    }
    format!("matches no slot sent, expected slot {want}")
}

/// perftest's latency statistics over consecutive post intervals, in
/// microseconds or, with `-C` (`cycles`: the CPU's MHz), in whole cycles
/// of the interval before the round trip is halved, as perftest's
/// `get_cycles` counts them.
fn lat_stats(
    size: u64,
    iters: u64,
    stamps: &[u64],
    rtt_factor: f64,
    cycles: Option<f64>,
) -> LatResult {
    let clock = clock();
    let d: Vec<f64> = stamps
        .windows(2)
        .map(|w| {
            let us = clock.delta_as_nanos(w[0], w[1]) as f64 / 1e3;
            cycles.map_or(us, |mhz| (us * mhz).round()) / rtt_factor
        })
        .collect();
    let mut r = lat_summary(size, iters, d.clone());
    r.intervals = d;
    r
}

/// perftest's `print_report_lat` over the intervals `d` (µs): sorted, the
/// two largest left out (`LAT_MEASURE_TAIL`) of the `m` the minimum,
/// median, average and deviation are taken over — but `t_max` is
/// `delta[m]` and the percentiles `delta[ceil(m × q)]`, indexed in the
/// whole sorted array, so `t_max` is the second largest interval and the
/// 99.9 % percentile of 1000 iterations is `t_max`.
fn lat_summary(size: u64, iters: u64, mut d: Vec<f64>) -> LatResult {
    if d.is_empty() {
        d.push(0.0);
    }
    d.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let all = d.len();
    let m = all.saturating_sub(2).max(1);
    let typical = if m.is_multiple_of(2) {
        (d[m / 2 - 1] + d[m / 2]) / 2.0
    } else {
        d[m / 2]
    };
    let avg = d[..m].iter().sum::<f64>() / m as f64;
    let var = d[..m]
        .iter()
        .map(|x| ((avg - x) as i64 as f64).powi(2))
        .sum::<f64>()
        / m as f64;
    let at = |i: usize| d[i.min(all - 1)];
    LatResult {
        size,
        iters,
        min: d[0],
        max: at(m),
        typical,
        avg,
        stdev: var.sqrt(),
        p99: at((m as f64 * 0.99).ceil() as usize),
        p999: at((m as f64 * 0.999).ceil() as usize),
        intervals: Vec::new(),
        tps: None,
    }
}

/// write_lat: each side writes `size` bytes whose last byte counts its
/// sends into the other's buffer and spins on its own last byte for the
/// peer's count. The server writes first; each side receives and sends
/// `iters` messages.
pub fn write_lat(r: &Res, p: &Params, size: u64, client: bool) -> R<LatResult> {
    let poll_off = r.target_off(0) + size as usize - 1;
    let src = r.local_off(0);
    // How often the spin drives the device. Over UDP the peer's WRITE is a
    // datagram only a pass of ours takes off the socket, so every look at
    // the byte comes with one: sixteen `pause`s between passes (~350 ns on
    // this VM's EPYC) were half of UC's wait to notice a datagram (4.33 ->
    // 4.05 us one way, alternated; RC's WRITE mostly arrives while the
    // poll of the send CQ below waits for the ACK riding with it). Over
    // shared memory the peer's lane writes the byte itself: a pass per
    // look would only slow the look.
    let every = if r.qps[0].transport() == "shm" { 16 } else { 1 };
    // The request is the same every time but for its id, built once as
    // perftest builds its `wr`: on shared memory each instruction between
    // the byte's arrival and the copy into the peer is on the round trip.
    let sge = [r.mr.sge(src, size as u32)];
    let op = op_for(r, p, 0, 0);
    let flags = if p.inline > 0 && size <= p.inline as u64 {
        SendFlags::SIGNALED | SendFlags::INLINE
    } else {
        SendFlags::SIGNALED
    };
    let mut run = LatRun::new(p);
    let mut wcs = [Completion::default(); 1];
    let mut dog = Watchdog::new();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    'run: while run.more(scnt) || run.more(rcnt) {
        if run.more(rcnt) && (client || scnt != 0) {
            rcnt += 1;
            let tag = rcnt as u8;
            let mut spins = 0u32;
            while r.mr.read_volatile_u8(poll_off) != tag {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(every) {
                    // Drive the device from here, as a poll_cq loop does:
                    // on a host with few cores this beats waiting for the
                    // engine thread to be scheduled.
                    r.ctx.progress();
                    // With -D the peer may have stopped first.
                    if run.ended() {
                        break 'run;
                    }
                }
                if spins.is_multiple_of(65536) {
                    dog.check()?;
                }
            }
            dog.progress();
        }
        if run.more(scnt) {
            scnt += 1;
            r.mr.write_volatile_u8(src + size as usize - 1, scnt as u8);
            run.stamp();
            r.qps[0].post_send(&SendWr {
                wr_id: scnt,
                op,
                sgl: &sge,
                flags,
                ud: None,
            })?;
            loop {
                let n = r.scq.poll(&mut wcs)?;
                if n > 0 {
                    check_wc(&wcs[0], if client { "client" } else { "server" })?;
                    break;
                }
                if run.ended() {
                    break 'run;
                }
                dog.check()?;
            }
        }
    }
    run.finish(size, 2.0, p.cycles)
}

/// send_lat: SEND/receive ping-pong; the client sends first.
pub fn send_lat(r: &Res, p: &Params, size: u64, client: bool) -> R<LatResult> {
    let rcq = r.rcq.as_ref().expect("send tests have a receive CQ");
    let mut run = LatRun::new(p);
    let mut wcs = [Completion::default(); 1];
    let mut posted = p.rx_depth as u64;
    let mut dog = Watchdog::new();
    let ud = if p.conn == QpType::Ud { 40 } else { 0 };
    arm_for_events(r, p)?;
    let mut k = 0u64;
    'run: while run.more(k) {
        if !(client && k == 0) {
            loop {
                let n = wait_one(r, rcq, p, &mut wcs, k <= 1)?;
                if n > 0 {
                    check_wc(&wcs[0], if client { "client" } else { "server" })?;
                    break;
                }
                if run.ended() {
                    break 'run; // the peer may have stopped first
                }
                dog.check()?;
            }
            dog.progress();
            if run.timed() || posted < p.iters {
                let sge = [r.mr.sge(r.target_off(0), size as u32 + ud)];
                r.qps[0].post_recv(&RecvWr {
                    wr_id: 0,
                    sgl: &sge,
                })?;
                posted += 1;
            }
        }
        let sge = [r.mr.sge(r.local_off(0), size as u32)];
        let mut flags = SendFlags::SIGNALED;
        if p.inline > 0 && size <= p.inline as u64 {
            flags = flags | SendFlags::INLINE;
        }
        run.stamp();
        r.qps[0].post_send(&SendWr {
            wr_id: k,
            op: SendOp::Send,
            sgl: &sge,
            flags,
            ud: (p.conn == QpType::Ud).then(|| r.ud_dest(0)),
        })?;
        loop {
            // With -e the send completion is awaited on the channel too, as
            // perftest's send_lat does (every send is signalled there: its
            // cq_mod is clamped to tx_depth 1).
            let n = wait_one(r, &r.scq, p, &mut wcs, false)?;
            if n > 0 {
                check_wc(&wcs[0], "send")?;
                break;
            }
            if run.ended() {
                break 'run;
            }
            dog.check()?;
        }
        k += 1;
    }
    if run.timed() {
        return run.finish(size, 2.0, p.cycles);
    }
    // The client sent first, so the server's last message is still to come:
    // perftest's client loops until it has received all `iters` too. Left in
    // the queue, it was taken for the first message of the next size under
    // `-a` and the next size's receives overflowed the queue (found against
    // rxe's ib_send_lat, docs/INTEROP.md).
    if client {
        loop {
            let n = wait_one(r, rcq, p, &mut wcs, false)?;
            if n > 0 {
                check_wc(&wcs[0], "client")?;
                break;
            }
            dog.check()?;
        }
    }
    run.finish(size, 2.0, p.cycles)
}

/// read_lat / atomic_lat: one request at a time, full round trip.
pub fn rd_atomic_lat(r: &Res, p: &Params, size: u64) -> R<LatResult> {
    let mut run = LatRun::new(p);
    let mut wcs = [Completion::default(); 1];
    let mut dog = Watchdog::new();
    let mut k = 0u64;
    while run.more(k) {
        let sge = [r.mr.sge(r.local_off(0), size as u32)];
        run.stamp();
        r.qps[0].post_send(&SendWr {
            wr_id: k,
            op: op_for(r, p, 0, 0),
            sgl: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        })?;
        loop {
            let n = poll(r, &r.scq, p, &mut wcs)?;
            if n > 0 {
                check_wc(&wcs[0], "client")?;
                break;
            }
            dog.check()?;
        }
        dog.progress();
        k += 1;
    }
    run.finish(size, 1.0, p.cycles)
}

fn used_ranges(r: &Res, p: &Params) -> Vec<(usize, usize)> {
    let size = p.sizes.last().copied().unwrap_or(0);
    let slots = cycle_slots(r, size).min(p.iters);
    let step = inc(size as usize, r.cache_line);
    (0..slots as usize)
        .map(|s| (s * step, size as usize))
        .collect()
}

fn compare(r: &Res, qp: usize, region_off: usize, what: &str, p: &Params, loud: bool) -> bool {
    let mut ok = true;
    let mut buf = Vec::new();
    for (o, len) in used_ranges(r, p) {
        buf.resize(len, 0);
        r.mr.read(region_off + o, &mut buf);
        if let Some(bad) = buf
            .iter()
            .enumerate()
            .position(|(k, &b)| b != pattern(qp, o + k))
        {
            if loud {
                eprintln!(" --check: {what} of QP {qp} differs at byte {}", o + bad);
            }
            ok = false;
        }
    }
    ok
}

/// write_bw --check, server side: each target slot holds the client's bytes.
pub fn check_write_target(r: &Res, p: &Params) -> bool {
    // UC WRITEs carry no acknowledgment: the writer's completions, and
    // the report it sends after them, can come before its last bytes land
    // here. So wait for them, driving the device, up to a bound far past
    // any delivery (RC's are all here already: an ACK follows placement).
    let deadline = Instant::now() + Duration::from_secs(10);
    let all =
        |loud| (0..r.qps.len()).all(|i| compare(r, i, r.target_off(i), "written target", p, loud));
    while Instant::now() < deadline {
        if all(false) {
            return true;
        }
        r.ctx.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    all(true)
}

/// read_bw --check, client side: what was read equals the server's bytes.
pub fn check_read(r: &Res, p: &Params) -> bool {
    (0..r.qps.len()).all(|i| compare(r, i, r.local_off(i), "read result", p, true))
}

/// atomic_bw --check, server side: each 8-byte target counted its adds.
pub fn check_atomic_target(r: &Res, p: &Params) -> bool {
    let slots = cycle_slots(r, 8);
    let step = inc(8, r.cache_line);
    let mut ok = true;
    for i in 0..r.qps.len() {
        for s in 0..slots {
            let mut w = [0u8; 8];
            r.mr.read(r.target_off(i) + s as usize * step, &mut w);
            let got = u64::from_ne_bytes(w);
            let want = match p.atomic {
                AtomicType::FetchAndAdd => p.iters / slots + u64::from(s < p.iters % slots),
                AtomicType::CmpAndSwap => 0,
            };
            if got != want {
                eprintln!(" --check: atomic target {s} of QP {i} is {got}, expected {want}");
                ok = false;
            }
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perftest 4.5's `print_report_lat` on 1000 iterations: 999 intervals
    /// sorted, m = 997; t_max is delta[997], the 99 % percentile
    /// delta[ceil(987.03)] = delta[988], the 99.9 % one delta[ceil(996.003)]
    /// = delta[997]; min, median, average over delta[0..997].
    #[test]
    fn duration_margin_is_perftests_whole_seconds() {
        for (d, m) in [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (10, 2)] {
            assert_eq!(duration_margin(d, None), Duration::from_secs(m), "-D {d}");
            assert_eq!(duration_margin(d, Some(0)), Duration::ZERO, "-D {d} -f 0");
        }
    }

    #[test]
    fn latency_columns_index_as_perftest() {
        // Intervals 1..=999 µs, shuffled.
        let d: Vec<f64> = (0..999u64).map(|k| ((k * 389) % 999 + 1) as f64).collect();
        let r = lat_summary(2, 1000, d);
        assert_eq!(r.min, 1.0);
        assert_eq!(r.max, 998.0, "t_max is delta[m], the second largest");
        assert_eq!(r.p99, 989.0);
        assert_eq!(r.p999, 998.0);
        assert_eq!(r.typical, 499.0, "median of delta[0..997]");
        assert_eq!(r.avg, 499.0);
        // The minimum iterations (5): 4 intervals, m = 2.
        let r = lat_summary(2, 5, vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!((r.min, r.max, r.typical), (1.0, 3.0, 1.5));
        assert_eq!((r.p99, r.p999), (3.0, 3.0));
    }

    /// perftest's peak over a stamp for every post and every completed
    /// message, as the tool computed it before it sampled.
    fn peak_every(tp: &[u64], tc: &[u64], cq_mod: usize, size: u64) -> f64 {
        let n = tp.len().min(tc.len());
        let mut best = (tc[0].saturating_sub(tp[0])).max(1);
        let stride = cq_mod.max(1);
        let mut i = 0;
        while i < n {
            let mut j = ((i + 1).div_ceil(stride) * stride).max(1) - 1;
            while j < n {
                let d = tc[j].saturating_sub(tp[i]) / (j - i + 1) as u64;
                if d > 0 && d < best {
                    best = d;
                }
                j += stride;
            }
            i += 1 + n / 2000;
        }
        size as f64 * 1e9 / best as f64
    }

    #[test]
    fn sampled_peak_is_perftests_peak() {
        for (n, cq_mod) in [
            (1usize, 1usize),
            (7, 1),
            (100, 10),
            (5000, 1),
            (20_000, 100),
            (9999, 7),
        ] {
            // Posts 100 ns apart with a jitter; each completion event covers
            // cq_mod messages and lands 5–9 µs after its last post.
            let tp: Vec<u64> = (0..n as u64)
                .map(|k| 1000 + k * 100 + (k * 37) % 23)
                .collect();
            let mut tc = vec![0u64; n];
            let mut events = Vec::new();
            let mut k = 0;
            while k < n {
                let last = (k + cq_mod).min(n) - 1;
                let t = tp[last] + 5000 + (last as u64 * 7919) % 4000;
                let t = t.max(events.last().map_or(0, |e: &(u64, u64)| e.1));
                tc[k..=last].fill(t);
                events.push((last as u64 + 1, t));
                k = last + 1;
            }
            let every = 1 + n as u64 / PEAK_SAMPLES;
            let sampled: Vec<(u64, u64)> = (0..n as u64)
                .filter(|i| i.is_multiple_of(every))
                .map(|i| (i, tp[i as usize]))
                .collect();
            assert_eq!(
                peak_bw(&sampled, &events, cq_mod, 8),
                peak_every(&tp, &tc, cq_mod, 8),
                "n {n} cq_mod {cq_mod}"
            );
        }
        assert_eq!(peak_bw(&[], &[], 1, 8), 0.0);
    }
}
