"""Exact resume: RL on the toy game killed with SIGKILL during an iteration, killed again while a
checkpoint is being written, resumed, then resumed once more from a corrupted newest checkpoint,
writes the same metrics rows (timings aside) and the same trajectories as a run never stopped.
The interrupted run checkpoints every 2 iterations (`rl.checkpoint_every`), the reference every
iteration: the cadence changes nothing but where a resume starts."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TESTS, user_env

from jaxswe.run.metrics import read_rows

CHILD = TESTS / "rl_toy_child.py"
ITERATIONS = 3


def _start(run_dir, *args, cache, every=2):
    env = user_env()
    env |= {"JAXSWE_TEST_CACHE": str(cache), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(run_dir), str(ITERATIONS), "--checkpoint-every", str(every), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc, timeout=600):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _timing(key: str) -> bool:
    return key.startswith("time_") or key.endswith("_per_s")


def _record(run_dir: Path) -> tuple[list[dict], list[list[dict]]]:
    """(metrics rows without timings, every iteration's episodes without their timings)."""
    rows = [{k: v for k, v in r.items() if not _timing(k)} for r in read_rows(run_dir / "metrics.jsonl")]
    episodes = []
    for f in sorted((run_dir / "trajectories").glob("iter_*.jsonl")):
        lines = [json.loads(line) for line in f.read_text().splitlines()]
        episodes.append([{k: v for k, v in e.items() if k != "timings"} for e in lines])
    return rows, episodes


def _check_complete(run_dir, want):
    rows, episodes = _record(run_dir)
    assert [r["step"] for r in rows] == list(range(1, ITERATIONS + 1))
    assert rows == want[0]  # floats too: the same weights, the same episodes
    assert episodes == want[1]
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == ITERATIONS
    assert (run_dir / "plots" / "rl_curves.png").is_file()


@pytest.mark.slow
def test_killed_anywhere_and_resumed_equals_the_uninterrupted_run(tmp_path):
    cache = tmp_path / "xla"
    whole = tmp_path / "whole"
    code, out = _finish(_start(whole, cache=cache, every=1))
    assert code == 0, out
    want = _record(whole)
    assert len(want[1]) == ITERATIONS and sum(r["optimizer_steps"] for r in want[0]) > 0  # it trained

    run_dir = tmp_path / "rl"
    proc = _start(run_dir, cache=cache)  # 1. SIGKILL inside iteration 2, before the first checkpoint
    deadline = time.time() + 600
    while time.time() < deadline and len(read_rows(run_dir / "metrics.jsonl")) < 1:
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_rows(run_dir / "metrics.jsonl")) == 1

    # 2. resumed: no checkpoint, so from the start (row 1 written again); SIGKILLed while
    # checkpoint 3 is being written
    code, out = _finish(_start(run_dir, "--resume", "--kill-in-save", str(ITERATIONS), cache=cache))
    assert code == -signal.SIGKILL and "resuming RL from iteration" not in out, out
    assert [r["step"] for r in read_rows(run_dir / "metrics.jsonl")] == [1, 2]

    code, out = _finish(_start(run_dir, "--resume", cache=cache))  # 3. resumed to the end
    assert code == 0, out
    _check_complete(run_dir, want)

    # 4. the newest checkpoint unreadable: resume continues from the previous good one (no
    # StepAlreadyExistsError when it saves that step again), redoes the last iteration exactly
    for f in (run_dir / "checkpoints" / str(ITERATIONS)).rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"\0garbage" * 8)
    code, out = _finish(_start(run_dir, "--resume", cache=cache))
    assert code == 0, out
    assert f"checkpoints/{ITERATIONS} is unreadable" in out
    assert f"resuming RL from iteration {ITERATIONS - 1}" in out
    _check_complete(run_dir, want)
    assert len(list((run_dir / "checkpoints" / "unreadable").iterdir())) == 1
    assert "1" not in {p.name for p in (run_dir / "checkpoints").iterdir()}  # every 2 iterations
