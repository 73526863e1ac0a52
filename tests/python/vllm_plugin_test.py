"""The vLLM general plugin (caliper.vllm) on vLLM's CPU build, in real processes, in vLLM's
default (compiled) mode unless a test is about eager mode: discovered through its entry point
and inert without CALIPER_*; sampling live traffic of vllm.LLM into a fleet window, against an
eager reference process capturing the same requests with vllm_hooks; hot
reload of a published version into every copy of the scales vLLM keeps; caliper_refit and the
trainer-side caliper.refit; the OpenAI server with the plugin, requests from the openai
client, Caliper killed -9 mid-traffic. Runs in the vllm venv (CALIPER_PYTHON_SET=vllm)."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import torch

import caliper
from caliper import fleets
from conftest import Server, free_port

pytest.importorskip("vllm")

KV_CACHE_BYTES = 64 << 20  # explicit: a share of the machine fails under other load
# vLLM's default mode (compiled: DYNAMO_TRACE_ONCE with inductor on the CPU build), as it serves.
ENGINE = dict(dtype="bfloat16", max_model_len=256, kv_cache_memory_bytes=KV_CACHE_BYTES)
EAGER = dict(ENGINE, enforce_eager=True)
# Live statistics in the default mode against an eager reference process on the same requests:
# inductor computes RMSNorm and RoPE in its own fused kernels, so K/V may differ from eager's by
# rounding. Set before measuring: one BF16 step of the value (relative 2^-7).
COMPILED_RTOL = 2.0 ** -7


def tiny_llama(directory: pathlib.Path) -> dict:
    """A tiny random BF16 Llama with a word-level tokenizer ("t0".."t511"), saved to directory."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   vocab_size=512, max_position_embeddings=512)
    cfg.architectures = ["LlamaForCausalLM"]
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():  # heavier tails than the default init
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.08)
    model.save_pretrained(directory)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(512)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1",
                                         bos_token="t2").save_pretrained(directory)
    return json.loads((directory / "config.json").read_text())


def prompts(n: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (length,), generator=g).tolist() for _ in range(n)]


def run_script(script: str, env: dict, *args) -> dict:
    """Runs script in its own process (vLLM keeps per-process state); its result is the last
    stdout line that is JSON (vLLM's and the plugin's log lines may follow it at exit)."""
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    return json.loads(next(line for line in reversed(r.stdout.strip().splitlines())
                           if line.startswith("{")))


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIPER_")
           or k in ("CALIPER_BUILD_DIR", "CALIPER_SOURCE_DIR")}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.update(extra)
    return env


INERT_SCRIPT = r"""
import json, os, sys
import vllm
from vllm.v1.worker.gpu_worker import Worker
import caliper.vllm as plugin
engine = json.loads(sys.argv[2])
llm = vllm.LLM(model=sys.argv[1], skip_tokenizer_init=True, **engine)
params = vllm.SamplingParams(max_tokens=6, temperature=0, prompt_logprobs=2, logprobs=2)
outs = llm.generate([{"prompt_token_ids": p} for p in json.loads(sys.argv[3])], params,
                    use_tqdm=False)
result = [[list(o.outputs[0].token_ids),
           [{str(k): v.logprob for k, v in d.items()} for d in o.prompt_logprobs[1:]]]
          for o in outs]
print(json.dumps({"status": plugin.status, "patched": Worker.load_model.__name__,
                  "outputs": result}))
"""


def test_plugin_discovered_and_inert_without_environment(tmp_path):
    """The entry point is there, vLLM loads it, and without CALIPER_FLEET/SERVER it changes
    nothing: greedy tokens and prompt logprobs equal those of a process that does not load it."""
    from importlib.metadata import entry_points
    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert found.get("caliper") == "caliper.vllm:register"
    tiny_llama(tmp_path / "model")
    ps = json.dumps(prompts(3, 24, seed=1))
    engine = json.dumps(ENGINE)
    inert = run_script(INERT_SCRIPT, clean_env(CALIPER_FLEET="only-the-fleet"),
                       tmp_path / "model", engine, ps)
    unloaded = run_script(INERT_SCRIPT, clean_env(VLLM_PLUGINS="none-of-them"),
                          tmp_path / "model", engine, ps)
    assert inert["status"] == {"loaded": True, "active": False, "error": ""}
    assert inert["patched"] == "load_model"  # nothing of vLLM replaced
    assert unloaded["status"]["loaded"] is False
    assert inert["outputs"] == unloaded["outputs"]


LIVE_SCRIPT = r"""
import json, os, sys, time
import torch, vllm, transformers
import caliper
import caliper.vllm as plugin
from caliper import fleets, vllm_hooks
address, model_dir, engine, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
client = caliper.Client(address)
out = {}
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, **engine)
greedy = vllm.SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=1)

def state():
    return llm.collective_rpc("caliper_state")[0]

def run(ps):
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], greedy, use_tqdm=False)
    return [[list(o.outputs[0].token_ids),
             [{str(k): v.logprob for k, v in d.items()} for d in o.prompt_logprobs[1:]]]
            for o in outs]

def wait(cond, what, seconds=60):
    deadline = time.time() + seconds
    while not cond():
        assert time.time() < deadline, (what, fleets.get_fleet(client, "f"), state())
        time.sleep(0.2)

def window_tokens(fleet, weight_version):
    for w in fleets.get_fleet(client, fleet).windows:
        if w.open and w.weight_version == weight_version:
            return w.tokens
    return -1

# vllm_hooks (module hooks) would see nothing of a compiled engine: attach refuses it.
if not engine.get("enforce_eager"):
    try:
        vllm_hooks.attach(llm, None)
        out["hooks_refused"] = False
    except RuntimeError as e:
        out["hooks_refused"] = "enforce_eager=True" in str(e)

# 1. Sampling into the window. The plugin opens its window in the background (serving never
#    waits for Caliper): steps before that are not sampled, so traffic starts once it is open.
wait(lambda: state()["window"] != "", "the plugin opened no window")
before = run(prompts[:2])
s = state()
out["sampled"] = s["total_sampled_tokens"]
out["first_window"] = s["window"]
# Every statistic acknowledged (its stream closed with a summary) before the window closes.
wait(lambda: state()["unacknowledged"] == 0, "statistics not acknowledged")
wait(lambda: window_tokens("f", "initial") >= s["total_sampled_tokens"], "window tokens")
window = fleets.close_window(client, "f", weight_version="initial")
out["closed"] = [window.decision, window.version, window.tokens]
live = client.session(window.session_id).scales()
out["absmax1"] = [[l.k_absmax, l.v_absmax] for l in live.kv_layers]
out["state1"] = {k: v for k, v in s.items() if k != "scales"}
out["version1"] = [(l.k_scale, l.v_scale) for l in live.kv_layers]

# 2. Hot reload: the next step switches; every copy equals what vLLM's loader makes of the
#    same checkpoint values (BaseKVCacheMethod, as a fresh process loading them would run).
wait(lambda: plugin.engine_versions["pending"] == 1, "WatchScales did not deliver version 1")
# A probe inside the attention op (over the plugin's wrapper): the scales the kernel reads on
# the first step after the switch, in whatever mode the engine runs.
probe = {}
def install_probe(model):
    from vllm.model_executor.layers.attention.attention import Attention
    for name, m in model.named_modules():
        if isinstance(m, Attention):
            def wrapped(layer, *args, _inner=m.impl.forward, _name=name, **kwargs):
                probe.setdefault(_name, [layer._k_scale_float, layer._v_scale_float,
                                         float(layer._k_scale), float(layer._v_scale)])
                return _inner(layer, *args, **kwargs)
            m.impl.forward = wrapped
llm.apply_model(install_probe)
after = run(prompts[:2])
out["probe"] = [probe[n] for n in sorted(probe)]
s = state()
out["version_in_use"] = s["version"]
out["outputs_unchanged"] = before == after
from vllm.model_executor.layers.attention.attention import set_default_quant_scales
from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
fresh = {}
for layer, (k, v) in enumerate(out["version1"]):
    m = torch.nn.Module()
    set_default_quant_scales(m, register_buffer=True)
    m.kv_cache_dtype = "fp8"
    BaseKVCacheMethod(None).create_weights(m)
    m.k_scale.data.fill_(max(k)); m.v_scale.data.fill_(max(v))
    BaseKVCacheMethod(None).process_weights_after_loading(m)
    fresh[str(layer)] = {n: (getattr(m, n).tolist() if hasattr(getattr(m, n), "tolist")
                             else getattr(m, n)) for n in s["scales"][0]}
out["reloaded"] = {str(k): v for k, v in s["scales"].items()}
out["fresh"] = fresh
wait(lambda: any(u.version == 1 for u in fleets.get_fleet(client, "f").in_use), "ReportInUse")
out["in_use"] = [[u.version, u.stale, len(u.layer_saturation)]
                 for u in fleets.get_fleet(client, "f").in_use]

# 3. A weight update: caliper_refit opens the new window; a weight reload (collective_rpc)
#    and sleep/wake_up keep the scales in use.
r = llm.collective_rpc("caliper_refit", args=("step-2",))[0]
out["refit_window"] = r["window"]
llm.collective_rpc("reload_weights")
out["reset_by_reload"] = state()["scales"][0]["_k_scale_float"]
for call in ("sleep", "wake_up"):
    llm.collective_rpc(call)
run(prompts[2:4])
s = state()
out["after_reload"] = {str(k): v for k, v in s["scales"].items()}
out["resets_repaired"] = s["resets_repaired"]
out["weight_version"] = s["weight_version"]
wait(lambda: state()["unacknowledged"] == 0, "statistics not acknowledged")
wait(lambda: window_tokens("f", "step-2") >= s["sampled_tokens"] > 0, "step-2 tokens")
engine_tokens = window_tokens("f", "step-2")

# 4. Trainer side: the same weight version's window gets the transformers model's K/V too.
ref_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto",
                                                              attn_implementation="eager")
w = caliper.refit(ref_model, "f", prompts[4:6], weight_version="step-2", client=client)
out["trainer_window"] = w.session_id
wait(lambda: window_tokens("f", "step-2") >= engine_tokens + 2 * len(prompts[4]), "trainer")
window = fleets.close_window(client, "f", weight_version="step-2")
out["closed2"] = [window.decision, window.version]
out["absmax2"] = [[l.k_absmax, l.v_absmax]
                 for l in client.session(window.session_id).scales().kv_layers]
wait(lambda: plugin.engine_versions["pending"] == 2, "WatchScales did not deliver version 2")
run(prompts[:1])
out["version_in_use2"] = state()["version"]
print(json.dumps(out))
"""


