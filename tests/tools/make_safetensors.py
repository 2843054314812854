#!/usr/bin/env python3
"""Writes safetensors files with the Python standard library alone, independently of dstrain:
what its importer is tested against.

    make_safetensors.py SPEC.json OUT [--shards N]

SPEC.json: {"tensors": [{"name": NAME, "dtype": "F32" | "F16" | "BF16" | "F8_E4M3", "shape": [...]}, ...]}.
Element k (row-major) of the t-th tensor of the list holds ((7k + 3t) mod 17 - 8) / 16, exact in
each of those dtypes but F8_E4M3. An F8_E4M3 tensor holds the code (37k + 11t + 5) mod 256, less
one where that is a NaN code (0x7F, 0xFF); with "block": [R, C] it gets DeepSeek's block scales
NAME_scale_inv, F32 [ceil(rows / R), ceil(cols / C)], scale j (row-major) 2^((j + t) mod 5 - 2) ×
(1 + ((3j + t) mod 8) / 8), listed right after it. For damaged files, "scale_shape" replaces the
scales' shape and "scale_first" (a float as text: "nan", "inf", "0", "-1") their first value.
The header lists the tensors in the order given, without padding; the data follow in the same order.

OUT ending in .safetensors: one file. Otherwise a directory with N shards (default 1)
model-0000i-of-0000N.safetensors, the tensors dealt out in turn, and model.safetensors.index.json.
"""
import json
import os
import struct
import sys


def value(t, k):
    return ((7 * k + 3 * t) % 17 - 8) / 16.0


def encode(dtype, values):
    if dtype == "F32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "F16":
        return struct.pack("<%de" % len(values), *values)
    if dtype == "BF16":  # the upper half of the float32's bits (exact for these values)
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    raise SystemExit("make_safetensors.py: unknown dtype " + dtype)


def fp8_codes(t, count):
    codes = [(37 * k + 11 * t + 5) % 256 for k in range(count)]
    return bytes(c - 1 if c & 0x7F == 0x7F else c for c in codes)


def scales(t, tensor):
    rows, cols = tensor["shape"]
    block_rows, block_cols = tensor["block"]
    shape = tensor.get("scale_shape", [-(-rows // block_rows), -(-cols // block_cols)])
    count = 1
    for d in shape:
        count *= d
    values = [2.0 ** ((j + t) % 5 - 2) * (1 + ((3 * j + t) % 8) / 8) for j in range(count)]
    if "scale_first" in tensor and count > 0:
        values[0] = float(tensor["scale_first"])
    return {"name": tensor["name"] + "_scale_inv", "dtype": "F32", "shape": shape,
            "bytes": encode("F32", values)}


def with_data(tensors):
    """The tensors with their bytes, each FP8 one followed by its scales when it has a block size."""
    out = []
    for t, tensor in enumerate(tensors):
        count = 1
        for d in tensor["shape"]:
            count *= d
        if tensor["dtype"] == "F8_E4M3":
            tensor["bytes"] = fp8_codes(t, count)
        else:
            tensor["bytes"] = encode(tensor["dtype"], [value(t, k) for k in range(count)])
        out.append(tensor)
        if tensor["dtype"] == "F8_E4M3" and "block" in tensor:
            out.append(scales(t, tensor))
    return out


def write_file(path, tensors):
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for t in tensors:
        header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"],
                             "data_offsets": [len(data), len(data) + len(t["bytes"])]}
        data += t["bytes"]
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


def main():
    args = sys.argv[1:]
    shards = 1
    if "--shards" in args:
        at = args.index("--shards")
        shards = int(args[at + 1])
        del args[at:at + 2]
    spec_path, out = args
    with open(spec_path) as f:
        tensors = with_data(json.load(f)["tensors"])
    if out.endswith(".safetensors"):
        write_file(out, tensors)
        return
    os.makedirs(out, exist_ok=True)
    weight_map, total = {}, 0
    for i in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        mine = tensors[i::shards]
        write_file(os.path.join(out, name), mine)
        for t in mine:
            weight_map[t["name"]] = name
            total += len(t["bytes"])
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()
