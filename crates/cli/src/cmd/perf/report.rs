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

/// Latency statistics in microseconds (computed by `bench::lat_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
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
}
