//! An async echo server on tokio: every client that connects gets its own
//! QP and task; each task awaits its receives and sends the bytes back.
//! Nothing spins: a waiting task is an eventfd registered with tokio's
//! reactor (`softrdma_verbs::aio`). The client side measures round trips,
//! as the `pingpong` example does in event mode.
//!
//! ```text
//! cargo run --release --features tokio --example async_server -- serve 127.0.0.1:18518
//! cargo run --release --features tokio --example async_server -- connect 127.0.0.1:18518 [rounds]
//! ```
//!
//! Each message carries its round number; `u64::MAX` ends the connection.
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_verbs::aio::{self, AsyncCq};
use softrdma_verbs::{
    by_addr, AccessFlags, ConnectOptions, Context, OpenOptions, Pd, QpInitAttr, QpType, Result,
};
use tokio::net::{TcpListener, TcpStream};

const SIZE: usize = 8;

/// One connection's QP, CQ and buffers, connected over `tcp`.
struct Conn {
    qp: softrdma_verbs::Qp,
    cq: AsyncCq,
    buf: softrdma_verbs::Mr,
}

impl Conn {
    async fn new(ctx: &Context, pd: &Pd, tcp: &mut TcpStream) -> Result<Conn> {
        let cq = ctx.create_cq(16, Some(&ctx.create_comp_channel()?))?;
        let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq))?;
        let buf = pd.alloc_mr(2 * SIZE, AccessFlags::LOCAL_WRITE)?;
        let peer = aio::exchange(tcp, &qp.endpoint()).await?;
        qp.connect(&peer, &ConnectOptions::default())?;
        qp.recv(0, buf.slice(SIZE..2 * SIZE)?)?;
        aio::exchange(tcp, &qp.endpoint()).await?; // both sides ready
        Ok(Conn {
            qp,
            cq: AsyncCq::new(cq)?,
            buf,
        })
    }

    /// Await a message, repost the receive, return its round number.
    async fn recv(&self) -> Result<u64> {
        self.cq.wait(0).await?;
        let v = self.buf.load_u64(SIZE)?;
        self.qp.recv(0, self.buf.slice(SIZE..2 * SIZE)?)?;
        Ok(v)
    }

    async fn send(&self, v: u64, wr_id: u64) -> Result<()> {
        self.buf.store_u64(0, v)?;
        self.qp.send(wr_id, self.buf.slice(0..SIZE)?)?;
        self.cq.wait(wr_id).await?;
        Ok(())
    }
}

async fn serve(addr: &str) -> Result<()> {
    let l = TcpListener::bind(addr).await?;
    println!("serving on {}", l.local_addr()?);
    let ctx = Arc::new(Context::open(
        &by_addr(l.local_addr()?.ip())?,
        &OpenOptions::default(),
    )?);
    let pd = Arc::new(ctx.alloc_pd());
    loop {
        let (mut tcp, from) = l.accept().await?;
        let (ctx, pd) = (ctx.clone(), pd.clone());
        tokio::spawn(async move {
            let run = async {
                let c = Conn::new(&ctx, &pd, &mut tcp).await?;
                let mut n = 0u64;
                loop {
                    let v = c.recv().await?;
                    if v == u64::MAX {
                        return Ok::<u64, softrdma_verbs::Error>(n);
                    }
                    n += 1;
                    c.send(v, n).await?;
                }
            };
            match run.await {
                Ok(n) => println!("server: {from}: echoed {n} messages"),
                Err(e) => eprintln!("server: {from}: {e}"),
            }
        });
    }
}

async fn client(addr: &str, rounds: usize) -> Result<()> {
    let mut tcp = TcpStream::connect(addr).await?;
    let ctx = Context::open(&by_addr(tcp.local_addr()?.ip())?, &OpenOptions::default())?;
    let pd = ctx.alloc_pd();
    let c = Conn::new(&ctx, &pd, &mut tcp).await?;
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds as u64 {
        let t = Instant::now();
        c.send(i, 1 + i).await?;
        let back = c.recv().await?;
        times.push(t.elapsed());
        if back != i {
            eprintln!("round {i}: the echo says {back}");
            std::process::exit(1);
        }
    }
    c.send(u64::MAX, 0).await?;
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{rounds} round trips of {SIZE} B: min {:.2} us, typical {:.2} us, p99 {:.2} us",
        us(times[0]),
        us(times[times.len() / 2]),
        us(times[times.len() * 99 / 100])
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let addr = args.get(2).map_or("127.0.0.1:18518", String::as_str);
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(addr).await,
        _ => {
            client(
                addr,
                args.get(3).and_then(|r| r.parse().ok()).unwrap_or(10_000),
            )
            .await
        }
    }
}
