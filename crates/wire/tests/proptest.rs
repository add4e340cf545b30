//! Property tests for the wire crate.
//!
//! * Every opcode, arbitrary field values: emit, ICRC, parse gives back the
//!   same value and payload, the ICRC verifies (also through a whole frame
//!   and the dissector), and any single flipped bit it covers is caught.
//! * Arbitrary bytes, and bytes that are almost right, never panic any
//!   parser: packet views, the dissector, Ethernet/IP/UDP, pcap files.
//! * PSN ring arithmetic beyond what `src/psn.rs` tests.

use std::net::{IpAddr, SocketAddr};

use proptest::prelude::*;
use proptest::sample::{select, Index};

use softrdma_wire::dissect::{
    dissect, dissect_all, is_steering_probe, to_json, Dissection, Line, STEERING_PROBE_LEN,
};
use softrdma_wire::ext::*;
use softrdma_wire::frame::{self, parse_ethernet_udp};
use softrdma_wire::icrc::{self, HiddenCheck};
use softrdma_wire::opcode::{len, Flags, OpcodeInfo};
use softrdma_wire::packet::ExtRepr;
use softrdma_wire::pcap::PcapFile;
use softrdma_wire::{BthRepr, Opcode, Packet, PacketRepr, Psn, ROCEV2_UDP_PORT};

fn opcodes() -> Vec<Opcode> {
    Opcode::all().map(|(op, _)| op).collect()
}

fn u24() -> impl Strategy<Value = u32> {
    0u32..1 << 24
}

/// `Some(value)` when the opcode carries the header, else `None`.
fn header<T: std::fmt::Debug + Clone + 'static>(
    present: bool,
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Option<T>> {
    if present {
        s.prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    }
}

/// Extension headers with arbitrary values, exactly those `info` calls for.
fn arb_ext(info: &OpcodeInfo) -> impl Strategy<Value = ExtRepr> {
    let has = |f| info.has(f);
    (
        header(
            has(Flags::DETH),
            (any::<u32>(), u24()).prop_map(|(qkey, src_qp)| DethRepr { qkey, src_qp }),
        ),
        header(
            has(Flags::RETH),
            any::<(u64, u32, u32)>().prop_map(|(va, rkey, dma_len)| RethRepr { va, rkey, dma_len }),
        ),
        header(
            has(Flags::ATOMIC_ETH),
            any::<(u64, u32, u64, u64)>().prop_map(|(va, rkey, swap_add, compare)| AtomicEthRepr {
                va,
                rkey,
                swap_add,
                compare,
            }),
        ),
        header(
            has(Flags::AETH),
            (any::<u8>(), u24()).prop_map(|(syndrome, msn)| AethRepr { syndrome, msn }),
        ),
        header(
            has(Flags::ATOMIC_ACK_ETH),
            any::<u64>().prop_map(|orig| AtomicAckEthRepr { orig }),
        ),
        header(
            has(Flags::IMMDT),
            any::<u32>().prop_map(|imm| ImmDtRepr { imm }),
        ),
        header(
            has(Flags::IETH),
            any::<u32>().prop_map(|rkey| IethRepr { rkey }),
        ),
        header(
            has(Flags::XRCETH),
            u24().prop_map(|srqn| XrcEthRepr { srqn }),
        ),
    )
        .prop_map(
            |(deth, reth, atomic_eth, aeth, atomic_ack_eth, immdt, ieth, xrceth)| ExtRepr {
                deth,
                reth,
                atomic_eth,
                aeth,
                atomic_ack_eth,
                immdt,
                ieth,
                xrceth,
            },
        )
}

/// A BTH for `op` with every other field arbitrary. The pad count is
/// arbitrary too: emit must derive it from the payload length instead.
fn arb_bth(op: Opcode) -> impl Strategy<Value = BthRepr> {
    (any::<[bool; 5]>(), 0u8..4, any::<u16>(), u24(), u24()).prop_map(
        move |([solicited, migreq, fecn, becn, ack_req], pad, pkey, dest_qp, psn)| BthRepr {
            opcode: op,
            solicited,
            migreq,
            pad,
            pkey,
            fecn,
            becn,
            dest_qp,
            ack_req,
            psn: Psn::new(psn),
        },
    )
}

