"""The vLLM general plugin: calibrate from live traffic (docs/vllm-plugin.md).

Registered in vLLM's `vllm.general_plugins` entry-point group, so vLLM loads it in every
process it starts. Inert unless CALIPER_FLEET and CALIPER_SERVER are set. Active, it
  - samples the K/V every attention layer hands to the cache (the step's real tokens only, a
    budget of CALIPER_SAMPLE_TOKENS per window and at most CALIPER_SAMPLE_FRACTION of the
    steps), reduces them to the statistics the fleet's recipe needs on the tensor's device, and
    counts per layer and head the elements beyond the FP8 range under the scale the kernel
    applies; a background thread streams them into the fleet's window for the weight version;
  - watches the fleet's versions (WatchScales) in the engine core and switches every worker to
    a new one between two steps (running requests are preempted so nothing in the cache was
    written under other scales; the prefix cache is reset), then reports it (ReportInUse);
  - gives workers `caliper_refit(weight_version)` (collective_rpc) and keeps the scales in use
    across weight reloads.
Nothing it does can fail or block a request: a full queue or an unreachable server drops
statistics and counts them; any error of the plugin disables it with one log line.
"""
from __future__ import annotations

import dataclasses
import math
import os
import queue
import re
import socket
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

ENV_FLEET = "CALIPER_FLEET"
ENV_SERVER = "CALIPER_SERVER"
DEFAULT_SAMPLE_TOKENS = 65536
DEFAULT_SAMPLE_FRACTION = 0.1

_METHODS = ("caliper_refit", "caliper_apply_scales", "caliper_state")

# What this process did with the plugin (tests and `caliper_state` read it).
status: Dict[str, Any] = {"loaded": False, "active": False, "error": ""}
# The engine core's versions, when it runs in this process (vllm.LLM without multiprocessing).
engine_versions: Dict[str, int] = {"pending": 0, "in_use": 0}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The plugin's configuration, from CALIPER_* environment variables."""

    fleet: str
    server: str
    weight_version: str = "initial"
    sample_tokens: int = DEFAULT_SAMPLE_TOKENS
    sample_fraction: float = DEFAULT_SAMPLE_FRACTION
    queue_items: int = 1024
    queue_bytes: int = 4 << 20
    producer: str = ""
    switch_grace_s: float = 2.0
    report_s: float = 10.0
    token: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Optional[Settings]:
        """None when the plugin stays inert; ValueError naming the variable when one is bad."""
        fleet, server = env.get(ENV_FLEET, "").strip(), env.get(ENV_SERVER, "").strip()
        if not fleet or not server:
            return None

        def number(name: str, kind, default, low, high=None):
            text = env.get(name, "").strip()
            if not text:
                return default
            try:
                value = kind(text)
            except ValueError:
                raise ValueError(f"{name}: expected a number, got {text!r}") from None
            if value < low or (high is not None and value > high):
                raise ValueError(f"{name}: expected {low}..{high if high is not None else ''}, "
                                 f"got {text}")
            return value
        return cls(
            fleet=fleet, server=server,
            weight_version=env.get("CALIPER_WEIGHT_VERSION", "").strip() or "initial",
            sample_tokens=number("CALIPER_SAMPLE_TOKENS", int, DEFAULT_SAMPLE_TOKENS, 0),
            sample_fraction=number("CALIPER_SAMPLE_FRACTION", float, DEFAULT_SAMPLE_FRACTION,
                                   0.0, 1.0),
            queue_items=number("CALIPER_QUEUE_ITEMS", int, 1024, 1),
            queue_bytes=number("CALIPER_QUEUE_BYTES", int, 4 << 20, 1024),
            producer=env.get("CALIPER_PRODUCER", "").strip(),
            switch_grace_s=number("CALIPER_SWITCH_GRACE_S", float, 2.0, 0.0),
            report_s=number("CALIPER_REPORT_S", float, 10.0, 0.1),
            token=env.get("CALIPER_TOKEN") or None,
            tls_ca=env.get("CALIPER_TLS_CA") or None,
            tls_cert=env.get("CALIPER_TLS_CERT") or None,
            tls_key=env.get("CALIPER_TLS_KEY") or None)

    def client(self, attempts: int):
        from .client import Client
        return Client(self.server, token=self.token, tls_ca=self.tls_ca, tls_cert=self.tls_cert,
                      tls_key=self.tls_key, attempts=attempts, who="caliper: vllm",
                      log=_LogStream())  # type: ignore[arg-type]


