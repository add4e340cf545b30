//! `softrdma run -- PROGRAM ARGS…`: start an unmodified RDMA program on
//! softrdma, in the host environment such programs look for.
//!
//! Besides loading our `libibverbs.so.1` and `librdmacm.so.1` (the
//! library directory goes first on `LD_LIBRARY_PATH`), programs and test
//! suites read the kernel's RDMA files: rdma-core's tests find a device's
//! network interface in `/sys/class/infiniband/<dev>/device/net/`, UCX
//! reads each GID's type from `…/ports/1/gid_attrs/types/<i>` and its
//! interface from `…/gid_attrs/ndevs/<i>`. On a host without an RDMA
//! driver none of that exists, and creating it would mean changing the
//! host. So the program runs in a private mount namespace in which
//! `/sys/class` is a read-only overlay: a tmpfs holding `infiniband/` and
//! `infiniband_verbs/` — laid out as the kernel's ib core lays them out
//! for an rxe device — over the host's own `/sys/class`, which shows
//! through unchanged. `/dev/infiniband/uverbsN` and `rdma_cm` appear the
//! same way over `/dev` (as root, where the namespace is not a user
//! namespace: see [`dev_view`]).
//!
//! Root gets a mount namespace alone; anyone else a user namespace too,
//! mapping only their own uid and gid onto themselves, so the program runs
//! as the same user with the same files. Nothing touches the host: the
//! tmpfs is never attached anywhere outside the namespace, and the
//! namespace ends with the program (this process `exec`s it).

use std::ffi::{CString, OsString};
use std::fmt::Write as _;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rustix::mount::{
    fsconfig_create, fsconfig_set_string, fsmount, fsopen, move_mount, open_tree, FsMountFlags,
    FsOpenFlags, MountAttrFlags, MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags,
};
use softrdma_verbs::gid::gid_words;
use softrdma_verbs::{device_attr, devices, DeviceInfo, GidTable};

#[derive(clap::Args)]
pub struct Args {
    /// The directory holding softrdma's libibverbs.so.1 and librdmacm.so.1
    /// (default: `$SOFTRDMA_LIB_DIR`, else `ibverbs/` beside this binary,
    /// where `scripts/build-ibverbs` puts them).
    #[arg(long, value_name = "DIR")]
    lib_dir: Option<PathBuf>,
    /// Print the files of the /sys view and exit, running nothing.
    #[arg(long)]
    show: bool,
    /// The program to run and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    command: Vec<OsString>,
}

/// One file of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory.
    Dir,
    /// A regular file with these contents.
    File(String),
    /// A symbolic link to this target.
    Link(String),
    /// A hard link to this earlier file of the view (its path in the
    /// view): the empty GID slots, 1023 a device, share one page.
    Same(String),
}

/// A device as the view shows it: softrdma's device and the network
/// interface that holds its address.
struct ViewDevice {
    info: DeviceInfo,
    /// Its port's GID table (rxe's layout), which names its interface.
    gids: GidTable,
}

