//! The UDP sockets bound to one address and port, as `/proc/net/udp` and
//! `/proc/net/udp6` show them to any user of the network namespace: inode,
//! owner and the kernel's drop counter of each.
//!
//! A UDP socket is listed exactly while it is hashed, and a reuseport
//! member is hashed exactly while it is in its group (`udp_lib_get_port`
//! adds it to both under the slot lock, `udp_lib_unhash` removes it from
//! both), so the rows for `addr:4791` are the group's members.

use std::io::{self, Read};
use std::net::SocketAddr;

/// One listed socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) inode: u64,
    pub(crate) uid: u32,
    pub(crate) drops: u64,
}

/// The local-address column as the kernel prints it for `addr`: each
/// 32-bit word of the address in host byte order, in hex, then the port.
fn local_column(addr: SocketAddr) -> String {
    let mut s = String::new();
    let words = |b: &[u8], s: &mut String| {
        for w in b.chunks(4) {
            let v = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
            s.push_str(&format!("{v:08X}"));
        }
    };
    match addr {
        SocketAddr::V4(a) => words(&a.ip().octets(), &mut s),
        SocketAddr::V6(a) => words(&a.ip().octets(), &mut s),
    }
    s.push_str(&format!(":{:04X}", addr.port()));
    s
}

/// Parse the rows of `table` (the text of /proc/net/udp or udp6) bound to
/// the column `local`.
fn parse(table: &str, local: &str, out: &mut Vec<Row>) {
    out.clear();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref ptr drops
        if f.len() < 13 || f[1] != local {
            continue;
        }
        let (Ok(uid), Ok(inode), Ok(drops)) = (f[7].parse(), f[9].parse(), f[12].parse()) else {
            continue;
        };
        out.push(Row { inode, uid, drops });
    }
}

/// Reads the table for one address, reusing its buffers.
pub(crate) struct Table {
    path: &'static str,
    local: String,
    text: String,
    pub(crate) rows: Vec<Row>,
}

impl Table {
    pub(crate) fn new(addr: SocketAddr) -> Table {
        Table {
            path: if addr.is_ipv4() {
                "/proc/net/udp"
            } else {
                "/proc/net/udp6"
            },
            local: local_column(addr),
            text: String::new(),
            rows: Vec::new(),
        }
    }

    /// Read the current rows.
    pub(crate) fn read(&mut self) -> io::Result<&[Row]> {
        self.text.clear();
        std::fs::File::open(self.path)
            .and_then(|mut f| f.read_to_string(&mut self.text))
            .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", self.path)))?;
        parse(&self.text, &self.local, &mut self.rows);
        Ok(&self.rows)
    }
}

/// The inode of the socket `fd`.
pub(crate) fn inode_of(fd: std::os::fd::RawFd) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is valid for writes of one `stat`; an invalid fd is
    // reported as an error.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: all-zero bytes are a valid `stat` (plain integers), and
    // fstat succeeded, filling it.
    Ok(unsafe { st.assume_init() }.st_ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_and_rows_as_the_kernel_prints_them() {
        let v4: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let v6: SocketAddr = "[::1]:4791".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(local_column(v4), "0100007F:12B7");
            assert_eq!(local_column(v6), "00000000000000000000000001000000:12B7");
        }
        let text = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
          100: 0100007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000  1001        0 53321 2 0000000000000000 7\n\
          101: 0200007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 53322 2 0000000000000000 0\n";
        let mut rows = Vec::new();
        parse(text, "0100007F:12B7", &mut rows);
        assert_eq!(
            rows,
            [Row {
                inode: 53321,
                uid: 1001,
                drops: 7
            }]
        );
    }

    #[test]
    fn a_bound_socket_is_listed_with_its_inode() {
        use std::os::fd::AsRawFd;
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let ino = inode_of(s.as_raw_fd()).unwrap();
        let mut t = Table::new(addr);
        let rows = t.read().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].inode, ino);
        drop(s);
        assert!(t.read().unwrap().is_empty());
    }
}
