"""The transformers hooks with recipe attention q and on models whose layers differ, without a
server: what the hooks hand the Session API (a recorder), and what Session.observe_query sends
(its statistic per KV group, the shape it stands for) on a session object with no connection."""
import pytest
import torch
import transformers

import caliper
import caliper.hooks
from caliper import _tensors
from caliper._pb import caliper_pb2 as pb
from caliper.client import statistic
from conftest import Recorder, tiny_model


class QueryRecorder(Recorder):
    def __init__(self, recipe):
        super().__init__(recipe)
        self.queries = []  # (layer, batch, query [b, q_heads, s, d])

    def observe_query(self, layer, query, *, batch, tp_rank=0, tp_size=1):
        self.queries.append((layer, batch, query.detach().clone()))


def run(model, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(n):
            model(torch.randint(0, 256, (1, 11), generator=g), use_cache=False)


def test_hooks_stream_the_query_after_rope_only_with_attention_q():
    model, _ = tiny_model("llama")
    rec = QueryRecorder(caliper.Recipe(kv="per_head", attention="q").to_proto())
    handle = caliper.hooks.attach(model, rec)
    assert handle.query
    run(model)
    handle.detach()
    assert sorted({(l, b) for l, b, _ in rec.queries}) == [(l, b) for l in range(2)
                                                           for b in range(3)]
    # [batch, q_heads, seq, head_dim], and after RoPE: it differs from q_proj's output at
    # positions > 0 but has the same per-token norm (RoPE is a rotation).
    layer0 = model.model.layers[0].self_attn
    ids = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(5))
    rec2 = QueryRecorder(caliper.Recipe(kv="per_head", attention="q").to_proto())
    captured = {}
    hook = layer0.q_proj.register_forward_hook(lambda m, a, out: captured.setdefault("q", out))
    with caliper.hooks.attach(model, rec2), torch.no_grad():
        model(ids, use_cache=False)
    hook.remove()
    q = rec2.queries[0][2]
    assert q.shape == (1, 4, 7, 16)
    pre = captured["q"].view(1, 7, 4, 16).transpose(1, 2)
    assert not torch.allclose(q[:, :, 1:], pre[:, :, 1:])
    torch.testing.assert_close(q.norm(dim=-1), pre.norm(dim=-1), rtol=1e-5, atol=1e-5)

    # Without attention q nothing of the query is streamed.
    rec3 = QueryRecorder(caliper.Recipe(kv="per_head").to_proto())
    with caliper.hooks.attach(model, rec3) as h:
        run(model, n=1)
    assert not h.query and rec3.queries == [] and rec3.kv


def test_query_statistic_is_per_kv_group():
    """Session.observe_query's reduction (statistics mode): one absmax per KV head, over the
    query heads of its group, for the shape [tokens, q_heads, head_dim]."""
    torch.manual_seed(0)
    q = torch.randn(1, 4, 9, 16)  # 4 query heads, 2 KV heads: groups {0, 1}, {2, 3}
    q[0, 3] *= 10
    view = _tensors.kv_view(q, "q", 4, 16, "", what="q_heads")
    recipe = caliper.Recipe(kv="per_head", attention="q").to_proto()
    chunk = statistic(recipe, view.reshape(view.shape[0], 2, -1), "F32", "q", pb.QUERY)
    expected = [q[0, 0:2].abs().max().item(), q[0, 2:4].abs().max().item()]
    assert chunk.absmax == pytest.approx(expected, rel=0, abs=0)
    with pytest.raises(_tensors.TensorError, match=r"\[batch, 4 q_heads, seq, 16 head_dim\]"):
        _tensors.kv_view(torch.zeros(1, 2, 9, 16), "observe_query: query", 4, 16, "",
                         what="q_heads")


def test_recipe_attention_round_trips_and_refuses_unknown():
    proto = caliper.Recipe(kv="per_tensor", attention="q").to_proto()
    assert proto.attention == pb.ATTENTION_Q
    assert caliper.Recipe.from_proto(proto).attention == "q"
    assert caliper.Recipe.from_proto(caliper.Recipe().to_proto()).attention == "off"
    with pytest.raises(ValueError, match="recipe.attention"):
        caliper.Recipe(attention="qk").to_proto()


def _hybrid(kind):
    torch.manual_seed(0)
    if kind == "gemma3":
        cfg = transformers.Gemma3TextConfig(
            num_hidden_layers=6, hidden_size=64, intermediate_size=96, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, sliding_window=8,
            max_position_embeddings=256)
        model = transformers.Gemma3ForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3NextConfig(
            num_hidden_layers=4, hidden_size=64, intermediate_size=96, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
            linear_value_head_dim=16, max_position_embeddings=256)
        model = transformers.Qwen3NextForCausalLM(cfg)
    return model.eval(), cfg


@pytest.mark.parametrize("kind", ["gemma3", "qwen3_next"])
def test_hooks_on_hybrid_models_stream_only_layers_with_a_kv_cache(kind):
    model, cfg = _hybrid(kind)
    rec = QueryRecorder(caliper.Recipe(kv="per_head", attention="q").to_proto())
    handle = caliper.hooks.attach(model, rec, inputs=False, weights=False)
    run(model, n=2)
    handle.detach()
    with_cache = [i for i, t in enumerate(cfg.layer_types) if t != "linear_attention"]
    assert sorted(handle.kv_layers) == with_cache
    assert sorted({l for l, *_ in rec.kv}) == with_cache
    assert sorted({l for l, *_ in rec.queries}) == with_cache
    if kind == "qwen3_next":
        assert with_cache == [3]
    else:
        assert with_cache == list(range(6))
    for _, _, key, value in rec.kv:
        assert key.shape[1] == 2 and key.shape[-1] == 16
