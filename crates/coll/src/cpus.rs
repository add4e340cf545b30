//! Whether the ranks of one host outnumber the CPUs they may run on. Then a
//! rank that waits yields its CPU: spinning, it would hold a core that
//! another rank of the host needs to make the progress it waits for.
//!
//! Each rank tells the others its host (the kernel's boot ID), the CPUs it
//! may run on (its affinity mask) and, where a CPU quota (a cgroup's
//! `cpu.max`, as `docker --cpus`) allows it fewer than its mask has, that
//! number; the ranks of a host are oversubscribed when they are more than
//! the CPUs in the union of their masks, or than the smallest quota among
//! them. Under `mpirun --bind-to core` each rank may run on one CPU of its
//! own — two ranks, two CPUs, no need to yield — where this process's own
//! count (`available_parallelism`: one) would have said yield, a system
//! call in every turn of every wait.

/// Words of the affinity mask: 1024 CPUs, glibc's `cpu_set_t`.
const WORDS: usize = 16;
/// Bytes of a placement on the wire.
const LEN: usize = 16 + 8 * WORDS + 4;

/// Where one rank runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The host: its boot ID (all zeros if unknown: a host of its own).
    host: [u8; 16],
    /// The CPUs the rank may run on.
    cpus: [u64; WORDS],
    /// The CPUs a quota lets it use, where fewer than its mask has
    /// (`u32::MAX`: no such limit).
    quota: u32,
}

impl Placement {
    /// This process's placement.
    pub(crate) fn of_this_process() -> Placement {
        let mut cpus = [0u64; WORDS];
        // SAFETY: `cpus` is `size_of_val(&cpus)` bytes, writable, and that
        // size is what the call is told; pid 0 is the calling thread.
        let r = unsafe {
            libc::sched_getaffinity(0, std::mem::size_of_val(&cpus), cpus.as_mut_ptr().cast())
        };
        if r != 0 {
            // Unknown (more than 1024 CPUs?): as many as the process may use.
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            for c in 0..n.min(64 * WORDS) {
                cpus[c / 64] |= 1 << (c % 64);
            }
        }
        // `available_parallelism` is the smaller of the mask's count and
        // the cgroup's CPU quota: smaller than the mask, it is the quota.
        let in_mask = cpus.iter().map(|w| w.count_ones()).sum::<u32>();
        let quota = std::thread::available_parallelism()
            .map_or(u32::MAX, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
        Placement {
            host: boot_id().unwrap_or_default(),
            cpus,
            quota: if quota < in_mask { quota } else { u32::MAX },
        }
    }

    pub(crate) fn to_bytes(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..16].copy_from_slice(&self.host);
        for (w, c) in b[16..LEN - 4].chunks_exact_mut(8).zip(&self.cpus) {
            w.copy_from_slice(&c.to_le_bytes());
        }
        b[LEN - 4..].copy_from_slice(&self.quota.to_le_bytes());
        b
    }

    /// A placement from another rank's bytes; one of another length (which
    /// a rank of this build never sends) is a host of its own with no CPU.
    pub(crate) fn from_bytes(b: &[u8]) -> Placement {
        let mut p = Placement {
            host: [0; 16],
            cpus: [0; WORDS],
            quota: u32::MAX,
        };
        if b.len() == LEN {
            p.host.copy_from_slice(&b[..16]);
            for (c, w) in p.cpus.iter_mut().zip(b[16..LEN - 4].chunks_exact(8)) {
                *c = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            }
            p.quota = u32::from_le_bytes(b[LEN - 4..].try_into().expect("4 bytes"));
        }
        p
    }

    /// Whether this rank's host is known (it has a boot ID).
    pub(crate) fn host_known(&self) -> bool {
        self.host != [0; 16]
    }
}

