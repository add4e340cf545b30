//! The rxe peer (`../shared/rxe-peer`): QEMU VMs whose kernels run Soft-RoCE,
//! on a bridge in a private network namespace. This wraps its scripts —
//! `setup.sh`, `start.sh`, `vm-exec.sh`, `stop.sh` — with deadlines, and
//! stops the VMs when the [`Peer`] is dropped, also after a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::proc::{self, Output};

/// Files the suite adds to the kit's VM image (paths relative to `/`, as
/// on this host): glibc loads `libgcc_s.so.1` with `dlopen` to unwind a
/// thread in `pthread_cancel` and `pthread_exit`, so no `ldd` lists it and
/// setup.sh does not copy it; without it the VM's rping aborts when it
/// tears down its CQ thread ("libgcc_s.so.1 must be installed for
/// pthread_exit to work", exit 134), after its pings but with its output
/// lost.
pub const EXTRA_FILES: &[&str] = &["usr/lib/x86_64-linux-gnu/libgcc_s.so.1"];

/// Where the peer's scripts and state are, and how to boot it.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The rxe-peer directory (its scripts).
    pub scripts: PathBuf,
    /// `RXE_PEER_CACHE`: kernel, initramfs and `run/` state.
    pub cache: PathBuf,
    /// Network namespace; the suite's own, so that a peer someone started
    /// by hand (`rxepeer`) is left alone.
    pub ns: String,
    /// Ethernet MTU of the bridge and VMs (1500: rxe path MTU 1024; 9000: 4096).
    pub mtu: u32,
    pub vms: u32,
}

impl PeerConfig {
    fn script(&self, name: &str) -> Command {
        let mut c = Command::new("bash");
        c.arg(self.scripts.join(name))
            .env("RXE_PEER_CACHE", &self.cache)
            .env("RXE_PEER_NS", &self.ns)
            .env("RXE_PEER_MTU", self.mtu.to_string())
            .env("RXE_PEER_VMS", self.vms.to_string());
        c
    }

    /// `setup.sh`: packages (apt) and the VM kernel + initramfs. Cheap when
    /// everything is in place. Then [`PeerConfig::extend_image`].
    pub fn setup(&self) -> Result<Output, String> {
        let out = proc::run(self.script("setup.sh"), Duration::from_secs(900));
        if out.ok() {
            self.extend_image()?;
            Ok(out)
        } else {
            Err(format!(
                "rxe-peer setup.sh failed ({}):\n{}",
                out.status(),
                out.text
            ))
        }
    }

    /// Add to the VM image what the kit's `setup.sh` leaves out and the
    /// suite's programs need ([`EXTRA_FILES`]), as a second archive
    /// appended to `initramfs.cpio.gz` (the kernel unpacks concatenated
    /// archives in order). A marker next to the image records the image
    /// this made (size, mtime), so a rebuilt image gets the files again and
    /// an extended one is left alone.
    pub fn extend_image(&self) -> Result<(), String> {
        let img = self.cache.join("initramfs.cpio.gz");
        let mark = self.cache.join("initramfs.extra");
        let stamp = |p: &Path| -> Result<String, String> {
            let m = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let t = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            Ok(format!("{} {t} {}\n", m.len(), EXTRA_FILES.join(" ")))
        };
        if std::fs::read_to_string(&mark).ok() == Some(stamp(&img)?) {
            return Ok(());
        }
        for f in EXTRA_FILES {
            if !Path::new("/").join(f).exists() {
                return Err(format!(
                    "/{f} is missing on this host: the VM image needs it (see EXTRA_FILES)"
                ));
            }
        }
        // cpio and gzip: the kit's setup.sh installs and uses them.
        let sh = format!(
            "set -o pipefail; cd / && printf '%s\\n' {} | cpio -o -H newc -R 0:0 --quiet | gzip -6 >> '{}'",
            EXTRA_FILES.join(" "),
            img.display()
        );
        let mut c = Command::new("bash");
        c.args(["-c", &sh]);
        let out = proc::run(c, Duration::from_secs(60));
        if !out.ok() {
            return Err(format!(
                "cannot append {} to {}: {}: {}",
                EXTRA_FILES.join(", "),
                img.display(),
                out.status(),
                out.text
            ));
        }
        std::fs::write(&mark, stamp(&img)?).map_err(|e| format!("{}: {e}", mark.display()))
    }
}

