//! `softrdma decode FILE.pcap`: one line per RoCEv2 packet; a datagram to
//! QP 1 also shows its MAD (a CM message with its key fields, or another
//! class's header), on the same line before the ICRC verdict.

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use softrdma_wire::dissect::{dissect_all, to_json_at, Dissection, Line};
use softrdma_wire::pcap::PcapFile;

#[derive(clap::Args)]
pub struct Args {
    /// A classic pcap file of Ethernet frames (tcpdump -w, tshark -F pcap).
    file: PathBuf,
    /// Print JSON lines instead of text, one object per packet and a final
    /// summary object.
    #[arg(long)]
    json: bool,
    /// Exit with status 1 if any packet has a bad ICRC or is malformed.
    #[arg(long)]
    strict: bool,
}

#[derive(Default)]
struct Counts {
    roce: usize,
    icrc_bad: usize,
    malformed: usize,
    skipped: usize,
}

pub fn run(a: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let bytes =
        std::fs::read(&a.file).map_err(|e| format!("cannot read {}: {e}", a.file.display()))?;
    let file = PcapFile::parse(&bytes).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut c = Counts::default();
    for rec in file.records() {
        let rec = match rec {
            Ok(r) => r,
            Err(n) => {
                c.malformed += 1;
                if a.json {
                    writeln!(out, "{{\"frame\":{n},\"malformed\":\"pcap record cut short by the end of the file\"}}")?;
                } else {
                    writeln!(
                        out,
                        "{n:>6} MALFORMED: pcap record cut short by the end of the file"
                    )?;
                }
                break;
            }
        };
        // A frame may hold a UDP GSO train (a capture on a loopback
        // device): its packets are numbered frame.1, frame.2, ...
        let all = dissect_all(rec.data);
        let train = all.len() > 1;
        for (k, d) in all.iter().enumerate() {
            match d {
                Dissection::NotRoce => {
                    c.skipped += 1;
                    continue;
                }
                Dissection::Malformed { .. } => c.malformed += 1,
                Dissection::Roce { icrc, .. } => {
                    c.roce += 1;
                    if !icrc.ok() {
                        c.icrc_bad += 1;
                    }
                }
            }
            if a.json {
                let at = train.then_some((k + 1, all.len()));
                writeln!(out, "{}", to_json_at(rec.number, at, d))?;
            } else if train {
                writeln!(
                    out,
                    "{:>6} {}",
                    format!("{}.{}", rec.number, k + 1),
                    Line(d)
                )?;
            } else {
                writeln!(out, "{:>6} {}", rec.number, Line(d))?;
            }
        }
    }
    if a.json {
        writeln!(
            out,
            "{{\"summary\":{{\"roce\":{},\"icrc_ok\":{},\"icrc_bad\":{},\"malformed\":{},\"skipped\":{}}}}}",
            c.roce,
            c.roce - c.icrc_bad,
            c.icrc_bad,
            c.malformed,
            c.skipped
        )?;
    } else {
        writeln!(
            out,
            "{} RoCEv2 packets: {} ICRC ok, {} ICRC BAD; {} malformed; {} non-RoCE frames skipped",
            c.roce,
            c.roce - c.icrc_bad,
            c.icrc_bad,
            c.malformed,
            c.skipped
        )?;
    }
    out.flush()?;
    Ok(if a.strict && (c.icrc_bad > 0 || c.malformed > 0) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
