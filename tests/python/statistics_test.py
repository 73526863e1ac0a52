"""Statistics computed on the producer (no server): the minmax observers' forms (per-head and
per-16-column-group min/max) against numpy, and the local merging of statistics."""
import math

import numpy as np
import pytest
import torch

from caliper import _merge, _tensors
from caliper._pb import caliper_pb2 as pb

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def as_f32(x):
    return x.float().numpy() if isinstance(x, torch.Tensor) else x.astype(np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [16, 40, 7, 256, 33])
def test_group_statistics_equal_numpy(dtype, cols):
    rng = np.random.default_rng(cols)
    x = torch.from_numpy(rng.standard_normal((3, 5, cols)).astype(np.float32) * 4).to(dtype)
    x[1, 2, cols - 1] = 1e4 if dtype != torch.float16 else 6e4  # the last (short) group
    ref = as_f32(x).reshape(-1, cols)
    groups = math.ceil(cols / 16)
    want_lo = [ref[:, g * 16:(g + 1) * 16].min() for g in range(groups)]
    want_hi = [ref[:, g * 16:(g + 1) * 16].max() for g in range(groups)]
    name = _tensors.dtype_name(x, "x")
    for source in (x, x.transpose(0, 1)):  # a non-contiguous view too
        got = _tensors.group_statistics(_tensors.flatten_rows(source), name, "x")
        assert got.group_min == want_lo and got.group_max == want_hi
        assert got.shape == [15, cols] and got.min is None and got.absmax is None
    if dtype == torch.float32:  # numpy arrays take the numpy path
        got = _tensors.group_statistics(ref, "F32", "x")
        assert got.group_min == want_lo and got.group_max == want_hi


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_minmax_statistics_equal_numpy(dtype):
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.standard_normal((20, 4, 32)).astype(np.float32)).to(dtype)
    x[:, 2] -= 3
    ref = as_f32(x)
    got = _tensors.kv_minmax_statistics(x, _tensors.dtype_name(x, "k"), "k")
    assert got.head_min == ref.min(axis=(0, 2)).tolist()
    assert got.head_max == ref.max(axis=(0, 2)).tolist()
    assert got.absmax is None
    got = _tensors.kv_minmax_statistics(ref, "F32", "k")
    assert got.head_min == ref.min(axis=(0, 2)).tolist()
    empty = _tensors.kv_minmax_statistics(x[:0], "F32", "k")
    assert empty.head_min == [math.inf] * 4 and empty.head_max == [-math.inf] * 4
    merged = _merge.merge_chunks(empty, got)  # the empty range's seeds merge away
    assert merged.head_min == got.head_min and merged.head_max == got.head_max
    assert merged.shape == [20, 4, 32]


def test_nan_refused_naming_group_and_head():
    x = torch.ones(4, 40)
    x[2, 35] = float("nan")
    with pytest.raises(_tensors.TensorError, match="x: NaN or Inf in column group 2"):
        _tensors.group_statistics(x, "F32", "x")
    k = torch.ones(3, 2, 8)
    k[0, 1, 0] = float("-inf")
    with pytest.raises(_tensors.TensorError, match="k: NaN or Inf in kv head 1"):
        _tensors.kv_minmax_statistics(k, "F32", "k")
    with pytest.raises(_tensors.TensorError, match="has no elements"):
        _tensors.group_statistics(torch.ones(0, 16), "F32", "x")


def test_merge_chunks_elementwise_and_signed_zero():
    a = _tensors.Chunk("BF16", [3, 2, 4], absmax=[1.0, 5.0])
    b = _tensors.Chunk("BF16", [5, 2, 4], absmax=[2.0, 0.5])
    m = _merge.merge_chunks(a, b)
    assert m.shape == [8, 2, 4] and m.absmax == [2.0, 5.0]
    a = _tensors.Chunk("F32", [2, 8], min=0.0, max=-0.0)
    b = _tensors.Chunk("F32", [1, 8], min=-0.0, max=0.0)
    m = _merge.merge_chunks(a, b)
    assert math.copysign(1, m.min) < 0 and math.copysign(1, m.max) > 0  # -0 below +0
    a = _tensors.Chunk("F32", [2, 20], group_min=[-1.0, -3.0], group_max=[1.0, 2.0])
    b = _tensors.Chunk("F32", [1, 20], group_min=[-2.0, -1.0], group_max=[0.5, 4.0])
    m = _merge.merge_chunks(a, b)
    assert m.group_min == [-2.0, -3.0] and m.group_max == [1.0, 4.0] and m.shape == [3, 20]


