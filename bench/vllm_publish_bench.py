"""Publish-to-in-use across two engines: how long after `CloseWindow` publishes a version both
vLLM engines (CPU build, the plugin, each its own process bound to its own core, serving a
steady request loop) run with it, beside a plain `WatchScales` subscriber of the same fleet
(the baseline: when the version reaches a client at all; an engine adds its wait for the next
step boundary, the switch and the collective_rpc to its workers).

Each round starts the two engines afresh, lets both feed the window, then closes it; latencies
are from just before `CloseWindow` to: its reply, the subscriber's receipt, each engine's switch
(its engine core's in-use version, polled every millisecond in the engine process). Prints
median and max over rounds and each engine's ratio to the subscriber.
usage: build/python-env-vllm/bin/python bench/vllm_publish_bench.py --build build [--rounds 5]
       [--grace S]
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
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_support import start_server  # noqa: E402
from vllm_plugin_bench import tiny_llama  # noqa: E402

ENGINE = r"""
import json, sys, threading, time
import vllm
import caliper.vllm as plugin
# vLLM's default (compiled) mode, as engines serve.
llm = vllm.LLM(model=sys.argv[1], skip_tokenizer_init=True, dtype="bfloat16",
               max_model_len=512, kv_cache_memory_bytes=128 << 20)
import random
rng = random.Random(int(sys.argv[2]))
prompts = [[rng.randrange(3, 512) for _ in range(64)] for _ in range(4)]
params = vllm.SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
state = lambda: llm.collective_rpc("caliper_state")[0]
while not state()["window"]:
    time.sleep(0.05)
switched = {}
def poll():
    while plugin.engine_versions["in_use"] < 1:
        time.sleep(0.001)
    switched["at"] = time.time()
threading.Thread(target=poll, daemon=True).start()
fed = False
while "at" not in switched:
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    if not fed and state()["unacknowledged"] == 0:
        fed = True
        print(json.dumps({"ready": True}), flush=True)
print(json.dumps({"switched_at": switched["at"]}), flush=True)
"""


def json_line(proc):
    for line in proc.stdout:
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"an engine exited ({proc.wait()})")


def one_round(args, tmp, address, model, index):
    import caliper
    from caliper import fleets
    client = caliper.Client(address)
    fleet = f"bench{index}"
    fleets.create_fleet(client, fleet, json.loads((model / "config.json").read_text()),
                        caliper.Recipe(kv="per_head"), min_tokens=16)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CALIPER_")}
    cores = os.cpu_count() or 1
    procs = [subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(model), str(i)], stdout=subprocess.PIPE,
        stderr=open(tmp / f"engine{index}-{i}.log", "w"), text=True,
        env=dict(base, VLLM_ENABLE_V1_MULTIPROCESSING="0", CALIPER_FLEET=fleet,
                 CALIPER_SERVER=address, CALIPER_SAMPLE_FRACTION="1",
                 VLLM_CPU_OMP_THREADS_BIND=str(i % cores),
                 **({"CALIPER_SWITCH_GRACE_S": args.grace} if args.grace else {})))
             for i in range(2)]
    try:
        for p in procs:
            json_line(p)
        received = {}

        def watch():
            for sv in fleets.watch_scales(client, fleet):
                if sv.version >= 1:
                    received["at"] = time.time()
                    return
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        time.sleep(1.0)  # the subscription is open before the publish
        t0 = time.time()
        window = fleets.close_window(client, fleet, weight_version="initial")
        replied = time.time()
        assert window.version == 1, window
        engines = [json_line(p)["switched_at"] for p in procs]
        watcher.join(timeout=30)
        return dict(close=replied - t0, watcher=received["at"] - t0,
                    engines=[e - t0 for e in engines])
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build", type=pathlib.Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--grace", help="CALIPER_SWITCH_GRACE_S: how long an engine waits for a step "
                    "with no running request before it preempts (default: the plugin's, 2 s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        tiny_llama(tmp / "model")
        proc, address, _ = start_server(args.build, tmp)
        try:
            rounds = [one_round(args, tmp, address, tmp / "model", i) for i in range(args.rounds)]
        finally:
            proc.kill()
            proc.wait()
    ms = lambda xs: f"median {1e3 * stats.median(xs):.1f} ms, max {1e3 * max(xs):.1f} ms"
    watcher = [r["watcher"] for r in rounds]
    both = [max(r["engines"]) for r in rounds]
    print(f"{args.rounds} rounds, two engines (one core each) serving a steady request loop; "
          f"switch grace {args.grace or 'the default'} s")
    print(f"CloseWindow reply: {ms([r['close'] for r in rounds])}")
    print(f"WatchScales subscriber receives (baseline): {ms(watcher)}")
    for i in range(2):
        e = [r["engines"][i] for r in rounds]
        print(f"engine {i} in use: {ms(e)}; ratio to the subscriber, median "
              f"{stats.median(a / b for a, b in zip(e, watcher)):.2f}")
    print(f"both engines in use: {ms(both)}; ratio to the subscriber, median "
          f"{stats.median(a / b for a, b in zip(both, watcher)):.2f}")


if __name__ == "__main__":
    main()
