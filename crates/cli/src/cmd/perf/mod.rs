//! `softrdma perf TEST`: perftest's eight benchmarks on softrdma, with
//! perftest's flags, out-of-band protocol and output, so either side can be
//! the real `ib_*` binary.
//!
//! * `oob` — the TCP exchange (versions, system data, MTU, per-QP records,
//!   handshakes, reports), message for message as perftest 4.5 sends it;
//! * `setup` — buffers, memory region, CQs and QPs laid out as perftest
//!   lays them out, and the INIT→RTR→RTS transitions with its attributes;
//! * `bench` — the measured loops;
//! * `report` — perftest's banner, tables and units.
//!
//! Beyond perftest: `--loopback` runs the server as a child process and the
//! client here (both ends from one command), `--check` verifies the data
//! that moved, `--fault` injects loss/reordering/duplication/corruption at
//! the IO layer, `--pcap` captures this process's traffic, `--tsv` prints
//! rows for `../shared/peers/run.sh`.

mod bench;
pub(crate) mod oob;
pub mod report;
mod setup;
mod unsupported;

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::ValueEnum;
use softrdma_verbs::{FaultConfig, Mtu, QpType};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[clap(rename_all = "snake_case")]
pub enum Test {
    WriteBw,
    WriteLat,
    ReadBw,
    ReadLat,
    SendBw,
    SendLat,
    AtomicBw,
    AtomicLat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Send,
    Write,
    Read,
    Atomic,
}

impl Test {
    pub fn verb(self) -> Verb {
        match self {
            Test::WriteBw | Test::WriteLat => Verb::Write,
            Test::ReadBw | Test::ReadLat => Verb::Read,
            Test::SendBw | Test::SendLat => Verb::Send,
            Test::AtomicBw | Test::AtomicLat => Verb::Atomic,
        }
    }

