"""Tiny random models and llm-compressor runs shared by the peer suites (dense Llama, MoE Mixtral).

Everything is built here from a seed: no download. llm-compressor runs its real `oneshot` with the
basic pipeline (the traced pipeline ran Mixtral attention without its causal mask)."""
import json
import os
import subprocess

import torch


def save_tokenizer(path, vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0", pad_token="t0").save_pretrained(path)


def build_model(path, kind="llama", dtype=torch.bfloat16, seed=0):
    """Saves a tiny random model: llama (2 layers, 4 heads / 2 KV heads), mixtral or qwen3_moe
    (4 experts, every layer sparse)."""
    from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM)
    torch.manual_seed(seed)
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**common, num_local_experts=4,
                                                 num_experts_per_tok=2))
    elif kind == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
            **common, head_dim=16, moe_intermediate_size=64, num_experts=4,
            num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[]))
    else:
        raise ValueError(f"kind: {kind!r}")
    with torch.no_grad():  # heavier tails than the init: outlier channels like real models
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(1 + 3 * (torch.rand(p.shape[1]) < 0.05).float())
    model = model.to(dtype)
    model.save_pretrained(path)
    save_tokenizer(path, 256)
    return path


def calibration_ids(samples=4, seq=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (seq,), generator=g).tolist() for _ in range(samples)]


def run_oneshot(model_dir, out_dir, scheme="NVFP4", kv_strategy="tensor", kv_observer=None,
                samples=4, seq=16, hook=None):
    """llm-compressor's own checkpoint of `model_dir`. `hook(model)` runs before calibration
    (e.g. to register observers-of-what-it-sees)."""
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    ids = calibration_ids(samples, seq)
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * seq] * samples})
    kv = None
    if kv_strategy is not None:
        kv = {"num_bits": 8, "type": "float", "strategy": kv_strategy, "dynamic": False,
              "symmetric": True}
        if kv_observer is not None:
            kv["observer"] = kv_observer
    ignore = ["lm_head", "re:.*block_sparse_moe.gate$", "re:.*mlp.gate$"]
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore,
                                  kv_cache_scheme=kv)
    oneshot(model=model_dir, dataset=ds, recipe=recipe, num_calibration_samples=samples,
            max_seq_length=seq, pipeline="basic", output_dir=out_dir)
    return out_dir


def scale_file_from(ckpt_dir, out_path):
    """The global and K/V scales of a compressed-tensors checkpoint as a Caliper scale file."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    tensors = {}
    for name in sorted(os.listdir(ckpt_dir)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(ckpt_dir, name), "pt") as f:
            for k in f.keys():
                if k.endswith(("_global_scale", ".k_scale", ".v_scale")):
                    t = f.get_tensor(k).float()
                    if k.endswith(("k_scale", "v_scale")):
                        t = t.reshape(-1) if t.numel() > 1 else t.reshape([])
                    tensors[k] = t.contiguous()
    save_file(tensors, out_path, metadata={"format": "pt", "caliper.format": "compressed-tensors"})
    return out_path


def load_all(ckpt_dir):
    from safetensors import safe_open
    out = {}
    for name in sorted(os.listdir(ckpt_dir)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(ckpt_dir, name), "pt") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
    return out


def raw(t):
    """Bytes-level view for exact comparison of any dtype."""
    if t.dtype in (torch.uint8, torch.float8_e4m3fn):
        return t.contiguous().view(torch.uint8).reshape(-1)
    return t.float().reshape(-1)


def caliper(binary, *args):
    res = subprocess.run([binary, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"caliper {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
    return res
