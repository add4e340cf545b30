//! softrdma against Linux Soft-RoCE: the live interoperability suite.
//!
//! The peer is `../shared/rxe-peer`: small QEMU VMs whose kernels run rxe on
//! a bridge inside a private network namespace. Our programs run inside that
//! namespace on the bridge's addresses; the VMs run the stock rdma-core and
//! perftest tools. For each combination ([`matrix`]) the suite starts both
//! sides with deadlines ([`proc`], [`peer`]), captures the traffic on the
//! bridge and checks it ([`capture`]), checks what both programs printed and
//! how they exited ([`run`]), and writes the table ([`report`]).
//!
//! The test binary `tests/rxe_peer.rs` drives it: it boots the peer once per
//! Ethernet MTU (1500 and 9000: rxe path MTU 1024 and 4096) and always stops
//! it again. A peer that cannot start is a failure, never a skip.

pub mod capture;
pub mod matrix;
pub mod peer;
pub mod proc;
pub mod report;
pub mod run;
