"""The vLLM plugin on a GPU, in vLLM's default mode (piecewise and full CUDA graphs): for a user's
machine with a GPU and vLLM 0.32 installed with this package. UNVERIFIED: it has not run on a GPU
machine yet (the one lent to this project has no vLLM); the CPU build's equivalents are the tests
in tests/python/vllm_plugin_test.py.

Prints one summary:
  - the K/V tokens the plugin sampled per step kind (prefill, mixed, decode: decode batches run
    in full CUDA graphs, so decode at 0 with the others growing means the captured ops do not
    run on replay);
  - the window's per-head absmax against an eager (--enforce-eager) process's on the same
    requests;
  - the switch to the published version (the scales every layer holds);
  - with an FP8 KV cache, greedy tokens and prompt logprobs after the switch against a fresh
    default-mode process started from the merged checkpoint (`caliper merge`): bit-identical?
usage: python bench/vllm_plugin_gpu_check.py --build build [--kv-cache-dtype fp8]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_support import start_server  # noqa: E402

SCRIPT = r"""
import json, sys, time
import torch, vllm
import caliper, caliper.vllm as plugin
from caliper import fleets
mode, model_dir, prompts, kv, address, fleet = sys.argv[1:7]
prompts = json.loads(prompts)
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=mode == "eager",
               kv_cache_dtype=kv, dtype="bfloat16", max_model_len=512,
               gpu_memory_utilization=0.3)
greedy = vllm.SamplingParams(max_tokens=16, temperature=0, prompt_logprobs=2)
def run():
    return [[list(o.outputs[0].token_ids),
             [{str(k): v.logprob for k, v in d.items()} for d in o.prompt_logprobs[1:]]]
            for o in llm.generate([{"prompt_token_ids": p} for p in prompts], greedy,
                                  use_tqdm=False)]
out = {}
if mode in ("live", "eager"):
    client = caliper.Client(address)
    state = lambda: llm.collective_rpc("caliper_state")[0]
    deadline = time.time() + 120
    while not state()["window"]:
        assert time.time() < deadline; time.sleep(0.2)
    run()
    time.sleep(3)
    s = state()
    out["tokens_by_kind"], out["sampled"] = s["tokens_by_kind"], s["total_sampled_tokens"]
    w = fleets.close_window(client, fleet, weight_version="initial")
    out["window"], out["version"] = w.session_id, w.version
    layers = client.session(w.session_id).scales().kv_layers
    out["absmax"] = [[l.k_absmax, l.v_absmax] for l in layers]
    deadline = time.time() + 120
    while plugin.engine_versions["pending"] != 1:
        assert time.time() < deadline; time.sleep(0.2)
out["outputs"] = run()
def held(model):
    from vllm.model_executor.layers.attention.attention import Attention
    return {n: [m._k_scale_float, m._v_scale_float] for n, m in model.named_modules()
            if isinstance(m, Attention)}
out["held"] = llm.apply_model(held)[0]
print(json.dumps(out))
"""


def run(args: list, env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], env=env,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr[-6000:])
    return json.loads(next(line for line in reversed(r.stdout.splitlines())
                           if line.startswith("{")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build", type=pathlib.Path)
    ap.add_argument("--kv-cache-dtype", default="fp8")
    args = ap.parse_args()
    import torch
    import transformers

    import caliper
    from caliper import fleets
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512,
                                       num_hidden_layers=4, num_attention_heads=8,
                                       num_key_value_heads=2, head_dim=64, vocab_size=1024,
                                       max_position_embeddings=1024)
        cfg.architectures = ["LlamaForCausalLM"]
        transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp / "model")
        config = json.loads((tmp / "model" / "config.json").read_text())
        g = torch.Generator().manual_seed(1)
        prompts = json.dumps([torch.randint(3, 1024, (int(n),), generator=g).tolist()
                              for n in torch.randint(8, 96, (12,), generator=g)])
        proc, address, _ = start_server(args.build, tmp)
        try:
            client = caliper.Client(address)
            for fleet in ("live", "eager"):
                fleets.create_fleet(client, fleet, config, caliper.Recipe(kv="per_head"),
                                    min_tokens=16)
            base = {k: v for k, v in os.environ.items() if not k.startswith("CALIPER_")}
            base["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            on = dict(base, CALIPER_SERVER=address, CALIPER_SAMPLE_FRACTION="1")
            kv = args.kv_cache_dtype
            live = run(["live", tmp / "model", prompts, kv, address, "live"],
                       dict(on, CALIPER_FLEET="live"))
            eager = run(["eager", tmp / "model", prompts, kv, address, "eager"],
                        dict(on, CALIPER_FLEET="eager"))
            client.session(live["window"]).scales(formats=["compressed-tensors"],
                                                  out=tmp / "s")
            subprocess.run([str(args.build / "client" / "caliper"), "merge", "--checkpoint",
                            str(tmp / "model"), "--scales",
                            str(tmp / "s" / "compressed_tensors_scales.safetensors"), "--out",
                            str(tmp / "merged"), "--kv-only"], check=True)
            fresh = run(["fresh", tmp / "merged", prompts, kv, address, ""], base)
        finally:
            proc.kill()
            proc.wait()
    worst = max(abs(a - b) / b for x, y in zip(live["absmax"], eager["absmax"])
                for xs, ys in zip(x, y) for a, b in zip(xs, ys))
    print(f"gpu: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
    print(f"sampled tokens by step kind (default mode): {live['tokens_by_kind']} "
          f"(eager: {eager['tokens_by_kind']})")
    print(f"per-head absmax, default vs eager: worst relative difference {worst:.4g}")
    print(f"switch: version {live['version']} applied; scales held {live['held']}")
    same = live["outputs"] == fresh["outputs"] and live["held"] == fresh["held"]
    print(f"{kv} cache after the switch vs a fresh process on the merged checkpoint: "
          f"{'bit-identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
