"""The tensor names Caliper writes for an MLA model (DeepseekV3), checked against vLLM 0.32's own
loader (its CPU build, venv "vllm"). vLLM's CPU engine cannot run an FP8-KV MLA model: its CPU MLA
backends take kv_cache_dtype "auto" only (v1/attention/backends/mla/cpu_mla.py:
`supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto"]`; AMX_MLA needs AMX). The
first test passes the names of the files a Caliper session writes through vLLM's own
AutoWeightsLoader, as a quantized DeepseekV3 checkpoint's load does (no engine); the second loads
a quantized checkpoint (kv_cache_dtype auto; the name looked for exists in no MLA model, whatever
the cache dtype). Both find that vLLM 0.32 loads no MLA K/V scale under any name: AutoWeightsLoader
applies the quant config's cache-scale mapper first (quantization/base_config.py
get_cache_scale_mapper: `*.k_proj.k_scale` and `*.k_scale` -> `*.attn.k_scale`), and
maybe_remap_kv_scale_name then maps that onto `*.attn.attn.k_scale`, which no MLA model has
(caliper check: mla-kv-scale-not-loaded).

Where vLLM's MLA k_scale lives (model_executor/models/deepseek_v2.py, DeepseekV2MLAAttention:
`self.mla_attn = MultiHeadLatentAttentionWrapper(`; model_executor/layers/mla.py:
`self.mla_attn = MLAAttention(`): model.layers.N.self_attn.mla_attn.mla_attn.k_scale. Its
DeepseekV2 load_weights passes every checkpoint name through
`remapped_name = maybe_remap_kv_scale_name(name, params_dict)` and skips it when that is None;
MLAAttention.forward writes the cache with `self._k_scale` only (one scale for kv_c_normed and
k_pe; layers/attention/mla_attention.py, update_kv_cache -> do_kv_cache_update ->
ops.concat_and_cache_mla(..., scale=k_scale))."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

import caliper

vllm = pytest.importorskip("vllm")
from vllm.model_executor.layers.quantization.compressed_tensors import (  # noqa: E402
    compressed_tensors as ct)
from vllm.model_executor.model_loader import weight_utils  # noqa: E402
from vllm.model_executor.models.utils import AutoWeightsLoader  # noqa: E402

CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
          "hidden_size": 64, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 12,
          "v_head_dim": 12, "torch_dtype": "float32"}

# What `caliper merge --kv-only` writes into config.json for either scale file (KV-only ModelOpt
# checkpoints carry the compressed-tensors scheme too): the quant config vLLM builds from it.
KV_ONLY_QUANT_CONFIG = {
    "quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "ignore": [],
    "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                        "symmetric": True}}


def vllm_params(layers):
    """The kv-scale parameters vLLM 0.32's DeepseekV2Model registers (see the module doc), plus
    a weight, as its load_weights' params_dict holds them (names under the model, no "model.")."""
    out = {}
    for i in range(layers):
        for leaf in ("k_scale", "v_scale", "q_scale"):
            out[f"layers.{i}.self_attn.mla_attn.mla_attn.{leaf}"] = None
        out[f"layers.{i}.self_attn.kv_b_proj.weight"] = None
    return out


class _DeepseekV2ModelKvScales(torch.nn.Module):
    """DeepseekV2Model.load_weights for a K/V scale named `self_attn.*_scale`: no stacked
    (gate/up, q_a/kv_a, wk) or expert mapping matches it, so it reaches
    `remapped_name = maybe_remap_kv_scale_name(name, params_dict)` and is skipped when that is
    None. Records each name it is handed and what that gives."""

    def __init__(self, params):
        super().__init__()
        self.params = params
        self.seen = []

    def load_weights(self, weights):
        loaded = set()
        for name, _ in weights:
            remapped = weight_utils.maybe_remap_kv_scale_name(name, self.params)
            self.seen.append((name, remapped))
            if remapped is not None:
                loaded.add(remapped)
        return loaded


class _DeepseekV3ForCausalLM(torch.nn.Module):
    """DeepseekV2ForCausalLM.load_weights: `AutoWeightsLoader(self).load_weights(weights)`, which
    finds the quant config on the model and descends into `model` (DeepseekV2Model)."""

    def __init__(self, params):
        super().__init__()
        self.quant_config = ct.CompressedTensorsConfig.from_config(KV_ONLY_QUANT_CONFIG)
        self.model = _DeepseekV2ModelKvScales(params)

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights)


