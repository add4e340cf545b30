//! Packet captures on the peer's bridge, and what the suite checks in them.
//!
//! Each combination is captured on its own (tcpdump in the namespace,
//! filtered to the VM's MAC so IPv4 and IPv6 RoCE are both seen, with
//! `--immediate-mode` so that stopping it loses nothing still buffered, and
//! a capture that lost frames fails the combination) and then:
//!
//! * decoded by `softrdma decode --strict`: every packet in both directions
//!   must carry a good ICRC and parse (the decoder recomputes the ICRC over
//!   the real IP headers, rxe's included);
//! * scanned for retransmissions: every packet with a payload (SEND and
//!   WRITE data, READ responses) seen more than once for the same
//!   destination QP and PSN must carry exactly the bytes of its first
//!   transmission, whichever side resent it ([`scan`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use softrdma_wire::frame::parse_ethernet_udp;
use softrdma_wire::pcap::PcapFile;
use softrdma_wire::{Packet, PacketRepr};

use crate::peer::Peer;
use crate::proc::{self, Running};

/// A running capture.
pub struct Capture {
    job: Running,
    pub path: PathBuf,
}

/// What tcpdump said when it stopped.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub captured: u64,
    pub received: u64,
    pub dropped: u64,
}

impl Capture {
    /// Capture RoCEv2 (UDP 4791) frames to or from the VM with MAC `mac`.
    pub fn start(peer: &Peer, path: &Path, mac: &str) -> Result<Capture, String> {
        let _ = std::fs::remove_file(path);
        let filter = format!("udp port 4791 and ether host {mac}");
        let p = path.to_string_lossy().to_string();
        let cmd = peer.ns(&[
            "tcpdump",
            "-i",
            "rxebr0",
            // Whole frames (jumbo ones included; the ICRC is at the end),
            // and a large kernel buffer: on two busy cores tcpdump falls
            // behind a burst, and a frame the kernel drops is one unchecked.
            // The ring is cut into snaplen-sized slots, so the snaplen must
            // not be the default 256 KiB.
            "-s",
            "9200",
            "-B",
            "262144",
            "--immediate-mode",
            // Each frame written out as it is taken (not held in stdio's
            // buffer): the file's size then says what tcpdump has done.
            "-U",
            "-w",
            &p,
            &filter,
        ]);
        let mut job = proc::spawn(cmd, Duration::from_secs(1800))
            .map_err(|e| format!("cannot start tcpdump: {e}"))?;
        // tcpdump creates the file once it is listening.
        if !proc::wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            path.exists()
        }) || !job.running()
        {
            return Err(format!("tcpdump did not start:\n{}", job.wait().text));
        }
        Ok(Capture {
            job,
            path: path.to_path_buf(),
        })
    }

    /// Stop (SIGINT, as tcpdump expects) and read its counters.
    pub fn stop(self) -> Counts {
        // Both programs have exited; their last frames are on the bridge,
        // but tcpdump may not have taken them all from its ring yet (on two
        // cores that also run the VM it falls behind), and on SIGINT it
        // stops at once: a frame still in the ring then counts as
        // "received by filter" and not "captured" — a lost frame to
        // `check`, though nothing was lost. So wait until the file has not
        // grown for 200 ms (tcpdump writes each frame as it takes it, -U),
        // for 5 s at most.
        std::thread::sleep(Duration::from_millis(100));
        let size = || std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        let (mut last, mut still) = (size(), 0);
        let _ = proc::wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
            let now = size();
            still = if now == last { still + 1 } else { 0 };
            last = now;
            still >= 4
        });
        let pid = self.job.pid().to_string();
        let _ = proc::run(
            {
                let mut c = Command::new("kill");
                c.args(["-INT", &pid]);
                c
            },
            Duration::from_secs(5),
        );
        let out = self.job.wait();
        let num = |what: &str| {
            out.text
                .lines()
                .find(|l| l.contains(what))
                .and_then(|l| l.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        Counts {
            captured: num("packets captured"),
            received: num("packets received by filter"),
            dropped: num("packets dropped by kernel"),
        }
    }
}

