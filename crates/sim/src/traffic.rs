//! Traffic: the flows a run carries.
//!
//! A flow is one message between two hosts on its own RC (or UC) QP pair,
//! created when the flow starts and destroyed when it completes, as in
//! HPCC's simulator. Flows come from HPCC's flow file, from htsim's
//! connection-matrix (`.cm`) files, or from generators:
//! flow-size CDFs at a load (HPCC's `traffic_gen.py` semantics), N:1 incast,
//! permutation, and the ring AllReduce of distributed training (a DAG:
//! each step waits for the step before it on both neighbours).

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use crate::spec::Params;
use crate::topo::Topology;
use crate::{parse_size, parse_time, Error, Ps, PS_PER_S};

/// What a flow's message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE over RC (the default, as in HPCC's simulator).
    Write,
    /// SEND over RC into a posted receive.
    Send,
    /// RDMA READ over RC: the destination host reads from the source, so
    /// data still flows src → dst; the requester is `dst`.
    Read,
    /// RDMA WRITE over UC: no ACKs, no retransmission; lost packets lose the
    /// message (the receiver drops the rest of it).
    UcWrite,
}

impl Op {
    pub fn parse(s: &str) -> Result<Op, Error> {
        Ok(match s {
            "write" => Op::Write,
            "send" => Op::Send,
            "read" => Op::Read,
            "uc_write" => Op::UcWrite,
            _ => {
                return Err(Error::new(format!(
                    "op `{s}`: write, send, read or uc_write"
                )))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Send => "send",
            Op::Read => "read",
            Op::UcWrite => "uc_write",
        }
    }
}

/// One flow.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    pub src: usize,
    pub dst: usize,
    pub size: u64,
    /// Earliest start; a flow with dependencies starts at the later of this
    /// and the completion of the last of them.
    pub start: Ps,
    pub op: Op,
    /// Indices of flows that must complete first.
    pub after: Vec<u32>,
}

/// The flows of a run.
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    pub name: String,
    pub flows: Vec<Flow>,
}

/// WebSearch (DCTCP paper), as in HPCC's `traffic_gen/WebSearch_distribution.txt`:
/// (bytes, cumulative percent).
pub const WEBSEARCH: &[(f64, f64)] = &[
    (0.0, 0.0),
    (10e3, 15.0),
    (20e3, 20.0),
    (30e3, 30.0),
    (50e3, 40.0),
    (80e3, 53.0),
    (200e3, 60.0),
    (1e6, 70.0),
    (2e6, 80.0),
    (5e6, 90.0),
    (10e6, 97.0),
    (30e6, 100.0),
];

/// FB_Hadoop (Roy et al.), as in HPCC's `traffic_gen/FbHdp_distribution.txt`.
pub const FB_HADOOP: &[(f64, f64)] = &[
    (0.0, 0.0),
    (100.0, 1.0),
    (200.0, 2.0),
    (300.0, 5.0),
    (350.0, 15.0),
    (400.0, 20.0),
    (500.0, 30.0),
    (600.0, 40.0),
    (700.0, 50.0),
    (1e3, 60.0),
    (2e3, 67.0),
    (7e3, 70.0),
    (30e3, 72.0),
    (50e3, 82.0),
    (80e3, 87.0),
    (120e3, 90.0),
    (300e3, 95.0),
    (1e6, 97.5),
    (2e6, 99.0),
    (10e6, 100.0),
];

/// Most flows a generator makes (about 1 KB of memory each through a run).
pub const MAX_GENERATED: usize = 20_000_000;

/// Largest message one flow may carry (one work request).
pub const MAX_FLOW: u64 = softrdma_core::MAX_MSG_SIZE;

fn cdf_mean(cdf: &[(f64, f64)]) -> f64 {
    cdf.windows(2)
        .map(|w| (w[1].1 - w[0].1) / 100.0 * (w[0].0 + w[1].0) / 2.0)
        .sum()
}

