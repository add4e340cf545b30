//! Ping-pong over SEND/RECV, sleeping on the completion channel between
//! messages (event mode: no spinning), printing the round-trip times.
//!
//! ```text
//! cargo run --release --example pingpong -- serve 127.0.0.1:18516
//! cargo run --release --example pingpong -- connect 127.0.0.1:18516 [rounds]
//! ```
//!
//! Each ping carries its round number; `u64::MAX` tells the server to stop.
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma_verbs::{
    by_addr, oob, AccessFlags, ConnectOptions, Context, OpenOptions, QpInitAttr, QpType,
};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const SIZE: usize = 8;

fn main() -> softrdma_verbs::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let serving = args.get(1).map(String::as_str) == Some("serve");
    let addr = args.get(2).map_or("127.0.0.1:18516", String::as_str);
    let rounds: usize = args.get(3).and_then(|r| r.parse().ok()).unwrap_or(10_000);
    let mut tcp = if serving {
        let l = TcpListener::bind(addr)?;
        println!("serving on {}", l.local_addr()?);
        l.accept()?.0
    } else {
        TcpStream::connect(addr)?
    };
    let ctx = Context::open(&by_addr(tcp.local_addr()?.ip())?, &OpenOptions::default())?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, Some(&ctx.create_comp_channel()?))?;
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq))?;
    let buf = pd.alloc_mr(2 * SIZE, AccessFlags::LOCAL_WRITE)?;
    let (tx, rx) = (buf.slice(0..SIZE)?, buf.slice(SIZE..2 * SIZE)?);
    let peer = oob::exchange(&mut tcp, &qp.endpoint())?;
    qp.connect(&peer, &ConnectOptions::default())?;
    qp.recv(0, rx)?;
    // Both sides are connected, with a receive posted, before the first
    // message leaves.
    oob::exchange(&mut tcp, &qp.endpoint())?;

    let mut times = Vec::with_capacity(rounds);
    if serving {
        for i in 1.. {
            cq.wait(0, WAIT)?; // a ping
            if buf.load_u64(SIZE)? == u64::MAX {
                break;
            }
            qp.recv(0, rx)?;
            qp.send(i, tx)?;
            cq.wait(i, WAIT)?;
        }
    }
    for i in 0..rounds as u64 {
        if serving {
            break;
        }
        let t = Instant::now();
        buf.store_u64(0, i)?;
        qp.send(1 + i, tx)?;
        cq.wait(1 + i, WAIT)?;
        cq.wait(0, WAIT)?; // the pong
        qp.recv(0, rx)?;
        times.push(t.elapsed());
    }
    if !serving {
        buf.store_u64(0, u64::MAX)?;
        qp.send(0, tx)?;
        cq.wait(0, WAIT)?;
        times.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "{rounds} round trips of {SIZE} B: min {:.2} us, typical {:.2} us, p99 {:.2} us",
            us(times[0]),
            us(times[times.len() / 2]),
            us(times[times.len() * 99 / 100])
        );
    }
    Ok(())
}
