//! tshark agrees with us: one packet of every opcode in the table, with
//! distinctive values in every header field, written to a pcap and read back
//! by Wireshark's InfiniBand dissector, field by field.
//!
//! This is the independent check on the emit side: the golden captures prove
//! we read what rxe writes; this proves that what we write reads, to a second
//! implementation, as what we meant. tshark is required: a machine without it
//! fails this test rather than skipping it silently.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use softrdma_wire::ext::*;
use softrdma_wire::opcode::{Flags, OpcodeInfo, Transport};
use softrdma_wire::packet::ExtRepr;
use softrdma_wire::pcap::PcapWriter;
use softrdma_wire::{frame, icrc, BthRepr, Opcode, PacketRepr, Psn, ROCEV2_UDP_PORT};

/// One packet of the test capture.
struct Case {
    repr: PacketRepr,
    src: SocketAddr,
    dst: SocketAddr,
}

/// Payload lengths, cycled through: every pad count 0..=3, and lengths
/// around the 1 KiB path MTU.
const PAYLOAD_LENS: [usize; 12] = [1, 2, 3, 0, 5, 6, 7, 4, 13, 1023, 1022, 1021];

/// AETH syndromes, cycled through: ACK with credits, unlimited ACK, RNR NAK,
/// and each NAK code.
const SYNDROMES: [u8; 8] = [0x1f, 0x00, 0x2e, 0x60, 0x61, 0x62, 0x63, 0x64];

/// The packet for the `i`-th opcode of the table: every field derived from
/// `i` so that a value landing in the wrong packet or the wrong field shows.
fn repr_for(i: usize, op: Opcode, info: &OpcodeInfo) -> PacketRepr {
    let k = i as u32;
    let q = i as u64;
    let has = |f| info.has(f);
    let ext = ExtRepr {
        deth: has(Flags::DETH).then_some(DethRepr {
            qkey: 0x8001_0000 | k,
            src_qp: 0x00fe_dc00 + k,
        }),
        reth: has(Flags::RETH).then_some(RethRepr {
            va: 0x0123_4567_89ab_cd00 | q,
            rkey: 0xfeed_0000 | k,
            dma_len: 4097 + 3 * k,
        }),
        atomic_eth: has(Flags::ATOMIC_ETH).then_some(AtomicEthRepr {
            va: 0xfedc_ba98_7654_3200 | q,
            rkey: 0x5a5a_0000 | k,
            swap_add: 0x1111_2222_3333_4400 + q,
            compare: 0x9999_aaaa_bbbb_cc00 + q,
        }),
        aeth: has(Flags::AETH).then_some(AethRepr {
            syndrome: SYNDROMES[i % SYNDROMES.len()],
            msn: 0x00ab_cd00 + k,
        }),
        atomic_ack_eth: has(Flags::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr {
            orig: 0x8000_0000_0000_0001 + (q << 8),
        }),
        immdt: has(Flags::IMMDT).then_some(ImmDtRepr {
            imm: 0xdead_be00 | k,
        }),
        ieth: has(Flags::IETH).then_some(IethRepr {
            rkey: 0xc0de_0000 | k,
        }),
        xrceth: has(Flags::XRCETH).then_some(XrcEthRepr {
            srqn: 0x00c5_0000 | k,
        }),
    };
    PacketRepr {
        bth: BthRepr {
            opcode: op,
            solicited: i.is_multiple_of(3),
            ack_req: i.is_multiple_of(2),
            migreq: i % 5 == 1,
            pkey: if i % 4 == 1 {
                0x8000 | k as u16
            } else {
                0xffff
            },
            dest_qp: 0x00a1_b200 + k,
            // Start just below the wrap so the top of the PSN space shows.
            psn: Psn::new(0x00ff_fff0 + k),
            ..BthRepr::default()
        },
        ext,
        payload_len: if has(Flags::PAYLOAD) {
            PAYLOAD_LENS[i % PAYLOAD_LENS.len()]
        } else {
            0
        },
    }
}

