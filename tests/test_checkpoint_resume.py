"""kill -9 during an RL iteration and during a checkpoint save, then resume: the run ends with
exactly the configured iterations, one metrics row each, and a readable checkpoint."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxswe.run.metrics import read_rows

CHILD = Path(__file__).parent / "rl_toy_child.py"
ITERATIONS = 3


def _start(run_dir, *args, cache):
    env = {**os.environ, "JAXSWE_TEST_CACHE": str(cache), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(run_dir), str(ITERATIONS), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc, timeout=600):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _check_complete(run_dir):
    rows = read_rows(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, ITERATIONS + 1))
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == ITERATIONS
    assert sorted(p.name for p in (run_dir / "trajectories").glob("iter_*.jsonl")) == [
        f"iter_{i:04d}.jsonl" for i in range(1, ITERATIONS + 1)
    ]
    assert (run_dir / "plots" / "rl_curves.png").is_file()


@pytest.mark.slow
def test_kill_during_iteration_then_resume(tmp_path):
    run_dir, cache = tmp_path / "rl", tmp_path / "xla"
    proc = _start(run_dir, cache=cache)
    deadline = time.time() + 600
    while time.time() < deadline and len(read_rows(run_dir / "metrics.jsonl")) < 1:
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    time.sleep(0.5)  # now inside iteration 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_rows(run_dir / "metrics.jsonl")) < ITERATIONS
    code, out = _finish(_start(run_dir, "--resume", cache=cache))
    assert code == 0, out
    assert "resuming RL from iteration" in out
    _check_complete(run_dir)


@pytest.mark.slow
def test_kill_during_checkpoint_save_then_resume(tmp_path):
    run_dir, cache = tmp_path / "rl", tmp_path / "xla"
    code, out = _finish(_start(run_dir, "--kill-in-save", "2", cache=cache))
    assert code == -signal.SIGKILL, out
    assert [r["step"] for r in read_rows(run_dir / "metrics.jsonl")] == [1]
    code, out = _finish(_start(run_dir, "--resume", cache=cache))
    assert code == 0, out
    _check_complete(run_dir)


@pytest.mark.slow
def test_corrupt_latest_checkpoint_then_resume(tmp_path):
    """The newest checkpoint is unreadable: resume continues from the previous good one (no
    StepAlreadyExistsError when it saves that step again) and metrics.jsonl keeps every row."""
    run_dir, cache = tmp_path / "rl", tmp_path / "xla"
    code, out = _finish(_start(run_dir, cache=cache))
    assert code == 0, out
    rows = read_rows(run_dir / "metrics.jsonl")
    for f in (run_dir / "checkpoints" / str(ITERATIONS)).rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"\0garbage" * 8)
    code, out = _finish(_start(run_dir, "--resume", cache=cache))
    assert code == 0, out
    assert (
        f"checkpoints/{ITERATIONS} is unreadable" in out
        and f"resuming RL from iteration {ITERATIONS - 1}" in out
    )
    _check_complete(run_dir)
    assert [r["step"] for r in read_rows(run_dir / "metrics.jsonl")] == [r["step"] for r in rows]
    assert len(list((run_dir / "checkpoints" / "unreadable").iterdir())) == 1
