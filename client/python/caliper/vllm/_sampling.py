"""What the plugin samples, where vLLM runs attention at serving time, kept on the device.

Where (vLLM 0.32, docs/vllm-plugin.md "Where the plugin samples"): `Attention.forward` calls the
opaque custom op `unified_attention_with_output` on CUDA and CPU
(`current_platform.opaque_attention_op()`), which looks the layer up in the forward context and
calls `layer.impl.forward(layer, query, key, value, kv_cache, attn_metadata, ...)` with the
step's query and the K/V it caches. The plugin wraps each layer's `impl.forward` (an instance
attribute: the op reads it on every call). So one mechanism serves every mode:
  - eager, and the CPU build's default compile (Dynamo traces `Attention.forward` once, but the
    op's body is Python run on every step);
  - GPU piecewise graphs (attention is a splitting op, run between the captured pieces);
  - GPU full CUDA graphs: the wrapper runs while vLLM captures, so its tensor ops are captured
    and replayed with the graph, gated by a device flag the engine thread sets before each step.
Rows past the step's tokens are padding: their slot_mapping entry is -1 (PAD_SLOT_ID), and the
statistics mask them on the device. Nothing here synchronises with the host: each sampled step
writes its statistics into one float32 and one int64 device buffer (every layer a view of
them, at addresses fixed for captured graphs), and the engine thread queues one copy of each
to the host after the step; the sender thread waits for the copy, never the step.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .. import _histogram, _tensors
from ._settings import logger

KEY, VALUE, QUERY = 0, 1, 2
_PART_NAMES = ("key", "value", "query")
_HOST_SLOTS = 8  # pinned host copies in flight (GPU); a sampled step finding none is dropped


@dataclasses.dataclass
class LayerShape:
    index: int                  # the checkpoint's layer index
    heads: int                  # local KV heads (MLA: 1, the latent)
    head_dim: int               # K's width per head (MLA: kv_lora_rank, kv_c_normed)
    q_heads: int                # local query heads
    parts: int                  # 2 (K, V) or 3 (with the query, reduced per KV head)
    v_dim: int = 0              # V's width per head when it differs (MLA: k_pe's rope dims)
    mla: bool = False           # one scale (_k_scale) for the whole cached entry

    def width(self, part: int) -> int:
        return self.v_dim if part == VALUE and self.v_dim else self.head_dim


@dataclasses.dataclass
class _Offsets:
    rows: int                   # int64: actual tokens of the step
    absmax: int                 # float32 [parts, heads]
    lo: int                     # float32 [parts, heads] (minmax observer)
    hi: int
    over: int                   # int64 [2, heads]: K/V elements beyond the cache's range
    max_count: int              # int64 [parts, heads]: elements equal to the absmax
    hist: int                   # int64 [parts, heads, SLOTS] (histogram recipes)


@dataclasses.dataclass
class Readout:
    """One sampled step's statistics on the host (or on their way there)."""
    floats: Any                 # torch float32 tensor
    ints: Any                   # torch int64 tensor
    event: Any                  # torch.cuda.Event to wait for, or None
    batch: int
    generation: int
    version: int
    release: Optional[Callable[[], None]] = None
    kind: str = ""              # the step's kind: prefill, decode or mixed

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


@dataclasses.dataclass
class LayerStatistics:
    """One layer's part of a readout: chunks for the session and the saturation counts."""
    index: int
    rows: int
    chunks: List[Tuple[str, int, _tensors.Chunk]]
    k_over: List[int]
    v_over: List[int]


