//! Finding the other ranks: who this process is, from the environment the
//! launcher set (Open MPI's `mpirun`, Slurm's `srun`, torchrun), and one
//! rendezvous through which the ranks swap their connection cards and meet
//! at barriers.
//!
//! Rank 0 listens, every other rank connects to it and stays connected for
//! the communicator's lifetime (the streams carry [`Bootstrap::allgather`]
//! and [`Bootstrap::barrier`]). Where rank 0 listens:
//!
//! - `MASTER_ADDR` and `MASTER_PORT` set (torchrun always sets them; pass
//!   them with `mpirun -x` or `srun --export` for jobs over several hosts):
//!   TCP to that address.
//! - otherwise, when the launcher says every rank is on this host (Open
//!   MPI's local size equals the world size, Slurm's job has one node): an
//!   abstract Unix socket named after the user and the launcher's job id,
//!   so concurrent jobs never meet and nothing is left in the file system.
//! - otherwise an error saying which variables to set.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How long a rank waits for the others to appear, and for any one
/// bootstrap message (`SOFTRDMA_COLL_TIMEOUT` in seconds overrides it): a
/// launcher starts its ranks within seconds; a rank that never comes is an
/// error, not a hang.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a collective waits for a peer before failing
/// (`SOFTRDMA_COLL_OP_TIMEOUT` in seconds overrides it): long, because a
/// rank may reach a collective minutes after its peers (a checkpoint, an
/// evaluation) — NCCL waits for ever — yet bounded, so a peer that died
/// without its QP failing (UDP, nothing outstanding) ends in an error.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(600);

const MAGIC: &[u8; 8] = b"SRCOLL01";
/// The largest card a rank may send (a card is a few hundred bytes per
/// peer): bounds what rank 0 allocates for a malformed or foreign peer.
const MAX_CARD: usize = 1 << 24;

/// Where rank 0 waits for the others.
#[derive(Debug)]
pub enum Rendezvous {
    /// TCP: rank 0 binds this address, the others connect to it.
    Tcp(SocketAddr),
    /// TCP, rank 0 only: a listener bound already (a local launch that
    /// chose a free port before it started the other ranks).
    Listener(TcpListener),
    /// An abstract Unix socket of this name (every rank on this host).
    Local(String),
}

/// Who this process is in the job, and where the ranks meet.
#[derive(Debug)]
pub struct Launch {
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// Where rank 0 listens.
    pub rendezvous: Rendezvous,
    /// Which launcher's variables said so: `"mpirun"`, `"slurm"`,
    /// `"torchrun"`, `"softrdma"` (a local launch) or `"none"` (one rank).
    pub launcher: &'static str,
    /// How long to wait for the other ranks and for each bootstrap message.
    pub timeout: Duration,
    /// How long a collective waits for a peer.
    pub op_timeout: Duration,
}

impl Launch {
    /// From this process's environment.
    pub fn from_env() -> Result<Launch> {
        Launch::from_vars(|k| std::env::var(k).ok())
    }

