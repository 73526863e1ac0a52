"""Capture hooks for a running vllm.LLM (eager mode, in-process engine: set
VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating it so the hooks and the session share the
process). Eager-only by design: they are module forward hooks, which vLLM's default compiled
mode traces once and never runs again. For live capture in the mode engines serve with, use
the `caliper.vllm` plugin (docs/vllm-plugin.md), which samples inside the attention op.

attach(llm, session) streams, with this worker's TP rank and size:
  - the key and value every attention layer hands to the KV cache (after RoPE,
    [num_tokens, kv_heads_local * head_dim], only the step's actual tokens), under the
    checkpoint's layer index; for MLA models (DeepSeek-V3, Kimi K2) what MLAAttention caches
    instead, kv_c_normed [num_tokens, kv_lora_rank] and k_pe [num_tokens, 1, qk_rope_head_dim]
    (the latent is the same on every TP rank), through Session.observe_mla;
  - with recipe attention q, the query every (non-MLA) attention layer is handed, after RoPE
    ([num_tokens, q_heads_local * head_dim], the step's actual tokens), as an engine's FP8
    attention quantizes it (Session.observe_query);
  - with NVFP4 activations, the input of every fused, TP-sharded linear layer under the
    checkpoint's module names: QKVParallelLinear `qkv_proj` and MergedColumnParallelLinear
    `gate_up_proj` are unfused through the model's packed_modules_mapping (their input, the
    same for each part, is observed as q_proj, k_proj, v_proj / gate_proj, up_proj);
    RowParallelLinear (o_proj, down_proj) inputs are this rank's columns;
  - with NVFP4 weights, each target weight once, read from the checkpoint's safetensors
    (vLLM's CPU build drops the weights after packing them for its GEMM, and the fused,
    sharded ones would have to be unfused anyway); only TP rank 0 sends them.
A batch is one model forward (one engine step) after attach: the profiling and warm-up passes
vLLM runs at start-up happen before, so they are never captured; generate with max_tokens=1
makes every step a prefill of the scheduled prompts, as a transformers forward is.
Not captured: FusedMoE experts (attach refuses NVFP4 for MoE models). Under TP > 1 the server
places a row-parallel shard's 16-column groups (minmax observer) at its rank's offset. TP > 1
is untested for these hooks: they attach in-process, and vLLM runs TP > 1 workers in their own
processes (the plugin, caliper.vllm, loads in every worker and is tested at TP 2).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
from typing import TYPE_CHECKING, Dict, List, Optional, Union

import torch

from ._handle import Handle

if TYPE_CHECKING:
    import vllm

    from .client import Session

_FUSED = ("QKVParallelLinear", "MergedColumnParallelLinear", "ColumnParallelLinear",
          "RowParallelLinear", "ReplicatedLinear")


def _model(llm):
    executor = llm.llm_engine.model_executor
    worker = getattr(executor, "driver_worker", None)
    worker = getattr(worker, "worker", worker)
    if worker is None:
        raise RuntimeError("attach: the vllm.LLM has no in-process worker (set "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating it)")
    return worker.model_runner.model


def _actual_tokens(layer_name: Optional[str]):
    """The step's real tokens (rows past them are padding), for one attention layer or any."""
    try:
        from vllm.forward_context import get_forward_context
        meta = get_forward_context().attn_metadata
    except Exception:  # noqa: BLE001 - outside a forward context (tests)
        return None
    if isinstance(meta, list):
        meta = meta[0] if meta else None
    if isinstance(meta, dict):
        meta = meta.get(layer_name) if layer_name is not None else next(iter(meta.values()),
                                                                           None)
    return getattr(meta, "num_actual_tokens", None)


def _checkpoint_modules(module_name: str, module, packed: Dict[str, List[str]]) -> List[str]:
    """The checkpoint modules a vLLM linear stands for, in the order of its output parts."""
    prefix, _, last = module_name.rpartition(".")
    parts = packed.get(last)
    if parts is None:
        return [module_name]
    return [f"{prefix}.{p}" if prefix else p for p in parts]


def _checkpoint_weights(model_dir: pathlib.Path, names: List[str]) -> Dict[str, torch.Tensor]:
    """`<name>.weight` for each name, from the safetensors files of model_dir."""
    from safetensors import safe_open
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        where = json.loads(index.read_text())["weight_map"]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise RuntimeError(f"attach: no safetensors checkpoint in {model_dir} to read the "
                               "NVFP4 weights from (pass weights_from=DIR)")
        where = {}
        for f in files:
            with safe_open(str(f), "pt") as st:
                where.update({k: f.name for k in st.keys()})
    out = {}
    for name in names:
        key = f"{name}.weight"
        if key not in where:
            raise RuntimeError(f"attach: the checkpoint in {model_dir} has no {key} (the vLLM "
                               "linear maps to this checkpoint module)")
        with safe_open(str(model_dir / where[key]), "pt") as st:
            out[name] = st.get_tensor(key)
    return out


