//! Topologies: which nodes exist, how they are linked, and the routes
//! (equal-cost next hops per switch and destination) derived from them.
//!
//! Built-in shapes are given as `name:key=value,...` specs (see
//! [`Topology::from_spec`]); HPCC's topology file format is read by
//! [`Topology::from_hpcc`]. Node ids are what traffic files refer to: in the
//! built-in shapes hosts come first (`0..hosts`), then switches.

use std::collections::HashMap;
use std::fmt;

use crate::spec::Params;
use crate::{parse_rate, parse_time, Error, Ps, PS_PER_NS};

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Host,
    /// A switch and its tier (0 = ToR/leaf/edge, 1 = aggregation/spine,
    /// 2 = core), used to report pauses and utilisation per tier.
    Switch {
        tier: u8,
    },
}

/// A full-duplex link between two nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSpec {
    pub a: usize,
    pub b: usize,
    pub rate_bps: u64,
    pub delay: Ps,
    /// Routes may use the link only from `a` to `b` (the ring's clockwise
    /// routing that builds a cyclic buffer dependency); packets still flow
    /// both ways (ACKs go back the other way round).
    pub one_way: bool,
}

/// Nodes, links and the parameters they were built from.
#[derive(Debug, Clone)]
pub struct Topology {
    pub name: String,
    pub kinds: Vec<Kind>,
    pub links: Vec<LinkSpec>,
}

const G100: u64 = 100_000_000_000;
const US: Ps = 1_000 * PS_PER_NS;

impl Topology {
    /// A built-in shape:
    ///
    /// * `dumbbell:n=N[,rate=100G,bottleneck=RATE,delay=1us]`: hosts
    ///   `0..N` on a left switch, `N..2N` on a right switch, one link between
    ///   the switches (at `bottleneck`, default `rate`).
    /// * `fattree:k=K[,oversub=1,rate=100G,fabric=RATE,delay=1us]`: the
    ///   three-tier k-ary fat tree (k pods of k/2 edge and k/2 aggregation
    ///   switches, (k/2)² cores); each edge switch has `k/2 × oversub` hosts.
    /// * `leafspine:leaves=L,spines=S,hosts=H[,rate=100G,fabric=RATE,delay=1us]`.
    /// * `ring:n=N[,hosts=1,rate=100G,delay=1us]`: N switches in a ring,
    ///   routed clockwise only; `hosts` on each.
    /// * `star:n=N[,rate=100G,delay=1us]`: N hosts on one switch.
    /// * `clos:pods=P,tors=T,aggs=A,cores=C,hosts=H[,rate,fabric,delay]`: a
    ///   three-tier Clos: each pod's T ToRs (H hosts each) link to its A
    ///   aggregation switches; aggregation switch a of every pod links to
    ///   cores a·C/A .. (a+1)·C/A. Numbered and linked in the order of
    ///   HPCC's `mix/fat.txt`, which is
    ///   `clos:pods=5,tors=4,aggs=4,cores=16,hosts=16,fabric=400G`.
    pub fn from_spec(spec: &str) -> Result<Topology, Error> {
        let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
        let mut p = Params::parse(spec, rest)?;
        let t = match name {
            "dumbbell" => {
                let n = p.count("n", None)?;
                let rate = p.rate("rate", G100)?;
                let bn = p.rate("bottleneck", rate)?;
                let delay = p.time("delay", US)?;
                dumbbell(n, rate, bn, delay)?
            }
            "fattree" => {
                let k = p.count("k", None)?;
                let over = p.count("oversub", Some(1))?;
                let rate = p.rate("rate", G100)?;
                let fabric = p.rate("fabric", rate)?;
                let delay = p.time("delay", US)?;
                fat_tree(k, over, rate, fabric, delay)?
            }
            "leafspine" => {
                let leaves = p.count("leaves", None)?;
                let spines = p.count("spines", None)?;
                let hosts = p.count("hosts", None)?;
                let rate = p.rate("rate", G100)?;
                let fabric = p.rate("fabric", rate)?;
                let delay = p.time("delay", US)?;
                leaf_spine(leaves, spines, hosts, rate, fabric, delay)?
            }
            "ring" => {
                let n = p.count("n", None)?;
                let hosts = p.count("hosts", Some(1))?;
                let rate = p.rate("rate", G100)?;
                let delay = p.time("delay", US)?;
                ring(n, hosts, rate, delay)?
            }
            "clos" => {
                let pods = p.count("pods", None)?;
                let tors = p.count("tors", None)?;
                let aggs = p.count("aggs", None)?;
                let cores = p.count("cores", None)?;
                let hosts = p.count("hosts", None)?;
                let rate = p.rate("rate", G100)?;
                let fabric = p.rate("fabric", rate)?;
                let delay = p.time("delay", US)?;
                clos(pods, tors, aggs, cores, hosts, rate, fabric, delay)?
            }
            "star" => {
                let n = p.count("n", None)?;
                let rate = p.rate("rate", G100)?;
                let delay = p.time("delay", US)?;
                star(n, rate, delay)?
            }
            _ => {
                return Err(Error::new(format!(
                "unknown topology `{name}` (dumbbell, fattree, leafspine, ring, star, or a file)"
            )))
            }
        };
        p.done()?;
        Ok(Topology {
            name: spec.to_string(),
            ..t
        })
    }

