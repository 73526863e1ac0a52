"""`caliper check`'s vLLM predictions for NVFP4 global-scale defects, against vLLM itself (CPU
build 0.32). vLLM's CPU platform has no NVFP4 GEMM of its own; its emulation kernel
(`EmulationNvFp4LinearKernel`, dequantize to BF16, what ROCm runs) is registered for the CPU
through vLLM's `register_linear_kernel`, so vLLM's real loader (`CompressedTensorsW4A4Fp4` /
ModelOpt's `KNvfp4Static`: the fused-group max, the inversion into alpha, the warnings) runs
unchanged. A tiny Llama is packed by `caliper quantize` (compressed-tensors and ModelOpt) from
scales computed here with torch; each case injects one defect, asks `caliper check --engine vllm`,
then loads the copy in a fresh vLLM process and reads what its NVFP4 layers hold, the warnings it
printed and whether its prompt logprobs are finite; the same for FP8 block scales out of range
(`--deep`) and a module the ignore list names while it carries NVFP4 tensors. A
`--repair fused=min` copy then loads clean.
Where vLLM's CPU build runs an FP8 KV cache (AVX-512 or AMX), the KV rules are then checked
through ModelOpt's KV loader on an NVFP4 + FP8 KV ModelOpt checkpoint (the compressed-tensors KV
loader's are in peers.vllm_check_predictions).
MoE experts are not run: vLLM's NVFP4 MoE emulation refuses the CPU ("kernel does not support
current device cpu"), so those rows stay read from the code.
The cases come in groups (GROUPS; --group picks, default all): compressed-tensors (the clean
checkpoint, the global-scale defects, the repair), deep-config (--deep block scales, the config
rules), modelopt (ModelOpt's Linear loader), modelopt-kv (its KV loader; exit 77 where vLLM has no
FP8 KV cache, and counted as skipped by a run of several groups: tests/peers/peer_report.py).
usage: vllm_nvfp4_predictions_test.py --caliper BIN [--group GROUP]...   (the "vllm" venv)"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

from tests.peers.peer_models import calibration_ids
from tests.peers.peer_report import Cases, skip_all
from tests.peers.vllm_engine_load_test import build_dense
from tests.peers.vllm_engine_load_test import check as check_that
from tests.peers.vllm_engine_load_test import failures, fp8_kv_cache_missing, run

NVFP4_MAX = 6.0 * 448.0
# The case groups (--group), one CTest entry each (peers.vllm_nvfp4_predictions.GROUP): each
# loads its copies in fresh vLLM processes (tens of seconds each on 2 cores), so all of them in
# one entry ran past 900 s on a loaded machine.
GROUPS = ("compressed-tensors", "deep-config", "modelopt", "modelopt-kv")
KV_WHAT = "the KV rules through vLLM's ModelOpt KV loader (group modelopt-kv)"
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
PROMPT = list(range(1, 17))

# One fresh in-process vLLM per checkpoint: the NVFP4 layers' loaded scales, the log, the logprobs.
LOAD = r"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
def main():
    from vllm.platforms import PlatformEnum
    from vllm.model_executor.kernels.linear import register_linear_kernel
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")
    import torch
    from vllm import LLM, SamplingParams
    kv = {"kv_cache_dtype": sys.argv[2]} if len(sys.argv) > 2 else {}
    try:
        llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=64, enforce_eager=True,
                  distributed_executor_backend="uni", kv_cache_memory_bytes=1 << 26, **kv)
    except Exception as e:
        print("RESULT " + json.dumps({"error": f"{type(e).__name__}: {e}"[-2000:]}))
        return
    def read(model):
        out = {}
        for name, m in model.named_modules():
            for attr in ("weight_global_scale", "input_global_scale", "alpha", "_k_scale",
                         "_v_scale"):
                t = getattr(m, attr, None)
                if isinstance(t, torch.Tensor) and "layers." in name:
                    out[f"{name}.{attr}"] = [repr(float(x)) for x in t.float().reshape(-1)]
        return out
    held = llm.apply_model(read)[0]
    o = llm.generate([{"prompt_token_ids": %s}],
                     SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    plp = [repr(list(d.values())[0].logprob) for d in o.prompt_logprobs if d]
    print("RESULT " + json.dumps({"held": held, "logprobs": plp}))
if __name__ == "__main__":
    main()
""" % PROMPT


