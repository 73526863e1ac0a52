"""The tensor names Caliper writes for an MLA model (DeepseekV3), checked against vLLM 0.32's own
loader code (its CPU build, venv "vllm"). vLLM's CPU engine cannot load an FP8-KV MLA model: its
CPU MLA backends take kv_cache_dtype "auto" only (v1/attention/backends/mla/cpu_mla.py:
`supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto"]`; AMX_MLA needs AMX), so the
loader's name resolution is run directly on the names of Caliper's file.

Where vLLM's MLA k_scale lives (model_executor/models/deepseek_v2.py, DeepseekV2MLAAttention:
`self.mla_attn = MultiHeadLatentAttentionWrapper(`; model_executor/layers/mla.py:
`self.mla_attn = MLAAttention(`): model.layers.N.self_attn.mla_attn.mla_attn.k_scale. Its
DeepseekV2 load_weights passes every checkpoint name through
`remapped_name = maybe_remap_kv_scale_name(name, params_dict)` and skips it when that is None;
MLAAttention.forward writes the cache with `self._k_scale` only (one scale for kv_c_normed and
k_pe; layers/attention/mla_attention.py, update_kv_cache -> do_kv_cache_update ->
ops.concat_and_cache_mla(..., scale=k_scale))."""
import json

import pytest
import torch
from safetensors import safe_open

import caliper

vllm = pytest.importorskip("vllm")
from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name  # noqa: E402

CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
          "hidden_size": 64, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 12,
          "v_head_dim": 12, "torch_dtype": "float32"}


def vllm_params(layers):
    """The kv-scale parameters vLLM 0.32's DeepseekV2 model registers (see the module doc), plus
    a weight, as its params_dict holds them."""
    out = {}
    for i in range(layers):
        for leaf in ("k_scale", "v_scale", "q_scale"):
            out[f"model.layers.{i}.self_attn.mla_attn.mla_attn.{leaf}"] = None
        out[f"model.layers.{i}.self_attn.kv_b_proj.weight"] = None
    return out


def test_vllm_loader_resolves_caliper_mla_names(server, tmp_path):
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
    params = vllm_params(2)
    for path in files:
        loaded = {}
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                target = maybe_remap_kv_scale_name(name, params)
                assert target is not None and target in params, f"vLLM drops {name} ({path})"
                t = f.get_tensor(name)
                assert t.numel() == 1  # per tensor, what MLAAttention's k_scale holds
                loaded[target] = t.item()
        for i in range(2):
            k = loaded[f"model.layers.{i}.self_attn.mla_attn.mla_attn.k_scale"]
            assert k == pytest.approx(doc["kv_cache"]["layers"][i]["k_scale"][0], rel=1e-7)
            assert loaded[f"model.layers.{i}.self_attn.mla_attn.mla_attn.v_scale"] == k
    # The compressed-tensors names llm-compressor writes for the same model are dropped by this
    # loader (it looks for self_attn.attn.k_scale): the cache then runs with k_scale 1.0.
    assert maybe_remap_kv_scale_name("model.layers.0.self_attn.k_scale", params) is None