REFERENCE_SCRIPT = r"""
import json, os, sys
import torch, vllm, transformers
import caliper, caliper.hooks
from caliper import vllm_hooks
address, model_dir, engine, recipe, groups = sys.argv[1], sys.argv[2], *map(json.loads, sys.argv[3:6])
client = caliper.Client(address)
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, **engine)
config = json.load(open(os.path.join(model_dir, "config.json")))
greedy = vllm.SamplingParams(max_tokens=4, temperature=0)
ref_model = None
out = []
def scale_weights(factor):  # what the refit test's transfer engine does to the weights
    def apply(model):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("proj.weight"):
                    p.mul_(factor)
    return apply
for i, group in enumerate(groups):  # {"engine": prompts, "trainer": prompts, "factor": f}
    if group.get("factor"):
        llm.apply_model(scale_weights(group["factor"]))
    session = client.create_session(config, caliper.Recipe(**recipe), name=f"reference {i}")
    handle = vllm_hooks.attach(llm, session)
    llm.generate([{"prompt_token_ids": p} for p in group["engine"]], greedy, use_tqdm=False)
    handle.detach()
    if group.get("trainer"):
        ref_model = ref_model or transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype="auto", attn_implementation="eager")
        handle = caliper.hooks.attach(ref_model, session, first_batch=1000)
        with torch.no_grad():
            for ids in group["trainer"]:
                ref_model(torch.tensor([ids]), use_cache=False)
        handle.detach()
    session.finalize()
    out.append([[l.k_absmax, l.v_absmax, l.q_absmax] for l in session.scales().kv_layers])
print(json.dumps({"groups": out}))
"""


def reference(server, model_dir, recipe: dict, groups: list) -> list:
    """Per group of requests, each layer's [k_absmax, v_absmax, q_absmax] as an eager vLLM
    process of its own captures them with vllm_hooks (and the transformers hooks for a group's
    "trainer" prompts): the offline reference for the plugin's live statistics."""
    return run_script(REFERENCE_SCRIPT, clean_env(), server.address, model_dir,
                      json.dumps(EAGER), json.dumps(recipe), json.dumps(groups))["groups"]


def assert_close(live, ref, rtol: float, what: str) -> None:
    """Every value of live within rtol of ref's (rtol 0: equal)."""
    flat_live, flat_ref = torch.tensor(live, dtype=torch.float64), torch.tensor(ref,
                                                                                dtype=torch.float64)
    assert flat_live.shape == flat_ref.shape, (what, live, ref)
    worst = ((flat_live - flat_ref).abs() / flat_ref.abs()).max().item()
    print(f"{what}: live vs reference, worst relative difference {worst:.3g} (allowed {rtol:.3g})")
    assert worst <= rtol, (what, live, ref)


@pytest.mark.parametrize("mode", ["default", "eager"])
def test_plugin_samples_llm_traffic_reloads_and_refits(server, tmp_path, mode):
    """vllm.LLM with the plugin, in vLLM's default (compiled) mode and in eager mode: the
    window gets every token of the sampled steps, with the statistics an eager process of its
    own captures on the same requests (bit for bit in eager mode, within COMPILED_RTOL in the
    default mode); the published version is applied as vLLM's loader would apply it; a weight
    reload keeps it; caliper_refit opens the next weight version's window, which the trainer
    side (caliper.refit) feeds too."""
    config = tiny_llama(tmp_path / "model")
    client = caliper.Client(server.address)
    fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_tensor"), min_tokens=16)
    ps = prompts(6, 32, seed=2)
    env = clean_env(CALIPER_FLEET="f", CALIPER_SERVER=server.address,
                    CALIPER_SAMPLE_FRACTION="1", CALIPER_REPORT_S="0.5")
    out = run_script(LIVE_SCRIPT, env, server.address, tmp_path / "model",
                     json.dumps(ENGINE if mode == "default" else EAGER), json.dumps(ps))
    print(json.dumps(out))
    ref = reference(server, tmp_path / "model", {"kv": "per_tensor"},
                    [{"engine": ps[:2]}, {"engine": ps[2:4], "trainer": ps[4:6]}])
    rtol = COMPILED_RTOL if mode == "default" else 0.0
    if mode == "default":  # module hooks would see nothing of a compiled engine
        assert out["hooks_refused"] is True
    # prompts of 32 tokens, 4 generated: 2 x (32 + 3) tokens go through the model
    assert out["sampled"] == 2 * (32 + 3)
    assert out["closed"] == ["first_version", 1, out["sampled"]]
    assert_close(out["absmax1"], [[l[0], l[1]] for l in ref[0]], rtol, "version 1 absmax")
    assert out["version_in_use"] == 1
    # the attention op read version 1's scales on the first step after the switch
    f32 = lambda x: torch.tensor(x, dtype=torch.float32).item()  # noqa: E731
    assert out["probe"] == [[max(k), max(v), f32(max(k)), f32(max(v))]
                            for k, v in out["version1"]], out["probe"]
    assert out["outputs_unchanged"]  # a BF16 cache does not read the scales
    assert out["reloaded"] == out["fresh"]
    assert out["in_use"] == [[1, False, 2]]  # saturation of each of the 2 layers
    # the reload reset vLLM's scales to 1.0; the next step had version 1's back
    assert out["reset_by_reload"] == 1.0
    assert out["after_reload"] == out["fresh"] and out["resets_repaired"] >= 1
    assert out["weight_version"] == "step-2"
    assert out["trainer_window"] == out["refit_window"] != out["first_window"]
    assert out["closed2"] == ["new_weight_version", 2]
    # version 2: the engine's steps after the refit and the trainer's samples
    assert_close(out["absmax2"], [[l[0], l[1]] for l in ref[1]], rtol, "version 2 absmax")
    assert out["version_in_use2"] == 2


