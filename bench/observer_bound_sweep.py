"""The mse observer's documented bound, swept over many seeds and shapes.

docs/observers.md ("Resolution and worst case, tested") states: the exact MSE of the scale mse
chooses is at most max's * 1.005 + 2 sigma and at most the best scale's * 1.02 + 3 sigma, sigma
the model's resolution (MseResolution) at the chosen or the best clip point, the larger; 0 for
bf16 values, which mse evaluates exactly. This sweep checks it on data (every draw from a
torch.Generator seeded by the case, so every run sees the same values): Gaussian, Student-t with
3, 2 and 1 degrees of freedom (1: Cauchy), and Gaussian heads with 4 outlier channels (x10..x59),
each at a random spread of 2^+-4, 16 / 64 / 256 tokens x 128 channels, f32, bf16- and
f16-rounded, for e4m3fn and e4m3fnuz. observer_probe (tests/core/calibration) builds the
histogram with the CPU backend and prints MseClip and MseResolution; torch computes the engine's
FP8 round trip (clamp to +-qmax, cast to float8, scale back) exactly for max * 2^(-k/1024),
k = 0..4096 in steps of 8, then every k around the best. Prints the worst chosen/max and
chosen/best (and where), per shape and dtype, the cases above max * 1.005 or best * 1.02 with
their sigma, and the cases outside the bound; exits 1 if any. f32 / f16 heads whose max is
bf16-exact are evaluated as points although they are not (unless --dtype_known): reported apart,
outside the bound's claim.

usage: $(scripts/python-env.sh tools)/bin/python bench/observer_bound_sweep.py \
           build/tests/core/calibration/observer_probe [--seeds 12] [--first_seed 1] \
           [--shapes gaussian,t3,...] [--dtype_known] [--json FILE]
"""
import argparse
import json
import math
import subprocess
import sys
import time

import torch

FLAVORS = {"e4m3fn": (torch.float8_e4m3fn, 448.0), "e4m3fnuz": (torch.float8_e4m3fnuz, 240.0)}
SHAPES = ("gaussian", "t3", "t2", "t1", "outlier_head")
TOKENS = (16, 64, 256)
DTYPES = ("f32", "bf16", "f16")
# docs/observers.md: chosen's MSE <= max's * 1.005 + 2 sigma and <= best's * 1.02 + 3 sigma, sigma
# the model's resolution (MseResolution) at the chosen or the best clip, the larger (0 for bf16
# values, which are evaluated exactly).
MAX_BOUND, MAX_SIGMAS, BEST_BOUND, BEST_SIGMAS = 1.005, 2.0, 1.02, 3.0
START = time.time()


def data(shape, tokens, dtype, seed):
    """One head's values, [tokens, 128] float32 holding `dtype` values, from a generator seeded by
    the case (the same f32 draw for every dtype)."""
    key = (SHAPES.index(shape) * 16 + TOKENS.index(tokens)) * 100003 + seed
    g = torch.Generator().manual_seed(key)
    sigma = 2.0 ** (torch.rand(1, generator=g, dtype=torch.float64).item() * 8 - 4)
    x = torch.randn(tokens, 128, generator=g, dtype=torch.float64)
    if shape.startswith("t"):  # Student t: normal / sqrt(chi2(nu) / nu), chi2 as a sum of squares
        nu = int(shape[1:])
        chi2 = (torch.randn(nu, tokens, 128, generator=g, dtype=torch.float64) ** 2).sum(0)
        x = x / torch.sqrt(chi2 / nu)
    if shape == "outlier_head":
        channels = torch.randperm(128, generator=g)[:4]
        gains = torch.randint(10, 60, (4,), generator=g, dtype=torch.int64).double()
        x[:, channels] *= gains
    x = (x * sigma).float()
    if dtype == "bf16":
        return x.bfloat16().float()
    if dtype == "f16":
        while x.abs().max() > 30000:  # heavy tails beyond f16's range: scale down by 2^10
            x = x / 1024
        return x.half().float()
    return x


