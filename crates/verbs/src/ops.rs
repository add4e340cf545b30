//! One call per common operation on a connected QP, and waiting for one
//! completion: what most applications post, without building work requests
//! by hand. Each post is signalled (it completes on the send CQ with its
//! `wr_id`), and everything [`Qp::post_send`] checks is checked here too.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use crate::{
    CompChannel, Completion, Context, CoreError, Cq, Error, Qp, RecvWr, RemoteRegion, Result,
    SendFlags, SendOp, SendWr, Sge,
};

impl Qp {
    fn post_one(&self, wr_id: u64, op: SendOp, sge: &[Sge]) -> Result<()> {
        self.post_send(&SendWr {
            wr_id,
            op,
            sgl: sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        })
    }

    fn fits(local: &Sge, remote: &RemoteRegion) -> Result<()> {
        if local.length as u64 > remote.len {
            return Err(CoreError::InvalidArgument(
                "the remote region is shorter than the local buffer",
            )
            .into());
        }
        Ok(())
    }

    /// RDMA WRITE `src` (a local slice: [`crate::Mr::slice`]) to the start
    /// of `dst`.
    pub fn write(&self, wr_id: u64, src: Sge, dst: RemoteRegion) -> Result<()> {
        Self::fits(&src, &dst)?;
        let op = SendOp::Write {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        };
        self.post_one(wr_id, op, &[src])
    }

    /// RDMA WRITE with immediate data: the peer's receive completes with
    /// `imm` (consuming a receive request).
    pub fn write_imm(&self, wr_id: u64, src: Sge, dst: RemoteRegion, imm: u32) -> Result<()> {
        Self::fits(&src, &dst)?;
        let op = SendOp::WriteWithImm {
            remote_addr: dst.addr,
            rkey: dst.rkey,
            imm,
        };
        self.post_one(wr_id, op, &[src])
    }

    /// RDMA READ the start of `src` into `dst` (a local slice).
    pub fn read(&self, wr_id: u64, dst: Sge, src: RemoteRegion) -> Result<()> {
        Self::fits(&dst, &src)?;
        let op = SendOp::Read {
            remote_addr: src.addr,
            rkey: src.rkey,
        };
        self.post_one(wr_id, op, &[dst])
    }

    /// SEND `src` into the peer's next receive request.
    pub fn send(&self, wr_id: u64, src: Sge) -> Result<()> {
        self.post_one(wr_id, SendOp::Send, &[src])
    }

    /// SEND with immediate data.
    pub fn send_imm(&self, wr_id: u64, src: Sge, imm: u32) -> Result<()> {
        self.post_one(wr_id, SendOp::SendWithImm { imm }, &[src])
    }

    /// Post one receive request into `dst` (it completes on the receive
    /// CQ with `wr_id`).
    pub fn recv(&self, wr_id: u64, dst: Sge) -> Result<()> {
        self.post_recv(&RecvWr { wr_id, sgl: &[dst] })
    }

    /// Atomic fetch-and-add of `add` on the 8-byte word at the start of
    /// `target`; the word's old value lands in `result` (8 local bytes).
    pub fn fetch_add(&self, wr_id: u64, result: Sge, target: RemoteRegion, add: u64) -> Result<()> {
        Self::word(&result, &target)?;
        let op = SendOp::FetchAdd {
            remote_addr: target.addr,
            rkey: target.rkey,
            add,
        };
        self.post_one(wr_id, op, &[result])
    }

