//! Collectives over softrdma: AllReduce, AllGather, ReduceScatter,
//! Broadcast, Reduce, AlltoAll and SendRecv among N ranks connected by RC
//! queue pairs, with data moved by RDMA WRITE (with immediate) into
//! registered FIFOs and credits returned by SEND, as NCCL's IB transport
//! does it.
//!
//! ```no_run
//! use softrdma_coll::{Comm, DataType, ReduceOp};
//! // Under `mpirun -np 4`, `srun -n 4`, or torchrun:
//! let mut comm = Comm::from_env()?;
//! let n = 1 << 20;
//! let buf = comm.alloc(n * 4)?;
//! let ones: Vec<u8> = (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect();
//! buf.write_bytes(0, &ones)?;
//! comm.all_reduce(buf.at(0), buf.at(0), n, DataType::Float, ReduceOp::Sum)?;
//! let mut first = [0u8; 4];
//! buf.read_bytes(0, &mut first)?;
//! assert_eq!(f32::from_le_bytes(first), comm.size() as f32);
//! # Ok::<(), softrdma_coll::Error>(())
//! ```
//!
//! - [`boot`]: who this rank is (from `mpirun`, Slurm or torchrun's
//!   variables) and the rendezvous through rank 0.
//! - [`comm`]: the communicator, its QPs and the chunk protocol.
//! - [`algo`]: the collectives' schedules.
//! - [`reduce`]: element types, operators and the reduction kernels.
#![warn(missing_docs)]

pub mod algo;
pub mod boot;
pub mod comm;
mod cpus;
pub mod reduce;

pub use algo::{Algo, View};
pub use boot::{Launch, Rendezvous};
pub use comm::{Buffer, Comm, Config};
pub use reduce::{DataType, ReduceOp};

use softrdma_verbs::Completion;

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// Finding or talking to the other ranks.
    Bootstrap(String),
    /// A caller's mistake (a buffer too small, a rank out of range).
    Invalid(String),
    /// The verbs refused something.
    Verbs(softrdma_verbs::Error),
    /// An RDMA operation to or from `peer` failed.
    Transfer {
        /// This rank.
        rank: usize,
        /// The peer of the failed QP.
        peer: usize,
        /// The failed completion.
        completion: Completion,
    },
    /// A peer broke the chunk protocol (ranks calling different
    /// collectives or counts).
    Protocol(String),
    /// Nothing arrived for the communicator's timeout.
    Stalled(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Bootstrap(s) => write!(f, "bootstrap: {s}"),
            Error::Invalid(s) => write!(f, "invalid argument: {s}"),
            Error::Verbs(e) => write!(f, "verbs: {e}"),
            Error::Transfer {
                rank,
                peer,
                completion,
            } => write!(
                f,
                "rank {rank}: RDMA with rank {peer} failed: {:?} (vendor error {:#x})",
                completion.status, completion.vendor_err
            ),
            Error::Protocol(s) => write!(f, "protocol: {s}"),
            Error::Stalled(s) => write!(f, "stalled: {s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<softrdma_verbs::Error> for Error {
    fn from(e: softrdma_verbs::Error) -> Error {
        Error::Verbs(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Verbs(softrdma_verbs::Error::Io(e))
    }
}

/// A result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// A byte size as nccl-tests reads one: a number (fractions allowed) with
/// an optional K, M or G (powers of 1024; only the first letter counts, so
/// `128MB` is 128 MiB).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mult = match suffix.chars().next().map(|c| c.to_ascii_uppercase()) {
        None => 1.0,
        Some('K') => 1024.0,
        Some('M') => 1024.0 * 1024.0,
        Some('G') => 1024.0 * 1024.0 * 1024.0,
        Some(_) => return None,
    };
    let b = v * mult;
    (b.is_finite() && b >= 0.0 && b < u64::MAX as f64).then_some(b as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_nccl_tests_reads_them() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("4K"), Some(4096));
        assert_eq!(parse_size("0.5k"), Some(512));
        assert_eq!(parse_size("128MB"), Some(128 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("8B"), None);
        assert_eq!(parse_size("x"), None);
    }
}
