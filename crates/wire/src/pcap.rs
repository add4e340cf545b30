//! Classic pcap files (the libpcap format tcpdump and tshark write by
//! default): read from a byte slice, written to any `io::Write`.
//!
//! pcapng is not read; `editcap -F pcap` converts.

use std::io::{self, Write};

/// Link-layer header types we read and write.
pub const LINKTYPE_ETHERNET: u32 = 1;

const MAGIC_US: u32 = 0xa1b2_c3d4;
const MAGIC_NS: u32 = 0xa1b2_3c4d;
const MAGIC_PCAPNG: u32 = 0x0a0d_0d0a;

/// Why a pcap file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PcapError {
    TooShort,
    Pcapng,
    BadMagic(u32),
    UnsupportedLinkType(u32),
}

impl core::fmt::Display for PcapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PcapError::TooShort => write!(f, "shorter than a pcap file header (24 bytes)"),
            PcapError::Pcapng => write!(
                f,
                "a pcapng file; convert it with `editcap -F pcap IN OUT` first"
            ),
            PcapError::BadMagic(m) => write!(f, "not a pcap file (magic {m:#010x})"),
            PcapError::UnsupportedLinkType(t) => {
                write!(f, "link type {t} is not supported (only Ethernet, 1)")
            }
        }
    }
}

impl std::error::Error for PcapError {}

/// One captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// 1-based frame number, as tshark counts.
    pub number: usize,
    pub ts_sec: u32,
    /// Nanoseconds (microsecond files are scaled).
    pub ts_nsec: u32,
    /// Length on the wire (may exceed `data.len()` when the snap length cut it).
    pub orig_len: u32,
    pub data: &'a [u8],
}

/// A pcap file held in memory.
#[derive(Debug, Clone)]
pub struct PcapFile<'a> {
    big_endian: bool,
    nanos: bool,
    pub link_type: u32,
    pub snaplen: u32,
    body: &'a [u8],
}

impl<'a> PcapFile<'a> {
    pub fn parse(b: &'a [u8]) -> Result<PcapFile<'a>, PcapError> {
        if b.len() < 24 {
            return Err(PcapError::TooShort);
        }
        let le = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let (big_endian, nanos) = match le {
            MAGIC_US => (false, false),
            MAGIC_NS => (false, true),
            x if x == MAGIC_US.swap_bytes() => (true, false),
            x if x == MAGIC_NS.swap_bytes() => (true, true),
            MAGIC_PCAPNG => return Err(PcapError::Pcapng),
            x => return Err(PcapError::BadMagic(x)),
        };
        let f = PcapFile {
            big_endian,
            nanos,
            link_type: 0,
            snaplen: 0,
            body: b,
        };
        let link_type = f.u32(&b[20..24]) & 0x0fff_ffff;
        if link_type != LINKTYPE_ETHERNET {
            return Err(PcapError::UnsupportedLinkType(link_type));
        }
        Ok(PcapFile {
            link_type,
            snaplen: f.u32(&b[16..20]),
            body: &b[24..],
            ..f
        })
    }

    fn u32(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.big_endian {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    }

    /// The records in order. A record cut short by the end of the file is
    /// returned as `Err` with its frame number, and iteration stops.
    pub fn records(&self) -> Records<'_, 'a> {
        Records {
            file: self,
            at: 0,
            number: 0,
            done: false,
        }
    }
}

/// Iterator over the records of a [`PcapFile`].
pub struct Records<'f, 'a> {
    file: &'f PcapFile<'a>,
    at: usize,
    number: usize,
    done: bool,
}

impl<'a> Iterator for Records<'_, 'a> {
    /// `Err(frame number)` for a record truncated by the end of the file.
    type Item = Result<Record<'a>, usize>;

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.file.body;
        if self.done || self.at >= b.len() {
            return None;
        }
        self.number += 1;
        let rest = &b[self.at..];
        if rest.len() < 16 {
            self.done = true;
            return Some(Err(self.number));
        }
        let ts_sec = self.file.u32(&rest[0..4]);
        let frac = self.file.u32(&rest[4..8]);
        let incl = self.file.u32(&rest[8..12]) as usize;
        let orig_len = self.file.u32(&rest[12..16]);
        if rest.len() - 16 < incl {
            self.done = true;
            return Some(Err(self.number));
        }
        self.at += 16 + incl;
        Some(Ok(Record {
            number: self.number,
            ts_sec,
            ts_nsec: if self.file.nanos {
                frac
            } else {
                frac.saturating_mul(1000)
            },
            orig_len,
            data: &rest[16..16 + incl],
        }))
    }
}

/// Writes a nanosecond-resolution, little-endian pcap of Ethernet frames.
pub struct PcapWriter<W: Write> {
    out: W,
    snaplen: u32,
}

impl<W: Write> PcapWriter<W> {
    /// Write the file header.
    pub fn new(mut out: W, snaplen: u32) -> io::Result<Self> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&MAGIC_NS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out, snaplen })
    }

    /// Append one frame, cut to the snap length, stamped `since_epoch`.
    pub fn write_frame(
        &mut self,
        since_epoch: std::time::Duration,
        frame: &[u8],
    ) -> io::Result<()> {
        let incl = frame.len().min(self.snaplen as usize);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&(since_epoch.as_secs() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&since_epoch.subsec_nanos().to_le_bytes());
        h[8..12].copy_from_slice(&(incl as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&frame[..incl])
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let mut w = PcapWriter::new(Vec::new(), 100).unwrap();
        w.write_frame(std::time::Duration::new(5, 7), &[1, 2, 3])
            .unwrap();
        w.write_frame(std::time::Duration::new(6, 0), &[9; 150])
            .unwrap();
        let bytes = w.into_inner();
        let f = PcapFile::parse(&bytes).unwrap();
        let r: Vec<_> = f.records().map(|r| r.unwrap()).collect();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].ts_sec, r[0].ts_nsec, r[0].data),
            (5, 7, &[1u8, 2, 3][..])
        );
        assert_eq!((r[1].orig_len, r[1].data.len()), (150, 100));
        // Cut the file inside the second record.
        let f = PcapFile::parse(&bytes[..bytes.len() - 1]).unwrap();
        let r: Vec<_> = f.records().collect();
        assert_eq!(r[1], Err(2));
        assert_eq!(PcapFile::parse(&[0; 10]).unwrap_err(), PcapError::TooShort);
    }
}