def _logger():
    try:
        from vllm.logger import init_logger
        return init_logger("vllm.caliper")  # vLLM's handler and format
    except Exception:  # noqa: BLE001 - outside vLLM (unit tests)
        import logging
        return logging.getLogger("caliper.vllm")


class _LogStream:
    """The client's retry lines, as rate-limited log lines."""

    def __init__(self) -> None:
        self._last = 0.0

    def write(self, text: str) -> None:
        text = text.strip()
        if text and time.monotonic() - self._last > 10.0:
            self._last = time.monotonic()
            _logger().warning("caliper: %s", text)

    def flush(self) -> None:
        pass


class _Every:
    """True at most once per `seconds` (rate-limited log lines)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last = -math.inf

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


def register() -> None:
    """The entry point vLLM calls in each of its processes (possibly more than once)."""
    if status["loaded"]:
        return
    status["loaded"] = True
    try:
        settings = Settings.from_env(os.environ)
    except ValueError as e:
        status["error"] = str(e)
        _logger().warning("caliper: plugin inert: %s", e)
        return
    if settings is None:
        return
    try:
        _install(settings)
    except Exception as e:  # noqa: BLE001 - never stop vLLM from starting
        status["error"] = f"{type(e).__name__}: {e}"
        _logger().warning("caliper: plugin inert: cannot attach to this vLLM: %s", status["error"])
        return
    status["active"] = True


# ---- what the plugin changes in vLLM ------------------------------------------------------

def _install(settings: Settings) -> None:
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_worker import Worker

    load_model, execute_model = Worker.load_model, Worker.execute_model

    def caliper_load_model(self, *args, **kwargs):
        out = load_model(self, *args, **kwargs)
        _guard(lambda: _attach_worker(self, settings), "attach to the worker")
        return out

    def caliper_execute_model(self, scheduler_output, *args, **kwargs):
        state = getattr(self, "_caliper", None)
        if state is None or not state.enabled:
            return execute_model(self, scheduler_output, *args, **kwargs)
        _guard(lambda: state.before_step(scheduler_output), "step", state)
        try:
            return execute_model(self, scheduler_output, *args, **kwargs)
        finally:
            _guard(state.after_step, "step", state)

    Worker.load_model, Worker.execute_model = caliper_load_model, caliper_execute_model

    init = EngineCore.__init__
    steps = {name: getattr(EngineCore, name) for name in ("step", "step_with_batch_queue")}

    def caliper_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _guard(lambda: _attach_engine(self, settings), "attach to the engine core")

    def wrap(original):
        def step(self, *args, **kwargs):
            engine = getattr(self, "_caliper", None)
            if engine is None and not hasattr(self, "_caliper"):
                # Spawned engine core: the plugin loaded inside __init__.
                _guard(lambda: _attach_engine(self, settings), "attach to the engine core")
                engine = getattr(self, "_caliper", None)
            if engine is not None and engine.enabled:
                _guard(lambda: engine.before_step(self), "switch scales", engine)
            return original(self, *args, **kwargs)
        return step

    EngineCore.__init__ = caliper_init
    for name, original in steps.items():
        setattr(EngineCore, name, wrap(original))


def _guard(fn, what: str, state=None) -> None:
    """Runs fn; an error disables the plugin's part (state) with one log line, never raises."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the plugin never fails a request
        if state is not None:
            state.enabled = False
        status["error"] = f"{what}: {type(e).__name__}: {e}"
        _logger().exception("caliper: %s failed; the plugin stays inert here (vLLM goes on "
                            "with the scales in use)", what)


