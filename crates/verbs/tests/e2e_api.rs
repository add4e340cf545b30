//! The everyday API, used as an application would: endpoints exchanged with
//! `oob::exchange`, `Qp::connect`, one-call operations, `Cq::wait`,
//! caller-owned buffers given back, borrowed access, and the errors that
//! hardware's behaviour calls for. Two real processes on loopback.

mod support;

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use softrdma_verbs::*;
use support::*;

const W: Option<Duration> = Some(Duration::from_secs(30));

/// The endpoint exchange's TCP connection, server side: listen on an
/// ephemeral port, tell the peer over `oob`, accept.
fn listen_for_peer(oob: &mut Oob) -> TcpStream {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    oob.send(l.local_addr().unwrap().to_string().as_bytes());
    l.accept().unwrap().0
}

/// The client side of [`listen_for_peer`].
fn dial_peer(oob: &mut Oob) -> TcpStream {
    let addr = String::from_utf8(oob.recv()).unwrap();
    TcpStream::connect(addr).unwrap()
}

/// A connected RC QP with its CQ (channel-backed), over `tcp`.
fn rc(
    ctx: &Context,
    pd: &Pd,
    tcp: &mut TcpStream,
    regions: &[RemoteRegion],
) -> (Qp, Cq, QpEndpoint) {
    let cq = ctx
        .create_cq(64, Some(&ctx.create_comp_channel().unwrap()))
        .unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq)).unwrap();
    let me = qp.endpoint().with_regions(regions.iter().copied());
    let peer = oob::exchange(tcp, &me).expect("exchange endpoints");
    qp.connect(&peer, &ConnectOptions::default())
        .expect("connect");
    (qp, cq, peer)
}

/// The child offers a `Vec<u64>` it registered with `reg_buf`; the parent
/// WRITEs, READs and runs both atomics through the one-call API; the child
/// then takes its vector back and finds exactly what the parent did.
#[test]
fn caller_buffer_is_written_remotely_and_given_back() {
    two_processes(
        "caller_buffer_is_written_remotely_and_given_back",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let v: Vec<u64> = (0..512).collect();
            let mr = pd.reg_buf(v, ALL_REMOTE).expect("reg_buf a Vec<u64>");
            let mut tcp = listen_for_peer(&mut oob);
            let (_qp, _cq, _) = rc(&ctx, &pd, &mut tcp, &[mr.remote()]);
            oob.expect("done");
            let v = mr.into_buffer().map_err(|b| b.1).expect("into_buffer");
            let mut want: Vec<u64> = (0..512).collect();
            want[0] = 100 + 7; // fetch_add 7
            want[1] = 0xfeed; // compare_swap 1 -> 0xfeed
            for (i, w) in want[8..16].iter_mut().enumerate() {
                *w = 0x1111_1111_0000_0000 | i as u64; // the WRITE
            }
            assert_eq!(v, want, "the vector given back");
        },
        |mut oob| {
            let mut tcp = dial_peer(&mut oob);
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let mine = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            assert_eq!(mine.addr() % PAGE as u64, 0, "alloc_mr is page-aligned");
            let (qp, cq, peer) = rc(&ctx, &pd, &mut tcp, &[]);
            let r = peer.regions[0];
            assert_eq!(r.len, 512 * 8);
            // The counter starts at 0 (the vector's value): add 100 first
            // through a WRITE, then the atomics.
            mine.store_u64(0, 100).unwrap();
            qp.write(1, mine.slice(0..8).unwrap(), r.slice(0..8).unwrap())
                .unwrap();
            cq.wait(1, W).expect("write");
            qp.fetch_add(2, mine.slice(8..16).unwrap(), r.slice(0..8).unwrap(), 7)
                .unwrap();
            cq.wait(2, W).expect("fetch_add");
            assert_eq!(mine.load_u64(8).unwrap(), 100, "fetch_add's old value");
            qp.compare_swap(
                3,
                mine.slice(16..24).unwrap(),
                r.slice(8..16).unwrap(),
                1,
                0xfeed,
            )
            .unwrap();
            cq.wait(3, W).expect("compare_swap");
            assert_eq!(mine.load_u64(16).unwrap(), 1, "compare_swap's old value");
            let data: Vec<u8> = (0..8u64)
                .flat_map(|i| (0x1111_1111_0000_0000 | i).to_ne_bytes())
                .collect();
            mine.with_bytes_mut(64..128, |b| b.copy_from_slice(&data))
                .unwrap();
            qp.write(4, mine.slice(64..128).unwrap(), r.slice(64..128).unwrap())
                .unwrap();
            qp.read(
                5,
                mine.slice(1024..1024 + 4096 - 1024).unwrap(),
                r.slice(0..3072).unwrap(),
            )
            .unwrap();
            // Completions of 4 and 5 in either wait order: `wait` keeps the
            // other one for later.
            cq.wait(5, W).expect("read");
            cq.wait(4, W).expect("write");
            let back = mine
                .with_bytes(1024 + 64..1024 + 128, |b| b.to_vec())
                .unwrap();
            assert_bytes(&back, &data, "the READ of what was written");
            assert_eq!(mine.load_u64(1024).unwrap(), 107);
            assert_eq!(mine.load_u64(1024 + 8).unwrap(), 0xfeed);
            oob.signal("done");
        },
    );
}