REFIT_SCRIPT = r"""
import dataclasses, json, os, sys, time
import torch, vllm
import caliper, caliper.vllm as plugin
from caliper import fleets
from vllm.distributed.weight_transfer.base import WeightTransferEngine
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.model_executor.layers.attention.attention import Attention

@dataclasses.dataclass
class Init:
    pass

@dataclasses.dataclass
class Update:
    factor: float = 1.0
    fail: bool = False
    reset_scales: bool = False

class ScaleWeights(WeightTransferEngine):
    # The test's transfer engine (none of vLLM's runs on a CPU): new weights are the old ones
    # times `factor`; it resets the K/V scales to 1.0 as a checkpoint-format reload does; with
    # `fail` it raises after half the weights, as a broken transfer would.
    init_info_cls, update_info_cls = Init, Update
    def init_transfer_engine(self, init_info): pass
    def start_weight_update(self): pass
    def finish_weight_update(self): pass
    def shutdown(self): pass
    def receive_weights(self, info):
        params = [p for n, p in self.model.named_parameters() if n.endswith("proj.weight")]
        with torch.no_grad():
            for i, p in enumerate(params):
                if info.fail and i == len(params) // 2:
                    raise RuntimeError("the transfer failed midway")
                p.mul_(info.factor)
            if info.reset_scales:
                for m in self.model.modules():
                    if isinstance(m, Attention):
                        m._k_scale.fill_(1.0); m._v_scale.fill_(1.0)
                        m._k_scale_float = m._v_scale_float = 1.0

WeightTransferEngineFactory.register_engine("caliper_test", ScaleWeights)
address, model_dir, engine, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
client = caliper.Client(address)
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True,
               weight_transfer_config={"backend": "caliper_test"}, **engine)
greedy = vllm.SamplingParams(max_tokens=4, temperature=0)
run = lambda ps: llm.generate([{"prompt_token_ids": p} for p in ps], greedy, use_tqdm=False)
state = lambda: llm.collective_rpc("caliper_state")[0]
def wait(cond, what, seconds=60):
    deadline = time.time() + seconds
    while not cond():
        assert time.time() < deadline, (what, state())
        time.sleep(0.2)
def windows():
    return {w.weight_version: w for w in fleets.get_fleet(client, "f").windows}
probe = []
def install_probe(model):
    for m in model.modules():
        if isinstance(m, Attention):
            def wrapped(layer, *args, _inner=m.impl.forward, **kwargs):
                probe.append([layer._k_scale_float, layer._v_scale_float])
                return _inner(layer, *args, **kwargs)
            m.impl.forward = wrapped
            return  # the first layer is enough
out = {}
wait(lambda: state()["window"] != "", "the plugin opened no window")
run(prompts[:2])
wait(lambda: state()["unacknowledged"] == 0, "statistics not acknowledged")
out["v1"] = fleets.close_window(client, "f", weight_version="initial").version
wait(lambda: plugin.engine_versions["pending"] == 1, "version 1 not delivered")
run(prompts[:1])
scales_of = lambda s: {str(k): [v["_k_scale_float"], v["_v_scale_float"]]
                       for k, v in s["scales"].items()}
out["v1_scales"] = scales_of(state())

# A weight update through vLLM's own API: no Caliper call.
llm.collective_rpc("start_weight_update")
llm.collective_rpc("update_weights", kwargs={"update_info": {"factor": 1.5, "reset_scales": True}})
llm.collective_rpc("finish_weight_update")
out["reset_to"] = scales_of(state())["0"][0]
llm.llm_engine.set_weight_version("step-2")
llm.apply_model(install_probe)
run(prompts[2:4])
out["probe_first_step"] = probe[0]
s = state()
out["weight_version"], out["repaired"] = s["weight_version"], s["resets_repaired"]
out["sampled2"] = s["sampled_tokens"]
wait(lambda: state()["unacknowledged"] == 0, "statistics not acknowledged")
wait(lambda: "step-2" in windows() and windows()["step-2"].tokens >= out["sampled2"], "step-2 tokens")
out["window2_tokens"] = windows()["step-2"].tokens
w = fleets.close_window(client, "f", weight_version="step-2")
out["v2"] = [w.decision, w.version]
out["absmax2"] = [[l.k_absmax, l.v_absmax] for l in client.session(w.session_id).scales().kv_layers]
wait(lambda: plugin.engine_versions["pending"] == 2, "version 2 not delivered")
run(prompts[:1])
out["v2_scales"] = scales_of(state())

# An update that fails midway: no weight version is set, so no window opens for it, and the
# version in use stays applied.
llm.collective_rpc("start_weight_update")
try:
    llm.collective_rpc("update_weights", kwargs={"update_info": {"factor": 2.0, "fail": True}})
    out["failed"] = False
except Exception as e:
    out["failed"] = "failed midway" in str(e)
run(prompts[:1])
time.sleep(1)
s = state()
out["after_failure"] = [s["version"], s["weight_version"], scales_of(s)]
out["windows"] = sorted(windows())
print(json.dumps(out))
"""


def test_refit_through_vllms_weight_update_api(server, tmp_path):
    """RL refits through vLLM's own weight-update API (start / update / finish_weight_update
    with a registered transfer engine, then the engine's weight version), in the default mode,
    with no Caliper call: the new weight version's window gets the engine's tokens and publishes
    what an eager reference process captures on the same updated weights and requests; the
    scales the update reset to 1.0 are repaired before the next step (a probe in the attention
    op); an update that fails midway opens no window and keeps the version in use."""
    config = tiny_llama(tmp_path / "model")
    client = caliper.Client(server.address)
    fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_tensor"), min_tokens=16)
    ps = prompts(4, 32, seed=9)
    env = clean_env(CALIPER_FLEET="f", CALIPER_SERVER=server.address,
                    CALIPER_SAMPLE_FRACTION="1", CALIPER_REPORT_S="0.5")
    out = run_script(REFIT_SCRIPT, env, server.address, tmp_path / "model", json.dumps(ENGINE),
                     json.dumps(ps))
    print(json.dumps(out))
    assert out["v1"] == 1
    assert out["reset_to"] == 1.0  # the update reset the scales ...
    assert out["probe_first_step"] == out["v1_scales"]["0"]  # ... repaired before the next step
    assert out["repaired"] >= 1
    assert out["weight_version"] == "step-2"
    assert out["sampled2"] == 2 * (32 + 3) == out["window2_tokens"]
    assert out["v2"] == ["new_weight_version", 2]
    ref = reference(server, tmp_path / "model", {"kv": "per_tensor"},
                    [{"engine": ps[2:4], "factor": 1.5}])
    assert_close(out["absmax2"], [[l[0], l[1]] for l in ref[0]], COMPILED_RTOL,
                 "version 2 (new weights) absmax")
    assert out["failed"] is True
    assert out["after_failure"] == [2, "step-2", out["v2_scales"]]
    assert out["windows"] == ["initial", "step-2"]  # none for the update that never finished


