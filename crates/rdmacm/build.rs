//! Link the cdylib as librdmacm.so.1 with librdmacm's version nodes
//! (RDMACM_1.0 … 1.3); each export is bound to its node by a `.symver`
//! directive next to its definition (src/lib.rs), as in softrdma's
//! libibverbs.so.1 (see crates/ibverbs/build.rs for why the script only
//! declares the nodes).

fn main() {
    let list = include_str!("exports.txt");
    let mut nodes: Vec<&str> = Vec::new();
    for line in list.lines().filter(|l| !l.trim().is_empty()) {
        let node = line.split_whitespace().next().expect("non-empty line");
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    nodes.sort();
    let mut script = String::new();
    let mut prev: Option<&str> = None;
    for n in &nodes {
        match prev {
            Some(p) => script.push_str(&format!("{n} {{ }} {p};\n")),
            None => script.push_str(&format!("{n} {{ }};\n")),
        }
        prev = Some(n);
    }
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let path = format!("{out}/librdmacm.map");
    std::fs::write(&path, script).expect("write version script");
    println!("cargo:rerun-if-changed=exports.txt");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={path}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
}
