"""How vLLM's CPU build rounds K/V into its FP8 cache, against scripts/tiny_llama.py's to_fp8.

vLLM's CPU attention stores K/V with `cpu_attn_reshape_and_cache` (ISA "vec", the AVX-512 path).
Measured here: x / scale saturated at +-448 and rounded toward zero (not to nearest even, as
torch's cast and CUDA's conversion do), NaN and Inf stored as +-448. The accuracy evidence
(bench/kv_vllm_evidence_bench.py) simulates the engine with to_fp8(..., "toward_zero"); this
test fails when vLLM's conversion stops being that, so the evidence's simulation stays honest.
Needs x86 with AVX-512 or AMX (vLLM's CPU FP8 KV cache); exits 77 (skipped) elsewhere.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
sys.path.insert(0, HERE)
import tiny_llama  # noqa: E402
from peer_report import skip_all  # noqa: E402
from vllm_engine_load_test import fp8_kv_cache_missing  # noqa: E402

HEADS, HEAD_SIZE, BLOCK = 2, 32, 32


def stored(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What vLLM's CPU cache holds for V = x (float32, numel a multiple of HEADS * HEAD_SIZE *
    BLOCK), read back as float. The vec ISA lays a block out as [head][K: dim x token | V: token x
    dim]; V is read, K is written transposed."""
    from vllm import _custom_ops as ops
    tokens = x.numel() // (HEADS * HEAD_SIZE)
    value = x.reshape(tokens, HEADS, HEAD_SIZE).contiguous()
    blocks = tokens // BLOCK
    cache = torch.zeros(blocks, HEADS, 2 * BLOCK, HEAD_SIZE, dtype=torch.uint8)
    key_cache, value_cache = cache.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(torch.zeros_like(value), value, key_cache, value_cache,
                                   torch.arange(tokens), "vec", k_scale=1.0, v_scale=scale,
                                   kv_cache_dtype="fp8")
    raw = cache.reshape(blocks, HEADS, 2, BLOCK, HEAD_SIZE)[:, :, 1]  # [block, head, token, dim]
    return (raw.permute(0, 2, 1, 3).reshape(tokens, HEADS, HEAD_SIZE).contiguous()
            .view(torch.float8_e4m3fn).float().reshape(-1))


def main() -> int:
    missing = fp8_kv_cache_missing()
    if missing:
        return skip_all(missing, "how vLLM's CPU FP8 KV cache rounds")
    n = HEADS * HEAD_SIZE * BLOCK * 64
    g = torch.Generator().manual_seed(7)
    # Every E4M3 value exactly (its own code must come back: this checks the layout read).
    exact = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    exact = exact.float()
    exact = exact[torch.isfinite(exact)]
    exact = torch.cat([exact, torch.zeros(n - exact.numel())])
    got = stored(exact, 1.0)
    assert torch.equal(got, exact), "exactly representable values changed: layout read wrong"
    # Random magnitudes over the whole range (subnormals to saturation), two scales.
    x = ((torch.rand(n, generator=g) * 2 - 1)
         * torch.exp2(torch.randint(-12, 10, (n,), generator=g).float()))
    for scale in (1.0, 0.37):
        got = stored(x, scale)
        toward_zero = tiny_llama.to_fp8(x / scale, "toward_zero").float()
        nearest = tiny_llama.to_fp8(x / scale, "nearest").float()
        wrong = int((got != toward_zero).sum())
        assert wrong == 0, (f"scale {scale}: {wrong} of {n} values differ from round toward zero, "
                            f"e.g. {x[(got != toward_zero)][:3].tolist()}")
        differs = float((toward_zero != nearest).float().mean())
        assert differs > 0.3, f"too few values tell the rounding modes apart ({differs:.2f})"
        print(f"scale {scale}: {n} values stored rounded toward zero (nearest even would differ "
              f"on {differs:.1%}), saturated at +-448")
    specials = torch.tensor([447.0, 449.0, 1e4, -1e4, float("inf"), float("-inf"), float("nan")])
    got = stored(torch.cat([specials, torch.zeros(n - specials.numel())]), 1.0)[:7]
    assert got.tolist() == [416.0, 448.0, 448.0, -448.0, 448.0, -448.0, 448.0], got.tolist()
    print("447 -> 416, 449 and 1e4 -> 448, +-inf -> +-448, NaN -> 448 (not NaN)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
