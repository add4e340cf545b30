//! Moving registered memory into the arena so that peers can map it.
//!
//! A registration's whole pages (the page-aligned interior of its range)
//! are replaced, at the same virtual addresses, by a shared mapping of an
//! arena extent holding the same bytes: the application and the engine
//! keep using the addresses they had, and a peer process that maps the
//! segment reaches the same physical pages. Only private anonymous memory
//! (the heap, `malloc`/`mmap` buffers) is moved; file mappings, shared or
//! huge-page memory and the stack are left alone (their regions are then
//! reached through the packet path, as over UDP).
//!
//! The move is atomic for readers: the bytes are copied into a shared
//! mapping made elsewhere, which `mremap` then puts in place of the old
//! pages in one step. A write another thread makes to those pages between
//! the copy and the `mremap` (a few microseconds per MiB, during the
//! registration call) would be lost; registering memory that another
//! thread is writing at that moment is the one thing this transport does
//! not support (docs/DESIGN.md). Deregistration moves the bytes back the
//! same way, so the application's memory is private anonymous memory again
//! and the arena extent is freed.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::RawFd;

use crate::seg::{ARENA_LEN, ARENA_OFF, PAGE};

/// A moved range: `[lo, hi)` of our address space is arena `[off, off + hi - lo)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub lo: u64,
    pub hi: u64,
    pub off: u64,
}

struct Extent {
    hi: u64,
    off: u64,
    refs: u32,
}

/// The arena's allocator and the moved extents.
pub struct Shares {
    /// Free arena ranges: offset → length.
    free: BTreeMap<u64, u64>,
    /// Moved extents by start address.
    extents: BTreeMap<u64, Extent>,
    /// Arena ranges of unshared extents, until a sweep finds that no
    /// stopped peer may still write them (see `Host::withdraw_mr`):
    /// neither punched nor reused meanwhile.
    quarantined: Vec<(u64, u64)>,
}

impl Default for Shares {
    fn default() -> Self {
        let mut free = BTreeMap::new();
        free.insert(0, ARENA_LEN);
        Shares {
            free,
            extents: BTreeMap::new(),
            quarantined: Vec::new(),
        }
    }
}

impl Shares {
    fn alloc(&mut self, len: u64) -> Option<u64> {
        let (&off, &flen) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        Some(off)
    }

