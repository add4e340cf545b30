//! The built library has libibverbs' ABI identity: its soname, every
//! default-versioned symbol of rdma-core 44's library with the same
//! version, nothing else exported, and every Debian RDMA binary (with the
//! provider libraries perftest links, all bound at load time) loads
//! against it.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

fn objdump(args: &[&str]) -> String {
    objdump_of("libibverbs.so.1", args)
}

fn objdump_of(lib: &str, args: &[&str]) -> String {
    let lib = common::lib_dir().join(lib);
    let out = Command::new("objdump")
        .args(args)
        .arg(&lib)
        .output()
        .expect("objdump (binutils) is needed to inspect the library");
    assert!(out.status.success(), "objdump {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// (version node, symbol) per line of an exports list.
fn export_list(text: &str) -> BTreeSet<(String, String)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            (w.next().unwrap().into(), w.next().unwrap().into())
        })
        .collect()
}

/// The defined dynamic symbols of `lib` with their versions (objdump -T:
/// "addr flags section size version name").
fn defined_exports(lib: &str) -> BTreeSet<(String, String)> {
    objdump_of(lib, &["-T"])
        .lines()
        .filter(|l| l.contains(" DF ") || l.contains(" DO "))
        .filter(|l| !l.contains("*UND*"))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[w.len() - 2].to_string(), w[w.len() - 1].to_string())
        })
        .collect()
}

#[test]
fn soname_and_versioned_exports_match_the_real_library() {
    let want = export_list(include_str!("../exports.txt"));
    assert_eq!(want.len(), 146);
    let have = defined_exports("libibverbs.so.1");
    // Besides libibverbs' own: the rdma_cm functions softrdma's
    // librdmacm.so.1 forwards to (`softrdma_<name>` for every rdma_*
    // export of crates/rdmacm/exports.txt), unversioned.
    let rdmacm: BTreeSet<(String, String)> = include_str!("../../rdmacm/exports.txt")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|n| n.starts_with("rdma_"))
        .map(|n| ("Base".to_string(), format!("softrdma_{n}")))
        .collect();
    let have_rdmacm: BTreeSet<(String, String)> = have
        .iter()
        .filter(|(_, n)| n.starts_with("softrdma_rdma_"))
        .cloned()
        .collect();
    assert_eq!(
        have_rdmacm, rdmacm,
        "the rdma_cm functions librdmacm.so.1 forwards to"
    );
    let have: BTreeSet<(String, String)> = have.difference(&rdmacm).cloned().collect();
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing (version, symbol): {missing:?}\nexported but not in libibverbs: {extra:?}"
    );
    let dynamic = objdump(&["-p"]);
    assert!(
        dynamic.contains("SONAME               libibverbs.so.1"),
        "soname is not libibverbs.so.1:\n{dynamic}"
    );
    // The data symbol is an object, not a function.
    let t = objdump(&["-T"]);
    let line = t
        .lines()
        .find(|l| l.ends_with(" verbs_allow_disassociate_destroy"))
        .unwrap();
    assert!(line.contains(" DO "), "{line}");
}

#[test]
fn every_debian_rdma_binary_loads() {
    let bins = [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_xsrq_pingpong",
        "ibv_asyncwatch",
        "ib_write_bw",
        "ib_write_lat",
        "ib_read_bw",
        "ib_read_lat",
        "ib_send_bw",
        "ib_send_lat",
        "ib_atomic_bw",
        "ib_atomic_lat",
    ];
    for b in bins {
        // An unknown option: each program prints its usage and exits, after
        // the loader has bound every symbol of every library it links.
        let mut c = common::command(b);
        c.arg("--softrdma-no-such-option").env("LD_BIND_NOW", "1");
        let out = common::run(c, Duration::from_secs(20));
        assert!(
            out.status != Some(127)
                && !out.stderr.contains("symbol lookup error")
                && !out.stderr.contains("error while loading shared libraries"),
            "{b} does not load against our library:\n{}",
            out.text()
        );
    }
}

/// softrdma's librdmacm.so.1: rdma-core 44's soname, and every export of
/// the real library (crates/rdmacm/exports.txt, from its `objdump -T`)
/// with the same version, nothing else.
#[test]
fn librdmacm_has_the_real_librarys_exports() {
    common::require_rdmacm();
    let have = defined_exports("librdmacm.so.1");
    let want = export_list(include_str!("../../rdmacm/exports.txt"));
    assert_eq!(want.len(), 68);
    assert_eq!(have, want);
    let p = objdump_of("librdmacm.so.1", &["-p"]);
    assert!(p.contains("SONAME               librdmacm.so.1"), "{p}");
}
