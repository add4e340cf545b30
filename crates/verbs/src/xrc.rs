//! XRC (eXtended Reliable Connected transport, IBA Annex A14): one
//! initiator QP reaches every XRC SRQ of a remote XRC domain through one
//! target QP there, each request naming the SRQ it is for.
//!
//! * [`Context::open_xrcd`]: an XRC domain ([`Xrcd`]).
//! * [`Pd::create_xrc_srq`]: an SRQ of a domain, with its PD (which checks
//!   the memory every request to it reaches, WRITE/READ/atomics included)
//!   and its CQ (where its receives complete); [`Srq::srq_num`] is the
//!   number a sender names.
//! * [`Xrcd::create_tgt_qp`]: the target QP (`IBV_QPT_XRC_RECV`): no PD,
//!   CQ, send or receive queue of its own. [`Xrcd::open_tgt_qp`] opens
//!   another handle on it by number (`ibv_open_qp`); the QP is destroyed
//!   with its last handle.
//! * [`Pd::create_qp`] with [`QpType::XrcSend`]: the initiator (no
//!   receive queue), whose sends go through [`Qp::post_send_xrc`].
//!
//! Both halves are brought up with [`Qp::modify`] like an RC QP (their
//! transition rules are the kernel's, see `softrdma_core::qp::state`).
//! XRC always runs over UDP, also between contexts of one host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use softrdma_core::cq::CqId;
use softrdma_core::mr::PdId;
use softrdma_core::qp::state::QpType;
use softrdma_core::wr::SendWr;

use crate::engine::Engine;
use crate::gid::GidTable;
use crate::{random_psn, Context, Cq, Mtu, Pd, Qp, Result, Srq};

/// An XRC domain (`struct ibv_xrcd`). It stays open while an XRC SRQ or
/// target QP of it exists (each holds a reference); closed when the last
/// of them and this handle are gone.
pub struct Xrcd {
    inner: XrcdRef,
    gid: [u8; 16],
    gids: Arc<GidTable>,
    port_mtu: Mtu,
}

/// A counted reference to an open XRC domain.
pub(crate) type XrcdRef = Arc<XrcdInner>;

pub(crate) struct XrcdInner {
    eng: Arc<Engine>,
    id: u32,
    /// The domain's target QPs by number, for `open_tgt_qp`.
    tgts: Mutex<HashMap<u32, Weak<TgtQp>>>,
}

/// An XRC target QP, shared by its handles: destroyed when the last goes.
pub(crate) struct TgtQp {
    xrcd: XrcdRef,
    qpn: u32,
}

impl Drop for TgtQp {
    fn drop(&mut self) {
        let eng = &self.xrcd.eng;
        let mut st = eng.lock();
        // An ACK the last pass deferred may be this QP's: the peer must
        // get it (see `Qp`'s drop).
        eng.flush_deferred(&mut st);
        let _ = st.ep.destroy_qp(self.qpn);
        st.publish_qps();
        drop(st);
        let mut m = self.xrcd.tgts.lock().unwrap_or_else(|e| e.into_inner());
        if m.get(&self.qpn).is_some_and(|w| w.strong_count() == 0) {
            m.remove(&self.qpn);
        }
    }
}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // Nothing of the domain is left: every SRQ and target QP holds
        // this, and each is destroyed before it lets go.
        let _ = self.eng.lock().ep.dealloc_xrcd(self.id);
    }
}

impl Context {
    /// `ibv_open_xrcd`: a new XRC domain of this context.
    pub fn open_xrcd(&self) -> Xrcd {
        let id = self.eng.lock().ep.alloc_xrcd();
        Xrcd {
            inner: Arc::new(XrcdInner {
                eng: self.eng.clone(),
                id,
                tgts: Mutex::new(HashMap::new()),
            }),
            gid: self.gid(),
            gids: self.gids.clone(),
            port_mtu: self.port_mtu,
        }
    }
}

