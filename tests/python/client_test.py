"""caliper.Client / Session against a real caliper-server: the files `caliper scales` writes,
byte for byte; tensors in every accepted layout; bad tensors refused with the argument and the
field named while the session keeps what it had; in-band rejections; tokens; sessions."""
import json
import os
import pathlib

import numpy as np
import pytest
import torch

import caliper
from conftest import run_cli, scales_doc, short_float

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 256,
          "head_dim": 32, "intermediate_size": 512}
MODULES = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
           "model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj"]


def recipe(**kw):
    base = dict(kv="per_head", nvfp4_weights=True, nvfp4_activations=True)
    base.update(kw)
    return caliper.Recipe(**base)


def feed(session, rng, batches=3, dtype=torch.bfloat16):
    for b in range(batches):
        for layer in range(2):
            k = torch.from_numpy(rng.standard_normal((1, 4, 40, 32)).astype(np.float32)).to(dtype)
            v = torch.from_numpy(rng.standard_normal((1, 4, 40, 32)).astype(np.float32)).to(dtype)
            k[0, 1] *= 7  # an outlier head
            session.observe_kv(layer, k, v, batch=b)
        for m in MODULES:
            session.observe_input(m, torch.from_numpy(
                rng.standard_normal((1, 40, 256)).astype(np.float32)).to(dtype), batch=b)
    for m in MODULES:
        session.observe_weight(m, torch.from_numpy(
            rng.standard_normal((128, 256)).astype(np.float32) * 0.05).to(dtype))


@pytest.mark.parametrize("mode", ["raw", "statistics"])
def test_scales_files_equal_caliper_scales(server, tmp_path, mode):
    client = caliper.Client(server.address)
    session = client.create_session(CONFIG, recipe(), name="files", mode=mode)
    feed(session, np.random.default_rng(1))
    session.finalize()
    formats = ["compressed-tensors", "modelopt", "vllm-legacy"]
    for tp, rank, convention, cache in ((1, None, "compressed-tensors", "fp8"),
                                        (8, 3, "modelopt", "fp8"),
                                        (2, None, "compressed-tensors", "nvfp4")):
        py_dir, cli_dir = tmp_path / f"py{tp}", tmp_path / f"cli{tp}"
        result = session.scales(tp=tp, rank=rank, formats=formats, convention=convention,
                                kv_cache_dtype=cache, out=py_dir)
        args = ["scales", f"--server={server.address}", f"--session={session.id}",
                f"--out={cli_dir}", f"--tp={tp}", f"--convention={convention}",
                f"--kv-cache-dtype={cache}"]
        args += [f"--format={f}" for f in formats]
        if rank is not None:
            args.append(f"--rank={rank}")
        run_cli(*args)
        names = sorted(p.name for p in cli_dir.iterdir())
        assert names == sorted(p.name for p in py_dir.iterdir())
        for name in names:
            assert (py_dir / name).read_bytes() == (cli_dir / name).read_bytes(), name
        assert result.written.scales_json == str(py_dir / "scales.json")
        assert result.tp_size == tp
        doc = json.loads((py_dir / "scales.json").read_text())
        if cache == "nvfp4":  # per-tensor global decode scales of the same absmax
            assert not (py_dir / "kv_cache_calib.json").exists()
            assert doc["kv_cache"]["kv_cache_dtype"] == "nvfp4"
            for layer, fp8 in zip(doc["kv_cache"]["layers"], fp8_layers):
                assert layer["k_absmax"] == [max(fp8["k_absmax"])]
                assert layer["k_scale"][0] == pytest.approx(layer["k_absmax"][0] / 2688, rel=1e-6)
                assert layer["v_scale"][0] == pytest.approx(max(fp8["v_absmax"]) / 2688, rel=1e-6)
        elif tp == 1:
            fp8_layers = doc["kv_cache"]["layers"]