def exact_mse(x, clips, dtype, qmax):
    """Exact round-trip MSE of x for each clip point (scale = clip / qmax), as the engine computes."""
    xd = x.reshape(1, -1).double()
    out = []
    for part in clips.double().split(64):
        s = (part / qmax).reshape(-1, 1)
        y = (xd / s).clamp(-qmax, qmax).float().to(dtype).double() * s
        out.append(((y - xd) ** 2).mean(dim=1))
    return torch.cat(out)


def exact_search(x, amax, dtype, qmax):
    """(best MSE, its k) over max * 2^(-k/1024): every 8th k over 4 octaves, then every k around
    the best; and max's MSE."""
    ks = torch.arange(0, 4097, 8, dtype=torch.float64)
    errs = exact_mse(x, amax * torch.exp2(-ks / 1024), dtype, qmax)
    best_k = int(ks[errs.argmin()])
    fine = torch.arange(max(0, best_k - 7), best_k + 8, dtype=torch.float64)
    fine_errs = exact_mse(x, amax * torch.exp2(-fine / 1024), dtype, qmax)
    if fine_errs.min().item() < errs.min().item():
        return fine_errs.min().item(), int(fine[fine_errs.argmin()]), errs[0].item()
    return errs.min().item(), best_k, errs[0].item()


