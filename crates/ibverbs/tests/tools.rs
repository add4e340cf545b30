//! `ibv_devices` and `ibv_devinfo` (with `-v`) show the softrdma device as
//! rdma-core's tools show a RoCE v2 port.

mod common;

use std::time::Duration;

fn run(tool: &str, args: &[&str]) -> String {
    let mut c = common::command(tool);
    c.args(args);
    let out = common::run(c, Duration::from_secs(30));
    assert!(out.ok(), "{tool} {args:?} failed:\n{}", out.text());
    out.stdout
}

#[test]
fn ibv_devices_lists_the_device() {
    let out = run("ibv_devices", &[]);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("srdma0"))
        .unwrap_or_else(|| panic!("srdma0 not listed:\n{out}"));
    // The node GUID: 16 hex digits.
    let guid = line.split_whitespace().nth(1).unwrap();
    assert_eq!(guid.len(), 16, "{line}");
    assert!(guid.chars().all(|c| c.is_ascii_hexdigit()), "{line}");
}

#[test]
fn ibv_devinfo_shows_an_active_roce_port() {
    let out = run("ibv_devinfo", &[]);
    for want in [
        "hca_id:\tsrdma0",
        "transport:\t\t\tInfiniBand (0)",
        "phys_port_cnt:\t\t\t1",
        "state:\t\t\tPORT_ACTIVE (4)",
        "active_mtu:\t\t4096 (5)",
        "link_layer:\t\tEthernet",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let out = run("ibv_devinfo", &["-d", "srdma0"]);
    assert!(out.contains("hca_id:\tsrdma0"), "{out}");
}

#[test]
fn ibv_devinfo_verbose_shows_caps_and_the_roce_v2_gid() {
    let out = run("ibv_devinfo", &["-v"]);
    for want in [
        "atomic_cap:\t\t\tATOMIC_HCA (1)",
        "max_qp_rd_atom:\t\t\t128",
        "gid_tbl_len:\t\t1024",
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
        "num_comp_vectors:\t\t1",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
}

#[test]
fn the_mtu_follows_softrdma_mtu() {
    let mut c = common::command("ibv_devinfo");
    c.env("SOFTRDMA_MTU", "1024");
    let out = common::run(c, Duration::from_secs(30));
    assert!(out.ok(), "{}", out.text());
    assert!(
        out.stdout.contains("active_mtu:\t\t1024 (3)"),
        "{}",
        out.stdout
    );
}
