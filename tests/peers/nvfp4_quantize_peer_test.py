"""caliper quantize against compressed-tensors and llm-compressor (their real code from PyPI).

1. Packing: for the same global scales, Caliper's weight_packed / weight_scale bytes equal those of
   compressed-tensors' NVFP4PackedCompressor (random heavy-tailed weights plus edge cases; f32,
   bf16, f16; group scales as compressed-tensors computes them from f32 or from the observed dtype).
2. Checkpoints: llm-compressor's oneshot NVFP4 + FP8 KV checkpoint of tiny random models (Llama,
   Mixtral; bf16, f32). Caliper quantizes the dense model with exactly its global and K/V scales:
   every tensor must be bit-identical under --compat llm-compressor, and transformers +
   compressed-tensors must load Caliper's checkpoint and produce the same logits.
3. ModelOpt form: same packed bytes, ModelOpt names/dtypes/shapes, hf_quant_config.json.
usage: nvfp4_quantize_peer_test.py --caliper BIN"""
import argparse
import json
import os
import sys
import tempfile

import torch

from tests.peers import peer_models as pm

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def compressor_case(tmp, binary, dtype, in_weight_dtype):
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from safetensors.torch import save_file
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    g = torch.Generator().manual_seed(3)
    shapes = {"model.layers.0.mlp.down_proj": (96, 256), "model.layers.0.mlp.up_proj": (64, 64),
              "model.layers.0.self_attn.o_proj": (7, 32)}
    weights, scales, want = {}, {}, {}
    for i, (name, (r, c)) in enumerate(shapes.items()):
        w = torch.distributions.StudentT(3.0).sample((r, c)) * 0.02
        if i == 0:
            w[0, :16] = 0.0                       # a zero group
            w[1, :16] = 1e-30                     # a group whose scale rounds to 0 in fp8
            w[2, 16:32] = -0.0
            w[3, :] = w[3, :] * 1000              # a row far above the rest
        if i == 2:
            w[:, :] = torch.linspace(-6, 6, r * c).reshape(r, c) / 6 * 0.05  # every E2M1 tie
        w = w.to(dtype)
        weights[name + ".weight"] = w
        obs = w if in_weight_dtype else w.float()
        gs = generate_gparam(obs.min(), obs.max())  # tensor-wide, f32 [1]
        if i == 1:
            gs = gs * 0.37  # global scales need not come from this tensor (fused groups)
        grouped = obs.reshape(r, c // 16, 16)
        s, _ = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights,
                                 global_scale=gs)
        sd = NVFP4PackedCompressor.compress(
            {"weight": w, "weight_scale": s, "weight_global_scale": gs}, scheme)
        want[name] = sd
        scales[name + ".weight_global_scale"] = gs.float().reshape(1)
    ckpt = os.path.join(tmp, f"synthetic-{dtype}-{in_weight_dtype}")
    os.makedirs(ckpt)
    save_file(weights, os.path.join(ckpt, "model.safetensors"), metadata={"format": "pt"})
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
               "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
               "hidden_size": 64}, open(os.path.join(ckpt, "config.json"), "w"))
    scale_path = os.path.join(tmp, f"scales-{dtype}-{in_weight_dtype}.safetensors")
    save_file(scales, scale_path, metadata={"format": "pt", "caliper.format": "compressed-tensors"})
    out = ckpt + "-q"
    args = ["quantize", "--checkpoint", ckpt, "--scales", scale_path, "--out", out, "--quiet"]
    in_dtype = dtype != torch.float32 and in_weight_dtype
    if in_dtype:
        args += ["--compat", "llm-compressor"]
    pm.caliper(binary, *args)
    got = pm.load_all(out)
    total = same = 0
    for name, sd in want.items():
        for key in ("weight_packed", "weight_scale"):
            a, b = pm.raw(sd[key]), pm.raw(got[f"{name}.{key}"])
            total += a.numel()
            same += int((a == b).sum()) if a.shape == b.shape else 0
    label = f"packing {str(dtype)[6:]}, group scales from {'observed dtype' if in_weight_dtype else 'f32'}"
    check(total == same, f"{label}: {same}/{total} packed+scale bytes equal compressed-tensors'")


