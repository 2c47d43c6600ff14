"""Async RL against the synchronous loop, in one run: stragglers, throughput, and learning.

    python bench/bench_async.py throughput [--iterations 8] [--step-s 1.0]
    python bench/bench_async.py learning [--seeds 0 1 2] [--iterations 30] [--set K=V] [--no-overlap]

throughput: configs/toy-rl.yaml with heavy-tailed environment latency (every step of an episode
sleeps --step-s; 5% of the episodes, drawn per episode, 10x longer), for rl.max_staleness k = 0,
1, 2 one after another in this process. Reports, over iterations 2.. (the first compiles),
episodes sampled and trajectories trained per minute of wall time, the trainer's busy fraction
(time in the DAPO update / iteration time), each k's ratio to k = 0, and the sampled work not
trained for staleness (groups with no fresh token; kept groups' trajectories with none).

learning: the plain toy config (no latency) for k = 0 and k = 1 per seed; reports the trained
samples (trajectories_trained, summed) until the pass rate first reaches 0.8, counted up to that
row and up to the policy version that sampled it (see samples_to), and k = 1's ratio to k = 0
(goal: <= 1.2). --set adds a config override to every run (e.g. --set optimizer.lr=1e-3).
--no-overlap (a diagnostic) runs k = 1's pump with new groups started only after each weight
sync, so every token is sampled by the newest version: it measures how far the pump's own
sampling seeds alone move the result from k = 0's at staleness 0.

Runs on one CPU device (XLA_FLAGS unset); prints one JSON line per run and a summary table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

os.environ.pop("XLA_FLAGS", None)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxswe.config import load_config  # noqa: E402
from jaxswe.run.metrics import read_rows  # noqa: E402
from jaxswe.stages import rl_async  # noqa: E402
from jaxswe.stages.context import open_stage  # noqa: E402
from jaxswe.stages.rollouts import EmbeddedBackend  # noqa: E402
from jaxswe.stages.stages import run_rl_stage  # noqa: E402

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
    rng, lock = random.Random(seed), threading.Lock()

    def make(task_id: str):
        with lock:
            slow = rng.random() < slow_p
        return StragglerEnv(make_env(task_id), step_s, slow)

    return make


@contextlib.contextmanager
def pump_without_overlap():
    """While active, the async loop's pump starts groups only after a weight sync (the embedded
    engine's), not while the trainer works: k = 1's bookkeeping at staleness 0."""
    live = []

    class NoOverlapPump(rl_async.RolloutPump):
        def __init__(self, ctx, order):
            self.at_sync = True  # the first groups start at once, as in every pump
            super().__init__(ctx, order)
            self.at_sync = False
            live.append(self)

        def _fill(self) -> None:
            if self.at_sync:
                super()._fill()

    synced = EmbeddedBackend.sync_weights

    async def sync_then_fill(self, params, export_dir, *, version):
        await synced(self, params, export_dir, version=version)
        for pump in live:
            pump.at_sync = True
            pump._fill()
            pump.at_sync = False

    saved = rl_async.RolloutPump
    rl_async.RolloutPump, EmbeddedBackend.sync_weights = NoOverlapPump, sync_then_fill
    try:
        yield
    finally:
        rl_async.RolloutPump, EmbeddedBackend.sync_weights = saved, synced


def run(run_dir: Path, sets: list[str], *, step_s: float = 0.0) -> list[dict]:
    cfg = load_config(CONFIG, sets)
    ctx = open_stage(cfg, run_dir, init_from=None)
    if step_s:
        ctx.make_env = straggler_factory(ctx.make_env, step_s, 0.05, cfg.seed)
    run_rl_stage(ctx, history_from=None, resume=False)
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


def learning(args) -> None:
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            need = {}
            for k in (0, 1):
                sets = [f"seed={seed}", f"rl.iterations={args.iterations}", f"rl.max_staleness={k}"]
                sets += ["eval.after_stage=false", *args.set]
                with pump_without_overlap() if k and args.no_overlap else contextlib.nullcontext():
                    rows = run(Path(tmp) / f"s{seed}k{k}", sets)
                need[k] = samples_to(rows, 0.8)
                rates = [round(r["pass_rate"], 2) for r in rows]
                print(
                    json.dumps({"seed": seed, "k": k, "samples_to_0.8": need[k], "pass_rates": rates}),
                    flush=True,
                )
            table.append((seed, need[0], need[1]))
    print_learning(table)


def print_learning(table: list[tuple[int, tuple, tuple]]) -> None:
    """The learning table (seed, k = 0's samples_to, k = 1's) and its summary over the seeds."""
    print("\n| seed | samples to 0.8, k=0 (by row / by version) | k=1 | k=1 / k=0 (by row / by version) |")
    print("|---|---|---|---|")
    ratio = lambda a, b: f"{b / a:.2f}" if a and b else "n/a"
    for seed, a, b in table:
        print(f"| {seed} | {a[0]} / {a[1]} | {b[0]} / {b[1]} | {ratio(a[0], b[0])} / {ratio(a[1], b[1])} |")
    reached = [sum(row[i][0] is not None for row in table) for i in (1, 2)]
    print(f"\nreached 0.8 at {reached[0]} of {len(table)} seeds with k=0, at {reached[1]} with k=1")
    both = [b[0] / a[0] for _, a, b in table if a[0] and b[0]]
    if both:
        within = sum(r <= 1.2 for r in both)
        median = np.median(both)
        print(f"where both did, k=1 / k=0 (by row): median {median:.2f}, <= 1.2 at {within} of {len(both)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--iterations", type=int, default=8)
    t.add_argument("--step-s", type=float, default=1.0)
    lr = sub.add_parser("learning")
    lr.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    lr.add_argument("--iterations", type=int, default=30)
    lr.add_argument("--set", action="append", default=[], help="a config override for every run")
    lr.add_argument("--no-overlap", action="store_true", help="k = 1 at staleness 0 (a diagnostic)")
    args = parser.parse_args()
    throughput(args) if args.what == "throughput" else learning(args)


if __name__ == "__main__":
    main()
