"""|x| histograms on the producer (statistics mode of sessions that keep histograms).

The bins are the server's MagnitudeHistogram (core/tensor/magnitude_histogram.h, docs/observers.md),
read from the same bits: slot = (f32 bits of |x|) >> 16 minus a bias, i.e. the exponent and the top
7 mantissa bits (128 bins per octave over [2^-32, 2^32)), slot 0 exact zeros, slot 1 below 2^-32,
the last slot 2^32 and above. BF16 and F16 convert to F32 exactly, so one rule serves every dtype.
Counts are computed where the tensor lives (torch: on its device, with bincount) and only the
counts come to the host; the wire carries the nonzero slots only (HistogramStatistics).
"""
from __future__ import annotations

import dataclasses
from typing import Any, List

import numpy as np

from ._pb import caliper_pb2 as pb

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - exercised without the torch extra
    torch = None

MANTISSA_BITS = 7
SHIFT = 23 - MANTISSA_BITS              # 16
BIAS = (127 - 32) << MANTISSA_BITS      # first log bin starts at 2^-32
LOG_BINS = 64 << MANTISSA_BITS          # [2^-32, 2^32): 8192 bins
ZERO_SLOT, UNDERFLOW_SLOT, FIRST_LOG_SLOT = 0, 1, 2
OVERFLOW_SLOT = FIRST_LOG_SLOT + LOG_BINS
SLOTS = OVERFLOW_SLOT + 1               # 8195
_BLOCK = 1 << 24                        # elements per bincount pass (bounds temporary memory)

# Observers whose scale comes from a histogram (Recipe::NeedsHistograms in core/session/session.h).
_KV_HISTOGRAM_OBSERVERS = (pb.KV_OBSERVER_PERCENTILE, pb.KV_OBSERVER_MSE)
_INPUT_HISTOGRAM_OBSERVERS = (pb.PERCENTILE, pb.MSE)


@dataclasses.dataclass
class Histogram:
    """One head's (or one tensor's) histogram: counts per slot (SLOTS int64), the exact max |x|
    (not sent: the server takes the chunk's absmax or min/max) and how many elements equal it."""
    counts: np.ndarray
    max_count: int
    max: float = 0.0

    def merge(self, other: Histogram) -> Histogram:
        """Exact, order-independent (as MagnitudeHistogram::Merge): for producers that merge
        chunks locally before sending."""
        if other.max_count == 0:
            return Histogram(self.counts.copy(), self.max_count, self.max)
        if self.max_count == 0 or other.max > self.max:
            return Histogram(self.counts + other.counts, other.max_count, other.max)
        count = self.max_count + (other.max_count if other.max == self.max else 0)
        return Histogram(self.counts + other.counts, count, self.max)

    def sparse(self):
        """(slot_gaps, counts) of the nonzero slots, as HistogramStatistics carries them."""
        slots = np.flatnonzero(self.counts)
        gaps = np.diff(slots, prepend=-1) - 1
        return gaps.tolist(), self.counts[slots].tolist()


def recipe_needs_histograms(recipe: Any) -> bool:
    """Whether a session with this pb.Recipe keeps histograms (then statistics must carry them)."""
    return (bool(recipe.histograms) or recipe.kv_observer in _KV_HISTOGRAM_OBSERVERS
            or recipe.activation_observer in _INPUT_HISTOGRAM_OBSERVERS)


def _slots_torch(a: Any) -> Any:
    """Slots of |x| values `a` (float32 tensor, non-negative), as int32 (a zero's bits are 0:
    the clamp puts it in the underflow slot, the subtraction moves it to the zero slot)."""
    bits = a.view(torch.int32)
    slot = torch.clamp((bits >> SHIFT) - (BIAS - FIRST_LOG_SLOT), UNDERFLOW_SLOT, OVERFLOW_SLOT)
    return slot - (bits == 0).int()


def _slots_numpy(a: np.ndarray) -> np.ndarray:
    bits = a.view(np.int32)
    slot = np.clip((bits >> SHIFT) - (BIAS - FIRST_LOG_SLOT), UNDERFLOW_SLOT, OVERFLOW_SLOT)
    return slot - (bits == 0)


