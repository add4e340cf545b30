//! softrdma as a drop-in `libibverbs.so.1`.
//!
//! Unmodified RDMA programs — `ibv_devinfo`, `ibv_rc_pingpong`, perftest's
//! `ib_write_bw` — run on softrdma when this library is found first:
//!
//! ```sh
//! scripts/build-ibverbs                      # target/release/ibverbs/libibverbs.so.1
//! LD_LIBRARY_PATH=target/release/ibverbs ib_write_bw
//! ```
//!
//! It is the C ABI layer over the safe verbs API (`softrdma-verbs`): the
//! C structures applications read (`abi`), the pointers they hold turned
//! back into softrdma objects (`handles`), the verbs themselves (`device`,
//! `resources`, `qp`), the operations table that verbs.h's static inline
//! functions jump through (`datapath`), and the rest of the library's
//! export list (`misc`), versioned as the real library's (`exports`).
//!
//! Every exported function has one shape (`ffi`): its pointer arguments are
//! checked, its body runs in a panic boundary, and failure is reported in
//! the convention of that libibverbs function. All `unsafe` here is the C
//! boundary: each exported function's safety contract is the one verbs.h
//! documents for it, which is why they carry no `# Safety` sections of
//! their own.
//!
//! Environment: `SOFTRDMA_DEVICES` (which devices exist, see
//! softrdma-verbs), `SOFTRDMA_MTU` (the port's active MTU in bytes, default
//! 4096), `SOFTRDMA_IBV_LOG=1` (log every failed call with its reason).

#![allow(clippy::missing_safety_doc)]

mod abi;
mod datapath;
mod device;
mod exports;
mod ffi;
mod handles;
mod import;
mod misc;
mod mw;
mod pages;
mod qp;
mod qpex;
mod rdmacm;
mod resources;
mod xrc;

#[cfg(test)]
mod tests;
