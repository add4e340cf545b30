//! `ibv_import_device` / `ibv_import_pd` / `ibv_import_mr` through the C
//! ABI: `tests/c/import.c`, compiled against the installed
//! `<infiniband/verbs.h>` and run on our `libibverbs.so.1` (one process
//! and, for the cross-process refusal, a child it execs with the fd).

mod common;

use std::path::PathBuf;
use std::time::Duration;

/// Compile one of `tests/c/*.c` against the system headers, linking
/// `-libverbs` (and `extra`); it runs with our library first.
fn compile(name: &str, extra: &[&str]) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let dir = std::env::temp_dir().join(format!("softrdma-ctest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let out = std::process::Command::new("cc")
        .arg("-O1")
        .arg("-Wall")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .args(extra)
        .output()
        .expect("cc is missing: apt-get install -y gcc libibverbs-dev");
    assert!(
        out.status.success(),
        "compiling {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn an_imported_context_shares_the_originals_pd_and_mr() {
    let exe = compile("import", &[]);
    let mut cmd = std::process::Command::new(&exe);
    cmd.env("LD_LIBRARY_PATH", common::lib_dir())
        .env("SOFTRDMA_DEVICES", "srdma0=127.0.0.1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::run(cmd, Duration::from_secs(60));
    assert!(out.ok(), "{}", out.text());
    assert_eq!(
        out.stdout,
        "traffic: 4096 bytes exact\nchild: EOPNOTSUPP\nimport: ok\n",
        "{}",
        out.text()
    );
}
