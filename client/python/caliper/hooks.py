"""Capture hooks for Hugging Face transformers models.

attach(model, session) streams, for every forward pass of `model` (one forward = one batch):
  - K and V of every attention layer after RoPE, exactly as the KV cache receives them
    ([batch, kv_heads, seq, head_dim], before GQA repetition): an attention function registered
    with transformers wraps the model's own one and sees the key/value states it is handed
    (run the model with use_cache=False: with a cache, attention sees past tokens again);
    with recipe attention q, the query it is handed too (after RoPE, [batch, q_heads, seq,
    head_dim]), as an engine's FP8 attention quantizes it;
  - the input of every NVFP4 target Linear, named as in the checkpoint (forward pre-hooks);
    MoE experts stored as fused 3-D parameters (transformers 5) are observed per expert as
    expert E's gate/up (w1/w3) and down (w2) projections: with moe_experts="routed" (default)
    on the tokens the router sent to it, as it runs in deployment; with "all" on every token
    of the batch, as llm-compressor calibrates (every expert runs on every token for
    observation only; the model's output is still the routed one);
  - each target weight once, at attach time.
MLA attention (DeepSeek-V2/V3, Kimi K2: modules with kv_a_proj_with_mqa, kv_a_layernorm and
kv_b_proj) streams what the engine caches instead of per-head K/V: kv_c_normed (kv_a_layernorm's
output) and k_pe after RoPE (the rotary tail of the key the attention function is handed, the same
for every head), through Session.observe_mla; the decompressed K/V of kv_b_proj are not cached.
Routers (`mlp.gate`, `block_sparse_moe.gate`, `shared_expert_gate`) and lm_head are never targets.
What is streamed follows the session's recipe (K/V when kv is on, inputs and weights with NVFP4).
"""
from __future__ import annotations

import re
import sys
import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Tuple

import torch
from torch import nn

from ._handle import Handle

if TYPE_CHECKING:
    from .client import Session

ROUTER_NAME = re.compile(r"(^|\.)(gate|router|shared_expert_gate)$")

# Checkpoint names of fused experts' projections: (gate, up, down), and a rename of the block.
_EXPERT_NAMES = {
    "mixtral": (("w1", "w3", "w2"), (".mlp.experts", ".block_sparse_moe.experts")),
}
_DEFAULT_EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), None)


def is_target_linear(name: str, module: nn.Module) -> bool:
    if not isinstance(module, nn.Linear):
        return False
    last = name.rsplit(".", 1)[-1]
    return last != "lm_head" and not ROUTER_NAME.search(name) and "embed" not in last


def _is_fused_experts(module: nn.Module) -> bool:
    return (isinstance(getattr(module, "gate_up_proj", None), torch.Tensor)
            and isinstance(getattr(module, "down_proj", None), torch.Tensor)
            and module.gate_up_proj.dim() == 3)


def expert_names(model_type: str, experts_path: str) -> Callable[[int], Tuple[str, str, str]]:
    (gate, up, down), rename = _EXPERT_NAMES.get(model_type, _DEFAULT_EXPERT_NAMES)
    base = experts_path
    if rename is not None and base.endswith(rename[0]):
        base = base[: -len(rename[0])] + rename[1]
    return lambda e: (f"{base}.{e}.{gate}", f"{base}.{e}.{up}", f"{base}.{e}.{down}")


def _expert_weights(module: nn.Module, e: int):
    gate_up = module.gate_up_proj[e]
    down = module.down_proj[e]
    if getattr(module, "is_transposed", False):
        gate_up, down = gate_up.t(), down.t()
    half = gate_up.shape[0] // 2
    return gate_up[:half], gate_up[half:], down


_REGISTRY_LOCK = threading.Lock()


def _forget_capture(module_id: int) -> None:
    _CAPTURES.pop(module_id, None)

_CAPTURES: Dict[int, Tuple[Any, Handle]] = {}  # id(attention module) -> (session, handle)


