"""Async RL against the synchronous loop, in one run: stragglers, throughput, and learning.

    python bench/bench_async.py throughput [--iterations 8] [--step-s 1.0]
    python bench/bench_async.py learning [--seeds 1 2 3] [--iterations 30] [--stale-tokens drop keep]
        [--set K=V] [--runs-dir DIR]

throughput: configs/toy-rl.yaml with heavy-tailed environment latency (every step of an episode
sleeps --step-s; 5% of the episodes, drawn from the episode's seed, 10x longer), for
rl.max_staleness k = 0, 1, 2 one after another in this process. Reports, over iterations 2..
(the first compiles), episodes sampled and trajectories trained per minute of wall time, the
trainer's busy fraction (time in the DAPO update / iteration time), each k's ratio to k = 0, and
the sampled work not trained for staleness.

learning: the plain toy config (no latency) per seed, for k = 0 and, for each rl.stale_tokens
policy named (drop: stale tokens leave the loss; trajectory: a trajectory trains whole or not at
all; keep: every token trains, importance-weighted), k = 1. Reports the trained samples
(trajectories_trained, summed) until the pass rate first reaches 0.8 (see samples_to), each
policy's ratio to k = 0, and at how many seeds each reached 0.8. --set adds a config override to
every run (e.g. --set optimizer.lr=1e-3). --runs-dir keeps each run in DIR/{policy}_k{k}_s{seed}
(k = 0 as drop_k0_s{seed}) and reads a finished one instead of running it again, so a long sweep
can be split over processes, e.g. `jaxswe rl --config configs/toy-rl.yaml --run-dir
DIR/keep_k1_s3 --set seed=3 --set rl.max_staleness=1 --set rl.stale_tokens=keep`.

Runs on one CPU device (XLA_FLAGS unset); prints one JSON line per run and a summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

os.environ.pop("XLA_FLAGS", None)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxswe.config import load_config  # noqa: E402
from jaxswe.run.metrics import read_rows  # noqa: E402
from jaxswe.stages.context import open_stage  # noqa: E402
from jaxswe.stages.finish import finish_stage  # noqa: E402
from jaxswe.stages.rl import run_rl  # noqa: E402

CONFIG = ROOT / "configs" / "toy-rl.yaml"


class StragglerEnv:
    """An environment whose every step first sleeps: `step_s`, or 10 x `step_s` for the episodes
    drawn slow (probability `slow_p`)."""

    def __init__(self, env, step_s: float, slow: bool):
        self.env, self.delay = env, step_s * (10.0 if slow else 1.0)

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action_text: str):
        time.sleep(self.delay)
        return self.env.step(action_text)


def straggler_factory(make_env, step_s: float, slow_p: float, seed: int):
    """`make_env` whose episodes are slow with probability `slow_p`, drawn from the episode's seed."""

    def make(task_id: str, episode_seed: int | None = None):
        slow = random.Random(f"{seed}/{task_id}/{episode_seed}").random() < slow_p
        return StragglerEnv(make_env(task_id, episode_seed), step_s, slow)

    return make


def run(run_dir: Path, sets: list[str], *, step_s: float = 0.0) -> list[dict]:
    cfg = load_config(CONFIG, sets)
    ctx = open_stage(cfg, run_dir, init_from=None)
    if step_s:
        ctx = replace(ctx, make_env=straggler_factory(ctx.make_env, step_s, 0.05, cfg.seed))
    finish_stage(ctx, *run_rl(ctx, resume=False))
    return read_rows(run_dir / "metrics.jsonl")