/// A valid packet of any opcode and its payload (0..=4096 bytes where the
/// opcode may carry one).
fn arb_packet() -> impl Strategy<Value = (PacketRepr, Vec<u8>)> {
    select(opcodes()).prop_flat_map(|op| {
        let info = op.info().unwrap();
        let payload = if info.has(Flags::PAYLOAD) {
            prop::collection::vec(any::<u8>(), 0..=4096).boxed()
        } else {
            Just(Vec::new()).boxed()
        };
        (arb_bth(op), arb_ext(info), payload).prop_map(|(bth, ext, payload)| {
            let repr = PacketRepr {
                bth,
                ext,
                payload_len: payload.len(),
            };
            (repr, payload)
        })
    })
}

/// Where a packet travels: IPv4 (with the IP ID and DF the ICRC covers) or
/// IPv6.
#[derive(Debug, Clone)]
struct Path {
    src: SocketAddr,
    dst: SocketAddr,
    ident: u16,
    df: bool,
}

fn arb_path() -> impl Strategy<Value = Path> {
    let v4 =
        (any::<[u8; 4]>(), any::<[u8; 4]>()).prop_map(|(s, d)| (IpAddr::from(s), IpAddr::from(d)));
    let v6 = (any::<[u8; 16]>(), any::<[u8; 16]>())
        .prop_map(|(s, d)| (IpAddr::from(s), IpAddr::from(d)));
    (
        prop_oneof![3 => v4, 1 => v6],
        any::<u16>(),
        any::<u16>(),
        any::<bool>(),
    )
        .prop_map(|((s, d), sport, ident, df)| Path {
            src: SocketAddr::new(s, sport),
            dst: SocketAddr::new(d, ROCEV2_UDP_PORT),
            ident,
            df,
        })
}

/// The IP and UDP headers the ICRC of `udp_payload_len` bytes covers.
fn icrc_headers(p: &Path, udp_payload_len: usize) -> (Vec<u8>, [u8; 8]) {
    let ulen = (udp_payload_len + 8) as u16;
    let udp = icrc::udp_header(p.src.port(), p.dst.port(), ulen);
    let ip = match (p.src.ip(), p.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            icrc::ipv4_header(s.octets(), d.octets(), p.ident, p.df, ulen).to_vec()
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => icrc::ipv6_header(s.octets(), d.octets(), ulen).to_vec(),
        _ => unreachable!(),
    };
    (ip, udp)
}

/// Emit `repr` with `payload` into a buffer that starts out as junk, so that
/// emit has to write every byte it owns, and fill in the ICRC.
fn emit(repr: &PacketRepr, payload: &[u8], p: &Path) -> Vec<u8> {
    let mut buf = vec![0xa5; repr.wire_len()];
    repr.emit_with_payload(&mut buf, payload);
    let (ip, udp) = icrc_headers(p, buf.len());
    icrc::fill(&ip, &udp, &mut buf);
    buf
}

/// What parsing an emitted `repr` must give back: the pad count follows
/// from the payload length, whatever the BTH said.
fn normalized(repr: &PacketRepr) -> PacketRepr {
    let mut r = *repr;
    r.bth.pad = r.pad_len() as u8;
    r
}