def vllm_load_names(names, layers, monkeypatch):
    """`names` through vLLM 0.32's loader as a quantized DeepseekV3 checkpoint's load runs it:
    AutoWeightsLoader's mapper (the cache-scale mapper among it), then DeepseekV2Model's
    maybe_remap_kv_scale_name. Returns what was loaded, what DeepseekV2Model was handed (with
    what maybe_remap_kv_scale_name gave) and {name handed: name looked for} from its
    "... is not loaded" warnings."""
    missed = {}

    def warning_once(msg, *args, **kwargs):
        if msg.endswith("%s is not loaded.") and len(args) == 4:
            missed[args[1]] = args[2]

    monkeypatch.setattr(weight_utils.logger, "warning_once", warning_once)
    model = _DeepseekV3ForCausalLM(vllm_params(layers))
    loaded = model.load_weights((n, torch.ones(())) for n in names)
    return loaded, model.model.seen, missed


def test_vllm_loader_drops_caliper_mla_names(server, tmp_path, monkeypatch):
    """The names a Caliper session writes for an MLA model (both scale files) through vLLM 0.32's
    loader: the cache-scale mapper turns `self_attn.{k,v}_proj.{k,v}_scale` into
    `self_attn.attn.{k,v}_scale`, maybe_remap_kv_scale_name turns that into
    `self_attn.attn.attn.{k,v}_scale`, which no MLA model has, and drops it: nothing loads (the
    cache keeps k_scale 1.0). llm-compressor's and vLLM's own names end the same way."""
    assert vllm.__version__.startswith("0.32"), vllm.__version__
    session = caliper.Client(server.address).create_session(
        CONFIG, caliper.Recipe(kv="per_tensor"), mode="raw")
    g = torch.Generator().manual_seed(0)
    for layer in range(2):
        latent = torch.randn(1, 7, 16, generator=g)
        k_pe = 10 * torch.randn(1, 7, 8, generator=g)
        session.observe_mla(layer, latent, k_pe, batch=0)
    session.finalize()
    session.scales(tp=1, out=tmp_path / "out", formats=["compressed-tensors", "modelopt"])
    doc = json.loads((tmp_path / "out" / "scales.json").read_text())
    files = sorted((tmp_path / "out").rglob("*.safetensors"))
    assert len(files) == 2  # the compressed-tensors and the ModelOpt scale files
    caliper_names = {f"model.layers.{i}.self_attn.{kv}_proj.{kv}_scale"
                     for i in range(2) for kv in "kv"}
    for path in files:
        # The file: Caliper's names (ModelOpt's spelling), one value each, k == v == scales.json.
        stored = {}
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                assert t.numel() == 1, (name, path)  # per tensor, what MLAAttention's k_scale holds
                stored[name] = t.item()
        assert set(stored) == caliper_names, path
        for i in range(2):
            k = stored[f"model.layers.{i}.self_attn.k_proj.k_scale"]
            assert k == pytest.approx(doc["kv_cache"]["layers"][i]["k_scale"][0], rel=1e-7)
            assert stored[f"model.layers.{i}.self_attn.v_proj.v_scale"] == k
        # The load: mapper, then maybe_remap_kv_scale_name; every name dropped.
        loaded, seen, missed = vllm_load_names(sorted(stored), 2, monkeypatch)
        assert loaded == set(), (path, seen)
        want_seen = [(f"layers.{i}.self_attn.attn.{kv}_scale", None)
                     for i in range(2) for kv in "kv"]
        assert sorted(seen) == want_seen, path
        assert missed == {f"layers.{i}.self_attn.attn.{kv}_scale":
                          f"layers.{i}.self_attn.attn.attn.{kv}_scale"
                          for i in range(2) for kv in "kv"}, path
    params = vllm_params(2)
    assert not any(".attn.attn." in p for p in params)
    # llm-compressor's names and vLLM's own parameter name are dropped the same way.
    loaded, seen, missed = vllm_load_names(
        ["model.layers.0.self_attn.k_scale", "model.layers.1.self_attn.mla_attn.mla_attn.k_scale"],
        2, monkeypatch)
    assert loaded == set()
    assert seen == [("layers.0.self_attn.attn.k_scale", None),
                    ("layers.1.self_attn.mla_attn.mla_attn.attn.k_scale", None)]
    assert missed == {
        "layers.0.self_attn.attn.k_scale": "layers.0.self_attn.attn.attn.k_scale",
        "layers.1.self_attn.mla_attn.mla_attn.attn.k_scale":
            "layers.1.self_attn.mla_attn.mla_attn.attn.attn.k_scale"}
    # Without the mapper, maybe_remap_kv_scale_name alone would resolve Caliper's name: the
    # mapping a real load never reaches.
    alone = weight_utils.maybe_remap_kv_scale_name("layers.0.self_attn.k_proj.k_scale", params)
    assert alone == "layers.0.self_attn.mla_attn.mla_attn.k_scale"


