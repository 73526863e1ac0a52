"""Fixtures for the Python client tests: a real caliper-server, tiny random models built from
configs (no downloads), a recorder with the Session's observe_* API, and dump writers for
`caliper calibrate`."""
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest


def short_float(value):
    """A float32's shortest decimal, as scales.json writes it (json.load reads it back as this)."""
    return float(str(np.float32(value)))


BUILD = pathlib.Path(os.environ.get("CALIPER_BUILD_DIR", "build"))
SERVER = BUILD / "server" / "caliper-server"
CLI = BUILD / "client" / "caliper"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """caliper-server on loopback; restart() keeps the port (and --state_dir)."""

    def __init__(self, tmp: pathlib.Path, state_dir=None, extra=()):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_port = free_port()
        self.log = tmp / f"server-{self.port}.log"
        self.args = [str(SERVER), f"--listen={self.address}",
                     f"--metrics_listen=127.0.0.1:{self.metrics_port}", "--device=cpu",
                     *([f"--state_dir={state_dir}"] if state_dir else []), *extra]
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=open(self.log, "a"),
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"caliper-server exited: {self.log.read_text()}")
            if f"listening on {self.address}" in self.log.read_text():
                return
            time.sleep(0.05)
        raise RuntimeError("caliper-server did not start")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def metrics(self) -> str:
        import urllib.request
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics").read().decode()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def make_server(tmp_path):
    servers = []

    def make(**kw):
        servers.append(Server(tmp_path, **kw))
        return servers[-1]
    yield make
    for s in servers:
        s.stop()


def run_cli(*args, check=True):
    proc = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"caliper {args[0]} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


class Recorder:
    """The Session API the hooks use, keeping every tensor (as float32 copies per call)."""

    def __init__(self, recipe):
        from caliper._pb import caliper_pb2 as pb
        self.proto = pb.Session(recipe=recipe)
        self.kv = []       # (layer, batch, key [b,h,s,d], value)
        self.inputs = []   # (module, batch, x)
        self.weights = {}  # module -> w

    def observe_kv(self, layer, key, value, *, batch, tp_rank=0, tp_size=1):
        self.kv.append((layer, batch, key.detach().clone(), value.detach().clone()))

    def observe_input(self, module, x, *, batch, tp_rank=0, tp_size=1):
        self.inputs.append((module, batch, x.detach().clone()))

    def observe_weight(self, module, w, *, tp_rank=0, tp_size=1):
        assert module not in self.weights, f"weight {module} observed twice"
        self.weights[module] = w.detach().clone()


def write_dumps(recorder, out_dir: pathlib.Path):
    """One safetensors dump per batch in `caliper calibrate`'s naming."""
    import torch
    from safetensors.torch import save_file
    out_dir.mkdir(parents=True, exist_ok=True)
    batches = {}
    for layer, batch, k, v in recorder.kv:
        d = batches.setdefault(batch, {})
        # [b, h, s, d] -> [tokens, h, d]
        d[f"model.layers.{layer}.self_attn.k"] = k.transpose(1, 2).reshape(-1, k.shape[1], k.shape[3]).contiguous()
        d[f"model.layers.{layer}.self_attn.v"] = v.transpose(1, 2).reshape(-1, v.shape[1], v.shape[3]).contiguous()
    pieces = {}
    for module, batch, x in recorder.inputs:
        pieces.setdefault((batch, module), []).append(x.reshape(-1, x.shape[-1]))
    for (batch, module), xs in pieces.items():
        batches.setdefault(batch, {})[f"{module}.input"] = torch.cat(xs).contiguous()
    for batch, tensors in batches.items():
        save_file(tensors, str(out_dir / f"batch{batch:04d}.safetensors"),
                  metadata={"batch": str(batch)})


def write_weights(recorder, out_dir: pathlib.Path):
    from safetensors.torch import save_file
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({f"{m}.weight": w.contiguous() for m, w in recorder.weights.items()},
              str(out_dir / "model.safetensors"))


def scales_doc(path) -> dict:
    """scales.json without what differs between two sessions (id, name, progress counters)."""
    doc = json.loads(pathlib.Path(path).read_text())
    for key in ("session_id", "session_name", "progress"):
        doc.pop(key, None)
    return doc


def vllm_deepseek_v3_config(layers=2):
    """A tiny DeepseekV3 vLLM's CPU build runs: a latent entry 576 wide (kv_lora_rank 512 +
    qk_rope_head_dim 64, the only width its CPU MLA kernel compiles for), head dims of 32 (the
    AMX backend packs W_UK/W_UV in blocks of 32), every layer dense, GPT-J rotary pairs."""
    import transformers
    cfg = transformers.DeepseekV3Config(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=layers, n_shared_experts=1,
        kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32,
        v_head_dim=32, vocab_size=512, max_position_embeddings=256, rope_interleave=True)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    return cfg


def tiny_model(kind: str, dtype="float32", seed=0):
    """A tiny random model and its config.json directory-less dict (no downloads)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256, head_dim=16,
                  max_position_embeddings=256)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls, arch = transformers.LlamaForCausalLM, "LlamaForCausalLM"
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(**common)
        cls, arch = transformers.Qwen3ForCausalLM, "Qwen3ForCausalLM"
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
        cls, arch = transformers.MixtralForCausalLM, "MixtralForCausalLM"
    elif kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=48, decoder_sparse_step=1,
                                          mlp_only_layers=[])
        cls, arch = transformers.Qwen3MoeForCausalLM, "Qwen3MoeForCausalLM"
    else:
        raise ValueError(kind)
    cfg.architectures = [arch]
    model = cls(cfg).to(getattr(torch, dtype)).eval()
    with torch.no_grad():  # heavier tails than the default init, per-head outliers
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.08)
    return model, json.loads(cfg.to_json_string())
