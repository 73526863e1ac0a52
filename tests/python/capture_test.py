"""Capture hooks on tiny random transformers models against a real caliper-server: the scales
equal `caliper calibrate` on dumps of the same tensors and what torch computes on them;
statistics mode equals raw mode bit for bit; kill -9 + restart of a --state_dir server in the
middle of a capture still gives the exact scales."""
import json
import os
import pathlib
import threading
import time

import numpy as np
import pytest
import torch
import transformers

import caliper
import caliper.hooks
from conftest import (Recorder, run_cli, scales_doc, short_float, tiny_model, write_dumps,
                      write_weights)

RECIPE = caliper.Recipe(kv="per_head", nvfp4_weights=True, nvfp4_activations=True)
SAMPLES = 4
MODES = ("raw", "statistics")


def samples(vocab, n=SAMPLES, seed=0, seq=(12, 20)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, int(torch.randint(seq[0], seq[1], (1,), generator=g))),
                          generator=g) for _ in range(n)]


def run(model, data):
    with torch.no_grad():
        for ids in data:
            model(ids, use_cache=False)


def capture(address, model, config, data, mode, tmp, name, **session_kw):
    client = caliper.Client(address)
    session = client.create_session(config, RECIPE, mode=mode, name=name, **session_kw)
    handle = caliper.hooks.attach(model, session)
    run(model, data)
    handle.detach()
    session.finalize()
    session.scales(tp=1, out=tmp / name, formats=["compressed-tensors"])
    return session, handle


@pytest.mark.parametrize("kind", ["llama", "qwen3", "mixtral", "qwen3_moe"])
def test_hooks_equal_calibrate_and_torch(server, tmp_path, kind):
    model, config = tiny_model(kind)
    data = samples(config["vocab_size"])
    # What the hooks hand over, recorded, and written as `caliper calibrate` dumps.
    rec = Recorder(RECIPE.to_proto())
    h = caliper.hooks.attach(model, rec)
    run(model, data)
    h.detach()
    assert h.forwards == SAMPLES and sorted(set(l for l, *_ in rec.kv)) == [0, 1]
    if kind in ("mixtral", "qwen3_moe"):
        experts = [m for m in rec.weights if ".experts." in m]
        assert len(experts) == 2 * 4 * 3, experts
        assert not any(m.endswith(".gate") for m in rec.weights)
        if kind == "mixtral":
            assert "model.layers.0.block_sparse_moe.experts.3.w2" in rec.weights
        else:
            assert "model.layers.1.mlp.experts.0.up_proj" in rec.weights
    assert "lm_head" not in rec.weights
    write_dumps(rec, tmp_path / "dumps")
    write_weights(rec, tmp_path / "ckpt")
    (tmp_path / "config.json").write_text(json.dumps(config))
    run_cli("calibrate", f"--server={server.address}", f"--model={tmp_path / 'config.json'}",
            f"--tensors={tmp_path / 'dumps'}", f"--weights={tmp_path / 'ckpt'}", "--nvfp4",
            "--kv=per_head", "--format=compressed-tensors", f"--out={tmp_path / 'cli'}")
    expected = scales_doc(tmp_path / "cli" / "scales.json")

    for mode in MODES:
        capture(server.address, model, config, data, mode, tmp_path, mode)
        got = scales_doc(tmp_path / mode / "scales.json")
        assert got == expected, mode
        for f in ("kv_cache_calib.json", "compressed_tensors_scales.safetensors"):
            assert (tmp_path / mode / f).read_bytes() == (tmp_path / "cli" / f).read_bytes()

    # And what torch computes directly on the captured tensors.
    for layer in expected["kv_cache"]["layers"]:
        ks = torch.stack([k.abs().amax(dim=(0, 2, 3)) for l, _, k, _ in rec.kv
                          if l == layer["layer"]]).amax(0)
        assert layer["k_absmax"] == [short_float(x) for x in ks.tolist()]
    mods = expected["nvfp4"]["modules"]
    for m, w in rec.weights.items():
        assert mods[m]["weight_amax"] == short_float(w.abs().max().item()) or \
            mods[m]["fused_group"], m
    for m in {m for m, _, _ in rec.inputs}:
        amax = max(x.abs().max().item() for mm, _, x in rec.inputs if mm == m)
        assert mods[m]["input_amax"] == short_float(amax), m


@pytest.mark.parametrize("kind,attn", [("llama", "eager"), ("llama", "sdpa"),
                                       ("qwen3_moe", "eager")])
