//! `softrdma coll <name>_perf`: nccl-tests' benchmarks (all_reduce_perf,
//! all_gather_perf, reduce_scatter_perf, broadcast_perf, reduce_perf,
//! alltoall_perf, sendrecv_perf) over `softrdma-coll`, with nccl-tests'
//! flags and its output column for column (the format of nccl-tests
//! 2.19.6): the same header, rows, `#wrong` from a real check of every
//! rank's result, and the `# Avg bus bandwidth` footer.
//!
//! Ranks come from the launcher (`mpirun`, `srun`, torchrun: see
//! `softrdma_coll::boot`), or `--np N` starts N ranks on this host. Only
//! rank 0 prints, as nccl-tests does.

use std::process::{Child, Command, ExitCode};
use std::time::Instant;

use softrdma_coll::{parse_size, Buffer, Comm, Config, DataType, Launch, ReduceOp, Rendezvous};

/// The format version our output follows.
const NCCL_TESTS_FORMAT: &str = "2.19.6";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AlltoAll,
    SendRecv,
}

impl Coll {
    fn parse(s: &str) -> Option<Coll> {
        Some(match s {
            "all_reduce_perf" => Coll::AllReduce,
            "all_gather_perf" => Coll::AllGather,
            "reduce_scatter_perf" => Coll::ReduceScatter,
            "broadcast_perf" => Coll::Broadcast,
            "reduce_perf" => Coll::Reduce,
            "alltoall_perf" => Coll::AlltoAll,
            "sendrecv_perf" => Coll::SendRecv,
            _ => return None,
        })
    }
    fn has_op(self) -> bool {
        matches!(
            self,
            Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce | Coll::SendRecv
        )
    }
    fn has_root(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }
    /// busbw = algbw × this (nccl-tests' factors).
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AlltoAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }
    /// (count column, send elements, receive elements) for `bytes`.
    fn counts(self, bytes: usize, ws: usize, n: usize) -> (usize, usize, usize) {
        let count = bytes / ws;
        // nccl-tests keeps per-rank blocks 16-byte aligned.
        let base = (count / n) & !((16 / ws).max(1) - 1);
        match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => {
                (count, count, count)
            }
            Coll::AllGather => (base, base, base * n),
            Coll::ReduceScatter => (base, base * n, base),
            Coll::AlltoAll => (base, base * n, base * n),
        }
    }
    /// Whether it combines the ranks' data by its operator.
    fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }
    /// In-place rows of these are timed but not checked (N/A), as in
    /// nccl-tests.
    fn checks_in_place(self) -> bool {
        !matches!(self, Coll::AlltoAll | Coll::SendRecv)
    }
}

#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub struct Args {
    /// all_reduce_perf, all_gather_perf, reduce_scatter_perf,
    /// broadcast_perf, reduce_perf, alltoall_perf or sendrecv_perf.
    test: String,
    /// Threads per process (only 1: one rank per process).
    #[arg(short = 't', long = "nthreads", default_value_t = 1)]
    nthreads: usize,
    /// Devices per thread (only 1).
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    ngpus: usize,
    /// Smallest size (bytes; K, M, G suffixes are powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "32M")]
    minbytes: String,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    maxbytes: String,
    /// Increment between sizes (when the factor is 1).
    #[arg(short = 'i', long = "stepbytes", default_value = "1M")]
    stepbytes: String,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    stepfactor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: u32,
    /// Operations aggregated per iteration.
    #[arg(short = 'm', long = "agg_iters", default_value_t = 1)]
    agg_iters: u32,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    warmup: u32,
    /// Times to run the whole sweep.
    #[arg(short = 'N', long = "run_cycles", default_value_t = 1)]
    cycles: u32,
    /// Check iterations (0: no check, #wrong is N/A).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u32,
    /// sum, prod, min, max, avg or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// int8, uint8, int32, uint32, int64, uint64, half, float, double,
    /// bfloat16 or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    datatype: String,
    /// Root rank (-1: every rank in turn).
    #[arg(
        short = 'r',
        long = "root",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    root: i64,
    /// Blocking mode (accepted; every collective here is blocking).
    #[arg(short = 'z', long = "blocking", default_value_t = 0)]
    blocking: u32,
    /// Time reported: 0 rank 0's, 1 the mean, 2 the min, 3 the max over ranks.
    #[arg(short = 'a', long = "average", default_value_t = 1)]
    average: u32,
    /// Start this many ranks on this host (rank 0 is this process).
    #[arg(long = "np")]
    np: Option<usize>,
    /// Print help.
    #[arg(short = 'h', long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

