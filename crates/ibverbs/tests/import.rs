//! `ibv_import_device` / `ibv_import_pd` / `ibv_import_mr` through the C
//! ABI: `tests/c/import.c`, compiled against the installed
//! `<infiniband/verbs.h>` and run on our `libibverbs.so.1` (one process
//! and, for the cross-process refusal, a child it execs with the fd).

mod common;

use std::time::Duration;

#[test]
fn an_imported_context_shares_the_originals_pd_and_mr() {
    let exe = common::compile_c("import", &[]);
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
