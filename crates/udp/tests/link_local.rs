//! Ports on IPv6 link-local addresses, as the interop suite uses against
//! rxe (whose GID 0 is the link-local address of its netdev).
//!
//! A link-local address binds only with its interface as the scope id;
//! without it the kernel refuses the bind (EINVAL), which is how the first
//! IPv6 run against rxe failed. The test builds a network namespace with a
//! veth pair whose ends hold fe80::1 and fe80::2 (DAD off) and runs a copy
//! of itself there that opens a port on each address and sends a datagram
//! from one to the other.
//!
//! Needs root and iproute2; skipped otherwise. Only the namespace it
//! creates (and deletes) is touched.

mod common;

use common::*;
use softrdma_udp::{Port, PortConfig};
use std::net::{IpAddr, Ipv6Addr};
use std::process::Command;

const CHILD_ENV: &str = "SOFTRDMA_UDP_LINK_LOCAL_CHILD";
const A: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
const B: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2);

fn ip(args: &str) -> bool {
    Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn ports_on_link_local_addresses() {
    let ns = format!("srdma-ll-{}", std::process::id());
    if !ip(&format!("netns add {ns}")) {
        eprintln!("skipped: cannot create a network namespace (needs root and iproute2)");
        return;
    }
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _guard = Del(ns.clone());
    assert!(ip(&format!("-n {ns} link add v0 type veth peer name v1")));
    assert!(ip(&format!("-n {ns} link set v0 up")));
    assert!(ip(&format!("-n {ns} link set v1 up")));
    assert!(ip(&format!("-n {ns} addr add {A}/64 dev v0 nodad")));
    assert!(ip(&format!("-n {ns} addr add {B}/64 dev v1 nodad")));
    let out = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe().unwrap())
        .args(["in_namespace", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("LINK-LOCAL OK"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs in the namespace when started by the test above.
#[test]
fn in_namespace() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let open = |a: Ipv6Addr| {
        Port::open(PortConfig {
            shared: false,
            ..PortConfig::new(IpAddr::V6(a))
        })
        .unwrap_or_else(|e| panic!("opening a port on {a}: {e}"))
    };
    let mut pa = open(A);
    let mut pb = open(B);
    // The scope is the interface that holds the address.
    let scope = |p: &Port| match p.local_addr() {
        std::net::SocketAddr::V6(s) => s.scope_id(),
        _ => 0,
    };
    assert_ne!(scope(&pa), 0);
    assert_ne!(scope(&pa), scope(&pb));
    let p = send_only(0x01_0000, 7, 100);
    {
        let mut tx = pa.tx();
        tx.push(B.octets(), 1, &p.head, &[&p.payload], p.pad)
            .unwrap();
        tx.finish().unwrap();
    }
    let got = recv_n(&mut pb, 1);
    assert_eq!(got.len(), 1, "the datagram crossed the veth");
    assert_eq!(got[0].0.sgid, A.octets());
    assert_eq!(&got[0].1[..got[0].1.len() - 4], p.body().as_slice());
    // And back, to the sender's link-local address.
    {
        let mut tx = pb.tx();
        tx.push(A.octets(), 1, &p.head, &[&p.payload], p.pad)
            .unwrap();
        tx.finish().unwrap();
    }
    assert_eq!(recv_n(&mut pa, 1).len(), 1);
    println!("LINK-LOCAL OK");
}
