//! The connection manager's blocking layer (`cm::Listener`, `cm::connect`,
//! `cm::UdListener`, `cm::resolve_ud`) as an application uses it: two real
//! processes on loopback, connected by address and port with private data
//! both ways and no out-of-band exchange (the test's pipe only carries the
//! port picked and the checks' verdicts).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use softrdma_verbs::cm::{self, CmOptions};
use softrdma_verbs::*;
use support::*;

const W: Option<Duration> = Some(Duration::from_secs(30));

fn opts() -> CmOptions {
    CmOptions::default().with_timeout(Duration::from_secs(20))
}

/// The service's address: the context's device address and `port`.
fn at(ctx: &Context, port: u16) -> SocketAddr {
    SocketAddr::new(ctx.device().addr, port)
}

fn rc_qp(ctx: &Context, pd: &Pd) -> (Qp, Cq) {
    let cq = ctx
        .create_cq(64, Some(&ctx.create_comp_channel().unwrap()))
        .unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq)).unwrap();
    (qp, cq)
}

/// An RC QP moved to INIT (so receives can be posted before the
/// connection exists, as with rdma_create_qp).
fn rc_qp_init(ctx: &Context, pd: &Pd) -> (Qp, Cq) {
    let (qp, cq) = rc_qp(ctx, pd);
    let a = QpAttr {
        port_num: 1,
        qp_access_flags: ALL_REMOTE,
        ..Default::default()
    };
    qp.modify_to(QpState::Init, &a).unwrap();
    (qp, cq)
}

fn trim(b: &[u8]) -> &[u8] {
    let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    &b[..end]
}

/// The server listens, reads the client's REQ private data before
/// accepting, answers with its own in the REP; both QPs come back in RTS
/// and carry a SEND each way and an RDMA WRITE into the server's region
/// (whose address and rkey the REP's private data carried).
#[test]
fn rc_listen_accept_connect_with_private_data() {
    two_processes(
        "rc_listen_accept_connect_with_private_data",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let l = cm::Listener::bind(&ctx, at(&ctx, 0)).expect("listen");
            oob.send(&l.local_addr().port().to_le_bytes());
            let (qp, cq) = rc_qp_init(&ctx, &pd);
            let mr = pd.alloc_mr(4096, ALL_REMOTE).unwrap();
            qp.recv(1, mr.slice(0..64).unwrap()).unwrap();
            let req = l.next_request(Duration::from_secs(20)).expect("a request");
            assert_eq!(trim(req.private_data()), b"hello from the client");
            assert_eq!(req.qp_type(), QpType::Rc);
            let r = mr.remote().slice(1024..2048).unwrap();
            let mut rep = r.addr.to_le_bytes().to_vec();
            rep.extend_from_slice(&r.rkey.to_le_bytes());
            let conn = req.accept(&qp, &rep, &opts()).expect("accept");
            assert_eq!(qp.query().unwrap().0, QpState::Rts);
            assert!(conn.peer_addr().is_some());
            let c = cq.wait(1, W).expect("the client's SEND");
            assert_eq!(c.byte_len, 64);
            assert_bytes(&read_mr(&mr, 0, 64), &pattern(7, 64), "the SEND");
            mr.write(64, &pattern(8, 32));
            qp.send(2, mr.slice(64..96).unwrap()).unwrap();
            cq.wait(2, W).expect("the reply");
            oob.expect("written");
            assert_bytes(&read_mr(&mr, 1024, 128), &pattern(9, 128), "the WRITE");
            oob.signal("checked");
            assert!(
                conn.wait_disconnected(Duration::from_secs(20)).unwrap(),
                "the client's DREQ"
            );
        },
        |mut oob| {
            let port = u16::from_le_bytes(oob.recv().try_into().unwrap());
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let (qp, cq) = rc_qp(&ctx, &pd);
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            let conn = cm::connect(&ctx, at(&ctx, port), &qp, b"hello from the client", &opts())
                .expect("connect");
            assert_eq!(qp.query().unwrap().0, QpState::Rts);
            let p = conn.private_data();
            let r = RemoteRegion {
                addr: u64::from_le_bytes(p[0..8].try_into().unwrap()),
                rkey: u32::from_le_bytes(p[8..12].try_into().unwrap()),
                len: 1024,
            };
            qp.recv(3, mr.slice(1024..1088).unwrap()).unwrap();
            mr.write(0, &pattern(7, 64));
            qp.send(1, mr.slice(0..64).unwrap()).unwrap();
            cq.wait(1, W).expect("SEND");
            cq.wait(3, W).expect("the server's reply");
            assert_bytes(&read_mr(&mr, 1024, 32), &pattern(8, 32), "the reply");
            mr.write(2048, &pattern(9, 128));
            qp.write(2, mr.slice(2048..2176).unwrap(), r.slice(0..128).unwrap())
                .unwrap();
            cq.wait(2, W).expect("WRITE");
            oob.signal("written");
            oob.expect("checked");
            conn.disconnect(Duration::from_secs(20))
                .expect("disconnect");
        },
    );
}

