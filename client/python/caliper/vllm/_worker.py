"""The worker's side: attaching to the model's attention layers, deciding which steps are
sampled, keeping the saturation counts, applying versions and surviving weight reloads."""
from __future__ import annotations

import os
import queue
import re
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._histogram import recipe_needs_histograms
from ._sampling import (
    LayerShape,
    LayerStatistics,
    Readout,
    StepStatistics,
    wrap_attention,
    wrap_mla,
)
from ._sender import Sender
from ._settings import Every, Settings, logger
from ._switch import (
    SCALE_ATTRS,
    Applied,
    VersionScales,
    differs,
    kv_qmax,
    plain,
    rank_scales,
    unsupported_cache,
)
from ._switch import set_scales as _set_scales

METHODS = ("caliper_refit", "caliper_apply_scales", "caliper_state")


def layer_index(name: str) -> Optional[int]:
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


class CaliperWorkerExtension:
    """The worker methods of the plugin, for `--worker-extension-cls` (combine it with your
    own class: `class Mine(MyExtension, CaliperWorkerExtension)`); without an extension class
    the plugin installs them itself."""

    def caliper_refit(self, weight_version: str, wait: bool = True) -> Dict[str, Any]:
        """After new weights: samples into the window of weight_version (opened now when
        `wait`, else by the sender thread); the scales in use stay (re-applied if the update
        reset them) until the fleet publishes."""
        return worker_state(self).refit(str(weight_version), wait)

    def caliper_apply_scales(self, version: int, weight_version: str,
                             scales: VersionScales) -> str:
        """Sets this rank's K/V scales, and the query's where given ((k, v) or (k, v, q) per
        layer; every copy vLLM keeps); '' or why it was refused."""
        return worker_state(self).apply(version, weight_version, scales)

    def caliper_state(self) -> Dict[str, Any]:
        return worker_state(self).snapshot()


def worker_state(worker: Any) -> WorkerState:
    state = getattr(worker, "_caliper", None)
    if state is None:
        raise RuntimeError("caliper: the plugin is not active in this worker (set "
                           "CALIPER_FLEET and CALIPER_SERVER)")
    assert isinstance(state, WorkerState)
    return state


def attach_worker(worker: Any, settings: Settings) -> None:
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.platforms import current_platform
    cls = type(worker)
    for name in METHODS:
        if not hasattr(cls, name):
            setattr(cls, name, getattr(CaliperWorkerExtension, name))
    model = worker.model_runner.get_model()
    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, (Attention, MLAAttention)):  # MLA is no subclass of Attention
            index = layer_index(name)
            if index is not None:
                layers[index] = module
    if not layers:
        raise RuntimeError("no vLLM Attention layer in the model")
    if not current_platform.opaque_attention_op():
        # Attention would be traced into the compiled graph with the plugin's wrapper in it.
        compiled = worker.vllm_config.compilation_config.mode
        logger().warning("caliper: on this platform attention is no opaque op; compiled mode "
                         "(%s) cannot be sampled, only --enforce-eager", compiled)
    worker._caliper = WorkerState(settings, layers, get_tensor_model_parallel_rank(),
                                  get_tensor_model_parallel_world_size())


def _fleet_recipe(settings: Settings) -> Any:
    """The fleet's recipe (pb.Recipe), asked once at start; None when Caliper does not answer
    (the statistics buffers then hold everything any recipe needs)."""
    from .._pb import caliper_pb2 as pb
    try:
        return settings.client(attempts=1)._call(
            "GetFleet", pb.GetFleetRequest(fleet=settings.fleet)).recipe
    except Exception as e:  # noqa: BLE001 - never stop the engine from starting
        logger().warning("caliper: fleet %s: recipe unknown at start (%s); the plugin keeps "
                         "every statistic a recipe may need", settings.fleet, e)
        return None


