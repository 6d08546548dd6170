#!/usr/bin/env python3
"""Fails unless every object with device code holds machine code (an ELF cubin) for each GPU
architecture asked for: what `cuobjdump --list-elf` shows, read here from the fat binaries
themselves, since a CUDA install need not ship cuobjdump (the CI one does not).

  check_cuda_arch.py --arch 80,90 [--absent 1] FILE...   (FILE: .o, .a (each member) or .so)

--absent A: also checks that the checker reports architecture A (one nobody builds for) missing
from the same objects, so that the test can fail.

A fat binary starts with the magic 0xBA55ED50, a 16-bit header size at +6 and a 64-bit size of
its entries at +8. Each entry: 16-bit kind at +0 (1 PTX, 2 ELF), 32-bit header size at +4,
64-bit payload size at +8, 32-bit SM architecture at +28 (80 for sm_80). Entries may be
compressed; only their headers are read.
"""
import argparse
import struct
import subprocess
import sys

MAGIC = struct.pack("<I", 0xBA55ED50)
KINDS = {1: "ptx", 2: "elf"}


def fatbin_entries(data):
    """(kind, arch) of every entry of every fat binary in `data`."""
    out = []
    pos = data.find(MAGIC)
    while pos >= 0:
        if pos + 16 > len(data):
            break
        hdr_size, = struct.unpack_from("<H", data, pos + 6)
        fat_size, = struct.unpack_from("<Q", data, pos + 8)
        entry, end = pos + hdr_size, pos + hdr_size + fat_size
        ok = hdr_size >= 16 and end <= len(data)
        while ok and entry + 32 <= end:
            kind, = struct.unpack_from("<H", data, entry)
            e_hdr, = struct.unpack_from("<I", data, entry + 4)
            payload, = struct.unpack_from("<Q", data, entry + 8)
            arch, = struct.unpack_from("<I", data, entry + 28)
            if kind not in KINDS or e_hdr < 32:
                break
            out.append((KINDS[kind], arch))
            entry += e_hdr + payload
        pos = data.find(MAGIC, end if ok else pos + 4)
    return out


def members(path):
    """(name, bytes) of each object in `path`: an archive's members, else the file itself."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(b"!<arch>\n"):
        return [(path, data)]
    names = subprocess.run(["ar", "t", path], check=True, capture_output=True,
                           text=True).stdout.split()
    return [(f"{path}({n})", subprocess.run(["ar", "p", path, n], check=True,
                                            capture_output=True).stdout) for n in names]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", required=True, help="comma-separated, e.g. 80,90")
    ap.add_argument("--absent", type=int, default=None)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    args.arch = [int(a) for a in args.arch.split(",") if a]
    bad, with_code, absent_found = [], 0, 0
    for path in args.files:
        for name, data in members(path):
            entries = fatbin_entries(data)
            if not entries:
                continue
            with_code += 1
            elf = sorted({a for k, a in entries if k == "elf"})
            if args.absent is not None and args.absent in elf:
                absent_found += 1
            missing = [a for a in args.arch if a not in elf]
            print(f"{name}: elf sm_{', sm_'.join(map(str, elf)) or '-'}; ptx "
                  f"{sorted({a for k, a in entries if k == 'ptx'})}")
            if missing:
                bad.append(f"{name}: no sm_{', sm_'.join(map(str, missing))} machine code")
    if with_code == 0:
        bad.append("no device code found in " + " ".join(args.files))
    if args.absent is not None:
        if absent_found:
            bad.append(f"sm_{args.absent}, which nothing is built for, reported present")
        else:
            print(f"ok: the checker reports sm_{args.absent} (not built) missing everywhere")
    for b in bad:
        print("FAIL:", b)
    if bad:
        return 1
    print(f"ok: {with_code} object(s) with device code, each with machine code for sm_"
          + ", sm_".join(map(str, args.arch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