    fn release(&mut self, mut off: u64, mut len: u64) {
        if let Some((&p, &pl)) = self.free.range(..off).next_back() {
            if p + pl == off {
                self.free.remove(&p);
                off = p;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nl;
        }
        self.free.insert(off, len);
    }

    /// The moved extent holding byte `addr`: its range and arena offset.
    pub fn extent_of(&self, addr: u64) -> Option<(u64, u64, u64)> {
        let (&elo, e) = self.extents.range(..=addr).next_back()?;
        (addr < e.hi).then_some((elo, e.hi, e.off))
    }

    /// Where `[addr, addr + len)` lies in the arena, if it lies wholly
    /// inside one moved extent.
    pub fn arena_of(&self, addr: u64, len: u64) -> Option<u64> {
        let (&elo, e) = self.extents.range(..=addr).next_back()?;
        (addr.checked_add(len)? <= e.hi).then_some(e.off + (addr - elo))
    }

    /// Move the whole pages of `[addr, addr + len)` into the arena (or
    /// find them moved already by an earlier registration of the same
    /// pages). None if the range has no whole page or is not all private
    /// anonymous writable memory, or overlaps a moved extent without lying
    /// inside it.
    pub fn share(&mut self, fd: RawFd, addr: u64, len: u64) -> Option<Share> {
        let lo = addr.checked_add(PAGE - 1)? & !(PAGE - 1);
        let hi = addr.checked_add(len)? & !(PAGE - 1);
        if hi <= lo {
            return None;
        }
        if let Some((&elo, e)) = self.extents.range_mut(..hi).next_back() {
            if e.hi > lo {
                if elo <= lo && hi <= e.hi {
                    e.refs += 1;
                    return Some(Share {
                        lo,
                        hi,
                        off: e.off + (lo - elo),
                    });
                }
                return None;
            }
        }
        if !private_anonymous(lo, hi) {
            return None;
        }
        let n = hi - lo;
        let off = self.alloc(n)?;
        // SAFETY: [lo, hi) is, as just checked, private anonymous writable
        // memory of this process, and lies inside the region the caller is
        // registering, whose memory the caller vouches for (it stays mapped
        // for the registration's life). `move_pages` replaces it by pages
        // with the same contents.
        match unsafe { move_into(fd, lo, n, ARENA_OFF + off) } {
            Ok(()) => {
                self.extents.insert(lo, Extent { hi, off, refs: 1 });
                Some(Share { lo, hi, off })
            }
            Err(_) => {
                self.release(off, n);
                None
            }
        }
    }

    /// Free the arena ranges `unshare` gave up that no late access can
    /// reach any more (`late(off, len)` says whether one still can); the
    /// others stay out of use until a later sweep.
    pub fn sweep(&mut self, fd: RawFd, late: &dyn Fn(u64, u64) -> bool) {
        for (off, n) in std::mem::take(&mut self.quarantined) {
            if late(off, n) {
                self.quarantined.push((off, n));
            } else {
                self.free_arena(fd, off, n);
            }
        }
    }

    /// Drop one reference to the extent `s` lies in; the last one moves
    /// the bytes back to private memory (if the application still has the
    /// extent mapped where we put it) and hands the arena extent to the
    /// next [`Shares::sweep`], which frees it unless a stopped peer may
    /// still write into it.
    pub fn unshare(&mut self, s: Share) {
        let Some((&elo, e)) = self.extents.range_mut(..=s.lo).next_back() else {
            return;
        };
        if e.hi < s.hi {
            return;
        }
        e.refs -= 1;
        if e.refs > 0 {
            return;
        }
        let (hi, off) = (e.hi, e.off);
        self.extents.remove(&elo);
        let n = hi - elo;
        if still_ours(elo, hi, ARENA_OFF + off) {
            // SAFETY: [elo, hi) is still our shared mapping of the arena
            // (checked just now in /proc/self/maps), which the application
            // registered; replacing it by private pages with the same bytes
            // changes no byte it can see.
            if unsafe { move_out(elo, n) }.is_err() {
                // Still the application's memory: the extent must keep its
                // bytes and must not be handed to another region. Leaked
                // (the failure is the kernel's: out of memory for the copy).
                return;
            }
        }
        // The application's bytes are private again (above); a late write
        // lands in arena pages nobody else is given before the sweep.
        self.quarantined.push((off, n));
    }

    fn free_arena(&mut self, fd: RawFd, off: u64, n: u64) {
        // SAFETY: plain system call on our memfd; peers no longer reach this
        // range (every region in it was withdrawn first, and no access
        // begun before is still inside: `sweep`'s `late` said so).
        unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (ARENA_OFF + off) as libc::off_t,
                n as libc::off_t,
            )
        };
        self.release(off, n);
    }
}

/// One line of /proc/self/maps.
struct Vma<'a> {
    lo: u64,
    hi: u64,
    perms: &'a str,
    off: u64,
    inode: u64,
    path: &'a str,
}

fn vmas(maps: &str) -> impl Iterator<Item = Vma<'_>> {
    maps.lines().filter_map(|l| {
        let mut it = l.split_ascii_whitespace();
        let range = it.next()?;
        let perms = it.next()?;
        let off = u64::from_str_radix(it.next()?, 16).ok()?;
        let _dev = it.next()?;
        let inode = it.next()?.parse().ok()?;
        let path = it.next().unwrap_or("");
        let (a, b) = range.split_once('-')?;
        Some(Vma {
            lo: u64::from_str_radix(a, 16).ok()?,
            hi: u64::from_str_radix(b, 16).ok()?,
            perms,
            off,
            inode,
            path,
        })
    })
}