fn types(s: &str) -> Result<Vec<DataType>, String> {
    if s == "all" {
        return Ok(DataType::ALL.to_vec());
    }
    DataType::parse(s)
        .map(|t| vec![t])
        .ok_or_else(|| format!("invalid type {s}"))
}

fn ops(s: &str) -> Result<Vec<ReduceOp>, String> {
    if s == "all" {
        return Ok(ReduceOp::ALL.to_vec());
    }
    ReduceOp::parse(s)
        .map(|o| vec![o])
        .ok_or_else(|| format!("invalid op {s}"))
}

/// nccl-tests' `getFloatStr`: the value in `w` columns, with 2, 1 or 0
/// decimals, whichever first fits, else in exponent form.
pub fn float_str(v: f64, w: usize) -> String {
    for p in [2, 1, 0] {
        let s = format!("{v:>w$.p$}");
        if s.len() <= w {
            return s;
        }
    }
    let s = c_exp(v, if w >= 7 { 1 } else { 0 });
    format!("{s:>w$}")
}

/// C's `%.{p}e`: Rust's `{:e}` without the sign and two digits of exponent.
fn c_exp(v: f64, p: usize) -> String {
    let s = format!("{v:.p$e}");
    let (m, e) = s.split_once('e').expect("an exponent");
    let e: i32 = e.parse().expect("an integer exponent");
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// C's `%g` (6 significant digits, trailing zeros dropped).
pub fn c_g(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let exp = v.abs().log10().floor() as i32;
    if !(-4..6).contains(&exp) {
        let s = c_exp(v, 5);
        let (m, e) = s.split_once('e').expect("an exponent");
        let m = if m.contains('.') {
            m.trim_end_matches('0').trim_end_matches('.')
        } else {
            m
        };
        return format!("{m}e{e}");
    }
    let decimals = (5 - exp).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A 64-bit mix (splitmix64's finaliser): neighbouring inputs give
/// unrelated outputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The value of element `i` of rank `rank`'s input in check `rep`, for a
/// reduction by `op` (None: a collective that only moves data). Each is a
/// hash of all three, so an element from another rank, another block or
/// another offset differs from the one due (a formula linear in them
/// repeats every few ranks and elements: a block delivered to the wrong
/// rank went unseen). Small integers, so every reduction is exact in every
/// type whatever order the ranks' contributions are combined in (sums of
/// up to 85 ranks fit bfloat16's 8 bits of mantissa; products are powers
/// of two); data only moved takes 256 values (exact in every type).
fn pattern(op: Option<ReduceOp>, seed: u64, i: usize, dt: DataType) -> i64 {
    let h = mix(seed ^ i as u64);
    let signed = !matches!(dt, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
    let (m, lo) = match op {
        Some(ReduceOp::Prod) => return (h % 2) as i64 + 1,
        Some(_) => (4, 1),
        None => (256, 128),
    };
    (h % m) as i64 - if signed { lo } else { 0 }
}

/// The seed of `rank`'s input in check `rep`.
fn seed(rank: usize, rep: usize) -> u64 {
    mix(mix(rep as u64) ^ rank as u64)
}

fn encode(dt: DataType, v: i64, out: &mut [u8]) {
    match dt {
        DataType::Int8 | DataType::Uint8 => out[0] = v as u8,
        DataType::Int32 | DataType::Uint32 => out.copy_from_slice(&(v as u32).to_le_bytes()),
        DataType::Int64 | DataType::Uint64 => out.copy_from_slice(&(v as u64).to_le_bytes()),
        DataType::Half => out.copy_from_slice(&half::f16::from_f32(v as f32).to_le_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&half::bf16::from_f32(v as f32).to_le_bytes()),
        DataType::Float => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::Double => out.copy_from_slice(&(v as f64).to_le_bytes()),
    }
}

/// Elements `first..first + out.len()/ws` of `rank`'s input (for a
/// reduction by `op`; None: data only moved).
fn fill(dt: DataType, op: Option<ReduceOp>, rank: usize, rep: usize, first: usize, out: &mut [u8]) {
    let ws = dt.size();
    let seed = seed(rank, rep);
    for (k, e) in out.chunks_exact_mut(ws).enumerate() {
        encode(dt, pattern(op, seed, first + k, dt), e);
    }
}

/// The reduction over `ranks` of elements `first..` (`out.len()/ws` of
/// them), as the collective must compute it.
fn reduced(dt: DataType, op: ReduceOp, ranks: usize, rep: usize, first: usize, out: &mut [u8]) {
    fill(dt, Some(op), 0, rep, first, out);
    let mut tmp = vec![0u8; out.len()];
    let n = out.len() / dt.size();
    for j in 1..ranks {
        fill(dt, Some(op), j, rep, first, &mut tmp);
        // SAFETY: both are local vectors of `n` elements.
        unsafe { softrdma_coll::reduce::reduce_into(dt, op, out.as_mut_ptr(), tmp.as_ptr(), n) };
    }
    // SAFETY: `out` holds `n` elements.
    unsafe { softrdma_coll::reduce::finish(dt, op, out.as_mut_ptr(), n, ranks) };
}

/// A case's element counts: the count column, and the send and receive
/// buffers' elements.
#[derive(Clone, Copy)]
struct Sizes {
    count: usize,
    send_n: usize,
    recv_n: usize,
}

struct Bufs {
    send: Buffer,
    recv: Buffer,
}

struct Case {
    coll: Coll,
    dt: DataType,
    op: ReduceOp,
    root: usize,
}

/// Where each collective's send and receive places are, in or out of place.
fn run_once(
    comm: &mut Comm,
    c: &Case,
    b: &Bufs,
    count: usize,
    in_place: bool,
) -> softrdma_coll::Result<()> {
    let ws = c.dt.size();
    let r = comm.rank();
    let n = comm.size();
    let recv = b.recv.at(0);
    let send = if !in_place {
        b.send.at(0)
    } else {
        match c.coll {
            Coll::AllGather => b.recv.at(r * count * ws),
            _ => b.recv.at(0),
        }
    };
    let recv = if in_place && c.coll == Coll::ReduceScatter {
        b.recv.at(r * count * ws)
    } else {
        recv
    };
    match c.coll {
        Coll::AllReduce => comm.all_reduce(send, recv, count, c.dt, c.op),
        Coll::AllGather => comm.all_gather(send, recv, count, c.dt),
        Coll::ReduceScatter => comm.reduce_scatter(send, recv, count, c.dt, c.op),
        Coll::Broadcast => comm.broadcast(send, recv, count, c.dt, c.root),
        Coll::Reduce => comm.reduce(send, recv, count, c.dt, c.op, c.root),
        Coll::AlltoAll => comm.all_to_all(send, recv, count, c.dt),
        Coll::SendRecv => comm.send_recv(send, (r + 1) % n, recv, (r + n - 1) % n, count, c.dt),
    }
}

/// Put this rank's input in place for one run (and zero the output).
fn init_data(
    comm: &Comm,
    c: &Case,
    b: &Bufs,
    z: Sizes,
    in_place: bool,
    rep: usize,
) -> softrdma_coll::Result<()> {
    let Sizes {
        count,
        send_n,
        recv_n,
    } = z;
    let ws = c.dt.size();
    let r = comm.rank();
    let mut v = vec![0u8; send_n * ws];
    // Rank r's input: for AllGather its `count` elements; for
    // ReduceScatter and AlltoAll `n` blocks, element indices global.
    fill(c.dt, c.coll.reduces().then_some(c.op), r, rep, 0, &mut v);
    let zeros = vec![0u8; recv_n * ws];
    b.recv.write_bytes(0, &zeros)?;
    if in_place {
        let at = if c.coll == Coll::AllGather {
            r * count * ws
        } else {
            0
        };
        b.recv.write_bytes(at, &v)?;
    } else {
        b.send.write_bytes(0, &v)?;
    }
    Ok(())
}

/// Wrong elements of this rank's result.
fn check(
    comm: &Comm,
    c: &Case,
    b: &Bufs,
    count: usize,
    recv_n: usize,
    in_place: bool,
    rep: usize,
) -> softrdma_coll::Result<u64> {
    let (r, n) = (comm.rank(), comm.size());
    let ws = c.dt.size();
    let (dt, op) = (c.dt, c.op);
    let (at, len) = match c.coll {
        Coll::ReduceScatter if in_place => (r * count * ws, count),
        _ => (0, recv_n),
    };
    let mut got = vec![0u8; len * ws];
    b.recv.read_bytes(at, &mut got)?;
    let mut want = vec![0u8; len * ws];
    match c.coll {
        Coll::AllReduce => reduced(dt, op, n, rep, 0, &mut want),
        Coll::AllGather => {
            for k in 0..n {
                fill(
                    dt,
                    None,
                    k,
                    rep,
                    0,
                    &mut want[k * count * ws..(k + 1) * count * ws],
                );
            }
        }
        Coll::ReduceScatter => reduced(dt, op, n, rep, r * count, &mut want),
        Coll::Broadcast => fill(dt, None, c.root, rep, 0, &mut want),
        Coll::Reduce => {
            if r == c.root {
                reduced(dt, op, n, rep, 0, &mut want)
            } else if in_place {
                fill(dt, Some(op), r, rep, 0, &mut want)
            }
        }
        Coll::AlltoAll => {
            for j in 0..n {
                fill(
                    dt,
                    None,
                    j,
                    rep,
                    r * count,
                    &mut want[j * count * ws..(j + 1) * count * ws],
                );
            }
        }
        Coll::SendRecv => fill(dt, None, (r + n - 1) % n, rep, 0, &mut want),
    }
    Ok(got
        .chunks_exact(ws)
        .zip(want.chunks_exact(ws))
        .filter(|(a, b)| a != b)
        .count() as u64)
}

fn gather_f64(comm: &mut Comm, v: f64) -> softrdma_coll::Result<Vec<f64>> {
    Ok(comm
        .allgather_bytes(&v.to_le_bytes())?
        .iter()
        .map(|b| f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])))
        .collect())
}

/// What a test's checks found wrong: elements summed over the ranks (the
/// `#wrong` column), and how many ranks' checks found any (nccl-tests'
/// "Out of bounds values" adds these up over the run).
#[derive(Clone, Copy)]
struct Wrong {
    elements: u64,
    ranks: u64,
}

/// One out-of-place or in-place measurement: (µs per op, what its checks
/// found wrong; None when not checked).
#[allow(clippy::too_many_arguments)]
fn bench(
    comm: &mut Comm,
    a: &Args,
    c: &Case,
    b: &Bufs,
    z: Sizes,
    in_place: bool,
) -> softrdma_coll::Result<(f64, Option<Wrong>)> {
    let Sizes { count, recv_n, .. } = z;
    if a.check > 0 {
        init_data(comm, c, b, z, in_place, 99)?;
    }
    run_once(comm, c, b, count, in_place)?;
    comm.barrier()?;
    let iters = (a.iters * a.agg_iters.max(1)).max(1);
    let t0 = Instant::now();
    for _ in 0..iters {
        run_once(comm, c, b, count, in_place)?;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let all = gather_f64(comm, us)?;
    let us = match a.average {
        0 => all[0],
        2 => all.iter().cloned().fold(f64::INFINITY, f64::min),
        3 => all.iter().cloned().fold(0.0, f64::max),
        _ => all.iter().sum::<f64>() / all.len() as f64,
    };
    let checked = a.check > 0 && (!in_place || c.coll.checks_in_place());
    let mut wrong = None;
    if a.check > 0 {
        let (mut total, mut ranks) = (0.0, 0);
        for rep in 0..a.check as usize {
            init_data(comm, c, b, z, in_place, rep)?;
            run_once(comm, c, b, count, in_place)?;
            let w = if checked {
                check(comm, c, b, count, recv_n, in_place, rep)?
            } else {
                0
            };
            let all = gather_f64(comm, w as f64)?;
            total = all.iter().sum::<f64>();
            // nccl-tests counts, per rank, every check that found its
            // result wrong (the footer's "Out of bounds values").
            ranks += all.iter().filter(|&&w| w > 0.0).count() as u64;
            if total > 0.0 {
                break;
            }
        }
        if checked {
            wrong = Some(Wrong {
                elements: total as u64,
                ranks,
            });
        }
    }
    Ok((us, wrong))
}

fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: gethostname writes at most `b.len()` bytes into `b`.
    let rc = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let s = String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or(&[])).to_string();
    s.split('.').next().unwrap_or("").to_string()
}

