//! Communication management MADs (IBA vol. 1, chapter 12) as the Linux
//! kernel's CM sends them over RoCEv2 to QP1, and the rdma_cm header its
//! `rdma_cm` puts at the start of a REQ's (or SIDR_REQ's) private data.
//!
//! A MAD is always 256 bytes: a 24-byte common header and 232 bytes of
//! message. Every message here is a value (`…Repr`) that parses from and
//! emits into a whole MAD (`&[u8; 256]`), so no length can be wrong and no
//! accessor can panic; [`parse`] reads any 256 bytes into a [`CmMsg`] or
//! says why not. Fields are big-endian, bit fields numbered from the most
//! significant bit of their byte, as in the IBA's tables.

use crate::field::*;
use crate::{Error, Result};

/// Bytes in a MAD.
pub const MAD_LEN: usize = 256;
/// Where a CM message starts in its MAD.
pub const DATA: usize = 24;

/// MAD base version, and the CM class and its version.
pub const BASE_VERSION: u8 = 1;
pub const MGMT_CLASS_CM: u8 = 0x07;
pub const CM_CLASS_VERSION: u8 = 2;
/// The only method CM messages use (`Send`).
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute IDs (IBA table 106).
pub mod attr {
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001a;
}

/// Private data each message carries (IBA 12.6).
pub mod private_len {
    pub const REQ: usize = 92;
    pub const MRA: usize = 222;
    pub const REJ: usize = 148;
    pub const REP: usize = 196;
    pub const RTU: usize = 224;
    pub const DREQ: usize = 220;
    pub const DREP: usize = 224;
    pub const SIDR_REQ: usize = 216;
    pub const SIDR_REP: usize = 136;
}

/// The common MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadHeader {
    pub base_version: u8,
    pub mgmt_class: u8,
    pub class_version: u8,
    pub method: u8,
    pub status: u16,
    pub class_specific: u16,
    pub tid: u64,
    pub attr_id: u16,
    pub attr_mod: u32,
}

impl MadHeader {
    /// A CM `Send` of `attr_id` with transaction ID `tid`.
    pub fn cm(attr_id: u16, tid: u64) -> MadHeader {
        MadHeader {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            tid,
            attr_id,
            ..Default::default()
        }
    }

    pub fn parse(m: &[u8; MAD_LEN]) -> MadHeader {
        MadHeader {
            base_version: m[0],
            mgmt_class: m[1],
            class_version: m[2],
            method: m[3],
            status: u16_at(m, 4),
            class_specific: u16_at(m, 6),
            tid: u64_at(m, 8),
            attr_id: u16_at(m, 16),
            attr_mod: u32_at(m, 20),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[..DATA].fill(0);
        m[0] = self.base_version;
        m[1] = self.mgmt_class;
        m[2] = self.class_version;
        m[3] = self.method;
        put_u16(m, 4, self.status);
        put_u16(m, 6, self.class_specific);
        put_u64(m, 8, self.tid);
        put_u16(m, 16, self.attr_id);
        put_u32(m, 20, self.attr_mod);
    }
}

/// Private data: the bytes a message carries and how many of them are
/// meaningful to the sender (the wire always carries the whole field,
/// zero-padded; the length is not on the wire).
pub type Private<const N: usize> = [u8; N];

fn private<const N: usize>(m: &[u8; MAD_LEN], at: usize) -> [u8; N] {
    let mut p = [0u8; N];
    p.copy_from_slice(&m[DATA + at..DATA + at + N]);
    p
}

fn put_private<const N: usize>(m: &mut [u8; MAD_LEN], at: usize, p: &[u8; N]) {
    m[DATA + at..DATA + at + N].copy_from_slice(p);
}

/// A bit field of `width` bits whose most significant bit is bit `msb`
/// (7 = the byte's top bit) of byte `at`.
fn bits(b: u8, msb: u8, width: u8) -> u8 {
    (b >> (msb + 1 - width)) & ((1u16 << width) - 1) as u8
}

fn set_bits(b: &mut u8, msb: u8, width: u8, v: u8) {
    let shift = msb + 1 - width;
    let mask = (((1u16 << width) - 1) as u8) << shift;
    *b = (*b & !mask) | ((v << shift) & mask);
}

/// A path in a REQ (primary or alternate; IBA table 99).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathRepr {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits (IBA rate encoding).
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// 5 bits: 4.096 µs × 2^n.
    pub local_ack_timeout: u8,
}

impl PathRepr {
    const LEN: usize = 44;

