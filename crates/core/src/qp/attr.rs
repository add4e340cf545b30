//! QP attributes: the values `ibv_modify_qp` carries, the mask that says which
//! of them one call sets, and the range checks on those values.
//!
//! Every number here (mask bits, MTU codes, access flags) is libibverbs' own,
//! so the C ABI layer passes them through without a translation table and a
//! value printed in a log means the same thing it means in `verbs.h`.
//!
//! Two questions are kept apart on purpose. *Which* attributes a transition
//! needs or accepts is the transition table's business
//! ([`super::state::check_modify`]); whether each supplied *value* is in range
//! is [`QpAttr::validate`]'s. `modify_qp` asks both, and either answer names
//! the attribute at fault.
//!
//! The timer encodings of IBA chapter 9 (local ACK timeout, RNR NAK timer)
//! live here as pure functions so the requester, the responder and the tests
//! all convert the same way.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

use super::state::QpState;

/// Writes `bits` as `NAME|NAME|0x..`, in table order, with any bits the table
/// does not name shown in hex so that nothing is silently dropped.
fn write_bits(f: &mut fmt::Formatter<'_>, bits: u32, names: &[(u32, &str)]) -> fmt::Result {
    if bits == 0 {
        return f.write_str("0");
    }
    let mut rest = bits;
    let mut sep = "";
    for &(bit, name) in names {
        if bits & bit != 0 {
            write!(f, "{sep}{name}")?;
            sep = "|";
            rest &= !bit;
        }
    }
    if rest != 0 {
        write!(f, "{sep}{rest:#x}")?;
    }
    Ok(())
}

const fn union_of(names: &[(u32, &str)]) -> u32 {
    let mut acc = 0;
    let mut i = 0;
    while i < names.len() {
        acc |= names[i].0;
        i += 1;
    }
    acc
}

/// Which fields of a [`QpAttr`] a modify call sets: `enum ibv_qp_attr_mask`.
///
/// Bits this crate does not name are kept (see [`AttrMask::from_bits_retain`])
/// rather than dropped, so that a caller passing a newer libibverbs bit gets
/// an "unsupported attribute" error instead of having it ignored.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(u32);

impl AttrMask {
    pub const EMPTY: Self = Self(0);
    /// `qp_state`: the state to move to. Without it, a modify changes
    /// attributes in place (the current state's self-transition).
    pub const STATE: Self = Self(1 << 0);
    /// `cur_qp_state`: the caller's idea of the current state.
    pub const CUR_STATE: Self = Self(1 << 1);
    pub const EN_SQD_ASYNC_NOTIFY: Self = Self(1 << 2);
    pub const ACCESS_FLAGS: Self = Self(1 << 3);
    pub const PKEY_INDEX: Self = Self(1 << 4);
    pub const PORT: Self = Self(1 << 5);
    pub const QKEY: Self = Self(1 << 6);
    /// The primary path's address vector (`ah_attr`).
    pub const AV: Self = Self(1 << 7);
    pub const PATH_MTU: Self = Self(1 << 8);
    pub const TIMEOUT: Self = Self(1 << 9);
    pub const RETRY_CNT: Self = Self(1 << 10);
    pub const RNR_RETRY: Self = Self(1 << 11);
    pub const RQ_PSN: Self = Self(1 << 12);
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    pub const ALT_PATH: Self = Self(1 << 14);
    pub const MIN_RNR_TIMER: Self = Self(1 << 15);
    pub const SQ_PSN: Self = Self(1 << 16);
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    pub const PATH_MIG_STATE: Self = Self(1 << 18);
    pub const CAP: Self = Self(1 << 19);
    pub const DEST_QPN: Self = Self(1 << 20);
    pub const RATE_LIMIT: Self = Self(1 << 25);
    /// Every bit this crate names.
    pub const ALL: Self = Self(union_of(&ATTR_NAMES));

