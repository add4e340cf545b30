//! Connecting a queue pair in one call: what a peer needs to know about a QP
//! ([`QpEndpoint`]), the remote memory it may touch ([`RemoteRegion`]), and
//! the RESET → INIT → RTR → RTS sequence with documented, typed defaults
//! ([`ConnectOptions`], [`Qp::connect`]).
//!
//! The attributes are libibverbs' (`struct ibv_qp_attr`); this module only
//! chooses them, converts durations to IBA's encodings, and derives the
//! attribute masks from the transition ([`Qp::modify_to`]), so a caller
//! never writes a mask by hand.

use std::ops::{Bound, RangeBounds};
use std::time::Duration;

use softrdma_core::qp::attr::{local_ack_timeout_ns, rnr_timer_ns};

use crate::{
    required_mask, AccessFlags, CoreError, Error, Mr, Mtu, Qp, QpAttr, QpState, QpType, Result,
};

/// What a peer needs to connect its QP to one of ours, plus the regions it
/// may address: the record an application exchanges out of band (or the
/// connection manager carries). With the `serde` feature it serialises.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpEndpoint {
    /// The QP's transport service.
    #[cfg_attr(feature = "serde", serde(with = "qp_type_serde"))]
    pub qp_type: QpType,
    /// Queue pair number.
    pub qpn: u32,
    /// The first PSN this QP sends (the peer's receive PSN).
    pub psn: u32,
    /// The port GID: on RoCEv2 the IPv6 or IPv4-mapped address.
    pub gid: [u8; 16],
    /// Memory the peer may WRITE, READ or use atomics on.
    pub regions: Vec<RemoteRegion>,
}

/// A QP type as `"RC"`, `"UC"` or `"UD"`.
#[cfg(feature = "serde")]
mod qp_type_serde {
    use super::QpType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &QpType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(t.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QpType, D::Error> {
        let v = String::deserialize(d)?;
        match v.as_str() {
            "RC" => Ok(QpType::Rc),
            "UC" => Ok(QpType::Uc),
            "UD" => Ok(QpType::Ud),
            "XRC_SEND" => Ok(QpType::XrcSend),
            "XRC_RECV" => Ok(QpType::XrcRecv),
            _ => Err(serde::de::Error::custom(format!(
                "QP type {v:?}: expected \"RC\", \"UC\", \"UD\", \"XRC_SEND\" or \"XRC_RECV\""
            ))),
        }
    }
}

/// Size of [`QpEndpoint::to_bytes`]' header (before the regions).
const ENDPOINT_HEADER: usize = 1 + 4 + 4 + 16 + 2;
/// Size of one region in [`QpEndpoint::to_bytes`].
const REGION_BYTES: usize = 8 + 4 + 8;

impl QpEndpoint {
    /// The endpoint with these regions offered to the peer.
    pub fn with_regions(mut self, regions: impl IntoIterator<Item = RemoteRegion>) -> QpEndpoint {
        self.regions.extend(regions);
        self
    }

    /// A fixed little-endian encoding (type, QPN, PSN, GID, region count,
    /// then address, rkey and length of each region), for exchanging
    /// endpoints without serde.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(ENDPOINT_HEADER + self.regions.len() * REGION_BYTES);
        v.push(self.qp_type.to_ibv() as u8);
        v.extend_from_slice(&self.qpn.to_le_bytes());
        v.extend_from_slice(&self.psn.to_le_bytes());
        v.extend_from_slice(&self.gid);
        v.extend_from_slice(&(self.regions.len().min(u16::MAX as usize) as u16).to_le_bytes());
        for r in self.regions.iter().take(u16::MAX as usize) {
            v.extend_from_slice(&r.addr.to_le_bytes());
            v.extend_from_slice(&r.rkey.to_le_bytes());
            v.extend_from_slice(&r.len.to_le_bytes());
        }
        v
    }

    /// Decode [`QpEndpoint::to_bytes`]; an error names what is wrong.
    pub fn from_bytes(b: &[u8]) -> Result<QpEndpoint> {
        let bad = |m| Err(Error::Verbs(CoreError::InvalidArgument(m)));
        if b.len() < ENDPOINT_HEADER {
            return bad("endpoint record shorter than its header");
        }
        let Some(qp_type) = QpType::from_ibv(b[0] as u32) else {
            return bad(
                "endpoint record names no QP type (RC 2, UC 3, UD 4, XRC_SEND 9, XRC_RECV 10)",
            );
        };
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let (qpn, psn) = (u32_at(1), u32_at(5));
        if qpn >= 1 << 24 || psn >= 1 << 24 {
            return bad("endpoint record's QPN or PSN is wider than 24 bits");
        }
        let gid: [u8; 16] = b[9..25].try_into().expect("16 bytes");
        let n = u16::from_le_bytes([b[25], b[26]]) as usize;
        if b.len() != ENDPOINT_HEADER + n * REGION_BYTES {
            return bad("endpoint record's length does not match its region count");
        }
        let regions = (0..n)
            .map(|i| {
                let o = ENDPOINT_HEADER + i * REGION_BYTES;
                RemoteRegion {
                    addr: u64_at(o),
                    rkey: u32_at(o + 8),
                    len: u64_at(o + 12),
                }
            })
            .collect();
        Ok(QpEndpoint {
            qp_type,
            qpn,
            psn,
            gid,
            regions,
        })
    }
}