def probe_run(probe, x, *args):
    return json.loads(subprocess.run([probe, *args], input=x.numpy().tobytes(),
                                     capture_output=True, check=True).stdout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("probe")
    p.add_argument("--seeds", type=int, default=6, help="seeds per (shape, tokens, dtype)")
    p.add_argument("--first_seed", type=int, default=1)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--json", help="write every case's numbers here")
    p.add_argument("--dtype_known", action="store_true",
                   help="tell mse each head's dtype (--values), as a session does with the model's "
                        "dtype; by default it is unknown and the max decides")
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for shape in a.shapes.split(","):
        for tokens in TOKENS:
            for dt in DTYPES:
                for seed in range(a.first_seed, a.first_seed + a.seeds):
                    x = data(shape, tokens, dt, seed)
                    told = [f"--values={dt}"] if a.dtype_known else []
                    out = probe_run(a.probe, x, *told)
                    amax = x.abs().max().item()
                    assert torch.tensor(out["max"], dtype=torch.float32).item() == amax
                    found = {name: exact_search(x, amax, dtype, qmax)
                             for name, (dtype, qmax) in FLAVORS.items()}
                    # The model's resolution at each flavor's best clip point (a probe built
                    # before MseResolution existed prints none: taken as 0).
                    at = ",".join(repr(amax * 2.0 ** (-found[n][1] / 1024)) for n in FLAVORS)
                    resolution = probe_run(a.probe, x, *told,
                                           f"--resolution_at={at}").get("resolution", {})
                    for name, (dtype, qmax) in FLAVORS.items():
                        best, best_k, at_max = found[name]
                        clip = out["mse"][name]
                        chosen = exact_mse(x, torch.tensor([clip]), dtype, qmax).item()
                        rows.append({
                            "shape": shape, "tokens": tokens, "dtype": dt, "seed": seed,
                            "flavor": name,
                            # mse evaluates bins as points when the max is bf16-representable
                            # and the dtype is not known to be f16 / f32
                            "points": (x.abs().max().view(torch.int32).item() & 0xFFFF) == 0
                                      and (dt == "bf16" or not a.dtype_known),
                            "max": amax, "clip": clip, "best_k": best_k,
                            "clip_k": -1024 * math.log2(clip / amax),
                            "vs_max": chosen / at_max, "vs_best": chosen / best,
                            "chosen_mse": chosen, "max_mse": at_max, "best_mse": best,
                            # the model's resolution (MseResolution, an MSE) at the chosen and
                            # at the best clip: sigma is the larger
                            "sigma": max(out.get("mse_resolution", {}).get(name, 0.0),
                                         resolution.get(name, 0.0))})
    return report(rows, a)


def report(rows, a):
    def where(r):
        return (f"{r['shape']} {r['tokens']}x128 {r['dtype']} seed {r['seed']} {r['flavor']} "
                f"(clip max*2^-{r['clip_k']:.0f}/1024, best 2^-{r['best_k']}/1024)")

    def pct(v):
        return f"{100 * (v - 1):+.3f}%"

    # Cases the model's assumptions hold for: bf16 values evaluated as points, other values with
    # the uniform model. f16 / f32 values whose max happens to be bf16-exact are evaluated as
    # points although they are not: reported apart.
    modelled = [r for r in rows if r["points"] == (r["dtype"] == "bf16")]
    mistaken = [r for r in rows if r["points"] != (r["dtype"] == "bf16")]
    def excess(r, what):  # how far chosen is above the bound's fixed part, in sigmas
        base, bound = (r["max_mse"], MAX_BOUND) if what == "max" else (r["best_mse"], BEST_BOUND)
        over = r["chosen_mse"] - base * bound
        return over / r["sigma"] if r["sigma"] > 0 else (math.inf if over > 0 else 0.0)

    bad = [r for r in modelled if excess(r, "max") > MAX_SIGMAS or excess(r, "best") > BEST_SIGMAS]
    kept = sum(r["clip"] == r["max"] for r in rows)
    print(f"observer_bound_sweep: {len(rows)} cases (seeds {a.first_seed}-{a.first_seed + a.seeds - 1}"
          f" x {len(TOKENS)} sizes x {'/'.join(DTYPES)} x {len(FLAVORS)} flavors per shape; dtype "
          f"{'known' if a.dtype_known else 'unknown'} to mse), {kept} kept the max, "
          f"{sum(r['points'] for r in rows)} evaluated as points (max bf16-exact), "
          f"{time.time() - START:.0f} s")
    for name, sub in (("all", rows), ("modelled", modelled), ("points, not bf16", mistaken)):
        if not sub:
            continue
        wm = max(sub, key=lambda r: r["vs_max"])
        wb = max(sub, key=lambda r: r["vs_best"])
        print(f"  {name} ({len(sub)} cases): chosen/max worst {pct(wm['vs_max'])} ({where(wm)}); "
              f"chosen/best worst {pct(wb['vs_best'])} ({where(wb)})")
    for shape in a.shapes.split(","):
        for dt in DTYPES:
            sub = [r for r in modelled if r["shape"] == shape and r["dtype"] == dt]
            if sub:
                print(f"    {shape:13} {dt:4}: chosen/max worst "
                      f"{pct(max(r['vs_max'] for r in sub))}, chosen/best worst "
                      f"{pct(max(r['vs_best'] for r in sub))}")
    sig = sorted(r["sigma"] / r["best_mse"] for r in modelled if not r["points"])
    if sig:
        print(f"  sigma / best's MSE over the {len(sig)} cases with the uniform model: median "
              f"{100 * sig[len(sig) // 2]:.3f}%, 90th percentile {100 * sig[len(sig) * 9 // 10]:.3f}%,"
              f" max {100 * sig[-1]:.2f}%")
    for what, key, bound, sigmas in (("max", "vs_max", MAX_BOUND, MAX_SIGMAS),
                                     ("best", "vs_best", BEST_BOUND, BEST_SIGMAS)):
        over = [r for r in modelled if r[key] > bound]
        worst = max((excess(r, what) for r in over), default=0.0)
        print(f"  modelled cases above {what} * {bound}: {len(over)}, at most {worst:.2f} sigma "
              f"above it (the bound allows {sigmas:g})")
        for r in over:
            print(f"    {where(r)}: chosen/{what} {pct(r[key])}, sigma {100 * r['sigma'] / r['best_mse']:.2f}% "
                  f"of the best's MSE: {excess(r, what):.2f} sigma")
    print(f"  bound (chosen <= max * {MAX_BOUND} + {MAX_SIGMAS:g} sigma, chosen <= best * "
          f"{BEST_BOUND} + {BEST_SIGMAS:g} sigma) on the modelled cases: {len(bad)} outside")
    for r in bad:
        print(f"    {where(r)}: chosen/max {pct(r['vs_max'])}, chosen/best {pct(r['vs_best'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
