"""A short RL run trains on tasks that `jaxswe tasks mine` mined from real repositories.

Two commits of the shared repositories are mined as a user mines them (`jaxswe tasks mine REPO
--limit 1` on a clone at the commit): toolz 5a7e078 and boltons 435774e. `jaxswe rl` then runs one
iteration on them in the local bubblewrap sandbox with each task's venv, graded by the tasks' own
tests (real git and pytest). The policy is tests/half_solver.py's tiny model, SFT'd on each task's
gold-command demonstration and a submit-at-once one, so it resolves each task about half the
time: groups are informative, and RL must train on them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from half_solver import half_solving_model

from envs.tasks import load_tasks
from jaxswe.cli import main
from jaxswe.config import config_from_dict
from jaxswe.model.export import load_stage
from jaxswe.model.hf_io import load_hf

REPOS = Path(__file__).resolve().parents[2] / "shared" / "repos"  # ../shared beside the checkout (CI too)
MINED = (  # (bundle, commit, owner/name, install recipe)
    ("toolz", "5a7e078", "pytoolz/toolz", {"test_cmd": "pytest -rA"}),
    # boltons' conftest predates pytest 9 (docs/tasks.md)
    ("boltons", "435774e", "mahmoud/boltons", {"test_cmd": "pytest -rA", "pip_packages": ["pytest~=7.4"]}),
)
AGENT = {"prompts": "demo", "window_lines": 5, "max_turns": 4, "max_context_tokens": 640}


def _mine(tmp_path: Path) -> Path:
    """Mine each commit with the CLI into one task file."""
    out = tmp_path / "mined.jsonl"
    lines = []
    for bundle, commit, name, recipe in MINED:
        repo = tmp_path / "repos" / bundle
        subprocess.run(["git", "clone", "-q", str(REPOS / f"{bundle}.bundle"), str(repo)], check=True)
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", commit], check=True)
        mined = tmp_path / f"{bundle}.jsonl"
        main(["tasks", "mine", str(repo), "--limit", "1", "--runs", "1", "--name", name,
              "--install", json.dumps(recipe), "--out", str(mined)])  # fmt: skip
        lines += mined.read_text().splitlines()
    assert len(lines) == len(MINED), lines  # each commit is a valid task
    out.write_text("".join(line + "\n" for line in lines))
    return out


@pytest.mark.slow
def test_short_rl_run_trains_on_mined_tasks(tmp_path):
    if not (REPOS / "toolz.bundle").is_file():
        pytest.skip("shared repositories missing")
    tasks_file = _mine(tmp_path)
    tasks = load_tasks(tasks_file)
    env = {"tasks": str(tasks_file), "backend": "local", "command_timeout_s": 60, "max_parallel": 8}
    model_dir = tmp_path / "model"
    half_solving_model(
        config_from_dict({"name": "x", "agent": AGENT, "env": env}), tasks, model_dir, steps=100
    )

    config = tmp_path / "rl.yaml"
    config.write_text(yaml.safe_dump({
        "name": "mined-rl",
        "model": {"path": str(model_dir), "dtype": "float32", "attention": "dense", "remat": "none"},
        "optimizer": {"lr": 1e-3, "weight_decay": 0.0},
        "rollout": {"engine": "embedded", "max_new_tokens": 256, "max_batch": 16},
        "agent": AGENT,
        "env": env,
        "rl": {"iterations": 1, "problems_per_iteration": 2, "group_size": 6, "seq_len": 640,
               "turn_penalty_threshold": 3},
    }))  # fmt: skip
    run_dir = tmp_path / "run"
    main(["rl", "--config", str(config), "--run-dir", str(run_dir)])

    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = [
        json.loads(line) for line in (run_dir / "trajectories" / "iter_0001.jsonl").read_text().splitlines()
    ]
    assert row["episodes"] == len(episodes) == 12 and row["infra_failures"] == 0
    assert {e["task_id"] for e in episodes} == {t.instance_id for t in tasks}
    # graded by the tasks' tests in fresh sandboxes: both outcomes occur
    assert all(e["grading_s"] > 0 for e in episodes if e["ended_by"] == "submitted")
    assert {e["resolved"] for e in episodes} == {True, False}
    assert not any(e["resolved"] for e in episodes if e["num_turns"] == 1)  # submitted unchanged code
    # at least one group trained, with finite metrics
    assert row["groups_kept"] >= 1 and row["optimizer_steps"] > 0 and row["trajectories_trained"] > 0
    assert all(np.isfinite(v) for v in row.values() if isinstance(v, float))
    assert row["logprob_gap_max_abs"] < 1e-3  # the embedded engine samples with the trainer's weights
    assert row["sampling_bias_alarm"] == 0  # the alarm's stop is on: a false alarm fails the stage
    # the weights changed
    before = load_hf(model_dir, dtype="float32")[1]
    after = load_stage(run_dir)[1]
    pairs = list(zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True))
    assert all(a.shape == b.shape for a, b in pairs)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