fn cases() -> Vec<Case> {
    Opcode::all()
        .enumerate()
        .map(|(i, (op, info))| {
            let sport = 49152 + i as u16;
            let (src, dst) = if i % 7 == 3 {
                // A few over IPv6 loopback.
                (
                    SocketAddr::new("::1".parse().unwrap(), sport),
                    SocketAddr::new("::1".parse().unwrap(), ROCEV2_UDP_PORT),
                )
            } else {
                let d = format!("127.0.0.{}", 2 + i % 5);
                (
                    SocketAddr::new("127.0.0.1".parse().unwrap(), sport),
                    SocketAddr::new(d.parse().unwrap(), ROCEV2_UDP_PORT),
                )
            };
            Case {
                repr: repr_for(i, op, info),
                src,
                dst,
            }
        })
        .collect()
}

/// The payload bytes of a case: a pattern that is not all zeros.
fn payload(c: &Case) -> Vec<u8> {
    (0..c.repr.payload_len)
        .map(|j| (j as u8).wrapping_mul(31) ^ 0xa5)
        .collect()
}

/// The whole Ethernet frame of a case, ICRC computed over the headers
/// [`frame::build_frame`] writes (IPv4 ID 0 with DF, or IPv6).
fn frame_of(c: &Case) -> Vec<u8> {
    let mut roce = vec![0u8; c.repr.wire_len()];
    c.repr.emit_with_payload(&mut roce, &payload(c));
    let udp_len = (roce.len() + 8) as u16;
    let udp = icrc::udp_header(c.src.port(), c.dst.port(), udp_len);
    match (c.src, c.dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            let ip = icrc::ipv4_header(s.ip().octets(), d.ip().octets(), 0, true, udp_len);
            icrc::fill(&ip, &udp, &mut roce);
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            let ip = icrc::ipv6_header(s.ip().octets(), d.ip().octets(), udp_len);
            icrc::fill(&ip, &udp, &mut roce);
        }
        _ => unreachable!("mixed address families"),
    }
    let mut out = Vec::new();
    frame::build_frame(c.src, c.dst, 0, &roce, &mut out);
    out
}

/// Write `frames` to a pcap in the test's scratch directory (kept after the
/// test, for a look with `tshark -V`).
fn write_pcap(frames: &[Vec<u8>]) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("tshark_every_opcode.pcap");
    let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut w = PcapWriter::new(std::io::BufWriter::new(file), 65535).unwrap();
    for (i, f) in frames.iter().enumerate() {
        let ts = Duration::new(1_700_000_000 + i as u64, 1000 * i as u32);
        w.write_frame(ts, f).unwrap();
    }
    w.flush().unwrap();
    path
}

/// How tshark 4.0 prints a field with `-T fields` (found by experiment).
#[derive(Clone, Copy, Debug)]
enum Fmt {
    /// `123`
    Dec,
    /// `0x00ab`: `0x` and this many hex digits, the field's full width
    /// (tshark's DETH Q_Key is a 64-bit field, its source QP 32 bits).
    Hex(usize),
    /// `deadbeef`: byte fields (ImmDt, IETH) print as bare hex, two digits
    /// per byte, this many bytes.
    Bytes(usize),
    /// `1` / `0`
    Bool,
    /// Present or not: any text means "yes".
    Text,
}

