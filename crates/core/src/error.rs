//! Errors returned to verbs callers. Each names what was wrong; none is
//! produced by wire input (remote faults become completion statuses).

use crate::qp::attr::{AccessError, AttrError};
use crate::qp::state::{ModifyError, QpState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    InvalidArgument(&'static str),
    InvalidAccess(AccessError),
    OutOfResources(&'static str),
    /// A work queue has no free slot (`ENOMEM` from `ibv_post_*`).
    QueueFull {
        queue: &'static str,
        depth: u32,
    },
    /// Too many scatter/gather entries for the queue's `max_sge`.
    TooManySge {
        got: usize,
        max: u32,
    },
    /// Inline data longer than the QP's `max_inline_data`.
    InlineTooLong {
        got: usize,
        max: u32,
    },
    /// The operation is not valid on this QP type.
    UnsupportedOp {
        op: &'static str,
        qp_type: &'static str,
    },
    /// The QP is in a state that does not allow this.
    InvalidState {
        what: &'static str,
        state: QpState,
    },
    NoSuchQp(u32),
    NoSuchCq(u32),
    NoSuchSrq(u32),
    /// The CQ overflowed and is in the error state: it takes, and gives, no
    /// more completions.
    CqOverflowed(u32),
    /// `resize_cq` to fewer entries than the CQ holds.
    CqTooSmall {
        depth: u32,
        queued: usize,
    },
    Modify(ModifyError),
    Attr(AttrError),
    /// The resource is still in use (e.g. a CQ with QPs attached).
    Busy(&'static str),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            Error::InvalidAccess(e) => write!(f, "invalid access flags: {e}"),
            Error::OutOfResources(s) => write!(f, "out of {s}"),
            Error::QueueFull { queue, depth } => {
                write!(f, "{queue} is full ({depth} outstanding work requests)")
            }
            Error::TooManySge { got, max } => {
                write!(f, "{got} scatter/gather entries, the queue allows {max}")
            }
            Error::InlineTooLong { got, max } => {
                write!(f, "{got} bytes of inline data, the QP allows {max}")
            }
            Error::UnsupportedOp { op, qp_type } => {
                write!(f, "{op} is not supported on {qp_type} QPs")
            }
            Error::InvalidState { what, state } => write!(f, "cannot {what} in state {state}"),
            Error::NoSuchQp(n) => write!(f, "no QP number {n:#x}"),
            Error::NoSuchCq(n) => write!(f, "no CQ {n}"),
            Error::NoSuchSrq(n) => write!(f, "no SRQ {n}"),
            Error::CqOverflowed(n) => write!(
                f,
                "CQ {n} overflowed and is in the error state (IBV_EVENT_CQ_ERR): destroy it"
            ),
            Error::CqTooSmall { depth, queued } => write!(
                f,
                "CQ depth {depth} is smaller than the {queued} completions it holds: poll them first"
            ),
            Error::Modify(e) => write!(f, "{e}"),
            Error::Attr(e) => write!(f, "{e}"),
            Error::Busy(s) => write!(f, "{s} is still in use"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ModifyError> for Error {
    fn from(e: ModifyError) -> Self {
        Error::Modify(e)
    }
}

impl From<AttrError> for Error {
    fn from(e: AttrError) -> Self {
        Error::Attr(e)
    }
}
