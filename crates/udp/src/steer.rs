//! Sharing one address and UDP port 4791 between processes, the way
//! processes share an RNIC — without privileges.
//!
//! RoCEv2 has one well-known port, so every softrdma process on a host that
//! uses the same IP address must receive on the same `addr:4791`. The kernel
//! lets several sockets of one user bind it with `SO_REUSEPORT` and picks one
//! member per datagram; a classic-BPF program attached to the group
//! (`SO_ATTACH_REUSEPORT_CBPF`, open to any user) makes the pick by
//! destination QP instead of a hash. See [`crate::cbpf`] for the programs.
//!
//! * **QPN slots.** The top 8 bits of the 24-bit QPN name a slot. A port
//!   owns one slot `s` in `1..=255` and its QPs are
//!   `s << 16 ..= s << 16 | 0xffff`. Slot 0 (QP1, the GSI) is never claimed.
//! * **Indices, not sockets.** A classic program can only return an index
//!   into the group's socket array, and the kernel keeps that array compact:
//!   a joining socket is appended, a leaving one is replaced by the last
//!   (`__reuseport_detach_sock`). So the program is a table slot → index,
//!   rebuilt and re-attached whenever the array changes.
//! * **Finding the indices.** Nothing reports a member's index. It is
//!   measured: every member has a socket filter that drops steering probes
//!   carrying the group's secret; a probe for index `i` sent to `addr:4791`
//!   is steered by the program to the socket at `i`, dropped there, and the
//!   kernel's drop counter of exactly that socket goes up in the socket
//!   listing any user may read (`sock_diag`, see [`crate::listing`]). One probe per index gives the
//!   whole array, with no help from the other processes, alive or stuck.
//! * **QP1.** Communication management MADs (the GSI, QP1) go to the
//!   member listening on the service a REQ names, and every reply to the
//!   member whose slot is the top byte of the communication ID it names
//!   (see [`crate::cbpf`]'s `gsi`). A member registers what it listens on
//!   ([`Joined::listen`]); its listeners go with it.
//! * **State.** `<runtime dir>/<addr>-<port>.steer` lists the members
//!   (slot, socket inode, pid), their listeners and the secret; `<addr>-<port>.lock` is
//!   `flock`ed around every change (join, leave, repair), so the array only
//!   changes under the lock — except by a death.
//! * **Join:** bind (appended last), measure, claim the lowest free slot,
//!   attach the new table, write the state. **Leave:** measure, attach the
//!   table the array will have without us (the last member moved into our
//!   index), close, write the state — unless the measurement or the attach
//!   failed: then the state keeps us, as after a death (below), so that the
//!   others repair.
//! * **Death without cleanup** (SIGKILL, crash): the kernel removes the
//!   socket and moves the last member into its index, and nobody updates
//!   the table. The moved member's datagrams then go to the dead slot's old
//!   index or are hashed to some member. The first datagram a member gets
//!   for a slot the state says another live member owns is the evidence: it
//!   compares the group the kernel lists with the state, and if they
//!   differ repairs the table (measure, attach, write) under the lock. Until
//!   then the moved member's datagrams are lost (RC retransmits them); no
//!   member is ever handed another's datagrams (each checks the slot).
//!   Datagrams for unowned slots are hashed to a member and dropped there.
//!
//! Processes of different users cannot share: the kernel joins a socket to
//! a reuseport group only if its owner's uid matches
//! (`udp_reuseport_add_sock`), and refuses the bind otherwise
//! (`udp_lib_lport_inuse`), so another user can neither join nor replace
//! the program; the state files sit in the user's own runtime directory,
//! checked by [`crate::rundir`].

use crate::cbpf;
use crate::listing::{self, Table};
use crate::rundir;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Slots a process may claim.
pub const SLOTS: std::ops::RangeInclusive<u8> = 1..=255;

/// The directory of the state files by default: the user's runtime
/// directory (see [`crate::rundir`]).
pub fn default_state_dir() -> PathBuf {
    rundir::default_dir()
}

/// How a port receives its share of `addr:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steering {
    /// Steering by QPN slot in a group described by this state file.
    Shared { state: PathBuf },
    /// This port owns the address and port alone. `why` says why sharing was
    /// not set up when it was asked for.
    Exclusive { why: Option<String> },
}

