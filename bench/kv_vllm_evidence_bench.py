"""The FP8 KV evidence's headline rows through vLLM's own FP8 KV cache (its CPU build's prompt
logprobs), beside the torch fake-quantisation kv_evidence_bench.py uses, in one run.

For each row the scales go into a checkpoint the way a user ships them (`caliper merge
--kv-only` of a compressed-tensors scale file: Caliper's sessions through `Session.scales`, the
torch-derived rows through a file written here), vLLM loads it with `kv_cache_dtype="fp8"`, and
its prompt logprobs over the whole byte vocabulary give perplexity and KL to the same engine with
an unquantised cache (`kv_cache_dtype="auto"`, float32). vLLM's CPU attention writes K/V into the
cache first and then attends over the cache for prefill as for decode (cpu_attn.py:
do_kv_cache_update, then cpu_attention_with_kv_cache), so every prompt position reads FP8 K/V.
It takes one float per layer and rank (`_k_scale_float`, `_v_scale_float`): per-head scales
reach its kernel as the maximum over the rank's heads (--tp 2 with 2 KV heads: one head a rank). It rounds x / scale toward zero, saturating at +-448 (tests/peers/
vllm_fp8_rounding_test.py). Each row is also evaluated in torch twice: as vLLM's CPU build stores
it (one scale per layer and rank, toward zero), and as a CUDA engine rounds (to nearest even, per head
where the scales are per head), the kv_evidence_bench.py numbers.

Rows: scale 1.0 (a checkpoint without scales), vLLM's calculate_kv_scales rule (first batch,
reproduced in torch as in kv_evidence_bench.py), Caliper static_minmax and mse, per tensor and per
head. Needs an x86 CPU with AVX-512 or AMX (vLLM's CPU FP8 KV cache) or a CUDA device.

usage: $(scripts/python-client-env.sh build/python-env-vllm vllm)/bin/python
       bench/kv_vllm_evidence_bench.py --build build [--size test|bench] [--seeds 0,1,2]
       [--model-seed 0] [--rescale] [--tp 1]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import kv_evidence_bench as evidence  # noqa: E402
import tiny_llama  # noqa: E402

VOCAB = 256
ENGINE = dict(enforce_eager=True, dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=128 << 20, max_logprobs=VOCAB)

# One engine per process (vLLM keeps per-process state). argv: model dir, kv_cache_dtype, the
# prompts (.pt), where to write the logprobs (.pt), engine kwargs (JSON). Prints the scales every
# attention layer of every TP rank applies, as JSON on its last line.
ENGINE_SCRIPT = r"""
import json, sys
import torch, vllm
model_dir, kv_dtype, prompts, out, engine = sys.argv[1:6]
ids = torch.load(prompts)
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, kv_cache_dtype=kv_dtype,
               **json.loads(engine))
params = vllm.SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=-1)
outs = llm.generate([{"prompt_token_ids": p} for p in ids.tolist()], params, use_tqdm=False)
lp = torch.full((ids.shape[0], ids.shape[1] - 1, 256), float("nan"))
for i, o in enumerate(outs):
    for j, d in enumerate(o.prompt_logprobs[1:]):
        lp[i, j, list(d.keys())] = torch.tensor([v.logprob for v in d.values()])
torch.save(lp, out)
def scales(worker):  # collective_rpc cloudpickles a callable to every rank
    from vllm.model_executor.layers.attention.attention import Attention
    return {n: [m._k_scale_float, m._v_scale_float]
            for n, m in worker.model_runner.get_model().named_modules()
            if isinstance(m, Attention)}