/// A remote access violation ends as IBA says: `Cq::wait` returns the
/// failed completion as an error naming its status.
#[test]
fn remote_violation_is_an_error_completion() {
    two_processes(
        "remote_violation_is_an_error_completion",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            // Readable only: a WRITE must fail.
            let mr = pd.alloc_mr(4096, AccessFlags::REMOTE_READ).unwrap();
            let mut tcp = listen_for_peer(&mut oob);
            let (_qp, _cq, _) = rc(&ctx, &pd, &mut tcp, &[mr.remote()]);
            // Only now may the peer's WRITE come: a fatal NAK sends this
            // QP to ERR, and one that came while it was still between RTR
            // and RTS would fail the RTS transition instead.
            oob.signal("connected");
            oob.expect("done");
        },
        |mut oob| {
            let mut tcp = dial_peer(&mut oob);
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let mine = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            let (qp, cq, peer) = rc(&ctx, &pd, &mut tcp, &[]);
            oob.expect("connected");
            let r = peer.regions[0];
            qp.write(9, mine.slice(0..64).unwrap(), r.slice(0..64).unwrap())
                .unwrap();
            match cq.wait(9, W) {
                Err(Error::Completion(c)) => {
                    assert_eq!((c.wr_id, c.status), (9, WcStatus::RemAccessErr), "{c:?}");
                    let msg = Error::Completion(c).to_string();
                    assert!(msg.contains("remote access error (10)"), "{msg}");
                }
                other => panic!("expected a remote access error, got {other:?}"),
            }
            let (state, _, _) = qp.query().unwrap();
            assert_eq!(state, QpState::Err, "the QP after a remote access error");
            oob.signal("done");
        },
    );
}