/// Why joining failed.
pub(crate) enum JoinError {
    /// The state directory is not usable here; the caller may fall back to
    /// exclusive mode.
    Unavailable(io::Error),
    Failed(io::Error),
}

/// A member as the state file records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Member {
    slot: u8,
    inode: u64,
    pid: u32,
}

/// A member's listener: the low 32 bits of a CM service ID (port space and
/// port) whose REQs and SIDR_REQs the member takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Listener {
    slot: u8,
    service: u32,
}

/// The state file's content.
#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    secret: [u8; 8],
    members: Vec<Member>,
    listeners: Vec<Listener>,
    /// The group's socket array (each index's socket inode) as the member
    /// that last changed the group measured it, or empty. Valid while the
    /// kernel lists exactly these sockets in the group: the array changes
    /// only when a socket joins (appended) or leaves (the last moves into
    /// its place), and either changes the set. A member that listens can
    /// then re-steer without measuring (a probe per socket, a millisecond
    /// or more), which keeps the window in which a REQ for a service just
    /// listened on still meets "nobody listens" short.
    array: Vec<Option<u64>>,
}

const MAGIC: &str = "softrdma-steer 2";

impl State {
    fn parse(text: &str) -> Option<State> {
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let hex = lines.next()?.strip_prefix("secret ")?;
        let v = u64::from_str_radix(hex, 16).ok()?;
        let mut members = Vec::new();
        let mut listeners = Vec::new();
        let mut array = Vec::new();
        for l in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["array", socks @ ..] if array.is_empty() => {
                    for x in socks {
                        array.push(match *x {
                            "-" => None,
                            i => Some(i.parse().ok()?),
                        });
                    }
                }
                ["member", slot, inode, pid] => members.push(Member {
                    slot: slot.parse().ok()?,
                    inode: inode.parse().ok()?,
                    pid: pid.parse().ok()?,
                }),
                ["listen", slot, service] => listeners.push(Listener {
                    slot: slot.parse().ok()?,
                    service: u32::from_str_radix(service, 16).ok()?,
                }),
                _ => return None,
            }
        }
        Some(State {
            secret: v.to_be_bytes(),
            members,
            listeners,
            array,
        })
    }

    /// The group program for the socket array `array`: the members' slots,
    /// and the listeners of the members in it.
    fn program(&self, array: &[Option<u64>]) -> io::Result<Vec<cbpf::Insn>> {
        let table = table_for(array, &self.members);
        let listeners: Vec<(u32, u16)> = self
            .listeners
            .iter()
            .filter_map(|l| {
                let &(_, i) = table.iter().find(|&&(s, _)| s == l.slot)?;
                Some((l.service, i))
            })
            .collect();
        cbpf::group_program(self.secret, &table, &listeners)
    }

    /// Keep only the listeners of members still present.
    fn prune_listeners(&mut self) {
        let members = &self.members;
        self.listeners
            .retain(|l| members.iter().any(|m| m.slot == l.slot));
    }

    #[cfg(test)]
    fn format(&self) -> String {
        self.format_members() + &self.format_listeners()
    }

    fn format_members(&self) -> String {
        let mut s = format!("{MAGIC}\nsecret {:016x}\n", u64::from_be_bytes(self.secret));
        for m in &self.members {
            s.push_str(&format!("member {} {} {}\n", m.slot, m.inode, m.pid));
        }
        if !self.array.is_empty() {
            s.push_str("array");
            for x in &self.array {
                match x {
                    Some(i) => s.push_str(&format!(" {i}")),
                    None => s.push_str(" -"),
                }
            }
            s.push('\n');
        }
        s
    }

    fn format_listeners(&self) -> String {
        let mut s = String::new();
        for l in &self.listeners {
            s.push_str(&format!("listen {} {:08x}\n", l.slot, l.service));
        }
        s
    }
}

fn random_secret() -> io::Result<[u8; 8]> {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(b)
}

/// What a member knows of the group, refreshed when the state file changes.
struct View {
    version: Option<(u64, u64, i64, i64)>,
    owned: [bool; 256],
    inodes: Vec<u64>,
}

