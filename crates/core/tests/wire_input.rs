//! No bytes from the wire can panic the transport: real packets of every
//! kind, mutated (bit flips, truncation, extension, header fields
//! overwritten, opcode swapped), and arbitrary bytes aimed at live QPs, are
//! fed straight to `Endpoint::handle_packet` (past the ICRC check, as if a
//! corruption had slipped through it). Every QP must end in a state IBA
//! allows, and the endpoint must keep working.

mod support;

use proptest::prelude::*;
use softrdma_core::qp::state::QpState;
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_core::RxMeta;
use support::*;

/// Real traffic of every operation, as (from, bytes).
fn corpus() -> Vec<(usize, Vec<u8>)> {
    let o = Opts::default();
    let (mut sim, qa, qb) = pair(7, 1 << 20, &o);
    let mut out = Vec::new();
    let base = MEM_BASE;
    sim.node_mut(1).post_recv(&qb, 1, base + 4096, 8192);
    sim.node_mut(1).post_recv(&qb, 2, base + 4096, 8192);
    let a = sim.node_mut(0);
    let ops = [
        SendOp::Send,
        SendOp::SendWithImm { imm: 5 },
        SendOp::Write {
            remote_addr: base + 65536,
            rkey: qb.rkey,
        },
        SendOp::WriteWithImm {
            remote_addr: base + 65536,
            rkey: qb.rkey,
            imm: 9,
        },
        SendOp::Read {
            remote_addr: base + 65536,
            rkey: qb.rkey,
        },
        SendOp::FetchAdd {
            remote_addr: base + 131072,
            rkey: qb.rkey,
            add: 1,
        },
        SendOp::CompareSwap {
            remote_addr: base + 131072,
            rkey: qb.rkey,
            compare: 1,
            swap: 2,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let len = if op.is_atomic() { 8 } else { 3000 };
        a.post(&qa, i as u64, op, base + 200_000, len, SendFlags::SIGNALED)
            .unwrap();
    }
    // Carry packets by hand so both directions are captured.
    for round in 0..200u64 {
        let now = round * 1000;
        let from_a = sim.node_mut(0).take(now, usize::MAX);
        for p in &from_a {
            sim.node_mut(1).deliver(now, 0, p);
        }
        let from_b = sim.node_mut(1).take(now, usize::MAX);
        for p in &from_b {
            sim.node_mut(0).deliver(now, 1, p);
        }
        if from_a.is_empty() && from_b.is_empty() {
            break;
        }
        out.extend(from_a.into_iter().map(|p| (0, p)));
        out.extend(from_b.into_iter().map(|p| (1, p)));
    }
    assert!(out.len() > 10, "traffic of every kind was captured");
    out
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Extend(Vec<u8>),
    Set(usize, u8),
    Opcode(u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0usize..128, 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (0usize..128).prop_map(Mutation::Truncate),
        proptest::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
        (0usize..64, any::<u8>()).prop_map(|(i, v)| Mutation::Set(i, v)),
        any::<u8>().prop_map(Mutation::Opcode),
    ]
}

fn apply(p: &mut Vec<u8>, m: &Mutation) {
    match *m {
        Mutation::Flip(i, b) => {
            if !p.is_empty() {
                let i = i % p.len();
                p[i] ^= 1 << b;
            }
        }
        Mutation::Truncate(n) => p.truncate(n.min(p.len())),
        Mutation::Extend(ref v) => p.extend_from_slice(v),
        Mutation::Set(i, v) => {
            if !p.is_empty() {
                let i = i % p.len();
                // Keep the destination QP (bytes 5..8) mostly intact so the
                // mutation reaches a live QP.
                if !(5..8).contains(&i) {
                    p[i] = v;
                }
            }
        }
        Mutation::Opcode(op) => {
            if !p.is_empty() {
                p[0] = op;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_packets_never_panic(
        picks in proptest::collection::vec((any::<prop::sample::Index>(), proptest::collection::vec(mutation(), 1..4)), 1..24),
        junk in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let corpus = corpus();
        let o = Opts::default();
        let (mut sim, qa, qb) = pair(7, 1 << 20, &o);
        let mut now = 1_000_000u64;
        for (idx, muts) in &picks {
            let (from, pkt) = &corpus[idx.index(corpus.len())];
            let mut p = pkt.clone();
            for m in muts {
                apply(&mut p, m);
            }
            let to = 1 - from;
            let meta = RxMeta { sgid: gid_of(*from), dgid: gid_of(to), traffic_class: 0, hop_limit: 64 };
            let h = sim.node_mut(to);
            // The oracle learns the live regions, as every support call does.
            h.sync();
            h.ep.handle_packet(now, &meta, &p, &mut h.mem);
            // Whatever it triggered goes out and is handled too.
            now += 10_000;
            let _ = sim.node_mut(to).take(now, 64);
            sim.node_mut(to).handle_timeout_at(now);
        }
        // Arbitrary bytes with a live destination QP.
        let mut j = junk.clone();
        if j.len() >= 8 {
            j[5..8].copy_from_slice(&qb.qpn.to_be_bytes()[1..]);
        }
        let meta = RxMeta { sgid: gid_of(0), dgid: gid_of(1), traffic_class: 0, hop_limit: 64 };
        let h = sim.node_mut(1);
        h.sync();
        h.ep.handle_packet(now, &meta, &j, &mut h.mem);
        // Every QP is in a state IBA allows for it, and the endpoints still
        // answer commands.
        for (n, q) in [(0usize, &qa), (1, &qb)] {
            let st = sim.node(n).ep.qp(q.qpn).unwrap().state;
            prop_assert!(matches!(st, QpState::Rts | QpState::Err), "{st:?}");
            let mut out = [Default::default(); 8];
            sim.node_mut(n).ep.poll_cq(q.scq, &mut out).unwrap();
        }
    }
}