/// Misuse that hardware would reject or stall on fails at once, with an
/// error that says so; slices outside what was offered are refused.
#[test]
fn strict_like_hardware() {
    let ctx = open(V4);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq)).unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // A peer that is never contacted: posting fails before anything is sent.
    let far = QpEndpoint {
        qp_type: QpType::Rc,
        qpn: 0x123,
        psn: 7,
        gid: ctx.gid(),
        regions: vec![RemoteRegion {
            addr: 0x10000,
            rkey: 0x42,
            len: 4096,
        }],
    };
    let opts = ConnectOptions {
        max_rd_atomic: 0,
        ..Default::default()
    };
    qp.connect(&far, &opts).unwrap();
    let r = far.regions[0];
    let e = qp
        .read(1, mr.slice(0..64).unwrap(), r.slice(0..64).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max_rd_atomic is 0") && e.contains("stalls"),
        "{e}"
    );
    let e = qp
        .fetch_add(2, mr.slice(0..8).unwrap(), r, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_rd_atomic is 0"), "{e}");
    // Out-of-range slices, both sides.
    assert!(mr.slice(4000..4100).is_err());
    assert!(r.slice(..4097).is_err());
    assert!(r.at(4097).is_err());
    let e = qp
        .write(3, mr.slice(0..128).unwrap(), r.slice(0..64).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("remote region is shorter"), "{e}");
    // An atomic needs one 8-byte word.
    let e = qp
        .compare_swap(4, mr.slice(0..16).unwrap(), r, 0, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("8-byte word"), "{e}");
    // A misaligned word for local atomics.
    let e = mr.load_u64(4).unwrap_err().to_string();
    assert!(e.contains("not 8-byte aligned"), "{e}");
    // Connecting to the wrong type, and bad options.
    let uc = QpEndpoint {
        qp_type: QpType::Uc,
        ..far.clone()
    };
    let qp2 = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq)).unwrap();
    assert!(qp2.connect(&uc, &ConnectOptions::default()).is_err());
    let bad = ConnectOptions {
        rnr_retry: RnrRetry::Count(7),
        ..Default::default()
    };
    assert!(qp2
        .connect(&far, &bad)
        .unwrap_err()
        .to_string()
        .contains("0..=6"));
    // Nothing was moved by the refused connects.
    assert_eq!(qp2.query().unwrap().0, QpState::Reset);
    // Waiting for a completion that never comes ends at the deadline.
    match cq.wait(77, Some(Duration::from_millis(20))) {
        Err(Error::Timeout(_)) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
}

/// A verbs call from inside a borrow of region bytes would deadlock; it
/// panics instead, saying why, and the device works afterwards.
#[test]
fn verbs_call_inside_a_borrow_panics() {
    let ctx = open(V4);
    let pd = ctx.alloc_pd();
    let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        mr.with_bytes(.., |_| mr.load_u64(0)).unwrap()
    }));
    let msg = panic_message(r.expect_err("a re-entrant call must panic"));
    assert!(msg.contains("would deadlock"), "{msg}");
    mr.store_u64(8, 5).unwrap();
    assert_eq!(mr.load_u64(8).unwrap(), 5, "the device after the panic");
}

/// Endpoints survive their encodings byte for byte; a bad record is an
/// error that names the problem.
#[test]
fn endpoint_encodings() {
    let e = QpEndpoint {
        qp_type: QpType::Uc,
        qpn: 0x01_0203,
        psn: 0xab_cdef,
        gid: ip_to_gid("10.1.2.3".parse().unwrap()),
        regions: vec![
            RemoteRegion {
                addr: 0x7f00_1234_5000,
                rkey: 0xdead_beef,
                len: 1 << 20,
            },
            RemoteRegion {
                addr: 8,
                rkey: 1,
                len: 0,
            },
        ],
    };
    let b = e.to_bytes();
    assert_eq!(b.len(), 27 + 2 * 20);
    assert_eq!(&b[..9], &[3, 0x03, 0x02, 0x01, 0, 0xef, 0xcd, 0xab, 0]);
    assert_eq!(QpEndpoint::from_bytes(&b).unwrap(), e);
    assert!(QpEndpoint::from_bytes(&b[..b.len() - 1])
        .unwrap_err()
        .to_string()
        .contains("region count"));
    let mut bad = b.clone();
    bad[0] = 8; // IBV_QPT_RAW_PACKET: not a type softrdma has
    assert!(QpEndpoint::from_bytes(&bad)
        .unwrap_err()
        .to_string()
        .contains("QP type"));
    let mut bad = b.clone();
    bad[4] = 1; // QPN above 24 bits
    assert!(QpEndpoint::from_bytes(&bad)
        .unwrap_err()
        .to_string()
        .contains("24 bits"));
    let j = serde_json::to_string(&e).unwrap();
    assert!(j.contains("\"qp_type\":\"UC\""), "{j}");
    assert_eq!(serde_json::from_str::<QpEndpoint>(&j).unwrap(), e);
    assert!(serde_json::from_str::<QpEndpoint>(&j.replace("\"UC\"", "\"XX\"")).is_err());
}

