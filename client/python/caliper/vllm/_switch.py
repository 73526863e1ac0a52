"""Switching the engine to a published version: which scale each TP rank applies, how it is
written into the layer (in place, where every kernel reads it), and when (between two steps)."""
from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Tuple

from ._settings import Settings, logger

# One version's K/V (and query) scales per layer: (k, v) or (k, v, q), each per head or one.
LayerScales = Tuple[List[float], ...]
VersionScales = Dict[int, LayerScales]
# The scales this rank applies per layer: (k, v, q or None).
Applied = Dict[int, Tuple[float, float, Optional[float]]]

SCALE_ATTRS = ("_k_scale", "_v_scale", "_q_scale", "_k_scale_float", "_v_scale_float",
               "_q_scale_float", "_k_scale_cpu", "_v_scale_cpu")
# Scales an attention backend derives from the floats once and keeps (FlashInfer's
# bmm1_scale / bmm2_scale): dropped so that the next forward derives them again.
_DERIVED_ATTRS = ("bmm1_scale", "bmm2_scale", "o_sf_scale")


# The KV caches whose scales a fleet calibrates: one FP8 scale per layer and rank, NVFP4's
# global decode scale, or an unquantized cache (auto: scales kept for a switch to FP8). Others
# (per-token-head FP8, turboquant, ...) quantize with scales of their own.
_CALIBRATED_CACHES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2",
                      "nvfp4")


def unsupported_cache(kv_cache_dtype: str) -> str:
    """'' when the plugin calibrates this vLLM kv_cache_dtype, else why not."""
    if kv_cache_dtype in _CALIBRATED_CACHES or kv_cache_dtype.startswith("nvfp4"):
        return ""
    return (f"kv_cache_dtype {kv_cache_dtype!r} takes no calibrated per-layer scale (the "
            f"plugin calibrates {', '.join(_CALIBRATED_CACHES)} and nvfp4 caches)")


def kv_qmax(kv_cache_dtype: str) -> float:
    """The largest |x| / k_scale the cache holds: its FP8 max, or for NVFP4 caches (global
    decode scales) E2M1's 6 times the E4M3 block scale's 448."""
    import torch
    if kv_cache_dtype.startswith("nvfp4"):
        return 448.0 * 6.0
    return float(torch.finfo(torch.float8_e5m2 if "e5m2" in kv_cache_dtype
                             else torch.float8_e4m3fn).max)


def rank_scale(values: List[float], rank: int, size: int) -> Optional[float]:
    """The scale the kernel applies on `rank`: the max over the heads it holds (vLLM's CPU and
    per-tensor kernels take one scale per layer and rank)."""
    n = len(values)
    if n == 1:
        return float(values[0])
    if n >= size and n % size == 0:
        per = n // size
        return float(max(values[rank * per:(rank + 1) * per]))
    if n < size and size % n == 0:
        return float(values[rank * n // size])
    return None


def rank_scales(version: int, scales: VersionScales, layers: List[int], rank: int,
                size: int) -> Tuple[Applied, str]:
    """What this rank applies of a version ({}, why) when it does not cover exactly `layers`
    or its heads cannot be mapped to the rank."""
    if sorted(scales) != sorted(layers):
        return {}, f"version {version} has layers {sorted(scales)}, the model {sorted(layers)}"
    out: Applied = {}
    for index, rows in scales.items():
        ks, vs, qs = rows[0], rows[1], (rows[2] if len(rows) > 2 else [])
        k, v = rank_scale(ks, rank, size), rank_scale(vs, rank, size)
        q = rank_scale(qs, rank, size) if qs else None
        if k is None or v is None or (qs and q is None):
            return {}, (f"version {version} layer {index}: {len(ks)} K/V scales cannot be "
                        f"mapped to TP rank {rank} of {size}")
        used = (k, v) if q is None else (k, v, q)
        if not all(math.isfinite(x) and x > 0 for x in used):
            return {}, f"version {version} layer {index}: scale {used} is not positive"
        out[index] = (k, v, q)
    return out, ""


def set_scales(module: Any, k: float, v: float, q: Optional[float] = None) -> None:
    """What vLLM's loader sets from checkpoint k/v (and q) scales (BaseKVCacheMethod
    .process_weights_after_loading), including the host copies; without q the query's scale
    stays, as does prob_scale. Tensors are written in place (`fill_`): kernels and captured
    graphs hold them by address. Derived scales a backend cached are dropped."""
    from vllm.platforms import current_platform
    if current_platform.is_fp8_fnuz():
        k, v = k * 2, v * 2
        q = q * 2 if q is not None else None
    module._k_scale.fill_(k)
    module._v_scale.fill_(v)
    module._k_scale_float = k
    module._v_scale_float = v
    if q is not None:
        module._q_scale.fill_(q)
        module._q_scale_float = q
    if hasattr(module, "_k_scale_cpu"):
        module._k_scale_cpu.fill_(k)
        module._v_scale_cpu.fill_(v)
    impl = getattr(module, "impl", None)
    for name in _DERIVED_ATTRS:
        if impl is not None and getattr(impl, name, None) is not None:
            setattr(impl, name, None)


def differs(module: Any, k: float, v: float, q: Optional[float]) -> bool:
    """Whether the layer no longer holds (k, v, q) (a reload reset it)."""
    return bool(module._k_scale_float != k or module._v_scale_float != v
                or (q is not None and module._q_scale_float != q))


def plain(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.detach().cpu().tolist()
    return x


class Switch:
    """The engine core's side: a version delivered by the watcher is applied on every worker
    between two steps (running requests preempted so nothing in the cache was written under
    other scales; the prefix cache reset)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pending: Optional[Tuple[int, str, VersionScales]] = None
        self.pending_since = 0.0
        self.version = 0
        self.refused: List[str] = []

    def offer(self, version: int, weight_version: str, scales: VersionScales) -> None:
        self.pending = (version, weight_version, scales)
        self.pending_since = time.monotonic()

    def before_step(self, core: Any) -> Optional[int]:
        """Applies the pending version if this is a point between two steps; the version now
        in use when it switched, else None."""
        pending = self.pending
        if pending is None:
            return None
        if getattr(core, "batch_queue", None):
            return None  # steps in flight: not between two steps yet
        scheduler = core.scheduler
        if scheduler.running:
            if time.monotonic() - self.pending_since < self.settings.switch_grace_s:
                return None  # wait for a drain point
            # Preempt: those requests recompute their K/V under the new scales.
            scheduler.reset_prefix_cache(reset_running_requests=True)
        version, weight_version, scales = pending
        results = core.model_executor.collective_rpc(
            "caliper_apply_scales", args=(version, weight_version, scales))
        self.pending = None
        refusal = next((r for r in results if r), "")
        if refusal:
            self.refused.append(refusal)
            logger().warning("caliper: fleet %s %s; the engine keeps its scales",
                             self.settings.fleet, refusal)
            return None
        scheduler.reset_prefix_cache()
        self.version = version
        logger().info("caliper: fleet %s version %d in use", self.settings.fleet, version)
        return version
