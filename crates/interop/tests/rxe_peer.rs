//! The live interoperability suite: softrdma against Linux rxe in QEMU VMs
//! (see the crate docs and docs/INTEROP.md).
//!
//! Needs root (network namespaces, taps, eBPF steering), the rxe-peer
//! directory (`../shared/rxe-peer` next to the checkout, or
//! `SOFTRDMA_RXE_PEER_DIR`) and the release `softrdma` binary. It fails,
//! loudly, when any of that is missing; `SOFTRDMA_INTEROP=skip` skips it on
//! a machine that cannot run it, and says so.
//!
//! * `SOFTRDMA_INTEROP_MTUS=1500,9000` — which peer boots (Ethernet MTUs);
//! * arguments (after `--`) — run only combinations whose name contains one
//!   of them, e.g. `cargo test --release -p softrdma-interop -- write_bw`;
//! * `SOFTRDMA_INTEROP_KEEP=1` — keep every capture, not only failures';
//! * `SOFTRDMA_INTEROP_NS=name` — the network namespace (default
//!   `srdma-interop`), for two checkouts' suites side by side.
//!
//! Results: `target/interop/results.md` (tables) and `figures.md`, a log and
//! (for failures) a capture per combination in `target/interop/`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use softrdma_interop::matrix;
use softrdma_interop::peer::{Peer, PeerConfig};
use softrdma_interop::report;
use softrdma_interop::run::{self, Env, Outcome};

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// One suite at a time on a machine: they would share the VMs' names.
struct Lock(PathBuf);