/// One VM: VM n is 10.91.47.(10+n).
#[derive(Debug, Clone)]
pub struct Vm {
    pub n: u32,
    pub ip: String,
    pub mac: String,
}

/// A running peer. Dropping it runs `stop.sh`.
pub struct Peer {
    pub cfg: PeerConfig,
    /// The host side of the bridge: 10.91.47.1.
    pub host_ip: String,
    /// The bridge's IPv6 link-local address (our device for the IPv6 GID).
    pub host_ll: String,
    pub vms: Vec<Vm>,
    stopped: bool,
    /// The namespace's lock, held from before `start.sh` until `stop.sh`
    /// has run ([`peer_lock`]).
    lock: Option<std::fs::File>,
}

/// The lock that makes runs of the suite take the peer's namespace in
/// turn. The namespace, the bridge's addresses and the VMs are one per
/// machine, so two runs at once (a CI run started while another checkout's
/// suite is still going) would stop each other's VMs, or find the
/// namespace taken ("namespace srdma-interop already exists"). Each waits
/// for the other instead. `flock` dies with its holder, so a run that was
/// killed leaves no lock behind, only its namespace, which the next holder
/// stops as stale.
fn peer_lock(ns: &str) -> Result<std::fs::File, String> {
    let path = lock_path(ns);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => {
            eprintln!(
                "interop: another run of the suite holds {} (the rxe peer's namespace {ns}): waiting for it",
                path.display()
            );
            f.lock().map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(f)
        }
        Err(std::fs::TryLockError::Error(e)) => Err(format!("{}: {e}", path.display())),
    }
}

/// Where [`peer_lock`] keeps namespace `ns`'s lock.
fn lock_path(ns: &str) -> PathBuf {
    let dir = Path::new("/run/lock");
    let dir = if dir.is_dir() { dir } else { Path::new("/tmp") };
    dir.join(format!("softrdma-interop-{ns}.lock"))
}

fn ns_exists(ns: &str) -> bool {
    let out = proc::run(
        {
            let mut c = Command::new("ip");
            c.args(["netns", "list"]);
            c
        },
        Duration::from_secs(10),
    );
    out.text
        .lines()
        .any(|l| l.split_whitespace().next() == Some(ns))
}

