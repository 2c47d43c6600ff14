"""Same seed, same run: the synchronous RL stage (rl.max_staleness 0) writes the same metrics rows
(timings aside) and the same trajectories, bit for bit, however many episodes are in flight, so
whatever the load and timing that decide which requests the embedded sampler batches together."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, user_env

CONFIG = ROOT / "configs" / "toy-rl.yaml"


def _untimed(record: dict) -> dict:
    """A metrics row or trajectory without its wall-clock fields (time_*, *_per_s, timings)."""
    return {
        k: v
        for k, v in record.items()
        if k != "timings" and not k.startswith("time_") and not k.endswith("_per_s")
    }


def _run(run_dir: Path, episodes_in_flight: int) -> tuple[list[dict], list[dict]]:
    """(metrics rows, trajectories) of a 2-iteration toy RL stage from the CLI."""
    sets = ("rl.iterations=2", "rl.problems_per_iteration=3", "rl.resample_to_fill=false",
            "rl.trajectories_per_step=8", "rl.rows_per_step=8", "rl.max_staleness=0",
            f"env.max_parallel={episodes_in_flight}")  # fmt: skip
    argv = [
        "rl",
        "--config",
        str(CONFIG),
        "--run-dir",
        str(run_dir),
        *(a for s in sets for a in ("--set", s)),
    ]
    env = user_env()
    done = subprocess.run(
        [sys.executable, "-m", "jaxswe", *argv], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stage = run_dir / "rl"
    rows = [_untimed(json.loads(line)) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    episodes = [
        _untimed(json.loads(line))
        for path in sorted((stage / "trajectories").glob("iter_*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return rows, episodes


@pytest.mark.slow
def test_k0_rows_and_trajectories_do_not_depend_on_episodes_in_flight(tmp_path):
    """All 24 episodes of a round in flight against 3 at a time (batches of 1-3 requests, composed
    by timing): the same rows (the update's metrics included) and episodes, rollout log-probs
    included. With rollout.deterministic_inference false a request's padded prompt length follows
    the longest prompt batched with it: then 6 of the 48 episodes' log-probs (by up to 2.4e-7) and
    the second row differ (measured)."""
    rows_all, episodes_all = _run(tmp_path / "all", 24)
    rows_few, episodes_few = _run(tmp_path / "few", 3)
    assert len(rows_all) == 2 and len(episodes_all) == 48
    assert rows_all[-1]["optimizer_steps"] > 0 and any(e["rollout_logprobs"] for e in episodes_all)
    assert rows_few == rows_all
    assert episodes_few == episodes_all
