"""Engine load: vLLM's CPU build (0.32) loads Caliper's outputs and its attention layers hold
Caliper's exact K/V scales. Cases: compressed-tensors KV per tensor ([1]) and per head
([H, 1, 1]) merged into a dense checkpoint; ModelOpt KV scales (k_proj.k_scale) merged the same
way; a negative control (one scale changed in the checkpoint) that the check must flag.
usage: vllm_engine_load_test.py --caliper BIN   (run with the "vllm" venv)"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from tests.peers.peer_report import skip_all  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def build_dense(path):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    from tests.peers.peer_models import save_tokenizer
    save_tokenizer(path, 256)


def run(binary, *args):
    res = subprocess.run([binary, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"caliper {' '.join(args)}: {res.stderr}")


def vllm_scales(model_dir):
    """{layer index: (k_scale list, v_scale list)} as vLLM's attention layers hold them."""
    from vllm import LLM

    def read(model):
        out = {}
        for name, m in model.named_modules():
            if hasattr(m, "_k_scale") and hasattr(m, "_v_scale") and "layers." in name:
                layer = int(name.split("layers.")[1].split(".")[0])
                out[layer] = (m._k_scale.float().reshape(-1).tolist(),
                              m._v_scale.float().reshape(-1).tolist())
        return out

    llm = LLM(model=model_dir, kv_cache_dtype="fp8", enforce_eager=True, max_model_len=128,
              dtype="bfloat16")
    got = llm.apply_model(read)[0]
    del llm
    return got


def expected(scale_file, modelopt=False):
    t = load_file(scale_file)
    out = {}
    for name, v in t.items():
        if name.endswith(("k_scale", "v_scale")):
            layer = int(name.split("layers.")[1].split(".")[0])
            k, vv = out.get(layer, (None, None))
            vals = v.float().reshape(-1).tolist()
            out[layer] = (vals, vv) if name.endswith("k_scale") else (k, vals)
    return out


def same(got, want, per_head_reduced=False):
    for layer, (k, v) in want.items():
        if layer not in got:
            return False
        gk, gv = got[layer]
        if per_head_reduced:
            k, v = [max(k)], [max(v)]
        if gk != k and not (len(gk) == 1 and len(set(k)) == 1 and gk == k[:1]):
            return False
        if gv != v and not (len(gv) == 1 and len(set(v)) == 1 and gv == v[:1]):
            return False
    return True


def fp8_kv_cache_missing():
    """Why vLLM's CPU build cannot run an FP8 KV cache here ("" when it can): it needs x86 with
    AVX-512 or AMX (a CUDA device does too)."""
    if torch.cuda.is_available():
        return ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), []))
    except OSError as e:
        return f"cannot read /proc/cpuinfo ({e})"
    if flags & {"avx512f", "amx_tile"}:
        return ""
    return "this CPU has neither AVX-512 (avx512f) nor AMX (amx_tile), which vLLM's CPU FP8 KV cache needs"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--caliper", required=True)
    args = p.parse_args()
    missing = fp8_kv_cache_missing()
    if missing:
        # CTest's SKIP_RETURN_CODE: what this machine could not check is said, not passed.
        return skip_all(missing, "that vLLM's attention layers load Caliper's FP8 KV scales "
                        "(compressed-tensors and ModelOpt, per tensor and per head)")
    with tempfile.TemporaryDirectory() as tmp:
        dense = os.path.join(tmp, "dense")
        build_dense(dense)
        for granularity in ("tensor", "head"):
            # A compressed-tensors scale file with distinct values per layer (and head), which
            # Caliper re-renders in both engines' forms.
            src = os.path.join(tmp, f"src-{granularity}.safetensors")
            g = torch.Generator().manual_seed(5)
            shape = [] if granularity == "tensor" else [2]
            save_file({f"model.layers.{l}.self_attn.{kv}_scale":
                       (torch.rand(shape, generator=g) * 0.05 + 0.01).float()
                       for l in range(2) for kv in ("k", "v")}, src,
                      metadata={"format": "pt", "caliper.format": "compressed-tensors"})
            rendered = os.path.join(tmp, f"rendered-{granularity}")
            run(args.caliper, "convert", "--in", src, "--format", "compressed-tensors",
                "--format", "modelopt", "--out", rendered, "--model",
                os.path.join(dense, "config.json"))
            for form, file in (("compressed-tensors", "compressed_tensors_scales.safetensors"),
                               ("modelopt", "modelopt_scales.safetensors")):
                scales = os.path.join(rendered, file)
                merged = os.path.join(tmp, f"merged-{form}-{granularity}")
                run(args.caliper, "merge", "--checkpoint", dense, "--scales", scales, "--out",
                    merged, "--kv-only")
                want = expected(scales)
                got = vllm_scales(merged)
                shapes = {k: tuple(v.shape) for k, v in load_file(scales).items()}
                check(same(got, want), f"vLLM 0.32 loads Caliper's {form} KV per {granularity} "
                      f"(file shapes {sorted(set(shapes.values()))}): attention scales {got} "
                      f"== file {want}")
                if form == "compressed-tensors" and granularity == "tensor":
                    # Negative control: one scale changed in the checkpoint must be caught.
                    shard = os.path.join(merged, "model-caliper-scales.safetensors")
                    t = load_file(shard)
                    t["model.layers.1.self_attn.v_scale"] = t["model.layers.1.self_attn.v_scale"] * 2
                    os.remove(shard)
                    save_file(t, shard, metadata={"format": "pt"})
                    check(not same(vllm_scales(merged), want),
                          "negative control: a doubled v_scale in the checkpoint is detected")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
