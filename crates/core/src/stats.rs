//! Counters an RDMA engineer asks for when something is slow or stuck.

/// Per-endpoint packet and error counters (`softrdma stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Request packets handed to a responder (of any QP state that takes
    /// them): this endpoint is a target of someone's traffic.
    pub requests_rx: u64,
    /// Packets sent again by go-back-N.
    pub retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_rcvd: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_rcvd: u64,
    /// Duplicate requests seen by responders.
    pub duplicates: u64,
    /// Requests ahead of the expected PSN.
    pub out_of_sequence: u64,
    /// ACKs for PSNs never sent, ignored.
    pub ghost_acks: u64,
    /// Packets that did not parse, or carried an opcode the QP cannot take.
    pub malformed: u64,
    /// Packets for a QP that does not exist or is not ready.
    pub dropped_no_qp: u64,
    /// RC/UC packets from an address other than the QP's connected peer.
    pub wrong_source: u64,
    /// Requests dropped unanswered because the responder's queue of
    /// answers was full (the requester retransmits them).
    pub responder_busy: u64,
    /// Remote Access Error NAKs sent: a bad rkey, a range outside the
    /// region, or an access the region or QP does not grant.
    pub access_naks_sent: u64,
    /// Invalid Request NAKs sent: an opcode out of sequence, a length the
    /// message does not allow, too many READs and atomics outstanding.
    pub invalid_naks_sent: u64,
    /// UD packets with the wrong Q_Key.
    pub bad_qkey: u64,
    /// UC messages dropped after a PSN gap, UD sends without a receive WQE.
    pub dropped_messages: u64,
    /// Completions lost to a full completion queue.
    pub cq_overflows: u64,
    /// QPs `poll_transmit` looked at (one per packet, plus one for each QP
    /// found to have nothing after all): the scheduler's cost.
    pub sched_visits: u64,
    /// Times a retransmission timeout halved a QP's window.
    pub window_backoffs: u64,
    /// One-sided work requests an [`Offload`](crate::endpoint::Offload)
    /// carried out at post (shared memory) instead of sending them.
    pub offloaded: u64,
    /// Of those, work requests held back behind ones on the wire and
    /// carried out once they completed (`Endpoint::offload_held`).
    pub offloaded_after_hold: u64,
    /// Data packets received marked ECN-CE (congestion experienced).
    pub ce_received: u64,
    /// CNPs sent by QPs' notification points, and received.
    pub cnps_sent: u64,
    pub cnps_received: u64,
    /// Selective repeat: requests that arrived ahead of the expected PSN
    /// and were held until the gap before them filled, and those that
    /// could not be held (outside the window, or the endpoint's pool of
    /// held packets full) and were dropped for the requester to resend.
    pub held_out_of_order: u64,
    pub hold_dropped: u64,
    /// Selective repeat: resends whose answer did not come within the
    /// measured retransmission timeout, sent again.
    pub resend_timeouts: u64,
}