    fn parse(m: &[u8; MAD_LEN], at: usize) -> PathRepr {
        let o = DATA + at;
        let mut lg = [0u8; 16];
        lg.copy_from_slice(&m[o + 4..o + 20]);
        let mut rg = [0u8; 16];
        rg.copy_from_slice(&m[o + 20..o + 36]);
        let w = u32_at(m, o + 36);
        PathRepr {
            local_lid: u16_at(m, o),
            remote_lid: u16_at(m, o + 2),
            local_gid: lg,
            remote_gid: rg,
            flow_label: w >> 12,
            packet_rate: (w & 0x3f) as u8,
            traffic_class: m[o + 40],
            hop_limit: m[o + 41],
            sl: bits(m[o + 42], 7, 4),
            subnet_local: bits(m[o + 42], 3, 1) != 0,
            local_ack_timeout: bits(m[o + 43], 7, 5),
        }
    }

    fn emit(&self, m: &mut [u8; MAD_LEN], at: usize) {
        let o = DATA + at;
        m[o..o + Self::LEN].fill(0);
        put_u16(m, o, self.local_lid);
        put_u16(m, o + 2, self.remote_lid);
        m[o + 4..o + 20].copy_from_slice(&self.local_gid);
        m[o + 20..o + 36].copy_from_slice(&self.remote_gid);
        put_u32(
            m,
            o + 36,
            (self.flow_label & 0xf_ffff) << 12 | (self.packet_rate & 0x3f) as u32,
        );
        m[o + 40] = self.traffic_class;
        m[o + 41] = self.hop_limit;
        set_bits(&mut m[o + 42], 7, 4, self.sl);
        set_bits(&mut m[o + 42], 3, 1, self.subnet_local as u8);
        set_bits(&mut m[o + 43], 7, 5, self.local_ack_timeout);
    }
}

/// Transport service types of a REQ.
pub mod service_type {
    pub const RC: u8 = 0;
    pub const UC: u8 = 1;
    pub const RD: u8 = 2;

    /// "RC", "UC" or "RD"; None for the reserved value 3.
    pub fn name(t: u8) -> Option<&'static str> {
        match t {
            RC => Some("RC"),
            UC => Some("UC"),
            RD => Some("RD"),
            _ => None,
        }
    }
}

/// The bytes of an IB path MTU code (1 = 256 … 5 = 4096); None for the
/// reserved codes.
pub fn path_mtu_bytes(code: u8) -> Option<u32> {
    (1..=5).contains(&code).then(|| 128 << code)
}

/// ConnectRequest (IBA table 99).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRepr {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits each: 4.096 µs × 2^n.
    pub remote_cm_response_timeout: u8,
    pub local_cm_response_timeout: u8,
    /// 2 bits ([`service_type`]).
    pub transport_service_type: u8,
    pub flow_control: bool,
    /// 24 bits.
    pub starting_psn: u32,
    /// 3 bits each.
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub pkey: u16,
    /// 4 bits (IB MTU code: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    pub srq: bool,
    pub primary: PathRepr,
    pub alternate: PathRepr,
    pub private: Private<{ private_len::REQ }>,
}

impl ReqRepr {
    pub fn parse(m: &[u8; MAD_LEN]) -> ReqRepr {
        let d = |i: usize| m[DATA + i];
        ReqRepr {
            local_comm_id: u32_at(m, DATA),
            service_id: u64_at(m, DATA + 8),
            local_ca_guid: u64_at(m, DATA + 16),
            local_qkey: u32_at(m, DATA + 28),
            local_qpn: u24_at(m, DATA + 32),
            responder_resources: d(35),
            initiator_depth: d(39),
            remote_cm_response_timeout: bits(d(43), 7, 5),
            transport_service_type: bits(d(43), 2, 2),
            flow_control: bits(d(43), 0, 1) != 0,
            starting_psn: u24_at(m, DATA + 44),
            local_cm_response_timeout: bits(d(47), 7, 5),
            retry_count: bits(d(47), 2, 3),
            pkey: u16_at(m, DATA + 48),
            path_mtu: bits(d(50), 7, 4),
            rnr_retry_count: bits(d(50), 2, 3),
            max_cm_retries: bits(d(51), 7, 4),
            srq: bits(d(51), 3, 1) != 0,
            primary: PathRepr::parse(m, 52),
            alternate: PathRepr::parse(m, 96),
            private: private(m, 140),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[DATA..].fill(0);
        put_u32(m, DATA, self.local_comm_id);
        put_u64(m, DATA + 8, self.service_id);
        put_u64(m, DATA + 16, self.local_ca_guid);
        put_u32(m, DATA + 28, self.local_qkey);
        put_u24(m, DATA + 32, self.local_qpn & 0xff_ffff);
        m[DATA + 35] = self.responder_resources;
        m[DATA + 39] = self.initiator_depth;
        let b = &mut m[DATA + 43];
        set_bits(b, 7, 5, self.remote_cm_response_timeout);
        set_bits(b, 2, 2, self.transport_service_type);
        set_bits(b, 0, 1, self.flow_control as u8);
        put_u24(m, DATA + 44, self.starting_psn & 0xff_ffff);
        let b = &mut m[DATA + 47];
        set_bits(b, 7, 5, self.local_cm_response_timeout);
        set_bits(b, 2, 3, self.retry_count);
        put_u16(m, DATA + 48, self.pkey);
        let b = &mut m[DATA + 50];
        set_bits(b, 7, 4, self.path_mtu);
        set_bits(b, 2, 3, self.rnr_retry_count);
        let b = &mut m[DATA + 51];
        set_bits(b, 7, 4, self.max_cm_retries);
        set_bits(b, 3, 1, self.srq as u8);
        self.primary.emit(m, 52);
        self.alternate.emit(m, 96);
        put_private(m, 140, &self.private);
    }
}

/// ConnectReply (IBA table 103).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// 24 bits.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    pub flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private: Private<{ private_len::REP }>,
}

