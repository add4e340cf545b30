//! Ports exchanging RoCEv2 datagrams over loopback (127.0.0.0/8 and ::1).
//! Each test uses its own loopback address(es) so they can run in parallel.

mod common;

use common::*;
use softrdma_udp::{FaultConfig, Port, PortConfig, PortOptions, PortStats};
use softrdma_wire::frame::parse_ethernet_udp;
use softrdma_wire::icrc::{self, HiddenCheck};
use softrdma_wire::pcap::PcapFile;
use softrdma_wire::Opcode;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

/// A port on 127.0.0.`last` that marks what it sends ECT(0) (traffic
/// class 0x02), not shared.
fn ect0_port_v4(last: u8) -> Port {
    let ect0 = PortOptions {
        traffic_class: 0x02,
        ..PortOptions::default()
    };
    Port::open_with(
        PortConfig {
            shared: false,
            ..PortConfig::new(v4(last))
        },
        ect0,
    )
    .unwrap()
}

#[test]
fn two_ports_exchange_ipv4() {
    let mut a = ect0_port_v4(11);
    let mut b = port_v4(12);
    let sizes = [0, 1, 7, 100, 1024, 4096];
    let pkts: Vec<Pkt> = (0..24u32)
        .map(|i| send_only(0x01_0000 | i, i, sizes[i as usize % 6]))
        .collect();
    {
        let mut tx = a.tx();
        for p in &pkts {
            // Several memory segments per packet, as a scatter list gives.
            let segs: Vec<&[u8]> = p.payload.chunks(333).collect();
            tx.push(b.local_gid(), 0x01_0001, &p.head, &segs, p.pad)
                .unwrap();
        }
        tx.finish().unwrap();
    }
    let got = recv_n(&mut b, pkts.len());
    assert_eq!(got.len(), pkts.len());
    // The source port is QP 0x01_0001's, as rxe would derive it (its low
    // eight bits cleared: 64 buckets).
    let sport = a.source_port(0x01_0001);
    assert_eq!(sport, softrdma_udp::rxe_source_port(0x01_0001) & 0xff00);
    for ((m, d), p) in got.iter().zip(&pkts) {
        assert_eq!(&d[..d.len() - 4], &p.body()[..]);
        assert!(
            exact_v4(v4(11), v4(12), sport, 4791, d),
            "ICRC with ID 0/DF"
        );
        assert_eq!(
            (m.sgid, m.dgid, m.src_port),
            (a.local_gid(), b.local_gid(), sport)
        );
        assert_eq!(m.traffic_class, 0x02);
        assert!(m.hop_limit > 0);
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_packets, 24);
    assert_eq!(sa.tx_bytes, sb.rx_bytes);
    assert_eq!((sb.rx_packets, sb.icrc_bad, sb.icrc_recovered), (24, 0, 0));
    assert!(b.is_softrdma_peer(a.local_gid(), sport));
    assert_eq!(sa.tx_source_ports, 1);

    // And back, one at a time.
    let p = send_only(0x01_0001, 99, 64);
    b.send(a.local_gid(), 0x01_0002, &p.head, &[&p.payload], p.pad)
        .unwrap();
    let got = recv_n(&mut a, 1);
    assert_eq!(&got[0].1[..got[0].1.len() - 4], &p.body()[..]);
}

fn v6_pair(pa: u16, pb: u16) -> (Port, Port) {
    let l = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let open = |port, remote_port| {
        let cfg = PortConfig {
            port,
            shared: false,
            ..PortConfig::new(l)
        };
        let opts = PortOptions {
            remote_port: Some(remote_port),
            traffic_class: 0x60,
            ..PortOptions::default()
        };
        Port::open_with(cfg, opts).unwrap()
    };
    (open(pa, pb), open(pb, pa))
}

