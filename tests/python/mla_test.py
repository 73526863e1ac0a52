"""MLA capture on transformers' real DeepseekV3 (tiny random config, no downloads) against a
real caliper-server: the hooks stream what the engine caches (kv_c_normed and k_pe after RoPE,
which is also what transformers' own cache stores for this model), the scale is the max of both
parts over 448, statistics equal raw, and the files hold it under the names vLLM loads."""
import json

import pytest
import torch
import transformers
from safetensors import safe_open

import caliper
import caliper.hooks

RECIPE = caliper.Recipe(kv="per_tensor")
SAMPLES = 3
LAYERS = 2


def tiny_deepseek(seed=0, dtype="float32"):
    torch.manual_seed(seed)
    cfg = transformers.DeepseekV3Config(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=12, vocab_size=256,
        max_position_embeddings=256)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    model = transformers.DeepseekV3ForCausalLM(cfg).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.08)
        # k_pe's rows of kv_a_proj_with_mqa scaled up: the rope part exceeds the latent (as in
        # the deployments where a latent-only scale saturated k_pe).
        for layer in model.model.layers:
            layer.self_attn.kv_a_proj_with_mqa.weight[16:] *= 6
    return model, json.loads(cfg.to_json_string())


def samples(n=SAMPLES, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (1, 10 + 3 * i), generator=g) for i in range(n)]


def cached_absmax(model, config, data):
    """Per layer (kv_c_normed, k_pe) absmax from what transformers' DynamicCache stores: for
    DeepseekV3 its keys are kv_c_normed and its values k_pe after RoPE."""
    latent, rope = [0.0] * LAYERS, [0.0] * LAYERS
    with torch.no_grad():
        for ids in data:
            cache = transformers.DynamicCache(config=model.config)
            model(ids, past_key_values=cache, use_cache=True)
            for i in range(LAYERS):
                assert cache.layers[i].keys.shape[-1] == config["kv_lora_rank"]
                assert cache.layers[i].values.shape[-1] == config["qk_rope_head_dim"]
                latent[i] = max(latent[i], cache.layers[i].keys.abs().max().item())
                rope[i] = max(rope[i], cache.layers[i].values.abs().max().item())
    return latent, rope


def capture(server, model, config, data, mode, out, recipe=RECIPE):
    session = caliper.Client(server.address).create_session(config, recipe, mode=mode)
    handle = caliper.hooks.attach(model, session)
    with torch.no_grad():
        for ids in data:
            model(ids, use_cache=False)
    handle.detach()
    assert handle.kv_layers == list(range(LAYERS))
    session.finalize()
    scales = session.scales(tp=1, out=out, formats=["compressed-tensors"])
    return session, scales


def test_hooks_stream_what_is_cached(server, tmp_path):
    model, config = tiny_deepseek()
    data = samples()
    latent, rope = cached_absmax(model, config, data)
    assert all(r > l for l, r in zip(latent, rope))  # the rope part is the larger here
    session, scales = capture(server, model, config, data, "raw", tmp_path / "raw")
    assert session.model.is_mla and session.model.num_kv_heads == 1
    assert session.model.head_dim == 24
    doc = json.loads((tmp_path / "raw" / "scales.json").read_text())
    for i, layer in enumerate(doc["kv_cache"]["layers"]):
        entry = max(latent[i], rope[i])
        assert layer["mla_kv_c_normed_absmax"] == pytest.approx(latent[i], rel=1e-6)
        assert layer["mla_k_pe_absmax"] == pytest.approx(rope[i], rel=1e-6)
        assert layer["k_scale"][0] == pytest.approx(entry / 448, rel=1e-6)
        assert layer["v_scale"] == layer["k_scale"]
        # The RPC's rows carry the same parts.
        row = scales.kv_layers[i]
        assert row.mla_kv_c_normed_absmax == pytest.approx(latent[i], rel=1e-6)
        assert row.mla_k_pe_absmax == pytest.approx(rope[i], rel=1e-6)
        assert row.k_absmax == [pytest.approx(entry, rel=1e-6)]
    files = {p.name: p for p in (tmp_path / "raw").rglob("*.safetensors")}
    assert files, "no compressed-tensors scale file"
    with safe_open(str(next(iter(files.values()))), "pt") as f:
        for i in range(LAYERS):
            for kind in ("k_proj.k_scale", "v_proj.v_scale"):
                t = f.get_tensor(f"model.layers.{i}.self_attn.{kind}")
                assert list(t.shape) == [1]
                assert t.item() == pytest.approx(max(latent[i], rope[i]) / 448, rel=1e-6)

    # Statistics mode (the producer reduces) gives the same scales bit for bit.
    _, stats = capture(server, model, config, data, "statistics", tmp_path / "stats")
    doc_s = json.loads((tmp_path / "stats" / "scales.json").read_text())
    assert doc_s["kv_cache"]["layers"] == doc["kv_cache"]["layers"]


