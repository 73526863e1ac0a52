"""Observer parity with llm-compressor's real oneshot (venv "tools").

llm-compressor 0.14 runs `oneshot` (NVFP4 weights and inputs, FP8 KV cache) on tiny random models
built here (dense Llama and MoE Mixtral, f32 and bf16, KV per tensor and per head, its default KV
observer `minmax` and NVFP4 input observers `static_minmax` and `minmax`). Every tensor its
observers see is recorded (patched Observer.forward: the value before its flattening, in call
order, so call i of a module is batch i). Caliper then calibrates exactly those tensors through
caliper-server and `caliper calibrate`, and every scale llm-compressor wrote (k_scale, v_scale,
input_global_scale, weight_global_scale) must equal Caliper's bit for bit under
`--compat llm-compressor`; without it the largest relative difference is reported.

MoE: llm-compressor calibrates with every expert seeing every token (its moe_calibration_context),
so the recorded expert inputs are all tokens; this suite compares that mode. Caliper's live capture
sees experts as routed unless asked otherwise (caliper.hooks, docs/observers.md).
usage: observer_parity_test.py --caliper BIN --server BIN"""
import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import peer_models as pm  # noqa: E402
from peer_report import Cases  # noqa: E402

FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


class Recorder:
    """What llm-compressor's observers saw, by (module, base name), in call order."""

    def __init__(self):
        self.model = None
        self.names = {}
        self.seen = {}  # (module, base) -> [tensor per call]

    def record(self, obs, observed):
        key = self.key(obs)
        if key is not None and observed.numel() > 0:
            calls = self.seen.setdefault(key, [])
            if key[1] != "weight" or not calls:  # weights are observed once
                calls.append(observed.detach().clone())

    def key(self, obs):
        if id(obs) not in self.names and self.model is not None:
            for name, module in self.model.named_modules():
                if name.endswith("_observer"):
                    parent, base = name.rsplit(".", 1)
                    self.names[id(module)] = (parent, base[: -len("_observer")])
        return self.names.get(id(obs))


CURRENT = []  # the recorder of the oneshot run in progress


def install_recording():
    from llmcompressor.observers.base import Observer
    original = Observer.forward

    def forward(obs, observed):
        if CURRENT:
            CURRENT[-1].record(obs, observed)
        return original(obs, observed)
    Observer.forward = forward


def scheme_groups(input_observer):
    from compressed_tensors.quantization import preset_name_to_scheme
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    scheme.input_activations.observer = input_observer
    return {"group_0": scheme}


def run_llmc(model_dir, out_dir, kv_strategy, input_observer, recorder, samples, seq):
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM
    ids = pm.calibration_ids(samples, seq)
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * seq] * samples})
    kv = {"num_bits": 8, "type": "float", "strategy": kv_strategy, "dynamic": False,
          "symmetric": True}  # observer: llm-compressor's default (minmax)
    recipe = QuantizationModifier(config_groups=scheme_groups(input_observer), kv_cache_scheme=kv,
                                  ignore=["lm_head", "re:.*block_sparse_moe.gate$",
                                          "re:.*mlp.gate$"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    recorder.model = model
    oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=samples,
            max_seq_length=seq, pipeline="basic", output_dir=out_dir)
    recorder.model = None


def write_inputs(recorder, dumps, weights, config_src):
    """The recorded tensors as `caliper calibrate` dumps (one file per batch) and a weights dir."""
    from safetensors.torch import save_file
    dumps.mkdir(parents=True)
    weights.mkdir(parents=True)
    batches, modules, layers = {}, set(), set()
    for (module, base), calls in recorder.seen.items():
        if base == "weight":
            continue
        for batch, t in enumerate(calls):
            d = batches.setdefault(batch, {})
            if base in ("k", "v"):
                layer = int(module.split(".layers.")[1].split(".")[0])
                layers.add(layer)
                # [batch 1, kv_heads, seq, head_dim] -> [tokens, kv_heads, head_dim]
                d[f"model.layers.{layer}.self_attn.{base}"] = (
                    t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]).contiguous())
            else:
                modules.add(module)
                d[f"{module}.input"] = t.reshape(-1, t.shape[-1]).contiguous()
    for batch, tensors in batches.items():
        save_file(tensors, str(dumps / f"batch{batch:04d}.safetensors"),
                  metadata={"batch": str(batch)})
    save_file({f"{m}.weight": calls[0].contiguous() for (m, base), calls in recorder.seen.items()
               if base == "weight"}, str(weights / "model.safetensors"))
    (weights / "config.json").write_text((pathlib.Path(config_src) / "config.json").read_text())
    return len(batches), len(modules), len(layers)


