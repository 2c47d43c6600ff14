"""Real-token fraction of packed RL steps: the old power-of-two row rule against row ladders.

    python bench/bench_packing.py [--steps 400] [--seed 0]

For two shipped stages, many random optimizer steps of `rl.trajectories_per_step` trajectories are
packed first-fit-decreasing into `rl.seq_len` rows (`jaxswe.packing.first_fit_decreasing`);
the row count is then rounded by each rule to a multiple of the trainer's row multiple
(`optimizer.micro_batch_rows` x the data x fsdp row shards). Per rule: the real-token fraction
(real tokens / (rows x seq_len)), its two factors (packing: real tokens / (packed rows x seq_len);
rounding: packed rows / rows), its 5th percentile over steps, and how many distinct row counts
(compiled shapes) the steps hit. Lengths: 72B stage 2 uniform in 8K-131K; 7B stage 1 log-normal,
median 20K, sigma 0.5, capped at seq_len. Pure numpy; seconds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import yaml

from jaxswe.packing import bucket_rows, first_fit_decreasing

ROOT = Path(__file__).resolve().parent.parent
RATIOS = (1.0, 1.05, 1.1, 1.25)


def stage(config: str) -> tuple[int, int, int]:
    """(trajectories per step, seq_len, row multiple) of a shipped RL config."""
    cfg = yaml.safe_load((ROOT / config).read_text())
    axes, opt = cfg["mesh"]["axes"], cfg["optimizer"]
    multiple = (opt.get("micro_batch_rows") or opt["micro_batches"]) * axes["data"] * axes["fsdp"]
    return cfg["rl"]["trajectories_per_step"], cfg["rl"]["seq_len"], multiple


def uniform_lengths(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return rng.integers(8192, seq_len + 1, n)


def lognormal_lengths(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return np.minimum(rng.lognormal(np.log(20_000), 0.5, n).astype(int), seq_len)


CASES = {
    "72B stage 2 (uniform 8K-131K)": ("configs/qwen2.5-72b/rl-stage2.yaml", uniform_lengths),
    "7B stage 1 (log-normal, median 20K)": ("configs/qwen2.5-7b/rl-stage1.yaml", lognormal_lengths),
}


def power_of_two(needed: int, multiple: int) -> int:
    """The rule before row ladders: a power of two of rows, then a multiple of `multiple`."""
    return -(-(1 << (max(needed, 1) - 1).bit_length()) // multiple) * multiple


def simulate(config: str, draw, steps: int, seed: int) -> list[tuple[str, float, float, float, float, int]]:
    """Per rule: (rule, real-token fraction, packing factor, rounding factor, p5 fraction, shapes)."""
    n, seq_len, multiple = stage(config)
    rng = np.random.default_rng(seed)
    real, packed = [], []
    for _ in range(steps):
        lengths = draw(rng, n, seq_len).tolist()
        real.append(sum(lengths))
        packed.append(len(first_fit_decreasing(lengths, seq_len)[1]))
    real_a, packed_a = np.array(real, float), np.array(packed)
    cap = -(-n // multiple) * multiple
    rules = [("power of two", lambda k: power_of_two(k, multiple))]
    rules += [(f"ladder {r}", lambda k, r=r: min(bucket_rows(k, multiple, r), cap)) for r in RATIOS]
    out = []
    for name, rule in rules:
        rows = np.array([rule(k) for k in packed])
        frac = real_a / (rows * seq_len)
        out.append(
            (
                name,
                float(real_a.sum() / (rows.sum() * seq_len)),
                float(real_a.sum() / (packed_a.sum() * seq_len)),
                float(packed_a.sum() / rows.sum()),
                float(np.percentile(frac, 5)),
                len(set(rows.tolist())),
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for title, (config, draw) in CASES.items():
        n, seq_len, multiple = stage(config)
        print(f"\n{title}: {n} trajectories/step, seq_len {seq_len}, row multiple {multiple}")
        print("| rule | real-token fraction | packing | rounding | p5 step | shapes |")
        print("|---|---|---|---|---|---|")
        for name, frac, pack, rnd, p5, shapes in simulate(config, draw, args.steps, args.seed):
            print(f"| {name} | {frac:.3f} | {pack:.3f} | {rnd:.3f} | {p5:.3f} | {shapes} |")


if __name__ == "__main__":
    main()