/// A joined group.
pub(crate) struct Joined {
    pub(crate) slot: u8,
    addr: SocketAddr,
    inode: u64,
    lock_path: PathBuf,
    pub(crate) state_path: PathBuf,
    view: View,
    table: Table,
    /// Table repairs this port made after finding the group changed.
    pub(crate) repairs: u64,
    /// The socket array as this member last measured or used it: still
    /// the array while the kernel lists the same sockets (see
    /// `State::array`). Saves `listen` a measurement (a probe per index) —
    /// which a connection request racing a listener's registration would
    /// otherwise wait out.
    known: Option<Vec<Option<u64>>>,
}

fn paths(dir: &Path, addr: SocketAddr) -> (PathBuf, PathBuf) {
    let stem = format!("{}-{}", addr.ip(), addr.port());
    (
        dir.join(format!("{stem}.lock")),
        dir.join(format!("{stem}.steer")),
    )
}

/// The listeners live in a file of their own next to the state
/// (`<addr>-<port>.listen`), so that registering one leaves the state file
/// (whose version keys `State::array`'s validity) as it is. Like the
/// state, it is replaced whole by a rename ([`rundir::replace_file`]),
/// never rewritten in place: under the group's lock no member reads it
/// while another writes, but a writer killed between truncating it and
/// writing it (or failing in the write: a full disk) would leave it empty
/// or cut short — every member's listeners lost, or a line cut into a
/// wrong service — and the next writer would make that permanent. A
/// reader opens either the old file or the new one, each whole. (Not
/// slower: on ext4 a truncating rewrite triggers the same flush of the
/// new data as a replacing rename; measured here, 650 µs a rewrite in
/// place, 190 µs by rename.)
fn listen_path(state: &Path) -> PathBuf {
    state.with_extension("listen")
}

fn read_state(path: &Path) -> Option<State> {
    use std::io::Read;
    let mut s = String::new();
    rundir::open_file(path, false, false)
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    if let Ok(mut f) = rundir::open_file(&listen_path(path), false, false) {
        let mut l = String::new();
        if f.read_to_string(&mut l).is_ok() {
            s.push_str(&l);
        }
    }
    State::parse(&s)
}

fn write_state(path: &Path, st: &State) -> io::Result<()> {
    rundir::replace_file(path, st.format_members().as_bytes())?;
    write_listeners(path, st)
}

/// Replace the listener file (the caller holds the group's lock).
fn write_listeners(path: &Path, st: &State) -> io::Result<()> {
    rundir::replace_file(&listen_path(path), st.format_listeners().as_bytes())
}

/// Measure the group's socket array: for each index, the inode of the
/// socket there (`None` if no probe drop showed up: a socket without our
/// probe filter). Fails if the group changed while measuring.
fn measure(addr: SocketAddr, secret: [u8; 8], table: &mut Table) -> io::Result<Vec<Option<u64>>> {
    // A probe's drop is counted while the sending call runs its softirq
    // (loopback delivery), so it is normally visible at once; a busy host
    // may defer the softirq to ksoftirqd. Up to this many reads per probe
    // (about 20 ms in all) before the index counts as unmeasurable.
    const READS: usize = 200;
    let probe_sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    let mut before: Vec<listing::Row> = table.read()?.to_vec();
    let members: HashSet<u64> = before.iter().map(|r| r.inode).collect();
    let n = before.len();
    let mut out = vec![None; n];
    for (j, slot) in out.iter_mut().enumerate() {
        let p = cbpf::probe(secret, j as u16);
        probe_sock.send_to(&p, &addr.into())?;
        for attempt in 0..READS {
            let now = table.read()?;
            if now.len() != n || now.iter().any(|r| !members.contains(&r.inode)) {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    "the group changed while it was measured",
                ));
            }
            let rose: Vec<u64> = now
                .iter()
                .filter(|r| {
                    before
                        .iter()
                        .any(|b| b.inode == r.inode && r.drops > b.drops)
                })
                .map(|r| r.inode)
                .collect();
            match rose.as_slice() {
                [] => {
                    if attempt > 10 {
                        std::thread::sleep(Duration::from_micros(100));
                    } else {
                        std::thread::yield_now();
                    }
                    continue;
                }
                [one] => *slot = Some(*one),
                // Another drop (a full receive buffer) at the same time:
                // cannot tell which was ours.
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "unrelated drops while measuring",
                    ))
                }
            }
            before = now.to_vec();
            break;
        }
    }
    let mut seen = HashSet::new();
    if out.iter().flatten().any(|i| !seen.insert(*i)) {
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "one socket answered for two indices",
        ));
    }
    Ok(out)
}

