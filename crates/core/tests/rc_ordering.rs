//! What holds the requester back: the fence, the READ/atomic limit
//! (`max_rd_atomic`) and the window of unacknowledged PSNs.

mod support;

use softrdma_core::qp::attr::Mtu;
use softrdma_core::qp::MAX_UNACKED_PSNS;
use softrdma_core::wc::WcStatus;
use softrdma_core::wr::{SendFlags, SendOp};
use softrdma_netsim::Sim;
use support::*;

const SIG: SendFlags = SendFlags::SIGNALED;
const D: u64 = US;

fn setup(o: &Opts) -> (Sim<Host>, QpEnd, QpEnd, Trace) {
    let (mut sim, qa, qb) = pair(1, 1 << 20, o);
    let t = trace(&mut sim, &[0, 1]);
    (sim, qa, qb, t)
}

fn times(t: &Trace) -> Vec<u64> {
    t.borrow().iter().map(|p| p.t).collect()
}

/// A READ of three packets from `X` on B, then a WRITE of new bytes to
/// `X`, fenced or not.
fn read_then_write(fence: bool) -> (Sim<Host>, QpEnd, Trace) {
    let (mut sim, qa, qb, t) = setup(&Opts::default());
    let x = region(0) + 8192;
    pattern(sim.node_mut(1), x, 3000, 1);
    pattern(sim.node_mut(0), region(0) + 4096, 3000, 2);
    let a = sim.node_mut(0);
    let read = SendOp::Read {
        remote_addr: x,
        rkey: qb.rkey,
    };
    a.post(&qa, 1, read, region(0), 3000, SIG).unwrap();
    let write = SendOp::Write {
        remote_addr: x,
        rkey: qb.rkey,
    };
    let flags = if fence { SIG | SendFlags::FENCE } else { SIG };
    a.post(&qa, 2, write, region(0) + 4096, 3000, flags)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    (sim, qa, t)
}

#[test]
fn fence_holds_a_request_until_earlier_reads_complete() {
    let (sim, _qa, t) = read_then_write(true);
    assert_eq!(
        lines(&t),
        [
            "A READ_REQUEST 100 ackreq",
            "B READ_RESPONSE_FIRST 100 [ACK msn=1]",
            "B READ_RESPONSE_MIDDLE 101",
            "B READ_RESPONSE_LAST 102 [ACK msn=1]",
            // Only once the READ has completed.
            "A WRITE_FIRST 103",
            "A WRITE_MIDDLE 104",
            "A WRITE_LAST 105 ackreq",
            "B ACKNOWLEDGE 105 [ACK msn=2]",
        ]
    );
    assert_eq!(times(&t), [0, D, D, D, 2 * D, 2 * D, 2 * D, 3 * D]);
    // So the READ returned the bytes from before the WRITE.
    let mut old = Host::new(1, 1 << 20, 0);
    pattern(&mut old, region(0) + 8192, 3000, 1);
    assert_eq!(
        sim.node(0).mem.slice(region(0), 3000),
        old.mem.slice(region(0) + 8192, 3000)
    );
}

#[test]
fn without_fence_a_write_follows_a_read_at_once() {
    let (_sim, _qa, t) = read_then_write(false);
    assert_eq!(
        lines(&t)[..4],
        [
            "A READ_REQUEST 100 ackreq",
            "A WRITE_FIRST 103",
            "A WRITE_MIDDLE 104",
            "A WRITE_LAST 105 ackreq",
        ]
    );
}

#[test]
fn fence_does_not_wait_for_sends_and_writes() {
    let (mut sim, qa, qb, t) = setup(&Opts::default());
    let a = sim.node_mut(0);
    let w = SendOp::Write {
        remote_addr: region(0),
        rkey: qb.rkey,
    };
    a.post(&qa, 1, w, region(0), 8, SIG).unwrap();
    a.post(&qa, 2, w, region(0), 8, SIG | SendFlags::FENCE)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A WRITE_ONLY 100 ackreq",
            "A WRITE_ONLY 101 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]",
            "B ACKNOWLEDGE 101 [ACK msn=2]",
        ]
    );
}

#[test]
fn fence_waits_for_an_atomic() {
    let (mut sim, qa, qb, t) = setup(&Opts::default());
    let a = sim.node_mut(0);
    let fa = SendOp::FetchAdd {
        remote_addr: region(0),
        rkey: qb.rkey,
        add: 1,
    };
    a.post(&qa, 1, fa, region(0) + 64, 8, SIG).unwrap();
    a.post(&qa, 2, SendOp::Send, region(0), 8, SIG | SendFlags::FENCE)
        .unwrap();
    sim.node_mut(1).post_recv(&qb, 70, region(0) + 128, 64);
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A FETCH_ADD 100 ackreq",
            "B ATOMIC_ACKNOWLEDGE 100 [ACK msn=1]",
            "A SEND_ONLY 101 ackreq",
            "B ACKNOWLEDGE 101 [ACK msn=2]",
        ]
    );
}

