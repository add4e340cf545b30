//! Which IPv4 senders get their hidden header fields recovered.
//!
//! A UDP socket does not show the IPv4 Identification field or the DF bit,
//! both covered by the ICRC (see [`softrdma_wire::icrc`]). softrdma sends
//! with DF set and ID 0, so the receiver first checks the ICRC assuming
//! exactly that: the full 32-bit check. Other senders (rxe increments the ID
//! per packet) need ID and DF recovered from the ICRC, which lets about one
//! corrupted packet in 2^15 through instead of one in 2^32. So recovery is
//! given only to senders that need it, and this table learns which do:
//!
//! * A sender (source address and UDP port) whose last
//!   [`PEER_AFTER_EXACT`] datagrams all matched with ID 0 is taken to be a
//!   softrdma peer.
//! * A softrdma peer gets no general recovery. The one exception is the
//!   kernel's own numbering of a GSO train: the n segments of one
//!   `UDP_SEGMENT` send leave with IDs 0, 1, .., n-1 (software segmentation
//!   in `inet_gso_segment` counts up from the first segment's ID), so for a
//!   peer an ID below [`GSO_MAX_SEGMENTS`] with DF set is accepted. That
//!   lets through a corrupted packet whose error happens to equal one of 63
//!   ID changes: about one in 2^26 instead of one in 2^32.
//! * If a peer keeps sending packets that only a larger ID explains
//!   ([`DEMOTE_AFTER`] in a row, which random corruption practically never
//!   produces), the address has changed hands (say, to an rxe host); it is
//!   forgotten and gets recovery again.
//! * Senders not (yet) known get full recovery; their GSO-range IDs neither
//!   count for nor against becoming a peer, any other recovered ID restarts
//!   the count.
//!
//! The table is bounded: when it holds [`TABLE_CAP`] senders and a new one
//! arrives, one sender not yet learned as a peer makes room (any sender if
//! all are peers, which then only has to be learned again): a stream of
//! datagrams from new source ports cannot make the learned peers strangers.
//!
//! The sender of the previous datagram is kept out of the map, so a stream
//! from one sender (a GSO train, a QP's burst) costs no hashing: the keyed
//! hash of an 18-byte key, twice per datagram, was ~3 % of the CPU of a
//! 64 KiB `write_bw` over loopback.

use softrdma_wire::icrc::HiddenCheck;
use std::collections::HashMap;

/// Consecutive exact (ID 0) datagrams that make a sender a softrdma peer.
pub const PEER_AFTER_EXACT: u8 = 4;
/// Largest number of segments one GSO send of ours carries; a peer's
/// datagrams may carry IDs below it.
pub const GSO_MAX_SEGMENTS: u16 = 64;
/// Consecutive large-ID datagrams after which a peer is forgotten.
pub const DEMOTE_AFTER: u8 = 8;
/// Senders remembered at most.
pub const TABLE_CAP: usize = 1024;

/// A sender: IPv4-mapped GID and UDP source port.
pub(crate) type SenderKey = ([u8; 16], u16);

#[derive(Debug, Clone, Copy, Default)]
struct Sender {
    exact_streak: u8,
    peer: bool,
    mismatches: u8,
}

/// What the receive path does with one IPv4 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Deliver; the header carried this ID and DF.
    Accept {
        ident: u16,
        df: bool,
        recovered: bool,
    },
    /// Drop as corrupt.
    Reject,
}

/// Per-sender learning state.
pub(crate) struct SenderTable {
    /// Every sender but `last`'s.
    map: HashMap<SenderKey, Sender>,
    /// The sender of the previous datagram, and its state.
    last: Option<(SenderKey, Sender)>,
    pub(crate) learned: u64,
    pub(crate) demoted: u64,
}

impl SenderTable {
    pub(crate) fn new() -> SenderTable {
        SenderTable {
            map: HashMap::with_capacity(TABLE_CAP),
            last: None,
            learned: 0,
            demoted: 0,
        }
    }

    /// Whether recovery beyond the GSO range is off for this sender.
    pub(crate) fn is_peer(&self, key: &SenderKey) -> bool {
        match &self.last {
            Some((k, s)) if k == key => s.peer,
            _ => self.map.get(key).is_some_and(|s| s.peer),
        }
    }

    /// The state of `key`'s sender, made the last one.
    fn sender(&mut self, key: SenderKey) -> &mut Sender {
        if self.last.as_ref().is_none_or(|(k, _)| *k != key) {
            if let Some((k, s)) = self.last.take() {
                self.map.insert(k, s);
            }
            let s = match self.map.remove(&key) {
                Some(s) => s,
                None => {
                    if self.map.len() >= TABLE_CAP {
                        // Make room by one: a sender not yet learned as a
                        // peer if there is one (found at once when many
                        // are: strangers are what fill the table), else
                        // any. Clearing the whole table let a stream of
                        // datagrams from new source ports make every
                        // learned peer a stranger again.
                        let victim = (self.map.iter().find(|(_, s)| !s.peer))
                            .or_else(|| self.map.iter().next())
                            .map(|(k, _)| *k);
                        if let Some(k) = victim {
                            self.map.remove(&k);
                        }
                    }
                    Sender::default()
                }
            };
            self.last = Some((key, s));
        }
        &mut self.last.as_mut().expect("just set").1
    }

