"""The vLLM plugin's cost: the same request loop on vllm.LLM (CPU build) with the plugin sampling
at its defaults vs without it (VLLM_PLUGINS excludes it), each in its own process, started in
alternating order; per mode the median over repeats of throughput (generated tokens/s of a
batch of requests) and of p99 latency (sequential single requests). Also the statistics bytes
the plugin sent per served token. Goals (issue): throughput ratio >= 0.97, p99 ratio <= 1.05.
usage: build/python-env-vllm/bin/python bench/vllm_plugin_bench.py --build build
       [--repeats 5] [--requests 64] [--fraction F]
(the venv of tests/python/run_pytest.sh with CALIPER_PYTHON_SET=vllm).
"""
import argparse
import json
import os
import pathlib
import statistics as stats
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_support import start_server  # noqa: E402 - the benches' one server start

LOOP = r"""
import json, os, sys, time
import vllm
model_dir, repeats, requests = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
               max_model_len=512, kv_cache_memory_bytes=256 << 20)
import random
rng = random.Random(0)
prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(64, 192))] for _ in range(requests)]
params = vllm.SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
run = lambda ps: llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)
run(prompts[:4])  # warm-up
throughput, p99, served = [], [], 0
for _ in range(repeats):
    t = time.perf_counter()
    outs = run(prompts)
    dt = time.perf_counter() - t
    throughput.append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
    served += sum(len(p) + 32 for p in prompts)
    lat = []
    for p in prompts[:32]:
        t = time.perf_counter()
        run([p])
        lat.append(time.perf_counter() - t)
    served += sum(len(p) + 32 for p in prompts[:32])
    lat.sort()
    p99.append(lat[min(len(lat) - 1, int(0.99 * len(lat)))])
state = {}
if os.environ.get("CALIPER_FLEET"):
    time.sleep(2)
    state = llm.collective_rpc("caliper_state")[0]
    state = {k: state[k] for k in ("sampled_steps", "steps", "total_sampled_tokens", "dropped",
                                   "wire_bytes", "sent")}
print(json.dumps({"throughput": throughput, "p99": p99, "served": served, "state": state}))
"""


def tiny_llama(directory: pathlib.Path) -> dict:
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                                   vocab_size=512, max_position_embeddings=1024)
    cfg.architectures = ["LlamaForCausalLM"]
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(directory)
    return json.loads((directory / "config.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build", type=pathlib.Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--fraction", help="CALIPER_SAMPLE_FRACTION (default: the plugin's)")
    args = ap.parse_args()
    import caliper
    from caliper import fleets
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        config = tiny_llama(tmp / "model")
        proc, address, _ = start_server(args.build, tmp)
        try:
            fleets.create_fleet(caliper.Client(address), "bench", config,
                                caliper.Recipe(kv="per_head"))
            base = {k: v for k, v in os.environ.items() if not k.startswith("CALIPER_")}
            base["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            on = dict(base, CALIPER_FLEET="bench", CALIPER_SERVER=address)
            if args.fraction:
                on["CALIPER_SAMPLE_FRACTION"] = args.fraction
            off = dict(base, VLLM_PLUGINS="none")
            results = {"on": [], "off": []}
            for order in (("off", "on"), ("on", "off")):
                for mode in order:
                    r = subprocess.run([sys.executable, "-c", LOOP, str(tmp / "model"),
                                        str(args.repeats), str(args.requests)],
                                       env=on if mode == "on" else off, capture_output=True,
                                       text=True)
                    if r.returncode:
                        raise SystemExit(r.stderr[-4000:])
                    lines = r.stdout.strip().splitlines()  # log lines may follow the result
                    results[mode].append(json.loads(next(
                        line for line in reversed(lines) if line.startswith("{"))))
        finally:
            proc.kill()
            proc.wait()
    med = {m: (stats.median(x for r in rs for x in r["throughput"]),
               stats.median(x for r in rs for x in r["p99"])) for m, rs in results.items()}
    print(f"throughput (generated tokens/s, median of {2 * args.repeats}): "
          f"with plugin {med['on'][0]:.1f}, without {med['off'][0]:.1f}, "
          f"ratio {med['on'][0] / med['off'][0]:.3f} (goal >= 0.97)")
    print(f"p99 latency of single requests (s): with {med['on'][1]:.4f}, without "
          f"{med['off'][1]:.4f}, ratio {med['on'][1] / med['off'][1]:.3f} (goal <= 1.05)")
    for r in results["on"]:
        s = r["state"]
        print(f"plugin: {s['sampled_steps']}/{s['steps']} steps sampled, "
              f"{s['total_sampled_tokens']} tokens, {s['dropped']} dropped; "
              f"{s['wire_bytes'] / r['served']:.3f} statistics bytes per served token "
              f"(the open window's stream)")


if __name__ == "__main__":
    main()
