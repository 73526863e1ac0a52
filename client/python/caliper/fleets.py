"""Fleet calls of caliper.Client (docs/fleets.md): windows a producer streams into, the versions
of scales a fleet publishes, and what an engine reports it runs."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterable, Iterator, List, Optional, Sequence

from ._pb import caliper_pb2 as pb

if TYPE_CHECKING:
    import grpc

    from .client import Client, Scales


@dataclasses.dataclass(frozen=True)
class FleetWindow:
    """A window of (fleet, weight version): stream into `session_id` as into a session."""

    session_id: str
    weight_version: str
    open: bool
    tokens: int
    close_reason: str
    decision: str
    version: int  # the version it became; 0 when not published
    detail: str = ""  # the decision in words (names refused or kept layers)

    @classmethod
    def from_proto(cls, w: pb.FleetWindow) -> FleetWindow:
        return cls(w.session_id, w.weight_version, w.open, w.tokens, w.close_reason, w.decision,
                   w.version, w.detail)


@dataclasses.dataclass(frozen=True)
class InUseReport:
    producer_id: str
    version: int
    saturation: float
    stale: bool
    layer_saturation: List[float] = dataclasses.field(default_factory=list)
    dropped_statistics: int = 0
    sampled_tokens: int = 0  # between its last two reports


@dataclasses.dataclass(frozen=True)
class FleetInfo:
    name: str
    current_version: int
    newest_version: int
    newest_weight_version: str
    windows: List[FleetWindow]
    in_use: List[InUseReport]

    @classmethod
    def from_proto(cls, f: pb.Fleet) -> FleetInfo:
        return cls(f.name, f.current_version, f.newest_version, f.newest_weight_version,
                   [FleetWindow.from_proto(w) for w in f.windows],
                   [InUseReport(u.producer_id, u.version, u.saturation, u.stale,
                                list(u.layer_saturation), u.dropped_statistics,
                                u.sampled_tokens)
                    for u in f.in_use])


@dataclasses.dataclass
class ScalesVersion:
    """One version WatchScales delivered, adapted to the watcher's deployment."""

    version: int
    weight_version: str
    gap: bool  # versions between the one asked after and this one were dropped by retention
    scales: Scales


def create_fleet(client: Client, name: str, model: object, recipe: object = None, *,
                 engine: str = "vllm", window_tokens: int = 0, window_seconds: int = 0,
                 min_tokens: Optional[int] = None, drift: Optional[float] = None,
                 max_saturation: Optional[float] = None) -> FleetInfo:
    from .client import Recipe, _config_json
    recipe = recipe if recipe is not None else Recipe()
    recipe_proto = recipe if isinstance(recipe, pb.Recipe) else (
        recipe.to_proto() if isinstance(recipe, Recipe) else Recipe(**recipe).to_proto())  # type: ignore[arg-type]
    policy = pb.PublishPolicy(window_tokens=window_tokens, window_seconds=window_seconds)
    if min_tokens is not None:
        policy.min_tokens = min_tokens
    if drift is not None:
        policy.drift = drift
    if max_saturation is not None:
        policy.max_saturation = max_saturation
    engines = {"vllm": pb.ENGINE_KIND_VLLM, "sglang": pb.ENGINE_KIND_SGLANG,
               "lightllm": pb.ENGINE_KIND_LIGHTLLM, "trtllm": pb.ENGINE_KIND_TRTLLM}
    if engine not in engines:
        raise ValueError(f"engine: expected vllm, sglang, lightllm or trtllm, got {engine!r}")
    request = pb.CreateFleetRequest(
        name=name, model=pb.ModelDescription(hf_config_json=_config_json(model)),  # type: ignore[arg-type]
        recipe=recipe_proto, engine=engines[engine], policy=policy)
    return FleetInfo.from_proto(client._call("CreateFleet", request))


def get_fleet(client: Client, fleet: str) -> FleetInfo:
    return FleetInfo.from_proto(client._call("GetFleet", pb.GetFleetRequest(fleet=fleet)))


def open_window(client: Client, fleet: str, weight_version: str) -> FleetWindow:
    return FleetWindow.from_proto(client._call(
        "OpenWindow", pb.OpenWindowRequest(fleet=fleet, weight_version=weight_version)))


def close_window(client: Client, fleet: str, *, session_id: str = "",
                 weight_version: str = "") -> FleetWindow:
    return FleetWindow.from_proto(client._call("CloseWindow", pb.CloseWindowRequest(
        fleet=fleet, session_id=session_id, weight_version=weight_version)))


def report_in_use(client: Client, fleet: str, producer_id: str, version: int,
                  saturation: float, *, layer_saturation: Sequence[float] = (),
                  dropped_statistics: int = 0, sampled_tokens: int = 0) -> None:
    """What the engine runs (version 0: no fleet version yet): `saturation` its worst layer's,
    `layer_saturation` per layer (index = layer), `dropped_statistics` its running total of
    statistics not sent, `sampled_tokens` the K/V tokens it sampled since its last report."""
    client._call("ReportInUse", pb.ReportInUseRequest(
        fleet=fleet, producer_id=producer_id, version=version, saturation=saturation,
        layer_saturation=list(layer_saturation), dropped_statistics=dropped_statistics,
        sampled_tokens=sampled_tokens))


def watch_scales(client: Client, fleet: str, *, tp_size: int = 1, after_version: int = 0,
                 kv_cache_dtype: str = "fp8",
                 timeout: Optional[float] = None) -> Iterator[ScalesVersion]:
    """The current version, then each version that becomes current (one stream; the caller
    reconnects with after_version on error). Cancel through the iterator's close().
    kv_cache_dtype "nvfp4": the scales of an NVFP4 KV cache (global decode scales)."""
    from .client import Scales
    deployment = pb.Deployment(tp_size=tp_size, kv_cache_dtype=pb.KV_CACHE_NVFP4
                               if kv_cache_dtype.startswith("nvfp4") else pb.KV_CACHE_FP8)
    request = pb.WatchScalesRequest(fleet=fleet, deployment=deployment,
                                    after_version=after_version)
    call: grpc.Future = client.stub.WatchScales(request, metadata=client._metadata,
                                                timeout=timeout)
    try:
        for r in call:
            yield ScalesVersion(r.version, r.weight_version, r.gap, Scales(r.scales, None))
    finally:
        call.cancel()


def refit(model: Any, fleet: str, samples: Iterable[Any], *, weight_version: str,
          client: Client, first_batch: int = 0) -> FleetWindow:
    """Trainer side of a weight update: runs the transformers capture hooks on `model` over
    `samples` (token-id lists or [1, seq] tensors, one forward each) into the window of
    (fleet, weight_version), so the trainer and the engines feed the same window. Returns the
    window once the server holds every statistic."""
    import torch

    from . import hooks
    window = open_window(client, fleet, weight_version)
    session = client.session(window.session_id)
    handle = hooks.attach(model, session, first_batch=first_batch)
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            for ids in samples:
                ids = ids if isinstance(ids, torch.Tensor) else torch.tensor([list(ids)])
                model(ids.to(device), use_cache=False)
        session.flush()
    finally:
        handle.detach()
        session.close()
    return window
