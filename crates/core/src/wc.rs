//! Work completions: `struct ibv_wc` as a value, with libibverbs' numbers.

/// `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// The text `ibv_wc_status_str` gives.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "operation aborted",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl core::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    LocalInv = 6,
    AtomicWrite = 9,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// `enum ibv_wc_flags`.
pub mod wc_flags {
    pub const GRH: u32 = 1;
    pub const WITH_IMM: u32 = 2;
    pub const IP_CSUM_OK: u32 = 4;
    pub const WITH_INV: u32 = 8;
}

/// One completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data (WITH_IMM) or the invalidated rkey (WITH_INV), as the
    /// verbs union holds them.
    pub imm_or_inv: u32,
    pub qp_num: u32,
    /// UD receive: the sender's QP number.
    pub src_qp: u32,
    pub wc_flags: u32,
    pub vendor_err: u32,
    /// UD receive: the packet's network type in the SL field, as mlx5
    /// reports it on RoCE (2: IPv4, 1: IPv6; RoCE v2 carries no SL). UCX
    /// before 1.19 reads it to find the destination GID in the GRH and
    /// drops a datagram whose SL says otherwise (rxe reports 0 there).
    /// 0 in every other completion.
    pub sl: u8,
}

impl Completion {
    /// The completion of a one-sided request carried out at post (see
    /// [`crate::Endpoint::post_send_offload`]), for a layer that delivers
    /// it itself ([`crate::Endpoint::complete_external`] takes it back).
    /// The completion of a receive an RC QP's sender filled itself (see
    /// [`crate::Endpoint::take_recvs`]), as the responder would complete it.
    pub fn received(wr_id: u64, qp_num: u32, byte_len: u32, imm: Option<u32>) -> Completion {
        let mut c = Completion::new(wr_id, WcStatus::Success, WcOpcode::Recv, qp_num);
        c.byte_len = byte_len;
        if let Some(i) = imm {
            c.wc_flags |= wc_flags::WITH_IMM;
            c.imm_or_inv = i;
        }
        c
    }

    /// A receive an RDMA WRITE with immediate consumed: no bytes of its
    /// own, the WRITE's length, the immediate.
    pub fn received_write_imm(wr_id: u64, qp_num: u32, byte_len: u32, imm: u32) -> Completion {
        let mut c = Completion::received(wr_id, qp_num, byte_len, Some(imm));
        c.opcode = WcOpcode::RecvRdmaWithImm;
        c
    }

    pub fn offloaded(wr_id: u64, op: &crate::wr::SendOp, qp_num: u32, byte_len: u32) -> Completion {
        let mut c = Completion::new(
            wr_id,
            WcStatus::Success,
            crate::qp::wc_opcode_of(op),
            qp_num,
        );
        c.byte_len = byte_len;
        c
    }
}

impl Default for Completion {
    /// An empty slot to poll into.
    fn default() -> Self {
        Completion::new(0, WcStatus::Success, WcOpcode::Send, 0)
    }
}

impl Completion {
    /// Whether the work request succeeded.
    pub fn is_success(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// `Ok` for a successful completion, `Err` (the completion itself, to
    /// inspect its status) otherwise.
    pub fn into_result(self) -> Result<Completion, Completion> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(self)
        }
    }

    pub(crate) fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Completion {
        Completion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_or_inv: 0,
            qp_num,
            src_qp: 0,
            wc_flags: 0,
            vendor_err: 0,
            sl: 0,
        }
    }
}
