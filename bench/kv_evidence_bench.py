"""FP8 KV-cache scales on a trained model, side by side: perplexity and KL to the unquantised model.

The model is the byte-level Llama scripts/tiny_llama.py trains here (cached outside the checkout).
K and V are fake-quantised to FP8 E4M3 inside its attention as an engine's FP8 KV cache stores
them (tiny_llama.fake_quant), with the scales of each row:
  - scale 1.0: what vLLM uses when the checkpoint has none;
  - vLLM's calculate_kv_scales: on the first forward, k_scale = max|K| / 200, v_scale = max|V| / 100
    per tensor (Attention.calc_kv_scales, K_SCALE_CONSTANT / V_SCALE_CONSTANT), reproduced in torch:
    the vLLM in this project's venv no longer has the option (kv_vllm_evidence_bench.py runs the
    headline rows through vLLM's own FP8 cache);
  - llm-compressor's defaults through its real oneshot (a KV-cache-only recipe, strategy tensor and
    attn_head), scales read from the checkpoint it writes;
  - Caliper's observers from a real caliper-server, fed by the transformers hooks (caliper.hooks);
  - a fleet window (per head, static_minmax) fed by the hooks, closed by CloseWindow;
  - the report's recommendation: per layer and K/V, mse's scale where `caliper report` recommends
    mse, else static_minmax's.
Each seed draws its own calibration windows (training split) and evaluation windows (held-out
files); the table gives mean and standard deviation over seeds.

usage: build/python-env/bin/python bench/kv_evidence_bench.py --build build [--size test|bench]
       [--seeds 0,1,2] [--model-seed 0] [--model DIR] [--rescale]
"""
import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import tiny_llama  # noqa: E402

CALIBRATION, EVALUATION, SEQ = 16, 64, 128
OBSERVERS = ("static_minmax", "minmax", "percentile:99.99", "percentile:99.9", "mse")
KV = ("per_tensor", "per_head")


def start_server(build):
    server = subprocess.Popen([f"{build}/server/caliper-server", "--listen=127.0.0.1:0",
                               "--metrics_listen=", "--device=cpu"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    for line in server.stdout:
        m = re.match(r"caliper-server listening on (\S+)", line)
        if m:
            return server, m.group(1)
    server.kill()
    sys.exit(f"caliper-server did not start: {line}")


def vllm_first_batch(model, calibration):
    """calc_kv_scales on the first forward: one scale per tensor, max|K| / 200, max|V| / 100."""
    record = {}
    with torch.no_grad(), tiny_llama.fp8_kv(record=record):
        model(calibration[:1], use_cache=False)
    heads = model.config.num_key_value_heads
    return {layer: ((kv[0][0].abs().max() / 200).expand(heads).clone(),
                    (kv[0][1].abs().max() / 100).expand(heads).clone())
            for layer, kv in record.items()}


def llmc_oneshot(model_dir, calibration, strategy, work):
    """llm-compressor's defaults: oneshot with a KV-cache-only FP8 recipe; its k/v scales."""
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from safetensors import safe_open
    ids = calibration.tolist()
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * SEQ] * len(ids)})
    kv = {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False,
          "symmetric": True}
    out = os.path.join(work, f"llmc-{strategy}")
    with contextlib.redirect_stdout(io.StringIO()):
        oneshot(model=model_dir, dataset=ds, recipe=QuantizationModifier(kv_cache_scheme=kv),
                num_calibration_samples=len(ids), max_seq_length=SEQ, pipeline="basic",
                output_dir=out)
    found = {}
    for name in os.listdir(out):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(out, name), "pt") as f:
                for key in f.keys():
                    m = re.match(r"model\.layers\.(\d+)\.self_attn\.([kv])_scale$", key)
                    if m:
                        found.setdefault(int(m.group(1)), {})[m.group(2)] = f.get_tensor(key)
    heads = None
    scales = {}
    for layer, kv_scales in found.items():
        k, v = (kv_scales[b].float().reshape(-1) for b in "kv")
        heads = heads or max(k.numel(), v.numel())
        scales[layer] = (k.expand(heads).clone() if k.numel() == 1 else k,
                         v.expand(heads).clone() if v.numel() == 1 else v)
    return scales


