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
