//! `softrdma sim`: the packet-level fabric simulator (softrdma-sim) on a
//! topology and traffic given as specs or files, writing `fct.txt`,
//! `summary.json`, the slowdown table, CSVs and plots into `--out`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use softrdma_core::cc::CcConfig;
use softrdma_sim::fabric::Config;
use softrdma_sim::{
    output, parse_rate, parse_size, parse_time, Ecn, Fabric, Failure, Topology, Traffic,
};

#[derive(clap::Args)]
pub struct Args {
    /// `fattree:k=8[,oversub=1,rate=100G,fabric=..,delay=1us]`,
    /// `dumbbell:n=2[,rate=..,bottleneck=..]`, `leafspine:leaves=L,spines=S,hosts=H`,
    /// `ring:n=4[,hosts=1]`, `star:n=N`, or a file in HPCC's topology format.
    #[arg(long)]
    topology: String,
    /// `websearch:load=0.3,duration=10ms`, `fbhadoop:...`, `cdf:file=F,load=..,duration=..`,
    /// `incast:n=16,size=1M`, `permutation:size=2M`, `allreduce:size=64M`,
    /// `flow:src=0,dst=1,size=1M`, or a flow file (HPCC's, or htsim's `.cm`).
    #[arg(long)]
    flows: String,
    /// Priority flow control on the data class: on (lossless) or off (drop-tail).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pfc: String,
    /// ECN marking: `hpcc` (HPCC's Kmin/Kmax/Pmax per port rate), `off`, or
    /// `kmin=5K,kmax=200K,pmax=0.01`.
    #[arg(long, default_value = "hpcc")]
    ecn: String,
    /// INT stamps on data packets (HPCC's telemetry; adds 42 bytes per packet).
    #[arg(long)]
    int: bool,
    /// Congestion control on every QP: none (line rate, go-back-N), dcqcn
    /// (the paper's parameters), dcqcn-nvidia (NVIDIA firmware defaults),
    /// timely or timely-patched (HPCC's simulator's parameters; change
    /// them as in `timely:seg=16K,init=0.1`), swift (htsim's constants),
    /// hpcc (needs --int).
    #[arg(long, default_value = "none", value_parser = crate::cmd::cc_spec)]
    cc: String,
    /// Loss recovery of every QP: sr (selective repeat, as softrdma peers
    /// negotiate by default) or gbn (go-back-N, as RNICs and rxe).
    #[arg(long, default_value = "sr", value_parser = ["sr", "gbn"])]
    recovery: String,
    /// Random loss: every packet crossing a link is dropped with this
    /// probability (0..1).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Path MTU of every QP.
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Shared buffer per switch (bytes; K/M suffixes).
    #[arg(long, default_value = "32M")]
    buffer: String,
    /// Dynamic-threshold factor of egress queues with PFC off.
    #[arg(long, default_value_t = 1.0)]
    alpha: f64,
    /// Local ACK timeout exponent of the QPs (4.096 µs × 2^t; 14, 67 ms,
    /// is perftest's and rdma-core's usual value: a QP behind a long PFC
    /// pause must not time out and resend what is only queued).
    #[arg(long, default_value_t = 14)]
    qp_timeout: u8,
    /// Stop at this simulated time even if flows remain.
    #[arg(long, default_value = "10s")]
    until: String,
    /// Queue sampling period (0 turns it off).
    #[arg(long, default_value = "10us")]
    sample: String,
    /// A link that fails: `A-B@TIME` (node ids), repeatable.
    #[arg(long = "fail")]
    fail: Vec<String>,
    /// Host link rate that generated loads are relative to (default: the
    /// topology's slowest host link).
    #[arg(long)]
    host_rate: Option<String>,
    /// Leave wall-clock figures out of summary.json, so that two runs with
    /// the same seed write byte-identical files.
    #[arg(long)]
    no_speed: bool,
    /// No progress line on stderr.
    #[arg(long, short)]
    quiet: bool,
    #[arg(long)]
    out: PathBuf,
}

fn parse_fail(s: &str) -> Result<Failure, String> {
    let (link, at) = s.split_once('@').ok_or(format!("--fail {s}: A-B@TIME"))?;
    let (a, b) = link
        .split_once('-')
        .ok_or(format!("--fail {s}: A-B@TIME"))?;
    Ok(Failure {
        at: parse_time(at).map_err(|e| e.to_string())?,
        a: a.parse().map_err(|_| format!("--fail {s}: node {a}"))?,
        b: b.parse().map_err(|_| format!("--fail {s}: node {b}"))?,
    })
}

