"""Tensors handed to a Session: torch (any device) or numpy, checked and turned into chunks.

Nothing here converts a dtype: BF16, F16 and F32 go out as they are, anything else is refused.
K/V come as [tokens, kv_heads, head_dim], [batch, kv_heads, seq, head_dim] (the layout
transformers and llm-compressor hand to the KV cache) or flattened [tokens, kv_heads * head_dim];
they are sent as [tokens, kv_heads, head_dim]. Statistics are computed where the tensor lives
(GPU tensors on the GPU) and only the few resulting floats are copied to the host.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, List, Optional, Sequence

import numpy as np

from . import _histogram

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - exercised without the torch extra
    torch = None

_TORCH_DTYPES = {}
if torch is not None:
    _TORCH_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}


class TensorError(ValueError):
    """A tensor the session cannot take; the message names the argument and the field."""


def torch_tensor_type() -> tuple:
    """(torch.Tensor,) when torch is installed, else () (isinstance is then always False)."""
    return (torch.Tensor,) if torch is not None else ()


def is_torch(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def dtype_name(x: Any, where: str) -> str:
    if is_torch(x):
        name = _TORCH_DTYPES.get(x.dtype)
        got = str(x.dtype)
    elif isinstance(x, np.ndarray):
        got = x.dtype.name
        name = {"float16": "F16", "float32": "F32", "bfloat16": "BF16"}.get(got)
        if name is not None and x.dtype.byteorder == ">":
            raise TensorError(f"{where}.dtype: big-endian {got}; the wire carries little-endian")
    else:
        raise TensorError(f"{where}: expected a torch.Tensor or numpy.ndarray, got "
                          f"{type(x).__name__}")
    if name is None:
        raise TensorError(f"{where}.dtype: expected bfloat16, float16 or float32, got {got} "
                          "(caliper never converts dtypes; convert it yourself if you mean to)")
    return name


@dataclasses.dataclass
class Chunk:
    """One TensorChunk's payload: raw bytes or a statistic, and the shape it stands for."""
    dtype: str
    shape: List[int]
    data: Optional[bytes] = None          # raw mode
    absmax: Optional[List[float]] = None  # statistics mode, K/V: per local head
    min: Optional[float] = None           # statistics mode, weights and inputs
    max: Optional[float] = None
    head_min: Optional[List[float]] = None   # K/V per local head, for the minmax KV observer
    head_max: Optional[List[float]] = None
    group_min: Optional[List[float]] = None  # inputs per 16-column group, minmax observer
    group_max: Optional[List[float]] = None
    histograms: Optional[List[_histogram.Histogram]] = None  # statistics, histogram sessions
    first_row: int = 0

    @property
    def tensor_bytes(self) -> int:
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]


def kv_view(x: Any, where: str, heads: int, head_dim: int, heads_note: str,
            what: str = "kv_heads"):
    """x as [tokens, heads, head_dim] (a view where possible; 4-D input is transposed)."""
    shape = list(x.shape)
    if len(shape) == 4:
        if shape[1] != heads or shape[3] != head_dim:
            raise TensorError(f"{where}.shape: {shape} is not [batch, {heads} {what}, seq, "
                              f"{head_dim} head_dim]{heads_note}")
        x = x.transpose(1, 2) if is_torch(x) else x.transpose(0, 2, 1, 3)
        return x.reshape(-1, heads, head_dim)
    if len(shape) == 3:
        if shape[1] != heads or shape[2] != head_dim:
            raise TensorError(f"{where}.shape: {shape} is not [tokens, {heads} {what}, "
                              f"{head_dim} head_dim]{heads_note}")
        return x
    if len(shape) == 2:
        if shape[1] != heads * head_dim:
            raise TensorError(f"{where}.shape: {shape} is not [tokens, {heads * head_dim}] "
                              f"({heads} {what} x {head_dim} head_dim{heads_note.strip(' ;()')})")
        return x.reshape(-1, heads, head_dim)
    raise TensorError(f"{where}.shape: {shape}: expected 2, 3 or 4 dimensions")