def test_merge_chunks_merges_histograms_exactly():
    from caliper import _histogram
    rng = np.random.default_rng(9)
    x = torch.from_numpy(rng.standard_normal((30, 2, 8)).astype(np.float32))
    a = _tensors.kv_statistics(x[:10], "F32", "k", histograms=True)
    b = _tensors.kv_statistics(x[10:], "F32", "k", histograms=True)
    whole = _tensors.kv_statistics(x, "F32", "k", histograms=True)
    m = _merge.merge_chunks(a, b)
    assert m.absmax == whole.absmax
    for got, want in zip(m.histograms, whole.histograms):
        assert np.array_equal(got.counts, want.counts) and got.max_count == want.max_count
        assert got.max == want.max
    assert isinstance(m.histograms[0], _histogram.Histogram)


def recipe(**kw):
    return pb.Recipe(kv=pb.KV_PER_HEAD, nvfp4_activations=True, nvfp4_weights=True, **kw)


def kv_item(layer, batch, absmax, tokens=4, kind=pb.KEY):
    return _merge.Pending(kind, dict(layer=layer, tp_rank=0, tp_size=1, batch=batch),
                          _tensors.Chunk("F32", [tokens, 2, 8], absmax=list(absmax)),
                          f"layer {layer} key", batch, batch)


def input_item(module, batch, lo, hi, rows=3):
    return _merge.Pending(pb.INPUT_ACTIVATION, dict(module=module, tp_rank=0, tp_size=1,
                                                    batch=batch),
                          _tensors.Chunk("F32", [rows, 16], min=lo, max=hi),
                          f"{module} input", batch, batch)


def test_merger_window_static_observers():
    m = _merge.Merger(recipe(), window_batches=4, max_entries=100)
    out = []
    for b in range(10):
        out += m.add(kv_item(0, b, [b, 10 - b]))
        out += m.add(input_item("q", b, -b, b))
    out += m.drain()
    # Windows [0, 4), [4, 8), [8, 10): one K statistic each; inputs stay per batch (the
    # server keeps them per batch), sent with their window.
    keys = [(p.fields["batch"], p.first_batch, p.last_batch, p.observations)
            for p in out if p.kind == pb.KEY]
    assert keys == [(0, 0, 3, 4), (4, 4, 7, 4), (8, 8, 9, 2)]
    inputs = [(p.fields["batch"], p.observations) for p in out if p.kind == pb.INPUT_ACTIVATION]
    assert inputs == [(b, 1) for b in range(10)]
    assert [p.kind for p in out[:5]] == [pb.KEY] + [pb.INPUT_ACTIVATION] * 4  # window order
    assert out[0].chunk.absmax == [3, 10] and out[0].chunk.shape == [16, 2, 8]
    assert out[0].description == "layer 0 key batches 0..3 (4 observations merged)"
    assert m.pending == 0 and m.merged == 7
    # Pieces of one batch's input merge.
    m = _merge.Merger(recipe(), window_batches=4, max_entries=100)
    for lo, hi in ((-1, 2), (-3, 1)):
        assert m.add(input_item("q", 0, lo, hi)) == []
    (p,) = m.drain()
    assert (p.chunk.min, p.chunk.max, p.chunk.shape, p.observations) == (-3, 2, [6, 16], 2)