proptest! {
    #[test]
    fn emit_then_parse_round_trips((repr, payload) in arb_packet(), path in arb_path()) {
        let info = repr.validate().unwrap();
        let buf = emit(&repr, &payload, &path);
        prop_assert_eq!(buf.len(), info.header_len as usize + payload.len() + repr.pad_len() + len::ICRC);
        prop_assert_eq!(buf.len() % 4, 0);
        let pkt = Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(PacketRepr::parse(&pkt).unwrap(), normalized(&repr));
        prop_assert_eq!(pkt.payload(), &payload[..]);
        prop_assert!(pkt.pad_bytes().iter().all(|&b| b == 0));
        if info.has(Flags::CNP_RSVD) {
            prop_assert!(buf[len::BTH..len::BTH + len::CNP_RSVD].iter().all(|&b| b == 0));
        }
        let (ip, udp) = icrc_headers(&path, buf.len());
        prop_assert_eq!(icrc::compute(&ip, &udp, &buf[..buf.len() - 4]), pkt.icrc());
        prop_assert_eq!(icrc::carried(&buf), Some(pkt.icrc()));
    }

    /// The same packet inside a whole frame: the dissector finds it intact,
    /// and a UDP-socket receiver (no IP ID, no DF) checks its ICRC exactly
    /// for ID 0 + DF, and otherwise recovers the ID and DF it was sent with.
    #[test]
    fn framed_packet_dissects_and_verifies((repr, payload) in arb_packet(), path in arb_path()) {
        // build_frame always sets DF; the ICRC must cover what it writes.
        let path = Path { df: true, ..path };
        let buf = emit(&repr, &payload, &path);
        let mut fr = Vec::new();
        frame::build_frame(path.src, path.dst, path.ident, &buf, &mut fr);
        match dissect(&fr) {
            Dissection::Roce { src, dst, repr: got, icrc, .. } => {
                prop_assert_eq!((src, dst), (path.src, path.dst));
                prop_assert_eq!(got, normalized(&repr));
                prop_assert!(icrc.ok(), "{:?}", icrc);
            }
            other => prop_assert!(false, "{:?}", other),
        }
        let f = parse_ethernet_udp(&fr).unwrap().unwrap();
        prop_assert_eq!(f.payload, &buf[..]);
        if let (IpAddr::V4(s), IpAddr::V4(d)) = (path.src.ip(), path.dst.ip()) {
            let src = (s.octets(), path.src.port());
            let dst = (d.octets(), path.dst.port());
            let exact = icrc::verify_ipv4_hidden(src, dst, &buf, false);
            let recovering = icrc::verify_ipv4_hidden(src, dst, &buf, true);
            if path.ident == 0 {
                prop_assert_eq!(exact, HiddenCheck::Exact);
                prop_assert_eq!(recovering, HiddenCheck::Exact);
            } else {
                prop_assert_eq!(exact, HiddenCheck::Corrupt);
                prop_assert_eq!(recovering, HiddenCheck::Recovered { ident: path.ident, df: true });
            }
        }
    }

    /// Any single-bit error in the bytes the ICRC covers is caught; BTH byte
    /// 4 (FECN, BECN, reserved) is masked out of it by design.
    #[test]
    fn single_bit_errors_break_the_icrc(
        (repr, payload) in arb_packet(),
        path in arb_path(),
        at in any::<Index>(),
        bit in 0u8..8,
    ) {
        let mut buf = emit(&repr, &payload, &path);
        let (ip, udp) = icrc_headers(&path, buf.len());
        let i = at.index(buf.len());
        buf[i] ^= 1 << bit;
        let n = buf.len();
        let carried = u32::from_le_bytes(buf[n - 4..].try_into().unwrap());
        let ok = icrc::compute(&ip, &udp, &buf[..n - 4]) == carried;
        prop_assert_eq!(ok, i == 4, "byte {} bit {}", i, bit);
    }

    /// A PacketRepr validates exactly when its headers are the opcode's.
    #[test]
    fn validate_accepts_exactly_the_opcodes_headers(
        op in select(opcodes()),
        (other, ext) in select(opcodes()).prop_flat_map(|o| (Just(o), arb_ext(o.info().unwrap()))),
        payload_len in 0usize..8,
    ) {
        let info = op.info().unwrap();
        let bth = BthRepr { opcode: op, ..BthRepr::default() };
        let repr = PacketRepr { bth, ext, payload_len };
        let headers = Flags::DETH | Flags::RETH | Flags::ATOMIC_ETH | Flags::AETH
            | Flags::ATOMIC_ACK_ETH | Flags::IMMDT | Flags::IETH | Flags::XRCETH;
        let same_headers = info.flags.bits() & headers.bits()
            == other.info().unwrap().flags.bits() & headers.bits();
        let payload_ok = payload_len == 0 || info.has(Flags::PAYLOAD);
        prop_assert_eq!(repr.validate().is_ok(), same_headers && payload_ok);
    }
}

/// Read everything a checked packet offers; none of it may panic.
fn exercise_packet(bytes: &[u8]) {
    if let Ok(p) = Packet::new_checked(bytes) {
        let _ = (
            p.reth(),
            p.aeth(),
            p.atomic_eth(),
            p.atomic_ack_eth(),
            p.immdt(),
            p.ieth(),
            p.deth(),
            p.xrceth(),
        );
        let _ = (p.payload(), p.pad_bytes(), p.icrc(), p.bth().psn());
        let info = p.info();
        assert_eq!(
            info.header_len as usize + p.payload().len() + p.pad_bytes().len() + len::ICRC,
            bytes.len()
        );
        if let Ok(r) = PacketRepr::parse(&p) {
            assert!(r.validate().is_ok(), "{r:?}");
            assert_eq!(r.payload_len, p.payload().len());
        }
    }
}