/// The `/sys/class` entries for `devs`, paths relative to `/sys/class`,
/// parents before children. Contents as the kernel's ib core writes them
/// for rxe (drivers/infiniband/core/sysfs.c), with the values softrdma's
/// `ibv_query_device`/`ibv_query_port` report.
fn sys_class(devs: &[ViewDevice]) -> Vec<(String, Node)> {
    let mut v = vec![
        ("infiniband".to_string(), Node::Dir),
        ("infiniband_verbs".to_string(), Node::Dir),
        // The uverbs ABI version of the kernel interface libibverbs speaks.
        ("infiniband_verbs/abi_version".to_string(), file("6")),
    ];
    for (i, d) in devs.iter().enumerate() {
        let a = device_attr(&d.info);
        let dev = format!("infiniband/{}", d.info.name);
        let netdev = &d.gids.netdev;
        let mut add = |p: &str, n: Node| v.push((format!("{dev}{p}"), n));
        add("", Node::Dir);
        add("/node_type", file("1: CA"));
        add("/node_guid", file(&guid(a.node_guid)));
        add("/sys_image_guid", file(&guid(a.sys_image_guid)));
        add("/fw_ver", file(&a.fw_ver));
        add("/node_desc", file(&format!("softrdma {}", d.info.name)));
        // rxe's `parent`: the network device it is bound to.
        if let Some(n) = netdev {
            add("/parent", file(n));
        }
        add("/device", Node::Dir);
        add("/device/net", Node::Dir);
        if let Some(n) = netdev {
            add(
                &format!("/device/net/{n}"),
                Node::Link(format!("../../../../net/{n}")),
            );
        }
        add("/ports", Node::Dir);
        add("/ports/1", Node::Dir);
        add("/ports/1/state", file("4: ACTIVE"));
        add("/ports/1/phys_state", file("5: LinkUp"));
        add("/ports/1/lid", file("0x0"));
        add("/ports/1/lid_mask_count", file("0"));
        add("/ports/1/sm_lid", file("0x0"));
        add("/ports/1/sm_sl", file("0"));
        // IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS, as ibv_query_port says.
        add("/ports/1/cap_mask", file("0x04010000"));
        // ibv_query_port: width 1X, speed 25 Gb/s (EDR).
        add("/ports/1/rate", file("25 Gb/sec (1X EDR)"));
        add("/ports/1/link_layer", file("Ethernet"));
        // Every slot of the table has its file, an empty one the zero GID
        // (sysfs.c's show_port_gid); only populated ones have a type and a
        // network device (the kernel's files of an empty slot fail to read
        // with EINVAL, which a file here cannot: they are left out).
        add("/ports/1/gids", Node::Dir);
        let mut empty: Option<String> = None;
        for i in 0..d.gids.len() {
            let p = format!("/ports/1/gids/{i}");
            match (d.gids.get(i), &empty) {
                (Ok(g), _) => add(&p, file(&gid_words(&g))),
                (Err(_), Some(first)) => add(&p, Node::Same(first.clone())),
                (Err(_), None) => {
                    add(&p, file(&gid_words(&[0; 16])));
                    empty = Some(format!("{dev}{p}"));
                }
            }
        }
        add("/ports/1/gid_attrs", Node::Dir);
        add("/ports/1/gid_attrs/types", Node::Dir);
        for (i, _) in d.gids.entries() {
            add(&format!("/ports/1/gid_attrs/types/{i}"), file("RoCE v2"));
        }
        add("/ports/1/gid_attrs/ndevs", Node::Dir);
        if let Some(n) = netdev {
            for (i, _) in d.gids.entries() {
                add(&format!("/ports/1/gid_attrs/ndevs/{i}"), file(n));
            }
        }
        add("/ports/1/pkeys", Node::Dir);
        add("/ports/1/pkeys/0", file("0xffff"));
        let uv = format!("infiniband_verbs/uverbs{i}");
        v.push((uv.clone(), Node::Dir));
        v.push((format!("{uv}/ibdev"), file(&d.info.name)));
        v.push((format!("{uv}/abi_version"), file("1")));
        v.push((format!("{uv}/dev"), file(&format!("231:{}", 192 + i))));
    }
    v
}

/// The view as `--show` prints it: a line a file; a run of hard links to
/// one file (the empty GID slots) as one line naming its first and last.
fn show(view: &[(String, Node)]) -> String {
    let mut o = String::new();
    let mut i = 0;
    while i < view.len() {
        let (p, n) = &view[i];
        match n {
            Node::Dir => {}
            Node::File(s) => {
                let _ = write!(o, "/sys/class/{p}: {s}");
            }
            Node::Link(t) => {
                let _ = writeln!(o, "/sys/class/{p} -> {t}");
            }
            Node::Same(t) => {
                let run = view[i..]
                    .iter()
                    .take_while(|(_, m)| matches!(m, Node::Same(u) if u == t))
                    .count();
                if run > 1 {
                    let last = &view[i + run - 1].0;
                    let _ = writeln!(o, "/sys/class/{p} … {last}: as /sys/class/{t}");
                } else {
                    let _ = writeln!(o, "/sys/class/{p}: as /sys/class/{t}");
                }
                i += run;
                continue;
            }
        }
        i += 1;
    }
    o
}

fn file(s: &str) -> Node {
    Node::File(format!("{s}\n"))
}

/// A GUID as sysfs prints it: four groups of four hex digits.
fn guid(g: u64) -> String {
    let b = g.to_be_bytes();
    let w: Vec<String> = b
        .chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect();
    w.join(":")
}