class StepStatistics:
    """The device buffers of every layer and the per-layer observation ops."""

    def __init__(self, shapes: List[LayerShape], device: Any, minmax: bool, histograms: bool,
                 kv_qmax: float):
        import torch
        self.shapes = shapes
        self.device = device
        self.minmax = minmax
        self.histograms = histograms
        self.kv_qmax = kv_qmax
        self.dtype = ""          # BF16 / F16 / F32, from the first K seen
        self.query_skipped = ""  # why the query is not sampled (quantized before the op)
        floats = ints = len(shapes)  # the rows of every layer first, zeroed as one range
        self.offsets: List[_Offsets] = []
        for s in shapes:
            ph = s.parts * s.heads
            hist = ints + 2 * s.heads + ph
            self.offsets.append(_Offsets(
                rows=len(self.offsets), absmax=floats, lo=floats + ph, hi=floats + 2 * ph,
                over=ints, max_count=ints + 2 * s.heads, hist=hist))
            floats += 3 * ph
            ints = hist + (ph * _histogram.SLOTS if histograms else 0)
        self.floats = torch.zeros(floats, dtype=torch.float32, device=device)
        self.ints = torch.zeros(ints, dtype=torch.int64, device=device)
        self.gate = torch.zeros((), dtype=torch.bool, device=device)
        self._gate_value = False
        self._cuda = getattr(device, "type", str(device)) == "cuda"
        self._free: List[Tuple[Any, Any]] = []
        self._free_lock = threading.Lock()
        if self._cuda:
            self._free = [(torch.empty_like(self.floats, device="cpu").pin_memory(),
                           torch.empty_like(self.ints, device="cpu").pin_memory())
                          for _ in range(_HOST_SLOTS)]
        self._offsets_by_index = {s.index: (s, o) for s, o in zip(shapes, self.offsets)}

    # engine thread, between steps -------------------------------------------------------------
    def begin_step(self, sampling: bool) -> None:
        """Before a step: the device gate (read by captured graphs) and, when sampling, every
        layer's row count zeroed (a layer that does not run then reports nothing)."""
        if sampling != self._gate_value:
            self.gate.fill_(sampling)
            self._gate_value = sampling
        if sampling:
            self.ints[:len(self.shapes)].zero_()

    def readout(self, batch: int, generation: int, version: int,
                kind: str = "") -> Optional[Readout]:
        """After a sampled step: the copy to the host, queued behind the step (None: every
        host slot is still in flight; the step's statistics are dropped)."""
        import torch
        if not self._cuda:
            return Readout(self.floats.clone(), self.ints.clone(), None, batch, generation,
                           version, None, kind)
        with self._free_lock:
            if not self._free:
                return None
            floats, ints = self._free.pop()
        floats.copy_(self.floats, non_blocking=True)
        ints.copy_(self.ints, non_blocking=True)
        event = torch.cuda.Event()
        event.record()

        def release() -> None:
            with self._free_lock:
                self._free.append((floats, ints))
        return Readout(floats, ints, event, batch, generation, version, release, kind)

    def capturing(self) -> bool:
        if not self._cuda:
            return False
        import torch
        return bool(torch.cuda.is_current_stream_capturing())

    # worker thread, inside the attention op -----------------------------------------------------
    def observe(self, index: int, module: Any, query: Any, key: Any, value: Any,
                slot_mapping: Any, gated: bool) -> None:
        """Writes layer `index`'s statistics of this step into the buffers. gated: while a CUDA
        graph is captured; every write then keeps the old value unless the gate is set."""
        import torch
        shape, off = self._offsets_by_index[index]
        rows = int(key.shape[0])
        if slot_mapping is not None:
            rows = min(rows, int(slot_mapping.shape[0]))
        if rows == 0:
            return
        if not self.dtype:
            self.dtype = {torch.bfloat16: "BF16", torch.float16: "F16",
                          torch.float32: "F32"}.get(key.dtype, "")
            if not self.dtype:
                raise RuntimeError(f"K/V of dtype {key.dtype} cannot be sampled")
        h = shape.heads
        parts = [key[:rows].reshape(rows, h, -1), value[:rows].reshape(rows, h, -1)]
        if shape.parts == 3:
            if query.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                if not self.query_skipped:
                    self.query_skipped = (f"the attention backend receives the query quantized "
                                          f"({query.dtype}); its statistics are not sampled")
                    logger().warning("caliper: %s", self.query_skipped)
            else:
                parts.append(query[:rows].reshape(rows, h, -1))
        if slot_mapping is not None:
            mask = (slot_mapping[:rows] >= 0).view(rows, 1, 1)
        else:
            mask = torch.ones((rows, 1, 1), dtype=torch.bool, device=key.device)
        gate = self.gate

        def write(dst: Any, src: Any) -> None:
            dst.copy_(torch.where(gate, src, dst) if gated else src)

        write(self.ints[off.rows:off.rows + 1], mask.sum().view(1))
        ph = shape.heads
        for p, x in enumerate(parts):
            xf = x.float()
            a = xf.abs()
            masked = torch.where(mask, a, 0.0)
            absmax = masked.amax(dim=(0, 2))
            write(self.floats[off.absmax + p * ph:off.absmax + (p + 1) * ph], absmax)
            if self.minmax:
                write(self.floats[off.lo + p * ph:off.lo + (p + 1) * ph],
                      torch.where(mask, xf, float("inf")).amin(dim=(0, 2)))
                write(self.floats[off.hi + p * ph:off.hi + (p + 1) * ph],
                      torch.where(mask, xf, float("-inf")).amax(dim=(0, 2)))
            if p < 2:  # saturation under the scale the kernel applies (read from the tensor)
                scale = module._k_scale if p == KEY or shape.mla else module._v_scale
                limit = scale.float().reshape(-1)[:1] * self.kv_qmax
                write(self.ints[off.over + p * ph:off.over + (p + 1) * ph],
                      (masked > limit).sum(dim=(0, 2)))
            if self.histograms:
                at_max = torch.where(mask, a, -1.0) == absmax.view(1, ph, 1)
                write(self.ints[off.max_count + p * ph:off.max_count + (p + 1) * ph],
                      at_max.sum(dim=(0, 2)))
                counts = self.ints[off.hist + p * ph * _histogram.SLOTS:
                                   off.hist + (p + 1) * ph * _histogram.SLOTS]
                slots = _histogram._slots_torch(a.contiguous())
                slots = slots + (torch.arange(ph, dtype=torch.int32, device=a.device)
                                 * _histogram.SLOTS).view(1, ph, 1)
                weights = mask.expand_as(a).reshape(-1).long()
                if gated:
                    counts.mul_((~gate).long())
                    weights = weights * gate.long()
                else:
                    counts.zero_()
                counts.index_add_(0, slots.reshape(-1).long(), weights)

    # sender thread --------------------------------------------------------------------------------
    def layers_of(self, readout: Readout, recipe: Any) -> List[LayerStatistics]:
        """The chunks the fleet's `recipe` (pb.Recipe) takes of each layer that saw tokens in
        the readout's step. ValueError naming the layer for NaN or Inf (that layer's step is
        dropped, the others returned with the error's text in `skipped`), or naming what the
        buffers lack."""
        from .._pb import caliper_pb2 as pb
        minmax = recipe.kv_observer == pb.KV_OBSERVER_MINMAX
        histograms = _histogram.recipe_needs_histograms(recipe)
        parts = 3 if recipe.attention == pb.ATTENTION_Q and not self.query_skipped else 2
        try:
            readout.wait()
            floats = readout.floats.numpy()
            ints = readout.ints.numpy().copy()
            floats = floats.copy()
        finally:
            if readout.release is not None:
                readout.release()
        if (minmax and not self.minmax) or (histograms and not self.histograms):
            raise ValueError("the fleet's recipe needs statistics this engine did not keep "
                             "(its recipe changed after start: restart the engine)")
        out: List[LayerStatistics] = []
        bad: List[str] = []
        for shape, off in zip(self.shapes, self.offsets):
            rows = int(ints[off.rows])
            if rows <= 0:
                continue
            if parts > shape.parts:
                raise ValueError("the fleet's recipe samples the query, which this engine did "
                                 "not keep (its recipe changed after start: restart it)")
            h = shape.heads
            chunks: List[Tuple[str, int, _tensors.Chunk]] = []
            for p in range(parts):
                where = f"layer {shape.index} {_PART_NAMES[p]}"
                absmax = floats[off.absmax + p * h:off.absmax + (p + 1) * h]
                heads = shape.q_heads if p == QUERY else h
                chunk = _tensors.Chunk(self.dtype, [rows, heads, shape.width(p)])
                if minmax:
                    chunk.head_min = floats[off.lo + p * h:off.lo + (p + 1) * h].tolist()
                    chunk.head_max = floats[off.hi + p * h:off.hi + (p + 1) * h].tolist()
                    values = chunk.head_min + chunk.head_max
                else:
                    chunk.absmax = absmax.tolist()
                    values = chunk.absmax
                if not all(np.isfinite(values)):
                    bad.append(f"{where}: NaN or Inf (the step's statistics of this layer are "
                               "dropped)")
                    chunks = []
                    break
                if histograms:
                    base = off.hist + p * h * _histogram.SLOTS
                    counts = ints[base:base + h * _histogram.SLOTS].reshape(h, _histogram.SLOTS)
                    max_count = ints[off.max_count + p * h:off.max_count + (p + 1) * h]
                    chunk.histograms = [
                        _histogram.Histogram(counts[i], int(max_count[i]), float(absmax[i]))
                        for i in range(h)]
                chunks.append((where, p, chunk))
            if not chunks:
                continue
            over = ints[off.over:off.over + 2 * h]
            out.append(LayerStatistics(shape.index, rows, chunks, over[:h].tolist(),
                                       over[h:].tolist()))
        if bad:
            raise PartialStatistics("; ".join(bad), out)
        return out


