#!/usr/bin/env python3
"""Writes the small seed corpus in tests/fuzz/corpus/<target>/ (run once; the files are committed).

LightLLM seeds are real fixtures from tests/fixtures/lightllm trimmed to their first layers;
the others are hand-made minimal valid inputs, one per code path worth starting from.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = (sys.argv[1] if len(sys.argv) > 1
            else os.path.join(HERE, "..", "fixtures", "lightllm"))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- lightllm: real files, first 2 layers ----
for src, dst in [("test_kv_cache_calib_per_head_qwen3_30b.json", "per_head_qwen3_30b_2l.json"),
                 ("test_kv_cache_calib_per_tensor_qwen2.5_14b.json", "per_tensor_qwen2.5_14b_2l.json"),
                 ("test_kv_cache_calib_per_head_qwen3_235b.json", "per_head_qwen3_235b_1l.json")]:
    with open(os.path.join(FIXTURES, src)) as f:
        doc = json.load(f)
    layers = 1 if "235b" in src else 2
    doc["num_layers"] = layers
    doc["scales"] = doc["scales"][:layers]
    doc["scales_shape"] = [layers, len(doc["scales"][0])]
    write("lightllm", dst, json.dumps(doc, indent=4))

# ---- hf_config ----
write("hf_config", "llama.json", json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 256}))
write("hf_config", "qwen3_moe.json", json.dumps({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 2048}))
write("hf_config", "multimodal.json", json.dumps({
    "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
    "text_config": {"num_hidden_layers": 4, "num_attention_heads": 16,
                    "num_key_value_heads": 16, "hidden_size": 1024}}))

# ---- safetensors ----
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data

write("safetensors", "two_tensors.safetensors", safetensors(
    [("w", "F32", [2, 2], struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)),
     ("b", "BF16", [3], struct.pack("<3H", 0x3F80, 0xBF80, 0x0000))], {"format": "pt"}))
write("safetensors", "f16_and_u8.safetensors", safetensors(
    [("h", "F16", [1, 2], struct.pack("<2H", 0x3C00, 0xC000)),
     ("scale", "F8_E4M3", [2], bytes([0x38, 0x40]))]))
write("safetensors", "empty_tensor.safetensors", safetensors([("e", "F32", [0, 4], b"")]))

# ---- observer_codec: one blob of each kind and a framed state file ----
def blob(tag, body):
    return tag.encode() + b"\x01" + body

kv = struct.pack("<I2f", 2, 0.5, -0.0) + struct.pack("<I2f", 2, 1.0, 2.0) + \
     struct.pack("<I2q", 2, 3, 4) + struct.pack("<I2q", 2, 3, 4)
write("observer_codec", "kv_layer.bin", blob("K", kv))
write("observer_codec", "minmax_empty.bin", blob("M", struct.pack("<ffq", float("inf"), float("-inf"), 0)))
write("observer_codec", "activation.bin", blob("A", struct.pack("<I", 2) +
      struct.pack("<qffq", 0, -1.0, 1.0, 1) + struct.pack("<qffq", 5, -2.0, 0.5, 3)))
write("observer_codec", "producers.bin", blob("P", struct.pack("<I", 2) +
      struct.pack("<I", 2) + b"r0" + struct.pack("<Q", 7) + struct.pack("<I", 2) + b"r1" + struct.pack("<Q", 9)))


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF

payload = blob("M", struct.pack("<ffq", -1.5, 2.0, 2))
header = b"CALIPER1" + struct.pack("<IIQI", 1, 0, len(payload), crc32c(payload))
write("observer_codec", "state_file.bin", header + struct.pack("<I", crc32c(header)) + payload)

# ---- chunk: [dtype][ndims][dims][kv_heads sel][head_dim sel][flags][kind][layer]
#             [module len][module][tp_size][tp_rank][batch][payload] (see fuzz_targets.cc) ----
def chunk(dtype, dims, kv_sel, hd_sel, flags, kind, layer, module, tp_size, tp_rank, batch, payload):
    return bytes([dtype, len(dims), *dims, kv_sel, hd_sel, flags, kind, layer, len(module)]) + \
        module.encode() + bytes([tp_size, tp_rank, batch]) + payload

write("chunk", "key_f32_per_head.bin", chunk(2, [2, 2, 2], 1, 1, 2, 0, 1, "", 1, 0, 0,
      struct.pack("<8f", 1, -2, 3, -4, 0.5, 0.25, -8, 1)))
write("chunk", "value_tp2_per_tensor.bin", chunk(2, [3, 1, 2], 1, 1, 1, 1, 0, "", 2, 1, 0,
      struct.pack("<6f", 1, 2, 3, 4, 5, 6)))
write("chunk", "weight_bf16.bin", chunk(0, [4, 4], 0, 3, 4, 2, 0, "q_proj", 1, 0, 0,
      struct.pack("<16H", *([0x3F80, 0xC000] * 8))))
write("chunk", "input_f16_ema.bin", chunk(1, [2, 3], 0, 3, 8 | 16, 3, 0, "mlp.up", 1, 0, 3,
      struct.pack("<6H", 0x3C00, 0xBC00, 0x4000, 0, 0x3800, 0xC400)))