impl Peer {
    /// `start.sh`: boot the VMs and wait for their rxe0. A failure is an
    /// error with everything the scripts said, never a skip.
    pub fn start(cfg: PeerConfig) -> Result<Peer, String> {
        let lock = peer_lock(&cfg.ns)?;
        if ns_exists(&cfg.ns) {
            // Left over by an earlier run of this suite that was killed
            // (a live one would hold the lock).
            let _ = proc::run(cfg.script("stop.sh"), Duration::from_secs(60));
        }
        let out = proc::run(cfg.script("start.sh"), Duration::from_secs(300));
        if !out.ok() {
            let _ = proc::run(cfg.script("stop.sh"), Duration::from_secs(60));
            return Err(format!(
                "rxe-peer start.sh failed ({}) with RXE_PEER_MTU={}:\n{}",
                out.status(),
                cfg.mtu,
                out.text
            ));
        }
        let env = std::fs::read_to_string(cfg.cache.join("run/env"))
            .map_err(|e| format!("rxe-peer wrote no run/env: {e}"))?;
        let get = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
        };
        let host_ip = get("RXE_PEER_HOST_IP").ok_or("run/env has no RXE_PEER_HOST_IP")?;
        let vms = (1..=cfg.vms)
            .map(|n| {
                Ok(Vm {
                    n,
                    ip: get(&format!("RXE_PEER_VM{n}_IP")).ok_or("run/env lacks a VM address")?,
                    mac: get(&format!("RXE_PEER_VM{n}_MAC")).ok_or("run/env lacks a VM MAC")?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut p = Peer {
            cfg,
            host_ip,
            host_ll: String::new(),
            vms,
            stopped: false,
            lock: Some(lock),
        };
        // The bridge's link-local address, once duplicate address detection
        // has finished with it (a tentative address cannot be bound).
        let mut ll = None;
        proc::wait_until(Duration::from_secs(20), Duration::from_millis(200), || {
            let o = proc::run(
                p.ns(&[
                    "ip", "-6", "-o", "addr", "show", "dev", "rxebr0", "scope", "link",
                ]),
                Duration::from_secs(10),
            );
            ll = o
                .text
                .lines()
                .find(|l| !l.contains("tentative"))
                .and_then(|l| {
                    let mut w = l.split_whitespace();
                    w.position(|x| x == "inet6")?;
                    w.next()?.split('/').next().map(str::to_string)
                });
            ll.is_some()
        });
        p.host_ll = ll.ok_or("the bridge has no usable IPv6 link-local address")?;
        for n in 1..=p.cfg.vms {
            // Kernel warnings onto the serial console (the boot is quiet),
            // for the console kept when a VM hangs.
            let _ = p.exec(n, "dmesg -n 7", Duration::from_secs(20));
            // rxe lists GID 0 as soon as eth0 has its link-local address,
            // but a route from it exists only once duplicate address
            // detection is over; until then rxe cannot connect a QP to an
            // IPv6 GID ("Failed to modify QP to RTR").
            let ready =
                proc::wait_until(Duration::from_secs(30), Duration::from_millis(300), || {
                    p.exec(
                        n,
                        "f=$(awk '$1 ~ /^fe80/ && $6 == \"eth0\" {print $5}' /proc/net/if_inet6); \
                     [ -n \"$f\" ] && [ $(( 0x$f & 0x40 )) -eq 0 ]",
                        Duration::from_secs(20),
                    )
                    .ok()
                });
            if !ready {
                return Err(format!(
                    "VM {n}: eth0's IPv6 link-local address never left DAD"
                ));
            }
        }
        Ok(p)
    }

    /// `ip netns exec NS args...`.
    pub fn ns(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.cfg.ns]).args(args);
        c
    }

    /// Run a shell command in VM `n` (busybox sh), within `limit`.
    pub fn exec(&self, n: u32, cmd: &str, limit: Duration) -> Output {
        let mut c = self.cfg.script("vm-exec.sh");
        c.arg(n.to_string())
            .arg(cmd)
            .env("RXE_PEER_EXEC_TIMEOUT", limit.as_secs().max(1).to_string());
        // vm-exec.sh has its own deadline; ours is a backstop.
        proc::run(c, limit + Duration::from_secs(5))
    }

    /// Whether VM `n` still answers.
    pub fn healthy(&self, n: u32) -> bool {
        self.exec(n, "true", Duration::from_secs(10)).ok()
    }

    /// The serial console of VM `n`, last `lines` lines.
    pub fn console_tail(&self, n: u32, lines: usize) -> String {
        let p = self.cfg.cache.join(format!("run/vm{n}.console"));
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let v: Vec<&str> = s.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }

    /// `stop.sh` (also done on drop).
    pub fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            let _ = proc::run(self.cfg.script("stop.sh"), Duration::from_secs(60));
            // The next run (or this one's next `start`) may have it now.
            self.lock = None;
        }
    }

    pub fn scripts(&self) -> &Path {
        &self.cfg.scripts
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A program started in the background inside a VM, its standard output
/// in `/tmp/<tag>.log`, its standard error in `/tmp/<tag>.err` and its exit
/// status in `/tmp/<tag>.rc` when it ends. Two files, not one: a program
/// whose stdout is a file writes it in 4 KiB blocks, its unbuffered stderr
/// in between, which cut rping -v's long ping lines in the middle.
pub struct VmJob {
    pub vm: u32,
    pub tag: String,
}

impl Peer {
    /// Start `cmdline` in VM `n` in the background.
    pub fn spawn_in_vm(&self, n: u32, tag: &str, cmdline: &str) -> Result<VmJob, String> {
        let sh = format!(
            "rm -f /tmp/{tag}.rc /tmp/{tag}.log /tmp/{tag}.err /tmp/{tag}.pid; \
             ( {cmdline} >/tmp/{tag}.log 2>/tmp/{tag}.err & echo $! >/tmp/{tag}.pid; wait $!; echo $? >/tmp/{tag}.rc ) \
             >/dev/null 2>&1 &"
        );
        let o = self.exec(n, &sh, Duration::from_secs(30));
        if !o.ok() {
            return Err(format!("cannot start '{cmdline}' in VM {n}: {}", o.text));
        }
        Ok(VmJob {
            vm: n,
            tag: tag.to_string(),
        })
    }

    /// Wait for a VM job to end (killing it at the deadline): its exit code
    /// (`None`: killed) and output (stdout, then stderr).
    pub fn wait_vm(&self, job: &VmJob, limit: Duration) -> (Option<i32>, String) {
        let t = &job.tag;
        let mut code = None;
        let mut log = String::new();
        // One call per poll: the status, a marker, the output so far.
        let mark = "__softrdma_interop_log__";
        proc::wait_until(limit, Duration::from_millis(150), || {
            let o = self.exec(
                job.vm,
                &format!("cat /tmp/{t}.rc 2>/dev/null; echo {mark}; cat /tmp/{t}.log /tmp/{t}.err"),
                Duration::from_secs(20),
            );
            if let Some((rc, rest)) = o.text.split_once(mark) {
                code = rc.trim().parse::<i32>().ok();
                log = rest.trim_start_matches('\n').to_string();
            }
            code.is_some()
        });
        if code.is_none() {
            self.kill_vm(job);
            let o = self.exec(
                job.vm,
                &format!("cat /tmp/{t}.log /tmp/{t}.err"),
                Duration::from_secs(20),
            );
            if o.ok() {
                log = o.text;
            }
        }
        (code, log)
    }

    /// Kill a VM job (by the pid it recorded) if it is still running.
    pub fn kill_vm(&self, job: &VmJob) {
        let t = &job.tag;
        let _ = self.exec(
            job.vm,
            &format!("[ -f /tmp/{t}.rc ] || kill -9 $(cat /tmp/{t}.pid) 2>/dev/null; true"),
            Duration::from_secs(20),
        );
    }

    /// Whether something in VM `n` listens on TCP `port`.
    pub fn vm_listening(&self, n: u32, port: u16) -> bool {
        self.exec(
            n,
            &format!("netstat -ltn | grep -q ':{port} '"),
            Duration::from_secs(20),
        )
        .ok()
    }

    /// Whether an rdma_cm ID in VM `n` listens on `port` (the kernel's
    /// `rdma resource show cm_id`: `state LISTEN ... src-addr A:PORT`).
    pub fn vm_cm_listening(&self, n: u32, port: u16) -> bool {
        self.exec(
            n,
            &format!("rdma resource show cm_id | grep -q 'state LISTEN .*:{port} '"),
            Duration::from_secs(20),
        )
        .ok()
    }

    /// Whether something in the namespace listens on TCP `port`.
    pub fn ns_listening(&self, port: u16) -> bool {
        let o = proc::run(
            self.ns(&["ss", "-ltnH", &format!("sport = :{port}")]),
            Duration::from_secs(10),
        );
        o.ok() && !o.text.trim().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second run finds the namespace's lock taken while a first holds
    /// it, and free once the first lets it go (as `Peer::stop` does).
    #[test]
    fn runs_take_the_peer_in_turn() {
        let ns = format!("lock-test-{}", std::process::id());
        let held = peer_lock(&ns).unwrap();
        let path = lock_path(&ns);
        let other = std::fs::File::open(&path).unwrap();
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        drop(held);
        other.try_lock().unwrap();
        drop(other);
        let _ = std::fs::remove_file(&path);
    }
}
