//! Receive-path cost of the wire layer: check and parse a RoCEv2 packet
//! (`Packet::new_checked` + `PacketRepr::parse`) and verify its ICRC over the
//! IPv4 and UDP headers (`icrc::compute`), for RC SEND ONLY and RDMA WRITE
//! ONLY packets with 1 KiB and 4 KiB payloads.
//!
//! Throughput is counted in bytes of the UDP payload (BTH through ICRC), the
//! bytes the check reads. Results and the machine's memcpy bandwidth from the
//! same session are in docs/PERFORMANCE.md.
//!
//! ```text
//! cargo bench -p softrdma-wire --bench parse_icrc -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softrdma_wire::ext::RethRepr;
use softrdma_wire::packet::ExtRepr;
use softrdma_wire::{icrc, BthRepr, Opcode, Packet, PacketRepr, Psn, ROCEV2_UDP_PORT};

/// One emitted packet with the IP and UDP headers its ICRC covers.
struct Sample {
    ip: [u8; 20],
    udp: [u8; 8],
    roce: Vec<u8>,
}

fn sample(opcode: Opcode, payload_len: usize) -> Sample {
    let reth = (opcode == Opcode::RC_RDMA_WRITE_ONLY).then_some(RethRepr {
        va: 0x7f00_1234_5000,
        rkey: 0x1234,
        dma_len: payload_len as u32,
    });
    let repr = PacketRepr {
        bth: BthRepr {
            opcode,
            dest_qp: 0x11,
            ack_req: true,
            psn: Psn::new(0x00ab_cdef),
            ..BthRepr::default()
        },
        ext: ExtRepr {
            reth,
            ..ExtRepr::default()
        },
        payload_len,
    };
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
    let mut roce = vec![0u8; repr.wire_len()];
    repr.emit_with_payload(&mut roce, &payload);
    let ulen = (roce.len() + 8) as u16;
    let ip = icrc::ipv4_header([10, 0, 0, 1], [10, 0, 0, 2], 0, true, ulen);
    let udp = icrc::udp_header(49152, ROCEV2_UDP_PORT, ulen);
    icrc::fill(&ip, &udp, &mut roce);
    Sample { ip, udp, roce }
}

/// What the receive path does first with a datagram: check, parse, verify.
#[inline]
fn parse_and_verify(s: &Sample) -> (PacketRepr, bool) {
    let b = black_box(&s.roce[..]);
    let p = Packet::new_checked(b).expect("valid packet");
    let r = PacketRepr::parse(&p).expect("valid headers");
    let n = b.len();
    let ok = icrc::compute(black_box(&s.ip), black_box(&s.udp), &b[..n - 4]) == p.icrc();
    (r, ok)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse+icrc");
    for (name, op) in [
        ("rc_send_only", Opcode::RC_SEND_ONLY),
        ("rc_write_only", Opcode::RC_RDMA_WRITE_ONLY),
    ] {
        for size in [1024, 4096] {
            let s = sample(op, size);
            assert!(parse_and_verify(&s).1, "ICRC of the sample");
            g.throughput(Throughput::Bytes(s.roce.len() as u64));
            g.bench_with_input(BenchmarkId::new(name, size), &s, |b, s| {
                b.iter(|| parse_and_verify(s))
            });
        }
    }
    g.finish();

    // The parse alone, to show that the CRC is the whole cost.
    let mut g = c.benchmark_group("parse_only");
    let s = sample(Opcode::RC_RDMA_WRITE_ONLY, 4096);
    g.throughput(Throughput::Bytes(s.roce.len() as u64));
    g.bench_function("rc_write_only/4096", |b| {
        b.iter(|| {
            let p = Packet::new_checked(black_box(&s.roce[..])).unwrap();
            PacketRepr::parse(&p).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