    /// Keeps every bit, named or not (see the type's docs for why).
    pub const fn from_bits_retain(bits: u32) -> Self {
        Self(bits)
    }
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
    pub const fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
    /// The bits of `self` that are not in `other`.
    pub const fn difference(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The set bits one at a time, lowest first.
    pub fn iter(self) -> impl Iterator<Item = AttrMask> {
        (0..32)
            .map(|i| 1u32 << i)
            .filter(move |b| self.0 & b != 0)
            .map(AttrMask)
    }
}

/// Names in bit order, spelled as in `IBV_QP_*` without the prefix.
const ATTR_NAMES: [(u32, &str); 22] = [
    (AttrMask::STATE.0, "STATE"),
    (AttrMask::CUR_STATE.0, "CUR_STATE"),
    (AttrMask::EN_SQD_ASYNC_NOTIFY.0, "EN_SQD_ASYNC_NOTIFY"),
    (AttrMask::ACCESS_FLAGS.0, "ACCESS_FLAGS"),
    (AttrMask::PKEY_INDEX.0, "PKEY_INDEX"),
    (AttrMask::PORT.0, "PORT"),
    (AttrMask::QKEY.0, "QKEY"),
    (AttrMask::AV.0, "AV"),
    (AttrMask::PATH_MTU.0, "PATH_MTU"),
    (AttrMask::TIMEOUT.0, "TIMEOUT"),
    (AttrMask::RETRY_CNT.0, "RETRY_CNT"),
    (AttrMask::RNR_RETRY.0, "RNR_RETRY"),
    (AttrMask::RQ_PSN.0, "RQ_PSN"),
    (AttrMask::MAX_QP_RD_ATOMIC.0, "MAX_QP_RD_ATOMIC"),
    (AttrMask::ALT_PATH.0, "ALT_PATH"),
    (AttrMask::MIN_RNR_TIMER.0, "MIN_RNR_TIMER"),
    (AttrMask::SQ_PSN.0, "SQ_PSN"),
    (AttrMask::MAX_DEST_RD_ATOMIC.0, "MAX_DEST_RD_ATOMIC"),
    (AttrMask::PATH_MIG_STATE.0, "PATH_MIG_STATE"),
    (AttrMask::CAP.0, "CAP"),
    (AttrMask::DEST_QPN.0, "DEST_QPN"),
    (AttrMask::RATE_LIMIT.0, "RATE_LIMIT"),
];

impl BitOr for AttrMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

impl BitOrAssign for AttrMask {
    fn bitor_assign(&mut self, rhs: Self) {
        *self = self.union(rhs);
    }
}

impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_bits(f, self.0, &ATTR_NAMES)
    }
}

impl fmt::Debug for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttrMask({self})")
    }
}

/// `enum ibv_access_flags`: what a QP lets its peer do (`qp_access_flags`)
/// and what a memory region permits (`ibv_reg_mr`'s `access`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    pub const EMPTY: Self = Self(0);
    pub const LOCAL_WRITE: Self = Self(1);
    pub const REMOTE_WRITE: Self = Self(2);
    pub const REMOTE_READ: Self = Self(4);
    pub const REMOTE_ATOMIC: Self = Self(8);
    pub const MW_BIND: Self = Self(16);
    pub const ZERO_BASED: Self = Self(32);
    pub const ON_DEMAND: Self = Self(64);
    pub const HUGETLB: Self = Self(128);
    pub const RELAXED_ORDERING: Self = Self(1 << 20);
    /// Every flag this crate names.
    pub const ALL: Self = Self(union_of(&ACCESS_NAMES));

    /// Keeps every bit, named or not, so validation can report strays.
    pub const fn from_bits_retain(bits: u32) -> Self {
        Self(bits)
    }
    pub const fn bits(self) -> u32 {
        self.0
    }
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
    pub const fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
    pub const fn difference(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The rules `ibv_reg_mr` enforces before it touches any memory: every
    /// bit must be a known flag, and remote write or remote atomic access
    /// needs local write too (IBA: memory a peer may modify must be locally
    /// writable; the kernel returns EINVAL otherwise).
    pub fn validate_for_mr(self) -> Result<(), AccessError> {
        let unknown = self.difference(Self::ALL);
        if !unknown.is_empty() {
            return Err(AccessError::UnknownBits { unknown: unknown.0 });
        }
        let remote_modify = self.intersection(Self::REMOTE_WRITE.union(Self::REMOTE_ATOMIC));
        if !remote_modify.is_empty() && !self.contains(Self::LOCAL_WRITE) {
            return Err(AccessError::RemoteWithoutLocalWrite {
                remote: remote_modify,
            });
        }
        Ok(())
    }
}

const ACCESS_NAMES: [(u32, &str); 9] = [
    (AccessFlags::LOCAL_WRITE.0, "LOCAL_WRITE"),
    (AccessFlags::REMOTE_WRITE.0, "REMOTE_WRITE"),
    (AccessFlags::REMOTE_READ.0, "REMOTE_READ"),
    (AccessFlags::REMOTE_ATOMIC.0, "REMOTE_ATOMIC"),
    (AccessFlags::MW_BIND.0, "MW_BIND"),
    (AccessFlags::ZERO_BASED.0, "ZERO_BASED"),
    (AccessFlags::ON_DEMAND.0, "ON_DEMAND"),
    (AccessFlags::HUGETLB.0, "HUGETLB"),
    (AccessFlags::RELAXED_ORDERING.0, "RELAXED_ORDERING"),
];

impl BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

impl BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        *self = self.union(rhs);
    }
}

impl fmt::Display for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_bits(f, self.0, &ACCESS_NAMES)
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AccessFlags({self})")
    }
}

/// Why a set of access flags cannot be used to register memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessError {
    /// Bits that are not `ibv_access_flags` at all.
    UnknownBits { unknown: u32 },
    /// REMOTE_WRITE and/or REMOTE_ATOMIC (the ones in `remote`) without
    /// LOCAL_WRITE.
    RemoteWithoutLocalWrite { remote: AccessFlags },
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownBits { unknown } => {
                write!(f, "access flags {unknown:#x} are not ibv_access_flags")
            }
            Self::RemoteWithoutLocalWrite { remote } => write!(
                f,
                "{remote} requires LOCAL_WRITE: memory a peer may modify must be \
                 locally writable too (ibv_reg_mr fails with EINVAL)"
            ),
        }
    }
}