/// Linear interpolation of the CDF at `u` ∈ [0, 100).
fn cdf_sample(cdf: &[(f64, f64)], u: f64) -> f64 {
    for w in cdf.windows(2) {
        if u <= w[1].1 {
            let span = w[1].1 - w[0].1;
            if span <= 0.0 {
                return w[1].0;
            }
            return w[0].0 + (w[1].0 - w[0].0) * (u - w[0].1) / span;
        }
    }
    cdf[cdf.len() - 1].0
}

fn parse_cdf(name: &str, text: &str) -> Result<Vec<(f64, f64)>, Error> {
    let mut v: Vec<(f64, f64)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut it = line.split_whitespace();
        let (Some(a), Some(b)) = (it.next(), it.next()) else {
            continue;
        };
        let (Ok(size), Ok(pct)) = (a.parse::<f64>(), b.parse::<f64>()) else {
            return Err(Error::new(format!(
                "{name}:{}: `{line}` is not `size percent`",
                i + 1
            )));
        };
        if !(size.is_finite() && size >= 0.0 && pct.is_finite() && (0.0..=100.0).contains(&pct)) {
            return Err(Error::new(format!(
                "{name}:{}: sizes are bytes ≥ 0 and percentages 0..=100",
                i + 1
            )));
        }
        if let Some(&(ls, lp)) = v.last() {
            if size < ls || pct < lp {
                return Err(Error::new(format!(
                    "{name}:{}: the CDF must not decrease",
                    i + 1
                )));
            }
        }
        v.push((size, pct));
    }
    if v.len() < 2 || v[v.len() - 1].1 != 100.0 {
        return Err(Error::new(format!(
            "{name}: a CDF needs two or more points, ending at 100"
        )));
    }
    if cdf_mean(&v) < 1.0 {
        return Err(Error::new(format!(
            "{name}: the CDF's mean flow size is under a byte"
        )));
    }
    Ok(v)
}

fn check_flow(t: &Topology, f: &Flow, what: &str) -> Result<(), Error> {
    if !t.is_host(f.src) || !t.is_host(f.dst) {
        return Err(Error::new(format!(
            "{what}: {} -> {}: both ends must be hosts of the topology",
            f.src, f.dst
        )));
    }
    if f.src == f.dst {
        return Err(Error::new(format!(
            "{what}: a flow from host {} to itself",
            f.src
        )));
    }
    if f.size == 0 || f.size > MAX_FLOW {
        return Err(Error::new(format!(
            "{what}: size {} must be 1..={MAX_FLOW} bytes (one work request)",
            f.size
        )));
    }
    Ok(())
}

