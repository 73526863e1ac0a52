"""vLLM CPU build: the K/V capture hooks on a running vllm.LLM (eager, in-process engine) give
the transformers capture's K/V scales on the same tiny random Llama and prompts within the
tolerance measured here (both run BF16; K after RoPE differs by rounding between the two
implementations' kernels). Runs in the vllm venv (CALIPER_PYTHON_SET=vllm)."""
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np
import pytest
import torch

import caliper
import caliper.hooks
from conftest import scales_doc

TOLERANCE = 0.05  # relative, per layer and head; measured 3.3% max (BF16), printed each run


def test_vllm_kv_agrees_with_transformers(server, tmp_path):
    vllm = pytest.importorskip("vllm")
    import transformers
    from caliper import vllm_hooks
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   vocab_size=512, max_position_embeddings=512)
    cfg.architectures = ["LlamaForCausalLM"]
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (48,), generator=g).tolist() for _ in range(6)]

    client = caliper.Client(server.address)
    recipe = caliper.Recipe(kv="per_head")
    hf = client.create_session(config, recipe, name="transformers")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype="auto", attn_implementation="eager").eval()
    h = caliper.hooks.attach(ref, hf)
    with torch.no_grad():
        for ids in prompts:
            ref(torch.tensor([ids]), use_cache=False)
    h.detach()
    hf.finalize()
    hf.scales(out=tmp_path / "hf")

    llm = vllm.LLM(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True,
                   dtype="bfloat16", max_model_len=256,
                   gpu_memory_utilization=0.05)  # on CPU: the share of RAM it reserves
    live = client.create_session(config, recipe, name="vllm")
    handle = vllm_hooks.attach(llm, live)
    params = vllm.SamplingParams(max_tokens=1)
    for ids in prompts:  # one prompt per step: one batch, as one transformers forward
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    handle.detach()
    assert handle.forwards == len(prompts)
    live.finalize()
    live.scales(out=tmp_path / "vllm")
    a = scales_doc(tmp_path / "hf" / "scales.json")["kv_cache"]["layers"]
    b = scales_doc(tmp_path / "vllm" / "scales.json")["kv_cache"]["layers"]
    worst = 0.0
    for la, lb in zip(a, b):
        for key in ("k_absmax", "v_absmax"):
            x, y = np.array(la[key]), np.array(lb[key])
            diff = np.abs(x - y) / x
            worst = max(worst, float(np.max(diff)))
            print(f"layer {la['layer']} {key}: relative differences {np.round(diff, 4).tolist()}")
    print(f"vLLM vs transformers K/V absmax: max relative difference {worst:.4%}")
    assert worst <= TOLERANCE
    status = live.refresh()
    assert [l.k_tokens for l in status.layers] == [48 * len(prompts)] * 2