def _step_kind(scheduler_output: Any) -> str:
    """prefill (no request decodes one token), decode (every request does) or mixed."""
    counts = list(getattr(scheduler_output, "num_scheduled_tokens", {}).values())
    ones = sum(1 for n in counts if n == 1)
    if not counts or ones == 0:
        return "prefill"
    return "decode" if ones == len(counts) else "mixed"


class _Layer:
    def __init__(self, module: Any, heads: int, k_width: int, v_width: int):
        self.module = module
        self.heads = heads
        # elements per head and token of K and V (MLA: of kv_c_normed and of k_pe)
        self.k_width, self.v_width = k_width, v_width
        # saturation since the version in use: per local head, elements beyond the cache's range
        self.k_over = [0] * heads
        self.v_over = [0] * heads
        self.tokens = 0

    @property
    def elements(self) -> int:
        return self.tokens  # 0: nothing sampled since the version in use

    def fractions(self) -> Tuple[List[float], List[float]]:
        """Per head, the fraction of K's and of V's elements beyond the cache's range."""
        return ([c / (self.tokens * self.k_width) for c in self.k_over],
                [c / (self.tokens * self.v_width) for c in self.v_over])

    def saturation(self) -> float:
        """The larger of K's and V's fraction over the heads (MLA: of the two parts of the
        entry, each against the entry's one scale)."""
        return max(sum(self.k_over) / (self.tokens * self.heads * self.k_width),
                   sum(self.v_over) / (self.tokens * self.heads * self.v_width))


