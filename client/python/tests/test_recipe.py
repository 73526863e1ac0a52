"""Recipe: what reaches the wire, what comes back, and the errors that name the field."""
import pytest

import caliper
from caliper._pb import caliper_pb2 as pb


def test_defaults_are_calibrate_defaults():
    r = caliper.Recipe().to_proto()
    assert r.kv == pb.KV_PER_HEAD and r.fp8_flavor == pb.FP8_E4M3FN
    assert r.activation_observer == pb.STATIC_MINMAX and r.kv_observer == pb.KV_OBSERVER_UNSPECIFIED
    assert not r.nvfp4_weights and not r.nvfp4_activations and r.warmup_batches == 0


def test_round_trip_through_the_message():
    recipe = caliper.Recipe(kv="per_tensor", fp8="e4m3fnuz", nvfp4_weights=True,
                            nvfp4_activations=True, observer="minmax", averaging_constant=0.25,
                            fused_groups="q_proj,k_proj,v_proj", warmup=2,
                            kv_observer="percentile:99.9", compat="llm-compressor",
                            histograms=True)
    message = recipe.to_proto()
    assert message.kv_observer == pb.KV_OBSERVER_PERCENTILE
    assert message.kv_percentile == pytest.approx(99.9)
    assert message.compat == pb.COMPAT_LLM_COMPRESSOR
    assert message.histograms
    assert caliper.Recipe.from_proto(message) == recipe
    mse = caliper.Recipe(observer="percentile:99.5", kv_observer="mse").to_proto()
    assert (mse.activation_observer, mse.activation_percentile) == (pb.PERCENTILE, 99.5)
    assert caliper.Recipe.from_proto(mse).observer == "percentile:99.5"
    assert caliper.Recipe.from_proto(mse).kv_observer == "mse"


@pytest.mark.parametrize("fields,error", [
    ({"kv": "per-head"}, "recipe.kv: expected per_head, per_tensor or off, got 'per-head'"),
    ({"fp8": "e5m2"}, "recipe.fp8: expected e4m3fn or e4m3fnuz, got 'e5m2'"),
    ({"observer": "max"}, "recipe.observer: expected static_minmax, minmax, percentile, mse "
                          "(percentile:P), got 'max'"),
    ({"kv_observer": "minmax:3"}, "recipe.kv_observer: expected static_minmax, minmax, "
                                  "percentile, mse (percentile:P), got 'minmax:3'"),
    ({"kv_observer": "percentile:x"}, "recipe.kv_observer: percentile:P needs a number P"),
    ({"compat": "vllm"}, "recipe.compat: expected \"\" or llm-compressor, got 'vllm'"),
])
def test_bad_fields_are_named(fields, error):
    with pytest.raises(ValueError) as info:
        caliper.Recipe(**fields).to_proto()
    assert str(info.value).startswith(error)