def fleet_window(model, address, model_dir, calibration, name):
    """A fleet's window (per head, static_minmax) fed by the hooks with the calibration windows as
    its traffic, closed by CloseWindow; its scales and the publish policy's decision."""
    import caliper
    from caliper._pb import caliper_pb2 as pb
    client = caliper.Client(address)
    with open(os.path.join(model_dir, "config.json")) as f:
        model_description = pb.ModelDescription(hf_config_json=f.read())
    client.stub.CreateFleet(pb.CreateFleetRequest(
        name=name, model=model_description, recipe=caliper.Recipe(kv="per_head").to_proto(),
        engine=pb.ENGINE_KIND_VLLM, policy=pb.PublishPolicy(min_tokens=1)), timeout=30)
    window = client.stub.OpenWindow(pb.OpenWindowRequest(fleet=name, weight_version="step-0"),
                                    timeout=30)
    session = client.session(window.session_id)
    tiny_llama.feed(model, session, calibration)
    session.flush()
    closed = client.stub.CloseWindow(pb.CloseWindowRequest(fleet=name,
                                                           session_id=window.session_id),
                                     timeout=30)
    heads = model.config.num_key_value_heads
    scales = {layer.layer: (tiny_llama._per_head(layer.k_scale, heads),
                            tiny_llama._per_head(layer.v_scale, heads))
              for layer in client.session(window.session_id).scales(tp=1).kv_layers}
    return scales, f"{closed.decision} (version {closed.version})"