def _original_attention(name: str, module: nn.Module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    if name == "eager" or name is None:
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def is_mla_attention(module: nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("layer_idx", "config", "kv_a_proj_with_mqa",
                                            "kv_a_layernorm", "kv_b_proj", "qk_nope_head_dim"))


# id(MLA attention module) -> this forward's kv_c_normed, set by kv_a_layernorm's forward hook
# and taken by the attention function of the same module.
_MLA_LATENTS: Dict[int, Any] = {}


def _make_attention(original: str):
    def caliper_attention(module, query, key, value, attention_mask, **kwargs):
        entry = _CAPTURES.get(id(module))
        if entry is not None:
            session, handle = entry
            latent = _MLA_LATENTS.pop(id(module), None)
            if handle.enabled and is_mla_attention(module):
                if latent is None:
                    raise RuntimeError(f"caliper: layer {module.layer_idx}: MLA attention ran "
                                       "without kv_a_layernorm's output (kv_c_normed)")
                # key: [batch, heads, seq, qk_nope + qk_rope]; the rope tail is k_pe, expanded
                # over heads from one tensor.
                k_pe = key[:, 0, :, module.qk_nope_head_dim:]
                session.observe_mla(module.layer_idx, latent, k_pe, batch=handle.batch)
            elif handle.enabled:
                session.observe_kv(module.layer_idx, key, value, batch=handle.batch)
                if handle.query:
                    session.observe_query(module.layer_idx, query, batch=handle.batch)
        return _original_attention(original, module)(module, query, key, value, attention_mask,
                                                     **kwargs)
    return caliper_attention


MOE_EXPERTS = ("routed", "all")


def attach(model: nn.Module, session: Session, *, kv: bool = True, inputs: bool = True,
           weights: bool = True, first_batch: int = 0, moe_experts: str = "routed") -> Handle:
    """Installs the capture hooks on `model` for `session` (see the module docstring); what is
    streamed follows the session's recipe, and kv / inputs / weights can leave a part out.
    Batches count from first_batch. If it raises (e.g. a bad weight), nothing of it stays
    installed. moe_experts: "routed" or "all" (see the module docstring)."""
    installed: List[Handle] = []
    try:
        return _attach(model, session, kv, inputs, weights, first_batch, moe_experts, installed)
    except BaseException:
        for handle in installed:
            handle.detach()
        raise


def _attach(model, session, kv, inputs, weights, first_batch, moe_experts, installed):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    if moe_experts not in MOE_EXPERTS:
        raise ValueError(f"moe_experts: expected routed or all, got {moe_experts!r}")

    recipe = session.proto.recipe
    from ._pb import caliper_pb2 as pb
    kv = kv and recipe.kv != pb.KV_OFF
    inputs = inputs and recipe.nvfp4_activations
    weights = weights and recipe.nvfp4_weights
    handle = Handle(first_batch)
    handle.query = kv and recipe.attention == pb.ATTENTION_Q
    installed.append(handle)
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""

    # One forward of the whole model = one batch.

    def after(_module, _args, _output):
        if handle.enabled:
            handle.forwards += 1
            handle.batch += 1

    h = model.register_forward_hook(after)
    handle._removers.append(h.remove)

    if kv:
        configs = {}
        for _, module in model.named_modules():
            mla = is_mla_attention(module)
            if mla or (hasattr(module, "layer_idx") and hasattr(module, "k_proj") and hasattr(
                    module, "config")):
                if mla:
                    mla_id = id(module)

                    def keep_latent(_m, _args, output, module_id=mla_id):
                        _MLA_LATENTS[module_id] = output
                    hook = module.kv_a_layernorm.register_forward_hook(keep_latent)
                    handle._removers.append(hook.remove)
                    handle._removers.append(partial(_MLA_LATENTS.pop, id(module), None))
                configs[id(module.config)] = module.config
                with _REGISTRY_LOCK:
                    _CAPTURES[id(module)] = (session, handle)
                handle.kv_layers.append(module.layer_idx)
                module_id = id(module)
                handle._removers.append(partial(_forget_capture, module_id))
        for config in configs.values():
            original = config._attn_implementation or "eager"
            if original.startswith("caliper_"):
                raise RuntimeError("attach: the model already has caliper hooks; detach them")
            name = f"caliper_{original}"
            AttentionInterface.register(name, _make_attention(original))
            # transformers builds the attention mask by implementation name and builds none
            # for a name it does not know: register the original's mask function too, or
            # eager attention would run without its causal mask.
            if original in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
                AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
            config._attn_implementation_internal = name

            def restore(config=config, original=original):
                config._attn_implementation_internal = original
            handle._removers.append(restore)
        if not handle.kv_layers:
            raise RuntimeError("attach: no attention layer with layer_idx and k_proj (or MLA's "
                               "kv_a_proj_with_mqa / kv_b_proj) found")

    for name, module in model.named_modules():
        if is_target_linear(name, module):
            if weights:
                session.observe_weight(name, module.weight.detach())
                handle.weight_modules.append(name)
            if inputs:
                def pre(_m, args, name=name):
                    if handle.enabled:
                        session.observe_input(name, args[0], batch=handle.batch)
                hook = module.register_forward_pre_hook(pre)
                handle._removers.append(hook.remove)
                handle.input_modules.append(name)
        elif _is_fused_experts(module) and (inputs or weights):
            names = expert_names(model_type, name)
            if weights:
                for e in range(module.gate_up_proj.shape[0]):
                    gate_w, up_w, down_w = _expert_weights(module, e)
                    for n, w in zip(names(e), (gate_w, up_w, down_w)):
                        session.observe_weight(n, w.detach())
                        handle.weight_modules.append(n)
            if inputs:
                hook = module.register_forward_pre_hook(
                    _expert_inputs_hook(session, handle, module, names, moe_experts == "all"))
                handle._removers.append(hook.remove)
                for e in range(module.gate_up_proj.shape[0]):
                    handle.input_modules += list(names(e))
    return handle


def _expert_inputs_hook(session, handle: Handle, module: nn.Module, names, all_experts: bool):
    """Inputs of each expert: its tokens (gate/up) and act(gate) * up (down), computed as the
    experts' eager forward computes them; the routed tokens, or every token (all_experts)."""
    def pre(_m, args, kwargs=None):
        if not handle.enabled:
            return
        hidden, top_k_index = args[0], args[1]
        with torch.no_grad():
            num_experts = module.gate_up_proj.shape[0]
            if all_experts:
                routed = ((e, hidden) for e in range(num_experts))
            else:
                mask = torch.nn.functional.one_hot(top_k_index, num_classes=num_experts)
                mask = mask.permute(2, 1, 0)
                hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
                routed = ((e, hidden[torch.where(mask[e])[1]]) for (e,) in hit.tolist())
            for e, current in routed:
                gate_name, up_name, down_name = names(e)
                session.observe_input(gate_name, current, batch=handle.batch)
                session.observe_input(up_name, current, batch=handle.batch)
                gate_up = module.gate_up_proj[e]
                if getattr(module, "is_transposed", False):
                    gate_up = gate_up.t()
                gate, up = nn.functional.linear(current, gate_up).chunk(2, dim=-1)
                session.observe_input(down_name, module.act_fn(gate) * up, batch=handle.batch)
    return pre