#[test]
fn ipv6_loopback() {
    let (mut a, mut b) = v6_pair(14791, 14792);
    assert_eq!(a.local_gid(), Ipv6Addr::LOCALHOST.octets());
    let pkts: Vec<Pkt> = (0..8)
        .map(|i| send_only(0x02_0000, i, 13 * i as usize))
        .collect();
    {
        let mut tx = a.tx();
        for p in &pkts {
            tx.push(b.local_gid(), 1, &p.head, &[&p.payload], p.pad)
                .unwrap();
        }
    }
    let got = recv_n(&mut b, pkts.len());
    assert_eq!(got.len(), pkts.len());
    let sport = a.source_port(1);
    for ((m, d), p) in got.iter().zip(&pkts) {
        assert_eq!(&d[..d.len() - 4], &p.body()[..]);
        let n = d.len();
        let ulen = (n + 8) as u16;
        let l = Ipv6Addr::LOCALHOST.octets();
        let want = icrc::compute(
            &icrc::ipv6_header(l, l, ulen),
            &icrc::udp_header(sport, 14792, ulen),
            &d[..n - 4],
        );
        assert_eq!(icrc::carried(d), Some(want));
        assert_eq!((m.src_port, m.traffic_class), (sport, 0x60));
    }
    assert_eq!(b.stats().icrc_bad, 0);
    // A bad ICRC over IPv6 is dropped too.
    let plain = UdpSocket::bind("[::1]:14793").unwrap();
    let mut d = pkts[3].body();
    d.extend_from_slice(&[1, 2, 3, 4]);
    plain.send_to(&d, "[::1]:14792").unwrap();
    // Awaited, not sampled after a fixed time: loopback's softirq work may
    // be deferred to ksoftirqd on a loaded machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while b.stats().icrc_bad == 0 && std::time::Instant::now() < deadline {
        recv_for(&mut b, Duration::from_millis(1));
    }
    assert_eq!(b.stats().icrc_bad, 1);
}

/// A datagram with an ICRC computed as if the IPv4 header had `ident`/DF.
fn datagram_v4(p: &Pkt, src: SocketAddr, dst: SocketAddr, ident: u16) -> Vec<u8> {
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        panic!()
    };
    let mut b = p.body();
    let ulen = (b.len() + 4 + 8) as u16;
    let c = icrc::compute(
        &icrc::ipv4_header(s.ip().octets(), d.ip().octets(), ident, true, ulen),
        &icrc::udp_header(src.port(), dst.port(), ulen),
        &b,
    );
    b.extend_from_slice(&c.to_le_bytes());
    b
}

#[test]
fn corrupted_icrc_is_dropped_and_counted() {
    let mut b = port_v4(14);
    let src: SocketAddr = "127.0.0.13:4791".parse().unwrap();
    let dst = b.local_addr();
    let plain = UdpSocket::bind(src).unwrap();
    for i in 0..4 {
        plain
            .send_to(&datagram_v4(&send_only(0x01_0000, i, 40), src, dst, 0), dst)
            .unwrap();
    }
    assert_eq!(recv_n(&mut b, 4).len(), 4);
    assert!(b.is_softrdma_peer(v4gid(13), 4791));
    let good = datagram_v4(&send_only(0x01_0000, 9, 40), src, dst, 0);
    for flip in [(30, 0x10), (good.len() - 2, 0x01), (5, 0x80)] {
        let mut d = good.clone();
        d[flip.0] ^= flip.1;
        plain.send_to(&d, dst).unwrap();
    }
    plain.send_to(&good[..10], dst).unwrap(); // too short for BTH + ICRC
    plain.send_to(&good, dst).unwrap();
    let got = recv_n(&mut b, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, good);
    let s = b.stats();
    assert_eq!((s.icrc_bad, s.rx_malformed, s.rx_packets), (3, 1, 5));
}