/// Start ranks 1..np of a local job (this process is rank 0).
fn spawn_local(np: usize) -> Result<(Launch, Vec<Child>), Box<dyn std::error::Error>> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let exe = std::env::current_exe()?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // Drop `--np N` / `--np=N`.
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--np" {
            args.drain(i..(i + 2).min(args.len()));
        } else if args[i].starts_with("--np=") {
            args.remove(i);
        } else {
            i += 1;
        }
    }
    let mut kids = Vec::new();
    for r in 1..np {
        let mut cmd = Command::new(&exe);
        // A launcher's own variables (this process may be one of its
        // ranks) would take precedence over ours in the children.
        for k in [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            "SLURM_PROCID",
            "SLURM_NTASKS",
        ] {
            cmd.env_remove(k);
        }
        let child = cmd
            .args(&args)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", np.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", np.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("SOFTRDMA_COLL_LOCAL", "1")
            .stdout(std::process::Stdio::null())
            .spawn()?;
        kids.push(child);
    }
    std::env::set_var("LOCAL_WORLD_SIZE", np.to_string());
    // The timeouts as the environment sets them, no launcher's variables.
    let base = Launch::from_vars(|k| {
        k.starts_with("SOFTRDMA_COLL_")
            .then(|| std::env::var(k).ok())
            .flatten()
    })?;
    Ok((
        Launch {
            rank: 0,
            size: np,
            rendezvous: Rendezvous::Listener(l),
            launcher: "softrdma",
            timeout: base.timeout,
            op_timeout: base.op_timeout,
        },
        kids,
    ))
}

