"""Benchmark 5: NVFP4 packing throughput, Caliper vs compressed-tensors' own compressor, same weights.

Both sides get the same bf16 weights and the same global scales. compressed-tensors: group scales
with calculate_qparams (what llm-compressor's observer step does) + NVFP4PackedCompressor.compress,
in process on CPU torch. Caliper: `caliper quantize` end to end (read the checkpoint, pack,
write the whole NVFP4 checkpoint), so its time includes the file I/O the other side skips.
Reports weight GB/s of each and the ratio (goal >= 10x). Same thread count on both sides.
usage: scripts/python-env.sh tools -> VENV; VENV/bin/python bench/nvfp4_pack_bench.py --caliper build/client/caliper
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--caliper", required=True)
    p.add_argument("--mib", type=int, default=256, help="bf16 weight MiB in total")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from safetensors.torch import save_file
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    rows, cols = 4096, 4096  # 32 MiB per bf16 tensor
    n = max(1, args.mib * 2**20 // (rows * cols * 2))
    g = torch.Generator().manual_seed(0)
    weights = {f"model.layers.{i}.mlp.down_proj.weight":
               (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16) for i in range(n)}
    gscales = {k: generate_gparam(w.min(), w.max()) for k, w in weights.items()}
    t0 = time.perf_counter()
    for k, w in weights.items():
        grouped = w.reshape(rows, cols // 16, 16)
        s, _ = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights,
                                 global_scale=gscales[k])
        NVFP4PackedCompressor.compress({"weight": w, "weight_scale": s,
                                        "weight_global_scale": gscales[k]}, scheme)
    ct_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "dense")
        os.makedirs(ckpt)
        save_file(weights, os.path.join(ckpt, "model.safetensors"), metadata={"format": "pt"})
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "num_hidden_layers": n, "num_attention_heads": 32, "hidden_size": 4096},
                  open(os.path.join(ckpt, "config.json"), "w"))
        scales = os.path.join(tmp, "scales.safetensors")
        save_file({k[:-7] + ".weight_global_scale": v.reshape(1) for k, v in gscales.items()},
                  scales, metadata={"format": "pt", "caliper.format": "compressed-tensors"})
        t0 = time.perf_counter()
        subprocess.run([args.caliper, "quantize", "--checkpoint", ckpt, "--scales", scales,
                        "--out", os.path.join(tmp, "q"), "--compat", "llm-compressor",
                        "--threads", str(args.threads), "--quiet"], check=True,
                       stdout=subprocess.DEVNULL)
        cal_s = time.perf_counter() - t0
    gb = sum(w.numel() * 2 for w in weights.values()) / 1e9
    print(json.dumps({"weights_GB": round(gb, 3), "threads": args.threads,
                      "compressed_tensors_GBps": round(gb / ct_s, 3),
                      "caliper_quantize_GBps": round(gb / cal_s, 3),
                      "ratio": round(ct_s / cal_s, 1)}))


if __name__ == "__main__":
    main()