class Server:
    def __init__(self, binary, log):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        self.log = log
        self.proc = subprocess.Popen([binary, f"--listen={self.address}", "--metrics_listen=",
                                      "--device=cpu"], stdout=open(log, "w"),
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while f"listening on {self.address}" not in pathlib.Path(log).read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"caliper-server did not start: {pathlib.Path(log).read_text()}")
            time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def caliper_scales(binary, server, model_dir, dumps, weights, out, kv, input_observer, compat):
    args = ["calibrate", "--server", server.address, "--model", f"{model_dir}/config.json",
            "--tensors", str(dumps), "--nvfp4", "--weights", str(weights), "--out", str(out),
            "--kv", kv, "--kv-observer", "minmax", "--observer", input_observer,
            "--format", "compressed-tensors"]
    if compat:
        args += ["--compat", "llm-compressor"]
    pm.caliper(binary, *args)
    return pm.load_all(out)


def compare(label, llmc, ours):
    """Bit-exact count and the largest relative difference over every scale llm-compressor wrote.
    Its Mixtral checkpoint names the MoE block `block_sparse_moe` (the HF checkpoint's spelling)
    while the module it calibrated (and Caliper saw) is `mlp` under transformers 5."""
    llmc = {k.replace(".block_sparse_moe.", ".mlp."): v for k, v in llmc.items()}
    keys = sorted(k for k in llmc if k.endswith(("k_scale", "v_scale", "input_global_scale",
                                                  "weight_global_scale")))
    same, worst, missing = 0, (0.0, ""), []
    for k in keys:
        if k not in ours:
            missing.append(k)
            continue
        a, b = llmc[k].float().reshape(-1), ours[k].float().reshape(-1)
        if a.shape != b.shape:
            missing.append(f"{k} {list(a.shape)} vs {list(b.shape)}")
            continue
        if torch.equal(a, b):
            same += 1
        rel = ((a - b).abs() / a.abs().clamp_min(1e-30)).max().item()
        worst = max(worst, (rel, k))
    if missing:
        print(f"  {label}: Caliper wrote e.g. {sorted(ours)[:6]}", flush=True)
    return keys, same, worst, missing


def case(tmp, args, kind, dtype, kv_strategy, input_observer, samples=6, seq=16):
    label = f"{kind} {str(dtype)[6:]} KV {kv_strategy} input {input_observer}"
    base = pathlib.Path(tmp) / label.replace(" ", "-")
    dense = pm.build_model(str(base) + "-dense", kind, dtype)
    recorder = Recorder()
    CURRENT.append(recorder)
    try:
        run_llmc(dense, str(base) + "-llmc", kv_strategy, input_observer, recorder, samples, seq)
    finally:
        CURRENT.clear()
    batches, modules, layers = write_inputs(recorder, base / "dumps", base / "weights", dense)
    check(batches == samples and layers == 2 and modules > 0,
          f"{label}: recorded {batches} batches, {modules} input modules, {layers} K/V layers")
    llmc = pm.load_all(str(base) + "-llmc")
    server = Server(args.server, str(base) + "-server.log")
    try:
        kv = "per-tensor" if kv_strategy == "tensor" else "per-head"
        for compat in (True, False):
            out = base / ("caliper-compat" if compat else "caliper")
            ours = caliper_scales(args.caliper, server, dense, base / "dumps", base / "weights",
                                  out, kv, input_observer, compat)
            keys, same, (rel, where), missing = compare(label, llmc, ours)
            if compat:
                quantize_from_session(args, server, label, dense, out, base, llmc, input_observer)
                check(not missing and same == len(keys),
                      f"{label}, --compat llm-compressor: {same}/{len(keys)} scales bit-identical"
                      f" (largest relative difference {rel:.3g} at {where}; missing {missing[:3]})")
            else:
                # bf16: llm-compressor rounds every moving-average step and scale to bf16.
                tolerance = 0.05 if dtype == torch.bfloat16 else 1e-6
                check(not missing and rel < tolerance,
                      f"{label}, Caliper's float32: {same}/{len(keys)} bit-identical, largest "
                      f"relative difference {rel:.3g} ({where})")
        if input_observer == "minmax":
            # Negative control: the static observer on the same tensors must not match, so the
            # equality above is the moving average's doing.
            ours = caliper_scales(args.caliper, server, dense, base / "dumps", base / "weights",
                                  base / "caliper-static", kv, "static_minmax", True)
            keys, same, _, _ = compare(label, llmc, ours)
            inputs = [k for k in keys if k.endswith("input_global_scale")]
            differ = sum(not torch.equal(llmc_value(llmc, k), ours[k].float().reshape(-1))
                         for k in inputs)
            check(differ > 0, f"{label}: negative control, static_minmax differs from "
                              f"llm-compressor's minmax on {differ}/{len(inputs)} input scales")
    finally:
        server.stop()
    return recorder


