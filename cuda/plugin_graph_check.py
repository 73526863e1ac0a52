"""The vLLM plugin's statistics ops (client/python/caliper/vllm/_sampling.py) under CUDA-graph
capture and replay, with PyTorch only (no vLLM, no Caliper server): what a full CUDA graph of a
decode batch does to them in a serving engine.

Checked, on a GPU:
  1. ops captured into a graph and replayed on new data (padded rows marked -1 in slot_mapping)
     write exactly, bit for bit, what the same ops run eagerly write for the same data;
  2. a replay with the gate off (a step not sampled) changes no buffer;
  3. the step (gate, replay) and the readout (copy to pinned host memory, event) run with
     torch.cuda.set_sync_debug_mode("error"): no host synchronisation;
  4. the padded rows count for nothing: the same data with other values in the padding gives the
     same statistics.
Without a GPU (CI's dry run) the same comparison of the gated and ungated paths runs on the CPU
(checks 2 and 4 and the masking), then the script exits 77: the graph part needs a GPU.
usage: python cuda/plugin_graph_check.py     (from the repository root; prints one summary)
"""
import os
import sys
import types

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "client", "python", "caliper")


def _load_sampling_alone():
    """caliper.vllm._sampling and what it imports, without the package's __init__ (which needs
    grpc and the generated stubs, absent on a bare GPU machine): the ops need none of them."""
    def package(name, path):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
        return module
    package("caliper", PACKAGE)
    package("caliper.vllm", os.path.join(PACKAGE, "vllm"))
    stubs = package("caliper._pb", os.path.join(PACKAGE, "_pb"))
    pb = types.ModuleType("caliper._pb.caliper_pb2")
    names = {}
    pb.__getattr__ = lambda name: names.setdefault(name, 1000 + len(names))  # enum values
    stubs.caliper_pb2 = pb
    sys.modules["caliper._pb.caliper_pb2"] = pb


_load_sampling_alone()
from caliper.vllm._sampling import LayerShape, StepStatistics  # noqa: E402

HEADS, DIM, Q_HEADS, PADDED, ACTUAL = 2, 64, 4, 16, 11


class Layer:
    def __init__(self, device):
        self._k_scale = torch.tensor(0.01, device=device)
        self._v_scale = torch.tensor(0.02, device=device)


def make(device):
    shapes = [LayerShape(i, HEADS, DIM, Q_HEADS, 3) for i in range(2)]
    return StepStatistics(shapes, torch.device(device), minmax=True, histograms=True,
                          kv_qmax=448.0)


def data(seed, device, pad_value=0.0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        k = torch.randn(PADDED, HEADS * DIM, generator=g) * 3
        v = torch.randn(PADDED, HEADS * DIM, generator=g)
        q = torch.randn(PADDED, Q_HEADS * DIM, generator=g)
        for t in (k, v, q):
            t[ACTUAL:] = pad_value
        out.append([t.to(torch.bfloat16).to(device) for t in (k, v, q)])
    slots = torch.full((PADDED,), -1, dtype=torch.int64)
    slots[:ACTUAL] = torch.randperm(64, generator=g)[:ACTUAL]
    return out, slots.to(device)


def observe(stats, layers, inputs, slots, gated):
    for i, (k, v, q) in enumerate(inputs):
        stats.observe(i, layers[i], q, k, v, slots, gated)


def snapshot(stats):
    return stats.floats.clone(), stats.ints.clone()


def same(a, b):
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b))


def eager_reference(device, inputs, slots):
    stats, layers = make(device), [Layer(device), Layer(device)]
    stats.begin_step(True)
    observe(stats, layers, inputs, slots, gated=False)
    return snapshot(stats)


def cpu_dry_run():
    device = "cpu"
    inputs, slots = data(1, device)
    want = eager_reference(device, inputs, slots)
    stats, layers = make(device), [Layer(device), Layer(device)]
    stats.begin_step(True)
    observe(stats, layers, inputs, slots, gated=True)
    assert same(snapshot(stats), want), "gated (gate on) differs from ungated"
    other, _ = data(2, device)
    stats.begin_step(False)
    observe(stats, layers, other, slots, gated=True)
    assert same(snapshot(stats), want), "a step with the gate off changed the buffers"
    padded, _ = data(1, device, pad_value=1e4)
    assert same(eager_reference(device, padded, slots), want), "padded rows counted"
    rows = int(want[1][0])
    assert rows == ACTUAL, rows
    print(f"plugin_graph_check: CPU: gated == ungated, gate off changes nothing, padding "
          f"masked ({rows} of {PADDED} rows)")


def gpu_check():
    device = "cuda"
    stats, layers = make(device), [Layer(device), Layer(device)]
    inputs, slots = data(1, device)
    static = [[t.clone() for t in layer] for layer in inputs]
    static_slots = slots.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture, as vLLM does
        stats.begin_step(True)
        observe(stats, layers, static, static_slots, gated=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        observe(stats, layers, static, static_slots, gated=True)
    checked = 0
    for seed in range(3, 8):
        new, new_slots = data(seed, device)
        want = eager_reference(device, new, new_slots)
        for dst, src in zip(static, new):
            for d, s in zip(dst, src):
                d.copy_(s)
        static_slots.copy_(new_slots)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        stats.begin_step(True)
        graph.replay()
        readout = stats.readout(batch=seed, generation=0, version=0)
        torch.cuda.set_sync_debug_mode("default")
        assert readout is not None
        readout.wait()
        assert same((readout.floats, readout.ints), want), f"replay {seed} differs from eager"
        readout.release()
        # The gate off: a replay on other data changes nothing.
        before = snapshot(stats)
        other, _ = data(seed + 100, device)
        for dst, src in zip(static, other):
            for d, s in zip(dst, src):
                d.copy_(s)
        stats.begin_step(False)
        graph.replay()
        torch.cuda.synchronize()
        assert same(snapshot(stats), before), f"replay {seed} with the gate off changed a buffer"
        checked += 1
    print(f"plugin_graph_check: GPU {torch.cuda.get_device_name()}: {checked} replays equal to "
          f"eager bit for bit ({ACTUAL} of {PADDED} rows real), gate off changes nothing, "
          f"step and readout without a host sync")


def main():
    cpu_dry_run()
    if not torch.cuda.is_available():
        print("plugin_graph_check: skipped: CUDA-graph capture and replay need a GPU")
        sys.exit(77)
    gpu_check()


if __name__ == "__main__":
    main()