def _why(e: BaseException) -> str:
    """One line: a gRPC error's code and details, else the exception's first line."""
    code = getattr(e, "code", None)
    if callable(code):
        try:
            return f"{code().name}: {e.details()}"  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - not a gRPC call error after all
            pass
    text = str(e).splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _layer_index(name: str) -> Optional[int]:
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def _kv_qmax(kv_cache_dtype: str) -> float:
    """The largest |x| / k_scale the cache holds: its FP8 max, or for NVFP4 caches (global
    decode scales) E2M1's 6 times the E4M3 block scale's 448."""
    import torch
    if kv_cache_dtype.startswith("nvfp4"):
        return 448.0 * 6.0
    return float(torch.finfo(torch.float8_e5m2 if "e5m2" in kv_cache_dtype
                             else torch.float8_e4m3fn).max)


class CaliperWorkerExtension:
    """The worker methods of the plugin, for `--worker-extension-cls` (combine it with your
    own class: `class Mine(MyExtension, CaliperWorkerExtension)`); without an extension class
    the plugin installs them itself."""

    def caliper_refit(self, weight_version: str) -> Dict[str, Any]:
        """After new weights: opens the window of weight_version and samples into it; the
        scales in use stay (re-applied if the reload reset them) until the fleet publishes."""
        state = _worker_state(self)
        return state.refit(str(weight_version))

    def caliper_apply_scales(self, version: int, weight_version: str,
                             scales: Dict[int, Tuple[List[float], ...]]) -> str:
        """Sets this rank's K/V scales, and the query's where given ((k, v) or (k, v, q) per
        layer; every copy vLLM keeps); '' or why it was refused."""
        return _worker_state(self).apply(version, weight_version, scales)

    def caliper_state(self) -> Dict[str, Any]:
        return _worker_state(self).snapshot()


def _worker_state(worker) -> _WorkerState:
    state = getattr(worker, "_caliper", None)
    if state is None:
        raise RuntimeError("caliper: the plugin is not active in this worker (set "
                           f"{ENV_FLEET} and {ENV_SERVER})")
    return state


def _attach_worker(worker, settings: Settings) -> None:
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )
    from vllm.model_executor.layers.attention.attention import Attention
    cls = type(worker)
    for name in _METHODS:
        if not hasattr(cls, name):
            setattr(cls, name, getattr(CaliperWorkerExtension, name))
    model = worker.model_runner.get_model()
    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            index = _layer_index(name)
            if index is not None:
                layers[index] = module
    if not layers:
        raise RuntimeError("no vLLM Attention layer in the model")
    worker._caliper = _WorkerState(settings, layers, get_tensor_model_parallel_rank(),
                                   get_tensor_model_parallel_world_size())


def _attach_engine(core, settings: Settings) -> None:
    core._caliper = None
    if getattr(core.vllm_config.parallel_config, "data_parallel_rank", 0):
        return  # data-parallel ranks > 0: the first one watches and switches (one per engine)
    core._caliper = _EngineState(settings, core)


# ---- the worker side: sampling, saturation, applying scales --------------------------------

@dataclasses.dataclass
class _Layer:
    module: Any
    heads: int
    head_dim: int
    q_heads: int  # local query heads (recipe attention q: reduced per KV group)
    # saturation since the version in use: per local head, elements beyond the FP8 range
    k_over: List[int]
    v_over: List[int]
    elements: int = 0  # per head, of K (and of V)


def _layer_saturation(layer: _Layer) -> float:
    over = layer.elements * layer.heads
    return max(sum(layer.k_over) / over, sum(layer.v_over) / over)