    /// HPCC's topology file (`mix/fat.txt`): `nodes switches links`, then
    /// the switch ids, then one `src dst rate delay error_rate` per link.
    /// Switch tiers are not in the file; they are inferred from the
    /// distance to the nearest host (1 hop = tier 0).
    pub fn from_hpcc(name: &str, text: &str) -> Result<Topology, Error> {
        let mut tok = text.split_whitespace();
        let mut next = |what: &str| {
            tok.next()
                .ok_or_else(|| Error::new(format!("{name}: ends before {what}")))
        };
        let num = |s: &str, what: &str| -> Result<usize, Error> {
            s.parse()
                .map_err(|_| Error::new(format!("{name}: {what} `{s}` is not a number")))
        };
        let nodes = num(next("the node count")?, "node count")?;
        let switches = num(next("the switch count")?, "switch count")?;
        let nlinks = num(next("the link count")?, "link count")?;
        if nodes == 0 || nodes > 1 << 20 || switches > nodes || nlinks > 1 << 24 {
            return Err(Error::new(format!(
                "{name}: implausible sizes {nodes} {switches} {nlinks}"
            )));
        }
        let mut kinds = vec![Kind::Host; nodes];
        for _ in 0..switches {
            let id = num(next("a switch id")?, "switch id")?;
            if id >= nodes {
                return Err(Error::new(format!(
                    "{name}: switch id {id} ≥ {nodes} nodes"
                )));
            }
            kinds[id] = Kind::Switch { tier: 0 };
        }
        let mut links = Vec::with_capacity(nlinks.min(1 << 20));
        for i in 0..nlinks {
            let a = num(next("a link's source")?, "link source")?;
            let b = num(next("a link's destination")?, "link destination")?;
            let rate = parse_rate(next("a link's rate")?)?;
            let delay = parse_time(next("a link's delay")?)?;
            let err = next("a link's error rate")?;
            let err: f64 = err
                .parse()
                .map_err(|_| Error::new(format!("{name}: link {i}: error rate `{err}`")))?;
            if a >= nodes || b >= nodes || a == b {
                return Err(Error::new(format!("{name}: link {i}: nodes {a}-{b}")));
            }
            if err != 0.0 {
                return Err(Error::new(format!(
                    "{name}: link {i}: error rate {err}: lossy links are not modelled (use 0)"
                )));
            }
            links.push(LinkSpec {
                a,
                b,
                rate_bps: rate,
                delay,
                one_way: false,
            });
        }
        let mut t = Topology {
            name: name.to_string(),
            kinds,
            links,
        };
        t.infer_tiers();
        t.validate()?;
        Ok(t)
    }

    /// Tier of each switch = hops to the nearest host − 1.
    fn infer_tiers(&mut self) {
        let n = self.kinds.len();
        let adj = self.adjacency();
        let mut dist = vec![usize::MAX; n];
        let mut q = std::collections::VecDeque::new();
        for (i, k) in self.kinds.iter().enumerate() {
            if *k == Kind::Host {
                dist[i] = 0;
                q.push_back(i);
            }
        }
        while let Some(u) = q.pop_front() {
            for &(v, _) in &adj[u] {
                if dist[v] == usize::MAX {
                    dist[v] = dist[u] + 1;
                    q.push_back(v);
                }
            }
        }
        for (i, k) in self.kinds.iter_mut().enumerate() {
            if let Kind::Switch { tier } = k {
                *tier = dist[i].saturating_sub(1).min(255) as u8;
            }
        }
    }