/// Remote memory as a peer's WRITE, READ or atomic addresses it: an
/// address in the region's iova space, its rkey and a length. Slicing is
/// checked, so a request built from a `RemoteRegion` stays inside what the
/// owner offered (the owner's device checks again: this only catches the
/// mistake early, with a better message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RemoteRegion {
    /// The first byte's address as the peer sends it (`remote_addr`).
    pub addr: u64,
    /// The key that grants access (`rkey`).
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteRegion {
    /// The part `range` of this region (offsets from its start), or an
    /// error if it does not lie inside.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<RemoteRegion> {
        let (start, end) = bounds(range, self.len as usize)?;
        Ok(RemoteRegion {
            addr: self.addr + start as u64,
            rkey: self.rkey,
            len: (end - start) as u64,
        })
    }

    /// The address `offset` bytes in, or an error past the end.
    pub fn at(&self, offset: usize) -> Result<u64> {
        Ok(self.slice(offset..)?.addr)
    }
}

/// `start..end` of `range` inside `0..len`, or an error.
pub(crate) fn bounds(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        _ => Err(CoreError::InvalidArgument("range outside the memory region").into()),
    }
}

impl Mr {
    /// This region as a peer addresses it, to hand out in a
    /// [`QpEndpoint`]. The peer can reach it only as the region's access
    /// flags allow.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.iova(),
            rkey: self.rkey(),
            len: self.len() as u64,
        }
    }
}

/// How many times a requester retries after an RNR NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RnrRetry {
    /// At most this many retries (0..=6; IBA encodes 7 as "for ever").
    Count(u8),
    /// Retry for as long as the receiver is not ready (encoded 7).
    Infinite,
}

/// The attributes [`Qp::connect`] sets, with defaults that work against
/// rxe and RNICs; every field can be overridden.
///
/// | field | default | IBA attribute |
/// | --- | --- | --- |
/// | `path_mtu` | the port's active MTU | `path_mtu` |
/// | `ack_timeout` | 67 ms (exponent 14, rdma-core's examples) | `timeout` |
/// | `retry_cnt` | 7 | `retry_cnt` |
/// | `rnr_retry` | `Infinite` | `rnr_retry` |
/// | `min_rnr_timer` | 640 µs (code 12) | `min_rnr_timer` |
/// | `max_rd_atomic` / `max_dest_rd_atomic` | 16 / 16 | same names |
/// | `access` | remote WRITE, READ and atomics | `qp_access_flags` |
/// | `hop_limit`, `traffic_class` | 64, 0 | `ah_attr.grh` |
/// | `qkey` (UD) | 0x11111111 (rdma-core's examples) | `qkey` |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectOptions {
    /// `None`: the port's active MTU.
    pub path_mtu: Option<Mtu>,
    /// How long the requester waits for an ACK before retransmitting,
    /// rounded up to IBA's 4.096 µs × 2^n; `None` waits for ever (timeout
    /// 0: a lost packet then stalls the QP, as on hardware).
    pub ack_timeout: Option<Duration>,
    /// Retransmissions after a timeout or sequence NAK (0..=7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK.
    pub rnr_retry: RnrRetry,
    /// The shortest RNR wait this QP's responder asks a peer for, rounded
    /// up to IBA's table (10 µs … 655 ms).
    pub min_rnr_timer: Duration,
    /// RDMA READs and atomics this QP may have outstanding (≥ 1 to issue
    /// any; the device's limit is 128).
    pub max_rd_atomic: u8,
    /// RDMA READs and atomics this QP serves at once for the peer.
    pub max_dest_rd_atomic: u8,
    /// The remote operations the peer may perform through this QP.
    pub access: AccessFlags,
    /// IP TTL / hop limit of what this QP sends.
    pub hop_limit: u8,
    /// IP traffic class (DSCP and ECN bits).
    pub traffic_class: u8,
    /// UD only: the Q_Key receives must carry.
    pub qkey: u32,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            path_mtu: None,
            ack_timeout: Some(Duration::from_nanos(4096 << 14)),
            retry_cnt: 7,
            rnr_retry: RnrRetry::Infinite,
            min_rnr_timer: Duration::from_micros(640),
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            access: AccessFlags::REMOTE_WRITE
                .union(AccessFlags::REMOTE_READ)
                .union(AccessFlags::REMOTE_ATOMIC),
            hop_limit: 64,
            traffic_class: 0,
            qkey: 0x1111_1111,
        }
    }
}

