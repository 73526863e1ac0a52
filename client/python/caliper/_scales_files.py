"""Writes the files `caliper scales` writes: the bytes the server rendered (kv_cache_calib.json,
scales.json, the engine files of the formats asked for), as the CLI does (client/scales_output.h).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import List

from ._pb import caliper_pb2 as pb

_LIGHTLLM_FILE = "kv_cache_calib.json"
_SCALES_JSON = "scales.json"


@dataclasses.dataclass
class WrittenFiles:
    """The paths written; `kv_cache_calib` is empty without a LightLLM file (KV off, e4m3fnuz)."""

    scales_json: str = ""
    kv_cache_calib: str = ""
    engine_files: List[str] = dataclasses.field(default_factory=list)


def _write_atomically(path: pathlib.Path, content: bytes) -> None:
    temp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(temp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def write_scales_files(out_dir: str, response: pb.ScalesResponse) -> WrittenFiles:
    """Writes the response's files into out_dir (created). RuntimeError when the response lacks
    scales.json or an e4m3fn KV session's LightLLM file, or names a file outside out_dir."""
    if not response.scales_json:
        raise RuntimeError("GetScales returned no scales.json (a caliper-server before 0.2.0?)")
    lightllm = [f for f in response.files if f.format == "lightllm"]
    if (response.kv != pb.KV_OFF and response.fp8_flavor == pb.FP8_E4M3FN
            and response.kv_cache_dtype != pb.KV_CACHE_NVFP4 and not lightllm):
        raise RuntimeError("GetScales returned no \"lightllm\" file for a KV session")
    others = [f for f in response.files if f.format != "lightllm"]
    for f in others:
        if not f.name or "/" in f.name or f.name.startswith("."):
            raise RuntimeError(f"GetScales returned a file named \"{f.name}\"")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = WrittenFiles()
    if lightllm:
        written.kv_cache_calib = str(out / _LIGHTLLM_FILE)
        _write_atomically(out / _LIGHTLLM_FILE, lightllm[-1].content)
    for f in others:
        written.engine_files.append(str(out / f.name))
        _write_atomically(out / f.name, f.content)
    written.scales_json = str(out / _SCALES_JSON)
    _write_atomically(out / _SCALES_JSON, response.scales_json)
    return written
