//! Does the memory an application registers exist, with the access it
//! asks for?
//!
//! A kernel provider pins a region's pages with `get_user_pages`, which
//! fails with EFAULT when part of the range is not mapped, or not writable
//! while the access flags need writing (`ib_access_writable`: LOCAL_WRITE,
//! REMOTE_WRITE, REMOTE_ATOMIC, MW_BIND). softrdma pins nothing, so it
//! checks the same thing in the VMAs the kernel walks: the process's
//! mappings in `/proc/self/maps`, which give each range's permissions.
//! The alternatives answer less: `process_vm_readv` on our own pid probes
//! readability without faulting but says nothing about writability (and
//! probing that by writing back would race with the application), and
//! `mincore` reports residency, not permissions.
//!
//! The check is a snapshot at registration, as the kernel's is for
//! permissions; what it cannot do is what pinning does: keep the pages
//! there. Unmapping registered memory stays the application's error, as it
//! is with every provider's contract (the memory must stay valid until the
//! region is deregistered and its work has completed).

use crate::ffi::{Fail, Res};

/// `IBV_ACCESS_*` bits for which the kernel pins pages for writing.
const WRITABLE: u32 = 1 | 2 | 8 | 16; // LOCAL_WRITE | REMOTE_WRITE | REMOTE_ATOMIC | MW_BIND

/// Whether `access` needs the pages writable.
pub fn needs_write(access: u32) -> bool {
    access & WRITABLE != 0
}

/// Check that `[addr, addr + len)` is mapped readable, and writable if
/// `write`: EFAULT naming the first byte that is not, otherwise.
pub fn check(addr: u64, len: u64, write: bool) -> Res<()> {
    if len == 0 {
        return Ok(());
    }
    let end = addr
        .checked_add(len)
        .ok_or_else(|| Fail::inval("addr + length overflows the address space"))?;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| Fail::new(libc::EFAULT, format!("cannot read /proc/self/maps: {e}")))?;
    check_in(&maps, addr, end, write)
}

/// [`check`] against a given `/proc/<pid>/maps` text (sorted by address, as
/// the kernel writes it).
fn check_in(maps: &str, addr: u64, end: u64, write: bool) -> Res<()> {
    let mut cur = addr;
    for line in maps.lines() {
        let Some((start, stop, perms)) = parse(line) else {
            continue;
        };
        if stop <= cur {
            continue;
        }
        if start > cur {
            break; // a hole at `cur`
        }
        let (r, w) = (perms.as_bytes()[0] == b'r', perms.as_bytes()[1] == b'w');
        if !r || (write && !w) {
            let need = if write {
                "readable and writable"
            } else {
                "readable"
            };
            return Err(Fail::new(
                libc::EFAULT,
                format!(
                    "{cur:#x} (in {addr:#x}..{end:#x}) is mapped {perms}, not {need}{}",
                    if write {
                        " (LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC and MW_BIND write)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        cur = stop;
        if cur >= end {
            return Ok(());
        }
    }
    Err(Fail::new(
        libc::EFAULT,
        format!("{cur:#x} (in {addr:#x}..{end:#x}) is not mapped"),
    ))
}

/// `start-end perms …` → (start, end, perms).
fn parse(line: &str) -> Option<(u64, u64, &str)> {
    let mut w = line.split_ascii_whitespace();
    let (a, b) = w.next()?.split_once('-')?;
    let perms = w.next()?;
    if perms.len() < 2 {
        return None;
    }
    Some((
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
        perms,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
1000-3000 rw-p 00000000 00:00 0
3000-4000 r--p 00000000 00:00 0
4000-5000 rw-p 00000000 00:00 0
6000-7000 ---p 00000000 00:00 0
7000-8000 rw-s 00000000 00:00 0  /dev/shm/x
";

    fn errno(r: Res<()>) -> i32 {
        r.err().map_or(0, |f| f.errno)
    }

    #[test]
    fn ranges_across_mappings() {
        assert_eq!(errno(check_in(MAPS, 0x1000, 0x3000, true)), 0);
        assert_eq!(errno(check_in(MAPS, 0x1800, 0x5000, false)), 0);
        assert_eq!(errno(check_in(MAPS, 0x2fff, 0x3001, true)), libc::EFAULT);
        assert_eq!(
            errno(check_in(MAPS, 0x4000, 0x5001, false)),
            libc::EFAULT,
            "hole"
        );
        assert_eq!(
            errno(check_in(MAPS, 0x6000, 0x6001, false)),
            libc::EFAULT,
            "PROT_NONE"
        );
        assert_eq!(errno(check_in(MAPS, 0x7000, 0x8000, true)), 0);
        assert_eq!(errno(check_in(MAPS, 0x0, 0x10, false)), libc::EFAULT);
        assert_eq!(errno(check_in(MAPS, 0x9000, 0x9001, false)), libc::EFAULT);
        let e = check_in(MAPS, 0x2000, 0x3800, true).unwrap_err();
        assert_eq!(
            e.why,
            "0x3000 (in 0x2000..0x3800) is mapped r--p, not readable and writable \
             (LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC and MW_BIND write)"
        );
    }

    #[test]
    fn overflow_is_invalid() {
        assert_eq!(errno(check(u64::MAX - 1, 4, false)), libc::EINVAL);
        assert_eq!(errno(check(0, 0, true)), 0);
    }
}
