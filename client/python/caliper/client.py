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
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    TextIO,
    Tuple,
    TypeVar,
    Union,
)

import grpc
import numpy as np
from google.protobuf.message import Message

from . import _histogram, _merge, _retry, _tensors
from ._pb import caliper_pb2 as pb
from ._pb import caliper_pb2_grpc as pb_grpc
from ._producer import Producer, RejectedChunksError, StreamError
from ._scales_files import WrittenFiles, write_scales_files
from ._types import (
    KvLayerScales,
    ModelInfo,
    ModuleScales,
    OutputFile,
    RankKvSlice,
    ScaleWarning,
    flavor_word,
    kv_word,
)
from ._types import files as _files
from ._types import kv_layers as _kv_layers
from ._types import modules as _modules
from ._types import rank_slices as _rank_slices
from ._types import warnings as _warnings

if TYPE_CHECKING:
    import torch
    from typing_extensions import TypedDict, Unpack

    class SessionOptions(TypedDict, total=False):
        """Session's keyword options, as create_session and session pass them on."""
        producer_prefix: Optional[str]
        chunk_bytes: int
        queue_bytes: int
        retain_bytes: int
        merge_batches: int
        merge_max_entries: int

# What observe_* take: a torch tensor (CPU or CUDA) or a numpy array of BF16/F16/F32.
TensorLike = Union["torch.Tensor", np.ndarray]
# A Recipe's fields by name (Recipe(**fields)).
RecipeFields = Mapping[str, Union[str, bool, int, float]]

MAX_MESSAGE_BYTES = 64 << 20  # as the CLI (client/server_connection.h)
DEFAULT_CHUNK_BYTES = 4 << 20  # as `caliper calibrate --chunk-bytes`
DEFAULT_MERGE_BATCHES = 16  # statistics mode: forward passes merged before sending
MODES = ("statistics", "raw")

_KV = {"per_head": pb.KV_PER_HEAD, "per_tensor": pb.KV_PER_TENSOR, "off": pb.KV_OFF}
_OBSERVERS = {"static_minmax": pb.STATIC_MINMAX, "minmax": pb.MINMAX, "percentile": pb.PERCENTILE,
              "mse": pb.MSE}
_KV_OBSERVERS = {"": pb.KV_OBSERVER_UNSPECIFIED, "static_minmax": pb.KV_OBSERVER_STATIC_MINMAX,
                 "minmax": pb.KV_OBSERVER_MINMAX, "percentile": pb.KV_OBSERVER_PERCENTILE,
                 "mse": pb.KV_OBSERVER_MSE}
_COMPAT = {"": pb.COMPAT_UNSPECIFIED, "caliper": pb.COMPAT_UNSPECIFIED,
           "llm-compressor": pb.COMPAT_LLM_COMPRESSOR}
_CONVENTIONS = {"compressed-tensors": pb.COMPRESSED_TENSORS,
                "compressed_tensors": pb.COMPRESSED_TENSORS, "modelopt": pb.MODELOPT}
_STATES = {pb.OPEN: "open", pb.FINALIZED: "finalized"}


def _key_of(table: Mapping[str, int], value: int, default: str) -> str:
    return next((k for k, v in table.items() if v == value and k), default)


_Enum = TypeVar("_Enum", bound=int)


def _observer(field: str, value: str, table: Mapping[str, _Enum]) -> Tuple[_Enum, float]:
    """'name' or 'percentile:P' -> (enum value, P or 0.0: the server's default 99.99)."""
    name, _, percentile = value.partition(":")
    if name not in table or (percentile and name != "percentile"):
        names = ", ".join(k for k in table if k)
        raise ValueError(f"recipe.{field}: expected {names} (percentile:P), got {value!r}")
    try:
        return table[name], float(percentile) if percentile else 0.0
    except ValueError:
        raise ValueError(f"recipe.{field}: percentile:P needs a number P, got "
                         f"{value!r}") from None


def _observer_name(table: Mapping[str, int], value: int, percentile: float, default: str) -> str:
    name = _key_of(table, value, default)
    return f"percentile:{percentile:g}" if name == "percentile" and percentile else name


