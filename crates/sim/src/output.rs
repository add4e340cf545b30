//! What a run writes: HPCC's `fct.txt` and `pfc.txt`, `summary.json`, the
//! FCT slowdown table by flow-size bucket, queue-length and link CSVs, and
//! SVG plots. Every file is a function of the [`Report`] alone, except the
//! wall-clock figures, which go only into `summary.json`'s `"speed"` object
//! (so `--no-speed` leaves every file byte-identical between runs).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;

use crate::fabric::{ip_of, Report};
use crate::plot::Plot;
use crate::{Error, Ps, PS_PER_NS, PS_PER_US};

/// One row of the slowdown table: flows sorted by size, in buckets of 5 %
/// of the flows (HPCC's `fct_analysis.py`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub max_size: u64,
    pub flows: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

/// Slowdown of a finished flow: FCT / standalone FCT, at least 1.
pub fn slowdown(fct: Ps, standalone: Ps) -> f64 {
    (fct as f64 / standalone.max(1) as f64).max(1.0)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    let k = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[k - 1]
}

/// The slowdown table over the flows that finished successfully.
pub fn buckets(r: &Report) -> Vec<Bucket> {
    let mut done: Vec<(u64, f64)> = r
        .flows
        .iter()
        .filter(|f| {
            f.status
                .is_some_and(|s| s == softrdma_core::wc::WcStatus::Success)
        })
        .filter_map(|f| f.end.map(|e| (f.size, slowdown(e - f.start, f.standalone))))
        .collect();
    done.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let n = done.len();
    let mut out = Vec::new();
    if n == 0 {
        return out;
    }
    let nb = 20.min(n);
    for b in 0..nb {
        let (lo, hi) = (b * n / nb, (b + 1) * n / nb);
        if lo == hi {
            continue;
        }
        let part = &done[lo..hi];
        let mut s: Vec<f64> = part.iter().map(|x| x.1).collect();
        s.sort_by(f64::total_cmp);
        out.push(Bucket {
            max_size: part[part.len() - 1].0,
            flows: part.len(),
            p50: pct(&s, 50.0),
            p95: pct(&s, 95.0),
            p99: pct(&s, 99.0),
        });
    }
    out
}

/// HPCC's `fct.txt`: `sip dip sport dport size start_ns fct_ns standalone_ns`,
/// one line per flow that completed successfully, in completion order
/// (failed flows are counted in `summary.json`).
pub fn fct_txt(r: &Report) -> String {
    let mut rows: Vec<(Ps, usize)> = r
        .flows
        .iter()
        .enumerate()
        .filter(|(_, f)| f.status == Some(softrdma_core::wc::WcStatus::Success))
        .filter_map(|(i, f)| f.end.map(|e| (e, i)))
        .collect();
    rows.sort();
    let mut s = String::with_capacity(rows.len() * 64);
    for (e, i) in rows {
        let f = &r.flows[i];
        let _ = writeln!(
            s,
            "{:08x} {:08x} {} {} {} {} {} {}",
            ip_of(f.src),
            ip_of(f.dst),
            f.sport,
            4791,
            f.size,
            f.start / PS_PER_NS,
            (e - f.start) / PS_PER_NS,
            f.standalone / PS_PER_NS
        );
    }
    s
}

/// HPCC's `pfc.txt`: `time_ns node node_type port type` (type 1 = pause,
/// 0 = resume; node type 1 = switch).
pub fn pfc_txt(r: &Report) -> String {
    let mut s = String::new();
    for e in &r.pfc {
        let _ = writeln!(
            s,
            "{} {} 1 {} {}",
            e.t / PS_PER_NS,
            e.node,
            e.port,
            e.pause as u8
        );
    }
    s
}

/// The slowdown table as text.
pub fn slowdown_table(b: &[Bucket]) -> String {
    let mut s = String::from("#  max_size      flows      p50      p95      p99\n");
    for x in b {
        let _ = writeln!(
            s,
            "{:>11} {:>10} {:>8.3} {:>8.3} {:>8.3}",
            x.max_size, x.flows, x.p50, x.p95, x.p99
        );
    }
    s
}