    pub fn is_bw(self) -> bool {
        matches!(
            self,
            Test::WriteBw | Test::ReadBw | Test::SendBw | Test::AtomicBw
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::WriteLat => "write_lat",
            Test::ReadBw => "read_bw",
            Test::ReadLat => "read_lat",
            Test::SendBw => "send_bw",
            Test::SendLat => "send_lat",
            Test::AtomicBw => "atomic_bw",
            Test::AtomicLat => "atomic_lat",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Conn {
    #[value(name = "RC")]
    Rc,
    #[value(name = "UC")]
    Uc,
    #[value(name = "UD")]
    Ud,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AtomicType {
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (n, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1024),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    let v: u64 = n.parse().map_err(|_| format!("'{s}' is not a size"))?;
    if v == 0 || v * mult > u32::MAX as u64 / 2 {
        return Err(format!("size {s} out of range 1..2^31"));
    }
    Ok(v * mult)
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Which benchmark.
    #[arg(value_enum)]
    pub test: Test,
    /// Server to connect to; without it, act as the server.
    pub host: Option<String>,
    /// Device name (default: chosen by the address in use).
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,
    /// Port number of the device (only 1 exists).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Message size (K and M suffixes allowed).
    #[arg(short = 's', long = "size", value_parser = parse_size)]
    pub size: Option<u64>,
    /// Iterations.
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run sizes 2 B to 8 MiB.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Measure bidirectional bandwidth: both sides post at once and each
    /// reports the sum of the two directions (perftest's -b).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidir: bool,
    /// Cancel the peak-bandwidth calculation (bandwidth tests; perftest
    /// skips it anyway above 20,000 iterations and in duration mode).
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: usize,
    /// Path MTU (256..4096).
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// GID index (the device has one GID, index 0).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<i32>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u64>,
    /// With -D: seconds left out of the measurement at each end (default:
    /// a quarter of -D, in whole seconds, as perftest's).
    #[arg(short = 'f', long = "margin")]
    pub margin: Option<u64>,
    /// Send queue depth.
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Receive queue depth (send tests).
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// Connection type.
    #[arg(short = 'c', long = "connection", value_enum, default_value = "RC")]
    pub conn: Conn,
    /// Sleep on completion events instead of polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Atomic operation.
    #[arg(
        short = 'A',
        long = "atomic_type",
        value_enum,
        default_value = "FETCH_AND_ADD"
    )]
    pub atomic_type: AtomicType,
    /// Accepted for compatibility (no CPU-frequency check is made).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Report bandwidth in Gb/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Latency tests: print every interval measured, in the order taken,
    /// before the result row (perftest's `#, usec` list).
    #[arg(short = 'U', long = "report-unsorted")]
    pub report_unsorted: bool,
    /// Latency tests: print the intervals sorted (less the two largest, as
    /// perftest leaves them out of its statistics) before the result row.
    #[arg(short = 'H', long = "report-histogram")]
    pub report_histogram: bool,
    /// Latency tests: report in CPU cycles at /proc/cpuinfo's clock
    /// instead of microseconds (the header still says usec, as perftest's).
    #[arg(short = 'C', long = "report-cycles")]
    pub report_cycles: bool,
    /// CQ moderation: signal one send in this many.
    #[arg(short = 'Q', long = "cq-mod")]
    pub cq_mod: Option<u32>,
    /// QP local ACK timeout exponent.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    pub qp_timeout: u8,
    /// Post lists of this many send WRs (one `post_send` call for a list,
    /// bandwidth tests); CQ moderation defaults to the list size.
    #[arg(short = 'l', long = "post_list", value_parser = clap::value_parser!(u32).range(1..))]
    pub post_list: Option<u32>,
    /// Outstanding reads/atomics.
    #[arg(short = 'o', long = "outs")]
    pub outs: Option<u16>,
    /// Inline size (latency tests).
    #[arg(short = 'I', long = "inline_size")]
    pub inline: Option<u32>,
    /// Accepted for compatibility: softrdma always uses ibv_post_send.
    #[arg(long = "use_old_post_send")]
    pub old_post_send: bool,
    /// Run the server as a child process and the client here.
    #[arg(long)]
    pub loopback: bool,
    /// Verify every byte that moved (both sides must be softrdma with --check).
    #[arg(long)]
    pub check: bool,
    /// Connect the QPs with rdma_cm, and exchange the test's parameters over
    /// an rdma_cm connection of their own instead of TCP (perftest's -R).
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Impairments at the IO layer, e.g. loss=0.05,reorder=0.05,dup=0.01,corrupt=0.001,seed=7.
    #[arg(long)]
    pub fault: Option<FaultConfig>,
    /// Capture this process's RoCEv2 traffic into a pcap file.
    #[arg(long)]
    pub pcap: Option<std::path::PathBuf>,
    /// Also print tab-separated rows for the peers comparison table.
    #[arg(long)]
    pub tsv: bool,
    /// Print the transport counters at the end.
    #[arg(long)]
    pub stats: bool,
    /// The transport: shared memory to a peer on this host where possible
    /// (auto), or forced (default: as SOFTRDMA_TRANSPORT says, else auto).
    #[arg(long, value_enum)]
    pub transport: Option<TransportArg>,
    /// Congestion control of the QPs: none, dcqcn, dcqcn-nvidia, timely,
    /// timely-patched, swift, hpcc (which hears nothing on the wire: no
    /// switch stamps INT), TIMELY's parameters as in `timely:seg=16K`
    /// (default: as SOFTRDMA_CC says, else none).
    #[arg(long, value_parser = crate::cmd::cc_spec)]
    pub cc: Option<String>,
    /// Loss recovery of the RC QPs: sr (selective repeat, offered to the
    /// peer and used if it accepts) or gbn (go-back-N, as IBA and rxe)
    /// (default: as SOFTRDMA_SR says, else sr).
    #[arg(long, value_parser = ["sr", "gbn"])]
    pub recovery: Option<String>,
    /// perftest's flags not implemented here, refused by name.
    #[command(flatten)]
    pub unsupported: unsupported::Unsupported,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    Auto,
    Udp,
    Shm,
}

impl TransportArg {
    fn name(self) -> &'static str {
        match self {
            TransportArg::Auto => "auto",
            TransportArg::Udp => "udp",
            TransportArg::Shm => "shm",
        }
    }

    fn verbs(self) -> softrdma_verbs::Transport {
        match self {
            TransportArg::Auto => softrdma_verbs::Transport::Auto,
            TransportArg::Udp => softrdma_verbs::Transport::Udp,
            TransportArg::Shm => softrdma_verbs::Transport::Shm,
        }
    }
}

/// The transport the last test in this process ran over (for the loopback
/// client's CPU row).
static LAST_TRANSPORT: std::sync::Mutex<&'static str> = std::sync::Mutex::new("udp");

/// Parameters after perftest's defaults and dependencies are applied.
#[derive(Debug, Clone)]
pub struct Params {
    pub test: Test,
    pub conn: QpType,
    pub sizes: Vec<u64>,
    /// `-a`: perftest's RUN_ALL method, which changes the handshakes of
    /// send_bw (one after every size).
    pub all: bool,
    /// `-b`: both sides post and measure; the row is the two directions'
    /// sum (perftest's duplex mode).
    pub bidir: bool,
    pub buf_size: u64,
    pub iters: u64,
    pub duration: Option<u64>,
    /// `-f`: the margin of a `-D` run, if given.
    pub margin: Option<u64>,
    pub qps: usize,
    pub tx_depth: u32,
    pub rx_depth: u32,
    pub cq_mod: u32,
    /// `-l`: send WRs posted per call, in lists (1: one at a time).
    pub post_list: u32,
    pub inline: u32,
    pub mtu: Option<Mtu>,
    pub timeout: u8,
    pub outs: u16,
    pub atomic: AtomicType,
    pub events: bool,
    pub gbits: bool,
    /// `-U`, `-H`: the intervals printed unsorted, sorted.
    pub unsorted: bool,
    pub histogram: bool,
    /// `-C`: cycles per microsecond (the CPU's MHz) to report in.
    pub cycles: Option<f64>,
    pub check: bool,
    pub rdma_cm: bool,
    pub no_peak: bool,
    /// `-x`: the GID index to send from, checked against the device's
    /// table once it is open (it must be the device's own entry).
    pub gid_index: Option<u8>,
}

const MAX_SIZE: u64 = 8 << 20;

fn fail(msg: &str) -> Box<dyn std::error::Error> {
    msg.to_string().into()
}

impl Params {
    pub fn from_args(a: &Args) -> Result<Params, Box<dyn std::error::Error>> {
        let t = a.test;
        let verb = t.verb();
        if let Some((flag, what)) = a.unsupported.given() {
            return Err(fail(&format!(
                " softrdma perf does not support perftest's {flag} ({what})"
            )));
        }
        let conn = match a.conn {
            Conn::Rc => QpType::Rc,
            Conn::Uc => QpType::Uc,
            Conn::Ud => QpType::Ud,
        };
        if conn == QpType::Uc && matches!(verb, Verb::Read | Verb::Atomic) {
            return Err(fail(" UC connection not possible in READ/ATOMIC verbs"));
        }
        if conn == QpType::Ud && verb != Verb::Send {
            return Err(fail(" UD connection only possible in SEND verb"));
        }
        if a.events && verb == Verb::Write {
            return Err(fail(" Events feature not available on WRITE verb"));
        }
        if !t.is_bw() && a.qps > 1 {
            return Err(fail(" Multiple QPs only available on bw tests"));
        }
        if a.qps == 0 || a.qps > 16384 {
            return Err(fail(" Number of QPs must be 1..16384"));
        }
        if a.no_peak && !t.is_bw() {
            return Err(fail(" -N (no peak) applies to bandwidth tests only"));
        }
        if a.bidir && !t.is_bw() {
            return Err(fail(
                " Bidirectional mode (-b) is supported for bandwidth tests only: latency tests go both ways already",
            ));
        }
        if a.bidir && a.events && verb == Verb::Send {
            return Err(fail(
                " Bidirectional send_bw (-b) polls both completion queues in one loop: -e is not supported with it",
            ));
        }
        if a.duration.is_some()
            && !t.is_bw()
            && (a.report_unsorted || a.report_histogram || a.report_cycles)
        {
            return Err(fail(
                " softrdma perf does not support -U, -H or -C with -D on a latency test: -D reports the average over its window (t_avg, tps), -U, -H and -C need -n's samples",
            ));
        }
        if (a.report_unsorted || a.report_histogram || a.report_cycles) && t.is_bw() {
            return Err(fail(
                " -U, -H and -C (--report-unsorted, --report-histogram, --report-cycles) are available only on latency tests",
            ));
        }
        let cycles = if a.report_cycles {
            Some(cpu_mhz().ok_or_else(|| {
                fail(" -C reports in cycles at the CPU's clock, and /proc/cpuinfo gives no \"cpu MHz\"")
            })?)
        } else {
            None
        };
        // perftest's check (with its defaults, -D 5 and -f 2, when either
        // is left out).
        if a.duration.is_some() || a.margin.is_some() {
            let (d, m) = (a.duration.unwrap_or(5), a.margin.unwrap_or(2));
            if a.margin.is_some() && d <= 2 * m {
                return Err(fail(" please check that DURATION > 2*MARGIN"));
            }
        }
        if a.duration.is_some() && (a.all || a.events) {
            return Err(fail(" Duration mode cannot be combined with -a or -e"));
        }
        let gid_index = match a.gid_index {
            None => None,
            Some(x) => Some(u8::try_from(x).map_err(|_| {
                fail(&format!(
                    " GID index {x} out of range: the GID table has {} entries",
                    softrdma_verbs::GID_TBL_LEN
                ))
            })?),
        };
        if a.ib_port != 1 {
            return Err(fail(" softrdma devices have one port (1)"));
        }
        if verb == Verb::Atomic && (a.all || a.size.is_some_and(|s| s != 8)) {
            return Err(fail("Message size cannot be changed for Atomic tests"));
        }
        let mtu = match a.mtu {
            None => None,
            Some(m) => Some(Mtu::from_bytes(m).ok_or_else(|| {
                fail(&format!(
                    " Invalid MTU {m}: use 256, 512, 1024, 2048 or 4096"
                ))
            })?),
        };
        let default_size = if verb == Verb::Atomic {
            8
        } else if t.is_bw() {
            65536
        } else {
            2
        };
        let sizes: Vec<u64> = if a.all {
            let top = if conn == QpType::Ud {
                mtu.map_or(4096, |m| m.bytes() as u64)
            } else {
                MAX_SIZE
            };
            (1..=23).map(|k| 1u64 << k).filter(|&s| s <= top).collect()
        } else {
            vec![a.size.unwrap_or(default_size)]
        };
        let buf_size = if a.all {
            *sizes.last().unwrap_or(&MAX_SIZE)
        } else {
            sizes[0]
        };
        let iters = a
            .iters
            .unwrap_or(if t == Test::WriteBw { 5000 } else { 1000 });
        if !(5..=100_000_000).contains(&iters) {
            return Err(fail(" Number of iterations must be 5..1e8"));
        }
        let mut tx_depth = a.tx_depth.unwrap_or(if t.is_bw() { 128 } else { 1 });
        if a.duration.is_none() {
            tx_depth = tx_depth.min(iters as u32);
        }
        let rx_depth = if verb == Verb::Send {
            let mut r = a.rx_depth.unwrap_or(512).min(iters as u32);
            if conn != QpType::Rc && a.rx_depth.is_none() {
                r = (iters as u32).min(16000);
            }
            if r % 2 == 1 && !a.all {
                r += 1;
            }
            r
        } else {
            if a.rx_depth.is_some_and(|r| r > 1) {
                return Err(fail(" On RDMA verbs rx depth can be only 1"));
            }
            1
        };
        let mut cq_mod = a.cq_mod.unwrap_or(100);
        if a.cq_mod.is_none() && sizes[0] > 8192 && conn != QpType::Ud && !a.all && !a.events {
            cq_mod = 1;
        }
        cq_mod = cq_mod.min(tx_depth).max(1);
        // perftest's post list: BW tests only, iterations a multiple of the
        // list, CQ moderation the list size unless -Q asks otherwise (and
        // then one that divides the list).
        let post_list = a.post_list.unwrap_or(1);
        if post_list > 1 {
            if !t.is_bw() {
                return Err(fail("Post list is supported in BW tests only"));
            }
            if a.duration.is_none() && !iters.is_multiple_of(post_list as u64) {
                return Err(fail(
                    "Number of iterations must be a multiple of post list size",
                ));
            }
            if a.cq_mod.is_none() {
                cq_mod = post_list;
            } else if !post_list.is_multiple_of(cq_mod) {
                return Err(fail("Post list size must be a multiple of CQ moderation"));
            }
            if post_list > tx_depth {
                return Err(fail(&format!(
                    " Post list size {post_list} is larger than the TX depth {tx_depth}: no list would fit in the send queue"
                )));
            }
        }
        let inline = if matches!(verb, Verb::Read | Verb::Atomic) {
            0
        } else {
            a.inline.unwrap_or(0)
        };
        Ok(Params {
            test: t,
            conn,
            sizes,
            all: a.all,
            bidir: a.bidir,
            buf_size,
            iters,
            duration: a.duration,
            margin: a.margin,
            qps: a.qps,
            tx_depth,
            rx_depth,
            cq_mod,
            post_list,
            inline: inline.min(softrdma_core::MAX_INLINE as u32),
            mtu,
            timeout: a.qp_timeout,
            outs: a.outs.unwrap_or(16).clamp(1, 16),
            atomic: a.atomic_type,
            events: a.events,
            gbits: a.report_gbits,
            unsorted: a.report_unsorted,
            histogram: a.report_histogram,
            cycles,
            check: a.check,
            rdma_cm: a.rdma_cm,
            no_peak: a.no_peak || a.duration.is_some() || (t.is_bw() && iters > 20000),
            gid_index,
        })
    }
}

pub fn run(a: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let p = Params::from_args(&a)?;
    if a.loopback {
        return loopback(&a);
    }
    let r = run_one(a, p);
    report_peak_cpu();
    r
}

/// The environment variable through which a loopback run's server learns
/// where to report the CPU time its peak computations took.
const PEAK_CPU_FD: &str = "SOFTRDMA_PERF_PEAK_CPU_FD";

/// A loopback run's server: write the CPU time of its peak computations
/// (`bench::PEAK_CPU_NS`) to the pipe its parent gave it, for the parent's
/// CPU per GB to leave out.
fn report_peak_cpu() {
    let Some(fd) = std::env::var(PEAK_CPU_FD)
        .ok()
        .and_then(|v| v.parse::<std::os::fd::RawFd>().ok())
    else {
        return;
    };
    let msg = format!(
        "{}\n",
        bench::PEAK_CPU_NS.load(std::sync::atomic::Ordering::Relaxed)
    );
    // SAFETY: a write of our own buffer; a descriptor that is not the
    // parent's pipe (the variable set by hand) fails or writes a line.
    unsafe { libc::write(fd, msg.as_ptr().cast(), msg.len()) };
}

fn run_one(a: Args, p: Params) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let client = a.host.is_some();
    if a.rdma_cm && p.conn == QpType::Uc {
        outln!("{}", report::RESULT_LINE);
        outln!(" UC is not supported in librdmacm");
        return Ok(ExitCode::from(1));
    }
    let patience = Duration::from_secs(if a.loopback { 20 } else { 2 });
    let mut ctx = None;
    let (chan, dev) = if a.rdma_cm {
        // The device first: the exchange itself runs on it.
        let dev = match (&a.device, &a.host) {
            (Some(n), _) => softrdma_verbs::by_name(n)?,
            (None, Some(h)) => softrdma_verbs::by_addr(softrdma_verbs::route_source(resolve(h)?)?)?,
            (None, None) => softrdma_verbs::devices()?
                .into_iter()
                .next()
                .ok_or("no softrdma device")?,
        };
        // One context for the exchange and the data QPs: rdma_cm keeps a
        // port it listened on steered to the device that listened.
        let c = softrdma_verbs::Context::open(&dev, &open_options(&a))?;
        let chan = match &a.host {
            Some(h) => oob::Channel::connect_cm(
                &c,
                resolve(h)?,
                a.port,
                patience.max(Duration::from_secs(20)),
            )?,
            None => {
                if !a.tsv {
                    outln!("\n************************************");
                    outln!("* Waiting for client to connect... *");
                    outln!("************************************");
                }
                oob::Channel::listen_cm(&c, a.port)?
            }
        };
        ctx = Some(c);
        (chan, dev)
    } else {
        let chan = match &a.host {
            Some(h) => {
                let ip = resolve(h)?;
                oob::Channel::connect(ip, a.port, patience)?
            }
            None => {
                if !a.tsv {
                    outln!("\n************************************");
                    outln!("* Waiting for client to connect... *");
                    outln!("************************************");
                }
                oob::Channel::listen(a.port)?
            }
        };
        // Device: named, or the one whose address this connection uses.
        let dev = match &a.device {
            Some(n) => softrdma_verbs::by_name(n)?,
            None if client => {
                softrdma_verbs::by_addr(softrdma_verbs::route_source(chan.peer_ip()?)?)?
            }
            None => softrdma_verbs::by_addr(chan.local_ip()?)?,
        };
        (chan, dev)
    };
    let mut chan = chan;
    chan.port = a.port;
    let opts = open_options(&a);
    let out = setup::run_test(&p, &dev, &opts, ctx, chan, a.tsv)?;
    *LAST_TRANSPORT.lock().unwrap() = out.transport;
    if a.stats {
        outln!("{}", out.stats);
    }
    Ok(if out.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn resolve(h: &str) -> Result<IpAddr, Box<dyn std::error::Error>> {
    if let Ok(ip) = h.parse() {
        return Ok(ip);
    }
    use std::net::ToSocketAddrs;
    let mut it = (h, 0u16).to_socket_addrs()?;
    it.next()
        .map(|s| s.ip())
        .ok_or_else(|| fail(&format!("cannot resolve host '{h}'")))
}

/// Both ends from one command: the server in a child process (its output
/// discarded), the client here.
fn loopback(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("perf").arg(a.test.name());
    cmd.args(server_args(a, port));
    cmd.stdout(std::process::Stdio::null());
    // The server reports the CPU time of its peak computations here.
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: both are ours, just made, and owned from here on.
    let (rd, wr) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    {
        use std::os::fd::AsRawFd;
        let w = wr.as_raw_fd();
        cmd.env(PEAK_CPU_FD, w.to_string());
        // SAFETY: runs in the child between fork and exec, and only makes
        // the pipe's write end survive the exec (an async-signal-safe
        // fcntl).
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                if libc::fcntl(w, libc::F_SETFD, 0) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    let mut child = cmd.spawn()?;
    drop(wr);
    let mut me = a.clone();
    me.loopback = false;
    me.host = Some("127.0.0.1".into());
    me.port = port;
    let r = run(me);
    let status = child.wait()?;
    let code = r?;
    if a.tsv && a.test.is_bw() {
        // CPU time of both processes (all threads) per GB of payload moved.
        let p = Params::from_args(a)?;
        let ways = if p.bidir { 2 } else { 1 };
        let bytes: u64 = p
            .sizes
            .iter()
            .map(|s| s * p.iters * p.qps as u64)
            .sum::<u64>()
            * ways;
        // Not the peak computations, ours or the server's: they come after
        // the transfer (see `bench::PEAK_CPU_NS`).
        let theirs = {
            use std::io::Read;
            let mut s = String::new();
            let mut rd = rd;
            let _ = rd.read_to_string(&mut s);
            s.trim().parse::<u64>().unwrap_or(0)
        };
        let peaks =
            (bench::PEAK_CPU_NS.load(std::sync::atomic::Ordering::Relaxed) + theirs) as f64 / 1e9;
        let cpu = cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN) - peaks;
        outln!(
            "self.{}.{}.cpu_s_per_gb\t{}\t{:.3}\ts/GB",
            LAST_TRANSPORT.lock().unwrap(),
            a.test.name(),
            p.sizes[0],
            cpu / (bytes as f64 / 1e9)
        );
    }
    if !status.success() {
        eprintln!("softrdma perf: the server side exited with {status}");
        return Ok(ExitCode::from(1));
    }
    Ok(code)
}

fn open_options(a: &Args) -> softrdma_verbs::OpenOptions {
    softrdma_verbs::OpenOptions {
        fault: a.fault,
        pcap: a.pcap.clone(),
        port_mtu: None,
        transport: a.transport.map(TransportArg::verbs),
        cc: a
            .cc
            .as_deref()
            .map(|n| softrdma_core::cc::CcConfig::parse(n).expect("clap checked the spec")),
        selective_repeat: a.recovery.as_deref().map(|r| r == "sr"),
    }
}

fn cpu_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid rusage to write.
    unsafe { libc::getrusage(who, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The command line the loopback server runs with: the same test
/// parameters; a different fault seed so both directions see their own
/// impairments.
fn server_args(a: &Args, port: u16) -> Vec<String> {
    let mut v = vec!["-p".to_string(), port.to_string()];
    let mut push = |k: &str, val: Option<String>| {
        if let Some(x) = val {
            v.push(k.to_string());
            v.push(x);
        }
    };
    push("-s", a.size.map(|s| s.to_string()));
    push("-n", a.iters.map(|s| s.to_string()));
    push("-q", Some(a.qps.to_string()));
    push("-m", a.mtu.map(|s| s.to_string()));
    push("-D", a.duration.map(|s| s.to_string()));
    push("-f", a.margin.map(|s| s.to_string()));
    push("-t", a.tx_depth.map(|s| s.to_string()));
    push("-r", a.rx_depth.map(|s| s.to_string()));
    push("-Q", a.cq_mod.map(|s| s.to_string()));
    push("-o", a.outs.map(|s| s.to_string()));
    push("-l", a.post_list.map(|s| s.to_string()));
    push("-I", a.inline.map(|s| s.to_string()));
    push("-u", Some(a.qp_timeout.to_string()));
    push("-d", a.device.clone());
    push("--transport", a.transport.map(|t| t.name().to_string()));
    push(
        "-c",
        Some(
            match a.conn {
                Conn::Rc => "RC",
                Conn::Uc => "UC",
                Conn::Ud => "UD",
            }
            .into(),
        ),
    );
    push(
        "-A",
        Some(
            match a.atomic_type {
                AtomicType::FetchAndAdd => "FETCH_AND_ADD",
                AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            }
            .into(),
        ),
    );
    if let Some(cc) = &a.cc {
        push("--cc", Some(cc.clone()));
    }
    if let Some(f) = &a.fault {
        let mut f = *f;
        f.seed = f.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
        push("--fault", Some(f.to_string()));
    }
    if a.all {
        v.push("-a".into());
    }
    if a.bidir {
        v.push("-b".into());
    }
    if a.no_peak {
        v.push("-N".into());
    }
    if a.events {
        v.push("-e".into());
    }
    if a.check {
        v.push("--check".into());
    }
    if a.rdma_cm {
        v.push("-R".into());
    }
    if a.report_gbits {
        v.push("--report_gbits".into());
    }
    for (on, flag) in [
        (a.report_unsorted, "-U"),
        (a.report_histogram, "-H"),
        (a.report_cycles, "-C"),
    ] {
        if on {
            v.push(flag.into());
        }
    }
    v
}

/// The CPU's clock in MHz as perftest's `get_cpu_mhz` reads it: the
/// largest `cpu MHz` line of /proc/cpuinfo (perftest warns when they
/// differ; a VM's lines are its TSC's nominal rate).
fn cpu_mhz() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    s.lines()
        .filter(|l| l.starts_with("cpu MHz"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .filter(|m| *m > 0.0)
        .reduce(f64::max)
}