impl Traffic {
    /// Check every flow against the topology and the dependency order.
    pub fn validate(&self, t: &Topology) -> Result<(), Error> {
        for (i, f) in self.flows.iter().enumerate() {
            check_flow(t, f, &format!("{} flow {i}", self.name))?;
            if f.after.iter().any(|&d| d as usize >= i) {
                return Err(Error::new(format!(
                    "{} flow {i}: depends on a later flow (dependencies point backwards)",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// A generator spec (`host_rate` is what load is relative to):
    ///
    /// * `websearch:load=0.3,duration=10ms[,start=0]`, `fbhadoop:...`,
    ///   `cdf:FILE,load=...,duration=...`: per-host Poisson arrivals with
    ///   mean gap `mean_size·8 / (host_rate·load)`, destination uniform
    ///   among the other hosts, size by linear interpolation of the CDF.
    /// * `incast:n=16,size=1M[,dst=0,op=write]`: the first n other hosts
    ///   send to `dst` at once.
    /// * `permutation:size=2M[,op=write]`: every host sends to one other,
    ///   a random derangement.
    /// * `allreduce:size=64M[,algo=ring|tree]`: AllReduce over all hosts in
    ///   id order, as distributed training runs it. Ring: 2(n−1) steps of
    ///   size/n bytes to the next host, each after the previous step of the
    ///   host and of its left neighbour. Tree: a binary tree, reduce up then
    ///   broadcast down, whole buffers.
    /// * `flow:src=0,dst=1,size=1M[,op=write,start=0]`: one flow.
    pub fn from_spec(
        spec: &str,
        t: &Topology,
        host_rate: u64,
        seed: u64,
    ) -> Result<Traffic, Error> {
        let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
        let mut p = Params::parse(spec, rest)?;
        let hosts: Vec<usize> = t.hosts().collect();
        if hosts.len() < 2 {
            return Err(Error::new(format!(
                "{spec}: the topology needs two or more hosts"
            )));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7472_6166_6669_6300);
        let op = match p.take("op") {
            Some(o) => Op::parse(o)?,
            None => Op::Write,
        };
        let mut flows = Vec::new();
        match name {
            "websearch" | "fbhadoop" | "cdf" => {
                let cdf = match name {
                    "websearch" => WEBSEARCH.to_vec(),
                    "fbhadoop" => FB_HADOOP.to_vec(),
                    _ => {
                        let file = p.req("file")?;
                        let text = std::fs::read_to_string(file)
                            .map_err(|e| Error::new(format!("{spec}: {file}: {e}")))?;
                        parse_cdf(file, &text)?
                    }
                };
                let load: f64 = p.req("load")?.parse().map_err(|_| Error::new(format!("{spec}: load")))?;
                if !(load > 0.0 && load <= 1.0) {
                    return Err(Error::new(format!("{spec}: load must be in (0, 1]")));
                }
                let duration = parse_time(p.req("duration")?)?;
                let start = p.take("start").map_or(Ok(0), parse_time)?;
                let mean = cdf_mean(&cdf);
                let gap_s = mean * 8.0 / (host_rate as f64 * load);
                for &src in &hosts {
                    let mut at = start as f64;
                    loop {
                        let u: f64 = rng.random::<f64>();
                        at += -(1.0 - u).ln() * gap_s * PS_PER_S as f64;
                        if at >= (start + duration) as f64 {
                            break;
                        }
                        let mut di = rng.random_range(0..hosts.len() - 1);
                        if hosts[di] >= src {
                            di += 1;
                        }
                        if flows.len() >= MAX_GENERATED {
                            return Err(Error::new(format!(
                                "{spec}: more than {MAX_GENERATED} flows; shorten the duration"
                            )));
                        }
                        let size = cdf_sample(&cdf, rng.random::<f64>() * 100.0).round().max(1.0);
                        flows.push(Flow {
                            src,
                            dst: hosts[di],
                            size: size as u64,
                            start: at as Ps,
                            op,
                            after: Vec::new(),
                        });
                    }
                }
                // Start order, ties by source: the order HPCC's flow file has.
                flows.sort_by_key(|f| (f.start, f.src));
            }
            "incast" => {
                let n = p.count("n", None)?;
                let size = parse_size(p.req("size")?)?;
                let dst = p.count("dst", Some(hosts[0]))?;
                let senders: Vec<usize> = hosts.iter().copied().filter(|&h| h != dst).take(n).collect();
                if senders.len() < n {
                    return Err(Error::new(format!("{spec}: only {} other hosts", senders.len())));
                }
                for src in senders {
                    flows.push(Flow { src, dst, size, start: 0, op, after: Vec::new() });
                }
            }
            "permutation" => {
                let size = parse_size(p.req("size")?)?;
                // A random derangement (Sattolo's algorithm gives one cycle).
                let mut perm: Vec<usize> = (0..hosts.len()).collect();
                for i in (1..perm.len()).rev() {
                    let j = rng.random_range(0..i);
                    perm.swap(i, j);
                }
                for (i, &j) in perm.iter().enumerate() {
                    flows.push(Flow {
                        src: hosts[i],
                        dst: hosts[j],
                        size,
                        start: 0,
                        op,
                        after: Vec::new(),
                    });
                }
            }
            "allreduce" => {
                let size = parse_size(p.req("size")?)?;
                let algo = p.take("algo").unwrap_or("ring");
                let n = hosts.len();
                match algo {
                    // Ring (NCCL's schedule): 2(n−1) steps of size/n to the
                    // next host, each after the host's previous step and the
                    // step that brought it its neighbour's chunk.
                    "ring" => {
                        let chunk = size.div_ceil(n as u64).max(1);
                        for s in 0..2 * (n - 1) {
                            for i in 0..n {
                                let mut after = Vec::new();
                                if s > 0 {
                                    after.push(((s - 1) * n + i) as u32);
                                    after.push(((s - 1) * n + (i + n - 1) % n) as u32);
                                }
                                flows.push(Flow {
                                    src: hosts[i],
                                    dst: hosts[(i + 1) % n],
                                    size: chunk,
                                    start: 0,
                                    op,
                                    after,
                                });
                            }
                        }
                    }
                    // Binary tree over the hosts in id order (parent of i is
                    // (i − 1) / 2): reduce up — i sends the whole buffer to
                    // its parent once both children's sends to it are done
                    // — then broadcast down, each host forwarding once it
                    // has the result.
                    "tree" => {
                        // Reduce flows leaves first: host i's (i ≥ 1) is
                        // flow n − 1 − i, after its children's.
                        let reduce = |i: usize| (n - 1 - i) as u32;
                        for i in (1..n).rev() {
                            let after = [2 * i + 1, 2 * i + 2].into_iter().filter(|&c| c < n).map(reduce).collect();
                            flows.push(Flow { src: hosts[i], dst: hosts[(i - 1) / 2], size, start: 0, op, after });
                        }
                        // Then the broadcast to host i (i ≥ 1), flow n − 2 + i.
                        for i in 1..n {
                            let parent = (i - 1) / 2;
                            let after = if parent == 0 {
                                [1usize, 2].into_iter().filter(|&c| c < n).map(reduce).collect()
                            } else {
                                vec![(n - 2 + parent) as u32]
                            };
                            flows.push(Flow { src: hosts[parent], dst: hosts[i], size, start: 0, op, after });
                        }
                    }
                    _ => return Err(Error::new(format!("{spec}: algo={algo}: ring or tree"))),
                }
            }
            "flow" => {
                let src = p.count("src", None)?;
                let dst = p.count("dst", None)?;
                let size = parse_size(p.req("size")?)?;
                let start = p.take("start").map_or(Ok(0), parse_time)?;
                flows.push(Flow { src, dst, size, start, op, after: Vec::new() });
            }
            _ => {
                return Err(Error::new(format!(
                    "unknown traffic `{name}` (websearch, fbhadoop, cdf, incast, permutation, allreduce, flow, or a file)"
                )))
            }
        }
        p.done()?;
        let tr = Traffic {
            name: spec.to_string(),
            flows,
        };
        tr.validate(t)?;
        Ok(tr)
    }

    /// HPCC's flow file: a count, then `src dst pg dport size start_s` per
    /// flow (priority group and destination port are read and ignored: all
    /// data shares one lossless class, the UDP port is RoCEv2's).
    pub fn from_hpcc(name: &str, text: &str) -> Result<Traffic, Error> {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let n: usize = lines
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| Error::new(format!("{name}: the first line is the flow count")))?;
        let mut flows = Vec::with_capacity(n.min(1 << 20));
        for (i, line) in lines.enumerate() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let bad = || {
                Error::new(format!(
                    "{name}:{}: `{line}` is not `src dst pg dport size start`",
                    i + 2
                ))
            };
            if f.len() < 6 {
                return Err(bad());
            }
            let src = f[0].parse().map_err(|_| bad())?;
            let dst = f[1].parse().map_err(|_| bad())?;
            let size = f[4].parse().map_err(|_| bad())?;
            let start_s: f64 = f[5].parse().map_err(|_| bad())?;
            if !(0.0..1e6).contains(&start_s) {
                return Err(bad());
            }
            flows.push(Flow {
                src,
                dst,
                size,
                start: (start_s * PS_PER_S as f64).round() as Ps,
                op: Op::Write,
                after: Vec::new(),
            });
        }
        if flows.len() != n {
            return Err(Error::new(format!(
                "{name}: says {n} flows, has {}",
                flows.len()
            )));
        }
        Ok(Traffic {
            name: name.to_string(),
            flows,
        })
    }

    /// htsim's connection matrix: `Nodes N`, `Connections C`, then
    /// `src->dst [start <ps>] [size <bytes>] [id n] ...` per flow. Flow
    /// start times are in picoseconds (htsim's `ConnectionMatrix::load`;
    /// its generators write spread_us × 10⁶). Triggers are not supported
    /// and are refused.
    pub fn from_htsim(name: &str, text: &str, default_size: u64) -> Result<Traffic, Error> {
        let mut flows = Vec::new();
        let mut declared = None;
        for (i, line) in text.lines().enumerate() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let bad = |why: &str| Error::new(format!("{name}:{}: {why}: `{line}`", i + 1));
            match w.first() {
                None => continue,
                Some(&"Nodes") => continue,
                Some(&"Connections") => {
                    declared = Some(
                        w.get(1)
                            .and_then(|s| s.parse::<usize>().ok())
                            .ok_or_else(|| bad("count"))?,
                    );
                    continue;
                }
                Some(&"Triggers") | Some(&"trigger") | Some(&"Failures") | Some(&"failure") => {
                    return Err(bad("triggers and failures are not supported in .cm files (use the allreduce generator, --fail)"));
                }
                Some(first) => {
                    let (s, d) = first
                        .split_once("->")
                        .ok_or_else(|| bad("expected src->dst"))?;
                    let src = s.parse().map_err(|_| bad("source"))?;
                    let dst = d.parse().map_err(|_| bad("destination"))?;
                    let mut f = Flow {
                        src,
                        dst,
                        size: default_size,
                        start: 0,
                        op: Op::Write,
                        after: Vec::new(),
                    };
                    let mut k = 1;
                    while k < w.len() {
                        let v = w.get(k + 1).ok_or_else(|| bad("a key without its value"))?;
                        match w[k] {
                            "start" => {
                                let ps: f64 = v.parse().map_err(|_| bad("start"))?;
                                if !(0.0..1e18).contains(&ps) {
                                    return Err(bad("start"));
                                }
                                f.start = ps.round() as Ps;
                            }
                            "size" => f.size = v.parse().map_err(|_| bad("size"))?,
                            "id" | "prio" => {}
                            "trigger" | "send_done_trigger" | "recv_done_trigger" => {
                                return Err(bad("triggers are not supported"));
                            }
                            other => return Err(bad(&format!("unknown key `{other}`"))),
                        }
                        k += 2;
                    }
                    flows.push(f);
                }
            }
        }
        if let Some(n) = declared {
            if n != flows.len() {
                return Err(Error::new(format!(
                    "{name}: says {n} connections, has {}",
                    flows.len()
                )));
            }
        }
        Ok(Traffic {
            name: name.to_string(),
            flows,
        })
    }

    /// A flow file by its first line: htsim's starts with `Nodes`, HPCC's
    /// with the count.
    pub fn from_file(path: &str) -> Result<Traffic, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::new(format!("{path}: {e}")))?;
        if text.trim_start().starts_with("Nodes") {
            Traffic::from_htsim(path, &text, 2_000_000)
        } else {
            Traffic::from_hpcc(path, &text)
        }
    }

    /// Bytes of all flows.
    pub fn bytes(&self) -> u64 {
        self.flows.iter().map(|f| f.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websearch_mean_matches_hpcc() {
        // The notes' figure: about 1.71 MB.
        let m = cdf_mean(WEBSEARCH);
        assert!((m - 1.71e6).abs() < 0.02e6, "{m}");
        assert_eq!(cdf_sample(WEBSEARCH, 15.0), 10e3);
        assert_eq!(cdf_sample(WEBSEARCH, 17.5), 15e3);
    }

    #[test]
    fn generated_load_is_the_asked_load() {
        let t = Topology::from_spec("star:n=16").unwrap();
        let tr =
            Traffic::from_spec("websearch:load=0.5,duration=1s", &t, 100_000_000_000, 1).unwrap();
        let offered = tr.bytes() as f64 * 8.0 / 16.0; // bits per host per second
        let ratio = offered / 50e9;
        assert!((0.8..1.2).contains(&ratio), "{ratio}");
        assert!(tr.flows.windows(2).all(|w| w[0].start <= w[1].start));
        assert!(tr.flows.iter().all(|f| f.src != f.dst));
    }

    #[test]
    fn permutation_is_a_derangement() {
        let t = Topology::from_spec("star:n=9").unwrap();
        let tr = Traffic::from_spec("permutation:size=1M", &t, 1, 3).unwrap();
        let mut dsts: Vec<_> = tr.flows.iter().map(|f| f.dst).collect();
        dsts.sort();
        assert_eq!(dsts, (0..9).collect::<Vec<_>>());
    }

    #[test]
    fn files() {
        let h = Traffic::from_hpcc("f", "2\n0 1 3 100 1000 2.0\n1 0 3 100 5 2.000001\n").unwrap();
        assert_eq!(h.flows[1].start, 2_000_001_000_000);
        assert!(Traffic::from_hpcc("f", "3\n0 1 3 100 1000 2.0\n").is_err());
        let c = Traffic::from_htsim(
            "c",
            "Nodes 4\nConnections 2\n0->1 id 1 start 0 size 100\n2->3 start 1500000 size 7\n",
            9,
        )
        .unwrap();
        assert_eq!(c.flows[1].start, 1_500_000);
        assert_eq!(c.flows[1].size, 7);
        assert!(Traffic::from_htsim("c", "Nodes 2\n0->1 trigger 1\n", 9).is_err());
    }

    #[test]
    fn bad_cdfs_are_refused() {
        for bad in [
            "0 0\n0 100\n",
            "0 0\n-5 100\n",
            "0 0\nNaN 100\n",
            "10 0\n5 100\n",
            "0 0\n100 90\n",
        ] {
            assert!(parse_cdf("f", bad).is_err(), "{bad:?}");
        }
        assert!(parse_cdf("f", "0 0\n1000 100\n").is_ok());
    }

    #[test]
    fn allreduce_dag() {
        let t = Topology::from_spec("star:n=4").unwrap();
        let tr = Traffic::from_spec("allreduce:size=4M", &t, 1, 0).unwrap();
        assert_eq!(tr.flows.len(), 6 * 4);
        assert_eq!(tr.flows[4 + 1].after, vec![1, 0]);
        let t = Topology::from_spec("star:n=7").unwrap();
        let tr = Traffic::from_spec("allreduce:size=1M,algo=tree", &t, 1, 0).unwrap();
        // 6 reduce flows then 6 broadcast flows.
        assert_eq!(tr.flows.len(), 12);
        // Leaves first (6 → 2 is flow 0); 1 → 0 (flow 5) after 3 → 1 and
        // 4 → 1 (flows 3 and 2).
        assert_eq!((tr.flows[0].src, tr.flows[0].dst), (6, 2));
        assert_eq!(
            (tr.flows[5].src, tr.flows[5].dst, tr.flows[5].after.clone()),
            (1, 0, vec![3, 2])
        );
        // 0 → 1 broadcast after both reductions into the root; 1 → 3 after 0 → 1.
        assert_eq!(
            (tr.flows[6].src, tr.flows[6].dst, tr.flows[6].after.clone()),
            (0, 1, vec![5, 4])
        );
        assert_eq!(
            (tr.flows[8].src, tr.flows[8].dst, tr.flows[8].after.clone()),
            (1, 3, vec![6])
        );
        tr.validate(&t).unwrap();
    }
}