/// The columns asked of tshark, in order, with the key each is compared
/// under. AtomicETH's VA and R_Key come out as `infiniband.reth.*`: tshark
/// reuses the RETH fields for them.
const FIELDS: &[(&str, &str, Fmt)] = &[
    ("frame.number", "frame", Fmt::Dec),
    ("infiniband.bth.opcode", "opcode", Fmt::Dec),
    ("infiniband.bth.destqp", "dest_qp", Fmt::Hex(6)),
    ("infiniband.bth.psn", "psn", Fmt::Dec),
    ("infiniband.bth.a", "ack_req", Fmt::Bool),
    ("infiniband.bth.se", "se", Fmt::Bool),
    ("infiniband.bth.padcnt", "pad", Fmt::Dec),
    ("infiniband.reth.va", "va", Fmt::Hex(16)),
    ("infiniband.reth.r_key", "rkey", Fmt::Hex(8)),
    ("infiniband.reth.dmalen", "dma_len", Fmt::Dec),
    ("infiniband.aeth.syndrome", "syndrome", Fmt::Dec),
    ("infiniband.aeth.msn", "msn", Fmt::Dec),
    ("infiniband.deth.q_key", "qkey", Fmt::Hex(16)),
    ("infiniband.deth.srcqp", "src_qp", Fmt::Hex(8)),
    ("infiniband.atomiceth.swapdt", "swap_add", Fmt::Dec),
    ("infiniband.atomiceth.cmpdt", "compare", Fmt::Dec),
    ("infiniband.atomicacketh.origremdt", "orig", Fmt::Dec),
    ("infiniband.immdt", "imm", Fmt::Bytes(4)),
    ("infiniband.ieth", "ieth_rkey", Fmt::Bytes(4)),
    ("_ws.malformed", "malformed", Fmt::Text),
    ("_ws.expert", "expert", Fmt::Text),
    // Beyond the transport headers: the rest of what we emit.
    ("infiniband.bth.p_key", "pkey", Fmt::Dec),
    ("infiniband.bth.m", "migreq", Fmt::Bool),
    ("infiniband.invariant.crc", "icrc", Fmt::Hex(8)),
    ("ip.checksum.status", "ip_checksum_good", Fmt::Dec),
    ("udp.checksum.status", "udp_checksum_good", Fmt::Dec),
];

/// Run tshark over `path` with `extra` arguments and `fields`; one row of
/// raw strings per frame.
fn tshark(path: &std::path::Path, extra: &[&str], fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(path);
    cmd.args(["-T", "fields", "-E", "separator=/t"]);
    // No heuristic may claim the payload: port 4791 is RoCEv2, full stop.
    cmd.args(["--disable-heuristic", "rpcrdma_infiniband"]);
    // Let tshark verify the IPv4 and UDP checksums build_frame wrote.
    cmd.args([
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
    ]);
    cmd.args(extra);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("tshark not found: install it (apt-get install tshark)")
        }
        Err(e) => panic!("running tshark: {e}"),
    };
    // stderr is not parsed: as root, tshark warns there about running as root.
    assert!(
        out.status.success(),
        "tshark failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("tshark output is UTF-8")
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// A field's text as a number, if it is in the format tshark uses for it.
fn parse_value(s: &str, fmt: Fmt) -> Option<u64> {
    let hex = |h: &str, digits: usize| {
        if h.len() != digits || !h.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(h, 16).ok()
    };
    match fmt {
        Fmt::Dec if s.bytes().all(|c| c.is_ascii_digit()) => s.parse().ok(),
        Fmt::Dec => None,
        Fmt::Hex(digits) => hex(s.strip_prefix("0x")?, digits),
        Fmt::Bytes(n) => hex(s, 2 * n),
        Fmt::Bool => match s {
            "1" => Some(1),
            "0" => Some(0),
            _ => None,
        },
        Fmt::Text => Some(1),
    }
}

/// One tshark row as `key -> value`, only for the fields it printed; each
/// value must be in the format tshark is known to use for that field.
fn parse_row(row: &[String]) -> BTreeMap<&'static str, u64> {
    assert_eq!(row.len(), FIELDS.len(), "tshark row {row:?}");
    let mut m = BTreeMap::new();
    for (&(name, key, fmt), s) in FIELDS.iter().zip(row) {
        if s.is_empty() {
            continue;
        }
        let v = parse_value(s, fmt)
            .unwrap_or_else(|| panic!("{name}: {s:?} is not in {fmt:?} format (row {row:?})"));
        m.insert(key, v);
    }
    m
}

