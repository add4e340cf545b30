//! perftest's output: the same header lines, units and columns, so results
//! read (and parse) exactly like `ib_write_bw`'s and `ib_write_lat`'s.
//!
//! Units are perftest's: MB/sec means 2^20 bytes per second, Gb/sec means
//! 10^9 bits per second, MsgRate is millions of messages per second, and
//! latencies are microseconds — one-way (RTT/2) for send and write, the full
//! round trip for read and atomic, as perftest reports them.

use std::fmt::Write as _;

pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// The bandwidth table header.
pub fn bw_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// One bandwidth result.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BwResult {
    pub size: u64,
    pub iters: u64,
    /// Bytes per second.
    pub peak: f64,
    pub avg: f64,
    /// Messages per second.
    pub msg_rate: f64,
}

/// C's `%-W.Pf`.
fn left(v: f64, w: usize, p: usize) -> String {
    format!("{:<w$.p$}", v, w = w, p = p)
}

pub fn bw_row(r: &BwResult, gbits: bool) -> String {
    let f = if gbits { 125_000_000.0 } else { 1_048_576.0 };
    format!(
        " {:<7}    {:<10}       {}            {}\t\t   {}",
        r.size,
        r.iters,
        left(r.peak / f, 7, 2),
        left(r.avg / f, 7, 2),
        left(r.msg_rate / 1e6, 7, 6)
    )
}

/// Latency statistics in microseconds, or in cycles with `-C` (computed by
/// `bench::lat_stats`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatResult {
    pub size: u64,
    pub iters: u64,
    pub min: f64,
    pub max: f64,
    pub typical: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
    /// Every interval measured, in the order taken, in the same unit.
    pub intervals: Vec<f64>,
    /// `-D`: iterations per second over the measured window (then only
    /// `iters` and `avg` are measured, as perftest reports them).
    pub tps: Option<f64>,
}

