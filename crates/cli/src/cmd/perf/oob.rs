//! perftest's out-of-band channel: fixed-size messages over one TCP
//! connection (default port 18515), in strict lock-step — the client writes
//! then reads, the server reads then writes — so that `softrdma perf` pairs
//! with the real `ib_*` binaries in either role.
//!
//! Every message goes out in a single write, as perftest reads each one
//! with a single exact-size `read()`.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma_verbs::{
    cm, AccessFlags, Context, Cq, Mr, Pd, Qp, QpAttr, QpInitAttr, QpState, QpType,
};

/// The version we announce; perftest refuses peers below 5.70.
const VERSION: &str = "6.06";

/// `cm::connect`, again while the service is not listened on yet (the
/// REQ answered "invalid service ID") until `deadline`: perftest's client
/// may start before its server.
pub fn connect_retrying(
    ctx: &Context,
    to: SocketAddr,
    qp: &Qp,
    opts: &cm::CmOptions,
    deadline: Instant,
) -> softrdma_verbs::Result<cm::Connection> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let o = opts.clone().with_timeout(left.max(Duration::from_secs(5)));
        match cm::connect(ctx, to, qp, &[], &o) {
            Err(softrdma_verbs::Error::Rejected(r)) if r.no_listener() && !left.is_zero() => {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// One QP's connection record (`struct pingpong_dest` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    pub lid: u16,
    pub out_reads: u16,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: [u8; 16],
    pub srqn: u32,
}

/// Length of the record with a GID (`KEY_MSG_SIZE_GID`), NUL included.
pub const KEY_LEN_GID: usize = 108;

impl Dest {
    /// The 108-byte GID form: six hex fields, 16 GID bytes, srqn, trailing
    /// colon, NUL.
    pub fn encode(&self) -> [u8; KEY_LEN_GID] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_LEN_GID];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> io::Result<Dest> {
        let text = std::str::from_utf8(b.split(|&c| c == 0).next().unwrap_or(&[]))
            .map_err(|_| bad("peer's connection record is not text"))?;
        let f: Vec<&str> = text.split(':').collect();
        if f.len() < 23 {
            return Err(bad(&format!(
                "couldn't parse peer's connection record '{text}'"
            )));
        }
        let h = |i: usize| {
            u64::from_str_radix(f[i], 16)
                .map_err(|_| bad(&format!("bad hex field '{}' in '{text}'", f[i])))
        };
        let mut gid = [0u8; 16];
        for (k, g) in gid.iter_mut().enumerate() {
            *g = h(6 + k)? as u8;
        }
        Ok(Dest {
            lid: h(0)? as u16,
            out_reads: h(1)? as u16,
            qpn: h(2)? as u32,
            psn: h(3)? as u32,
            rkey: h(4)? as u32,
            vaddr: h(5)?,
            gid,
            srqn: h(22)? as u32,
        })
    }
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// The TCP channel to the peer.
pub struct Channel {
    s: Link,
    pub client: bool,
    /// The port the test runs on (`-p`); with `-R` the data QPs connect
    /// to it too.
    pub port: u16,
}

/// What carries the exchange: perftest's TCP socket, or (`-R`) an RC
/// connection of its own made through rdma_cm, one SEND each way per
/// message, as perftest's `comm->rdma_ctx` (`rdma_write_data`,
/// `rdma_read_data`).
enum Link {
    Tcp(TcpStream),
    Cm(Box<CmLink>),
}

/// The control connection of `-R`. Fields drop in order: the CM state
/// first (its DREQ), then the QP and what it uses.
struct CmLink {
    conn: cm::Connection,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    _pd: Pd,
}

/// Where the control connection's receive lands and its send comes from.
const CM_RECV: usize = 0;
const CM_SEND: usize = 4096;
const CM_BUF: usize = 8192;

impl CmLink {
    fn open(ctx: &Context) -> io::Result<(Pd, Qp, Cq, Mr)> {
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(4, None).map_err(verr)?;
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Rc, &cq))
            .map_err(verr)?;
        let mr = pd
            .alloc_mr(CM_BUF, AccessFlags::LOCAL_WRITE)
            .map_err(verr)?;
        let a = QpAttr {
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE,
            ..Default::default()
        };
        qp.modify_to(QpState::Init, &a).map_err(verr)?;
        qp.recv(2, mr.slice(CM_RECV..CM_SEND).map_err(verr)?)
            .map_err(verr)?;
        Ok((pd, qp, cq, mr))
    }

    fn write(&self, mine: &[u8]) -> io::Result<()> {
        self.mr.write(CM_SEND, mine);
        self.qp
            .send(
                1,
                self.mr.slice(CM_SEND..CM_SEND + mine.len()).map_err(verr)?,
            )
            .map_err(verr)?;
        self.cq.wait(1, None).map_err(verr)?;
        Ok(())
    }

    fn read(&self, theirs: &mut [u8]) -> io::Result<()> {
        let c = self.cq.wait(2, None).map_err(verr)?;
        if c.byte_len as usize != theirs.len() {
            return Err(bad(&format!(
                "the peer's rdma_cm message is {} bytes, {} expected",
                c.byte_len,
                theirs.len()
            )));
        }
        self.mr.read(CM_RECV, theirs);
        self.qp
            .recv(2, self.mr.slice(CM_RECV..CM_SEND).map_err(verr)?)
            .map_err(verr)
    }
}

