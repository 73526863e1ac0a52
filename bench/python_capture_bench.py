"""Python client benchmarks, each a ratio to a baseline measured in the same run.

  1. wire bytes: statistics vs raw mode for the same K/V (head_dim 128), and the statistics
     bytes per tensor byte they stand for (goal <= 1e-3 for K/V);
  2. capture overhead: forward time with the hooks (statistics mode) / without (goal <= 1.10,
     CPU), interleaved runs, median;
  3. end to end: caliper-capture vs llm-compressor's oneshot on the same model, samples and
     recipe (FP8 KV per head + NVFP4), wall time of each as a fresh process.
usage: python bench/python_capture_bench.py --build build [--only wire,overhead,e2e]
(the python env of tests/python/run_pytest.sh: build/python-env/bin/python).
"""
import argparse
import json
import pathlib
import re
import resource
import statistics as stats
import subprocess
import sys
import tempfile
import time

import torch
import transformers

import caliper
import caliper.hooks
from bench_support import capture, start_server


def llama(hidden, layers, heads, kv_heads, head_dim, inter, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, head_dim=head_dim,
                                   vocab_size=1024, max_position_embeddings=4096)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg).eval(), json.loads(cfg.to_json_string())


def bench_wire(addr, metrics):
    model, config = llama(512, 4, 8, 8, 128, 1024)
    model = model.to(torch.bfloat16)
    ids = [torch.randint(0, 1024, (1, 512)) for _ in range(4)]
    out = {}
    for name, mode, merge in (("raw", "raw", 0), ("unmerged", "statistics", 0),
                              ("statistics", "statistics", 16)):
        c = caliper.Client(addr)
        s = c.create_session(config, caliper.Recipe(kv="per_head"), mode=mode,
                             merge_batches=merge)
        capture(model, s, ids)
        out[name] = (s.wire_bytes, s.tensor_bytes, s.proto.accepted_chunks)
        s.close()
    import urllib.request
    text = urllib.request.urlopen(f"http://{metrics}/metrics").read().decode()
    def metric(name):  # K and V together
        found = re.findall(rf'^{name}{{kind="(?:key|value)"}} (\S+)$', text, re.M)
        return sum(map(float, found)) if found else float("nan")
    raw_wire, tensor, raw_n = out["raw"]
    un_wire, _, un_n = out["unmerged"]
    st_wire, st_tensor, st_n = out["statistics"]
    print("wire bytes, K/V only, 4 samples x 512 tokens, 4 layers, 8 KV heads x 128, BF16:")
    print(f"  raw mode        {raw_wire:>12} B on the wire for {tensor} tensor bytes, "
          f"{raw_n} chunks")
    print(f"  statistics, one per observe call {un_wire:>8} B, {un_n} chunks")
    print(f"  statistics, merged (default)     {st_wire:>8} B, {st_n} chunks, for {st_tensor} "
          f"tensor bytes")
    print(f"  ratio statistics/raw wire bytes = {st_wire / raw_wire:.3e}  (goal <= 1e-3); "
          f"merged/unmerged {st_wire / un_wire:.3f}")
    print(f"  server metrics: caliper_statistics_bytes_total{{key,value}} = "
          f"{metric('caliper_statistics_bytes_total'):.0f}, "
          f"caliper_statistics_tensor_bytes_total{{key,value}} = "
          f"{metric('caliper_statistics_tensor_bytes_total'):.0f} -> "
          f"{metric('caliper_statistics_bytes_total') / metric('caliper_statistics_tensor_bytes_total'):.3e}")
    return st_wire / raw_wire


def bench_overhead(addr, reps=15):
    torch.set_num_threads(1)
    model, config = llama(1024, 4, 16, 8, 64, 2816)
    x = torch.randint(0, 1024, (1, 256))
    c = caliper.Client(addr)
    s = c.create_session(config, caliper.Recipe(kv="per_head", nvfp4_weights=True,
                                                nvfp4_activations=True), mode="statistics")
    h = caliper.hooks.attach(model, s)
    with torch.no_grad():
        model(x, use_cache=False)  # warm-up
        base, hooked, base_cpu, hooked_cpu = [], [], [], []
        for _ in range(reps):
            for enabled, wall, cpu in ((False, base, base_cpu), (True, hooked, hooked_cpu)):
                h.enabled = enabled
                t, c = time.perf_counter(), time.thread_time()
                model(x, use_cache=False)
                wall.append(time.perf_counter() - t)
                cpu.append(time.thread_time() - c)
    h.detach()
    s.flush()
    ratio = stats.median(hooked) / stats.median(base)
    cpu_ratio = stats.median(hooked_cpu) / stats.median(base_cpu)
    print("capture overhead, statistics mode, CPU 1 thread, Llama 4 layers hidden 1024, 256 tokens,"
          " K/V + all Linear inputs:")
    print(f"  forward without hooks {stats.median(base) * 1e3:.1f} ms, with hooks "
          f"{stats.median(hooked) * 1e3:.1f} ms (median of {reps}); ratio {ratio:.3f} (goal <= 1.10)")
    # The forward thread's own CPU time: the hooks' work without the machine's other load (the
    # producer thread's sending is not in it).
    print(f"  forward thread CPU time: without {stats.median(base_cpu) * 1e3:.1f} ms, with "
          f"{stats.median(hooked_cpu) * 1e3:.1f} ms; ratio {cpu_ratio:.3f}")
    s.close()
    return ratio