/// C's `%g`: six significant digits, trailing zeros dropped, exponent form
/// below 1e-4 and from 1e6.
pub fn c_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v == 0.0 { "0".into() } else { v.to_string() };
    }
    let e = format!("{v:.5e}");
    let (mant, exp) = e.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    let trim = |t: &str| -> String {
        if t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t.to_string()
        }
    };
    if (-4..6).contains(&exp) {
        trim(&format!("{:.*}", (5 - exp) as usize, v))
    } else {
        format!(
            "{}e{}{:02}",
            trim(mant),
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

/// perftest's `-U` and `-H` lists, printed between the header and the
/// result row: `#, usec` (or `#, cycles`), then `i, interval` for every
/// interval in the order taken (`-U`) and for the sorted ones less the two
/// largest, which its statistics leave out too (`-H`); after either, the
/// result line and the header again. `None` with neither flag.
pub fn lat_samples(r: &LatResult, unsorted: bool, histogram: bool, cycles: bool) -> Option<String> {
    if !unsorted && !histogram {
        return None;
    }
    let units = if cycles { "cycles" } else { "usec" };
    let mut o = String::new();
    let mut list = |xs: &[f64]| {
        let _ = writeln!(o, "#, {units}");
        for (i, x) in xs.iter().enumerate() {
            let _ = writeln!(o, "{}, {}", i + 1, c_g(*x));
        }
    };
    if unsorted {
        list(&r.intervals);
    }
    if histogram {
        let mut d = r.intervals.clone();
        d.sort_by(|a, b| a.total_cmp(b));
        d.truncate(d.len().saturating_sub(2));
        list(&d);
    }
    let _ = writeln!(o, "{RESULT_LINE}");
    o.push_str(LAT_HEADER);
    Some(o)
}

/// perftest's latency header in duration mode (`-D`).
pub const LAT_DUR_HEADER: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// perftest's `REPORT_FMT_LAT_DUR` row with its tps column (perftest 4.5).
pub fn lat_dur_row(r: &LatResult) -> String {
    format!(
        " {:<7}       {}            {}        {}",
        r.size,
        r.iters,
        left(r.avg, 7, 2),
        left(r.tps.unwrap_or(0.0), 7, 2)
    )
}

pub fn lat_row(r: &LatResult) -> String {
    format!(
        " {:<7} {}          {}        {}      {}  \t       {}     \t{}\t\t{} \t\t{}",
        r.size,
        r.iters,
        left(r.min, 7, 2),
        left(r.max, 7, 2),
        left(r.typical, 7, 2),
        left(r.avg, 7, 2),
        left(r.stdev, 7, 2),
        left(r.p99, 7, 2),
        left(r.p999, 7, 2)
    )
}

/// The test banner perftest prints before the connection details.
pub struct Banner<'a> {
    pub title: &'a str,
    pub device: &'a str,
    pub qps: usize,
    pub conn: &'a str,
    pub tx_depth: u32,
    pub rx_depth: Option<u32>,
    pub cq_mod: Option<u32>,
    /// `-l` above 1.
    pub post_list: Option<u32>,
    pub mtu: u32,
    pub gid_index: i32,
    pub inline: u32,
    pub outstand_reads: Option<u32>,
    pub events: bool,
    /// `-R`: the QPs connected, and the parameters exchanged, by rdma_cm.
    pub rdma_cm: bool,
}

impl Banner<'_> {
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "{RESULT_LINE}");
        let _ = writeln!(o, "                    {}", self.title);
        let _ = writeln!(
            o,
            " Dual-port       : OFF\t\tDevice         : {}",
            self.device
        );
        let _ = writeln!(o, " Number of qps   : {}\t\tTransport type : IB", self.qps);
        let _ = writeln!(
            o,
            " Connection type : {}\t\tUsing SRQ      : OFF",
            self.conn
        );
        let _ = writeln!(o, " PCIe relax order: OFF");
        let _ = writeln!(o, " ibv_wr* API     : OFF");
        let _ = writeln!(o, " TX depth        : {}", self.tx_depth);
        if let Some(l) = self.post_list {
            let _ = writeln!(o, " Post List       : {}", l);
        }
        if let Some(r) = self.rx_depth {
            let _ = writeln!(o, " RX depth        : {}", r);
        }
        if let Some(c) = self.cq_mod {
            let _ = writeln!(o, " CQ Moderation   : {}", c);
        }
        let _ = writeln!(o, " Mtu             : {}[B]", self.mtu);
        let _ = writeln!(o, " Link type       : Ethernet");
        let _ = writeln!(o, " GID index       : {}", self.gid_index);
        if let Some(r) = self.outstand_reads {
            let _ = writeln!(o, " Outstand reads  : {}", r);
        }
        let _ = writeln!(o, " Max inline data : {}[B]", self.inline);
        if self.rdma_cm {
            let _ = writeln!(o, " rdma_cm QPs\t : ON");
            let _ = writeln!(o, " Data ex. method : rdma_cm");
        } else {
            let _ = writeln!(o, " rdma_cm QPs\t : OFF");
            let _ = writeln!(o, " Data ex. method : Ethernet");
        }
        if self.events {
            let _ = writeln!(o, " Using Events    : ON");
        }
        let _ = write!(o, "{RESULT_LINE}");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_match_perftest_printf() {
        let r = BwResult {
            size: 65536,
            iters: 5000,
            peak: 1_048_576.0 * 1234.5,
            avg: 1_048_576.0 * 1200.25,
            msg_rate: 19_204.0,
        };
        assert_eq!(
            bw_row(&r, false),
            " 65536      5000             1234.50            1200.25\t\t   0.019204"
        );
        let l = LatResult {
            size: 2,
            iters: 4,
            min: 1.0,
            max: 4.0,
            typical: 3.0,
            ..Default::default()
        };
        assert!(lat_row(&l).starts_with(" 2       4          1.00           4.00         3.00   "));
    }

    /// What glibc's printf("%g") prints for these (checked with printf(1)).
    #[test]
    fn c_g_is_printfs_g() {
        for (v, want) in [
            (0.0, "0"),
            (75595.0, "75595"),
            (129051.0, "129051"),
            (1234567.0, "1.23457e+06"),
            (0.0751121, "0.0751121"),
            (55.04213, "55.0421"),
            (1.111664, "1.11166"),
            (0.0500747, "0.0500747"),
            (689.5, "689.5"),
            (2.0, "2"),
            (0.00001234, "1.234e-05"),
            (0.0001, "0.0001"),
            (999999.5, "1e+06"),
            (100000.0, "100000"),
        ] {
            assert_eq!(c_g(v), want, "{v}");
        }
    }

    /// `ib_write_lat -U -H -n 6`'s layout: both lists, the sorted one two
    /// short, then the result line and the header again.
    #[test]
    fn samples_as_perftest_prints_them() {
        let r = LatResult {
            intervals: vec![55.0421, 1.11166, 0.100149, 0.0500747, 0.0500747],
            ..Default::default()
        };
        assert_eq!(lat_samples(&r, false, false, false), None);
        let want = format!(
            "#, usec\n1, 55.0421\n2, 1.11166\n3, 0.100149\n4, 0.0500747\n5, 0.0500747\n\
             #, usec\n1, 0.0500747\n2, 0.0500747\n3, 0.100149\n{RESULT_LINE}\n{LAT_HEADER}"
        );
        assert_eq!(lat_samples(&r, true, true, false).unwrap(), want);
        let c = LatResult {
            intervals: vec![1378.0, 728.0, 689.5],
            ..Default::default()
        };
        assert!(lat_samples(&c, false, true, true)
            .unwrap()
            .starts_with("#, cycles\n1, 689.5\n---"));
    }

    /// perftest 4.5 on this host (`ib_write_lat -D 5` through our
    /// libibverbs.so.1), byte for byte.
    #[test]
    fn duration_row_is_perftests() {
        let r = LatResult {
            size: 2,
            iters: 2995490,
            avg: 0.5007,
            tps: Some(997797.94),
            ..Default::default()
        };
        assert_eq!(
            lat_dur_row(&r),
            " 2             2995490            0.50           997797.94"
        );
        assert_eq!(
            LAT_DUR_HEADER,
            " #bytes        #iterations       t_avg[usec]    tps average"
        );
    }
}