/// Whether the ranks on `rank`'s host are more than the CPUs they may run
/// on between them (the union of their masks, or the smallest quota among
/// them if smaller). A rank whose host is unknown counts as alone on it
/// (the caller then asks the launcher how many share it).
pub(crate) fn oversubscribed(all: &[Placement], rank: usize) -> bool {
    let Some(me) = all.get(rank) else {
        return false;
    };
    let mut union = [0u64; WORDS];
    let mut quota = u32::MAX;
    let mut ranks = 0usize;
    for (r, p) in all.iter().enumerate() {
        if r == rank || (me.host_known() && p.host == me.host) {
            ranks += 1;
            quota = quota.min(p.quota);
            for (u, c) in union.iter_mut().zip(&p.cpus) {
                *u |= c;
            }
        }
    }
    let cpus = union.iter().map(|w| w.count_ones() as usize).sum::<usize>();
    ranks > cpus.min(quota as usize)
}

/// The kernel's boot ID: one per running host (a container or network
/// namespace of the host shares it, and its CPUs).
fn boot_id() -> Option<[u8; 16]> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: Vec<u8> = s
        .trim()
        .bytes()
        .filter(|c| *c != b'-')
        .map(|c| (c as char).to_digit(16).map(|d| d as u8))
        .collect::<Option<_>>()?;
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = hex[2 * i] << 4 | hex[2 * i + 1];
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(host: u8, cpus: &[usize]) -> Placement {
        let mut p = Placement {
            host: [host; 16],
            cpus: [0; WORDS],
            quota: u32::MAX,
        };
        for &c in cpus {
            p.cpus[c / 64] |= 1 << (c % 64);
        }
        p
    }

    #[test]
    fn ranks_bound_to_cores_of_their_own_do_not_yield() {
        // mpirun -np 2 --bind-to core on a 2-CPU host.
        let all = [at(1, &[0]), at(1, &[1])];
        assert!(!oversubscribed(&all, 0) && !oversubscribed(&all, 1));
        // Unbound: both may run on both.
        let all = [at(1, &[0, 1]), at(1, &[0, 1])];
        assert!(!oversubscribed(&all, 0));
    }

    #[test]
    fn more_ranks_than_cpus_yield() {
        let all = [at(1, &[0, 1]), at(1, &[0, 1]), at(1, &[0, 1])];
        assert!((0..3).all(|r| oversubscribed(&all, r)));
        // Two bound to the same core.
        let all = [at(1, &[0]), at(1, &[0])];
        assert!(oversubscribed(&all, 1));
    }

    #[test]
    fn a_quota_below_the_mask_counts() {
        // docker --cpus=2 on a 4-CPU host: every rank may run on all four,
        // but together they get two.
        let q = |mut p: Placement| {
            p.quota = 2;
            p
        };
        let all = [
            q(at(1, &[0, 1, 2, 3])),
            q(at(1, &[0, 1, 2, 3])),
            q(at(1, &[0, 1, 2, 3])),
        ];
        assert!(oversubscribed(&all, 0));
        assert!(!oversubscribed(&all[..2], 0));
    }

    #[test]
    fn only_ranks_of_the_same_host_count() {
        // Each host runs two ranks on its two CPUs.
        let all = [
            at(1, &[0, 1]),
            at(1, &[0, 1]),
            at(2, &[0, 1]),
            at(2, &[0, 1]),
        ];
        assert!((0..4).all(|r| !oversubscribed(&all, r)));
        // An unknown host is a host of its own: its rank is alone there.
        let all = [at(0, &[0]), at(0, &[0])];
        assert!(!oversubscribed(&all, 0));
    }

    #[test]
    fn placements_cross_the_wire_unchanged() {
        let mut p = at(7, &[0, 63, 64, 1023]);
        assert_eq!(Placement::from_bytes(&p.to_bytes()), p);
        p.quota = 3;
        assert_eq!(Placement::from_bytes(&p.to_bytes()), p);
        // Bytes of another length: a host of its own, no CPU.
        assert_eq!(Placement::from_bytes(&[1, 2, 3]), at(0, &[]));
        let me = Placement::of_this_process();
        assert!(
            me.cpus.iter().any(|w| *w != 0),
            "this process runs somewhere"
        );
        assert_ne!(me.host, [0; 16], "Linux has a boot ID");
    }
}