def _host_bytes(x: Any) -> memoryview:
    """The elements of x, row-major little-endian, copied to host memory the caller owns."""
    if is_torch(x):
        x = x.detach()
        if x.device.type != "cpu":
            x = x.to("cpu")
        x = x.contiguous()
        if x.dtype == torch.bfloat16:
            x = x.view(torch.int16)
        return memoryview(x.numpy().tobytes())
    return memoryview(np.ascontiguousarray(x).tobytes())


def raw_chunks(x: Any, dtype: str, chunk_bytes: int) -> List[Chunk]:
    """x split along dim 0 into pieces of at most chunk_bytes (at least one row each), as the
    CLI splits dump tensors (client/tensor_stream.cc)."""
    shape = [int(d) for d in x.shape]
    data = _host_bytes(x)
    rows = shape[0] if shape else 0
    if len(shape) < 2 or rows <= 1 or len(data) <= chunk_bytes:
        return [Chunk(dtype, shape, data=bytes(data))]
    row_bytes = len(data) // rows
    per = max(1, chunk_bytes // max(row_bytes, 1))
    out = []
    for row in range(0, rows, per):
        count = min(per, rows - row)
        out.append(Chunk(dtype, [count] + shape[1:],
                         data=bytes(data[row * row_bytes:(row + count) * row_bytes]),
                         first_row=row))
    return out


def kv_statistics(x: Any, dtype: str, where: str, histograms: bool = False) -> Chunk:
    """Per-head absmax of [tokens, heads, head_dim], reduced on x's device."""
    shape = [int(d) for d in x.shape]
    if is_torch(x):
        x = x.detach()
        if shape[0] == 0:
            absmax = [0.0] * shape[1]
        else:
            absmax = x.abs().amax(dim=(0, 2)).float().cpu().tolist()
    else:
        absmax = (np.abs(x).max(axis=(0, 2)).astype(np.float32).tolist() if shape[0]
                  else [0.0] * shape[1])
    for head, value in enumerate(absmax):
        if not math.isfinite(value):
            raise TensorError(f"{where}: NaN or Inf in kv head {head} (the whole tensor is "
                              "refused; nothing of it was sent)")
    return Chunk(dtype, shape, absmax=absmax,
                 histograms=_histogram.kv_histograms(x) if histograms else None)


def _check_finite(values: List[float], where: str, what: str) -> None:
    for i, value in enumerate(values):
        if not math.isfinite(value):
            raise TensorError(f"{where}: NaN or Inf in {what} {i} (the whole tensor is refused; "
                              "nothing of it was sent)")


def kv_minmax_statistics(x: Any, dtype: str, where: str, histograms: bool = False) -> Chunk:
    """Per-head min and max of [tokens, heads, head_dim] (the minmax KV observer's form)."""
    shape = [int(d) for d in x.shape]
    hists = _histogram.kv_histograms(x) if histograms else None
    if shape[0] == 0:  # nothing observed: the empty range's seeds, as the server expects
        return Chunk(dtype, shape, head_min=[math.inf] * shape[1],
                     head_max=[-math.inf] * shape[1], histograms=hists)
    if is_torch(x):
        x = x.detach()
        lo = x.amin(dim=(0, 2)).float().cpu().tolist()
        hi = x.amax(dim=(0, 2)).float().cpu().tolist()
    else:
        lo = np.min(x, axis=(0, 2)).astype(np.float32).tolist()
        hi = np.max(x, axis=(0, 2)).astype(np.float32).tolist()
    _check_finite(lo, where, "kv head")
    _check_finite(hi, where, "kv head")
    return Chunk(dtype, shape, head_min=lo, head_max=hi, histograms=hists)


GROUP_COLUMNS = 16  # the minmax activation observer's group (llm-compressor's NVFP4 group)


def group_statistics(x: Any, dtype: str, where: str, histograms: bool = False) -> Chunk:
    """Min and max per group of 16 consecutive columns of the last dimension (the last group
    may be shorter) over every other dimension, of [rows, features]."""
    shape = [int(d) for d in x.shape]
    if math.prod(shape) == 0:
        raise TensorError(f"{where}.shape: {shape} has no elements")
    cols = shape[-1]
    full = cols // GROUP_COLUMNS * GROUP_COLUMNS
    if is_torch(x):
        rows = x.detach().reshape(-1, cols)
        col_lo, col_hi = rows.amin(dim=0), rows.amax(dim=0)  # exact: min/max of elements
        lo = col_lo[:full].reshape(-1, GROUP_COLUMNS).amin(dim=1)
        hi = col_hi[:full].reshape(-1, GROUP_COLUMNS).amax(dim=1)
        if full < cols:
            lo = torch.cat([lo, col_lo[full:].amin().reshape(1)])
            hi = torch.cat([hi, col_hi[full:].amax().reshape(1)])
        lo, hi = lo.float().cpu().tolist(), hi.float().cpu().tolist()
    else:
        rows = np.asarray(x).reshape(-1, cols)
        # float32 holds every bf16/f16/f32 value exactly: the minima are the same.
        col_lo = rows.min(axis=0).astype(np.float32)
        col_hi = rows.max(axis=0).astype(np.float32)
        lo = [float(col_lo[i:i + GROUP_COLUMNS].min()) for i in range(0, cols, GROUP_COLUMNS)]
        hi = [float(col_hi[i:i + GROUP_COLUMNS].max()) for i in range(0, cols, GROUP_COLUMNS)]
    _check_finite(lo, where, "column group")
    _check_finite(hi, where, "column group")
    return Chunk(dtype, shape, group_min=lo, group_max=hi,
                 histograms=[_histogram.tensor_histogram(x)] if histograms else None)


def range_statistics(x: Any, dtype: str, where: str, histograms: bool = False) -> Chunk:
    """Min and max of the whole tensor, reduced on x's device."""
    shape = [int(d) for d in x.shape]
    if math.prod(shape) == 0:
        raise TensorError(f"{where}.shape: {shape} has no elements")
    if is_torch(x):
        lo, hi = torch.aminmax(x.detach())
        lo, hi = float(lo), float(hi)
    else:
        lo, hi = float(np.min(x)), float(np.max(x))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise TensorError(f"{where}: NaN or Inf in the tensor (the whole tensor is refused; "
                          "nothing of it was sent)")
    return Chunk(dtype, shape, min=lo, max=hi,
                 histograms=[_histogram.tensor_histogram(x)] if histograms else None)


def flatten_rows(x: Any) -> Any:
    """Activations [..., features] as [rows, features]."""
    if len(x.shape) <= 2:
        return x
    return x.reshape(-1, x.shape[-1])


def check_weight(w: Any, where: str) -> None:
    if len(w.shape) != 2:
        raise TensorError(f"{where}.shape: {list(w.shape)}: a Linear weight is 2-D [out, in]")


def check_tp(tp_rank: int, tp_size: int, where: str) -> None:
    if tp_size < 1:
        raise TensorError(f"{where}: tp_size must be >= 1, got {tp_size}")
    if not 0 <= tp_rank < tp_size:
        raise TensorError(f"{where}: tp_rank {tp_rank} is outside [0, tp_size={tp_size})")


def local_kv_heads(num_kv_heads: int, tp_size: int, where: str) -> int:
    if tp_size <= num_kv_heads:
        if num_kv_heads % tp_size:
            raise TensorError(f"{where}: tp_size {tp_size} does not divide the model's "
                              f"{num_kv_heads} KV heads")
        return num_kv_heads // tp_size
    if tp_size % num_kv_heads:
        raise TensorError(f"{where}: the model's {num_kv_heads} KV heads do not divide "
                          f"tp_size {tp_size}")
    return 1


def shape_list(shape: Sequence[int]) -> List[int]:
    return [int(d) for d in shape]
