"""caliper.vllm without vLLM: when the plugin turns on, the errors naming the variable, and the
scale each TP rank's kernel applies."""
import pytest

from caliper import vllm as plugin


def test_inert_without_fleet_and_server():
    assert plugin.Settings.from_env({}) is None
    assert plugin.Settings.from_env({"CALIPER_FLEET": "prod"}) is None
    assert plugin.Settings.from_env({"CALIPER_SERVER": "localhost:50051"}) is None


def test_defaults_and_overrides():
    s = plugin.Settings.from_env({"CALIPER_FLEET": "prod", "CALIPER_SERVER": "h:1"})
    assert (s.sample_tokens, s.sample_fraction, s.weight_version) == (65536, 0.1, "initial")
    s = plugin.Settings.from_env({"CALIPER_FLEET": "prod", "CALIPER_SERVER": "h:1",
                                  "CALIPER_SAMPLE_TOKENS": "100", "CALIPER_SAMPLE_FRACTION": "1",
                                  "CALIPER_WEIGHT_VERSION": "step-3"})
    assert (s.sample_tokens, s.sample_fraction, s.weight_version) == (100, 1.0, "step-3")


@pytest.mark.parametrize("name,value", [("CALIPER_SAMPLE_FRACTION", "2"),
                                        ("CALIPER_SAMPLE_FRACTION", "half"),
                                        ("CALIPER_SAMPLE_TOKENS", "-1"),
                                        ("CALIPER_QUEUE_ITEMS", "0")])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        plugin.Settings.from_env({"CALIPER_FLEET": "f", "CALIPER_SERVER": "h:1", name: value})


def test_register_stays_inert_on_a_bad_value(monkeypatch):
    monkeypatch.setitem(plugin.status, "loaded", False)
    monkeypatch.setitem(plugin.status, "active", False)
    monkeypatch.setenv("CALIPER_FLEET", "f")
    monkeypatch.setenv("CALIPER_SERVER", "h:1")
    monkeypatch.setenv("CALIPER_SAMPLE_FRACTION", "7")
    plugin.register()
    assert plugin.status["loaded"] and not plugin.status["active"]
    assert "CALIPER_SAMPLE_FRACTION" in plugin.status["error"]


def test_rank_scale_is_the_max_over_the_rank_heads():
    per_head = [0.1, 0.4, 0.3, 0.2]
    assert plugin.rank_scale(per_head, 0, 1) == 0.4
    assert [plugin.rank_scale(per_head, r, 2) for r in range(2)] == [0.4, 0.3]
    assert [plugin.rank_scale([0.1, 0.2], r, 4) for r in range(4)] == [0.1, 0.1, 0.2, 0.2]
    assert plugin.rank_scale([0.5], 3, 4) == 0.5      # per tensor: every rank
    assert plugin.rank_scale([0.1, 0.2, 0.3], 0, 2) is None  # 3 heads on 2 ranks: refused


def test_only_the_supported_vllm_releases_turn_it_on():
    assert plugin._unsupported_vllm("0.32.0") == ""
    assert plugin._unsupported_vllm("0.32.1+cpu") == ""
    assert "0.33.0 is outside" in plugin._unsupported_vllm("0.33.0")
    assert "0.31.2 is outside" in plugin._unsupported_vllm("0.31.2")
    assert "cannot be read" in plugin._unsupported_vllm("dev")


def test_settings_silent_steps():
    s = plugin.Settings.from_env({"CALIPER_FLEET": "f", "CALIPER_SERVER": "h:1",
                                  "CALIPER_SILENT_STEPS": "5"})
    assert s.silent_steps == 5
    with pytest.raises(ValueError, match="CALIPER_SILENT_STEPS"):
        plugin.Settings.from_env({"CALIPER_FLEET": "f", "CALIPER_SERVER": "h:1",
                                  "CALIPER_SILENT_STEPS": "0"})


def test_only_caches_with_calibrated_scales_are_taken():
    from caliper.vllm._switch import unsupported_cache
    for dtype in ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4", "nvfp4_4over6"):
        assert unsupported_cache(dtype) == "", dtype
    for dtype in ("fp8_per_token_head", "turboquant_k8v4", "octave_k3v4"):
        assert dtype in unsupported_cache(dtype)