    fn adjacency(&self) -> Vec<Vec<(usize, usize)>> {
        let mut adj = vec![Vec::new(); self.kinds.len()];
        for (i, l) in self.links.iter().enumerate() {
            adj[l.a].push((l.b, i));
            adj[l.b].push((l.a, i));
        }
        adj
    }

    /// Every host has exactly one link, to a switch; no two nodes are
    /// linked twice in the same direction... (parallel links are allowed:
    /// ECMP treats them as separate next hops).
    pub fn validate(&self) -> Result<(), Error> {
        let mut host_links = vec![0u32; self.kinds.len()];
        for l in &self.links {
            for (x, y) in [(l.a, l.b), (l.b, l.a)] {
                if self.kinds[x] == Kind::Host {
                    host_links[x] += 1;
                    if self.kinds[y] == Kind::Host {
                        return Err(Error::new(format!(
                            "{}: hosts {x} and {y} are linked directly (a host connects to a switch)",
                            self.name
                        )));
                    }
                }
            }
            if l.rate_bps == 0 {
                return Err(Error::new(format!(
                    "{}: link {}-{} has rate 0",
                    self.name, l.a, l.b
                )));
            }
        }
        for (i, k) in self.kinds.iter().enumerate() {
            if *k == Kind::Host && host_links[i] != 1 {
                return Err(Error::new(format!(
                    "{}: host {i} has {} links (a host has exactly one NIC port)",
                    self.name, host_links[i]
                )));
            }
        }
        Ok(())
    }

    /// The topology in HPCC's file format (rates in Gbps, delays in ns).
    pub fn to_hpcc(&self) -> String {
        use std::fmt::Write as _;
        let switches: Vec<String> = self
            .kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| **k != Kind::Host)
            .map(|(i, _)| i.to_string())
            .collect();
        let mut s = format!(
            "{} {} {}\n{}\n",
            self.kinds.len(),
            switches.len(),
            self.links.len(),
            switches.join(" ")
        );
        for l in &self.links {
            let _ = writeln!(
                s,
                "{} {} {}Gbps {}ns 0.000000",
                l.a,
                l.b,
                l.rate_bps as f64 / 1e9,
                l.delay as f64 / 1e3
            );
        }
        s
    }

    pub fn hosts(&self) -> impl Iterator<Item = usize> + '_ {
        self.kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| **k == Kind::Host)
            .map(|(i, _)| i)
    }

    pub fn is_host(&self, node: usize) -> bool {
        self.kinds.get(node) == Some(&Kind::Host)
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts = self.hosts().count();
        write!(
            f,
            "{}: {} hosts, {} switches, {} links",
            self.name,
            hosts,
            self.kinds.len() - hosts,
            self.links.len()
        )
    }
}

fn link(a: usize, b: usize, rate_bps: u64, delay: Ps) -> LinkSpec {
    LinkSpec {
        a,
        b,
        rate_bps,
        delay,
        one_way: false,
    }
}

fn build(name: &str, hosts: usize, tiers: &[u8], links: Vec<LinkSpec>) -> Result<Topology, Error> {
    let mut kinds = vec![Kind::Host; hosts];
    kinds.extend(tiers.iter().map(|&tier| Kind::Switch { tier }));
    let t = Topology {
        name: name.to_string(),
        kinds,
        links,
    };
    t.validate()?;
    Ok(t)
}

fn check_size(what: &str, n: usize, lo: usize, hi: usize) -> Result<(), Error> {
    if n < lo || n > hi {
        return Err(Error::new(format!("{what}={n}: must be {lo}..={hi}")));
    }
    Ok(())
}

fn dumbbell(n: usize, rate: u64, bn: u64, delay: Ps) -> Result<Topology, Error> {
    check_size("dumbbell n", n, 1, 1 << 16)?;
    let (l, r) = (2 * n, 2 * n + 1);
    let mut links: Vec<_> = (0..n).map(|h| link(h, l, rate, delay)).collect();
    links.extend((n..2 * n).map(|h| link(h, r, rate, delay)));
    links.push(link(l, r, bn, delay));
    build("dumbbell", 2 * n, &[0, 0], links)
}