pub fn run(a: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let devs: Vec<ViewDevice> = devices()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|info| ViewDevice {
            gids: GidTable::for_addr(info.addr),
            info,
        })
        .collect();
    let view = sys_class(&devs);
    if a.show {
        out!("{}", show(&view));
        return Ok(ExitCode::SUCCESS);
    }
    let Some((prog, args)) = a.command.split_first() else {
        return Err("run: name the program to run: softrdma run -- PROGRAM [ARGS...]".into());
    };
    let lib_dir = lib_dir(a.lib_dir)?;
    enter_namespace(&view, devs.len()).map_err(|e| format!("run: {e}"))?;
    let mut ld = lib_dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    // exec only returns on failure.
    let e = std::process::Command::new(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", ld)
        .exec();
    Err(format!("run: cannot run {}: {e}", Path::new(prog).display()).into())
}

/// The library directory: `--lib-dir`, `$SOFTRDMA_LIB_DIR`, or `ibverbs/`
/// beside this binary; it must hold libibverbs.so.1.
fn lib_dir(given: Option<PathBuf>) -> Result<PathBuf, String> {
    let dir = match given.or_else(|| std::env::var_os("SOFTRDMA_LIB_DIR").map(PathBuf::from)) {
        Some(d) => d,
        None => std::env::current_exe()
            .map_err(|e| format!("run: cannot find this binary's directory: {e}"))?
            .parent()
            .map(|p| p.join("ibverbs"))
            .ok_or("run: this binary has no directory")?,
    };
    let dir = std::fs::canonicalize(&dir).map_err(|e| {
        format!(
            "run: library directory {}: {e} (build it with scripts/build-ibverbs, or name it with --lib-dir)",
            dir.display()
        )
    })?;
    if !dir.join("libibverbs.so.1").is_file() {
        return Err(format!(
            "run: {} holds no libibverbs.so.1 (build it with scripts/build-ibverbs)",
            dir.display()
        ));
    }
    Ok(dir)
}

/// Enter a private mount namespace (and a user namespace for a non-root
/// caller) and lay the views over `/sys/class` and `/dev`.
fn enter_namespace(view: &[(String, Node)], ndev: usize) -> io::Result<()> {
    let uid = rustix::process::getuid();
    let gid = rustix::process::getgid();
    let root = uid.is_root();
    let mut flags = rustix::thread::UnshareFlags::NEWNS;
    if !root {
        flags |= rustix::thread::UnshareFlags::NEWUSER;
    }
    // SAFETY: unshare_unsafe is unsafe only for CLONE_FILES (threads would
    // see different descriptor tables); these flags share no descriptors,
    // and this process is single-threaded here (clap parsing and device
    // listing start no thread), as CLONE_NEWUSER requires.
    unsafe { rustix::thread::unshare_unsafe(flags) }
        .map_err(|e| ctx(e, "cannot create a private mount namespace (unshare)"))?;
    if !root {
        // Map only ourselves: the program runs as the same user.
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{0} {0} 1\n", uid.as_raw())).map_err(
            |e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot map the user into its namespace: {e}"),
                )
            },
        )?;
        std::fs::write("/proc/self/gid_map", format!("{0} {0} 1\n", gid.as_raw()))?;
    }
    // Nothing mounted from here on may propagate to the host.
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| ctx(e, "cannot make the namespace's mounts private"))?;

    let stage = detached_tmpfs()?;
    let base = PathBuf::from(format!("/proc/self/fd/{}", fd_num(&stage)));
    std::fs::create_dir(base.join("class"))?;
    materialize(&base.join("class"), view)?;
    overlay("/sys/class", &base.join("class"))?;
    if root {
        dev_view(&base, ndev)?;
    }
    Ok(())
}

/// A tmpfs mount attached nowhere: reachable only through its descriptor.
fn detached_tmpfs() -> io::Result<OwnedFd> {
    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(|e| ctx(e, "cannot open a tmpfs (fsopen)"))?;
    fsconfig_set_string(fs.as_fd(), "size", "1m")?;
    fsconfig_set_string(fs.as_fd(), "mode", "0755")?;
    fsconfig_create(fs.as_fd())?;
    Ok(fsmount(
        fs.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )?)
}

