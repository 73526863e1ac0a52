"""The engine core's side: watching the fleet's versions (WatchScales) and handing each valid
one to the switch, which applies it on every worker between two steps."""
from __future__ import annotations

import threading
import time
from typing import Any, Dict

from ._settings import Every, Settings, logger, why
from ._switch import Switch, VersionScales

# vLLM's weight version of the weights an engine starts with ("default", EngineCore) is the
# fleet's CALIPER_WEIGHT_VERSION default.
VLLM_INITIAL_WEIGHT_VERSION = "default"


def fleet_weight_version(vllm_weight_version: str) -> str:
    """The fleet's weight version for vLLM's: vLLM's initial "default" is the fleet's "initial"."""
    if vllm_weight_version == VLLM_INITIAL_WEIGHT_VERSION:
        return "initial"
    return vllm_weight_version


# The engine core's versions, when it runs in this process (vllm.LLM without multiprocessing).
engine_versions: Dict[str, int] = {"pending": 0, "in_use": 0}


class EngineState:
    def __init__(self, settings: Settings, core: Any):
        self.settings = settings
        self.enabled = True
        config = core.vllm_config
        self.tp_size = int(config.parallel_config.tensor_parallel_size)
        # nvfp4 / nvfp4_4over6 caches take NVFP4 global decode scales, the FP8 ones absmax / qmax.
        self.kv_cache_dtype = str(config.cache_config.cache_dtype)
        self.num_layers = int(config.model_config.get_num_layers(config.parallel_config))
        self.kv_heads = int(config.model_config.get_total_num_kv_heads())
        self.switch = Switch(settings)
        self._log = Every(30.0)
        self._thread = threading.Thread(target=self._watch, name="caliper-vllm-watch",
                                        daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.switch.version

    def _watch(self) -> None:
        from ..fleets import watch_scales
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
                    scales: VersionScales = {
                        r.layer: (list(r.k_scale), list(r.v_scale), list(r.q_scale))
                        for r in sv.scales.kv_layers if r.k_scale}
                    refusal = self.check(sv.version, scales)
                    if refusal:
                        self.switch.refused.append(refusal)
                        logger().warning("caliper: fleet %s %s; the engine keeps its scales",
                                         self.settings.fleet, refusal)
                        continue
                    self.switch.offer(sv.version, sv.weight_version, scales)
                    engine_versions["pending"] = sv.version
            except Exception as e:  # noqa: BLE001 - reconnect with after_version
                if self._log():
                    logger().warning("caliper: WatchScales: %s (reconnecting)", why(e))
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def check(self, version: int, scales: VersionScales) -> str:
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

    def refit(self, core: Any, weight_version: str) -> None:
        """vLLM's weight version changed: every worker opens that weight version's window (in
        the background: nothing here waits for Caliper) before the engine's next step."""
        fleet_version = fleet_weight_version(weight_version)
        core.model_executor.collective_rpc("caliper_refit", args=(fleet_version, False))
        logger().info("caliper: weight version %s: sampling into its window of fleet %s",
                      fleet_version, self.settings.fleet)

    def before_step(self, core: Any) -> None:
        version = self.switch.before_step(core)
        if version is not None:
            engine_versions["in_use"] = version