def test_hooks_leave_the_output_unchanged():
    model, config = tiny_deepseek(seed=3)
    ids = samples(1)[0]

    with torch.no_grad():
        before = model(ids, use_cache=False).logits

    class Recorder:
        def __init__(self):
            from caliper._pb import caliper_pb2 as pb
            self.proto = pb.Session(recipe=RECIPE.to_proto())
            self.mla = []

        def observe_mla(self, layer, kv_c_normed, k_pe, *, batch):
            self.mla.append((layer, tuple(kv_c_normed.shape), tuple(k_pe.shape)))

    rec = Recorder()
    h = caliper.hooks.attach(model, rec)
    with torch.no_grad():
        after = model(ids, use_cache=False).logits
    h.detach()
    assert torch.equal(before, after)
    seq = ids.shape[1]
    assert rec.mla == [(0, (1, seq, 16), (1, seq, 8)), (1, (1, seq, 16), (1, seq, 8))]


def cached_entries(model, data):
    """Per layer, every cached element's |x| (kv_c_normed and k_pe together, f64)."""
    parts = [[] for _ in range(LAYERS)]
    with torch.no_grad():
        for ids in data:
            cache = transformers.DynamicCache(config=model.config)
            model(ids, past_key_values=cache, use_cache=True)
            for i in range(LAYERS):
                for t in (cache.layers[i].keys, cache.layers[i].values):
                    parts[i].append(t.reshape(-1).abs().double())
    return [torch.cat(p) for p in parts]


def fp8_mse(x, scale):
    """Exact mean squared FP8 (e4m3fn, round to nearest, saturating) round-trip error."""
    q = (x / scale).clamp(max=448.0).to(torch.float8_e4m3fn).double() * scale
    return ((x - q) ** 2).mean().item()


@pytest.mark.parametrize("kv_observer", ["mse", "percentile:99"])
def test_histogram_observers_take_the_whole_entry(server, tmp_path, kv_observer):
    """percentile and mse on MLA: one clip point from both cached parts' elements; statistics
    mode (histograms from the producer) gives the raw-mode scales bit for bit."""
    model, config = tiny_deepseek()
    data = samples()
    recipe = caliper.Recipe(kv="per_tensor", kv_observer=kv_observer)
    _, raw = capture(server, model, config, data, "raw", tmp_path / "raw", recipe)
    _, stats = capture(server, model, config, data, "statistics", tmp_path / "stats", recipe)
    doc = json.loads((tmp_path / "raw" / "scales.json").read_text())
    doc_s = json.loads((tmp_path / "stats" / "scales.json").read_text())
    assert doc_s["kv_cache"]["layers"] == doc["kv_cache"]["layers"]
    for i, (layer, x) in enumerate(zip(doc["kv_cache"]["layers"], cached_entries(model, data))):
        scale = layer["k_scale"][0]
        assert layer["v_scale"] == layer["k_scale"]
        absmax = x.max().item()
        assert layer["k_absmax"][0] == pytest.approx(absmax, rel=1e-6)
        if kv_observer == "mse":
            assert fp8_mse(x, scale) <= fp8_mse(x, absmax / 448) * (1 + 1e-9), f"layer {i}"
        else:
            clip = scale * 448
            assert (x > clip * (1 + 1e-6)).double().mean().item() <= 0.01, f"layer {i}"
            # the smallest |x| with at most 1% of the values above it
            exact = torch.sort(x, descending=True).values[int(0.01 * x.numel())].item()
            assert clip <= exact * 2 ** (1 / 128) * (1 + 1e-6), f"layer {i}"
            assert clip < absmax


