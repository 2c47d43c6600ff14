"""One RL iteration of `jaxswe rl` on built-in tasks in the local sandbox, against the embedded
server over HTTP (`jaxswe serve` in a subprocess): every episode samples, the metrics are finite,
the server is handed the exported weights, and every artifact is written. (A random model rarely
yields an informative group here; that a group trains over HTTP is not yet asserted.)"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from envs.builtin import BUILTIN_DIR
from jaxswe.cli import main
from jaxswe.model.config import get_preset
from jaxswe.model.hf_io import load_hf, save_hf
from jaxswe.model.params import init_params
from jaxswe.tokenizer import build_tokenizer

TASKS = ("builtin__roman-1", "builtin__slugify-1")


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
    texts = [(BUILTIN_DIR / t / "task.json").read_text() for t in TASKS]
    texts.append((Path(__file__).parents[1] / "jaxswe" / "prompts" / "default.yaml").read_text())
    out = tmp_path / "model"
    tok = build_tokenizer(texts, 512, out)
    cfg = get_preset("tiny", vocab_size=-(-len(tok) // 64) * 64, attention="dense")
    save_hf(out, cfg, init_params(cfg, jax.random.key(0)))
    tok.save_pretrained(str(out))
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
                        "max_new_tokens": 16,
                        "export_dtype": "float32",
                    },
                    "env": {"tasks": str(task_root), "backend": "local", "max_parallel": 4},
                    "agent": {"max_turns": 2, "max_context_tokens": 2048},
                    "optimizer": {"lr": 1e-3},
                    "rl": {
                        "iterations": 1,
                        "problems_per_iteration": 2,
                        "group_size": 4,
                        "seq_len": 2048,
                        "turn_penalty_threshold": 1,
                    },
                }
            )
        )
        run_dir = tmp_path / "run"
        main(["rl", "--config", str(config), "--run-dir", str(run_dir)])  # raises SystemExit on error
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1] and rows[0]["episodes"] == 8
        row = rows[0]
        # every episode sampled tokens (the context holds the prompt) and all were checked
        assert (
            all(np.isfinite(v) for v in row.values() if isinstance(v, float)) and row["tokens_generated"] > 0
        )
        assert row["sampling_bias_tokens"] > 0 and row["logprob_gap_max_abs"] < 1e-3
        for key in ("reward_mean", "pass_rate", "mean_turns", "submit_ratio", "groups_kept", "time_rollout_s",
                    "time_weight_sync_s", "tokens_per_s"):  # fmt: skip
            assert key in rows[0]
        assert (run_dir / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
        assert list((run_dir / "tb").glob("events.out.tfevents.*"))
        assert len((run_dir / "trajectories" / "iter_0001.jsonl").read_text().splitlines()) == 8
        assert (run_dir / "checkpoints" / "1").is_dir()
        assert (run_dir / "plots" / "rl_curves.png").is_file()
        assert (run_dir / "weights" / "config.json").is_file()  # exported for the server
        before, after = (load_hf(d, dtype="float32")[1] for d in (model_dir, run_dir / "weights"))
        pairs = zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
        changed = any(not np.array_equal(a, b) for a, b in pairs)
        assert changed == (row["optimizer_steps"] > 0)  # the export is what the trainer holds
        with urllib.request.urlopen(url + "/get_model_info", timeout=10) as r:
            info = json.loads(r.read())
        assert str(run_dir / "weights") in json.dumps(info)
        assert info["weight_version"] == "1"  # the first weight sync is policy version 1
        episodes = [
            json.loads(line)
            for line in (run_dir / "trajectories" / "iter_0001.jsonl").read_text().splitlines()
        ]
        assert all(  # sampled by the starting policy (SGLang's "default", version 0)
            v == (0 if m else -1)
            for e in episodes
            for v, m in zip(e["policy_versions"], e["loss_mask"], strict=True)
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
