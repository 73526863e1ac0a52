#!/usr/bin/env python3
"""A small Llama-architecture model trained here, and FP8 KV-cache evaluation of it.

Trains a small Llama-architecture model (GQA) here, from a seed, on text every Debian machine has:
the Python 3 standard library's sources in /usr/lib/python3.X (Debian's libpython3.X-minimal and
-stdlib packages; PSF License v2, /usr/lib/python3.X/LICENSE.txt). Byte-level: token = byte (256).

The model is cached outside the checkout, like the venvs: $CALIPER_CACHE_DIR (default
~/.cache/caliper)/models/tiny-llama-SIZE-seedN-HASH/ (HASH: of the training code, the size's
parameters, the seed, the thread count, torch's version and the corpus): a Hugging Face
directory (config.json, model.safetensors, a byte tokenizer) and training.json (held-out and
uniform perplexity, time). Deterministic: same code, seed and corpus give the same weights (CPU,
one thread). Never committed; delete the folder to retrain.

usage: $(scripts/python-env.sh tools)/bin/python scripts/tiny_llama.py [--size test|bench]
       [--seed N]
Prints the model directory (training first when it is not cached).

Evaluation (fp8_kv, evaluate): K and V fake-quantised to FP8 E4M3 inside the model's attention,
as an engine's FP8 KV cache stores them: x / scale saturated at +-448, rounded by torch's
float8_e4m3fn cast (round to nearest even), times scale; per tensor or per KV head.
"""
import argparse
import fcntl
import glob
import hashlib
import inspect
import json
import math
import os
import shutil
import sys
import tempfile
import time

import torch

# test: what tests/python uses (minutes of one CPU core); bench: the evidence bench's second size.
SIZES = {
    "test": dict(layers=4, hidden=256, heads=8, kv_heads=2, intermediate=512, steps=400,
                 batch=8, seq=128, lr=3e-3),
    "bench": dict(layers=6, hidden=320, heads=10, kv_heads=2, intermediate=640, steps=400,
                  batch=8, seq=128, lr=2e-3),
}
THREADS = 1  # part of the cache key (float sums depend on the split); on a shared machine
# two threads ran 5x slower per step than one (OpenMP barriers under load)
HELD_OUT_EVERY = 10  # every 10th source file (sorted by name) is held out, never trained on


def corpus_files():
    """The top-level .py files of the newest /usr/lib/python3.X, sorted by name."""
    dirs = sorted(glob.glob("/usr/lib/python3.*/"), key=lambda d: [int(p) for p in
                  d.rstrip("/").rsplit("python", 1)[1].split(".")])
    for d in reversed(dirs):
        files = sorted(glob.glob(os.path.join(d, "*.py")))
        if len(files) >= 50:
            return d, files
    sys.exit("train-tiny-llama: no Python standard library sources under /usr/lib/python3.*")


def corpus():
    """(train bytes, held-out bytes, description): files joined by a NUL byte each."""
    root, files = corpus_files()
    train, held = bytearray(), bytearray()
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            (held if i % HELD_OUT_EVERY == 0 else train).extend(fh.read() + b"\0")
    desc = {"corpus": f"{root}*.py (Python standard library sources, PSF License v2)",
            "files": len(files), "train_bytes": len(train), "held_out_bytes": len(held),
            "held_out_every": HELD_OUT_EVERY}
    return bytes(train), bytes(held), desc


def windows(data: bytes, n: int, seq: int, seed: int) -> torch.Tensor:
    """n windows of seq bytes at seeded random offsets, as token ids [n, seq]."""
    g = torch.Generator().manual_seed(seed)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    starts = torch.randint(0, len(data) - seq, (n,), generator=g)
    return torch.stack([t[s:s + seq] for s in starts.tolist()]).long()


