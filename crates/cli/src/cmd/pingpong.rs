//! `softrdma pingpong --transport rc|uc|ud`: libibverbs' example programs
//! `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong` on softrdma,
//! so that either end can be the real binary.
//!
//! What is the same as rdma-core's (libibverbs/examples/*_pingpong.c):
//!
//! * the flags and their defaults (`-p 18515 -i 1 -s 4096 -m 1024 -r 500
//!   -n 1000 -l 0 -e -g -c`; UD's default size is 1024, as rdma-core's code
//!   has it since 2019 — its usage text still says 2048 — and must fit the
//!   port MTU);
//! * the out-of-band exchange on TCP: the client writes its 52-byte record
//!   `"%04x:%06x:%06x:%s\0"` (LID, QPN, PSN, GID as 32 hex digits of its four
//!   big-endian words), the server connects its QP, answers with its own
//!   record, and the client writes `"done\0"`;
//! * the QP attributes (RC: `max_dest_rd_atomic` 1, `min_rnr_timer` 12,
//!   timeout 14, retry 7, RNR retry 7, `max_rd_atomic` 1, hop limit 1; UC:
//!   PSNs only; UD: Q_Key 0x11111111, a GRH on every receive);
//! * the traffic: one buffer (filled with 0x7b) that every message is sent
//!   from and received into, `rx_depth` receives kept posted, one send in
//!   flight, the client sending first, each side sending its next message
//!   once its previous send and a new receive have completed;
//! * the output lines, byte for byte, including UD's `PSN 0x%06x: GID`;
//! * `-c`: the client puts 0 in the first byte of every page of the
//!   buffer, and the side without a host checks the buffer at the end,
//!   printing `invalid data in page N`.
//!
//! Where softrdma differs, and why:
//!
//! * RoCE needs a GID; a softrdma device has one (index 0) and always sends
//!   it, `-g` or not. A peer whose record has no GID (a real binary run
//!   without `-g`) cannot be reached: that is reported, and the run fails.
//! * With no `-d`, the client picks the device whose address routes to the
//!   server, and the server the device its client's TCP connection arrived
//!   on (so it prints its local address once the client has connected).
//! * `-c` checks every byte of the buffer, not only the first of each page,
//!   and also at the client (the server echoes the client's bytes back);
//!   bad data makes the exit status 1.
//! * `--fault` (not in rdma-core) impairs what this side sends, as `perf
//!   --fault` does; the interop suite's loss runs against rxe use it.
//! * RC lingers: after its last completion it keeps the QP answering until
//!   no packet has arrived for two retransmission periods (134 ms), so a
//!   peer whose final ACK was lost gets it again instead of retrying into
//!   a destroyed QP (`Pp::linger`).
//! * A client retries connecting for a few seconds while the server
//!   starts; a run in which no completion arrives for a minute gives up
//!   instead of hanging.
//! * `-R` (not in rdma-core's programs; perftest's flag): the QP connects
//!   through rdma_cm instead of the TCP exchange — RC and UC by
//!   `rdma_connect`/`rdma_accept` to the server's port `-p` (rdma_cm picks
//!   the PSNs), UD by SIDR to the server's UD service on that port, with
//!   rdma_cm's Q_Key (0x01234567); the UD server learns the client's QP
//!   from its first datagram (SIDR tells a service nothing of the
//!   requester's QP). The address lines are printed once connected, with
//!   the PSNs rdma_cm chose.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use softrdma_verbs::{
    by_addr, by_name, cm, route_source, AccessFlags, AttrMask, CompChannel, Completion, Context,
    Cq, DeviceInfo, Mr, Mtu, OpenOptions, Pd, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendFlags, SendOp, SendWr, UdDest, WcStatus,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    Rc,
    Uc,
    Ud,
}

/// `strtoul(s, NULL, 0)`: decimal, `0x` hex or `0` octal.
fn c_num(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let r = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else if t.len() > 1 && t.starts_with('0') {
        u64::from_str_radix(&t[1..], 8)
    } else {
        t.parse()
    };
    r.map_err(|_| format!("'{s}' is not a number"))
}

fn c_u32(s: &str) -> Result<u32, String> {
    c_num(s).and_then(|v| u32::try_from(v).map_err(|_| format!("{s} is out of range")))
}

fn c_u16(s: &str) -> Result<u16, String> {
    c_num(s).and_then(|v| u16::try_from(v).map_err(|_| format!("{s} is out of range")))
}