impl Lock {
    fn take(path: PathBuf) -> Lock {
        let _ = std::fs::create_dir_all(path.parent().expect("a parent"));
        let mut said = false;
        loop {
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    let _ = std::fs::write(path.join("pid"), std::process::id().to_string());
                    return Lock(path);
                }
                Err(_) => {
                    let holder = std::fs::read_to_string(path.join("pid")).unwrap_or_default();
                    let alive = !holder.trim().is_empty()
                        && Path::new(&format!("/proc/{}", holder.trim())).exists();
                    if !alive {
                        let _ = std::fs::remove_dir_all(&path);
                        continue;
                    }
                    if !said {
                        eprintln!(
                            "interop: waiting for the suite running as pid {}",
                            holder.trim()
                        );
                        said = true;
                    }
                    std::thread::sleep(std::time::Duration::from_secs(2));
                }
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("\n==== softrdma interop suite FAILED ====\n{msg}\n");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    if std::env::var("SOFTRDMA_INTEROP").as_deref() == Ok("skip") {
        eprintln!(
            "\n==== softrdma interop suite SKIPPED (SOFTRDMA_INTEROP=skip): nothing was tested against rxe ====\n"
        );
        return ExitCode::SUCCESS;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let scripts = std::env::var_os("SOFTRDMA_RXE_PEER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../shared/rxe-peer"));
    if !is_root() {
        return fail(
            "the rxe peer needs root (network namespaces, taps, eBPF steering).\n\
             Run as root, or set SOFTRDMA_INTEROP=skip to skip this suite.",
        );
    }
    if !scripts.join("start.sh").exists() {
        return fail(&format!(
            "no rxe peer at {} (set SOFTRDMA_RXE_PEER_DIR, or SOFTRDMA_INTEROP=skip to skip this suite)",
            scripts.display()
        ));
    }
    let softrdma = match run::find_softrdma() {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    for l in ["libibverbs.so.1", "librdmacm.so.1"] {
        let lib = softrdma.with_file_name("ibverbs").join(l);
        if !lib.exists() {
            return fail(&format!(
                "{} is missing: build it with scripts/build-ibverbs (scripts/test does)",
                lib.display()
            ));
        }
    }
    for (t, pkg) in [
        ("ib_write_bw", "perftest"),
        ("ib_read_lat", "perftest"),
        ("rping", "rdmacm-utils"),
        ("nft", "nftables"),
    ] {
        if !std::process::Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .status()
            .is_ok_and(|s| s.success())
        {
            return fail(&format!("{t} is missing: install {pkg} (.ci/run does)"));
        }
    }
    let target = root.join("target");
    let out = target.join("interop");
    let _ = std::fs::create_dir_all(&out);
    for e in std::fs::read_dir(&out).into_iter().flatten().flatten() {
        let p = e.path();
        if matches!(p.extension().and_then(|x| x.to_str()), Some("pcap" | "log")) {
            let _ = std::fs::remove_file(p);
        }
    }
    let _lock = Lock::take(target.join("rxe-peer/suite.lock"));
    // Our programs' XDG_RUNTIME_DIR (run::Env::rundir): fresh each run.
    let rundir = out.join("run");
    let _ = std::fs::remove_dir_all(&rundir);
    if let Err(e) = std::fs::create_dir_all(&rundir).and_then(|()| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&rundir, std::fs::Permissions::from_mode(0o700))
    }) {
        return fail(&format!("cannot create {}: {e}", rundir.display()));
    }
    let mtus: Vec<u32> = std::env::var("SOFTRDMA_INTEROP_MTUS")
        .unwrap_or_else(|_| "1500,9000".into())
        .split(',')
        .filter_map(|m| m.trim().parse().ok())
        .collect();
    let base = PeerConfig {
        scripts,
        cache: target.join("rxe-peer"),
        // SOFTRDMA_INTEROP_NS: another name, for a second checkout's suite
        // beside this one (the namespace would clash: start.sh refuses an
        // existing one, and a leftover is deleted).
        ns: std::env::var("SOFTRDMA_INTEROP_NS").unwrap_or_else(|_| "srdma-interop".into()),
        mtu: 1500,
        vms: 2,
    };
    let t0 = Instant::now();
    eprintln!("interop: rxe-peer setup.sh");
    if let Err(e) = base.setup() {
        return fail(&e);
    }
    let wanted = |c: &matrix::Combo| {
        filters.is_empty() || filters.iter().any(|f| c.to_string().contains(f.as_str()))
    };
    let mut all: Vec<Outcome> = Vec::new();
    let mut idx = 0;
    for mtu in mtus {
        let cfg = PeerConfig {
            mtu,
            ..base.clone()
        };
        // rxe's active MTU: the largest IB MTU that fits in the Ethernet one.
        let path_mtu = [4096, 2048, 1024, 512, 256]
            .into_iter()
            .find(|m| m + 100 <= mtu)
            .unwrap_or(256);
        let combos: Vec<_> = matrix::matrix(path_mtu)
            .into_iter()
            .filter(wanted)
            .collect();
        if combos.is_empty() {
            continue;
        }
        eprintln!("interop: booting the rxe peer, Ethernet MTU {mtu} (path MTU {path_mtu})");
        let mut peer = match Peer::start(cfg.clone()) {
            Ok(p) => p,
            Err(e) => return fail(&e),
        };
        if combos.iter().any(|c| c.group == matrix::Group::RdmaCm) {
            // The VM side of the rdma_cm cases: the kit's image has them.
            let o = peer.exec(
                1,
                "for t in rping ib_write_bw ib_read_bw ib_send_bw rdma; do command -v $t >/dev/null || echo \"missing: $t\"; done; \
                 [ -c /dev/infiniband/rdma_cm ] || echo 'missing: /dev/infiniband/rdma_cm (rdma_ucm)'; \
                 [ -e /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 ] || echo 'missing: libgcc_s.so.1'",
                std::time::Duration::from_secs(30),
            );
            if !o.ok() || o.text.contains("missing") {
                return fail(&format!(
                    "the VM cannot run the rdma_cm cases ({}): {}",
                    o.status(),
                    o.text.trim()
                ));
            }
        }
        let env = Env {
            softrdma: softrdma.clone(),
            out: out.clone(),
            path_mtu,
            rundir: rundir.clone(),
        };
        for c in &combos {
            idx += 1;
            let mut o = run::run(&peer, &env, c, idx);
            if o.vm_dead {
                // A TCG guest that stops answering mid-run (seen a few
                // times, with nothing unusual on the wire before it): keep
                // its console, reboot, and run the combination once more.
                // The table says so; a second hang fails it.
                let kept = out.join(format!("{idx:03}-vm1-console.txt"));
                let _ = std::fs::copy(cfg.cache.join("run/vm1.console"), &kept);
                eprintln!(
                    "interop: VM 1 stopped answering during {c}: console kept in {}, rebooting and running it again",
                    kept.display()
                );
                peer.stop();
                peer = match Peer::start(cfg.clone()) {
                    Ok(p) => p,
                    Err(e) => return fail(&e),
                };
                let first = o.problems.join("; ");
                o = run::run(&peer, &env, c, idx);
                o.rerun_of = Some(format!(
                    "first attempt: {first} (VM console: {})",
                    kept.display()
                ));
            }
            eprintln!(
                "interop: [{:>6.1} s] {:<4} {} (path MTU {path_mtu}, {:.1} s){}",
                t0.elapsed().as_secs_f64(),
                if o.pass() { "ok" } else { "FAIL" },
                c,
                o.secs,
                if o.pass() {
                    String::new()
                } else {
                    format!("\n        {}", o.problems.join("\n        "))
                }
            );
            // A passing run's capture has been checked; keep only failures'
            // (all of them with SOFTRDMA_INTEROP_KEEP=1).
            if o.pass() && std::env::var_os("SOFTRDMA_INTEROP_KEEP").is_none() {
                for e in std::fs::read_dir(&out).into_iter().flatten().flatten() {
                    let p = e.path();
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    if name.starts_with(&format!("{idx:03}-")) && name.ends_with(".pcap") {
                        let _ = std::fs::remove_file(&p);
                    }
                }
            }
            let dead = o.vm_dead;
            all.push(o);
            if dead {
                eprintln!("interop: VM 1 stopped answering again: rebooting the peer");
                let _ = std::fs::copy(
                    cfg.cache.join("run/vm1.console"),
                    out.join(format!("{idx:03}-vm1-console-2.txt")),
                );
                peer.stop();
                peer = match Peer::start(cfg.clone()) {
                    Ok(p) => p,
                    Err(e) => return fail(&e),
                };
            }
        }
        peer.stop();
    }
    let secs = t0.elapsed().as_secs_f64();
    let md = report::markdown(&all);
    let figs = report::figures(&all);
    let _ = std::fs::write(out.join("results.md"), &md);
    let _ = std::fs::write(out.join("figures.md"), &figs);
    let failed = all.iter().filter(|o| !o.pass()).count();
    eprintln!("\n{md}\n{figs}");
    eprintln!(
        "interop: {} combinations, {} failed, {:.0} s; tables in {}",
        all.len(),
        failed,
        secs,
        out.join("results.md").display()
    );
    if all.is_empty() && filters.is_empty() {
        return fail("no combination ran");
    }
    if failed > 0 {
        return fail(&format!("{failed} of {} combinations failed", all.len()));
    }
    ExitCode::SUCCESS
}