/// Whether `[lo, hi)` is covered, without a hole, by mappings satisfying `ok`.
fn covered(lo: u64, hi: u64, mut ok: impl FnMut(&Vma<'_>) -> bool) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let mut at = lo;
    for v in vmas(&maps) {
        if v.hi <= at {
            continue;
        }
        if v.lo > at || !ok(&v) {
            return false;
        }
        at = v.hi;
        if at >= hi {
            return true;
        }
    }
    false
}

fn private_anonymous(lo: u64, hi: u64) -> bool {
    covered(lo, hi, |v| {
        v.perms == "rw-p" && v.inode == 0 && (v.path.is_empty() || v.path == "[heap]")
    })
}

fn still_ours(lo: u64, hi: u64, file_off: u64) -> bool {
    covered(lo, hi, |v| {
        v.perms.starts_with("rw-s")
            && v.path.starts_with("/memfd:softrdma-shm")
            && v.off.wrapping_sub(file_off) == v.lo.wrapping_sub(lo)
    })
}

/// Replace `[lo, lo + n)` by a shared mapping of `fd` at `file_off` holding
/// the same bytes.
///
/// # Safety
/// `[lo, lo + n)` must be page-aligned writable memory of this process
/// that nothing else relies on being private (see the module docs).
unsafe fn move_into(fd: RawFd, lo: u64, n: u64, file_off: u64) -> io::Result<()> {
    let tmp = raw_mmap(n, Some((fd, file_off as libc::off_t)))?;
    // SAFETY: `lo..lo+n` is readable (caller) and `tmp` is a fresh mapping
    // of n bytes: distinct ranges.
    unsafe { std::ptr::copy_nonoverlapping(lo as *const u8, tmp.cast::<u8>(), n as usize) };
    // SAFETY: tmp is ours; lo as the caller promised.
    unsafe { place(tmp, lo, n) }
}

/// Replace `[lo, lo + n)` by private anonymous memory holding the same bytes.
///
/// # Safety
/// As for [`move_into`].
unsafe fn move_out(lo: u64, n: u64) -> io::Result<()> {
    let tmp = raw_mmap(n, None)?;
    // SAFETY: as in `move_into`.
    unsafe { std::ptr::copy_nonoverlapping(lo as *const u8, tmp.cast::<u8>(), n as usize) };
    // SAFETY: as in `move_into`.
    unsafe { place(tmp, lo, n) }
}

// The moves below are system calls made directly, not through libc's
// `mmap`/`mremap`/`munmap`: memory-event hooks (UCX's ucm, Open MPI's
// patcher, libfabric's memory monitors) interpose on those wrappers to
// learn when an application's memory goes away, and would hear the move
// as an unmap of the application's buffer, which it is not (the same
// addresses keep the same bytes). UCX then invalidated its registration
// cache entry for the buffer it had just registered, and `ucp_put_lat`
// over shared memory never finished (docs/INTEROP.md, UCX).

/// A new read-write mapping of `n` bytes where the kernel picks: of `fd`
/// at the offset, shared, or private anonymous memory.
fn raw_mmap(n: u64, file: Option<(RawFd, libc::off_t)>) -> io::Result<*mut libc::c_void> {
    let (flags, fd, off) = match file {
        Some((fd, off)) => (libc::MAP_SHARED, fd, off),
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0),
    };
    // SAFETY: mmap with a null hint and without MAP_FIXED makes a new
    // mapping and touches no existing memory; its arguments are plain
    // values.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            std::ptr::null_mut::<libc::c_void>(),
            n as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            off,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as *mut libc::c_void)
}

