#!/usr/bin/env python3
"""Decodes TensorBoard event files with the Python standard library alone, independently of
dstrain's C++ encoder: its own CRC-32C (bit by bit, not table-driven) and its own protobuf wire
decoder. Prints every event as one JSON object per line:

    {"wall_time": ..., "step": ..., "file_version": "...", "scalars": {"train/loss": ...},
     "session_log_status": 1}

Exits with 1 and a message naming the file and offset when a record's framing or checksum is
wrong, or an Event does not decode.

    read_tfevents.py FILE...
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class DecodeError(Exception):
    pass


def varint(buf, pos):
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise DecodeError("varint runs past the end")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def fields(buf):
    """(field number, wire type, value) of every field of a message; value: int or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError("field number 0")
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise DecodeError("unsupported wire type %d" % wire)
        if pos > len(buf):
            raise DecodeError("field %d runs past the end" % number)
        yield number, wire, value


def signed64(value):
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_event(buf):
    # event.proto: 1 wall_time double, 2 step int64, 3 file_version string, 5 summary, 7 session_log
    event = {}
    for number, wire, value in fields(buf):
        if number == 1 and wire == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            event["step"] = signed64(value)
        elif number == 3 and wire == 2:
            event["file_version"] = value.decode("utf-8")
        elif number == 5 and wire == 2:
            scalars = event.setdefault("scalars", {})
            # summary.proto: Summary 1 repeated Value; Value 1 tag string, 2 simple_value float
            for vnumber, vwire, vbytes in fields(value):
                if vnumber != 1 or vwire != 2:
                    raise DecodeError("Summary field %d (wire %d)" % (vnumber, vwire))
                tag, simple = None, None
                for n, w, v in fields(vbytes):
                    if n == 1 and w == 2:
                        tag = v.decode("utf-8")
                    elif n == 2 and w == 5:
                        simple = struct.unpack("<f", v)[0]
                if tag is None or simple is None:
                    raise DecodeError("Summary.Value without tag or simple_value")
                scalars[tag] = simple
        elif number == 7 and wire == 2:
            for n, w, v in fields(value):
                if n == 1 and w == 0:
                    event["session_log_status"] = v
        else:
            raise DecodeError("unexpected Event field %d (wire %d)" % (number, wire))
    return event


def read_records(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise DecodeError("%s: truncated record header at offset %d" % (path, pos))
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked(crc32c(header)) != length_crc:
            raise DecodeError("%s: length checksum wrong at offset %d" % (path, pos))
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            raise DecodeError("%s: truncated record at offset %d" % (path, pos))
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if masked(crc32c(body)) != body_crc:
            raise DecodeError("%s: data checksum wrong at offset %d" % (path, pos))
        try:
            yield decode_event(body)
        except DecodeError as e:
            raise DecodeError("%s: record at offset %d: %s" % (path, pos, e))
        pos += 16 + length


def main(paths):
    if not paths:
        sys.stderr.write(__doc__)
        return 2
    try:
        for path in paths:
            for event in read_records(path):
                print(json.dumps(event))
    except (DecodeError, OSError, UnicodeDecodeError) as e:
        sys.stderr.write("read_tfevents: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
