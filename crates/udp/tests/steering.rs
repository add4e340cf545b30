//! Several ports — in one process and in two — sharing one address and port
//! 4791, each receiving only the datagrams for its own QPN slot. Sharing
//! needs no privilege (classic BPF), so these tests require it to work for
//! whoever runs them; `tests/sharing.rs` covers several processes, deaths
//! and other users.

mod common;

use common::*;
use softrdma_udp::{Port, PortConfig, PortOptions, Steering};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SOFTRDMA_UDP_STEERING_CHILD";

/// Send `n` SEND ONLYs to each of `qpns` from `from` to the GID `dst`.
fn spray(from: &mut Port, dst: [u8; 16], qpns: &[u32], n: u32) {
    let pkts: Vec<Pkt> = qpns
        .iter()
        .flat_map(|&q| (0..n).map(move |i| send_only(q, i, 16)))
        .collect();
    let mut tx = from.tx();
    for p in &pkts {
        tx.push(dst, 1, &p.head, &[&p.payload], p.pad).unwrap();
    }
    tx.finish().unwrap();
}

#[test]
fn two_ports_one_address_one_process() {
    let mut a = Port::open(PortConfig::new(v4(41))).unwrap();
    assert!(steered(&a), "{:?}", a.steering());
    let mut b = Port::open(PortConfig::new(v4(41))).unwrap();
    assert!(steered(&b));
    assert_ne!(a.slot(), b.slot());
    assert_eq!(a.steering(), b.steering(), "one group");
    assert!(
        a.gro_enabled() && b.gro_enabled(),
        "GRO in a shared group (safe with per-QP source ports)"
    );
    assert!(a.rcvbuf() > 0);
    let (sa, sb) = (a.slot() as u32, b.slot() as u32);
    // A slot nobody owns; slot 0 (QP1) is never claimed.
    let free = (1..=255u32).find(|&s| s != sa && s != sb).unwrap();

    let mut c = port_v4(42);
    let gid = a.local_gid();
    spray(
        &mut c,
        gid,
        &[sa << 16 | 5, sb << 16 | 0xfff0, free << 16 | 1],
        20,
    );
    let got_a = recv_n(&mut a, 20);
    let got_b = recv_n(&mut b, 20);
    assert_eq!(got_a.len(), 20);
    assert_eq!(got_b.len(), 20);
    assert!(got_a.iter().all(|(_, d)| qpn(d) == sa << 16 | 5));
    assert!(got_b.iter().all(|(_, d)| qpn(d) == sb << 16 | 0xfff0));
    // Nothing else is delivered: the other 20, for a slot nobody owns,
    // were hashed to one of the two and dropped there — and they are the
    // only datagrams that reached the wrong socket. Their count is awaited,
    // not sampled once: on a loaded machine loopback's softirq work is
    // deferred to ksoftirqd (as in `tests/sharing.rs`).
    let wrong = |a: &Port, b: &Port| a.stats().rx_wrong_slot + b.stats().rx_wrong_slot;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(recv_for(&mut a, Duration::from_millis(30)).is_empty());
        assert!(recv_for(&mut b, Duration::from_millis(30)).is_empty());
        if wrong(&a, &b) >= 20 || Instant::now() > deadline {
            break;
        }
    }
    assert_eq!(wrong(&a, &b), 20);
    // QP1 belongs to no slot: what is not a CM MAD is hashed to a member
    // and delivered there (the engine drops what is not a MAD).
    spray(&mut c, gid, &[1], 20);
    let mut gsi = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while gsi.len() < 20 && Instant::now() < deadline {
        gsi.extend(recv_for(&mut a, Duration::from_millis(10)));
        gsi.extend(recv_for(&mut b, Duration::from_millis(10)));
    }
    gsi.extend(recv_for(&mut a, Duration::from_millis(30)));
    gsi.extend(recv_for(&mut b, Duration::from_millis(30)));
    assert_eq!(gsi.len(), 20);
    assert!(gsi.iter().all(|(_, d)| qpn(d) == 1));
    assert_eq!(a.stats().rx_wrong_slot + b.stats().rx_wrong_slot, 20);
    assert_eq!(a.stats().steer_repairs + b.stats().steer_repairs, 0);

    // A closed port frees its slot for the next one.
    let slot_b = b.slot();
    drop(b);
    let b2 = Port::open(PortConfig::new(v4(41))).unwrap();
    assert_eq!(b2.slot(), slot_b);
}

