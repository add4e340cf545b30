//! Exchanging [`QpEndpoint`]s out of band over TCP: the step every verbs
//! application needs before `connect` and that libibverbs leaves to it
//! (rdma-core's examples and perftest each hand-roll one). One message each
//! way — a 4-byte little-endian length, then [`QpEndpoint::to_bytes`] —
//! with a bounded size, so a stray client cannot make the other side
//! allocate without limit.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::{CoreError, Error, QpEndpoint, Result};

/// The largest endpoint record accepted (a header and 4096 regions).
pub const MAX_RECORD: usize = 27 + 4096 * 20;

/// Send `mine` and receive the peer's endpoint on a connected stream
/// (either side may call it first: both write, then read).
pub fn exchange(stream: &mut TcpStream, mine: &QpEndpoint) -> Result<QpEndpoint> {
    stream.write_all(&frame(mine))?;
    let mut n = [0u8; 4];
    stream.read_exact(&mut n)?;
    let n = check_len(u32::from_le_bytes(n))?;
    let mut b = vec![0u8; n];
    stream.read_exact(&mut b)?;
    QpEndpoint::from_bytes(&b)
}

/// `mine` as one message: its length, then its record.
pub(crate) fn frame(mine: &QpEndpoint) -> Vec<u8> {
    let b = mine.to_bytes();
    let mut m = (b.len() as u32).to_le_bytes().to_vec();
    m.extend_from_slice(&b);
    m
}

pub(crate) fn check_len(n: u32) -> Result<usize> {
    let n = n as usize;
    if n > MAX_RECORD {
        return Err(Error::Verbs(CoreError::InvalidArgument(
            "the peer's endpoint record is longer than MAX_RECORD: not a softrdma endpoint",
        )));
    }
    Ok(n)
}