def quantize_from_session(args, server, label, dense, calibrated, base, llmc, input_observer):
    """`caliper quantize` straight from the finalized session: every tensor of the packed
    checkpoint must equal llm-compressor's own (names as each engine loads them)."""
    session = json.loads((calibrated / "scales.json").read_text())["session_id"]
    ours_dir = base / "caliper-quantized"
    pm.caliper(args.caliper, "quantize", "--checkpoint", dense, "--server", server.address,
               "--session", session, "--out", str(ours_dir), "--compat", "llm-compressor",
               "--quiet")  # observer names come from the session's scale file
    a, b = pm.load_all(str(base) + "-llmc"), pm.load_all(str(ours_dir))
    common = sorted(set(a) & set(b))
    differ = [k for k in common if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
              or not torch.equal(pm.raw(a[k]), pm.raw(b[k]))]
    check(set(a) == set(b) and not differ,
          f"{label}: quantize --session: {len(common) - len(differ)}/{len(a)} checkpoint tensors "
          f"bit-identical to llm-compressor's (differ {differ[:3]}, only llm-compressor "
          f"{sorted(set(a) - set(b))[:3]}, only Caliper {sorted(set(b) - set(a))[:3]})")
    qa = json.load(open(os.path.join(str(base) + "-llmc", "config.json")))["quantization_config"]
    qb = json.load(open(ours_dir / "config.json"))["quantization_config"]
    # llm-compressor writes the KV observer it defaulted to as null; Caliper names it.
    check(qb["kv_cache_scheme"].pop("observer") == "minmax" and
          qa["kv_cache_scheme"].pop("observer") in (None, "minmax"),
          f"{label}: kv_cache_scheme.observer names minmax")
    for key in ("config_groups", "kv_cache_scheme", "format", "version"):
        check(qa.get(key) == qb.get(key), f"{label}: quantization_config.{key} equals "
              f"llm-compressor's (observers {input_observer} / minmax included)"
              + ("" if qa.get(key) == qb.get(key) else f": {qa.get(key)} vs {qb.get(key)}"))


def llmc_value(llmc, key):
    for k, v in llmc.items():
        if k.replace(".block_sparse_moe.", ".mlp.") == key:
            return v.float().reshape(-1)
    raise KeyError(key)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--caliper", required=True)
    parser.add_argument("--server", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    install_recording()
    only = os.environ.get("ONLY")  # a debugging shortcut: the other cases are counted skipped
    report = Cases()
    with tempfile.TemporaryDirectory() as tmp:
        for run_it, *what in (
                (only not in ("mixtral", "one"), "llama", torch.bfloat16, "tensor", "minmax"),
                (only not in ("mixtral", "one"), "llama", torch.float32, "attn_head", "minmax"),
                (only not in ("mixtral", "one"), "llama", torch.bfloat16, "attn_head",
                 "static_minmax"),
                (True, "mixtral", torch.bfloat16, "tensor", "minmax"),
                (only != "mixtral", "mixtral", torch.float32, "attn_head", "static_minmax")):
            if run_it:
                case(tmp, args, *what)
                report.ran()
            else:
                report.skip(1, f"ONLY={only} is set", f"{what[0]} {what[1]} {what[2]} {what[3]}")
    return report.exit_code(FAILURES)


if __name__ == "__main__":
    sys.exit(main())