@pytest.mark.parametrize("warmup", [0, 2])
def test_merged_statistics_give_identical_files_and_fewer_messages(server, tmp_path, warmup):
    """Statistics merged on the producer (across chunks and batches: static observers) give
    the same files as one statistic per observe call, and as raw mode, in fewer messages."""
    client = caliper.Client(server.address)
    runs, reports = {}, {}
    for name, mode, merge in (("raw", "raw", 0), ("each", "statistics", 0),
                              ("merged", "statistics", 3), ("one", "statistics", 64)):
        s = client.create_session(CONFIG, recipe(warmup=warmup), name=name, mode=mode,
                                  merge_batches=merge)
        feed(s, np.random.default_rng(5), batches=7)
        s.finalize()
        s.scales(tp=2, out=tmp_path / name, formats=["compressed-tensors"])
        runs[name] = (s.proto.accepted_chunks + s.proto.skipped_warmup_chunks, s.wire_bytes)
        report = json.loads(client.stub.GetReport(
            caliper._pb.caliper_pb2.ReportRequest(session_id=s.id)).report_json)
        report["session"].pop("id"), report["session"].pop("name")
        reports[name] = report
        s.close()
    for name in ("each", "merged", "one"):
        assert scales_doc(tmp_path / name / "scales.json") == \
            scales_doc(tmp_path / "raw" / "scales.json"), name
        for f in ("kv_cache_calib.json", "compressed_tensors_scales.safetensors"):
            assert (tmp_path / name / f).read_bytes() == (tmp_path / "raw" / f).read_bytes()
    # The report too (its minmax estimate reads the per-batch inputs, kept per batch).
    for name in ("each", "merged", "one"):
        assert reports[name]["nvfp4"] == reports["raw"]["nvfp4"], name
        assert {k: v for k, v in reports[name].items() if k != "session"} == \
            {k: v for k, v in reports["raw"].items() if k != "session"}, name
    kv, inputs = 2 * 2, 7 * len(MODULES)  # K and V of 2 layers per batch; inputs stay per batch
    assert runs["each"][0] == 7 * kv + inputs + len(MODULES)
    # K/V: warm-up batches stay apart (the server skips them); the rest merge per window of 3:
    # [0,3) [3,6) [6,7), or 0 | 1 | 2 in [0,3), [3,6), [6,7); the weights join the last.
    assert runs["merged"][0] == {0: 3, 2: 5}[warmup] * kv + inputs + len(MODULES)
    assert runs["one"][0] == (1 + warmup) * kv + inputs + len(MODULES)
    assert runs["one"][1] < runs["merged"][1] < runs["each"][1]


def test_shared_input_reduced_once_unless_modified(server, monkeypatch):
    """q/k/v share one input tensor: its statistic is computed once; modified in place (its
    version changes) or another tensor, it is computed again."""
    client = caliper.Client(server.address)
    s = client.create_session(CONFIG, recipe(nvfp4_weights=False), mode="statistics")
    calls = []
    real = caliper._tensors.range_statistics
    monkeypatch.setattr(caliper._tensors, "range_statistics",
                        lambda *a: calls.append(1) or real(*a))
    x = torch.ones(2, 5, 256)
    for m in MODULES[:3]:
        s.observe_input(m, x, batch=0)
    assert len(calls) == 1
    x.mul_(3)  # in place: a new version
    s.observe_input(MODULES[3], x, batch=0)
    s.observe_input(MODULES[3], x.clone(), batch=1)
    assert len(calls) == 3
    s.finalize()
    amax = {m.module: m.input_amax for m in s.scales().modules}
    assert [amax[m] for m in MODULES] == [1.0, 1.0, 1.0, 3.0]


def test_layouts_give_identical_scales(server, tmp_path):
    """[b,h,s,d], [tokens,h,d], [tokens,h*d], numpy and torch: one result."""
    rng = np.random.default_rng(2)
    k = rng.standard_normal((2, 4, 24, 32)).astype(np.float32)
    v = rng.standard_normal((2, 4, 24, 32)).astype(np.float32)
    k3 = k.transpose(0, 2, 1, 3).reshape(-1, 4, 32)
    v3 = v.transpose(0, 2, 1, 3).reshape(-1, 4, 32)
    client = caliper.Client(server.address)
    docs = []
    for i, (kk, vv) in enumerate([(torch.from_numpy(k), torch.from_numpy(v)), (k3, v3),
                                  (k3.reshape(-1, 128), v3.reshape(-1, 128)),
                                  (torch.from_numpy(k3), v3)]):
        s = client.create_session(CONFIG, caliper.Recipe(kv="per_head"), mode="raw")
        s.observe_kv(0, kk, vv, batch=0)
        s.finalize()
        s.scales(out=tmp_path / str(i))
        docs.append(scales_doc(tmp_path / str(i) / "scales.json"))
    assert all(d == docs[0] for d in docs)
    layer0 = docs[0]["kv_cache"]["layers"][0]
    expect_k = np.abs(k).max(axis=(0, 2, 3))
    assert layer0["k_absmax"] == [short_float(x) for x in expect_k]