MLA_SCRIPT = r"""
import json, os, sys, time
import torch, vllm
import caliper, caliper.vllm as plugin
from caliper import fleets
from vllm.model_executor.layers.attention.mla_attention import MLAAttention
address, model_dir, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
client = caliper.Client(address)
# Default mode; the native rotary, as vllm_mla_test.py explains (the CPU build's compiled rotary
# writes into DeepSeek's latent).
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128,
               kv_cache_memory_bytes=64 << 20,
               compilation_config={"custom_ops": ["-rotary_embedding"]})
one = vllm.SamplingParams(max_tokens=1)  # each request one prefill: the tokens transformers sees
def run(ps):
    for p in ps:
        llm.generate([{"prompt_token_ids": p}], one, use_tqdm=False)
state = lambda: llm.collective_rpc("caliper_state")[0]
def wait(cond, what, seconds=60):
    deadline = time.time() + seconds
    while not cond():
        assert time.time() < deadline, (what, state())
        time.sleep(0.2)
def window_tokens():
    return next((w.tokens for w in fleets.get_fleet(client, "m").windows if w.open), -1)
out = {}
wait(lambda: state()["window"] != "", "the plugin opened no window")
run(prompts)
s = state()
out["sampled"] = s["total_sampled_tokens"]
wait(lambda: state()["unacknowledged"] == 0, "statistics not acknowledged")
wait(lambda: window_tokens() >= s["total_sampled_tokens"], "window tokens")
w = fleets.close_window(client, "m", weight_version="initial")
out["closed"] = [w.decision, w.version]
layers = client.session(w.session_id).scales().kv_layers
out["absmax"] = [[l.mla_kv_c_normed_absmax, l.mla_k_pe_absmax] for l in layers]
out["version1"] = [[l.k_scale, l.v_scale] for l in layers]
wait(lambda: plugin.engine_versions["pending"] == 1, "version 1 not delivered")
run(prompts[:1])
def held(model):
    return {n: [float(m._k_scale), float(m._v_scale), m._k_scale_float, m._v_scale_float]
            for n, m in model.named_modules() if isinstance(m, MLAAttention)}
out["held"] = llm.apply_model(held)[0]
out["version_in_use"] = state()["version"]

# Saturation against the entry's one scale: half of each layer's calibrated scale, applied as a
# version; a probe records the K/V the cache is handed (real rows), counted here.
recorded = {}
def install_probe(model):
    for name, m in model.named_modules():
        if isinstance(m, MLAAttention):
            def probe(kv_c, k_pe, kv_cache, slot_mapping, *args, _inner=m.update_kv_cache,
                      _name=name, **kwargs):
                if slot_mapping is not None:
                    real = slot_mapping[:kv_c.shape[0]] >= 0
                    recorded.setdefault(_name, []).append(
                        (kv_c[:real.numel()][real].float().clone(),
                         k_pe[:real.numel()][real].float().reshape(int(real.sum()), -1).clone()))
                return _inner(kv_c, k_pe, kv_cache, slot_mapping, *args, **kwargs)
            m.update_kv_cache = probe
half = {i: ([k[0] / 2], [v[0] / 2]) for i, (k, v) in enumerate(out["version1"])}
out["apply"] = llm.collective_rpc("caliper_apply_scales", args=(7, "initial", half))[0]
llm.apply_model(install_probe)
run(prompts)
wait(lambda: state()["unacknowledged"] == 0 and state()["saturation_per_layer"], "saturation")
time.sleep(1)
out["saturation"] = state()["saturation_per_layer"]
count = {}
for name, parts in sorted(recorded.items()):
    index = int(name.split("layers.")[1].split(".")[0])
    limit = torch.tensor(half[index][0][0], dtype=torch.float32) * 448.0
    kv_c = torch.cat([a for a, _ in parts]); k_pe = torch.cat([b for _, b in parts])
    count[str(index)] = {"k": [(kv_c.abs() > limit).sum().item() / kv_c.numel()],
                         "v": [(k_pe.abs() > limit).sum().item() / k_pe.numel()]}
out["count"] = count
print(json.dumps(out))
"""