    /// From the variables `var` returns (a test's map, or the environment).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let num = |k: &str| -> Result<Option<usize>> {
            match var(k) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| {
                    Error::Bootstrap(format!("{k}={v:?} is not a non-negative integer"))
                }),
            }
        };
        let secs = |k: &str, default: Duration| -> Result<Duration> {
            match var(k) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| *s > 0.0)
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .filter(|d| Instant::now().checked_add(*d).is_some())
                    .ok_or_else(|| {
                        Error::Bootstrap(format!("{k}={v:?} is not a usable number of seconds"))
                    }),
            }
        };
        let timeout = secs("SOFTRDMA_COLL_TIMEOUT", DEFAULT_TIMEOUT)?;
        let op_timeout = secs("SOFTRDMA_COLL_OP_TIMEOUT", DEFAULT_OP_TIMEOUT)?;
        let uid = {
            // SAFETY: getuid cannot fail and touches no memory.
            unsafe { libc::getuid() }
        };
        // (launcher, rank, size, "all ranks on this host" and a job id to
        // name a local rendezvous by)
        let (launcher, rank, size, local): (_, _, _, Option<String>) = if let (Some(r), Some(n)) =
            (num("OMPI_COMM_WORLD_RANK")?, num("OMPI_COMM_WORLD_SIZE")?)
        {
            let one_host = num("OMPI_COMM_WORLD_LOCAL_SIZE")? == Some(n);
            let job = var("OMPI_MCA_ess_base_jobid").or_else(|| var("PMIX_NAMESPACE"));
            (
                "mpirun",
                r,
                n,
                job.filter(|_| one_host).map(|j| format!("ompi/{j}")),
            )
        } else if let (Some(r), Some(n)) = (num("SLURM_PROCID")?, num("SLURM_NTASKS")?) {
            let nodes = num("SLURM_STEP_NUM_NODES")?.or(num("SLURM_NNODES")?);
            let job = match (var("SLURM_JOB_ID"), var("SLURM_STEP_ID")) {
                (Some(j), Some(s)) => Some(format!("slurm/{j}.{s}")),
                (Some(j), None) => Some(format!("slurm/{j}")),
                _ => None,
            };
            ("slurm", r, n, job.filter(|_| nodes == Some(1)))
        } else if let (Some(r), Some(n)) = (num("RANK")?, num("WORLD_SIZE")?) {
            let who = if var("SOFTRDMA_COLL_LOCAL").is_some() {
                "softrdma"
            } else {
                "torchrun"
            };
            (who, r, n, None)
        } else {
            ("none", 0, 1, Some(format!("single/{}", std::process::id())))
        };
        if size == 0 || rank >= size {
            return Err(Error::Bootstrap(format!(
                "{launcher}: rank {rank} of a job of {size} ranks"
            )));
        }
        let rendezvous = match (var("MASTER_ADDR"), var("MASTER_PORT")) {
            (Some(a), Some(p)) => {
                let mut port: u16 = p.trim().parse().map_err(|_| {
                    Error::Bootstrap(format!("MASTER_PORT={p:?} is not a port number"))
                })?;
                if launcher == "torchrun" {
                    // torchrun's agent hosts its own TCP store on
                    // MASTER_PORT of rank 0's host: meet on the next one.
                    port = port.checked_add(1).ok_or_else(|| {
                        Error::Bootstrap("MASTER_PORT 65535 leaves no port after it".into())
                    })?;
                }
                let addr = (a.trim(), port)
                    .to_socket_addrs()
                    .map_err(|e| Error::Bootstrap(format!("MASTER_ADDR={a:?}: {e}")))?
                    .next()
                    .ok_or_else(|| Error::Bootstrap(format!("MASTER_ADDR={a:?} has no address")))?;
                Rendezvous::Tcp(addr)
            }
            _ => match local {
                Some(job) => Rendezvous::Local(format!("softrdma-coll/{uid}/{job}")),
                None => {
                    return Err(Error::Bootstrap(format!(
                        "{launcher} started {size} ranks that are not all on this host (or did not \
                         say so): set MASTER_ADDR and MASTER_PORT to an address of rank 0's host and \
                         a free port (e.g. mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500)"
                    )))
                }
            },
        };
        Ok(Launch {
            rank,
            size,
            rendezvous,
            launcher,
            timeout,
            op_timeout,
        })
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn set_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(t))?;
                s.set_write_timeout(Some(t))
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(t))?;
                s.set_write_timeout(Some(t))
            }
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The joined ranks: rank 0 holds a stream to every other rank, the others
/// one stream to rank 0.
pub struct Bootstrap {
    rank: usize,
    size: usize,
    /// Rank 0: `streams[r]` for r in 1..size (index 0 unused). Others:
    /// `streams[0]` is rank 0.
    streams: Vec<Option<Stream>>,
    /// The local address this rank's traffic should use (the one its
    /// rendezvous connection uses).
    local_ip: IpAddr,
    timeout: Duration,
}

