//! `softrdma sim`: the simulator's command line and files, as a user runs
//! it: built-in specs and HPCC/htsim input files, HPCC's `fct.txt` and
//! `pfc.txt` formats, `summary.json`, plots, byte-identical reruns, and
//! clear errors for bad input.

use std::path::Path;
use std::process::{Command, Output};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("sim")
        .arg("--quiet")
        .args(args)
        .output()
        .expect("running softrdma sim")
}

/// A scratch directory of this test's own, removed when dropped.
fn dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("softrdma-sim-cli-{name}-"))
        .tempdir()
        .expect("a scratch directory")
}

fn ok(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn read(d: &Path, f: &str) -> String {
    std::fs::read_to_string(d.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"))
}

#[test]
fn hpcc_files_in_hpcc_files_out() {
    let tmp = dir("hpcc");
    let d = tmp.path();
    // Two ToRs of two hosts under one spine, in HPCC's topology format;
    // four flows in HPCC's flow format (start times in seconds).
    let topo = "7 3 6\n4 5 6\n0 4 100Gbps 1000ns 0\n1 4 100Gbps 1000ns 0\n2 5 100Gbps 1000ns 0\n3 5 100Gbps 1000ns 0\n4 6 400Gbps 1000ns 0\n5 6 400Gbps 1000ns 0\n";
    let flows = "4\n0 2 3 100 200000 0.000001\n1 3 3 100 64 0.000002\n2 0 3 100 1000000 0.0000015\n3 1 3 100 4096 0.00001\n";
    std::fs::write(d.join("topo.txt"), topo).unwrap();
    std::fs::write(d.join("flows.txt"), flows).unwrap();
    let out = d.join("out");
    let stdout = ok(&sim(&[
        "--topology",
        d.join("topo.txt").to_str().unwrap(),
        "--flows",
        d.join("flows.txt").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(
        stdout.contains("flows: 4 done, 0 failed, 0 unfinished"),
        "{stdout}"
    );
    let fct = read(&out, "fct.txt");
    let lines: Vec<&str> = fct.lines().collect();
    assert_eq!(lines.len(), 4);
    // `%08x %08x %u %u %lu %lu %lu %lu`: 11.0.0.1 → 11.0.2.1, RoCEv2's
    // port, the size, start 1000 ns, then FCT and standalone FCT.
    let f: Vec<&str> = lines
        .iter()
        .find(|l| l.contains(" 200000 "))
        .unwrap()
        .split(' ')
        .collect();
    assert_eq!(f.len(), 8);
    assert_eq!(
        (f[0], f[1], f[3], f[4], f[5]),
        ("0b000001", "0b000201", "4791", "200000", "1000")
    );
    let sport: u32 = f[2].parse().unwrap();
    assert!((0xc000..=0xffff).contains(&sport));
    let (fct_ns, alone): (u64, u64) = (f[6].parse().unwrap(), f[7].parse().unwrap());
    assert!(
        fct_ns >= alone && alone > 200_000 * 8 / 100,
        "{fct_ns} {alone}"
    );
    // Completion order: the 64-byte flow (started at 2 µs) ends before the
    // 1 MB one (started at 1.5 µs).
    let pos = |size: &str| {
        lines
            .iter()
            .position(|l| l.split(' ').nth(4) == Some(size))
            .unwrap()
    };
    assert!(pos("64") < pos("1000000"));
    let summary: serde_json::Value = serde_json::from_str(&read(&out, "summary.json")).unwrap();
    assert_eq!(summary["flows"]["done"], 4);
    assert_eq!(summary["hosts"], 4);
    assert_eq!(summary["switches"], 3);
    assert!(summary["speed"]["events_per_s"].as_f64().unwrap() > 0.0);
    for svg in ["fct_slowdown.svg", "qlen.svg", "pfc.svg"] {
        let s = read(&out, svg);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"), "{svg}");
    }
    assert!(read(&out, "links.csv").starts_with("node,port,peer,tier,"));
}

#[test]
fn htsim_connection_matrix_and_pfc_log() {
    let tmp = dir("htsim");
    let d = tmp.path();
    // htsim's .cm: 8:1 incast of 1 MB on a k=4 fat tree, PFC on, small buffer.
    let mut cm = String::from("Nodes 16\nConnections 8\n");
    for s in 1..=8 {
        cm.push_str(&format!("{s}->0 id {s} start 0 size 1000000\n"));
    }
    std::fs::write(d.join("incast.cm"), cm).unwrap();
    let out = d.join("out");
    let stdout = ok(&sim(&[
        "--topology",
        "fattree:k=4",
        "--flows",
        d.join("incast.cm").to_str().unwrap(),
        "--buffer",
        "1M",
        "--ecn",
        "off",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(
        stdout.contains("flows: 8 done, 0 failed, 0 unfinished; drops 0"),
        "{stdout}"
    );
    // pfc.txt: `time_ns node 1 port 1|0` per frame, pauses and resumes paired.
    let pfc = read(&out, "pfc.txt");
    let rows: Vec<Vec<u64>> = pfc
        .lines()
        .map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert!(!rows.is_empty(), "an 8:1 incast into a 1 MB buffer pauses");
    assert!(rows
        .iter()
        .all(|r| r.len() == 5 && r[2] == 1 && r[4] <= 1 && r[1] >= 16));
    assert!(rows.windows(2).all(|w| w[0][0] <= w[1][0]), "in time order");
    let summary: serde_json::Value = serde_json::from_str(&read(&out, "summary.json")).unwrap();
    assert!(summary["counters"]["pauses"].as_u64().unwrap() > 0);
    assert!(
        summary["tiers"]["host"]["pauses_received"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[test]
fn same_seed_same_bytes() {
    let tmp = dir("seed");
    let d = tmp.path();
    let run = |name: &str| {
        let out = d.join(name);
        ok(&sim(&[
            "--topology",
            "leafspine:leaves=4,spines=2,hosts=4",
            "--flows",
            "fbhadoop:load=0.6,duration=100us",
            "--seed",
            "5",
            "--no-speed",
            "--out",
            out.to_str().unwrap(),
        ]));
        out
    };
    let (a, b) = (run("a"), run("b"));
    for f in [
        "fct.txt",
        "summary.json",
        "qlen.csv",
        "links.csv",
        "fct_slowdown.svg",
        "qlen.svg",
    ] {
        assert!(
            read(&a, f) == read(&b, f),
            "{f} differs between two runs of one seed"
        );
    }
    assert!(read(&a, "fct.txt").lines().count() > 20);
}

#[test]
fn bad_input_is_a_clear_error() {
    let tmp = dir("bad");
    let d = tmp.path();
    let out = d.join("out");
    let o = out.to_str().unwrap();
    for (args, want) in [
        (
            vec![
                "--topology",
                "fattree:k=5",
                "--flows",
                "permutation:size=1M",
            ],
            "must be even",
        ),
        (
            vec!["--topology", "torus:n=3", "--flows", "permutation:size=1M"],
            "unknown topology",
        ),
        (
            vec![
                "--topology",
                "star:n=4",
                "--flows",
                "flow:src=0,dst=9,size=1",
            ],
            "must be hosts",
        ),
        (
            vec![
                "--topology",
                "star:n=4",
                "--flows",
                "flow:src=1,dst=1,size=1",
            ],
            "to itself",
        ),
        (
            vec!["--topology", "star:n=4", "--flows", "incast:n=9,size=1M"],
            "only 3 other hosts",
        ),
        (
            vec![
                "--topology",
                "star:n=4",
                "--flows",
                "websearch:load=2,duration=1ms",
            ],
            "load must be",
        ),
        (
            vec![
                "--topology",
                "star:n=4",
                "--flows",
                "permutation:size=1M",
                "--mtu",
                "1500",
            ],
            "mtu 1500",
        ),
        (
            vec![
                "--topology",
                "star:n=4",
                "--flows",
                "permutation:size=1M",
                "--fail",
                "0-3@1us",
            ],
            "no such link",
        ),
        (
            vec![
                "--topology",
                "star:n=4",
                "--flows",
                "permutation:size=1M",
                "--ecn",
                "kmin=1K",
            ],
            "needs kmin, kmax and pmax",
        ),
    ] {
        let mut a = args.clone();
        a.extend(["--out", o]);
        let r = sim(&a);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: wanted `{want}` in: {err}");
    }
    assert!(!out.exists(), "nothing written on a refused run");
}

#[test]
fn a_failed_link_is_routed_around() {
    let tmp = dir("fail");
    let d = tmp.path();
    let out = d.join("out");
    // leafspine: hosts 0..4 on leaf 8, 4..8 on leaf 9, spines 10 and 11.
    // Spine 10's link to leaf 9 fails 5 µs into a 2 MB transfer.
    let stdout = ok(&sim(&[
        "--topology",
        "leafspine:leaves=2,spines=2,hosts=4",
        "--flows",
        "permutation:size=2M",
        "--fail",
        "9-10@5us",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(
        stdout.contains("flows: 8 done, 0 failed, 0 unfinished"),
        "{stdout}"
    );
    let links = read(&out, "links.csv");
    // After the failure nothing more crosses 10 → 9.
    let row = links
        .lines()
        .find(|l| l.starts_with("10,") && l.split(',').nth(2) == Some("9"))
        .unwrap();
    let tx: u64 = row.split(',').nth(5).unwrap().parse().unwrap();
    assert!(tx < 2_000_000, "10→9 carried {tx} bytes");
}