fn verr(e: softrdma_verbs::Error) -> io::Error {
    match e {
        softrdma_verbs::Error::Io(e) => e,
        e => io::Error::other(e.to_string()),
    }
}

/// Values both sides settle in the prologue.
#[derive(Debug, Clone, Copy)]
pub struct Agreed {
    pub cycle_buffer: u32,
    pub cache_line: u32,
    /// ibv_mtu enum value (1..=5).
    pub mtu: u8,
}

impl Channel {
    /// Wait for one client on `port` (perftest accepts exactly one).
    pub fn listen(port: u16) -> io::Result<Channel> {
        let l = TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot listen on TCP port {port}: {e}"))
        })?;
        let (s, _) = l.accept()?;
        s.set_nodelay(true)?;
        Ok(Channel {
            s: Link::Tcp(s),
            client: false,
            port: 0,
        })
    }

    /// Connect to a server, retrying for `patience` while it starts.
    pub fn connect(host: IpAddr, port: u16, patience: Duration) -> io::Result<Channel> {
        let start = Instant::now();
        loop {
            match TcpStream::connect(SocketAddr::new(host, port)) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(Channel {
                        s: Link::Tcp(s),
                        client: true,
                        port,
                    });
                }
                Err(e) if start.elapsed() < patience => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("couldn't connect to {host}:{port}: {e}"),
                    ))
                }
            }
        }
    }

    /// Local address of the connection: a server picks its device by it.
    /// `-R`: take perftest's control connection through rdma_cm on
    /// `dev`, at `port` (the listener goes away once connected, as
    /// perftest's `rdma_server_connect` leaves the port for the data QPs).
    pub fn listen_cm(ctx: &Context, port: u16) -> io::Result<Channel> {
        let dev = ctx.device();
        let (pd, qp, cq, mr) = CmLink::open(ctx)?;
        let l = cm::Listener::bind(ctx, SocketAddr::new(dev.addr, port)).map_err(|e| {
            io::Error::other(format!("cannot listen with rdma_cm on port {port}: {e}"))
        })?;
        let opts = cm::CmOptions::default().with_timeout(Duration::from_secs(30));
        let conn = loop {
            let req = match l.next_request(Duration::from_secs(3600)) {
                Ok(r) => r,
                Err(softrdma_verbs::Error::Timeout(_)) => continue,
                Err(e) => return Err(verr(e)),
            };
            break req.accept(&qp, &[], &opts).map_err(verr)?;
        };
        drop(l);
        Ok(Channel {
            s: Link::Cm(Box::new(CmLink {
                conn,
                qp,
                cq,
                mr,
                _pd: pd,
            })),
            client: false,
            port: 0,
        })
    }

    /// `-R`, the client: connect the control connection through rdma_cm,
    /// retrying for `patience` while nobody listens yet.
    pub fn connect_cm(
        ctx: &Context,
        host: IpAddr,
        port: u16,
        patience: Duration,
    ) -> io::Result<Channel> {
        let start = Instant::now();
        let (pd, qp, cq, mr) = CmLink::open(ctx)?;
        let to = SocketAddr::new(host, port);
        let conn = connect_retrying(ctx, to, &qp, &cm::CmOptions::default(), start + patience)
            .map_err(|e| io::Error::other(format!("rdma_cm connect to {to} failed: {e}")))?;
        Ok(Channel {
            s: Link::Cm(Box::new(CmLink {
                conn,
                qp,
                cq,
                mr,
                _pd: pd,
            })),
            client: true,
            port: 0,
        })
    }

    pub fn local_ip(&self) -> io::Result<IpAddr> {
        match &self.s {
            Link::Tcp(s) => Ok(s.local_addr()?.ip()),
            Link::Cm(c) => c
                .conn
                .local_addr()
                .map(|a| a.ip())
                .ok_or_else(|| bad("the rdma_cm connection has no local address")),
        }
    }

    pub fn peer_ip(&self) -> io::Result<IpAddr> {
        match &self.s {
            Link::Tcp(s) => Ok(s.peer_addr()?.ip()),
            Link::Cm(c) => c
                .conn
                .peer_addr()
                .map(|a| a.ip())
                .ok_or_else(|| bad("the rdma_cm connection has no peer address")),
        }
    }

    fn write(&mut self, mine: &[u8]) -> io::Result<()> {
        match &mut self.s {
            Link::Tcp(s) => s.write_all(mine),
            Link::Cm(c) => c.write(mine),
        }
    }

    fn read(&mut self, theirs: &mut [u8]) -> io::Result<()> {
        match &mut self.s {
            Link::Tcp(s) => s.read_exact(theirs),
            Link::Cm(c) => c.read(theirs),
        }
    }

    /// One lock-step exchange of equal-size messages.
    pub fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> io::Result<()> {
        if self.client {
            self.write(mine)?;
            self.read(theirs)
        } else {
            self.read(theirs)?;
            self.write(mine)
        }
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("out-of-band exchange with the peer failed: {e}"),
            )
        })
    }

    /// Versions, page size, cache-line size, MTU.
    pub fn prologue(&mut self, cycle: u32, cache_line: u32, mtu: u8) -> io::Result<Agreed> {
        let mut v = [0u8; 16];
        v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut rv = [0u8; 16];
        self.xchg(&v, &mut rv)?;
        let text = String::from_utf8_lossy(rv.split(|&c| c == 0).next().unwrap_or(&[])).to_string();
        let remote_version: f64 = text.trim().parse().unwrap_or(0.0);
        if remote_version < 5.70 {
            return Err(bad(&format!(
                "peer speaks perftest protocol version '{text}', older than 5.70"
            )));
        }
        let mut r4 = [0u8; 4];
        self.xchg(&cycle.to_be_bytes(), &mut r4)?;
        let cycle_buffer = cycle.max(u32::from_be_bytes(r4));
        self.xchg(&cache_line.to_be_bytes(), &mut r4)?;
        let cache_line = cache_line.max(u32::from_be_bytes(r4));
        let mut r2 = [0u8; 2];
        self.xchg(&[b'0' + mtu, 0], &mut r2)?;
        let theirs = r2[0].wrapping_sub(b'0');
        let mtu = if (1..=5).contains(&theirs) {
            mtu.min(theirs)
        } else {
            mtu
        };
        Ok(Agreed {
            cycle_buffer,
            cache_line,
            mtu,
        })
    }

    /// One handshake: our record for theirs.
    pub fn handshake(&mut self, mine: &Dest) -> io::Result<Dest> {
        let mut r = [0u8; KEY_LEN_GID];
        self.xchg(&mine.encode(), &mut r)?;
        Dest::decode(&r)
    }

    /// The bandwidth report: size, iterations, peak, average, message rate,
    /// each 8 bytes big-endian.
    pub fn xchg_bw_report(&mut self, mine: [f64; 5]) -> io::Result<[f64; 5]> {
        let mut out = [0f64; 5];
        for (i, v) in mine.iter().enumerate() {
            let bytes = if i < 2 {
                (*v as u64).to_be_bytes()
            } else {
                v.to_bits().to_be_bytes()
            };
            let mut r = [0u8; 8];
            self.xchg(&bytes, &mut r)?;
            out[i] = if i < 2 {
                u64::from_be_bytes(r) as f64
            } else {
                f64::from_bits(u64::from_be_bytes(r))
            };
        }
        Ok(out)
    }

    /// perftest's close: a last handshake, then "done" (never read back).
    pub fn close(mut self, mine: &Dest) -> io::Result<()> {
        self.handshake(mine)?;
        let s = match &mut self.s {
            Link::Tcp(s) => s,
            // perftest's rdma_cm exchange ends with the handshake; the
            // connection's DREQ follows when it is dropped.
            Link::Cm(_) => return Ok(()),
        };
        s.write_all(b"done\0")?;
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut sink = [0u8; 64];
        while let Ok(n) = s.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_is_perftests_108_bytes() {
        let d = Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x10100,
            psn: 0x7b5f21,
            rkey: 0x1fffbd,
            vaddr: 0x7f3e_6f0d_6000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
            srqn: 0,
        };
        let e = d.encode();
        let s = std::str::from_utf8(&e[..107]).unwrap();
        assert_eq!(
            s,
            "0000:0010:010100:7b5f21:001fffbd:00007f3e6f0d6000:00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01:00000000:"
        );
        assert_eq!(e[107], 0);
        assert_eq!(Dest::decode(&e).unwrap(), d);
        assert!(Dest::decode(b"garbage").is_err());
    }
}