#[test]
fn ibta_encodings() {
    // 4.096 us * 2^14 = 67.1 ms: exponent 14; just above it: 15.
    assert_eq!(
        ack_timeout_exponent(Some(Duration::from_nanos(4096 << 14))),
        14
    );
    assert_eq!(
        ack_timeout_exponent(Some(Duration::from_nanos((4096 << 14) + 1))),
        15
    );
    assert_eq!(ack_timeout_exponent(Some(Duration::ZERO)), 1);
    assert_eq!(ack_timeout_exponent(None), 0);
    assert_eq!(ack_timeout_exponent(Some(Duration::from_secs(100_000))), 31);
    // IBA's RNR table: 10 us is code 1, 640 us code 12, 655 ms code 0.
    assert_eq!(rnr_timer_code(Duration::from_micros(10)), 1);
    assert_eq!(rnr_timer_code(Duration::from_micros(11)), 2);
    assert_eq!(rnr_timer_code(Duration::from_micros(640)), 12);
    assert_eq!(rnr_timer_code(Duration::from_millis(491)), 31);
    assert_eq!(rnr_timer_code(Duration::from_millis(500)), 0);
    assert_eq!(rnr_timer_code(Duration::from_millis(600)), 0);
}

/// `Qp::post_send_list` posts a chain as `ibv_post_send` does: in order,
/// stopping at the first refused request (its index and why), the ones
/// before it posted and carried out.
#[test]
fn a_list_of_sends_posts_in_order_up_to_the_first_refused() {
    two_processes(
        "a_list_of_sends_posts_in_order_up_to_the_first_refused",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let mr = pd.alloc_mr(4096, ALL_REMOTE).unwrap();
            let mut tcp = listen_for_peer(&mut oob);
            let (_qp, _cq, _) = rc(&ctx, &pd, &mut tcp, &[mr.remote()]);
            oob.expect("done");
            let mut got = [0u8; 16];
            mr.read(0, &mut got);
            oob.send(&got);
        },
        |mut oob| {
            let mut tcp = dial_peer(&mut oob);
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let mine = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            mine.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]);
            mine.write(8, &42u64.to_le_bytes());
            let (qp, cq, peer) = rc(&ctx, &pd, &mut tcp, &[]);
            let r = peer.regions[0];
            let data = [mine.slice(0..8).unwrap()];
            let word = [mine.slice(8..16).unwrap()];
            let bad = [Sge {
                lkey: mine.lkey() ^ 0x55,
                ..data[0]
            }];
            fn wr<'a>(id: u64, op: SendOp, sgl: &'a [Sge]) -> SendWr<'a> {
                SendWr {
                    wr_id: id,
                    op,
                    sgl,
                    flags: SendFlags::SIGNALED,
                    ud: None,
                }
            }
            let list = [
                wr(
                    1,
                    SendOp::Write {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                    },
                    &data,
                ),
                wr(
                    2,
                    SendOp::AtomicWrite {
                        remote_addr: r.addr + 8,
                        rkey: r.rkey,
                    },
                    &word,
                ),
                wr(
                    3,
                    SendOp::Write {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                    },
                    &bad,
                ),
                wr(
                    4,
                    SendOp::Write {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                    },
                    &data,
                ),
            ];
            let (i, e) = qp.post_send_list(&list).unwrap_err();
            assert_eq!(i, 2, "the third request is refused: {e}");
            assert!(e.to_string().contains("lkey"), "{e}");
            cq.wait(1, W).unwrap();
            cq.wait(2, W).unwrap();
            let mut rest = [Completion::default(); 4];
            assert_eq!(
                cq.poll(&mut rest).unwrap(),
                0,
                "nothing after the refused one"
            );
            oob.signal("done");
            let got = oob.recv();
            assert_eq!(&got[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
            assert_eq!(u64::from_le_bytes(got[8..16].try_into().unwrap()), 42);
        },
    );
}