fn c_i32(s: &str) -> Result<i32, String> {
    match s.trim().strip_prefix('-') {
        Some(rest) => c_num(rest).map(|v| -(v.min(i32::MAX as u64) as i32)),
        None => c_num(s).map(|v| v.min(i32::MAX as u64) as i32),
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Which of rdma-core's three programs to be.
    #[arg(long, value_enum, default_value = "rc")]
    pub transport: Transport,
    /// Server to connect to; without it, wait for a client.
    pub host: Option<String>,
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value = "18515", value_parser = c_u16)]
    pub port: u16,
    /// Use this device (default: chosen by the address in use).
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,
    /// Port of the device (softrdma devices have one, port 1).
    #[arg(short = 'i', long = "ib-port", default_value = "1", value_parser = c_i32)]
    pub ib_port: i32,
    /// Size of the message to exchange (default 4096; UD 1024).
    #[arg(short = 's', long = "size", value_parser = c_u32)]
    pub size: Option<u32>,
    /// Path MTU (RC and UC).
    #[arg(short = 'm', long = "mtu", default_value = "1024", value_parser = c_u32)]
    pub mtu: u32,
    /// Number of receives to keep posted.
    #[arg(short = 'r', long = "rx-depth", default_value = "500", value_parser = c_u32)]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value = "1000", value_parser = c_u32)]
    pub iters: u32,
    /// Service level.
    #[arg(short = 'l', long = "sl", default_value = "0", value_parser = c_i32)]
    pub sl: i32,
    /// Sleep on CQ events instead of polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Local port GID index (softrdma devices have one GID, index 0).
    #[arg(short = 'g', long = "gid-idx", value_parser = c_i32, allow_hyphen_values = true)]
    pub gid_idx: Option<i32>,
    /// Validate the received buffer.
    #[arg(short = 'c', long = "chk")]
    pub check: bool,
    /// Impairments on what this side sends (softrdma only, as `perf
    /// --fault`), e.g. loss=0.02,seed=7: the interop suite's loss runs
    /// against rxe.
    #[arg(long)]
    pub fault: Option<softrdma_verbs::FaultConfig>,
    /// Connect the QP through rdma_cm (to the server's port `-p`) instead
    /// of exchanging its address over TCP (perftest's -R).
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const UD_QKEY: u32 = 0x1111_1111;
/// The GRH at the start of every UD receive.
const GRH: usize = 40;
/// Give up when nothing completes for this long.
const STALL: Duration = Duration::from_secs(60);
/// How long a client keeps trying to reach a server that is starting.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// A failure: the message is printed to stderr and the exit status is 1,
/// as rdma-core's programs do.
struct Fail(String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Fail {
        Fail(e.to_string())
    }
}

fn fail<T>(msg: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(msg.into()))
}

pub fn run(a: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match pingpong(&a) {
        Ok(true) => Ok(ExitCode::SUCCESS),
        Ok(false) => Ok(ExitCode::from(1)),
        Err(Fail(msg)) => {
            let _ = std::io::stdout().flush();
            eprintln!("{msg}");
            Ok(ExitCode::from(1))
        }
    }
}

// ---------------------------------------------------------------------------
// The out-of-band record

/// `struct pingpong_dest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
}

/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
pub const MSG_LEN: usize = 52;

impl Dest {
    /// The record as rdma-core writes it: the GID as four 32-bit words,
    /// each printed `%08x` in network order (so its bytes in order).
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{gid}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        let mut out = [0u8; MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Result<Dest, String> {
        let text = std::str::from_utf8(b.split(|&c| c == 0).next().unwrap_or(&[]))
            .map_err(|_| "the peer's address record is not text".to_string())?;
        let bad = || format!("couldn't parse the peer's address record '{text}'");
        let mut f = text.splitn(4, ':');
        let mut hex = |max: u64| {
            f.next()
                .and_then(|x| u64::from_str_radix(x, 16).ok())
                .filter(|&v| v <= max)
                .ok_or_else(bad)
        };
        let lid = hex(0xffff)? as u16;
        let qpn = hex(0xff_ffff)? as u32;
        let psn = hex(0xff_ffff)? as u32;
        let g = f.next().ok_or_else(bad)?;
        if g.len() != 32 || !g.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, v) in gid.iter_mut().enumerate() {
            *v = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Dest { lid, qpn, psn, gid })
    }
}