#[test]
fn two_processes_share_an_address() {
    let mut a = Port::open(PortConfig::new(v4(43))).unwrap();
    assert!(steered(&a), "{:?}", a.steering());
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "child_receiver",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "127.0.0.43")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // libtest may print "test child_receiver ... " on the same line.
    let after = |l: &str, tag: &str| l.find(tag).map(|i| l[i..].trim().to_string());
    let slot_line = lines
        .by_ref()
        .find_map(|l| after(&l.unwrap(), "SLOT "))
        .expect("child reports its slot");
    let child_slot: u32 = slot_line[5..].parse().unwrap();
    assert_ne!(child_slot, a.slot() as u32);

    let mut c = port_v4(44);
    let mine = (a.slot() as u32) << 16 | 7;
    let theirs = child_slot << 16 | 9;
    spray(&mut c, a.local_gid(), &[mine, theirs], 50);
    let got = recv_n(&mut a, 50);
    assert_eq!(got.len(), 50);
    assert!(got.iter().all(|(_, d)| qpn(d) == mine));
    assert!(recv_for(&mut a, Duration::from_millis(30)).is_empty());

    // Tell the child to report what it got.
    writeln!(child.stdin.take().unwrap(), "done").unwrap();
    let report = lines
        .find_map(|l| after(&l.unwrap(), "GOT "))
        .expect("child reports");
    assert!(child.wait().unwrap().success());
    assert_eq!(report, format!("GOT 50 QPN {theirs:#x} OTHER 0"));
}