impl std::error::Error for AccessError {}

/// Path MTU, `enum ibv_mtu`: the largest payload one packet of a QP carries.
///
/// Variants are named by their size in bytes; the discriminant is the
/// libibverbs code, so ordering by variant is ordering by size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Mtu {
    B256 = 1,
    B512 = 2,
    /// The default because it is the usual RoCE path MTU: 1024 bytes of
    /// payload plus RoCEv2 headers fit a standard 1500-byte Ethernet frame.
    #[default]
    B1024 = 3,
    B2048 = 4,
    B4096 = 5,
}

impl Mtu {
    pub const ALL: [Mtu; 5] = [Mtu::B256, Mtu::B512, Mtu::B1024, Mtu::B2048, Mtu::B4096];

    /// From an `IBV_MTU_*` code (1..=5); anything else is not an MTU.
    pub const fn from_ibv(code: u32) -> Option<Mtu> {
        match code {
            1 => Some(Mtu::B256),
            2 => Some(Mtu::B512),
            3 => Some(Mtu::B1024),
            4 => Some(Mtu::B2048),
            5 => Some(Mtu::B4096),
            _ => None,
        }
    }
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }
    /// Payload bytes per packet: the IBA encoding is 2^(7 + code).
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// From a size in bytes, which must be one of the five IBA MTUs.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.bytes() == bytes)
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// Where a connected QP's packets go (`ibv_ah_attr` with its GRH, as RoCE
/// always uses one). The destination QP number is not here: it is
/// [`QpAttr::dest_qp_num`], set by its own mask bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AddressVector {
    /// Destination GID: on RoCEv2, the peer's IPv6 or IPv4-mapped address.
    pub dgid: [u8; 16],
    /// Index of our own GID (and so our source IP) in the port's GID table.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP and ECN bits).
    pub traffic_class: u8,
    /// IPv6 flow label, 20 bits.
    pub flow_label: u32,
    /// Service level, 4 bits.
    pub sl: u8,
}

/// The subset of `struct ibv_qp_attr` that softrdma's transport uses.
///
/// Fields are listed in mask-bit order; each is read only when its
/// [`AttrMask`] bit is set, exactly as in libibverbs. There are no alternate
/// path, capability or rate-limit fields: [`QpAttr::validate`] rejects those
/// bits with [`AttrError::Unsupported`].
///
/// `Default` is a zeroed `struct ibv_qp_attr`, as C code starts from: local
/// ACK timeout 0 (no retransmission timer: a lost packet stalls the QP),
/// `retry_cnt` 0, `rnr_retry` 0, `max_rd_atomic` 0 (no READ or atomic can
/// be issued), hop limit 0. Those are legal IBA values with those meanings,
/// not working defaults; `softrdma-verbs`' `ConnectOptions` has those.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// [`AttrMask::STATE`]
    pub qp_state: QpState,
    /// [`AttrMask::CUR_STATE`]
    pub cur_qp_state: QpState,
    /// [`AttrMask::EN_SQD_ASYNC_NOTIFY`]: raise an async event once the
    /// send queue has drained after RTS->SQD.
    pub en_sqd_async_notify: bool,
    /// Query-only: whether the QP is in SQD and still draining.
    pub sq_draining: bool,
    /// [`AttrMask::ACCESS_FLAGS`]: which remote operations the peer may
    /// perform on this QP's responder (REMOTE_WRITE/READ/ATOMIC).
    pub qp_access_flags: AccessFlags,
    /// [`AttrMask::PKEY_INDEX`]
    pub pkey_index: u16,
    /// [`AttrMask::PORT`]
    pub port_num: u8,
    /// [`AttrMask::QKEY`]: UD only.
    pub qkey: u32,
    /// [`AttrMask::AV`]
    pub av: AddressVector,
    /// [`AttrMask::PATH_MTU`]
    pub path_mtu: Mtu,
    /// [`AttrMask::TIMEOUT`]: local ACK timeout exponent, see
    /// [`local_ack_timeout_ns`].
    pub timeout: u8,
    /// [`AttrMask::RETRY_CNT`]: transport retries after a timeout or NAK.
    pub retry_cnt: u8,
    /// [`AttrMask::RNR_RETRY`]: retries after an RNR NAK; 7 means forever.
    pub rnr_retry: u8,
    /// [`AttrMask::RQ_PSN`]: first PSN the responder expects.
    pub rq_psn: u32,
    /// [`AttrMask::MAX_QP_RD_ATOMIC`]: outstanding RDMA reads/atomics this QP
    /// may issue as requester.
    pub max_rd_atomic: u8,
    /// [`AttrMask::MIN_RNR_TIMER`]: RNR NAK timer code we advertise, see
    /// [`rnr_timer_ns`].
    pub min_rnr_timer: u8,
    /// [`AttrMask::SQ_PSN`]: first PSN the requester sends.
    pub sq_psn: u32,
    /// [`AttrMask::MAX_DEST_RD_ATOMIC`]: outstanding RDMA reads/atomics this
    /// QP accepts as responder.
    pub max_dest_rd_atomic: u8,
    /// [`AttrMask::DEST_QPN`]
    pub dest_qp_num: u32,
}