/// `inet_ntop(AF_INET6, ...)` as glibc writes it: the longest run of two or
/// more zero words becomes `::` (the first of equals), and `::a.b.c.d` /
/// `::ffff:a.b.c.d` end in dotted IPv4.
pub fn ntop6(g: &[u8; 16]) -> String {
    let w: Vec<u16> = g
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    let (mut best, mut cur): ((usize, usize), Option<(usize, usize)>) = ((0, 0), None);
    for (i, &x) in w.iter().enumerate() {
        if x == 0 {
            let c = cur.map_or((i, 1), |(b, l)| (b, l + 1));
            if c.1 > best.1 {
                best = c;
            }
            cur = Some(c);
        } else {
            cur = None;
        }
    }
    let run = (best.1 >= 2).then_some(best);
    let mut s = String::new();
    let mut i = 0;
    while i < 8 {
        if let Some((b, l)) = run {
            if i == b {
                s.push(':');
                if b + l == 8 {
                    s.push(':');
                }
                i += l;
                continue;
            }
        }
        if i != 0 {
            s.push(':');
        }
        if i == 6 && run.is_some_and(|(b, l)| b == 0 && (l == 6 || (l == 5 && w[5] == 0xffff))) {
            s.push_str(&format!("{}.{}.{}.{}", g[12], g[13], g[14], g[15]));
            break;
        }
        s.push_str(&format!("{:x}", w[i]));
        i += 1;
    }
    s
}

fn addr_line(local: bool, t: Transport, d: &Dest) -> String {
    // ibv_ud_pingpong's local line has a colon before GID; the rest a comma.
    let sep = if local && t == Transport::Ud {
        ':'
    } else {
        ','
    };
    format!(
        "  {} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
        if local {
            "local address: "
        } else {
            "remote address:"
        },
        d.lid,
        d.qpn,
        d.psn,
        ntop6(&d.gid)
    )
}

// ---------------------------------------------------------------------------
// Resources

/// `struct pingpong_context`.
struct Pp {
    ctx: Context,
    chan: Option<CompChannel>,
    mr: Mr,
    cq: Cq,
    qp: Qp,
    t: Transport,
    size: u32,
    rx_depth: u32,
    send_flags: SendFlags,
    /// Where the message starts in the buffer (UD: after the GRH).
    data: usize,
    ud: Option<UdDest>,
    /// `-R`, the UD server: the client's GID (from its SIDR_REQ) until its
    /// first datagram names its QP.
    ud_peer_gid: Option<[u8; 16]>,
    _pd: Pd,
}

/// rdma-core's RC attributes: local ACK timeout 4.096 µs × 2^14 = 67 ms,
/// seven retries.
const ACK_TIMEOUT: u8 = 14;
const RETRY_CNT: u8 = 7;

impl Pp {
    /// Keep the QP answering for a while after the last completion.
    ///
    /// The ping-pong has no closing handshake: the side that completes
    /// first exits right after ACKing the peer's last message. If that ACK
    /// is lost, the peer retransmits into a destroyed QP — rdma-core's
    /// program then fails with "transport retry counter exceeded", and rxe,
    /// which treats `retry_cnt` 7 as "retry for ever", never finishes at
    /// all. So this side stays until its QP has been quiet for two of the
    /// peer's retransmission periods (both sides use rdma-core's timeout,
    /// 67 ms): a retransmission comes one period after the original, is
    /// ACKed again (the responder answers a duplicate), and restarts the
    /// wait. At most `retry_cnt + 1` periods pass with traffic, the most
    /// the peer itself would retransmit. Costs 134 ms at exit.
    fn linger(&self) {
        let period = Duration::from_nanos(4096 << ACK_TIMEOUT);
        let heard = || self.ctx.stats().0.rx_packets;
        let mut seen = heard();
        for _ in 0..=RETRY_CNT {
            std::thread::sleep(2 * period);
            let now = heard();
            if now == seen {
                return;
            }
            seen = now;
        }
    }

