"""The files `caliper scales` writes, byte for byte (client/remote_common.cc WriteScalesOutputs):
kv_cache_calib.json (the server's LightLLM rendering), the engine files the server rendered, and
scales.json. JSON is laid out as the CLI's nlohmann::json dump(2), floats as the shortest decimal
that reads back as the same float32.
"""
from __future__ import annotations

import dataclasses
import decimal
import math
import os
import pathlib
from typing import Any, List

import numpy as np

from ._pb import caliper_pb2 as pb


def short_float(value: float) -> Any:
    """The CLI's ShortFloat: the float32's shortest decimal, read back as a double."""
    f = np.float32(value)
    if not np.isfinite(f):
        return None  # nlohmann writes non-finite numbers as null
    return float(str(f))


def _format_double(v: float) -> str:
    """nlohmann::json's number layout: shortest digits, fixed for 1e-4 <= |v| < 1e15."""
    if v == 0:
        return "-0.0" if math.copysign(1, v) < 0 else "0.0"
    sign = "-" if v < 0 else ""
    _, digit_tuple, exponent = decimal.Decimal(repr(abs(v))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = k + exponent  # the decimal point's position after the first digit
    if k <= n <= 15:
        return f"{sign}{digits}{'0' * (n - k)}.0"
    if 0 < n <= 15:
        return f"{sign}{digits[:n]}.{digits[n:]}"
    if -4 < n <= 0:
        return f"{sign}0.{'0' * (-n)}{digits}"
    e = n - 1
    body = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{sign}{body}e{'-' if e < 0 else '+'}{abs(e):02d}"


def _escape(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def dump_json(value: Any, indent: int = 2, _level: int = 0) -> str:
    """nlohmann::ordered_json::dump(indent) for dicts, lists, str, int, float, bool, None."""
    pad = " " * (indent * (_level + 1))
    end = " " * (indent * _level)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{pad}{_escape(str(k))}: {dump_json(v, indent, _level + 1)}"
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        items = [pad + dump_json(v, indent, _level + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + end + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "null" if not math.isfinite(value) else _format_double(value)
    if isinstance(value, str):
        return _escape(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _write_atomically(path: pathlib.Path, content: bytes) -> None:
    temp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(temp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


@dataclasses.dataclass
class WrittenOutputs:
    scales_json: str = ""
    kv_cache_calib: str = ""
    engine_files: List[str] = dataclasses.field(default_factory=list)


def _floats(values) -> list:
    return [short_float(v) for v in values]


def _kv_mode_name(mode: int) -> str:
    return {pb.KV_PER_HEAD: "per_head", pb.KV_PER_TENSOR: "per_tensor"}.get(mode, "off")


def scales_document(scales: pb.ScalesResponse, session: pb.Session,
                    deployment: pb.Deployment) -> dict:
    m = session.model
    doc = {
        "session_id": session.id,
        "session_name": session.name,
        "model": {"architecture": m.architecture, "model_type": m.model_type,
                  "num_layers": m.num_layers, "num_attention_heads": m.num_attention_heads,
                  "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
                  "hidden_size": m.hidden_size},
    }
    deploy = {"tp_size": scales.tp_size, "total_kv_heads": scales.deployed_total_kv_heads}
    if deployment.HasField("rank"):
        deploy["rank"] = deployment.rank
    doc["deployment"] = deploy
    doc["progress"] = {"accepted_chunks": session.accepted_chunks,
                       "accepted_bytes": session.accepted_bytes,
                       "rejected_chunks": session.rejected_chunks,
                       "skipped_warmup_chunks": session.skipped_warmup_chunks}
    fnuz = scales.fp8_flavor == pb.FP8_E4M3FNUZ
    kv = {"mode": _kv_mode_name(scales.kv),
          "fp8_dtype": "float8_e4m3fnuz" if fnuz else "float8_e4m3fn",
          "qmax": 240.0 if fnuz else 448.0,
          "num_kv_heads": scales.num_kv_heads,
          "deployed_total_kv_heads": scales.deployed_total_kv_heads,
          "note": "scale = absmax / qmax (dequantization multiplier), over the model's original "
                  "heads"}
    kv["layers"] = [{"layer": layer.layer, "k_absmax": _floats(layer.k_absmax),
                     "v_absmax": _floats(layer.v_absmax), "k_scale": _floats(layer.k_scale),
                     "v_scale": _floats(layer.v_scale)} for layer in scales.kv_layers]
    if scales.rank_slices:
        kv["rank_slices"] = [{"layer": s.layer, "k_scale": _floats(s.k_scale),
                              "v_scale": _floats(s.v_scale)} for s in scales.rank_slices]
    if scales.kv != pb.KV_OFF and scales.fp8_flavor == pb.FP8_E4M3FN:
        kv["lightllm_file"] = "kv_cache_calib.json"
    doc["kv_cache"] = kv
    divisor = scales.convention == pb.COMPRESSED_TENSORS
    nvfp4 = {"convention": "compressed_tensors" if divisor else "modelopt",
             "form": "divisor: global_scale = 448 * 6 / amax" if divisor
             else "multiplier: scale = amax / (448 * 6)"}
    modules = {}
    for mod in scales.modules:
        entry = {"fused_group": mod.fused_group}
        if mod.HasField("weight_amax"):
            entry["weight_amax"] = short_float(mod.weight_amax)
        if mod.HasField("weight_global_scale"):
            entry["weight_global_scale" if divisor else "weight_scale_2"] = short_float(
                mod.weight_global_scale)
        if mod.HasField("input_amax"):
            entry["input_amax"] = short_float(mod.input_amax)
        if mod.HasField("input_global_scale"):
            entry["input_global_scale" if divisor else "input_scale"] = short_float(
                mod.input_global_scale)
        modules[mod.module] = entry
    nvfp4["modules"] = modules
    doc["nvfp4"] = nvfp4
    doc["warnings"] = [{"where": w.where, "message": w.message} for w in scales.warnings]
    return doc


def write_scales_outputs(out_dir: str, scales: pb.ScalesResponse, session: pb.Session,
                         deployment: pb.Deployment) -> WrittenOutputs:
    """Writes kv_cache_calib.json, the engine files and scales.json into out_dir (created)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = WrittenOutputs()
    lightllm = [f for f in scales.files if f.format == "lightllm"]
    if scales.kv != pb.KV_OFF and scales.fp8_flavor == pb.FP8_E4M3FN:  # e4m3fnuz: none
        if not lightllm:
            raise RuntimeError("GetScales returned no \"lightllm\" file for a KV session")
        written.kv_cache_calib = str(out / "kv_cache_calib.json")
        _write_atomically(out / "kv_cache_calib.json", lightllm[-1].content)
    for f in scales.files:
        if f.format == "lightllm":
            continue
        if not f.name or "/" in f.name or f.name.startswith("."):
            raise RuntimeError(f"GetScales returned a file named \"{f.name}\"")
        written.engine_files.append(str(out / f.name))
        _write_atomically(out / f.name, f.content)
    text = dump_json(scales_document(scales, session, deployment)) + "\n"
    written.scales_json = str(out / "scales.json")
    _write_atomically(out / "scales.json", text.encode("utf-8"))
    return written