/// A rejected request fails the client's connect with
/// `Error::Rejected`, whose reason is "consumer reject" and whose private
/// data is the server's words; the client's QP stays out of RTS, and a
/// second attempt on a fresh QP is accepted.
#[test]
fn rc_reject_with_reason() {
    two_processes(
        "rc_reject_with_reason",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let l = cm::Listener::bind(&ctx, at(&ctx, 0)).expect("listen");
            oob.send(&l.local_addr().port().to_le_bytes());
            let req = l.next_request(Duration::from_secs(20)).expect("a request");
            assert_eq!(trim(req.private_data()), b"let me in");
            req.reject(b"busy: try again").expect("reject");
            let (qp, _cq) = rc_qp(&ctx, &pd);
            let conn = l.accept(&qp, b"ok now", &opts()).expect("accept the retry");
            assert_eq!(trim(conn.private_data()), b"second try");
            oob.expect("done");
        },
        |mut oob| {
            let port = u16::from_le_bytes(oob.recv().try_into().unwrap());
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let (qp, _cq) = rc_qp(&ctx, &pd);
            match cm::connect(&ctx, at(&ctx, port), &qp, b"let me in", &opts()) {
                Err(Error::Rejected(r)) => {
                    assert!(r.by_application(), "{r}");
                    assert_eq!(r.reason, 28);
                    assert_eq!(trim(&r.private_data), b"busy: try again");
                    let msg = Error::Rejected(r).to_string();
                    assert!(
                        msg.contains("(28)") && msg.contains("busy: try again"),
                        "{msg}"
                    );
                }
                other => panic!("expected a rejection, got {other:?}"),
            }
            assert_ne!(qp.query().unwrap().0, QpState::Rts);
            let (qp2, _cq2) = rc_qp(&ctx, &pd);
            let conn = cm::connect(&ctx, at(&ctx, port), &qp2, b"second try", &opts())
                .expect("the second connect");
            assert_eq!(trim(conn.private_data()), b"ok now");
            oob.signal("done");
        },
    );
}

/// A connect to a port nobody listens on fails fast and says so, not
/// after the CM's minute of retries: the REQ is answered "invalid service
/// ID" (or, where no process answers for the address at all, the
/// caller's timeout names what it waited for).
#[test]
fn rc_connect_to_nobody() {
    let ctx = open(V4);
    let pd = ctx.alloc_pd();
    let (qp, _cq) = rc_qp(&ctx, &pd);
    let o = CmOptions::default().with_timeout(Duration::from_secs(5));
    match cm::connect(&ctx, at(&ctx, 1), &qp, b"anyone?", &o) {
        Err(Error::Rejected(r)) => assert!(r.no_listener(), "{r}"),
        Err(Error::Timeout(what)) => assert!(what.contains("REP"), "{what}"),
        other => panic!("expected a rejection or timeout, got {other:?}"),
    }
}