def test_mla_fleet_through_the_plugin(server, tmp_path):
    """DeepseekV3 (MLA: MLAAttention is no subclass of Attention) served in vLLM's default mode
    with the plugin: it samples kv_c_normed and k_pe where the cache update op hands them over,
    into an MLA fleet, equal to transformers' capture of the same prompts (caliper.hooks; within
    2^-6, the bf16 rounding vllm_mla_test.py measures); after a switch every MLA layer holds
    the version's scales as vLLM's loader sets them for an FP8 cache (the CPU MLA backend runs
    only the auto cache, so they are read, not served); its saturation, against the entry's one
    scale, equals a count over the same K/V done here."""
    import transformers
    from conftest import vllm_deepseek_v3_config
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(vllm_deepseek_v3_config(layers=2))
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    client = caliper.Client(server.address)
    fleets.create_fleet(client, "m", config, caliper.Recipe(kv="per_tensor"), min_tokens=16)
    ps = prompts(3, 32, seed=11)
    env = clean_env(CALIPER_FLEET="m", CALIPER_SERVER=server.address,
                    CALIPER_SAMPLE_FRACTION="1", CALIPER_REPORT_S="0.5")
    out = run_script(MLA_SCRIPT, env, server.address, tmp_path / "model", json.dumps(ps))
    print(json.dumps(out))
    assert out["sampled"] == 3 * 32
    assert out["closed"] == ["first_version", 1]
    # transformers' DeepseekV3 on the same prompts (its cached parts, through caliper.hooks)
    import caliper.hooks as transformers_hooks
    ref = client.create_session(config, caliper.Recipe(kv="per_tensor"), name="transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "model", dtype="auto", attn_implementation="eager").eval()
    handle = transformers_hooks.attach(hf, ref)
    with torch.no_grad():
        for ids in ps:
            hf(torch.tensor([ids]), use_cache=False)
    handle.detach()
    ref.finalize()
    want = [[l.mla_kv_c_normed_absmax, l.mla_k_pe_absmax] for l in ref.scales().kv_layers]
    assert_close(out["absmax"], want, 2.0 ** -6, "MLA kv_c_normed / k_pe absmax")
    # the FP8 loader's values for the version's scales (BaseKVCacheMethod, kv_cache_dtype fp8)
    assert out["version_in_use"] == 1
    f32 = lambda x: torch.tensor(x, dtype=torch.float32).item()  # noqa: E731
    for name, values in out["held"].items():
        k, v = out["version1"][int(name.split("layers.")[1].split(".")[0])]
        assert values == [f32(k[0]), f32(v[0]), k[0], v[0]], (name, values)
    assert out["apply"] == ""
    assert out["saturation"] == out["count"]
    assert any(f > 0 for layer in out["count"].values() for f in layer["k"] + layer["v"])


QUERY_SCRIPT = r"""
import json, os, sys, time
import torch, vllm
import caliper
import caliper.vllm as plugin
from caliper import fleets, vllm_hooks
address, model_dir, engine, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
client = caliper.Client(address)
out = {}
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, **engine)
greedy = vllm.SamplingParams(max_tokens=4, temperature=0)

def state():
    return llm.collective_rpc("caliper_state")[0]

def run(ps):
    llm.generate([{"prompt_token_ids": p} for p in ps], greedy, use_tqdm=False)

def wait(cond, what, seconds=60):
    deadline = time.time() + seconds
    while not cond():
        assert time.time() < deadline, (what, fleets.get_fleet(client, "f"), state())
        time.sleep(0.2)

def window_tokens():
    return next((w.tokens for w in fleets.get_fleet(client, "f").windows if w.open), -1)

wait(lambda: state()["window"] != "", "the plugin opened no window")
config = json.load(open(os.path.join(model_dir, "config.json")))
run(prompts)
s = state()
wait(lambda: state()["unacknowledged"] == 0, "statistics not acknowledged")
wait(lambda: window_tokens() >= s["total_sampled_tokens"], "window tokens")
window = fleets.close_window(client, "f", weight_version="initial")
out["closed"] = [window.decision, window.version, window.detail]
live = client.session(window.session_id).scales()
out["absmax"] = [[l.k_absmax, l.v_absmax, l.q_absmax] for l in live.kv_layers]
out["q_scale"] = [l.q_scale for l in live.kv_layers]
out["k_scale"] = [l.k_scale for l in live.kv_layers]
wait(lambda: plugin.engine_versions["pending"] == 1, "WatchScales did not deliver version 1")
run(prompts[:1])
s = state()
out["version_in_use"] = s["version"]
out["in_use"] = {str(k): {n: v[n] for n in ("_q_scale", "_q_scale_float", "_k_scale_float")}
                 for k, v in s["scales"].items()}
# What vLLM's loader makes of the same q/k/v values in a checkpoint (one per tensor).
from vllm.model_executor.layers.attention.attention import set_default_quant_scales
from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
fresh = {}
for layer, (q, k) in enumerate(zip(out["q_scale"], out["k_scale"])):
    m = torch.nn.Module()
    set_default_quant_scales(m, register_buffer=True)
    m.kv_cache_dtype = "fp8"
    BaseKVCacheMethod(None).create_weights(m)
    m.k_scale.data.fill_(max(k)); m.v_scale.data.fill_(max(k)); m.q_scale.data.fill_(max(q))
    BaseKVCacheMethod(None).process_weights_after_loading(m)
    fresh[str(layer)] = {"_q_scale": m._q_scale.tolist(), "_q_scale_float": m._q_scale_float,
                         "_k_scale_float": m._k_scale_float}
out["fresh"] = fresh
# Saturation per KV head under half of each head's scale (the kernel applies the max over the
# rank's heads): the plugin's count against one made here over the K/V the attention op got.
from vllm.model_executor.layers.attention.attention import Attention
recorded = {}
def install_probe(model):
    for name, m in model.named_modules():
        if isinstance(m, Attention):
            def probe(layer, query, key, value, *args, _inner=m.impl.forward, _name=name, **kw):
                from vllm.forward_context import get_forward_context
                sm = get_forward_context().slot_mapping
                sm = sm.get(layer.layer_name) if isinstance(sm, dict) else None
                if sm is not None and kw.get("attn_metadata", args[1] if len(args) > 1 else None) is not None:
                    real = sm[:key.shape[0]] >= 0
                    recorded.setdefault(_name, []).append(
                        (key[:real.numel()][real].float().clone(),
                         value[:real.numel()][real].float().clone()))
                return _inner(layer, query, key, value, *args, **kw)
            m.impl.forward = probe
half = {i: ([x / 2 for x in k], [x / 2 for x in k], [x / 2 for x in q])
        for i, (q, k) in enumerate(zip(out["q_scale"], out["k_scale"]))}
out["apply"] = llm.collective_rpc("caliper_apply_scales", args=(7, "initial", half))[0]
llm.apply_model(install_probe)
run(prompts)
wait(lambda: state()["unacknowledged"] == 0 and state()["saturation_per_layer"], "saturation")
time.sleep(1)
out["saturation"] = state()["saturation_per_layer"]
count = {}
for name, parts in sorted(recorded.items()):
    index = int(name.split("layers.")[1].split(".")[0])
    limit = torch.tensor(max(half[index][0]), dtype=torch.float32) * 448.0
    k = torch.cat([a for a, _ in parts]); v = torch.cat([b for _, b in parts])
    k, v = k.reshape(k.shape[0], 2, -1), v.reshape(v.shape[0], 2, -1)
    frac = lambda x: (x.abs() > limit).sum().item() / x.numel()
    count[str(index)] = {"k": [frac(k[:, h]) for h in range(2)],
                         "v": [frac(v[:, h]) for h in range(2)]}
out["count"] = count
print(json.dumps(out))
"""


def test_plugin_samples_and_applies_the_query_scale_of_an_attention_q_fleet(server, tmp_path):
    """A fleet whose recipe observes the query, in vLLM's default mode: the plugin samples the
    query each attention layer is handed (after RoPE) beside K and V, what an eager process's
    vllm_hooks capture on the same requests (within COMPILED_RTOL), and applies the version's
    q_scale to _q_scale / _q_scale_float as vLLM's loader
    would from a checkpoint. Without the query the fleet's first version would be refused."""
    config = tiny_llama(tmp_path / "model")
    client = caliper.Client(server.address)
    fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_head", attention="q"),
                        min_tokens=16)
    env = clean_env(CALIPER_FLEET="f", CALIPER_SERVER=server.address,
                    CALIPER_SAMPLE_FRACTION="1", CALIPER_REPORT_S="0.5")
    ps = prompts(2, 32, seed=4)
    out = run_script(QUERY_SCRIPT, env, server.address, tmp_path / "model",
                     json.dumps(ENGINE), json.dumps(ps))
    print(json.dumps(out))
    assert out["closed"][:2] == ["first_version", 1], out["closed"]
    ref = reference(server, tmp_path / "model", {"kv": "per_head", "attention": "q"},
                    [{"engine": ps}])
    assert_close(out["absmax"], ref[0], COMPILED_RTOL, "K, V and query absmax per head")
    # one scale per KV head, not the K scale
    assert all(len(q) == 2 and q != k for q, k in zip(out["q_scale"], out["k_scale"]))
    assert out["version_in_use"] == 1
    assert out["in_use"] == out["fresh"]
    assert all(v["_q_scale_float"] != 1.0 for v in out["in_use"].values())
    # the plugin's saturation per KV head equals the count made in the script over the same K/V
    assert out["apply"] == ""
    assert out["saturation"].keys() == out["count"].keys()
    for layer, fractions in out["count"].items():
        for part in ("k", "v"):
            assert out["saturation"][layer][part] == pytest.approx(fractions[part], rel=1e-12)
    assert any(f > 0 for layer in out["count"].values() for f in layer["k"] + layer["v"])


