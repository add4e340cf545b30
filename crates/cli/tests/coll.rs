//! `softrdma coll <name>_perf`: nccl-tests' output, column for column, and
//! a real `#wrong` — with ranks started by `--np` and by Open MPI's
//! `mpirun` (which must be installed: `.ci/run` installs openmpi-bin).

use std::process::{Command, Output};

fn coll(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("coll")
        .args(args)
        .env("SOFTRDMA_COLL_TIMEOUT", "60")
        .output()
        .expect("running softrdma coll")
}

fn ok(o: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{what}: {}\n{stdout}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// The fields of a data row at nccl-tests' fixed columns: the preamble
/// `%12li  %12li  %8s  %6s  %6s` and two groups `  %7s  %6s  %6s  %6g`.
fn fields(row: &str) -> Vec<&str> {
    assert_eq!(row.len(), 118, "a row is 118 columns: {row:?}");
    let mut v = Vec::new();
    let mut at = 0;
    for (i, w) in [12, 12, 8, 6, 6, 7, 6, 6, 6, 7, 6, 6, 6].iter().enumerate() {
        if i > 0 {
            assert_eq!(
                &row[at..at + 2],
                "  ",
                "two spaces before field {i}: {row:?}"
            );
            at += 2;
        }
        v.push(row[at..at + w].trim_start());
        at += w;
    }
    v
}

/// Check a whole report; returns its data rows' fields.
fn check_report(out: &str, test: &str, ranks: usize) -> Vec<Vec<String>> {
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("# nccl-tests version 2.19.6 format: softrdma-coll"),
        "{out}"
    );
    assert_eq!(lines[1], format!("# Collective test starting: {test}"));
    assert!(
        lines[2].starts_with("# nThread 1 nGpus 1 minBytes ")
            && lines[2].contains(" warmup iters: ")
            && lines[2].ends_with(" graph: 0 unalign: 0"),
        "{}",
        lines[2]
    );
    assert_eq!(lines[3], "#");
    assert_eq!(lines[4], "# Using devices");
    for r in 0..ranks {
        let l = lines[5 + r];
        assert!(
            l.starts_with(&format!("#  Rank {r:2} Group  0 Pid ")) && l.contains(" device  0 ["),
            "{l}"
        );
    }
    let h = 5 + ranks;
    assert_eq!(lines[h], "#");
    assert_eq!(
        lines[h + 1],
        "#                                                              out-of-place                       in-place          "
    );
    assert_eq!(
        lines[h + 2],
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong "
    );
    assert_eq!(
        lines[h + 3],
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         "
    );
    let rows: Vec<Vec<String>> = lines[h + 4..]
        .iter()
        .take_while(|l| !l.starts_with('#'))
        .map(|l| fields(l).into_iter().map(String::from).collect())
        .collect();
    assert!(!rows.is_empty(), "{out}");
    let f = h + 4 + rows.len();
    assert_eq!(lines[f], "# Out of bounds values : 0 OK", "{out}");
    assert!(lines[f + 1].starts_with("# Avg bus bandwidth    : ") && lines[f + 1].ends_with(' '));
    assert_eq!(lines[f + 2], "#");
    assert_eq!(lines[f + 3], format!("# Collective test concluded: {test}"));
    assert_eq!(lines[f + 4], "#");
    assert_eq!(lines.len(), f + 6, "an empty line ends the report");
    // The average is that of every row's two busbw figures.
    let busbw: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r[7].parse::<f64>().unwrap(), r[11].parse::<f64>().unwrap()])
        .collect();
    let avg: f64 = lines[f + 1][25..].trim().parse().unwrap();
    let want = busbw.iter().sum::<f64>() / busbw.len() as f64;
    // Rows print two decimals; the footer averages the unrounded figures.
    assert!((avg - want).abs() <= 0.006, "avg {avg} vs rows' {want}");
    rows
}

#[test]
fn all_reduce_perf_prints_nccl_tests_format_with_checked_results() {
    let o = coll(&[
        "all_reduce_perf",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "1M",
        "-f",
        "4",
        "-n",
        "5",
    ]);
    let out = ok(&o, "all_reduce_perf");
    let rows = check_report(&out, "all_reduce_perf", 2);
    let sizes: Vec<u64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
    assert_eq!(sizes, [8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288]);
    for r in &rows {
        let bytes: f64 = r[0].parse().unwrap();
        assert_eq!(r[1].parse::<f64>().unwrap() * 4.0, bytes, "count × 4 B");
        assert_eq!(
            (r[2].as_str(), r[3].as_str(), r[4].as_str()),
            ("float", "sum", "-1")
        );
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "#wrong: {r:?}");
        for g in [5, 9] {
            let us: f64 = r[g].parse().unwrap();
            let algbw: f64 = r[g + 1].parse().unwrap();
            let busbw: f64 = r[g + 2].parse().unwrap();
            // algbw = bytes / time; busbw = algbw × 2(n−1)/n = algbw for 2.
            assert!(
                (algbw - bytes / us / 1e3).abs() <= 0.01 + algbw * 0.01,
                "{r:?}"
            );
            assert_eq!(algbw, busbw, "{r:?}");
        }
    }
}