def report(build, address, session, work):
    out = os.path.join(work, f"report-{session.id}")
    subprocess.run([f"{build}/client/caliper", "report", f"--server={address}",
                    f"--session={session.id}", f"--out={out}"], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def recommended(rep, static, mse):
    """Per layer and K/V: mse's scales where the report recommends mse, else static_minmax's."""
    out, chosen = {}, []
    for layer in rep["kv"]["layers"]:
        i = layer["layer"]
        pick = [layer[t]["recommended"] == "mse" for t in ("K", "V")]
        chosen += [f"L{i}{t}" for t, p in zip("KV", pick) if p]
        out[i] = tuple((mse if p else static)[i][j] for j, p in enumerate(pick))
    return out, chosen


def outliers(rep, record, threshold=4.0):
    """Outlier heads as the report flags them, and channels whose absmax is >= threshold x the
    median channel absmax of their layer's K (or V)."""
    heads, channels = [], []
    for layer in rep["kv"]["layers"]:
        for t in ("K", "V"):
            for h, head in enumerate(layer[t]["heads"]):
                if head.get("outlier"):
                    heads.append(f"L{layer['layer']}{t}h{h} ({head['absmax']:.3g})")
    for layer, kvs in sorted(record.items()):
        for j, t in enumerate("KV"):
            x = torch.cat([kv[j] for kv in kvs], dim=2)  # [1, heads, tokens, dim]
            amax = x.abs().amax(dim=(0, 2)).reshape(-1)
            med = amax.median()
            for c in (amax >= threshold * med).nonzero().reshape(-1).tolist():
                channels.append(f"L{layer}{t}c{c} ({amax[c] / med:.1f}x)")
    return heads, channels


def one_seed(args, model, model_dir, address, seed, work, train, held):
    calibration = tiny_llama.windows(train, CALIBRATION, SEQ, 100 + seed)
    evaluation = tiny_llama.windows(held, EVALUATION, SEQ, 200 + seed)
    ref = tiny_llama.log_probs(model, evaluation)
    rows = {}  # (row name, kv) -> scales
    for kv in KV:
        rows[("scale 1.0 (vLLM default)", kv)] = tiny_llama.unit_scales(model)
    rows[("vLLM calculate_kv_scales (first batch)", "per_tensor")] = vllm_first_batch(
        model, calibration)
    for kv, strategy in zip(KV, ("tensor", "attn_head")):
        t0 = time.time()
        rows[("llm-compressor oneshot defaults", kv)] = llmc_oneshot(
            model_dir, calibration, strategy, work)
        print(f"seed {seed}: llm-compressor {strategy} {time.time() - t0:.0f} s", file=sys.stderr)
    extra = {}
    for kv in KV:
        for observer in OBSERVERS:
            session, scales = tiny_llama.caliper_session(
                model, address, model_dir, calibration, kv=kv, observer=observer,
                histograms=observer == "static_minmax", name=f"seed{seed} {kv} {observer}")
            rows[(f"Caliper {observer}", kv)] = scales
            if observer == "static_minmax":
                rep = report(args.build, address, session, work)
        if kv == "per_head":
            rows[("fleet window fed by the hooks", kv)], extra["fleet"] = fleet_window(
                model, address, model_dir, calibration, f"evidence-seed{seed}")
        rows[("report's recommendation", kv)], extra[kv] = recommended(
            rep, rows[("Caliper static_minmax", kv)], rows[("Caliper mse", kv)])
        if kv == "per_head":
            record = {}
            with torch.no_grad(), tiny_llama.fp8_kv(record=record):
                for x in calibration[:4]:
                    model(x[None], use_cache=False)
            extra["outliers"] = outliers(rep, record)
            extra["absmax"] = {t: max(h["absmax"] for layer in rep["kv"]["layers"]
                                      for h in layer[t]["heads"]) for t in ("K", "V")}
    results = {key: tiny_llama.evaluate(model, evaluation, ref, scales)
               for key, scales in rows.items()}
    ppl_ref = tiny_llama.evaluate(model, evaluation, ref, None)[0]
    return results, ppl_ref, extra


def rescaled(model, work):
    """--rescale: the same function with K x64 and V of even KV heads x64, of odd ones / 4096
    (tiny_llama.rescale_kv), saved to work/rescaled (llm-compressor and vLLM load a directory)."""
    heads = model.config.num_key_value_heads
    model = tiny_llama.rescale_kv(model, [64.0] * heads,
                                  [64.0 if h % 2 == 0 else 1 / 4096 for h in range(heads)])
    model_dir = os.path.join(work, "rescaled")
    model.config._attn_implementation_internal = "sdpa"
    model.save_pretrained(model_dir)
    model.config._attn_implementation_internal = "fp8_kv"
    tiny_llama.save_tokenizer(model_dir)
    return model, model_dir


def run_seeds(args, one_seed, model, model_dir, seeds, work, train, held):
    """one_seed(args, model, model_dir, address, seed, work, train, held) for each seed, against
    one caliper-server of args.build."""
    server, address = start_server(args.build)
    per_seed = []
    try:
        for seed in seeds:
            t0 = time.time()
            per_seed.append(one_seed(args, model, model_dir, address, seed, work, train, held))
            print(f"seed {seed}: {time.time() - t0:.0f} s", file=sys.stderr)
    finally:
        server.terminate()
        server.wait()
    return per_seed


def fmt(values, spec):
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.mean(values), spec)} ± {format(statistics.stdev(values), spec)}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--size", default="test", choices=sorted(tiny_llama.SIZES))
    ap.add_argument("--model-seed", type=int, default=0)
    ap.add_argument("--seeds", default="0,1,2", help="calibration/evaluation sample seeds")
    ap.add_argument("--model", help="a model directory instead of the cached --size/--model-seed")
    ap.add_argument("--rescale", action="store_true",
                    help="the same function reparametrised (tiny_llama.rescale_kv): K x64, V of "
                         "even KV heads x64 and of odd ones / 4096, as trained models' K/V reach")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    seeds = [int(s) for s in args.seeds.split(",")]
    model_dir = args.model or tiny_llama.model_dir(args.size, args.model_seed)
    model = tiny_llama.load(model_dir)
    train, held, _ = tiny_llama.corpus()
    with open(os.path.join(model_dir, "training.json")) as f:
        info = json.load(f)
    work = tempfile.mkdtemp(prefix="kv-evidence-")
    if args.rescale:
        model, model_dir = rescaled(model, work)
    per_seed = run_seeds(args, one_seed, model, model_dir, seeds, work, train, held)
    names = list(dict.fromkeys(name for name, _ in per_seed[0][0]))
    print(f"model {os.path.basename(model_dir)}: {info['parameters']} parameters, held-out "
          f"perplexity {info['held_out_perplexity']:.2f} (uniform 256); {CALIBRATION} calibration "
          f"x {SEQ} bytes, {EVALUATION} evaluation x {SEQ} bytes, seeds {args.seeds}"
          + ("; rescaled (K x64, V x64 / x1/4096)" if args.rescale else ""))
    print(f"unquantised perplexity on the evaluation windows: "
          f"{fmt([p for _, p, _ in per_seed], '.4f')}\n")
    print("| scales | per tensor: perplexity | per tensor: KL (nats/token) "
          "| per head: perplexity | per head: KL (nats/token) |")
    print("|---|---|---|---|---|")
    for name in names:
        cells = []
        for kv in KV:
            got = [r[(name, kv)] for r, _, _ in per_seed if (name, kv) in r]
            cells += ([fmt([g[0] for g in got], ".4f"), fmt([g[1] for g in got], ".3e")]
                      if got else ["", ""])
        print(f"| {name} | " + " | ".join(cells) + " |")
    for seed, (_, _, extra) in zip(seeds, per_seed):
        heads, channels = extra["outliers"]
        print(f"\nseed {seed}: fleet window: {extra['fleet']}")
        print(f"seed {seed}: K/V absmax {extra['absmax']}; report recommends mse on "
              f"per tensor {extra['per_tensor'] or 'none'}, per head {extra['per_head'] or 'none'}"
              f"\n  outlier heads (report): {', '.join(heads) or 'none'}"
              f"\n  outlier channels (>= 4x the layer's median channel absmax): "
              f"{len(channels)}" + (f", e.g. {', '.join(channels[:4])}" if channels else ""))
    print(f"\nwork dir {work}")


if __name__ == "__main__":
    main()