def http_ok(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except OSError:
        return False


@pytest.mark.skipif("openai" not in sys.modules and
                    __import__("importlib").util.find_spec("openai") is None,
                    reason="the openai package is not in this venv")
def test_openai_server_survives_caliper_kill9(tmp_path):
    """The OpenAI server with the plugin, requests from the openai client without pause;
    caliper-server (with --state_dir) killed -9 and restarted mid-traffic: no request fails,
    the statistics that found the queue full are counted, the stream resumes into the same
    window, and a published version reaches the server's engine."""
    import openai
    config = tiny_llama(tmp_path / "model")
    caliper_server = Server(tmp_path, state_dir=tmp_path / "state")
    vllm_proc = None
    try:
        client = caliper.Client(caliper_server.address)
        fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_head"), min_tokens=16)
        port = free_port()
        env = clean_env(CALIPER_FLEET="f", CALIPER_SERVER=caliper_server.address,
                        CALIPER_SAMPLE_FRACTION="1", CALIPER_QUEUE_ITEMS="4",
                        CALIPER_QUEUE_BYTES="2048", CALIPER_REPORT_S="0.5")
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        log = tmp_path / "vllm.log"
        vllm_proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
             str(tmp_path / "model"), "--served-model-name", "tiny", "--host", "127.0.0.1",
             "--port", str(port), "--dtype", "bfloat16",
             "--max-model-len", "256", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES)],
            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while not http_ok(f"http://127.0.0.1:{port}/health"):
            assert vllm_proc.poll() is None, log.read_text()[-4000:]
            assert time.time() < deadline, "the OpenAI server did not start"
            time.sleep(1)
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                            max_retries=0, timeout=60)
        texts = [" ".join(f"t{t}" for t in p) for p in prompts(8, 24, seed=3)]
        results = {"ok": 0, "failed": []}
        stop = threading.Event()

        def traffic():
            i = 0
            while not stop.is_set():
                try:
                    r = api.completions.create(model="tiny", prompt=texts[i % len(texts)],
                                               max_tokens=8, temperature=0)
                    assert r.choices[0].text
                    results["ok"] += 1
                except Exception as e:  # noqa: BLE001 - counted, asserted below
                    results["failed"].append(repr(e))
                i += 1
        thread = threading.Thread(target=traffic)
        thread.start()

        def window():
            return next(w for w in fleets.get_fleet(client, "f").windows if w.open)

        def wait(cond, what, seconds=120):
            deadline = time.time() + seconds
            while not cond():
                assert time.time() < deadline, what + "\n" + log.read_text()[-3000:]
                time.sleep(0.5)
        try:
            wait(lambda: window_tokens_safe(window) > 0, "no tokens reached the window")
            first = window()
            caliper_server.kill9()
            served_before = results["ok"]
            time.sleep(8)
            served_while_down = results["ok"] - served_before
            caliper_server.start()
            client = caliper.Client(caliper_server.address)
            wait(lambda: window().tokens > first.tokens + 100, "the stream did not resume")
            assert window().session_id == first.session_id
        finally:
            stop.set()
            thread.join(120)
        print(f"requests: {results['ok']} served, {served_while_down} while Caliper was down, "
              f"{len(results['failed'])} failed")
        assert results["failed"] == [] and served_while_down > 0
        text = log.read_text()
        assert "statistics dropped so far" in text

        closed = fleets.close_window(client, "f", session_id=first.session_id)
        assert closed.version == 1, closed

        def switched():  # the switch happens before the engine's next step
            api.completions.create(model="tiny", prompt=texts[0], max_tokens=2, temperature=0)
            return "caliper: fleet f version 1 in use" in log.read_text()
        wait(switched, "no switch")
        wait(lambda: [u.version for u in fleets.get_fleet(client, "f").in_use] == [1],
             f"no ReportInUse: {fleets.get_fleet(client, 'f').in_use}")
        # the statistics dropped while Caliper was down reach the server with the report
        wait(lambda: fleets.get_fleet(client, "f").in_use[0].dropped_statistics > 0,
             "no dropped statistics reported")
    finally:
        if vllm_proc is not None and vllm_proc.poll() is None:
            vllm_proc.send_signal(signal.SIGINT)
            try:
                vllm_proc.wait(60)
            except subprocess.TimeoutExpired:
                vllm_proc.kill()
                vllm_proc.wait()
        caliper_server.kill9() if caliper_server.proc.poll() is None else None


def window_tokens_safe(window) -> int:
    try:
        return window().tokens
    except StopIteration:
        return 0


def fp8_kv_cache_missing() -> str:
    """Why vLLM's CPU build cannot run an FP8 KV cache here ("" when it can)."""
    if torch.cuda.is_available():
        return ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line.split(":", 1)[1].split() for line in f
                              if line.startswith("flags")), []))
    except OSError as e:
        return f"cannot read /proc/cpuinfo ({e})"
    if flags & {"avx512f", "amx_tile"}:
        return ""
    return ("this CPU has neither AVX-512 (avx512f) nor AMX (amx_tile), which vLLM's CPU FP8 KV "
            "cache needs")


def merged_checkpoint(session, tmp_path: pathlib.Path) -> pathlib.Path:
    """tmp_path/merged: tmp_path/model with the session's K/V scales (`caliper merge --kv-only`
    of its compressed-tensors file), what a fresh vLLM process is started from."""
    from conftest import run_cli
    session.scales(formats=["compressed-tensors"], out=tmp_path / "s")
    run_cli("merge", "--checkpoint", tmp_path / "model", "--scales",
            tmp_path / "s" / "compressed_tensors_scales.safetensors", "--out",
            tmp_path / "merged", "--kv-only")
    return tmp_path / "merged"


FP8_SCRIPT = r"""
import json, sys, time
import vllm
import caliper, caliper.vllm as plugin
from caliper import fleets
mode, model_dir, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, kv_cache_dtype="fp8",
               **json.loads(sys.argv[4]))
params = vllm.SamplingParams(max_tokens=8, temperature=0, prompt_logprobs=2)
run = lambda: [[list(o.outputs[0].token_ids),
                [{str(k): v.logprob for k, v in d.items()} for d in o.prompt_logprobs[1:]]]
               for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                     use_tqdm=False)]
out = {}
if mode == "live":
    client = caliper.Client(sys.argv[5])
    deadline = time.time() + 60
    while not llm.collective_rpc("caliper_state")[0]["window"]:  # opened in the background
        assert time.time() < deadline
        time.sleep(0.2)
    run()
    time.sleep(3)
    window = fleets.close_window(client, "f", weight_version="initial")
    out["window"] = window.session_id
    deadline = time.time() + 60
    while plugin.engine_versions["pending"] != 1:
        assert time.time() < deadline
        time.sleep(0.2)
out["outputs"] = run()
def scales(model):
    from vllm.model_executor.layers.attention.attention import Attention
    return {n: [float(m._k_scale), float(m._v_scale), m._k_scale_float, m._v_scale_float]
            for n, m in model.named_modules() if isinstance(m, Attention)}
out["scales"] = llm.apply_model(scales)[0]
print(json.dumps(out))
"""


@pytest.mark.skipif(bool(fp8_kv_cache_missing()), reason=fp8_kv_cache_missing() or "runs")
def test_hot_reload_equals_a_fresh_process_on_the_merged_checkpoint(server, tmp_path):
    """With an FP8 KV cache: after the switch, the scales and the prompt logprobs and greedy
    tokens are bit-identical to a fresh vLLM process started from the checkpoint holding the
    same scales (`caliper merge`)."""
    config = tiny_llama(tmp_path / "model")
    client = caliper.Client(server.address)
    fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_tensor"), min_tokens=16)
    ps = json.dumps(prompts(3, 32, seed=4))
    live = run_script(FP8_SCRIPT, clean_env(CALIPER_FLEET="f", CALIPER_SERVER=server.address,
                                            CALIPER_SAMPLE_FRACTION="1"),
                      "live", tmp_path / "model", ps, json.dumps(ENGINE), server.address)
    merged_checkpoint(client.session(live["window"]), tmp_path)
    fresh = run_script(FP8_SCRIPT, clean_env(), "fresh", tmp_path / "merged", ps,
                       json.dumps(ENGINE))
    assert live["scales"] == fresh["scales"]
    assert live["outputs"] == fresh["outputs"]


