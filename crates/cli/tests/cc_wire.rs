//! Congestion control over real sockets: `softrdma perf --cc dcqcn` between
//! two network namespaces this test creates, joined by a veth pair, with a
//! marking point on the client's egress: an nftables rule that marks every
//! hundredth ECN-capable RoCEv2 packet CE (the first included), as a
//! switch's RED does above Kmin at 1 %, but counted, not drawn: the rule
//! sees a GSO train as one packet, so a run of 200 64 KiB WRITEs offers it
//! only ~400, and a 1 % draw marked none in about one run in fifty. (The
//! kernels this runs on need not have RED or fq_codel; nftables' `ip ecn
//! set ce` is everywhere nf_tables is.) The receiver answers the marks with
//! CNPs over UDP, the sender's reaction point takes them — and every byte
//! arrives. Needs root, iproute2 and nftables (`.ci/run` installs them).

mod common;

use common::{counter, finish};
use std::process::{Command, Stdio};

fn ip(args: &[&str]) {
    let st = Command::new("ip")
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e} (this test needs iproute2)"));
    assert!(st.success(), "ip {args:?} failed (this test needs root)");
}

fn nft(ns: &str, rule: &str) {
    let st = Command::new("ip")
        .args(["netns", "exec", ns, "nft", rule])
        .status()
        .unwrap_or_else(|e| panic!("nft {rule}: {e} (this test needs nftables)"));
    assert!(
        st.success(),
        "nft {rule:?} failed (this test needs nftables and nf_tables in the kernel)"
    );
}

/// Namespaces made by this test, deleted when it ends.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Two namespaces joined by a veth pair, 198.18.`net`.1 (client) and .2
/// (server), whose client egress marks every hundredth of its ECN-capable
/// RoCEv2 datagrams CE (a GSO train counts as one). `tag` keeps the names of concurrent tests apart, `net`
/// their addresses: softrdma's port-sharing state is per address in the
/// user's runtime directory, which namespaces share, so two tests' clients
/// on one address would take each other for members of one group.
fn marking_pair(tag: &str, net: u8) -> (Namespaces, String, String) {
    let tag = format!("srcc-{}-{tag}", std::process::id());
    let (a, b) = (format!("{tag}-a"), format!("{tag}-b"));
    let guard = Namespaces(vec![a.clone(), b.clone()]);
    ip(&["netns", "add", &a]);
    ip(&["netns", "add", &b]);
    ip(&[
        "-n", &a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &b,
    ]);
    let (ca, sa) = (format!("198.18.{net}.1/24"), format!("198.18.{net}.2/24"));
    for (ns, addr) in [(&a, &ca), (&b, &sa)] {
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        ip(&["-n", ns, "link", "set", "eth0", "mtu", "9000", "up"]);
        ip(&["-n", ns, "addr", "add", addr, "dev", "eth0"]);
    }
    nft(&a, "add table ip srcc");
    nft(
        &a,
        "add chain ip srcc post { type filter hook postrouting priority 0; }",
    );
    nft(
        &a,
        "add rule ip srcc post udp dport 4791 ip ecn ect0 numgen inc mod 100 0 ip ecn set ce",
    );
    (guard, a, b)
}

/// `perf write_bw --cc dcqcn --stats --check ARGS` as server in `b` and
/// client in `a`; both must succeed and the data be verified. Returns
/// (client, server) stdout.
fn dcqcn_write_bw(a: &str, b: &str, server_addr: &str, args: &[&str]) -> (String, String) {
    let bin = env!("CARGO_BIN_EXE_softrdma");
    let perf = |ns: &str, extra: &[&str]| {
        let mut c = Command::new("ip");
        c.args([
            "netns", "exec", ns, bin, "perf", "write_bw", "--cc", "dcqcn", "--stats", "--check",
        ])
        .args(args)
        .args(extra)
        .env("SOFTRDMA_TRANSPORT", "udp")
        .env("SOFTRDMA_CC_LINE_RATE", "1G")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        c
    };
    // The client retries its TCP connect while the server starts.
    // Both are bounded in time, and their output is read while they run:
    // with many QPs each prints a line per QP, more than a pipe holds.
    let server = perf(b, &[]).spawn().expect("server");
    let server = std::thread::spawn(move || finish(server, "server"));
    let client = finish(perf(a, &[server_addr]).spawn().expect("client"), "client");
    let server = server.join().expect("server output");
    let (cout, sout) = (
        String::from_utf8_lossy(&client.stdout).to_string(),
        String::from_utf8_lossy(&server.stdout).to_string(),
    );
    assert!(
        client.status.success() && server.status.success(),
        "client: {}\n{cout}\n{}\nserver: {}\n{sout}\n{}",
        client.status,
        String::from_utf8_lossy(&client.stderr),
        server.status,
        String::from_utf8_lossy(&server.stderr)
    );
    assert!(
        cout.contains("every byte verified") || sout.contains("every byte verified"),
        "{cout}\n{sout}"
    );
    (cout, sout)
}

/// The server (responder) saw marks and sent CNPs; the client (the
/// reaction point) received them, and no more than were sent.
fn assert_cnps(cout: &str, sout: &str) {
    let ce = counter(sout, "ECN-CE received");
    let sent = counter(sout, "CNPs sent/rcvd");
    let rcvd: u64 = cout
        .split("CNPs sent/rcvd ")
        .nth(1)
        .and_then(|s| s.split('/').nth(1))
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no CNP counters in:\n{cout}"));
    assert!(ce > 0, "no CE marks reached the receiver:\n{sout}");
    assert!(
        sent > 0 && rcvd > 0,
        "CNPs sent {sent}, received {rcvd}\n{cout}\n{sout}"
    );
    assert!(
        rcvd <= sent,
        "more CNPs received ({rcvd}) than sent ({sent})"
    );
}

#[test]
fn dcqcn_over_udp_gets_cnps_from_a_marking_bottleneck() {
    let (_guard, a, b) = marking_pair("one", 9);
    let (cout, sout) = dcqcn_write_bw(
        &a,
        &b,
        "198.18.9.2",
        &["-s", "65536", "-n", "200", "-p", "18777"],
    );
    assert_cnps(&cout, &sout);
}

/// Issue 13's scale run: 1024 RC QPs, each with its own DCQCN reaction
/// point, through the marking bottleneck. Every QP's data arrives and is
/// checked; nothing is retransmitted, no QP times out (so none comes near
/// retry exhaustion), the kernel drops nothing on either receive socket
/// (the per-destination in-flight budget keeps 1024 QPs from overrunning
/// it), and CNPs flow.
#[test]
fn dcqcn_with_1024_qps_completes_without_loss_and_with_cnps() {
    let (_guard, a, b) = marking_pair("many", 10);
    let (cout, sout) = dcqcn_write_bw(
        &a,
        &b,
        "198.18.10.2",
        &["-q", "1024", "-s", "4096", "-n", "50", "-p", "18778"],
    );
    assert_cnps(&cout, &sout);
    for (who, out) in [("client", &cout), ("server", &sout)] {
        for what in ["retransmits", "timeouts", "kernel receive drops"] {
            assert_eq!(counter(out, what), 0, "{who}: {what}\n{out}");
        }
    }
}