print(json.dumps({"applied": llm.collective_rpc(scales), "kv_cache_dtype": kv_dtype}))
"""


def run_engine(model_dir, kv_dtype, prompts, out, tp=1):
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    engine = dict(ENGINE)
    if tp > 1:  # one worker process per rank, each bound to its own core
        engine.update(tensor_parallel_size=tp, distributed_executor_backend="mp")
        cores = os.cpu_count() or 1
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(r % cores) for r in range(tp)))
    r = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT, model_dir, kv_dtype, prompts, out,
                        json.dumps(engine)], capture_output=True, text=True, env=env,
                       timeout=1200)
    if r.returncode != 0:
        sys.exit(f"vLLM on {model_dir} ({kv_dtype}) failed:\n{r.stdout[-2000:]}{r.stderr[-6000:]}")
    result = json.loads(next(line for line in reversed(r.stdout.strip().splitlines())
                             if line.startswith("{")))
    return torch.load(out), result["applied"]


def metrics(logp, ref, ids):
    """(perplexity, mean KL(ref || logp) in nats per token, non-finite logprobs) over ids."""
    bad = int((~torch.isfinite(logp)).sum())
    nll = -logp.gather(-1, ids[:, 1:, None]).mean().item()
    kl = (ref.exp() * (ref - logp)).sum(-1).mean().item()
    return math.exp(nll), kl, bad


def write_scale_file(path, scales):
    """A compressed-tensors scale file of {layer: (k [heads], v [heads])}, per tensor when every
    head has one value."""
    tensors = {}
    for layer, (k, v) in scales.items():
        for name, t in (("k", k), ("v", v)):
            t = t.float().reshape(-1)
            tensors[f"model.layers.{layer}.self_attn.{name}_scale"] = (
                t[:1].reshape([]).clone() if bool((t == t[0]).all()) else t.clone())
    save_file(tensors, path, metadata={"format": "pt", "caliper.format": "compressed-tensors"})


def merged(build, model_dir, scale_file, out):
    subprocess.run([f"{build}/client/caliper", "merge", "--checkpoint", model_dir, "--scales",
                    scale_file, "--out", out, "--kv-only"], check=True, capture_output=True)
    return out


def rank_max(t, tp):
    """Per head, the scale vLLM's CPU kernel applies to the head at TP size tp: the max over
    the heads of its rank (heads split evenly; with more ranks than heads, one head a rank)."""
    heads = t.numel()
    if heads < tp:
        return t.clone()
    return t.reshape(tp, heads // tp).amax(1).repeat_interleave(heads // tp)


def as_ranks(scales, tp):
    return {layer: (rank_max(k, tp), rank_max(v, tp)) for layer, (k, v) in scales.items()}


def one_seed(args, model, model_dir, address, seed, work, train, held):
    calibration = tiny_llama.windows(train, evidence.CALIBRATION, evidence.SEQ, 100 + seed)
    evaluation = tiny_llama.windows(held, evidence.EVALUATION, evidence.SEQ, 200 + seed)
    prompts = os.path.join(work, f"prompts-{seed}.pt")
    torch.save(evaluation, prompts)
    ref_torch = tiny_llama.log_probs(model, evaluation)
    ref_vllm, _ = run_engine(model_dir, "auto", prompts, os.path.join(work, f"ref-{seed}.pt"),
                             args.tp)
    # The two unquantised references, to show the engine computes the model the torch rows do.
    ref_gap = metrics(ref_vllm, ref_torch, evaluation)
    rows = []  # (name, kv, torch scales, checkpoint)
    rows.append(("scale 1.0 (no scales in the checkpoint)", "per_tensor",
                 tiny_llama.unit_scales(model), model_dir))
    first = evidence.vllm_first_batch(model, calibration)
    path = os.path.join(work, f"first-batch-{seed}.safetensors")
    write_scale_file(path, first)
    rows.append(("vLLM calculate_kv_scales (first batch)", "per_tensor", first,
                 merged(args.build, model_dir, path, os.path.join(work, f"m-first-{seed}"))))
    for observer in ("static_minmax", "mse"):
        for kv in evidence.KV:
            session, scales = tiny_llama.caliper_session(
                model, address, model_dir, calibration, kv=kv, observer=observer,
                name=f"vllm seed{seed} {kv} {observer}")
            files = os.path.join(work, f"s-{seed}-{kv}-{observer}")
            session.scales(tp=1, formats=["compressed-tensors"], out=files)
            rows.append((f"Caliper {observer}", kv, scales, merged(
                args.build, model_dir, os.path.join(files, "compressed_tensors_scales.safetensors"),
                os.path.join(work, f"m-{seed}-{kv}-{observer}"))))
    heads = model.config.num_key_value_heads
    rank_heads = [min(r * heads // args.tp, heads - 1) for r in range(args.tp)]  # one of rank r
    results = {}
    for name, kv, scales, checkpoint in rows:
        t0 = time.time()
        logp, applied = run_engine(checkpoint, "fp8", prompts,
                                   os.path.join(work, f"lp-{seed}-{len(results)}.pt"), args.tp)
        nearest = tiny_llama.evaluate(model, evaluation, ref_torch, scales)
        # The engine in torch: one scale per layer and rank, rounded toward zero (tests/peers/
        # vllm_fp8_rounding_test.py checks that this is how vLLM's CPU cache rounds).
        at_ranks = as_ranks(scales, args.tp)
        as_vllm_cpu = tiny_llama.evaluate(model, evaluation, ref_torch, at_ranks,
                                          rounding="toward_zero")
        want = [[[float(k[h]), float(v[h])] for _, (k, v) in sorted(at_ranks.items())]
                for h in rank_heads]
        got = [[rank[n] for n in sorted(rank, key=lambda n: int(n.split(".")[2]))]
               for rank in applied]
        results[(name, kv)] = dict(vllm=metrics(logp, ref_vllm, evaluation), nearest=nearest,
                                   as_vllm_cpu=as_vllm_cpu,
                                   applied_ok=all(math.isclose(a, b, rel_tol=1e-6)
                                                  for gr, wr in zip(got, want)
                                                  for g, w in zip(gr, wr) for a, b in zip(g, w)))
        print(f"seed {seed}: {name} {kv}: {time.time() - t0:.0f} s, applied {got[0][:1]}...",
              file=sys.stderr)
    return results, ref_gap


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--size", default="test", choices=sorted(tiny_llama.SIZES))
    ap.add_argument("--model-seed", type=int, default=0)
    ap.add_argument("--seeds", default="0,1,2", help="calibration/evaluation sample seeds")
    ap.add_argument("--tp", type=int, default=1, help="vLLM's tensor-parallel size (worker "
                    "processes; the CPU kernel takes one scale per rank and layer)")
    ap.add_argument("--rescale", action="store_true",
                    help="as kv_evidence_bench.py --rescale: K x64, V of even KV heads x64 and of "
                         "odd ones / 4096")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    seeds = [int(s) for s in args.seeds.split(",")]
    model_dir = tiny_llama.model_dir(args.size, args.model_seed)
    model = tiny_llama.load(model_dir)
    train, held, _ = tiny_llama.corpus()
    work = tempfile.mkdtemp(prefix="kv-vllm-evidence-")
    if args.rescale:
        model, model_dir = evidence.rescaled(model, work)
    per_seed = evidence.run_seeds(args, one_seed, model, model_dir, seeds, work, train, held)
    print(f"model {os.path.basename(model_dir)}" + (" rescaled (K x64, V x64 / x1/4096)"
                                                     if args.rescale else "")
          + f"; vLLM TP {args.tp}; {evidence.CALIBRATION} calibration x {evidence.SEQ} bytes, "
          f"{evidence.EVALUATION} evaluation x {evidence.SEQ} bytes, seeds {args.seeds}")
    gaps = [g for _, g in per_seed]
    print(f"vLLM unquantised cache vs torch float32: perplexity {evidence.fmt([g[0] for g in gaps], '.4f')}"
          f", KL {evidence.fmt([g[1] for g in gaps], '.3e')} nats/token\n")
    print("| scales | kv | vLLM fp8 cache: perplexity | vLLM: KL (nats/token) | torch as vLLM CPU "
          "stores it: KL | torch, nearest even, scales as calibrated: KL | non-finite vLLM "
          "logprobs | vLLM applied the scales |")
    print("|---|---|---|---|---|---|---|---|")
    for key in per_seed[0][0]:
        got = [r[key] for r, _ in per_seed]
        print(f"| {key[0]} | {key[1].replace('_', ' ')} | "
              f"{evidence.fmt([g['vllm'][0] for g in got], '.4f')} | "
              f"{evidence.fmt([g['vllm'][1] for g in got], '.3e')} | "
              f"{evidence.fmt([g['as_vllm_cpu'][1] for g in got], '.3e')} | "
              f"{evidence.fmt([g['nearest'][1] for g in got], '.3e')} | "
              f"{sum(g['vllm'][2] for g in got)} | "
              f"{'yes' if all(g['applied_ok'] for g in got) else 'NO'} |")
    print(f"\nwork dir {work}")


if __name__ == "__main__":
    main()