def config(size: str):
    from transformers import LlamaConfig
    p = SIZES[size]
    cfg = LlamaConfig(vocab_size=256, hidden_size=p["hidden"], intermediate_size=p["intermediate"],
                      num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
                      num_key_value_heads=p["kv_heads"], head_dim=p["hidden"] // p["heads"],
                      max_position_embeddings=512, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg.architectures = ["LlamaForCausalLM"]
    return cfg


def cache_key(size: str, seed: int, corpus_bytes: bytes) -> str:
    """Hash of the code that decides the weights, the size's parameters, the seed and the corpus
    (editing this script's documentation or command line keeps the cache)."""
    h = hashlib.sha256()
    for fn in (corpus_files, corpus, config, _train):
        h.update(inspect.getsource(fn).encode())
    h.update(json.dumps([size, SIZES[size], seed, THREADS, torch.__version__]).encode())
    h.update(hashlib.sha256(corpus_bytes).digest())
    return h.hexdigest()[:16]


def model_dir(size: str = "test", seed: int = 0) -> str:
    """The cached model's directory, trained first if absent (one trainer at a time)."""
    train, held, desc = corpus()
    cache = os.environ.get("CALIPER_CACHE_DIR") or os.path.expanduser("~/.cache/caliper")
    out = os.path.join(cache, "models", f"tiny-llama-{size}-seed{seed}-"
                       f"{cache_key(size, seed, train + held)}")
    if os.path.exists(os.path.join(out, "training.json")):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(out, "training.json")):
            tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".", dir=os.path.dirname(out))
            try:
                _train(size, seed, train, held, desc, tmp)
                os.rename(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def perplexity(model, ids: torch.Tensor, batch: int = 16) -> float:
    """exp(mean next-token cross entropy) over ids [n, seq]."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids), batch):
            x = ids[i:i + batch]
            logits = model(x, use_cache=False).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1),
                                                     reduction="sum")
            total, count = total + loss.item(), count + x[:, 1:].numel()
    return math.exp(total / count)


def save_tokenizer(path):
    """A byte tokenizer file for tools that load one (llm-compressor); ids are the bytes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.WordLevel({f"b{i}": i for i in range(256)}, unk_token="b0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="b0", pad_token="b0")
    tokenizer.save_pretrained(path)


def _train(size, seed, train, held, desc, out):
    from transformers import LlamaForCausalLM
    p = SIZES[size]
    torch.set_num_threads(THREADS)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    model = LlamaForCausalLM(config(size)).float()
    opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    warmup = p["steps"] // 20

    def lr_at(step):  # linear warm-up, then cosine down to a tenth
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / (p["steps"] - warmup)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    data = torch.frombuffer(bytearray(train), dtype=torch.uint8)
    g = torch.Generator().manual_seed(seed + 1)
    t0 = time.time()
    model.train()
    for step in range(p["steps"]):
        starts = torch.randint(0, len(data) - p["seq"], (p["batch"],), generator=g).tolist()
        x = torch.stack([data[s:s + p["seq"]] for s in starts]).long()
        loss = model(x, labels=x, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == p["steps"] - 1:
            print(f"train-tiny-llama {size}: step {step} loss {loss.item():.3f} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)
    model.eval()
    held_ppl = perplexity(model, windows(held, 64, p["seq"], 12345))
    train_ppl = perplexity(model, windows(train, 64, p["seq"], 12345))
    model.save_pretrained(out)
    save_tokenizer(out)
    info = dict(desc, size=size, seed=seed, params=SIZES[size], threads=THREADS,
                parameters=sum(t.numel() for t in model.parameters()),
                train_seconds=round(time.time() - t0, 1), held_out_perplexity=held_ppl,
                train_perplexity=train_ppl, uniform_perplexity=256.0,
                torch=torch.__version__)
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"train-tiny-llama {size}: held-out perplexity {held_ppl:.2f} (uniform 256), "
          f"train {train_ppl:.2f}, {info['train_seconds']} s", file=sys.stderr)


FP8_MAX = 448.0  # float8_e4m3fn
ROUNDINGS = ("nearest", "toward_zero")
# What the fp8_kv attention does on the current forward.
_FP8 = {"scales": None, "record": None, "rounding": "nearest"}


def to_fp8(x: torch.Tensor, rounding: str = "nearest") -> torch.Tensor:
    """x saturated at +-448 and rounded to float8_e4m3fn: to nearest even (torch's cast, as CUDA
    engines convert), or toward zero (what vLLM's CPU build stores: tests/peers/
    vllm_fp8_rounding_test.py checks it against vLLM's own cache write)."""
    q = x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    if rounding == "toward_zero":
        # E4M3 codes order like magnitudes: one code toward zero where nearest rounded away.
        up = q.float().abs() > x.float().abs()
        q = torch.where(up, (q.view(torch.uint8) - 1).view(torch.float8_e4m3fn), q)
    elif rounding != "nearest":
        raise ValueError(f"rounding: expected one of {ROUNDINGS}, got {rounding!r}")
    return q


def fake_quant(x: torch.Tensor, scale: torch.Tensor, rounding: str = "nearest") -> torch.Tensor:
    """x [batch, kv_heads, seq, head_dim]; scale [kv_heads] (or one value): s * fp8(x / s)."""
    s = scale.to(x.dtype).reshape(1, -1, 1, 1)
    return to_fp8(x / s, rounding).to(x.dtype) * s


def _fp8_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if _FP8["record"] is not None:
        _FP8["record"].setdefault(module.layer_idx, []).append((key.detach(), value.detach()))
    if _FP8["scales"] is not None:
        k_scale, v_scale = _FP8["scales"][module.layer_idx]
        key = fake_quant(key, k_scale, _FP8["rounding"])
        value = fake_quant(value, v_scale, _FP8["rounding"])
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def load(path: str, threads: int = THREADS):
    """The cached model, in float32 (the unquantised reference), with the fp8_kv attention
    registered (off until a forward runs under fp8_kv)."""
    from transformers import AttentionInterface, LlamaForCausalLM
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    torch.set_num_threads(threads)
    AttentionInterface.register("fp8_kv", _fp8_attention)
    AttentionMaskInterface.register("fp8_kv", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.config._attn_implementation_internal = "fp8_kv"
    return model


class fp8_kv:
    """Forwards inside run with K/V fake-quantised by scales {layer: (k [heads], v [heads])},
    or unquantised with scales None; record={} collects each layer's (key, value) per forward;
    rounding: see to_fp8."""

    def __init__(self, scales=None, record=None, rounding="nearest"):
        self.state = {"scales": scales, "record": record, "rounding": rounding}

    def __enter__(self):
        self.saved = dict(_FP8)
        _FP8.update(self.state)

    def __exit__(self, *exc):
        _FP8.update(self.saved)


def log_probs(model, ids: torch.Tensor, scales=None, batch: int = 16,
              rounding: str = "nearest") -> torch.Tensor:
    """log p(next byte) [n, seq - 1, 256] for ids [n, seq], K/V quantised with scales."""
    out = []
    with torch.no_grad(), fp8_kv(scales, rounding=rounding):
        for i in range(0, len(ids), batch):
            logits = model(ids[i:i + batch], use_cache=False).logits[:, :-1].float()
            out.append(torch.log_softmax(logits, -1))
    return torch.cat(out)


def evaluate(model, ids: torch.Tensor, ref: torch.Tensor, scales=None,
             rounding: str = "nearest"):
    """(perplexity, mean KL(ref || quantised) in nats per token) over ids, ref = log_probs(ids)."""
    logp = log_probs(model, ids, scales, rounding=rounding)
    nll = -logp.gather(-1, ids[:, 1:, None]).mean().item()
    kl = (ref.exp() * (ref - logp)).sum(-1).mean().item()
    return math.exp(nll), kl


def unit_scales(model):
    """Scale 1.0 on every layer (what vLLM uses when a checkpoint carries none)."""
    heads = model.config.num_key_value_heads
    return {i: (torch.ones(heads), torch.ones(heads))
            for i in range(model.config.num_hidden_layers)}


def rescale_kv(model, k_factors, v_factors):
    """A copy of model whose K (V) of KV head h is k_factors[h] (v_factors[h]) times larger and
    which computes the same function: the query heads reading head h get q_proj / k_factor (RoPE
    is a rotation, so q.k is unchanged) and their o_proj columns / v_factor. Powers of two keep
    it exact. For the magnitudes trained models show (K absmax in the hundreds or thousands)."""
    import copy
    model = copy.deepcopy(model)
    cfg = model.config
    group, d = cfg.num_attention_heads // cfg.num_key_value_heads, cfg.head_dim
    with torch.no_grad():
        for layer in model.model.layers:
            att = layer.self_attn
            for h, (kf, vf) in enumerate(zip(k_factors, v_factors)):
                att.k_proj.weight[h * d:(h + 1) * d] *= kf
                att.v_proj.weight[h * d:(h + 1) * d] *= vf
                q_rows = slice(h * group * d, (h + 1) * group * d)
                att.q_proj.weight[q_rows] /= kf
                att.o_proj.weight[:, q_rows] /= vf
    return model


def _per_head(values, heads: int) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32).reshape(-1)
    return t.expand(heads).clone() if t.numel() == 1 else t


def feed(model, session, calibration: torch.Tensor) -> None:
    """One forward per calibration sequence with caliper.hooks streaming K/V into session."""
    import caliper.hooks
    saved = model.config._attn_implementation_internal
    model.config._attn_implementation_internal = "sdpa"  # the hooks wrap the model's own
    try:
        with torch.no_grad(), caliper.hooks.attach(model, session, inputs=False, weights=False):
            for x in calibration:
                model(x[None], use_cache=False)
    finally:
        model.config._attn_implementation_internal = saved


def caliper_session(model, address: str, model_path: str, calibration: torch.Tensor, *,
                    kv: str = "per_head", observer: str = "static_minmax",
                    histograms: bool = False, name: str = ""):
    """A finalized Caliper session fed by the transformers hooks (caliper.hooks) with one forward
    per calibration sequence, and its scales {layer: (k [heads], v [heads])}."""
    import caliper
    client = caliper.Client(address)
    recipe = caliper.Recipe(kv=kv, kv_observer=observer, histograms=histograms)
    session = client.create_session(model_path, recipe, name=name or f"{kv} {observer}")
    feed(model, session, calibration)
    session.finalize()
    heads = model.config.num_key_value_heads
    scales = {layer.layer: (_per_head(layer.k_scale, heads), _per_head(layer.v_scale, heads))
              for layer in session.scales(tp=1).kv_layers}
    return session, scales


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="test", choices=sorted(SIZES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(model_dir(args.size, args.seed))


if __name__ == "__main__":
    main()