/// A UDP GSO train as a capture on a loopback device holds it: `n`
/// packets of one WRITE to QP `qp` from PSN `psn`, all with `m` payload
/// bytes but the last (`last` bytes), each with the ICRC of the datagram
/// segmentation makes of it (its own IP and UDP lengths, the IPv4 ID
/// counting up from the train's), in one frame. Returns the frame and the
/// packets.
fn gso_train(
    path: &Path,
    qp: u32,
    psn: u32,
    n: usize,
    m: usize,
    last: usize,
) -> (Vec<u8>, Vec<Vec<u8>>) {
    let path = Path {
        df: true,
        ..path.clone()
    };
    let mut packets = Vec::new();
    let mut train = Vec::new();
    for k in 0..n {
        let size = if k + 1 == n { last } else { m };
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: if k + 1 == n {
                    Opcode::RC_RDMA_WRITE_LAST
                } else {
                    Opcode::RC_RDMA_WRITE_MIDDLE
                },
                dest_qp: qp,
                psn: Psn::new(psn).add(k as u32),
                ..BthRepr::default()
            },
            ext: ExtRepr::default(),
            payload_len: size,
        };
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 + k) as u8).collect();
        let seg = Path {
            ident: path.ident.wrapping_add(k as u16),
            ..path.clone()
        };
        let buf = emit(&repr, &payload, &seg);
        train.extend_from_slice(&buf);
        packets.push(buf);
    }
    let mut fr = Vec::new();
    frame::build_frame(path.src, path.dst, path.ident, &train, &mut fr);
    (fr, packets)
}

proptest! {
    /// A GSO train in one frame (`softrdma decode` of a loopback capture):
    /// read as one packet its ICRC fails; `dissect_all` finds each packet,
    /// in order, each with its own good ICRC. A corrupted packet after the
    /// first leaves the others good and only its own ICRC bad.
    #[test]
    fn a_gso_train_dissects_into_its_packets(
        path in arb_path(),
        qp in u24(),
        psn in u24(),
        n in 2usize..8,
        m in prop::sample::select(vec![8usize, 256, 1024, 4096]),
        short in 0usize..=4096,
        bad in any::<Index>(),
    ) {
        let last = short.min(m);
        let (fr, packets) = gso_train(&path, qp, psn, n, m, last);
        match dissect(&fr) {
            Dissection::Roce { icrc, .. } => prop_assert!(!icrc.ok()),
            other => prop_assert!(false, "{:?}", other),
        }
        let all = dissect_all(&fr);
        prop_assert_eq!(all.len(), n);
        for (k, d) in all.iter().enumerate() {
            match d {
                Dissection::Roce { repr, icrc, .. } => {
                    prop_assert!(icrc.ok(), "packet {}: {:?}", k, icrc);
                    prop_assert_eq!(repr.bth.psn, Psn::new(psn).add(k as u32));
                    prop_assert_eq!(repr.payload_len, if k + 1 == n { last } else { m });
                }
                other => prop_assert!(false, "packet {}: {:?}", k, other),
            }
        }
        // Corrupt one payload byte of a packet after the first.
        let j = 1 + bad.index(n - 1);
        let size = if j + 1 == n { last } else { m };
        if size > 0 {
            let at = fr.len() - packets[j..].iter().map(Vec::len).sum::<usize>() + len::BTH;
            let mut fr = fr.clone();
            fr[at] ^= 0x10;
            let all = dissect_all(&fr);
            prop_assert_eq!(all.len(), n);
            for (k, d) in all.iter().enumerate() {
                match d {
                    Dissection::Roce { icrc, .. } => prop_assert_eq!(icrc.ok(), k != j, "packet {}", k),
                    other => prop_assert!(false, "packet {}: {:?}", k, other),
                }
            }
        }
    }
}