ACROSS_SCRIPT = r"""
import json, sys, time
import vllm
import caliper, caliper.vllm as plugin
from caliper import fleets
mode, model_dir, warm, prompt, before = sys.argv[1:6]
warm, prompt, before = json.loads(warm), json.loads(prompt), int(before)
llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, kv_cache_dtype="fp8",
               **json.loads(sys.argv[6]))
LONG = 40
def wait(ready, what):
    deadline = time.time() + 60
    while not ready():
        assert time.time() < deadline, what
        time.sleep(0.2)
out = {}
engine = llm.llm_engine
if mode == "live":
    client = caliper.Client(sys.argv[7])
    wait(lambda: llm.collective_rpc("caliper_state")[0]["window"], "window opened")
    llm.generate([{"prompt_token_ids": p} for p in warm],
                 vllm.SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    time.sleep(3)
    engine.add_request("across", {"prompt_token_ids": prompt},
                       vllm.SamplingParams(max_tokens=LONG, temperature=0, logprobs=2))
    tokens = []
    while len(tokens) < before:  # decoded under the scales in use before the version
        for o in engine.step():
            tokens = list(o.outputs[0].token_ids)
    out["before"] = tokens
    out["window"] = fleets.close_window(client, "f", weight_version="initial").session_id
    wait(lambda: plugin.engine_versions["pending"] == 1, "version 1 pending")
    assert plugin.engine_versions["in_use"] == 0
    out["switched_at"] = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            final = o
            if out["switched_at"] is None and plugin.engine_versions["in_use"] == 1:
                out["switched_at"] = len(o.outputs[0].token_ids)
else:  # fresh: the prompt and the tokens generated before the switch, as one prompt
    engine.add_request("fresh", {"prompt_token_ids": prompt},
                       vllm.SamplingParams(max_tokens=LONG - before, temperature=0, logprobs=2))
    while engine.has_unfinished_requests():
        for o in engine.step():
            final = o
out["tokens"] = list(final.outputs[0].token_ids)
out["logprobs"] = [{str(k): v.logprob for k, v in d.items()} for d in final.outputs[0].logprobs]
print(json.dumps(out))
"""


@pytest.mark.skipif(bool(fp8_kv_cache_missing()), reason=fp8_kv_cache_missing() or "runs")
def test_a_request_running_across_the_switch_continues_as_a_fresh_process(server, tmp_path):
    """With an FP8 KV cache, a request decoding when a version arrives is preempted at the
    switch (CALIPER_SWITCH_GRACE_S=0) and recomputes its K/V under the new scales: its tokens and
    logprobs after the switch are bit-identical to a fresh process on the merged checkpoint fed
    the prompt and the tokens generated before the switch. Had the cache kept K/V written under
    the old scales (scale 1.0), the logprobs would differ."""
    config = tiny_llama(tmp_path / "model")
    client = caliper.Client(server.address)
    fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_tensor"), min_tokens=16)
    prompt, before = prompts(1, 32, seed=5)[0], 8
    live = run_script(ACROSS_SCRIPT, clean_env(CALIPER_FLEET="f", CALIPER_SERVER=server.address,
                                               CALIPER_SAMPLE_FRACTION="1",
                                               CALIPER_SWITCH_GRACE_S="0"),
                      "live", tmp_path / "model", json.dumps(prompts(3, 32, seed=4)),
                      json.dumps(prompt), before, json.dumps(ENGINE), server.address)
    assert live["tokens"][:before] == live["before"]
    assert before < live["switched_at"] < len(live["tokens"]), live["switched_at"]
    merged_checkpoint(client.session(live["window"]), tmp_path)
    fresh = run_script(ACROSS_SCRIPT, clean_env(), "fresh", tmp_path / "merged", "[]",
                       json.dumps(prompt + live["before"]), before, json.dumps(ENGINE))
    assert live["tokens"][before:] == fresh["tokens"]
    assert live["logprobs"][before:] == fresh["logprobs"]


TP_SCRIPT = r"""
import json, sys, time
import vllm
import caliper, caliper.vllm as plugin
from caliper import fleets
def main():
    mode, model_dir, prompts, kv_dtype = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, kv_cache_dtype=kv_dtype,
                   tensor_parallel_size=2, distributed_executor_backend="mp",
                   **json.loads(sys.argv[5]))
    params = vllm.SamplingParams(max_tokens=8, temperature=0, prompt_logprobs=2)
    run = lambda: [[list(o.outputs[0].token_ids),
                    [{str(k): v.logprob for k, v in d.items()} for d in o.prompt_logprobs[1:]]]
                   for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                         use_tqdm=False)]
    def wait(ready, what):
        deadline = time.time() + 120
        while not ready():
            assert time.time() < deadline, what
            time.sleep(0.2)
    out = {}
    if mode == "live":
        client = caliper.Client(sys.argv[6])
        wait(lambda: all(s["window"] for s in llm.collective_rpc("caliper_state")),
             "every rank opened the window")
        run()
        time.sleep(3)
        out["sent"] = [[s["tp_rank"], s["tp_size"], s["sampled_tokens"], s["producer"]]
                       for s in llm.collective_rpc("caliper_state")]
        out["window"] = fleets.close_window(client, "f", weight_version="initial").session_id
        wait(lambda: plugin.engine_versions["pending"] == 1, "version 1 pending")
        out["outputs"] = run()  # the first step switches every rank
        out["versions"] = [s["version"] for s in llm.collective_rpc("caliper_state")]
    else:
        out["outputs"] = run()
    def scales(worker):  # a callable collective_rpc cloudpickles to every rank
        from vllm.model_executor.layers.attention.attention import Attention
        return {n: [float(m._k_scale), float(m._v_scale), m._k_scale_float, m._v_scale_float,
                    float(m._q_scale), m._q_scale_float]
                for n, m in worker.model_runner.get_model().named_modules()
                if isinstance(m, Attention)}
    out["scales"] = llm.collective_rpc(scales)
    print(json.dumps(out), flush=True)
if __name__ == "__main__":
    main()
"""


def test_tensor_parallel_two_ranks_feed_one_window_and_switch_together(server, tmp_path):
    """TP 2 on the CPU build (two worker processes, one core each): both ranks stream their
    KV head, and the query heads of its group (recipe attention q), into one window, and after
    the publish both apply version 1 on the same step, each with the K, V and Q scales vLLM's
    loader gives that rank from the merged per-head checkpoint; outputs (with an FP8 cache where
    this CPU runs one) equal a fresh TP 2 process on that checkpoint."""
    config = tiny_llama(tmp_path / "model")
    client = caliper.Client(server.address)
    fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_head", attention="q"),
                        min_tokens=16)
    ps = json.dumps(prompts(3, 32, seed=6))
    # Explicit: "auto" would load the merged checkpoint's kv_cache_scheme as an FP8 cache, which
    # vLLM's CPU build refuses without AVX-512 or AMX.
    kv_dtype = "bfloat16" if fp8_kv_cache_missing() else "fp8"
    env = dict(VLLM_CPU_OMP_THREADS_BIND="0|1" if (os.cpu_count() or 1) >= 2 else "0|0")
    live = run_script(TP_SCRIPT, clean_env(CALIPER_FLEET="f", CALIPER_SERVER=server.address,
                                           CALIPER_SAMPLE_FRACTION="1", **env),
                      "live", tmp_path / "model", ps, kv_dtype, json.dumps(ENGINE),
                      server.address)
    ranks = sorted(live["sent"])
    assert [r[:2] for r in ranks] == [[0, 2], [1, 2]]
    assert all(r[2] > 0 for r in ranks) and ranks[0][3] != ranks[1][3]  # two producers
    assert live["versions"] == [1, 1]
    window = client.session(live["window"])
    layers = window.scales(tp=1).kv_layers
    for heads in [layer.k_scale for layer in layers] + [layer.q_scale for layer in layers]:
        assert len(heads) == 2 and min(heads) > 0  # a KV head (and its queries) from each rank
    # Each rank holds its own KV head's scales of the version (rank r: head r), in every copy.
    f32 = lambda x: torch.tensor(x, dtype=torch.float32).item()  # noqa: E731
    for rank, held in enumerate(live["scales"]):
        for name, values in held.items():
            layer = layers[int(name.split("layers.")[1].split(".")[0])]
            k, v, q = layer.k_scale[rank], layer.v_scale[rank], layer.q_scale[rank]
            assert values == [f32(k), f32(v), k, v, f32(q), q], (rank, name, values)
    assert live["scales"][0] != live["scales"][1]
    if kv_dtype != "fp8":
        # A BF16 cache reads no scale: outputs against a fresh process could not see a wrong
        # one, so that comparison runs only where the CPU runs an FP8 cache.
        print(f"tp2: outputs against a fresh process not compared ({fp8_kv_cache_missing()})")
        return
    merged_checkpoint(window, tmp_path)
    fresh = run_script(TP_SCRIPT, clean_env(**env), "fresh", tmp_path / "merged", ps, kv_dtype,
                       json.dumps(ENGINE))
    assert live["scales"] == fresh["scales"]
    assert live["outputs"] == fresh["outputs"]


