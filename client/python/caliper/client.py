"""caliper.Client and caliper.Session: the Python side of caliper-server's caliper.v1 API."""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import socket
import sys
import threading
import uuid
from typing import Any, Dict, Iterable, List, Optional, Sequence, TextIO, Union

import grpc

from . import _histogram, _retry, _tensors
from ._pb import caliper_pb2 as pb
from ._pb import caliper_pb2_grpc as pb_grpc
from ._producer import Producer, RejectedChunksError, StreamError
from .outputs import WrittenOutputs, write_scales_outputs

MAX_MESSAGE_BYTES = 64 << 20  # as the CLI (client/remote_common.h)
DEFAULT_CHUNK_BYTES = 4 << 20  # as `caliper calibrate --chunk-bytes`
MODES = ("statistics", "raw")

_KV = {"per_head": pb.KV_PER_HEAD, "per_tensor": pb.KV_PER_TENSOR, "off": pb.KV_OFF}
_OBSERVERS = {"static_minmax": pb.STATIC_MINMAX, "minmax": pb.MINMAX}
_CONVENTIONS = {"compressed-tensors": pb.COMPRESSED_TENSORS,
                "compressed_tensors": pb.COMPRESSED_TENSORS, "modelopt": pb.MODELOPT}


@dataclasses.dataclass
class Recipe:
    """What a session observes (the flags of `caliper calibrate`)."""
    kv: str = "per_head"                 # per_head, per_tensor or off
    fp8: str = "e4m3fn"                  # e4m3fn (qmax 448) or e4m3fnuz (qmax 240)
    nvfp4_weights: bool = False
    nvfp4_activations: bool = False
    observer: str = "static_minmax"      # NVFP4 input observer: static_minmax or minmax
    averaging_constant: float = 0.0      # minmax c; 0 = the server's default 0.01
    fused_groups: str = ""               # "q_proj,k_proj,v_proj;gate_proj,up_proj"; "" = default
    warmup: int = 0                      # batches below this are skipped

    def to_proto(self) -> pb.Recipe:
        if self.kv not in _KV:
            raise ValueError(f"recipe.kv: expected per_head, per_tensor or off, got {self.kv!r}")
        if self.fp8 not in ("e4m3fn", "e4m3fnuz"):
            raise ValueError(f"recipe.fp8: expected e4m3fn or e4m3fnuz, got {self.fp8!r}")
        if self.observer not in _OBSERVERS:
            raise ValueError(f"recipe.observer: expected static_minmax or minmax, got "
                             f"{self.observer!r}")
        return pb.Recipe(kv=_KV[self.kv],
                         fp8_flavor=pb.FP8_E4M3FNUZ if self.fp8 == "e4m3fnuz" else pb.FP8_E4M3FN,
                         nvfp4_weights=self.nvfp4_weights,
                         nvfp4_activations=self.nvfp4_activations,
                         activation_observer=_OBSERVERS[self.observer],
                         averaging_constant=self.averaging_constant,
                         fused_groups=self.fused_groups, warmup_batches=self.warmup)


def token_from_environment() -> str:
    return os.environ.get("CALIPER_TOKEN", "").strip()


def _read(path: Optional[str], what: str) -> Optional[bytes]:
    if not path:
        return None
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{what}: {path}: {e.strerror}") from None


def _config_json(model: Union[str, os.PathLike, dict]) -> str:
    if isinstance(model, dict):
        return json.dumps(model)
    path = pathlib.Path(model)
    if path.is_dir():
        path = path / "config.json"
    try:
        return path.read_text()
    except OSError as e:
        raise ValueError(f"model: {path}: {e.strerror}") from None