impl RepRepr {
    pub fn parse(m: &[u8; MAD_LEN]) -> RepRepr {
        let d = |i: usize| m[DATA + i];
        RepRepr {
            local_comm_id: u32_at(m, DATA),
            remote_comm_id: u32_at(m, DATA + 4),
            local_qkey: u32_at(m, DATA + 8),
            local_qpn: u24_at(m, DATA + 12),
            starting_psn: u24_at(m, DATA + 20),
            responder_resources: d(24),
            initiator_depth: d(25),
            target_ack_delay: bits(d(26), 7, 5),
            failover_accepted: bits(d(26), 2, 2),
            flow_control: bits(d(26), 0, 1) != 0,
            rnr_retry_count: bits(d(27), 7, 3),
            srq: bits(d(27), 4, 1) != 0,
            local_ca_guid: u64_at(m, DATA + 28),
            private: private(m, 36),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[DATA..].fill(0);
        put_u32(m, DATA, self.local_comm_id);
        put_u32(m, DATA + 4, self.remote_comm_id);
        put_u32(m, DATA + 8, self.local_qkey);
        put_u24(m, DATA + 12, self.local_qpn & 0xff_ffff);
        put_u24(m, DATA + 20, self.starting_psn & 0xff_ffff);
        m[DATA + 24] = self.responder_resources;
        m[DATA + 25] = self.initiator_depth;
        let b = &mut m[DATA + 26];
        set_bits(b, 7, 5, self.target_ack_delay);
        set_bits(b, 2, 2, self.failover_accepted);
        set_bits(b, 0, 1, self.flow_control as u8);
        let b = &mut m[DATA + 27];
        set_bits(b, 7, 3, self.rnr_retry_count);
        set_bits(b, 4, 1, self.srq as u8);
        put_u64(m, DATA + 28, self.local_ca_guid);
        put_private(m, 36, &self.private);
    }
}

/// Which message a REJ or MRA answers.
pub mod msg_kind {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
    pub const OTHER: u8 = 2;

    /// "REQ", "REP" or "other"; None for the reserved value 3.
    pub fn name(k: u8) -> Option<&'static str> {
        match k {
            REQ => Some("REQ"),
            REP => Some("REP"),
            OTHER => Some("other"),
            _ => None,
        }
    }
}

/// REJ reasons (IBA table 112; the kernel's `enum ib_cm_rej_reason`).
pub mod rej_reason {
    pub const NO_QP: u16 = 1;
    pub const NO_EEC: u16 = 2;
    pub const NO_RESOURCES: u16 = 3;
    pub const TIMEOUT: u16 = 4;
    pub const UNSUPPORTED: u16 = 5;
    pub const INVALID_COMM_ID: u16 = 6;
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    pub const STALE_CONN: u16 = 10;
    pub const CONSUMER_REJECT: u16 = 28;
    pub const INVALID_RNR_RETRY: u16 = 29;
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    pub const INVALID_CLASS_VERSION: u16 = 31;

    /// The kernel's words for a reason (`ibcm_reject_msg()`,
    /// drivers/infiniband/core/cm.c); None for a value it does not name.
    pub fn name(r: u16) -> Option<&'static str> {
        Some(match r {
            1 => "no QP",
            2 => "no EEC",
            3 => "no resources",
            4 => "timeout",
            5 => "unsupported",
            6 => "invalid comm ID",
            7 => "invalid comm instance",
            8 => "invalid service ID",
            9 => "invalid transport type",
            10 => "stale conn",
            11 => "RDC not exist",
            12 => "invalid GID",
            13 => "invalid LID",
            14 => "invalid SL",
            15 => "invalid traffic class",
            16 => "invalid hop limit",
            17 => "invalid packet rate",
            18 => "invalid alt GID",
            19 => "invalid alt LID",
            20 => "invalid alt SL",
            21 => "invalid alt traffic class",
            22 => "invalid alt hop limit",
            23 => "invalid alt packet rate",
            24 => "port CM redirect",
            25 => "port redirect",
            26 => "invalid MTU",
            27 => "insufficient resp resources",
            28 => "consumer defined",
            29 => "invalid RNR retry",
            30 => "duplicate local comm ID",
            31 => "invalid class version",
            32 => "invalid flow label",
            33 => "invalid alt flow label",
            35 => "vendor option is not supported",
            _ => return None,
        })
    }
}

