//! libfabric's verbs provider (Debian's libfabric1, its fi_info and
//! fi_pingpong) on softrdma's libibverbs.so.1 and librdmacm.so.1: the
//! device is listed for datagram, connected (FI_EP_MSG, over rdma_cm) and
//! reliable-datagram (verbs;ofi_rxm) endpoints, and fi_pingpong completes
//! over `verbs` with its default datagrams and with connected endpoints
//! (`-e msg`, RC over rdma_cm), and over `verbs;ofi_rxm` (RDM, over
//! rdma_cm connections: what fabtests' fi_rdm_pingpong, which Debian does
//! not package, runs).
//!
//! The verbs provider offers MSG endpoints only on devices whose address
//! belongs to an interface that is not loopback (it looks for an "IPoIB
//! interface", `fi_verbs(7)`), so the test makes a network namespace with
//! a veth pair and puts the device on it; both processes run there. This
//! needs root (`ip netns`); scripts/test-unprivileged leaves this file out.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A namespace and the device's address in it: one address per namespace,
/// since softrdma's port-sharing state is kept per address in the user's
/// runtime directory, which namespaces do not separate.
struct Ns(String, String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(args: &[&str]) {
    let st = Command::new("ip")
        .args(args)
        .status()
        .expect("ip (iproute2) is needed: apt-get install -y iproute2");
    assert!(st.success(), "ip {args:?} failed (this test needs root)");
}

fn netns() -> Ns {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("srdma-fi-{}-{n}", std::process::id());
    let addr = format!("10.77.{}.{}", std::process::id() % 250, 1 + n);
    ip(&["netns", "add", &name]);
    let ns = Ns(name.clone(), addr.clone());
    ip(&[
        "-n", &name, "link", "add", "fi0", "type", "veth", "peer", "name", "fi1",
    ]);
    ip(&[
        "-n",
        &name,
        "addr",
        "add",
        &format!("{addr}/24"),
        "dev",
        "fi0",
    ]);
    for dev in ["lo", "fi0", "fi1"] {
        ip(&["-n", &name, "link", "set", dev, "up"]);
    }
    ns
}

/// `tool args` in the namespace with our libraries and a device on its
/// address.
fn command(ns: &Ns, tool: &str, args: &[&str]) -> Command {
    common::require_rdmacm();
    let path = common::tool(tool);
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns.0])
        .arg(path)
        .args(args)
        .env("LD_LIBRARY_PATH", common::lib_dir())
        .env("SOFTRDMA_DEVICES", format!("srdma0={}", ns.1))
        // The provider's datagram endpoints send from GID index 0 unless
        // told: on the veth, as on rxe over it, index 0 is the link-local
        // default GID and the IPv4 address is index 1, the one a device on
        // that address sends from (docs/DESIGN.md, "The GID table").
        .env("FI_VERBS_GID_IDX", "1")
        .env_remove("SOFTRDMA_MTU")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn output(mut c: Command, timeout: Duration) -> (bool, String) {
    finish(c.spawn().expect("spawn"), timeout)
}

/// Wait for `child` (killed after `timeout`); its status and output.
fn finish(child: std::process::Child, timeout: Duration) -> (bool, String) {
    let pid = child.id();
    let deadline = Instant::now() + timeout;
    let watchdog = std::thread::spawn(move || {
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        // SAFETY: kill(2) of the child we started, by its pid.
        unsafe { libc_kill(pid as i32) };
    });
    let out = child.wait_with_output().expect("wait");
    let _ = watchdog.join();
    (
        out.status.success(),
        format!(
            "[{}]\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// SIGKILL, for a child that outlived its time.
unsafe fn libc_kill(pid: i32) {
    // SAFETY: the caller names its own child.
    unsafe { kill(pid, 9) };
}

#[test]
fn fi_info_lists_the_device_for_every_endpoint_type() {
    let ns = netns();
    let (ok, out) = output(
        command(&ns, "fi_info", &["-p", "verbs", "-t", "FI_EP_MSG"]),
        Duration::from_secs(30),
    );
    assert!(ok, "fi_info -p verbs -t FI_EP_MSG:\n{out}");
    assert!(out.contains("domain: srdma0\n"), "{out}");
    assert!(out.contains("protocol: FI_PROTO_RDMA_CM_IB_RC"), "{out}");
    let (ok, out) = output(
        command(&ns, "fi_info", &["-p", "verbs"]),
        Duration::from_secs(30),
    );
    assert!(ok, "fi_info -p verbs:\n{out}");
    assert!(out.contains("domain: srdma0-dgram"), "{out}");
    assert!(out.contains("type: FI_EP_DGRAM"), "{out}");
    let (ok, out) = output(
        command(&ns, "fi_info", &["-p", "verbs;ofi_rxm"]),
        Duration::from_secs(30),
    );
    assert!(ok, "fi_info -p 'verbs;ofi_rxm':\n{out}");
    assert!(out.contains("protocol: FI_PROTO_RXM"), "{out}");
}

/// fi_pingpong server and client (its control port: 47592 by default; one
/// namespace per test, so no other test shares it).
fn pingpong(ns: &Ns, args: &[&str]) -> String {
    let mut server = command(ns, "fi_pingpong", args);
    let child = server.spawn().expect("spawn");
    let pid = child.id();
    let srv = std::thread::spawn(move || finish(child, Duration::from_secs(60)));
    // The client starts once the server listens on its control port
    // (47592), as the process sees its namespace's TCP table.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let listening = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).is_ok_and(|t| {
            t.lines()
                .skip(1)
                .any(|l| l.contains(":B9E8 ") && l.split_whitespace().nth(3) == Some("0A"))
        });
        if listening {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client_args = args.to_vec();
    client_args.push(&ns.1);
    let (cok, cout) = output(
        command(ns, "fi_pingpong", &client_args),
        Duration::from_secs(60),
    );
    let (sok, sout) = srv.join().unwrap();
    assert!(
        sok && cok,
        "fi_pingpong {args:?}\n=== server:\n{sout}\n=== client:\n{cout}"
    );
    cout
}

/// The table rows fi_pingpong prints: size, sent, acked ("=N"), ...
fn rows(out: &str) -> Vec<(String, String, String)> {
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 8 && w[2].starts_with('=')).then(|| (w[0].into(), w[1].into(), w[2].into()))
        })
        .collect()
}

#[test]
fn fi_pingpong_over_verbs_and_rxm() {
    let ns = netns();
    for args in [
        // fi_pingpong's default endpoint: datagrams (verbs UD).
        &["-p", "verbs", "-I", "100"][..],
        // Connected endpoints: RC QPs over rdma_cm. Both sides send their
        // last message and disconnect as soon as it completes, so the
        // ACK of the message each received must leave before the QP goes
        // to Error (see `Qp::modify`).
        &["-p", "verbs", "-e", "msg", "-I", "100"][..],
        &["-p", "verbs;ofi_rxm", "-e", "rdm", "-I", "100"][..],
    ] {
        let out = pingpong(&ns, args);
        let r = rows(&out);
        assert!(r.len() >= 4, "{args:?}: sizes run\n{out}");
        for (size, sent, acked) in &r {
            assert_eq!(sent, "100", "{args:?} size {size}\n{out}");
            assert_eq!(acked, "=100", "{args:?} size {size}\n{out}");
        }
    }
}
