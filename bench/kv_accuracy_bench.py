"""Accuracy of FP8 KV-cache scales, measured: KL divergence of next-token distributions.

A tiny Llama (transformers, seeded random weights: no small pretrained model ships on PyPI)
with outlier channels injected into K and V as client/demo/demo_data.cc does, and a sharpened
lm_head so next-token distributions are peaked. Its post-RoPE K/V on calibration sequences are
dumped as Caliper dumps and calibrated by the real caliper-server for each observer; the same
K/V go through llm-compressor's own observers. Then K and V are fake-quantized to FP8 E4M3
(per head) with each set of scales, and with unit scales (what vLLM uses uncalibrated), and the
mean KL(p_ref || p_quant) over held-out tokens is reported.

usage: python bench/kv_accuracy_bench.py --build build [--out DIR]   (venv: scripts/python-env.sh tools)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

LAYERS, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, VOCAB = 4, 8, 4, 32, 256, 512
CALIB, HELD_OUT, SEQ = 16, 16, 128

STATE = {"mode": "off", "kv": {}, "scales": None}
KV = {"granularity": "per-head"}  # --kv: per-head or per-tensor scales, for every row


def per_head(scale):
    """A scale list as [KV_HEADS] (a per-tensor scale repeated)."""
    t = torch.as_tensor(scale, dtype=torch.float32).reshape(-1)
    return t.expand(KV_HEADS).clone() if t.numel() == 1 else t


def fp8_fake_quant(x, scale):
    """x [b, heads, seq, d], scale [heads]: s * fp8(clamp(x / s))."""
    s = scale.to(x.dtype).view(1, -1, 1, 1)
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype) * s


def attention(module, query, key, value, attention_mask, **kwargs):
    layer = module.layer_idx
    if STATE["mode"] == "collect":
        STATE["kv"].setdefault(layer, {"k": [], "v": []})
        STATE["kv"][layer]["k"].append(key.detach().clone())
        STATE["kv"][layer]["v"].append(value.detach().clone())
    elif STATE["mode"] == "quant":
        ks, vs = STATE["scales"][layer]
        key, value = fp8_fake_quant(key, ks), fp8_fake_quant(value, vs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def build_model(outlier):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=256, attn_implementation="caliper_fq")
    cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            att = layer.self_attn
            # An outlier K head with two hot channels and a V head with one (demo_data's shape).
            kh, vh = i % KV_HEADS, (i + 1) % KV_HEADS
            for c in (3, 17):
                att.k_proj.weight[kh * HEAD_DIM + c] *= outlier
            att.v_proj.weight[vh * HEAD_DIM + 5] *= outlier * 2 / 3
            att.k_proj.weight[(kh + 2) % KV_HEADS * HEAD_DIM + 9] *= 4.0
        model.lm_head.weight *= 12.0
    return model


def tokens(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, SEQ), generator=g)


def run_server(build):
    server = subprocess.Popen([f"{build}/server/caliper-server", "--listen=127.0.0.1:0",
                               "--metrics_listen="], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    for line in server.stdout:
        m = re.match(r"caliper-server listening on (\S+)", line)
        if m:
            break
    if not m:
        server.kill()
        sys.exit(f"caliper-server did not start: {line}")
    return server, m.group(1)


def caliper_scales(build, addr, work, observer):
    out = os.path.join(work, "out-" + observer.replace(":", "_"))
    subprocess.run([f"{build}/client/caliper", "calibrate", f"--server={addr}",
                    f"--model={work}/config.json", f"--tensors={work}/dumps", f"--out={out}",
                    f"--kv-observer={observer}", f"--kv={KV['granularity']}",
                    "--name=" + observer], check=True, stdout=subprocess.DEVNULL)
    d = json.load(open(os.path.join(out, "scales.json")))
    return {l["layer"]: (per_head(l["k_scale"]), per_head(l["v_scale"]))
            for l in d["kv_cache"]["layers"]}


def llmc_scales(name):
    from compressed_tensors.quantization import QuantizationArgs
    from llmcompressor.observers import Observer
    out = {}
    for layer, kv in STATE["kv"].items():
        pair = []
        for base in ("k", "v"):
            # As llm-compressor's own KV calibration builds and calls it (modifiers/quantization/
            # calibration.py: load_from_registry, then observer(key_states) per forward pass).
            strategy = "attn_head" if KV["granularity"] == "per-head" else "tensor"
            args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True,
                                    dynamic=False, observer=name)
            obs = Observer.load_from_registry(name, base_name=base, args=args)
            for x in kv[base]:
                obs(x)
            pair.append(per_head(obs.get_qparams()["scale"].float()))
        out[layer] = tuple(pair)
    return out


def kl(model, ids, ref_logp, scales):
    STATE["mode"], STATE["scales"] = "quant", scales
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), -1)
    STATE["mode"] = "off"
    per_token = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
    return per_token.mean().item(), per_token.max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None)
    ap.add_argument("--outlier", type=float, default=12.0,
                    help="factor on the outlier K channels (V: 2/3 of it); 400 puts K beyond 448")
    ap.add_argument("--kv", default="per-head", choices=["per-head", "per-tensor"],
                    help="scale granularity of every row (llm-compressor: attn_head / tensor)")
    ap.add_argument("--sensitivity", action="store_true",
                    help="also rows of static_minmax's scales times 0.98..1.02: how much KL moves "
                         "for a scale change far smaller than any observer's")
    ap.add_argument("--jitter", action="store_true",
                    help="also the median (and range) of KL over each row's scales times "
                         "0.99..1.01 (9 points): a ranking that survives it is not rounding luck")
    args = ap.parse_args()
    KV["granularity"] = args.kv
    build = os.path.abspath(args.build)
    work = args.out or tempfile.mkdtemp(prefix="kv-accuracy-")
    os.makedirs(f"{work}/dumps", exist_ok=True)
    AttentionInterface.register("caliper_fq", attention)
    model = build_model(args.outlier)
    model.config.to_json_file(f"{work}/config.json")
    calib, held = tokens(1, CALIB), tokens(2, HELD_OUT)
    STATE["mode"] = "collect"
    with torch.no_grad():
        for b in range(CALIB):
            model(calib[b:b + 1])
    STATE["mode"] = "off"
    for b in range(CALIB):  # one dump per forward pass: [tokens, kv_heads, head_dim]
        tensors = {}
        for layer, kv in STATE["kv"].items():
            for base in ("k", "v"):
                tensors[f"model.layers.{layer}.self_attn.{base}"] = (
                    kv[base][b][0].transpose(0, 1).contiguous().float())
        save_file(tensors, f"{work}/dumps/batch{b:03d}.safetensors", metadata={"batch": str(b)})
    with torch.no_grad():
        ref_logp = torch.log_softmax(model(held).logits.float(), -1)

    rows = []
    unit = {l: (torch.ones(KV_HEADS), torch.ones(KV_HEADS)) for l in range(LAYERS)}
    rows.append(("unit scales (1.0)", "vLLM uncalibrated", unit))
    server, addr = run_server(build)
    try:
        for obs in ("static_minmax", "percentile:99.99", "percentile:99.9", "mse"):
            t0 = time.time()
            rows.append((obs, "Caliper", caliper_scales(build, addr, work, obs)))
            print(f"caliper {obs}: {time.time() - t0:.1f} s", file=sys.stderr)
    finally:
        server.terminate()
        server.wait()
    for obs in ("static_minmax", "minmax", "memoryless_mse", "mse"):
        rows.append((obs, "llm-compressor 0.14", llmc_scales(obs)))
    if args.sensitivity:
        for f in (0.98, 0.99, 0.995, 1.005, 1.01, 1.02):
            rows.append((f"static_minmax x {f}", "Caliper, scaled",
                         {l: (k * f, v * f) for l, (k, v) in rows[1][2].items()}))
    jitter = [1 + i / 400 for i in range(-4, 5)] if args.jitter else []
    head = ("| observer | scales from | mean KL (nats/token) | max KL | KL / KL(static_minmax) "
            "| mean k_scale / static |")
    print(head + (" median KL, scales x 0.99..1.01 | its range | median / static's median |"
                  if jitter else ""))
    print("|---|---|---|---|---|---|" + ("---|---|---|" if jitter else ""))
    base_kl = None
    static = rows[1][2]
    results = []
    base_median = None
    for name, source, scales in rows:
        mean, worst = kl(model, held, ref_logp, scales)
        spread = sorted(kl(model, held, ref_logp, {l: (k * f, v * f)
                                                   for l, (k, v) in scales.items()})[0]
                        for f in jitter)
        if source == "Caliper" and name == "static_minmax":
            base_kl = mean
            base_median = spread[len(spread) // 2] if spread else None
        results.append((name, source, scales, mean, worst, spread))
    for name, source, scales, mean, worst, spread in results:
        ratio = sum((scales[l][0] / static[l][0]).mean().item() for l in range(LAYERS)) / LAYERS
        line = (f"| {name} | {source} | {mean:.3e} | {worst:.3e} | {mean / base_kl:.3f} "
                f"| {ratio:.3f} |")
        if spread:
            median = spread[len(spread) // 2]
            line += (f" {median:.3e} | {spread[0]:.2e}..{spread[-1]:.2e} "
                     f"| {median / base_median:.3f} |")
        print(line)
    kmax = max(x.abs().max().item() for kv in STATE["kv"].values() for x in kv["k"])
    vmax = max(x.abs().max().item() for kv in STATE["kv"].values() for x in kv["v"])
    print(f"\noutlier factor {args.outlier}, {args.kv} scales: K absmax {kmax:.4g}, "
          f"V absmax {vmax:.4g}")
    print(f"{CALIB} calibration and {HELD_OUT} held-out sequences of {SEQ} tokens; work dir {work}")


if __name__ == "__main__":
    main()
