#!/usr/bin/env python3
"""Shrinks a CUDA library for one GPU architecture before it is carried to a GPU machine.

    prune_fatbin.py IN.so OUT.so [--keep-sm 90]

A CUDA library holds, in its `.nv_fatbin` section, one fat binary per compiled module, each with
machine code for several architectures (ONNX Runtime's CUDA provider: sm_75 to sm_120, 284 MB).
The CUDA runtime loads only the entry that matches the device. In every fat binary that has an
entry for the kept architecture, this zeroes the payload of the other architectures' entries:
the file keeps its size and layout (nothing moves, no relinking) but compresses to a fraction,
and on a device of the kept architecture it behaves as before. A fat binary without an entry for
it is left whole. Never use the output on a GPU of another architecture.

Format (NVIDIA's fat binary container, as read by cuobjdump): a header {magic 0xBA55ED50, u16
version, u16 header size, u64 payload size}, then entries {u16 kind, u16, u32 header size,
u64 payload size, ..., u32 sm at offset 28}, each followed by its payload.
"""
import argparse
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50


def section(data: bytes, wanted: str) -> tuple[int, int]:
    """(offset, size) of an ELF64 section by name."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    for h in headers:
        start = names + h[0]
        if data[start:data.index(b"\0", start)].decode() == wanted:
            return h[4], h[5]
    raise SystemExit(f"no {wanted} section: not a CUDA library")


def prune(data: bytearray, keep_sm: int) -> tuple[int, int, int]:
    """Zeroes other architectures' payloads in place: (fat binaries, bytes zeroed, bytes kept)."""
    offset, size = section(data, ".nv_fatbin")
    end, binaries, zeroed, kept = offset + size, 0, 0, 0
    while offset + 16 <= end:
        magic, _version, header_size, payload_size = struct.unpack_from("<IHHQ", data, offset)
        if magic != FATBIN_MAGIC:
            offset += 8  # fat binaries are 8-byte aligned, with padding between them
            continue
        binaries += 1
        entries, entry, binary_end = [], offset + header_size, offset + header_size + payload_size
        while entry < binary_end:
            _kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", data, entry)
            sm = struct.unpack_from("<I", data, entry + 28)[0]
            entries.append((entry + entry_header, entry_size, sm))
            entry += entry_header + entry_size
        if any(sm == keep_sm for _, _, sm in entries):
            for start, length, sm in entries:
                if sm == keep_sm:
                    kept += length
                else:
                    data[start:start + length] = bytes(length)
                    zeroed += length
        offset = binary_end
    return binaries, zeroed, kept


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--keep-sm", type=int, default=90, help="the architecture kept (90: H100/H200)")
    a = p.parse_args()
    with open(a.input, "rb") as f:
        data = bytearray(f.read())
    binaries, zeroed, kept = prune(data, a.keep_sm)
    with open(a.output, "wb") as f:
        f.write(data)
    print(f"{binaries} fat binaries: kept {kept / 1e6:.0f} MB of sm_{a.keep_sm}, zeroed {zeroed / 1e6:.0f} MB",
          file=sys.stderr)


if __name__ == "__main__":
    main()
