"""`caliper check`'s vLLM predictions for KV-cache defects, against vLLM's own loader (CPU build
0.32, FP8 KV cache). Each case injects one defect into a checkpoint Caliper merged
(compressed-tensors or ModelOpt KV scales), asks `caliper check --engine vllm` what vLLM will
do, then loads the checkpoint in a fresh vLLM process and reads what its attention layers hold
(or the load error): the rule and vLLM's severity must be the ones docs/check.md gives for the
case, and vLLM must do what that rule says it does. vLLM's compressed-tensors KV loader is what
runs (KV-only ModelOpt checkpoints load through it too); its ModelOpt KV loader needs a checkpoint
with quantized weights (`quant_algo`): peers.vllm_nvfp4_predictions checks those predictions.
Needs x86 with AVX-512 or AMX (vLLM's CPU FP8 KV cache); exits 77 (skipped) elsewhere.
usage: vllm_check_predictions_test.py --caliper BIN   (run with the "vllm" venv)"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

from tests.peers.peer_report import skip_all
from tests.peers.vllm_engine_load_test import build_dense
from tests.peers.vllm_engine_load_test import check as check_that
from tests.peers.vllm_engine_load_test import failures, fp8_kv_cache_missing, run

SHARD = "model-caliper-scales.safetensors"  # where `caliper merge` puts the scales

# A fresh process per load (a failed load leaves vLLM's process state behind), reading the
# attention layers as peers.vllm_engine_load does.
LOAD = r"""
import json, sys
from tests.peers.vllm_engine_load_test import vllm_scales
try:
    print(json.dumps({"scales": vllm_scales(sys.argv[1])}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"[-400:]}))
"""

def vllm_load(model_dir):
    r = subprocess.run([sys.executable, "-c", LOAD, model_dir], capture_output=True, text=True,
                       timeout=600)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise SystemExit(f"vLLM load of {model_dir} printed nothing:\n{r.stderr[-3000:]}")
    out = json.loads(lines[-1])
    if "scales" in out:
        out["scales"] = {int(k): v for k, v in out["scales"].items()}
    return out


def caliper_check(binary, ckpt):
    out = ckpt + ".check.json"
    r = subprocess.run([binary, "check", ckpt, "--engine", "vllm", "--json", out],
                       capture_output=True, text=True)
    if r.returncode not in (0, 4):
        raise SystemExit(f"caliper check {ckpt} exited {r.returncode}: {r.stderr}")
    with open(out) as f:
        doc = json.load(f)
    return {(f["rule"], next(e["severity"] for e in f["engines"] if e["engine"] == "vllm"))
            for f in doc["findings"]}


def variant(base, dst, edit):
    shutil.copytree(base, dst)
    t = load_file(os.path.join(dst, SHARD))
    edit(t)
    os.remove(os.path.join(dst, SHARD))
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(dst, SHARD),
              metadata={"format": "pt"})
    index = os.path.join(dst, "model.safetensors.index.json")
    with open(index) as f:
        doc = json.load(f)
    doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if v != SHARD}
    doc["weight_map"].update({k: SHARD for k in t})
    with open(index, "w") as f:
        json.dump(doc, f, indent=2)
    return dst


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--caliper", required=True)
    args = p.parse_args()
    missing = fp8_kv_cache_missing()
    if missing:
        return skip_all(missing, "that vLLM does what `caliper check` predicts for KV-cache "
                        "defects")
    with tempfile.TemporaryDirectory() as tmp:
        dense = os.path.join(tmp, "dense")
        build_dense(dense)
        src = os.path.join(tmp, "src.safetensors")
        g = torch.Generator().manual_seed(9)
        file = {f"model.layers.{l}.self_attn.{kv}_scale": (torch.rand([], generator=g) * 0.05
                                                           + 0.01).float()
                for l in range(2) for kv in ("k", "v")}
        save_file(file, src, metadata={"format": "pt", "caliper.format": "compressed-tensors"})
        scale = {(l, kv): float(file[f"model.layers.{l}.self_attn.{kv}_scale"])
                 for l in range(2) for kv in ("k", "v")}
        rendered = os.path.join(tmp, "rendered")
        run(args.caliper, "convert", "--in", src, "--format", "compressed-tensors", "--format",
            "modelopt", "--out", rendered, "--model", os.path.join(dense, "config.json"))
        base = {}
        for form, name in (("ct", "compressed_tensors_scales.safetensors"),
                           ("modelopt", "modelopt_scales.safetensors")):
            base[form] = os.path.join(tmp, f"merged-{form}")
            run(args.caliper, "merge", "--checkpoint", dense, "--scales",
                os.path.join(rendered, name), "--out", base[form], "--kv-only")
        # Per head (compressed-tensors attn_head): layer l head h = 0.02 + 0.01 (l + h).
        heads = {(l, h): 0.02 + 0.01 * (l + h) for l in range(2) for h in range(2)}
        src_heads = os.path.join(tmp, "src-heads.safetensors")
        save_file({f"model.layers.{l}.self_attn.{kv}_scale":
                   torch.tensor([heads[l, 0], heads[l, 1]]).reshape(2, 1, 1)
                   for l in range(2) for kv in ("k", "v")}, src_heads,
                  metadata={"format": "pt", "caliper.format": "compressed-tensors"})
        run(args.caliper, "convert", "--in", src_heads, "--format", "compressed-tensors", "--out",
            os.path.join(tmp, "rendered-heads"), "--model", os.path.join(dense, "config.json"))
        base["ct-heads"] = os.path.join(tmp, "merged-ct-heads")
        run(args.caliper, "merge", "--checkpoint", dense, "--scales",
            os.path.join(tmp, "rendered-heads", "compressed_tensors_scales.safetensors"), "--out",
            base["ct-heads"], "--kv-only")
        # The same K/V scales with the checkpoint's kv_cache_scheme removed.
        base["ct-no-scheme"] = os.path.join(tmp, "merged-ct-no-scheme")
        shutil.copytree(base["ct"], base["ct-no-scheme"])
        config_path = os.path.join(base["ct-no-scheme"], "config.json")
        with open(config_path) as f:
            config = json.load(f)
        config["quantization_config"]["kv_cache_scheme"] = None
        with open(config_path, "w") as f:
            json.dump(config, f)
        ct = lambda kv: f"model.layers.1.self_attn.{kv}_scale"
        mo = lambda kv: f"model.layers.1.self_attn.{kv}_proj.{kv}_scale"
        k0, v0, k1, v1 = scale[0, "k"], scale[0, "v"], scale[1, "k"], scale[1, "v"]

        def per_head(t):
            t[ct("k")] = torch.tensor([k1, k1, k1]).reshape(3, 1, 1)
        # (case, form, edit, the finding check must give, what vLLM then holds: layer -> (k, v),
        # or "error")
        cases = [
            ("layer 1 without K/V scales", "ct",
             lambda t: (t.pop(ct("k")), t.pop(ct("v"))), ("kv-layer-missing", "degrades"),
             {0: (k0, v0), 1: (1.0, 1.0)}),
            ("layer 1 K without V", "ct", lambda t: t.pop(ct("v")),
             ("kv-k-without-v", "degrades"), {0: (k0, v0), 1: (k1, 1.0)}),
            ("layer 1 V without K", "ct", lambda t: t.pop(ct("k")),
             ("kv-v-without-k", "degrades"), {0: (k0, v0), 1: (1.0, v1)}),
            ("layer 1 K/V placeholders of 1.0", "ct",
             lambda t: t.update({ct("k"): torch.ones([]), ct("v"): torch.ones([])}),
             ("kv-placeholder-one", "degrades"), {0: (k0, v0), 1: (1.0, 1.0)}),
            # KV-only ModelOpt scales: config.json carries the compressed-tensors scheme (vLLM
            # has no ModelOpt KV-only form), so vLLM's compressed-tensors loader reads them.
            ("ModelOpt-named, KV-only: layer 1 K without V", "modelopt",
             lambda t: t.pop(mo("v")), ("kv-k-without-v", "degrades"),
             {0: (k0, v0), 1: (k1, 1.0)}),
            ("ModelOpt-named, KV-only: layer 1 V without K", "modelopt",
             lambda t: t.pop(mo("k")), ("kv-v-without-k", "degrades"),
             {0: (k0, v0), 1: (1.0, v1)}),
            ("a kv_cache_scheme and no K/V scale at all", "ct", lambda t: t.clear(),
             ("config-kv-scheme-without-scales", "degrades"), {0: (1.0, 1.0), 1: (1.0, 1.0)}),
            ("layer 1 K with 3 per-head values for 2 KV heads", "ct", per_head,
             ("kv-head-shape", "breaks"), "error"),
            ("per-head K/V scales (attn_head)", "ct-heads", lambda t: None,
             ("kv-per-head", "none"), {l: ([heads[l, 0], heads[l, 1]],) * 2 for l in range(2)}),
            ("descales written where scales belong", "ct",
             lambda t: t.update({k: 1 / v for k, v in t.items()}), ("kv-convention", "degrades"),
             {0: (1 / k0, 1 / v0), 1: (1 / k1, 1 / v1)}),
            # Started with an FP8 KV cache (as every case here), the scales load and are used.
            ("K/V scales without a kv_cache_scheme", "ct-no-scheme", lambda t: None,
             ("config-kv-scales-without-scheme", "degrades"), {0: (k0, v0), 1: (k1, v1)}),
        ]
        for i, (what, form, edit, finding, want) in enumerate(cases):
            ckpt = variant(base[form], os.path.join(tmp, f"case{i}"), edit)
            predicted = caliper_check(args.caliper, ckpt)
            check_that(finding in predicted, f"{what}: caliper check predicts {finding} "
                       f"for vLLM (got {sorted(predicted)})")
            got = vllm_load(ckpt)
            if want == "error":
                check_that("error" in got, f"{what}: vLLM's load fails "
                           f"({got.get('error', got.get('scales'))})")
            else:
                held = {l: (k, v) for l, (k, v) in got.get("scales", {}).items()}
                as_list = lambda x: x if isinstance(x, list) else [x]  # noqa: E731
                ok = set(held) == set(want) and all(
                    len(held[l][j]) == len(as_list(want[l][j])) and
                    all(abs(h - w) <= 1e-6 * max(1.0, w)
                        for h, w in zip(held[l][j], as_list(want[l][j])))
                    for l in want for j in (0, 1))
                check_that(ok, f"{what}: vLLM holds {held or got.get('error')}, as predicted "
                           f"{want}")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
