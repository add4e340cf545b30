//! `softrdma decode`, run as a user runs it: the built binary on the golden
//! rxe captures, checked against tshark's view of the same files, and on
//! broken input (truncated captures, garbage), where it must say what is
//! wrong in one line and never panic.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use softrdma_wire::pcap::PcapWriter;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/golden")
}

fn golden_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("golden captures")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    v.sort();
    assert!(v.len() >= 12, "golden captures missing: {v:?}");
    v
}

fn scratch(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// The file and frame that carry an ICRC corrupted on purpose.
const BAD_ICRC: (&str, usize) = ("host_inject_bad-icrc.pcap", 1);

fn is_bad_icrc(file: &Path, frame: usize) -> bool {
    file.file_name().unwrap() == BAD_ICRC.0 && frame == BAD_ICRC.1
}

/// Run `softrdma` with `args`; fails the test if it panicked.
fn softrdma(args: &[&str], file: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .arg(file)
        .output()
        .expect("run softrdma");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(101) && !stderr.contains("panicked"),
        "softrdma {args:?} {} panicked: {stderr}",
        file.display()
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

/// Run tshark on `file`: `udp.port == 4791` frames, `fields` of each.
fn tshark(file: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(file);
    cmd.args([
        "-Y",
        "udp.port == 4791",
        "-T",
        "fields",
        "-E",
        "separator=/t",
    ]);
    cmd.args([
        "-E",
        "occurrence=f",
        "--disable-heuristic",
        "rpcrdma_infiniband",
    ]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("tshark not found: install it (apt-get install tshark)")
        }
        Err(e) => panic!("running tshark: {e}"),
    };
    // stderr is not read: as root, tshark warns there about running as root.
    assert!(
        out.status.success(),
        "tshark on {}: {}",
        file.display(),
        out.status
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// A decoded text line: the frame number and the rest.
fn split_line(l: &str) -> (usize, &str) {
    let (n, rest) = l
        .trim_start()
        .split_once(' ')
        .unwrap_or_else(|| panic!("line {l:?}"));
    (
        n.parse()
            .unwrap_or_else(|_| panic!("frame number in {l:?}")),
        rest,
    )
}

/// Text output: the per-packet lines and the summary line.
fn text_lines(out: &str) -> (Vec<(usize, &str)>, &str) {
    let mut lines: Vec<&str> = out.lines().collect();
    let summary = lines.pop().expect("a summary line");
    assert!(summary.contains(" RoCEv2 packets: "), "summary {summary:?}");
    (lines.into_iter().map(split_line).collect(), summary)
}

#[test]
fn one_line_per_rocev2_packet_as_tshark_counts_them() {
    let mut total = 0;
    for file in golden_files() {
        let out = softrdma(&["decode"], &file);
        assert!(out.status.success(), "{}: {}", file.display(), out.status);
        let text = stdout(&out);
        let (lines, summary) = text_lines(&text);
        let want: Vec<usize> = tshark(&file, &["frame.number"])
            .iter()
            .map(|r| r[0].parse().unwrap())
            .collect();
        let got: Vec<usize> = lines.iter().map(|l| l.0).collect();
        assert_eq!(
            got,
            want,
            "{}: frames decoded vs tshark's udp.port == 4791",
            file.display()
        );
        let mut bad = 0;
        for &(n, rest) in &lines {
            if is_bad_icrc(&file, n) {
                bad += 1;
                assert!(
                    rest.contains("ICRC BAD"),
                    "{} frame {n}: {rest}",
                    file.display()
                );
            } else {
                assert!(
                    rest.ends_with("ICRC ok"),
                    "{} frame {n}: {rest}",
                    file.display()
                );
            }
        }
        let n = lines.len();
        assert_eq!(
            summary,
            format!("{n} RoCEv2 packets: {} ICRC ok, {bad} ICRC BAD; 0 malformed; 0 non-RoCE frames skipped", n - bad),
            "{}",
            file.display()
        );
        total += n;
    }
    assert_eq!(total, 125, "the golden captures hold 125 RoCEv2 packets");
}

/// `--json` parses line by line, says what the text says, and agrees with
/// tshark on every BTH field both print.
#[test]
fn json_parses_and_agrees_with_text_and_tshark() {
    for file in golden_files() {
        let name = file.display();
        let text = stdout(&softrdma(&["decode"], &file));
        let (lines, _) = text_lines(&text);
        let out = softrdma(&["decode", "--json"], &file);
        assert!(out.status.success(), "{name}");
        let json = stdout(&out);
        let mut objs: Vec<Value> = json
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
            .collect();
        let summary = objs.pop().expect("a summary object");
        assert_eq!(objs.len(), lines.len(), "{name}");
        let shark = tshark(
            &file,
            &[
                "frame.number",
                "infiniband.bth.opcode",
                "infiniband.bth.destqp",
                "infiniband.bth.psn",
                "infiniband.bth.a",
                "infiniband.bth.padcnt",
            ],
        );
        assert_eq!(shark.len(), objs.len(), "{name}");
        let mut bad = 0;
        for ((o, &(n, line)), t) in objs.iter().zip(&lines).zip(&shark) {
            let u = |k: &str| o[k].as_u64().unwrap_or_else(|| panic!("{name} {k} in {o}"));
            let s = |k: &str| o[k].as_str().unwrap_or_else(|| panic!("{name} {k} in {o}"));
            let b = |k: &str| {
                o[k].as_bool()
                    .unwrap_or_else(|| panic!("{name} {k} in {o}"))
            };
            assert_eq!(u("frame") as usize, n, "{name}");
            // The text line says the same.
            let sa = |ip: &str, port: &str| SocketAddr::new(s(ip).parse().unwrap(), u(port) as u16);
            let head = format!(
                "{} > {} {} qp=0x{:06x} psn={}",
                sa("src", "sport"),
                sa("dst", "dport"),
                s("opcode"),
                u("dest_qp"),
                u("psn")
            );
            assert!(
                line.starts_with(&head),
                "{name} frame {n}: {line:?} vs {head:?}"
            );
            assert_eq!(b("icrc_ok"), line.ends_with("ICRC ok"), "{name} frame {n}");
            assert_eq!(b("icrc_ok"), u("icrc_carried") == u("icrc_computed"));
            assert_eq!(b("icrc_ok"), !is_bad_icrc(&file, n), "{name} frame {n}");
            bad += usize::from(!b("icrc_ok"));
            // tshark says the same.
            let want = [
                n.to_string(),
                u("opcode_num").to_string(),
                format!("0x{:06x}", u("dest_qp")),
                u("psn").to_string(),
                u64::from(b("ack_req")).to_string(),
                u("pad").to_string(),
            ];
            assert_eq!(t[..], want[..], "{name} frame {n}: tshark vs --json");
        }
        let sm = &summary["summary"];
        assert_eq!(sm["roce"].as_u64(), Some(objs.len() as u64), "{name}");
        assert_eq!(sm["icrc_bad"].as_u64(), Some(bad as u64), "{name}");
        assert_eq!(
            sm["icrc_ok"].as_u64(),
            Some((objs.len() - bad) as u64),
            "{name}"
        );
        assert_eq!(sm["malformed"].as_u64(), Some(0), "{name}");
    }
}

#[test]
fn strict_fails_exactly_on_the_bad_icrc_capture() {
    for file in golden_files() {
        for args in [
            &["decode", "--strict"][..],
            &["decode", "--strict", "--json"],
        ] {
            let out = softrdma(args, &file);
            let want = if file.file_name().unwrap() == BAD_ICRC.0 {
                1
            } else {
                0
            };
            assert_eq!(out.status.code(), Some(want), "{args:?} {}", file.display());
        }
    }
}

/// A capture cut inside a record: the records before it decode, the cut
/// one is one MALFORMED line, and `--strict` turns that into exit status 1.
#[test]
fn truncated_capture_reports_the_cut_record() {
    let src = golden_dir().join("rc_read.pcap");
    let bytes = std::fs::read(&src).unwrap();
    // Inside the last record's data, and inside a record header (frame 2's:
    // 24-byte file header, 16-byte record header, frame 1, then 8 bytes).
    let incl1 = u32::from_le_bytes(bytes[32..36].try_into().unwrap()) as usize;
    for (cut, last) in [(bytes.len() - 7, 20), (24 + 16 + incl1 + 8, 2)] {
        let path = scratch(&format!("rc_read_cut_{cut}.pcap"));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let out = softrdma(&["decode"], &path);
        assert!(out.status.success(), "cut at {cut}: {}", out.status);
        let text = stdout(&out);
        let (lines, summary) = text_lines(&text);
        assert_eq!(lines.len(), last, "cut at {cut}: {text}");
        for &(n, rest) in &lines[..last - 1] {
            assert!(rest.ends_with("ICRC ok"), "cut at {cut}, frame {n}: {rest}");
        }
        assert_eq!(
            lines[last - 1],
            (
                last,
                "MALFORMED: pcap record cut short by the end of the file"
            )
        );
        assert!(summary.contains("; 1 malformed;"), "{summary}");
        assert_eq!(
            softrdma(&["decode", "--strict"], &path).status.code(),
            Some(1)
        );
        let json = stdout(&softrdma(&["decode", "--json"], &path));
        let objs: Vec<Value> = json
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let cut_obj = &objs[last - 1];
        assert_eq!(cut_obj["frame"].as_u64(), Some(last as u64));
        assert!(cut_obj["malformed"].is_string(), "{cut_obj}");
        assert_eq!(objs[last]["summary"]["malformed"].as_u64(), Some(1));
    }
}

/// Deterministic pseudo-random bytes (xorshift64).
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Not a pcap at all, or cut inside the file header: one line on stderr
/// that names the file and the problem, nothing on stdout, exit status 2.
#[test]
fn garbage_and_short_files_are_one_line_errors() {
    let golden = std::fs::read(golden_dir().join("rc_send_small.pcap")).unwrap();
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("garbage.bin", noise(7, 4096), "not a pcap file"),
        ("empty.pcap", Vec::new(), "shorter than a pcap file header"),
        (
            "header_cut.pcap",
            golden[..10].to_vec(),
            "shorter than a pcap file header",
        ),
        (
            "pcapng.pcap",
            [&[0x0a, 0x0d, 0x0d, 0x0a][..], &noise(3, 60)].concat(),
            "pcapng",
        ),
    ];
    for (name, bytes, says) in cases {
        let path = scratch(name);
        std::fs::write(&path, &bytes).unwrap();
        for args in [
            &["decode"][..],
            &["decode", "--json"],
            &["decode", "--strict"],
        ] {
            let out = softrdma(args, &path);
            assert_eq!(out.status.code(), Some(2), "{name} {args:?}");
            assert!(out.stdout.is_empty(), "{name} {args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(err.lines().count(), 1, "{name} {args:?}: {err}");
            assert!(
                err.starts_with("softrdma: ") && err.contains(name) && err.contains(says),
                "{name} {args:?}: {err}"
            );
        }
    }
    let out = softrdma(&["decode"], &scratch("does-not-exist.pcap"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("softrdma: cannot read "));
}

/// A well-formed pcap whose frames are broken: every golden RoCE frame cut
/// at every length, and random bytes. Each frame to port 4791 (and each one
/// too short to tell) is one MALFORMED or decoded line; nothing panics.
#[test]
fn broken_frames_in_a_valid_capture_are_malformed_lines() {
    let golden = std::fs::read(golden_dir().join("rc_atomic_cas.pcap")).unwrap();
    let file = softrdma_wire::pcap::PcapFile::parse(&golden).unwrap();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    for rec in file.records().take(2) {
        let data = rec.unwrap().data;
        frames.extend((0..data.len()).map(|n| data[..n].to_vec()));
    }
    let cut = frames.len();
    frames.extend((0..200).map(|i| noise(i + 100, (i as usize * 37) % 1600)));
    let path = scratch("broken_frames.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap(), 65535).unwrap();
    for f in &frames {
        w.write_frame(std::time::Duration::ZERO, f).unwrap();
    }
    w.flush().unwrap();
    drop(w);

    let out = softrdma(&["decode"], &path);
    assert!(out.status.success(), "{}", out.status);
    let text = stdout(&out);
    let (lines, summary) = text_lines(&text);
    // Every cut golden frame is RoCE-bound or too short to say: one line each,
    // and none of them is a whole packet.
    let cut_lines: Vec<_> = lines.iter().filter(|l| l.0 <= cut).collect();
    assert_eq!(cut_lines.len(), cut, "{text}");
    for (n, rest) in cut_lines {
        assert!(rest.contains("MALFORMED: "), "frame {n}: {rest}");
    }
    assert!(summary.contains(&format!(
        "{} RoCEv2 packets",
        lines.len() - summary_malformed(summary)
    )));
    assert_eq!(
        softrdma(&["decode", "--strict"], &path).status.code(),
        Some(1)
    );
    let json = stdout(&softrdma(&["decode", "--json"], &path));
    for l in json.lines() {
        serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
    }
    assert_eq!(json.lines().count(), lines.len() + 1);
}

/// The malformed count of a text summary line.
fn summary_malformed(summary: &str) -> usize {
    let (_, rest) = summary.split_once("; ").unwrap();
    rest.split(' ').next().unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------
// CM MADs on QP 1: the golden captures of the kernel's rdma_cm
// (crates/wire/tests/golden/cm; its README documents every field).

fn cm_golden(name: &str) -> PathBuf {
    golden_dir().join("cm").join(name)
}

/// The decoded text of a CM capture: every packet line (frame number,
/// rest) after checking that all of them have a good ICRC and that the
/// summary counts them all.
fn cm_lines(name: &str) -> Vec<(usize, String)> {
    let file = cm_golden(name);
    let out = softrdma(&["decode", "--strict"], &file);
    assert!(out.status.success(), "{name}: {}", out.status);
    let text = stdout(&out);
    let (lines, summary) = text_lines(&text);
    let n = lines.len();
    assert_eq!(
        summary,
        format!(
            "{n} RoCEv2 packets: {n} ICRC ok, 0 ICRC BAD; 0 malformed; 0 non-RoCE frames skipped"
        ),
        "{name}"
    );
    for (f, rest) in &lines {
        assert!(rest.ends_with(" ICRC ok"), "{name} frame {f}: {rest}");
    }
    lines
        .into_iter()
        .map(|(f, rest)| (f, rest.to_owned()))
        .collect()
}

/// The line of frame `frame`.
fn frame_line(lines: &[(usize, String)], frame: usize) -> &str {
    &lines
        .iter()
        .find(|l| l.0 == frame)
        .unwrap_or_else(|| panic!("no frame {frame}"))
        .1
}

/// The start of every QP1 line of the two VMs' captures: vm2 (client,
/// 10.91.47.12) to vm1 (server, 10.91.47.11) or back, with the BTH PSN of
/// the node's QP1 counter.
fn qp1(from_client: bool, psn: u32) -> String {
    let (s, d) = if from_client {
        ("10.91.47.12", "10.91.47.11")
    } else {
        ("10.91.47.11", "10.91.47.12")
    };
    format!(
        "{s}:55410 > {d}:4791 UD Send Only qp=0x000001 psn={psn} ackreq DETH qkey=0x80010000 srcqp=0x000001 payload=256"
    )
}

/// rping: REQ, REP, RTU, then (after the data) DREQ and DREP, with the
/// values the README's section 3 reads from the bytes: TID = 2 << 32 | the
/// byte-reversed Comm ID, ServiceID RDMA_PS_TCP port 7174, QPN 0x11 both
/// sides, Starting PSNs 0xf531e6 (REQ) and 0x2546b0 (REP), responder
/// resources and initiator depth 1, path MTU 3 (1024), RC, retry 7 / RNR
/// retry 7, the rdma_cm header's 10.91.47.12:41320 > 10.91.47.11.
#[test]
fn rping_cm_handshake_and_disconnect_lines() {
    let l = cm_lines("cm_rping.pcap");
    let tid = "tid=0x00000002c193bf35";
    assert_eq!(
        frame_line(&l, 1),
        format!(
            "{} CM REQ {tid} local_id=0x35bf93c1 service=0x0000000001061c06 (RDMA_PS_TCP port 7174) \
             qpn=0x000011 start_psn=16069094 resp_res=1 init_depth=1 mtu=1024 transport=RC retry=7 rnr_retry=7 \
             rdma_cm 10.91.47.12:41320 > 10.91.47.11:7174 ICRC ok",
            qp1(true, 0)
        )
    );
    assert_eq!(0xf531e6, 16069094);
    assert_eq!(
        frame_line(&l, 2),
        format!(
            "{} CM REP {tid} local_id=0xfa60f732 remote_id=0x35bf93c1 qpn=0x000011 start_psn=2442928 \
             resp_res=1 init_depth=1 rnr_retry=7 ICRC ok",
            qp1(false, 0)
        )
    );
    assert_eq!(0x2546b0, 2442928);
    assert_eq!(
        frame_line(&l, 3),
        format!(
            "{} CM RTU {tid} local_id=0x35bf93c1 remote_id=0xfa60f732 ICRC ok",
            qp1(true, 1)
        )
    );
    assert_eq!(
        frame_line(&l, 40),
        format!(
            "{} CM DREQ {tid} local_id=0x35bf93c1 remote_id=0xfa60f732 remote_qpn=0x000011 ICRC ok",
            qp1(true, 2)
        )
    );
    assert_eq!(
        frame_line(&l, 41),
        format!(
            "{} CM DREP {tid} local_id=0xfa60f732 remote_id=0x35bf93c1 ICRC ok",
            qp1(false, 1)
        )
    );
    // The data in between is RC to QP 0x11, with no MAD.
    let data: Vec<&(usize, String)> = l.iter().filter(|x| (4..=39).contains(&x.0)).collect();
    assert_eq!(data.len(), 36);
    for (n, rest) in data {
        assert!(
            rest.contains(" RC ") && rest.contains(" qp=0x000011 ") && !rest.contains(" CM "),
            "frame {n}: {rest}"
        );
    }
}

/// The two REJs: to a port nobody listens on (reason 8, no Comm ID of its
/// own), and rdma_reject() of ucmatose's second REQ (reason 28).
#[test]
fn rej_lines_name_the_reason() {
    let l = cm_lines("cm_reject.pcap");
    assert_eq!(
        frame_line(&l, 1),
        format!(
            "{} CM REQ tid=0x00000002c193bf34 local_id=0x34bf93c1 service=0x000000000106270f (RDMA_PS_TCP port 9999) \
             qpn=0x000012 start_psn=16305347 resp_res=1 init_depth=1 mtu=1024 transport=RC retry=7 rnr_retry=7 \
             rdma_cm 10.91.47.12:52061 > 10.91.47.11:9999 ICRC ok",
            qp1(true, 3)
        )
    );
    assert_eq!(
        frame_line(&l, 2),
        format!(
            "{} CM REJ reason 8 (invalid service ID) tid=0x00000002c193bf34 local_id=0x00000000 remote_id=0x34bf93c1 \
             rejected=REQ ICRC ok",
            qp1(false, 2)
        )
    );
    let l = cm_lines("cm_ucmatose_server_c1.pcap");
    assert_eq!(
        frame_line(&l, 4),
        format!(
            "{} CM REJ reason 28 (consumer defined) tid=0x00000002c193bf31 local_id=0xfc60f732 remote_id=0x31bf93c1 \
             rejected=REQ ICRC ok",
            qp1(false, 5)
        )
    );
    // The server-side DREQ: its TID is formed from the server's Comm ID.
    assert_eq!(
        frame_line(&l, 6),
        format!(
            "{} CM DREQ tid=0x0000000232f760fd local_id=0xfd60f732 remote_id=0x36bf93c1 remote_qpn=0x000014 ICRC ok",
            qp1(false, 6)
        )
    );
    // ucmatose asks for retry 5 and RNR retry 0.
    assert!(
        frame_line(&l, 1).contains(" retry=5 rnr_retry=0 "),
        "{}",
        frame_line(&l, 1)
    );
}

/// udaddy's SIDR: the request in RDMA_PS_UDP with its rdma_cm header, the
/// reply with the server's UD QPN and rdma_cm's UDP Q_Key.
#[test]
fn sidr_lines_show_service_qpn_and_qkey() {
    let l = cm_lines("cm_udaddy.pcap");
    assert_eq!(
        frame_line(&l, 1),
        format!(
            "{} CM SIDR_REQ tid=0x00000002c193bf37 req_id=0x37bf93c1 service=0x0000000001111c06 (RDMA_PS_UDP port 7174) \
             rdma_cm 10.91.47.12:36065 > 10.91.47.11:7174 ICRC ok",
            qp1(true, 4)
        )
    );
    assert_eq!(
        frame_line(&l, 2),
        format!(
            "{} CM SIDR_REP status 0 (success) tid=0x00000002c193bf37 req_id=0x37bf93c1 qpn=0x000012 qkey=0x01234567 \
             service=0x0000000001111c06 (RDMA_PS_UDP port 7174) ICRC ok",
            qp1(false, 3)
        )
    );
    // The UD data that follows uses that QPN and Q_Key.
    assert!(l
        .iter()
        .any(|(_, r)| r.contains(" qp=0x000012 ") && r.contains(" qkey=0x01234567 ")));
}

/// Over IPv6 the rdma_cm header carries 16-byte addresses.
#[test]
fn ipv6_req_line_has_ipv6_rdma_cm_addresses() {
    let l = cm_lines("cm_rping_ipv6.pcap");
    assert_eq!(
        frame_line(&l, 1),
        "[fe80::5054:ff:fe91:4712]:55410 > [fe80::5054:ff:fe91:4711]:4791 UD Send Only qp=0x000001 psn=41 ackreq \
         DETH qkey=0x80010000 srcqp=0x000001 payload=256 CM REQ tid=0x00000002c193bf39 local_id=0x39bf93c1 \
         service=0x0000000001061c06 (RDMA_PS_TCP port 7174) qpn=0x00001d start_psn=9748341 resp_res=1 init_depth=1 \
         mtu=1024 transport=RC retry=7 rnr_retry=7 \
         rdma_cm [fe80::5054:ff:fe91:4712]:38815 > [fe80::5054:ff:fe91:4711]:7174 ICRC ok"
    );
}

/// All 77 MADs of the ten captures are CM messages the decoder names, in
/// the numbers the README counts; no other packet shows a MAD.
#[test]
fn every_golden_cm_mad_is_named() {
    let mut files: Vec<String> = std::fs::read_dir(golden_dir().join("cm"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10, "{files:?}");
    let mut kinds = std::collections::BTreeMap::new();
    for f in &files {
        for (n, rest) in cm_lines(f) {
            let to_qp1 = rest.contains(" qp=0x000001 ");
            let cm = rest
                .split_once(" payload=256 CM ")
                .map(|(_, m)| m.split(' ').next().unwrap().to_owned());
            assert_eq!(to_qp1, cm.is_some(), "{f} frame {n}: {rest}");
            assert!(!rest.contains("MAD"), "{f} frame {n}: {rest}");
            if let Some(k) = cm {
                *kinds.entry(k).or_insert(0) += 1;
            }
        }
    }
    let want: std::collections::BTreeMap<String, usize> = [
        ("DREP", 11),
        ("DREQ", 12),
        ("REJ", 2),
        ("REP", 10),
        ("REQ", 28),
        ("RTU", 10),
        ("SIDR_REP", 2),
        ("SIDR_REQ", 2),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    assert_eq!(kinds, want);
    assert_eq!(kinds.values().sum::<usize>(), 77);
}

/// `--json` carries the same MAD as an object: every header field, and the
/// CM message's fields under "cm".
#[test]
fn json_carries_the_cm_mad() {
    let json = stdout(&softrdma(
        &["decode", "--json"],
        &cm_golden("cm_rping.pcap"),
    ));
    let objs: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(
        objs[0]["mad"],
        serde_json::json!({
            "base_version": 1, "class": 7, "class_version": 2, "method": 3, "status": 0,
            "class_specific": 0, "tid": 0x0000_0002_c193_bf35_u64, "attr_id": 0x10, "attr_mod": 0,
            "trailing": 0, "class_name": "CM",
            "cm": {
                "msg": "REQ", "local_comm_id": 0x35bf_93c1_u32, "service_id": 0x0106_1c06,
                "port_space": "RDMA_PS_TCP", "port": 7174, "local_qpn": 0x11,
                "starting_psn": 0xf5_31e6, "responder_resources": 1, "initiator_depth": 1,
                "path_mtu": 3, "path_mtu_bytes": 1024, "transport": "RC", "retry_count": 7,
                "rnr_retry_count": 7, "srq": false, "pkey": 0xffff,
                "rdma_cm": {"src": "10.91.47.12", "sport": 41320, "dst": "10.91.47.11", "dport": 7174}
            }
        })
    );
    assert_eq!(
        objs[1]["mad"]["cm"],
        serde_json::json!({
            "msg": "REP", "local_comm_id": 0xfa60_f732_u32, "remote_comm_id": 0x35bf_93c1_u32,
            "local_qpn": 0x11, "starting_psn": 0x25_46b0, "responder_resources": 1,
            "initiator_depth": 1, "rnr_retry_count": 7, "srq": false
        })
    );
    // Data packets have no "mad".
    assert!(objs[3].get("mad").is_none(), "{}", objs[3]);
    let json = stdout(&softrdma(
        &["decode", "--json"],
        &cm_golden("cm_udaddy.pcap"),
    ));
    let rep: Value = serde_json::from_str(json.lines().nth(1).unwrap()).unwrap();
    assert_eq!(
        rep["mad"]["cm"],
        serde_json::json!({
            "msg": "SIDR_REP", "request_id": 0x37bf_93c1_u32, "status": 0, "status_name": "success",
            "qpn": 0x12, "qkey": 0x0123_4567, "service_id": 0x0111_1c06,
            "port_space": "RDMA_PS_UDP", "port": 7174
        })
    );
}

// ---------------------------------------------------------------------------
// MADs the kernel never sent: other classes, other methods and versions,
// broken rdma_cm headers, short and long payloads.

use softrdma_wire::cm::{self, CmMsg};

const SYN_SRC: &str = "10.0.0.1:55410";
const SYN_DST: &str = "10.0.0.2:4791";

/// A UD SEND Only to QP 1 carrying `payload`, in an IPv4 frame whose ICRC
/// is right.
fn qp1_frame(payload: &[u8], psn: u32) -> Vec<u8> {
    use softrdma_wire::ext::DethRepr;
    use softrdma_wire::packet::ExtRepr;
    use softrdma_wire::{frame, icrc, BthRepr, Opcode, PacketRepr, Psn};
    let repr = PacketRepr {
        bth: BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            dest_qp: 1,
            ack_req: true,
            psn: Psn::new(psn),
            ..Default::default()
        },
        ext: ExtRepr {
            deth: Some(DethRepr {
                qkey: 0x8001_0000,
                src_qp: 1,
            }),
            ..Default::default()
        },
        payload_len: payload.len(),
    };
    let mut roce = vec![0u8; repr.wire_len()];
    repr.emit_with_payload(&mut roce, payload);
    let (src, dst): (SocketAddr, SocketAddr) = (SYN_SRC.parse().unwrap(), SYN_DST.parse().unwrap());
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        unreachable!()
    };
    let udp_len = (roce.len() + 8) as u16;
    let ip = icrc::ipv4_header(s.ip().octets(), d.ip().octets(), 0, true, udp_len);
    let udp = icrc::udp_header(src.port(), dst.port(), udp_len);
    icrc::fill(&ip, &udp, &mut roce);
    let mut out = Vec::new();
    frame::build_frame(src, dst, 0, &roce, &mut out);
    out
}

fn write_capture(name: &str, frames: &[Vec<u8>]) -> PathBuf {
    let path = scratch(name);
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap(), 65535).unwrap();
    for f in frames {
        w.write_frame(std::time::Duration::ZERO, f).unwrap();
    }
    w.flush().unwrap();
    path
}

/// The golden rping REQ, as a value, and its TID.
fn golden_req() -> (u64, cm::ReqRepr) {
    let bytes = std::fs::read(cm_golden("cm_rping.pcap")).unwrap();
    let file = softrdma_wire::pcap::PcapFile::parse(&bytes).unwrap();
    let rec = file.records().next().unwrap().unwrap();
    let u = softrdma_wire::frame::parse_ethernet_udp(rec.data)
        .unwrap()
        .unwrap();
    let p = softrdma_wire::Packet::new_checked(u.payload).unwrap();
    let m: &[u8; cm::MAD_LEN] = p.payload().try_into().unwrap();
    let (h, msg) = cm::parse(m).unwrap();
    let CmMsg::Req(r) = msg else { panic!() };
    (h.tid, *r)
}

#[test]
fn unusual_mads_say_what_they_are() {
    let (tid, req) = golden_req();
    let emit = |m: CmMsg| m.emit(tid).to_vec();
    let req_mad = emit(CmMsg::Req(Box::new(req)));
    let with = |at: usize, v: u8| {
        let mut m = req_mad.clone();
        m[at] = v;
        m
    };
    let req_text = "CM REQ tid=0x00000002c193bf35 local_id=0x35bf93c1 service=0x0000000001061c06 \
                    (RDMA_PS_TCP port 7174) qpn=0x000011 start_psn=16069094 resp_res=1 init_depth=1 mtu=1024 \
                    transport=RC retry=7 rnr_retry=7";
    // An SA PathRecord query (class 3, Get).
    let mut sa = vec![0u8; 256];
    sa[..4].copy_from_slice(&[1, 0x03, 2, 0x01]);
    sa[8..16].copy_from_slice(&0x1234u64.to_be_bytes());
    sa[16..18].copy_from_slice(&0x0035u16.to_be_bytes());
    // A class nobody names, with a status.
    let mut odd = vec![0u8; 256];
    odd[..6].copy_from_slice(&[1, 0x77, 1, 0x81, 0x00, 0x04]);
    // A CM Get of ClassPortInfo.
    let mut cpi = vec![0u8; 256];
    cpi[..4].copy_from_slice(&[1, 0x07, 2, 0x01]);
    cpi[16..18].copy_from_slice(&cm::attr::CLASS_PORT_INFO.to_be_bytes());
    // rdma_cm headers that do not read: version 5, IP version 5 (private
    // data starts at MAD offset 24 + 140).
    let pd = cm::DATA + 140;
    // A REQ with every optional field: UC, a reserved MTU code, SRQ, a
    // P_Key, a service ID outside rdma_cm's port spaces.
    let odd_req = cm::ReqRepr {
        service_id: 0x1000_0000_0000_0001,
        transport_service_type: cm::service_type::UC,
        path_mtu: 0,
        srq: true,
        pkey: 0x7fff,
        ..req
    };
    let rej = cm::RejRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        msg_rejected: 3,
        reject_info_length: 0,
        reason: 99,
        ari: [0; 72],
        private: [0; cm::private_len::REJ],
    };
    let mra = cm::MraRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        msg_mraed: cm::msg_kind::REP,
        service_timeout: 21,
        private: [0; cm::private_len::MRA],
    };
    let lap = {
        let mut m = cm::MadHeader::cm(cm::attr::LAP, 7);
        let mut b = [0u8; 256];
        m.emit(&mut b);
        m.attr_id = 0x0030;
        let mut c = [0u8; 256];
        m.emit(&mut c);
        (b.to_vec(), c.to_vec())
    };
    let long = [&req_mad[..], &[0xee; 4]].concat();
    let cases: Vec<(Vec<u8>, String)> = vec![
        (
            sa,
            "MAD class 0x03 (SA) version 2 method 0x01 attr 0x0035 tid=0x0000000000001234".into(),
        ),
        (
            odd,
            "MAD class 0x77 version 1 method 0x81 attr 0x0000 tid=0x0000000000000000 mad_status=0x0004".into(),
        ),
        (
            cpi,
            "MAD class 0x07 (CM) version 2 method 0x01 attr 0x0001 (ClassPortInfo) tid=0x0000000000000000".into(),
        ),
        (
            with(2, 1),
            "MAD class 0x07 (CM) version 1 method 0x03 attr 0x0010 (REQ) tid=0x00000002c193bf35".into(),
        ),
        (
            with(0, 2),
            "MAD class 0x07 (CM) version 2 method 0x03 attr 0x0010 (REQ) tid=0x00000002c193bf35 \
             base_version=2 (expected 1)"
                .into(),
        ),
        (
            with(pd, 5),
            format!("{req_text} rdma_cm header unreadable: version 5, expected 0"),
        ),
        (
            with(pd + 1, 0x50),
            format!("{req_text} rdma_cm header unreadable: IP version 5, expected 4 or 6"),
        ),
        (
            emit(CmMsg::Req(Box::new(odd_req))),
            "CM REQ tid=0x00000002c193bf35 local_id=0x35bf93c1 service=0x1000000000000001 qpn=0x000011 \
             start_psn=16069094 resp_res=1 init_depth=1 mtu=reserved(0) transport=UC retry=7 rnr_retry=7 srq \
             pkey=0x7fff"
                .into(),
        ),
        (
            emit(CmMsg::Rej(Box::new(rej))),
            "CM REJ reason 99 tid=0x00000002c193bf35 local_id=0x00000001 remote_id=0x00000002 rejected=3".into(),
        ),
        (
            emit(CmMsg::Mra(Box::new(mra))),
            "CM MRA tid=0x00000002c193bf35 local_id=0x00000001 remote_id=0x00000002 mraed=REP \
             service_timeout=21"
                .into(),
        ),
        (lap.0, "CM LAP tid=0x0000000000000007".into()),
        (lap.1, "CM attr 0x0030 tid=0x0000000000000007".into()),
        (long, format!("{req_text} rdma_cm 10.91.47.12:41320 > 10.91.47.11:7174 (4 bytes after the MAD)")),
        (req_mad[..40].to_vec(), "MAD truncated: 40 of 256 bytes".into()),
        (Vec::new(), "MAD truncated: 0 of 256 bytes".into()),
    ];
    let frames: Vec<Vec<u8>> = cases
        .iter()
        .enumerate()
        .map(|(i, (p, _))| qp1_frame(p, i as u32))
        .collect();
    let path = write_capture("unusual_mads.pcap", &frames);
    // A MAD that does not read is still a well-formed RoCEv2 packet:
    // --strict passes.
    let out = softrdma(&["decode", "--strict"], &path);
    assert!(out.status.success(), "{}", out.status);
    let text = stdout(&out);
    let (lines, summary) = text_lines(&text);
    assert_eq!(lines.len(), cases.len(), "{text}");
    for ((n, rest), (i, (payload, mad))) in lines.iter().zip(cases.iter().enumerate()) {
        assert_eq!(*n, i + 1);
        assert_eq!(
            *rest,
            format!(
                "{SYN_SRC} > {SYN_DST} UD Send Only qp=0x000001 psn={i} ackreq DETH qkey=0x80010000 \
                 srcqp=0x000001 payload={} {mad} ICRC ok",
                payload.len()
            ),
            "case {i}"
        );
    }
    assert_eq!(
        summary,
        format!(
            "{0} RoCEv2 packets: {0} ICRC ok, 0 ICRC BAD; 0 malformed; 0 non-RoCE frames skipped",
            cases.len()
        )
    );
    let json = stdout(&softrdma(&["decode", "--json"], &path));
    let objs: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(objs.len(), cases.len() + 1);
    assert_eq!(
        objs[13]["mad"],
        serde_json::json!({"malformed": "MAD truncated: 40 of 256 bytes"})
    );
    assert_eq!(
        objs[5]["mad"]["cm"]["rdma_cm"],
        serde_json::json!({"malformed": "version 5, expected 0"})
    );
    assert_eq!(objs[0]["mad"]["class_name"], "SA");
    assert_eq!(objs[0]["mad"].get("cm"), None);
    assert_eq!(objs[10]["mad"]["cm"]["msg"], "LAP");
}

/// Every payload length from 0 to 300 bytes to QP 1, and every prefix of
/// the golden REQ padded out with noise: a line each, no panic; those
/// shorter than a MAD say how short.
#[test]
fn qp1_payloads_of_every_length() {
    let (tid, req) = golden_req();
    let req_mad = CmMsg::Req(Box::new(req)).emit(tid);
    let frames: Vec<Vec<u8>> = (0..=300usize)
        .map(|n| {
            let mut p = noise(n as u64 + 1, n);
            let k = n.min(req_mad.len());
            p[..k].copy_from_slice(&req_mad[..k]);
            qp1_frame(&p, n as u32)
        })
        .collect();
    let path = write_capture("qp1_every_length.pcap", &frames);
    let out = softrdma(&["decode"], &path);
    assert!(out.status.success(), "{}", out.status);
    let text = stdout(&out);
    let (lines, _) = text_lines(&text);
    assert_eq!(lines.len(), 301);
    for (n, rest) in lines {
        let len = n - 1;
        let want = if len < 256 {
            format!(" payload={len} MAD truncated: {len} of 256 bytes ICRC ok")
        } else if len == 256 {
            " rdma_cm 10.91.47.12:41320 > 10.91.47.11:7174 ICRC ok".to_owned()
        } else {
            format!(
                " rdma_cm 10.91.47.12:41320 > 10.91.47.11:7174 ({} bytes after the MAD) ICRC ok",
                len - 256
            )
        };
        assert!(rest.ends_with(&want), "length {len}: {rest}");
    }
    let json = stdout(&softrdma(&["decode", "--json"], &path));
    for l in json.lines() {
        serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
    }
}

// ---------------------------------------------------------------------------
// XRC: the XRCETH after the BTH, in text and JSON.

/// An XRC request of `op` to XRC SRQ `srqn`, in an IPv4 frame whose ICRC
/// is right.
fn xrc_frame(op: softrdma_wire::Opcode, srqn: u32, reth: bool, payload: &[u8]) -> Vec<u8> {
    use softrdma_wire::ext::{RethRepr, XrcEthRepr};
    use softrdma_wire::packet::ExtRepr;
    use softrdma_wire::{frame, icrc, BthRepr, PacketRepr, Psn};
    let repr = PacketRepr {
        bth: BthRepr {
            opcode: op,
            dest_qp: 0x000123,
            ack_req: true,
            psn: Psn::new(77),
            ..Default::default()
        },
        ext: ExtRepr {
            xrceth: Some(XrcEthRepr { srqn }),
            reth: reth.then_some(RethRepr {
                va: 0x1000,
                rkey: 0xabcd_0001,
                dma_len: payload.len() as u32,
            }),
            ..Default::default()
        },
        payload_len: payload.len(),
    };
    let mut roce = vec![0u8; repr.wire_len()];
    repr.emit_with_payload(&mut roce, payload);
    let (src, dst): (SocketAddr, SocketAddr) = (SYN_SRC.parse().unwrap(), SYN_DST.parse().unwrap());
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        unreachable!()
    };
    let udp_len = (roce.len() + 8) as u16;
    let ip = icrc::ipv4_header(s.ip().octets(), d.ip().octets(), 0, true, udp_len);
    let udp = icrc::udp_header(src.port(), dst.port(), udp_len);
    icrc::fill(&ip, &udp, &mut roce);
    let mut out = Vec::new();
    frame::build_frame(src, dst, 0, &roce, &mut out);
    out
}

#[test]
fn xrc_requests_show_their_xrceth() {
    use softrdma_wire::Opcode;
    let path = write_capture(
        "xrc.pcap",
        &[
            xrc_frame(Opcode::XRC_SEND_ONLY, 0x00abcd, false, &[7; 12]),
            xrc_frame(Opcode::XRC_RDMA_WRITE_ONLY, 0x000002, true, &[9; 8]),
        ],
    );
    let out = stdout(&softrdma(&["decode"], &path));
    let (lines, _) = text_lines(&out);
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].1.contains("XRC Send Only")
            && lines[0].1.contains(" XRCETH srqn=0x00abcd ")
            && lines[0].1.contains("payload=12")
            && lines[0].1.ends_with("ICRC ok"),
        "{}",
        lines[0].1
    );
    assert!(
        lines[1].1.contains("XRC RDMA Write Only")
            && lines[1]
                .1
                .contains(" XRCETH srqn=0x000002 RETH va=0x1000 rkey=0xabcd0001 len=8 "),
        "{}",
        lines[1].1
    );
    let json = stdout(&softrdma(&["decode", "--json"], &path));
    let rows: Vec<Value> = json
        .lines()
        .filter(|l| l.contains("\"xrceth\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{json}");
    assert_eq!(rows[0]["xrceth"]["srqn"], 0x00abcd);
    assert_eq!(rows[1]["xrceth"]["srqn"], 2);
}