def test_merger_keeps_batches_apart_for_moving_average_and_warmup():
    m = _merge.Merger(recipe(kv_observer=pb.KV_OBSERVER_MINMAX, activation_observer=pb.MINMAX,
                             warmup_batches=0), window_batches=8, max_entries=100)
    out = []
    for b in range(3):
        for _ in range(2):  # two pieces of each batch: merged within the batch
            out += m.add(kv_item(1, b, [1, 1]))
            out += m.add(input_item("q", b, -1, 1))
    out += m.drain()
    assert sorted((p.kind, p.fields["batch"], p.observations) for p in out) == sorted(
        [(pb.KEY, b, 2) for b in range(3)] + [(pb.INPUT_ACTIVATION, b, 2) for b in range(3)])
    # Static observer with warm-up: warm-up batches each alone, the rest merged.
    m = _merge.Merger(recipe(warmup_batches=2), window_batches=8, max_entries=100)
    out = []
    for b in range(5):
        out += m.add(kv_item(0, b, [b, b]))
    out += m.drain()
    assert [(p.fields["batch"], p.observations) for p in out] == [(0, 1), (1, 1), (2, 3)]


def test_merger_bounds_and_what_it_never_merges():
    m = _merge.Merger(recipe(), window_batches=100, max_entries=2)
    out = []
    for layer in range(5):
        out += m.add(kv_item(layer, 0, [1, 1]))
    assert len(out) == 4 and m.pending == 1  # drained each time two were pending
    # Different tp placement, dtype or trailing shape: separate statistics.
    m = _merge.Merger(recipe(), window_batches=100, max_entries=100)
    a = kv_item(0, 0, [1, 1])
    b = kv_item(0, 0, [1, 1])
    b.fields["tp_size"] = 2
    c = kv_item(0, 0, [1, 1])
    c.chunk.dtype = "BF16"
    for item in (a, b, c):
        assert m.add(item) == []
    assert m.pending == 3
    # Off: merge_batches 0, raw chunks.
    m = _merge.Merger(recipe(), window_batches=0, max_entries=100)
    item = kv_item(0, 0, [1, 1])
    assert m.add(item) == [item]
    # Histogram observers keep batches apart (merged within one).
    m = _merge.Merger(recipe(kv_observer=pb.KV_OBSERVER_MSE), window_batches=4, max_entries=100)
    for b in (0, 0, 1):
        assert m.add(kv_item(0, b, [1, 1])) == []
    assert [p.observations for p in m.drain()] == [2, 1]
    m = _merge.Merger(recipe(), window_batches=4, max_entries=100)
    raw = _merge.Pending(pb.KEY, dict(layer=0, tp_rank=0, tp_size=1, batch=0),
                         _tensors.Chunk("F32", [1, 2, 8], data=b"\0" * 64), "layer 0 key", 0, 0)
    assert m.add(raw) == [raw]


def test_recipe_kv_observer_and_compat():
    import caliper
    p = caliper.Recipe(kv_observer="minmax", compat="llm-compressor").to_proto()
    assert p.kv_observer == pb.KV_OBSERVER_MINMAX and p.compat == pb.COMPAT_LLM_COMPRESSOR
    p = caliper.Recipe(kv_observer="percentile:99.9").to_proto()
    assert p.kv_observer == pb.KV_OBSERVER_PERCENTILE and p.kv_percentile == 99.9
    assert caliper.Recipe().to_proto().kv_observer == pb.KV_OBSERVER_UNSPECIFIED
    for bad, field in ((dict(kv_observer="ema"), "recipe.kv_observer"),
                       (dict(kv_observer="minmax:3"), "recipe.kv_observer"),
                       (dict(kv_observer="percentile:x"), "recipe.kv_observer"),
                       (dict(compat="vllm"), "recipe.compat")):
        with pytest.raises(ValueError, match=field):
            caliper.Recipe(**bad).to_proto()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_statistics_on_cuda_equal_cpu(dtype):
    """Reduced where the tensor lives: a CUDA tensor's statistics equal the CPU ones."""
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.standard_normal((9, 4, 40)).astype(np.float32)).to(dtype)
    name = _tensors.dtype_name(x, "x")
    for fn, arg in ((_tensors.group_statistics, _tensors.flatten_rows(x)),
                    (_tensors.kv_minmax_statistics, x), (_tensors.kv_statistics, x),
                    (_tensors.range_statistics, x)):
        assert fn(arg.cuda(), name, "x") == fn(arg, name, "x"), fn.__name__
