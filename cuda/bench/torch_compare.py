"""Benchmark 4b: PyTorch's x.abs().amax(dim=(0, 2)) on a [tokens, heads, dim] BF16 tensor, timed
like cuda_kernel_bench (median of CUDA-event-timed runs). Prints one RESULT line."""
import argparse

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    x = torch.randn(a.tokens, a.heads, a.dim, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        x.abs().amax(dim=(0, 2))
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y = x.abs().amax(dim=(0, 2))
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    ms = times[len(times) // 2]
    nbytes = x.numel() * x.element_size()
    print(f"RESULT name=torch_abs_amax_bf16 ms={ms:.4f} gbps={nbytes / ms / 1e6:.1f} heads_out={y.numel()}")


if __name__ == "__main__":
    main()