    fn new(dev: &DeviceInfo, a: &Args, size: u32) -> Result<Pp, Fail> {
        let t = a.transport;
        let opts = OpenOptions {
            fault: a.fault,
            ..OpenOptions::default()
        };
        let ctx = Context::open(dev, &opts)
            .map_err(|e| format!("Couldn't get context for {}: {e}", dev.name))?;
        // -g: an index of the port's GID table (rxe's layout), which must
        // be the device's own entry: it is the one it sends from.
        if let Some(g) = a.gid_idx.filter(|&g| g >= 0) {
            let t = ctx.gid_table();
            if t.get(g as u32).is_err() {
                return fail(if a.transport == Transport::Ud {
                    format!("Could not get local gid for gid index {g}")
                } else {
                    format!("can't read sgid of index {g}")
                });
            }
            t.source(g as u32)
                .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        }
        if t == Transport::Ud {
            let mtu = ctx.query_port().active_mtu.bytes();
            if size > mtu {
                return fail(format!("Requested size larger than port MTU ({mtu})"));
            }
        }
        let chan = if a.events {
            Some(
                ctx.create_comp_channel()
                    .map_err(|e| format!("Couldn't create completion channel: {e}"))?,
            )
        } else {
            None
        };
        let pd = ctx.alloc_pd();
        let data = if t == Transport::Ud { GRH } else { 0 };
        let len = (data + size as usize).max(1);
        let mr = pd
            .reg_mr(vec![0x7b; len], AccessFlags::LOCAL_WRITE)
            .map_err(|e| format!("Couldn't register MR: {e}"))?;
        let cq = ctx
            .create_cq(a.rx_depth + 1, chan.as_ref())
            .map_err(|e| format!("Couldn't create CQ: {e}"))?;
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: match t {
                    Transport::Rc => QpType::Rc,
                    Transport::Uc => QpType::Uc,
                    Transport::Ud => QpType::Ud,
                },
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: a.rx_depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .map_err(|e| format!("Couldn't create QP: {e}"))?;
        let mut send_flags = SendFlags::SIGNALED;
        let (_, _, caps) = qp.query()?;
        if caps.max_inline_data >= size {
            send_flags = send_flags | SendFlags::INLINE;
        }
        let init = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: a.ib_port as u8,
            qp_access_flags: AccessFlags::EMPTY,
            qkey: if a.rdma_cm { cm::UDP_QKEY } else { UD_QKEY },
            ..Default::default()
        };
        let mask = AttrMask::STATE
            | AttrMask::PKEY_INDEX
            | AttrMask::PORT
            | if t == Transport::Ud {
                AttrMask::QKEY
            } else {
                AttrMask::ACCESS_FLAGS
            };
        qp.modify(&init, mask)
            .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
        Ok(Pp {
            ctx,
            chan,
            mr,
            cq,
            qp,
            t,
            size,
            rx_depth: a.rx_depth,
            send_flags,
            data,
            ud: None,
            ud_peer_gid: None,
            _pd: pd,
        })
    }

    /// Post up to `n` receives; returns how many were posted.
    fn post_recv(&self, n: u32) -> u32 {
        let sge = [self.mr.sge(0, self.data as u32 + self.size)];
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sgl: &sge,
        };
        (0..n)
            .take_while(|_| self.qp.post_recv(&wr).is_ok())
            .count() as u32
    }

    fn post_send(&self) -> Result<(), Fail> {
        let sge = [self.mr.sge(self.data, self.size)];
        self.qp
            .post_send(&SendWr {
                wr_id: SEND_WRID,
                op: SendOp::Send,
                sgl: &sge,
                flags: self.send_flags,
                ud: self.ud,
            })
            .map_err(|e| Fail(format!("Couldn't post send: {e}")))
    }

    /// `-R`, UD: RTR and RTS (the peer comes from SIDR, or from its first
    /// datagram).
    fn ready_ud(&self) -> Result<(), Fail> {
        let mut attr = QpAttr {
            qp_state: QpState::Rtr,
            ..Default::default()
        };
        self.qp
            .modify(&attr, AttrMask::STATE)
            .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = random_psn();
        self.qp
            .modify(&attr, AttrMask::STATE | AttrMask::SQ_PSN)
            .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
        Ok(())
    }

    /// `pp_connect_ctx`: RTR and RTS towards `rem` (and UD's address handle).
    fn connect(&mut self, a: &Args, my_psn: u32, rem: &Dest) -> Result<(), Fail> {
        if rem.gid == [0; 16] {
            return fail(
                "The peer sent no GID, and RoCE cannot reach it without one: run it with -g <gid index>",
            );
        }
        let mtu = Mtu::from_bytes(a.mtu).unwrap_or(Mtu::B1024);
        let mut attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: mtu,
            dest_qp_num: rem.qpn,
            rq_psn: rem.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        attr.av.dgid = rem.gid;
        attr.av.hop_limit = 1;
        attr.av.sgid_index = self.ctx.gid_index();
        attr.av.sl = a.sl.clamp(0, 15) as u8;
        let rtr = match self.t {
            Transport::Rc => {
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MAX_DEST_RD_ATOMIC
                    | AttrMask::MIN_RNR_TIMER
            }
            Transport::Uc => {
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
            }
            Transport::Ud => AttrMask::STATE,
        };
        self.qp
            .modify(&attr, rtr)
            .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        attr.qp_state = QpState::Rts;
        attr.timeout = ACK_TIMEOUT;
        attr.retry_cnt = RETRY_CNT;
        attr.rnr_retry = 7;
        attr.sq_psn = my_psn;
        attr.max_rd_atomic = 1;
        let rts = match self.t {
            Transport::Rc => {
                AttrMask::STATE
                    | AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::SQ_PSN
                    | AttrMask::MAX_QP_RD_ATOMIC
            }
            _ => AttrMask::STATE | AttrMask::SQ_PSN,
        };
        self.qp
            .modify(&attr, rts)
            .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
        if self.t == Transport::Ud {
            self.ud = Some(UdDest {
                gid: rem.gid,
                remote_qpn: rem.qpn,
                remote_qkey: UD_QKEY,
            });
        }
        Ok(())
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf takes no pointers.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

/// `lrand48() & 0xffffff`, seeded per process and moment.
fn random_psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut x = t ^ ((std::process::id() as u64) << 32);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x & 0x00ff_ffff) as u32
}