def test_per_head_and_observe_kv_are_refused(server):
    model, config = tiny_deepseek()
    client = caliper.Client(server.address)
    with pytest.raises(Exception, match="KV_PER_HEAD on an MLA model"):
        client.create_session(config, caliper.Recipe(kv="per_head"))
    session = client.create_session(config, RECIPE)
    with pytest.raises(Exception, match="use observe_mla"):
        session.observe_kv(0, torch.zeros(1, 1, 4, 24), torch.zeros(1, 1, 4, 24), batch=0)
    with pytest.raises(Exception, match="k_pe.shape"):
        session.observe_mla(0, torch.zeros(4, 16), torch.zeros(4, 9), batch=0)


def test_llm_compressor_oneshot_beside_caliper(server, tmp_path):
    """llm-compressor's real oneshot (FP8 KV, per tensor, static_minmax) on the same tiny model
    and samples. With transformers 5 it observes DeepseekV3's cache update, whose key is
    kv_c_normed and value k_pe: its k_scale is the latent's absmax / 448, its v_scale k_pe's.
    An engine that quantizes the whole entry with k_scale (vLLM) then saturates k_pe whenever
    k_pe is the larger part. Caliper's one scale covers both. The decompressed K/V of kv_b_proj
    (what compressed-tensors' DeepSeek support hooked before) are reported too."""
    pytest.importorskip("llmcompressor")
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from tokenizers import Tokenizer, models, pre_tokenizers

    model, config = tiny_deepseek(seed=5)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(256)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0",
                                         pad_token="t0").save_pretrained(model_dir)
    seq = 16
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, 256, (seq,), generator=g).tolist() for _ in range(SAMPLES)]
    data = [torch.tensor([s]) for s in ids]

    latent, rope = cached_absmax(model, config, data)
    decompressed = [0.0] * LAYERS

    def keep(i):
        def hook(_m, _a, out):
            decompressed[i] = max(decompressed[i], out.abs().max().item())
        return hook
    hooks = [layer.self_attn.kv_b_proj.register_forward_hook(keep(i))
             for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        for x in data:
            model(x, use_cache=False)
    for h in hooks:
        h.remove()

    kv = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
          "symmetric": True, "observer": "static_minmax"}
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * seq] * SAMPLES})
    out_dir = tmp_path / "llmc"
    oneshot(model=str(model_dir), dataset=ds, recipe=QuantizationModifier(kv_cache_scheme=kv),
            num_calibration_samples=SAMPLES, max_seq_length=seq, pipeline="basic",
            output_dir=str(out_dir))
    theirs = {}
    for f in out_dir.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                if k.endswith(("k_scale", "v_scale")):
                    theirs[k] = st.get_tensor(k).float().item()

    _, _ = capture(server, model, config, data, "raw", tmp_path / "caliper")
    ours = json.loads((tmp_path / "caliper" / "scales.json").read_text())["kv_cache"]["layers"]
    print("\nlayer | kv_c_normed absmax | k_pe absmax | kv_b_proj out absmax | "
          "llm-compressor k_scale, v_scale | Caliper k_scale = v_scale | k_pe / (448 k_scale)")
    for i in range(LAYERS):
        k = theirs[f"model.layers.{i}.self_attn.k_scale"]
        v = theirs[f"model.layers.{i}.self_attn.v_scale"]
        mine = ours[i]["k_scale"][0]
        print(f"{i} | {latent[i]:.6g} | {rope[i]:.6g} | {decompressed[i]:.6g} | {k:.6g}, {v:.6g}"
              f" | {mine:.6g} | {rope[i] / (448 * k):.3g}")
        # What it observed: the cache update's two tensors, not kv_b_proj's output.
        assert k == pytest.approx(latent[i] / 448, rel=1e-5)
        assert v == pytest.approx(rope[i] / 448, rel=1e-5)
        assert k != pytest.approx(decompressed[i] / 448, rel=1e-2)
        assert mine == pytest.approx(max(k, v), rel=1e-5)
        # The rope part is the larger here: k_scale alone clips k_pe.
        assert rope[i] > 448 * k * 1.5