/// softrdma's own port-sharing probe to port 4791 is no RoCEv2 packet:
/// the dissector says so instead of calling it malformed.
#[test]
fn a_steering_probe_is_not_roce() {
    let mut probe = [0u8; STEERING_PROBE_LEN];
    probe[0] = 0xff;
    probe[4..12].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    probe[13] = 3;
    assert!(is_steering_probe(&probe));
    let mut fr = Vec::new();
    let (src, dst) = (
        "127.0.0.1:40000".parse().unwrap(),
        "127.0.0.1:4791".parse().unwrap(),
    );
    frame::build_frame(src, dst, 0, &probe, &mut fr);
    assert_eq!(dissect(&fr), Dissection::NotRoce);
    assert_eq!(dissect_all(&fr), vec![Dissection::NotRoce]);
    // One byte longer, it is a malformed RoCEv2 packet again.
    let mut fr = Vec::new();
    frame::build_frame(src, dst, 0, &[&probe[..], &[0]].concat(), &mut fr);
    assert!(matches!(dissect(&fr), Dissection::Malformed { .. }));
}

/// Dissect and print a frame both ways; none of it may panic.
fn exercise_frame(bytes: &[u8]) {
    if let Ok(Some(f)) = parse_ethernet_udp(bytes) {
        assert_eq!(f.payload.len() + 8, f.udp.len as usize);
        assert_eq!(f.udp_header.len(), 8);
        let _ = icrc::check_frame(&f);
    }
    let d = dissect(bytes);
    let _ = Line(&d).to_string();
    let _ = to_json(1, &d);
    for d in dissect_all(bytes) {
        let _ = Line(&d).to_string();
    }
}

/// A buffer that starts like a packet: a known opcode, transport version 0.
fn almost_a_packet() -> impl Strategy<Value = Vec<u8>> {
    (
        select(opcodes()),
        0u8..16,
        prop::collection::vec(any::<u8>(), 0..128),
    )
        .prop_map(|(op, hi, mut rest)| {
            let mut v = vec![op.0, hi << 4];
            v.append(&mut rest);
            v
        })
}

/// A valid frame with a few bytes overwritten and its end cut off somewhere.
fn almost_a_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        arb_packet(),
        arb_path(),
        prop::collection::vec((any::<Index>(), any::<u8>()), 0..4),
        any::<Index>(),
    )
        .prop_map(|((repr, payload), path, edits, cut)| {
            let buf = emit(&repr, &payload, &path);
            let mut fr = Vec::new();
            frame::build_frame(path.src, path.dst, path.ident, &buf, &mut fr);
            for (at, v) in edits {
                let i = at.index(fr.len());
                fr[i] = v;
            }
            let keep = fr.len() - cut.index(fr.len() / 4 + 1);
            fr.truncate(keep);
            fr
        })
}

/// A pcap file header (either byte order, either time resolution) followed
/// by arbitrary bytes, or by records with arbitrary lengths.
fn almost_a_pcap() -> impl Strategy<Value = Vec<u8>> {
    let magic = select(vec![0xa1b2_c3d4u32, 0xa1b2_3c4d, 0xd4c3_b2a1, 0x4d3c_b2a1]);
    let records = prop::collection::vec(
        (
            any::<u32>(),
            prop_oneof![0u32..200, any::<u32>()],
            prop::collection::vec(any::<u8>(), 0..200),
        ),
        0..8,
    );
    (magic, records, prop::collection::vec(any::<u8>(), 0..32)).prop_map(
        |(magic, records, tail)| {
            let big = magic == 0xd4c3_b2a1 || magic == 0x4d3c_b2a1;
            let w = |v: u32| {
                if big {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                }
            };
            let mut f = Vec::new();
            f.extend_from_slice(&magic.to_le_bytes());
            f.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            f.extend_from_slice(&w(65535));
            f.extend_from_slice(&w(1));
            for (ts, incl, data) in records {
                f.extend_from_slice(&w(ts));
                f.extend_from_slice(&w(ts));
                f.extend_from_slice(&w(incl));
                f.extend_from_slice(&w(data.len() as u32));
                f.extend_from_slice(&data);
            }
            f.extend_from_slice(&tail);
            f
        },
    )
}

