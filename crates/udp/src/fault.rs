//! Seeded fault injection on the send path, for testing the transport above
//! against a bad network without one.
//!
//! Each datagram a [`crate::Port`] sends draws, in this order, from one
//! ChaCha8 stream seeded by [`FaultConfig::seed`]: loss (the datagram is not
//! sent), corruption (one random bit of the finished datagram, ICRC
//! included, is flipped in a private copy), duplication (sent twice), and
//! reordering (held back and sent after the next datagram). The same seed,
//! configuration and sequence of sends gives the same faults.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use std::fmt;
use std::str::FromStr;

/// Probabilities (each 0.0..=1.0) of the faults applied per datagram sent.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// The datagram is dropped.
    pub loss: f64,
    /// The datagram is held back and sent after the next one.
    pub reorder: f64,
    /// The datagram is sent twice.
    pub dup: f64,
    /// One bit of the datagram is flipped after its ICRC was computed.
    pub corrupt: f64,
    pub seed: u64,
}

/// Why a fault specification could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultParseError(String);

impl fmt::Display for FaultParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (expected comma-separated key=value with keys loss, reorder, dup, corrupt \
             (probabilities 0..1) and seed (an integer), e.g. \
             \"loss=0.05,reorder=0.05,dup=0.01,corrupt=0.001,seed=7\")",
            self.0
        )
    }
}

impl std::error::Error for FaultParseError {}

impl FromStr for FaultConfig {
    type Err = FaultParseError;

    /// Parse `"loss=0.05,reorder=0.05,dup=0.01,corrupt=0.001,seed=7"`. Keys
    /// may appear in any order and be left out (0, seed 0); each at most once.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut c = FaultConfig::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| FaultParseError(format!("`{item}` is not key=value")))?;
            let (k, v) = (k.trim(), v.trim());
            if seen.contains(&k) {
                return Err(FaultParseError(format!("`{k}` given twice")));
            }
            let prob = |v: &str| -> Result<f64, FaultParseError> {
                let p: f64 = v
                    .parse()
                    .map_err(|_| FaultParseError(format!("{k}=`{v}` is not a number")))?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(FaultParseError(format!(
                        "{k}={v} is not a probability in 0..1"
                    )));
                }
                Ok(p)
            };
            match k {
                "loss" => c.loss = prob(v)?,
                "reorder" => c.reorder = prob(v)?,
                "dup" => c.dup = prob(v)?,
                "corrupt" => c.corrupt = prob(v)?,
                "seed" => {
                    c.seed = v.parse().map_err(|_| {
                        FaultParseError(format!("seed=`{v}` is not an unsigned integer"))
                    })?
                }
                _ => return Err(FaultParseError(format!("unknown key `{k}`"))),
            }
            seen.push(k);
        }
        Ok(c)
    }
}

impl fmt::Display for FaultConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss={},reorder={},dup={},corrupt={},seed={}",
            self.loss, self.reorder, self.dup, self.corrupt, self.seed
        )
    }
}

/// What to do with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Verdict {
    pub(crate) drop: bool,
    /// Flip this bit (index into the UDP payload, ICRC included).
    pub(crate) corrupt_bit: Option<usize>,
    pub(crate) dup: bool,
    pub(crate) reorder: bool,
}

/// The random source and the configuration.
pub(crate) struct Injector {
    cfg: FaultConfig,
    rng: ChaCha8Rng,
}

impl Injector {
    pub(crate) fn new(cfg: FaultConfig) -> Injector {
        Injector {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
        }
    }

    /// Decide the faults for a datagram of `len` bytes.
    pub(crate) fn decide(&mut self, len: usize) -> Verdict {
        let c = self.cfg;
        let mut v = Verdict {
            drop: self.rng.random::<f64>() < c.loss,
            ..Verdict::default()
        };
        if v.drop {
            return v;
        }
        if self.rng.random::<f64>() < c.corrupt && len > 0 {
            v.corrupt_bit = Some(self.rng.random_range(0..len * 8));
        }
        v.dup = self.rng.random::<f64>() < c.dup;
        v.reorder = self.rng.random::<f64>() < c.reorder;
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let c: FaultConfig = "loss=0.05,reorder=0.05,dup=0.01,corrupt=0.001,seed=7"
            .parse()
            .unwrap();
        assert_eq!(
            c,
            FaultConfig {
                loss: 0.05,
                reorder: 0.05,
                dup: 0.01,
                corrupt: 0.001,
                seed: 7
            }
        );
        assert_eq!(c.to_string().parse::<FaultConfig>().unwrap(), c);
        assert_eq!(
            " seed = 3 , loss=1 ".parse::<FaultConfig>().unwrap().seed,
            3
        );
        assert_eq!("".parse::<FaultConfig>().unwrap(), FaultConfig::default());
    }

    #[test]
    fn rejects_with_reasons() {
        for (s, why) in [
            ("loss", "is not key=value"),
            ("loss=x", "is not a number"),
            ("loss=1.5", "not a probability"),
            ("dup=-0.1", "not a probability"),
            ("seed=-1", "not an unsigned integer"),
            ("jitter=0.1", "unknown key `jitter`"),
            ("loss=0.1,loss=0.2", "given twice"),
        ] {
            let e = s.parse::<FaultConfig>().unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn same_seed_same_faults() {
        let c: FaultConfig = "loss=0.2,reorder=0.2,dup=0.2,corrupt=0.2,seed=9"
            .parse()
            .unwrap();
        let (mut a, mut b) = (Injector::new(c), Injector::new(c));
        let va: Vec<_> = (0..100).map(|_| a.decide(64)).collect();
        let vb: Vec<_> = (0..100).map(|_| b.decide(64)).collect();
        assert_eq!(va, vb);
        assert!(va.iter().any(|v| v.drop) && va.iter().any(|v| v.corrupt_bit.is_some()));
    }
}