fn tier_name(t: Option<u8>) -> &'static str {
    match t {
        None => "host",
        Some(0) => "tor",
        Some(1) => "agg",
        Some(2) => "core",
        Some(_) => "tier3+",
    }
}

/// `summary.json`: configuration, counters, the slowdown table, per-tier
/// PFC and utilisation, and (unless `speed` is false) the wall-clock figures.
pub fn summary(r: &Report, config: serde_json::Value, speed: bool) -> serde_json::Value {
    let b = buckets(r);
    let c = &r.counters;
    let mut tiers = serde_json::Map::new();
    for name in ["host", "tor", "agg", "core", "tier3+"] {
        let ps: Vec<_> = r
            .ports
            .iter()
            .filter(|p| tier_name(p.tier) == name)
            .collect();
        if ps.is_empty() {
            continue;
        }
        let dur = r.now.max(1) as f64 / 1e12;
        let util: Vec<f64> = ps
            .iter()
            .map(|p| p.tx_bytes as f64 * 8.0 / (p.rate as f64 * dur))
            .collect();
        tiers.insert(
            name.to_string(),
            json!({
                "ports": ps.len(),
                "pauses_sent": ps.iter().map(|p| p.pauses_sent).sum::<u64>(),
                "pauses_received": ps.iter().map(|p| p.pauses_rcvd).sum::<u64>(),
                "paused_us": ps.iter().map(|p| p.paused_ps).sum::<u64>() / PS_PER_US,
                "drops": ps.iter().map(|p| p.drops).sum::<u64>(),
                "ecn_marks": ps.iter().map(|p| p.ecn_marks).sum::<u64>(),
                "peak_queue_bytes": ps.iter().map(|p| p.peak_bytes).max().unwrap_or(0),
                "mean_utilisation": round6(util.iter().sum::<f64>() / util.len() as f64),
                "max_utilisation": round6(util.iter().cloned().fold(0.0, f64::max)),
            }),
        );
    }
    let unfinished = r.flows.iter().filter(|f| f.end.is_none()).count();
    let mut v = json!({
        "topology": r.topology,
        "traffic": r.traffic,
        "hosts": r.hosts,
        "switches": r.switches,
        "config": config,
        "simulated_ns": r.now / PS_PER_NS,
        "flows": {
            "total": r.flows.len(),
            "done": c.flows_done,
            "failed": c.flows_failed,
            "failed_no_qp": c.flows_no_qp,
            "unfinished": unfinished,
            "bytes": r.flows.iter().map(|f| f.size).sum::<u64>(),
        },
        "counters": {
            "events": c.events,
            "packet_hops": c.packet_hops,
            "host_tx_packets": c.host_tx_packets,
            "drops": c.drops,
            "drops_no_route": c.drops_no_route,
            "drops_link_down": c.drops_link_down,
            "drops_random": c.drops_random,
            "pauses": c.pauses,
            "resumes": c.resumes,
            "ecn_marks": c.ecn_marks,
            "ce_received": c.ce_received,
            "cnps": c.cnps,
            "retransmits": c.retransmits,
            "timeouts": c.timeouts,
            "seq_naks": c.seq_naks,
            "peak_packets_in_flight": r.peak_packets,
        },
        "tiers": tiers,
        "slowdown": b.iter().map(|x| json!({
            "max_size": x.max_size, "flows": x.flows,
            "p50": round6(x.p50), "p95": round6(x.p95), "p99": round6(x.p99),
        })).collect::<Vec<_>>(),
        "deadlock": r.deadlock.as_ref().map(|d| json!({
            "at_ns": d.at / PS_PER_NS,
            "cycle": d.ports.iter().map(|(n, p)| json!([n, p])).collect::<Vec<_>>(),
        })),
    });
    if speed {
        v["speed"] = json!({
            "wall_s": round6(r.wall_s),
            "events_per_s": (c.events as f64 / r.wall_s.max(1e-9)).round(),
            "packet_hops_per_s": (c.packet_hops as f64 / r.wall_s.max(1e-9)).round(),
            "simulated_s_per_wall_s": round6(r.now as f64 / 1e12 / r.wall_s.max(1e-9)),
        });
    }
    v
}

