"""The mse and percentile observers against an exact torch search on the very values they saw.

For Gaussian, Student-t (3 dof) and outlier-channel data over many seeds (f32 and bf16-rounded;
every draw from a torch.Generator seeded by the case, so every run checks the same values),
observer_probe builds the histogram with the CPU backend and prints MseClip / PercentileClip;
torch computes the engine's FP8 round trip (clamp to +-qmax, cast to float8_e4m3fn /
float8_e4m3fnuz, scale back) for every clip point max * 2^(-k/1024), k = 0..4096 in steps of 8,
then every k around the best. Asserted (docs/observers.md): mse's MSE <= max's * 1.005 and
<= the best's * 1.02; percentile within one bin (<= 1/128 of it) above the exact percentile.
usage: observers_torch_check.py OBSERVER_PROBE
"""
import json
import subprocess
import sys

import torch

FLAVORS = {"e4m3fn": (torch.float8_e4m3fn, 448.0), "e4m3fnuz": (torch.float8_e4m3fnuz, 240.0)}
PERCENTILES = ("99", "99.9", "99.99")


def data(shape, seed):
    g = torch.Generator().manual_seed(seed)
    sigma = 2.0 ** (torch.rand(1, generator=g).item() * 8 - 4)
    x = torch.randn(256, 128, generator=g, dtype=torch.float64) * sigma
    if shape == "heavy":
        # Student t (3 dof): chi2(3) as the sum of squares of 3 normals, all from g (no draw
        # from a global random state, so every run sees the same data).
        chi2 = (torch.randn(3, 256, 128, generator=g, dtype=torch.float64) ** 2).sum(0)
        x = x / torch.sqrt(chi2 / 3.0)
    if shape == "outlier_head":
        x[:, torch.randint(0, 128, (4,), generator=g)] *= 30.0
    x = x.float()
    return x.bfloat16().float() if seed % 2 else x


def mse(x, clips, dtype, qmax):
    """Exact round-trip MSE of x for each clip point (scale = clip / qmax), as the engine computes."""
    out = []
    for part in clips.double().split(32):
        s = (part / qmax).reshape(-1, 1)
        y = (x.reshape(1, -1).double() / s).clamp(-qmax, qmax).float().to(dtype).double() * s
        out.append(((y - x.reshape(1, -1).double()) ** 2).mean(dim=1))
    return torch.cat(out)


def main(probe):
    worst_max = worst_best = 0.0
    cases = 0
    for shape in ("gaussian", "heavy", "outlier_head"):
        for seed in range(1, 9):
            x = data(shape, seed)
            out = json.loads(subprocess.run([probe, *PERCENTILES], input=x.numpy().tobytes(),
                                            capture_output=True, check=True).stdout)
            amax = x.abs().max().item()
            assert torch.tensor(out["max"], dtype=torch.float32).item() == amax, (out["max"], amax)
            for name, (dtype, qmax) in FLAVORS.items():
                ks = torch.arange(0, 4097, 8, dtype=torch.float64)
                errs = mse(x, amax * torch.exp2(-ks / 1024), dtype, qmax)
                best_k = int(ks[errs.argmin()])
                fine = torch.arange(max(0, best_k - 7), best_k + 8, dtype=torch.float64)
                best = min(errs.min().item(),
                           mse(x, amax * torch.exp2(-fine / 1024), dtype, qmax).min().item())
                at_max = errs[0].item()
                chosen = mse(x, torch.tensor([out["mse"][name]]), dtype, qmax).item()
                worst_max = max(worst_max, chosen / at_max - 1)
                worst_best = max(worst_best, chosen / best - 1)
                where = f"{shape} seed {seed} {name}"
                assert chosen <= at_max * 1.005, f"{where}: mse {chosen} worse than max's {at_max}"
                assert chosen <= best * 1.02, f"{where}: mse {chosen}, best {best}"
                cases += 1
            a = x.abs().flatten().double().sort().values
            for p in PERCENTILES:
                allowed = (100 - float(p)) / 100 * a.numel()
                exact = a[a.numel() - int(allowed) - 1].item()
                clip = out["percentile"][p]
                # One bin: bins split each octave in 128 equal parts, at most 1/128 of the value.
                assert exact <= clip <= exact * (1 + 1 / 128) * (1 + 1e-12), (shape, seed, p, exact, clip)
    print(f"observers_torch_check: {cases} cases; mse vs max worst {100 * worst_max:+.4f}%, "
          f"vs the best on the fine grid worst {100 * worst_best:+.4f}%; percentile within one bin")


if __name__ == "__main__":
    main(sys.argv[1])
