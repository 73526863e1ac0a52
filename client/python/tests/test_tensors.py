"""Tensors a session takes (numpy here; torch in tests/python), refused ones named, and the
Handle both capture hooks return."""
import numpy as np
import pytest

import caliper
from caliper import _tensors


def test_dtypes_pass_unconverted_or_are_refused():
    assert _tensors.dtype_name(np.zeros(2, np.float32), "x") == "F32"
    assert _tensors.dtype_name(np.zeros(2, np.float16), "x") == "F16"
    with pytest.raises(caliper.TensorError, match=r"x.dtype: expected bfloat16, float16 or "
                                                  r"float32, got float64"):
        _tensors.dtype_name(np.zeros(2), "x")
    with pytest.raises(caliper.TensorError, match="x.dtype: big-endian float32"):
        _tensors.dtype_name(np.zeros(2, ">f4"), "x")
    with pytest.raises(caliper.TensorError, match="x: expected a torch.Tensor or numpy.ndarray"):
        _tensors.dtype_name([1.0], "x")


def test_kv_statistics_are_per_head_absmax():
    k = np.zeros((3, 2, 4), np.float32)
    k[1, 0, 2] = -5.0
    k[2, 1, 3] = 0.25
    chunk = _tensors.kv_statistics(k, "F32", "observe_kv: key")
    assert chunk.absmax == [5.0, 0.25]
    assert chunk.data is None and chunk.shape == [3, 2, 4]


def test_non_finite_values_are_refused_in_statistics_mode():
    k = np.ones((2, 1, 4), np.float32)
    k[0, 0, 1] = np.inf
    with pytest.raises(caliper.TensorError, match="observe_kv: key"):
        _tensors.kv_statistics(k, "F32", "observe_kv: key")


def test_raw_chunks_split_whole_rows():
    x = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    chunks = _tensors.raw_chunks(x, "F32", chunk_bytes=3 * 16)
    assert [c.shape for c in chunks] == [[3, 4], [3, 4], [2, 4]]
    assert b"".join(bytes(c.data) for c in chunks) == x.tobytes()


def test_handle_detaches_once_and_as_a_context_manager():
    removed = []
    with caliper.Handle(first_batch=3) as handle:
        handle._removers += [lambda: removed.append("a"), lambda: removed.append("b")]
        assert handle.batch == 3 and handle.enabled
    assert removed == ["b", "a"]
    handle.detach()
    assert removed == ["b", "a"]
