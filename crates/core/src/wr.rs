//! Work requests: what applications post to send and receive queues, in the
//! shape of `struct ibv_send_wr` / `ibv_recv_wr`, minus the pointers.

/// A scatter/gather element: `length` bytes at local address `addr`, in the
/// memory region whose local key is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Send-side operation and its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm {
        imm: u32,
    },
    SendWithInv {
        rkey: u32,
    },
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    WriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    /// RDMA ATOMIC WRITE (IBA 1.5, RC only): the SGL's 8 bytes stored at
    /// the 8-byte aligned `remote_addr` as one 64-bit word.
    AtomicWrite {
        remote_addr: u64,
        rkey: u32,
    },
    Read {
        remote_addr: u64,
        rkey: u32,
    },
    CompareSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
    /// `IBV_WR_BIND_MW`: bind a type-2 window (and what `ibv_bind_mw`
    /// posts for a type-1 one). Executed when the requester reaches it; it
    /// sends nothing.
    BindMw(crate::mr::MwBind),
    /// `IBV_WR_LOCAL_INV`: invalidate a type-2 window's rkey.
    LocalInv {
        rkey: u32,
    },
}

impl SendOp {
    /// The operations that expect a response carrying data (READ, atomics):
    /// they count against `max_rd_atomic` and are what a fence waits for.
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// RDMA WRITE without immediate, READ, the atomics and ATOMIC WRITE:
    /// what a responder carries out on its memory alone, consuming no
    /// receive WQE and producing no completion there (what an
    /// [`Offload`](crate::endpoint::Offload) may carry out).
    pub fn is_one_sided(&self) -> bool {
        matches!(
            self,
            SendOp::Write { .. }
                | SendOp::Read { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. }
        )
    }

    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// Memory operations the requester carries out itself, sending nothing.
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv { .. })
    }

    pub fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendWithImm { .. } => "SEND_WITH_IMM",
            SendOp::SendWithInv { .. } => "SEND_WITH_INV",
            SendOp::Write { .. } => "RDMA_WRITE",
            SendOp::WriteWithImm { .. } => "RDMA_WRITE_WITH_IMM",
            SendOp::AtomicWrite { .. } => "ATOMIC_WRITE",
            SendOp::Read { .. } => "RDMA_READ",
            SendOp::CompareSwap { .. } => "ATOMIC_CMP_AND_SWP",
            SendOp::FetchAdd { .. } => "ATOMIC_FETCH_AND_ADD",
            SendOp::BindMw(_) => "BIND_MW",
            SendOp::LocalInv { .. } => "LOCAL_INV",
        }
    }
}

/// `enum ibv_send_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct SendFlags(pub u32);

impl SendFlags {
    pub const FENCE: SendFlags = SendFlags(1);
    pub const SIGNALED: SendFlags = SendFlags(2);
    pub const SOLICITED: SendFlags = SendFlags(4);
    pub const INLINE: SendFlags = SendFlags(8);

    pub const fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, r: SendFlags) -> SendFlags {
        SendFlags(self.0 | r.0)
    }
}

/// Where a UD send goes: the address handle's destination plus the remote
/// QP and Q_Key (`wr.ud` in verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub gid: [u8; 16],
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// A send work request. The scatter/gather list is borrowed: posting copies
/// it into the send queue's preallocated slot, so nothing is allocated per
/// request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp,
    pub sgl: &'a [Sge],
    pub flags: SendFlags,
    /// UD only.
    pub ud: Option<UdDest>,
}

/// A receive work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sgl: &'a [Sge],
}