def throughput(args) -> None:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in (0, 1, 2):
            sets = [f"rl.iterations={args.iterations}", f"rl.max_staleness={k}", "eval.after_stage=false"]
            rows = run(Path(tmp) / f"k{k}", sets, step_s=args.step_s)[1:]
            wall = sum(r["time_iteration_s"] for r in rows)
            out[k] = {
                "episodes_per_min": 60 * sum(r["episodes"] for r in rows) / wall,
                "trained_per_min": 60 * sum(r["trajectories_trained"] for r in rows) / wall,
                "trainer_busy": sum(r["time_train_s"] for r in rows) / wall,
                "staleness_mean": sum(r.get("staleness_mean", 0.0) for r in rows) / len(rows),
                "groups_stale": sum(r.get("groups_stale", 0) for r in rows),
                "trajectories_stale": sum(r.get("trajectories_stale", 0) for r in rows),
                "pass_rate_last": rows[-1]["pass_rate"],
            }
            print(json.dumps({"k": k, **out[k]}), flush=True)
    head = "| k | episodes/min | x k=0 | trained/min | x k=0 | trainer busy | mean staleness | stale groups |"
    print("\n" + head + " stale trajectories |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, r in out.items():
        ratio = r["episodes_per_min"] / out[0]["episodes_per_min"]
        trained = r["trained_per_min"] / out[0]["trained_per_min"]
        print(
            f"| {k} | {r['episodes_per_min']:.0f} | {ratio:.2f} | {r['trained_per_min']:.0f} | "
            f"{trained:.2f} | {r['trainer_busy']:.2f} | {r['staleness_mean']:.2f} | {r['groups_stale']} | "
            f"{r['trajectories_stale']} |"
        )


def samples_to(rows: list[dict], target: float) -> tuple[int | None, int | None]:
    """Trained trajectories until the pass rate first reaches `target`: (counted up to that row,
    counted into the policy version that sampled it). A row's episodes come from version
    step - 1 - lag (lag: the trained tokens' mean staleness, 0 for k = 0), which had trained on
    the rows up to that version only, so the second count charges k = 1 nothing for its lag."""
    total, trained = 0, [0]
    for r in rows:
        total += r.get("trajectories_trained", 0)
        trained.append(total)
        if r["pass_rate"] >= target:
            version = r["step"] - 1 - round(r.get("staleness_mean", 0.0))
            return total, trained[max(version, 0)]
    return None, None


def finished_or_run(run_dir: Path, sets: list[str], iterations: int) -> list[dict]:
    """The rows of the run in `run_dir`: read when it finished, run (afresh) otherwise."""
    path = run_dir / "metrics.jsonl"
    rows = read_rows(path) if path.exists() else []
    if len(rows) == iterations:
        return rows
    shutil.rmtree(run_dir, ignore_errors=True)
    return run(run_dir, sets)


def learning(args) -> None:
    runs = [("drop", 0)] + [(policy, 1) for policy in args.stale_tokens]
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.runs_dir or tmp)
        for seed in args.seeds:
            for policy, k in runs:
                sets = [f"seed={seed}", f"rl.iterations={args.iterations}", f"rl.max_staleness={k}"]
                sets += [f"rl.stale_tokens={policy}", "eval.after_stage=false", *args.set]
                rows = finished_or_run(base / f"{policy}_k{k}_s{seed}", sets, args.iterations)
                table[seed, policy, k] = need = samples_to(rows, 0.8)
                rates = [round(r["pass_rate"], 2) for r in rows]
                line = {
                    "seed": seed,
                    "k": k,
                    "stale_tokens": policy,
                    "samples_to_0.8": need,
                    "pass_rates": rates,
                }
                print(json.dumps(line), flush=True)
    print_learning(table, args.seeds, runs)


def print_learning(table: dict, seeds: list[int], runs: list[tuple[str, int]]) -> None:
    """Samples to 0.8 (by row / by version) per seed and run, each k = 1 run's ratio to k = 0 by
    row, and per run the seeds that reached 0.8 and the median ratio where both did."""
    names = ["k=0" if k == 0 else f"k=1 {policy}" for policy, k in runs]
    print("\n| seed | " + " | ".join(names) + " | " + " | ".join(f"{n} / k=0" for n in names[1:]) + " |")
    print("|---" * (2 * len(runs)) + "|")
    ratio = lambda a, b: f"{b / a:.2f}" if a and b else "n/a"
    for seed in seeds:
        needs = [table[seed, policy, k] for policy, k in runs]
        cells = [f"{n[0]} / {n[1]}" for n in needs] + [ratio(needs[0][0], n[0]) for n in needs[1:]]
        print(f"| {seed} | " + " | ".join(cells) + " |")
    print()
    for (policy, k), name in zip(runs, names, strict=True):
        reached = sum(table[s, policy, k][0] is not None for s in seeds)
        both = [table[s, policy, k][0] / table[s, "drop", 0][0] for s in seeds
                if table[s, policy, k][0] and table[s, "drop", 0][0]]  # fmt: skip
        median = f", median {np.median(both):.2f} x k=0's samples where both did" if k and both else ""
        print(f"{name}: reached 0.8 at {reached} of {len(seeds)} seeds{median}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--iterations", type=int, default=8)
    t.add_argument("--step-s", type=float, default=1.0)
    lr = sub.add_parser("learning")
    lr.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    lr.add_argument("--iterations", type=int, default=30)
    lr.add_argument("--stale-tokens", nargs="+", default=["drop", "trajectory", "keep"])
    lr.add_argument("--set", action="append", default=[], help="a config override for every run")
    lr.add_argument("--runs-dir", help="keep runs here and reuse the finished ones")
    args = parser.parse_args()
    throughput(args) if args.what == "throughput" else learning(args)


if __name__ == "__main__":
    main()