/// The result of checking one capture.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub packets: u64,
    pub from_host: u64,
    pub from_vm: u64,
    pub icrc_bad: u64,
    pub malformed: u64,
    /// Packets seen again with a PSN already seen (resent by either side).
    pub resent: u64,
    /// Resent packets whose bytes differ from the first transmission.
    pub resent_differing: u64,
    pub problems: Vec<String>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Decode with `softrdma decode --strict` and scan for retransmissions.
pub fn check(softrdma: &Path, pcap: &Path, host: &[IpAddr], counts: &Counts) -> Verdict {
    let mut v = Verdict::default();
    if counts.dropped != 0 || counts.captured != counts.received {
        v.problems.push(format!(
            "tcpdump lost frames: {} captured, {} received by the filter, {} dropped by the kernel",
            counts.captured, counts.received, counts.dropped
        ));
    }
    let out = proc::run(
        {
            let mut c = Command::new(softrdma);
            c.arg("decode").arg("--strict").arg(pcap);
            c
        },
        Duration::from_secs(120),
    );
    let summary = out
        .text
        .lines()
        .rev()
        .find(|l| l.contains("RoCEv2 packets:"));
    match summary {
        None => v.problems.push(format!(
            "softrdma decode printed no summary ({})",
            out.status()
        )),
        Some(s) => {
            // "N RoCEv2 packets: N ICRC ok, B ICRC BAD; M malformed; ..."
            let n: Vec<u64> = s
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|x| x.parse().ok())
                .collect();
            if n.len() >= 4 {
                v.packets = n[0];
                v.icrc_bad = n[2];
                v.malformed = n[3];
            }
        }
    }
    if !out.ok() {
        v.problems.push(format!(
            "softrdma decode --strict: {} ({} ICRC BAD, {} malformed): {}",
            out.status(),
            v.icrc_bad,
            v.malformed,
            out.text
                .lines()
                .filter(|l| l.contains("BAD") || l.contains("MALFORMED"))
                .take(3)
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    match std::fs::read(pcap) {
        Ok(bytes) => scan(&bytes, host, &mut v),
        Err(e) => v
            .problems
            .push(format!("cannot read {}: {e}", pcap.display())),
    }
    if v.packets == 0 {
        v.problems.push("no RoCEv2 packet was captured".into());
    } else if v.from_host == 0 || v.from_vm == 0 {
        v.problems.push(format!(
            "traffic in one direction only: {} from the host, {} from the VM",
            v.from_host, v.from_vm
        ));
    }
    v
}

/// Count packets by direction and compare every retransmission with the
/// first transmission of its PSN.
pub fn scan(bytes: &[u8], host: &[IpAddr], v: &mut Verdict) {
    let file = match PcapFile::parse(bytes) {
        Ok(f) => f,
        Err(e) => {
            v.problems.push(format!("pcap: {e}"));
            return;
        }
    };
    // (source, destination QP, PSN) -> payload of the first transmission.
    let mut first: HashMap<(IpAddr, u32, u32), Vec<u8>> = HashMap::new();
    for rec in file.records().flatten() {
        let Ok(Some(f)) = parse_ethernet_udp(rec.data) else {
            continue;
        };
        if !f.is_rocev2() {
            continue;
        }
        let src = f.ip.src();
        if host.contains(&src) {
            v.from_host += 1;
        } else {
            v.from_vm += 1;
        }
        let Ok(pkt) = Packet::new_checked(f.payload) else {
            continue;
        };
        let Ok(repr) = PacketRepr::parse(&pkt) else {
            continue;
        };
        let payload = pkt.payload();
        if payload.is_empty() {
            // ACKs, NAKs, READ requests, atomic ACKs: nothing to compare,
            // and a NAK shares its PSN with the data resent after it.
            continue;
        }
        let key = (src, repr.bth.dest_qp, repr.bth.psn.value());
        match first.get(&key) {
            None => {
                first.insert(key, payload.to_vec());
            }
            Some(p) => {
                v.resent += 1;
                if p.as_slice() != payload {
                    v.resent_differing += 1;
                    if v.resent_differing <= 3 {
                        v.problems.push(format!(
                            "frame {}: {} resent PSN {} to QP {:#x} with other bytes than the first time",
                            rec.number,
                            src,
                            repr.bth.psn.value(),
                            repr.bth.dest_qp
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::bth::BthRepr;
    use softrdma_wire::ext::{AethRepr, NakCode, Syndrome};
    use softrdma_wire::frame::build_frame;
    use softrdma_wire::packet::ExtRepr;
    use softrdma_wire::pcap::PcapWriter;
    use softrdma_wire::{Opcode, Psn};
    use std::net::SocketAddr;

    const HOST: &str = "10.91.47.1:4791";
    const VM: &str = "10.91.47.11:4791";

    fn pkt(op: Opcode, psn: u32, aeth: Option<Syndrome>, payload: &[u8]) -> Vec<u8> {
        let r = PacketRepr {
            bth: BthRepr {
                opcode: op,
                dest_qp: 0x11,
                psn: Psn::new(psn),
                ..BthRepr::default()
            },
            ext: ExtRepr {
                aeth: aeth.map(|s| AethRepr::new(s, 1)),
                ..Default::default()
            },
            payload_len: payload.len(),
        };
        let mut b = vec![0u8; r.wire_len()];
        r.emit_with_payload(&mut b, payload);
        b
    }

    fn pcap(frames: &[(&str, &str, Vec<u8>)]) -> Vec<u8> {
        let mut w = PcapWriter::new(Vec::new(), 65535).unwrap();
        for (src, dst, p) in frames {
            let (s, d): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            let mut f = Vec::new();
            build_frame(s, d, 0, p, &mut f);
            w.write_frame(std::time::Duration::ZERO, &f).unwrap();
        }
        w.into_inner()
    }

    #[test]
    fn a_resent_packet_must_carry_its_first_bytes() {
        let host: Vec<IpAddr> = vec!["10.91.47.1".parse().unwrap()];
        let nak = Some(Syndrome::Nak(NakCode::PsnSequenceError));
        let data = [7u8; 64];
        // A NAK names PSN 5, then the data at PSN 5 comes, twice, the same:
        // all fine (the NAK has no bytes to compare).
        let good = pcap(&[
            (HOST, VM, pkt(Opcode::RC_ACKNOWLEDGE, 5, nak, &[])),
            (HOST, VM, pkt(Opcode::RC_SEND_ONLY, 5, None, &data)),
            (
                VM,
                HOST,
                pkt(
                    Opcode::RC_ACKNOWLEDGE,
                    5,
                    Some(Syndrome::ACK_UNLIMITED),
                    &[],
                ),
            ),
            (HOST, VM, pkt(Opcode::RC_SEND_ONLY, 5, None, &data)),
        ]);
        let mut v = Verdict::default();
        scan(&good, &host, &mut v);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert_eq!((v.from_host, v.from_vm, v.resent), (3, 1, 1));
        // The resend carries other bytes: reported.
        let mut other = data;
        other[63] ^= 1;
        let bad = pcap(&[
            (HOST, VM, pkt(Opcode::RC_SEND_ONLY, 5, None, &data)),
            (HOST, VM, pkt(Opcode::RC_SEND_ONLY, 5, None, &other)),
        ]);
        let mut v = Verdict::default();
        scan(&bad, &host, &mut v);
        assert_eq!(v.resent_differing, 1);
        assert!(v.problems[0].contains("resent PSN 5"), "{:?}", v.problems);
    }
}