ONESHOT = r'''
import json, sys, time
t0 = time.perf_counter()
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
model_dir, ids_file, out = sys.argv[1:4]
ids = json.load(open(ids_file))
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]})
recipe = QuantizationModifier(targets="Linear", scheme="NVFP4", ignore=["lm_head"],
    kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "attn_head", "dynamic": False,
                     "symmetric": True})
oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=len(ids),
        max_seq_length=max(map(len, ids)), pipeline="basic")
model.save_pretrained(out, save_compressed=True)
print(f"oneshot {time.perf_counter() - t0:.2f}")
'''


def bench_e2e(addr, tmp, samples=16, seq=256, reps=3):
    model, config = llama(1024, 4, 16, 8, 64, 2816)
    model = model.to(torch.bfloat16)
    model_dir = tmp / "model"
    model.save_pretrained(model_dir)
    save_tokenizer(model_dir, 1024)  # oneshot's dataset path initialises a processor from it
    ids = [torch.randint(0, 1024, (seq,)).tolist() for _ in range(samples)]
    (tmp / "ids.json").write_text(json.dumps(ids))
    exe = pathlib.Path(sys.executable).parent / "caliper-capture"

    def capture(i):
        r = subprocess.run([str(exe), f"--server={addr}", f"--model={model_dir}",
                            f"--token-ids={tmp / 'ids.json'}", "--kv=per-head", "--nvfp4",
                            "--model-device=cpu", f"--out={tmp / f'capture{i}'}",
                            f"--name=bench {i}"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    def oneshot(i):
        r = subprocess.run([sys.executable, "-c", ONESHOT, str(model_dir), str(tmp / "ids.json"),
                            str(tmp / f"oneshot{i}")], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr[-3000:])
            raise SystemExit("oneshot failed")

    # A warm-up of each (the first process after an install pays cold file caches), then
    # interleaved timed runs, median.
    # CPU seconds (user + sys of the child) are reported too: less sensitive to a loaded machine.
    times = {"capture": [], "oneshot": []}
    cpu = {"capture": [], "oneshot": []}
    for i in range(reps + 1):
        for name, fn in (("capture", capture), ("oneshot", oneshot)):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            fn(i)
            wall = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if i:
                times[name].append(wall)
                cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime -
                                 before.ru_stime)
    capture_s, oneshot_s = stats.median(times["capture"]), stats.median(times["oneshot"])
    capture_cpu, oneshot_cpu = stats.median(cpu["capture"]), stats.median(cpu["oneshot"])
    print(f"end to end, {samples} samples x {seq} tokens, Llama 4 layers hidden 1024 BF16, "
          f"FP8 KV per head + NVFP4, CPU (fresh processes, model load included, median of {reps}):")
    print(f"  caliper-capture {capture_s:.2f} s, llm-compressor oneshot {oneshot_s:.2f} s; "
          f"ratio {capture_s / oneshot_s:.3f}  (runs: capture "
          f"{', '.join(f'{t:.2f}' for t in times['capture'])}; oneshot "
          f"{', '.join(f'{t:.2f}' for t in times['oneshot'])})")
    print(f"  CPU time (user+sys): caliper-capture {capture_cpu:.2f} s, oneshot {oneshot_cpu:.2f} s;"
          f" ratio {capture_cpu / oneshot_cpu:.3f}")
    return capture_s / oneshot_s


def save_tokenizer(path, vocab):
    """A word-level tokenizer over the model's vocabulary ("t0" .. "t<vocab-1>")."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0",
                                         pad_token="t0").save_pretrained(path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--only", default="wire,overhead,e2e")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        proc, addr, metrics = start_server(pathlib.Path(a.build), tmp)
        try:
            for name in a.only.split(","):
                {"wire": lambda: bench_wire(addr, metrics), "overhead": lambda: bench_overhead(addr),
                 "e2e": lambda: bench_e2e(addr, tmp)}[name]()
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
