"""Capture hooks for a running vllm.LLM (eager mode, in-process engine: set
VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating it so the hooks and the session share the
process).

attach(llm, session) streams the key and value every attention layer hands to the KV cache
(after RoPE, [num_tokens, kv_heads_local * head_dim], only the step's actual tokens) with this
worker's TP rank and size, under the checkpoint's layer index. A batch is one model forward
(one engine step) after attach: the profiling and warm-up passes vLLM runs at start-up happen
before, so they are never captured; generate with max_tokens=1 makes every step a prefill of the
scheduled prompts, as a transformers forward is. NVFP4 inputs/weights of vLLM's fused,
TP-sharded linear layers are not captured here (use the transformers hooks for them).
"""
from __future__ import annotations

import re
from typing import List

import torch


class Handle:
    def __init__(self):
        self._removers = []
        self.batch = 0
        self.forwards = 0
        self.enabled = True
        self.kv_layers: List[int] = []

    def detach(self) -> None:
        while self._removers:
            self._removers.pop()()


def _model(llm):
    executor = llm.llm_engine.model_executor
    worker = getattr(executor, "driver_worker", None)
    worker = getattr(worker, "worker", worker)
    return worker.model_runner.model


def _actual_tokens(layer_name: str):
    try:
        from vllm.forward_context import get_forward_context
        meta = get_forward_context().attn_metadata
    except Exception:  # noqa: BLE001 - outside a forward context (tests)
        return None
    if isinstance(meta, dict):
        meta = meta.get(layer_name)
    return getattr(meta, "num_actual_tokens", None)


def attach(llm, session, *, first_batch: int = 0) -> Handle:
    from vllm.distributed import (get_tensor_model_parallel_rank,
                                  get_tensor_model_parallel_world_size)
    from vllm.model_executor.layers.attention.attention import Attention

    model = _model(llm)
    tp_rank = get_tensor_model_parallel_rank()
    tp_size = get_tensor_model_parallel_world_size()
    handle = Handle()
    handle.batch = first_batch

    def after(_m, _a, _o):
        if handle.enabled:
            handle.forwards += 1
            handle.batch += 1
    h = model.register_forward_hook(after)
    handle._removers.append(h.remove)
    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        m = re.search(r"layers\.(\d+)\.", name)
        if m is None:
            continue
        layer = int(m.group(1))
        layer_name = getattr(module, "layer_name", name)

        def pre(_mod, args, layer=layer, layer_name=layer_name):
            if not handle.enabled:
                return
            key, value = args[1], args[2]
            n = _actual_tokens(layer_name)
            if n is not None:
                key, value = key[:n], value[:n]
            session.observe_kv(layer, key, value, tp_rank=tp_rank, tp_size=tp_size,
                               batch=handle.batch)
        hook = module.register_forward_pre_hook(pre)
        handle._removers.append(hook.remove)
        handle.kv_layers.append(layer)
    if not handle.kv_layers:
        raise RuntimeError("attach: no vLLM Attention layer found in the model")
    return handle