class WorkerState:
    def __init__(self, settings: Settings, layers: Dict[int, Any], tp_rank: int, tp_size: int):
        from .._pb import caliper_pb2 as pb
        self.settings = settings
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.enabled = True
        self.layers: Dict[int, _Layer] = {
            index: _Layer(module, int(module.num_kv_heads),
                          int(getattr(module, "kv_lora_rank", 0) or module.head_size),
                          int(getattr(module, "qk_rope_head_dim", 0) or module.head_size))
            for index, module in sorted(layers.items())}
        first = next(iter(layers.values()))
        self.kv_cache_dtype = str(first.kv_cache_dtype)
        refusal = unsupported_cache(self.kv_cache_dtype)
        if refusal:
            raise RuntimeError(refusal)
        self.kv_qmax = kv_qmax(self.kv_cache_dtype)
        recipe = _fleet_recipe(settings)
        self.mla = hasattr(first, "kv_lora_rank")  # MLAAttention: the latent is the cache
        self.query = not self.mla and (recipe is None or recipe.attention == pb.ATTENTION_Q)
        if self.mla:  # kv_c_normed (K slot) and k_pe (V slot), one "head", one entry scale
            shapes = [LayerShape(index, 1, int(layer.module.kv_lora_rank), 0, 2,
                                 v_dim=int(layer.module.qk_rope_head_dim), mla=True)
                      for index, layer in self.layers.items()]
        else:
            shapes = [LayerShape(index, layer.heads, int(layer.module.head_size),
                                 int(layer.module.num_heads), 3 if self.query else 2)
                      for index, layer in self.layers.items()]
        device = first._k_scale.device
        self.statistics = StepStatistics(
            shapes, device,
            minmax=recipe is None or recipe.kv_observer == pb.KV_OBSERVER_MINMAX,
            histograms=recipe is None or recipe_needs_histograms(recipe),
            kv_qmax=self.kv_qmax)
        self.steps = 0
        self.sampled_steps = 0
        self.sampled_tokens = 0         # of the window in use
        self.total_sampled_tokens = 0
        self.unreported_tokens = 0      # sampled since the last ReportInUse
        self.empty_steps = 0            # sampled steps in a row in which no layer saw a token
        self.sampling = False
        self.step_tokens = 0
        self.step_kind = ""
        # K/V tokens that reached the statistics, by step kind: a kind at 0 while the others
        # grow is a kind of step the plugin does not reach (e.g. decode in full CUDA graphs).
        self.tokens_by_kind: Dict[str, int] = {"prefill": 0, "decode": 0, "mixed": 0}
        self.batch = 0
        self.dropped = 0                # statistics (one layer's step) not sent
        self.errors = 0
        self.version = 0                # the fleet version in use (0: the checkpoint's scales)
        self.weight_version = settings.weight_version
        self.applied: Applied = {}
        self.resets_repaired = 0
        self.recipe: Any = None         # the fleet's recipe, once a window is open
        self.generation = 0             # bumped by each refit: statistics of older weights
        self._lock = threading.Lock()
        self._drop_log = Every(30.0)
        self._silent_log = Every(60.0)
        self.queue: queue.Queue[Readout] = queue.Queue(settings.queue_items)
        base = settings.producer or (f"{socket.gethostname() or 'localhost'}/"
                                     f"vllm-{os.getpid()}")
        self.sender = Sender(self, base)
        wrap = wrap_mla if self.mla else wrap_attention
        self._undo: List[Callable[[], None]] = [
            wrap(layer.module, index, self.statistics, self._sampling_now,
                 self._statistic_failed)
            for index, layer in self.layers.items()]

    # engine thread --------------------------------------------------------------------------
    def _sampling_now(self) -> bool:
        return self.sampling and self.enabled

    def before_step(self, scheduler_output: Any) -> None:
        self._repair_reset()
        tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        sampling = False
        if tokens > 0 and self.recipe is not None:
            self.steps += 1
            if (self.sampled_tokens < self.settings.sample_tokens
                    and self.sampled_steps < self.settings.sample_fraction * self.steps):
                sampling = True
                self.sampled_steps += 1
                self.batch += 1
                self.step_tokens = tokens
                self.step_kind = _step_kind(scheduler_output)
        self.statistics.begin_step(sampling)
        self.sampling = sampling

    def after_step(self) -> None:
        if not self.sampling:
            return
        self.sampling = False
        self.sampled_tokens += self.step_tokens
        self.total_sampled_tokens += self.step_tokens
        readout = self.statistics.readout(self.batch, self.generation, self.version,
                                          self.step_kind)
        if readout is None:
            self.drop(1)
            return
        try:
            self.queue.put_nowait(readout)
        except queue.Full:
            if readout.release is not None:
                readout.release()
            self.drop(1)

    def _statistic_failed(self, index: int, e: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            logger().warning("caliper: layer %d statistics skipped: %s", index, e)

    def drop(self, count: int) -> None:
        self.dropped += count
        if self._drop_log():
            logger().warning("caliper: %d statistics dropped so far (queue full or Caliper "
                             "unreachable); serving goes on", self.dropped)

    # sender thread ----------------------------------------------------------------------------
    def statistics_of(self, readout: Readout) -> List[LayerStatistics]:
        return self.statistics.layers_of(readout, self.recipe)

    def note_sampled(self, readout: Readout, layers: List[LayerStatistics]) -> None:
        """Counts a sampled step's tokens and saturation (the latter only while the version it
        was sampled under is still in use); a step in which no layer saw a token is the mark of
        a mode the plugin does not reach: said once a minute after silent_steps of them."""
        if not layers:
            self.empty_steps += 1
            if self.empty_steps >= self.settings.silent_steps and self._silent_log():
                logger().warning(
                    "caliper: %d sampled steps in a row reached no attention layer: this "
                    "engine serves in a mode the plugin does not sample (fleet %s gets nothing "
                    "from it)", self.empty_steps, self.settings.fleet)
            return
        self.empty_steps = 0
        with self._lock:
            tokens = max(layer.rows for layer in layers)
            self.unreported_tokens += tokens
            if readout.kind in self.tokens_by_kind:
                self.tokens_by_kind[readout.kind] += tokens
            if readout.version != self.version:
                return
            for stats in layers:
                layer = self.layers[stats.index]
                for h in range(layer.heads):
                    layer.k_over[h] += stats.k_over[h]
                    layer.v_over[h] += stats.v_over[h]
                layer.tokens += stats.rows

    def take_unreported_tokens(self) -> int:
        with self._lock:
            tokens, self.unreported_tokens = self.unreported_tokens, 0
        return tokens

    # scales ---------------------------------------------------------------------------------
    def apply(self, version: int, weight_version: str, scales: VersionScales) -> str:
        """Sets every copy of the K/V scales of each layer, and the query's when the version
        has them; refuses (changing nothing) when the version does not cover exactly this
        model's layers or its heads cannot be mapped."""
        scales = {int(k): v for k, v in scales.items()}
        effective, refusal = rank_scales(version, scales, list(self.layers), self.tp_rank,
                                         self.tp_size)
        if refusal:
            return refusal
        for index, (k, v, q) in effective.items():
            _set_scales(self.layers[index].module, k, v, q)
        with self._lock:
            self.applied = effective
            self.version = version
            for layer in self.layers.values():
                layer.k_over = [0] * layer.heads
                layer.v_over = [0] * layer.heads
                layer.tokens = 0
        self.sender.report_soon()
        return ""

    def _repair_reset(self) -> None:
        """A weight reload (or anything else) that reset the scales gets the version back."""
        if not self.applied:
            return
        for index, (k, v, q) in self.applied.items():
            if differs(self.layers[index].module, k, v, q):
                for i, (kk, vv, qq) in self.applied.items():
                    _set_scales(self.layers[i].module, kk, vv, qq)
                self.resets_repaired += 1
                logger().warning("caliper: the K/V scales were reset (a weight reload?); "
                                 "version %d re-applied", self.version)
                return

    def saturation(self) -> Tuple[float, Dict[int, Dict[str, List[float]]]]:
        """The most saturation of a layer (K or V, over its heads) and the per-head fractions."""
        worst, per_layer = 0.0, {}
        with self._lock:
            for index, layer in self.layers.items():
                if not layer.elements:
                    continue
                k, v = layer.fractions()
                per_layer[index] = {"k": k, "v": v}
                worst = max(worst, layer.saturation())
        return worst, per_layer

    def layer_saturation(self) -> List[float]:
        """Per layer (index = layer): the larger of K's and V's fraction over its heads, what
        ReportInUse carries; 0 for a layer not sampled since the version in use."""
        with self._lock:
            if not self.layers:
                return []
            out = [0.0] * (max(self.layers) + 1)
            for index, layer in self.layers.items():
                if layer.elements:
                    out[index] = min(1.0, layer.saturation())
        return out

    def refit(self, weight_version: str, wait: bool = True) -> Dict[str, Any]:
        self._repair_reset()
        window = self.sender.switch(weight_version, wait)
        self.generation += 1
        self.sampled_tokens = 0
        self.weight_version = weight_version
        return {"window": window, "version": self.version, "weight_version": weight_version}

    def snapshot(self) -> Dict[str, Any]:
        worst, per_layer = self.saturation()
        scales = {index: {name: plain(getattr(layer.module, name, None)) for name in SCALE_ATTRS}
                  for index, layer in self.layers.items()}
        return {"tp_rank": self.tp_rank, "tp_size": self.tp_size, "version": self.version,
                "weight_version": self.weight_version, "steps": self.steps,
                "sampled_steps": self.sampled_steps, "sampled_tokens": self.sampled_tokens,
                "total_sampled_tokens": self.total_sampled_tokens, "dropped": self.dropped,
                "errors": self.errors, "sent": self.sender.sent,
                "wire_bytes": self.sender.wire_bytes(),
                "unacknowledged": self.queue.qsize() + self.sender.unacknowledged(),
                "window": self.sender.window_id, "producer": self.sender.producer_id,
                "resets_repaired": self.resets_repaired, "saturation": worst,
                "saturation_per_layer": per_layer, "scales": scales,
                "empty_steps": self.empty_steps, "query_skipped": self.statistics.query_skipped,
                "tokens_by_kind": dict(self.tokens_by_kind),
                "kv_cache_dtype": self.kv_cache_dtype, "enabled": self.enabled}
