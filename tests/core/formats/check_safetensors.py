#!/usr/bin/env python3
"""Independent safetensors header check (stdlib only), for files written by Caliper's writer.

Usage: check_safetensors.py WRITER_EXE
Runs WRITER_EXE DIR, which writes *.safetensors files and DIR/manifest.json
({file: {tensor: {"dtype", "shape", "values"}}}); then checks every file's layout against the
safetensors spec and every tensor's decoded values against the manifest. Exit status 1 on any
problem.
"""
import json
import math
import re
import os
import struct
import subprocess
import sys
import tempfile

# bits per element, struct format for decoding (None: compare raw bytes only)
DTYPES = {
    "BOOL": (8, "?"), "U8": (8, "B"), "I8": (8, "b"), "F8_E5M2": (8, None),
    "F8_E4M3": (8, None), "F8_E8M0": (8, None), "I16": (16, "h"), "U16": (16, "H"),
    "F16": (16, "e"), "BF16": (16, None), "I32": (32, "i"), "U32": (32, "I"),
    "F32": (32, "f"), "F64": (64, "d"), "I64": (64, "q"), "U64": (64, "Q"),
}

problems = []


def fail(where, message):
    problems.append(f"{where}: {message}")


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise ValueError(f"duplicate keys {sorted(dupes)}")
    return dict(pairs)