fn fd_num(fd: &OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

/// Write `view` under `dir`.
fn materialize(dir: &Path, view: &[(String, Node)]) -> io::Result<()> {
    for (p, n) in view {
        let path = dir.join(p);
        match n {
            Node::Dir => std::fs::create_dir(&path)?,
            Node::File(s) => std::fs::write(&path, s)?,
            Node::Link(t) => std::os::unix::fs::symlink(t, &path)?,
            Node::Same(t) => std::fs::hard_link(dir.join(t), &path)?,
        }
    }
    Ok(())
}

/// Mount a read-only overlay on `target`: `upper` over `target` itself.
fn overlay(target: &str, upper: &Path) -> io::Result<()> {
    let opts = format!("lowerdir={}:{target}", upper.display());
    let opts = CString::new(opts).map_err(|_| io::Error::other("NUL in a path"))?;
    rustix::mount::mount(
        "softrdma",
        target,
        "overlay",
        MountFlags::RDONLY | MountFlags::NOSUID,
        Some(opts.as_c_str()),
    )
    .map_err(|e| ctx(e, &format!("cannot lay the view over {target} (overlayfs)")))
}

/// `/dev/infiniband/uverbsN` (character devices 231:192+N, as the kernel
/// numbers them) and `/dev/infiniband/rdma_cm` (10:58 on Debian), over
/// `/dev`. Opening them fails (no driver is behind those numbers); our
/// libraries never do, and programs that only look for them find them.
///
/// Root only: in a user namespace a new overlay is `nodev`, which would
/// make every device under `/dev` unusable, `/dev/null` included. The
/// mounts beneath `/dev` (`/dev/shm`, `/dev/pts`, …) would be hidden by
/// the overlay, so they are cloned first and attached on top of it again:
/// the same mounts, so `/dev/shm` is still the host's (the shared-memory
/// transport reaches processes outside the namespace through it).
fn dev_view(base: &Path, ndev: usize) -> io::Result<()> {
    let dev = base.join("dev");
    std::fs::create_dir(&dev)?;
    std::fs::create_dir(dev.join("infiniband"))?;
    // The staging tmpfs is nodev, which only matters for opening the nodes
    // through it; the overlay on /dev is not nodev.
    for i in 0..ndev {
        mknod(
            &dev.join(format!("infiniband/uverbs{i}")),
            231,
            192 + i as u32,
        )?;
    }
    mknod(&dev.join("infiniband/rdma_cm"), 10, 58)?;
    let subs = submounts("/dev")?;
    let mut clones = Vec::new();
    for m in &subs {
        let t = open_tree(
            rustix::fs::CWD,
            m.as_str(),
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_RECURSIVE,
        )
        .map_err(|e| ctx(e, &format!("cannot clone the mount on {m}")))?;
        clones.push((m, t));
    }
    let opts = format!("lowerdir={}:/dev", dev.display());
    let opts = CString::new(opts).map_err(|_| io::Error::other("NUL in a path"))?;
    rustix::mount::mount(
        "softrdma",
        "/dev",
        "overlay",
        MountFlags::NOSUID,
        Some(opts.as_c_str()),
    )
    .map_err(|e| ctx(e, "cannot lay the view over /dev (overlayfs)"))?;
    for (m, t) in clones {
        move_mount(
            t.as_fd(),
            "",
            rustix::fs::CWD,
            m.as_str(),
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(|e| ctx(e, &format!("cannot attach {m} again")))?;
    }
    Ok(())
}

fn mknod(path: &Path, major: u32, minor: u32) -> io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(major, minor),
    )
    .map_err(|e| ctx(e, &format!("cannot make {}", path.display())))
}