/// UD service resolution by SIDR: the client learns the server's QPN and
/// Q_Key (and the server's private data), sends it a datagram, and the
/// server receives it; a second request is rejected with words the client
/// gets back.
#[test]
fn ud_sidr_resolve_and_send() {
    two_processes(
        "ud_sidr_resolve_and_send",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq)).unwrap();
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            let l = cm::UdListener::bind(&ctx, at(&ctx, 0)).expect("serve");
            oob.send(&l.local_addr().port().to_le_bytes());
            oob.send(&qp.qpn().to_le_bytes());
            let req = l
                .next_request(Duration::from_secs(20))
                .expect("a SIDR request");
            assert_eq!(trim(req.private_data()), b"which QP?");
            req.accept(&qp, b"this one").expect("answer");
            assert_eq!(qp.query().unwrap().0, QpState::Rts);
            qp.recv(1, mr.slice(0..40 + 256).unwrap()).unwrap();
            // UD drops a datagram that finds no receive posted: the client
            // sends only once this one is (the SIDR_REP left in `accept`).
            oob.signal("posted");
            let c = cq.wait(1, W).expect("the datagram");
            assert_eq!(c.byte_len, 40 + 100);
            assert_bytes(&read_mr(&mr, 40, 100), &pattern(3, 100), "the datagram");
            let req = l
                .next_request(Duration::from_secs(20))
                .expect("a second request");
            req.reject(b"full").expect("reject");
            oob.expect("done");
        },
        |mut oob| {
            let port = u16::from_le_bytes(oob.recv().try_into().unwrap());
            let qpn = u32::from_le_bytes(oob.recv().try_into().unwrap());
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq)).unwrap();
            cm::ready_ud(&qp).expect("ready the UD QP");
            let peer = cm::resolve_ud(&ctx, at(&ctx, port), b"which QP?", Duration::from_secs(20))
                .expect("resolve the service");
            assert_eq!(peer.qpn, qpn);
            assert_eq!(peer.qkey, cm::UDP_QKEY);
            assert_eq!(trim(&peer.private_data), b"this one");
            oob.expect("posted");
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            mr.write(0, &pattern(3, 100));
            let sge = [mr.slice(0..100).unwrap()];
            qp.post_send(&SendWr {
                ud: Some(peer.dest()),
                ..wr(1, SendOp::Send, &sge, SendFlags::SIGNALED)
            })
            .unwrap();
            cq.wait(1, W).expect("the datagram sent");
            match cm::resolve_ud(&ctx, at(&ctx, port), b"again", Duration::from_secs(20)) {
                Err(Error::Rejected(r)) => {
                    assert!(r.sidr && r.by_application(), "{r}");
                    assert_eq!(trim(&r.private_data), b"full");
                }
                other => panic!("expected a rejection, got {other:?}"),
            }
            oob.signal("done");
        },
    );
}

/// The active side of an ID in the event model (`CmId`): resolved and
/// connected (REQ sent for `qp`) to the listener at `addr`.
fn connect_id(
    ctx: &Context,
    addr: SocketAddr,
    qp: &Qp,
    private: &[u8],
) -> (cm::CmId, cm::EventChannel) {
    let dev = ctx.connection_manager().unwrap();
    let ch = cm::EventChannel::new().unwrap();
    let id = cm::CmId::new(&ch, cm::PortSpace::Tcp);
    id.resolve_addr(None, addr, std::slice::from_ref(&dev))
        .unwrap();
    assert_eq!(
        ch.get(W).expect("ADDR_RESOLVED").kind,
        cm::EventKind::AddrResolved
    );
    id.resolve_route().unwrap();
    assert_eq!(
        ch.get(W).expect("ROUTE_RESOLVED").kind,
        cm::EventKind::RouteResolved
    );
    let param = cm::ConnParam {
        private_data: private.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    id.connect(&param, qp.qpn()).unwrap();
    (id, ch)
}

/// A listening ID in the event model on the context's device (port 0
/// picks one), its port sent to the peer over `oob`, and the first
/// request it gets: the listener, its channel and the request's event.
fn listen_for_request(ctx: &Context, oob: &mut Oob) -> (cm::CmId, cm::EventChannel, cm::CmEvent) {
    let dev = ctx.connection_manager().unwrap();
    let ch = cm::EventChannel::new().unwrap();
    let id = cm::CmId::new(&ch, cm::PortSpace::Tcp);
    id.bind(at(ctx, 0), std::slice::from_ref(&dev)).unwrap();
    id.listen(std::slice::from_ref(&dev)).unwrap();
    oob.send(&id.src_addr().unwrap().port().to_le_bytes());
    let ev = ch.get(W).expect("the CONNECT_REQUEST");
    assert_eq!(ev.kind, cm::EventKind::ConnectRequest);
    (id, ch, ev)
}

/// An active side that gives up on its REQ (its ID destroyed before the
/// REP: a connect timed out, the process is exiting) tells the passive
/// side, as the kernel's CM does (a REJ "timeout"): the request's ID gets
/// REJECTED, status 4, once — whether that REJ reached the server while
/// it held the request (the accept then fails: there is nothing left to
/// accept), or the port's steering took it elsewhere (it names no ID of
/// the server's, so it goes by hash among the address's processes) and
/// the server's REP is what the client answers with it. Before, nothing
/// was sent and an unknown REP was dropped: the server's REP went
/// unanswered for 15 retries (a minute) before UNREACHABLE.
#[test]
fn a_requester_that_gives_up_rejects_its_request() {
    two_processes(
        "a_requester_that_gives_up_rejects_its_request",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let (l, ch, ev) = listen_for_request(&ctx, &mut oob);
            assert_eq!(trim(&ev.conn.private_data), b"anyone home?");
            let child = ev.id.clone();
            oob.signal("requested");
            oob.expect("gone");
            let (qp, _cq) = rc_qp(&ctx, &pd);
            let accepted = child.accept(&cm::ConnParam::default(), qp.qpn());
            let ev = ch
                .get(Some(Duration::from_secs(20)))
                .expect("REJECTED for the abandoned request");
            assert_eq!(ev.kind, cm::EventKind::Rejected, "accept: {accepted:?}");
            assert!(ev.id == child, "REJECTED names the request's ID");
            assert_eq!(ev.status, 4, "IB_CM_REJ_TIMEOUT");
            assert_eq!(ev.conn.private_data.len(), cm::MAX_REJECT_PRIVATE);
            assert!(
                ch.get(Some(Duration::from_millis(300))).is_none(),
                "one event"
            );
            child.destroy();
            l.destroy();
            oob.signal("done");
        },
        |mut oob| {
            let port = u16::from_le_bytes(oob.recv().try_into().unwrap());
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let (qp, _cq) = rc_qp_init(&ctx, &pd);
            let (id, _ch) = connect_id(&ctx, at(&ctx, port), &qp, b"anyone home?");
            oob.expect("requested");
            id.destroy();
            oob.signal("gone");
            oob.expect("done");
        },
    );
}