LOAD = r"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import vllm
llm = vllm.LLM(model=sys.argv[1], skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
               max_model_len=128, kv_cache_memory_bytes=64 << 20,
               compilation_config={"custom_ops": ["-rotary_embedding"]})
held = llm.apply_model(lambda m: {n: [float(x._k_scale), float(x._v_scale)]
                                  for n, x in m.named_modules() if hasattr(x, "_k_scale")})[0]
print("HELD " + json.dumps(held))
"""


def test_vllm_loads_no_mla_kv_scale_from_a_quantized_checkpoint(tmp_path):
    """One layer each under Caliper's name (ModelOpt's spelling), llm-compressor's, and vLLM's own
    parameter name: every layer's MLA attention holds 1.0 and vLLM warns for each. `caliper merge`
    writes the checkpoint (its compressed-tensors kv_cache_scheme, so vLLM builds the scales)."""
    from safetensors.torch import save_file
    import transformers
    from conftest import run_cli, vllm_deepseek_v3_config

    assert vllm.__version__.startswith("0.32"), vllm.__version__
    torch.manual_seed(0)
    cfg = vllm_deepseek_v3_config(layers=3)
    dense = tmp_path / "dense"
    transformers.DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(dense)
    scales = tmp_path / "scales.safetensors"
    save_file({f"model.layers.{l}.self_attn.{kv}_proj.{kv}_scale": torch.tensor(0.01 * (l + 2))
               for l in range(3) for kv in "kv"}, str(scales),
              metadata={"format": "pt", "caliper.format": "compressed-tensors"})
    merged = tmp_path / "merged"
    proc = run_cli("merge", "--checkpoint", dense, "--scales", scales, "--out", merged,
                   "--kv-only")
    assert "warning: check: mla-kv-scale-not-loaded: " in proc.stderr, proc.stderr
    config = json.loads((merged / "config.json").read_text())
    assert config["quantization_config"]["kv_cache_scheme"]["strategy"] == "tensor"
    # Layer 1 under llm-compressor's name, layer 2 under vLLM's own parameter name.
    from safetensors.torch import load_file
    shard = next(merged.glob("*caliper-scales*.safetensors"))
    tensors = load_file(str(shard))
    renamed = {}
    for name, t in tensors.items():
        if ".layers.1." in name:
            name = name.replace("k_proj.k_scale", "k_scale").replace("v_proj.v_scale", "v_scale")
        if ".layers.2." in name:
            name = name.replace("k_proj.k_scale", "mla_attn.mla_attn.k_scale").replace(
                "v_proj.v_scale", "mla_attn.mla_attn.v_scale")
        renamed[name] = t
    shard.unlink()
    save_file(renamed, str(shard), metadata={"format": "pt"})
    index_path = merged / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard.name}
    index["weight_map"].update({k: shard.name for k in renamed})
    index_path.write_text(json.dumps(index))

    r = subprocess.run([sys.executable, "-c", LOAD, str(merged)], capture_output=True, text=True,
                       timeout=600, cwd=os.getcwd())
    held_lines = [l for l in r.stdout.splitlines() if l.startswith("HELD ")]
    assert held_lines, r.stderr[-3000:]
    held = json.loads(held_lines[-1][5:])
    mla = {int(n.split("layers.")[1].split(".")[0]): v for n, v in held.items()
           if n.endswith("mla_attn.mla_attn")}
    assert mla == {0: [1.0, 1.0], 1: [1.0, 1.0], 2: [1.0, 1.0]}, held
    for layer, looked_for in ((0, "self_attn.attn.attn.k_scale"), (1, "self_attn.attn.attn.k_scale"),
                              (2, "self_attn.mla_attn.mla_attn.attn.attn.k_scale")):
        assert f"layers.{layer}.{looked_for}). k_scale is not loaded" in r.stdout + r.stderr, layer
    # caliper check names it for the checkpoint, with vLLM degraded.
    out = tmp_path / "check.json"
    proc = run_cli("check", merged, "--engine", "vllm", "--json", out, check=False)
    assert proc.returncode == 4, proc.stderr
    rules = {f["rule"]: f for f in json.loads(out.read_text())["findings"]}
    assert rules["mla-kv-scale-not-loaded"]["severity"] == "degrades"
    assert rules["mla-kv-scale-not-loaded"]["details"]["tensors"] == 6
    assert "mla-kv-scale-name" in rules  # layer 1: llm-compressor's name
