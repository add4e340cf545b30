//! One captured Ethernet frame, any bytes: the dissector and both of its
//! printers (`softrdma decode` text and JSON) must not panic. Where the
//! bytes hold a packet we accept, re-emitting what we parsed must give a
//! packet that parses to the same value: the receive path never produces a
//! value the send path rejects.

#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_wire::dissect::{dissect, to_json, Line};
use softrdma_wire::frame::parse_ethernet_udp;
use softrdma_wire::{Packet, PacketRepr};

fuzz_target!(|data: &[u8]| {
    let d = dissect(data);
    let _ = Line(&d).to_string();
    let _ = to_json(1, &d);

    // The RoCE packet inside the frame if there is one, else the bytes
    // themselves read as a UDP payload.
    let udp_payload = match parse_ethernet_udp(data) {
        Ok(Some(f)) => f.payload,
        _ => data,
    };
    let Ok(p) = Packet::new_checked(udp_payload) else {
        return;
    };
    let Ok(repr) = PacketRepr::parse(&p) else {
        return;
    };
    let mut out = vec![0u8; repr.wire_len()];
    repr.emit_with_payload(&mut out, p.payload());
    let again = Packet::new_checked(&out[..]).expect("re-emitted packet is valid");
    let mut want = repr;
    want.bth.pad = repr.pad_len() as u8; // emit derives the pad from the length
    assert_eq!(
        PacketRepr::parse(&again).expect("re-emitted headers parse"),
        want
    );
    assert_eq!(again.payload(), p.payload());
});