def decode(dtype, raw, count):
    bits, fmt = DTYPES[dtype]
    if dtype == "BF16":
        halves = struct.unpack(f"<{count}H", raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    if fmt is None:
        return None
    return list(struct.unpack(f"<{count}{fmt}", raw))


def check_file(path, expected):
    data = open(path, "rb").read()
    where = os.path.basename(path)
    if len(data) < 8:
        return fail(where, "shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        return fail(where, f"header length {n} beyond file size {len(data)}")
    if (8 + n) % 8 != 0:
        fail(where, f"data section starts at {8 + n}, not 8-byte aligned")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    except ValueError as e:
        return fail(where, f"header is not valid JSON: {e}")
    if not isinstance(header, dict):
        return fail(where, "header is not an object")
    data_size = len(data) - 8 - n
    spans = []
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
                fail(where, "__metadata__ is not str -> str")
            continue
        tw = f"{where}: {name}"
        if set(info) != {"dtype", "shape", "data_offsets"}:
            fail(tw, f"keys {sorted(info)}")
            continue
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            fail(tw, f"unknown dtype {dtype!r}")
            continue
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            fail(tw, f"bad shape {shape}")
            continue
        itemsize = DTYPES[dtype][0] // 8
        count = math.prod(shape)
        if not (0 <= begin <= end <= data_size):
            fail(tw, f"offsets {begin},{end} outside 0..{data_size}")
            continue
        if end - begin != count * itemsize:
            fail(tw, f"{end - begin} bytes for {count} x {dtype}")
        if begin % itemsize != 0:
            fail(tw, f"begins at {begin}, not aligned to its item size {itemsize}")
        spans.append((begin, end, name))
        tensors[name] = (dtype, shape, data[8 + n + begin:8 + n + end], count)
    cursor = 0
    for begin, end, name in sorted(spans):
        if begin != cursor:
            fail(where, f"{name} begins at {begin}, expected {cursor} (gap or overlap)")
        cursor = max(cursor, end)
    if cursor != data_size:
        fail(where, f"tensors cover {cursor} of {data_size} data bytes")

    check_engine_conventions(where, header.get("__metadata__", {}), tensors)
    if expected is None:
        return
    if set(expected) != set(tensors):
        fail(where, f"tensor names {sorted(tensors)} != manifest {sorted(expected)}")
    for name, want in expected.items():
        if name not in tensors:
            continue
        dtype, shape, raw, count = tensors[name]
        if dtype != want["dtype"] or shape != want["shape"]:
            fail(f"{where}: {name}", f"{dtype}{shape} != manifest {want['dtype']}{want['shape']}")
            continue
        values = decode(dtype, raw, count)
        if "values" in want and values is not None:
            for i, (got, ref) in enumerate(zip(values, want["values"])):
                same = (got == ref) or (isinstance(got, float) and math.isnan(got)
                                        and isinstance(ref, str) and ref == "nan")
                if not same:
                    fail(f"{where}: {name}[{i}]", f"{got!r} != manifest {ref!r}")
                    break


FUSED = [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3")]


def check_fused(where, scalars, suffix):
    """Members of a fused group under one parent must carry the same value."""
    groups = {}
    for name, value in scalars.items():
        if not name.endswith(suffix):
            continue
        module = name[: -len(suffix)]
        parent, _, leaf = module.rpartition(".")
        for i, group in enumerate(FUSED):
            if leaf in group:
                groups.setdefault((parent, i), set()).add(value)
    for (parent, i), values in groups.items():
        if len(values) != 1:
            fail(where, f"fused group {FUSED[i]} under {parent} has different {suffix}: {values}")


def check_engine_conventions(where, metadata, tensors):
    """Names, dtypes and shapes the engines expect, from the spec, not from our code."""
    fmt = metadata.get("caliper.format")
    if fmt is None:
        return
    config = json.loads(metadata.get("caliper.config", "null"))
    scalars = {}
    kv_shapes = set()
    for name, (dtype, shape, raw, count) in tensors.items():
        if dtype != "F32":
            fail(f"{where}: {name}", f"scale dtype {dtype}, engines expect F32")
            continue
        if count == 1:
            scalars[name] = struct.unpack("<f", raw)[0]
        if fmt == "compressed-tensors":
            if re.fullmatch(r".*layers\.\d+\.self_attn\.[kv]_scale", name):
                kv_shapes.add(tuple(shape))
                # [1] per tensor, [H, 1, 1] per head (llm-compressor's shapes).
                if shape != [1] and not (len(shape) == 3 and shape[1:] == [1, 1]):
                    fail(f"{where}: {name}", f"KV scale shape {shape}")
            elif re.fullmatch(r".+\.(weight|input)_global_scale", name):
                if shape != [1]:
                    fail(f"{where}: {name}", f"global scale shape {shape}, expected [1]")
            else:
                fail(f"{where}: {name}", "not a compressed-tensors scale name")
        elif fmt == "modelopt":
            ok = re.fullmatch(r".*layers\.\d+\.self_attn\.(k_proj\.k|v_proj\.v)_scale", name) \
                or re.fullmatch(r".+\.(weight_scale_2|input_scale)", name)
            if not ok:
                fail(f"{where}: {name}", "not a ModelOpt scale name")
            if shape != []:
                fail(f"{where}: {name}", f"ModelOpt scale shape {shape}, expected []")
        else:
            fail(where, f"unknown caliper.format {fmt!r}")
    if fmt == "compressed-tensors":
        if config.get("quant_method") != "compressed-tensors":
            fail(where, "quantization_config.quant_method is not compressed-tensors")
        scheme = config.get("kv_cache_scheme")
        if kv_shapes:
            per_head = any(len(s) == 3 for s in kv_shapes)
            want = "attn_head" if per_head else "tensor"
            if len(kv_shapes) != 1 or not scheme or scheme.get("strategy") != want:
                fail(where, f"KV shapes {kv_shapes} disagree with kv_cache_scheme {scheme}")
            elif (scheme.get("num_bits"), scheme.get("type"), scheme.get("dynamic"),
                  scheme.get("symmetric")) != (8, "float", False, True):
                fail(where, f"kv_cache_scheme {scheme}")
        check_fused(where, scalars, ".weight_global_scale")
    elif fmt == "modelopt":
        q = config.get("quantization", {})
        if config.get("producer", {}).get("name") != "caliper" or \
                (q.get("quant_algo"), q.get("group_size")) != ("NVFP4", 16):
            fail(where, f"hf_quant_config {config}")
        check_fused(where, scalars, ".weight_scale_2")
        check_fused(where, scalars, ".input_scale")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.argv[1], out], check=True)
        manifest = json.load(open(os.path.join(out, "manifest.json")))
        files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        if not files:
            fail(out, "the writer wrote no .safetensors file")
        for f in files:
            check_file(os.path.join(out, f), manifest.get(f))
        missing = set(manifest) - set(files)
        if missing:
            fail(out, f"manifest lists files not written: {sorted(missing)}")
        print(f"checked {len(files)} files")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