/// The mount points strictly beneath `top` whose nearest mounted ancestor
/// is `top` itself (cloning those recursively carries the rest), from
/// `/proc/self/mountinfo`.
fn submounts(top: &str) -> io::Result<Vec<String>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut all: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|p| p.starts_with(&format!("{top}/")))
        .collect();
    all.sort();
    all.dedup();
    let tops = all
        .iter()
        .filter(|p| {
            !all.iter()
                .any(|q| q != *p && p.starts_with(&format!("{q}/")))
        })
        .cloned()
        .collect();
    Ok(tops)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |c: &u8| (b'0'..=b'7').contains(c);
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(octal) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ctx(e: rustix::io::Errno, what: &str) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, addr: &str, netdev: Option<&str>) -> ViewDevice {
        let addr = addr.parse().unwrap();
        let mut gids = GidTable::from_interface(addr, None, &[]);
        gids.netdev = netdev.map(str::to_string);
        ViewDevice {
            info: DeviceInfo {
                name: name.into(),
                addr,
            },
            gids,
        }
    }

    fn get<'a>(v: &'a [(String, Node)], p: &str) -> &'a Node {
        &v.iter()
            .find(|(q, _)| q == p)
            .unwrap_or_else(|| panic!("no {p}"))
            .1
    }

    #[test]
    fn the_view_is_laid_out_as_the_kernel_lays_out_rxe() {
        let v = sys_class(&[
            dev("srdma0", "127.0.0.1", Some("lo")),
            dev("srdma1", "::1", None),
        ]);
        let f = |p: &str| match get(&v, p) {
            Node::File(s) => s.clone(),
            n => panic!("{p}: {n:?}"),
        };
        assert_eq!(
            f("infiniband/srdma0/ports/1/gids/0"),
            "0000:0000:0000:0000:0000:ffff:7f00:0001\n"
        );
        assert_eq!(
            f("infiniband/srdma0/ports/1/gid_attrs/types/0"),
            "RoCE v2\n"
        );
        assert_eq!(f("infiniband/srdma0/ports/1/gid_attrs/ndevs/0"), "lo\n");
        assert_eq!(f("infiniband/srdma0/node_guid"), "0250:7fff:fe00:0001\n");
        assert_eq!(f("infiniband/srdma0/ports/1/state"), "4: ACTIVE\n");
        assert_eq!(
            get(&v, "infiniband/srdma0/device/net/lo"),
            &Node::Link("../../../../net/lo".into())
        );
        assert_eq!(f("infiniband_verbs/uverbs1/ibdev"), "srdma1\n");
        assert_eq!(f("infiniband_verbs/uverbs1/dev"), "231:193\n");
        assert_eq!(
            f("infiniband/srdma1/ports/1/gids/0"),
            "0000:0000:0000:0000:0000:0000:0000:0001\n"
        );
        // No interface holds the address: no net entry, no ndev.
        assert!(!v
            .iter()
            .any(|(p, _)| p.starts_with("infiniband/srdma1/device/net/")));
        assert!(!v
            .iter()
            .any(|(p, _)| p == "infiniband/srdma1/ports/1/gid_attrs/ndevs/0"));
        // Every slot has a GID file; empty ones read as the zero GID and
        // have no type or network device.
        assert_eq!(
            f("infiniband/srdma0/ports/1/gids/1"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n"
        );
        assert_eq!(
            get(&v, "infiniband/srdma0/ports/1/gids/1023"),
            &Node::Same("infiniband/srdma0/ports/1/gids/1".into())
        );
        assert!(!v
            .iter()
            .any(|(p, _)| p == "infiniband/srdma0/ports/1/gids/1024"));
        assert!(!v
            .iter()
            .any(|(p, _)| p == "infiniband/srdma0/ports/1/gid_attrs/types/1"));
        // Parents come before children, so writing in order works.
        for (i, (p, _)) in v.iter().enumerate() {
            if let Some((parent, _)) = p.rsplit_once('/') {
                assert!(
                    v[..i].iter().any(|(q, n)| q == parent && *n == Node::Dir),
                    "{p}"
                );
            }
        }
    }

    #[test]
    fn an_ethernet_device_shows_rxes_table() {
        let addr = "10.91.47.1".parse().unwrap();
        let mac = [0x52, 0x54, 0x00, 0x91, 0x47, 0x01];
        let mut gids = GidTable::from_interface(addr, Some(mac), &[addr]);
        gids.netdev = Some("rxebr0".into());
        let v = sys_class(&[ViewDevice {
            info: DeviceInfo {
                name: "srdma4".into(),
                addr,
            },
            gids,
        }]);
        let f = |p: &str| match get(&v, &format!("infiniband/srdma4/ports/1/{p}")) {
            Node::File(s) => s.clone(),
            n => panic!("{p}: {n:?}"),
        };
        assert_eq!(f("gids/0"), "fe80:0000:0000:0000:5054:00ff:fe91:4701\n");
        assert_eq!(f("gids/1"), "0000:0000:0000:0000:0000:ffff:0a5b:2f01\n");
        assert_eq!(f("gids/2"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
        for i in 0..2 {
            assert_eq!(f(&format!("gid_attrs/types/{i}")), "RoCE v2\n");
            assert_eq!(f(&format!("gid_attrs/ndevs/{i}")), "rxebr0\n");
        }
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo("/dev/a\\040b"), "/dev/a b");
        assert_eq!(unescape_mountinfo("/dev/shm"), "/dev/shm");
    }
}