/// After a receive that found nothing, the next takes one datagram (a
/// `recvmsg`); after one that found datagrams, a batch. A bad datagram is
/// delivered to nobody but counts as taken, so a caller draining the
/// socket goes on to the good ones behind it. An idle multicast group
/// between the receives does not make the unicast socket look idle.
#[test]
fn a_receive_after_an_empty_one_takes_one_then_a_batch() {
    let mut b = port_v4(37);
    let group = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 37];
    b.join_group(group).expect("joining a group on loopback");
    let src: SocketAddr = "127.0.0.38:4791".parse().unwrap();
    let dst = b.local_addr();
    let plain = UdpSocket::bind(src).unwrap();
    let mut got = Vec::new();
    assert_eq!(b.recv(|_, d| got.push(d.to_vec())).unwrap(), 0);
    assert_eq!(b.taken(), 0);
    let good: Vec<Vec<u8>> = (0..4)
        .map(|i| datagram_v4(&send_only(0x01_0000, i, 40), src, dst, 0))
        .collect();
    let mut bad = good[0].clone();
    bad[30] ^= 0x10;
    // Loopback queues a datagram before send_to returns.
    plain.send_to(&bad, dst).unwrap();
    for d in &good {
        plain.send_to(d, dst).unwrap();
    }
    let calls = b.stats().recvmmsg_calls;
    // The bad one alone: nothing delivered, one taken.
    assert_eq!(b.recv(|_, d| got.push(d.to_vec())).unwrap(), 0);
    assert_eq!(b.taken(), 1);
    assert_eq!(b.stats().icrc_bad, 1);
    // An idle group in between.
    assert_eq!(b.recv_groups(|_, _| {}).unwrap(), 0);
    // Then the four good ones in one batch.
    assert_eq!(b.recv(|_, d| got.push(d.to_vec())).unwrap(), 4);
    assert_eq!(b.taken(), 4);
    assert_eq!(got, good);
    assert_eq!(b.stats().recvmmsg_calls, calls + 2);
}

/// A thread woken from `epoll_wait` for the socket receives a batch at
/// once, even after an empty receive: what arrived while it woke is
/// seen together (the engine thread's pass; `Port::rx_woken`).
#[test]
fn a_receive_after_a_wake_up_takes_the_batch() {
    let mut b = port_v4(50);
    let src: SocketAddr = "127.0.0.51:4791".parse().unwrap();
    let dst = b.local_addr();
    let plain = UdpSocket::bind(src).unwrap();
    let mut got = Vec::new();
    assert_eq!(b.recv(|_, d| got.push(d.to_vec())).unwrap(), 0);
    let good: Vec<Vec<u8>> = (0..3)
        .map(|i| datagram_v4(&send_only(0x01_0000, i, 40), src, dst, 0))
        .collect();
    for d in &good {
        plain.send_to(d, dst).unwrap();
    }
    b.rx_woken();
    let calls = b.stats().recvmmsg_calls;
    assert_eq!(b.recv(|_, d| got.push(d.to_vec())).unwrap(), 3);
    assert_eq!(got, good);
    assert_eq!(b.stats().recvmmsg_calls, calls + 1);
}

fn v4gid(last: u8) -> [u8; 16] {
    std::net::Ipv4Addr::new(127, 0, 0, last)
        .to_ipv6_mapped()
        .octets()
}