    /// Apply the policy to the outcome of a check run with recovery allowed.
    pub(crate) fn decide(&mut self, key: SenderKey, check: HiddenCheck) -> Decision {
        if check == HiddenCheck::Corrupt {
            return Decision::Reject;
        }
        let s = self.sender(key);
        let (mut learned, mut demoted) = (0, 0);
        let d = match check {
            HiddenCheck::Exact => {
                s.mismatches = 0;
                s.exact_streak = s.exact_streak.saturating_add(1);
                if !s.peer && s.exact_streak >= PEER_AFTER_EXACT {
                    s.peer = true;
                    learned = 1;
                }
                Decision::Accept {
                    ident: 0,
                    df: true,
                    recovered: false,
                }
            }
            HiddenCheck::Recovered { ident, df } => {
                let gso_train = df && ident < GSO_MAX_SEGMENTS;
                let accept = Decision::Accept {
                    ident,
                    df,
                    recovered: true,
                };
                if gso_train {
                    s.mismatches = 0;
                    accept
                } else if s.peer {
                    s.mismatches += 1;
                    if s.mismatches >= DEMOTE_AFTER {
                        *s = Sender::default();
                        demoted = 1;
                    }
                    Decision::Reject
                } else {
                    s.exact_streak = 0;
                    accept
                }
            }
            HiddenCheck::Corrupt => Decision::Reject,
        };
        self.learned += learned;
        self.demoted += demoted;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: SenderKey = ([1; 16], 4791);
    const REC: HiddenCheck = HiddenCheck::Recovered {
        ident: 4242,
        df: true,
    };

    #[test]
    fn learns_after_four_exact_then_refuses_recovery() {
        let mut t = SenderTable::new();
        for i in 0..PEER_AFTER_EXACT {
            assert!(!t.is_peer(&A), "after {i}");
            assert!(matches!(
                t.decide(A, HiddenCheck::Exact),
                Decision::Accept { .. }
            ));
        }
        assert!(t.is_peer(&A));
        assert_eq!(t.decide(A, REC), Decision::Reject);
        // A GSO train's segment IDs are still fine.
        assert!(matches!(
            t.decide(A, HiddenCheck::Recovered { ident: 5, df: true }),
            Decision::Accept { ident: 5, .. }
        ));
        assert_eq!(
            t.decide(
                A,
                HiddenCheck::Recovered {
                    ident: 5,
                    df: false
                }
            ),
            Decision::Reject
        );
    }

    #[test]
    fn a_large_id_restarts_the_count() {
        let mut t = SenderTable::new();
        for _ in 0..3 {
            t.decide(A, HiddenCheck::Exact);
        }
        assert!(matches!(
            t.decide(A, REC),
            Decision::Accept {
                recovered: true,
                ..
            }
        ));
        for _ in 0..3 {
            t.decide(A, HiddenCheck::Exact);
        }
        assert!(!t.is_peer(&A));
        t.decide(A, HiddenCheck::Exact);
        assert!(t.is_peer(&A));
    }

    #[test]
    fn persistent_large_ids_demote_a_peer() {
        let mut t = SenderTable::new();
        for _ in 0..4 {
            t.decide(A, HiddenCheck::Exact);
        }
        for _ in 0..DEMOTE_AFTER - 1 {
            assert_eq!(t.decide(A, REC), Decision::Reject);
        }
        assert!(t.is_peer(&A));
        assert_eq!(t.decide(A, REC), Decision::Reject);
        assert!(!t.is_peer(&A));
        assert!(matches!(t.decide(A, REC), Decision::Accept { .. }));
        assert_eq!(t.demoted, 1);
    }

    #[test]
    fn interleaved_senders_keep_their_own_state() {
        const B: SenderKey = ([2; 16], 4791);
        let mut t = SenderTable::new();
        for _ in 0..PEER_AFTER_EXACT {
            t.decide(A, HiddenCheck::Exact);
            t.decide(B, REC);
        }
        assert!(t.is_peer(&A));
        assert!(!t.is_peer(&B));
        assert_eq!(t.decide(A, REC), Decision::Reject);
        assert!(matches!(t.decide(B, REC), Decision::Accept { .. }));
        assert!(t.is_peer(&A), "A's state survived B becoming the last");
        assert_eq!(t.learned, 1);
    }

    #[test]
    fn bounded() {
        let mut t = SenderTable::new();
        for i in 0..(TABLE_CAP as u32 + 10) {
            let mut g = [0u8; 16];
            g[..4].copy_from_slice(&i.to_be_bytes());
            t.decide((g, 1), HiddenCheck::Exact);
            assert!(t.map.len() < TABLE_CAP);
        }
        assert_eq!(t.decide(A, HiddenCheck::Corrupt), Decision::Reject);
    }

    /// A flood of new senders, twice the table's size, leaves a learned
    /// peer learned: its recovered IDs are still refused.
    #[test]
    fn a_flood_of_strangers_does_not_unlearn_a_peer() {
        let mut t = SenderTable::new();
        for _ in 0..PEER_AFTER_EXACT {
            t.decide(A, HiddenCheck::Exact);
        }
        assert!(t.is_peer(&A));
        for i in 0..(2 * TABLE_CAP as u32) {
            let mut g = [9u8; 16];
            g[..4].copy_from_slice(&i.to_be_bytes());
            t.decide((g, 7), HiddenCheck::Exact);
            assert!(t.map.len() < TABLE_CAP);
        }
        assert!(t.is_peer(&A), "the peer was forgotten");
        assert_eq!(t.decide(A, REC), Decision::Reject);
    }
}
