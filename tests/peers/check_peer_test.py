#!/usr/bin/env python3
"""`caliper check` on checkpoints real producers made: llm-compressor's own `oneshot` (tiny random
Llama, Mixtral and Qwen3-MoE, NVFP4 + FP8 KV) and `caliper quantize`. Clean ones give no finding; copies
with one defect injected per rule give that rule's finding on the injected tensor (exit 4); the
`--repair` copies of the broken ones check clean."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file

from tests.peers.peer_models import build_model, caliper, load_all, run_oneshot, scale_file_from


def check(binary, ckpt, *extra):
    out = os.path.join(ckpt + ".check.json")
    res = subprocess.run([binary, "check", ckpt, "--json", out, *extra], capture_output=True,
                         text=True)
    if res.returncode not in (0, 4):
        raise SystemExit(f"caliper check {ckpt} exited {res.returncode}:\n{res.stderr}")
    with open(out) as f:
        doc = json.load(f)
    return res.returncode, doc, res.stdout


def copy_with(src, dst, edit):
    """A copy of checkpoint `src` whose tensors went through `edit(dict)` (one shard out)."""
    shutil.copytree(src, dst)
    for name in os.listdir(dst):
        if name.endswith(".safetensors") or name == "model.safetensors.index.json":
            os.remove(os.path.join(dst, name))
    tensors = load_all(src)
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


def expect(failures, label, code, doc, rule, tensor_pattern):
    hits = [f for f in doc["findings"] if f["rule"] == rule and re.search(tensor_pattern, f["tensor"])]
    if not hits:
        failures.append(f"{label}: no {rule} finding on /{tensor_pattern}/; got "
                        f"{[(f['rule'], f['tensor']) for f in doc['findings']]}")
    elif code != 4 and hits[0]["severity"] != "none":
        failures.append(f"{label}: exit {code}, expected 4")
    else:
        print(f"ok {label}: {rule} {hits[0]['tensor']} = {hits[0]['value']} "
              f"({hits[0]['severity']})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--caliper", required=True)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="caliper-check-peer-")
    failures = []
    try:
        llama = build_model(os.path.join(work, "llama"), "llama")
        mixtral = build_model(os.path.join(work, "mixtral"), "mixtral")
        ct_llama = run_oneshot(llama, os.path.join(work, "llama-nvfp4"))
        ct_mixtral = run_oneshot(mixtral, os.path.join(work, "mixtral-nvfp4"))
        qwen3 = build_model(os.path.join(work, "qwen3-moe"), "qwen3_moe")
        ct_qwen3 = run_oneshot(qwen3, os.path.join(work, "qwen3-moe-nvfp4"))
        # caliper quantize from llm-compressor's scales: another producer of the same form.
        scales = scale_file_from(ct_llama, os.path.join(work, "scales.safetensors"))
        ours = os.path.join(work, "llama-caliper")
        caliper(args.caliper, "quantize", "--checkpoint", llama, "--scales", scales, "--out", ours,
                "--quiet")

        for label, ckpt in [("llm-compressor llama", ct_llama),
                            ("llm-compressor mixtral", ct_mixtral),
                            ("llm-compressor qwen3-moe", ct_qwen3), ("caliper quantize", ours)]:
            code, doc, out = check(args.caliper, ckpt)
            if code != 0 or doc["summary"]["breaks"] + doc["summary"]["degrades"] != 0:
                failures.append(f"{label}: clean checkpoint gave findings:\n{out}")
            else:
                print(f"ok {label}: clean ({doc['scale_tensors']} scale tensors of "
                      f"{doc['tensors']})")

        for moe, ckpt in (("mixtral", ct_mixtral), ("qwen3-moe", ct_qwen3)):
            names = sorted(load_all(ckpt))
            expert_inputs = [n for n in names
                             if re.search(r"experts\.\d+\..*input_global_scale$", n)]
            first_layer = [n for n in expert_inputs if ".layers.0." in n]
            dead, missing = first_layer[0], first_layer[-1]

            def dead_expert(t):
                t[dead] = torch.zeros_like(t[dead])  # no token reached it
                del t[missing]

            broken_moe = copy_with(ckpt, os.path.join(work, f"{moe}-dead"), dead_expert)
            if moe == "mixtral":
                broken = broken_moe  # repaired below
            code, doc, _ = check(args.caliper, broken_moe)
            expect(failures, f"{moe} dead expert", code, doc, "zero-scale", re.escape(dead))
            expect(failures, f"{moe} missing expert scale", code, doc,
                   "expert-input-scale-missing", re.escape(missing))

            router = [n for n in names if re.search(r"\.gate\.weight$", n)][0]
            routed = copy_with(ckpt, os.path.join(work, f"{moe}-router"),
                               lambda t: t.__setitem__(
                                   router.replace(".weight", ".input_global_scale"),
                                   torch.tensor([100.0])))
            code, doc, _ = check(args.caliper, routed)
            expect(failures, f"{moe} router with a scale", code, doc,
                   "config-ignored-module-has-scale", re.escape(router.replace(".weight", "")))

            # An expert's gate and up projections (vLLM's w1/w3) with different global scales.
            up = next(n for n in names if re.search(
                r"layers\.1\..*experts\.1\.(up_proj|w3)\.weight_global_scale$", n))
            skewed = copy_with(ckpt, os.path.join(work, f"{moe}-w1w3"),
                               lambda t: t.__setitem__(up, t[up] * 2.0))
            code, doc, _ = check(args.caliper, skewed)
            expect(failures, f"{moe} expert gate/up scales differ", code, doc,
                   "fused-scale-mismatch", r"layers\.1\..*experts\.1 \(gate_proj,up_proj\)")

        k0 = "model.layers.0.self_attn.k_proj.weight_global_scale"
        fused = copy_with(ct_llama, os.path.join(work, "llama-fused"),
                          lambda t: t.__setitem__(k0, t[k0] * 2.14))
        code, doc, _ = check(args.caliper, fused)
        expect(failures, "fused q/k/v", code, doc, "fused-scale-mismatch",
               r"layers\.0\.self_attn")

        def kv_defects(t):
            del t["model.layers.1.self_attn.k_scale"], t["model.layers.1.self_attn.v_scale"]
        code, doc, _ = check(args.caliper, copy_with(ct_llama, os.path.join(work, "llama-kv1"),
                                                     kv_defects))
        expect(failures, "KV layer missing", code, doc, "kv-layer-missing", r"layers\.1\.")

        def v_missing(t):
            del t["model.layers.0.self_attn.v_scale"]
            t["model.layers.1.self_attn.k_scale"] = torch.ones_like(t["model.layers.1.self_attn.k_scale"])
        code, doc, _ = check(args.caliper, copy_with(ct_llama, os.path.join(work, "llama-kv2"),
                                                     v_missing))
        expect(failures, "K without V", code, doc, "kv-k-without-v", r"layers\.0\.")
        expect(failures, "KV 1.0 placeholder", code, doc, "kv-placeholder-one", r"layers\.1\.")

        def inf_scale(t):
            t["model.layers.1.mlp.down_proj.input_global_scale"] = torch.tensor([float("inf")])
        code, doc, _ = check(args.caliper, copy_with(ct_llama, os.path.join(work, "llama-inf"),
                                                     inf_scale))
        expect(failures, "infinite global scale", code, doc, "non-finite-scale",
               r"layers\.1\.mlp\.down_proj")

        # Repairs: the dead expert from its layer's siblings, the fused group to its minimum.
        repaired = os.path.join(work, "mixtral-repaired")
        res = subprocess.run([args.caliper, "check", broken, "--repair", "experts=max-of-layer",
                              "--out", repaired], capture_output=True, text=True)
        code, doc, out = check(args.caliper, repaired)
        if res.returncode != 0 or code != 0:
            failures.append(f"repaired mixtral: repair exit {res.returncode}, check exit {code}:\n"
                            f"{res.stdout}{res.stderr}{out}")
        else:
            print(f"ok repaired mixtral checks clean:\n{res.stdout}")
        repaired = os.path.join(work, "llama-fused-repaired")
        res = subprocess.run([args.caliper, "check", fused, "--repair", "fused=min", "--out",
                              repaired, "--weights-from", llama], capture_output=True, text=True)
        code, doc, out = check(args.caliper, repaired)
        if res.returncode != 0 or code != 0:
            failures.append(f"repaired fused: repair exit {res.returncode}, check exit {code}:\n"
                            f"{res.stdout}{res.stderr}{out}")
        else:
            print(f"ok repaired fused group checks clean:\n{res.stdout}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