/// IBA's local ACK timeout exponent for `d`: the smallest n ≥ 1 with
/// 4.096 µs × 2^n ≥ d (at most 31); `None` → 0, "for ever".
pub fn ack_timeout_exponent(d: Option<Duration>) -> u8 {
    let Some(d) = d else { return 0 };
    let ns = d.as_nanos();
    (1..=31u8)
        .find(|&n| local_ack_timeout_ns(n).is_some_and(|t| t as u128 >= ns))
        .unwrap_or(31)
}

/// IBA's RNR timer code for `d`: the code of the shortest wait ≥ d (code 0,
/// 655.36 ms, the longest, when nothing shorter is long enough).
pub fn rnr_timer_code(d: Duration) -> u8 {
    let ns = d.as_nanos();
    (1..=31u8)
        .filter(|&c| rnr_timer_ns(c) as u128 >= ns)
        .min_by_key(|&c| rnr_timer_ns(c))
        .unwrap_or(0)
}

impl ConnectOptions {
    fn check(&self) -> Result<()> {
        let bad = |m| Err(Error::Verbs(CoreError::InvalidArgument(m)));
        if self.retry_cnt > 7 {
            return bad("retry_cnt is a 3-bit field (0..=7)");
        }
        if matches!(self.rnr_retry, RnrRetry::Count(n) if n > 6) {
            return bad("RnrRetry::Count takes 0..=6 (7 is RnrRetry::Infinite)");
        }
        Ok(())
    }
}

impl Qp {
    /// This QP as a peer needs it, without regions (add them with
    /// [`QpEndpoint::with_regions`]). Its PSN is the random one chosen when
    /// the QP was created, which [`Qp::connect`] starts sending from.
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            qp_type: self.qp_type,
            qpn: self.qpn,
            psn: self.psn,
            gid: self.gid,
            regions: Vec::new(),
        }
    }

    /// Modify to `to`, setting exactly the attributes IBA requires for the
    /// transition from the current state (taken from `attr`): the mask is
    /// inferred (`required_mask`), so none is written by hand.
    pub fn modify_to(&self, to: QpState, attr: &QpAttr) -> Result<()> {
        let (from, _, _) = self.query()?;
        let mask = required_mask(from, to, self.qp_type).ok_or(Error::Verbs(
            CoreError::InvalidArgument("no such QP state transition for this QP type"),
        ))?;
        let attr = QpAttr {
            qp_state: to,
            ..attr.clone()
        };
        self.modify(&attr, mask)
    }

    /// Connect this QP to `remote`: RESET → INIT → RTR → RTS with `opts`
    /// (RC and UC, and an XRC initiator to a target or back; a UD QP just
    /// becomes ready to send, `remote` naming nothing). From INIT or RTR it
    /// goes on from there. The QP sends from [`Qp::endpoint`]'s PSN and
    /// expects `remote.psn`.
    pub fn connect(&self, remote: &QpEndpoint, opts: &ConnectOptions) -> Result<()> {
        opts.check()?;
        let peer = match self.qp_type {
            QpType::XrcSend => QpType::XrcRecv,
            QpType::XrcRecv => QpType::XrcSend,
            t => t,
        };
        if self.qp_type != QpType::Ud && remote.qp_type != peer {
            return Err(CoreError::InvalidArgument(
                "the remote endpoint is of another QP type (RC connects to RC, UC to UC, \
                 XRC_SEND to XRC_RECV)",
            )
            .into());
        }
        let mut a = QpAttr {
            port_num: 1,
            qp_access_flags: opts.access,
            qkey: opts.qkey,
            path_mtu: opts.path_mtu.unwrap_or(self.port_mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: opts.max_dest_rd_atomic,
            min_rnr_timer: rnr_timer_code(opts.min_rnr_timer),
            sq_psn: self.psn,
            timeout: ack_timeout_exponent(opts.ack_timeout),
            retry_cnt: opts.retry_cnt,
            rnr_retry: match opts.rnr_retry {
                RnrRetry::Count(n) => n,
                RnrRetry::Infinite => 7,
            },
            max_rd_atomic: opts.max_rd_atomic,
            ..Default::default()
        };
        a.av.dgid = remote.gid;
        a.av.sgid_index = self.gid_index();
        a.av.hop_limit = opts.hop_limit;
        a.av.traffic_class = opts.traffic_class;
        let (mut state, _, _) = self.query()?;
        while state != QpState::Rts {
            let next = match state {
                QpState::Reset => QpState::Init,
                QpState::Init => QpState::Rtr,
                QpState::Rtr => QpState::Rts,
                _ => {
                    return Err(Error::Verbs(CoreError::InvalidState {
                        what: "connect a QP (it must be in RESET, INIT or RTR)",
                        state,
                    }))
                }
            };
            self.modify_to(next, &a)?;
            state = next;
        }
        Ok(())
    }
}
