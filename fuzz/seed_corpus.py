#!/usr/bin/env python3
"""Seed the fuzz corpora from captures (corpus/ is not checked in).

    python3 fuzz/seed_corpus.py [EXTRA.pcap ...]

decode_frame gets every frame of every golden capture, the CM MADs of
golden/cm included (and of the extra
files, e.g. target/tmp/tshark_every_opcode.pcap, which the tshark test
writes: one packet of every opcode); pcap_file gets the capture files.
"""
import pathlib
import shutil
import struct
import sys

root = pathlib.Path(__file__).resolve().parent
golden = root.parent / "crates" / "wire" / "tests" / "golden"
files = (
    sorted(golden.glob("*.pcap"))
    + sorted(golden.glob("cm/*.pcap"))
    + [pathlib.Path(p) for p in sys.argv[1:]]
)
frames_dir = root / "corpus" / "decode_frame"
pcaps_dir = root / "corpus" / "pcap_file"
frames_dir.mkdir(parents=True, exist_ok=True)
pcaps_dir.mkdir(parents=True, exist_ok=True)

n = 0
for f in files:
    b = f.read_bytes()
    shutil.copy(f, pcaps_dir / f.name)
    magic = struct.unpack("<I", b[:4])[0]
    end = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    at = 24
    i = 0
    while at + 16 <= len(b):
        incl = struct.unpack(end + "I", b[at + 8 : at + 12])[0]
        frame = b[at + 16 : at + 16 + incl]
        at += 16 + incl
        i += 1
        (frames_dir / f"{f.stem}-{i}").write_bytes(frame)
        n += 1
print(f"{n} frames from {len(files)} captures")