impl Xrcd {
    /// The domain's number in its context.
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// Whether an XRC SRQ or target QP of this domain still exists
    /// (`ibv_close_xrcd` fails with `EBUSY` then).
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: a target QP of this
    /// domain, in RESET. Requests reaching it go to the XRC SRQ of this
    /// domain their XRCETH names; one of another domain, or none, is
    /// refused with an invalid request NAK.
    pub fn create_tgt_qp(&self) -> Result<Qp> {
        let qpn = self.inner.eng.lock().ep.create_xrc_tgt_qp(self.inner.id)?;
        let tgt = Arc::new(TgtQp {
            xrcd: self.inner.clone(),
            qpn,
        });
        self.inner
            .tgts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(qpn, Arc::downgrade(&tgt));
        Ok(self.tgt_handle(tgt))
    }

    /// `ibv_open_qp`: another handle on target QP `qpn` of this domain
    /// (modify, query and destroy work through either; the QP is destroyed
    /// with its last handle). Fails if the domain has no such target QP.
    pub fn open_tgt_qp(&self, qpn: u32) -> Result<Qp> {
        let tgt = self
            .inner
            .tgts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&qpn)
            .and_then(Weak::upgrade)
            .ok_or(softrdma_core::Error::InvalidArgument(
                "ibv_open_qp: this XRC domain has no target QP of that number",
            ))?;
        Ok(self.tgt_handle(tgt))
    }

    fn tgt_handle(&self, tgt: Arc<TgtQp>) -> Qp {
        Qp {
            eng: self.inner.eng.clone(),
            qpn: tgt.qpn,
            pd: PdId(0),
            qp_type: QpType::XrcRecv,
            psn: random_psn(),
            gid: self.gid,
            gids: self.gids.clone(),
            port_mtu: self.port_mtu,
            tgt: Some(tgt),
            // Never opened: lanes serve RC QPs only.
            lane: Arc::new(crate::lane::Lane::new()),
            rlane: Arc::new(crate::lane::CqLane::new(softrdma_core::cq::CqId(u32::MAX))),
        }
    }
}

impl Pd {
    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of domain `xrcd`
    /// holding `depth` receives of up to `max_sge` SGEs (in regions of this
    /// PD), completing on `cq`. Its number for senders is
    /// [`Srq::srq_num`].
    pub fn create_xrc_srq(&self, xrcd: &Xrcd, cq: &Cq, depth: u32, max_sge: u32) -> Result<Srq> {
        let mut st = self.eng.lock();
        let id = st
            .ep
            .create_xrc_srq(self.id, xrcd.inner.id, cq.id, depth, max_sge)?;
        st.count_udp_cq(cq.id.0, 1);
        Ok(Srq {
            eng: self.eng.clone(),
            id,
            xrc: Some((xrcd.inner.clone(), CqId(cq.id.0))),
        })
    }
}

impl Srq {
    /// `ibv_get_srq_num`: the 24-bit number an XRC sender names this SRQ
    /// by (`wr.qp_type.xrc.remote_srqn`); meaningful for XRC SRQs.
    pub fn srq_num(&self) -> u32 {
        self.id
    }

    /// Whether this is an XRC SRQ.
    pub fn is_xrc(&self) -> bool {
        self.xrc.is_some()
    }
}

impl Qp {
    /// Post a send work request on an XRC initiator QP for the target's
    /// XRC SRQ `remote_srqn`. Every SGE must lie in a memory region of
    /// this QP's protection domain.
    pub fn post_send_xrc(&self, wr: &SendWr<'_>, remote_srqn: u32) -> Result<()> {
        let mut st = self.eng.lock();
        let mut host = crate::HostSgl::default();
        let wr = self.host_sges(&st, wr, &mut host)?;
        st.post_send_xrc(self.qpn, &wr, remote_srqn)?;
        self.eng.posted_send(&mut st, false);
        Ok(())
    }

    /// [`Qp::post_send_xrc`] with inline SGEs that may point anywhere
    /// (verbs semantics).
    ///
    /// # Safety
    /// Inline SGEs must point to readable memory of their length.
    pub unsafe fn post_send_xrc_unchecked(&self, wr: &SendWr<'_>, remote_srqn: u32) -> Result<()> {
        let mut st = self.eng.lock();
        st.post_send_xrc(self.qpn, wr, remote_srqn)?;
        self.eng.posted_send(&mut st, false);
        Ok(())
    }

    /// The XRC domain of an XRC target QP.
    pub fn xrcd_id(&self) -> Option<u32> {
        self.tgt.as_ref().map(|t| t.xrcd.id)
    }
}