#[test]
fn policy_learns_zero_id_senders() {
    let mut b = port_v4(15);
    let src: SocketAddr = "127.0.0.16:4791".parse().unwrap();
    let dst = b.local_addr();
    let plain = UdpSocket::bind(src).unwrap();
    let send = |ident: u16, psn: u32| {
        let d = datagram_v4(&send_only(0x01_0000, psn, 32), src, dst, ident);
        plain.send_to(&d, dst).unwrap();
    };
    // An unknown sender with an rxe-like ID: recovered and accepted.
    send(0x1234, 0);
    assert_eq!(recv_n(&mut b, 1).len(), 1);
    assert_eq!(b.stats().icrc_recovered, 1);
    // Three exact ones do not make a peer, the fourth does.
    for i in 1..=3 {
        send(0, i);
    }
    assert_eq!(recv_n(&mut b, 3).len(), 3);
    assert!(!b.is_softrdma_peer(v4gid(16), 4791));
    send(0, 4);
    assert_eq!(recv_n(&mut b, 1).len(), 1);
    assert!(b.is_softrdma_peer(v4gid(16), 4791));
    assert_eq!(b.stats().peers_learned, 1);
    // Now a large recovered ID is refused; a GSO segment index is not.
    send(0x1234, 5);
    send(3, 6);
    let got = recv_n(&mut b, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(qpn(&got[0].1), 0x01_0000);
    assert_eq!(got[0].1[11], 6, "the PSN 6 packet got through");
    let s = b.stats();
    assert_eq!((s.icrc_bad, s.icrc_recovered), (1, 2));

    // A softrdma port is learned the same way.
    let mut a = port_v4(17);
    for i in 0..4 {
        let p = send_only(0x01_0000, i, 8);
        a.send(b.local_gid(), 1, &p.head, &[&p.payload], p.pad)
            .unwrap();
    }
    assert_eq!(recv_n(&mut b, 4).len(), 4);
    assert!(b.is_softrdma_peer(a.local_gid(), a.source_port(1)));
}

/// Ten 4 KiB WRITE MIDDLEs and a shorter LAST to one QP: one GSO train.
fn write_train(qp: u32) -> Vec<Pkt> {
    let mut v: Vec<Pkt> = (0..10)
        .map(|i| pkt(Opcode::RC_RDMA_WRITE_MIDDLE, qp, i, 4096))
        .collect();
    v.push(pkt(Opcode::RC_RDMA_WRITE_LAST, qp, 10, 1001));
    v
}

fn send_train(a: &mut Port, dst: [u8; 16], train: &[Pkt]) {
    let mut tx = a.tx();
    for p in train {
        let segs: Vec<&[u8]> = p.payload.chunks(3000).collect();
        tx.push(dst, 1, &p.head, &segs, p.pad).unwrap();
    }
    tx.finish().unwrap();
}

fn check_train(
    got: &[(softrdma_udp::RxMeta, Vec<u8>)],
    train: &[Pkt],
    (src, sport): (IpAddr, u16),
    dst: IpAddr,
) {
    assert_eq!(got.len(), train.len());
    for (i, ((m, d), p)) in got.iter().zip(train).enumerate() {
        assert_eq!(&d[..d.len() - 4], &p.body()[..], "datagram {i}");
        assert_eq!(m.src_port, sport, "datagram {i}: the sending QP's port");
        if let (IpAddr::V4(s), IpAddr::V4(t)) = (src, dst) {
            let c = icrc::verify_ipv4_hidden((s.octets(), sport), (t.octets(), 4791), d, true);
            let want = if i == 0 {
                HiddenCheck::Exact
            } else {
                HiddenCheck::Recovered {
                    ident: i as u16,
                    df: true,
                }
            };
            // GSO numbers the segments' IP IDs; alone, each would be ID 0.
            let alone = HiddenCheck::Exact;
            assert!(c == want || c == alone, "datagram {i}: {c:?}");
        }
    }
}

#[test]
fn gso_train_arrives_as_separate_datagrams() {
    let mut a = port_v4(18);
    let mut b = port_v4(19);
    let no_gro = PortOptions {
        gro: false,
        ..PortOptions::default()
    };
    let mut c = Port::open_with(
        PortConfig {
            shared: false,
            ..PortConfig::new(v4(20))
        },
        no_gro,
    )
    .unwrap();
    assert!(!c.gro_enabled());
    let train = write_train(0x01_0005);
    send_train(&mut a, b.local_gid(), &train);
    let sa = a.stats();
    if a.gso_enabled() {
        assert_eq!((sa.gso_batches, sa.gso_segments), (1, 11));
        assert_eq!(sa.sendmmsg_calls, 1);
    } else {
        eprintln!("UDP GSO unavailable: {:?}", sa.gso_disabled);
    }
    let got = recv_n(&mut b, train.len());
    let sport = a.source_port(1);
    check_train(&got, &train, (v4(18), sport), v4(19));
    if a.gso_enabled() && b.gro_enabled() {
        // Loopback hands the whole train over as one GRO entry.
        assert_eq!((b.stats().gro_batches, b.stats().gro_segments), (1, 11));
    }
    assert_eq!(b.stats().icrc_bad, 0);

    // Without GRO the kernel cuts the train apart on receive.
    send_train(&mut a, c.local_gid(), &train);
    let got = recv_n(&mut c, train.len());
    check_train(&got, &train, (v4(18), sport), v4(20));
    assert_eq!(c.stats().gro_batches, 0);

    // Different QPs never share a train.
    let mixed: Vec<Pkt> = (0..4)
        .map(|i| pkt(Opcode::RC_RDMA_WRITE_MIDDLE, 0x01_0000 + i, i, 256))
        .collect();
    let before = a.stats().gso_batches;
    send_train(&mut a, b.local_gid(), &mixed);
    assert_eq!(a.stats().gso_batches, before);
    assert_eq!(recv_n(&mut b, 4).len(), 4);
}

/// The receive ring sets a header up again only where the kernel wrote
/// into it. A lone datagram's control data (no GRO segment size) is
/// shorter than a coalesced train's: a header whose control length the
/// lone datagram shrank and that was not set up again would cut the next
/// entry's control data short, and its traffic class, hop limit or
/// destination would be lost.
#[test]
fn each_receive_has_room_for_all_control_data() {
    let mut a = ect0_port_v4(35);
    let mut b = port_v4(36);
    assert!(
        a.gso_enabled() && b.gro_enabled(),
        "this test needs UDP GSO and GRO on loopback (Linux 5.0 and later)"
    );
    let sport = a.source_port(1);
    for round in 0..3 {
        // Two lone datagrams first, so that entries 0 and 1 both held one.
        let lone: Vec<Pkt> = (0..2)
            .map(|i| pkt(Opcode::RC_SEND_ONLY, 0x01_0005, round * 100 + i, 8))
            .collect();
        for p in &lone {
            send_train(&mut a, b.local_gid(), std::slice::from_ref(p));
        }
        let got = recv_n(&mut b, 2);
        assert_eq!(got.len(), 2, "round {round}: the lone datagrams");
        for ((m, d), p) in got.iter().zip(&lone) {
            assert_eq!(&d[..d.len() - 4], &p.body()[..]);
            assert_eq!((m.src_port, m.traffic_class), (sport, 0x02));
        }
        let before = b.stats().gro_batches;
        let train = write_train(0x01_0005);
        send_train(&mut a, b.local_gid(), &train);
        let got = recv_n(&mut b, train.len());
        check_train(&got, &train, (v4(35), sport), v4(36));
        for (i, (m, _)) in got.iter().enumerate() {
            assert_eq!(
                (m.traffic_class, m.hop_limit > 0, m.dgid),
                (0x02, true, b.local_gid()),
                "round {round}, datagram {i}: every control message read"
            );
        }
        assert_eq!(
            b.stats().gro_batches,
            before + 1,
            "round {round}: one GRO entry"
        );
    }
    assert_eq!(b.stats().icrc_bad, 0);
}

#[test]
fn gso_over_ipv6() {
    let (mut a, mut b) = v6_pair(15791, 15792);
    let train = write_train(0x02_0001);
    for _ in 0..3 {
        send_train(&mut a, b.local_gid(), &train);
        let got = recv_n(&mut b, train.len());
        let sport = a.source_port(1);
        check_train(
            &got,
            &train,
            (a.local_addr().ip(), sport),
            b.local_addr().ip(),
        );
    }
    assert_eq!(b.stats().icrc_bad, 0);
    assert_eq!(b.stats().icrc_recovered, 0);
    if a.gso_enabled() {
        assert_eq!(a.stats().gso_batches, 3);
    }
}

fn psn(d: &[u8]) -> u32 {
    u32::from_be_bytes([0, d[9], d[10], d[11]])
}

/// Send 400 datagrams through a faulty port and return both ports' stats
/// and the PSNs received, in order.
fn faulty_run(a_last: u8, b_last: u8, spec: &str) -> (PortStats, PortStats, Vec<u32>) {
    let fault: FaultConfig = spec.parse().unwrap();
    let mut a = Port::open(PortConfig {
        shared: false,
        fault: Some(fault),
        ..PortConfig::new(v4(a_last))
    })
    .unwrap();
    let mut b = port_v4(b_last);
    let pkts: Vec<Pkt> = (0..400).map(|i| send_only(0x01_0000, i, 48)).collect();
    let mut got = Vec::new();
    for chunk in pkts.chunks(16) {
        let mut tx = a.tx();
        for p in chunk {
            tx.push(b.local_gid(), 1, &p.head, &[&p.payload], p.pad)
                .unwrap();
        }
        tx.finish().unwrap();
        b.recv(|_, d| got.push(psn(d))).unwrap();
    }
    // Held-back datagrams leave at the latest one flush later.
    a.tx().finish().unwrap();
    a.tx().finish().unwrap();
    let sent = a.stats().tx_packets as usize;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while (b.stats().rx_packets + b.stats().icrc_bad) < sent as u64
        && std::time::Instant::now() < deadline
    {
        if b.recv(|_, d| got.push(psn(d))).unwrap() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    (a.stats(), b.stats(), got)
}

#[test]
fn fault_injection_is_seeded_and_counted() {
    let spec = "loss=0.1,reorder=0.1,dup=0.1,corrupt=0.05,seed=7";
    let (sa, sb, psns) = faulty_run(21, 22, spec);
    assert!(
        sa.fault_drops > 10
            && sa.fault_dups > 10
            && sa.fault_corrupts > 5
            && sa.fault_reorders > 10,
        "{sa:?}"
    );
    assert_eq!(sa.tx_packets, 400 - sa.fault_drops + sa.fault_dups);
    // Loopback loses nothing: every datagram sent arrived, good or bad.
    assert_eq!(sb.rx_packets + sb.icrc_bad, sa.tx_packets);
    // Corrupted datagrams (and duplicates of them) are all caught.
    assert!(
        sb.icrc_bad >= sa.fault_corrupts && sb.icrc_bad <= 2 * sa.fault_corrupts,
        "{sb:?}"
    );
    assert_eq!(psns.len() as u64, sb.rx_packets);
    let inversions = psns
        .windows(2)
        .filter(|w| w[1] < w[0] && w[0] - w[1] < 100)
        .count();
    let repeats = psns.windows(2).filter(|w| w[1] == w[0]).count();
    assert!(
        inversions > 0 && repeats > 0,
        "reordered and duplicated: {psns:?}"
    );

    // The same seed gives the same faults and the same arrivals.
    let (sa2, sb2, psns2) = faulty_run(23, 24, spec);
    assert_eq!(
        (
            sa.fault_drops,
            sa.fault_dups,
            sa.fault_corrupts,
            sa.fault_reorders
        ),
        (
            sa2.fault_drops,
            sa2.fault_dups,
            sa2.fault_corrupts,
            sa2.fault_reorders
        )
    );
    assert_eq!((sb.rx_packets, sb.icrc_bad), (sb2.rx_packets, sb2.icrc_bad));
    assert_eq!(psns, psns2);
}

#[test]
fn pcap_frames_verify() {
    let tmp = tempfile::Builder::new()
        .prefix("softrdma-udp-pcap-")
        .tempdir()
        .expect("a scratch directory");
    let dir = tmp.path();
    let (pa, pb) = (dir.join("a.pcap"), dir.join("b.pcap"));
    let cfg = |last, path: &std::path::Path| PortConfig {
        shared: false,
        pcap: Some(path.to_path_buf()),
        ..PortConfig::new(v4(last))
    };
    let mut a = Port::open(cfg(25, &pa)).unwrap();
    let mut b = Port::open(cfg(26, &pb)).unwrap();
    let pkts: Vec<Pkt> = (0..6)
        .map(|i| send_only(0x01_0000, i, 50 * i as usize + 1))
        .collect();
    {
        let mut tx = a.tx();
        for p in &pkts {
            tx.push(b.local_gid(), 1, &p.head, &[&p.payload], p.pad)
                .unwrap();
        }
    }
    let train = write_train(0x01_0002);
    send_train(&mut a, b.local_gid(), &train);
    // A sender with rxe-like IDs: captured with the recovered ID.
    let src: SocketAddr = "127.0.0.27:4791".parse().unwrap();
    let plain = UdpSocket::bind(src).unwrap();
    plain
        .send_to(
            &datagram_v4(&pkts[2], src, b.local_addr(), 0x4321),
            b.local_addr(),
        )
        .unwrap();
    let n = pkts.len() + train.len() + 1;
    assert_eq!(recv_n(&mut b, n).len(), n);
    b.send(
        a.local_gid(),
        1,
        &pkts[0].head,
        &[&pkts[0].payload],
        pkts[0].pad,
    )
    .unwrap();
    assert_eq!(recv_n(&mut a, 1).len(), 1);
    drop((a, b));

    for (path, frames) in [(&pa, pkts.len() + train.len() + 1), (&pb, n + 1)] {
        let bytes = std::fs::read(path).unwrap();
        let f = PcapFile::parse(&bytes).unwrap();
        let recs: Vec<_> = f.records().map(|r| r.unwrap()).collect();
        assert_eq!(recs.len(), frames, "{}", path.display());
        for r in recs {
            let u = parse_ethernet_udp(r.data).unwrap().unwrap();
            assert!(u.is_rocev2());
            let (got, want) = icrc::check_frame(&u).unwrap();
            assert_eq!(got, want, "frame {} of {}", r.number, path.display());
        }
    }
}

#[test]
fn a_leaked_batch_is_discarded_not_sent() {
    let mut a = port_v4(28);
    let mut b = port_v4(29);
    for round in 0..2u32 {
        {
            let data = vec![7u8; 100];
            let p = send_only(0x01_0000, 1, 100);
            let mut tx = a.tx();
            tx.push(b.local_gid(), 1, &p.head, &[&data], p.pad).unwrap();
            std::mem::forget(tx);
        } // `data` is freed here, with a pointer to it still queued.
        if round == 0 {
            // The safe flush must not send it either.
            a.flush().unwrap();
        } else {
            let p = send_only(0x01_0000, 2, 8);
            a.send(b.local_gid(), 1, &p.head, &[&p.payload], p.pad)
                .unwrap();
        }
        assert_eq!(a.stats().tx_dropped, round as u64 + 1);
    }
    // The one that was sent, awaited; then nothing more.
    let mut got = recv_n(&mut b, 1);
    got.extend(recv_for(&mut b, Duration::from_millis(50)));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1[11], 2);
}

#[test]
fn unsafe_push_then_flush() {
    let mut a = port_v4(33);
    let mut b = port_v4(34);
    let pkts: Vec<Pkt> = (0..40).map(|i| send_only(0x01_0000, i, 64)).collect();
    for p in &pkts {
        // SAFETY: `pkts` outlives the flush below.
        unsafe {
            a.push(b.local_gid(), 1, &p.head, &[&p.payload], p.pad)
                .unwrap()
        };
    }
    // 32 went out when the batch filled; the rest wait for the flush.
    assert_eq!(a.stats().tx_packets, 32);
    a.flush().unwrap();
    assert_eq!(a.stats().tx_packets, 40);
    let got = recv_n(&mut b, 40);
    assert_eq!(got.len(), 40);
    assert!(got
        .iter()
        .zip(&pkts)
        .all(|((_, d), p)| d[..d.len() - 4] == p.body()[..]));
}

#[test]
fn bad_input_is_an_error() {
    let mut a = port_v4(30);
    let p = send_only(0x01_0000, 1, 8);
    let v6 = Ipv6Addr::LOCALHOST.octets();
    let e = a.send(v6, 1, &p.head, &[&p.payload], p.pad).unwrap_err();
    assert!(e.to_string().contains("is IPv6"), "{e}");
    let gid = v4gid(31);
    assert!(a.send(gid, 1, &p.head[..8], &[], 0).is_err());
    assert!(a.send(gid, 1, &p.head, &[], 4).is_err());
    let many = vec![&p.payload[..]; 33];
    assert!(a.send(gid, 1, &p.head, &many, 0).is_err());
    let e = Port::open(PortConfig::new("0.0.0.0".parse().unwrap()))
        .err()
        .unwrap();
    assert!(e.to_string().contains("specific unicast"), "{e}");
}

#[test]
fn an_owned_address_is_refused_clearly() {
    let _a = port_v4(32);
    let e = Port::open(PortConfig {
        shared: false,
        ..PortConfig::new(v4(32))
    })
    .err()
    .unwrap();
    assert!(
        e.to_string()
            .contains("another process owns 127.0.0.32:4791"),
        "{e}"
    );
    let e = Port::open(PortConfig::new(v4(32))).err().unwrap();
    let s = e.to_string();
    assert!(s.contains("does not share it"), "{s}");
}
