//! Async waiting on tokio (feature `tokio`): a completion, an async event or
//! a peer's endpoint is awaited on tokio's reactor through the descriptors
//! the device already has — the completion channel's and the context's
//! eventfds — so an idle task costs nothing: no polling thread, no timer.
//!
//! ```no_run
//! # async fn f(cq: softrdma_verbs::Cq) -> softrdma_verbs::Result<()> {
//! let cq = softrdma_verbs::aio::AsyncCq::new(cq)?;
//! let c = cq.wait(7).await?; // work request 7's completion
//! # let _ = c; Ok(()) }
//! ```

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{AsyncEvent, CompChannel, Completion, Context, Cq, Error, QpEndpoint, Result};

/// A context's async-event descriptor, lent to tokio's reactor by a
/// borrow of the context (so it stays open while registered).
struct EventsFd<'a>(&'a Context);

impl AsRawFd for EventsFd<'_> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.async_fd()
    }
}

/// A completion queue whose completions are awaited. The CQ must have been
/// created with a completion channel of its own: `AsyncCq::new` refuses a
/// channel another CQ shares, and while the `AsyncCq` lives no other CQ
/// can be created on it (it takes the channel's events without looking
/// whose they are).
pub struct AsyncCq {
    cq: Cq,
    /// The CQ's channel, owned by the registration: its eventfd stays open
    /// for as long as tokio watches it.
    fd: AsyncFd<CompChannel>,
}

impl AsyncCq {
    /// Take `cq` (created with a completion channel) for async waiting.
    /// Needs a tokio runtime with IO enabled.
    pub fn new(cq: Cq) -> Result<AsyncCq> {
        cq.own_channel()?;
        let ch = cq.channel.clone().expect("own_channel checked it");
        // SAFETY: the channel is owned by the `AsyncFd`; its eventfd is
        // closed only when the last clone of the channel drops, which
        // cannot happen before this registration does, and `as_raw_fd`
        // always returns that same descriptor.
        match unsafe { AsyncFd::register(ch) } {
            Ok(fd) => Ok(AsyncCq { cq, fd }),
            Err(e) => {
                cq.release_channel();
                Err(Error::Io(e.into()))
            }
        }
    }

    /// The CQ, for posting against and polling.
    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    /// Await the completion of work request `wr_id` ([`Cq::wait`]'s
    /// contract: other completions are kept for later, a failed one is
    /// [`Error::Completion`]).
    pub async fn wait(&self, wr_id: u64) -> Result<Completion> {
        self.next_matching(Some(wr_id)).await
    }

    /// Await the next completion, whatever its work request.
    pub async fn next(&self) -> Result<Completion> {
        self.next_matching(None).await
    }

    async fn next_matching(&self, wr_id: Option<u64>) -> Result<Completion> {
        loop {
            if let Some(c) = self.try_take(wr_id)? {
                return Ok(c.into_result()?);
            }
            // Arm, then look again: a completion between the empty poll and
            // the arming raises no event.
            self.cq.req_notify(false)?;
            if let Some(c) = self.try_take(wr_id)? {
                return Ok(c.into_result()?);
            }
            let mut ready = self.fd.readable().await?;
            if self.fd.get_ref().get_event(Some(Duration::ZERO))?.is_none() {
                ready.clear_ready();
            }
        }
    }

    fn try_take(&self, wr_id: Option<u64>) -> Result<Option<Completion>> {
        match wr_id {
            Some(id) => self.cq.wait_nonblocking(id),
            None => {
                let mut c = [Completion::default()];
                Ok((self.cq.poll(&mut c)? == 1).then_some(c[0]))
            }
        }
    }
}

impl Drop for AsyncCq {
    fn drop(&mut self) {
        self.cq.release_channel();
    }
}

/// A context's async events (`ibv_get_async_event`), awaited.
pub struct AsyncEvents<'a> {
    fd: AsyncFd<EventsFd<'a>>,
}

impl<'a> AsyncEvents<'a> {
    /// Await `ctx`'s async events. Needs a tokio runtime with IO enabled.
    pub fn new(ctx: &'a Context) -> Result<AsyncEvents<'a>> {
        // SAFETY: the descriptor is the context's, which the borrow keeps
        // open for the registration's whole life; `as_raw_fd` always
        // returns it.
        let fd = unsafe { AsyncFd::register(EventsFd(ctx)) }.map_err(|e| Error::Io(e.into()))?;
        Ok(AsyncEvents { fd })
    }

    /// The next async event.
    pub async fn next(&self) -> Result<AsyncEvent> {
        loop {
            let mut ready = self.fd.readable().await?;
            match self.fd.get_ref().0.get_async_event() {
                Some(e) => return Ok(e),
                None => ready.clear_ready(),
            }
        }
    }
}

/// [`crate::oob::exchange`] on a tokio stream: send `mine`, await the
/// peer's endpoint.
pub async fn exchange(stream: &mut tokio::net::TcpStream, mine: &QpEndpoint) -> Result<QpEndpoint> {
    stream.write_all(&crate::oob::frame(mine)).await?;
    let n = crate::oob::check_len(stream.read_u32_le().await?)?;
    let mut b = vec![0u8; n];
    stream.read_exact(&mut b).await?;
    QpEndpoint::from_bytes(&b)
}
