"""Wire bytes of statistics mode with |x| histograms, as a ratio to raw mode in the same run.

The same K/V (a tiny random Llama, 8 KV heads x head_dim 128, BF16, hooks as in a capture) go to
three sessions: raw tensors, statistics (absmax only) and statistics for a session that keeps
histograms (histograms=true: every K/V chunk also carries one sparse histogram per head). Prints
the wire bytes, the ratio of each to raw, and the histogram bytes per head and chunk.
usage: python bench/histogram_wire_bench.py --build build [--tokens 512,2048]
(the python env of tests/python/run_pytest.sh: build/python-env/bin/python).
"""
import argparse
import json
import pathlib
import tempfile

import torch
import transformers

import caliper
from bench_support import capture, start_server


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build", type=pathlib.Path)
    p.add_argument("--tokens", default="512,2048", help="tokens per forward pass (per chunk)")
    a = p.parse_args()
    torch.manual_seed(0)
    layers, kv_heads, head_dim = 4, 8, 128
    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2048,
                                   num_hidden_layers=layers, num_attention_heads=8,
                                   num_key_value_heads=kv_heads, head_dim=head_dim,
                                   vocab_size=1024, max_position_embeddings=8192)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).eval().to(torch.bfloat16)
    config = json.loads(cfg.to_json_string())
    with tempfile.TemporaryDirectory() as tmp:
        proc, addr, _ = start_server(a.build, pathlib.Path(tmp))
        try:
            client = caliper.Client(addr)
            for tokens in map(int, a.tokens.split(",")):
                ids = [torch.randint(0, 1024, (1, tokens)) for _ in range(4)]
                out = {}
                for name, mode, fields in (("raw", "raw", {}),
                                           ("statistics", "statistics", {}),
                                           ("statistics+histograms", "statistics",
                                            {"histograms": True})):
                    recipe = caliper.Recipe(kv="per_head").to_proto()
                    for k, v in fields.items():
                        setattr(recipe, k, v)
                    s = client.create_session(config, recipe, mode=mode)
                    capture(model, s, ids)
                    out[name] = (s.wire_bytes, s.tensor_bytes)
                    s.close()
                raw = out["raw"][0]
                chunks = 4 * layers * 2  # forward passes x layers x (K, V)
                print(f"K/V only, 4 passes x {tokens} tokens, {layers} layers, {kv_heads} KV heads "
                      f"x {head_dim}, BF16 ({out['raw'][1]} tensor bytes):")
                for name, (wire, _) in out.items():
                    print(f"  {name:22} {wire:>12} B on the wire, ratio to raw {wire / raw:.3e}")
                extra = out["statistics+histograms"][0] - out["statistics"][0]
                print(f"  histograms: {extra / (chunks * kv_heads):.0f} B per head and chunk "
                      f"({extra / chunks:.0f} B per chunk of {tokens} x {kv_heads} x {head_dim})")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