#[allow(clippy::too_many_arguments)]
fn clos(
    pods: usize,
    tors: usize,
    aggs: usize,
    cores: usize,
    per_tor: usize,
    rate: u64,
    fabric: u64,
    delay: Ps,
) -> Result<Topology, Error> {
    check_size("clos pods", pods, 1, 1024)?;
    check_size("clos tors", tors, 1, 1024)?;
    check_size("clos aggs", aggs, 1, 1024)?;
    check_size("clos hosts", per_tor, 1, 1024)?;
    if cores == 0 || !cores.is_multiple_of(aggs) {
        return Err(Error::new(format!(
            "clos cores={cores}: must be a multiple of aggs={aggs}"
        )));
    }
    let hosts = pods * tors * per_tor;
    let tor0 = hosts;
    let agg0 = tor0 + pods * tors;
    let core0 = agg0 + pods * aggs;
    let per_agg = cores / aggs;
    let mut links: Vec<_> = (0..hosts)
        .map(|h| link(h, tor0 + h / per_tor, rate, delay))
        .collect();
    for t in 0..pods * tors {
        let pod = t / tors;
        for a in 0..aggs {
            links.push(link(tor0 + t, agg0 + pod * aggs + a, fabric, delay));
        }
    }
    for g in 0..pods * aggs {
        let a = g % aggs;
        for c in 0..per_agg {
            links.push(link(agg0 + g, core0 + a * per_agg + c, fabric, delay));
        }
    }
    let mut tiers = vec![0u8; pods * tors];
    tiers.extend(std::iter::repeat_n(1, pods * aggs));
    tiers.extend(std::iter::repeat_n(2, cores));
    build("clos", hosts, &tiers, links)
}

fn star(n: usize, rate: u64, delay: Ps) -> Result<Topology, Error> {
    check_size("star n", n, 2, 1 << 16)?;
    let links = (0..n).map(|h| link(h, n, rate, delay)).collect();
    build("star", n, &[0], links)
}

fn fat_tree(k: usize, over: usize, rate: u64, fabric: u64, delay: Ps) -> Result<Topology, Error> {
    if k < 2 || !k.is_multiple_of(2) || k > 64 {
        return Err(Error::new(format!("fattree k={k}: must be even, 2..=64")));
    }
    check_size("fattree oversub", over, 1, 16)?;
    let half = k / 2;
    let per_edge = half * over;
    let hosts = k * half * per_edge;
    let edges = k * half;
    let aggs = k * half;
    let cores = half * half;
    let edge0 = hosts;
    let agg0 = edge0 + edges;
    let core0 = agg0 + aggs;
    let mut links = Vec::new();
    for h in 0..hosts {
        links.push(link(h, edge0 + h / per_edge, rate, delay));
    }
    for pod in 0..k {
        for e in 0..half {
            for a in 0..half {
                links.push(link(
                    edge0 + pod * half + e,
                    agg0 + pod * half + a,
                    fabric,
                    delay,
                ));
            }
        }
        for a in 0..half {
            for c in 0..half {
                links.push(link(
                    agg0 + pod * half + a,
                    core0 + a * half + c,
                    fabric,
                    delay,
                ));
            }
        }
    }
    let mut tiers = vec![0u8; edges];
    tiers.extend(std::iter::repeat_n(1, aggs));
    tiers.extend(std::iter::repeat_n(2, cores));
    build("fattree", hosts, &tiers, links)
}

fn leaf_spine(
    leaves: usize,
    spines: usize,
    per_leaf: usize,
    rate: u64,
    fabric: u64,
    delay: Ps,
) -> Result<Topology, Error> {
    check_size("leafspine leaves", leaves, 1, 4096)?;
    check_size("leafspine spines", spines, 1, 4096)?;
    check_size("leafspine hosts", per_leaf, 1, 4096)?;
    let hosts = leaves * per_leaf;
    let mut links: Vec<_> = (0..hosts)
        .map(|h| link(h, hosts + h / per_leaf, rate, delay))
        .collect();
    for l in 0..leaves {
        for s in 0..spines {
            links.push(link(hosts + l, hosts + leaves + s, fabric, delay));
        }
    }
    let mut tiers = vec![0u8; leaves];
    tiers.extend(std::iter::repeat_n(1, spines));
    build("leafspine", hosts, &tiers, links)
}

fn ring(n: usize, per: usize, rate: u64, delay: Ps) -> Result<Topology, Error> {
    check_size("ring n", n, 3, 4096)?;
    check_size("ring hosts", per, 1, 4096)?;
    let hosts = n * per;
    let mut links: Vec<_> = (0..hosts)
        .map(|h| link(h, hosts + h / per, rate, delay))
        .collect();
    for s in 0..n {
        links.push(LinkSpec {
            one_way: true,
            ..link(hosts + s, hosts + (s + 1) % n, rate, delay)
        });
    }
    build("ring", hosts, &vec![0u8; n], links)
}