def test_hooks_leave_the_model_output_unchanged(kind, attn):
    """The wrapping attention function keeps the model's own mask (causal): logits with the
    hooks attached equal those without, bit for bit, for eager and sdpa attention."""
    model, config = tiny_model(kind, seed=13)
    model.config._attn_implementation = attn
    data = samples(config["vocab_size"], n=2, seed=13)
    with torch.no_grad():
        plain = [model(ids, use_cache=False).logits for ids in data]
        h = caliper.hooks.attach(model, Recorder(RECIPE.to_proto()))
        hooked = [model(ids, use_cache=False).logits for ids in data]
        h.detach()
        after = [model(ids, use_cache=False).logits for ids in data]
    assert model.config._attn_implementation == attn
    for a, b, c in zip(plain, hooked, after):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_bf16_model_statistics_equal_raw(server, tmp_path):
    model, config = tiny_model("llama", dtype="bfloat16", seed=3)
    data = samples(config["vocab_size"], seed=3)
    capture(server.address, model, config, data, "raw", tmp_path, "raw")
    capture(server.address, model, config, data, "statistics", tmp_path, "stats")
    for f in ("scales.json", "kv_cache_calib.json", "compressed_tensors_scales.safetensors"):
        a, b = (tmp_path / "raw" / f), (tmp_path / "stats" / f)
        if f == "scales.json":
            assert scales_doc(a) == scales_doc(b)
        else:
            assert a.read_bytes() == b.read_bytes(), f


@pytest.mark.parametrize("mode", ["raw", "statistics"])
def test_kill9_restart_mid_capture_is_exact(make_server, tmp_path, mode):
    model, config = tiny_model("llama", seed=5)
    data = samples(config["vocab_size"], n=12, seed=5, seq=(40, 60))
    reference = make_server()
    capture(reference.address, model, config, data, mode, tmp_path, "reference")
    reference.stop()

    srv = make_server(state_dir=str(tmp_path / "state"))
    client = caliper.Client(srv.address)
    # Small streams, so several are acknowledged (durable) before the kill; statistics merged
    # over 2 batches, so merged statistics are sent, retained and resumed across the kills.
    session = client.create_session(config, RECIPE, mode=mode, retain_bytes=64 << 10,
                                    chunk_bytes=16 << 10, merge_batches=2)
    handle = caliper.hooks.attach(model, session)
    with torch.no_grad():
        for i, ids in enumerate(data):
            model(ids, use_cache=False)
            if i in (3, 8):
                time.sleep(0.3)
                srv.kill9()
                srv.start()
    handle.detach()
    session.finalize()
    session.scales(tp=1, out=tmp_path / "killed", formats=["compressed-tensors"])
    assert scales_doc(tmp_path / "killed" / "scales.json") == \
        scales_doc(tmp_path / "reference" / "scales.json")
    assert (tmp_path / "killed" / "compressed_tensors_scales.safetensors").read_bytes() == \
        (tmp_path / "reference" / "compressed_tensors_scales.safetensors").read_bytes()