def vllm_load(ckpt, *kv_cache_dtype):
    r = subprocess.run([sys.executable, "-c", LOAD, ckpt, *kv_cache_dtype], capture_output=True,
                       text=True, timeout=600, cwd=os.path.dirname(ckpt))
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"vLLM load of {ckpt} printed nothing:\n{r.stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT "):])
    out["log"] = r.stdout + r.stderr
    if "held" in out:
        out["held"] = {k: [float(x) for x in v] for k, v in out["held"].items()}
        out["logprobs"] = [float(x) for x in out["logprobs"]]
    return out


def scale_file(dense, path, kv_path):
    """compressed-tensors NVFP4 global scales of the dense model, computed here: weight divisors
    2688 / amax (fused groups share the smallest, i.e. their largest amax), input divisors from
    the Linear inputs' amax over calibration prompts. kv_path gets the same plus per-tensor K/V
    scales, k_proj's and v_proj's output amax / 448 (before RoPE: plausible values, the test asks
    which of them vLLM holds)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32)
    amax_in, amax_out = {}, {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name != "lm_head":
            def hook(_m, args, name=name):
                a = args[0].detach().abs().max().item()
                amax_in[name] = max(amax_in.get(name, 0.0), a)

            def out_hook(_m, _args, out, name=name):
                amax_out[name] = max(amax_out.get(name, 0.0), out.detach().abs().max().item())
            hooks.append(m.register_forward_pre_hook(hook))
            hooks.append(m.register_forward_hook(out_hook))
    with torch.no_grad():
        for ids in calibration_ids(samples=4, seq=16):
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    amax_w = {n: m.weight.detach().abs().max().item() for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    for name in list(amax_w):
        parent, leaf = name.rsplit(".", 1)
        for group in FUSED:
            if leaf in group:
                shared = max(amax_w[f"{parent}.{g}"] for g in group)
                amax_w[name] = shared
                amax_in[name] = max(amax_in[f"{parent}.{g}"] for g in group)
    t = {}
    for name in amax_w:
        t[f"{name}.weight_global_scale"] = torch.tensor([NVFP4_MAX / amax_w[name]])
        t[f"{name}.input_global_scale"] = torch.tensor([NVFP4_MAX / amax_in[name]])
    save_file(t, path, metadata={"format": "pt", "caliper.format": "compressed-tensors"})
    for name, a in amax_out.items():
        parent, leaf = name.rsplit(".", 1)
        if leaf in ("k_proj", "v_proj"):
            t[f"{parent}.{leaf[0]}_scale"] = torch.tensor(a / 448.0)
    save_file(t, kv_path, metadata={"format": "pt", "caliper.format": "compressed-tensors"})


def variant(base, dst, key, edit):
    shutil.copytree(base, dst)
    shard = os.path.join(dst, "model.safetensors")
    t = load_file(shard)
    t[key] = edit(t[key].clone()).contiguous()
    os.remove(shard)
    save_file(t, shard, metadata={"format": "pt"})
    return dst


def caliper_check(binary, ckpt, *flags):
    out = ckpt + ".check.json"
    r = subprocess.run([binary, "check", ckpt, "--engine", "vllm", "--json", out, *flags],
                       capture_output=True, text=True)
    if r.returncode not in (0, 4):
        raise SystemExit(f"caliper check {ckpt} exited {r.returncode}: {r.stderr}")
    with open(out) as f:
        doc = json.load(f)
    return [(f["rule"], f["tensor"], next(e for e in f["engines"] if e["engine"] == "vllm"),
             f.get("details", {})) for f in doc["findings"]]


def finite(got):
    return bool(got["logprobs"]) and all(math.isfinite(x) for x in got["logprobs"])


# What a loaded copy must show: each returns "" or what is wrong.
def held_is(key, want):
    def test(got):
        h = got["held"][key][0]
        ok = (math.isnan(h) and math.isnan(want)) or h == want or math.isclose(
            h, want, rel_tol=1e-6)
        return "" if ok else f"{key} = {h}, want {want}"
    return test


def nan_out(got):
    return "" if not finite(got) else "logprobs finite, want NaN"


def finite_out(got):
    return "" if finite(got) else "logprobs not finite"


def differs_from(clean):
    return lambda got: ("" if got["logprobs"] != clean["logprobs"]
                        else "logprobs equal to the clean run")


def same_as(clean):
    return lambda got: ("" if got["logprobs"] == clean["logprobs"]
                        else "logprobs differ from the clean run")


def warns(text):
    return lambda got: "" if text in got["log"] else f"no \"{text}\" in vLLM's log"


def run_cases(caliper, base, cases, tmp, prefix, warnings, flags=()):
    """Each (what, tensor, edit, (rule, vLLM severity), tests) on a copy of `base`: caliper check
    finds exactly that rule and severity, vLLM loads the copy and passes every test, and each of
    `warnings` is in vLLM's log exactly when the finding's effect quotes it. Returns
    (rule, copy, finding, loaded) per case that loaded."""
    loaded = []
    for i, (what, key, edit, (rule, severity), tests) in enumerate(cases):
        what = f"{prefix}{what}"
        tag = "".join(c for c in prefix if c.isalnum())[:8]
        ckpt = variant(base, os.path.join(tmp, f"{os.path.basename(base)}-{tag}case{i}"),
                       "model.layers.0." + key, edit)
        found = caliper_check(caliper, ckpt, *flags)
        mine = [f for f in found if f[0] == rule]
        check_that(len(found) == 1 and mine and mine[0][2]["severity"] == severity,
                   f"{what}: caliper check predicts {rule} / {severity} for vLLM "
                   f"(got {[(f[0], f[2]['severity']) for f in found]})")
        got = vllm_load(ckpt)
        if "held" not in got:
            check_that(False, f"{what}: vLLM loads it ({got.get('error')})")
            continue
        for test in tests:
            wrong = test(got)
            check_that(not wrong, f"{what}: vLLM does what the check says ({wrong})")
        for text in warnings:
            check_that(not mine or (text in got["log"]) == (text in mine[0][2]["effect"]),
                       f"{what}: the effect quotes vLLM's warning exactly when it warns "
                       f"(\"{text}\")")
        loaded.append((rule, ckpt, mine[0] if mine else None, got))
    return loaded


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--caliper", required=True)
    p.add_argument("--group", choices=GROUPS, action="append",
                   help="a group of cases to run (repeatable; default: all); CTest runs one group "
                        "per entry, peers.vllm_nvfp4_predictions.GROUP")
    args = p.parse_args()
    groups = [g for g in GROUPS if g in (args.group or GROUPS)]
    report = Cases()
    if groups == ["modelopt-kv"] and fp8_kv_cache_missing():
        return skip_all(fp8_kv_cache_missing(), KV_WHAT)
    with tempfile.TemporaryDirectory() as tmp:
        dense = os.path.join(tmp, "dense")
        build_dense(dense)
        scales = os.path.join(tmp, "scales.safetensors")
        scales_kv = os.path.join(tmp, "scales-kv.safetensors")
        scale_file(dense, scales, scales_kv)
        ct, mo = os.path.join(tmp, "ct"), os.path.join(tmp, "modelopt")
        run(args.caliper, "quantize", "--checkpoint", dense, "--scales", scales, "--out", ct)
        run(args.caliper, "quantize", "--checkpoint", dense, "--scales", scales, "--out", mo,
            "--format", "modelopt")

        # The clean compressed-tensors checkpoint: the reference of every group but modelopt-kv.
        clean = None
        if set(groups) - {"modelopt-kv"}:
            clean = vllm_load(ct)
            check_that("held" in clean and finite(clean),
                       f"the clean checkpoint loads with finite logprobs ({clean.get('error')})")
            if "held" not in clean:
                return report.exit_code(failures)
        if "compressed-tensors" in groups:
            compressed_tensors_cases(args.caliper, dense, ct, clean, tmp, report)
        if "deep-config" in groups:
            report.ran(block_scale_cases(args.caliper, ct, clean, tmp))
            report.ran(config_cases(args.caliper, dense, ct, clean, tmp))
        if "modelopt" in groups:
            # Both forms check clean and load with equal outputs.
            modelopt = vllm_load(mo)
            check_that(caliper_check(args.caliper, mo) == [],
                       "the ModelOpt checkpoint checks clean")
            check_that(modelopt.get("logprobs") == clean["logprobs"],
                       f"caliper quantize --format modelopt loads in vLLM and gives the "
                       f"compressed-tensors checkpoint's logprobs ({modelopt.get('error')})")
            report.ran()
            if "held" in modelopt:
                report.ran(modelopt_linear_cases(args.caliper, mo, modelopt, tmp))
        if "modelopt-kv" in groups:
            modelopt_kv_cases(args.caliper, dense, scales_kv, tmp, report)
    return report.exit_code(failures)


def compressed_tensors_cases(caliper, dense, ct, clean, tmp, report):
    """The clean compressed-tensors checkpoint checks clean and vLLM holds 1 / its divisors; one
    global-scale defect per copy; the `--repair fused=min` copy of the fused mismatch then checks
    clean and loads without the warning."""
    stored = load_file(os.path.join(ct, "model.safetensors"))
    L = "model.layers.0."
    attn, mlp = "model.layers.0.self_attn.", "model.layers.0.mlp."

    def s(key):
        return float(stored[L + key].reshape(-1)[0])

    check_that(caliper_check(caliper, ct) == [], "the clean checkpoint checks clean")
    check_that(math.isclose(clean["held"][attn + "qkv_proj.weight_global_scale"][0],
                            1 / s("self_attn.q_proj.weight_global_scale"), rel_tol=1e-6),
               "vLLM holds 1 / the stored divisor")
    report.ran()
    q_w = "self_attn.q_proj.weight_global_scale"
    differs = differs_from(clean)
    weight_warning = "the weight global scale is different for parallel layers"
    input_warning = "the input global scale is different for parallel layers"
    # (case, tensor, edit, (rule, vLLM severity), tests of the loaded copy)
    cases = [
        ("q/k/v weight global scales 2.14x apart", q_w, lambda x: x * 2.14,
         ("fused-scale-mismatch", "degrades"),
         [held_is(attn + "qkv_proj.weight_global_scale",
                  1 / float(torch.tensor(s(q_w) * 2.14).float())), finite_out, differs,
          warns(weight_warning)]),
        ("q_proj weight global scale 0 (k, v healthy)", q_w, lambda x: x * 0,
         ("zero-scale", "degrades"),
         [held_is(attn + "qkv_proj.weight_global_scale",
                  1 / s("self_attn.k_proj.weight_global_scale")), finite_out,
          warns(weight_warning)]),
        ("gate_proj input global scale 0 (up healthy)", "mlp.gate_proj.input_global_scale",
         lambda x: x * 0, ("zero-scale", "none"),
         [held_is(mlp + "gate_up_proj.input_global_scale",
                  1 / s("mlp.up_proj.input_global_scale")), finite_out,
          warns(input_warning)]),
        ("o_proj weight global scale 0", "self_attn.o_proj.weight_global_scale",
         lambda x: x * 0, ("zero-scale", "breaks"),
         [held_is(attn + "o_proj.weight_global_scale", math.inf), nan_out]),
        ("k_proj weight global scale NaN", "self_attn.k_proj.weight_global_scale",
         lambda x: x * math.nan, ("non-finite-scale", "breaks"),
         [held_is(attn + "qkv_proj.weight_global_scale", math.nan), nan_out]),
        ("q_proj input global scale +inf", "self_attn.q_proj.input_global_scale",
         lambda x: x * math.inf, ("non-finite-scale", "breaks"),
         [held_is(attn + "qkv_proj.alpha", 0.0), finite_out, differs]),
        ("down_proj weight global scale +inf", "mlp.down_proj.weight_global_scale",
         lambda x: x * math.inf, ("non-finite-scale", "breaks"),
         [held_is(mlp + "down_proj.weight_global_scale", 0.0), finite_out, differs]),
        ("o_proj weight global scale negative", "self_attn.o_proj.weight_global_scale",
         lambda x: -x, ("negative-scale", "breaks"),
         [held_is(attn + "o_proj.weight_global_scale",
                  -1 / s("self_attn.o_proj.weight_global_scale")), differs]),
        ("down_proj weight global scale subnormal", "mlp.down_proj.weight_global_scale",
         lambda x: x * 0 + 1e-40, ("subnormal-scale", "breaks"),
         [held_is(mlp + "down_proj.weight_global_scale", math.inf), nan_out]),
        ("o_proj weight global scale stored as int32", "self_attn.o_proj.weight_global_scale",
         lambda x: x.round().to(torch.int32), ("unreadable-scale", "breaks"),
         [held_is(attn + "o_proj.weight_global_scale",
                  1 / float(torch.tensor(round(s("self_attn.o_proj.weight_global_scale")))
                            .float())), finite_out]),
    ]
    fused_case = None
    report.ran(len(cases) + 1)  # and the repair below
    for rule, ckpt, finding, got in run_cases(caliper, ct, cases, tmp, "",
                                              (weight_warning, input_warning)):
        if rule == "fused-scale-mismatch" and finding is not None:
            fused_case = ckpt
            used = finding[3].get("used")
            check_that(used is not None and math.isclose(
                1 / used, got["held"][attn + "qkv_proj.weight_global_scale"][0],
                rel_tol=1e-6), f"fused mismatch: details.used ({used}) is the value vLLM "
                               "loads")

    # The repair: one shared divisor, weights requantized from the dense checkpoint.
    if fused_case is None:
        check_that(False, "--repair fused=min: the fused mismatch case did not load")
        return
    fixed = os.path.join(tmp, "fixed")
    r = subprocess.run([caliper, "check", fused_case, "--repair", "fused=min",
                        "--weights-from", dense, "--out", fixed], capture_output=True,
                       text=True)
    check_that(r.returncode in (0, 4), f"--repair fused=min ran ({r.stderr[-400:]})")
    check_that(caliper_check(caliper, fixed) == [], "the repaired copy checks clean")
    got = vllm_load(fixed)
    check_that("held" in got and finite(got) and
               "the weight global scale is different" not in got["log"],
               f"the repaired copy loads without the warning, finite ({got.get('error')})")


def block_scale_cases(caliper, ct, clean, tmp):
    """block-scale-out-of-range (`caliper check --deep`): one FP8 group scale of down_proj made NaN
    or negative; without --deep the copy checks clean (block scales are not read)."""
    def set_largest(negative):
        def edit(x):
            codes = x.view(torch.uint8).clone().reshape(-1)
            i = int(codes.argmax())  # positive E4M3 codes are ordered as their values
            codes[i] = codes[i] | 0x80 if negative else 0x7F  # 0x7F: E4M3's NaN
            return codes.reshape(x.shape).view(x.dtype)
        return edit
    cases = [
        ("a down_proj block scale NaN", "mlp.down_proj.weight_scale", set_largest(False),
         ("block-scale-out-of-range", "breaks"), [nan_out]),
        ("a down_proj block scale negative", "mlp.down_proj.weight_scale", set_largest(True),
         ("block-scale-out-of-range", "breaks"), [finite_out, differs_from(clean)]),
    ]
    run_cases(caliper, ct, cases, tmp, "--deep, ", (), flags=("--deep",))
    shallow = variant(ct, os.path.join(tmp, "ct-shallow"),
                      "model.layers.0.mlp.down_proj.weight_scale", set_largest(False))
    check_that(caliper_check(caliper, shallow) == [],
               "without --deep the block scales are not read (no finding)")
    return len(cases) + 1


def config_cases(caliper, dense, ct, clean, tmp):
    """The config rules against vLLM's loader, each on a copy of the compressed-tensors
    checkpoint with its config.json (or one module's tensors) changed: the finding (or none)
    and what vLLM does, a load error's text or logprobs equal to the clean checkpoint's."""
    def with_config(name, edit):
        dst = os.path.join(tmp, name)
        shutil.copytree(ct, dst)
        path = os.path.join(dst, "config.json")
        with open(path) as f:
            config = json.load(f)
        edit(config)
        with open(path, "w") as f:
            json.dump(config, f)
        return dst

    def ignore(edit):
        return lambda c: c["quantization_config"].__setitem__(
            "ignore", edit(list(c["quantization_config"].get("ignore", []))))

    def groups(key, value):
        def edit(c):
            for g in c["quantization_config"]["config_groups"].values():
                if value is None:
                    g["weights"].pop(key, None)
                else:
                    g[key] = value
            if key == "format":
                c["quantization_config"]["format"] = value
        return edit

    # A dense o_proj in place of its packed tensors, not named by the ignore list.
    dense_o = os.path.join(tmp, "ct-dense-o-proj")
    shutil.copytree(ct, dense_o)
    shard = os.path.join(dense_o, "model.safetensors")
    t = load_file(shard)
    for key in [k for k in t if k.startswith("model.layers.0.self_attn.o_proj.")]:
        del t[key]
    t["model.layers.0.self_attn.o_proj.weight"] = load_file(
        os.path.join(dense, "model.safetensors"))["model.layers.0.self_attn.o_proj.weight"]
    os.remove(shard)
    save_file(t, shard, metadata={"format": "pt"})

    no_module = "There is no module or parameter named"
    # (what, checkpoint, expected findings, error text vLLM gives or None: loads unchanged)
    cases = [
        ("down_proj in the ignore list with NVFP4 tensors",
         with_config("ct-ignored-down", ignore(lambda n: n + ["model.layers.0.mlp.down_proj"])),
         [("config-ignored-module-has-scale", "breaks")], no_module),
        ("lm_head left out of the ignore list (vLLM does not quantize its LM head)",
         with_config("ct-lm-head", ignore(lambda n: [x for x in n if "lm_head" not in x])),
         [], None),
        ("no quantization_config", with_config("ct-no-config",
                                               lambda c: c.pop("quantization_config")),
         [("config-missing", "breaks")], no_module),
        ("an unknown compressed-tensors format with NVFP4 arguments",
         with_config("ct-format", groups("format", "foo-quantized")),
         [("config-unsupported-format", "none")], None),
        ("an unknown quant_method",
         with_config("ct-method", lambda c: c["quantization_config"].__setitem__(
             "quant_method", "foo")),
         [("config-unsupported-format", "breaks")], "Unknown quantization method"),
        ("NVFP4 weights without scale_dtype", with_config("ct-scale-dtype",
                                                          groups("scale_dtype", None)),
         [("config-scale-dtype", "none")], None),
        ("a dense o_proj the ignore list does not name", dense_o,
         [("config-unquantized-module-not-ignored", "breaks")],
         f"{no_module} 'layers.0.self_attn.o_proj.weight'"),
    ]
    for what, ckpt, want, error in cases:
        found = [(f[0], f[2]["severity"]) for f in caliper_check(caliper, ckpt)]
        check_that(found == want, f"{what}: caliper check gives {want} (got {found})")
        got = vllm_load(ckpt)
        if error is not None:
            check_that(error in got.get("error", ""),
                       f"{what}: vLLM fails to load it with \"{error}\" ({got.get('error')})")
        else:
            check_that(got.get("logprobs") == clean["logprobs"],
                       f"{what}: vLLM loads it unchanged ({got.get('error')})")
    return len(cases)


def modelopt_linear_cases(caliper, mo, clean, tmp):
    """The NVFP4 rules through ModelOpt's Linear loader (KNvfp4Static / KNvfp4Dynamic: the fused
    group's max of weight_scale_2 and input_scale, held as multipliers), each defect on a copy of
    the `caliper quantize --format modelopt` checkpoint."""
    stored = load_file(os.path.join(mo, "model.safetensors"))
    L = "model.layers.0."
    attn, mlp = L + "self_attn.", L + "mlp."

    def s(key):
        return float(stored[L + key].reshape(-1)[0])

    differs, same = differs_from(clean), same_as(clean)
    weight_warning = "the global weight scale differs across parallel layers"
    input_warning = "the global input scale differs across parallel layers"
    q_w = "self_attn.q_proj.weight_scale_2"
    f32 = lambda x: float(torch.tensor(x).float())  # noqa: E731
    cases = [
        ("q/k/v weight_scale_2 2.14x apart", q_w, lambda x: x * 2.14,
         ("fused-scale-mismatch", "degrades"),
         [held_is(attn + "qkv_proj.weight_global_scale", f32(s(q_w) * 2.14)), finite_out,
          differs, warns(weight_warning)]),
        # The members shared one scale: the max of the healthy ones is the one q was packed with.
        ("q_proj weight_scale_2 0 (k, v healthy)", q_w, lambda x: x * 0,
         ("zero-scale", "degrades"),
         [held_is(attn + "qkv_proj.weight_global_scale", s("self_attn.k_proj.weight_scale_2")),
          finite_out, same, warns(weight_warning)]),
        ("gate_proj input_scale 0 (up healthy)", "mlp.gate_proj.input_scale", lambda x: x * 0,
         ("zero-scale", "none"),
         [held_is(mlp + "gate_up_proj.input_global_scale", s("mlp.up_proj.input_scale")),
          finite_out, same, warns(input_warning)]),
        ("o_proj weight_scale_2 0", "self_attn.o_proj.weight_scale_2", lambda x: x * 0,
         ("zero-scale", "breaks"),
         [held_is(attn + "o_proj.weight_global_scale", 0.0), finite_out, differs]),
        ("o_proj input_scale 0", "self_attn.o_proj.input_scale", lambda x: x * 0,
         ("zero-scale", "breaks"),
         [held_is(attn + "o_proj.input_global_scale", 0.0), finite_out, differs]),
        ("k_proj weight_scale_2 NaN", "self_attn.k_proj.weight_scale_2", lambda x: x * math.nan,
         ("non-finite-scale", "breaks"),
         [held_is(attn + "qkv_proj.weight_global_scale", math.nan), nan_out]),
        ("q_proj input_scale +inf", "self_attn.q_proj.input_scale", lambda x: x * math.inf,
         ("non-finite-scale", "breaks"),
         [held_is(attn + "qkv_proj.input_global_scale", math.inf), nan_out]),
        ("down_proj weight_scale_2 +inf", "mlp.down_proj.weight_scale_2", lambda x: x * math.inf,
         ("non-finite-scale", "breaks"),
         [held_is(mlp + "down_proj.weight_global_scale", math.inf), nan_out]),
        ("o_proj weight_scale_2 negative", "self_attn.o_proj.weight_scale_2", lambda x: -x,
         ("negative-scale", "breaks"),
         [held_is(attn + "o_proj.weight_global_scale", -s("self_attn.o_proj.weight_scale_2")),
          finite_out, differs]),
        ("down_proj weight_scale_2 subnormal", "mlp.down_proj.weight_scale_2",
         lambda x: x * 0 + 1e-40, ("subnormal-scale", "breaks"),
         [held_is(mlp + "down_proj.weight_global_scale", f32(1e-40)), finite_out, differs]),
        ("down_proj input_scale subnormal", "mlp.down_proj.input_scale",
         lambda x: x * 0 + 1e-40, ("subnormal-scale", "breaks"),
         [held_is(mlp + "down_proj.input_global_scale", f32(1e-40)), finite_out, differs]),
    ]
    run_cases(caliper, mo, cases, tmp, "ModelOpt Linear loader, ",
              (weight_warning, input_warning))
    return len(cases)


def modelopt_kv_cases(caliper, dense, scales_kv, tmp, report):
    """The KV rules through ModelOpt's KV loader (BaseKVCacheMethod via ModelOptKVCacheMethod:
    placeholders -1, both missing -> 1.0 with a warning, else assert k_scale > 0 and V = max(K, V)),
    which needs ModelOpt-quantized weights: an NVFP4 + FP8 KV checkpoint from caliper quantize,
    loaded with an FP8 KV cache. vLLM holds the scales in the model's dtype (bfloat16). Where
    vLLM's CPU build has no FP8 KV cache, the cases are counted as skipped in `report`."""
    base = os.path.join(tmp, "modelopt-kv")
    run(caliper, "quantize", "--checkpoint", dense, "--scales", scales_kv, "--out", base,
        "--format", "modelopt")
    stored = load_file(os.path.join(base, "model.safetensors"))
    attn = "model.layers.{}.self_attn."

    def bf16(x):
        return float(torch.tensor(x).bfloat16())

    k = {l: float(stored[attn.format(l) + "k_proj.k_scale"]) for l in (0, 1)}
    v = {l: float(stored[attn.format(l) + "v_proj.v_scale"]) for l in (0, 1)}
    key = {kv: attn.format(1) + f"{kv}_proj.{kv}_scale" for kv in ("k", "v")}
    one = "Using KV cache scaling factor 1.0 for fp8_e4m3"
    # (case, edits on layer 1 (None: drop), (rule, vLLM severity), layer 1's (K, V) or "error",
    # whether vLLM warns that it uses 1.0)
    cases = [
        ("no defect", {}, None, (k[1], v[1]), False),
        ("V without K", {"k": None}, ("kv-v-without-k", "breaks"), "error", False),
        ("K without V", {"v": None}, ("kv-k-without-v", "degrades"), (k[1], k[1]), False),
        ("neither K nor V", {"k": None, "v": None}, ("kv-layer-missing", "degrades"),
         (1.0, 1.0), True),
        ("K scale 0", {"k": 0.0}, ("zero-scale", "breaks"), "error", False),
        ("K scale NaN", {"k": math.nan}, ("non-finite-scale", "breaks"), "error", False),
        ("V scale negative", {"v": -v[1]}, ("negative-scale", "degrades"), (k[1], k[1]), False),
        ("K and V placeholders of 1.0", {"k": 1.0, "v": 1.0}, ("kv-placeholder-one", "degrades"),
         (1.0, 1.0), True),
    ]
    missing = fp8_kv_cache_missing()
    if missing:
        report.skip(len(cases), missing, KV_WHAT)
        return
    report.ran(len(cases))
    for i, (what, edits, finding, want, warns) in enumerate(cases):
        what = f"ModelOpt KV loader, layer 1 {what}"
        ckpt = os.path.join(tmp, f"modelopt-kv{i}")
        shutil.copytree(base, ckpt)
        shard = os.path.join(ckpt, "model.safetensors")
        t = load_file(shard)
        for kv, value in edits.items():
            if value is None:
                del t[key[kv]]
            else:
                t[key[kv]] = torch.full_like(t[key[kv]], value)
        os.remove(shard)
        save_file(t, shard, metadata={"format": "pt"})
        found = [(f[0], f[2]["severity"]) for f in caliper_check(caliper, ckpt)]
        if finding is None:
            check_that(found == [], f"{what}: checks clean (got {found})")
        else:
            check_that(finding in found and all(f[1] == finding[1] for f in found),
                       f"{what}: caliper check predicts {finding[0]} / {finding[1]} (got {found})")
        got = vllm_load(ckpt, "fp8")
        if want == "error":
            check_that("AssertionError" in got.get("error", ""),
                       f"{what}: vLLM fails to load it, AssertionError ({got.get('error')})")
            continue
        if "held" not in got:
            check_that(False, f"{what}: vLLM loads it ({got.get('error')})")
            continue
        held = {l: (got["held"][attn.format(l) + "attn._k_scale"][0],
                    got["held"][attn.format(l) + "attn._v_scale"][0]) for l in (0, 1)}
        check_that(held[0] == (bf16(k[0]), bf16(v[0])) and
                   held[1] == (bf16(want[0]), bf16(want[1])),
                   f"{what}: vLLM holds layer 1 (K, V) = {want} (held {held})")
        check_that((one in got["log"]) == warns,
                   f"{what}: vLLM {'warns' if warns else 'does not warn'} that it uses 1.0")


if __name__ == "__main__":
    sys.exit(main())