/// What tshark should print for case `i` (frame `i + 1`), under the keys of
/// [`FIELDS`].
fn expected(i: usize, c: &Case, icrc_wire: [u8; 4]) -> BTreeMap<&'static str, u64> {
    let r = &c.repr;
    let b = &r.bth;
    let e = &r.ext;
    let mut m = BTreeMap::new();
    let mut put = |k, v: u64| {
        m.insert(k, v);
    };
    put("frame", i as u64 + 1);
    put("opcode", b.opcode.0.into());
    put("dest_qp", b.dest_qp.into());
    put("psn", b.psn.value().into());
    put("ack_req", b.ack_req.into());
    put("se", b.solicited.into());
    put("pad", r.pad_len() as u64);
    put("pkey", b.pkey.into());
    put("migreq", b.migreq.into());
    if let Some(h) = e.reth {
        put("va", h.va);
        put("rkey", h.rkey.into());
        put("dma_len", h.dma_len.into());
    }
    if let Some(h) = e.atomic_eth {
        put("va", h.va);
        put("rkey", h.rkey.into());
        put("swap_add", h.swap_add);
        put("compare", h.compare);
    }
    if let Some(h) = e.aeth {
        put("syndrome", h.syndrome.into());
        put("msn", h.msn.into());
    }
    if let Some(h) = e.deth {
        // tshark reads the reserved byte and the source QP as one 32-bit
        // field; we emit the reserved byte as zero.
        put("qkey", h.qkey.into());
        put("src_qp", h.src_qp.into());
    }
    if let Some(h) = e.atomic_ack_eth {
        put("orig", h.orig);
    }
    if let Some(h) = e.immdt {
        put("imm", h.imm.into());
    }
    if let Some(h) = e.ieth {
        put("ieth_rkey", h.rkey.into());
    }
    if b.opcode != Opcode::CNP {
        // tshark shows the ICRC as the big-endian number of its wire bytes.
        put("icrc", u32::from_be_bytes(icrc_wire).into());
    }
    // 1 is "Good" in Wireshark's checksum status; IPv6 has no header checksum.
    if c.src.is_ipv4() {
        put("ip_checksum_good", 1);
    }
    put("udp_checksum_good", 1);
    m
}

#[test]
fn tshark_decodes_every_opcode_as_we_emitted_it() {
    let cases = cases();
    assert_eq!(cases.len(), Opcode::all().count());
    // The cases cover every pad count and both IP versions.
    let pads: std::collections::BTreeSet<_> = cases.iter().map(|c| c.repr.pad_len()).collect();
    assert_eq!(pads.len(), 4, "{pads:?}");
    assert!(cases.iter().any(|c| c.src.is_ipv6()));
    let frames: Vec<Vec<u8>> = cases.iter().map(frame_of).collect();
    let path = write_pcap(&frames);
    let names: Vec<&str> = FIELDS.iter().map(|f| f.0).collect();
    let rows = tshark(&path, &["-E", "occurrence=f"], &names);
    assert_eq!(rows.len(), cases.len(), "tshark read {} frames", rows.len());
    for (i, (c, row)) in cases.iter().zip(&rows).enumerate() {
        let f = &frames[i];
        let icrc_wire: [u8; 4] = f[f.len() - 4..].try_into().unwrap();
        let got = parse_row(row);
        let mut want = expected(i, c, icrc_wire);
        if c.repr.info().is_some_and(|i| i.transport == Transport::Xrc) {
            // Wireshark 4.0 names the XRC opcodes but dissects only their
            // BTH, showing the rest as vendor data (checked byte for byte
            // in `tshark_shows_xrc_as_its_bth_then_our_bytes`).
            for k in ["opcode", "dest_qp", "psn", "ack_req", "se", "pad", "pkey"] {
                assert!(got.contains_key(k), "frame {}: no {k}", i + 1);
            }
            want.retain(|k, _| got.contains_key(k));
        }
        if c.repr.bth.opcode == Opcode::RC_ATOMIC_WRITE && !got.contains_key("va") {
            // Wireshark before 4.2 predates IBA 1.5's ATOMIC WRITE (0x1d) and
            // dissects only its BTH (Debian 12 ships 4.0): compare what it
            // shows, and the rest where it knows the opcode.
            want.retain(|k, _| got.contains_key(k));
        }
        assert_eq!(
            got,
            want,
            "frame {} ({:?}, {} > {}): tshark disagrees",
            i + 1,
            c.repr.bth.opcode,
            c.src,
            c.dst
        );
    }
}