/// [`measure`], retried a few times when the group changes underneath or
/// unrelated drops interfere.
fn measure_retrying(
    addr: SocketAddr,
    secret: [u8; 8],
    table: &mut Table,
) -> io::Result<Vec<Option<u64>>> {
    let mut last = None;
    for _ in 0..5 {
        match measure(addr, secret, table) {
            Ok(v) => return Ok(v),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "measuring the reuseport group of {addr}: {}",
        last.expect("tried")
    )))
}

/// The (slot, index) table for an array of inodes and the members.
fn table_for(array: &[Option<u64>], members: &[Member]) -> Vec<(u8, u16)> {
    array
        .iter()
        .enumerate()
        .filter_map(|(i, ino)| {
            let m = members.iter().find(|m| Some(m.inode) == *ino)?;
            Some((m.slot, i as u16))
        })
        .collect()
}

fn view_of(path: &Path, st: &State) -> View {
    let mut owned = [false; 256];
    for m in &st.members {
        owned[m.slot as usize] = true;
    }
    View {
        version: rundir::version(path),
        owned,
        inodes: st.members.iter().map(|m| m.inode).collect(),
    }
}

/// Bind `sock` (configured, not yet bound) to `addr` as a member of the
/// steered group, claiming a slot.
pub(crate) fn join(sock: &Socket, addr: SocketAddr, dir: &Path) -> Result<Joined, JoinError> {
    let unavailable = |e: io::Error| JoinError::Unavailable(e);
    let failed = |e: io::Error| JoinError::Failed(e);
    rundir::ensure_dir(dir).map_err(unavailable)?;
    let (lock_path, state_path) = paths(dir, addr);
    let _lock = rundir::lock(&lock_path).map_err(unavailable)?;
    let mut table = Table::new(addr);
    let rows = table.read().map_err(unavailable)?;
    let empty = rows.is_empty();
    let old = read_state(&state_path);
    let secret = match (&old, empty) {
        (Some(st), false) => st.secret,
        _ => random_secret().map_err(failed)?,
    };
    let fd = sock.as_raw_fd();
    cbpf::attach_filter(fd, &cbpf::probe_filter(secret)).map_err(failed)?;
    crate::sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
        .map_err(|e| failed(io::Error::new(e.kind(), format!("SO_REUSEPORT: {e}"))))?;
    sock.bind(&addr.into()).map_err(|e| {
        failed(if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                e.kind(),
                format!(
                    "{addr} is taken by a process that does not share it \
                     (another user's, not softrdma, or a softrdma port opened with shared = false): {e}"
                ),
            )
        } else {
            io::Error::new(e.kind(), format!("binding {addr}: {e}"))
        })
    })?;
    let inode = listing::inode_of(fd).map_err(failed)?;
    // Every other member must be one the state describes: a member that
    // is not (another softrdma version, another program) would fight over
    // the group's program, so sharing with it is refused, not hijacked.
    let described = |ino: u64| {
        ino == inode
            || old
                .as_ref()
                .is_some_and(|st| st.members.iter().any(|m| m.inode == ino))
    };
    let undescribed = !empty
        && table
            .read()
            .map_err(failed)?
            .iter()
            .any(|r| !described(r.inode));
    if undescribed {
        return Err(failed(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{addr} is shared by sockets of this user that {} does not describe \
                 (another softrdma version, another program, or the runtime directory \
                 was cleared while they ran)",
                state_path.display()
            ),
        )));
    }
    let array = if empty {
        vec![Some(inode)]
    } else {
        measure_retrying(addr, secret, &mut table).map_err(|e| {
            failed(io::Error::new(
                e.kind(),
                format!(
                    "{e} (is {} missing or stale while other processes share {addr}?)",
                    state_path.display()
                ),
            ))
        })?
    };
    let live: HashSet<u64> = array.iter().flatten().copied().collect();
    let (members, mut listeners) = old
        .filter(|_| !empty)
        .map(|st| (st.members, st.listeners))
        .unwrap_or_default();
    let mut members: Vec<Member> = members
        .into_iter()
        .filter(|m| live.contains(&m.inode) && m.inode != inode)
        .collect();
    let taken: HashSet<u8> = members.iter().map(|m| m.slot).collect();
    let slot = SLOTS
        .into_iter()
        .find(|s| !taken.contains(s))
        .ok_or_else(|| {
            failed(io::Error::new(
                io::ErrorKind::AddrInUse,
                "all 255 QPN slots of this address are taken by other processes",
            ))
        })?;
    members.push(Member {
        slot,
        inode,
        pid: std::process::id(),
    });
    // A dead member's listeners, and any left for the slot we now take.
    listeners.retain(|l| l.slot != slot);
    let mut st = State {
        secret,
        members,
        listeners,
        array: array.clone(),
    };
    st.prune_listeners();
    cbpf::attach_group(fd, &st.program(&array).map_err(failed)?).map_err(failed)?;
    write_state(&state_path, &st).map_err(failed)?;
    Ok(Joined {
        slot,
        addr,
        inode,
        lock_path,
        view: view_of(&state_path, &st),
        known: Some(array),
        state_path,
        table,
        repairs: 0,
    })
}

