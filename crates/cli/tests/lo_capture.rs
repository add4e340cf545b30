//! A capture of softrdma's own traffic the way an RDMA engineer takes one:
//! `tcpdump -i lo` while `softrdma perf` runs over UDP, then `softrdma
//! decode` of the file. On a loopback device nothing segments a UDP GSO
//! train, so the capture holds whole trains as single frames; the decoder
//! must find every packet in them, each with a good ICRC, and must not call
//! softrdma's own port-sharing probes malformed. Needs root (a capture) and
//! tcpdump; CI's unprivileged pass leaves this binary out.

mod common;
use common::{finish, own_address, spawn_env, spawn_tool};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_loopback_capture_decodes_packet_by_packet() {
    let addr = own_address();
    let dir = tempfile::tempdir().expect("a scratch directory");
    let file = dir.path().join("lo.pcap");
    let mut dump = Command::new("tcpdump")
        // Whole frames, each handed over as it comes (a capture stopped
        // with packets still in the kernel's buffer block loses them), into
        // a buffer a burst of 64 KiB trains does not overflow.
        .args([
            "-i",
            "lo",
            "-s",
            "0",
            "-U",
            "--immediate-mode",
            "-B",
            "65536",
            "-w",
        ])
        .arg(&file)
        .arg(format!("udp port 4791 and host {addr}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("tcpdump: {e} (this test needs tcpdump: apt-get install tcpdump)")
        });
    // tcpdump says on stderr when it listens; nothing sent before counts.
    let mut err = BufReader::new(dump.stderr.take().expect("piped"));
    let mut line = String::new();
    let start = Instant::now();
    while !line.contains("listening on") {
        line.clear();
        let n = err.read_line(&mut line).expect("tcpdump's stderr");
        assert!(
            n > 0 && start.elapsed() < Duration::from_secs(20),
            "tcpdump did not start capturing (this test needs root): {line}"
        );
    }
    let dev = format!("iso={addr}");
    let env = [("SOFTRDMA_DEVICES", dev.as_str())];
    let o = finish(
        spawn_env(
            &[
                "write_bw",
                "-d",
                "iso",
                "--transport",
                "udp",
                "-s",
                "65536",
                "-n",
                "20",
                "--loopback",
                "--check",
            ],
            &env,
        ),
        "write_bw over UDP",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Let tcpdump write out what it has, then end it (ours, by pid).
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill has no memory arguments; the pid is our child's.
    unsafe { libc::kill(dump.id() as libc::pid_t, libc::SIGINT) };
    let st = dump.wait().expect("tcpdump");
    assert!(st.success(), "tcpdump: {st}");

    let o = finish(
        spawn_tool(
            "decode",
            &[&file.to_string_lossy()[..], "--json", "--strict"],
            &[],
        ),
        "decode",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "decode --strict: {}\n{out}", o.status);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let summary = &lines.last().expect("a summary")["summary"];
    assert_eq!(summary["icrc_bad"], 0, "{summary}");
    assert_eq!(summary["malformed"], 0, "{summary}");
    // The client's WRITEs: 20 messages of 16 packets, every one of them
    // found, PSNs consecutive; most came in trains.
    let writes: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["opcode"]
                .as_str()
                .is_some_and(|o| o.contains("RDMA Write"))
        })
        .collect();
    assert_eq!(writes.len(), 20 * 16, "WRITE packets in the capture");
    let psn = |v: &Value| v["psn"].as_u64().expect("a PSN");
    for w in writes.windows(2) {
        assert_eq!(
            (psn(w[0]) + 1) % (1 << 24),
            psn(w[1]),
            "{} then {}",
            w[0],
            w[1]
        );
    }
    let in_trains = writes
        .iter()
        .filter(|w| w["segments"].as_u64() > Some(1))
        .count();
    assert!(
        in_trains > writes.len() / 2,
        "{in_trains} of {} WRITE packets came in GSO trains",
        writes.len()
    );
}