def test_bad_tensors_raise_and_session_keeps_what_it_had(server, tmp_path):
    client = caliper.Client(server.address)
    session = client.create_session(CONFIG, recipe(), mode="raw")
    good = torch.ones(1, 4, 8, 32)
    session.observe_kv(0, good, good, batch=0)
    session.flush()
    before = session.refresh()
    cases = [
        (lambda: session.observe_kv(0, good.double(), good, batch=1), "observe_kv: key.dtype"),
        (lambda: session.observe_kv(0, good, torch.ones(1, 3, 8, 32), batch=1),
         "observe_kv: value.shape"),
        (lambda: session.observe_kv(0, good, torch.ones(8, 4, 31), batch=1),
         "observe_kv: value.shape"),
        (lambda: session.observe_kv(0, torch.ones(8, 100), good, batch=1), "observe_kv: key.shape"),
        (lambda: session.observe_kv(5, good, good, batch=1), "observe_kv: layer 5"),
        (lambda: session.observe_kv(0, good, good, batch=-1), "observe_kv: batch"),
        (lambda: session.observe_kv(0, good, good, batch=1, tp_rank=2, tp_size=2), "tp_rank"),
        (lambda: session.observe_kv(0, [[1.0]], good, batch=1), "observe_kv: key"),
        (lambda: session.observe_weight("m", torch.ones(2, 2, 2)), "observe_weight: w.shape"),
        (lambda: session.observe_weight("", torch.ones(2, 2)), "observe_weight: module"),
        (lambda: session.observe_input("m", np.ones((2, 2), np.int32), batch=0),
         "observe_input: x.dtype"),
    ]
    for call, expected in cases:
        with pytest.raises(caliper.TensorError) as info:
            call()
        assert expected in str(info.value)
    session.flush()
    after = session.refresh()
    assert after.accepted_chunks == before.accepted_chunks
    assert after.rejected_chunks == before.rejected_chunks == 0


def test_statistics_mode_refuses_nan_before_sending(server):
    client = caliper.Client(server.address)
    session = client.create_session(CONFIG, recipe(), mode="statistics")
    bad = torch.ones(1, 4, 8, 32)
    bad[0, 2, 3, 1] = float("nan")
    with pytest.raises(caliper.TensorError, match="observe_kv: value: NaN or Inf in kv head 2"):
        session.observe_kv(0, torch.ones(1, 4, 8, 32), bad, batch=0)
    with pytest.raises(caliper.TensorError, match="observe_weight: w: NaN or Inf"):
        session.observe_weight(MODULES[0], torch.full((4, 4), float("inf")))
    session.flush()
    assert session.refresh().accepted_chunks == 0


def test_in_band_rejection_names_tensor_and_server_message(server):
    client = caliper.Client(server.address)
    session = client.create_session(CONFIG, recipe(), mode="raw")
    good = torch.ones(1, 4, 8, 32)
    bad = good.clone()
    bad[0, 0, 0, 0] = float("inf")
    session.observe_kv(1, good, bad, batch=0)
    session.observe_input(MODULES[0], torch.ones(2, 256), batch=0)
    with pytest.raises(caliper.RejectedChunksError) as info:
        session.flush()
    text = str(info.value)
    assert "layer 1 value rows 0..8 batch 0" in text and "INVALID_ARGUMENT" in text
    assert "NaN/Inf" in text or "non-finite" in text or "Inf" in text
    status = session.refresh()
    assert status.accepted_chunks == 2 and status.rejected_chunks == 1
    session.flush()  # reported once


def test_in_band_rejection_of_a_merged_statistic_names_its_batches(server):
    client = caliper.Client(server.address)
    session = client.create_session(CONFIG, recipe(kv="off"), mode="statistics")
    for b in range(3):
        session.observe_input(MODULES[0], torch.ones(2, 256), batch=b)
        # The recipe has kv off: the server refuses the merged K and V statistics.
        session.observe_kv(0, torch.ones(1, 4, 8, 32), torch.ones(1, 4, 8, 32), batch=b)
    with pytest.raises(caliper.RejectedChunksError) as info:
        session.flush()
    text = str(info.value)
    assert "layer 0 key batches 0..2 (3 observations merged) (sequence 2): " \
        "INVALID_ARGUMENT: chunk.kind" in text, text
    assert "layer 0 value batches 0..2 (3 observations merged)" in text, text
    status = session.refresh()
    assert status.accepted_chunks == 3 and status.rejected_chunks == 2


