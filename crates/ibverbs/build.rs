//! Link the cdylib as libibverbs.so.1 with libibverbs' symbol version nodes.
//!
//! The version script only *declares* the nodes (IBVERBS_1.0 … 1.14,
//! IBVERBS_PRIVATE_34); each exported symbol is bound to its node by a
//! `.symver name, name@@NODE` directive next to its definition (see
//! `src/exports.rs`). rustc passes its own anonymous version script for the
//! cdylib's exports, and rust-lld merges both; a script that also listed the
//! symbols would leave them unversioned under lld, and GNU ld refuses to mix
//! an anonymous version tag with named ones.

use std::fmt::Write;

fn main() {
    let list = include_str!("exports.txt");
    let mut nodes: Vec<&str> = Vec::new();
    for line in list.lines().filter(|l| !l.trim().is_empty()) {
        let node = line.split_whitespace().next().expect("non-empty line");
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    // IBVERBS_1.0 < 1.1 < 1.5 < … < 1.14, then the private node.
    nodes.sort_by_key(|n| {
        let v = n.trim_start_matches("IBVERBS_");
        match v.split_once('.') {
            Some((a, b)) => (
                0,
                a.parse::<u32>().unwrap_or(0),
                b.parse::<u32>().unwrap_or(0),
            ),
            None => (1, 0, 0),
        }
    });
    let mut script = String::new();
    let mut prev: Option<&str> = None;
    for n in &nodes {
        match prev {
            Some(p) if n.starts_with("IBVERBS_1.") => writeln!(script, "{n} {{ }} {p};").unwrap(),
            _ => writeln!(script, "{n} {{ }};").unwrap(),
        }
        prev = Some(n);
    }
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let path = format!("{out}/libibverbs.map");
    std::fs::write(&path, script).expect("write version script");
    println!("cargo:rerun-if-changed=exports.txt");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={path}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