def test_two_openai_servers_feed_one_window_and_switch_to_one_version(server, tmp_path):
    """Two OpenAI server processes on one fleet, threads bound to different cores, requests from
    the openai client: the window holds exactly the tokens both served, it publishes version 1,
    and both switch to it and report it in use (two engines in the fleet's in-use list)."""
    openai = pytest.importorskip("openai")
    config = tiny_llama(tmp_path / "model")
    servers = []
    try:
        client = caliper.Client(server.address)
        fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_tensor"), min_tokens=16)
        cores = os.cpu_count() or 1
        for i in range(2):
            env = clean_env(CALIPER_FLEET="f", CALIPER_SERVER=server.address,
                            CALIPER_SAMPLE_FRACTION="1", CALIPER_REPORT_S="0.5",
                            VLLM_CPU_OMP_THREADS_BIND=str(i % cores))
            env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
            port, log = free_port(), tmp_path / f"vllm{i}.log"
            servers.append((port, log, subprocess.Popen(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                 str(tmp_path / "model"), "--served-model-name", "tiny", "--host", "127.0.0.1",
                 "--port", str(port), "--dtype", "bfloat16",
                 "--max-model-len", "256", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES)],
                env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)))

        def wait(ready, what, seconds=600):
            deadline = time.time() + seconds
            while not ready():
                for _, log, proc in servers:
                    assert proc.poll() is None, log.read_text()[-4000:]
                assert time.time() < deadline, what
                time.sleep(0.5)
        for port, _, _ in servers:
            wait(lambda: http_ok(f"http://127.0.0.1:{port}/health"), "an OpenAI server started")
        apis = [openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                              max_retries=0, timeout=120) for port, _, _ in servers]
        wait(lambda: any(w.open for w in fleets.get_fleet(client, "f").windows), "window open")
        served = 0  # tokens through the model: the prompt, and each generated token but the last
        for i, api in enumerate(apis):
            for p in prompts(2 + i, 24, seed=20 + i):
                r = api.completions.create(model="tiny", prompt=" ".join(f"t{t}" for t in p),
                                           max_tokens=8, temperature=0)
                served += r.usage.prompt_tokens + r.usage.completion_tokens - 1

        def window():
            return next(w for w in fleets.get_fleet(client, "f").windows if w.open)
        wait(lambda: window().tokens >= served, f"the window reached {served} tokens", 120)
        assert window().tokens == served
        closed = fleets.close_window(client, "f", weight_version="initial")
        assert (closed.version, closed.tokens) == (1, served)

        def switched():  # each engine switches before its next step
            for api in apis:
                api.completions.create(model="tiny", prompt="t5 t6 t7", max_tokens=2)
            return all("caliper: fleet f version 1 in use" in log.read_text()
                       for _, log, _ in servers)
        wait(switched, "both engines switched", 120)
        wait(lambda: [u.version for u in fleets.get_fleet(client, "f").in_use] == [1, 1],
             "both engines reported version 1 in use", 60)
    finally:
        for _, _, proc in servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_openai_server_tensor_parallel_two_ranks_feed_one_window_and_switch(server, tmp_path):
    """The OpenAI server with --tensor-parallel-size 2 (one core per worker), default mode,
    requests from the openai client: both ranks feed the fleet's window (each reports the tokens
    it sampled), the window holds exactly the tokens served, and after the publish both ranks
    apply version 1 on the same step (one collective_rpc from the engine core: one switch line)
    and report it in use."""
    openai = pytest.importorskip("openai")
    config = tiny_llama(tmp_path / "model")
    client = caliper.Client(server.address)
    fleets.create_fleet(client, "f", config, caliper.Recipe(kv="per_head"), min_tokens=16)
    env = clean_env(CALIPER_FLEET="f", CALIPER_SERVER=server.address,
                    CALIPER_SAMPLE_FRACTION="1", CALIPER_REPORT_S="0.5",
                    VLLM_CPU_OMP_THREADS_BIND="0|1" if (os.cpu_count() or 1) >= 2 else "0|0")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    port, log = free_port(), tmp_path / "vllm.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
         str(tmp_path / "model"), "--served-model-name", "tiny", "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "256",
         "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--tensor-parallel-size", "2",
         "--distributed-executor-backend", "mp"],
        env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        def wait(ready, what, seconds=600):
            deadline = time.time() + seconds
            while not ready():
                assert proc.poll() is None, log.read_text()[-4000:]
                assert time.time() < deadline, what + "\n" + log.read_text()[-3000:]
                time.sleep(0.5)
        wait(lambda: http_ok(f"http://127.0.0.1:{port}/health"), "the OpenAI server started")
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                            max_retries=0, timeout=120)
        wait(lambda: any(w.open for w in fleets.get_fleet(client, "f").windows), "window open")
        served = 0
        for p in prompts(4, 24, seed=30):
            r = api.completions.create(model="tiny", prompt=" ".join(f"t{t}" for t in p),
                                       max_tokens=8, temperature=0)
            served += r.usage.prompt_tokens + r.usage.completion_tokens - 1

        def window():
            return next(w for w in fleets.get_fleet(client, "f").windows if w.open)
        wait(lambda: window().tokens >= served, f"the window reached {served} tokens", 120)
        assert window().tokens == served
        time.sleep(3)  # the window counts rank 0's tokens; rank 1's statistics land beside them

        # Both ranks report from the start (version 0), and each fed its KV head: the version's
        # per-head scales come from rank 0 (head 0) and rank 1 (head 1).
        assert sorted(u.producer_id.rsplit("/", 1)[1]
                      for u in fleets.get_fleet(client, "f").in_use) == ["rank0", "rank1"]
        closed = fleets.close_window(client, "f", weight_version="initial")
        assert (closed.version, closed.tokens) == (1, served)
        for layer in client.session(closed.session_id).scales(tp=1).kv_layers:
            assert len(layer.k_scale) == 2 and min(layer.k_scale + layer.v_scale) > 0

        def switched():
            api.completions.create(model="tiny", prompt="t5 t6 t7", max_tokens=2)
            return "caliper: fleet f version 1 in use" in log.read_text()
        wait(switched, "the engine switched", 120)
        assert log.read_text().count("caliper: fleet f version 1 in use") == 1  # one switch
        wait(lambda: sorted((u.producer_id.rsplit("/", 1)[1], u.version)
                            for u in fleets.get_fleet(client, "f").in_use)
             == [("rank0", 1), ("rank1", 1)], "both ranks reported version 1 in use", 60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
