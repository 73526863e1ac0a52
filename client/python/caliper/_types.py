"""What the server answers, as plain typed values (the API's messages stay inside the package)."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from ._pb import caliper_pb2 as pb

_FLAVORS: Dict[int, str] = {pb.FP8_E4M3FN: "e4m3fn", pb.FP8_E4M3FNUZ: "e4m3fnuz"}
_KV_WORDS: Dict[int, str] = {pb.KV_PER_HEAD: "per_head", pb.KV_PER_TENSOR: "per_tensor",
                             pb.KV_OFF: "off"}


def kv_word(mode: int) -> str:
    return _KV_WORDS.get(mode, "off")


def flavor_word(flavor: int) -> str:
    return _FLAVORS.get(flavor, "e4m3fn")


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """The model a session calibrates, as the server parsed its config.json."""

    architecture: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    dtype: str  # "BF16", "F16", "F32" or "" (unknown)
    # MLA models (0 otherwise): the cache holds kv_c_normed [kv_lora_rank] and k_pe
    # [qk_rope_head_dim] per token; num_kv_heads is then 1, head_dim their sum.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @classmethod
    def from_proto(cls, m: pb.ModelDescription) -> ModelInfo:
        return cls(m.architecture, m.model_type, m.num_layers, m.num_attention_heads,
                   m.num_kv_heads, m.head_dim, m.hidden_size, m.dtype, m.kv_lora_rank,
                   m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim)


@dataclasses.dataclass(frozen=True)
class KvLayerScales:
    """One layer's FP8 KV scales over the model's original heads (one value per tensor)."""

    layer: int
    k_absmax: List[float]
    v_absmax: List[float]
    k_scale: List[float]
    v_scale: List[float]
    # recipe attention q only (else empty): the query's, per KV head or one value.
    q_absmax: List[float] = dataclasses.field(default_factory=list)
    q_scale: List[float] = dataclasses.field(default_factory=list)
    # MLA models only (else None): each cached part's absmax; k_absmax is their max.
    mla_kv_c_normed_absmax: Optional[float] = None
    mla_k_pe_absmax: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class RankKvSlice:
    """The K/V scales one TP rank holds (Session.scales(rank=R))."""

    layer: int
    k_scale: List[float]
    v_scale: List[float]


@dataclasses.dataclass(frozen=True)
class ModuleScales:
    """One NVFP4 module: amax after group sharing, global scales in the convention's form."""

    module: str
    fused_group: str
    weight_amax: Optional[float]
    input_amax: Optional[float]
    weight_global_scale: Optional[float]
    input_global_scale: Optional[float]


@dataclasses.dataclass(frozen=True)
class ScaleWarning:
    """A fallback or lossy step, naming where ("layer 3 K head 5") and what was used instead."""

    where: str
    message: str


@dataclasses.dataclass(frozen=True)
class OutputFile:
    """One file the server rendered: its format ("lightllm", ...), file name and bytes."""

    format: str
    name: str
    content: bytes


def _opt(message: Any, field: str) -> Optional[float]:
    return getattr(message, field) if message.HasField(field) else None


def kv_layers(response: pb.ScalesResponse) -> List[KvLayerScales]:
    return [KvLayerScales(r.layer, list(r.k_absmax), list(r.v_absmax), list(r.k_scale),
                          list(r.v_scale), list(r.q_absmax), list(r.q_scale),
                          _opt(r, "mla_kv_c_normed_absmax"), _opt(r, "mla_k_pe_absmax"))
            for r in response.kv_layers]


def rank_slices(response: pb.ScalesResponse) -> List[RankKvSlice]:
    return [RankKvSlice(r.layer, list(r.k_scale), list(r.v_scale))
            for r in response.rank_slices]


def modules(response: pb.ScalesResponse) -> List[ModuleScales]:
    return [ModuleScales(m.module, m.fused_group, _opt(m, "weight_amax"), _opt(m, "input_amax"),
                         _opt(m, "weight_global_scale"), _opt(m, "input_global_scale"))
            for m in response.modules]


def warnings(response: pb.ScalesResponse) -> List[ScaleWarning]:
    return [ScaleWarning(w.where, w.message) for w in response.warnings]


def files(response: pb.ScalesResponse) -> List[OutputFile]:
    return [OutputFile(f.format, f.name, f.content) for f in response.files]
