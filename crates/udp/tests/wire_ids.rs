//! What really leaves the host: the IPv4 ID and DF the kernel writes, and
//! whether our ICRC verifies over those real headers.
//!
//! The ICRC covers the IPv4 Identification field, which a UDP socket
//! cannot set. softrdma relies on two kernel behaviours: an unconnected
//! socket with `IP_PMTUDISC_DO` sends DF and ID 0, and the software GSO path
//! numbers a train's segments 0, 1, 2, ... This test checks both on the
//! wire. Loopback cannot show it (it passes GSO trains whole and nobody
//! reads its IDs), so the test builds two network namespaces joined by a
//! veth pair, limits the sending veth to one segment per packet (forcing
//! software segmentation), runs a copy of itself in the sending namespace,
//! and captures that copy's frames with an AF_PACKET socket.
//!
//! Needs root and iproute2; skipped otherwise. Only addresses inside the
//! namespaces it creates (and deletes) are used.

mod common;

use common::*;
use socket2::{Domain, Protocol, Socket, Type};
use softrdma_udp::{Port, PortConfig};
use softrdma_wire::frame::{parse_ethernet_udp, IpRepr, Ipv4Repr};
use softrdma_wire::icrc;
use softrdma_wire::Opcode;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SOFTRDMA_UDP_WIRE_IDS_CHILD";
const SRC: Ipv4Addr = Ipv4Addr::new(10, 199, 0, 1);
const DST: Ipv4Addr = Ipv4Addr::new(10, 199, 0, 2);

/// Deletes the namespaces it names when dropped.
struct Netns(Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn ip(args: &str) -> bool {
    Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn kernel_ids_and_our_icrc_on_the_wire() {
    let pid = std::process::id();
    let (a, b) = (format!("srdma-ids-a-{pid}"), format!("srdma-ids-b-{pid}"));
    if !ip(&format!("netns add {a}")) {
        eprintln!("skipped: cannot create a network namespace (needs root and iproute2)");
        return;
    }
    let _guard = Netns(vec![a.clone(), b.clone()]);
    assert!(ip(&format!("netns add {b}")));
    assert!(ip(&format!(
        "-n {a} link add v0 type veth peer name v1 netns {b}"
    )));
    assert!(ip(&format!("-n {a} addr add {SRC}/24 dev v0")));
    assert!(ip(&format!("-n {b} addr add {DST}/24 dev v1")));
    assert!(ip(&format!("-n {a} link set v0 gso_max_segs 1 up")));
    assert!(ip(&format!(
        "-n {b} link set v1 address 02:00:00:00:00:02 up"
    )));
    assert!(ip(&format!(
        "-n {a} neigh add {DST} lladdr 02:00:00:00:00:02 dev v0"
    )));

    let out = Command::new("ip")
        .args(["netns", "exec", &a])
        .arg(std::env::current_exe().unwrap())
        .args([
            "sender_in_namespace",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("WIRE OK"))
        .unwrap_or_else(|| panic!("{stdout}"));
    eprintln!("{}", line.trim());
}

/// Runs in the sending namespace when started by the test above.
#[test]
fn sender_in_namespace() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    // ETH_P_ALL in network byte order: every frame, outgoing ones included.
    let cap = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(0x0300))).unwrap();
    cap.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut port = Port::open(PortConfig {
        shared: false,
        ..PortConfig::new(IpAddr::V4(SRC))
    })
    .unwrap();
    let dst = SRC.to_ipv6_mapped().octets();
    let dst = {
        let mut g = dst;
        g[12..].copy_from_slice(&DST.octets());
        g
    };
    // Three datagrams alone (different QPs), then a GSO train of six.
    let singles: Vec<Pkt> = (0..3)
        .map(|i| send_only(0x01_0000 + i, i, 100 + i as usize))
        .collect();
    let mut train: Vec<Pkt> = (0..5)
        .map(|i| pkt(Opcode::RC_RDMA_WRITE_MIDDLE, 0x01_0009, i, 1024))
        .collect();
    train.push(pkt(Opcode::RC_RDMA_WRITE_LAST, 0x01_0009, 5, 333));
    {
        let mut tx = port.tx();
        for p in singles.iter().chain(&train) {
            tx.push(dst, 1, &p.head, &[&p.payload], p.pad).unwrap();
        }
        tx.finish().unwrap();
    }
    let gso = port.gso_enabled() && port.stats().gso_batches == 1;
    // Every datagram leaves from the sending QP's source port.
    let sport = port.source_port(1);
    assert_ne!(sport, 4791);

    let mut frames = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut buf = vec![0u8; 65536];
    while frames.len() < singles.len() + train.len() && Instant::now() < deadline {
        let Ok(n) = (&cap).read(&mut buf) else {
            continue;
        };
        let Ok(Some(f)) = parse_ethernet_udp(&buf[..n]) else {
            continue;
        };
        let IpRepr::V4(ip) = f.ip else { continue };
        if ip.src == SRC.octets() && f.udp.src_port == sport {
            let (got, want) = icrc::check_frame(&f).unwrap();
            frames.push((ip, got == want, f.payload.len()));
        }
    }
    assert_eq!(frames.len(), singles.len() + train.len(), "frames captured");
    for (i, (ip, icrc_ok, len)) in frames.iter().enumerate() {
        let expect_id = if gso && i >= singles.len() {
            (i - singles.len()) as u16
        } else {
            0
        };
        assert!(ip.flags_frag & Ipv4Repr::DF != 0, "frame {i}: DF");
        assert_eq!(ip.ident, expect_id, "frame {i}: IPv4 ID (gso {gso})");
        assert!(icrc_ok, "frame {i}: ICRC over the real headers");
        let want_len = if i < singles.len() {
            &singles[i]
        } else {
            &train[i - singles.len()]
        };
        assert_eq!(*len, want_len.body().len() + 4);
    }
    println!("WIRE OK: {} frames, gso {gso}", frames.len());
}