/// The device and port limits that [`QpAttr`] values are checked against
/// (the relevant fields of `ibv_device_attr` and `ibv_port_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrLimits {
    /// Upper bound for `max_dest_rd_atomic` (reads/atomics we serve).
    pub max_qp_rd_atom: u8,
    /// Upper bound for `max_rd_atomic` (reads/atomics we initiate).
    pub max_qp_init_rd_atom: u8,
    /// Upper bound for `path_mtu`.
    pub active_mtu: Mtu,
    /// Number of entries in the port's GID table: bounds `av.sgid_index`.
    pub gid_table_len: u16,
}

/// PSNs and QP numbers are 24-bit fields in the BTH.
const MAX_24BIT: u32 = (1 << 24) - 1;

/// A [`QpAttr`] value that is out of range for the attribute that carries
/// it. Each variant names one attribute and holds the offending value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrError {
    QpAccessFlags {
        unknown: u32,
    },
    PkeyIndex {
        value: u16,
    },
    Port {
        value: u8,
    },
    SgidIndex {
        value: u8,
        gid_table_len: u16,
    },
    FlowLabel {
        value: u32,
    },
    ServiceLevel {
        value: u8,
    },
    PathMtu {
        value: Mtu,
        active: Mtu,
    },
    Timeout {
        value: u8,
    },
    RetryCnt {
        value: u8,
    },
    RnrRetry {
        value: u8,
    },
    RqPsn {
        value: u32,
    },
    MaxRdAtomic {
        value: u8,
        max: u8,
    },
    MinRnrTimer {
        value: u8,
    },
    SqPsn {
        value: u32,
    },
    MaxDestRdAtomic {
        value: u8,
        max: u8,
    },
    DestQpn {
        value: u32,
    },
    /// Mask bits for features softrdma does not have.
    Unsupported {
        attrs: AttrMask,
    },
}

impl fmt::Display for AttrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::QpAccessFlags { unknown } => write!(
                f,
                "qp_access_flags has bits {unknown:#x} that are not ibv_access_flags"
            ),
            Self::PkeyIndex { value } => write!(
                f,
                "pkey_index {value} is out of range: the P_Key table has one entry, index 0"
            ),
            Self::Port { value } => write!(
                f,
                "port_num {value} is invalid: a softrdma device has one port, number 1"
            ),
            Self::SgidIndex {
                value,
                gid_table_len,
            } => write!(
                f,
                "av.sgid_index {value} is out of range: the GID table has {gid_table_len} entries"
            ),
            Self::FlowLabel { value } => write!(
                f,
                "av.flow_label {value:#x} is out of range: flow labels are 20 bits"
            ),
            Self::ServiceLevel { value } => write!(
                f,
                "av.sl {value} is out of range: service levels are 4 bits (0..=15)"
            ),
            Self::PathMtu { value, active } => write!(
                f,
                "path_mtu {value} exceeds the port's active MTU {active}"
            ),
            Self::Timeout { value } => write!(
                f,
                "timeout {value} is out of range: the local ACK timeout is a 5-bit exponent (0..=31, 0 = infinite)"
            ),
            Self::RetryCnt { value } => write!(
                f,
                "retry_cnt {value} is out of range: it is a 3-bit count (0..=7)"
            ),
            Self::RnrRetry { value } => write!(
                f,
                "rnr_retry {value} is out of range: it is a 3-bit count (0..=7, 7 = retry forever)"
            ),
            Self::RqPsn { value } => write!(
                f,
                "rq_psn {value:#x} is out of range: PSNs are 24 bits (at most 0xffffff)"
            ),
            Self::MaxRdAtomic { value, max } => write!(
                f,
                "max_rd_atomic {value} exceeds the device's max_qp_init_rd_atom {max}"
            ),
            Self::MinRnrTimer { value } => write!(
                f,
                "min_rnr_timer {value} is out of range: the RNR NAK timer is a 5-bit code (0..=31)"
            ),
            Self::SqPsn { value } => write!(
                f,
                "sq_psn {value:#x} is out of range: PSNs are 24 bits (at most 0xffffff)"
            ),
            Self::MaxDestRdAtomic { value, max } => write!(
                f,
                "max_dest_rd_atomic {value} exceeds the device's max_qp_rd_atom {max}"
            ),
            Self::DestQpn { value } => write!(
                f,
                "dest_qp_num {value:#x} is out of range: QP numbers are 24 bits (at most 0xffffff)"
            ),
            Self::Unsupported { attrs } => write!(
                f,
                "softrdma does not support {attrs}: it has no alternate path or path \
                 migration (ALT_PATH, PATH_MIG_STATE), QP resize (CAP) or rate limit (RATE_LIMIT)"
            ),
        }
    }
}

