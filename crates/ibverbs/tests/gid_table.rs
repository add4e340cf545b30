//! The port's GID table on an Ethernet interface, as rxe's over it: the
//! link-local default GID from the MAC at index 0, then the interface's
//! IPv4 addresses, then its IPv6 ones (docs/DESIGN.md, "Devices and the GID
//! table"), shown alike by rdma-core's `ibv_devinfo -v` on our library,
//! `softrdma devinfo -v` and `softrdma run`'s /sys view; and the device's
//! own index being the one a QP can send from (`ibv_rc_pingpong -g`).
//!
//! Needs root: the test makes a network namespace with a veth pair of
//! known MAC and addresses (scripts/test-unprivileged leaves this file
//! out).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

/// A namespace, deleted when dropped.
struct Ns(String);

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

/// g0 (MAC 52:54:00:5a:00:01) with 10.78.N.1/24, 10.78.N.2/24 (secondary)
/// and 2001:db8:78::1/64, in a namespace of its own; `N` from the pid, so
/// two runs at once do not share an address (softrdma's port-sharing
/// state is per address in the runtime directory, which namespaces share).
fn netns() -> (Ns, String) {
    let name = format!("srdma-gid-{}", std::process::id());
    let net = format!("10.78.{}", std::process::id() % 250);
    ip(&["netns", "add", &name]);
    let ns = Ns(name.clone());
    ip(&[
        "-n",
        &name,
        "link",
        "add",
        "g0",
        "address",
        "52:54:00:5a:00:01",
        "type",
        "veth",
        "peer",
        "name",
        "g1",
    ]);
    for a in [format!("{net}.1/24"), format!("{net}.2/24")] {
        ip(&["-n", &name, "addr", "add", &a, "dev", "g0"]);
    }
    ip(&[
        "-n",
        &name,
        "-6",
        "addr",
        "add",
        "2001:db8:78::1/64",
        "dev",
        "g0",
        "nodad",
    ]);
    for dev in ["lo", "g0", "g1"] {
        ip(&["-n", &name, "link", "set", dev, "up"]);
    }
    (ns, net)
}

/// `prog args` in the namespace, with our libraries and `devices`.
fn in_ns(ns: &Ns, prog: &std::path::Path, args: &[&str], devices: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns.0])
        .arg(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", common::lib_dir())
        .env("SOFTRDMA_DEVICES", devices)
        .env("SOFTRDMA_IBV_LOG", "1")
        .env("XDG_RUNTIME_DIR", runtime_dir())
        .env_remove("SOFTRDMA_MTU")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A runtime directory of this test's own (the port-sharing state),
/// private to the user (0700: softrdma refuses a runtime directory others
/// may write in); the test removes it when it ends.
fn runtime_dir() -> &'static std::path::Path {
    use std::os::unix::fs::PermissionsExt;
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("srdma-gid-rt-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .expect("runtime dir")
    })
    .path()
}

fn softrdma() -> std::path::PathBuf {
    let p = common::profile_dir().join("softrdma");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build --release --bin softrdma; scripts/test does)",
        p.display()
    );
    p
}

