"""The vLLM plugin's cost: the same request loop on vllm.LLM (CPU build), in vLLM's default
(compiled) mode unless --eager, with the plugin sampling at its defaults vs without it
(VLLM_PLUGINS excludes it), each in its own process. Rounds alternate the order (off, on), (on,
off), ...; each round gives the ratio of the two processes' medians over repeats of throughput
(generated tokens/s of a batch of requests) and of p99 latency (sequential single requests), and
the report is the median ratio over rounds with its spread (min..max). Also the tokens the
plugin sampled per second and the statistics bytes it sent per served token.
Goals: throughput ratio >= 0.97, p99 ratio <= 1.05.
usage: build/python-env-vllm/bin/python bench/vllm_plugin_bench.py --build build
       [--rounds 4] [--repeats 3] [--requests 64] [--fraction F] [--eager]
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
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=sys.argv[4] == "eager",
               dtype="bfloat16", max_model_len=512, kv_cache_memory_bytes=256 << 20)
import random
rng = random.Random(0)
prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(64, 192))] for _ in range(requests)]
params = vllm.SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
run = lambda ps: llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)
run(prompts[:4])  # warm-up
throughput, p99, served = [], [], 0
start = time.perf_counter()
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
elapsed = time.perf_counter() - start
state = {}
if os.environ.get("CALIPER_FLEET"):
    time.sleep(2)
    state = llm.collective_rpc("caliper_state")[0]
    state = {k: state[k] for k in ("sampled_steps", "steps", "total_sampled_tokens", "dropped",
                                   "wire_bytes", "sent")}
print(json.dumps({"throughput": throughput, "p99": p99, "served": served, "state": state,
                  "elapsed": elapsed}))
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


def ratio(result: dict, what: str) -> float:
    """One round's median with the plugin over its median without."""
    return stats.median(result["on"][what]) / stats.median(result["off"][what])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build", type=pathlib.Path)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--fraction", help="CALIPER_SAMPLE_FRACTION (default: the plugin's)")
    ap.add_argument("--eager", action="store_true", help="--enforce-eager (default: compiled)")
    args = ap.parse_args()
    import caliper
    from caliper import fleets
    mode_arg = "eager" if args.eager else "default"
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
            rounds = []
            for i in range(args.rounds):
                result = {}
                for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                    r = subprocess.run([sys.executable, "-c", LOOP, str(tmp / "model"),
                                        str(args.repeats), str(args.requests), mode_arg],
                                       env=on if mode == "on" else off, capture_output=True,
                                       text=True)
                    if r.returncode:
                        raise SystemExit(r.stderr[-4000:])
                    lines = r.stdout.strip().splitlines()  # log lines may follow the result
                    result[mode] = json.loads(next(
                        line for line in reversed(lines) if line.startswith("{")))
                rounds.append(result)
                print(f"round {i + 1}: throughput ratio {ratio(result, 'throughput'):.3f}, "
                      f"p99 ratio {ratio(result, 'p99'):.3f}", flush=True)
        finally:
            proc.kill()
            proc.wait()
    tput = [ratio(r, "throughput") for r in rounds]
    p99 = [ratio(r, "p99") for r in rounds]
    print(f"vLLM {mode_arg} mode, {args.rounds} rounds of {args.repeats} repeats x "
          f"{args.requests} requests, fraction {args.fraction or 'default'}")
    print(f"throughput ratio (with / without the plugin): median {stats.median(tput):.3f}, "
          f"spread {min(tput):.3f}..{max(tput):.3f} (goal >= 0.97)")
    print(f"p99 latency ratio: median {stats.median(p99):.3f}, spread {min(p99):.3f}.."
          f"{max(p99):.3f} (goal <= 1.05)")
    for r in rounds:
        s, on_run = r["on"]["state"], r["on"]
        rate = s["total_sampled_tokens"] / on_run["elapsed"]
        print(f"plugin: {s['sampled_steps']}/{s['steps']} steps sampled, "
              f"{s['total_sampled_tokens']} tokens ({rate:.0f} sampled tokens/s), "
              f"{s['dropped']} dropped; "
              f"{s['wire_bytes'] / on_run['served']:.3f} statistics bytes per served token")


if __name__ == "__main__":
    main()
