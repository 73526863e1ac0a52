"""Statistics mode for sessions that keep |x| histograms (percentile / mse observers, or
histograms=true): the producer's bins (caliper/_histogram.py) are the server's, and a session
fed statistics gives the same scales and the same report.json, byte for byte, as one fed raw
tensors.
A producer that leaves the histograms out (or sends them to a session that keeps none) is refused."""
import json
import math
import struct

import numpy as np
import pytest
import torch

import caliper
from caliper import _histogram
from caliper._pb import caliper_pb2 as pb

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 256,
          "head_dim": 32, "intermediate_size": 512}
MODULES = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
           "model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj"]


def reference_slot(value: float) -> int:
    """MagnitudeHistogram::SlotOf, written out from the f32 bits."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0] & 0x7FFFFFFF
    if bits == 0:
        return 0
    t = (bits >> 16) - 12160
    return 1 if t < 0 else (8194 if t >= 8192 else 2 + t)


SPECIAL = [0.0, -0.0, 1e-45, 1e-40, 2.0 ** -32, 2.0 ** -32 * 0.999, 2.0 ** -24, 6e-8, 1.0,
           -1.0, 1.0625, 1.0624, 1.5, 448.0, -448.0, 65504.0, 2.0 ** 32, 2.0 ** 32 * 0.9999,
           3e38, -3e38, 1e20, 0.1, -7.25]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bins_match_the_servers_slot_rule_torch_and_numpy(dtype):
    rng = np.random.default_rng(3)
    values = np.concatenate([np.array(SPECIAL, np.float32),
                             rng.standard_normal(4000).astype(np.float32) *
                             np.exp(rng.uniform(-30, 30, 4000)).astype(np.float32)])
    x = torch.from_numpy(values).to(dtype)  # round to the dtype first, as a producer holds it
    exact = x.float().numpy()
    exact = exact[np.isfinite(exact)]
    x = torch.from_numpy(exact).to(dtype)
    want = np.zeros(_histogram.SLOTS, np.int64)
    for v in exact:
        want[reference_slot(float(v))] += 1
    amax = float(np.abs(exact).max())
    hist_t = _histogram.tensor_histogram(x)
    assert hist_t.counts.tolist() == want.tolist()
    assert hist_t.max_count == int((np.abs(exact) == amax).sum())
    if dtype != torch.bfloat16:  # numpy has no bfloat16 without ml_dtypes
        hist_n = _histogram.tensor_histogram(x.numpy())
        assert hist_n.counts.tolist() == want.tolist()
        assert hist_n.max_count == hist_t.max_count


def test_per_head_and_blocks_fold_the_max_count(monkeypatch):
    x = torch.zeros(6, 3, 4)
    x[0, 0, 0] = 5.0
    x[5, 0, 3] = -5.0   # the same max in another block: counts add
    x[1, 1, 1] = 2.0
    x[4, 1, 2] = 3.0    # a larger max in a later block replaces the count
    monkeypatch.setattr(_histogram, "_BLOCK", 12)  # one token per block
    for t in (x, x.numpy()):
        hists = _histogram.kv_histograms(t)
        assert [h.max_count for h in hists] == [2, 1, 24]
        assert [int(h.counts.sum()) for h in hists] == [24, 24, 24]
        assert hists[2].counts[0] == 24
        gaps, counts = hists[0].sparse()
        assert counts == [22, 2] and gaps == [0, reference_slot(5.0) - 1]
    empty = _histogram.kv_histograms(torch.zeros(0, 3, 4))
    assert [h.sparse() for h in empty] == [([], [])] * 3
    # Merging chunks locally equals one histogram of both, in either order.
    a, b = _histogram.kv_histograms(x[:3]), _histogram.kv_histograms(x[3:])
    for h, whole in enumerate(_histogram.kv_histograms(x)):
        for m in (a[h].merge(b[h]), b[h].merge(a[h])):
            assert (m.counts.tolist(), m.max_count, m.max) == \
                (whole.counts.tolist(), whole.max_count, whole.max)
        m = a[h].merge(empty[h])
        assert (m.counts.tolist(), m.max_count, m.max) == (a[h].counts.tolist(), a[h].max_count,
                                                          a[h].max)


def recipe(**fields) -> pb.Recipe:
    proto = caliper.Recipe(kv="per_head", nvfp4_weights=True, nvfp4_activations=True).to_proto()
    for name, value in fields.items():
        setattr(proto, name, value)
    return proto


def feed(session, seed, batches=2):
    """K/V with an outlier head, exact zeros and tiny values, in three dtypes and two layouts;
    TP 2 on layer 1; inputs as torch and numpy."""
    rng = np.random.default_rng(seed)
    for b in range(batches):
        for layer in range(2):
            k = rng.standard_normal((1, 4, 40, 32)).astype(np.float32)
            v = rng.standard_normal((1, 4, 40, 32)).astype(np.float32) * 0.3
            k[0, 1] *= 9                      # an outlier head
            k[0, 2, :, :4] = 0.0              # exact zeros
            v[0, 3, 5, 7] = 1e-30             # underflow-ish tiny value
            v[0, 0, 3, :3] = 4.0              # ties at the max
            dtype = (torch.bfloat16, torch.float16, torch.float32)[(b + layer) % 3]
            kt, vt = torch.from_numpy(k).to(dtype), torch.from_numpy(v).to(dtype)
            if layer == 0:
                session.observe_kv(layer, kt, vt, batch=b)
            else:  # two TP ranks, two heads each, as [tokens, heads, head_dim]
                for rank in range(2):
                    sl = slice(2 * rank, 2 * rank + 2)
                    session.observe_kv(layer, kt[0, sl].transpose(0, 1).contiguous(),
                                       vt[0, sl].transpose(0, 1).contiguous(), batch=b,
                                       tp_rank=rank, tp_size=2)
        for i, m in enumerate(MODULES):
            x = rng.standard_normal((1, 40, 256)).astype(np.float32)
            x[0, :, 17] *= 40                 # an outlier channel
            if i % 2:
                session.observe_input(m, x.astype(np.float16), batch=b)
            else:
                session.observe_input(m, torch.from_numpy(x).to(torch.bfloat16), batch=b)
    for m in MODULES:
        session.observe_weight(m, torch.from_numpy(
            rng.standard_normal((128, 256)).astype(np.float32) * 0.05).to(torch.bfloat16))


def results(client, session):
    """(GetScales answers for two deployments, report.json without the session's id/name)."""
    session.finalize()
    scales = []
    for tp, rank, conv in ((1, None, "compressed-tensors"), (2, 1, "modelopt")):
        answer = vars(session.scales(tp=tp, rank=rank, formats=["compressed-tensors", "vllm-legacy"],
                                     convention=conv))
        # scales.json names its session: the one part that differs between raw and statistics.
        answer["scales_json"] = answer["scales_json"].replace(session.id.encode(), b"ID")
        scales.append(answer)
    report = json.loads(client.stub.GetReport(pb.ReportRequest(session_id=session.id)).report_json)
    report["session"].pop("id")
    report["session"].pop("name")
    return scales, json.dumps(report, sort_keys=True)


RECIPES = {
    "percentile": dict(kv_observer=pb.KV_OBSERVER_PERCENTILE, kv_percentile=99.9,
                       activation_observer=pb.PERCENTILE, activation_percentile=99.99),
    "mse": dict(kv_observer=pb.KV_OBSERVER_MSE, activation_observer=pb.MSE),
    "histograms": dict(histograms=True),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_statistics_equal_raw_scales_and_report(server, name):
    client = caliper.Client(server.address)
    out = {}
    for mode in ("raw", "statistics"):
        session = client.create_session(CONFIG, recipe(**RECIPES[name]), name=name, mode=mode)
        feed(session, seed=5)
        out[mode] = results(client, session)
        if mode == "statistics":  # tiny chunks: 128 bins per octave make it ~1/10 here
            assert session.wire_bytes < session.tensor_bytes / 5
        session.close()
    assert out["statistics"][0] == out["raw"][0]
    assert out["statistics"][1] == out["raw"][1]
    report = json.loads(out["raw"][1])
    assert report["has_histograms"] is True
    if name != "histograms":  # the observers moved the scales off the absmax
        absmax_only = client.create_session(CONFIG, recipe(), mode="statistics")
        feed(absmax_only, seed=5)
        assert results(client, absmax_only)[0] != out["raw"][0]
        absmax_only.close()


def test_statistics_without_histograms_are_refused(server, monkeypatch):
    """A producer that does not send the histograms never silently changes the results."""
    client = caliper.Client(server.address)
    session = client.create_session(CONFIG, recipe(**RECIPES["mse"]), mode="statistics")
    monkeypatch.setattr(_histogram, "recipe_needs_histograms", lambda r: False)
    session.observe_kv(0, torch.ones(3, 4, 32), torch.ones(3, 4, 32), batch=0)
    session.observe_input(MODULES[0], torch.ones(3, 256), batch=0)
    session.observe_weight(MODULES[0], torch.ones(8, 256))
    with pytest.raises(caliper.RejectedChunksError) as e:
        session.flush()
    text = str(e.value)
    assert text.count("chunk.statistics.histograms: required") == 3, text  # K, V, input
    assert session.refresh().accepted_chunks == 1  # the weight
    session.close()
    # And the reverse: histograms to a session that keeps none.
    plain = client.create_session(CONFIG, recipe(), mode="statistics")
    monkeypatch.setattr(_histogram, "recipe_needs_histograms", lambda r: True)
    plain.observe_kv(0, torch.ones(3, 4, 32), torch.ones(3, 4, 32), batch=0)
    with pytest.raises(caliper.RejectedChunksError) as e:
        plain.flush()
    assert "this session keeps none" in str(e.value)
    plain.close()


def test_histogram_statistics_size_per_head():
    """What a head costs on the wire (bench/README, docs/observers.md): normal K at head_dim 128."""
    rng = np.random.default_rng(0)
    for tokens in (16, 512, 4096):
        x = torch.from_numpy(rng.standard_normal((tokens, 8, 128)).astype(np.float32))
        x = x.to(torch.bfloat16)
        stats = pb.ChunkStatistics()
        _histogram.to_proto(stats, _histogram.kv_histograms(x))
        per_head = stats.ByteSize() / 8
        # 128 bins per octave: about 1.4 KiB at 16 tokens, 3 KiB at 512, 4.3 KiB at 4096.
        assert per_head < 5 * 1024, (tokens, per_head)
        assert math.isfinite(per_head)