#[test]
fn max_rd_atomic_limits_reads_in_flight() {
    let o = Opts {
        rd_atomic: 2,
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    let a = sim.node_mut(0);
    for wr in 0..4 {
        let op = SendOp::Read {
            remote_addr: region(0) + 64 * wr,
            rkey: qb.rkey,
        };
        a.post(&qa, wr, op, region(0) + 4096 + 64 * wr, 64, SIG)
            .unwrap();
    }
    sim.run_until_idle(10 * SEC).unwrap();
    assert_eq!(
        lines(&t),
        [
            "A READ_REQUEST 100 ackreq",
            "A READ_REQUEST 101 ackreq",
            "B READ_RESPONSE_ONLY 100 [ACK msn=1]",
            "B READ_RESPONSE_ONLY 101 [ACK msn=2]",
            // Each completion frees a slot for the next READ.
            "A READ_REQUEST 102 ackreq",
            "A READ_REQUEST 103 ackreq",
            "B READ_RESPONSE_ONLY 102 [ACK msn=3]",
            "B READ_RESPONSE_ONLY 103 [ACK msn=4]",
        ]
    );
    assert_eq!(times(&t), [0, 0, D, D, 2 * D, 2 * D, 3 * D, 3 * D]);
    assert_eq!(
        statuses(&sim.node_mut(0).poll_cq(qa.scq)),
        (0..4).map(|w| (w, WcStatus::Success)).collect::<Vec<_>>()
    );
}

#[test]
fn window_of_unacknowledged_psns() {
    let o = Opts {
        mtu: Mtu::B256,
        ..Default::default()
    };
    let (mut sim, qa, qb, t) = setup(&o);
    let len = 300 * 256;
    pattern(sim.node_mut(0), region(0), len, 6);
    let w = SendOp::Write {
        remote_addr: region(0) + (512 << 10),
        rkey: qb.rkey,
    };
    sim.node_mut(0)
        .post(&qa, 1, w, region(0), len as u32, SIG)
        .unwrap();
    sim.run_until_idle(10 * SEC).unwrap();
    let tr = t.borrow();
    let sent: Vec<_> = tr.iter().filter(|p| p.from == 0).collect();
    assert_eq!(sent.len(), 300);
    // A full window leaves at once; the rest waits for the first ACK.
    let at_once = sent.iter().filter(|p| p.t == 0).count();
    assert_eq!(at_once, MAX_UNACKED_PSNS as usize);
    assert!(sent[256..].iter().all(|p| p.t == 2 * D));
    // AckReq every 64 packets, at the window's edge, and on the last.
    let ackreq: Vec<u32> = sent
        .iter()
        .filter(|p| p.repr.bth.ack_req)
        .map(|p| p.psn())
        .collect();
    assert_eq!(ackreq, [163, 227, 291, 355, 399]);
    let acks: Vec<String> = tr.iter().filter(|p| p.from == 1).map(Pkt::line).collect();
    assert_eq!(
        acks,
        [
            "B ACKNOWLEDGE 163 [ACK msn=0]",
            "B ACKNOWLEDGE 227 [ACK msn=0]",
            "B ACKNOWLEDGE 291 [ACK msn=0]",
            "B ACKNOWLEDGE 355 [ACK msn=0]",
            "B ACKNOWLEDGE 399 [ACK msn=1]",
        ]
    );
    drop(tr);
    assert_eq!(
        sim.node(1).mem.slice(region(0) + (512 << 10), len),
        sim.node(0).mem.slice(region(0), len)
    );
}

/// A responder that owes an ACK and has a request of its own to send (the
/// reply of a ping-pong) sends the request first and the ACK right after
/// it: the peer's application waits for the reply, not for the ACK. At
/// most one request passes a queued ACK, so a long message never holds one
/// back; and the ACK still acknowledges, the peer completes both.
#[test]
fn a_reply_passes_one_queued_ack() {
    let (mut sim, qa, qb) = pair(3, 1 << 20, &Opts::default());
    let w = |q: &QpEnd| SendOp::Write {
        remote_addr: region(0) + 4096,
        rkey: q.rkey,
    };
    let a = sim.node_mut(0);
    a.post(&qa, 1, w(&qb), region(0), 8, SendFlags::SIGNALED)
        .unwrap();
    let out = a.take(0, usize::MAX);
    assert_eq!(describe_all(0, &out), ["A WRITE_ONLY 100 ackreq"]);
    let b = sim.node_mut(1);
    b.deliver(0, 0, &out[0]);
    // B answers before it sends what the WRITE called for: the reply first.
    b.post(&qb, 2, w(&qa), region(0), 8, SendFlags::SIGNALED)
        .unwrap();
    let back = b.take(0, usize::MAX);
    assert_eq!(
        describe_all(1, &back),
        [
            "B WRITE_ONLY 16777200 ackreq",
            "B ACKNOWLEDGE 100 [ACK msn=1]"
        ]
    );

    // A long reply (3 packets at MTU 1024): one packet passes the ACK.
    let a = sim.node_mut(0);
    for p in &back {
        a.deliver(0, 1, p);
    }
    a.post(&qa, 3, w(&qb), region(0), 3000, SendFlags::SIGNALED)
        .unwrap();
    let out = a.take(0, usize::MAX);
    assert_eq!(
        describe_all(0, &out),
        [
            "A WRITE_FIRST 101",
            "A ACKNOWLEDGE 16777200 [ACK msn=1]",
            "A WRITE_MIDDLE 102",
            "A WRITE_LAST 103 ackreq",
        ]
    );
    let got: Vec<_> = a
        .poll_cq(qa.scq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(got, [(1, WcStatus::Success)]);
    let b = sim.node_mut(1);
    for p in &out {
        b.deliver(0, 0, p);
    }
    let acks = b.take(0, usize::MAX);
    assert_eq!(describe_all(1, &acks), ["B ACKNOWLEDGE 103 [ACK msn=2]"]);
    let got: Vec<_> = b
        .poll_cq(qb.scq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(got, [(2, WcStatus::Success)]);
}
