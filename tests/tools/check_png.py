#!/usr/bin/env python3
"""Checks that files are valid PNG images, with the Python standard library alone: the signature,
every chunk's CRC-32, IHDR first and IEND last, and the image data inflating (zlib) to exactly the
bytes its width, height, bit depth and colour type call for. Prints "WIDTH HEIGHT DISTINCT_ROWS"
per file (distinct raw scanlines: more than one means the image is not blank); exits with 1 and
a message naming the file otherwise.

    check_png.py FILE...
"""
import struct
import sys
import zlib

CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel


def check(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("no PNG signature")
    pos, chunks, idat = 8, [], b""
    while pos < len(data):
        if pos + 12 > len(data) or pos + 12 + struct.unpack(">I", data[pos:pos + 4])[0] > len(data):
            raise ValueError("truncated chunk at offset %d" % pos)
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if len(body) != length or zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError("chunk %r at offset %d: bad length or CRC" % (kind, pos))
        chunks.append((kind, body))
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    if not chunks or chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        raise ValueError("IHDR must come first and IEND last")
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if width == 0 or height == 0 or colour not in CHANNELS or interlace != 0:
        raise ValueError("unexpected IHDR %r" % (chunks[0][1],))
    raw = zlib.decompress(idat)
    row = 1 + (width * CHANNELS[colour] * depth + 7) // 8  # a filter byte, then the samples
    if len(raw) != row * height:
        raise ValueError("image data inflate to %d bytes, expected %d" % (len(raw), row * height))
    distinct = len({raw[i * row:(i + 1) * row] for i in range(height)})
    return width, height, distinct


def main(paths):
    if not paths:
        sys.stderr.write(__doc__)
        return 2
    for path in paths:
        try:
            width, height, distinct = check(path)
        except (OSError, ValueError, zlib.error) as e:
            sys.stderr.write("check_png: %s: %s\n" % (path, e))
            return 1
        print(width, height, distinct)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
