#!/usr/bin/env python3
"""FP8 query evidence: what a q_scale of 1.0 costs against a calibrated one.

On the trained tiny Llama (scripts/tiny_llama.py, cached), the query after RoPE is fake-quantised
to FP8 E4M3 inside attention as an engine's FP8 attention quantizes it (vLLM's static
`query_quant`: q / q_scale saturated at +-448, rounded by torch's float8_e4m3fn cast, times
q_scale), per tensor or per KV head (the query heads of one KV group share a scale, vLLM's
GroupShape(-1, head_dim * num_heads / num_kv_heads)). K and V stay unquantised, so the numbers
are the query's alone. Compared: scale 1.0 (what SGLang ran and vLLM keeps without a checkpoint
q_scale) and Caliper's calibrated q_scale (recipe attention q, static min/max: absmax / 448 per KV
head, or the max over heads per tensor) computed from the calibration windows the same way the
server does. Perplexity and mean KL(reference || quantised) per token over held-out windows.

Two models: the model as trained, and the same function with every query 2^k times larger and
every key 2^-k times smaller (q.k unchanged, exact in float32: powers of two), the magnitudes some
trained models show (Gemma's large query norms), where a unit scale saturates.

usage: nice -n 10 $(scripts/python-env.sh tools)/bin/python bench/q_evidence_bench.py [--factor 9]
"""
import argparse
import copy
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import tiny_llama  # noqa: E402

CALIBRATION, EVALUATION, SEQ = 32, 48, 128
_Q = {"scale": None, "record": None}


def fake_quant_q(q: torch.Tensor, scale: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q [batch, q_heads, seq, head_dim]; scale [kv_heads] (one per KV group) or [1]."""
    b, h, s, d = q.shape
    grouped = q.reshape(b, kv_heads, h // kv_heads, s, d)
    sc = scale.to(q.dtype).reshape(1, -1, 1, 1, 1)
    quant = (grouped / sc).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(q.dtype) * sc
    return quant.reshape(b, h, s, d)


def _attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    kv_heads = key.shape[1]
    if _Q["record"] is not None:
        b, h, s, d = query.shape
        grouped = query.detach().reshape(b, kv_heads, h // kv_heads, s, d)
        absmax = grouped.abs().amax(dim=(0, 2, 3, 4))
        prev = _Q["record"].get(module.layer_idx)
        _Q["record"][module.layer_idx] = absmax if prev is None else torch.maximum(prev, absmax)
    if _Q["scale"] is not None:
        query = fake_quant_q(query, _Q["scale"][module.layer_idx], kv_heads)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def run(model, ids, scale=None, record=None, batch=16):
    _Q.update(scale=scale, record=record)
    out = []
    try:
        with torch.no_grad():
            for i in range(0, len(ids), batch):
                logits = model(ids[i:i + batch], use_cache=False).logits[:, :-1].float()
                out.append(torch.log_softmax(logits, -1))
    finally:
        _Q.update(scale=None, record=None)
    return torch.cat(out)


def metrics(logp, ref, ids):
    nll = -logp.gather(-1, ids[:, 1:, None]).mean().item()
    kl = (ref.exp() * (ref - logp)).sum(-1).mean().item()
    return math.exp(nll), kl


def scale_query(model, factor):
    """Same function, queries `factor` times larger, keys 1/factor (a power of two: exact)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= factor
            layer.self_attn.k_proj.weight /= factor
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--factor", type=int, default=9, help="queries scaled by 2^factor")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    path = tiny_llama.model_dir("test", 0)
    base = tiny_llama.load(path)
    AttentionInterface.register("fp8_q", _attention)
    AttentionMaskInterface.register("fp8_q", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    base.config._attn_implementation_internal = "fp8_q"
    train, held, _ = tiny_llama.corpus()
    calibration = tiny_llama.windows(train, CALIBRATION, SEQ, 100 + args.seed)
    evaluation = tiny_llama.windows(held, EVALUATION, SEQ, 200 + args.seed)
    layers, kv_heads = base.config.num_hidden_layers, base.config.num_key_value_heads
    results = {}
    for label, model in (("as trained", base),
                         (f"queries x2^{args.factor}", scale_query(base, 2.0 ** args.factor))):
        ref = run(model, evaluation)
        record = {}
        run(model, calibration, record=record)
        per_head = {l: record[l] / 448.0 for l in range(layers)}
        per_tensor = {l: (record[l].max() / 448.0).reshape(1).expand(kv_heads).clone()
                      for l in range(layers)}
        unit = {l: torch.ones(kv_heads) for l in range(layers)}
        rows = {}
        for name, scale in (("q_scale 1.0", unit), ("calibrated per tensor", per_tensor),
                            ("calibrated per KV head", per_head)):
            ppl, kl = metrics(run(model, evaluation, scale=scale), ref, evaluation)
            rows[name] = {"perplexity": ppl, "kl": kl}
        ref_ppl = metrics(ref, ref, evaluation)[0]
        q_absmax = max(record[l].max().item() for l in range(layers))
        results[label] = {"reference_perplexity": ref_ppl, "query_absmax": q_absmax, **rows}
        print(f"{label}: reference perplexity {ref_ppl:.4f}, query absmax {q_absmax:.4g}")
        for name, r in rows.items():
            print(f"  {name:24s} perplexity {r['perplexity']:.4f}  KL {r['kl']:.3e} nats/token")
    print(json.dumps({"model": os.path.basename(path), "calibration": CALIBRATION,
                      "evaluation": EVALUATION, "seq": SEQ, "results": results}, indent=1))


if __name__ == "__main__":
    main()
