//! The communication management MADs of the golden captures of the Linux
//! kernel's rdma_cm and ib_cm (`tests/golden/cm/`, from two rxe VMs; see
//! its README): every one parses as the CM message its attribute names and
//! re-emits to the exact 256 bytes it was parsed from, and the fields an
//! implementation must get right have the values the kernel sends.

use softrdma_wire::cm::{self, CmMsg, CmaHdr};
use softrdma_wire::frame::parse_ethernet_udp;
use softrdma_wire::pcap::PcapFile;
use softrdma_wire::Packet;

fn dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/cm")
}

/// Every CM MAD (BTH destination QP 1) of a capture, with its header.
fn mads(name: &str) -> Vec<(cm::MadHeader, CmMsg, [u8; cm::MAD_LEN])> {
    let bytes = std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let f = PcapFile::parse(&bytes).unwrap();
    let mut out = Vec::new();
    for r in f.records() {
        let r = r.unwrap();
        let Some(u) = parse_ethernet_udp(r.data).unwrap() else {
            continue;
        };
        if u.udp.dst_port != 4791 {
            continue;
        }
        let p = Packet::new_checked(u.payload).unwrap();
        if p.bth().dest_qp() != 1 {
            continue;
        }
        let m: [u8; cm::MAD_LEN] = p.payload()[..cm::MAD_LEN].try_into().unwrap();
        let (h, msg) = cm::parse(&m).unwrap_or_else(|e| panic!("{name} #{}: {e}", r.number));
        out.push((h, msg, m));
    }
    out
}

#[test]
fn every_golden_cm_mad_parses_and_re_emits_exactly() {
    let mut files: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10, "{files:?}");
    let mut n = 0;
    for f in &files {
        for (h, msg, bytes) in mads(f) {
            assert!(
                !matches!(msg, CmMsg::Other(_)),
                "{f}: attribute {:#x}",
                h.attr_id
            );
            assert_eq!(msg.emit(h.tid), bytes, "{f}: {} re-emitted", msg.name());
            n += 1;
        }
    }
    assert_eq!(n, 77, "CM MADs in the captures (the README counts 77)");
}

#[test]
fn rping_connects_as_the_kernel_sends_it() {
    let m = mads("cm_rping.pcap");
    let kinds: Vec<&str> = m.iter().map(|(_, x, _)| x.name()).collect();
    assert_eq!(kinds, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    let CmMsg::Req(req) = &m[0].1 else { panic!() };
    assert_eq!(req.service_id, cm::service::id(cm::service::PS_TCP, 7174));
    assert_eq!(cm::service::split(req.service_id), Some((0x0106, 7174)));
    assert_eq!(req.local_qpn, 0x11);
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!(req.remote_cm_response_timeout, 20);
    assert_eq!(req.local_cm_response_timeout, 20);
    assert_eq!(req.transport_service_type, cm::service_type::RC);
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(req.path_mtu, 3);
    assert_eq!(req.max_cm_retries, 15);
    assert_eq!(req.pkey, 0xffff);
    assert_eq!(
        (req.primary.local_lid, req.primary.remote_lid),
        (0xffff, 0xffff)
    );
    assert_eq!(req.primary.hop_limit, 64);
    assert_eq!(req.primary.local_ack_timeout, 19);
    assert!(!req.primary.subnet_local);
    let hdr = CmaHdr::parse(&req.private).unwrap();
    assert_eq!(
        hdr.src.ip(),
        "10.91.47.12".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(hdr.dst, "10.91.47.11".parse::<std::net::IpAddr>().unwrap());
    // The flow label rdma_cm puts on RoCEv2 paths: from the two ports.
    assert_eq!(
        req.primary.flow_label,
        (hdr.src.port() as u32 * 31 + 7174) & 0xf_ffff
    );
    let CmMsg::Rep(rep) = &m[1].1 else { panic!() };
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    assert_eq!((rep.target_ack_delay, rep.rnr_retry_count), (15, 7));
    // Answers carry the TID of the REQ.
    assert_eq!(m[1].0.tid, m[0].0.tid);
    assert_eq!(m[2].0.tid, m[0].0.tid);
    let CmMsg::Rtu(rtu) = &m[2].1 else { panic!() };
    assert_eq!(
        (rtu.local_comm_id, rtu.remote_comm_id),
        (req.local_comm_id, rep.local_comm_id)
    );
    let CmMsg::Dreq(dreq) = &m[3].1 else { panic!() };
    assert_eq!(dreq.remote_qpn, rep.local_qpn);
    assert_eq!(m[4].0.tid, m[3].0.tid);
}

#[test]
fn a_port_nobody_listens_on_is_rejected_with_invalid_service_id() {
    let m = mads("cm_reject.pcap");
    let CmMsg::Req(req) = &m[0].1 else { panic!() };
    let CmMsg::Rej(rej) = &m[1].1 else { panic!() };
    assert_eq!(rej.reason, cm::rej_reason::INVALID_SERVICE_ID);
    assert_eq!(rej.msg_rejected, cm::msg_kind::REQ);
    assert_eq!(rej.remote_comm_id, req.local_comm_id);
}

#[test]
fn udaddy_resolves_its_service_by_sidr() {
    let m = mads("cm_udaddy.pcap");
    let CmMsg::SidrReq(req) = &m[0].1 else {
        panic!()
    };
    assert_eq!(
        cm::service::split(req.service_id).map(|s| s.0),
        Some(cm::service::PS_UDP)
    );
    CmaHdr::parse(&req.private).unwrap();
    let CmMsg::SidrRep(rep) = &m[1].1 else {
        panic!()
    };
    assert_eq!(rep.request_id, req.request_id);
    assert_eq!(rep.status, cm::sidr_status::SUCCESS);
    assert_eq!(rep.qkey, 0x0123_4567);
}