class Client:
    """A connection to caliper-server. `address` is any gRPC target ("localhost:50051").

    token: bearer token of your tenant (default $CALIPER_TOKEN); tls_ca: PEM CA to connect with
    TLS; tls_cert / tls_key: client certificate for mutual TLS. `attempts` tries per call while
    the server is unreachable (as the CLI's --attempts). Retry lines go to `log` (stderr)
    prefixed with `who`.
    """

    def __init__(self, address: str, token: Optional[str] = None, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None, *,
                 attempts: int = 8, who: str = "caliper", log: Optional[TextIO] = None):
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("tls_key needs tls_cert" if tls_key else "tls_cert needs tls_key")
        if tls_cert and not tls_ca:
            raise ValueError("tls_cert needs tls_ca (mutual TLS runs over TLS)")
        if not 1 <= attempts <= 100:
            raise ValueError(f"attempts: expected 1..100, got {attempts}")
        self.address = address
        self.who = who
        self.log = log if log is not None else sys.stderr
        self.policy = _retry.RetryPolicy(max_attempts=attempts)
        token = token if token is not None else token_from_environment()
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if tls_ca:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca, "tls_ca"),
                private_key=_read(tls_key, "tls_key"),
                certificate_chain=_read(tls_cert, "tls_cert"))
            self.channel = grpc.secure_channel(address, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.stub = pb_grpc.CalibrationStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- sessions ------------------------------------------------------------------------
    def _backoff(self, method: str) -> _retry.Backoff:
        return _retry.Backoff(self.policy, f"{self.who}: {method}", self.log, self.channel)

    def _call(self, method: str, request):
        rpc = getattr(self.stub, method)
        return _retry.call_with_retry(
            self._backoff(method), lambda t: rpc(request, timeout=t, metadata=self._metadata))

    def create_session(self, model: Union[str, os.PathLike, dict],
                       recipe: Union[Recipe, dict, pb.Recipe, None] = None, *, name: str = "",
                       mode: str = "statistics", **session_options) -> "Session":
        """A new session for `model` (an HF config.json path, its directory, or its dict)."""
        if recipe is None:
            recipe = Recipe()
        elif isinstance(recipe, dict):
            recipe = Recipe(**recipe)
        recipe_proto = recipe if isinstance(recipe, pb.Recipe) else recipe.to_proto()
        request = pb.CreateSessionRequest(
            model=pb.ModelDescription(hf_config_json=_config_json(model)), recipe=recipe_proto,
            name=name)
        proto = _retry.create_with_retry(
            self._backoff("CreateSession"), self.channel,
            lambda t: self.stub.CreateSession(request, timeout=t, metadata=self._metadata))
        return Session(self, proto, mode=mode, **session_options)

    def session(self, session_id: str, *, mode: str = "statistics",
                **session_options) -> "Session":
        """An existing session (to add to it, finalize it or fetch its scales)."""
        return Session(self, self.get_session(session_id), mode=mode, **session_options)

    def get_session(self, session_id: str) -> pb.Session:
        return self._call("GetSession", pb.GetSessionRequest(session_id=session_id))

    def list_sessions(self) -> List[pb.Session]:
        return list(self._call("ListSessions", pb.ListSessionsRequest()).sessions)

    def delete_session(self, session_id: str) -> None:
        self.stub.DeleteSession(pb.DeleteSessionRequest(session_id=session_id),
                                timeout=self.policy.call_deadline_s, metadata=self._metadata)


def default_producer_prefix() -> str:
    """<hostname>/python-<pid>-<random>: unique per Session object unless one is given."""
    return f"{socket.gethostname() or 'localhost'}/python-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Session:
    """One calibration session. observe_* queue chunks and return at once (bounded queue);
    finalize() and flush() wait until the server holds every chunk durably and raise
    RejectedChunksError for chunks it refused (tensor name + the server's message).

    mode: "statistics" (reduce on the producer: per-head absmax for K/V, min/max for weights
    and inputs) or "raw" (send the tensors, as `caliper calibrate` does). Each TP rank is one
    producer with its own Observe stream; producer ids are `<producer_prefix>/rank<R>`.
    """

    def __init__(self, client: Client, proto: pb.Session, *, mode: str = "statistics",
                 producer_prefix: Optional[str] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 queue_bytes: int = 256 << 20, retain_bytes: int = 256 << 20):
        if mode not in MODES:
            raise ValueError(f"mode: expected statistics or raw, got {mode!r}")
        if not 1024 <= chunk_bytes <= MAX_MESSAGE_BYTES - (1 << 20):
            raise ValueError(f"chunk_bytes: expected 1024..{MAX_MESSAGE_BYTES - (1 << 20)}")
        self.client = client
        self.proto = proto
        self.mode = mode
        self.chunk_bytes = chunk_bytes
        self.producer_prefix = producer_prefix or default_producer_prefix()
        self._queue_bytes = queue_bytes
        self._retain_bytes = retain_bytes
        self._producers: Dict[int, Producer] = {}
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        return self.proto.id

    @property
    def model(self) -> pb.ModelDescription:
        return self.proto.model

    def producer(self, tp_rank: int = 0) -> Producer:
        with self._lock:
            p = self._producers.get(tp_rank)
            if p is None:
                p = Producer(self.client.stub, self.client.channel, self.id,
                             f"{self.producer_prefix}/rank{tp_rank}",
                             metadata=self.client._metadata, policy=self.client.policy,
                             who=self.client.who, queue_bytes=self._queue_bytes,
                             retain_bytes=self._retain_bytes, log=self.client.log)
                self._producers[tp_rank] = p
            return p

    # ---- observing -----------------------------------------------------------------------
    def observe_kv(self, layer: int, key: Any, value: Any, *, tp_rank: int = 0,
                   tp_size: int = 1, batch: int) -> None:
        """K and V of `layer` for one forward pass `batch`, after RoPE, from TP rank tp_rank."""
        where = "observe_kv"
        if not 0 <= layer < self.model.num_layers:
            raise _tensors.TensorError(f"{where}: layer {layer} is outside the model's layers "
                                       f"[0, {self.model.num_layers})")
        _check_batch(batch, where)
        _tensors.check_tp(tp_rank, tp_size, where)
        heads = _tensors.local_kv_heads(self.model.num_kv_heads, tp_size, where)
        note = (f" (the model's {self.model.num_kv_heads} KV heads at tp_size {tp_size})"
                if tp_size > 1 else "")
        prepared = []
        for arg, x, kind in (("key", key, pb.KEY), ("value", value, pb.VALUE)):
            dtype = _tensors.dtype_name(x, f"{where}: {arg}")
            view = _tensors.kv_view(x, f"{where}: {arg}", heads, self.model.head_dim, note)
            prepared.append((arg, kind, dtype, view))
        chunks = []
        for arg, kind, dtype, view in prepared:
            for chunk in self._chunks(view, dtype, f"{where}: {arg}", kv=True, histograms=True):
                chunks.append((f"layer {layer} {arg}{_rows(chunk)} batch {batch}", kind, chunk))
        self._put(chunks, tp_rank, lambda m: (setattr(m, "layer", layer),
                                               setattr(m, "tp_rank", tp_rank),
                                               setattr(m, "tp_size", tp_size),
                                               setattr(m, "batch", batch)))

    def observe_input(self, module: str, x: Any, *, batch: int, tp_rank: int = 0,
                      tp_size: int = 1) -> None:
        """The input activation of Linear `module` (checkpoint name) in forward pass `batch`."""
        where = "observe_input"
        _check_module(module, where)
        _check_batch(batch, where)
        _tensors.check_tp(tp_rank, tp_size, where)
        dtype = _tensors.dtype_name(x, f"{where}: x")
        view = _tensors.flatten_rows(x)
        chunks = [(f"{module} input{_rows(c)} batch {batch}", pb.INPUT_ACTIVATION, c)
                  for c in self._chunks(view, dtype, f"{where}: x", kv=False, histograms=True)]
        self._put(chunks, tp_rank, lambda m: (setattr(m, "module", module),
                                               setattr(m, "tp_rank", tp_rank),
                                               setattr(m, "tp_size", tp_size),
                                               setattr(m, "batch", batch)))

    def observe_weight(self, module: str, w: Any, *, tp_rank: int = 0, tp_size: int = 1) -> None:
        """The weight (or this rank's TP shard of it) of Linear `module`."""
        where = "observe_weight"
        _check_module(module, where)
        _tensors.check_tp(tp_rank, tp_size, where)
        dtype = _tensors.dtype_name(w, f"{where}: w")
        _tensors.check_weight(w, f"{where}: w")
        chunks = [(f"{module} weight{_rows(c)}", pb.WEIGHT, c)
                  for c in self._chunks(w, dtype, f"{where}: w", kv=False)]
        self._put(chunks, tp_rank, lambda m: (setattr(m, "module", module),
                                               setattr(m, "tp_rank", tp_rank),
                                               setattr(m, "tp_size", tp_size)))

    def _chunks(self, x: Any, dtype: str, where: str, kv: bool,
                histograms: bool = False) -> List[_tensors.Chunk]:
        if self.mode == "raw":
            return _tensors.raw_chunks(x, dtype, self.chunk_bytes)
        # Sessions that keep histograms need them from K/V and inputs (the server refuses less).
        histograms = histograms and _histogram.recipe_needs_histograms(self.proto.recipe)
        if kv:
            return [_tensors.kv_statistics(x, dtype, where, histograms)]
        return [_tensors.range_statistics(x, dtype, where, histograms)]

    def _put(self, chunks, tp_rank: int, fill) -> None:
        producer = self.producer(tp_rank)
        for tensor, kind, chunk in chunks:
            message = pb.TensorChunk(kind=kind, dtype=chunk.dtype, shape=chunk.shape)
            fill(message)
            if chunk.data is not None:
                message.data = chunk.data
            else:
                stats = message.statistics
                if chunk.absmax is not None:
                    stats.absmax.extend(chunk.absmax)
                else:
                    stats.min = chunk.min
                    stats.max = chunk.max
                if chunk.histograms is not None:
                    _histogram.to_proto(stats, chunk.histograms)
            producer.put(message, tensor, chunk.tensor_bytes)

    # ---- results -------------------------------------------------------------------------
    def flush(self) -> None:
        """Waits until the server holds every chunk observed so far (durably, with
        --state_dir); raises RejectedChunksError / StreamError for what it refused."""
        errors = []
        for producer in list(self._producers.values()):
            try:
                producer.flush()
            except (RejectedChunksError, StreamError) as e:
                errors.append(e)
        if errors:
            raise errors[0] if len(errors) == 1 else RejectedChunksError(
                self.producer_prefix, [r for e in errors for r in getattr(e, "rejected", [])])

    def close(self) -> None:
        """Flushes and stops the producers' threads."""
        producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            producer.close()

    def refresh(self) -> pb.Session:
        self.proto = self.client.get_session(self.id)
        return self.proto

    def finalize(self) -> pb.Session:
        """Flushes, then freezes the session (idempotent, retried like the CLI's Finalize)."""
        self.flush()
        self.proto = self.client._call("Finalize", pb.FinalizeRequest(session_id=self.id))
        return self.proto

    def scales(self, tp: Optional[int] = None, rank: Optional[int] = None, *,
               total_kv_heads: Optional[int] = None, formats: Sequence[str] = (),
               convention: str = "compressed-tensors",
               out: Optional[Union[str, os.PathLike]] = None) -> "Scales":
        """Scales of the finalized session for a deployment (TP size `tp`, or total_kv_heads);
        with `out`, writes the files `caliper scales` writes (kv_cache_calib.json, scales.json,
        the engine files of `formats`) and puts their paths in `.written`."""
        if tp is not None and total_kv_heads is not None:
            raise ValueError("give tp or total_kv_heads, not both")
        if rank is not None and tp is None:
            raise ValueError("rank needs tp")
        if convention not in _CONVENTIONS:
            raise ValueError(f"convention: expected compressed-tensors or modelopt, got "
                             f"{convention!r}")
        deployment = pb.Deployment()
        if total_kv_heads is not None:
            deployment.total_kv_heads = total_kv_heads
        else:
            deployment.tp_size = tp if tp is not None else 1
        if rank is not None:
            deployment.rank = rank
        request = pb.ScalesRequest(session_id=self.id, deployment=deployment,
                                   convention=_CONVENTIONS[convention],
                                   formats=["lightllm"] + [f for f in formats if f != "lightllm"])
        response = self.client._call("GetScales", request)
        written = (write_scales_outputs(str(out), response, self.proto, deployment)
                   if out is not None else None)
        return Scales(response, written)

    def delete(self) -> None:
        self.close()
        self.client.delete_session(self.id)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def wire_bytes(self) -> int:
        return sum(p.sent_bytes for p in self._producers.values())

    @property
    def tensor_bytes(self) -> int:
        return sum(p.tensor_bytes for p in self._producers.values())


class Scales:
    """A ScalesResponse (its fields read through) and, when written, the paths of its files."""

    def __init__(self, response: pb.ScalesResponse, written: Optional[WrittenOutputs]):
        self.response = response
        self.written = written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.response, name)


def _rows(chunk: _tensors.Chunk) -> str:
    if chunk.data is None or not chunk.shape:
        return ""
    return f" rows {chunk.first_row}..{chunk.first_row + chunk.shape[0]}"


def _check_batch(batch: int, where: str) -> None:
    if not isinstance(batch, int) or batch < 0:
        raise _tensors.TensorError(f"{where}: batch must be an int >= 0, got {batch!r}")


def _check_module(module: str, where: str) -> None:
    if not isinstance(module, str) or not module:
        raise _tensors.TensorError(f"{where}: module must be a non-empty name, got {module!r}")
