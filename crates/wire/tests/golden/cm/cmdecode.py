#!/usr/bin/env python3
"""Decode the IB CM MADs (BTH dest QP 1) of a RoCEv2/IPv4|IPv6 pcap, stdlib only.

Field offsets follow IBTA vol 1 ch. 12 as the Linux kernel's
include/rdma/ibta_vol1_c12.h declares them (byte offsets relative to the end
of the 24-byte MAD header; bit fields numbered from the MSB).

    cmdecode.py FILE.pcap            # one block per CM MAD
"""
import struct
import sys
import zlib

ATTR = {0x10: "REQ", 0x11: "MRA", 0x12: "REJ", 0x13: "REP", 0x14: "RTU",
        0x15: "DREQ", 0x16: "DREP", 0x17: "SIDR_REQ", 0x18: "SIDR_REP",
        0x19: "LAP", 0x1a: "APR", 0x20: "ClassPortInfo"}


def frames(path):
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    e = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    nsec = magic in (0xA1B23C4D, 0x4D3CB2A1)
    off, n = 24, 0
    while off + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack(e + "IIII", data[off:off + 16])
        off += 16
        n += 1
        yield n, sec + frac / (1e9 if nsec else 1e6), data[off:off + incl]
        off += incl


def gid_str(g):
    if g[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:%d.%d.%d.%d" % tuple(g[12:])
    return ":".join("%04x" % x for x in struct.unpack(">8H", g))


def u32(b, o):
    return struct.unpack(">I", b[o:o + 4])[0]


def u24hi(b, o):  # high 24 bits of the 32-bit word at o
    return u32(b, o) >> 8


def u16(b, o):
    return struct.unpack(">H", b[o:o + 2])[0]


def u64(b, o):
    return struct.unpack(">Q", b[o:o + 8])[0]


def hi(b, o, width):  # the top `width` bits of byte o
    return b[o] >> (8 - width)


def bits(b, o, start, width):  # bits start..start+width-1 of byte o, MSB = bit 0
    return (b[o] >> (8 - start - width)) & ((1 << width) - 1)


def nonzero_tail(b):
    n = len(b)
    while n and b[n - 1] == 0:
        n -= 1
    return n


def cma_hdr(p):
    """The rdma_cm header (struct cma_hdr) at the start of REQ/SIDR_REQ private data."""
    ipv = p[1] >> 4
    out = ["  private data: rdma_cm header (struct cma_hdr, 36 bytes):",
           "    [0]    cma_version = 0x%02x" % p[0],
           "    [1]    ip_version<<4 = 0x%02x (IP version %d, low nibble %d)" % (p[1], ipv, p[1] & 15),
           "    [2:4]  src port = 0x%04x (%d)" % (u16(p, 2), u16(p, 2))]
    if ipv == 4:
        out.append("    [4:20] src addr = %s (bytes %s; IPv4 in the last 4)" % (
            ".".join(str(x) for x in p[16:20]), p[4:20].hex()))
        out.append("    [20:36] dst addr = %s (bytes %s)" % (
            ".".join(str(x) for x in p[32:36]), p[20:36].hex()))
    else:
        out.append("    [4:20] src addr = %s" % gid_str(p[4:20]))
        out.append("    [20:36] dst addr = %s" % gid_str(p[20:36]))
    u = p[36:]
    nz = nonzero_tail(u)
    out.append("  user private data after the 36-byte header: %d bytes, %s" % (
        len(u), "all zero" if nz == 0 else "non-zero up to byte %d: %s" % (nz, u[:nz].hex())))
    return out


def priv(p, name="private data"):
    nz = nonzero_tail(p)
    if nz == 0:
        return ["  %s: %d bytes, all zero" % (name, len(p))]
    return ["  %s: %d bytes, non-zero up to byte %d: %s" % (name, len(p), nz, p[:nz].hex())]


def decode_cm(attr, d):
    """d = the 232 MAD data bytes after the MAD header."""
    L = []
    if attr == 0x10:  # REQ
        L += ["  Local Comm ID           = 0x%08x" % u32(d, 0),
              "  ServiceID               = 0x%016x" % u64(d, 8),
              "  Local CA GUID           = 0x%016x" % u64(d, 16),
              "  Local Q_Key             = 0x%08x" % u32(d, 28),
              "  Local QPN               = 0x%06x" % u24hi(d, 32),
              "  Responder Resources     = %d" % d[35],
              "  Local EECN              = 0x%06x" % u24hi(d, 36),
              "  Initiator Depth         = %d" % d[39],
              "  Remote EECN             = 0x%06x" % u24hi(d, 40),
              "  Remote CM Resp Timeout  = %d" % hi(d, 43, 5),
              "  Transport Service Type  = %d (0=RC 1=UC 3=XRC)" % bits(d, 43, 5, 2),
              "  End-to-End Flow Control = %d" % bits(d, 43, 7, 1),
              "  Starting PSN            = 0x%06x" % u24hi(d, 44),
              "  Local CM Resp Timeout   = %d" % hi(d, 47, 5),
              "  Retry Count             = %d" % bits(d, 47, 5, 3),
              "  P_Key                   = 0x%04x" % u16(d, 48),
              "  Path MTU                = %d (1=256 2=512 3=1024 4=2048 5=4096)" % hi(d, 50, 4),
              "  RDC Exists              = %d" % bits(d, 50, 4, 1),
              "  RNR Retry Count         = %d" % bits(d, 50, 5, 3),
              "  Max CM Retries          = %d" % hi(d, 51, 4),
              "  SRQ                     = %d" % bits(d, 51, 4, 1),
              "  Extended Transport Type = %d" % bits(d, 51, 5, 3),
              "  Primary Local LID       = 0x%04x" % u16(d, 52),
              "  Primary Remote LID      = 0x%04x" % u16(d, 54),
              "  Primary Local GID       = %s (%s)" % (gid_str(d[56:72]), d[56:72].hex()),
              "  Primary Remote GID      = %s (%s)" % (gid_str(d[72:88]), d[72:88].hex()),
              "  Primary Flow Label      = 0x%05x (word at +88 = 0x%08x)" % (u32(d, 88) >> 12, u32(d, 88)),
              "  Primary Packet Rate     = %d" % (d[91] & 0x3f),
              "  Primary Traffic Class   = 0x%02x" % d[92],
              "  Primary Hop Limit       = %d" % d[93],
              "  Primary SL              = %d" % hi(d, 94, 4),
              "  Primary Subnet Local    = %d" % bits(d, 94, 4, 1),
              "  Primary Local ACK Tmo   = %d (byte 0x%02x)" % (hi(d, 95, 5), d[95]),
              "  Alternate path (96..139) = %s" % ("all zero" if not any(d[96:140]) else d[96:140].hex())]
        L += cma_hdr(d[140:232])
    elif attr == 0x13:  # REP
        L += ["  Local Comm ID           = 0x%08x" % u32(d, 0),
              "  Remote Comm ID          = 0x%08x" % u32(d, 4),
              "  Local Q_Key             = 0x%08x" % u32(d, 8),
              "  Local QPN               = 0x%06x" % u24hi(d, 12),
              "  Local EECN              = 0x%06x" % u24hi(d, 16),
              "  Starting PSN            = 0x%06x" % u24hi(d, 20),
              "  Responder Resources     = %d" % d[24],
              "  Initiator Depth         = %d" % d[25],
              "  Target ACK Delay        = %d" % hi(d, 26, 5),
              "  Failover Accepted       = %d" % bits(d, 26, 5, 2),
              "  End-to-End Flow Control = %d" % bits(d, 26, 7, 1),
              "  RNR Retry Count         = %d" % hi(d, 27, 3),
              "  SRQ                     = %d" % bits(d, 27, 3, 1),
              "  reserved bits of +27    = 0x%x" % (d[27] & 0x0f),
              "  Local CA GUID           = 0x%016x" % u64(d, 28)]
        L += priv(d[36:232])
    elif attr in (0x14, 0x16):  # RTU, DREP
        L += ["  Local Comm ID           = 0x%08x" % u32(d, 0),
              "  Remote Comm ID          = 0x%08x" % u32(d, 4)]
        L += priv(d[8:232])
    elif attr == 0x15:  # DREQ
        L += ["  Local Comm ID           = 0x%08x" % u32(d, 0),
              "  Remote Comm ID          = 0x%08x" % u32(d, 4),
              "  Remote QPN/EECN         = 0x%06x (word 0x%08x)" % (u24hi(d, 8), u32(d, 8))]
        L += priv(d[12:232])
    elif attr == 0x12:  # REJ
        ari_len = d[9] >> 1
        L += ["  Local Comm ID           = 0x%08x" % u32(d, 0),
              "  Remote Comm ID          = 0x%08x" % u32(d, 4),
              "  Message Rejected        = %d (0=REQ 1=REP 2=other)" % hi(d, 8, 2),
              "  byte +8                 = 0x%02x" % d[8],
              "  Reject Info Length      = %d" % ari_len,
              "  Reason                  = %d" % u16(d, 10),
              "  ARI (72 bytes)          = %s" % ("all zero" if not any(d[12:84]) else d[12:84].hex())]
        L += priv(d[84:232])
    elif attr == 0x11:  # MRA
        L += ["  Local Comm ID           = 0x%08x" % u32(d, 0),
              "  Remote Comm ID          = 0x%08x" % u32(d, 4),
              "  Message MRAed           = %d" % hi(d, 8, 2),
              "  Service Timeout         = %d" % hi(d, 9, 5)]
        L += priv(d[10:232])
    elif attr == 0x17:  # SIDR_REQ
        L += ["  Request ID              = 0x%08x" % u32(d, 0),
              "  P_Key                   = 0x%04x" % u16(d, 4),
              "  reserved +6..7          = 0x%04x" % u16(d, 6),
              "  ServiceID               = 0x%016x" % u64(d, 8)]
        L += cma_hdr(d[16:232])
    elif attr == 0x18:  # SIDR_REP
        L += ["  Request ID              = 0x%08x" % u32(d, 0),
              "  Status                  = %d" % d[4],
              "  Add. Info Length        = %d" % d[5],
              "  reserved +6..7          = 0x%04x" % u16(d, 6),
              "  QPN                     = 0x%06x (word 0x%08x)" % (u24hi(d, 8), u32(d, 8)),
              "  ServiceID               = 0x%016x" % u64(d, 12),
              "  Q_Key                   = 0x%08x" % u32(d, 20),
              "  Add. Info (72 bytes)    = %s" % ("all zero" if not any(d[24:96]) else d[24:96].hex())]
        L += priv(d[96:232])
    else:
        L += ["  (undecoded) %s" % d.hex()]
    return L


def decode(path):
    out = []
    t0 = None
    last_by_kind = {}
    for n, ts, f in frames(path):
        if t0 is None:
            t0 = ts
        et = u16(f, 12)
        if et == 0x0800:
            ihl = (f[14] & 15) * 4
            ip = f[14:14 + ihl]
            tos, tot, ident, ffo, ttl, proto = ip[1], u16(ip, 2), u16(ip, 4), u16(ip, 6), ip[8], ip[9]
            src, dst = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
            ipline = "IPv4 %s -> %s TOS 0x%02x TTL %d ID 0x%04x flags/frag 0x%04x (DF=%d) total len %d" % (
                src, dst, tos, ttl, ident, ffo, (ffo >> 14) & 1, tot)
            u = 14 + ihl
        elif et == 0x86DD:
            ip = f[14:54]
            vtf = u32(ip, 0)
            src, dst = gid_str(ip[8:24]), gid_str(ip[24:40])
            ipline = "IPv6 %s -> %s TC 0x%02x flow 0x%05x hop limit %d payload len %d" % (
                src, dst, (vtf >> 20) & 0xff, vtf & 0xfffff, ip[7], u16(ip, 4))
            u = 54
        else:
            continue
        sport, dport, ulen, ucsum = struct.unpack(">HHHH", f[u:u + 8])
        if dport != 4791:
            continue
        r = f[u + 8:u + ulen]
        bth = r[:12]
        opcode, b1, pkey = bth[0], bth[1], u16(bth, 2)
        dqp = u32(bth, 4) & 0xffffff
        ackreq = bth[8] >> 7
        psn = u32(bth, 8) & 0xffffff
        if dqp != 1:
            continue
        deth = r[12:20]
        qkey, sqp = u32(deth, 0), u32(deth, 4) & 0xffffff
        mad = r[20:20 + 256]
        icrc = r[20 + 256:]
        base, mclass, cver, method = mad[0], mad[1], mad[2], mad[3]
        status, cls_spec = u16(mad, 4), u16(mad, 6)
        tid = u64(mad, 8)
        attr_id, resv, attr_mod = u16(mad, 16), u16(mad, 18), u32(mad, 20)
        kind = ATTR.get(attr_id, "attr 0x%04x" % attr_id)
        d = mad[24:]
        prev = last_by_kind.get((kind, src))
        last_by_kind[(kind, src)] = ts
        out.append("=== frame %d  t=+%.6f s  %s%s" % (
            n, ts - t0, kind, "" if prev is None else "  (%.6f s after the previous %s from %s)" % (ts - prev, kind, src)))
        out.append("  " + ipline)
        out.append("  UDP %d -> %d len %d checksum 0x%04x; RoCE payload %d bytes = BTH 12 + DETH 8 + MAD %d + ICRC %d" % (
            sport, dport, ulen, ucsum, len(r), len(mad), len(icrc)))
        crc = zlib.crc32(b"\xff" * 8 + (bytes([ip[0], 0xff]) + ip[2:8] + b"\xff" + ip[9:10] + b"\xff\xff" + ip[12:] if et == 0x0800
                          else bytes([(ip[0] & 0xf0) | 0x0f, 0xff, 0xff, 0xff]) + ip[4:7] + b"\xff" + ip[8:40]) +
                         f[u:u + 6] + b"\xff\xff" + bth[:4] + b"\xff" + bth[5:] + r[12:-4]) & 0xffffffff
        out.append("  BTH opcode 0x%02x SE %d M %d PadCnt %d TVer %d P_Key 0x%04x resv8 0x%02x DestQP 0x%06x AckReq %d resv7 0x%02x PSN %d (0x%06x)" % (
            opcode, b1 >> 7, (b1 >> 6) & 1, (b1 >> 4) & 3, b1 & 15, pkey, bth[4], dqp, ackreq, bth[8] & 0x7f, psn, psn))
        out.append("  DETH Q_Key 0x%08x SrcQP 0x%06x (reserved byte 0x%02x)" % (qkey, sqp, deth[4]))
        out.append("  ICRC %s (stored LE; %s)" % (icrc.hex(), "ok" if struct.unpack("<I", icrc)[0] == crc else "MISMATCH"))
        out.append("  MAD BaseVersion %d MgmtClass 0x%02x ClassVersion %d Method 0x%02x Status 0x%04x ClassSpecific 0x%04x" % (
            base, mclass, cver, method, status, cls_spec))
        out.append("  MAD TID 0x%016x (high 32 = 0x%08x, low 32 = 0x%08x) AttributeID 0x%04x (%s) reserved 0x%04x AttributeModifier 0x%08x" % (
            tid, tid >> 32, tid & 0xffffffff, attr_id, kind, resv, attr_mod))
        out += decode_cm(attr_id, d)
    return out


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print("\n".join(decode(p)))
