//! A whole pcap file, any bytes: reading the file header, walking the
//! records and dissecting each frame must not panic, and the records must
//! stay inside the file.

#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_wire::dissect::{dissect, to_json, Line};
use softrdma_wire::pcap::PcapFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = PcapFile::parse(data) else {
        return;
    };
    let mut seen = 24;
    for rec in file.records() {
        let Ok(rec) = rec else {
            continue; // a record cut short: iteration ends after it
        };
        seen += 16 + rec.data.len();
        assert!(seen <= data.len());
        let d = dissect(rec.data);
        let _ = Line(&d).to_string();
        let _ = to_json(rec.number, &d);
    }
});