impl Joined {
    /// Leave the group: re-steer for the array as it will be without us,
    /// then close `sock`.
    pub(crate) fn leave(mut self, sock: Socket) {
        let Ok(_lock) = rundir::lock(&self.lock_path) else {
            return;
        };
        let Some(st) = read_state(&self.state_path) else {
            return;
        };
        let mut st = st;
        st.members.retain(|m| m.inode != self.inode);
        st.prune_listeners();
        st.array.clear();
        let mut resteered = false;
        if let Ok(mut array) = measure_retrying(self.addr, st.secret, &mut self.table) {
            if let Some(i) = array.iter().position(|&x| x == Some(self.inode)) {
                // The kernel moves the last socket into the leaver's place.
                array.swap_remove(i);
                let attached = st
                    .program(&array)
                    .and_then(|p| cbpf::attach_group(sock.as_raw_fd(), &p));
                if attached.is_ok() {
                    st.array = array;
                    resteered = true;
                }
            }
        }
        drop(sock);
        // Not re-steered (the group could not be measured: say, another
        // member's receive buffer overflowing meanwhile): the state keeps
        // us, as after a death, so that the members see the group the
        // kernel lists differ from it and repair at the first misdelivered
        // datagram. Written without us, it would match the group while the
        // table is stale, and no repair would ever be made.
        if resteered {
            let _ = write_state(&self.state_path, &st);
        }
    }

