"""Persistent-shell benchmark: median command round trip, persistent shell vs one process per command.

    DOCKER_HOST=unix:///tmp/jaxswe-ci-docker/docker.sock .venv/bin/python bench/bench_shell.py --reps 50

Setups, each timed on the same commands, interleaved in a fresh random order each round (so a noisy
machine slows all alike), `--settle` seconds of sleep before each timed call (so what one call
leaves running, a container's exec cleanup, a namespace's teardown, lands on no other's timing):
  local persistent    LocalSandbox under bwrap, commands through its persistent shell (envs.sandbox.shell)
  local per-command   the same sandbox kind with `persistent_shell = False`: bwrap + setpriv per command
  mini-swe-agent      mini-swe-agent's LocalEnvironment.execute (unisolated `subprocess` with shell=True
                      on the host); `pip install mini-swe-agent`, a bench-only dependency (extra
                      `bench`); without it, its measured call (Popen(shell=True).communicate) is timed
  docker persistent   DockerSandbox, commands through one long-lived `docker exec`
  docker per-exec     DockerSandbox with `persistent_shell = False`: one `docker exec` per command
Prints a markdown table of medians (ms) and the ratios the issue asks about. `--no-docker` skips Docker.
`--grade N` also times N local gradings of the task's gold patch (about 15 sandbox calls each) with
the persistent shell and without, alternating.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from envs import DockerSandbox, LocalSandbox, load_tasks
from envs.tasks.repos import clean_template

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "builtin_tasks"
COMMANDS = {
    "true": "true",
    "echo": "echo hello",
    "cat (small file)": "cat calc.py",
    "git status": "git status",
}


class _MiniCall:
    """mini-swe-agent's LocalEnvironment, or (not installed) the call it makes, reimplemented."""

    def __init__(self, cwd: str):
        self.cwd = cwd
        try:
            from minisweagent.environments.local import LocalEnvironment

            self.env, self.name = LocalEnvironment(cwd=cwd), "mini-swe-agent LocalEnvironment"
        except ImportError:
            self.env, self.name = None, "subprocess shell=True (mini-swe-agent's call, reimplemented)"

    def exec(self, command: str):
        if self.env is not None:
            return self.env.execute({"command": command})
        proc = subprocess.Popen(
            command, shell=True, text=True, cwd=self.cwd, env=dict(os.environ),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        return proc.communicate(timeout=60)[0]

    def close(self) -> None:
        pass


def _docker_image(task) -> str:
    from envs.provision.images import task_image

    return task_image(task)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--no-docker", action="store_true")
    parser.add_argument("--settle", type=float, default=0.02, help="sleep before each timed call (s)")
    parser.add_argument("--grade", type=int, default=0, help="local gradings to time each way")
    args = parser.parse_args()
    task = load_tasks(DATA)[0]
    template = clean_template(task)
    tmp = tempfile.mkdtemp(prefix="bench-shell-")
    shutil.copytree(template, f"{tmp}/repo", symlinks=True)
    setups = {}
    try:
        setups["local persistent"] = LocalSandbox(template)
        per_command = LocalSandbox(template)
        per_command.persistent_shell = False
        setups["local per-command"] = per_command
        mini = _MiniCall(f"{tmp}/repo")
        setups["mini-swe-agent"] = mini
        if not args.no_docker:
            image = _docker_image(task)
            setups["docker persistent"] = DockerSandbox(image)
            per_exec = DockerSandbox(image)
            per_exec.persistent_shell = False
            setups["docker per-exec"] = per_exec
        for name, sb in setups.items():  # correctness and warm-up
            if name != "mini-swe-agent":
                first = sb.exec("echo hello")
                assert first.output == "hello\n" and first.exit_code == 0, (name, first)
            for _ in range(3):
                for command in COMMANDS.values():
                    sb.exec(command)
        times = {(s, c): [] for s in setups for c in COMMANDS}
        rng = random.Random(0)
        for _ in range(args.reps):
            for label, command in COMMANDS.items():
                order = list(setups.items())
                rng.shuffle(order)
                for name, sb in order:
                    time.sleep(args.settle)
                    start = time.perf_counter()
                    sb.exec(command)
                    times[name, label].append(time.perf_counter() - start)
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        notes = {
            n: getattr(sb, "shell_note", "") for n, sb in setups.items() if getattr(sb, "shell_note", "")
        }
    finally:
        for sb in setups.values():
            sb.close()
        shutil.rmtree(tmp, ignore_errors=True)
    cols = list(setups)
    ratios = [("local persistent / mini", "local persistent", "mini-swe-agent"),
              ("local per-command / mini", "local per-command", "mini-swe-agent")]  # fmt: skip
    if not args.no_docker:
        ratios.append(("docker persistent / per-exec", "docker persistent", "docker per-exec"))
    print(f"median of {args.reps} round trips, ms (mini-swe-agent: {mini.name}); cpus={os.cpu_count()}\n")
    print("| command | " + " | ".join(cols) + " | " + " | ".join(r[0] for r in ratios) + " |")
    print("|---" * (1 + len(cols) + len(ratios)) + "|")
    for label in COMMANDS:
        cells = [f"{med[c, label]:.1f}" for c in cols]
        cells += [f"{med[a, label] / med[b, label]:.2f}x" for _, a, b in ratios]
        print(f"| {label} | " + " | ".join(cells) + " |")
    for name, note in notes.items():
        print(f"\nnote ({name}): {note}")
    if args.grade:
        _grading(task, args.grade)


def _grading(task, rounds: int) -> None:
    from envs import grade

    times = {True: [], False: []}
    try:
        for _ in range(rounds):
            for persistent in (True, False):
                LocalSandbox.persistent_shell = persistent
                start = time.perf_counter()
                result = grade(task, task.patch, "local")
                times[persistent].append(time.perf_counter() - start)
                assert result.resolved, result.reason
    finally:
        LocalSandbox.persistent_shell = True
    on, off = (statistics.median(times[k]) for k in (True, False))
    print(f"\nlocal grading of {task.instance_id}'s gold patch, median of {rounds}: "
          f"persistent {on:.2f} s, per-command {off:.2f} s ({on / off:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