fn io_err(what: &str, e: io::Error) -> Error {
    Error::Bootstrap(format!("{what}: {e}"))
}

/// Wait until `fd` is readable or `deadline` passes (poll(2)).
fn wait_readable(fd: i32, deadline: Instant) -> io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `p` is one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return Ok(true);
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Bootstrap {
    /// Meet the other ranks of `launch`: returns once every rank has joined
    /// (rank 0) or rank 0 has accepted this one (the others).
    pub fn join(launch: Launch) -> Result<Bootstrap> {
        let Launch {
            rank,
            size,
            rendezvous,
            timeout,
            ..
        } = launch;
        let deadline_err =
            || Error::Bootstrap(format!("a timeout of {timeout:?} overflows the clock"));
        let deadline = Instant::now()
            .checked_add(timeout)
            .ok_or_else(deadline_err)?;
        let mut streams: Vec<Option<Stream>> = (0..size).map(|_| None).collect();
        if size == 1 {
            return Ok(Bootstrap {
                rank,
                size,
                streams,
                local_ip: local_device_ip(None),
                timeout,
            });
        }
        let local_ip;
        if rank == 0 {
            enum L {
                Tcp(TcpListener),
                Unix(UnixListener),
            }
            let l = match rendezvous {
                Rendezvous::Tcp(a) => L::Tcp(
                    TcpListener::bind(a)
                        .map_err(|e| io_err(&format!("rank 0: listening on {a}"), e))?,
                ),
                Rendezvous::Listener(l) => L::Tcp(l),
                Rendezvous::Local(name) => {
                    let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                        .map_err(|e| io_err("rendezvous name", e))?;
                    L::Unix(UnixListener::bind_addr(&a).map_err(|e| {
                        io_err(
                            &format!(
                                "rank 0: listening on @{name} (another job of this id running?)"
                            ),
                            e,
                        )
                    })?)
                }
            };
            // Rank 0's address: the listener's if it has one, else the one
            // the first rank to join reached it on (an address of this host
            // the others route to).
            let mut ip0 = match &l {
                L::Tcp(t) => Some(t.local_addr().map_err(|e| io_err("listener", e))?.ip())
                    .filter(|ip| !ip.is_unspecified()),
                L::Unix(_) => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            };
            let fd = match &l {
                L::Tcp(t) => t.as_raw_fd(),
                L::Unix(u) => u.as_raw_fd(),
            };
            let mut joined = 1;
            while joined < size {
                if !wait_readable(fd, deadline).map_err(|e| io_err("rank 0: waiting", e))? {
                    return Err(Error::Bootstrap(format!(
                        "rank 0: only {joined} of {size} ranks joined within {timeout:?}"
                    )));
                }
                let mut s = match &l {
                    L::Tcp(t) => Stream::Tcp(t.accept().map_err(|e| io_err("accept", e))?.0),
                    L::Unix(u) => Stream::Unix(u.accept().map_err(|e| io_err("accept", e))?.0),
                };
                // A rank writes its hello as soon as it connects: a client
                // that says nothing within a few seconds is not one (the
                // bound keeps strangers from holding rank 0 for the whole
                // timeout).
                let left = deadline.saturating_duration_since(Instant::now());
                s.set_timeout(left.clamp(Duration::from_millis(1), Duration::from_secs(5)))
                    .map_err(|e| io_err("socket", e))?;
                let mut hello = [0u8; 16];
                if s.read_exact(&mut hello).is_err() || &hello[..8] != MAGIC {
                    // Not one of ours (a port scanner, a stale client).
                    continue;
                }
                let r = u32::from_le_bytes(hello[8..12].try_into().expect("4 bytes")) as usize;
                let n = u32::from_le_bytes(hello[12..16].try_into().expect("4 bytes")) as usize;
                if n != size || r == 0 || r >= size || streams[r].is_some() {
                    // Another job on the same rendezvous, or a stale rank:
                    // turned away, so it cannot end this job.
                    eprintln!(
                        "softrdma-coll: rank 0: turned away a rank {r} of a job of {n} ranks \
                         (this job has {size}; {})",
                        if streams.get(r).is_some_and(|x| x.is_some()) {
                            "that rank joined already"
                        } else {
                            "another job on this rendezvous?"
                        }
                    );
                    continue;
                }
                s.set_timeout(timeout).map_err(|e| io_err("socket", e))?;
                if ip0.is_none() {
                    if let Stream::Tcp(t) = &s {
                        ip0 = t.local_addr().ok().map(|a| a.ip());
                    }
                }
                streams[r] = Some(s);
                joined += 1;
            }
            local_ip = local_device_ip(ip0);
        } else {
            let mut s = loop {
                let attempt = match &rendezvous {
                    Rendezvous::Tcp(a) => TcpStream::connect_timeout(a, timeout).map(Stream::Tcp),
                    Rendezvous::Local(name) => {
                        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                            .and_then(|a| UnixStream::connect_addr(&a))
                            .map(Stream::Unix)
                    }
                    Rendezvous::Listener(_) => {
                        return Err(Error::Bootstrap(
                            "a pre-bound listener is for rank 0 only".into(),
                        ))
                    }
                };
                match attempt {
                    Ok(s) => break s,
                    // Rank 0 may not be listening yet: launchers start
                    // ranks in no particular order. Retry on a short
                    // period until the deadline (the only wait here with
                    // nothing to wake it: there is no one to ring us).
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => {
                        return Err(io_err(
                            &format!("rank {rank}: connecting to rank 0 at {rendezvous:?}"),
                            e,
                        ))
                    }
                }
            };
            s.set_timeout(timeout).map_err(|e| io_err("socket", e))?;
            local_ip = match &s {
                Stream::Tcp(t) => {
                    local_device_ip(Some(t.local_addr().map_err(|e| io_err("socket", e))?.ip()))
                }
                Stream::Unix(_) => local_device_ip(None),
            };
            let mut hello = [0u8; 16];
            hello[..8].copy_from_slice(MAGIC);
            hello[8..12].copy_from_slice(&(rank as u32).to_le_bytes());
            hello[12..16].copy_from_slice(&(size as u32).to_le_bytes());
            s.write_all(&hello).map_err(|e| io_err("hello", e))?;
            streams[0] = Some(s);
        }
        Ok(Bootstrap {
            rank,
            size,
            streams,
            local_ip,
            timeout,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The local address this rank's RDMA traffic should use: the one its
    /// connection to rank 0 uses (or `SOFTRDMA_COLL_ADDR`; 127.0.0.1 for
    /// ranks that met through a local socket).
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    fn stream(&mut self, r: usize) -> &mut Stream {
        self.streams[r]
            .as_mut()
            .expect("a stream per peer of rank 0")
    }

    fn lost(&self, r: usize, e: io::Error) -> Error {
        Error::Bootstrap(format!(
            "rank {}: bootstrap connection to rank {r}: {e} (did rank {r} exit?)",
            self.rank
        ))
    }

    /// Every rank's `mine`, indexed by rank (through rank 0).
    pub fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if mine.len() > MAX_CARD {
            return Err(Error::Invalid(format!(
                "allgather of {} bytes (at most {MAX_CARD})",
                mine.len()
            )));
        }
        if self.size == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        if self.rank == 0 {
            let mut all = vec![mine.to_vec()];
            for r in 1..self.size {
                let v = read_blob(self.stream(r)).map_err(|e| self.lost(r, e))?;
                all.push(v);
            }
            let mut out = Vec::new();
            for v in &all {
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
            for r in 1..self.size {
                write_blob(self.stream(r), &out).map_err(|e| self.lost(r, e))?;
            }
            Ok(all)
        } else {
            write_blob(self.stream(0), mine).map_err(|e| self.lost(0, e))?;
            let out = read_blob(self.stream(0)).map_err(|e| self.lost(0, e))?;
            let mut all = Vec::with_capacity(self.size);
            let mut at = 0;
            for _ in 0..self.size {
                let bad = || Error::Bootstrap("rank 0 sent a malformed table".into());
                let len = out
                    .get(at..at + 4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                    .ok_or_else(bad)?;
                let v = out.get(at + 4..at + 4 + len).ok_or_else(bad)?;
                all.push(v.to_vec());
                at += 4 + len;
            }
            Ok(all)
        }
    }

    /// Return once every rank has called it.
    pub fn barrier(&mut self) -> Result<()> {
        self.allgather(&[]).map(drop)
    }

    /// How long each bootstrap message may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

fn read_blob(s: &mut Stream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_CARD * 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a bootstrap message of {len} bytes"),
        ));
    }
    let mut v = vec![0; len];
    s.read_exact(&mut v)?;
    Ok(v)
}

fn write_blob(s: &mut Stream, b: &[u8]) -> io::Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(b)
}

/// The address to open the device on: `SOFTRDMA_COLL_ADDR` if set, else
/// the rendezvous connection's local address, else loopback.
fn local_device_ip(conn: Option<IpAddr>) -> IpAddr {
    if let Some(ip) = std::env::var("SOFTRDMA_COLL_ADDR")
        .ok()
        .and_then(|a| a.trim().parse().ok())
    {
        return ip;
    }
    conn.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn launch(vars: &[(&str, &str)]) -> Result<Launch> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Launch::from_vars(|k| m.get(k).cloned())
    }

    fn local_name(l: &Launch) -> &str {
        match &l.rendezvous {
            Rendezvous::Local(n) => n,
            other => panic!("expected a local rendezvous, got {other:?}"),
        }
    }

    #[test]
    fn mpirun_on_one_host_meets_on_a_socket_named_by_its_job() {
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "1951989761"),
        ])
        .unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (1, 4, "mpirun"));
        assert!(
            local_name(&l).ends_with("/ompi/1951989761"),
            "{}",
            local_name(&l)
        );
    }

    #[test]
    fn several_hosts_need_master_addr() {
        let vars = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "7"),
        ];
        let e = launch(&vars).unwrap_err().to_string();
        assert!(e.contains("set MASTER_ADDR and MASTER_PORT"), "{e}");
        let mut with = vars.to_vec();
        with.extend([("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]);
        let l = launch(&with).unwrap();
        assert!(matches!(l.rendezvous, Rendezvous::Tcp(a) if a.port() == 29500));
    }

    #[test]
    fn slurm_and_torchrun() {
        let l = launch(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_NNODES", "1"),
            ("SLURM_JOB_ID", "42"),
            ("SLURM_STEP_ID", "0"),
        ])
        .unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (2, 3, "slurm"));
        assert!(local_name(&l).ends_with("/slurm/42.0"));
        let l = launch(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29501"),
        ])
        .unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (0, 2, "torchrun"));
        assert!(matches!(l.rendezvous, Rendezvous::Tcp(_)));
        // Open MPI's variables win over Slurm's (mpirun inside an
        // allocation inherits the daemon's SLURM_*).
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "9"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ])
        .unwrap();
        assert_eq!(l.launcher, "mpirun");
    }

    #[test]
    fn no_launcher_is_one_rank_and_bad_values_are_named() {
        let l = launch(&[]).unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (0, 1, "none"));
        let e = launch(&[("RANK", "x"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("RANK=\"x\" is not a non-negative integer"),
            "{e}"
        );
        let e = launch(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("rank 2 of a job of 2 ranks"), "{e}");
        let e = launch(&[("SOFTRDMA_COLL_TIMEOUT", "-1")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("SOFTRDMA_COLL_TIMEOUT"), "{e}");
    }
}