    /// Start (`on`) or stop taking the CM REQs and SIDR_REQs for
    /// `service` (the low 32 bits of its service ID) at this address.
    /// Another live member listening on it already: `AddrInUse`.
    pub(crate) fn listen(&mut self, sock: &Socket, service: u32, on: bool) -> io::Result<()> {
        let _lock = rundir::lock(&self.lock_path)?;
        let mut st = read_state(&self.state_path)
            .ok_or_else(|| io::Error::other(format!("{} is missing", self.state_path.display())))?;
        // The array: ours from the last time, or the state's (measured by
        // whoever last changed the group), if the kernel lists exactly its
        // sockets; measured otherwise.
        let listed: HashSet<u64> = self.table.read()?.iter().map(|r| r.inode).collect();
        let valid = |a: &[Option<u64>]| {
            !a.is_empty() && listed == a.iter().flatten().copied().collect::<HashSet<u64>>()
        };
        let array = match &self.known {
            Some(a) if valid(a) => a.clone(),
            _ if valid(&st.array) => st.array.clone(),
            _ => measure_retrying(self.addr, st.secret, &mut self.table)?,
        };
        let live: HashSet<u64> = array.iter().flatten().copied().collect();
        st.members.retain(|m| live.contains(&m.inode));
        st.prune_listeners();
        let ours = |l: &Listener| l.slot == self.slot && l.service == service;
        if on {
            if let Some(l) = st.listeners.iter().find(|l| l.service == service) {
                if l.slot != self.slot {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "service {service:#010x} at {} is listened on by another process (slot {})",
                            self.addr.ip(),
                            l.slot
                        ),
                    ));
                }
                return Ok(());
            }
            if st.listeners.len() >= cbpf::MAX_LISTENERS {
                return Err(io::Error::new(
                    io::ErrorKind::QuotaExceeded,
                    format!(
                        "cannot listen on service {service:#010x} at {}: {} services are \
                         listened on at this address, the most its steering program holds \
                         (a classic BPF program may have at most {} instructions, \
                         BPF_MAXINSNS: two per service, with room for all 255 members)",
                        self.addr.ip(),
                        st.listeners.len(),
                        cbpf::BPF_MAXINSNS
                    ),
                ));
            }
            st.listeners.push(Listener {
                slot: self.slot,
                service,
            });
        } else if !st.listeners.iter().any(ours) {
            return Ok(());
        } else {
            st.listeners.retain(|l| !ours(l));
        }
        cbpf::attach_group(sock.as_raw_fd(), &st.program(&array)?)?;
        // Members unchanged: the state file (and its version, which the
        // array's validity is keyed on) stays as it is.
        write_listeners(&self.state_path, &st)?;
        self.known = Some(array);
        Ok(())
    }

    /// A datagram for `slot` (not ours) arrived on `sock`. If the state says
    /// another member owns it, the table may be stale: if the group in
    /// the kernel's listing differs from the state, measure and re-steer. Returns
    /// whether the table was repaired.
    pub(crate) fn misdelivered(&mut self, sock: &Socket, slot: u8) -> io::Result<bool> {
        if rundir::version(&self.state_path) != self.view.version {
            if let Some(st) = read_state(&self.state_path) {
                self.view = view_of(&self.state_path, &st);
            }
        }
        if !self.view.owned[slot as usize] || !self.group_differs()? {
            return Ok(false);
        }
        let _lock = rundir::lock(&self.lock_path)?;
        let Some(st) = read_state(&self.state_path) else {
            return Ok(false);
        };
        self.view = view_of(&self.state_path, &st);
        if !self.group_differs()? {
            return Ok(false); // repaired by another member meanwhile
        }
        self.resteer(sock, st)?;
        Ok(true)
    }

    /// Measure the group, drop the members gone from it, re-steer and
    /// write the state (the caller holds the group's lock).
    fn resteer(&mut self, sock: &Socket, mut st: State) -> io::Result<()> {
        let array = measure_retrying(self.addr, st.secret, &mut self.table)?;
        let live: HashSet<u64> = array.iter().flatten().copied().collect();
        st.members.retain(|m| live.contains(&m.inode));
        st.prune_listeners();
        st.array = array.clone();
        cbpf::attach_group(sock.as_raw_fd(), &st.program(&array)?)?;
        write_state(&self.state_path, &st)?;
        self.view = view_of(&self.state_path, &st);
        self.known = Some(array);
        self.repairs += 1;
        Ok(())
    }

    /// A CM message for `slot` (not ours) arrived: whether another live
    /// member owns that slot (then it was misdelivered, and the steering
    /// is repaired — re-measured even if the group looks unchanged, since
    /// a group that did not change cannot misdeliver unless its array was
    /// wrong). `false`: nobody owns the slot (its process is gone), and
    /// the message is ours to answer as for a forgotten ID.
    pub(crate) fn misdelivered_cm(&mut self, sock: &Socket, slot: u8) -> io::Result<bool> {
        let repaired = self.misdelivered(sock, slot)?;
        if !self.view.owned[slot as usize] {
            return Ok(false);
        }
        if !repaired {
            let _lock = rundir::lock(&self.lock_path)?;
            let Some(st) = read_state(&self.state_path) else {
                return Ok(true);
            };
            self.resteer(sock, st)?;
        }
        Ok(self.view.owned[slot as usize])
    }

    /// The slot of the live member listening on `service` (the low 32 bits
    /// of a CM service ID) at this address, if any. Waits for the group's
    /// lock, which a member registering a listener holds until the
    /// steering takes it: a request that reached this member in that
    /// window is then known to be the registering member's. Live: its
    /// socket is in the kernel's listing.
    pub(crate) fn listener_of(&mut self, service: u32) -> io::Result<Option<u8>> {
        let _lock = rundir::lock(&self.lock_path)?;
        let Some(st) = read_state(&self.state_path) else {
            return Ok(None);
        };
        let Some(l) = st.listeners.iter().find(|l| l.service == service) else {
            return Ok(None);
        };
        let Some(m) = st.members.iter().find(|m| m.slot == l.slot) else {
            return Ok(None);
        };
        let inode = m.inode;
        let live = self.table.read()?.iter().any(|r| r.inode == inode);
        Ok(live.then_some(l.slot))
    }

    /// Whether the members the kernel lists are not those of the view.
    fn group_differs(&mut self) -> io::Result<bool> {
        let rows = self.table.read()?;
        let now: HashSet<u64> = rows.iter().map(|r| r.inode).collect();
        let known: HashSet<u64> = self.view.inodes.iter().copied().collect();
        Ok(now != known)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_rejects_junk() {
        let st = State {
            secret: *b"\x00\x11\x22\x33\x44\x55\x66\x77",
            members: vec![
                Member {
                    slot: 1,
                    inode: 12345,
                    pid: 77,
                },
                Member {
                    slot: 255,
                    inode: 1,
                    pid: 2,
                },
            ],
            listeners: vec![Listener {
                slot: 255,
                service: 0x0106_4e20,
            }],
            array: vec![Some(1), None, Some(12345)],
        };
        assert_eq!(State::parse(&st.format()), Some(st.clone()));
        assert!(st.format().contains("\narray 1 - 12345\n"));
        assert_eq!(State::parse(&(st.format() + "array 1\n")), None);
        // The previous format (no listeners) is not this one.
        assert_eq!(State::parse("softrdma-steer 1\nsecret 00\n"), None);
        assert_eq!(State::parse(&(st.format() + "listen 1 xyz\n")), None);
        assert_eq!(State::parse(&(st.format() + "member 1 x 3\n")), None);
        assert_eq!(State::parse(&(st.format() + "member 256 1 3\n")), None);
    }

    /// A state with `n` listeners (slot 1, services `base + i`).
    fn with_listeners(base: u32, n: u32) -> State {
        State {
            secret: *b"\x00\x11\x22\x33\x44\x55\x66\x77",
            members: vec![Member {
                slot: 1,
                inode: 12345,
                pid: 77,
            }],
            listeners: (0..n)
                .map(|i| Listener {
                    slot: 1,
                    service: base + i,
                })
                .collect(),
            array: vec![Some(12345)],
        }
    }

    const LISTEN_WRITER_ENV: &str = "SOFTRDMA_UDP_LISTEN_WRITER";

    /// The child of `a_listener_update_killed_midway_loses_no_listener`:
    /// rewrites the listeners of the state file named in the environment
    /// with a file size limit (`RLIMIT_FSIZE`) shorter than the new
    /// listing, so the kernel kills it (`SIGXFSZ`) partway through the
    /// write. Does nothing in an ordinary test run.
    #[test]
    fn listener_writer_child() {
        let Some(path) = std::env::var_os(LISTEN_WRITER_ENV) else {
            return;
        };
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let small = libc::rlimit {
            rlim_cur: 64,
            rlim_max: 64,
        };
        // SAFETY: both point at a valid `rlimit` for the duration of the
        // call; the limits apply to this child process only.
        unsafe {
            assert_eq!(libc::setrlimit(libc::RLIMIT_CORE, &no_core), 0);
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &small), 0);
        }
        let r = write_listeners(Path::new(&path), &with_listeners(0x0111_0000, 40));
        panic!("not killed while writing the listeners: {r:?}");
    }

    /// A member killed while it rewrites the listener file (here by the
    /// file size limit, at the byte where the limit falls) leaves the
    /// previous listing whole. Rewritten in place (truncated, then
    /// written), the file was left with part of the new listing — every
    /// member's listeners lost or cut short for the next writer to
    /// make permanent.
    #[test]
    fn a_listener_update_killed_midway_loses_no_listener() {
        use std::os::unix::process::ExitStatusExt;
        use std::time::Instant;
        let dir = tempfile::Builder::new()
            .prefix("srdma-steer-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("127.0.0.1-4791.steer");
        let old = with_listeners(0x0106_0000, 3);
        write_state(&path, &old).unwrap();
        assert_eq!(read_state(&path).as_ref(), Some(&old));
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "steer::tests::listener_writer_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(LISTEN_WRITER_ENV, &path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the writer did not finish in 30 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(
            status.signal(),
            Some(libc::SIGXFSZ),
            "the writer was to be killed in its write: {status:?}"
        );
        assert_eq!(read_state(&path), Some(old));
    }

    #[test]
    fn the_table_follows_the_array() {
        let m = |slot, inode| Member {
            slot,
            inode,
            pid: 0,
        };
        let members = [m(1, 10), m(2, 20), m(9, 90)];
        let array = [Some(20), None, Some(90), Some(10)];
        assert_eq!(table_for(&array, &members), [(2, 0), (9, 2), (1, 3)]);
    }
}