class _WorkerState:
    def __init__(self, settings: Settings, layers: Dict[int, Any], tp_rank: int, tp_size: int):
        self.settings = settings
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.enabled = True
        self.layers: Dict[int, _Layer] = {}
        for index, module in sorted(layers.items()):
            heads = int(module.num_kv_heads)
            self.layers[index] = _Layer(module, heads, int(module.head_size),
                                        int(module.num_heads), [0] * heads, [0] * heads)
        self.kv_cache_dtype = str(next(iter(layers.values())).kv_cache_dtype)
        self.kv_qmax = _kv_qmax(self.kv_cache_dtype)
        self.steps = 0
        self.sampled_steps = 0
        self.sampled_tokens = 0         # of the window in use
        self.total_sampled_tokens = 0
        self.sampling = False
        self.step_tokens = 0
        self.batch = 0
        self.dropped = 0                # statistics (one K/V pair of a layer) not sent
        self.errors = 0
        self.version = 0                # the fleet version in use (0: the checkpoint's scales)
        self.weight_version = settings.weight_version
        self.applied: Dict[int, Tuple[float, float, Optional[float]]] = {}
        self.resets_repaired = 0
        self.recipe: Any = None         # the fleet's recipe, once a window is open
        self.generation = 0             # bumped by each refit: statistics of older weights
        self._lock = threading.Lock()
        self._drop_log = _Every(30.0)
        self._queue: queue.Queue = queue.Queue(settings.queue_items)
        base = settings.producer or (f"{socket.gethostname() or 'localhost'}/"
                                     f"vllm-{os.getpid()}")
        self.sender = _Sender(self, base)
        self._hooks = [layer.module.register_forward_pre_hook(self._make_hook(index))
                       for index, layer in self.layers.items()]

    # engine thread --------------------------------------------------------------------------
    def before_step(self, scheduler_output) -> None:
        self._repair_reset()
        tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        self.sampling = False
        if tokens <= 0 or self.recipe is None:
            return
        self.steps += 1
        if self.sampled_tokens >= self.settings.sample_tokens:
            return
        if self.sampled_steps >= self.settings.sample_fraction * self.steps:
            return
        self.sampled_steps += 1
        self.batch += 1
        self.sampling = True
        self.step_tokens = 0

    def after_step(self) -> None:
        if self.sampling:
            self.sampled_tokens += self.step_tokens
            self.total_sampled_tokens += self.step_tokens
        self.sampling = False

    def _make_hook(self, index: int):
        import torch

        from ._pb import caliper_pb2 as pb
        from .client import statistic
        layer = self.layers[index]
        dtypes = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}

        def hook(module, args):
            if not self.sampling or not self.enabled:
                return
            try:
                query, key, value = args[0], args[1], args[2]
                if key is None or value is None:
                    return
                n = _actual_tokens(module.layer_name)
                if n is not None:
                    query, key, value = query[:n], key[:n], value[:n]
                k = key.reshape(-1, layer.heads, layer.head_dim)
                v = value.reshape(-1, layer.heads, layer.head_dim)
                rows = int(k.shape[0])
                if rows == 0:
                    return
                self.step_tokens = max(self.step_tokens, rows)
                recipe = self.recipe
                dtype = dtypes[k.dtype]
                kc = statistic(recipe, k, dtype, f"layer {index} key", pb.KEY)
                vc = statistic(recipe, v, dtype, f"layer {index} value", pb.VALUE)
                qc = None
                if recipe.attention == pb.ATTENTION_Q:
                    # The query after RoPE, before the attention quantizes it with _q_scale;
                    # each KV head's group of query heads reduced together.
                    qc = statistic(recipe, query.reshape(rows, layer.heads, -1), dtype,
                                   f"layer {index} query", pb.QUERY)
                    qc.shape = [rows, layer.q_heads, layer.head_dim]
                # Saturation under the scale the kernel applies (one per layer and rank).
                k_over = (k.abs() > module._k_scale_float * self.kv_qmax).sum(dim=(0, 2))
                v_over = (v.abs() > module._v_scale_float * self.kv_qmax).sum(dim=(0, 2))
                with self._lock:
                    for h, (a, b) in enumerate(zip(k_over.tolist(), v_over.tolist())):
                        layer.k_over[h] += a
                        layer.v_over[h] += b
                    layer.elements += rows * layer.head_dim
                try:
                    self._queue.put_nowait((index, self.batch, kc, vc, self.generation, qc))
                except queue.Full:
                    self.drop(1)
            except Exception as e:  # noqa: BLE001 - a refused tensor never fails the step
                self.errors += 1
                if self.errors == 1:
                    _logger().warning("caliper: layer %d statistics skipped: %s", index, e)
        return hook

    def drop(self, count: int) -> None:
        self.dropped += count
        if self._drop_log():
            _logger().warning("caliper: %d statistics dropped so far (queue full or Caliper "
                              "unreachable); serving goes on", self.dropped)

    # scales ---------------------------------------------------------------------------------
    def apply(self, version: int, weight_version: str,
              scales: Dict[int, Tuple[List[float], ...]]) -> str:
        """Sets every copy of the K/V scales of each layer, and the query's when the version
        has them ((k, v) or (k, v, q) per layer); refuses (changing nothing) when the version
        does not cover exactly this model's layers or its heads cannot be mapped."""
        scales = {int(k): v for k, v in scales.items()}
        if sorted(scales) != sorted(self.layers):
            return (f"version {version} has layers {sorted(scales)}, the model "
                    f"{sorted(self.layers)}")
        effective: Dict[int, Tuple[float, float, Optional[float]]] = {}
        for index, rows in scales.items():
            ks, vs, qs = rows[0], rows[1], (rows[2] if len(rows) > 2 else [])
            k = _rank_scale(ks, self.tp_rank, self.tp_size)
            v = _rank_scale(vs, self.tp_rank, self.tp_size)
            q = _rank_scale(qs, self.tp_rank, self.tp_size) if qs else None
            if k is None or v is None or (qs and q is None):
                return (f"version {version} layer {index}: {len(ks)} K/V scales cannot be "
                        f"mapped to TP rank {self.tp_rank} of {self.tp_size}")
            used = (k, v) if q is None else (k, v, q)
            if not all(math.isfinite(x) and x > 0 for x in used):
                return f"version {version} layer {index}: scale {used} is not positive"
            effective[index] = (k, v, q)
        for index, (k, v, q) in effective.items():
            _set_scales(self.layers[index].module, k, v, q)
        with self._lock:
            self.applied = effective
            self.version = version
            for layer in self.layers.values():
                layer.k_over = [0] * layer.heads
                layer.v_over = [0] * layer.heads
                layer.elements = 0
        self.sender.report_soon()
        return ""

    def _repair_reset(self) -> None:
        """A weight reload (or anything else) that reset the scales gets the version back."""
        if not self.applied:
            return
        for index, (k, v, q) in self.applied.items():
            module = self.layers[index].module
            if (module._k_scale_float != k or module._v_scale_float != v
                    or (q is not None and module._q_scale_float != q)):
                for i, (kk, vv, qq) in self.applied.items():
                    _set_scales(self.layers[i].module, kk, vv, qq)
                self.resets_repaired += 1
                _logger().warning("caliper: the K/V scales were reset (a weight reload?); "
                                  "version %d re-applied", self.version)
                return

    def saturation(self) -> Tuple[float, Dict[int, Dict[str, List[float]]]]:
        """The most saturation of a layer (K or V, over its heads) and the per-head fractions."""
        worst, per_layer = 0.0, {}
        with self._lock:
            for index, layer in self.layers.items():
                if not layer.elements:
                    continue
                k = [c / layer.elements for c in layer.k_over]
                v = [c / layer.elements for c in layer.v_over]
                per_layer[index] = {"k": k, "v": v}
                worst = max(worst, _layer_saturation(layer))
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
                    out[index] = min(1.0, _layer_saturation(layer))
        return out

    def refit(self, weight_version: str) -> Dict[str, Any]:
        self._repair_reset()
        window = self.sender.switch(weight_version)
        self.generation += 1
        self.sampled_tokens = 0
        self.weight_version = weight_version
        return {"window": window, "version": self.version, "weight_version": weight_version}

    def snapshot(self) -> Dict[str, Any]:
        worst, per_layer = self.saturation()
        scales = {}
        for index, layer in self.layers.items():
            m = layer.module
            scales[index] = {name: _plain(getattr(m, name, None)) for name in _SCALE_ATTRS}
        return {"tp_rank": self.tp_rank, "tp_size": self.tp_size, "version": self.version,
                "weight_version": self.weight_version, "steps": self.steps,
                "sampled_steps": self.sampled_steps, "sampled_tokens": self.sampled_tokens,
                "total_sampled_tokens": self.total_sampled_tokens, "dropped": self.dropped,
                "errors": self.errors, "sent": self.sender.sent,
                "wire_bytes": self.sender.wire_bytes(),
                "unacknowledged": self._queue.qsize() + self.sender.unacknowledged(),
                "window": self.sender.window_id, "producer": self.sender.producer_id,
                "resets_repaired": self.resets_repaired, "saturation": worst,
                "saturation_per_layer": per_layer, "scales": scales,
                "kv_cache_dtype": self.kv_cache_dtype, "enabled": self.enabled}