/// The second process of `two_processes_share_an_address`; does nothing
/// unless started by it.
#[test]
fn child_receiver() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut p = Port::open(PortConfig::new(addr.parse().unwrap())).unwrap();
    assert!(steered(&p));
    println!("SLOT {}", p.slot());
    std::io::stdout().flush().unwrap();
    // Wait for the parent's "done" (bounded by its own test timeout and
    // ours: 10 s), receiving meanwhile.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
        let _ = tx.send(());
    });
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rx.try_recv().is_err() && std::time::Instant::now() < deadline {
        if p.recv(|_, d| got.push(qpn(d))).unwrap() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // The parent's "done" follows its own 50, not ours: ours may still be
    // in loopback's backlog (deferred to ksoftirqd on a loaded machine).
    while got.len() < 50 && std::time::Instant::now() < deadline {
        if p.recv(|_, d| got.push(qpn(d))).unwrap() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    while p.recv(|_, d| got.push(qpn(d))).unwrap() > 0 {}
    let first = got.first().copied().unwrap_or(0);
    let other = got.iter().filter(|&&q| q != first).count();
    println!("GOT {} QPN {first:#x} OTHER {other}", got.len());
    std::io::stdout().flush().unwrap();
}

#[test]
fn falls_back_to_exclusive_when_sharing_is_unavailable() {
    // A state directory that cannot be created stands in for a refused
    // bpf(2): both make sharing impossible, and take the same path.
    let cfg = PortConfig::new(v4(46));
    let opts = PortOptions {
        state_dir: "/sys/softrdma-cannot-exist".into(),
        ..PortOptions::default()
    };
    let a = Port::open_with(cfg.clone(), opts.clone()).unwrap();
    let Steering::Exclusive { why: Some(why) } = a.steering() else {
        panic!("expected the exclusive fallback, got {:?}", a.steering())
    };
    assert!(why.contains("/sys/softrdma-cannot-exist"), "{why}");
    assert_eq!(a.slot(), 1);
    let e = Port::open_with(cfg, opts).err().unwrap().to_string();
    assert!(
        e.contains("another process owns 127.0.0.46:4791 and sharing is unavailable"),
        "{e}"
    );
}

#[test]
fn steering_over_ipv6() {
    let l: std::net::IpAddr = "::1".parse().unwrap();
    let open = |port, remote_port, shared| {
        let cfg = PortConfig {
            port,
            shared,
            ..PortConfig::new(l)
        };
        let opts = PortOptions {
            remote_port: Some(remote_port),
            ..PortOptions::default()
        };
        Port::open_with(cfg, opts)
    };
    let mut a = open(24791, 24791, true).unwrap();
    assert!(steered(&a));
    let mut b = open(24791, 24791, true).unwrap();
    let mut c = open(24792, 24791, false).unwrap();
    let (sa, sb) = (a.slot() as u32, b.slot() as u32);
    spray(&mut c, a.local_gid(), &[sb << 16 | 3, sa << 16 | 4], 10);
    let (got_a, got_b) = (recv_n(&mut a, 10), recv_n(&mut b, 10));
    assert!(got_a.len() == 10 && got_a.iter().all(|(_, d)| qpn(d) == sa << 16 | 4));
    assert!(got_b.len() == 10 && got_b.iter().all(|(_, d)| qpn(d) == sb << 16 | 3));
}

#[test]
fn a_foreign_member_is_refused_not_hijacked() {
    // A socket of this user in the group that no softrdma port put there
    // (another program, another softrdma version): joining would fight it
    // over the group's program, so the port refuses.
    let here: std::net::SocketAddr = "127.0.0.47:4791".parse().unwrap();
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    s.set_reuse_port(true).unwrap();
    s.bind(&here.into()).unwrap();
    let e = Port::open(PortConfig::new(v4(47)))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not describe"), "{e}");
    // Once it is gone the address is free to share.
    drop(s);
    let a = Port::open(PortConfig::new(v4(47))).unwrap();
    assert!(steered(&a));
}

/// A CM REQ MAD for `service` (the low 32 bits of its service ID) as the
/// head (BTH and DETH) and the MAD a port sends to QP1.
fn cm_req(service: u32, psn: u8) -> (Vec<u8>, Vec<u8>) {
    let mut head = vec![0u8; 20];
    head[0] = 0x64; // UD SEND ONLY
    head[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
    head[5..8].copy_from_slice(&[0, 0, 1]);
    head[11] = psn;
    head[12..16].copy_from_slice(&0x8001_0000u32.to_be_bytes()); // GSI Q_Key
    head[19] = 1; // source QP 1
                  // The MAD, from UDP payload offset 20: base version, class (CM), class
                  // version, method (Send), attribute REQ at 36, service ID at 48..56.
    let mut mad = vec![0u8; 256];
    mad[0] = 1;
    mad[1] = 0x07;
    mad[2] = 2;
    mad[3] = 0x03;
    mad[8] = psn; // transaction ID
    mad[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
    mad[36..40].copy_from_slice(&service.to_be_bytes());
    (head, mad)
}

/// The low 32 bits of the service ID of a received REQ.
fn req_service(d: &[u8]) -> u32 {
    u32::from_be_bytes(d[56..60].try_into().unwrap())
}

/// Two CM requests for services listened on by two members, pushed in one
/// batch: each reaches its own listener. Both go to QP1 at one address,
/// so the send queue used to make them one GSO train — which the group
/// steers whole by its first datagram (on loopback a train arrives as one
/// entry), handing the second listener's request to the first.
#[test]
fn cm_requests_in_one_batch_each_reach_their_listener() {
    let mut a = Port::open(PortConfig::new(v4(81))).unwrap();
    let mut b = Port::open(PortConfig::new(v4(81))).unwrap();
    assert!(steered(&a) && steered(&b));
    let (sa, sb) = (0x0106_4e21, 0x0106_4e22);
    a.listen_service(sa, true).unwrap();
    b.listen_service(sb, true).unwrap();
    let mut c = port_v4(82);
    assert!(c.gso_enabled(), "the sender makes GSO trains");
    let gid = a.local_gid();
    let reqs = [cm_req(sa, 1), cm_req(sb, 2), cm_req(sa, 3), cm_req(sb, 4)];
    let mut tx = c.tx();
    for (head, mad) in &reqs {
        tx.push(gid, 1, head, &[mad], 0).unwrap();
    }
    tx.finish().unwrap();
    let mut got_a = recv_n(&mut a, 2);
    let mut got_b = recv_n(&mut b, 2);
    got_a.extend(recv_for(&mut a, Duration::from_millis(30)));
    got_b.extend(recv_for(&mut b, Duration::from_millis(30)));
    let services = |g: &[(softrdma_udp::RxMeta, Vec<u8>)]| {
        g.iter().map(|(_, d)| req_service(d)).collect::<Vec<_>>()
    };
    assert_eq!(services(&got_a), [sa, sa]);
    assert_eq!(services(&got_b), [sb, sb]);
}

/// Two CM requests for services of two members, arriving as one GRO entry
/// (what a NIC's GRO makes of a peer's back-to-back MADs, all sent from
/// its QP1's one source port and all of one size; here a foreign sender's
/// GSO train, which loopback delivers as one entry): the group steered
/// both by the first, so the entry mixed two members' datagrams although
/// both carry QP1, slot 0 — GRO turns itself off as for mixed slots.
#[test]
fn a_gro_entry_of_mads_for_two_members_turns_gro_off() {
    use std::os::fd::AsRawFd;
    let mut a = Port::open(PortConfig::new(v4(83))).unwrap();
    let mut b = Port::open(PortConfig::new(v4(83))).unwrap();
    assert!(steered(&a) && steered(&b));
    assert!(a.gro_enabled() && b.gro_enabled());
    let (sa, sb) = (0x0106_4e23, 0x0106_4e24);
    a.listen_service(sa, true).unwrap();
    b.listen_service(sb, true).unwrap();
    // Two MADs of one size in one UDP_SEGMENT send (their ICRCs are not
    // filled in: the entry is judged before the datagrams are checked).
    let mut train = Vec::new();
    for (head, mad) in [cm_req(sa, 1), cm_req(sb, 2)] {
        train.extend_from_slice(&head);
        train.extend_from_slice(&mad);
        train.extend_from_slice(&[0; 4]);
    }
    let seg = train.len() / 2;
    let s = std::net::UdpSocket::bind("127.0.0.84:0").unwrap();
    let seg_int = seg as libc::c_int;
    // SAFETY: `seg_int` lives across the call and its size is passed; the
    // kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_UDP,
            103, // UDP_SEGMENT
            (&seg_int as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
    s.send_to(&train, "127.0.0.83:4791").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = |p: &Port| p.stats().icrc_bad + p.stats().rx_packets;
    while seen(&a) + seen(&b) < 2 && Instant::now() < deadline {
        let _ = recv_for(&mut a, Duration::from_millis(5));
        let _ = recv_for(&mut b, Duration::from_millis(5));
    }
    assert_eq!(seen(&a), 2, "both steered by the first, sa's listener");
    assert_eq!(a.stats().gro_batches, 1, "as one entry");
    assert_eq!(a.stats().gro_mixed, 1);
    assert!(!a.gro_enabled());
    assert!(b.gro_enabled());
}

/// A member leaving while another's receive buffer overflows cannot
/// measure the group (every probe's drop comes with an unrelated one), so
/// it cannot re-steer for the array without it. The state it leaves must
/// then still show the group changed, or the member the kernel moved into
/// its place never gets its datagrams again: those hashed to another member
/// are misdelivered there, and a repair needs the group the kernel lists to
/// differ from the state's.
#[test]
fn a_leave_that_cannot_resteer_leaves_the_group_to_be_repaired() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let a = Port::open(PortConfig::new(v4(85))).unwrap();
    let mut b = Port::open(PortConfig::new(v4(85))).unwrap();
    let mut c = Port::open(PortConfig::new(v4(85))).unwrap();
    assert!(steered(&a) && steered(&b) && steered(&c));
    let sc = c.slot() as u32;
    // Fill c's receive buffer and keep it overflowing while `a` leaves.
    let stop = Arc::new(AtomicBool::new(false));
    let spray = {
        let stop = stop.clone();
        let p = send_only(sc << 16 | 1, 0, 16);
        let mut d = p.body();
        d.extend_from_slice(&[0; 4]);
        std::thread::spawn(move || {
            let s = std::net::UdpSocket::bind("127.0.0.86:0").unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) || n < 100_000 {
                let _ = s.send_to(&d, "127.0.0.85:4791");
                n += 1;
            }
        })
    };
    // Let the spray fill the buffer, then leave while it overflows.
    std::thread::sleep(Duration::from_millis(200));
    drop(a);
    stop.store(true, Ordering::Relaxed);
    spray.join().unwrap();
    // Drain c.
    while !recv_for(&mut c, Duration::from_millis(50)).is_empty() {}
    // Rounds of datagrams for c's slot from 16 source ports (16 flows, so
    // whichever member the stale table's hash picks for some of them): one
    // round must reach c whole once b, getting some, has repaired.
    let mut s = port_v4(86);
    let gid = c.local_gid();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut whole = false;
    let mut round = 0u32;
    while !whole && Instant::now() < deadline {
        round += 1;
        let pkts: Vec<Pkt> = (0..16)
            .map(|k| send_only(sc << 16 | 2, round << 4 | k, 16))
            .collect();
        let mut tx = s.tx();
        for (k, p) in pkts.iter().enumerate() {
            tx.push(gid, (k as u32) << 8 | 0x11, &p.head, &[&p.payload], p.pad)
                .unwrap();
        }
        tx.finish().unwrap();
        let _ = recv_for(&mut b, Duration::from_millis(20));
        let got = recv_for(&mut c, Duration::from_millis(100));
        let n = got
            .iter()
            .filter(|(_, d)| qpn(d) == sc << 16 | 2 && psn(d) >> 4 == round)
            .count();
        whole = n == 16;
    }
    assert!(
        whole,
        "c never got a whole round ({round} rounds; b repaired {} times, wrong slot {})",
        b.stats().steer_repairs,
        b.stats().rx_wrong_slot
    );
}

fn psn(d: &[u8]) -> u32 {
    u32::from_be_bytes([0, d[9], d[10], d[11]])
}

/// Listening on more services at one address than the group's classic-BPF
/// program can hold (at most 4096 instructions, `BPF_MAXINSNS`; two per
/// listener, with room kept for all 255 members) is refused by an error
/// naming the limit and the number of services listened on, before
/// anything changes. It used to build the longer program and show the
/// kernel's bare "Invalid argument" from attaching it.
#[test]
fn listeners_past_the_program_limit_are_refused_by_name() {
    // Some 1800 listener files rewritten: in memory where there is a
    // tmpfs (a disk file system flushes each replacement).
    let shm = std::path::Path::new("/dev/shm");
    let dir = tempfile::Builder::new()
        .prefix("srdma-steering-")
        .tempdir_in(if shm.is_dir() {
            shm
        } else {
            std::path::Path::new("/tmp")
        })
        .unwrap();
    let opts = PortOptions {
        state_dir: dir.path().into(),
        ..PortOptions::default()
    };
    let mut a = Port::open_with(PortConfig::new(v4(91)), opts).unwrap();
    assert!(steered(&a), "{:?}", a.steering());
    let base = 0x0106_0000u32;
    let mut n = 0u32;
    let err = loop {
        match a.listen_service(base + n, true) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 20_000, "{n} services listened on, never refused");
    };
    let msg = err.to_string();
    assert!(
        msg.contains("4096") && msg.contains("BPF_MAXINSNS"),
        "the limit named: {msg}"
    );
    assert!(msg.contains(&format!("{n} services")), "the count: {msg}");
    // Listening on one already listened on is still fine, and stopping one
    // makes room for another.
    a.listen_service(base, true).unwrap();
    a.listen_service(base, false).unwrap();
    a.listen_service(base + n, true).unwrap();
    assert!(a.listen_service(base + n + 1, true).is_err());
    assert_eq!(a.listener_of(base + n), Some(a.slot()));
}