fn parse_ecn(s: &str) -> Result<Ecn, String> {
    match s {
        "off" => return Ok(Ecn::Off),
        "hpcc" => return Ok(Ecn::Hpcc),
        _ => {}
    }
    let (mut kmin, mut kmax, mut pmax) = (None, None, None);
    for kv in s.split(',') {
        let (k, v) = kv
            .split_once('=')
            .ok_or(format!("--ecn {s}: key=value list"))?;
        match k {
            "kmin" => kmin = Some(parse_size(v).map_err(|e| e.to_string())?),
            "kmax" => kmax = Some(parse_size(v).map_err(|e| e.to_string())?),
            "pmax" => pmax = Some(v.parse::<f64>().map_err(|_| format!("--ecn pmax={v}"))?),
            _ => return Err(format!("--ecn: unknown key `{k}` (kmin, kmax, pmax)")),
        }
    }
    match (kmin, kmax, pmax) {
        (Some(kmin), Some(kmax), Some(pmax)) => Ok(Ecn::Red { kmin, kmax, pmax }),
        _ => Err(format!("--ecn {s}: needs kmin, kmax and pmax")),
    }
}

pub fn run(a: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let topo = if std::path::Path::new(&a.topology).is_file() {
        Topology::from_hpcc(&a.topology, &std::fs::read_to_string(&a.topology)?)?
    } else {
        Topology::from_spec(&a.topology)?
    };
    let host_rate = match &a.host_rate {
        Some(r) => parse_rate(r)?,
        None => {
            let ends = softrdma_sim::topo::ports(&topo);
            topo.hosts()
                .map(|h| topo.links[ends[h][0].link].rate_bps)
                .min()
                .unwrap_or(100_000_000_000)
        }
    };
    let traffic = if std::path::Path::new(&a.flows).is_file() {
        let t = Traffic::from_file(&a.flows)?;
        t.validate(&topo)?;
        t
    } else {
        Traffic::from_spec(&a.flows, &topo, host_rate, a.seed)?
    };
    let cfg = Config {
        seed: a.seed,
        mtu: a.mtu,
        pfc: a.pfc == "on",
        buffer: parse_size(&a.buffer)?,
        alpha: a.alpha,
        ecn: parse_ecn(&a.ecn)?,
        int: a.int,
        qp_timeout: a.qp_timeout,
        until: parse_time(&a.until)?,
        sample: parse_time(&a.sample)?,
        deadlock_check: 100 * softrdma_sim::PS_PER_US,
        failures: a
            .fail
            .iter()
            .map(|s| parse_fail(s))
            .collect::<Result<_, _>>()?,
        progress: !a.quiet,
        cc: CcConfig::parse(&a.cc).expect("clap checked the spec"),
        link_loss: a.loss,
        selective_repeat: a.recovery == "sr",
    };
    if !(0.0..1.0).contains(&a.loss) {
        return Err(format!("--loss {}: a probability in [0, 1)", a.loss).into());
    }
    let config_json = serde_json::json!({
        "seed": cfg.seed, "mtu": cfg.mtu, "pfc": cfg.pfc, "buffer": cfg.buffer,
        "alpha": cfg.alpha, "ecn": a.ecn, "int": cfg.int, "cc": a.cc,
        "qp_timeout": cfg.qp_timeout, "until": a.until, "sample": a.sample,
        "failures": a.fail, "recovery": a.recovery, "loss": a.loss,
    });
    if !a.quiet {
        eprintln!(
            "sim: {topo}; {} flows, {} bytes; pfc {}, ecn {}, cc {}, seed {}",
            traffic.flows.len(),
            traffic.bytes(),
            a.pfc,
            a.ecn,
            a.cc,
            a.seed
        );
    }
    let mut fab = Fabric::new(cfg, topo, traffic)?;
    let report = fab.run();
    if std::env::var_os("SIM_EVSTATS").is_some() {
        eprintln!("events by kind: {:?}", fab.evstats);
    }
    output::write_all(&a.out, &report, config_json, !a.no_speed)?;
    // Written with errors ignored: a closed stdout (`| head`) is not a
    // failed run, the files are written already.
    let mut out = std::io::stdout().lock();
    let c = &report.counters;
    let unfinished = report.flows.iter().filter(|f| f.end.is_none()).count();
    let _ = writeln!(
        out,
        "simulated {:.3} ms in {:.2} s wall: {} events ({:.2} M/s), {} packet-hops ({:.2} M/s)",
        report.now as f64 / 1e9,
        report.wall_s,
        c.events,
        c.events as f64 / report.wall_s.max(1e-9) / 1e6,
        c.packet_hops,
        c.packet_hops as f64 / report.wall_s.max(1e-9) / 1e6
    );
    let _ = writeln!(
        out,
        "flows: {} done, {} failed, {} unfinished; drops {}, pauses {}, ECN marks {}, CNPs {}, retransmits {}, timeouts {}",
        c.flows_done, c.flows_failed, unfinished, c.drops, c.pauses, c.ecn_marks, c.cnps, c.retransmits, c.timeouts
    );
    if let Some(d) = &report.deadlock {
        let _ = writeln!(
            out,
            "PFC DEADLOCK detected at {:.3} µs: cycle of paused non-empty ports {:?}",
            d.at as f64 / 1e6,
            d.ports
        );
    }
    let _ = write!(out, "{}", output::slowdown_table(&output::buckets(&report)));
    let _ = writeln!(out, "wrote {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}