/// Reject (IBA table 111).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits ([`msg_kind`]).
    pub msg_rejected: u8,
    /// 7 bits.
    pub reject_info_length: u8,
    pub reason: u16,
    pub ari: [u8; 72],
    pub private: Private<{ private_len::REJ }>,
}

impl RejRepr {
    pub fn parse(m: &[u8; MAD_LEN]) -> RejRepr {
        RejRepr {
            local_comm_id: u32_at(m, DATA),
            remote_comm_id: u32_at(m, DATA + 4),
            msg_rejected: bits(m[DATA + 8], 7, 2),
            reject_info_length: bits(m[DATA + 9], 7, 7),
            reason: u16_at(m, DATA + 10),
            ari: private(m, 12),
            private: private(m, 84),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[DATA..].fill(0);
        put_u32(m, DATA, self.local_comm_id);
        put_u32(m, DATA + 4, self.remote_comm_id);
        set_bits(&mut m[DATA + 8], 7, 2, self.msg_rejected);
        set_bits(&mut m[DATA + 9], 7, 7, self.reject_info_length);
        put_u16(m, DATA + 10, self.reason);
        put_private(m, 12, &self.ari);
        put_private(m, 84, &self.private);
    }
}

/// MessageReceiptAcknowledgement (IBA table 102).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MraRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits ([`msg_kind`]).
    pub msg_mraed: u8,
    /// 5 bits: 4.096 µs × 2^n.
    pub service_timeout: u8,
    pub private: Private<{ private_len::MRA }>,
}

impl MraRepr {
    pub fn parse(m: &[u8; MAD_LEN]) -> MraRepr {
        MraRepr {
            local_comm_id: u32_at(m, DATA),
            remote_comm_id: u32_at(m, DATA + 4),
            msg_mraed: bits(m[DATA + 8], 7, 2),
            service_timeout: bits(m[DATA + 9], 7, 5),
            private: private(m, 10),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[DATA..].fill(0);
        put_u32(m, DATA, self.local_comm_id);
        put_u32(m, DATA + 4, self.remote_comm_id);
        set_bits(&mut m[DATA + 8], 7, 2, self.msg_mraed);
        set_bits(&mut m[DATA + 9], 7, 5, self.service_timeout);
        put_private(m, 10, &self.private);
    }
}

/// ReadyToUse (RTU, IBA table 105) and DisconnectReply (DREP, table 110):
/// two communication IDs and private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdsRepr<const N: usize> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private: Private<N>,
}

pub type RtuRepr = IdsRepr<{ private_len::RTU }>;
pub type DrepRepr = IdsRepr<{ private_len::DREP }>;

impl<const N: usize> IdsRepr<N> {
    pub fn parse(m: &[u8; MAD_LEN]) -> Self {
        IdsRepr {
            local_comm_id: u32_at(m, DATA),
            remote_comm_id: u32_at(m, DATA + 4),
            private: private(m, 8),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[DATA..].fill(0);
        put_u32(m, DATA, self.local_comm_id);
        put_u32(m, DATA + 4, self.remote_comm_id);
        put_private(m, 8, &self.private);
    }
}

/// DisconnectRequest (IBA table 109).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DreqRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits.
    pub remote_qpn: u32,
    pub private: Private<{ private_len::DREQ }>,
}

impl DreqRepr {
    pub fn parse(m: &[u8; MAD_LEN]) -> DreqRepr {
        DreqRepr {
            local_comm_id: u32_at(m, DATA),
            remote_comm_id: u32_at(m, DATA + 4),
            remote_qpn: u24_at(m, DATA + 8),
            private: private(m, 12),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[DATA..].fill(0);
        put_u32(m, DATA, self.local_comm_id);
        put_u32(m, DATA + 4, self.remote_comm_id);
        put_u24(m, DATA + 8, self.remote_qpn & 0xff_ffff);
        put_private(m, 12, &self.private);
    }
}

/// ServiceIDResolutionRequest (IBA table 114).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReqRepr {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private: Private<{ private_len::SIDR_REQ }>,
}

