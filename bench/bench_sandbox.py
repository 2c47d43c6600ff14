"""Sandbox benchmark: command round-trip latency vs mini-swe-agent, start + grade time, concurrency.

    DOCKER_HOST=unix:///tmp/jaxswe-ci-docker/docker.sock .venv/bin/python bench/bench_sandbox.py

Needs a Docker engine with the base image (`.ci/docker.sh start`) and, for the comparison,
`pip install mini-swe-agent` (not a dependency of jaxswe). Prints one JSON object per figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from envs import DockerSandbox, LocalSandbox, grade, load_tasks, open_sandbox
from envs.provision.images import task_image
from envs.tasks.repos import clean_template

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "builtin_tasks"
COMMANDS = {
    "true": "true",
    "cat file": "cat calc.py",
    "pytest -q": "python3 -m pytest -q -p no:cacheprovider",
}


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 1)


def _emit(**row) -> None:
    print(json.dumps(row), flush=True)


def latency(task, reps: int, mini: bool) -> None:
    image, _ = task_image(task)
    runners = {
        "jaxswe LocalSandbox": lambda: LocalSandbox(clean_template(task)),
        "jaxswe DockerSandbox": lambda: DockerSandbox(image),
    }
    if mini:
        from minisweagent.environments.docker import DockerEnvironment
        from minisweagent.environments.local import LocalEnvironment

        tmp = tempfile.mkdtemp(prefix="bench-mini-")
        import shutil

        shutil.copytree(clean_template(task), f"{tmp}/repo")
        runners["mini-swe-agent LocalEnvironment"] = lambda: LocalEnvironment(cwd=f"{tmp}/repo")
        runners["mini-swe-agent DockerEnvironment"] = lambda: DockerEnvironment(image=image, cwd="/testbed")
    for name, make in runners.items():
        env = make()
        run = env.exec if hasattr(env, "exec") else (lambda c, env=env: env.execute({"command": c}))
        try:
            for label, command in COMMANDS.items():
                _emit(
                    bench="latency",
                    env=name,
                    command=label,
                    median_ms=_median_ms(lambda r=run, c=command: r(c), reps),
                )
        finally:
            (env.close if hasattr(env, "close") else getattr(env, "cleanup", lambda: None))()


def start_and_grade(tasks, backend: str) -> None:
    for task in tasks:
        start = time.perf_counter()
        with open_sandbox(task, backend) as sb:
            opened = time.perf_counter() - start
            sb.exec("true")
        start = time.perf_counter()
        result = grade(task, task.patch, backend)
        _emit(bench="start+grade", backend=backend, task=task.instance_id, start_s=round(opened, 2),
              grade_s=round(time.perf_counter() - start, 2), resolved=result.resolved)  # fmt: skip


def throughput(task, backend: str, concurrency: int, episodes: int) -> None:
    def episode(_: int) -> None:
        with open_sandbox(task, backend) as sb:
            for command in (
                "cat calc.py",
                "grep -n add calc.py",
                "python3 -m pytest -q -p no:cacheprovider",
                "git diff",
            ):
                sb.exec(command)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(episode, range(episodes)))
    wall = time.perf_counter() - start
    _emit(bench="throughput", backend=backend, concurrency=concurrency, episodes=episodes,
          wall_s=round(wall, 1), episodes_per_min=round(episodes / wall * 60, 1))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[8, 32])
    parser.add_argument("--backends", nargs="*", default=["local", "docker"])
    parser.add_argument("--no-mini", action="store_true", help="skip the mini-swe-agent comparison")
    args = parser.parse_args()
    tasks = load_tasks(DATA)
    latency(tasks[0], args.reps, not args.no_mini)
    for backend in args.backends:
        start_and_grade(tasks, backend)
        for c in args.concurrency:
            throughput(tasks[0], backend, c, episodes=c)


if __name__ == "__main__":
    main()