class PartialStatistics(ValueError):
    """Some layers' statistics of a step were not finite; `layers` holds the others."""

    def __init__(self, message: str, layers: List[LayerStatistics]):
        super().__init__(message)
        self.layers = layers


def slot_mapping_of(layer_name: str) -> Any:
    """The step's slot mapping of one layer from vLLM's forward context (-1: a padded row), or
    None when there is none (a profiling run)."""
    from vllm.forward_context import get_forward_context
    mappings = get_forward_context().slot_mapping
    if isinstance(mappings, list):
        mappings = mappings[0] if mappings else {}
    return mappings.get(layer_name) if isinstance(mappings, dict) else None


def wrap_mla(module: Any, index: int, statistics: StepStatistics,
             sampling: Callable[[], bool], on_error: Callable[[int, Exception], None]
             ) -> Callable[[], None]:
    """MLA (vLLM 0.32's MLAAttention): the opaque op `unified_mla_kv_cache_update` looks the
    layer up and calls `layer.update_kv_cache(kv_c_normed, k_pe, kv_cache, slot_mapping, ...)`
    on every step, with what the cache stores; wrapped on the instance as impl.forward is for
    standard attention. Returns the function that undoes it."""
    original = module.update_kv_cache

    def update_kv_cache(kv_c_normed: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any,
                        attn_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        if attn_metadata is not None and slot_mapping is not None:
            gated = statistics.capturing()
            if gated or sampling():
                try:
                    statistics.observe(index, module, None, kv_c_normed, k_pe, slot_mapping,
                                       gated)
                except Exception as e:  # noqa: BLE001 - a statistic never fails the step
                    on_error(index, e)
        return original(kv_c_normed, k_pe, kv_cache, slot_mapping, attn_metadata, *args,
                        **kwargs)

    module.update_kv_cache = update_kv_cache

    def undo() -> None:
        del module.update_kv_cache  # the class's method again
    return undo


def wrap_attention(module: Any, index: int, statistics: StepStatistics,
                   sampling: Callable[[], bool], on_error: Callable[[int, Exception], None]
                   ) -> Callable[[], None]:
    """Wraps module.impl.forward so each call observes the layer's K/V (and query); returns
    the function that undoes it."""
    impl = module.impl
    original = impl.forward

    def forward(layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, attn_metadata: Any,
                *args: Any, **kwargs: Any) -> Any:
        if attn_metadata is not None and key is not None and value is not None:
            gated = statistics.capturing()
            if gated or sampling():
                try:
                    statistics.observe(index, layer, query, key, value,
                                       slot_mapping_of(layer.layer_name), gated)
                except Exception as e:  # noqa: BLE001 - a statistic never fails the step
                    on_error(index, e)
        return original(layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)

    impl.forward = forward

    def undo() -> None:
        impl.forward = original
    return undo