fn exercise_pcap(bytes: &[u8]) {
    if let Ok(f) = PcapFile::parse(bytes) {
        let mut consumed = 24;
        let mut number = 0;
        let mut ended_in_error = false;
        for r in f.records() {
            assert!(!ended_in_error, "a record after a truncated one");
            number += 1;
            match r {
                Ok(rec) => {
                    assert_eq!(rec.number, number);
                    consumed += 16 + rec.data.len();
                    exercise_frame(rec.data);
                }
                Err(n) => {
                    assert_eq!(n, number);
                    ended_in_error = true;
                }
            }
        }
        assert!(consumed <= bytes.len());
        assert!(ended_in_error || consumed == bytes.len());
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_packet_view(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        exercise_packet(&bytes);
    }

    #[test]
    fn almost_packets_never_panic_the_packet_view(bytes in almost_a_packet()) {
        exercise_packet(&bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_dissector(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        exercise_frame(&bytes);
    }

    #[test]
    fn almost_frames_never_panic_the_dissector(bytes in almost_a_frame()) {
        exercise_frame(&bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_pcap_reader(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        exercise_pcap(&bytes);
    }

    #[test]
    fn almost_pcaps_never_panic_the_pcap_reader(bytes in almost_a_pcap()) {
        exercise_pcap(&bytes);
    }
}

// PSN ring arithmetic: the properties `src/psn.rs` does not state.
proptest! {
    #[test]
    fn psn_new_and_checked_agree(v in any::<u32>()) {
        prop_assert_eq!(Psn::new(v).value(), v & Psn::MASK);
        prop_assert_eq!(Psn::checked(v).is_some(), v < Psn::MODULUS);
        if let Some(p) = Psn::checked(v) {
            prop_assert_eq!(p, Psn::new(v));
        }
    }

    #[test]
    fn psn_add_sub_inverse(a in u24(), n in any::<u32>()) {
        let p = Psn::new(a);
        prop_assert_eq!(p.add(n).sub(n), p);
        prop_assert_eq!(p.sub(n).add(n), p);
        prop_assert_eq!(p.add(n), p.add(n & Psn::MASK));
        prop_assert_eq!(p.distance_to(p.add(n)), n & Psn::MASK);
    }

    /// Away from the exact half-ring distance, every pair is ordered one way
    /// only; at it, `diff` is -2^23 both ways (see psn.rs) and both are
    /// "before" the other.
    #[test]
    fn psn_order_is_antisymmetric(a in u24(), b in u24()) {
        let (p, q) = (Psn::new(a), Psn::new(b));
        prop_assert_eq!(p.before(q), q.after(p) || p.distance_to(q) == Psn::HALF);
        let d = p.distance_to(q);
        prop_assert_eq!((d + q.distance_to(p)) % Psn::MODULUS, 0);
        if d != Psn::HALF {
            let n = [p.before(q), p.after(q), p == q].iter().filter(|&&x| x).count();
            prop_assert_eq!(n, 1);
            prop_assert_eq!(q.diff(p), if d < Psn::HALF { d as i32 } else { d as i32 - Psn::MODULUS as i32 });
            prop_assert_eq!(p.diff(q), -q.diff(p));
        }
    }

    #[test]
    fn psn_window_is_forward_distance(s in u24(), k in u24(), len in 0u32..=Psn::MODULUS) {
        let start = Psn::new(s);
        prop_assert_eq!(start.add(k).in_window(start, len), k < len);
        // Windows of up to half the ring agree with the ordering.
        if len <= Psn::HALF && k < len {
            prop_assert!(!start.add(k).before(start));
        }
    }
}

/// Found by `almost_packets_never_panic_the_packet_view`: an ACK followed by
/// one stray byte used to be accepted and parse into a repr with a payload,
/// which `validate` rejects and `emit_headers` panics on.
#[test]
fn payload_on_an_opcode_without_payload_is_rejected() {
    let repr = PacketRepr {
        bth: BthRepr {
            opcode: Opcode::RC_ACKNOWLEDGE,
            ..BthRepr::default()
        },
        ext: ExtRepr {
            aeth: Some(AethRepr::new(Syndrome::ACK_UNLIMITED, 1)),
            ..ExtRepr::default()
        },
        payload_len: 0,
    };
    let mut buf = vec![0u8; repr.wire_len()];
    repr.emit_with_payload(&mut buf, &[]);
    assert!(Packet::new_checked(&buf[..]).is_ok());
    buf.insert(repr.header_len(), 0x42);
    let err = Packet::new_checked(&buf[..]).unwrap_err();
    assert!(err.to_string().contains("opcode without payload"), "{err}");
}
