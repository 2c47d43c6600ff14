"""Sandbox pool benchmark: episodes per minute on 1 vs 2 Docker engines, in the same run.

    DOCKER_HOST=unix:///tmp/jaxswe-ci-docker/docker.sock .venv/bin/python bench/bench_engines.py \
        [--second unix:///tmp/jaxswe-docker2/docker.sock] [--concurrency 8] [--episodes 32]

An episode: a sandbox from the pool (envs.provision.engines.EnginePool), a few commands (`ls`, `cat`, a
`git status`, one `python3 -c`), close. `--concurrency` episodes are in flight at once; each engine's
capacity is the concurrency (so with 2 engines placement spreads them over both). Without
`--second` the script starts its own second engine (`.ci/docker.sh start` with a private directory,
no base image: the pool copies it there first; that copy is warm-up, not timed) and stops it at the
end. The rounds alternate 1 engine, 2 engines, ... after a warm-up episode on each engine. Prints one
JSON line per round and a summary line with the ratio (2 engines / 1 engine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from envs import load_tasks
from envs.provision.engines import EnginePool, EngineSpec

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "builtin_tasks"
COMMANDS = ("ls", "cat calc.py", "git status --short", "python3 -c 'print(sum(range(10**5)))'")


def _docker_sh(action: str, directory: str) -> None:
    env = {**os.environ, "JAXSWE_CI_DOCKER_DIR": directory, "JAXSWE_CI_DOCKER_BASE": "0"}
    done = subprocess.run(
        ["bash", str(ROOT / ".ci/docker.sh"), action], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"bench_engines: .ci/docker.sh {action} failed: {done.stderr[-1000:]}")


def episode(pool: EnginePool, task) -> str:
    with pool.open(task, wait_s=600) as sandbox:
        for command in COMMANDS:
            result = sandbox.exec(command, timeout=60)
            if result.exit_code != 0:
                raise RuntimeError(f"{command}: {result.output[-300:]}")
        return sandbox.engine.name


def rate(pool: EnginePool, task, episodes: int, concurrency: int) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        placed = list(ex.map(lambda _: episode(pool, task), range(episodes)))
    elapsed = time.perf_counter() - start
    return episodes / elapsed * 60, {name: placed.count(name) for name in sorted(set(placed))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", default="default", help="the first engine (default: DOCKER_HOST)")
    parser.add_argument("--second", help="the second engine's URL (default: start one)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=32, help="per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per setting (alternating)")
    args = parser.parse_args()
    task = load_tasks(DATA)[0]
    directory = None
    if args.second is None:
        directory = tempfile.mkdtemp(prefix="jaxswe-bench-engine2-", dir="/tmp")
        _docker_sh("start", directory)
        args.second = f"unix://{directory}/docker.sock"
    try:
        one = EnginePool([EngineSpec(args.first, capacity=args.concurrency, name="first")])
        two = EnginePool([EngineSpec(args.first, capacity=args.concurrency, name="first"),
                          EngineSpec(args.second, capacity=args.concurrency, name="second")])  # fmt: skip
        for engine in two.engines:  # warm-up: the task image on each engine (copied / built there)
            t0 = time.perf_counter()
            two.task_image(engine, task)
            print(
                json.dumps({"warm_up": engine.name, "image_s": round(time.perf_counter() - t0, 1)}),
                flush=True,
            )
        episode(one, task)
        rates: dict[int, list[float]] = {1: [], 2: []}
        for r in range(args.rounds):
            for n, pool in ((1, one), (2, two)):
                per_min, placed = rate(pool, task, args.episodes, args.concurrency)
                rates[n].append(per_min)
                row = {"round": r, "engines": n, "episodes_per_min": round(per_min, 1), "placed": placed}
                print(json.dumps(row), flush=True)
        mean = {n: sum(v) / len(v) for n, v in rates.items()}
        print(json.dumps({
            "episodes_per_min_1_engine": round(mean[1], 1), "episodes_per_min_2_engines": round(mean[2], 1),
            "ratio_2_over_1": round(mean[2] / mean[1], 2), "concurrency": args.concurrency,
            "episodes_per_round": args.episodes, "cpus": os.cpu_count(),
            "load_avg": round(os.getloadavg()[0], 1),
        }), flush=True)  # fmt: skip
        one.close()
        two.close()
    finally:
        if directory is not None:
            _docker_sh("stop", directory)
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