pub fn run(a: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let coll = Coll::parse(&a.test).ok_or_else(|| {
        format!(
            "unknown test '{}': all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf, reduce_perf, alltoall_perf or sendrecv_perf",
            a.test
        )
    })?;
    if a.nthreads != 1 || a.ngpus != 1 {
        return Err(
            "one rank per process (-t 1 -g 1): start more ranks with a launcher or --np".into(),
        );
    }
    let size = |s: &str, what: &str| {
        parse_size(s).ok_or_else(|| format!("invalid size specified for '{what}': {s}"))
    };
    let minb = size(&a.minbytes, "minbytes")? as usize;
    let maxb = size(&a.maxbytes, "maxbytes")? as usize;
    let stepb = size(&a.stepbytes, "stepbytes")? as usize;
    if minb > maxb {
        return Err(format!("minbytes {minb} is larger than maxbytes {maxb}").into());
    }
    if (a.stepfactor > 1 && minb == 0) || (a.stepfactor <= 1 && stepb == 0) {
        return Err("the sizes never grow: -b 0 with -f, or -i 0".into());
    }
    let types = types(&a.datatype)?;
    let ops = if coll.has_op() {
        ops(&a.op)?
    } else {
        vec![ReduceOp::Sum]
    };

    let (launch, mut kids) = match a.np {
        Some(0) => return Err("--np 0: at least one rank".into()),
        Some(np) => spawn_local(np)?,
        None => (Launch::from_env()?, Vec::new()),
    };
    let result = run_ranks(&a, coll, launch, minb, maxb, stepb, &types, &ops);
    let mut code = match result {
        Ok(c) => c,
        Err(e) => {
            // End the ranks this process started (a failed rank 0 leaves
            // them waiting).
            for k in &mut kids {
                let _ = k.kill();
            }
            for k in &mut kids {
                let _ = k.wait();
            }
            return Err(e);
        }
    };
    for (i, k) in kids.iter_mut().enumerate() {
        let st = k.wait()?;
        if !st.success() {
            eprintln!("softrdma coll: rank {} exited with {st}", i + 1);
            code = ExitCode::FAILURE;
        }
    }
    Ok(code)
}

