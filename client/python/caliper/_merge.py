"""Local merging of statistics on the producer, before they are queued for the wire.

Statistics of the same tensor (K or V of a layer, a module's input or weight, from one TP rank
with the same dtype and trailing shape) are folded into one statistic: absmax, min and max
element-wise, the row counts summed. Across batches only where the server forgets batches
(static_minmax K/V, weights); inputs keep one statistic per batch whatever the observer (the
server keeps them per batch: the report's minmax estimate reads them), and so do K/V under the
other observers (minmax's moving average, percentile, mse); within a batch everything merges.
Histograms (sessions that keep them) merge exactly (caliper/_histogram.py Histogram.merge).

Bounds, all counted in observe calls so the merged statistics (and so the sequences a producer
gives them) are the same on every re-run of the same capture, which Resume relies on: pending
statistics go out when an observation arrives for a batch `window_batches` or more past the
first batch of the window (or before it), when `max_entries` are pending, and on flush.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

from . import _tensors
from ._pb import caliper_pb2 as pb


@dataclasses.dataclass
class Pending:
    """One statistic ready for the wire: what the message needs and the observations it holds."""
    kind: int
    fields: dict            # TensorChunk fields: layer/module, tp_rank, tp_size, batch
    chunk: _tensors.Chunk
    tensor: str             # description for errors, without the batch
    first_batch: Optional[int] = None
    last_batch: Optional[int] = None
    observations: int = 1

    @property
    def description(self) -> str:
        text = self.tensor
        if self.first_batch is not None:
            text += (f" batch {self.first_batch}" if self.first_batch == self.last_batch
                     else f" batches {self.first_batch}..{self.last_batch}")
        if self.observations > 1:
            text += f" ({self.observations} observations merged)"
        return text


def merges_across_batches(recipe: pb.Recipe) -> Dict[int, bool]:
    """Per chunk kind: may statistics of different batches become one? (None: do not merge.)"""
    kv_static = recipe.kv_observer in (pb.KV_OBSERVER_UNSPECIFIED, pb.KV_OBSERVER_STATIC_MINMAX)
    return {pb.KEY: kv_static, pb.VALUE: kv_static, pb.QUERY: kv_static,
            pb.INPUT_ACTIVATION: False, pb.WEIGHT: True}


def _lower(a: float, b: float) -> float:
    """min with -0 below +0 (as the server's one-pass reduction orders them)."""
    if a == b:
        return a if math.copysign(1.0, a) < 0 else b
    return a if a < b else b


def _upper(a: float, b: float) -> float:
    if a == b:
        return a if math.copysign(1.0, a) > 0 else b
    return a if a > b else b


def _each(f, a: Optional[List[float]], b: Optional[List[float]]) -> Optional[List[float]]:
    if a is None or b is None:
        return None
    return [f(x, y) for x, y in zip(a, b)]


def _histograms(a, b):
    if a is None:
        return None
    return [x.merge(y) for x, y in zip(a, b)]


def merge_chunks(a: _tensors.Chunk, b: _tensors.Chunk) -> _tensors.Chunk:
    """The statistic of a and b together (same dtype and trailing shape, same form)."""
    return _tensors.Chunk(
        a.dtype, [a.shape[0] + b.shape[0]] + list(a.shape[1:]),
        absmax=_each(_upper, a.absmax, b.absmax),
        min=None if a.min is None or b.min is None else _lower(a.min, b.min),
        max=None if a.max is None or b.max is None else _upper(a.max, b.max),
        head_min=_each(_lower, a.head_min, b.head_min),
        head_max=_each(_upper, a.head_max, b.head_max),
        group_min=_each(_lower, a.group_min, b.group_min),
        group_max=_each(_upper, a.group_max, b.group_max),
        histograms=_histograms(a.histograms, b.histograms))


def _form(chunk: _tensors.Chunk) -> Tuple[bool, ...]:
    return tuple(getattr(chunk, f) is None for f in
                 ("absmax", "min", "head_min", "group_min", "histograms"))


class Merger:
    def __init__(self, recipe: pb.Recipe, window_batches: int, max_entries: int):
        self.window_batches = window_batches
        self.max_entries = max_entries
        self.enabled = window_batches > 0
        self._across = merges_across_batches(recipe)
        self._warmup = recipe.warmup_batches
        self._entries: Dict[tuple, Pending] = {}
        self._window_start: Optional[int] = None
        self.merged = 0  # observations folded into an earlier pending statistic

    def add(self, item: Pending) -> List[Pending]:
        """Folds item in; returns what must go out now (in a deterministic order)."""
        if not self.enabled or item.chunk.data is not None:
            return [item]
        out: List[Pending] = []
        batch = item.fields.get("batch") if item.kind != pb.WEIGHT else None
        if batch is not None:
            if self._window_start is None:
                self._window_start = batch
            elif not self._window_start <= batch < self._window_start + self.window_batches:
                out += self.drain()
                self._window_start = batch
        # Warm-up batches are skipped by the server: never merged with calibrated ones.
        per_batch = batch is not None and (not self._across[item.kind] or batch < self._warmup)
        key = (item.kind, item.fields.get("layer"), item.fields.get("module"),
               item.fields.get("tp_rank"), item.fields.get("tp_size"),
               batch if per_batch else None, item.chunk.dtype, tuple(item.chunk.shape[1:]),
               _form(item.chunk))
        pending = self._entries.get(key)
        if pending is None:
            if len(self._entries) >= self.max_entries:
                out += self.drain()
            item.first_batch = item.last_batch = batch
            self._entries[key] = item
            return out
        pending.chunk = merge_chunks(pending.chunk, item.chunk)
        pending.observations += 1
        self.merged += 1
        if batch is not None:
            pending.first_batch = min(pending.first_batch, batch)
            pending.last_batch = max(pending.last_batch, batch)
            pending.fields["batch"] = pending.first_batch
        return out

    def drain(self) -> List[Pending]:
        out = list(self._entries.values())
        self._entries.clear()
        self._window_start = None
        return out

    @property
    def pending(self) -> int:
        return len(self._entries)