#[test]
fn an_ethernet_devices_table_is_rxes_and_its_own_index_sends() {
    let (ns, net) = netns();
    let devs = format!("srdma0={net}.2,srdma1={net}.1");
    let want = [
        "GID[  0]:\t\tfe80::5054:ff:fe5a:1, RoCE v2".to_string(),
        format!("GID[  1]:\t\t::ffff:{net}.1, RoCE v2"),
        format!("GID[  2]:\t\t::ffff:{net}.2, RoCE v2"),
        "GID[  3]:\t\t2001:db8:78::1, RoCE v2".to_string(),
    ];
    // rdma-core's ibv_devinfo on our library, and softrdma devinfo: the
    // same four entries of 1024, nothing else.
    for (what, out) in [
        (
            "ibv_devinfo -v",
            common::run(
                in_ns(
                    &ns,
                    &common::tool("ibv_devinfo"),
                    &["-v", "-d", "srdma0"],
                    &devs,
                ),
                Duration::from_secs(30),
            ),
        ),
        (
            "softrdma devinfo -v",
            common::run(
                in_ns(&ns, &softrdma(), &["devinfo", "-v", "-d", "srdma0"], &devs),
                Duration::from_secs(30),
            ),
        ),
    ] {
        assert!(out.ok(), "{what}: {}", out.text());
        assert!(
            out.stdout.contains("gid_tbl_len:\t\t1024"),
            "{what}: {}",
            out.stdout
        );
        let gids: Vec<&str> = out
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("GID["))
            .collect();
        assert_eq!(gids, want, "{what}:\n{}", out.stdout);
    }

    // softrdma run's /sys view: every slot's file, types of the populated.
    let out = common::run(
        in_ns(&ns, &softrdma(), &["run", "--show"], &devs),
        Duration::from_secs(30),
    );
    assert!(out.ok(), "softrdma run --show: {}", out.text());
    let p = "/sys/class/infiniband/srdma0/ports/1";
    for line in [
        format!("{p}/gids/0: fe80:0000:0000:0000:5054:00ff:fe5a:0001"),
        format!(
            "{p}/gids/1: 0000:0000:0000:0000:0000:ffff:0a4e:{:02x}01",
            net_octet(&net)
        ),
        format!("{p}/gids/3: 2001:0db8:0078:0000:0000:0000:0000:0001"),
        format!("{p}/gids/4: 0000:0000:0000:0000:0000:0000:0000:0000"),
        format!("{p}/gids/5 … infiniband/srdma0/ports/1/gids/1023: as {p}/gids/4"),
        format!("{p}/gid_attrs/types/3: RoCE v2"),
        format!("{p}/gid_attrs/ndevs/3: g0"),
    ] {
        assert!(
            out.stdout.lines().any(|l| l == line),
            "missing {line:?} in:\n{}",
            out.stdout
        );
    }
    assert!(!out.stdout.contains(&format!("{p}/gid_attrs/types/4:")));

    // An RC exchange with checked buffers, each side on its own index:
    // srdma0 (.2) is GID 2, srdma1 (.1) GID 1.
    let pp = common::tool("ibv_rc_pingpong");
    let port = common::next_port().to_string();
    let server = in_ns(
        &ns,
        &pp,
        &["-d", "srdma0", "-g", "2", "-n", "20", "-c", "-p", &port],
        &devs,
    );
    let client = || {
        in_ns(
            &ns,
            &pp,
            &["-d", "srdma1", "-g", "1", "-n", "20", "-c", "-p", &port],
            &devs,
        )
    };
    let (s, c) = pair_to(server, client, &format!("{net}.2"));
    assert!(
        s.ok() && c.ok(),
        "server: {}\nclient: {}",
        s.text(),
        c.text()
    );
    assert!(c.stdout.contains("163840 bytes in"), "{}", c.stdout);

    // Another entry of the interface is not this device's to send from:
    // the client's RTR is refused, naming its own index.
    let port = common::next_port().to_string();
    let server = in_ns(
        &ns,
        &pp,
        &["-d", "srdma0", "-g", "2", "-n", "20", "-p", &port],
        &devs,
    );
    let client = || {
        in_ns(
            &ns,
            &pp,
            &["-d", "srdma1", "-g", "2", "-n", "20", "-p", &port],
            &devs,
        )
    };
    let (_, c) = pair_to(server, client, &format!("{net}.2"));
    assert!(!c.ok(), "{}", c.text());
    assert!(
        c.stderr.contains(&format!(
            "GID index 2 ({net}.2) is another address of the device's interface; \
             the device sends from {net}.1 (GID index 1)"
        )),
        "{}",
        c.text()
    );
    let _ = std::fs::remove_dir_all(runtime_dir());
}

/// The third octet of `10.78.N`.
fn net_octet(net: &str) -> u8 {
    net.rsplit('.').next().unwrap().parse().unwrap()
}

/// Start `server`, then the client towards `host` once the server listens
/// (retried while the connection is refused: the server may not be up).
fn pair_to(
    mut server: Command,
    client: impl Fn() -> Command,
    host: &str,
) -> (common::Output, common::Output) {
    let srv = server.spawn().expect("spawn server");
    let mut c = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let mut k = client();
        k.arg(host);
        let out = common::run(k, Duration::from_secs(30));
        let refused = out.stderr.contains("Couldn't connect to");
        c = Some(out);
        if !refused {
            break;
        }
    }
    let s = common::wait(srv, Duration::from_secs(10));
    (s, c.expect("ran"))
}
