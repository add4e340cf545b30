//! Every packet of the golden captures of real Linux rxe traffic
//! (`tests/golden/`, copied from the rxe-peer test bed) decodes, carries a
//! correct ICRC (but the one corrupted on purpose), and re-emits to the exact
//! bytes it was parsed from.

use softrdma_wire::dissect::{dissect, Dissection};
use softrdma_wire::ext::{NakCode, Syndrome};
use softrdma_wire::frame::{parse_ethernet_udp, IpRepr, UdpFrame};
use softrdma_wire::icrc::{self, HiddenCheck};
use softrdma_wire::pcap::PcapFile;
use softrdma_wire::{Opcode, Packet, PacketRepr};

fn golden_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn load(name: &str) -> Vec<u8> {
    std::fs::read(golden_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn all_pcaps() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    v.sort();
    v
}

/// Every RoCEv2 frame of a capture with its number.
fn roce_frames(bytes: &[u8]) -> Vec<(usize, Vec<u8>)> {
    let f = PcapFile::parse(bytes).unwrap();
    f.records()
        .map(|r| r.unwrap())
        .map(|r| (r.number, r.data.to_vec()))
        .collect()
}

/// The packet counts tshark gives for `udp.port == 4791` on each file
/// (recorded from tshark 4.0.17; the tshark test in the CLI crate re-runs it).
const TSHARK_COUNTS: &[(&str, usize)] = &[
    ("host_inject_bad-icrc.pcap", 9),
    ("host_inject_duplicate.pcap", 10),
    ("host_inject_psn-gap.pcap", 10),
    ("host_rc_send.pcap", 12),
    ("rc_atomic_cas.pcap", 10),
    ("rc_atomic_fadd.pcap", 10),
    ("rc_read.pcap", 20),
    ("rc_send_ipv6.pcap", 4),
    ("rc_send_multi.pcap", 8),
    ("rc_send_small.pcap", 8),
    ("rc_write.pcap", 20),
    ("ud_send.pcap", 4),
];

#[test]
fn every_golden_packet_decodes_with_a_good_icrc() {
    let files = all_pcaps();
    assert_eq!(files.len(), TSHARK_COUNTS.len(), "{files:?}");
    for (name, want) in TSHARK_COUNTS {
        let mut n = 0;
        for (num, frame) in roce_frames(&load(name)) {
            match dissect(&frame) {
                Dissection::Roce { icrc, .. } => {
                    n += 1;
                    let bad_on_purpose = *name == "host_inject_bad-icrc.pcap" && num == 1;
                    assert_eq!(icrc.ok(), !bad_on_purpose, "{name} frame {num}: {icrc:?}");
                }
                other => panic!("{name} frame {num}: {other:?}"),
            }
        }
        assert_eq!(n, *want, "{name}");
    }
}

/// Re-emit every layer from its parsed value and compare with the capture.
#[test]
fn parse_then_emit_reproduces_every_golden_frame() {
    let mut total = 0;
    for name in all_pcaps() {
        for (num, frame) in roce_frames(&load(&name)) {
            let f = parse_ethernet_udp(&frame).unwrap().unwrap();
            let pkt = Packet::new_checked(f.payload).unwrap();
            let repr = PacketRepr::parse(&pkt).unwrap();
            let mut out = vec![0u8; frame.len()];
            let eh = f.eth.header_len();
            f.eth.emit(&mut out);
            f.ip.emit(&mut out[eh..]);
            let ih = f.ip.header_len();
            f.udp.emit(&mut out[eh + ih..]);
            let at = eh + ih + 8;
            let roce = &mut out[at..at + repr.wire_len()];
            repr.emit_with_payload(roce, pkt.payload());
            icrc::fill(f.ip_header, f.udp_header, roce);
            let end = at + repr.wire_len();
            out[end..].copy_from_slice(f.trailer);
            if name == "host_inject_bad-icrc.pcap" && num == 1 {
                // We emit the correct ICRC; the capture carries a wrong one.
                let n = end - 4;
                assert_ne!(out[n..end], frame[n..end]);
                out[n..end].copy_from_slice(&frame[n..end]);
            }
            assert_eq!(out, frame, "{name} frame {num}");
            total += 1;
        }
    }
    assert_eq!(total, TSHARK_COUNTS.iter().map(|c| c.1).sum::<usize>());
}

/// (source, destination, IP ID, DF) of an IPv4 frame.
type V4Addrs = (([u8; 4], u16), ([u8; 4], u16), u16, bool);

fn v4_addrs(f: &UdpFrame<'_>) -> Option<V4Addrs> {
    match f.ip {
        IpRepr::V4(ip) => Some((
            (ip.src, f.udp.src_port),
            (ip.dst, f.udp.dst_port),
            ip.ident,
            ip.flags_frag & 0x4000 != 0,
        )),
        IpRepr::V6(_) => None,
    }
}

/// What a UDP-socket receiver sees (no IP ID, no DF) is enough to check the
/// ICRC: ID 0 + DF verifies exactly, rxe's incrementing IDs are recovered,
/// and the corrupted packet is caught.
#[test]
fn hidden_ipv4_fields_are_recovered_or_the_packet_is_rejected() {
    let (mut exact, mut recovered, mut corrupt) = (0, 0, 0);
    for name in all_pcaps() {
        for (num, frame) in roce_frames(&load(&name)) {
            let f = parse_ethernet_udp(&frame).unwrap().unwrap();
            let Some((src, dst, ident, df)) = v4_addrs(&f) else {
                continue;
            };
            let got = icrc::verify_ipv4_hidden(src, dst, f.payload, true);
            if got != HiddenCheck::Exact {
                assert_eq!(
                    icrc::verify_ipv4_hidden(src, dst, f.payload, false),
                    HiddenCheck::Corrupt
                );
            }
            if name == "host_inject_bad-icrc.pcap" && num == 1 {
                assert_eq!(got, HiddenCheck::Corrupt, "{name} {num}");
                corrupt += 1;
            } else if ident == 0 && df {
                assert_eq!(got, HiddenCheck::Exact, "{name} {num}");
                exact += 1;
            } else {
                assert_eq!(got, HiddenCheck::Recovered { ident, df }, "{name} {num}");
                recovered += 1;
            }
        }
    }
    // The host-side Python sender uses ID 0 + DF; rxe increments its IDs.
    assert!(
        exact > 0 && recovered > 50 && corrupt == 1,
        "{exact} {recovered} {corrupt}"
    );
}

/// Single-bit errors: the exact check (ID 0 senders, i.e. softrdma) catches
/// every one; with ID recovery (rxe senders) the residual is measured.
#[test]
fn hidden_check_against_single_bit_errors() {
    let frames = roce_frames(&load("rc_write.pcap"));
    let frame = &frames[0].1;
    let f = parse_ethernet_udp(frame).unwrap().unwrap();
    let (src, dst, ident, df) = v4_addrs(&f).unwrap();
    assert!(ident != 0 && df, "rxe sends non-zero IDs");
    // The same packet as an ID-0 sender would have sent it.
    let mut ours = f.payload.to_vec();
    let ip0 = icrc::ipv4_header(src.0, dst.0, 0, true, (ours.len() + 8) as u16);
    icrc::fill(&ip0, f.udp_header, &mut ours);
    assert_eq!(
        icrc::verify_ipv4_hidden(src, dst, &ours, false),
        HiddenCheck::Exact
    );
    let mut p = f.payload.to_vec();
    let (mut flips, mut accepted) = (0, 0);
    for byte in 0..p.len() {
        if byte == 4 {
            continue; // BTH byte 4 is masked out of the ICRC by design
        }
        for bit in 0..8 {
            flips += 1;
            ours[byte] ^= 1 << bit;
            assert_eq!(
                icrc::verify_ipv4_hidden(src, dst, &ours, false),
                HiddenCheck::Corrupt,
                "exact check, byte {byte} bit {bit}"
            );
            ours[byte] ^= 1 << bit;
            p[byte] ^= 1 << bit;
            match icrc::verify_ipv4_hidden(src, dst, &p, true) {
                HiddenCheck::Corrupt => {}
                HiddenCheck::Recovered { ident: got, .. } => {
                    assert_ne!(got, ident, "a flip cannot leave the ICRC intact");
                    accepted += 1;
                }
                HiddenCheck::Exact => panic!("byte {byte} bit {bit}"),
            }
            p[byte] ^= 1 << bit;
        }
    }
    // About 2^-15 of random error patterns look like an ID change.
    eprintln!("ID recovery accepted {accepted} of {flips} single-bit errors");
    assert!(flips > 8000 && accepted <= 2, "{accepted} of {flips}");
}

fn reprs(name: &str) -> Vec<PacketRepr> {
    roce_frames(&load(name))
        .iter()
        .map(|(_, fr)| {
            let f = parse_ethernet_udp(fr).unwrap().unwrap();
            PacketRepr::parse(&Packet::new_checked(f.payload).unwrap()).unwrap()
        })
        .collect()
}

#[test]
fn golden_fields_match_the_tools_output() {
    // ib_write_bw -s 3000: FIRST carries the RETH with the whole length.
    let w = reprs("rc_write.pcap");
    let first = w
        .iter()
        .find(|r| r.bth.opcode == Opcode::RC_RDMA_WRITE_FIRST)
        .unwrap();
    assert_eq!(first.ext.reth.unwrap().dma_len, 3000);
    assert!(!first.bth.ack_req);
    let last = w
        .iter()
        .find(|r| r.bth.opcode == Opcode::RC_RDMA_WRITE_LAST)
        .unwrap();
    assert!(last.bth.ack_req);
    assert_eq!(last.payload_len, 3000 - 2 * 1024);
    // READ request consumes 3 PSNs: its responses carry psn, psn+1, psn+2.
    let r = reprs("rc_read.pcap");
    let req = r
        .iter()
        .find(|p| p.bth.opcode == Opcode::RC_RDMA_READ_REQUEST)
        .unwrap();
    let resp: Vec<_> = r
        .iter()
        .filter(|p| {
            p.bth
                .opcode
                .info()
                .unwrap()
                .has(softrdma_wire::opcode::Flags::READ_RESPONSE)
        })
        .take(3)
        .collect();
    assert_eq!(resp[0].bth.psn, req.bth.psn);
    assert_eq!(resp[2].bth.psn, req.bth.psn.add(2));
    assert!(resp[0].ext.aeth.is_some() && resp[1].ext.aeth.is_none());
    // Atomics.
    let fa = reprs("rc_atomic_fadd.pcap");
    assert_eq!(fa[0].bth.opcode, Opcode::RC_FETCH_ADD);
    assert_eq!(fa[0].ext.atomic_eth.unwrap().swap_add, 1);
    let ack = fa
        .iter()
        .find(|p| p.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE)
        .unwrap();
    assert!(ack.ext.atomic_ack_eth.is_some() && ack.ext.aeth.is_some());
    let cas = reprs("rc_atomic_cas.pcap");
    assert_eq!(cas[0].bth.opcode, Opcode::RC_COMPARE_SWAP);
    // UD: Q_Key of ibv_ud_pingpong.
    let ud = reprs("ud_send.pcap");
    assert_eq!(ud[0].bth.opcode, Opcode::UD_SEND_ONLY);
    assert_eq!(ud[0].ext.deth.unwrap().qkey, 0x1111_1111);
    assert_eq!(ud[0].payload_len, 512);
    // PSN gap: rxe's NAK carries the expected PSN.
    let gap = reprs("host_inject_psn-gap.pcap");
    let nak = gap
        .iter()
        .find(|p| {
            p.ext
                .aeth
                .is_some_and(|a| a.kind() == Syndrome::Nak(NakCode::PsnSequenceError))
        })
        .expect("a sequence-error NAK");
    assert_eq!(nak.ext.aeth.unwrap().msn, 0);
    // ACKs from rxe: unlimited credits.
    let small = reprs("rc_send_small.pcap");
    let ack = small
        .iter()
        .find(|p| p.bth.opcode == Opcode::RC_ACKNOWLEDGE)
        .unwrap();
    assert_eq!(ack.ext.aeth.unwrap().kind(), Syndrome::ACK_UNLIMITED);
}
