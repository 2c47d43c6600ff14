"""The cluster in a box: `jaxswe rl` as 2 trainer processes x 4 CPU devices (gloo collectives),
2 `jaxswe serve` workers behind the real `sglang-router`, sandboxes over 2 Docker engines, k = 1
(rl.max_staleness 1: episodes run while the trainer trains), built-in tasks graded by their tests.
Once the first iteration is done, one worker is killed (SIGKILL) and one engine stopped while it
holds sandboxes. The run finishes; every episode drawn is accounted for (trained, dropped with
its group, an infrastructure failure with its reason, or not taken when the stage ended); the
metrics show the failures; the final weights load in `transformers` and give the trainer's
log-probs. Also the multi-host path's own facts: process 0's pump feeds both processes, every
sync pauses, loads and continues the live worker, the trained tokens are at most one version
old, and process 1 writes nothing but its checkpoint and weight shards."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from half_solver import half_solving_model
from helpers import free_port
from second_engine import docker_sh, second_engine
from test_multiprocess import _audited, _spawn, _wait, _written

from envs.tasks.records import load_builtin
from jaxswe.agent.trajectory import load_jsonl
from jaxswe.config import config_from_dict
from jaxswe.run.metrics import read_rows

pytestmark = [pytest.mark.slow, pytest.mark.docker]
engines = second_engine
TASKS = ["builtin__roman-1", "builtin__slugify-1"]
AGENT = {"prompts": "demo", "window_lines": 5, "max_turns": 4, "max_context_tokens": 640}
ITERATIONS, GROUP = 4, 4


def _get(url: str, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _until(what: str, check, timeout: float, procs=()) -> None:
    deadline = time.time() + timeout
    while not check():
        for p in procs:
            assert p.poll() is None, f"{p.args[:4]} exited {p.returncode}:\n{p.log.read_text()[-3000:]}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2):
            return True
    except OSError:
        return False


def _router(port: int, workers: list[str], log: Path) -> subprocess.Popen:
    """The real sglang-router (pip) in front of `workers`, up once it lists them all healthy (it
    answers /health before it knows any worker); its metrics on a port of its own (the default,
    29000, makes a second router on the host panic)."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *workers, "--policy", "round_robin", "--log-level", "warn",
           "--health-check-interval-secs", "1", "--prometheus-port", str(free_port())]  # fmt: skip
    router = _spawn(cmd, 1, log.parent, log)

    def listed() -> bool:
        try:
            return (
                sum(w.get("is_healthy", False) for w in _get(f"http://127.0.0.1:{port}/workers")["workers"])
                == 2
            )
        except (OSError, ValueError, KeyError):
            return False

    _until("the router's workers", listed, 120, [router])
    return router


def _sandboxes(url: str) -> int:
    """How many jaxswe sandboxes the engine at `url` runs (0 when it does not answer)."""
    import docker

    try:
        client = docker.DockerClient(base_url=url, timeout=5)
        return len(client.containers.list(filters={"label": "jaxswe.sandbox"}))
    except Exception:
        return 0


