//! Loopback throughput of 4 KiB RDMA WRITE datagrams between two ports, with
//! and without UDP GSO/GRO.
//!
//! `cargo run --release -p softrdma-udp --example throughput [seconds]`
//!
//! One thread sends batches of 32 WRITE MIDDLEs to one QP as fast as it can,
//! another receives; the figure is datagrams (and payload Gbit/s) received
//! per second. Loopback drops what the receiver cannot keep up with, so
//! "sent" can exceed "received".

use softrdma_udp::{Port, PortConfig, PortOptions};
use softrdma_wire::bth::BthRepr;
use softrdma_wire::packet::{ExtRepr, PacketRepr};
use softrdma_wire::{Opcode, Psn};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAYLOAD: usize = 4096;

fn run(name: &str, a_last: u8, b_last: u8, gso: bool, gro: bool, secs: f64) {
    let open = |last, gso, gro| {
        let cfg = PortConfig {
            shared: false,
            batch: 32,
            ..PortConfig::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
        };
        let opts = PortOptions {
            gso,
            gro,
            ..PortOptions::default()
        };
        Port::open_with(cfg, opts).unwrap()
    };
    let mut a = open(a_last, gso, false);
    let mut b = open(b_last, false, gro);
    let dst = b.local_gid();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_rx = stop.clone();
    let rx = std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop_rx.load(Ordering::Relaxed) {
            n += b.recv(|_, _| {}).unwrap() as u64;
        }
        // Drain what is already queued.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            n += b.recv(|_, _| {}).unwrap() as u64;
        }
        (n, b.stats())
    });
    let r = PacketRepr {
        bth: BthRepr {
            opcode: Opcode::RC_RDMA_WRITE_MIDDLE,
            dest_qp: 0x01_0001,
            psn: Psn::new(0),
            ..BthRepr::default()
        },
        ext: ExtRepr::default(),
        payload_len: PAYLOAD,
    };
    let mut head = vec![0u8; r.wire_len()];
    r.emit_headers(&mut head);
    head.truncate(r.header_len());
    let memory = vec![0x5au8; PAYLOAD];
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        let mut tx = a.tx();
        for _ in 0..32 {
            tx.push(dst, 1, &head, &[&memory], 0).unwrap();
        }
        tx.finish().unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (got, sb) = rx.join().unwrap();
    let sa = a.stats();
    let rate = got as f64 / elapsed;
    println!(
        "{name:<28} sent {:>9.0}/s  received {:>9.0}/s  ({:5.2} Gbit/s payload)  gso trains {} gro entries {} icrc_bad {}",
        sa.tx_packets as f64 / elapsed,
        rate,
        rate * PAYLOAD as f64 * 8.0 / 1e9,
        sa.gso_batches,
        sb.gro_batches,
        sb.icrc_bad,
    );
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    run("sendmmsg / recvmmsg", 101, 102, false, false, secs);
    run("GSO send / recvmmsg", 103, 104, true, false, secs);
    run("GSO send / GRO receive", 105, 106, true, true, secs);
}
