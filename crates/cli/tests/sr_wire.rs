//! Issue 13's loss run on the wire, in a test binary of its own: how many
//! packets a lossy transfer costs depends on how the two processes are
//! scheduled against each other (ACKs coalesce, a stalled window asks for
//! an ACK once per opening), so it runs with no other test's processes
//! competing for the CPUs.

mod common;
use common::{counter, finish, free_port, spawn};

/// Packets both processes of one `write_bw` sent (server and client as two
/// commands, each counting its own), after checking both verified.
fn packets_of_write_bw(extra: &[&str]) -> (u64, u64) {
    let port = free_port();
    let mut common = vec![
        "write_bw",
        "-p",
        &port,
        "-m",
        "256",
        "-s",
        "99991",
        "-n",
        "20",
        "-u",
        "12",
        "--transport",
        "udp",
        "--check",
        "--stats",
    ];
    common.extend(extra);
    let server = spawn(&common);
    let mut ca = common.clone();
    ca.push("127.0.0.1");
    let c = finish(spawn(&ca), "write_bw client");
    let s = finish(server, "write_bw server");
    let mut tx = [0; 2];
    for (i, (who, o)) in [("server", &s), ("client", &c)].into_iter().enumerate() {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains(" --check: every byte verified"),
            "{who} {extra:?}: {}\n{out}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        tx[i] = counter(&out, "softrdma counters: tx");
    }
    (tx[0], tx[1])
}

/// Issue 13's loss run: 20 WRITEs of 99,991 bytes at MTU 256 (7,820 request
/// packets) with 10 % loss, 10 % reordering, 5 % duplication and 1 %
/// corruption on both sides. Selective repeat (the default) puts at most
/// 1.3× the packets of the same transfer without faults on the wire, both
/// directions counted, and every byte is checked; go-back-N, asked for,
/// puts more than selective repeat under the same (milder) faults.
#[test]
fn selective_repeat_resends_only_what_was_lost() {
    let (srv0, cli0) = packets_of_write_bw(&[]);
    assert_eq!(
        cli0,
        20 * 99991_u64.div_ceil(256),
        "one packet per 256 bytes"
    );
    let min = srv0 + cli0;
    let f = "loss=0.10,reorder=0.10,dup=0.05,corrupt=0.01,seed=7";
    let (srv, cli) = packets_of_write_bw(&["--fault", f]);
    let ratio = (srv + cli) as f64 / min as f64;
    eprintln!("selective repeat: {srv} + {cli} packets against {min} without faults: {ratio:.3}x");
    assert!(ratio <= 1.3, "{srv} + {cli} packets for {min}: {ratio:.3}x");
    // Go-back-N against selective repeat under milder faults. Under the
    // ones above go-back-N stalls ~500 times a run on tail losses, each
    // recovered only by a timeout, and a stall whose resend or ACK is lost
    // 7 more times in a row ends in "transport retry counter exceeded"
    // (status 12) as IBA says it must: with ~20 % of rounds lost that is
    // a few percent of runs (seen in CI, 1 in ~40 by hand), a property of
    // the fault rates, not of the transport. At a third of them a stall
    // fails ~1e-9 of the time.
    let mild = "loss=0.03,reorder=0.03,dup=0.02,corrupt=0.005,seed=7";
    let (ssrv, scli) = packets_of_write_bw(&["--fault", mild]);
    let (gsrv, gcli) = packets_of_write_bw(&["--fault", mild, "--recovery", "gbn"]);
    eprintln!("milder faults: selective repeat {ssrv} + {scli}, go-back-N {gsrv} + {gcli} packets");
    assert!(gsrv + gcli > ssrv + scli, "go-back-N resends more");
}