_SCALE_ATTRS = ("_k_scale", "_v_scale", "_q_scale", "_k_scale_float", "_v_scale_float",
                "_q_scale_float", "_k_scale_cpu", "_v_scale_cpu")


def _plain(x):
    if hasattr(x, "tolist"):
        return x.detach().cpu().tolist()
    return x


def _rank_scale(values: List[float], rank: int, size: int) -> Optional[float]:
    """The scale the kernel applies on `rank`: the max over the heads it holds (vLLM's CPU and
    per-tensor kernels take one scale per layer and rank)."""
    n = len(values)
    if n == 1:
        return float(values[0])
    if n >= size and n % size == 0:
        per = n // size
        return float(max(values[rank * per:(rank + 1) * per]))
    if n < size and size % n == 0:
        return float(values[rank * n // size])
    return None


def _set_scales(module, k: float, v: float, q: Optional[float] = None) -> None:
    """What vLLM's loader sets from checkpoint k/v (and q) scales (BaseKVCacheMethod
    .process_weights_after_loading), including the host copies; without q the query's scale
    stays, as does prob_scale."""
    from vllm.platforms import current_platform
    if current_platform.is_fp8_fnuz():
        k, v = k * 2, v * 2
        q = q * 2 if q is not None else None
    module._k_scale.fill_(k)
    module._v_scale.fill_(v)
    module._k_scale_float = k
    module._v_scale_float = v
    if q is not None:
        module._q_scale.fill_(q)
        module._q_scale_float = q
    if hasattr(module, "_k_scale_cpu"):
        module._k_scale_cpu.fill_(k)
        module._v_scale_cpu.fill_(v)


def _actual_tokens(layer_name: Optional[str]):
    from .vllm_hooks import _actual_tokens as actual
    return actual(layer_name)


class _Sender:
    """The worker's background thread: the window's session, the stream, ReportInUse."""

    CHECK_S = 2.0

    def __init__(self, state: _WorkerState, base: str):
        self.state = state
        self.base = base
        self.settings = state.settings
        self.incarnation = 0
        self.producer_id = ""
        self.window_id = ""
        self.sent = 0
        self._session: Any = None
        self._stream: Any = None   # client for the stream (long retries)
        self._control: Any = None  # client for unary calls (no waiting: the engine never blocks)
        self._want = state.weight_version
        self._have = ""
        self._generation = 0
        self._report = threading.Event()
        self._log = _Every(30.0)
        self._thread = threading.Thread(target=self._run, name="caliper-vllm-sender",
                                        daemon=True)
        self._thread.start()

    def wire_bytes(self) -> int:
        """Bytes of the messages written to the open window's stream."""
        session = self._session
        return session.wire_bytes if session is not None else 0

    def unacknowledged(self) -> int:
        """Statistics the server has not yet acknowledged as durable (merged, queued, sent)."""
        session = self._session
        if session is None:
            return 0
        count = session._merger.pending
        for p in list(session._producers.values()):
            count += len(p._pending) + len(p._retained) + int(p._in_flight)
        return count

    def report_soon(self) -> None:
        self._report.set()

    def switch(self, weight_version: str) -> str:
        """Opens the window of weight_version now (the caller learns its id) and moves the
        stream there; the sampling budget starts again."""
        from .fleets import open_window
        client = self._control or self.settings.client(attempts=3)
        self._control = client
        window = open_window(client, self.settings.fleet, weight_version)
        self._want = weight_version
        self._report.set()
        return window.session_id

    def _run(self) -> None:
        from .fleets import open_window, report_in_use
        self._stream = self.settings.client(attempts=100)
        self._control = self._control or self.settings.client(attempts=1)
        last_check, last_report = -math.inf, time.monotonic()
        last_drain = last_report
        while True:
            try:
                item = self.state._queue.get(timeout=0.5)
            except queue.Empty:
                item = None
            try:
                now = time.monotonic()
                want = self._want
                if want != self._have or now - last_check > self.CHECK_S:
                    last_check = now
                    window = open_window(self._control, self.settings.fleet, want)
                    if window.session_id != self.window_id:
                        self._open(window.session_id, want)
                if item is not None and item[4] < self._generation:
                    self.state.drop(1)  # sampled under the weights before a refit
                    item = None
                if item is not None and self._session is not None:
                    self._put(item)
                    item = None
                if self._session is not None and now - last_drain > 1.0:
                    last_drain = now  # merged statistics wait at most a second
                    self._session._drain_merged()
                if self._report.is_set() or now - last_report > self.settings.report_s:
                    self._report.clear()
                    last_report = now
                    if self.state.version:
                        worst, _ = self.state.saturation()
                        report_in_use(self._control, self.settings.fleet, self.producer_id,
                                      self.state.version, min(1.0, worst),
                                      layer_saturation=self.state.layer_saturation(),
                                      dropped_statistics=self.state.dropped)
            except Exception as e:  # noqa: BLE001 - unreachable, refusing, closed: go on
                if self._log():
                    _logger().warning("caliper: %s (statistics are dropped and counted until "
                                      "it answers)", _why(e))
            if item is not None:
                self.state.drop(1)

    def _open(self, session_id: str, weight_version: str) -> None:
        refit = weight_version != self._have
        old, self._session = self._session, None
        if old is not None:
            threading.Thread(target=self._retire, args=(old,), daemon=True).start()
        self.incarnation += 1
        # Stable for this window and process: a reconnect resumes exactly where it stopped.
        prefix = f"{self.base}/{self.incarnation}"
        session = self._stream.session(session_id, producer_prefix=prefix,
                                       queue_bytes=self.settings.queue_bytes)
        self.state.recipe = session.proto.recipe
        self._session = session
        self.window_id = session_id
        self.producer_id = f"{prefix}/rank{self.state.tp_rank}"
        self._have = weight_version
        if refit:
            self._generation = self.state.generation
        else:  # the window closed: a new budget for the next one
            self.state.sampled_tokens = 0

    def _retire(self, session) -> None:
        """The old window's statistics: sent, or counted as dropped (the window closed)."""
        try:
            session.close()
        except Exception as e:  # noqa: BLE001
            self.state.drop(len(getattr(e, "rejected", [])) or 1)

    def _put(self, item) -> None:
        from ._pb import caliper_pb2 as pb
        index, batch, kc, vc, _, qc = item
        fields = dict(layer=index, tp_rank=self.state.tp_rank, tp_size=self.state.tp_size,
                      batch=batch)
        chunks = [(f"layer {index} key", pb.KEY, kc), (f"layer {index} value", pb.VALUE, vc)]
        if qc is not None:
            chunks.append((f"layer {index} query", pb.QUERY, qc))
        self._session._put(chunks, fields)
        self.sent += 1


# ---- the engine core: watching versions, switching every worker on one step ---------------

class _EngineState:
    def __init__(self, settings: Settings, core):
        self.settings = settings
        self.enabled = True
        config = core.vllm_config
        self.tp_size = int(config.parallel_config.tensor_parallel_size)
        # nvfp4 / nvfp4_4over6 caches take NVFP4 global decode scales, the FP8 ones absmax / qmax.
        self.kv_cache_dtype = str(config.cache_config.cache_dtype)
        self.num_layers = int(config.model_config.get_num_layers(config.parallel_config))
        self.kv_heads = int(config.model_config.get_total_num_kv_heads())
        self.pending: Optional[Tuple[int, str, Dict[int, Tuple[List[float], ...]]]] = None
        self.pending_since = 0.0
        self.version = 0
        self.refused: List[str] = []
        self._log = _Every(30.0)
        self._thread = threading.Thread(target=self._watch, name="caliper-vllm-watch",
                                        daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        from .fleets import watch_scales
        client = self.settings.client(attempts=1)
        after, delay = 0, 0.2
        while True:
            try:
                for sv in watch_scales(client, self.settings.fleet, tp_size=self.tp_size,
                                       after_version=after,
                                       kv_cache_dtype=self.kv_cache_dtype):
                    delay = 0.2
                    after = max(after, sv.version)
                    # A hybrid model's layers without a KV cache have no scales (and no
                    # attention module on the workers, which check the rest exactly).
                    scales: Dict[int, Tuple[List[float], ...]] = {
                        r.layer: (list(r.k_scale), list(r.v_scale), list(r.q_scale))
                        for r in sv.scales.kv_layers if r.k_scale}
                    why = self._check(sv.version, scales)
                    if why:
                        self.refused.append(why)
                        _logger().warning("caliper: fleet %s %s; the engine keeps its scales",
                                          self.settings.fleet, why)
                        continue
                    self.pending = (sv.version, sv.weight_version, scales)
                    self.pending_since = time.monotonic()
                    engine_versions["pending"] = sv.version
            except Exception as e:  # noqa: BLE001 - reconnect with after_version
                if self._log():
                    _logger().warning("caliper: WatchScales: %s (reconnecting)", _why(e))
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _check(self, version: int, scales) -> str:
        if not scales or not set(scales) <= set(range(self.num_layers)):
            return (f"version {version} has K/V scales for layers {sorted(scales)}, the model "
                    f"{self.num_layers} layers")
        for layer, (k, v, q) in scales.items():
            if len(k) != len(v) or len(k) not in (1, self.kv_heads):
                return (f"version {version} layer {layer} has {len(k)} K/V scales, the model "
                        f"{self.kv_heads} KV heads")
            if q and len(q) != len(k):
                return (f"version {version} layer {layer} has {len(q)} query scales for "
                        f"{len(k)} K/V scales")
        return ""

    def before_step(self, core) -> None:
        pending = self.pending
        if pending is None:
            return
        if getattr(core, "batch_queue", None):
            return  # steps in flight: not between two steps yet
        scheduler = core.scheduler
        if scheduler.running:
            if time.monotonic() - self.pending_since < self.settings.switch_grace_s:
                return  # wait for a drain point
            # Preempt: those requests recompute their K/V under the new scales.
            scheduler.reset_prefix_cache(reset_running_requests=True)
        version, weight_version, scales = pending
        results = core.model_executor.collective_rpc(
            "caliper_apply_scales", args=(version, weight_version, scales))
        self.pending = None
        why = next((r for r in results if r), "")
        if why:
            self.refused.append(why)
            _logger().warning("caliper: fleet %s %s; the engine keeps its scales",
                              self.settings.fleet, why)
            return
        scheduler.reset_prefix_cache()
        self.version = version
        engine_versions["in_use"] = version
        _logger().info("caliper: fleet %s version %d in use", self.settings.fleet, version)
