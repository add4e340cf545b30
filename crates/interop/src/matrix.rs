//! The combinations the suite runs, as data: which program, which side is
//! ours, which GID, how many QPs, sweep or not, loss or not. One table per
//! boot of the peer (its MTU decides the path MTU).

use std::fmt;

/// Which side our stack plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ours {
    /// `softrdma` listens, the VM's program connects.
    Server,
    /// The VM's program listens, `softrdma` connects.
    Client,
}

/// Which of rxe's GIDs the VM uses (ours follows: one device per family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gid {
    /// rxe GID 1, `::ffff:10.91.47.1x`; ours: 10.91.47.1.
    V4,
    /// rxe GID 0, the link-local `fe80::…`; ours: the bridge's link-local.
    V6,
}

impl Gid {
    /// Its GID index, the same on both sides: rxe's table and ours are laid
    /// out alike (the link-local default GID, then the IPv4 address), so
    /// each side's tools take the index rxe users type (`-x 1` for IPv4).
    pub fn index(self) -> u8 {
        match self {
            Gid::V4 => 1,
            Gid::V6 => 0,
        }
    }
}

/// The program pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// perftest's `ib_<test>` in the VM against `softrdma perf <test>`.
    Perf(&'static str),
    /// `ibv_<t>_pingpong` in the VM against `softrdma pingpong --transport <t>`.
    Pingpong(&'static str),
    /// perftest's `ib_<test>` on the host, running on softrdma's drop-in
    /// `libibverbs.so.1`, against perftest on rxe in the VM.
    Library(&'static str),
    /// perftest against perftest, rxe against rxe between the two VMs: the
    /// reference figures for the same session (no softrdma involved).
    RxePair(&'static str),
    /// Debian's `rping -v` on softrdma's drop-in `librdmacm.so.1` and
    /// `libibverbs.so.1` against the VM's `rping` on the kernel's rdma_cm:
    /// every ping's bytes checked on both sides.
    Rping,
    /// perftest's `ib_<test> -R` (QPs connected by rdma_cm) on softrdma's
    /// two libraries against the VM's, on the kernel's rdma_cm.
    LibraryCm(&'static str),
}

/// Which part of the issue a combination covers (a table section each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    Perftest,
    MultiQp,
    Sweep,
    Pingpong,
    Loss,
    Library,
    RdmaCm,
    Reference,
}

impl Group {
    pub fn title(self) -> &'static str {
        match self {
            Group::Perftest => "perftest, one QP",
            Group::MultiQp => "perftest, several QPs (-q 4)",
            Group::Sweep => "perftest, size sweep (-a)",
            Group::Pingpong => "ibv_*_pingpong, buffer validation on (-c)",
            Group::Loss => {
                "RC under loss (VM: netem loss 2%, not for rc_pingpong; ours: --fault loss=0.02)"
            }
            Group::Library => "perftest on softrdma's libibverbs.so.1 against perftest on rxe",
            Group::RdmaCm => {
                "rdma_cm: rping and perftest -R on softrdma's librdmacm.so.1 against the kernel's rdma_cm"
            }
            Group::Reference => "rxe against rxe (reference figures, no softrdma)",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Combo {
    pub group: Group,
    pub program: Program,
    pub ours: Ours,
    pub gid: Gid,
    /// perftest `-A` for atomics.
    pub atomic: Option<&'static str>,
    pub qps: u32,
    /// perftest `-a`.
    pub all: bool,
    pub loss: bool,
    pub iters: u32,
    /// Message size, where not the program's default.
    pub size: Option<u32>,
}

impl Combo {
    fn new(group: Group, program: Program, ours: Ours, gid: Gid) -> Combo {
        Combo {
            group,
            program,
            ours,
            gid,
            atomic: None,
            qps: 1,
            all: false,
            loss: false,
            iters: 0,
            size: None,
        }
    }

    /// The program's name as the table shows it: `write_bw`, `atomic_bw CAS`,
    /// `rc_pingpong`.
    pub fn program_name(&self) -> String {
        let base = match self.program {
            Program::Perf(t) | Program::RxePair(t) => t.to_string(),
            Program::Library(t) => format!("ib_{t} on libibverbs.so.1"),
            Program::Pingpong(t) => format!("{t}_pingpong"),
            Program::Rping => match self.size {
                Some(s) => format!("rping -S {s}"),
                None => "rping".into(),
            },
            Program::LibraryCm(t) => format!("ib_{t} -R on librdmacm.so.1"),
        };
        match self.atomic {
            Some("CMP_AND_SWAP") => format!("{base} CAS"),
            Some(_) => format!("{base} FAA"),
            None => base,
        }
    }
}

impl fmt::Display for Combo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program_name())?;
        if self.qps > 1 {
            write!(f, " -q {}", self.qps)?;
        }
        if self.all {
            write!(f, " -a")?;
        }
        if self.loss {
            write!(f, " +loss")?;
        }
        match self.program {
            Program::RxePair(_) => write!(f, ", rxe vs rxe")?,
            _ => write!(
                f,
                ", ours {}",
                match self.ours {
                    Ours::Server => "server",
                    Ours::Client => "client",
                }
            )?,
        }
        write!(
            f,
            ", {}",
            match self.gid {
                Gid::V4 => "IPv4 GID",
                Gid::V6 => "IPv6 GID",
            }
        )
    }
}

const BOTH: [Ours; 2] = [Ours::Server, Ours::Client];

/// perftest's eight tests, atomic_bw with both operations.
const PERFTESTS: [(&str, Option<&str>); 9] = [
    ("write_bw", None),
    ("read_bw", None),
    ("send_bw", None),
    ("atomic_bw", Some("FETCH_AND_ADD")),
    ("atomic_bw", Some("CMP_AND_SWAP")),
    ("write_lat", None),
    ("read_lat", None),
    ("send_lat", None),
    ("atomic_lat", Some("FETCH_AND_ADD")),
];

/// rping's large buffer (`-S`): more than one packet at path MTU 4096.
pub const RPING_LARGE: u32 = 10_000;

/// Iterations: a second or two of TCG time each. Latency tests and
/// atomics move 2 or 8 bytes per iteration; the other bandwidth tests
/// 64 KiB.
fn iters_for(test: &str) -> u32 {
    if test.ends_with("_lat") || test.starts_with("atomic") {
        200
    } else {
        50
    }
}

/// Everything to run against one boot of the peer, whose path MTU is
/// `path_mtu`.
///
/// The latency tests' sweeps run at path MTU 4096 only: under TCG each
/// takes 20–35 s (every size both ways, up to 8 MiB, one message at a
/// time), and the suite must stay well inside CI's time. The bandwidth
/// sweeps run at both.
pub fn matrix(path_mtu: u32) -> Vec<Combo> {
    let mut v = Vec::new();
    for gid in [Gid::V4, Gid::V6] {
        for (t, atomic) in PERFTESTS {
            for ours in BOTH {
                let mut c = Combo::new(Group::Perftest, Program::Perf(t), ours, gid);
                c.atomic = atomic;
                c.iters = iters_for(t);
                v.push(c);
            }
        }
    }
    for t in ["write_bw", "read_bw", "send_bw", "atomic_bw"] {
        for ours in BOTH {
            let mut c = Combo::new(Group::MultiQp, Program::Perf(t), ours, Gid::V4);
            c.qps = 4;
            c.iters = 20;
            if t == "atomic_bw" {
                c.atomic = Some("FETCH_AND_ADD");
            }
            v.push(c);
        }
    }
    for t in [
        "write_bw",
        "read_bw",
        "send_bw",
        "write_lat",
        "read_lat",
        "send_lat",
    ] {
        if t.ends_with("_lat") && path_mtu != 4096 {
            continue;
        }
        for ours in BOTH {
            let mut c = Combo::new(Group::Sweep, Program::Perf(t), ours, Gid::V4);
            c.all = true;
            c.iters = 5;
            v.push(c);
        }
    }
    for gid in [Gid::V4, Gid::V6] {
        for t in ["rc", "uc", "ud"] {
            for ours in BOTH {
                let mut c = Combo::new(Group::Pingpong, Program::Pingpong(t), ours, gid);
                c.iters = 50;
                v.push(c);
            }
        }
    }
    for t in ["write_bw", "read_bw", "send_bw"] {
        for ours in BOTH {
            let mut c = Combo::new(Group::Loss, Program::Perf(t), ours, Gid::V4);
            c.loss = true;
            c.iters = 20;
            v.push(c);
        }
    }
    for ours in BOTH {
        let mut c = Combo::new(Group::Loss, Program::Pingpong("rc"), ours, Gid::V4);
        c.loss = true;
        c.iters = 50;
        v.push(c);
    }
    for (t, atomic) in PERFTESTS {
        if atomic == Some("CMP_AND_SWAP") {
            continue;
        }
        for ours in BOTH {
            let mut c = Combo::new(Group::Library, Program::Library(t), ours, Gid::V4);
            c.atomic = atomic;
            c.iters = iters_for(t);
            v.push(c);
        }
    }
    // rdma_cm: rping with its default size and with one of several
    // packets at either path MTU (RDMA READ and WRITE of FIRST/MIDDLE/LAST),
    // and the bandwidth tests whose connections rdma_cm sets up.
    for (gid, size) in [
        (Gid::V4, None),
        (Gid::V4, Some(RPING_LARGE)),
        (Gid::V6, None),
    ] {
        for ours in BOTH {
            let mut c = Combo::new(Group::RdmaCm, Program::Rping, ours, gid);
            c.size = size;
            c.iters = 10;
            v.push(c);
        }
    }
    for t in ["write_bw", "read_bw", "send_bw"] {
        for ours in BOTH {
            let mut c = Combo::new(Group::RdmaCm, Program::LibraryCm(t), ours, Gid::V4);
            c.iters = iters_for(t);
            v.push(c);
        }
    }
    for (t, atomic) in PERFTESTS {
        if atomic == Some("CMP_AND_SWAP") {
            continue;
        }
        let mut c = Combo::new(Group::Reference, Program::RxePair(t), Ours::Client, Gid::V4);
        c.atomic = atomic;
        c.iters = iters_for(t);
        v.push(c);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list, checked against the table: every perftest test
    /// and both atomics, both pingpongs' sides, both GIDs, several QPs, the
    /// sweeps and RC under loss — each with our side as server and as client.
    #[test]
    fn the_table_covers_every_required_combination() {
        for mtu in [1024, 4096] {
            let m = matrix(mtu);
            let has = |g: Group, name: &str, gid: Gid, ours: Ours| {
                m.iter().any(|c| {
                    c.group == g && c.program_name() == name && c.gid == gid && c.ours == ours
                })
            };
            for ours in BOTH {
                for gid in [Gid::V4, Gid::V6] {
                    for name in [
                        "write_bw",
                        "read_bw",
                        "send_bw",
                        "atomic_bw FAA",
                        "atomic_bw CAS",
                        "write_lat",
                        "read_lat",
                        "send_lat",
                        "atomic_lat FAA",
                        "rc_pingpong",
                        "uc_pingpong",
                        "ud_pingpong",
                    ] {
                        let g = if name.ends_with("pingpong") {
                            Group::Pingpong
                        } else {
                            Group::Perftest
                        };
                        assert!(has(g, name, gid, ours), "{name} {gid:?} {ours:?} at {mtu}");
                    }
                }
                for name in ["write_bw", "read_bw", "send_bw", "rc_pingpong"] {
                    assert!(has(Group::Loss, name, Gid::V4, ours), "{name} under loss");
                }
                assert!(has(Group::MultiQp, "write_bw", Gid::V4, ours));
                for t in [
                    "write_bw",
                    "read_bw",
                    "send_bw",
                    "atomic_bw",
                    "write_lat",
                    "read_lat",
                    "send_lat",
                    "atomic_lat",
                ] {
                    let name = format!("ib_{t} on libibverbs.so.1");
                    let name = if t.starts_with("atomic") {
                        format!("{name} FAA")
                    } else {
                        name
                    };
                    assert!(has(Group::Library, &name, Gid::V4, ours), "{name}");
                }
                assert!(has(Group::Sweep, "write_bw", Gid::V4, ours));
                for name in [
                    "rping".to_string(),
                    format!("rping -S {RPING_LARGE}"),
                    "ib_write_bw -R on librdmacm.so.1".into(),
                ] {
                    assert!(has(Group::RdmaCm, &name, Gid::V4, ours), "{name}");
                }
                assert!(has(Group::RdmaCm, "rping", Gid::V6, ours));
                assert_eq!(
                    has(Group::Sweep, "send_lat", Gid::V4, ours),
                    mtu == 4096,
                    "latency sweeps at 4096 only"
                );
            }
            assert!(m.iter().all(|c| c.iters >= 5), "perftest's minimum");
            assert!(m.iter().filter(|c| c.loss).all(|c| c.group == Group::Loss));
        }
    }
}
