//! Every collective × element type × operator, in place and out of place,
//! over odd counts, checked element by element against a reference this
//! test computes itself: with 1 to 8 ranks as processes of this host
//! (started as Open MPI's `mpirun` starts them: the same environment
//! variables, so the local rendezvous is the one an `mpirun` job uses),
//! and with ranks in network namespaces this test creates (each its own
//! host: UDP between them, a TCP rendezvous on MASTER_ADDR).
//!
//! Each rank is a copy of this test binary running `rank_child`; it exits
//! non-zero, naming the first wrong element, if any result is wrong.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use softrdma_coll::{Algo, Buffer, Comm, DataType, ReduceOp};

const CHILD: &str = "SOFTRDMA_COLL_TEST_CHILD";
/// Counts of elements per case: one, odd, not a multiple of anything,
/// and several chunks (the ranks run with 4 KiB chunks).
const COUNTS: [usize; 4] = [1, 7, 1031, 9001];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coll {
    AllReduce(Algo),
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AlltoAll,
    SendRecv,
}

fn value(dt: DataType, op: ReduceOp, rank: usize, i: usize) -> i128 {
    let x = (i * 5 + rank * 3 + 1) as i128;
    let signed = !matches!(dt, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
    match op {
        ReduceOp::Prod => x % 2 + 1,
        _ if signed => x % 4 - 1,
        _ => x % 4,
    }
}

fn encode(dt: DataType, v: i128) -> Vec<u8> {
    match dt {
        DataType::Int8 | DataType::Uint8 => vec![v as u8],
        DataType::Int32 | DataType::Uint32 => (v as u32).to_le_bytes().to_vec(),
        DataType::Int64 | DataType::Uint64 => (v as u64).to_le_bytes().to_vec(),
        DataType::Half => half::f16::from_f64(v as f64).to_le_bytes().to_vec(),
        DataType::Bfloat16 => half::bf16::from_f64(v as f64).to_le_bytes().to_vec(),
        DataType::Float => (v as f32).to_le_bytes().to_vec(),
        DataType::Double => (v as f64).to_le_bytes().to_vec(),
    }
}

/// The reduction of element `i` over `n` ranks, as bytes of `dt`.
fn reduced(dt: DataType, op: ReduceOp, n: usize, i: usize) -> Vec<u8> {
    let vals: Vec<i128> = (0..n).map(|r| value(dt, op, r, i)).collect();
    let wrap = |v: i128| -> i128 {
        match dt {
            DataType::Int8 => v as i8 as i128,
            DataType::Uint8 => v as u8 as i128,
            DataType::Int32 => v as i32 as i128,
            DataType::Uint32 => v as u32 as i128,
            DataType::Int64 => v as i64 as i128,
            DataType::Uint64 => v as u64 as i128,
            _ => v,
        }
    };
    let sum: i128 = vals.iter().sum();
    match op {
        ReduceOp::Sum => encode(dt, wrap(sum)),
        ReduceOp::Prod => encode(dt, wrap(vals.iter().product())),
        ReduceOp::Min => encode(dt, *vals.iter().min().unwrap()),
        ReduceOp::Max => encode(dt, *vals.iter().max().unwrap()),
        ReduceOp::Avg => match dt {
            // Integers: the wrapped sum, divided with truncation.
            DataType::Int8
            | DataType::Uint8
            | DataType::Int32
            | DataType::Uint32
            | DataType::Int64
            | DataType::Uint64 => encode(dt, wrap(sum) / n as i128),
            DataType::Double => (sum as f64 / n as f64).to_le_bytes().to_vec(),
            DataType::Float => (sum as f32 / n as f32).to_le_bytes().to_vec(),
            DataType::Half => half::f16::from_f32(sum as f32 / n as f32)
                .to_le_bytes()
                .to_vec(),
            DataType::Bfloat16 => half::bf16::from_f32(sum as f32 / n as f32)
                .to_le_bytes()
                .to_vec(),
        },
    }
}

fn input(dt: DataType, op: ReduceOp, rank: usize, first: usize, count: usize) -> Vec<u8> {
    (first..first + count)
        .flat_map(|i| encode(dt, value(dt, op, rank, i)))
        .collect()
}

fn fail(what: String) -> ! {
    eprintln!("RANK FAILED: {what}");
    std::process::exit(1);
}

#[allow(clippy::too_many_arguments)]
fn one_case(
    comm: &mut Comm,
    send: &Buffer,
    recv: &Buffer,
    coll: Coll,
    dt: DataType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    root: usize,
) {
    let (r, n) = (comm.rank(), comm.size());
    let es = dt.size();
    let marker = vec![0xa5u8; recv.len()];
    recv.write_bytes(0, &marker).unwrap();
    // Inputs.
    let mine = match coll {
        Coll::ReduceScatter | Coll::AlltoAll => input(dt, op, r, 0, count * n),
        _ => input(dt, op, r, 0, count),
    };
    let (s, d) = if in_place {
        let at = if coll == Coll::AllGather {
            r * count * es
        } else {
            0
        };
        recv.write_bytes(at, &mine).unwrap();
        let d = if coll == Coll::ReduceScatter {
            recv.at(r * count * es)
        } else {
            recv.at(0)
        };
        (recv.at(at), d)
    } else {
        send.write_bytes(0, &mine).unwrap();
        (send.at(0), recv.at(0))
    };
    let res = match coll {
        Coll::AllReduce(a) => {
            comm.set_all_reduce_algo(Some(a));
            comm.all_reduce(s, d, count, dt, op)
        }
        Coll::AllGather => comm.all_gather(s, d, count, dt),
        Coll::ReduceScatter => comm.reduce_scatter(s, d, count, dt, op),
        Coll::Broadcast => comm.broadcast(s, d, count, dt, root),
        Coll::Reduce => comm.reduce(s, d, count, dt, op, root),
        Coll::AlltoAll => comm.all_to_all(s, d, count, dt),
        Coll::SendRecv => comm.send_recv(s, (r + 1) % n, d, (r + n - 1) % n, count, dt),
    };
    let case = format!(
        "rank {r} of {n}: {coll:?} {} {} count {count} {} root {root}",
        dt.name(),
        op.name(),
        if in_place { "in place" } else { "out of place" }
    );
    if let Err(e) = res {
        fail(format!("{case}: {e}"));
    }
    // What this rank's receive buffer must hold, and where.
    let (at, want): (usize, Vec<u8>) = match coll {
        Coll::AllReduce(_) => (0, (0..count).flat_map(|i| reduced(dt, op, n, i)).collect()),
        Coll::AllGather => (0, (0..n).flat_map(|k| input(dt, op, k, 0, count)).collect()),
        Coll::ReduceScatter => (
            if in_place { r * count * es } else { 0 },
            (r * count..(r + 1) * count)
                .flat_map(|i| reduced(dt, op, n, i))
                .collect(),
        ),
        Coll::Broadcast => (0, input(dt, op, root, 0, count)),
        Coll::Reduce if r == root => (0, (0..count).flat_map(|i| reduced(dt, op, n, i)).collect()),
        // Not the root: the receive buffer is untouched.
        Coll::Reduce if in_place => (0, mine.clone()),
        Coll::Reduce => (0, vec![0xa5; count * es]),
        Coll::AlltoAll => (
            0,
            (0..n)
                .flat_map(|j| input(dt, op, j, r * count, count))
                .collect(),
        ),
        Coll::SendRecv => (0, input(dt, op, (r + n - 1) % n, 0, count)),
    };
    let mut got = vec![0u8; want.len()];
    recv.read_bytes(at, &mut got).unwrap();
    if let Some(k) =
        (0..want.len() / es).find(|&k| got[k * es..(k + 1) * es] != want[k * es..(k + 1) * es])
    {
        fail(format!(
            "{case}: element {k} is {:02x?}, should be {:02x?}",
            &got[k * es..(k + 1) * es],
            &want[k * es..(k + 1) * es]
        ));
    }
    // Nothing written past the result.
    let end = at + want.len();
    let mut tail = vec![0u8; (recv.len() - end).min(64)];
    recv.read_bytes(end, &mut tail).unwrap();
    let untouched_tail = match coll {
        // In place, the rest of the buffer holds the other blocks' input.
        Coll::ReduceScatter if in_place => true,
        _ => tail.iter().all(|&b| b == 0xa5),
    };
    if !untouched_tail {
        fail(format!(
            "{case}: wrote past its {} result bytes",
            want.len()
        ));
    }
}

/// One rank of a sweep (started by `ranks` below).
#[test]
fn rank_child() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let mut comm = Comm::from_env().unwrap_or_else(|e| fail(format!("joining: {e}")));
    let n = comm.size();
    let max = COUNTS.iter().max().unwrap() * n * 8;
    let send = comm.alloc(max).unwrap();
    let recv = comm.alloc(max + 4096).unwrap();
    let colls = [
        Coll::AllReduce(Algo::Ring),
        Coll::AllReduce(Algo::RecursiveDoubling),
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AlltoAll,
        Coll::SendRecv,
    ];
    let mut cases = 0;
    for coll in colls {
        let reduces = matches!(
            coll,
            Coll::AllReduce(_) | Coll::ReduceScatter | Coll::Reduce
        );
        let ops: &[ReduceOp] = if reduces {
            &ReduceOp::ALL
        } else {
            &[ReduceOp::Sum]
        };
        let roots: Vec<usize> = if matches!(coll, Coll::Broadcast | Coll::Reduce) {
            let mut v = vec![0, n - 1];
            v.dedup();
            v
        } else {
            vec![0]
        };
        for dt in DataType::ALL {
            for &op in ops {
                for count in COUNTS {
                    for in_place in [false, true] {
                        for &root in &roots {
                            one_case(&mut comm, &send, &recv, coll, dt, op, count, in_place, root);
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    comm.barrier().unwrap();
    println!(
        "RANK {} OK: {cases} cases over {}",
        comm.rank(),
        comm.transport()
    );
}

fn wait_all(mut kids: Vec<(usize, Child)>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut failed = Vec::new();
    while !kids.is_empty() {
        let mut i = 0;
        while i < kids.len() {
            if let Some(st) = kids[i].1.try_wait().unwrap() {
                let (r, c) = kids.remove(i);
                let out = c.wait_with_output().unwrap();
                let stdout = String::from_utf8_lossy(&out.stdout).to_string();
                if !st.success() || !stdout.contains("OK:") {
                    failed.push(format!(
                        "rank {r} ({st}):\n{stdout}\n{}",
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
            } else {
                i += 1;
            }
        }
        if Instant::now() > deadline {
            for (_, c) in &mut kids {
                let _ = c.kill();
            }
            panic!("{what}: ranks still running after 240 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(failed.is_empty(), "{what}:\n{}", failed.join("\n"));
}

fn child_cmd(prefix: &[String]) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = if prefix.is_empty() {
        Command::new(&exe)
    } else {
        let mut c = Command::new(&prefix[0]);
        c.args(&prefix[1..]).arg(&exe);
        c
    };
    c.args(["rank_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("SOFTRDMA_COLL_CHUNK", "4096")
        .env("SOFTRDMA_COLL_TIMEOUT", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `n` ranks on this host, with the variables `mpirun` gives its ranks.
fn local_ranks(n: usize, transport: &str) {
    let job = format!("test-{}-{n}-{transport}", std::process::id());
    let kids = (0..n)
        .map(|r| {
            let mut c = child_cmd(&[]);
            c.env("OMPI_COMM_WORLD_RANK", r.to_string())
                .env("OMPI_COMM_WORLD_SIZE", n.to_string())
                .env("OMPI_COMM_WORLD_LOCAL_SIZE", n.to_string())
                .env("OMPI_MCA_ess_base_jobid", &job)
                .env("SOFTRDMA_TRANSPORT", transport)
                .env_remove("MASTER_ADDR")
                .env_remove("MASTER_PORT");
            (r, c.spawn().unwrap())
        })
        .collect();
    wait_all(kids, &format!("{n} local ranks over {transport}"));
}

#[test]
fn one_to_eight_ranks_on_this_host() {
    for n in 1..=8 {
        local_ranks(n, "auto");
    }
}

#[test]
fn three_and_four_ranks_over_udp_on_this_host() {
    local_ranks(3, "udp");
    local_ranks(4, "udp");
}

fn ip(args: &[&str]) {
    let st = Command::new("ip")
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e} (this test needs iproute2)"));
    assert!(st.success(), "ip {args:?} failed (this test needs root)");
}

/// Namespaces made by this test, deleted when it ends.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Ranks in network namespaces of their own, joined by a bridge in a hub
/// namespace: one host each, as far as the stack can tell.
fn netns_ranks(n: usize) {
    let tag = format!("srcoll-{}-{n}", std::process::id());
    let hub = format!("{tag}-hub");
    let mut made = Namespaces(Vec::new());
    ip(&["netns", "add", &hub]);
    made.0.push(hub.clone());
    ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
    ip(&["-n", &hub, "link", "set", "br0", "up"]);
    for r in 0..n {
        let ns = format!("{tag}-{r}");
        ip(&["netns", "add", &ns]);
        made.0.push(ns.clone());
        let port = format!("p{r}");
        ip(&[
            "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        // Jumbo frames, as RoCE fabrics run: the device's 4096-byte path
        // MTU does not fit a 1500-byte veth.
        ip(&["-n", &hub, "link", "set", &port, "mtu", "9000"]);
        ip(&["-n", &ns, "link", "set", "eth0", "mtu", "9000"]);
        ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("198.18.7.{}/24", r + 1),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
    }
    let kids = (0..n)
        .map(|r| {
            let prefix: Vec<String> = ["ip", "netns", "exec", &format!("{tag}-{r}")]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let mut c = child_cmd(&prefix);
            c.env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "198.18.7.1")
                .env("MASTER_PORT", "29500")
                .env_remove("OMPI_COMM_WORLD_RANK");
            (r, c.spawn().unwrap())
        })
        .collect();
    wait_all(kids, &format!("{n} ranks in network namespaces"));
    drop(made);
}

#[test]
fn ranks_in_network_namespaces() {
    netns_ranks(2);
    netns_ranks(5);
}

/// Misuse gets an error naming it, and nothing is touched.
#[test]
fn misuse_is_refused_with_a_reason() {
    let launch = softrdma_coll::Launch {
        rank: 0,
        size: 1,
        rendezvous: softrdma_coll::Rendezvous::Local(format!("test-misuse-{}", std::process::id())),
        launcher: "none",
        timeout: Duration::from_secs(5),
        op_timeout: Duration::from_secs(5),
    };
    let mut comm = Comm::init(launch, softrdma_coll::Config::default()).unwrap();
    let b = comm.alloc(4096).unwrap();
    let f = DataType::Float;
    let err = |r: softrdma_coll::Result<()>| r.unwrap_err().to_string();
    // Overlapping, but not the in-place arrangement.
    let e = err(comm.all_reduce(b.at(0), b.at(4), 16, f, ReduceOp::Sum));
    assert!(
        e.contains("overlap without being the in-place arrangement"),
        "{e}"
    );
    let e = err(comm.reduce(b.at(8), b.at(0), 16, f, ReduceOp::Max, 0));
    assert!(e.contains("overlap"), "{e}");
    // Too small a buffer.
    let e = err(comm.all_reduce(b.at(0), b.at(0), 2000, f, ReduceOp::Sum));
    assert!(
        e.contains("the send buffer needs bytes 0..8000 of a buffer of 4096"),
        "{e}"
    );
    // Counts that overflow.
    let e = err(comm.all_gather(b.at(0), b.at(0), usize::MAX / 2, f));
    assert!(e.contains("elements of 4 bytes"), "{e}");
    // A root that is no rank.
    let e = err(comm.broadcast(b.at(0), b.at(0), 4, f, 3));
    assert!(e.contains("rank 3 of a communicator of 1"), "{e}");
    // In place and disjoint are fine.
    comm.all_reduce(b.at(0), b.at(0), 16, f, ReduceOp::Sum)
        .unwrap();
    comm.all_reduce(b.at(0), b.at(64), 16, f, ReduceOp::Sum)
        .unwrap();
}

const MISMATCH: &str = "SOFTRDMA_COLL_TEST_MISMATCH";

/// One rank of `mismatched_counts_are_refused`: rank 0 gathers two chunks
/// of its own, rank 1 one (the first of rank 0's chunk sequence, so every
/// chunk it waits for has the length it expects), then both gather one
/// chunk again. Prints "OK:" if the mismatch was refused with a reason.
#[test]
fn mismatch_child() {
    if std::env::var(MISMATCH).is_err() {
        return;
    }
    let mut comm = Comm::from_env().unwrap_or_else(|e| fail(format!("joining: {e}")));
    let r = comm.rank();
    let f = DataType::Float;
    let send = comm.alloc(8192).unwrap();
    let recv = comm.alloc(2 * 8192).unwrap();
    let first = if r == 0 { 2048 } else { 1024 };
    let res = comm
        .all_gather(send.at(0), recv.at(0), first, f)
        .and_then(|()| comm.all_gather(send.at(0), recv.at(0), 1024, f));
    match res {
        Err(e @ softrdma_coll::Error::Protocol(_)) if e.to_string().contains("count") => {
            println!("RANK {r} OK: refused: {e}")
        }
        Err(e) => fail(format!("rank {r}: an error not naming the mismatch: {e}")),
        Ok(()) => fail(format!(
            "rank {r}: AllGathers of {first} and then 1024 elements, against another rank's other count, both succeeded"
        )),
    }
}

/// Ranks that call a collective with different counts get an error saying
/// so — not a result made of the next call's data, nor a wait for a chunk
/// that never comes.
#[test]
fn mismatched_counts_are_refused() {
    let job = format!("test-mismatch-{}", std::process::id());
    let kids = (0..2)
        .map(|r| {
            let exe = std::env::current_exe().unwrap();
            let mut c = Command::new(&exe);
            c.args([
                "mismatch_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(MISMATCH, "1")
            .env("SOFTRDMA_COLL_CHUNK", "4096")
            .env("SOFTRDMA_COLL_TIMEOUT", "30")
            .env("SOFTRDMA_COLL_OP_TIMEOUT", "20")
            .env("OMPI_COMM_WORLD_RANK", r.to_string())
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
            .env("OMPI_MCA_ess_base_jobid", &job)
            .env_remove("MASTER_ADDR")
            .env_remove("MASTER_PORT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            (r, c.spawn().unwrap())
        })
        .collect();
    wait_all(kids, "2 ranks with mismatched counts");
}
