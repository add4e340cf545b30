//! The results as Markdown: one table per group (a column per path MTU)
//! and the measured figures next to rxe's own.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::matrix::{Gid, Group, Ours, Program};
use crate::run::{Figure, Outcome};

fn cell(o: &Outcome) -> String {
    let mut s = if o.pass() {
        format!("pass ({:.1} s)", o.secs)
    } else {
        format!("**FAIL** ({:.1} s)", o.secs)
    };
    if o.rerun_of.is_some() {
        s += "; rerun after the VM hung";
    }
    for n in &o.notes {
        let _ = write!(s, "; {n}");
    }
    if o.combo.loss {
        let retx = o
            .counters
            .as_deref()
            .and_then(|c| c.split("retransmits ").nth(1))
            .and_then(|x| x.split(',').next())
            .unwrap_or("-");
        let lost = if crate::run::vm_loss(&o.combo) {
            format!(
                "netem dropped {}",
                o.netem_dropped.map_or("?".into(), |d| d.to_string())
            )
        } else {
            "only our side lossy".into()
        };
        let _ = write!(
            s,
            "; {lost}, resent on the wire {}, our retransmits {retx}",
            o.verdict.resent
        );
    }
    s
}

/// Every group's table, then the failures in full.
pub fn markdown(all: &[Outcome]) -> String {
    let mtus: Vec<u32> = {
        let mut m: Vec<u32> = all.iter().map(|o| o.path_mtu).collect();
        m.sort_unstable();
        m.dedup();
        m
    };
    let mut s = String::new();
    let mut groups: BTreeMap<Group, Vec<&Outcome>> = BTreeMap::new();
    for o in all {
        groups.entry(o.combo.group).or_default().push(o);
    }
    for (g, v) in &groups {
        let _ = writeln!(s, "### {}\n", g.title());
        let _ = write!(s, "| program | ours | GID |");
        for m in &mtus {
            let _ = write!(s, " path MTU {m} |");
        }
        let _ = write!(s, "\n| --- | --- | --- |");
        for _ in &mtus {
            let _ = write!(s, " --- |");
        }
        s.push('\n');
        // Rows in first-seen order.
        let mut keys: Vec<(String, &str, &str)> = Vec::new();
        for o in v {
            let k = row_key(o);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for k in &keys {
            let _ = write!(s, "| {} | {} | {} |", k.0, k.1, k.2);
            for m in &mtus {
                let c = v
                    .iter()
                    .find(|o| o.path_mtu == *m && row_key(o) == *k)
                    .map_or("not run".to_string(), |o| cell(o));
                let _ = write!(s, " {c} |");
            }
            s.push('\n');
        }
        s.push('\n');
    }
    let reruns: Vec<&Outcome> = all.iter().filter(|o| o.rerun_of.is_some()).collect();
    if !reruns.is_empty() {
        let _ = writeln!(s, "### Reruns after a VM hang\n");
        for o in reruns {
            let _ = writeln!(
                s,
                "* {} at path MTU {}: {}",
                o.combo,
                o.path_mtu,
                o.rerun_of.as_deref().unwrap_or("")
            );
        }
        s.push('\n');
    }
    let failed: Vec<&Outcome> = all.iter().filter(|o| !o.pass()).collect();
    if !failed.is_empty() {
        let _ = writeln!(s, "### Failures\n");
        for o in failed {
            let _ = writeln!(s, "* {} at path MTU {}:", o.combo, o.path_mtu);
            for p in &o.problems {
                let _ = writeln!(s, "  * {p}");
            }
        }
        s.push('\n');
    }
    s
}

fn row_key(o: &Outcome) -> (String, &'static str, &'static str) {
    let c = &o.combo;
    let mut name = c.program_name();
    if c.qps > 1 {
        name += &format!(" -q {}", c.qps);
    }
    if c.all {
        name += " -a";
    }
    let ours = match (c.program, c.ours) {
        (Program::RxePair(_), _) => "–",
        (_, Ours::Server) => "server",
        (_, Ours::Client) => "client",
    };
    let gid = match c.gid {
        Gid::V4 => "IPv4",
        Gid::V6 => "IPv6",
    };
    (name, ours, gid)
}

/// The one-QP perftest figures (IPv4 GID): ours as server, ours as client,
/// and rxe against rxe, per path MTU, with the ratio to rxe.
pub fn figures(all: &[Outcome]) -> String {
    let mut s = String::new();
    let mut mtus: Vec<u32> = all.iter().map(|o| o.path_mtu).collect();
    mtus.sort_unstable();
    mtus.dedup();
    let find = |m: u32, name: &str, g: Group, ours: Option<Ours>| {
        all.iter()
            .find(|o| {
                o.path_mtu == m
                    && o.pass()
                    && o.combo.group == g
                    && o.combo.gid == Gid::V4
                    && o.combo.program_name() == name
                    && ours.is_none_or(|w| o.combo.ours == w)
            })
            .and_then(|o| o.figure)
    };
    let show = |f: Option<Figure>| match f {
        Some(Figure::Bw { mb_s, .. }) => format!("{mb_s:.2} MB/s"),
        Some(Figure::Lat { typical, .. }) => format!("{typical:.1} µs"),
        None => "–".into(),
    };
    let val = |f: Option<Figure>| match f {
        Some(Figure::Bw { mb_s, .. }) => Some(mb_s),
        Some(Figure::Lat { typical, .. }) => Some(typical),
        None => None,
    };
    let ratio = |a: Option<Figure>, r: Option<Figure>| match (val(a), val(r)) {
        (Some(a), Some(r)) if r > 0.0 => format!("{:.2}", a / r),
        _ => "–".into(),
    };
    for m in mtus {
        let _ = writeln!(s, "Path MTU {m}:\n");
        let _ = writeln!(
            s,
            "| test | size | softrdma server, rxe client | rxe server, softrdma client | rxe against rxe | ratios to rxe |"
        );
        let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: |");
        let mut names: Vec<String> = Vec::new();
        for o in all.iter().filter(|o| o.combo.group == Group::Perftest) {
            let n = o.combo.program_name();
            if !names.contains(&n) {
                names.push(n);
            }
        }
        for n in names {
            let a = find(m, &n, Group::Perftest, Some(Ours::Server));
            let b = find(m, &n, Group::Perftest, Some(Ours::Client));
            let r = find(m, &n, Group::Reference, None);
            let size = [a, b, r]
                .into_iter()
                .flatten()
                .map(|f| match f {
                    Figure::Bw { size, .. } | Figure::Lat { size, .. } => size,
                })
                .next()
                .map_or("–".into(), |x| x.to_string());
            let _ = writeln!(
                s,
                "| {n} | {size} | {} | {} | {} | {} / {} |",
                show(a),
                show(b),
                show(r),
                ratio(a, r),
                ratio(b, r)
            );
        }
        s.push('\n');
    }
    s
}
