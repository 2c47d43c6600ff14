"""A short RL run over HTTP trains on tasks that `jaxswe tasks mine` mined from real repositories.

Two commits of the shared repositories are mined as a user mines them (`jaxswe tasks mine REPO
--limit 1` on a clone at the commit): toolz 5a7e078 and boltons 435774e. `jaxswe rl` then runs one
iteration on them against the embedded server over HTTP (`jaxswe serve` in a subprocess), in the
local bubblewrap sandbox with each task's venv, graded by the tasks' own tests (real git and
pytest). The policy is tests/half_solver.py's tiny model, SFT'd on each task's gold-command
demonstration and a submit-at-once one, so it resolves each task about half the time: groups are
informative, and RL must train on them. The server is handed the trained weights (it serves
weight_version 1 from the export, which holds what the trainer holds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from half_solver import half_solving_model
from helpers import REPOS, free_port

from envs.tasks.records import load_tasks
from jaxswe.agent.trajectory import load_jsonl
from jaxswe.cli import main
from jaxswe.config import config_from_dict
from jaxswe.model import token_logprobs
from jaxswe.model.hf_io import load_hf
from jaxswe.policy import load_policy

MINED = (  # (bundle, commit, owner/name, install recipe)
    ("toolz", "5a7e078", "pytoolz/toolz", {"test_cmd": "pytest -rA"}),
    # boltons' conftest predates pytest 9 (docs/tasks.md)
    ("boltons", "435774e", "mahmoud/boltons", {"test_cmd": "pytest -rA", "pip_packages": ["pytest~=7.4"]}),
)
AGENT = {"prompts": "demo", "window_lines": 5, "max_turns": 4, "max_context_tokens": 640}
GROUP = 6  # an even split leaves a group of 6 uninformative with probability 1/32


def _wait_healthy(url, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(url)


def _serve(model_dir: Path, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "jaxswe", "serve", "--model", str(model_dir), "--port", str(port),
            "--max-context", "2048", "--max-batch", "4"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})  # fmt: skip


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
def test_short_rl_run_over_http_trains_on_mined_tasks(tmp_path):
    if not (REPOS / "toolz.bundle").is_file():
        pytest.skip("shared repositories missing")
    tasks_file = _mine(tmp_path)
    tasks = load_tasks(tasks_file)
    env = {"tasks": str(tasks_file), "backend": "local", "command_timeout_s": 60, "max_parallel": 8}
    model_dir = tmp_path / "model"
    half_solving_model(
        config_from_dict({"name": "x", "agent": AGENT, "env": env}), tasks, model_dir, steps=100
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serve(model_dir, port)
    try:
        _wait_healthy(url, server)
        config = tmp_path / "rl.yaml"
        config.write_text(yaml.safe_dump({
            "name": "mined-rl",
            "model": {"path": str(model_dir), "dtype": "float32", "attention": "dense", "remat": "none"},
            "optimizer": {"lr": 1e-3, "weight_decay": 0.0},
            # float32 weight syncs: the log-prob checks below are exact numerics
            "rollout": {"engine": "http", "urls": [url], "max_new_tokens": 256, "export_dtype": "float32"},
            "agent": AGENT,
            "env": {k: v for k, v in env.items() if k != "tasks"},  # the task file comes with --tasks
            "mesh": {"devices": 1},  # the RL loop, not sharding (tests/stages/test_stages_handoff.py)
            "rl": {"iterations": 1, "problems_per_iteration": 2, "group_size": GROUP, "seq_len": 640,
                   "turn_penalty_threshold": 3},
        }))  # fmt: skip
        run_dir = tmp_path / "run"
        main(["rl", "--config", str(config), "--run-dir", str(run_dir), "--tasks", str(tasks_file)])
        _check_run(run_dir / "rl", model_dir, tasks, url)  # RUN_DIR/<stage>
    finally:
        server.terminate()
        server.wait(timeout=30)


def _check_run(run_dir: Path, model_dir: Path, tasks, url: str) -> None:
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = load_jsonl(run_dir / "trajectories" / "iter_0001.jsonl")
    assert row["step"] == 1 and row["episodes"] == len(episodes) == 2 * GROUP and row["infra_failures"] == 0
    assert {e.task_id for e in episodes} == {t.instance_id for t in tasks}
    # graded by the tasks' tests in fresh sandboxes: both outcomes occur
    assert all(e.grading_s > 0 for e in episodes if e.ended_by == "submitted")
    assert {e.resolved for e in episodes} == {True, False}
    assert not any(e.resolved for e in episodes if e.num_turns == 1)  # submitted unchanged code
    # at least one group trained, with finite metrics; every episode sampled and was checked
    assert row["groups_kept"] >= 1 and row["optimizer_steps"] > 0 and row["trajectories_trained"] > 0
    assert all(np.isfinite(v) for v in row.values() if isinstance(v, float)) and row["tokens_generated"] > 0
    assert row["sampling_bias_tokens"] > 0 and row["logprob_gap_max_abs"] < 1e-3
    assert row["sampling_bias_alarm"] == 0  # the alarm's stop is on: a false alarm fails the stage
    for key in ("reward_mean", "pass_rate", "mean_turns", "submit_ratio", "time_rollout_s",
                "time_weight_sync_s", "tokens_per_s"):  # fmt: skip
        assert key in row
    assert (run_dir / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "1").is_dir() and (run_dir / "plots" / "rl_curves.png").is_file()
    assert all(  # sampled by the starting policy (SGLang's "default", version 0)
        v == (0 if m else -1) for e in episodes for v, m in zip(e.policy_versions, e.loss_mask, strict=True)
    )
    # trained, exported as trained (the export holds what the trainer's checkpoint holds)
    before, after = (load_hf(d, dtype="float32")[1] for d in (model_dir, run_dir / "weights"))
    pairs = zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
    assert any(not np.array_equal(a, b) for a, b in pairs)
    trained = load_policy(run_dir).params
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the server serves the export as weight_version 1 and scores tokens with the trained weights
    with urllib.request.urlopen(url + "/get_model_info", timeout=10) as r:
        info = json.loads(r.read())
    assert str(run_dir / "weights") in json.dumps(info) and info["weight_version"] == "1"
    ids = episodes[0].input_ids
    request = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
               "logprob_start_len": 0}  # fmt: skip
    post = urllib.request.Request(url + "/generate", json.dumps(request).encode(), method="POST",
                                  headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(post, timeout=120) as r:
        served = [e[0] for e in json.loads(r.read())["meta_info"]["input_token_logprobs"][1:]]
    mine = np.asarray(token_logprobs(trained, load_hf(model_dir)[0], np.asarray([ids], np.int32)))[0, 1:]
    np.testing.assert_allclose(served, mine, atol=1e-4)
