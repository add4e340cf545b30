//! softrdma-sim: a packet-level RoCE fabric simulator whose hosts run the
//! real transport.
//!
//! Every host is a [`softrdma_core::Endpoint`] — the same requester,
//! responder, completer, scheduler and transmit gate that talk to Linux rxe
//! over UDP — behind a NIC model that pulls one packet from the endpoint
//! each time its wire is free. Between hosts sit output-queued switches with
//! a shared buffer: HPCC's MMU (per-ingress reserve, dynamic shared
//! threshold, headroom) with PFC pause frames, RED/ECN marking at dequeue,
//! INT stamps, ECMP on a hash of the 5-tuple (UDP source port included),
//! drop-tail in lossy mode and link failures at given times.
//!
//! Time is virtual, kept in picoseconds (so serialisation at 100 and
//! 400 Gb/s is exact; the endpoints see nanoseconds), and a run is a
//! function of its configuration and seed: one thread, one event queue
//! ordered by (time, sequence number), seeded ChaCha8 streams for ECN and
//! traffic, no hash-map iteration in anything that reaches the output.
//!
//! See `docs/SIMULATOR.md` for the model, the formats and a worked example.
#![forbid(unsafe_code)]

pub mod fabric;
pub mod output;
pub mod plot;
pub mod queue;
mod spec;
pub mod topo;
pub mod traffic;

use std::fmt;

pub use fabric::{Config, Ecn, Fabric, Failure, Report};
pub use topo::Topology;
pub use traffic::{Flow, Op, Traffic};

/// Virtual time in picoseconds.
pub type Ps = u64;
pub const PS_PER_NS: Ps = 1_000;
pub const PS_PER_US: Ps = 1_000_000;
pub const PS_PER_MS: Ps = 1_000_000_000;
pub const PS_PER_S: Ps = 1_000_000_000_000;

/// A configuration or input error, with what was wrong in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl Error {
    pub fn new(s: impl Into<String>) -> Error {
        Error(s.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn split_unit(s: &str) -> (&str, &str) {
    let i = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    // "1e" followed by a unit letter is not an exponent: back off.
    let (mut num, mut unit) = s.split_at(i);
    while num.ends_with('e') || num.ends_with('+') || num.ends_with('-') {
        let j = num.len() - 1;
        unit = &s[j..];
        num = &s[..j];
    }
    (num, unit)
}

fn number(s: &str, what: &str) -> Result<f64, Error> {
    let v: f64 = s
        .parse()
        .map_err(|_| Error::new(format!("{what}: `{s}` is not a number")))?;
    if !v.is_finite() || v < 0.0 {
        return Err(Error::new(format!(
            "{what}: `{s}` is not a non-negative number"
        )));
    }
    Ok(v)
}

/// A link rate: `100G`, `100Gbps`, `400Gb/s`, `25000M`, `10000000000`
/// (bits per second).
pub fn parse_rate(s: &str) -> Result<u64, Error> {
    let (num, unit) = split_unit(s.trim());
    let v = number(num, "rate")?;
    let mult = match unit
        .to_ascii_lowercase()
        .trim_end_matches("/s")
        .trim_end_matches("bps")
    {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        _ => return Err(Error::new(format!("rate `{s}`: unknown unit `{unit}`"))),
    };
    let bps = v * mult;
    if !(1e3..=1e15).contains(&bps) {
        return Err(Error::new(format!("rate `{s}`: must be 1 kb/s..1 Pb/s")));
    }
    Ok(bps.round() as u64)
}

/// A duration: `1us`, `1000ns`, `0.001ms`, `2s`, `500ps` (a bare number is
/// seconds, as in HPCC's and ns-3's files).
pub fn parse_time(s: &str) -> Result<Ps, Error> {
    let (num, unit) = split_unit(s.trim());
    let v = number(num, "time")?;
    let mult = match unit {
        "ps" => 1.0,
        "ns" => 1e3,
        "us" | "µs" => 1e6,
        "ms" => 1e9,
        "" | "s" => 1e12,
        _ => return Err(Error::new(format!("time `{s}`: unknown unit `{unit}`"))),
    };
    let ps = v * mult;
    if ps > 1e18 {
        return Err(Error::new(format!("time `{s}`: too long")));
    }
    Ok(ps.round() as Ps)
}

/// A byte count: `4096`, `64K`, `1M`, `2G` (decimal, as flow sizes are
/// written in the traffic literature) or `64KiB`, `1MiB` (binary).
pub fn parse_size(s: &str) -> Result<u64, Error> {
    let (num, unit) = split_unit(s.trim());
    let v = number(num, "size")?;
    let mult = match unit {
        "" | "B" => 1.0,
        "K" | "k" | "KB" | "kB" => 1e3,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        _ => return Err(Error::new(format!("size `{s}`: unknown unit `{unit}`"))),
    };
    let b = v * mult;
    if b > 1e15 {
        return Err(Error::new(format!("size `{s}`: too large")));
    }
    Ok(b.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_rate("100Gbps").unwrap(), 100_000_000_000);
        assert_eq!(parse_rate("400G").unwrap(), 400_000_000_000);
        assert_eq!(parse_rate("25Gb/s").unwrap(), 25_000_000_000);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0G").is_err());
        assert_eq!(parse_time("0.001ms").unwrap(), 1_000_000);
        assert_eq!(parse_time("1us").unwrap(), 1_000_000);
        assert_eq!(parse_time("2").unwrap(), 2 * PS_PER_S);
        assert_eq!(parse_time("1e-6").unwrap(), 1_000_000);
        assert!(parse_time("1 fortnight").is_err());
        assert_eq!(parse_size("1M").unwrap(), 1_000_000);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert!(parse_size("-1").is_err());
    }
}