impl std::error::Error for AttrError {}

impl QpAttr {
    /// Mask bits for features softrdma does not implement.
    pub const UNSUPPORTED: AttrMask = AttrMask::ALT_PATH
        .union(AttrMask::PATH_MIG_STATE)
        .union(AttrMask::CAP)
        .union(AttrMask::RATE_LIMIT);

    /// Checks the range of every value whose bit is in `mask`; values whose
    /// bit is clear are not looked at, as libibverbs ignores them. Reports
    /// the first bad value in mask-bit order.
    ///
    /// This does not check whether the bits are allowed for the transition:
    /// that is [`super::state::check_modify`].
    pub fn validate(&self, mask: AttrMask, limits: &AttrLimits) -> Result<(), AttrError> {
        let unsupported = mask.intersection(Self::UNSUPPORTED);
        if !unsupported.is_empty() {
            return Err(AttrError::Unsupported { attrs: unsupported });
        }
        if mask.contains(AttrMask::ACCESS_FLAGS) {
            let unknown = self.qp_access_flags.difference(AccessFlags::ALL);
            if !unknown.is_empty() {
                return Err(AttrError::QpAccessFlags {
                    unknown: unknown.bits(),
                });
            }
        }
        if mask.contains(AttrMask::PKEY_INDEX) && self.pkey_index != 0 {
            return Err(AttrError::PkeyIndex {
                value: self.pkey_index,
            });
        }
        if mask.contains(AttrMask::PORT) && self.port_num != 1 {
            return Err(AttrError::Port {
                value: self.port_num,
            });
        }
        if mask.contains(AttrMask::AV) {
            let av = &self.av;
            if u16::from(av.sgid_index) >= limits.gid_table_len {
                return Err(AttrError::SgidIndex {
                    value: av.sgid_index,
                    gid_table_len: limits.gid_table_len,
                });
            }
            if av.flow_label >= 1 << 20 {
                return Err(AttrError::FlowLabel {
                    value: av.flow_label,
                });
            }
            if av.sl >= 16 {
                return Err(AttrError::ServiceLevel { value: av.sl });
            }
        }
        if mask.contains(AttrMask::PATH_MTU) && self.path_mtu > limits.active_mtu {
            return Err(AttrError::PathMtu {
                value: self.path_mtu,
                active: limits.active_mtu,
            });
        }
        if mask.contains(AttrMask::TIMEOUT) && self.timeout >= 32 {
            return Err(AttrError::Timeout {
                value: self.timeout,
            });
        }
        if mask.contains(AttrMask::RETRY_CNT) && self.retry_cnt > 7 {
            return Err(AttrError::RetryCnt {
                value: self.retry_cnt,
            });
        }
        if mask.contains(AttrMask::RNR_RETRY) && self.rnr_retry > 7 {
            return Err(AttrError::RnrRetry {
                value: self.rnr_retry,
            });
        }
        if mask.contains(AttrMask::RQ_PSN) && self.rq_psn > MAX_24BIT {
            return Err(AttrError::RqPsn { value: self.rq_psn });
        }
        if mask.contains(AttrMask::MAX_QP_RD_ATOMIC)
            && self.max_rd_atomic > limits.max_qp_init_rd_atom
        {
            return Err(AttrError::MaxRdAtomic {
                value: self.max_rd_atomic,
                max: limits.max_qp_init_rd_atom,
            });
        }
        if mask.contains(AttrMask::MIN_RNR_TIMER) && self.min_rnr_timer >= 32 {
            return Err(AttrError::MinRnrTimer {
                value: self.min_rnr_timer,
            });
        }
        if mask.contains(AttrMask::SQ_PSN) && self.sq_psn > MAX_24BIT {
            return Err(AttrError::SqPsn { value: self.sq_psn });
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC)
            && self.max_dest_rd_atomic > limits.max_qp_rd_atom
        {
            return Err(AttrError::MaxDestRdAtomic {
                value: self.max_dest_rd_atomic,
                max: limits.max_qp_rd_atom,
            });
        }
        if mask.contains(AttrMask::DEST_QPN) && self.dest_qp_num > MAX_24BIT {
            return Err(AttrError::DestQpn {
                value: self.dest_qp_num,
            });
        }
        Ok(())
    }
}

/// The unit of the local ACK timeout: 4.096 µs (IBA 9.7.6.1.3).
pub const LOCAL_ACK_TIMEOUT_UNIT_NS: u64 = 4096;

/// How long the requester waits for an ACK before retrying, from the 5-bit
/// `timeout` attribute: 4.096 µs × 2^timeout; 0 means wait forever (`None`).
///
/// Values above 31 are not valid ([`QpAttr::validate`] rejects them); here
/// they saturate at the largest timer rather than overflow.
pub const fn local_ack_timeout_ns(timeout: u8) -> Option<u64> {
    if timeout == 0 {
        return None;
    }
    let exp = if timeout > 31 { 31 } else { timeout };
    Some(LOCAL_ACK_TIMEOUT_UNIT_NS << exp)
}

