#!/usr/bin/env python3
"""Writes safetensors files with the Python standard library alone, independently of dstrain:
what its importer is tested against.

    make_safetensors.py SPEC.json OUT [--shards N]

SPEC.json: {"tensors": [{"name": NAME, "dtype": "F32" | "F16" | "BF16" | "F8_E4M3", "shape": [...]}, ...]}.
Element k (row-major) of the t-th tensor of the list holds ((7k + 3t) mod 17 - 8) / 16, exact in
each of those dtypes but F8_E4M3, whose tensors hold zero bytes. The header lists the tensors in
the order given, without padding; the data follow in the same order.

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
    if dtype == "F8_E4M3":
        return bytes(len(values))
    raise SystemExit("make_safetensors.py: unknown dtype " + dtype)


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
        tensors = json.load(f)["tensors"]
    for t, tensor in enumerate(tensors):
        count = 1
        for d in tensor["shape"]:
            count *= d
        tensor["bytes"] = encode(tensor["dtype"], [value(t, k) for k in range(count)])
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