@dataclasses.dataclass
class Recipe:
    """What a session observes (the flags of `caliper calibrate`)."""
    kv: str = "per_head"                 # per_head, per_tensor or off
    fp8: str = "e4m3fn"                  # e4m3fn (qmax 448) or e4m3fnuz (qmax 240)
    nvfp4_weights: bool = False
    nvfp4_activations: bool = False
    observer: str = "static_minmax"      # NVFP4 inputs: static_minmax, minmax, mse, percentile:P
    averaging_constant: float = 0.0      # minmax c; 0 = the server's default 0.01
    fused_groups: str = ""               # "q_proj,k_proj,v_proj;gate_proj,up_proj"; "" = default
    warmup: int = 0                      # batches below this are skipped
    kv_observer: str = ""                # static_minmax (""), minmax, mse or percentile:P
    compat: str = ""                     # "" (Caliper's arithmetic) or llm-compressor
    histograms: bool = False             # keep |x| histograms (mse / percentile imply it)
    attention: str = "off"               # off, or q: also the query's scale (needs kv on)

    def to_proto(self) -> pb.Recipe:
        if self.kv not in _KV:
            raise ValueError(f"recipe.kv: expected per_head, per_tensor or off, got {self.kv!r}")
        if self.fp8 not in ("e4m3fn", "e4m3fnuz"):
            raise ValueError(f"recipe.fp8: expected e4m3fn or e4m3fnuz, got {self.fp8!r}")
        observer, percentile = _observer("observer", self.observer, _OBSERVERS)
        kv_observer, kv_percentile = _observer("kv_observer", self.kv_observer, _KV_OBSERVERS)
        if self.compat not in _COMPAT:
            raise ValueError(f"recipe.compat: expected \"\" or llm-compressor, got "
                             f"{self.compat!r}")
        if self.attention not in ("off", "q"):
            raise ValueError(f"recipe.attention: expected off or q, got {self.attention!r}")
        return pb.Recipe(attention=pb.ATTENTION_Q if self.attention == "q" else
                         pb.ATTENTION_UNSPECIFIED,
                         kv=_KV[self.kv], kv_observer=kv_observer, kv_percentile=kv_percentile,
                         compat=_COMPAT[self.compat],
                         fp8_flavor=pb.FP8_E4M3FNUZ if self.fp8 == "e4m3fnuz" else pb.FP8_E4M3FN,
                         nvfp4_weights=self.nvfp4_weights,
                         nvfp4_activations=self.nvfp4_activations,
                         activation_observer=observer, activation_percentile=percentile,
                         averaging_constant=self.averaging_constant,
                         fused_groups=self.fused_groups, warmup_batches=self.warmup,
                         histograms=self.histograms)

    @classmethod
    def from_proto(cls, r: pb.Recipe) -> Recipe:
        return cls(kv=_key_of(_KV, r.kv, "off"), fp8=flavor_word(r.fp8_flavor),
                   nvfp4_weights=r.nvfp4_weights, nvfp4_activations=r.nvfp4_activations,
                   observer=_observer_name(_OBSERVERS, r.activation_observer,
                                           r.activation_percentile, "static_minmax"),
                   averaging_constant=r.averaging_constant, fused_groups=r.fused_groups,
                   warmup=r.warmup_batches,
                   kv_observer=_observer_name(_KV_OBSERVERS, r.kv_observer, r.kv_percentile, ""),
                   compat="llm-compressor" if r.compat == pb.COMPAT_LLM_COMPRESSOR else "",
                   histograms=r.histograms,
                   attention="q" if r.attention == pb.ATTENTION_Q else "off")