def checkpoint_case(tmp, binary, kind, dtype, kv):
    base = os.path.join(tmp, f"{kind}-{str(dtype)[6:]}-{kv}")
    dense = pm.build_model(base + "-dense", kind, dtype)
    llmc = pm.run_oneshot(dense, base + "-llmc", kv_strategy=kv)
    scales = pm.scale_file_from(llmc, base + "-scales.safetensors")
    ours = base + "-caliper"
    pm.caliper(binary, "quantize", "--checkpoint", dense, "--scales", scales, "--out", ours,
               "--compat", "llm-compressor", "--observer", "static_minmax", "--quiet")
    a, b = pm.load_all(llmc), pm.load_all(ours)
    label = f"{kind} {str(dtype)[6:]} KV {kv}"
    check(set(a) == set(b), f"{label}: same tensor names ({len(a)}); only llm-compressor: "
          f"{sorted(set(a) - set(b))[:4]}, only Caliper: {sorted(set(b) - set(a))[:4]}")
    differ = [k for k in sorted(set(a) & set(b))
              if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
              or not torch.equal(pm.raw(a[k]), pm.raw(b[k]))]
    check(not differ, f"{label}: {len(set(a) & set(b)) - len(differ)}/{len(set(a) & set(b))} "
          f"tensors bit-identical (shape, dtype, bytes); differ: {differ[:4]}")
    qa = json.load(open(os.path.join(llmc, "config.json")))["quantization_config"]
    qb = json.load(open(os.path.join(ours, "config.json")))["quantization_config"]
    for key in ("format", "quant_method", "version", "config_groups"):
        check(qa.get(key) == qb.get(key), f"{label}: quantization_config.{key} matches")
    check(sorted(qb["ignore"]) == sorted(i for i in qb["ignore"]) and "lm_head" in qb["ignore"],
          f"{label}: ignore {qb['ignore']}")
    if kind == "mixtral":
        routers = [k[:-7] for k in b if k.endswith("block_sparse_moe.gate.weight")]
        check(routers and all(r in qb["ignore"] for r in routers),
              f"{label}: every router ({len(routers)}) unquantized and in ignore")
    if kind == "mixtral":
        # transformers 5.17 cannot load quantized Mixtral experts at all (llm-compressor's own
        # checkpoint loads with its experts MISSING, i.e. random): the bytes above are the check,
        # and the engine-load suite serves the MoE checkpoint with vLLM.
        return dense, scales, ours
    from transformers import AutoModelForCausalLM
    ids = torch.tensor(pm.calibration_ids(2, 16, seed=9))
    # compressed-tensors 0.19 decompresses NVFP4 weights to bf16 whatever the model dtype, so an
    # f32 model only runs when loaded as bf16 (its own checkpoint as much as ours).
    load = dict(dtype=torch.bfloat16) if dtype == torch.float32 else {}
    with torch.no_grad():
        la = AutoModelForCausalLM.from_pretrained(llmc, **load).eval()(ids).logits
        lb = AutoModelForCausalLM.from_pretrained(ours, **load).eval()(ids).logits
    check(torch.equal(la, lb), f"{label}: transformers logits of Caliper's checkpoint equal "
          f"llm-compressor's (max |diff| {(la - lb).abs().max().item():.3g})")
    return dense, scales, ours


def modelopt_case(tmp, binary, dense, scales, ct_dir):
    out = os.path.join(tmp, "modelopt")
    pm.caliper(binary, "quantize", "--checkpoint", dense, "--scales", scales, "--out", out,
               "--format", "modelopt", "--compat", "llm-compressor", "--quiet")
    ct, mo = pm.load_all(ct_dir), pm.load_all(out)
    mods = [k[:-len(".weight_packed")] for k in ct if k.endswith(".weight_packed")]
    ok = all(mo[m + ".weight"].dtype == torch.uint8 and torch.equal(mo[m + ".weight"], ct[m + ".weight_packed"])
             and mo[m + ".weight_scale"].dtype == torch.float8_e4m3fn
             and mo[m + ".weight_scale_2"].shape == torch.Size([])
             and mo[m + ".input_scale"].shape == torch.Size([]) for m in mods)
    check(ok, f"modelopt: {len(mods)} modules with U8 weight (= compressed-tensors' bytes), F8 "
          f"weight_scale, 0-d weight_scale_2 / input_scale")
    rel = max(abs(mo[m + ".weight_scale_2"].item() * ct[m + ".weight_global_scale"].item() - 1)
              for m in mods)
    check(rel < 1.2e-7, f"modelopt: weight_scale_2 is the reciprocal of weight_global_scale "
          f"(max rel err {rel:.2g})")
    hq = json.load(open(os.path.join(out, "hf_quant_config.json")))["quantization"]
    check(hq["quant_algo"] == "NVFP4" and hq["group_size"] == 16 and "lm_head" in hq["exclude_modules"],
          f"modelopt: hf_quant_config.json {hq}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--caliper", required=True)
    args = p.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for in_weight_dtype in ((False, True) if dtype != torch.float32 else (False,)):
                compressor_case(tmp, args.caliper, dtype, in_weight_dtype)
        dense, scales, ours = checkpoint_case(tmp, args.caliper, "llama", torch.bfloat16, "tensor")
        modelopt_case(tmp, args.caliper, dense, scales, ours)
        checkpoint_case(tmp, args.caliper, "llama", torch.float32, "tensor")
        checkpoint_case(tmp, args.caliper, "mixtral", torch.bfloat16, "tensor")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