fn round6(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1e6).round() / 1e6
    } else {
        0.0
    }
}

/// Per-port CSV: utilisation, queues, pauses, drops.
pub fn links_csv(r: &Report) -> String {
    let mut s = String::from(
        "node,port,peer,tier,rate_bps,tx_bytes,tx_packets,utilisation,peak_queue_bytes,pauses_sent,pauses_received,paused_us,drops,ecn_marks\n",
    );
    let dur = r.now.max(1) as f64 / 1e12;
    for p in &r.ports {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{:.6},{},{},{},{},{},{}",
            p.node,
            p.port,
            p.peer,
            tier_name(p.tier),
            p.rate,
            p.tx_bytes,
            p.tx_pkts,
            p.tx_bytes as f64 * 8.0 / (p.rate as f64 * dur),
            p.peak_bytes,
            p.pauses_sent,
            p.pauses_rcvd,
            p.paused_ps / PS_PER_US,
            p.drops,
            p.ecn_marks
        );
    }
    s
}

/// Queue samples: `time_ns,node,port,bytes` for every non-empty switch
/// egress queue at each sample.
pub fn qlen_csv(r: &Report) -> String {
    let mut s = String::from("time_ns,node,port,bytes\n");
    for (t, n, p, b) in &r.qlen {
        let _ = writeln!(s, "{},{},{},{}", t / PS_PER_NS, n, p, b);
    }
    s
}

/// Per-flow goodput: `time_ns,flow,bytes_delivered,gbps` (the rate over
/// the sample period ending then), for runs of few flows.
pub fn goodput_csv(r: &Report) -> String {
    let mut s = String::from("time_ns,flow,bytes,gbps\n");
    for (t, f, b, g) in goodput_rates(r) {
        let _ = writeln!(s, "{},{},{},{:.6}", t / PS_PER_NS, f, b, g);
    }
    s
}

/// (time, flow, bytes so far, Gb/s over the last period) from the samples.
pub fn goodput_rates(r: &Report) -> Vec<(Ps, u32, u64, f64)> {
    let mut last: std::collections::BTreeMap<u32, (Ps, u64)> = Default::default();
    let mut out = Vec::with_capacity(r.goodput.len());
    for &(t, f, b) in &r.goodput {
        let (t0, b0) = last
            .get(&f)
            .copied()
            .unwrap_or((t.saturating_sub(r.sample), 0));
        let dt = (t - t0).max(1) as f64 / 1e12;
        out.push((t, f, b, (b - b0) as f64 * 8.0 / dt / 1e9));
        last.insert(f, (t, b));
    }
    out
}

/// Jain's fairness index of the flows' goodput over `[from, to)` (1 is
/// perfectly fair), over the flows that were active then: sampled (so
/// started) by `to` and not finished by `from`. A flow that was active and
/// delivered nothing counts as a zero share — a starved flow makes the
/// split less fair, it does not leave the set. `None` if no flow was
/// active or none delivered a byte.
pub fn jain(r: &Report, from: Ps, to: Ps) -> Option<f64> {
    // Bytes delivered by `from` and by `to` (0 before a flow's first sample).
    let mut at: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
    for &(t, f, b) in &r.goodput {
        if t > to {
            continue;
        }
        let e = at.entry(f).or_insert((0, 0));
        if t <= from {
            e.0 = b;
        }
        e.1 = b;
    }
    let x: Vec<f64> = at
        .iter()
        .filter(|(&f, _)| {
            r.flows
                .get(f as usize)
                .is_none_or(|fl| fl.start < to && fl.end.is_none_or(|e| e > from))
        })
        .map(|(_, &(a, b))| b.saturating_sub(a) as f64)
        .collect();
    let sum: f64 = x.iter().sum();
    if x.is_empty() || sum <= 0.0 {
        return None;
    }
    let sq: f64 = x.iter().map(|v| v * v).sum();
    Some(sum * sum / (x.len() as f64 * sq))
}