/// The RNR NAK timer (IBA table 45 in 9.7.5.2.8), in microseconds, indexed
/// by the 5-bit code a responder advertises in its RNR NAK. Code 0 is the
/// longest wait, not the shortest: the encoding is a lookup, not a formula.
const RNR_TIMER_US: [u64; 32] = [
    655_360, // 0: 655.36 ms
    10,      // 1: 0.01 ms
    20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, // codes 2..=13
    1_280, 1_920, 2_560, 3_840, 5_120, 7_680, 10_240, 15_360, // codes 14..=21
    20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, // codes 22..=28
    245_760, 327_680, 491_520, // codes 29..=31
];

/// How long a requester waits after an RNR NAK carrying timer `code`.
///
/// Codes above 31 are not valid; they map to the longest wait (code 0's
/// 655.36 ms) so that a bad value errs on the side of backing off.
pub const fn rnr_timer_ns(code: u8) -> u64 {
    let us = if code > 31 {
        RNR_TIMER_US[0]
    } else {
        RNR_TIMER_US[code as usize]
    };
    us * 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `enum ibv_qp_attr_mask` from libibverbs' verbs.h, transcribed as
    /// literal numbers so that a typo in the consts cannot hide here.
    #[test]
    fn mask_bits_match_libibverbs() {
        let expected: [(&str, u32); 22] = [
            ("STATE", 1),
            ("CUR_STATE", 2),
            ("EN_SQD_ASYNC_NOTIFY", 4),
            ("ACCESS_FLAGS", 8),
            ("PKEY_INDEX", 16),
            ("PORT", 32),
            ("QKEY", 64),
            ("AV", 128),
            ("PATH_MTU", 256),
            ("TIMEOUT", 512),
            ("RETRY_CNT", 1024),
            ("RNR_RETRY", 2048),
            ("RQ_PSN", 4096),
            ("MAX_QP_RD_ATOMIC", 8192),
            ("ALT_PATH", 16384),
            ("MIN_RNR_TIMER", 32768),
            ("SQ_PSN", 65536),
            ("MAX_DEST_RD_ATOMIC", 131072),
            ("PATH_MIG_STATE", 262144),
            ("CAP", 524288),
            ("DEST_QPN", 1048576),
            ("RATE_LIMIT", 33554432),
        ];
        for ((bit, name), (want_name, want_bit)) in ATTR_NAMES.iter().zip(expected) {
            assert_eq!((*name, *bit), (want_name, want_bit));
            assert_eq!(AttrMask::from_bits_retain(*bit).to_string(), *name);
        }
        assert_eq!(AttrMask::ALL.iter().count(), 22);
        assert_eq!(AttrMask::PATH_MTU.bits(), 256);
        assert_eq!(AttrMask::RATE_LIMIT.bits(), 1 << 25);
    }

    #[test]
    fn mask_set_operations() {
        let m = AttrMask::PATH_MTU | AttrMask::DEST_QPN;
        assert!(m.contains(AttrMask::PATH_MTU));
        assert!(!m.contains(AttrMask::PATH_MTU | AttrMask::AV));
        assert!(m.contains(AttrMask::EMPTY));
        assert_eq!(m.difference(AttrMask::DEST_QPN), AttrMask::PATH_MTU);
        assert!(m.difference(m).is_empty());
        assert_eq!(
            m.iter().collect::<Vec<_>>(),
            [AttrMask::PATH_MTU, AttrMask::DEST_QPN]
        );
        let mut n = AttrMask::EMPTY;
        n |= AttrMask::AV;
        assert_eq!(n, AttrMask::AV);
    }

    #[test]
    fn mask_display_names_bits_in_order_and_keeps_strays() {
        assert_eq!(
            (AttrMask::DEST_QPN | AttrMask::PATH_MTU).to_string(),
            "PATH_MTU|DEST_QPN"
        );
        assert_eq!(AttrMask::EMPTY.to_string(), "0");
        assert_eq!(
            AttrMask::from_bits_retain(AttrMask::AV.bits() | 1 << 21 | 1 << 30).to_string(),
            "AV|0x40200000"
        );
        assert_eq!(format!("{:?}", AttrMask::QKEY), "AttrMask(QKEY)");
    }

    #[test]
    fn access_flags_match_libibverbs() {
        let expected: [(&str, u32); 9] = [
            ("LOCAL_WRITE", 1),
            ("REMOTE_WRITE", 2),
            ("REMOTE_READ", 4),
            ("REMOTE_ATOMIC", 8),
            ("MW_BIND", 16),
            ("ZERO_BASED", 32),
            ("ON_DEMAND", 64),
            ("HUGETLB", 128),
            ("RELAXED_ORDERING", 1 << 20),
        ];
        for ((bit, name), (want_name, want_bit)) in ACCESS_NAMES.iter().zip(expected) {
            assert_eq!((*name, *bit), (want_name, want_bit));
        }
        assert_eq!(
            (AccessFlags::REMOTE_READ | AccessFlags::LOCAL_WRITE).to_string(),
            "LOCAL_WRITE|REMOTE_READ"
        );
    }

    #[test]
    fn mr_access_rules() {
        use AccessFlags as A;
        for ok in [
            A::EMPTY,
            A::LOCAL_WRITE,
            A::REMOTE_READ,
            A::LOCAL_WRITE | A::REMOTE_WRITE,
            A::LOCAL_WRITE | A::REMOTE_WRITE | A::REMOTE_READ | A::REMOTE_ATOMIC,
            A::ALL,
        ] {
            assert_eq!(ok.validate_for_mr(), Ok(()), "{ok}");
        }
        let err = (A::REMOTE_WRITE | A::REMOTE_READ)
            .validate_for_mr()
            .unwrap_err();
        assert_eq!(
            err,
            AccessError::RemoteWithoutLocalWrite {
                remote: A::REMOTE_WRITE
            }
        );
        assert!(err
            .to_string()
            .starts_with("REMOTE_WRITE requires LOCAL_WRITE"));
        assert_eq!(
            (A::REMOTE_ATOMIC | A::REMOTE_WRITE).validate_for_mr(),
            Err(AccessError::RemoteWithoutLocalWrite {
                remote: A::REMOTE_WRITE | A::REMOTE_ATOMIC
            })
        );
        assert_eq!(
            A::from_bits_retain(1 << 8 | 1).validate_for_mr(),
            Err(AccessError::UnknownBits { unknown: 1 << 8 })
        );
    }

    #[test]
    fn mtu_codes_and_sizes() {
        let table = [(1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096)];
        for (mtu, (code, bytes)) in Mtu::ALL.into_iter().zip(table) {
            assert_eq!(mtu.to_ibv(), code);
            assert_eq!(mtu.bytes(), bytes);
            assert_eq!(Mtu::from_ibv(code), Some(mtu));
            assert_eq!(Mtu::from_bytes(bytes), Some(mtu));
            assert_eq!(mtu.to_string(), bytes.to_string());
        }
        assert_eq!(Mtu::from_ibv(0), None);
        assert_eq!(Mtu::from_ibv(6), None);
        assert_eq!(Mtu::from_bytes(1500), None);
        assert!(Mtu::B256 < Mtu::B4096);
    }

    fn limits() -> AttrLimits {
        AttrLimits {
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 8,
            active_mtu: Mtu::B4096,
            gid_table_len: 4,
        }
    }

    fn good_attr() -> QpAttr {
        QpAttr {
            qp_state: QpState::Rts,
            qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            port_num: 1,
            av: AddressVector {
                sgid_index: 3,
                flow_label: 0xf_ffff,
                sl: 15,
                ..Default::default()
            },
            path_mtu: Mtu::B4096,
            timeout: 31,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: 0xff_ffff,
            max_rd_atomic: 8,
            min_rnr_timer: 31,
            sq_psn: 0xff_ffff,
            max_dest_rd_atomic: 16,
            dest_qp_num: 0xff_ffff,
            ..Default::default()
        }
    }

    #[test]
    fn boundary_values_are_valid() {
        let supported = AttrMask::ALL.difference(QpAttr::UNSUPPORTED);
        assert_eq!(good_attr().validate(supported, &limits()), Ok(()));
    }

    /// One bad value per attribute: rejected with its own variant when its
    /// bit is set, ignored when it is not.
    #[test]
    fn each_bad_value_is_named_and_only_checked_under_its_bit() {
        type Case = (AttrMask, fn(&mut QpAttr), AttrError, &'static str);
        let cases: [Case; 16] = [
            (
                AttrMask::ACCESS_FLAGS,
                |a| a.qp_access_flags = AccessFlags::from_bits_retain(1 << 31),
                AttrError::QpAccessFlags { unknown: 1 << 31 },
                "qp_access_flags",
            ),
            (
                AttrMask::PKEY_INDEX,
                |a| a.pkey_index = 1,
                AttrError::PkeyIndex { value: 1 },
                "pkey_index 1",
            ),
            (
                AttrMask::PORT,
                |a| a.port_num = 2,
                AttrError::Port { value: 2 },
                "port_num 2",
            ),
            (
                AttrMask::AV,
                |a| a.av.sgid_index = 4,
                AttrError::SgidIndex {
                    value: 4,
                    gid_table_len: 4,
                },
                "sgid_index 4",
            ),
            (
                AttrMask::AV,
                |a| a.av.flow_label = 1 << 20,
                AttrError::FlowLabel { value: 1 << 20 },
                "flow_label 0x100000",
            ),
            (
                AttrMask::AV,
                |a| a.av.sl = 16,
                AttrError::ServiceLevel { value: 16 },
                "sl 16",
            ),
            (
                AttrMask::TIMEOUT,
                |a| a.timeout = 32,
                AttrError::Timeout { value: 32 },
                "timeout 32",
            ),
            (
                AttrMask::RETRY_CNT,
                |a| a.retry_cnt = 8,
                AttrError::RetryCnt { value: 8 },
                "retry_cnt 8",
            ),
            (
                AttrMask::RNR_RETRY,
                |a| a.rnr_retry = 8,
                AttrError::RnrRetry { value: 8 },
                "rnr_retry 8",
            ),
            (
                AttrMask::RQ_PSN,
                |a| a.rq_psn = 1 << 24,
                AttrError::RqPsn { value: 1 << 24 },
                "rq_psn 0x1000000",
            ),
            (
                AttrMask::MAX_QP_RD_ATOMIC,
                |a| a.max_rd_atomic = 9,
                AttrError::MaxRdAtomic { value: 9, max: 8 },
                "max_rd_atomic 9",
            ),
            (
                AttrMask::MIN_RNR_TIMER,
                |a| a.min_rnr_timer = 32,
                AttrError::MinRnrTimer { value: 32 },
                "min_rnr_timer 32",
            ),
            (
                AttrMask::SQ_PSN,
                |a| a.sq_psn = u32::MAX,
                AttrError::SqPsn { value: u32::MAX },
                "sq_psn 0xffffffff",
            ),
            (
                AttrMask::MAX_DEST_RD_ATOMIC,
                |a| a.max_dest_rd_atomic = 17,
                AttrError::MaxDestRdAtomic { value: 17, max: 16 },
                "max_dest_rd_atomic 17",
            ),
            (
                AttrMask::DEST_QPN,
                |a| a.dest_qp_num = 1 << 24,
                AttrError::DestQpn { value: 1 << 24 },
                "dest_qp_num 0x1000000",
            ),
            (
                AttrMask::PATH_MTU,
                |a| {
                    a.path_mtu = Mtu::B4096;
                },
                AttrError::PathMtu {
                    value: Mtu::B4096,
                    active: Mtu::B1024,
                },
                "path_mtu 4096",
            ),
        ];
        for (bit, spoil, err, names) in cases {
            let mut attr = good_attr();
            spoil(&mut attr);
            let mut lim = limits();
            if bit == AttrMask::PATH_MTU {
                lim.active_mtu = Mtu::B1024;
            }
            assert_eq!(attr.validate(bit | AttrMask::STATE, &lim), Err(err));
            assert!(err.to_string().contains(names), "{err} should name {names}");
            let others = AttrMask::ALL
                .difference(QpAttr::UNSUPPORTED)
                .difference(bit);
            assert_eq!(attr.validate(others, &lim), Ok(()), "{bit} not in mask");
        }
    }

    #[test]
    fn unsupported_features_are_rejected_by_name() {
        let err = good_attr()
            .validate(AttrMask::ALT_PATH | AttrMask::SQ_PSN, &limits())
            .unwrap_err();
        assert_eq!(
            err,
            AttrError::Unsupported {
                attrs: AttrMask::ALT_PATH
            }
        );
        assert!(err.to_string().contains("does not support ALT_PATH"));
    }

    #[test]
    fn local_ack_timeout() {
        assert_eq!(local_ack_timeout_ns(0), None);
        assert_eq!(local_ack_timeout_ns(1), Some(8_192));
        // 14 is a common choice (perftest): about 67 ms.
        assert_eq!(local_ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(local_ack_timeout_ns(31), Some(4096 << 31));
        assert_eq!(local_ack_timeout_ns(32), local_ack_timeout_ns(31));
        assert_eq!(local_ack_timeout_ns(255), local_ack_timeout_ns(31));
        for t in 1..31 {
            let (a, b) = (local_ack_timeout_ns(t), local_ack_timeout_ns(t + 1));
            assert_eq!(a.map(|ns| ns * 2), b, "timeout {t} doubles");
        }
    }

    /// The whole RNR table, rendered in milliseconds and compared with the
    /// IBA table as printed in the spec.
    #[test]
    fn rnr_timer_table_matches_iba() {
        let spec = "0:655.36 1:0.01 2:0.02 3:0.03 4:0.04 5:0.06 6:0.08 7:0.12 \
                    8:0.16 9:0.24 10:0.32 11:0.48 12:0.64 13:0.96 14:1.28 15:1.92 \
                    16:2.56 17:3.84 18:5.12 19:7.68 20:10.24 21:15.36 22:20.48 \
                    23:30.72 24:40.96 25:61.44 26:81.92 27:122.88 28:163.84 \
                    29:245.76 30:327.68 31:491.52";
        let rendered: Vec<String> = (0..32u8)
            .map(|code| {
                let ns = rnr_timer_ns(code);
                assert_eq!(ns % 10_000, 0, "code {code} is a whole 0.01 ms");
                let centi_ms = ns / 10_000;
                format!("{code}:{}.{:02}", centi_ms / 100, centi_ms % 100)
            })
            .collect();
        assert_eq!(
            rendered.join(" "),
            spec.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        // Codes 1..=31 increase; code 0 is the longest of all.
        for code in 1..31 {
            assert!(rnr_timer_ns(code) < rnr_timer_ns(code + 1));
        }
        assert!(rnr_timer_ns(0) > rnr_timer_ns(31));
        assert_eq!(rnr_timer_ns(32), rnr_timer_ns(0));
    }
}