def _per_head(x: Any) -> List[Histogram]:
    """Histograms of each head of x [tokens, heads, dim] over tokens and dim."""
    tokens, heads = int(x.shape[0]), int(x.shape[1])
    per_token = max(1, int(np.prod(x.shape[1:])))
    step = max(1, _BLOCK // per_token)
    if isinstance(x, np.ndarray):
        counts = np.zeros((heads, SLOTS), np.int64)
        amax = np.zeros(heads, np.float32)
        amax_count = np.zeros(heads, np.int64)
        offset = (np.arange(heads, dtype=np.int32) * SLOTS).reshape(1, heads, 1)
        for t in range(0, tokens, step):
            a = np.abs(np.asarray(x[t:t + step]).astype(np.float32))
            idx = _slots_numpy(a) + offset
            counts += np.bincount(idx.reshape(-1), minlength=heads * SLOTS).reshape(heads, SLOTS)
            block_max = a.max(axis=(0, 2))
            block_count = (a == block_max.reshape(1, heads, 1)).sum(axis=(0, 2))
            _fold_max(block_max, block_count, amax, amax_count)
        return [Histogram(counts[h], int(amax_count[h]), float(amax[h])) for h in range(heads)]
    x = x.detach()
    counts = torch.zeros(heads * SLOTS, dtype=torch.int64, device=x.device)
    amax = torch.zeros(heads, dtype=torch.float32, device=x.device)
    amax_count = torch.zeros(heads, dtype=torch.int64, device=x.device)
    offset = (torch.arange(heads, dtype=torch.int32, device=x.device) * SLOTS).view(1, heads, 1)
    for t in range(0, tokens, step):
        a = x[t:t + step].float().abs().contiguous()
        idx = _slots_torch(a) + offset
        counts += torch.bincount(idx.reshape(-1), minlength=heads * SLOTS)
        block_max = a.amax(dim=(0, 2))
        block_count = (a == block_max.view(1, heads, 1)).sum(dim=(0, 2))
        # (max, count) pairs fold as MergeMaxCount does: larger max wins, equal maxima add.
        amax_count = torch.where(block_max > amax, block_count,
                                 torch.where(block_max == amax, amax_count + block_count,
                                             amax_count))
        amax = torch.maximum(amax, block_max)
    counts = counts.view(heads, SLOTS).cpu().numpy()
    amax_count, amax = amax_count.cpu().tolist(), amax.cpu().tolist()
    return [Histogram(counts[h], int(amax_count[h]), float(amax[h])) for h in range(heads)]


def _fold_max(block_max, block_count, amax, amax_count) -> None:
    greater, equal = block_max > amax, block_max == amax
    amax_count[:] = np.where(greater, block_count, np.where(equal, amax_count + block_count,
                                                            amax_count))
    amax[:] = np.maximum(amax, block_max)


def kv_histograms(x: Any) -> List[Histogram]:
    """One histogram per head of K/V x [tokens, heads, head_dim] (tokens may be 0)."""
    if int(x.shape[0]) == 0:
        return [Histogram(np.zeros(SLOTS, np.int64), 0) for _ in range(int(x.shape[1]))]
    return _per_head(x)


def tensor_histogram(x: Any) -> Histogram:
    """The histogram of every element of x (an input activation)."""
    flat = x.reshape(-1, 1, 1)
    if int(flat.shape[0]) == 0:
        return Histogram(np.zeros(SLOTS, np.int64), 0)
    return _per_head(flat)[0]


def to_proto(statistics: Any, histograms: List[Histogram]) -> None:
    """Appends `histograms` to a pb.ChunkStatistics (an empty head still gets its entry)."""
    for hist in histograms:
        entry = statistics.histograms.add()
        gaps, counts = hist.sparse()
        entry.slot_gaps.extend(gaps)
        entry.counts.extend(counts)
        entry.max_count = hist.max_count