/// Equal-cost next hops of every switch towards every host, as port
/// indices of the switch, interned: `set[table[switch_row * hosts + host]]`.
#[derive(Debug, Clone)]
pub struct Routes {
    /// Host node id → column.
    pub host_col: Vec<u32>,
    pub hosts: usize,
    /// Node id → row (switches only; `u32::MAX` for hosts).
    pub switch_row: Vec<u32>,
    pub table: Vec<u32>,
    /// Port set `i` is `ports[sets[i].0 .. sets[i].0 + sets[i].1]`.
    pub sets: Vec<(u32, u32)>,
    pub ports: Vec<u16>,
}

/// A node's view of its links: for each port, the link index and the far end.
#[derive(Debug, Clone, Copy)]
pub struct PortEnd {
    pub link: usize,
    pub peer: usize,
    pub peer_port: usize,
}

/// Ports of every node, in link order.
pub fn ports(t: &Topology) -> Vec<Vec<PortEnd>> {
    let mut ports: Vec<Vec<PortEnd>> = vec![Vec::new(); t.kinds.len()];
    for (i, l) in t.links.iter().enumerate() {
        let pa = ports[l.a].len();
        let pb = ports[l.b].len();
        ports[l.a].push(PortEnd {
            link: i,
            peer: l.b,
            peer_port: pb,
        });
        ports[l.b].push(PortEnd {
            link: i,
            peer: l.a,
            peer_port: pa,
        });
    }
    ports
}

impl Routes {
    /// Shortest paths over the links that are up (`up[link]`), honouring
    /// one-way routing links. A switch with no route to a host gets the
    /// empty set (its packets for that host are dropped and counted).
    pub fn compute(t: &Topology, ports: &[Vec<PortEnd>], up: &[bool]) -> Routes {
        let n = t.kinds.len();
        let mut host_col = vec![u32::MAX; n];
        let mut switch_row = vec![u32::MAX; n];
        let mut hosts = 0;
        let mut rows = 0;
        for (i, k) in t.kinds.iter().enumerate() {
            match k {
                Kind::Host => {
                    host_col[i] = hosts as u32;
                    hosts += 1;
                }
                Kind::Switch { .. } => {
                    switch_row[i] = rows as u32;
                    rows += 1;
                }
            }
        }
        let mut sets: Vec<(u32, u32)> = vec![(0, 0)];
        let mut flat: Vec<u16> = Vec::new();
        let mut interned: HashMap<Vec<u16>, u32> = HashMap::new();
        interned.insert(Vec::new(), 0);
        let mut table = vec![0u32; rows * hosts];
        let mut dist = vec![u32::MAX; n];
        let mut queue = Vec::with_capacity(n);
        // May a packet go from `u` out of port `p` (towards ports[u][p].peer)?
        let usable = |u: usize, p: &PortEnd| {
            let l = &t.links[p.link];
            up[p.link] && !(l.one_way && l.a != u)
        };
        for d in 0..n {
            if t.kinds[d] != Kind::Host {
                continue;
            }
            dist.iter_mut().for_each(|x| *x = u32::MAX);
            dist[d] = 0;
            queue.clear();
            queue.push(d);
            let mut head = 0;
            while head < queue.len() {
                let v = queue[head];
                head += 1;
                for pe in &ports[v] {
                    let u = pe.peer;
                    // u forwards to v through its port pe.peer_port.
                    if t.kinds[u] == Kind::Host || dist[u] != u32::MAX {
                        continue;
                    }
                    if !usable(u, &ports[u][pe.peer_port]) {
                        continue;
                    }
                    dist[u] = dist[v] + 1;
                    queue.push(u);
                }
            }
            let col = host_col[d] as usize;
            let mut set = Vec::new();
            for s in 0..n {
                if switch_row[s] == u32::MAX || dist[s] == u32::MAX {
                    continue;
                }
                set.clear();
                for (p, pe) in ports[s].iter().enumerate() {
                    let v = pe.peer;
                    let hop_ok = if t.kinds[v] == Kind::Host {
                        v == d
                    } else {
                        true
                    };
                    if hop_ok && dist[v] != u32::MAX && dist[v] + 1 == dist[s] && usable(s, pe) {
                        set.push(p as u16);
                    }
                }
                let id = match interned.get(&set) {
                    Some(&id) => id,
                    None => {
                        let id = sets.len() as u32;
                        sets.push((flat.len() as u32, set.len() as u32));
                        flat.extend_from_slice(&set);
                        interned.insert(set.clone(), id);
                        id
                    }
                };
                table[switch_row[s] as usize * hosts + col] = id;
            }
        }
        Routes {
            host_col,
            hosts,
            switch_row,
            table,
            sets,
            ports: flat,
        }
    }