#[allow(clippy::too_many_arguments)]
fn run_ranks(
    a: &Args,
    coll: Coll,
    launch: Launch,
    minb: usize,
    maxb: usize,
    stepb: usize,
    types: &[DataType],
    ops: &[ReduceOp],
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut comm = Comm::init(launch, Config::from_env()?)?;
    let (r, n) = (comm.rank(), comm.size());
    let me = r == 0;
    let out = |s: String| {
        if me {
            outln!("{s}");
        }
    };
    // Buffers for the largest size of the widest layout.
    let (_, send_max, recv_max) = coll.counts(maxb, 1, n);
    let bufs = Bufs {
        send: comm.alloc(send_max.max(maxb))?,
        recv: comm.alloc(recv_max.max(maxb))?,
    };
    let (step, step_kind) = if a.stepfactor > 1 {
        (a.stepfactor as usize, "factor")
    } else {
        (stepb, "bytes")
    };
    out(format!(
        "# nccl-tests version {NCCL_TESTS_FORMAT} format: softrdma-coll {} over softrdma verbs",
        env!("CARGO_PKG_VERSION")
    ));
    out(format!("# Collective test starting: {}", a.test));
    out(format!(
        "# nThread {} nGpus {} minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: {} unalign: {}",
        a.nthreads, a.ngpus, minb, maxb, step, step_kind, a.warmup, a.iters, a.agg_iters, a.check, 0, 0
    ));
    out("#".into());
    out("# Using devices".into());
    let line = format!(
        "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device {:2} [{}] softrdma {} ({})",
        r,
        0,
        std::process::id(),
        hostname(),
        0,
        comm.context().device().name,
        comm.context().device().addr,
        comm.transport()
    );
    let lines = comm.allgather_bytes(line.as_bytes())?;
    for l in &lines {
        out(String::from_utf8_lossy(l).to_string());
    }
    out("#".into());
    out(format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    ));
    out(format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
    ));
    out(format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    ));
    let roots: Vec<usize> = if !coll.has_root() {
        vec![0]
    } else if a.root < 0 {
        (0..n).collect()
    } else if (a.root as usize) < n {
        vec![a.root as usize]
    } else {
        return Err(format!("root {} of {n} ranks", a.root).into());
    };
    let mut bw_sum = 0.0;
    let mut bw_rows = 0u64;
    let mut errors = 0u64;
    for &dt in types {
        for &op in ops {
            for &root in &roots {
                let c = Case { coll, dt, op, root };
                let ws = dt.size();
                comm.barrier()?;
                // Warm-up: every size from the smallest, doubling.
                let mut s = minb.max(1);
                while s <= maxb {
                    let (count, _, _) = coll.counts(s, ws, n);
                    for _ in 0..a.warmup {
                        run_once(&mut comm, &c, &bufs, count, false)?;
                    }
                    s *= 2;
                }
                // nccl-tests' `do { … } while (--repeat)`: -N 0 never ends.
                let mut repeat = i64::from(a.cycles);
                loop {
                    let mut s = minb;
                    while s <= maxb {
                        let (count, send_n, recv_n) = coll.counts(s, ws, n);
                        let bytes = send_n.max(recv_n) * ws;
                        let mut row = format!(
                            "{:12}  {:12}  {:>8}  {:>6}  {:6}",
                            bytes,
                            count,
                            dt.name(),
                            if coll.has_op() { op.name() } else { "none" },
                            if coll.has_root() { root as i64 } else { -1 }
                        );
                        for in_place in [false, true] {
                            let (us, wrong) = bench(
                                &mut comm,
                                a,
                                &c,
                                &bufs,
                                Sizes {
                                    count,
                                    send_n,
                                    recv_n,
                                },
                                in_place,
                            )?;
                            let algbw = bytes as f64 / 1e9 / (us / 1e6);
                            let busbw = algbw * coll.bus_factor(n);
                            bw_sum += busbw;
                            bw_rows += 1;
                            row.push_str(&format!(
                                "  {:>7}  {:>6}  {:>6}",
                                float_str(us, 7),
                                float_str(algbw, 6),
                                float_str(busbw, 6)
                            ));
                            match wrong {
                                Some(w) => {
                                    errors += w.ranks;
                                    row.push_str(&format!("  {:>6}", c_g(w.elements as f64)));
                                }
                                None => row.push_str("     N/A"),
                            }
                        }
                        out(row);
                        s = if a.stepfactor > 1 {
                            s * a.stepfactor as usize
                        } else {
                            s + stepb
                        };
                        if s == 0 {
                            break;
                        }
                    }
                    repeat -= 1;
                    if repeat == 0 {
                        break;
                    }
                }
            }
        }
    }
    let avg = if bw_rows > 0 {
        bw_sum / bw_rows as f64
    } else {
        0.0
    };
    out(format!(
        "# Out of bounds values : {} {}",
        errors,
        if errors == 0 { "OK" } else { "FAILED" }
    ));
    out(format!("# Avg bus bandwidth    : {} ", c_g(avg)));
    out("#".into());
    out(format!("# Collective test concluded: {}", a.test));
    out("#".into());
    out(String::new());
    comm.barrier()?;
    if std::env::var_os("SOFTRDMA_COLL_DEBUG").is_some() {
        let (st, _) = comm.context().stats();
        eprintln!("rank {r}: {:?} {:?}", comm.context().shm_stats(), st);
    }
    Ok(if errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_shrink_to_fit_as_nccl_tests_prints_them() {
        assert_eq!(float_str(0.0, 7), "   0.00");
        assert_eq!(float_str(9999.96, 7), "9999.96");
        assert_eq!(float_str(10000.04, 7), "10000.0");
        assert_eq!(float_str(99999.96, 7), " 100000");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(9999999.6, 7), "1.0e+07");
        assert_eq!(float_str(9999.96, 6), " 10000");
        assert_eq!(float_str(1e6, 6), " 1e+06");
    }

    #[test]
    fn g_format_is_cs() {
        assert_eq!(c_g(0.0), "0");
        assert_eq!(c_g(12.0), "12");
        assert_eq!(c_g(2.2151), "2.2151");
        assert_eq!(c_g(3.456789), "3.45679");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(c_g(0.000123), "0.000123");
    }

    /// Every rank's input differs from every other's, and every block of
    /// one rank's input from its other blocks, at the counts the tools use
    /// (multiples of 4 elements): else a block delivered to the wrong rank,
    /// or the wrong block reduced, checks as right.
    #[test]
    fn inputs_tell_ranks_and_blocks_apart() {
        for dt in DataType::ALL {
            let ws = dt.size();
            for (coll, op) in [
                (Coll::AlltoAll, ReduceOp::Sum),
                (Coll::ReduceScatter, ReduceOp::Sum),
                (Coll::ReduceScatter, ReduceOp::Prod),
            ] {
                let op = coll.reduces().then_some(op);
                for count in [64, 1024] {
                    let mut seen = std::collections::HashSet::new();
                    for rank in 0..8 {
                        for block in 0..8 {
                            let mut v = vec![0u8; count * ws];
                            fill(dt, op, rank, 1, block * count, &mut v);
                            assert!(
                                seen.insert(v),
                                "{} {coll:?} {op:?}: rank {rank} block {block} of {count} is another's",
                                dt.name()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn counts_follow_nccl_tests() {
        // AllGather, 2 ranks, float: 8 and 16 bytes round down to 0.
        assert_eq!(Coll::AllGather.counts(8, 4, 2), (0, 0, 0));
        assert_eq!(Coll::AllGather.counts(16, 4, 2), (0, 0, 0));
        assert_eq!(Coll::AllGather.counts(32, 4, 2), (4, 4, 8));
        // 3 ranks, 1 MiB: 87380 elements per rank.
        assert_eq!(Coll::AllGather.counts(1 << 20, 4, 3).0, 87380);
        assert_eq!(
            Coll::AllReduce.counts(1 << 20, 4, 3),
            (262144, 262144, 262144)
        );
    }
}
