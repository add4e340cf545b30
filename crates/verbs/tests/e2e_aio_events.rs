//! `aio::AsyncEvents` (feature `tokio`): a task awaiting a context's async
//! events is woken by the context's own eventfd when the engine raises one
//! — here `IBV_EVENT_QP_LAST_WQE_REACHED` for each of two SRQ-attached QPs
//! moved to ERR — and gets each event once, in order; with nothing raised
//! it stays pending.

mod support;

use std::time::Duration;

use softrdma_verbs::*;
use support::*;

#[test]
fn async_events_wake_a_tokio_task_once_per_event() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
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