def test_unknown_session_is_a_stream_error(server):
    client = caliper.Client(server.address)
    session = client.create_session(CONFIG, recipe(), mode="raw")
    client.delete_session(session.id)
    with pytest.raises(Exception) as info:
        session.observe_kv(0, torch.ones(1, 4, 8, 32), torch.ones(1, 4, 8, 32), batch=0)
        session.flush()
    assert "NOT_FOUND" in str(info.value)


def test_small_queue_and_many_chunks(server, tmp_path):
    """Backpressure: a queue and retain bound far below the data still delivers all of it."""
    client = caliper.Client(server.address)
    s = client.create_session(CONFIG, caliper.Recipe(kv="per_tensor"), mode="raw",
                              chunk_bytes=4096, queue_bytes=16384, retain_bytes=32768)
    rng = np.random.default_rng(3)
    peak = 0.0
    for b in range(10):
        k = rng.standard_normal((64, 4, 32)).astype(np.float32)
        peak = max(peak, float(np.abs(k).max()))
        s.observe_kv(0, k, k, batch=b)
        assert s.producer(0).queued_bytes <= 16384 + 32768 + 8192
    s.finalize()
    r = s.scales()
    assert r.kv_layers[0].k_absmax[0] == np.float32(peak)
    assert s.proto.accepted_chunks == 10 * 2 * (64 * 4 * 32 * 4 // 4096)


def test_sessions_list_get_delete(server):
    client = caliper.Client(server.address)
    a = client.create_session(CONFIG, recipe(), name="a")
    ids = [s.id for s in client.list_sessions()]
    assert a.id in ids
    assert client.get_session(a.id).name == "a"
    again = client.session(a.id)
    assert again.model.num_kv_heads == 4
    a.delete()
    assert a.id not in [s.id for s in client.list_sessions()]


def test_token_from_environment(make_server, tmp_path, monkeypatch):
    tokens = tmp_path / "tokens"
    tokens.write_text("team-a secret-a-0123456789\n")
    srv = make_server(extra=[f"--tokens_file={tokens}", "--allow_plaintext_tokens"])
    monkeypatch.delenv("CALIPER_TOKEN", raising=False)
    import grpc
    with pytest.raises(grpc.RpcError) as info:
        caliper.Client(srv.address, attempts=1).list_sessions()
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    monkeypatch.setenv("CALIPER_TOKEN", "secret-a-0123456789\n")
    assert caliper.Client(srv.address).list_sessions() == []
    assert caliper.Client(srv.address, token="secret-a-0123456789").list_sessions() == []


@pytest.mark.parametrize("merge", [0, 3])
def test_minmax_observers_statistics_equal_raw(server, tmp_path, merge):
    """Moving-average observers (kv_observer minmax: per-head min/max per batch; activation
    observer minmax: per 16-column group per batch): statistics producers, merged within a
    batch or not, give the raw producer's files bit for bit."""
    client = caliper.Client(server.address)
    r = recipe(kv_observer="minmax", observer="minmax", averaging_constant=0.25)
    for name, mode in (("raw", "raw"), ("stats", "statistics")):
        s = client.create_session(CONFIG, r, name=name, mode=mode, merge_batches=merge)
        rng = np.random.default_rng(8)
        feed(s, rng, batches=5)
        # Two pieces of one batch (merged on the producer when merge > 0).
        s.observe_input(MODULES[0], torch.from_numpy(
            rng.standard_normal((7, 256)).astype(np.float32) * 9).to(torch.bfloat16), batch=4)
        s.finalize()
        s.scales(tp=2, out=tmp_path / name, formats=["compressed-tensors"])
        s.close()
    assert scales_doc(tmp_path / "stats" / "scales.json") == scales_doc(tmp_path / "raw" / "scales.json")
    for f in ("kv_cache_calib.json", "compressed_tensors_scales.safetensors"):
        assert (tmp_path / "stats" / f).read_bytes() == (tmp_path / "raw" / f).read_bytes()


@pytest.mark.parametrize("kv_observer,act_observer", [
    ("percentile:99.9", "mse"), ("static_minmax", "static_minmax")])
def test_merged_histograms_give_identical_files(server, tmp_path, kv_observer, act_observer):
    """Sessions that keep histograms (percentile / mse observers, or histograms on): statistics
    with their bins merged on the producer give the raw producer's files."""
    client = caliper.Client(server.address)
    runs = {}
    for name, mode, merge in (("raw", "raw", 0), ("each", "statistics", 0),
                              ("merged", "statistics", 4)):
        r = caliper.Recipe(kv="per_head", nvfp4_weights=True, nvfp4_activations=True,
                           kv_observer=kv_observer, observer=act_observer, histograms=True)
        s = client.create_session(CONFIG, r, name=name, mode=mode, merge_batches=merge)
        feed(s, np.random.default_rng(12), batches=5)
        s.finalize()
        s.scales(tp=1, out=tmp_path / name, formats=["compressed-tensors"])
        runs[name] = s.proto.accepted_chunks
        s.close()
    for name in ("each", "merged"):
        assert scales_doc(tmp_path / name / "scales.json") == \
            scales_doc(tmp_path / "raw" / "scales.json"), name
        for f in ("kv_cache_calib.json", "compressed_tensors_scales.safetensors"):
            assert (tmp_path / name / f).read_bytes() == (tmp_path / "raw" / f).read_bytes()
    # Across batches only for the static observers; percentile / mse keep batches apart.
    if kv_observer == "static_minmax":
        assert runs["merged"] < runs["each"]
    else:
        assert runs["merged"] == runs["each"]


def test_fleet_with_attention_q_publishes_the_query_scale_of_its_window(server):
    """A fleet whose recipe observes the query: caliper.refit's transformers hooks stream the
    query after RoPE into the window, and the version's q_scale is each KV group's absmax / 448,
    as a recorder of the same forwards computes it; the next window, with the query twice as
    large, drifts on Q and names it."""
    from caliper import fleets
    from caliper.hooks import attach
    from conftest import Recorder, tiny_model

    class QueryRecorder(Recorder):
        def __init__(self, recipe):
            super().__init__(recipe)
            self.queries = []

        def observe_query(self, layer, query, *, batch, tp_rank=0, tp_size=1):
            self.queries.append((layer, query.detach().clone()))

    model, config = tiny_model("llama")
    recipe = caliper.Recipe(kv="per_head", attention="q")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (1, 12), generator=g) for _ in range(3)]
    rec = QueryRecorder(recipe.to_proto())
    with attach(model, rec), torch.no_grad():
        for ids in prompts:
            model(ids, use_cache=False)
    expected = {}  # layer -> per KV group absmax over every prompt ([b, 4 q heads, s, d])
    for layer, q in rec.queries:
        groups = q.abs().transpose(0, 1).reshape(2, -1).amax(dim=1)
        expected[layer] = torch.maximum(expected.get(layer, groups), groups)

    client = caliper.Client(server.address)
    fleets.create_fleet(client, "f", config, recipe, min_tokens=8)
    window = caliper.refit(model, "f", prompts, weight_version="step-1", client=client)
    assert fleets.close_window(client, "f", session_id=window.session_id).version == 1
    first = next(fleets.watch_scales(client, "f", timeout=30))
    for layer in first.scales.kv_layers:
        want = expected[layer.layer].numpy()
        assert layer.q_absmax == pytest.approx(want.tolist(), rel=0, abs=0)
        assert layer.q_scale == pytest.approx((want / np.float32(448)).tolist(), rel=1e-7)

    # The last layer's query doubles (its q_proj's weights; nothing it feeds is observed), K
    # and V do not: the version moves on that Q alone.
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight.mul_(2)
    window = caliper.refit(model, "f", prompts, weight_version="step-1", client=client)
    closed = fleets.close_window(client, "f", session_id=window.session_id)
    assert closed.version == 2 and closed.decision == "drift", closed.detail
    assert "layer 1 Q head " in closed.detail and "moved by 1 " in closed.detail, closed.detail
    second = next(fleets.watch_scales(client, "f", after_version=1, timeout=30))
    a, b = first.scales.kv_layers, second.scales.kv_layers
    assert b[1].q_scale == pytest.approx([2 * x for x in a[1].q_scale], rel=1e-6)
    assert (b[0].q_scale, b[0].k_scale, b[1].k_scale, b[1].v_scale) == (
        a[0].q_scale, a[0].k_scale, a[1].k_scale, a[1].v_scale)
