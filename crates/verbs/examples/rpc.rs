//! An RPC over SEND/RECV: the client keeps up to `DEPTH` calls in flight,
//! each a SEND with immediate data naming the call; the server answers
//! each with a SEND carrying the same immediate. The call here adds the
//! two 8-byte numbers of the request. Messages are sent inline (copied when
//! posted), so one scratch buffer per side serves every call.
//!
//! ```text
//! cargo run --example rpc -- serve 127.0.0.1:18517
//! cargo run --example rpc -- connect 127.0.0.1:18517 [calls]
//! ```
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma_verbs::{
    by_addr, oob, AccessFlags, ConnectOptions, Context, Cq, Error, Mr, OpenOptions, Qp, QpInitAttr,
    QpType, SendFlags, SendOp, SendWr, Sge, WcOpcode,
};

/// Calls in flight, and receive buffers posted on each side.
const DEPTH: usize = 8;
/// A request is two u64s; a reply one.
const MSG: usize = 16;
const WAIT: Duration = Duration::from_secs(10);

/// Receive buffer `i` of the region (after the scratch buffer).
fn rx(mr: &Mr, i: usize) -> softrdma_verbs::Result<Sge> {
    mr.slice((1 + i) * MSG..(2 + i) * MSG)
}

/// SEND `len` bytes of the scratch buffer inline, with `imm` (also its
/// `wr_id`): the bytes are copied when posted, so the buffer is free again
/// at once.
fn send(qp: &Qp, mr: &Mr, len: usize, imm: u32) -> softrdma_verbs::Result<()> {
    qp.post_send(&SendWr {
        wr_id: imm as u64,
        op: SendOp::SendWithImm { imm },
        sgl: &[mr.slice(0..len)?],
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        ud: None,
    })
}

/// The next completion of a successful work request.
fn next(cq: &Cq) -> softrdma_verbs::Result<softrdma_verbs::Completion> {
    let mut c = [softrdma_verbs::Completion::default()];
    let start = Instant::now();
    loop {
        if cq.poll(&mut c)? == 1 {
            return Ok(c[0].into_result()?);
        }
        if start.elapsed() > WAIT {
            return Err(Error::Timeout("an RPC message"));
        }
        std::thread::yield_now();
    }
}

fn main() -> softrdma_verbs::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let serving = args.get(1).map(String::as_str) == Some("serve");
    let addr = args.get(2).map_or("127.0.0.1:18517", String::as_str);
    let calls: u32 = args.get(3).and_then(|r| r.parse().ok()).unwrap_or(1000);
    // The call number that tells the server to stop.
    const STOP: u32 = u32::MAX;
    let mut tcp = if serving {
        let l = TcpListener::bind(addr)?;
        println!("serving on {}", l.local_addr()?);
        l.accept()?.0
    } else {
        TcpStream::connect(addr)?
    };
    let ctx = Context::open(&by_addr(tcp.local_addr()?.ip())?, &OpenOptions::default())?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4 * DEPTH as u32, None)?;
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq))?;
    let mr = pd.alloc_mr((1 + DEPTH) * MSG, AccessFlags::LOCAL_WRITE)?;
    let peer = oob::exchange(&mut tcp, &qp.endpoint())?;
    qp.connect(&peer, &ConnectOptions::default())?;
    // Receive wr_ids are their buffer's index.
    for i in 0..DEPTH {
        qp.recv(i as u64, rx(&mr, i)?)?;
    }
    oob::exchange(&mut tcp, &qp.endpoint())?; // both sides ready

    let word = |off: usize| mr.load_u64(off);
    if serving {
        let mut served = 0u32;
        loop {
            let c = next(&cq)?;
            if c.opcode != WcOpcode::Recv {
                continue; // a reply's send completion
            }
            if c.imm_or_inv == STOP {
                break;
            }
            let i = c.wr_id as usize;
            let (a, b) = (word((1 + i) * MSG)?, word((1 + i) * MSG + 8)?);
            qp.recv(i as u64, rx(&mr, i)?)?;
            mr.store_u64(0, a.wrapping_add(b))?;
            send(&qp, &mr, 8, c.imm_or_inv)?;
            served += 1;
        }
        println!("server: answered {served} calls");
        return Ok(());
    }
    let start = Instant::now();
    let (mut sent, mut done) = (0u32, 0u32);
    let mut out: HashMap<u32, u64> = HashMap::new(); // call -> expected sum
    while done < calls {
        while sent < calls && out.len() < DEPTH {
            let (a, b) = (sent as u64 * 3, 1u64 << (sent % 40));
            mr.store_u64(0, a)?;
            mr.store_u64(8, b)?;
            send(&qp, &mr, MSG, sent)?;
            out.insert(sent, a + b);
            sent += 1;
        }
        let c = next(&cq)?;
        if c.opcode != WcOpcode::Recv {
            continue; // a request's send completion
        }
        let want = out
            .remove(&c.imm_or_inv)
            .expect("a reply to a call in flight");
        let got = word((1 + c.wr_id as usize) * MSG)?;
        qp.recv(c.wr_id, rx(&mr, c.wr_id as usize)?)?;
        if got != want {
            eprintln!("call {}: got {got}, want {want}", c.imm_or_inv);
            std::process::exit(1);
        }
        done += 1;
    }
    let s = start.elapsed().as_secs_f64();
    send(&qp, &mr, 0, STOP)?;
    // The stop's own send completion: a reply can overtake the ACK of its
    // call, so earlier calls' send completions may still come before it.
    while next(&cq)?.wr_id != STOP as u64 {}
    println!(
        "client: {calls} calls answered correctly, {DEPTH} in flight, {:.1} us per call",
        s * 1e6 / calls as f64
    );
    Ok(())
}