// ---------------------------------------------------------------------------
// The run

fn pingpong(a: &Args) -> Result<bool, Fail> {
    let t = a.transport;
    if a.ib_port < 1 {
        return fail(format!("Invalid IB port {}", a.ib_port));
    }
    if a.ib_port != 1 {
        return fail(format!(
            "Couldn't get port info: softrdma devices have one port (1), not {}",
            a.ib_port
        ));
    }
    if t != Transport::Ud && Mtu::from_bytes(a.mtu).is_none() {
        return fail(format!(
            "Invalid MTU {}: use 256, 512, 1024, 2048 or 4096",
            a.mtu
        ));
    }
    if a.rx_depth == 0 {
        return fail("Couldn't create QP: rx depth must be at least 1");
    }
    let size = a
        .size
        .unwrap_or(if t == Transport::Ud { 1024 } else { 4096 });
    let page = page_size();

    // Device, resources and the exchange. A server without -d learns its
    // device from the connection, so it opens the device after accepting.
    let named = match &a.device {
        Some(n) => Some(by_name(n).map_err(|_| format!("IB device {n} not found"))?),
        None => None,
    };
    let mut _conn = None;
    let (mut pp, client) = if a.rdma_cm {
        let (pp, client, conn) = connect_cm(a, named, size)?;
        _conn = conn;
        (pp, client)
    } else {
        match &a.host {
            Some(host) => {
                let addrs = resolve(host, a.port)?;
                let dev = match named {
                    Some(d) => d,
                    None => by_addr(route_source(addrs[0].ip())?)?,
                };
                let (mut pp, my) = start(&dev, a, size)?;
                let mut s = connect_tcp(&addrs, host, a.port)?;
                s.write_all(&my.encode())
                    .map_err(|e| format!("Couldn't send local address: {e}"))?;
                let mut m = [0u8; MSG_LEN];
                s.read_exact(&mut m)
                    .and_then(|_| s.write_all(b"done\0"))
                    .map_err(|e| format!("Couldn't read/write remote address: {e}"))?;
                let rem = Dest::decode(&m)?;
                outln!("{}", addr_line(false, t, &rem));
                pp.connect(a, my.psn, &rem)?;
                (pp, true)
            }
            None => {
                let l = listen(a.port)?;
                let mut early = match named {
                    Some(d) => Some(start(&d, a, size)?),
                    None => None,
                };
                let (mut s, _) = l.accept().map_err(|e| format!("accept() failed: {e}"))?;
                drop(l);
                s.set_read_timeout(Some(STALL))?;
                let (mut pp, my) = match early.take() {
                    Some(x) => x,
                    None => start(&by_addr(s.local_addr()?.ip())?, a, size)?,
                };
                let mut m = [0u8; MSG_LEN];
                s.read_exact(&mut m)
                    .map_err(|e| format!("Couldn't read remote address: {e}"))?;
                let rem = Dest::decode(&m)?;
                pp.connect(a, my.psn, &rem)
                    .map_err(|Fail(e)| Fail(format!("{e}\nCouldn't connect to remote QP")))?;
                let mut done = [0u8; 5];
                s.write_all(&my.encode())
                    .and_then(|_| s.read_exact(&mut done))
                    .map_err(|e| format!("Couldn't send/recv local address: {e}"))?;
                outln!("{}", addr_line(false, t, &rem));
                (pp, false)
            }
        }
    };

    // The ping-pong.
    let mut pending = RECV_WRID;
    if client {
        if a.check {
            for i in (0..size as usize).step_by(page) {
                pp.mr.write(pp.data + i, &[0]);
            }
        }
        pp.post_send()?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt, mut routs) = (0u32, 0u32, pp.rx_depth);
    let mut wc = [Completion::default(); 2];
    let mut last = Instant::now();
    while rcnt < a.iters || scnt < a.iters {
        if let Some(ch) = &pp.chan {
            match ch.get_event(Some(STALL))? {
                Some(cq) if cq == pp.cq.id() => {}
                Some(cq) => return fail(format!("CQ event for unknown CQ {}", cq.0)),
                None => return fail("Failed to get cq_event: no completion for 60 seconds"),
            }
            pp.cq
                .req_notify(false)
                .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
        }
        let ne = loop {
            let ne = pp
                .cq
                .poll(&mut wc)
                .map_err(|e| format!("poll CQ failed {e}"))?;
            if ne > 0 || pp.chan.is_some() {
                break ne;
            }
            if last.elapsed() > STALL {
                return fail("No completion for 60 seconds, exiting");
            }
        };
        if ne > 0 {
            last = Instant::now();
        }
        for c in &wc[..ne] {
            if c.status != WcStatus::Success {
                return fail(format!(
                    "Failed status {} ({}) for wr_id {}",
                    c.status.as_str(),
                    c.status as u32,
                    c.wr_id as i32
                ));
            }
            match c.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if let (None, Some(gid)) = (pp.ud, pp.ud_peer_gid) {
                        // -R, the UD server: the client's QP is the
                        // source of its first datagram.
                        let rem = Dest {
                            lid: 0,
                            qpn: c.src_qp,
                            psn: 0,
                            gid,
                        };
                        outln!("{}", addr_line(false, t, &rem));
                        pp.ud = Some(UdDest {
                            gid,
                            remote_qpn: c.src_qp,
                            remote_qkey: cm::UDP_QKEY,
                        });
                    }
                    routs -= 1;
                    if routs <= 1 {
                        routs += pp.post_recv(pp.rx_depth - routs);
                        if routs < pp.rx_depth {
                            return fail(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                id => return fail(format!("Completion for unknown wr_id {}", id as i32)),
            }
            pending &= !c.wr_id;
            if scnt < a.iters && pending == 0 {
                pp.post_send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    // C computes in a float; so do we, for the same figures.
    let usec = start.elapsed().as_micros() as f32;
    let bytes = size as i64 * a.iters as i64 * 2;
    outln!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec as f64 / 1e6,
        bytes as f64 * 8.0 / usec as f64
    );
    outln!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        a.iters,
        usec as f64 / 1e6,
        (usec / a.iters as f32) as f64
    );
    if pp.t == Transport::Rc {
        pp.linger();
    }
    let mut ok = true;
    if a.check {
        let mut buf = vec![0u8; size as usize];
        pp.mr.read(pp.data, &mut buf);
        for (p, chunk) in buf.chunks(page).enumerate() {
            let good = chunk
                .iter()
                .enumerate()
                .all(|(i, &b)| b == if i == 0 { 0 } else { 0x7b });
            if !good {
                outln!("invalid data in page {p}");
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// `-R`: the device (named, routing to the server, or the first), the
/// resources, and the QP connected through rdma_cm; whether this side is
/// the client; the connection (kept for the run: dropping it disconnects).
fn connect_cm(
    a: &Args,
    named: Option<DeviceInfo>,
    size: u32,
) -> Result<(Pp, bool, Option<cm::Connection>), Fail> {
    let t = a.transport;
    let to = match &a.host {
        Some(host) => Some(resolve(host, a.port)?[0]),
        None => None,
    };
    let dev = match (named, to) {
        (Some(d), _) => d,
        (None, Some(to)) => by_addr(route_source(to.ip())?)?,
        (None, None) => softrdma_verbs::devices()?
            .into_iter()
            .next()
            .ok_or("No IB devices found")?,
    };
    let mut pp = prepare(&dev, a, size)?;
    let opts = cm::CmOptions::default().with_timeout(STALL);
    // What the QP says once connected: its PSNs are rdma_cm's.
    let show = |pp: &Pp, peer_qpn: u32, peer_gid: [u8; 16]| -> Result<(), Fail> {
        let (_, attr, _) = pp.qp.query()?;
        let lid = pp.ctx.query_port().lid;
        let (my_psn, rem_psn) = if t == Transport::Ud {
            (attr.sq_psn, 0)
        } else {
            (attr.sq_psn, attr.rq_psn)
        };
        let my = Dest {
            lid,
            qpn: pp.qp.qpn(),
            psn: my_psn,
            gid: pp.ctx.gid(),
        };
        outln!("{}", addr_line(true, t, &my));
        if peer_qpn != 0 {
            let rem = Dest {
                lid: 0,
                qpn: peer_qpn,
                psn: rem_psn,
                gid: peer_gid,
            };
            outln!("{}", addr_line(false, t, &rem));
        }
        Ok(())
    };
    match (to, t) {
        (Some(to), Transport::Ud) => {
            pp.ready_ud()?;
            let deadline = Instant::now() + CONNECT_PATIENCE;
            let peer = loop {
                match cm::resolve_ud(&pp.ctx, to, &[], STALL) {
                    Err(softrdma_verbs::Error::Rejected(r))
                        if r.no_listener() && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    r => {
                        break r.map_err(|e| {
                            format!("rdma_cm: resolving the UD service at {to} failed: {e}")
                        })?
                    }
                }
            };
            pp.ud = Some(UdDest {
                gid: peer.gid,
                remote_qpn: peer.qpn,
                remote_qkey: peer.qkey,
            });
            show(&pp, peer.qpn, peer.gid)?;
            Ok((pp, true, None))
        }
        (Some(to), _) => {
            let conn = super::perf::oob::connect_retrying(
                &pp.ctx,
                to,
                &pp.qp,
                &opts,
                Instant::now() + CONNECT_PATIENCE,
            )
            .map_err(|e| format!("rdma_cm: connecting to {to} failed: {e}"))?;
            let gid = conn.peer_addr().map_or([0; 16], |p| gid_of(p.ip()));
            show(&pp, conn.peer_qpn(), gid)?;
            Ok((pp, true, Some(conn)))
        }
        (None, Transport::Ud) => {
            pp.ready_ud()?;
            let at = SocketAddr::new(dev.addr, a.port);
            let l = cm::UdListener::bind(&pp.ctx, at)
                .map_err(|e| format!("rdma_cm: cannot serve UD at {at}: {e}"))?;
            let req = next(|| l.next_request(Duration::from_secs(3600)))?;
            pp.ud_peer_gid = Some(req.peer_gid());
            req.accept(&pp.qp, &[])
                .map_err(|e| format!("rdma_cm: answering the SIDR request failed: {e}"))?;
            show(&pp, 0, [0; 16])?;
            Ok((pp, false, None))
        }
        (None, _) => {
            let at = SocketAddr::new(dev.addr, a.port);
            // UC connects in the IB port space (rdma_cm's TCP one is RC's).
            let l = if t == Transport::Uc {
                cm::Listener::bind_ib(&pp.ctx, at)
            } else {
                cm::Listener::bind(&pp.ctx, at)
            }
            .map_err(|e| format!("rdma_cm: cannot listen at {at}: {e}"))?;
            let req = next(|| l.next_request(Duration::from_secs(3600)))?;
            let conn = req
                .accept(&pp.qp, &[], &opts)
                .map_err(|e| format!("rdma_cm: accepting the connection failed: {e}"))?;
            let gid = conn.peer_addr().map_or([0; 16], |p| gid_of(p.ip()));
            show(&pp, conn.peer_qpn(), gid)?;
            Ok((pp, false, Some(conn)))
        }
    }
}

/// The next connection request, however long it takes.
fn next<T>(mut f: impl FnMut() -> softrdma_verbs::Result<T>) -> Result<T, Fail> {
    loop {
        match f() {
            Ok(r) => return Ok(r),
            Err(softrdma_verbs::Error::Timeout(_)) => continue,
            Err(e) => return fail(format!("rdma_cm: waiting for a client failed: {e}")),
        }
    }
}

/// A GID from an address: IPv6 as it is, IPv4 mapped.
fn gid_of(ip: std::net::IpAddr) -> [u8; 16] {
    match ip {
        std::net::IpAddr::V6(v6) => v6.octets(),
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
    }
}

/// Open the device, create the resources, post the receives and arm the
/// CQ.
fn prepare(dev: &DeviceInfo, a: &Args, size: u32) -> Result<Pp, Fail> {
    let pp = Pp::new(dev, a, size)?;
    let routs = pp.post_recv(pp.rx_depth);
    if routs < pp.rx_depth {
        return fail(format!("Couldn't post receive ({routs})"));
    }
    if pp.chan.is_some() {
        pp.cq
            .req_notify(false)
            .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
    }
    Ok(pp)
}

/// Open the device, create the resources, post the receives, arm the CQ
/// and print the local address.
fn start(dev: &DeviceInfo, a: &Args, size: u32) -> Result<(Pp, Dest), Fail> {
    let pp = prepare(dev, a, size)?;
    let my = Dest {
        lid: pp.ctx.query_port().lid,
        qpn: pp.qp.qpn(),
        psn: random_psn(),
        gid: pp.ctx.gid(),
    };
    outln!("{}", addr_line(true, pp.t, &my));
    Ok((pp, my))
}

fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, Fail> {
    let v: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{e} for {host}:{port}"))?
        .collect();
    if v.is_empty() {
        return fail(format!("Couldn't resolve {host}:{port}"));
    }
    Ok(v)
}

/// Connect to the first address that answers, retrying while the server
/// may still be starting.
fn connect_tcp(addrs: &[SocketAddr], host: &str, port: u16) -> Result<TcpStream, Fail> {
    let start = Instant::now();
    loop {
        for a in addrs {
            if let Ok(s) = TcpStream::connect(a) {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(STALL))?;
                return Ok(s);
            }
        }
        if start.elapsed() > CONNECT_PATIENCE {
            return fail(format!("Couldn't connect to {host}:{port}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Listen on every address, IPv6 and IPv4 (one dual-stack socket where the
/// host allows it).
fn listen(port: u16) -> Result<TcpListener, Fail> {
    TcpListener::bind((std::net::Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)))
        .map_err(|e| Fail(format!("Couldn't listen to port {port}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_is_rdma_cores_52_bytes() {
        let d = Dest {
            lid: 0,
            qpn: 0x10111,
            psn: 0xabcdef,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 7],
        };
        let m = d.encode();
        assert_eq!(
            std::str::from_utf8(&m[..51]).unwrap(),
            "0000:010111:abcdef:00000000000000000000ffffc0a80107"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::decode(&m).unwrap(), d);
        assert!(Dest::decode(b"0000:010111:abcdef:00ff\0").is_err());
        assert!(Dest::decode(b"garbage").is_err());
    }

    #[test]
    fn gids_print_as_glibc_inet_ntop() {
        let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1];
        assert_eq!(ntop6(&v4), "::ffff:127.0.0.1");
        let mut one = [0u8; 16];
        one[15] = 1;
        assert_eq!(ntop6(&one), "::1");
        assert_eq!(ntop6(&[0; 16]), "::");
        let compat = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1];
        assert_eq!(ntop6(&compat), "::10.0.0.1");
        let ll: std::net::Ipv6Addr = "fe80::5054:ff:fe12:3456".parse().unwrap();
        assert_eq!(ntop6(&ll.octets()), "fe80::5054:ff:fe12:3456");
        let mid: std::net::Ipv6Addr = "2001:db8:0:0:1:0:0:1".parse().unwrap();
        assert_eq!(ntop6(&mid.octets()), "2001:db8::1:0:0:1");
        let tail: std::net::Ipv6Addr = "2001:db8::".parse().unwrap();
        assert_eq!(ntop6(&tail.octets()), "2001:db8::");
        let single: std::net::Ipv6Addr = "2001:db8:0:1:1:1:1:1".parse().unwrap();
        assert_eq!(ntop6(&single.octets()), "2001:db8:0:1:1:1:1:1");
    }

    #[test]
    fn numbers_parse_as_strtoul() {
        assert_eq!(c_num("18515"), Ok(18515));
        assert_eq!(c_num("0x10"), Ok(16));
        assert_eq!(c_num("010"), Ok(8));
        assert_eq!(c_num("0"), Ok(0));
        assert!(c_num("x").is_err());
        assert_eq!(c_i32("-1"), Ok(-1));
    }

    #[test]
    fn address_lines_match_rdma_core() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0x1a2b3c,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2],
        };
        assert_eq!(
            addr_line(true, Transport::Rc, &d),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0x1a2b3c, GID ::ffff:10.0.0.2"
        );
        assert_eq!(
            addr_line(true, Transport::Ud, &d),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0x1a2b3c: GID ::ffff:10.0.0.2"
        );
        assert_eq!(
            addr_line(false, Transport::Ud, &d),
            "  remote address: LID 0x0000, QPN 0x000011, PSN 0x1a2b3c, GID ::ffff:10.0.0.2"
        );
    }
}
