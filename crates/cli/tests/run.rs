//! `softrdma run`: a program started under it sees the kernel's RDMA files
//! for softrdma's devices, laid out as for rxe, and the host is left as it
//! was. Runs as root (a mount namespace) and, in `scripts/test-unprivileged`,
//! as a normal user (a user namespace too).

use std::path::Path;
use std::process::{Command, Output};

/// A library directory `run` accepts (it checks for libibverbs.so.1; the
/// programs here load no RDMA library), this call's alone and removed when
/// dropped.
fn lib_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("softrdma-run-test-")
        .tempdir()
        .expect("a scratch directory");
    std::fs::write(d.path().join("libibverbs.so.1"), b"").unwrap();
    d
}

fn run(args: &[&str]) -> Output {
    let lib = lib_dir();
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("run")
        .arg("--lib-dir")
        .arg(lib.path())
        .arg("--")
        .args(args)
        .env("SOFTRDMA_DEVICES", "srdma0=127.0.0.1,srdma1=::1")
        .output()
        .expect("run softrdma")
}

fn text(o: &Output) -> String {
    assert!(
        o.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// What the host has under a path, to compare before and after.
fn listing(p: &str) -> Option<Vec<String>> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .ok()?
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    Some(v)
}

#[test]
fn the_program_sees_the_devices_files_and_the_host_is_unchanged() {
    let before = (listing("/sys/class"), listing("/sys/class/infiniband"));
    let o = run(&[
        "sh",
        "-c",
        "cat /sys/class/infiniband/srdma0/ports/1/gids/0 \
             /sys/class/infiniband/srdma0/ports/1/gid_attrs/types/0 \
             /sys/class/infiniband/srdma0/ports/1/gid_attrs/ndevs/0 \
             /sys/class/infiniband/srdma1/ports/1/gids/0 \
             /sys/class/infiniband_verbs/uverbs1/ibdev; \
         ls /sys/class/infiniband/srdma0/device/net; \
         cat /sys/class/infiniband/srdma0/device/net/lo/ifindex",
    ]);
    let out = text(&o);
    let lo_index = std::fs::read_to_string("/sys/class/net/lo/ifindex").unwrap();
    assert_eq!(
        out,
        format!(
            "0000:0000:0000:0000:0000:ffff:7f00:0001\nRoCE v2\nlo\n\
             0000:0000:0000:0000:0000:0000:0000:0001\nsrdma1\nlo\n{lo_index}"
        )
    );
    // The rest of /sys/class shows through.
    let o = run(&["ls", "/sys/class"]);
    let seen: Vec<String> = text(&o).lines().map(str::to_string).collect();
    for c in before.0.as_ref().unwrap() {
        assert!(seen.contains(c), "/sys/class/{c} hidden: {seen:?}");
    }
    assert!(seen.contains(&"infiniband".to_string()));
    // Nothing left on the host.
    assert_eq!(
        (listing("/sys/class"), listing("/sys/class/infiniband")),
        before
    );
}

#[test]
fn the_program_runs_as_the_same_user_and_keeps_dev_shm() {
    let me = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap();
    let name = format!("softrdma-run-test-{}-{}", me.trim(), std::process::id());
    let o = run(&[
        "sh",
        "-c",
        &format!("id -u; echo x > /dev/shm/{name}; echo y > /dev/null"),
    ]);
    assert_eq!(text(&o), me);
    // /dev/shm inside is the host's (the shared-memory transport needs it).
    let host = Path::new("/dev/shm").join(&name);
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "x\n");
    std::fs::remove_file(host).unwrap();
}

#[test]
fn misuse_is_named() {
    let o = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args([
            "run",
            "--lib-dir",
            "/nonexistent-softrdma-libs",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("library directory /nonexistent-softrdma-libs"),
        "{e}"
    );
    let lib = lib_dir();
    let o = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("run")
        .arg("--lib-dir")
        .arg(lib.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("name the program to run"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run(&["/nonexistent-program"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot run /nonexistent-program"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