def attach(model: vllm.LLM, session: Session, *, kv: bool = True, inputs: bool = True,
           weights: bool = True, first_batch: int = 0,
           weights_from: Optional[Union[str, os.PathLike]] = None) -> Handle:
    """Installs the hooks on the vllm.LLM `model` for `session` (see the module docstring); what
    is streamed follows the session's recipe, and kv / inputs / weights can leave a part out.
    Batches count from first_batch. weights_from: the checkpoint directory (default: the model
    vLLM loaded, when it is a local directory)."""
    llm = model
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    if config is not None and not config.model_config.enforce_eager:
        raise RuntimeError("attach: this vllm.LLM runs compiled (vLLM's default mode), where "
                           "module hooks run once while the model is traced and never again: "
                           "create it with enforce_eager=True, or sample a serving engine with "
                           "the caliper.vllm plugin")
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )
    from vllm.model_executor.layers.attention.attention import Attention
    try:
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    except ImportError:  # a vLLM without MLA
        MLAAttention = ()

    from ._pb import caliper_pb2 as pb
    recipe = session.proto.recipe
    kv = kv and recipe.kv != pb.KV_OFF
    query = kv and recipe.attention == pb.ATTENTION_Q
    inputs = inputs and recipe.nvfp4_activations
    weights = weights and recipe.nvfp4_weights
    net = _model(llm)
    tp_rank = get_tensor_model_parallel_rank()
    tp_size = get_tensor_model_parallel_world_size()
    handle = Handle(first_batch)

    def after(_m, _a, _o):
        if handle.enabled:
            handle.forwards += 1
            handle.batch += 1
    h = net.register_forward_hook(after)
    handle._removers.append(h.remove)
    if inputs or weights:
        try:
            _attach_linears(llm, net, session, handle, inputs, weights, tp_rank, tp_size,
                            weights_from)
        except BaseException:
            handle.detach()  # nothing of a refused attach stays installed
            raise
    for name, module in net.named_modules():
        mla = isinstance(module, MLAAttention)
        if not kv or not (mla or isinstance(module, Attention)):
            continue
        m = re.search(r"layers\.(\d+)\.", name)
        if m is None:
            continue
        layer = int(m.group(1))
        layer_name = getattr(module, "layer_name", name)

        def pre(_mod, args, layer=layer, layer_name=layer_name, mla=mla):
            if not handle.enabled:
                return
            # Attention(q, key, value) / MLAAttention(q, kv_c_normed, k_pe).
            q, key, value = args[0], args[1], args[2]
            n = _actual_tokens(layer_name)
            if n is not None:
                q, key, value = q[:n], key[:n], value[:n]
            observe = session.observe_mla if mla else session.observe_kv
            observe(layer, key, value, tp_rank=tp_rank, tp_size=tp_size, batch=handle.batch)
            if query and not mla:
                session.observe_query(layer, q, tp_rank=tp_rank, tp_size=tp_size,
                                      batch=handle.batch)
        hook = module.register_forward_pre_hook(pre)
        handle._removers.append(hook.remove)
        handle.kv_layers.append(layer)
    if kv and not handle.kv_layers:
        handle.detach()
        raise RuntimeError("attach: no vLLM Attention layer found in the model")
    return handle


def _attach_linears(llm, model, session, handle: Handle, inputs: bool, weights: bool,
                    tp_rank: int, tp_size: int, weights_from) -> None:
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    targets = []  # (vLLM name, module, checkpoint names)
    for name, module in model.named_modules():
        kind = type(module).__name__
        if "FusedMoE" in kind:
            raise RuntimeError(f"attach: {name} is a vLLM FusedMoE layer; its experts' NVFP4 "
                               "inputs are not captured from vLLM (use the transformers hooks, "
                               "caliper.hooks.attach, for MoE models)")
        if kind not in _FUSED:
            continue
        last = name.rsplit(".", 1)[-1]
        if last in ("lm_head", "gate", "router", "shared_expert_gate") or "embed" in last:
            continue
        targets.append((name, module, _checkpoint_modules(name, module, packed)))
    if not targets:
        raise RuntimeError("attach: no vLLM linear layer found in the model")
    if weights and tp_rank == 0:
        source = pathlib.Path(weights_from or llm.llm_engine.model_config.model)
        if not source.is_dir():
            raise RuntimeError(f"attach: {source} is not a local checkpoint directory; pass "
                               "weights_from=DIR to read the NVFP4 weights from")
        names = [c for _, _, ckpt in targets for c in ckpt]
        for name, w in _checkpoint_weights(source, names).items():
            session.observe_weight(name, w)
            handle.weight_modules.append(name)
    if not inputs:
        return
    for _name, module, ckpt in targets:
        def pre(_m, args, ckpt=ckpt):
            if not handle.enabled:
                return
            x = args[0]
            n = _actual_tokens(None)
            if n is not None and x.dim() >= 2:
                x = x[:n]
            for c in ckpt:
                # Column-parallel inputs are whole on every rank; row-parallel ones are this
                # rank's columns: the server merges the ranks' min/max of one batch.
                session.observe_input(c, x, batch=handle.batch, tp_rank=tp_rank,
                                      tp_size=tp_size)
        hook = module.register_forward_pre_hook(pre)
        handle._removers.append(hook.remove)
        handle.input_modules += ckpt
