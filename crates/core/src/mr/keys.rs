//! Memory keys: where their bits come from, and the record that keeps any
//! key from being handed out twice in a device's lifetime.
//!
//! A key is the only thing standing between a remote peer and a region, so
//! every bit of it comes from the caller's [`KeySource`] — the operating
//! system's CSPRNG in the real stack; the core, being sans-IO, reads no
//! randomness of its own. The key reveals nothing else: the table finds a
//! region's slot through a map, not through bits of the key.
//!
//! A key that was ever issued is never issued again, so a key observed once
//! (or guessed) can never come to name a later registration. That takes
//! memory per key ever issued. [`IssuedKeys`] keeps its first
//! [`SMALL_KEYS`] keys in one sorted vector (4 bytes each); past that it
//! stores each key as 16 bits in one of 65 536 sorted buckets chosen by its
//! upper 16 bits — 2 bytes per key (up to 4 while a bucket's vector has
//! grown but not filled), plus the bucket array (1.5 MiB). A region takes
//! two keys (lkey and rkey), so a registration costs 4–8 bytes for the rest
//! of the device's life; 10^8 registrations cost well under 1 GiB.
//!
//! The small vector is there because the bucket array is a fixed cost: a
//! context that registers a handful of regions would otherwise allocate
//! 65 536 vectors at its first key and walk them all when it is dropped.
//! The stateful fuzz target, which creates two endpoints per input, spent
//! 95% of its time doing exactly that.

use std::fmt;

/// Where key material comes from: called once per key drawn. Every bit of
/// a key is a bit of its output.
pub struct KeySource(Box<dyn FnMut() -> u32 + Send>);

impl KeySource {
    /// Keys from `f`, e.g. the `getrandom` crate's output.
    pub fn new(f: impl FnMut() -> u32 + Send + 'static) -> KeySource {
        KeySource(Box::new(f))
    }

    /// Deterministic keys from `seed` (splitmix64), for tests and the
    /// simulator: the same seed gives the same keys, so every run of a test
    /// is the same run. Not unpredictable: a real device must pass the
    /// operating system's CSPRNG through [`KeySource::new`].
    pub fn seeded(seed: u64) -> KeySource {
        let mut s = seed;
        KeySource::new(move || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as u32
        })
    }

    pub(crate) fn draw(&mut self) -> u32 {
        (self.0)()
    }
}

impl Default for KeySource {
    fn default() -> Self {
        KeySource::seeded(0x5eed)
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySource")
    }
}

/// Keys kept in the sorted vector before the record switches to buckets.
/// Up to here an insertion moves at most 16 KiB and the whole record is
/// smaller than 1% of the bucket array it postpones.
pub(crate) const SMALL_KEYS: usize = 4096;

/// Every key issued so far (see the module docs for the cost).
#[derive(Debug, Default)]
pub(crate) struct IssuedKeys {
    /// All keys, sorted, while there are at most [`SMALL_KEYS`].
    small: Vec<u32>,
    /// Past that, indexed by a key's upper 16 bits; each holds the lower
    /// 16, sorted. Empty until then.
    buckets: Vec<Vec<u16>>,
    count: u64,
}

impl IssuedKeys {
    fn split(k: u32) -> (usize, u16) {
        ((k >> 16) as usize, k as u16)
    }

    #[cfg(test)]
    pub fn contains(&self, k: u32) -> bool {
        if self.buckets.is_empty() {
            return self.small.binary_search(&k).is_ok();
        }
        let (b, lo) = Self::split(k);
        self.buckets[b].binary_search(&lo).is_ok()
    }

    /// Whether any issued key has the upper 24 bits `prefix` (a memory
    /// window's rkeys share their upper 24 bits and differ in the low 8,
    /// which the consumer picks).
    pub fn any_with_prefix(&self, prefix: u32) -> bool {
        let first = prefix << 8;
        if self.buckets.is_empty() {
            let i = self.small.partition_point(|&x| x < first);
            return self.small.get(i).is_some_and(|&x| x <= first | 0xff);
        }
        let (b, lo) = Self::split(first);
        let v = &self.buckets[b];
        let i = v.partition_point(|&x| x < lo);
        v.get(i).is_some_and(|&x| x <= lo | 0xff)
    }

    /// Record `k`; returns false if it was already issued.
    pub fn insert(&mut self, k: u32) -> bool {
        if self.buckets.is_empty() {
            match self.small.binary_search(&k) {
                Ok(_) => return false,
                Err(i) if self.small.len() < SMALL_KEYS => {
                    self.small.insert(i, k);
                    self.count += 1;
                    return true;
                }
                Err(_) => self.spill(),
            }
        }
        let (b, lo) = Self::split(k);
        let v = &mut self.buckets[b];
        match v.binary_search(&lo) {
            Ok(_) => false,
            Err(i) => {
                v.insert(i, lo);
                self.count += 1;
                true
            }
        }
    }

    /// Move the sorted vector into buckets (each bucket stays sorted,
    /// since the vector was).
    fn spill(&mut self) {
        self.buckets = vec![Vec::new(); 1 << 16];
        for k in std::mem::take(&mut self.small) {
            let (b, lo) = Self::split(k);
            self.buckets[b].push(lo);
        }
    }

    pub fn len(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_keys_remember_and_answer_prefixes() {
        let mut s = IssuedKeys::default();
        assert!(!s.contains(7));
        assert!(s.insert(0x1234_5678));
        assert!(!s.insert(0x1234_5678));
        assert!(s.contains(0x1234_5678));
        assert!(!s.contains(0x1234_5679));
        assert!(s.any_with_prefix(0x12_3456));
        assert!(!s.any_with_prefix(0x12_3457));
        assert!(!s.any_with_prefix(0x12_3455));
        assert_eq!(s.len(), 1);
        assert!(s.buckets.is_empty(), "a few keys need no bucket array");
    }

    #[test]
    fn the_record_answers_the_same_before_and_after_it_spills() {
        let mut src = KeySource::seeded(7);
        let keys: Vec<u32> = (0..SMALL_KEYS + 500).map(|_| src.draw()).collect();
        let mut s = IssuedKeys::default();
        for (i, &k) in keys.iter().enumerate() {
            assert!(s.insert(k), "key {i} is new");
            assert_eq!(
                s.buckets.is_empty(),
                i < SMALL_KEYS,
                "spills after SMALL_KEYS"
            );
            assert!(!s.insert(k), "key {i} is refused the second time");
        }
        assert_eq!(s.len(), keys.len() as u64);
        for &k in &keys {
            assert!(s.contains(k));
            assert!(s.any_with_prefix(k >> 8));
            assert!(!s.contains(k ^ 0x8000_0000) || keys.contains(&(k ^ 0x8000_0000)));
        }
        // Prefixes next to issued keys, on both sides of a key.
        let k = keys[0];
        let near = |p: u32| keys.iter().any(|&x| x >> 8 == p);
        assert_eq!(s.any_with_prefix((k >> 8) + 1), near((k >> 8) + 1));
        assert_eq!(
            s.any_with_prefix((k >> 8).wrapping_sub(1)),
            near((k >> 8).wrapping_sub(1))
        );
    }

    #[test]
    fn seeded_sources_repeat_and_differ() {
        let a: Vec<u32> = (0..4)
            .map({
                let mut k = KeySource::seeded(1);
                move |_| k.draw()
            })
            .collect();
        let b: Vec<u32> = (0..4)
            .map({
                let mut k = KeySource::seeded(1);
                move |_| k.draw()
            })
            .collect();
        let c = KeySource::seeded(2).draw();
        assert_eq!(a, b);
        assert_ne!(a[0], c);
    }
}
