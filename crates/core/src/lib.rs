//! The softrdma transport core: a sans-IO implementation of the InfiniBand
//! transport (RC, UC, UD) as carried by RoCEv2.
//!
//! It owns no sockets, threads or clocks: packets come in through `handle_*`
//! methods, go out through `poll_transmit`, and time is passed in as an
//! argument, so the same code runs in the real stack and in deterministic
//! tests on virtual time.

pub mod qp;
