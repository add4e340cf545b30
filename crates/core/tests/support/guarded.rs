//! The guarded memory the hosts use lives in the core crate
//! (`softrdma_core::mr::GuardedMemory`), shared with the stateful fuzz
//! target; see its module docs.

pub use softrdma_core::mr::GuardedMemory;
