//! Memory keys: every bit from the caller's key source, none revealing a
//! table slot, and none ever issued twice in a device's lifetime.

use std::collections::HashSet;

use softrdma_core::mr::{KeySource, RemoteAccessError, MAX_MR};
use softrdma_core::qp::attr::AccessFlags;
use softrdma_core::{Endpoint, EndpointConfig, Error};

fn rw() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
}

fn endpoint(keys: KeySource) -> Endpoint {
    Endpoint::new(EndpointConfig {
        key_source: keys,
        ..Default::default()
    })
}

#[test]
fn keys_are_unique_over_a_million_registrations_with_churn() {
    let mut ep = endpoint(KeySource::seeded(42));
    let pd = ep.alloc_pd();
    let mut seen = HashSet::with_capacity(2 << 20);
    // A window of live regions, the oldest deregistered as each new one
    // comes: slots are reused all the time, keys never.
    let mut live = std::collections::VecDeque::new();
    for i in 0..1_000_000u64 {
        let (l, r) = ep.reg_mr(pd, i << 12, i << 12, 4096, rw()).unwrap();
        assert!(seen.insert(l), "lkey {l:#x} issued twice");
        assert!(seen.insert(r), "rkey {r:#x} issued twice");
        live.push_back((l, r, i << 12));
        if live.len() > 1000 || i % 7 == 0 {
            let (l, r, va) = live.pop_front().unwrap();
            ep.dereg_mr(l).unwrap();
            // A deregistered key no longer matches, locally or remotely.
            assert!(ep.mrs().get_by_lkey(l).is_none());
            assert_eq!(
                ep.mrs()
                    .resolve_remote(0, pd, r, va, 8, AccessFlags::REMOTE_READ),
                Err(RemoteAccessError::BadRkey)
            );
            assert!(ep.dereg_mr(l).is_err(), "deregistered twice");
        }
    }
    assert_eq!(ep.mrs().keys_issued(), 2_000_000);
    assert_eq!(ep.mrs().len(), live.len());
    // The live ones still resolve.
    for &(l, r, va) in &live {
        assert_eq!(ep.mrs().get_by_lkey(l).unwrap().rkey, r);
        assert!(ep
            .mrs()
            .resolve_remote(0, pd, r, va, 8, AccessFlags::REMOTE_READ)
            .is_ok());
    }
}

#[test]
fn every_bit_of_a_key_is_the_sources_and_repeats_are_redrawn() {
    // A source that repeats each value once, and passes 0 (never a key).
    let seq = [
        0u32,
        0xdead_beef,
        0xdead_beef,
        0x1234_5678,
        0x1234_5678,
        7,
        9,
    ];
    let mut i = 0;
    let mut ep = endpoint(KeySource::new(move || {
        let k = seq[i % seq.len()];
        i += 1;
        k
    }));
    let pd = ep.alloc_pd();
    assert_eq!(
        ep.reg_mr(pd, 0, 0, 64, rw()).unwrap(),
        (0xdead_beef, 0x1234_5678)
    );
    assert_eq!(ep.reg_mr(pd, 0, 0, 64, rw()).unwrap(), (7, 9));
    // Now the source only repeats issued keys: registration fails instead
    // of reusing one.
    assert_eq!(
        ep.reg_mr(pd, 0, 0, 64, rw()),
        Err(Error::OutOfResources(
            "memory keys (the key source keeps repeating itself)"
        ))
    );
}

#[test]
fn keys_do_not_reveal_the_slot() {
    // Two registrations into the same slot (the first freed first) get
    // unrelated keys: no bits in common beyond chance.
    let mut ep = endpoint(KeySource::seeded(7));
    let pd = ep.alloc_pd();
    let (l1, r1) = ep.reg_mr(pd, 0, 0, 64, rw()).unwrap();
    ep.dereg_mr(l1).unwrap();
    let (l2, r2) = ep.reg_mr(pd, 0, 0, 64, rw()).unwrap();
    let common = |a: u32, b: u32| (!(a ^ b)).count_ones();
    assert!(common(l1, l2) < 28 && common(r1, r2) < 28);
    assert_ne!(l1 & 0xfff, l2 & 0xfff, "no slot index in the low bits");
    const { assert!(MAX_MR >= 1 << 20) };
}