    /// Next-hop ports of `switch` towards host `dst`.
    #[inline]
    pub fn next_hops(&self, switch: usize, dst: usize) -> &[u16] {
        let row = self.switch_row[switch] as usize;
        let col = self.host_col[dst] as usize;
        let (off, len) = self.sets[self.table[row * self.hosts + col] as usize];
        &self.ports[off as usize..(off + len) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fat_tree_sizes() {
        let t = Topology::from_spec("fattree:k=4").unwrap();
        assert_eq!(t.hosts().count(), 16);
        assert_eq!(t.kinds.len(), 16 + 8 + 8 + 4);
        assert_eq!(t.links.len(), 16 + 16 + 16);
        let t = Topology::from_spec("fattree:k=16").unwrap();
        assert_eq!(t.hosts().count(), 1024);
        let p = ports(&t);
        let up = vec![true; t.links.len()];
        let r = Routes::compute(&t, &p, &up);
        // Edge switch of host 0 towards a host in another pod: every agg.
        let edge = 1024;
        assert_eq!(r.next_hops(edge, 1023).len(), 8);
        // Towards its own host: the one down port.
        assert_eq!(r.next_hops(edge, 0), &[0]);
        // A core towards any host: one port (the pod's aggregation switch).
        let core = 1024 + 128 + 128;
        assert_eq!(r.next_hops(core, 5).len(), 1);
    }

    #[test]
    fn ring_routes_clockwise() {
        let t = Topology::from_spec("ring:n=4").unwrap();
        let p = ports(&t);
        let r = Routes::compute(&t, &p, &vec![true; t.links.len()]);
        // Switch 4 (ring position 0) to host 3 (on switch 7, position 3):
        // three hops clockwise, not one hop back.
        let hops = r.next_hops(4, 3);
        assert_eq!(hops.len(), 1);
        assert_eq!(p[4][hops[0] as usize].peer, 5);
    }

    #[test]
    fn hpcc_file() {
        let text =
            "4 2 3\n2 3\n0 2 100Gbps 0.001ms 0\n1 3 100Gbps 0.001ms 0\n2 3 400Gbps 0.001ms 0\n";
        let t = Topology::from_hpcc("mini", text).unwrap();
        assert_eq!(t.hosts().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(t.links[2].rate_bps, 400_000_000_000);
        assert_eq!(t.links[0].delay, 1_000_000);
        assert_eq!(t.kinds[2], Kind::Switch { tier: 0 });
        assert!(Topology::from_hpcc("bad", "4 2 3\n2 3\n0 2 100Gbps").is_err());
        assert!(Topology::from_hpcc("bad", "2 0 1\n0 1 1Gbps 1us 0").is_err());
    }

    #[test]
    fn hpcc_paper_topology() {
        // HPCC's mix/fat.txt: 376 nodes, 56 switches, 480 links; host 16 on
        // ToR 321; ToR 320 up to aggs 340..=343; agg 341 to cores 364..=367;
        // agg 344 (pod 1) to cores 360..=363.
        let t =
            Topology::from_spec("clos:pods=5,tors=4,aggs=4,cores=16,hosts=16,fabric=400G").unwrap();
        let text = t.to_hpcc();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("376 56 480"));
        let has = |a: usize, b: usize, r: &str| {
            text.contains(&format!("\n{a} {b} {r} 1000ns 0.000000\n"))
        };
        assert!(has(16, 321, "100Gbps"));
        assert!((340..=343).all(|a| has(320, a, "400Gbps")));
        assert!((364..=367).all(|c| has(341, c, "400Gbps")));
        assert!((360..=363).all(|c| has(344, c, "400Gbps")));
        let back = Topology::from_hpcc("x", &text).unwrap();
        assert_eq!(back.links, t.links);
        assert_eq!(back.kinds, t.kinds);
    }

    #[test]
    fn specs_are_checked() {
        for bad in [
            "fattree:k=3",
            "fattree",
            "dumbbell:n=2,colour=red",
            "mesh:n=3",
            "ring:n=2",
        ] {
            assert!(Topology::from_spec(bad).is_err(), "{bad}");
        }
    }
}
