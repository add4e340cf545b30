//! Remote memory: one process offers 1 MiB and stays passive; the other
//! WRITEs 4 KiB into it, READs it back and compare-and-swaps a counter.
//!
//! ```text
//! cargo run --example remote_memory -- serve 127.0.0.1:18515
//! cargo run --example remote_memory -- connect 127.0.0.1:18515
//! ```
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use softrdma_verbs::{oob, AccessFlags, ConnectOptions, Context, OpenOptions, QpInitAttr, QpType};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn main() -> softrdma_verbs::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let serving = args.get(1).map(String::as_str) == Some("serve");
    let addr = args.get(2).map_or("127.0.0.1:18515", String::as_str);
    let mut tcp = if serving {
        let l = TcpListener::bind(addr)?;
        println!("serving on {}", l.local_addr()?);
        l.accept()?.0
    } else {
        TcpStream::connect(addr)?
    };
    // The device on the address the TCP connection uses.
    let ctx = Context::open(
        &softrdma_verbs::by_addr(tcp.local_addr()?.ip())?,
        &OpenOptions::default(),
    )?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, Some(&ctx.create_comp_channel()?))?;
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mem = pd.alloc_mr(1 << 20, access | AccessFlags::REMOTE_ATOMIC)?;
    let me = qp.endpoint().with_regions([mem.remote()]);
    let peer = oob::exchange(&mut tcp, &me)?;
    qp.connect(&peer, &ConnectOptions::default())?;

    if serving {
        // Passive: the device serves the peer's WRITE, READ and CAS alone.
        tcp.read_exact(&mut [0u8; 1])?;
        let mut head = [0u8; 16];
        mem.read(0, &mut head);
        println!("server: bytes 0..16 now {:02x?}", head);
        println!("server: counter at 4096 is {}", mem.load_u64(4096)?);
        return Ok(());
    }
    let remote = peer.regions[0];
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    mem.write(0, &data);
    qp.write(1, mem.slice(0..4096)?, remote.slice(0..4096)?)?;
    cq.wait(1, WAIT)?;
    qp.read(2, mem.slice(8192..12288)?, remote.slice(0..4096)?)?;
    cq.wait(2, WAIT)?;
    let back = mem.with_bytes(8192..12288, |b| b == &data[..])?;
    println!(
        "client: wrote 4096 bytes, read them back: {}",
        if back { "identical" } else { "DIFFERENT" }
    );
    qp.compare_swap(
        3,
        mem.slice(16384..16392)?,
        remote.slice(4096..4104)?,
        0,
        42,
    )?;
    cq.wait(3, WAIT)?;
    println!(
        "client: compare-and-swap 0 -> 42 found {}",
        mem.load_u64(16384)?
    );
    tcp.write_all(b"x")?;
    if !back {
        std::process::exit(1);
    }
    Ok(())
}
