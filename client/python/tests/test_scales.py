"""Session.scales' results as typed values, and the files written from the server's bytes."""
import pytest

import caliper
from caliper._pb import caliper_pb2 as pb
from caliper._scales_files import write_scales_files


def response(**fields):
    r = pb.ScalesResponse(kv=pb.KV_PER_HEAD, fp8_flavor=pb.FP8_E4M3FN, num_kv_heads=2,
                          deployed_total_kv_heads=4, tp_size=4, convention=pb.MODELOPT,
                          scales_json=b'{"session_id": "s"}\n', **fields)
    r.kv_layers.add(layer=0, k_absmax=[4.5, 1.0], v_absmax=[2.0, 3.0], k_scale=[0.01, 0.002],
                    v_scale=[0.004, 0.006])
    m = r.modules.add(module="model.layers.0.mlp.up_proj", fused_group="gate_up")
    m.weight_global_scale = 0.5
    r.warnings.add(where="layer 0 V head 1", message="absmax 0: scale 1.0")
    r.files.add(format="lightllm", name="kv_cache_calib.json", content=b"{lightllm}")
    r.files.add(format="modelopt", name="modelopt_scales.safetensors", content=b"\x00\x01")
    return r


def test_typed_fields():
    s = caliper.Scales(response(), None)
    assert (s.kv, s.fp8, s.convention, s.tp_size) == ("per_head", "e4m3fn", "modelopt", 4)
    assert s.kv_layers == [caliper.KvLayerScales(0, [4.5, 1.0], [2.0, 3.0],
                                                 [pytest.approx(0.01), pytest.approx(0.002)],
                                                 [pytest.approx(0.004), pytest.approx(0.006)])]
    assert s.modules == [caliper.ModuleScales("model.layers.0.mlp.up_proj", "gate_up", None, None,
                                              0.5, None)]
    assert s.warnings == [caliper.ScaleWarning("layer 0 V head 1", "absmax 0: scale 1.0")]
    assert [f.name for f in s.files] == ["kv_cache_calib.json", "modelopt_scales.safetensors"]
    assert s.scales_json == b'{"session_id": "s"}\n' and s.written is None


def test_files_are_the_servers_bytes(tmp_path):
    written = write_scales_files(str(tmp_path / "out"), response())
    out = tmp_path / "out"
    assert (out / "kv_cache_calib.json").read_bytes() == b"{lightllm}"
    assert (out / "modelopt_scales.safetensors").read_bytes() == b"\x00\x01"
    assert (out / "scales.json").read_bytes() == b'{"session_id": "s"}\n'
    assert written.engine_files == [str(out / "modelopt_scales.safetensors")]
    assert sorted(p.name for p in out.iterdir()) == [
        "kv_cache_calib.json", "modelopt_scales.safetensors", "scales.json"]


@pytest.mark.parametrize("change,error", [
    (lambda r: r.ClearField("scales_json"), "no scales.json"),
    (lambda r: r.files.pop(0), "no \"lightllm\" file"),
    (lambda r: setattr(r.files[1], "name", "../x"), "a file named \"../x\""),
    (lambda r: setattr(r.files[1], "name", ".hidden"), "a file named \".hidden\""),
])
def test_broken_answers_write_nothing(tmp_path, change, error):
    r = response()
    change(r)
    with pytest.raises(RuntimeError, match=error):
        write_scales_files(str(tmp_path / "out"), r)
    assert not (tmp_path / "out").exists()