    /// Atomic compare-and-swap on the 8-byte word at the start of
    /// `target`: it becomes `swap` if it equals `compare`; its old value
    /// lands in `result` either way.
    pub fn compare_swap(
        &self,
        wr_id: u64,
        result: Sge,
        target: RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> Result<()> {
        Self::word(&result, &target)?;
        let op = SendOp::CompareSwap {
            remote_addr: target.addr,
            rkey: target.rkey,
            compare,
            swap,
        };
        self.post_one(wr_id, op, &[result])
    }

    fn word(result: &Sge, target: &RemoteRegion) -> Result<()> {
        if result.length != 8 || target.len < 8 {
            return Err(CoreError::InvalidArgument(
                "an atomic works on one 8-byte word: an 8-byte result slice and a target of at least 8 bytes",
            )
            .into());
        }
        Ok(())
    }
}

impl crate::Mr {
    /// The local slice `range` of this region, as an SGE for a work
    /// request, or an error if it does not lie inside.
    pub fn slice(&self, range: impl std::ops::RangeBounds<usize>) -> Result<Sge> {
        let (s, e) = crate::connect::bounds(range, self.len())?;
        let len = u32::try_from(e - s)
            .map_err(|_| CoreError::InvalidArgument("an SGE is at most 4 GiB - 1 long"))?;
        self.try_sge(s, len)
    }
}

impl Cq {
    /// Wait for the completion of work request `wr_id` and return it, or
    /// [`Error::Completion`] if it failed, or [`Error::Timeout`] after
    /// `timeout` (`None`: no limit). Completions of other work requests
    /// that arrive meanwhile are kept, in order, for the next
    /// [`Cq::poll`] or `wait`.
    ///
    /// With a completion channel (given at [`Context::create_cq`]) this
    /// sleeps on it between polls — one kernel wake-up per completion, no
    /// spinning; without one it polls, yielding the CPU between polls.
    pub fn wait(&self, wr_id: u64, timeout: Option<Duration>) -> Result<Completion> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(c) = self.wait_nonblocking(wr_id)? {
                return Ok(c.into_result()?);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Err(Error::Timeout("a work request's completion")),
                },
                None => None,
            };
            match &self.channel {
                Some(ch) => {
                    // Arm, then look once more: a completion that came
                    // between the empty poll and the arming raises no
                    // event.
                    self.req_notify(false)?;
                    if let Some(c) = self.wait_nonblocking(wr_id)? {
                        return Ok(c.into_result()?);
                    }
                    // On a shared channel this CQ's event may be queued
                    // behind another CQ's: taken from where it stands.
                    if ch.inner.take_for(self.id().0) {
                        continue;
                    }
                    // An event for another CQ is put back for its owner,
                    // and this thread sleeps until the queue changes again
                    // (that event taken, or another pushed — perhaps this
                    // CQ's, looked for once more after the generation is
                    // read, so one pushed meanwhile is not slept through).
                    // Taking it again at once was a busy loop for as long
                    // as its owner did not come for it.
                    if let Some(id) = ch.get_event(left)? {
                        if id != self.id() {
                            ch.put_back(id);
                            let seen = ch.inner.generation();
                            if !ch.inner.take_for(self.id().0) {
                                ch.inner.wait_change(seen, left);
                            }
                        }
                    }
                }
                None => std::thread::yield_now(),
            }
        }
    }

    /// [`Cq::wait`] without waiting: the completion of `wr_id` if it is
    /// here, else `None`. Polls until it is found or the CQ is empty (an
    /// armed CQ raises no event for completions already queued, so a
    /// caller about to sleep must not leave any behind); the others polled
    /// meanwhile are kept, in order, for the next poll or wait.
    pub fn wait_nonblocking(&self, wr_id: u64) -> Result<Option<Completion>> {
        if let Some(c) = self.take_stashed(wr_id) {
            return Ok(Some(c));
        }
        let mut buf = [Completion::default(); 16];
        loop {
            let n = self.poll_device(&mut buf)?;
            let mut q = self.stash.lock().unwrap_or_else(|p| p.into_inner());
            let i = buf[..n].iter().position(|c| c.wr_id == wr_id);
            q.extend(buf[..i.unwrap_or(n)].iter().copied());
            if let Some(i) = i {
                // The rest stay behind the found one, in order.
                q.extend(buf[i + 1..n].iter().copied());
            }
            self.stashed
                .store(!q.is_empty(), std::sync::atomic::Ordering::Release);
            if let Some(i) = i {
                return Ok(Some(buf[i]));
            }
            if n < buf.len() {
                return Ok(None);
            }
        }
    }

    fn take_stashed(&self, wr_id: u64) -> Option<Completion> {
        let mut q = self.stash.lock().unwrap_or_else(|p| p.into_inner());
        let i = q.iter().position(|c| c.wr_id == wr_id)?;
        let c = q.remove(i);
        self.stashed
            .store(!q.is_empty(), std::sync::atomic::Ordering::Release);
        c
    }
}

impl CompChannel {
    /// Queue an event taken for a CQ that was not the taker's.
    pub(crate) fn put_back(&self, cq: crate::CqId) {
        self.inner.push_front(cq.0);
    }
}

impl std::os::fd::AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd()
    }
}

impl AsFd for CompChannel {
    /// Readable while CQ events are queued (epoll, `poll`, tokio's
    /// `AsyncFd`).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

impl AsFd for Context {
    /// Readable while async events are queued ([`Context::get_async_event`]).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.eng.async_fd.as_fd()
    }
}