#[test]
fn every_tool_checks_every_type_with_three_ranks() {
    for (test, extra) in [
        ("all_reduce_perf", &["-o", "all"][..]),
        ("all_gather_perf", &[][..]),
        ("reduce_scatter_perf", &["-o", "all"][..]),
        ("broadcast_perf", &["-r", "-1"][..]),
        ("reduce_perf", &["-r", "-1", "-o", "all"][..]),
        ("alltoall_perf", &[][..]),
        ("sendrecv_perf", &[][..]),
    ] {
        let mut args = vec![
            test, "--np", "3", "-b", "96", "-e", "96K", "-f", "32", "-n", "2", "-d", "all",
        ];
        args.extend_from_slice(extra);
        let out = ok(&coll(&args), test);
        let rows = check_report(&out, test, 3);
        for r in &rows {
            assert_eq!(r[8], "0", "{test} out of place: {r:?}");
            // nccl-tests checks no in-place AlltoAll or SendRecv.
            let in_place = if matches!(test, "alltoall_perf" | "sendrecv_perf") {
                "N/A"
            } else {
                "0"
            };
            assert_eq!(r[12], in_place, "{test} in place: {r:?}");
        }
        // Sizes as nccl-tests derives them for 3 ranks: per-rank blocks of
        // 16-byte multiples for the gathering collectives.
        for r in &rows {
            let ws: u64 = match r[2].as_str() {
                "int8" | "uint8" => 1,
                "half" | "bfloat16" => 2,
                "int32" | "uint32" | "float" => 4,
                _ => 8,
            };
            let (size, count): (u64, u64) = (r[0].parse().unwrap(), r[1].parse().unwrap());
            if matches!(
                test,
                "all_gather_perf" | "reduce_scatter_perf" | "alltoall_perf"
            ) {
                // From 96 B, 3 KiB or 96 KiB requested (-f 32).
                let req = [96u64, 3072, 98304]
                    .into_iter()
                    .find(|&q| q >= size)
                    .unwrap();
                let base = (req / ws / 3) & !((16 / ws) - 1);
                assert_eq!((size, count), (base * 3 * ws, base), "{test}: {r:?}");
            } else {
                assert_eq!(count * ws, size, "{test}: {r:?}");
            }
        }
        if test == "reduce_perf" || test == "broadcast_perf" {
            let roots: std::collections::BTreeSet<&str> =
                rows.iter().map(|r| r[4].as_str()).collect();
            assert_eq!(
                roots.into_iter().collect::<Vec<_>>(),
                ["0", "1", "2"],
                "{test}: -r -1"
            );
        }
    }
}

#[test]
fn check_off_prints_na() {
    let out = ok(
        &coll(&[
            "sendrecv_perf",
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "-c",
            "0",
        ]),
        "-c 0",
    );
    let rows = check_report(&out, "sendrecv_perf", 2);
    assert_eq!((rows[0][8].as_str(), rows[0][12].as_str()), ("N/A", "N/A"));
    assert!(out.contains(" validation: 0 "));
}

/// `-N` repeats the sweep of sizes for each type (and operator and root)
/// in turn, as nccl-tests' `TimeTest` does: not the whole run.
#[test]
fn run_cycles_repeat_each_types_sweep() {
    let out = ok(
        &coll(&[
            "reduce_perf",
            "--np",
            "2",
            "-b",
            "64",
            "-e",
            "128",
            "-f",
            "2",
            "-d",
            "all",
            "-o",
            "max",
            "-r",
            "-1",
            "-N",
            "2",
            "-n",
            "1",
            "-w",
            "0",
        ]),
        "-N 2",
    );
    let rows = check_report(&out, "reduce_perf", 2);
    let got: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (r[2].clone(), r[4].clone(), r[0].clone()))
        .collect();
    let mut want = Vec::new();
    for t in [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
        "bfloat16",
    ] {
        for root in ["0", "1"] {
            for _ in 0..2 {
                for size in ["64", "128"] {
                    want.push((t.to_string(), root.to_string(), size.to_string()));
                }
            }
        }
    }
    assert_eq!(got, want, "{out}");
}

#[test]
fn mpirun_starts_the_ranks() {
    let o = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_softrdma"))
        .args([
            "coll",
            "all_reduce_perf",
            "-b",
            "8",
            "-e",
            "128K",
            "-f",
            "16",
            "-n",
            "5",
        ])
        .env("SOFTRDMA_COLL_TIMEOUT", "60")
        .output()
        .expect("mpirun (Open MPI) is needed for this test: apt-get install openmpi-bin");
    let out = ok(&o, "mpirun -np 2 softrdma coll all_reduce_perf");
    let rows = check_report(&out, "all_reduce_perf", 2);
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r[8] == "0" && r[12] == "0"), "{out}");
}

#[test]
fn bad_flags_are_named() {
    let o = coll(&["all_reduce_perf", "-d", "float7"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("invalid type float7"));
    let o = coll(&["allreduce", "--np", "2"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown test 'allreduce'"));
    let o = coll(&["all_reduce_perf", "-b", "8B"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("invalid size specified for 'minbytes'"));
}
