"""One RL iteration of `jaxswe rl` on built-in tasks in the local sandbox, against the embedded
server over HTTP (`jaxswe serve` in a subprocess). The policy is tests/half_solver.py's tiny model,
which resolves each task about half the time, so groups are informative: at least one group
trains, the metrics are finite, the trained weights differ from the starting ones, and the server
is handed them (it serves weight_version 1 from the export, which holds what the trainer holds)."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import jax
import numpy as np
import pytest
import yaml
from half_solver import half_solving_model

from envs.builtin import BUILTIN_DIR
from jaxswe.cli import main
from jaxswe.config import config_from_dict
from jaxswe.model import token_logprobs
from jaxswe.model.export import load_stage
from jaxswe.model.hf_io import load_hf
from jaxswe.stages.runtime import load_pool

TASKS = ("builtin__roman-1", "builtin__slugify-1")
AGENT = {"prompts": "demo", "window_lines": 5, "max_turns": 4, "max_context_tokens": 640}
GROUP = 6  # an even split leaves a group of 6 uninformative with probability 1/32


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.fixture
def task_root(tmp_path):
    root = tmp_path / "tasks"
    root.mkdir()
    for t in TASKS:
        (root / t).symlink_to(BUILTIN_DIR / t)
    return root


@pytest.fixture
def model_dir(tmp_path, task_root):
    out = tmp_path / "model"
    env = {"tasks": str(task_root), "backend": "local"}
    half_solving_model(
        config_from_dict({"name": "x", "agent": AGENT, "env": env}), load_pool(str(task_root)), out
    )
    return out


@pytest.mark.slow
def test_one_rl_iteration_over_http(tmp_path, task_root, model_dir):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaxswe",
            "serve",
            "--model",
            str(model_dir),
            "--port",
            str(port),
            "--max-context",
            "2048",
            "--max-batch",
            "4",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        _wait_healthy(url, server)
        config = tmp_path / "rl.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "name": "http-test",
                    "model": {
                        "path": str(model_dir),
                        "dtype": "float32",
                        "attention": "dense",
                        "remat": "none",
                    },
                    "rollout": {  # float32 weight syncs: the gap check below is exact numerics
                        "engine": "http",
                        "urls": [url],
                        "max_new_tokens": 256,
                        "export_dtype": "float32",
                    },
                    "env": {"tasks": str(task_root), "backend": "local", "max_parallel": 4},
                    "agent": AGENT,
                    "optimizer": {"lr": 1e-3},
                    "rl": {
                        "iterations": 1,
                        "problems_per_iteration": 2,
                        "group_size": GROUP,
                        "seq_len": 640,
                        "turn_penalty_threshold": 3,
                    },
                }
            )
        )
        run_dir = tmp_path / "run"
        main(["rl", "--config", str(config), "--run-dir", str(run_dir)])  # raises SystemExit on error
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1] and rows[0]["episodes"] == 2 * GROUP
        row = rows[0]
        # every episode sampled tokens (the context holds the prompt) and all were checked
        assert (
            all(np.isfinite(v) for v in row.values() if isinstance(v, float)) and row["tokens_generated"] > 0
        )
        assert row["sampling_bias_tokens"] > 0 and row["logprob_gap_max_abs"] < 1e-3
        assert row["sampling_bias_alarm"] == 0  # a near-deterministic policy, sampled without bias
        for key in ("reward_mean", "pass_rate", "mean_turns", "submit_ratio", "groups_kept", "time_rollout_s",
                    "time_weight_sync_s", "tokens_per_s"):  # fmt: skip
            assert key in rows[0]
        assert (run_dir / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
        assert list((run_dir / "tb").glob("events.out.tfevents.*"))
        assert len((run_dir / "trajectories" / "iter_0001.jsonl").read_text().splitlines()) == 2 * GROUP
        assert (run_dir / "checkpoints" / "1").is_dir()
        assert (run_dir / "plots" / "rl_curves.png").is_file()
        assert (run_dir / "weights" / "config.json").is_file()  # exported for the server
        before, after = (load_hf(d, dtype="float32")[1] for d in (model_dir, run_dir / "weights"))
        pairs = zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
        assert any(not np.array_equal(a, b) for a, b in pairs)  # trained, and exported as trained
        trained = load_stage(run_dir)[1]  # the RL checkpoint: the export holds what the trainer holds
        for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(after), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        with urllib.request.urlopen(url + "/get_model_info", timeout=10) as r:
            info = json.loads(r.read())
        assert str(run_dir / "weights") in json.dumps(info)
        assert info["weight_version"] == "1"  # the first weight sync is policy version 1
        episodes = [
            json.loads(line)
            for line in (run_dir / "trajectories" / "iter_0001.jsonl").read_text().splitlines()
        ]
        # graded both ways by the tasks' tests; at least one group trained
        assert {e["resolved"] for e in episodes} == {True, False} and row["infra_failures"] == 0
        assert row["groups_kept"] >= 1 and row["optimizer_steps"] > 0 and row["trajectories_trained"] > 0
        assert all(  # sampled by the starting policy (SGLang's "default", version 0)
            v == (0 if m else -1)
            for e in episodes
            for v, m in zip(e["policy_versions"], e["loss_mask"], strict=True)
        )
        # the server now scores tokens with the trained weights: its prompt log-probs of an episode
        # equal the trainer's under the checkpoint's params
        ids = episodes[0]["input_ids"]
        request = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                   "logprob_start_len": 0}  # fmt: skip
        post = urllib.request.Request(url + "/generate", json.dumps(request).encode(), method="POST",
                                      headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(post, timeout=120) as r:
            served = [e[0] for e in json.loads(r.read())["meta_info"]["input_token_logprobs"][1:]]
        mine = np.asarray(token_logprobs(trained, load_hf(model_dir)[0], np.asarray([ids], np.int32)))[0, 1:]
        np.testing.assert_allclose(served, mine, atol=1e-4)
    finally:
        server.terminate()
        server.wait(timeout=30)
