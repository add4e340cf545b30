//! `aio::AsyncEvents` (feature `tokio`): a task awaiting a context's async
//! events is woken by the context's own eventfd when the engine raises one
//! — here `IBV_EVENT_QP_LAST_WQE_REACHED` for each of two SRQ-attached QPs
//! moved to ERR — and gets each event once, in order; with nothing raised
//! it stays pending.

mod support;

use std::time::Duration;

use softrdma_verbs::*;
use support::*;

/// A current-thread runtime with IO (the async types register their
/// descriptors with its reactor).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn async_events_wake_a_tokio_task_once_per_event() {
    runtime().block_on(async {
        let ctx = open(V4);
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(8, None).unwrap();
        let srq = pd.create_srq(8, 1).unwrap();
        let qps: Vec<Qp> = (0..2)
            .map(|_| qp_init(&pd, QpType::Rc, &cq, &cq, Some(&srq), cap(4, 4)))
            .collect();
        let events = aio::AsyncEvents::new(&ctx).unwrap();
        // Nothing raised: the task stays pending (no event is ever made up).
        assert!(
            tokio::time::timeout(Duration::from_millis(50), events.next())
                .await
                .is_err(),
            "an event before any was raised"
        );
        let err = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        for qp in &qps {
            qp.modify(&err, AttrMask::STATE).unwrap();
        }
        for qp in &qps {
            let e = tokio::time::timeout(WAIT, events.next())
                .await
                .expect("no event within the wait")
                .unwrap();
            assert_eq!(e, AsyncEvent::QpLastWqeReached(qp.qpn()));
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(50), events.next())
                .await
                .is_err(),
            "an event delivered twice"
        );
    });
}

/// `AsyncCq` takes its channel's events without looking whose they are, so
/// its CQ must have the channel to itself: a channel another CQ shares is
/// refused with an error saying so (the other CQ's events would have been
/// swallowed), and while an `AsyncCq` holds a channel no CQ can join it;
/// once the `AsyncCq` is gone one can. Before, both were accepted.
#[test]
fn async_cq_needs_a_channel_of_its_own() {
    runtime().block_on(async {
        let ctx = open(V4);
        let shared = ctx.create_comp_channel().unwrap();
        let a = ctx.create_cq(8, Some(&shared)).unwrap();
        let _b = ctx.create_cq(8, Some(&shared)).unwrap();
        let e = aio::AsyncCq::new(a)
            .err()
            .expect("a shared channel was taken");
        assert!(e.to_string().contains("of its own"), "{e}");

        let own = ctx.create_comp_channel().unwrap();
        let c = ctx.create_cq(8, Some(&own)).unwrap();
        let acq = aio::AsyncCq::new(c).unwrap();
        let e = ctx
            .create_cq(8, Some(&own))
            .err()
            .expect("a CQ joined an AsyncCq's channel");
        assert!(e.to_string().contains("belongs to an AsyncCq"), "{e}");
        drop(acq);
        ctx.create_cq(8, Some(&own)).unwrap();
    });
}