/// Wireshark 4.0 knows the XRC opcodes by name ("Extended Reliable
/// Connection (XRC) - SEND First") but not the XRCETH: after the BTH it
/// shows everything as one "Unknown/Vendor Specific Data" field. That
/// field must be exactly our bytes after the BTH — XRCETH (a zero byte and
/// the 24-bit SRQ number), the other headers, payload, pad and ICRC — and
/// the opcode must read as XRC.
#[test]
fn tshark_shows_xrc_as_its_bth_then_our_bytes() {
    let cases = cases();
    let frames: Vec<Vec<u8>> = cases.iter().map(frame_of).collect();
    let path = write_pcap(&frames);
    let rows = tshark(
        &path,
        &["-E", "occurrence=l"],
        &["frame.number", "infiniband.bth.opcode", "infiniband.vendor"],
    );
    let mut n = 0;
    for (i, c) in cases.iter().enumerate() {
        if c.repr.info().map(|i| i.transport) != Some(Transport::Xrc) {
            continue;
        }
        n += 1;
        let f = &frames[i];
        let roce = &f[f.len() - c.repr.wire_len()..];
        let want: String = roce[12..].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            rows[i][1],
            c.repr.bth.opcode.0.to_string(),
            "frame {}",
            i + 1
        );
        assert_eq!(
            rows[i][2],
            want,
            "frame {} ({:?})",
            i + 1,
            c.repr.bth.opcode
        );
        if let Some(x) = c.repr.ext.xrceth {
            assert_eq!(&want[..8], format!("00{:06x}", x.srqn), "frame {}", i + 1);
        }
    }
    assert_eq!(n, 23, "every XRC opcode");
    // The opcode names tshark gives them.
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args([
            "-V",
            "-Y",
            "infiniband.bth.opcode >= 160 && infiniband.bth.opcode < 192",
        ])
        .output()
        .expect("tshark");
    let text = String::from_utf8_lossy(&out.stdout);
    let xrc_lines = text
        .lines()
        .filter(|l| {
            l.trim_start()
                .starts_with("Opcode: Extended Reliable Connection (XRC) - ")
        })
        .count();
    assert_eq!(xrc_lines, 23, "{text}");
}

/// tshark 4.0 does not know the RoCEv2 CNP (opcode 0x81, Annex A17): it
/// decodes the BTH, names the opcode "Unknown (129)" and shows the rest as
/// "Unknown/Vendor Specific Data". The BTH fields are checked with every
/// other opcode above (no malformed, no expert info); here: what follows the
/// BTH is exactly the 16 zero reserved bytes and the ICRC, nothing more.
#[test]
fn tshark_shows_cnp_as_bth_plus_sixteen_reserved_bytes() {
    let (i, c) = cases()
        .into_iter()
        .enumerate()
        .find(|(_, c)| c.repr.bth.opcode == Opcode::CNP)
        .expect("CNP is in the table");
    let f = frame_of(&c);
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("tshark_cnp.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap(), 65535).unwrap();
    w.write_frame(Duration::new(1_700_000_000 + i as u64, 0), &f)
        .unwrap();
    w.flush().unwrap();
    drop(w);
    // The vendor field occurs twice (its subtree header, 4 bytes, then the
    // data item): ask for the last.
    let rows = tshark(
        &path,
        &["-E", "occurrence=l"],
        &[
            "infiniband.bth.opcode",
            "infiniband.vendor",
            "_ws.malformed",
            "_ws.expert",
        ],
    );
    let icrc: String = f[f.len() - 4..]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let want = vec![
        "129".to_owned(),
        format!("{}{icrc}", "00".repeat(16)),
        String::new(),
        String::new(),
    ];
    assert_eq!(rows, vec![want]);
}