/// Move the mapping at `tmp` to `lo`, replacing what was there in one step.
///
/// # Safety
/// `tmp` is a mapping of `n` bytes we made; `lo` as for [`move_into`].
unsafe fn place(tmp: *mut libc::c_void, lo: u64, n: u64) -> io::Result<()> {
    // SAFETY: moves our mapping `tmp` over `lo..lo+n`, which the caller
    // lets us replace.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mremap,
            tmp,
            n as usize,
            n as usize,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            lo as *mut libc::c_void,
        )
    };
    if r == -1 {
        let e = io::Error::last_os_error();
        // SAFETY: tmp is still our mapping of n bytes (mremap failed), and
        // nothing else refers to it.
        unsafe { libc::syscall(libc::SYS_munmap, tmp, n as usize) };
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_allocator_merges_what_it_frees() {
        let mut s = Shares::default();
        let a = s.alloc(PAGE).unwrap();
        let b = s.alloc(2 * PAGE).unwrap();
        let c = s.alloc(PAGE).unwrap();
        assert_eq!((a, b, c), (0, PAGE, 3 * PAGE));
        s.release(b, 2 * PAGE);
        s.release(a, PAGE);
        assert_eq!(s.free.get(&0), Some(&(3 * PAGE)));
        s.release(c, PAGE);
        assert_eq!(s.free.len(), 1);
        assert_eq!(s.free.get(&0), Some(&ARENA_LEN));
    }

    use std::sync::atomic::{AtomicU64, Ordering};

    /// The target of the last call of libc's `mremap` in this binary
    /// (this definition takes the symbol's place, as a memory-event hook
    /// such as UCX's does; it forwards to the system call).
    static HOOKED: AtomicU64 = AtomicU64::new(0);

    #[no_mangle]
    extern "C" fn mremap(
        old: *mut libc::c_void,
        old_len: usize,
        new_len: usize,
        flags: libc::c_int,
        new: *mut libc::c_void,
    ) -> *mut libc::c_void {
        HOOKED.store(new as u64, Ordering::SeqCst);
        // SAFETY: forwards the caller's arguments unchanged.
        unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new) as *mut _ }
    }

    /// Sharing a buffer and unsharing it keep its bytes and addresses, and
    /// go past libc's `mremap`: a memory-event hook there would report the
    /// application's buffer as unmapped (UCX then dropped its registration
    /// and `ucp_put_lat` over shared memory never finished).
    #[test]
    fn moving_pages_keeps_the_bytes_and_is_not_seen_by_memory_hooks() {
        let n = 4 * PAGE;
        let buf = raw_mmap(n, None).unwrap() as u64;
        let bytes = |b: u64| {
            (0..n)
                .map(move |i| (i as u8) ^ (b as u8))
                .collect::<Vec<u8>>()
        };
        // SAFETY: buf is our fresh mapping of n bytes.
        let mem = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n as usize) };
        mem.copy_from_slice(&bytes(7));
        // SAFETY: a fresh memfd, ours.
        let fd = unsafe { libc::memfd_create(c"softrdma-shm-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: our memfd; a sparse length covering the arena.
        assert_eq!(
            unsafe { libc::ftruncate(fd, (ARENA_OFF + ARENA_LEN) as libc::off_t) },
            0
        );
        let mut shares = Shares::default();
        let sh = shares
            .share(fd, buf, n)
            .expect("private anonymous pages are shared");
        assert_eq!((sh.lo, sh.hi), (buf, buf + n));
        assert!(still_ours(buf, buf + n, ARENA_OFF + sh.off));
        assert_eq!(mem, &bytes(7)[..]);
        mem[5] = 0xee;
        shares.unshare(sh);
        shares.sweep(fd, &|_, _| false);
        assert!(private_anonymous(buf, buf + n));
        assert_eq!(mem[5], 0xee);
        let hooked = HOOKED.load(Ordering::SeqCst);
        assert!(
            !(buf..buf + n).contains(&hooked),
            "libc's mremap moved the application's buffer at {hooked:#x}"
        );
        // SAFETY: our mapping and descriptor, no longer used.
        unsafe {
            libc::syscall(libc::SYS_munmap, buf, n as usize);
            libc::close(fd);
        }
    }

    #[test]
    fn parses_proc_maps_lines() {
        let m = "7f00-7f10 rw-p 00000000 00:00 0 \n7f10-7f20 rw-s 00200000 00:01 1234 /memfd:softrdma-shm (deleted)\n";
        let v: Vec<_> = vmas(m).collect();
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].lo, v[0].hi, v[0].perms, v[0].path),
            (0x7f00, 0x7f10, "rw-p", "")
        );
        assert_eq!((v[1].off, v[1].inode), (0x200000, 1234));
        assert!(v[1].path.starts_with("/memfd:softrdma-shm"));
    }
}