impl SidrReqRepr {
    pub fn parse(m: &[u8; MAD_LEN]) -> SidrReqRepr {
        SidrReqRepr {
            request_id: u32_at(m, DATA),
            pkey: u16_at(m, DATA + 4),
            service_id: u64_at(m, DATA + 8),
            private: private(m, 16),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[DATA..].fill(0);
        put_u32(m, DATA, self.request_id);
        put_u16(m, DATA + 4, self.pkey);
        put_u64(m, DATA + 8, self.service_id);
        put_private(m, 16, &self.private);
    }
}

/// SIDR_REP status values (IBA table 116).
pub mod sidr_status {
    pub const SUCCESS: u8 = 0;
    pub const UNSUPPORTED: u8 = 1;
    pub const REJECT: u8 = 2;
    pub const NO_QP: u8 = 3;
    pub const REDIRECT: u8 = 4;
    pub const UNSUPPORTED_VERSION: u8 = 5;

    /// What a status means (IBA table 116, in the kernel's
    /// `enum ib_cm_sidr_status` terms); None for a reserved value.
    pub fn name(s: u8) -> Option<&'static str> {
        Some(match s {
            SUCCESS => "success",
            UNSUPPORTED => "unsupported service ID",
            REJECT => "rejected",
            NO_QP => "no QP",
            REDIRECT => "redirect",
            UNSUPPORTED_VERSION => "unsupported version",
            _ => return None,
        })
    }
}

/// ServiceIDResolutionResponse (IBA table 115).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRepRepr {
    pub request_id: u32,
    pub status: u8,
    pub add_info_length: u8,
    /// 24 bits.
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub class_port_info: [u8; 72],
    pub private: Private<{ private_len::SIDR_REP }>,
}

impl SidrRepRepr {
    pub fn parse(m: &[u8; MAD_LEN]) -> SidrRepRepr {
        SidrRepRepr {
            request_id: u32_at(m, DATA),
            status: m[DATA + 4],
            add_info_length: m[DATA + 5],
            qpn: u24_at(m, DATA + 8),
            service_id: u64_at(m, DATA + 12),
            qkey: u32_at(m, DATA + 20),
            class_port_info: private(m, 24),
            private: private(m, 96),
        }
    }

    pub fn emit(&self, m: &mut [u8; MAD_LEN]) {
        m[DATA..].fill(0);
        put_u32(m, DATA, self.request_id);
        m[DATA + 4] = self.status;
        m[DATA + 5] = self.add_info_length;
        put_u24(m, DATA + 8, self.qpn & 0xff_ffff);
        put_u64(m, DATA + 12, self.service_id);
        put_u32(m, DATA + 20, self.qkey);
        put_private(m, 24, &self.class_port_info);
        put_private(m, 96, &self.private);
    }
}

/// A CM message read from a MAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMsg {
    Req(Box<ReqRepr>),
    Mra(Box<MraRepr>),
    Rej(Box<RejRepr>),
    Rep(Box<RepRepr>),
    Rtu(Box<RtuRepr>),
    Dreq(Box<DreqRepr>),
    Drep(Box<DrepRepr>),
    SidrReq(Box<SidrReqRepr>),
    SidrRep(Box<SidrRepRepr>),
    /// A CM attribute this stack does not act on (LAP, APR,
    /// ClassPortInfo): its ID.
    Other(u16),
}

/// Read a MAD as a CM message. Errors: not the CM class, not CM class
/// version 2, not a `Send`.
pub fn parse(m: &[u8; MAD_LEN]) -> Result<(MadHeader, CmMsg)> {
    let h = MadHeader::parse(m);
    let bad = |what, value: u8| {
        Err(Error::BadField {
            what,
            value: value as u64,
        })
    };
    if h.base_version != BASE_VERSION {
        return bad("MAD base version", h.base_version);
    }
    if h.mgmt_class != MGMT_CLASS_CM {
        return bad("MAD management class (not CM)", h.mgmt_class);
    }
    if h.class_version != CM_CLASS_VERSION {
        return bad("CM class version", h.class_version);
    }
    if h.method != METHOD_SEND {
        return bad("CM method (not Send)", h.method);
    }
    let msg = match h.attr_id {
        attr::REQ => CmMsg::Req(Box::new(ReqRepr::parse(m))),
        attr::MRA => CmMsg::Mra(Box::new(MraRepr::parse(m))),
        attr::REJ => CmMsg::Rej(Box::new(RejRepr::parse(m))),
        attr::REP => CmMsg::Rep(Box::new(RepRepr::parse(m))),
        attr::RTU => CmMsg::Rtu(Box::new(RtuRepr::parse(m))),
        attr::DREQ => CmMsg::Dreq(Box::new(DreqRepr::parse(m))),
        attr::DREP => CmMsg::Drep(Box::new(DrepRepr::parse(m))),
        attr::SIDR_REQ => CmMsg::SidrReq(Box::new(SidrReqRepr::parse(m))),
        attr::SIDR_REP => CmMsg::SidrRep(Box::new(SidrRepRepr::parse(m))),
        other => CmMsg::Other(other),
    };
    Ok((h, msg))
}

