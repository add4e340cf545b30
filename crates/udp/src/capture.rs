//! A pcap of everything a port sends and receives, as Ethernet frames whose
//! ICRCs verify.
//!
//! The kernel builds the real IP headers; this writes the ones the ICRC was
//! computed over. Sent datagrams carry ID 0 and DF, or their index in a GSO
//! train. Received IPv4 datagrams carry the ID and DF the ICRC check found
//! (0 and DF for our peers, the recovered values for others) and the TOS and
//! TTL the socket reported, so `softrdma decode` verifies their ICRC too.
//! Frames the fault injector corrupted are written as sent, and fail.

use softrdma_wire::frame::{build_frame, Ipv4Repr, Ipv6Repr};
use softrdma_wire::pcap::PcapWriter;
use std::fs::File;
use std::io::{self, BufWriter};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

const SNAPLEN: u32 = 65535;
const ETH_LEN: usize = 14;

/// The IP header fields of a received datagram that a capture records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IpFields {
    pub(crate) ident: u16,
    pub(crate) df: bool,
    pub(crate) tclass: u8,
    pub(crate) hop_limit: u8,
}

pub(crate) struct Capture {
    w: PcapWriter<BufWriter<File>>,
    /// The datagram gathered from its pieces.
    gather: Vec<u8>,
    frame: Vec<u8>,
    pub(crate) errors: u64,
    /// The traffic class (DSCP and ECN) our socket sends with, written into
    /// the IP header of every sent datagram recorded.
    pub(crate) tx_tclass: u8,
}

impl Capture {
    pub(crate) fn create(path: &Path) -> io::Result<Capture> {
        let f = File::create(path)
            .map_err(|e| io::Error::new(e.kind(), format!("pcap file {}: {e}", path.display())))?;
        Ok(Capture {
            w: PcapWriter::new(BufWriter::with_capacity(1 << 20, f), SNAPLEN)?,
            gather: Vec::with_capacity(SNAPLEN as usize),
            frame: Vec::with_capacity(SNAPLEN as usize),
            errors: 0,
            tx_tclass: 0,
        })
    }

    fn now() -> std::time::Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }

    /// Record a datagram we sent; `fill` appends its bytes.
    pub(crate) fn sent(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        ident: u16,
        fill: impl FnOnce(&mut Vec<u8>),
    ) {
        self.gather.clear();
        fill(&mut self.gather);
        self.frame.clear();
        build_frame(src, dst, ident, &self.gather, &mut self.frame);
        if self.tx_tclass != 0 {
            let hdr = &mut self.frame[ETH_LEN..];
            if src.is_ipv4() {
                if let Ok((mut r, _)) = Ipv4Repr::parse(hdr) {
                    r.tos = self.tx_tclass;
                    r.checksum = 0;
                    r.checksum = r.compute_checksum();
                    r.emit(hdr);
                }
            } else if let Ok(mut r) = Ipv6Repr::parse(hdr) {
                r.traffic_class = self.tx_tclass;
                r.emit(hdr);
            }
        }
        if self.w.write_frame(Self::now(), &self.frame).is_err() {
            self.errors += 1;
        }
    }

    /// Record a datagram we received.
    pub(crate) fn received(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        ip: IpFields,
        payload: &[u8],
    ) {
        self.frame.clear();
        build_frame(src, dst, ip.ident, payload, &mut self.frame);
        let hdr = &mut self.frame[ETH_LEN..];
        if src.is_ipv4() {
            if let Ok((mut r, _)) = Ipv4Repr::parse(hdr) {
                r.tos = ip.tclass;
                r.ttl = ip.hop_limit;
                if !ip.df {
                    r.flags_frag &= !Ipv4Repr::DF;
                }
                r.checksum = 0;
                r.checksum = r.compute_checksum();
                r.emit(hdr);
            }
        } else if let Ok(mut r) = Ipv6Repr::parse(hdr) {
            r.traffic_class = ip.tclass;
            r.hop_limit = ip.hop_limit;
            r.emit(hdr);
        }
        if self.w.write_frame(Self::now(), &self.frame).is_err() {
            self.errors += 1;
        }
    }

    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.w.flush();
    }
}
