//! rdma-core's example programs, unmodified, between two processes on this
//! host: RC, UC, UD and SRQ ping-pong, each with buffer validation (`-c`)
//! and with completion events (`-e`). `-g 0` gives the address vector the
//! peer's GID, which RoCE needs (as with rxe).

mod common;

use std::time::Duration;

fn pingpong(bin: &str, extra: &[&str]) {
    let port = common::next_port();
    let args = |c: &mut std::process::Command| {
        c.args(["-d", "srdma0", "-g", "0", "-n", "500", "-p"])
            .arg(port.to_string())
            .args(extra);
    };
    let mut s = common::command(bin);
    args(&mut s);
    let mut c = common::command(bin);
    args(&mut c);
    let (s, c) = common::pair(s, c, port, Duration::from_secs(120));
    common::assert_pair_ok(&format!("{bin} {extra:?}"), &s, &c);
    for out in [&s, &c] {
        assert!(
            out.stdout.contains("500 iters in"),
            "{bin} {extra:?}: no result line\n{}",
            out.text()
        );
    }
}

#[test]
fn rc_pingpong_validated() {
    pingpong("ibv_rc_pingpong", &["-c"]);
}

#[test]
fn rc_pingpong_events() {
    pingpong("ibv_rc_pingpong", &["-e"]);
}

/// `-N`: the new post-send API — `ibv_create_qp_ex` with send-ops flags,
/// `ibv_qp_to_qp_ex` and `ibv_wr_start`/`ibv_wr_send`/`ibv_wr_set_sge`/
/// `ibv_wr_complete` through the QP's `struct ibv_qp_ex`.
#[test]
fn rc_pingpong_new_send_api() {
    pingpong("ibv_rc_pingpong", &["-N", "-c"]);
}

#[test]
fn uc_pingpong_validated() {
    pingpong("ibv_uc_pingpong", &["-c"]);
}

#[test]
fn uc_pingpong_events() {
    pingpong("ibv_uc_pingpong", &["-e"]);
}

#[test]
fn ud_pingpong_validated() {
    pingpong("ibv_ud_pingpong", &["-c"]);
}

#[test]
fn ud_pingpong_events() {
    pingpong("ibv_ud_pingpong", &["-e"]);
}

#[test]
fn srq_pingpong_validated() {
    pingpong("ibv_srq_pingpong", &["-c"]);
}

#[test]
fn srq_pingpong_events() {
    pingpong("ibv_srq_pingpong", &["-e"]);
}