def test_caliper_capture_cli(server, tmp_path):
    """caliper-capture on a saved tiny Llama gives the scales of the hooks on the same samples."""
    import subprocess
    import sys
    model, config = tiny_model("llama", seed=7)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    data = samples(config["vocab_size"], seed=7)
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps([d[0].tolist() for d in data]))
    exe = pathlib.Path(sys.executable).parent / "caliper-capture"
    args = [str(exe), f"--server={server.address}", f"--model={model_dir}",
            f"--token-ids={ids_file}", "--kv=per_head", "--nvfp4",
            "--format=compressed-tensors", "--model-device=cpu"]
    out = subprocess.run(args + [f"--out={tmp_path / 'cap'}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "wrote" in out.stdout and "statistics mode" in out.stdout
    session_id = out.stdout.split()[1]
    # The reference: the hooks in raw mode on the same model (loaded as caliper-capture loads
    # it: eager attention) and samples.
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype="auto", attn_implementation="eager").eval()
    capture(server.address, loaded, config, data, "raw", tmp_path, "ref")
    assert scales_doc(tmp_path / "cap" / "scales.json") == scales_doc(tmp_path / "ref" / "scales.json")
    # Re-running into the same session (a crashed capture restarted) adds nothing.
    client = caliper.Client(server.address)
    before = client.get_session(session_id)
    again = subprocess.run([str(exe), f"--server={server.address}", f"--model={model_dir}",
                            f"--token-ids={ids_file}", f"--session={session_id}",
                            f"--out={tmp_path / 'cap2'}", "--nvfp4", "--model-device=cpu"],
                           capture_output=True, text=True)
    # The session is finalized: a resumed producer sends nothing, so finalize and scales work.
    assert again.returncode == 0, again.stderr
    assert client.get_session(session_id).accepted_chunks == before.accepted_chunks
    # Usage errors: exit 2, one line, nothing written.
    bad = subprocess.run([str(exe), f"--server={server.address}", f"--model={model_dir}",
                          f"--token-ids={ids_file}", "--kv=sideways", f"--out={tmp_path / 'x'}"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--kv" in bad.stderr and not (tmp_path / "x").exists()
    bad = subprocess.run([str(exe), f"--server={server.address}", f"--model={tmp_path}",
                          f"--token-ids={ids_file}", f"--out={tmp_path / 'x'}"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "config.json" in bad.stderr


def save_tokenizer(path, vocab):
    """Word-level: "t<i>" is token i (so a text's ids are known exactly)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0",
                                         pad_token="t0").save_pretrained(path)


def test_caliper_capture_text_and_flags(server, tmp_path):
    """--text with the model's tokenizer equals --token-ids of the same ids (raw mode, too);
    the deployment/format/recipe flags write what `caliper scales` writes for the session;
    usage errors exit 2 naming the flag, server refusals exit 1."""
    import subprocess
    import sys
    model, config = tiny_model("llama", seed=9)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    save_tokenizer(model_dir, config["vocab_size"])
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, config["vocab_size"], (70,), generator=g).tolist()
    text = tmp_path / "corpus.txt"
    text.write_text(" ".join(f"t{i}" for i in ids) + "\n")
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps([ids[i * 12:(i + 1) * 12] for i in range(5)]))
    exe = pathlib.Path(sys.executable).parent / "caliper-capture"
    base = [str(exe), f"--server={server.address}", f"--model={model_dir}", "--nvfp4",
            "--model-device=cpu"]

    def cap(*args):
        return subprocess.run(base + list(map(str, args)), capture_output=True, text=True)

    a = cap(f"--text={text}", "--samples=5", "--seq-len=12", f"--out={tmp_path / 'text'}")
    assert a.returncode == 0, a.stderr
    b = cap(f"--token-ids={ids_file}", "--mode=raw", f"--out={tmp_path / 'ids'}")
    assert b.returncode == 0, b.stderr
    assert scales_doc(tmp_path / "text" / "scales.json") == \
        scales_doc(tmp_path / "ids" / "scales.json")

    token = tmp_path / "token"
    token.write_text("\n")
    flags = ["--tp=2", "--convention=modelopt", "--format=modelopt", "--format=vllm-legacy",
             "--fp8=e4m3fnuz", "--warmup=1", "--observer=static_minmax", "--kv=per-tensor",
             "--name=flags", "--merge-batches=0", "--first-batch=3", "--compat=llm-compressor",
             "--kv-observer=minmax"]
    c = cap(f"--text={text}", "--samples=4", "--seq-len=16", f"--out={tmp_path / 'flags'}",
            *flags)
    assert c.returncode == 0, c.stderr
    session_id = c.stdout.split()[1]
    session = caliper.Client(server.address).get_session(session_id)
    assert session.name == "flags" and session.recipe.fp8 == "e4m3fnuz"
    assert session.recipe.warmup == 1 and session.skipped_warmup_chunks == 0  # batches 3..6
    assert session.recipe.compat == "llm-compressor"
    assert session.recipe.kv_observer == "minmax"
    run_cli("scales", f"--server={server.address}", f"--session={session_id}", "--tp=2",
            "--convention=modelopt", "--format=modelopt", "--format=vllm-legacy",
            f"--out={tmp_path / 'cli'}")
    names = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "flags").iterdir())
    for name in names:
        assert (tmp_path / "cli" / name).read_bytes() == \
            (tmp_path / "flags" / name).read_bytes(), name

    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps(config))
    usage = [
        ([f"--text={text}", f"--out={tmp_path / 'x'}"], "--text needs --samples"),
        ([f"--token-ids={ids_file}", "--samples=2", f"--out={tmp_path / 'x'}"],
         "--samples and --seq-len go with --text"),
        ([f"--text={text}", "--samples=9", "--seq-len=9", f"--out={tmp_path / 'x'}"],
         "has 70 tokens, 81 needed"),
        ([f"--text={tmp_path / 'missing.txt'}", "--samples=1", "--seq-len=1",
          f"--out={tmp_path / 'x'}"], "--text:"),
        ([f"--token-ids={ids_file}", "--engine=vllm", f"--out={tmp_path / 'x'}"],
         "--engine vllm"),
        ([f"--token-ids={ids_file}", f"--token-file={token}", f"--out={tmp_path / 'x'}"],
         "is empty"),
        ([f"--token-ids={ids_file}", f"--token-file={token}", "--token=abc",
          f"--out={tmp_path / 'x'}"], "give one of them"),
        ([f"--token-ids={ids_file}", "--merge-batches=-1", f"--out={tmp_path / 'x'}"],
         "--merge-batches"),
        ([f"--token-ids={ids_file}", "--tp=0", f"--out={tmp_path / 'x'}"], "--tp"),
        ([f"--token-ids={ids_file}", "--convention=ct", f"--out={tmp_path / 'x'}"],
         "--convention"),
        ([f"--token-ids={ids_file}", "--kv-observer=ema", f"--out={tmp_path / 'x'}"],
         "--kv-observer: expected static_minmax"),
        ([f"--token-ids={tmp_path / 'corpus.txt'}", f"--out={tmp_path / 'x'}"], "--token-ids"),
    ]
    for args, expected in usage:
        r = cap(*args)
        assert r.returncode == 2 and expected in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([str(exe), f"--server={server.address}", f"--model={tmp_path / 'bare'}",
                        f"--text={text}", "--samples=1", "--seq-len=4", f"--out={tmp_path / 'x'}"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no tokenizer in" in r.stderr, r.stderr
    r = subprocess.run([str(exe), f"--server={server.address}", f"--model={model_dir}",
                        "--kv=off", f"--token-ids={ids_file}", f"--out={tmp_path / 'x'}"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "nothing to calibrate" in r.stderr, r.stderr
    if not torch.cuda.is_available():
        r = cap(f"--token-ids={ids_file}", "--model-device=cuda", f"--out={tmp_path / 'x'}")
        assert r.returncode == 2 and "no CUDA device" in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()
    # The server refuses: an unknown session is exit 1 with the server's message.
    r = cap(f"--token-ids={ids_file}", "--session=0123456789abcdef", f"--out={tmp_path / 'x'}")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_moe_all_experts(server, tmp_path, kind):
    """moe_experts="all": every expert observes every token of the batch (as llm-compressor
    calibrates) while the model's output stays the routed one; the routed tokens are a subset
    of them; statistics equal raw; the expert input scales are the tokens' absmax."""
    model, config = tiny_model(kind, seed=11)
    data = samples(config["vocab_size"], seed=11)
    with torch.no_grad():
        plain = [model(ids, use_cache=False).logits for ids in data]
    experts = {n: m for n, m in model.named_modules() if caliper.hooks._is_fused_experts(m)}
    assert len(experts) == 2
    seen = []  # (experts path, hidden) per experts call, in order

    def spy(name):
        return lambda _m, args: seen.append((name, args[0].detach().clone()))
    spies = [m.register_forward_pre_hook(spy(n)) for n, m in experts.items()]
    recs = {}
    for which in ("routed", "all"):
        rec = Recorder(RECIPE.to_proto())
        h = caliper.hooks.attach(model, rec, moe_experts=which)
        with torch.no_grad():
            logits = [model(ids, use_cache=False).logits for ids in data]
        h.detach()
        assert all(torch.equal(a, b) for a, b in zip(logits, plain)), which
        recs[which] = rec
    for s in spies:
        s.remove()
    hidden = seen[len(seen) // 2:]  # the "all" run's calls
    names = {path: caliper.hooks.expert_names(config["model_type"], path) for path in experts}
    by_module = {}
    for which, rec in recs.items():
        for module, batch, x in rec.inputs:
            by_module.setdefault((which, module), []).append((batch, x))
    for call, (path, h_states) in enumerate(hidden):
        batch = call // len(experts)
        for e in range(4):
            gate, up, down = names[path](e)
            got = dict(by_module[("all", gate)])[batch]
            assert torch.equal(got, h_states)  # every token
            assert torch.equal(dict(by_module[("all", up)])[batch], h_states)
            assert dict(by_module[("all", down)])[batch].shape[0] == h_states.shape[0]
            routed = dict(by_module.get(("routed", gate), [])).get(batch)
            if routed is not None:  # the routed tokens are rows of all of them
                rows = {tuple(r.tolist()) for r in h_states}
                assert all(tuple(r.tolist()) in rows for r in routed)
    # Against the server: statistics == raw, and the gate inputs' scale is the tokens' absmax.
    for mode in MODES:
        client = caliper.Client(server.address)
        session = client.create_session(config, RECIPE, mode=mode, name=f"all-{mode}")
        h = caliper.hooks.attach(model, session, moe_experts="all")
        run(model, data)
        h.detach()
        session.finalize()
        session.scales(tp=1, out=tmp_path / mode)
    doc = scales_doc(tmp_path / "statistics" / "scales.json")
    assert doc == scales_doc(tmp_path / "raw" / "scales.json")
    mods = doc["nvfp4"]["modules"]
    for path in experts:
        amax = max(h_states.abs().max().item() for p, h_states in hidden if p == path)
        for e in range(4):
            gate = names[path](e)[0]
            assert mods[gate]["input_amax"] == short_float(amax), gate


def test_refused_attach_leaves_nothing_installed(server):
    """A weight the session refuses (NaN) makes attach raise naming it, with no hook left."""
    model, config = tiny_model("llama", seed=17)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    session = caliper.Client(server.address).create_session(config, RECIPE)
    with pytest.raises(caliper.TensorError, match="observe_weight: w: NaN or Inf"):
        caliper.hooks.attach(model, session)
    assert not str(model.config._attn_implementation).startswith("caliper_")
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    assert not caliper.hooks._CAPTURES
    caliper.hooks.attach(model, session, weights=False).detach()  # attachable again


@pytest.mark.parametrize("kind,compat", [("llama", ""), ("qwen3_moe", ""),
                                         ("llama", "llm-compressor")])
def test_minmax_observers_hooks_statistics_equal_raw(server, tmp_path, kind, compat):
    """A minmax session (kv_observer minmax, activation observer minmax; MoE experts are
    averaged tensor-wide by the server; with llm-compressor's arithmetic too) gives the same
    files from statistics and raw producers through the hooks, merged or not, in BF16."""
    model, config = tiny_model(kind, dtype="bfloat16", seed=19)
    config["dtype"] = "bfloat16"  # compat llm-compressor computes in the model's dtype
    data = samples(config["vocab_size"], n=6, seed=19)
    recipe = caliper.Recipe(kv="per_head", nvfp4_weights=True, nvfp4_activations=True,
                            kv_observer="minmax", observer="minmax", averaging_constant=0.2,
                            compat=compat)
    for name, mode, merge in (("raw", "raw", 0), ("each", "statistics", 0),
                              ("merged", "statistics", 4)):
        session = caliper.Client(server.address).create_session(
            config, recipe, mode=mode, name=name, merge_batches=merge)
        assert session.proto.recipe.compat == (1 if compat else 0)
        assert session.proto.recipe.kv_observer == caliper._pb.caliper_pb2.KV_OBSERVER_MINMAX
        h = caliper.hooks.attach(model, session)
        run(model, data)
        h.detach()
        session.finalize()
        session.scales(tp=1, out=tmp_path / name, formats=["compressed-tensors"])
        session.close()
    for name in ("each", "merged"):
        assert scales_doc(tmp_path / name / "scales.json") == \
            scales_doc(tmp_path / "raw" / "scales.json"), name
        for f in ("kv_cache_calib.json", "compressed_tensors_scales.safetensors"):
            assert (tmp_path / name / f).read_bytes() == (tmp_path / "raw" / f).read_bytes()
    # The moving average is not the static max: the minmax K scales differ from static ones.
    static = caliper.Client(server.address).create_session(
        config, caliper.Recipe(kv="per_head"), name="static")
    h = caliper.hooks.attach(model, static)
    run(model, data)
    h.detach()
    static.finalize()
    static.scales(out=tmp_path / "static")
    assert scales_doc(tmp_path / "static" / "scales.json")["kv_cache"]["layers"] != \
        scales_doc(tmp_path / "raw" / "scales.json")["kv_cache"]["layers"]


def test_vllm_kv_cache_size_is_explicit(monkeypatch):
    """--engine vllm gets a KV cache size in bytes, never a share of the machine; on the CPU
    build $VLLM_CPU_KVCACHE_SPACE (GiB) wins when set, as in vLLM itself."""
    from caliper import capture
    args = capture.build_parser().parse_args(
        ["--server=x:1", "--model=m", "--token-ids=t.json", "--out=o", "--engine=vllm"])
    assert args.kv_cache_memory_bytes == capture.DEFAULT_KV_CACHE_BYTES == 512 << 20
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert capture.engine_kv_cache_bytes(64 << 20, on_cuda=False) == 64 << 20
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert capture.engine_kv_cache_bytes(64 << 20, on_cuda=False) == 2 << 30
    assert capture.engine_kv_cache_bytes(64 << 20, on_cuda=True) == 64 << 20
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "lots")
    with pytest.raises(SystemExit, match="VLLM_CPU_KVCACHE_SPACE"):
        capture.engine_kv_cache_bytes(64 << 20, on_cuda=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    with pytest.raises(SystemExit, match="--kv-cache-memory-bytes"):
        capture.engine_kv_cache_bytes(0, on_cuda=False)