impl CmMsg {
    /// The attribute ID this message is sent as.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Mra(_) => attr::MRA,
            CmMsg::Rej(_) => attr::REJ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu(_) => attr::RTU,
            CmMsg::Dreq(_) => attr::DREQ,
            CmMsg::Drep(_) => attr::DREP,
            CmMsg::SidrReq(_) => attr::SIDR_REQ,
            CmMsg::SidrRep(_) => attr::SIDR_REP,
            CmMsg::Other(a) => *a,
        }
    }

    /// The whole MAD: a CM `Send` with transaction ID `tid`.
    pub fn emit(&self, tid: u64) -> [u8; MAD_LEN] {
        let mut m = [0u8; MAD_LEN];
        MadHeader::cm(self.attr_id(), tid).emit(&mut m);
        match self {
            CmMsg::Req(r) => r.emit(&mut m),
            CmMsg::Mra(r) => r.emit(&mut m),
            CmMsg::Rej(r) => r.emit(&mut m),
            CmMsg::Rep(r) => r.emit(&mut m),
            CmMsg::Rtu(r) => r.emit(&mut m),
            CmMsg::Dreq(r) => r.emit(&mut m),
            CmMsg::Drep(r) => r.emit(&mut m),
            CmMsg::SidrReq(r) => r.emit(&mut m),
            CmMsg::SidrRep(r) => r.emit(&mut m),
            CmMsg::Other(_) => {}
        }
        m
    }

    /// A name for logs and the decoder.
    pub fn name(&self) -> &'static str {
        attr_name(self.attr_id())
    }
}

/// The name of a CM attribute.
pub fn attr_name(a: u16) -> &'static str {
    known_attr_name(a).unwrap_or("unknown CM attribute")
}

/// The name of a CM attribute the IBA defines; None for any other value.
pub fn known_attr_name(a: u16) -> Option<&'static str> {
    Some(match a {
        attr::CLASS_PORT_INFO => "ClassPortInfo",
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LAP",
        attr::APR => "APR",
        _ => return None,
    })
}

/// rdma_cm's service IDs: port space in bits 16..32, port in 0..16
/// (`RDMA_IB_IP_PS_*`).
pub mod service {
    pub const PS_TCP: u16 = 0x0106;
    pub const PS_UDP: u16 = 0x0111;
    pub const PS_IB: u16 = 0x013f;
    pub const PS_IPOIB: u16 = 0x0002;

    /// The service ID of `port` in port space `ps`.
    pub fn id(ps: u16, port: u16) -> u64 {
        (ps as u64) << 16 | port as u64
    }

    /// (port space, port) of an rdma_cm service ID; None if the ID is not
    /// one of rdma_cm's.
    pub fn split(id: u64) -> Option<(u16, u16)> {
        (id >> 32 == 0).then_some(((id >> 16) as u16, id as u16))
    }

    /// The name rdma_cm gives a port space (`enum rdma_ucm_port_space`);
    /// None for one it does not define.
    pub fn ps_name(ps: u16) -> Option<&'static str> {
        match ps {
            PS_TCP => Some("RDMA_PS_TCP"),
            PS_UDP => Some("RDMA_PS_UDP"),
            PS_IB => Some("RDMA_PS_IB"),
            PS_IPOIB => Some("RDMA_PS_IPOIB"),
            _ => None,
        }
    }

    /// (port space name, port) of a service ID in one of rdma_cm's port
    /// spaces; None for any other service ID.
    pub fn rdma_cm(id: u64) -> Option<(&'static str, u16)> {
        let (ps, port) = split(id)?;
        Some((ps_name(ps)?, port))
    }
}

/// The header rdma_cm prepends to a REQ's or SIDR_REQ's private data
/// (`struct cma_hdr`, 36 bytes): version 0, IP version, the active side's
/// port, its address and the address it connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHdr {
    pub src: std::net::SocketAddr,
    pub dst: std::net::IpAddr,
}

impl CmaHdr {
    pub const LEN: usize = 36;
    pub const VERSION: u8 = 0x00;