/// The plots: FCT slowdown by size, the eight deepest queues over time,
/// PFC pause frames over time per tier.
pub fn plots(r: &Report) -> Vec<(&'static str, String)> {
    let b = buckets(r);
    let pts = |f: fn(&Bucket) -> f64| b.iter().map(|x| (x.max_size as f64, f(x))).collect();
    let fct = Plot::new(
        &format!("FCT slowdown by flow size — {}", r.traffic),
        "flow size (bytes, bucket maximum)",
        "FCT slowdown",
    )
    .log_x()
    .log_y()
    .markers()
    .series("p50", pts(|x| x.p50))
    .series("p95", pts(|x| x.p95))
    .series("p99", pts(|x| x.p99));

    // Deepest queues by peak (ties by node, port: deterministic).
    let mut deep: Vec<_> = r
        .ports
        .iter()
        .filter(|p| p.tier.is_some() && p.peak_bytes > 0)
        .collect();
    deep.sort_by(|a, b| {
        b.peak_bytes
            .cmp(&a.peak_bytes)
            .then((a.node, a.port).cmp(&(b.node, b.port)))
    });
    deep.truncate(8);
    let mut q = Plot::new(
        "Switch egress queues (deepest 8)",
        "time (µs)",
        "queue (KB)",
    );
    for p in &deep {
        let pts: Vec<(f64, f64)> = r
            .qlen
            .iter()
            .filter(|s| s.1 == p.node && s.2 == p.port)
            .map(|s| (s.0 as f64 / PS_PER_US as f64, s.3 as f64 / 1e3))
            .collect();
        q = q.series(&format!("sw{} p{} → {}", p.node, p.port, p.peer), pts);
    }

    let mut pfc = Plot::new(
        "PFC pause frames sent (cumulative)",
        "time (µs)",
        "pause frames",
    );
    for tier in [0u8, 1, 2] {
        let nodes: Vec<u32> = r
            .ports
            .iter()
            .filter(|p| p.tier == Some(tier))
            .map(|p| p.node)
            .collect();
        if nodes.is_empty() {
            continue;
        }
        let mut n = 0.0;
        let mut pts = vec![(0.0, 0.0)];
        for e in r
            .pfc
            .iter()
            .filter(|e| e.pause && nodes.binary_search(&e.node).is_ok())
        {
            n += 1.0;
            pts.push((e.t as f64 / PS_PER_US as f64, n));
        }
        pts.push((r.now as f64 / PS_PER_US as f64, n));
        pfc = pfc.series(tier_name(Some(tier)), pts);
    }
    let mut v = vec![
        ("fct_slowdown.svg", fct.to_svg()),
        ("qlen.svg", q.to_svg()),
        ("pfc.svg", pfc.to_svg()),
    ];
    if !r.goodput.is_empty() {
        let rates = goodput_rates(r);
        let mut flows: Vec<u32> = rates.iter().map(|x| x.1).collect();
        flows.sort();
        flows.dedup();
        let mut g = Plot::new("Goodput per flow", "time (µs)", "Gb/s");
        for f in flows {
            let pts = rates
                .iter()
                .filter(|x| x.1 == f)
                .map(|x| (x.0 as f64 / PS_PER_US as f64, x.3))
                .collect();
            g = g.series(&format!("flow {f}"), pts);
        }
        v.push(("goodput.svg", g.to_svg()));
    }
    v
}

/// Write every output file into `dir` (created if missing).
pub fn write_all(
    dir: &Path,
    r: &Report,
    config: serde_json::Value,
    speed: bool,
) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::new(format!("{}: {e}", dir.display())))?;
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| Error::new(format!("{}: {e}", p.display())))
    };
    write("fct.txt", &fct_txt(r))?;
    write("pfc.txt", &pfc_txt(r))?;
    write("slowdown.txt", &slowdown_table(&buckets(r)))?;
    write("links.csv", &links_csv(r))?;
    write("qlen.csv", &qlen_csv(r))?;
    if !r.goodput.is_empty() {
        write("goodput.csv", &goodput_csv(r))?;
    }
    let mut js =
        serde_json::to_string_pretty(&summary(r, config, speed)).expect("JSON values serialise");
    js.push('\n');
    write("summary.json", &js)?;
    for (name, svg) in plots(r) {
        write(name, &svg)?;
    }
    Ok(())
}