@pytest.mark.timeout(900)
def test_cluster_in_a_box_survives_a_dead_worker_and_a_dead_engine(tmp_path, engines):
    pytest.importorskip("sglang_router")  # the dev extra installs it
    first, second, directory = engines
    tasks = [t for t in load_builtin() if t.instance_id in TASKS]
    model = tmp_path / "model"
    env = {"tasks": "builtin", "backend": "local", "command_timeout_s": 60, "max_parallel": 8}
    half_solving_model(config_from_dict({"name": "x", "agent": AGENT, "env": env}), tasks, model, steps=60)

    ports = [free_port(), free_port()]
    workers = [f"http://127.0.0.1:{p}" for p in ports]
    procs: list[subprocess.Popen] = []
    try:
        for p in ports:
            cmd = [sys.executable, "-m", "jaxswe", "serve", "--model", str(model), "--port", str(p),
                   "--max-context", "1024", "--max-batch", "4"]  # fmt: skip
            procs.append(_spawn(cmd, 1, tmp_path / "serve_xla", tmp_path / f"worker_{p}.txt"))
        for url in workers:
            _until(url, lambda url=url: _answers(url), 300, procs)
        router_port = free_port()
        procs.append(_router(router_port, workers, tmp_path / "router.txt"))
        cfg = {
            "name": "cluster",
            "task_subset": TASKS,
            "model": {"path": str(model), "dtype": "float32", "attention": "dense", "remat": "none"},
            "optimizer": {"lr": 1e-3, "weight_decay": 0.0},
            "rollout": {
                "engine": "http",
                "urls": workers,
                "router": f"http://127.0.0.1:{router_port}",
                "max_new_tokens": 256,
                "export_dtype": "float32",
            },  # fmt: skip
            "agent": AGENT,
            "env": {
                **env,
                "backend": "docker",
                "docker_health_interval_s": 1,
                "docker_hosts": [
                    {"url": first, "name": "ci", "capacity": 4},
                    {"url": second, "name": "second", "capacity": 4},
                ],
            },  # fmt: skip
            "rl": {
                "iterations": ITERATIONS,
                "problems_per_iteration": 2,
                "group_size": GROUP,
                "max_staleness": 1,
                "seq_len": 640,
                "turn_penalty_threshold": 3,
                "trajectories_per_step": 4,
                "rows_per_step": 8,
            },  # fmt: skip
            "eval": {"after_stage": False},
        }
        (tmp_path / "rl.yaml").write_text(yaml.safe_dump(cfg))
        run = tmp_path / "run"
        stage = run / "rl"
        trainers = _audited(["rl", "--config", str(tmp_path / "rl.yaml"), "--run-dir", str(run)], run, 2,
                            tmp_path / "xla")  # fmt: skip
        metrics = stage / "metrics.jsonl"
        _until("iteration 1", lambda: metrics.is_file() and read_rows(metrics), 600, trainers)
        _until("sandboxes on the second engine", lambda: _sandboxes(second) >= 2, 120, trainers)
        procs[1].send_signal(signal.SIGKILL)  # worker 1 dies with requests in flight
        assert docker_sh("stop", directory).returncode == 0  # the second engine dies under its sandboxes
        outs = _wait(trainers, timeout=600)
        assert _get(workers[0] + "/get_weight_version")["weight_version"] == str(ITERATIONS)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    rows = read_rows(metrics)
    summary = json.loads((stage / "summary.json").read_text())
    assert [r["step"] for r in rows] == list(range(1, ITERATIONS + 1))
    # every episode drawn is accounted for
    recorded = 0
    reasons = []
    for row in rows:
        episodes = load_jsonl(stage / "trajectories" / f"iter_{row['step']:04d}.jsonl")
        recorded += len(episodes)
        assert row["episodes"] == len(episodes) == row["groups_total"] * GROUP
        failed = [e for e in episodes if e.infra_error is not None]
        assert row["infra_failures"] == len(failed) and all(e.reward is None for e in failed)
        reasons += [e.infra_error for e in failed]
        trained = [e for e in episodes if e.stage["group_kept"] and e.infra_error is None]
        dropped = [e for e in episodes if not e.stage["group_kept"] and e.infra_error is None]
        assert len(trained) + len(dropped) + len(failed) == len(episodes)
        assert all(e.reward is not None for e in trained + dropped)
    assert summary["episodes_drawn"] == recorded + summary["episodes_not_taken"], summary
    # the failures: the dead engine's episodes, excluded (not scored 0); both outages in the metrics
    assert reasons and all("second" in r for r in reasons), reasons
    after = rows[1:]
    assert any(r["infra_failures"] > 0 for r in after) and rows[0]["infra_failures"] == 0
    assert rows[0]["rollout_workers_left_out"] == 0 and after[-1]["rollout_workers_left_out"] == 1
    assert rows[0]["sandbox_engines_down"] == 0 and after[-1]["sandbox_engines_down"] == 1
    log = outs[0]
    assert log.count("does not answer") == 1 and workers[1] in log, log[-3000:]
    assert "no XLA compile cache with several CPU processes" in log
    # k = 1: trained, at most one version behind, some tokens one behind; versions grow in an episode
    assert sum(r["optimizer_steps"] for r in rows) > 0
    assert all(r["staleness_max"] <= 1 for r in rows) and any(r["staleness_frac_1"] > 0 for r in rows)
    for row in rows:
        for ep in load_jsonl(stage / "trajectories" / f"iter_{row['step']:04d}.jsonl"):
            sampled = [v for v, m in zip(ep.policy_versions, ep.loss_mask, strict=True) if m]
            assert sorted(sampled) == sampled and all(0 <= v <= row["step"] - 1 for v in sampled)
    # the live worker paused, loaded and continued at every sync (version 0, then one per iteration)
    served = (tmp_path / f"worker_{ports[0]}.txt").read_text()
    updates = [line for line in served.splitlines() if "update_weights_from_disk(" in line]
    assert len(updates) == served.count("continue_generation") == ITERATIONS + 1, served[-3000:]
    assert updates[-1].endswith(f"serving weight_version {ITERATIONS}"), served[-3000:]
    # process 1 writes its checkpoint and weight shards only; process 0 the rest
    wrote = _written(tmp_path / "logs_2" / "written_1.txt", stage)  # Python's writes: not safetensors'
    assert wrote and all(p.parts[0] == "checkpoints" for p in wrote), wrote
    main_wrote = {p.parts[0] for p in _written(tmp_path / "logs_2" / "written_0.txt", stage)}
    assert {"metrics.jsonl", "trajectories", "plots", "summary.json"} <= main_wrote, main_wrote
    shards = sorted(p.name for p in (stage / "weights").glob("*.safetensors"))  # one a process
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"], shards
    _loads_in_transformers(stage, rows)


def _loads_in_transformers(stage: Path, rows) -> None:
    """The exported final weights in `transformers` give the trained policy's log-probs."""
    import torch
    import transformers

    from jaxswe.model.logprobs import token_logprobs
    from jaxswe.policy import load_policy

    policy = load_policy(stage)
    ids = np.asarray([load_jsonl(stage / "trajectories" / f"iter_{len(rows):04d}.jsonl")[0].input_ids[:256]])
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        stage / "weights", torch_dtype=torch.float32
    ).eval()
    with torch.no_grad():
        logp = torch.log_softmax(hf.eval()(torch.tensor(ids)).logits, -1).numpy()
    ref = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    ours = np.asarray(token_logprobs(policy.params, policy.model_cfg, ids))[:, 1:]
    np.testing.assert_allclose(ours, ref, atol=1e-4)
