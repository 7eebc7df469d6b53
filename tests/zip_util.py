"""Zip archives written by hand for the tests: a torch file re-zipped with its records deflated,
one of them replaced by a deflate bomb (a GiB of zeros in about a MiB, built in milliseconds by
repeating one flushed block instead of compressing the GiB)."""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

MIB = 1 << 20


def deflated_zeros(size: int) -> tuple[bytes, int]:
    """A raw deflate stream of `size` zero bytes (a multiple of 1 MiB), and their CRC-32. After a
    full flush the compressor starts afresh, so every further MiB compresses to the same bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = bytes(MIB)
    first = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size // MIB):
        crc = zlib.crc32(block, crc)
    return first + again * (size // MIB - 1) + c.flush(), crc


def write_zip(path: Path, members: list[tuple[str, bytes, int, int]]) -> None:
    """An archive of deflated members: (name, raw deflate data, uncompressed size, CRC-32)."""
    out, central = bytearray(), bytearray()
    for name, data, size, crc in members:
        raw, offset = name.encode(), len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, zipfile.ZIP_DEFLATED, 0, 0x21, crc, len(data),
                           size, len(raw), 0) + raw + data
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, zipfile.ZIP_DEFLATED, 0, 0x21, crc,
                               len(data), size, len(raw), 0, 0, 0, 0, 0, offset) + raw
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + end))


def rezip_deflated(src: Path, dst: Path, bombs: dict[str, int] | None = None) -> None:
    """`src`'s members, every one deflated, into `dst`; each member named in `bombs` replaced by
    that many zero bytes."""
    members = []
    with zipfile.ZipFile(src) as z:
        for info in z.infolist():
            if info.filename in (bombs or {}):
                data, crc = deflated_zeros(bombs[info.filename])
                members.append((info.filename, data, bombs[info.filename], crc))
                continue
            payload = z.read(info)
            c = zlib.compressobj(6, zlib.DEFLATED, -15)
            members.append((info.filename, c.compress(payload) + c.flush(), len(payload), zlib.crc32(payload)))
    write_zip(dst, members)