    pub fn parse(p: &[u8]) -> Result<CmaHdr> {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
        crate::check_len("rdma_cm header", p, Self::LEN)?;
        if p[0] != Self::VERSION {
            return Err(Error::BadField {
                what: "rdma_cm header version",
                value: p[0] as u64,
            });
        }
        let port = u16_at(p, 2);
        let (src, dst): (IpAddr, IpAddr) = match p[1] >> 4 {
            4 => (
                Ipv4Addr::new(p[16], p[17], p[18], p[19]).into(),
                Ipv4Addr::new(p[32], p[33], p[34], p[35]).into(),
            ),
            6 => {
                let mut s = [0u8; 16];
                s.copy_from_slice(&p[4..20]);
                let mut d = [0u8; 16];
                d.copy_from_slice(&p[20..36]);
                (Ipv6Addr::from(s).into(), Ipv6Addr::from(d).into())
            }
            v => return Err(Error::BadIpVersion(v)),
        };
        Ok(CmaHdr {
            src: SocketAddr::new(src, port),
            dst,
        })
    }

    /// Write the header into the first 36 bytes of `p` (a programming
    /// error if shorter, or if the two addresses are of different
    /// families: panics).
    pub fn emit(&self, p: &mut [u8]) {
        use std::net::IpAddr;
        let p = &mut p[..Self::LEN];
        p.fill(0);
        p[0] = Self::VERSION;
        put_u16(p, 2, self.src.port());
        match (self.src.ip(), self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                p[1] = 4 << 4;
                p[16..20].copy_from_slice(&s.octets());
                p[32..36].copy_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                p[1] = 6 << 4;
                p[4..20].copy_from_slice(&s.octets());
                p[20..36].copy_from_slice(&d.octets());
            }
            _ => panic!("rdma_cm header with addresses of two families"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_req() -> ReqRepr {
        let mut private = [0u8; private_len::REQ];
        private[..4].copy_from_slice(b"abcd");
        ReqRepr {
            local_comm_id: 0x0301_0203,
            service_id: service::id(service::PS_TCP, 7174),
            local_ca_guid: 0x0200_00ff_fe00_0001,
            local_qkey: 0,
            local_qpn: 0x01_0100,
            responder_resources: 16,
            initiator_depth: 16,
            remote_cm_response_timeout: 20,
            local_cm_response_timeout: 20,
            transport_service_type: service_type::RC,
            flow_control: true,
            starting_psn: 0xab_cdef,
            retry_count: 7,
            rnr_retry_count: 7,
            pkey: 0xffff,
            path_mtu: 5,
            max_cm_retries: 15,
            srq: false,
            primary: PathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: [1; 16],
                remote_gid: [2; 16],
                flow_label: 0xf_1234,
                packet_rate: 0x3f,
                traffic_class: 0x48,
                hop_limit: 64,
                sl: 0xa,
                subnet_local: true,
                local_ack_timeout: 18,
            },
            alternate: PathRepr::default(),
            private,
        }
    }

    #[test]
    fn every_message_round_trips() {
        let req = sample_req();
        let msgs = [
            CmMsg::Req(Box::new(req)),
            CmMsg::Rep(Box::new(RepRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                local_qkey: 3,
                local_qpn: 0xfe_dcba,
                starting_psn: 0x12_3456,
                responder_resources: 4,
                initiator_depth: 5,
                target_ack_delay: 31,
                failover_accepted: 3,
                flow_control: true,
                rnr_retry_count: 6,
                srq: true,
                local_ca_guid: 7,
                private: [9; private_len::REP],
            })),
            CmMsg::Rej(Box::new(RejRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                msg_rejected: msg_kind::REP,
                reject_info_length: 72,
                reason: rej_reason::CONSUMER_REJECT,
                ari: [3; 72],
                private: [4; private_len::REJ],
            })),
            CmMsg::Mra(Box::new(MraRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                msg_mraed: msg_kind::REQ,
                service_timeout: 21,
                private: [5; private_len::MRA],
            })),
            CmMsg::Rtu(Box::new(RtuRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                private: [6; private_len::RTU],
            })),
            CmMsg::Dreq(Box::new(DreqRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn: 0x12,
                private: [7; private_len::DREQ],
            })),
            CmMsg::Drep(Box::new(DrepRepr {
                local_comm_id: 1,
                remote_comm_id: 2,
                private: [8; private_len::DREP],
            })),
            CmMsg::SidrReq(Box::new(SidrReqRepr {
                request_id: 1,
                pkey: 0xffff,
                service_id: service::id(service::PS_UDP, 7174),
                private: [9; private_len::SIDR_REQ],
            })),
            CmMsg::SidrRep(Box::new(SidrRepRepr {
                request_id: 1,
                status: sidr_status::SUCCESS,
                add_info_length: 0,
                qpn: 0x11_2233,
                service_id: 5,
                qkey: 0x0123_4567,
                class_port_info: [1; 72],
                private: [2; private_len::SIDR_REP],
            })),
        ];
        for m in msgs {
            let bytes = m.emit(0x1122_3344_5566_7788);
            let (h, back) = parse(&bytes).expect("parses");
            assert_eq!(h.tid, 0x1122_3344_5566_7788);
            assert_eq!(h.attr_id, m.attr_id());
            assert_eq!(back, m, "{}", m.name());
        }
    }

    #[test]
    fn req_fields_sit_where_the_iba_puts_them() {
        let m = CmMsg::Req(Box::new(sample_req())).emit(1);
        // Offsets in the MAD (header 24 bytes, then IBA table 99's).
        assert_eq!(&m[0..4], &[1, 0x07, 2, 0x03]);
        assert_eq!(&m[16..18], &[0x00, 0x10]);
        assert_eq!(&m[24..28], &[0x03, 0x01, 0x02, 0x03]);
        assert_eq!(&m[32..40], &[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]);
        assert_eq!(&m[56..60], &[0x01, 0x01, 0x00, 16]); // QPN, responder resources
        assert_eq!(m[63], 16); // initiator depth
        assert_eq!(m[67], 20 << 3 | 1); // remote CM timeout, RC, flow control
        assert_eq!(&m[68..72], &[0xab, 0xcd, 0xef, 20 << 3 | 7]);
        assert_eq!(&m[72..76], &[0xff, 0xff, 5 << 4 | 7, 15 << 4]);
        assert_eq!(&m[76..80], &[0xff, 0xff, 0xff, 0xff]); // LIDs
        assert_eq!(&m[80..96], &[1; 16]);
        assert_eq!(&m[96..112], &[2; 16]);
        assert_eq!(&m[112..116], &[0xf1, 0x23, 0x40, 0x3f]);
        assert_eq!(&m[116..120], &[0x48, 64, 0xa << 4 | 1 << 3, 18 << 3]);
        assert_eq!(&m[164..168], b"abcd");
    }

    #[test]
    fn not_a_cm_send_is_refused() {
        let mut m = CmMsg::Rtu(Box::new(RtuRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            private: [0; private_len::RTU],
        }))
        .emit(1);
        m[3] = 0x01; // Get
        assert!(parse(&m).is_err());
        m[3] = METHOD_SEND;
        m[1] = 0x03; // SA
        assert!(parse(&m).is_err());
    }

    #[test]
    fn names_for_the_decoder() {
        assert_eq!(
            rej_reason::name(rej_reason::CONSUMER_REJECT),
            Some("consumer defined")
        );
        assert_eq!(
            rej_reason::name(rej_reason::INVALID_SERVICE_ID),
            Some("invalid service ID")
        );
        assert_eq!(rej_reason::name(34), None);
        assert_eq!(rej_reason::name(0), None);
        assert_eq!(sidr_status::name(sidr_status::SUCCESS), Some("success"));
        assert_eq!(sidr_status::name(6), None);
        assert_eq!(msg_kind::name(msg_kind::REP), Some("REP"));
        assert_eq!(msg_kind::name(3), None);
        assert_eq!(service_type::name(service_type::UC), Some("UC"));
        assert_eq!(service_type::name(3), None);
        let mtus: Vec<_> = (0..=6).map(path_mtu_bytes).collect();
        assert_eq!(
            mtus,
            [
                None,
                Some(256),
                Some(512),
                Some(1024),
                Some(2048),
                Some(4096),
                None
            ]
        );
        assert_eq!(
            service::rdma_cm(service::id(service::PS_TCP, 7174)),
            Some(("RDMA_PS_TCP", 7174))
        );
        assert_eq!(
            service::rdma_cm(service::id(service::PS_IPOIB, 1)),
            Some(("RDMA_PS_IPOIB", 1))
        );
        assert_eq!(service::rdma_cm(service::id(0x0107, 1)), None);
        assert_eq!(service::rdma_cm(1 << 32 | 0x0106_0001), None);
        assert_eq!(known_attr_name(attr::LAP), Some("LAP"));
        assert_eq!(known_attr_name(0x30), None);
        assert_eq!(attr_name(0x30), "unknown CM attribute");
    }

    #[test]
    fn cma_header_round_trips() {
        for (src, dst) in [("10.0.0.1:40000", "10.0.0.2"), ("[fe80::1]:5", "fe80::2")] {
            let h = CmaHdr {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
            };
            let mut p = [0u8; 56];
            h.emit(&mut p);
            assert_eq!(CmaHdr::parse(&p).unwrap(), h);
        }
        let mut p = [0u8; 36];
        CmaHdr {
            src: "10.91.47.12:1234".parse().unwrap(),
            dst: "10.91.47.11".parse().unwrap(),
        }
        .emit(&mut p);
        assert_eq!(&p[..4], &[0, 0x40, 0x04, 0xd2]);
        assert_eq!(&p[16..20], &[10, 91, 47, 12]);
        assert_eq!(&p[32..36], &[10, 91, 47, 11]);
        assert!(CmaHdr::parse(&p[..35]).is_err());
    }
}
