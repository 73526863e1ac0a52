"""The Llama trained here (scripts/tiny_llama.py, test size, seed 0; cached outside the checkout,
trained on first use: a few minutes of one core) learned its corpus, and the per-head FP8 KV scales
Caliper calibrates from it (a real server fed by caliper.hooks) cost about what scale 1.0 costs at
the magnitudes it learned (within the spread measured over sample seeds 0-2), and far less than
scale 1.0 at trained models' magnitudes."""
import json
import os
import pathlib
import sys

import pytest
import torch

SOURCE = pathlib.Path(os.environ.get("CALIPER_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
sys.path.insert(0, str(SOURCE / "scripts"))
import tiny_llama  # noqa: E402

# Uniform over bytes is 256; the trained model's held-out perplexity is about 6.6 (training.json).
PERPLEXITY_BOUND = 10.0

# KL(calibrated per head) / KL(scale 1.0) at the magnitudes the model learned, measured with the
# cached test-size model of seed 0 (torch 2.14.0+cu130, corpus /usr/lib/python3.11, held-out
# perplexity 6.60), 2026-12-07, by
#  CALIPER_PYTHON_SET=tools tests/python/run_pytest.sh build trained_model_test.py -s -k cost_little
# sample seed 0: 9.668e-4 / 1.0198e-3 = 0.948; 1: 9.849e-4 / 1.0352e-3 = 0.951;
# 2: 9.537e-4 / 8.425e-4 = 1.132. Mean 1.010, standard deviation over the seeds 0.105
# (docs/accuracy.md). Calibrated is not better than scale 1.0 here, nor worse beyond the spread:
# the ratio must stay within the mean +- 2 standard deviations, [0.80, 1.22]. (Seeds 3-9 gave
# 1.037, 1.090, 1.089, 1.011, 1.015, 1.025, 1.057, all inside.)
KL_RATIO_MEAN, KL_RATIO_SD = 1.010, 0.105


@pytest.fixture(scope="module")
def trained():
    path = tiny_llama.model_dir("test", 0)
    train, held, _ = tiny_llama.corpus()
    return path, tiny_llama.load(path), train, held


def test_it_learned_held_out_text(trained):
    path, model, _, held = trained
    ids = tiny_llama.windows(held, 32, 128, 7)  # files it never trained on
    ppl = tiny_llama.perplexity(model, ids)
    info = json.loads(pathlib.Path(path, "training.json").read_text())
    print(f"held-out perplexity {ppl:.3f} (training.json {info['held_out_perplexity']:.3f}, "
          f"uniform 256)")
    assert ppl < PERPLEXITY_BOUND
    assert info["held_out_perplexity"] < PERPLEXITY_BOUND
    # The cache is keyed by what decides the weights: it holds this size and seed.
    assert info["size"] == "test" and info["seed"] == 0
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA


def sample(trained, seed):
    """Sample seed `seed`'s 16 calibration windows (training split) and 64 evaluation windows
    (held-out files) of 128 bytes: bench/kv_evidence_bench.py's seeds (100 + seed, 200 + seed)."""
    _, _, train, held = trained
    return (tiny_llama.windows(train, 16, 128, 100 + seed),
            tiny_llama.windows(held, 64, 128, 200 + seed))


@pytest.fixture(scope="module")
def windows(trained):
    return sample(trained, 0)


def kl_of(model, evaluation, scales):
    ref = tiny_llama.log_probs(model, evaluation)
    return tiny_llama.evaluate(model, evaluation, ref, scales)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_head_scales_are_the_hooks_absmax_and_cost_little(trained, seed, server):
    """At the magnitudes this model learned (K, V absmax 8-14, far inside FP8's range) E4M3's
    3-bit mantissa sets the error whatever the scale: calibrated scales cost about what scale 1.0
    costs, both little (KL_RATIO_MEAN +- 2 KL_RATIO_SD over sample seeds 0-2, each checked)."""
    path, model, _, _ = trained
    calibration, evaluation = sample(trained, seed)
    _, scales = tiny_llama.caliper_session(model, server.address, path, calibration)
    heads = model.config.num_key_value_heads
    assert sorted(scales) == list(range(model.config.num_hidden_layers))
    record = {}
    with torch.no_grad(), tiny_llama.fp8_kv(record=record):
        for x in calibration:
            model(x[None], use_cache=False)
    for layer, (k_scale, v_scale) in scales.items():
        assert k_scale.shape == (heads,) and v_scale.shape == (heads,)
        # static_minmax per head: the absmax over what the hooks saw, / 448.
        for j, scale in enumerate((k_scale, v_scale)):
            absmax = torch.cat([kv[j] for kv in record[layer]], dim=2).abs().amax(dim=(0, 2, 3))
            assert torch.allclose(scale, absmax / 448, rtol=1e-6)
    ppl_ref, kl_self = kl_of(model, evaluation, None)
    assert kl_self == pytest.approx(0, abs=1e-9)
    ref = tiny_llama.log_probs(model, evaluation)
    ppl_unit, kl_unit = tiny_llama.evaluate(model, evaluation, ref, tiny_llama.unit_scales(model))
    ppl_cal, kl_cal = tiny_llama.evaluate(model, evaluation, ref, scales)
    print(f"seed {seed}: perplexity {ppl_ref:.4f} unquantised, {ppl_unit:.4f} scale 1.0, "
          f"{ppl_cal:.4f} per head; KL {kl_unit:.4e} scale 1.0, {kl_cal:.4e} per head, "
          f"ratio {kl_cal / kl_unit:.4f}")
    assert 0 < kl_cal < 5e-3 and 0 < kl_unit < 5e-3
    ratio = kl_cal / kl_unit
    assert abs(ratio - KL_RATIO_MEAN) <= 2 * KL_RATIO_SD, (
        f"seed {seed}: KL ratio {ratio:.4f} outside {KL_RATIO_MEAN} +- 2 x {KL_RATIO_SD}")
    assert abs(ppl_cal / ppl_ref - 1) < 5e-3


def test_calibrated_per_head_scales_beat_scale_one_at_trained_magnitudes(trained, windows,
                                                                          server):
    """The same model reparametrised (exactly: powers of two) to K and V magnitudes trained
    models reach: K x64 (absmax ~850, past 448), one V head x64 and the other / 4096. Scale 1.0
    saturates K and flushes the small head to FP8 subnormals; per-tensor scales fit the large
    head only; per-head scales fit each head."""
    path, model, _, _ = trained
    calibration, evaluation = windows
    big = tiny_llama.rescale_kv(model, [64.0, 64.0], [64.0, 1 / 4096])
    ref = tiny_llama.log_probs(model, evaluation)
    assert torch.allclose(tiny_llama.log_probs(big, evaluation), ref, atol=1e-5)
    _, per_head = tiny_llama.caliper_session(big, server.address, path, calibration)
    _, per_tensor = tiny_llama.caliper_session(big, server.address, path, calibration,
                                               kv="per_tensor")
    assert per_head[0][0].min() > 1.0  # K absmax / 448 past 1: scale 1.0 clips
    kl = {name: tiny_llama.evaluate(big, evaluation, ref, scales)[1]
          for name, scales in (("unit", tiny_llama.unit_scales(big)), ("per_tensor", per_tensor),
                               ("per_head", per_head))}
    print(f"rescaled model, KL: {kl}")
    assert kl["per_head"] < 5e-3
    assert kl["per_head"] * 10 < kl["unit"]
    assert kl["per_head"] * 2 < kl["per_tensor"]