/// A server that disconnects right after its accept (before the client's
/// RTU: `rdma_disconnect`, `rdma_destroy_id` or its exit) while the client
/// has yet to take the REP: the client still establishes (CONNECT_RESPONSE,
/// its QP moved with the REP's numbers, the RTU) and then gets
/// DISCONNECTED, once; the server gets DISCONNECTED once. Before, the
/// DREQ closed the client's connection under it: its QP could no longer be
/// moved ("no peer yet"), the establishment failed (librdmacm's callers
/// got CONNECT_ERROR) and DISCONNECTED came for a connection never
/// established.
#[test]
fn a_dreq_before_the_rtu_follows_the_establishment() {
    two_processes(
        "a_dreq_before_the_rtu_follows_the_establishment",
        |mut oob| {
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let (l, ch, ev) = listen_for_request(&ctx, &mut oob);
            let child = ev.id.clone();
            let (qp, _cq) = rc_qp(&ctx, &pd);
            let param = cm::ConnParam {
                private_data: b"welcome, and goodbye".to_vec(),
                ..Default::default()
            };
            child.accept(&param, qp.qpn()).expect("accept");
            child.disconnect().expect("disconnect before the RTU");
            let ev = ch.get(W).expect("the client's DREP");
            assert_eq!(ev.kind, cm::EventKind::Disconnected);
            assert!(ev.id == child);
            oob.signal("disconnected");
            oob.expect("done");
            assert!(ch.try_get().is_none(), "one event");
            child.destroy();
            l.destroy();
        },
        |mut oob| {
            let port = u16::from_le_bytes(oob.recv().try_into().unwrap());
            let ctx = open(V4);
            let pd = ctx.alloc_pd();
            let (qp, _cq) = rc_qp_init(&ctx, &pd);
            let (id, ch) = connect_id(&ctx, at(&ctx, port), &qp, b"hello");
            // The server's DREQ has been answered by now.
            oob.expect("disconnected");
            let ev = ch.get(W).expect("CONNECT_RESPONSE");
            assert_eq!(ev.kind, cm::EventKind::ConnectResponse);
            assert_eq!(trim(&ev.conn.private_data), b"welcome, and goodbye");
            for s in [QpState::Rtr, QpState::Rts] {
                let (attr, mask) = id.init_qp_attr(s).expect("the REP's numbers");
                qp.modify(&attr, mask).expect("move the QP");
            }
            id.establish().expect("establish (the RTU)");
            let ev = ch.get(W).expect("DISCONNECTED");
            assert_eq!(ev.kind, cm::EventKind::Disconnected);
            assert!(ev.id == id);
            assert!(
                ch.get(Some(Duration::from_millis(300))).is_none(),
                "one event"
            );
            id.disconnect()
                .expect("a disconnect after the peer's is a no-op");
            id.destroy();
            oob.signal("done");
        },
    );
}
