"""Grading cost: this checkout's grader against an earlier revision's, on the built-in gold patches,
or (`--mix`) on an RL-like mix: each task's gold patch and its empty patch twice (a third resolve).

    .venv/bin/python bench/bench_grading.py --baseline 16b33b3 [--backend local] [--rounds 2] [--tasks 32]
        [--mix]

The baseline revision is checked out into a temporary git worktree; each round grades the same
gold patches once with the baseline's `envs` and once with this checkout's, in alternating child
processes (same machine, same caches, same load), and the per-task times are compared. Prints one
JSON object per round and a summary: the ratio of total seconds (new / baseline) and the median of
the per-task ratios. A first unmeasured pass builds the task virtualenvs (or images).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CHILD = """
import json, sys, time
from envs import grade
from envs.tasks.records import load_builtin
tasks = load_builtin()[: int(sys.argv[1])]
out = {}
for t in tasks:
    start = time.perf_counter()
    patches = [t.patch, "", ""] if sys.argv[3] == "mix" else [t.patch]
    resolved = [grade(t, p, sys.argv[2]).resolved for p in patches]
    out[t.instance_id] = [time.perf_counter() - start, sum(resolved)]
print(json.dumps(out))
"""


def _grade_all(tree: Path, n: int, backend: str, mix: bool) -> dict[str, list]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-c", _CHILD, str(n), backend, "mix" if mix else "gold"]
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision of the grader to compare with")
    parser.add_argument("--backend", default="local")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--mix", action="store_true", help="gold and twice the empty patch per task")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jaxswe-bench-grading-") as tmp:
        base = Path(tmp) / "baseline"
        worktree = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*worktree, "add", "-q", "--detach", str(base), args.baseline], check=True)
        try:
            sides = {"baseline": base, "new": ROOT}
            for tree in sides.values():  # warm-up: venvs / images
                _grade_all(tree, args.tasks, args.backend, args.mix)
            totals = {name: [] for name in sides}
            ratios = []
            for r in range(args.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                times = {name: _grade_all(sides[name], args.tasks, args.backend, args.mix) for name in order}
                for name in sides:
                    totals[name].append(sum(v[0] for v in times[name].values()))
                ratios += [times["new"][t][0] / times["baseline"][t][0] for t in times["new"]]
                resolved = {name: sum(v[1] for v in times[name].values()) for name in sides}
                per_task = {k: round(sum(v) / args.tasks / args.rounds, 2) for k, v in totals.items()}
            print(json.dumps({"round": r, "seconds": {k: round(v[-1], 1) for k, v in totals.items()},
                                  "resolved": resolved}))  # fmt: skip
            per_task = {k: round(sum(v) / args.tasks / args.rounds, 2) for k, v in totals.items()}
            print(json.dumps({
                "figure": "grading cost, new / baseline", "backend": args.backend, "tasks": args.tasks,
                "patches": "gold, empty, empty" if args.mix else "gold",
                "rounds": args.rounds, "total_ratio": round(sum(totals["new"]) / sum(totals["baseline"]), 3),
                "median_task_ratio": round(statistics.median(ratios), 3),
                "seconds_per_task": per_task,
            }))  # fmt: skip
        finally:
            subprocess.run([*worktree, "remove", "--force", str(base)], check=False)


if __name__ == "__main__":
    main()