@dataclasses.dataclass(frozen=True)
class LayerProgress:
    """K/V tokens a layer has seen (per head, averaged over the model's KV heads)."""
    layer: int
    k_tokens: int
    v_tokens: int


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """A session as the server reports it (Client.get_session, list_sessions, Session.refresh)."""
    id: str
    name: str
    state: str                # "open" or "finalized"
    model: ModelInfo
    recipe: Recipe
    accepted_chunks: int
    accepted_bytes: int
    rejected_chunks: int
    skipped_warmup_chunks: int
    modules_with_weights: int
    modules_with_inputs: int
    created_unix_ms: int
    layers: tuple[LayerProgress, ...]  # one per layer when the recipe keeps K/V, else empty

    @classmethod
    def from_proto(cls, s: pb.Session) -> SessionInfo:
        return cls(s.id, s.name, _STATES.get(s.state, "open"), ModelInfo.from_proto(s.model),
                   Recipe.from_proto(s.recipe), s.accepted_chunks, s.accepted_bytes,
                   s.rejected_chunks, s.skipped_warmup_chunks, s.modules_with_weights,
                   s.modules_with_inputs, s.created_unix_ms,
                   tuple(LayerProgress(p.layer, p.k_tokens, p.v_tokens) for p in s.layers))


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

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sessions ------------------------------------------------------------------------
    def _backoff(self, method: str) -> _retry.Backoff:
        return _retry.Backoff(self.policy, f"{self.who}: {method}", self.log, self.channel)

    def _call(self, method: str, request: Message) -> Any:  # the method's response message
        rpc = getattr(self.stub, method)
        return _retry.call_with_retry(
            self._backoff(method), lambda t: rpc(request, timeout=t, metadata=self._metadata))

    def create_session(self, model: Union[str, os.PathLike[str], Dict[str, object]],
                       recipe: Union[Recipe, RecipeFields, None] = None, *, name: str = "",
                       mode: str = "statistics",
                       **session_options: Unpack[SessionOptions]) -> Session:
        """A new session for `model` (an HF config.json path, its directory, or its dict)."""
        if recipe is None:
            recipe = Recipe()
        elif not isinstance(recipe, (Recipe, pb.Recipe)):
            recipe = Recipe(**recipe)  # type: ignore[arg-type]
        # A caliper.v1 Recipe message is taken as it is (tests and tools build them directly).
        recipe_proto = recipe if isinstance(recipe, pb.Recipe) else recipe.to_proto()
        request = pb.CreateSessionRequest(
            model=pb.ModelDescription(hf_config_json=_config_json(model)), recipe=recipe_proto,
            name=name)
        proto = _retry.create_with_retry(
            self._backoff("CreateSession"), self.channel,
            lambda t: self.stub.CreateSession(request, timeout=t, metadata=self._metadata))
        return Session(self, proto, mode=mode, **session_options)

    def session(self, session_id: str, *, mode: str = "statistics",
                **session_options: Unpack[SessionOptions]) -> Session:
        """An existing session (to add to it, finalize it or fetch its scales)."""
        return Session(self, self._get_session(session_id), mode=mode, **session_options)

    def _get_session(self, session_id: str) -> pb.Session:
        return self._call("GetSession", pb.GetSessionRequest(session_id=session_id))

    def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_proto(self._get_session(session_id))

    def list_sessions(self) -> List[SessionInfo]:
        return [SessionInfo.from_proto(s)
                for s in self._call("ListSessions", pb.ListSessionsRequest()).sessions]

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
    and inputs; per-head / per-16-column-group min and max for the minmax observers) or "raw"
    (send the tensors, as `caliper calibrate` does). Each TP rank is one producer with its own
    Observe stream; producer ids are `<producer_prefix>/rank<R>`.

    In statistics mode, statistics of the same tensor are merged locally (caliper/_merge.py)
    before they are queued: across batches where the observer allows it, and sent once an
    observation for a batch merge_batches past the window's first arrives, when
    merge_max_entries are pending, and on flush/finalize/close. merge_batches=0 sends one
    statistic per observe call. Keep merge_batches the same when re-running a capture into a
    session (Resume counts the statistics sent).
    """

    def __init__(self, client: Client, proto: pb.Session, *, mode: str = "statistics",
                 producer_prefix: Optional[str] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 queue_bytes: int = 256 << 20, retain_bytes: int = 256 << 20,
                 merge_batches: int = DEFAULT_MERGE_BATCHES, merge_max_entries: int = 4096):
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
        if merge_batches < 0 or merge_max_entries < 1:
            raise ValueError("merge_batches: expected >= 0 and merge_max_entries >= 1")
        self._producers: Dict[int, Producer] = {}
        self._lock = threading.Lock()
        self._merge_lock = threading.RLock()  # merger state and the order of puts
        # (tensor, its _version, its statistic): see _input_statistic
        self._last_input: Optional[Tuple[torch.Tensor, int, List[_tensors.Chunk]]] = None
        self._merger = _merge.Merger(proto.recipe, merge_batches if mode == "statistics" else 0,
                                     merge_max_entries)

    @property
    def id(self) -> str:
        return self.proto.id

    @property
    def model(self) -> ModelInfo:
        return ModelInfo.from_proto(self.proto.model)

    @property
    def info(self) -> SessionInfo:
        """The session as last reported (created, refreshed or finalized)."""
        return SessionInfo.from_proto(self.proto)

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
    def observe_kv(self, layer: int, key: TensorLike, value: TensorLike, *, tp_rank: int = 0,
                   tp_size: int = 1, batch: int) -> None:
        """K and V of `layer` for one forward pass `batch`, after RoPE, from TP rank tp_rank."""
        where = "observe_kv"
        if self.model.is_mla:
            raise _tensors.TensorError(f"{where}: the session's model is MLA (kv_lora_rank "
                                       f"{self.model.kv_lora_rank}): its cache holds kv_c_normed "
                                       "and k_pe, not per-head K and V; use observe_mla")
        _check_layer_call(where, layer, self.model.num_layers, batch, tp_rank, tp_size)
        heads = _tensors.local_kv_heads(self.model.num_kv_heads, tp_size, where)
        note = (f" (the model's {self.model.num_kv_heads} KV heads at tp_size {tp_size})"
                if tp_size > 1 else "")
        prepared = []
        for arg, x, kind in (("key", key, pb.KEY), ("value", value, pb.VALUE)):
            dtype = _tensors.dtype_name(x, f"{where}: {arg}")
            view = _tensors.kv_view(x, f"{where}: {arg}", heads, self.model.head_dim, note)
            prepared.append((arg, kind, dtype, view))
        self._put_layer(where, layer, prepared, tp_rank=tp_rank, tp_size=tp_size, batch=batch)

    def observe_query(self, layer: int, query: TensorLike, *, tp_rank: int = 0, tp_size: int = 1,
                      batch: int) -> None:
        """Q of `layer` after RoPE for one forward pass `batch` (recipe attention q), from TP rank
        tp_rank: [batch, q_heads, seq, head_dim], [tokens, q_heads, head_dim] or flattened. The
        query heads of one KV group are reduced together (the server keeps one scale per KV
        head)."""
        where = "observe_query"
        if self.proto.recipe.attention != pb.ATTENTION_Q:
            raise _tensors.TensorError(f"{where}: the session's recipe has attention off "
                                       "(recipe attention q observes the query)")
        _check_layer_call(where, layer, self.model.num_layers, batch, tp_rank, tp_size)
        kv_heads = _tensors.local_kv_heads(self.model.num_kv_heads, tp_size, where)
        q_total = self.model.num_attention_heads
        if q_total % tp_size or (q_total // tp_size) % kv_heads:
            raise _tensors.TensorError(f"{where}: {q_total} query heads do not split over "
                                       f"tp_size {tp_size} ranks of {kv_heads} KV heads")
        heads = q_total // tp_size
        note = (f" (the model's {q_total} query heads at tp_size {tp_size})"
                if tp_size > 1 else "")
        dtype = _tensors.dtype_name(query, f"{where}: query")
        view = _tensors.kv_view(query, f"{where}: query", heads, self.model.head_dim, note,
                                what="q_heads")
        if self.mode == "raw":
            pieces = _tensors.raw_chunks(view, dtype, self.chunk_bytes)
        else:
            # Per KV head: each KV head's group of query heads as one head of the reduction.
            grouped = view.reshape(view.shape[0], kv_heads, -1)
            chunk = statistic(self.proto.recipe, grouped, dtype, f"{where}: query", pb.QUERY)
            chunk.shape = [int(d) for d in view.shape]
            pieces = [chunk]
        chunks = [(f"layer {layer} query{_rows(c)}", pb.QUERY, c) for c in pieces]
        self._put(chunks, dict(layer=layer, tp_rank=tp_rank, tp_size=tp_size, batch=batch))

    def observe_mla(self, layer: int, kv_c_normed: TensorLike, k_pe: TensorLike, *,
                    tp_rank: int = 0, tp_size: int = 1, batch: int) -> None:
        """MLA models: what the engine caches for `layer` in forward pass `batch`: kv_c_normed
        ([..., kv_lora_rank], after kv_a_layernorm) and k_pe after RoPE ([..., qk_rope_head_dim]
        or [..., 1, qk_rope_head_dim]). Every TP rank caches the whole latent (it is not split
        by heads): each rank may send its copy, ranks merge by max."""
        where = "observe_mla"
        model = self.model
        if not model.is_mla:
            raise _tensors.TensorError(f"{where}: the session's model is not MLA (no "
                                       "kv_lora_rank); use observe_kv")
        _check_layer_call(where, layer, model.num_layers, batch, tp_rank, tp_size)
        prepared = []
        for arg, x, kind, width in (("kv_c_normed", kv_c_normed, pb.KEY, model.kv_lora_rank),
                                    ("k_pe", k_pe, pb.VALUE, model.qk_rope_head_dim)):
            dtype = _tensors.dtype_name(x, f"{where}: {arg}")
            if int(x.shape[-1]) != width:
                raise _tensors.TensorError(f"{where}: {arg}.shape: {list(x.shape)} does not end "
                                           f"in {width} (the model's {arg} width)")
            view = _tensors.kv_view(x.reshape(-1, width), f"{where}: {arg}", 1, width, "")
            prepared.append((arg, kind, dtype, view))
        self._put_layer(where, layer, prepared, tp_rank=tp_rank, tp_size=tp_size, batch=batch)

    def observe_input(self, module: str, x: TensorLike, *, batch: int, tp_rank: int = 0,
                      tp_size: int = 1) -> None:
        """The input activation of Linear `module` (checkpoint name) in forward pass `batch`."""
        where = "observe_input"
        _check_module(module, where)
        _check_batch(batch, where)
        _tensors.check_tp(tp_rank, tp_size, where)
        dtype = _tensors.dtype_name(x, f"{where}: x")
        pieces = self._input_statistic(x)
        if pieces is None:
            pieces = self._chunks(_tensors.flatten_rows(x), dtype, f"{where}: x",
                                  pb.INPUT_ACTIVATION)
        chunks = [(f"{module} input{_rows(c)}", pb.INPUT_ACTIVATION, c) for c in pieces]
        self._put(chunks, dict(module=module, tp_rank=tp_rank, tp_size=tp_size, batch=batch))

    def observe_weight(self, module: str, w: TensorLike, *, tp_rank: int = 0,
                       tp_size: int = 1) -> None:
        """The weight (or this rank's TP shard of it) of Linear `module`."""
        where = "observe_weight"
        _check_module(module, where)
        _tensors.check_tp(tp_rank, tp_size, where)
        dtype = _tensors.dtype_name(w, f"{where}: w")
        _tensors.check_weight(w, f"{where}: w")
        chunks = [(f"{module} weight{_rows(c)}", pb.WEIGHT, c)
                  for c in self._chunks(w, dtype, f"{where}: w", pb.WEIGHT)]
        self._put(chunks, dict(module=module, tp_rank=tp_rank, tp_size=tp_size))

    def _input_statistic(self, x: TensorLike) -> Optional[List[_tensors.Chunk]]:
        """The statistic of the last input observed when x is that same, unmodified torch
        tensor (q/k/v and gate/up projections share their input: reduced once); else None,
        after remembering x for the next call. The statistic is never mutated (merging makes
        new ones)."""
        # Inference tensors (vLLM runs under inference_mode) keep no version counter.
        if self.mode != "statistics" or not isinstance(x, _tensors.torch_tensor_type()) \
                or x.is_inference():
            return None
        last = self._last_input
        if last is not None and last[0] is x and last[1] == x._version:
            return last[2]
        self._last_input = None
        pieces = self._chunks(_tensors.flatten_rows(x), _tensors.dtype_name(x, "x"),
                              "observe_input: x", pb.INPUT_ACTIVATION)
        self._last_input = (x, x._version, pieces)
        return pieces

    def _chunks(self, x: TensorLike, dtype: str, where: str, kind: int) -> List[_tensors.Chunk]:
        """Raw pieces, or the statistic the session's observer needs (its recipe decides)."""
        if self.mode == "raw":
            return _tensors.raw_chunks(x, dtype, self.chunk_bytes)
        return [statistic(self.proto.recipe, x, dtype, where, kind)]

    def _put_layer(self, where: str, layer: int, prepared: Sequence[Tuple[str, int, str, Any]], *,
                   tp_rank: int, tp_size: int, batch: int) -> None:
        """Queues one layer's (argument, kind, dtype, view) tensors as chunks, named for errors."""
        chunks = []
        for arg, kind, dtype, view in prepared:
            for chunk in self._chunks(view, dtype, f"{where}: {arg}", kind):
                chunks.append((f"layer {layer} {arg}{_rows(chunk)}", kind, chunk))
        self._put(chunks, dict(layer=layer, tp_rank=tp_rank, tp_size=tp_size, batch=batch))

    def _put(self, chunks: Sequence[Tuple[str, int, _tensors.Chunk]],
             fields: Dict[str, Union[int, str]]) -> None:
        batch = fields.get("batch")
        assert batch is None or isinstance(batch, int)
        with self._merge_lock:
            for tensor, kind, chunk in chunks:
                item = _merge.Pending(kind, dict(fields), chunk, tensor, batch, batch)
                for ready in self._merger.add(item):
                    self._send(ready)

    def _send(self, item: _merge.Pending) -> None:
        chunk = item.chunk
        message = pb.TensorChunk(kind=item.kind, dtype=chunk.dtype,  # type: ignore[arg-type]
                                 shape=chunk.shape, **item.fields)
        if chunk.data is not None:
            message.data = chunk.data
        else:
            stats = message.statistics
            if chunk.absmax is not None:
                stats.absmax.extend(chunk.absmax)
            elif chunk.head_min is not None:
                stats.head_min.extend(chunk.head_min)
                stats.head_max.extend(chunk.head_max)
            elif chunk.group_min is not None:
                stats.group_min.extend(chunk.group_min)
                stats.group_max.extend(chunk.group_max)
            elif chunk.min is not None and chunk.max is not None:
                stats.min = chunk.min
                stats.max = chunk.max
            if chunk.histograms is not None:
                _histogram.to_proto(stats, chunk.histograms)
        self.producer(item.fields["tp_rank"]).put(message, item.description, chunk.tensor_bytes)

    def _drain_merged(self) -> None:
        """Sends every locally merged statistic still pending."""
        with self._merge_lock:
            for ready in self._merger.drain():
                self._send(ready)

    # ---- results -------------------------------------------------------------------------
    def flush(self) -> None:
        """Waits until the server holds every chunk observed so far (durably, with
        --state_dir); raises RejectedChunksError / StreamError for what it refused."""
        self._last_input = None
        self._drain_merged()
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
        self._drain_merged()
        producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            producer.close()

    def refresh(self) -> SessionInfo:
        self.proto = self.client._get_session(self.id)
        return self.info

    def finalize(self) -> SessionInfo:
        """Flushes, then freezes the session (idempotent, retried like the CLI's Finalize)."""
        self.flush()
        self.proto = self.client._call("Finalize", pb.FinalizeRequest(session_id=self.id))
        return self.info

    def scales(self, tp: Optional[int] = None, rank: Optional[int] = None, *,
               total_kv_heads: Optional[int] = None, formats: Sequence[str] = (),
               convention: str = "compressed-tensors", kv_cache_dtype: str = "fp8",
               out: Optional[Union[str, os.PathLike[str]]] = None) -> Scales:
        """Scales of the finalized session for a deployment (TP size `tp`, or total_kv_heads;
        `kv_cache_dtype` "nvfp4" for an NVFP4 KV cache: per-tensor global decode scales, absmax
        / 2688); with `out`, writes the files `caliper scales` writes (kv_cache_calib.json,
        scales.json, the engine files of `formats`) and puts their paths in `.written`."""
        if tp is not None and total_kv_heads is not None:
            raise ValueError("give tp or total_kv_heads, not both")
        if rank is not None and tp is None:
            raise ValueError("rank needs tp")
        if convention not in _CONVENTIONS:
            raise ValueError(f"convention: expected compressed-tensors or modelopt, got "
                             f"{convention!r}")
        if kv_cache_dtype not in ("fp8", "nvfp4"):
            raise ValueError(f"kv_cache_dtype: expected fp8 or nvfp4, got {kv_cache_dtype!r}")
        deployment = pb.Deployment(kv_cache_dtype=pb.KV_CACHE_NVFP4 if kv_cache_dtype == "nvfp4"
                                   else pb.KV_CACHE_FP8)
        if total_kv_heads is not None:
            deployment.total_kv_heads = total_kv_heads
        else:
            deployment.tp_size = tp if tp is not None else 1
        if rank is not None:
            deployment.rank = rank
        # The session's default KV file first, as `caliper scales`: LightLLM's, or
        # compressed-tensors for e4m3fnuz and NVFP4 caches (LightLLM holds e4m3fn FP8 only).
        kv_format = ("compressed-tensors" if self.proto.recipe.fp8_flavor == pb.FP8_E4M3FNUZ
                     or kv_cache_dtype == "nvfp4" else "lightllm")
        request = pb.ScalesRequest(
            session_id=self.id, deployment=deployment, convention=_CONVENTIONS[convention],
            formats=([kv_format] if self.proto.recipe.kv != pb.KV_OFF else []) +
            [f for f in formats if f != kv_format])
        response = self.client._call("GetScales", request)
        written = write_scales_files(str(out), response) if out is not None else None
        return Scales(response, written)

    def delete(self) -> None:
        self.close()
        self.client.delete_session(self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def wire_bytes(self) -> int:
        return sum(p.sent_bytes for p in self._producers.values())

    @property
    def tensor_bytes(self) -> int:
        return sum(p.tensor_bytes for p in self._producers.values())


class Scales:
    """A deployment's scales (Session.scales) and, when written, the paths of its files.

    kv: "per_head", "per_tensor" or "off"; fp8: "e4m3fn" or "e4m3fnuz"; convention:
    "compressed-tensors" (global scale = 2688 / amax) or "modelopt" (amax / 2688)."""

    def __init__(self, response: pb.ScalesResponse, written: Optional[WrittenFiles]):
        self.kv = kv_word(response.kv)
        self.fp8 = flavor_word(response.fp8_flavor)
        self.num_kv_heads = response.num_kv_heads
        self.deployed_total_kv_heads = response.deployed_total_kv_heads
        self.tp_size = response.tp_size
        self.kv_layers: List[KvLayerScales] = _kv_layers(response)
        self.rank_slices: List[RankKvSlice] = _rank_slices(response)
        self.convention = "modelopt" if response.convention == pb.MODELOPT else "compressed-tensors"
        self.modules: List[ModuleScales] = _modules(response)
        self.warnings: List[ScaleWarning] = _warnings(response)
        self.files: List[OutputFile] = _files(response)
        self.scales_json: bytes = response.scales_json
        self.written = written


def statistic(recipe: pb.Recipe, x: TensorLike, dtype: str, where: str,
              kind: int) -> _tensors.Chunk:
    """The statistic of x (a chunk `kind` of a session with `recipe`) its observer needs,
    reduced on x's device."""
    # Sessions that keep histograms need them from K/V and inputs (the server refuses less).
    hist = kind != pb.WEIGHT and _histogram.recipe_needs_histograms(recipe)
    if kind in (pb.KEY, pb.VALUE, pb.QUERY):
        if recipe.kv_observer == pb.KV_OBSERVER_MINMAX:
            return _tensors.kv_minmax_statistics(x, dtype, where, hist)
        return _tensors.kv_statistics(x, dtype, where, hist)
    if kind == pb.INPUT_ACTIVATION and recipe.activation_observer == pb.MINMAX:
        return _tensors.group_statistics(x, dtype, where, hist)
    return _tensors.range_statistics(x, dtype, where, hist)


def _rows(chunk: _tensors.Chunk) -> str:
    if chunk.data is None or not chunk.shape:
        return ""
    return f" rows {chunk.first_row}..{chunk.first_row + chunk.shape[0]}"


def _check_layer_call(where: str, layer: int, num_layers: int, batch: int, tp_rank: int,
                      tp_size: int) -> None:
    """What every per-layer observe checks first: the layer, the batch and the TP rank."""
    if not 0 <= layer < num_layers:
        raise _tensors.TensorError(f"{where}: layer {layer} is outside the model's layers "
                                   f"[0, {num_layers})")
    _check_batch(batch, where)
    _tensors.check_tp(tp_rank, tp_size, where)


def _check_batch(batch: int, where: str) -> None:
    if not isinstance(batch, int) or batch < 0:
        raise _tensors.TensorError(f"{where}: batch must be an int >= 0, got {batch!r}")


def _check_module(module: str, where: str) -> None:
    if not isinstance(module, str) or not module:
        raise _tensors.TensorError(f"{where}: module must be a non-empty name, got {module!r}")
