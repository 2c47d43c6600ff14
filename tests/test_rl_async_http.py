"""Async RL (rl.max_staleness = 1) over the HTTP backend: `jaxswe rl` on the toy game against
`jaxswe serve` in a subprocess, where every weight sync pauses the server (its requests in flight
return their tokens so far and go on under the new weights), loads, and continues; and the
handover's ordering over several workers (all paused before any loads, all continued after all
loaded, or after a failure)."""

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from test_rl_mined import _free_port, _wait_healthy

from jaxswe.config import config_from_dict
from jaxswe.rollout.client import RolloutClient, RolloutError

ROOT = Path(__file__).parent.parent
ITERATIONS = 4
ONE_DEVICE = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # not conftest's 8


def _toy_http_config(url: str) -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "toy-rl.yaml").read_text())
    cfg["rollout"] = {**cfg["rollout"], "engine": "http", "urls": [url], "export_dtype": "float32"}
    cfg["env"]["max_parallel"] = 16
    cfg["agent"]["max_turns"] = 8  # longer episodes than the trainer's step: they span its syncs
    cfg["rl"].update(
        iterations=ITERATIONS,
        max_staleness=1,
        problems_per_iteration=4,
        group_size=4,
        trajectories_per_step=16,
        rows_per_step=16,
    )
    return cfg


def _starting_model(cfg: dict, out: Path) -> None:
    """A Hugging Face dir of the toy policy's architecture for the server to start from (the run
    pushes its own starting weights as version 0 before the first episode)."""
    from jaxswe.model.hf_io import save_hf
    from jaxswe.stages.toy import toy_policy

    policy = toy_policy(config_from_dict(cfg), out / "stage")
    save_hf(out / "model", policy.model_cfg, policy.params, dtype="float32")


@pytest.mark.slow
def test_async_rl_over_http_pauses_in_flight_episodes_at_each_sync(tmp_path):
    """4 iterations of `jaxswe rl` (toy game, k = 1, 4 x 4 episodes) against `jaxswe serve`: rows
    carry staleness, some trained tokens are one version old and none older (older ones are left
    out of the loss), episodes span two
    versions, every sync paused (some with requests in flight), loaded and continued the server,
    which ends on the last version. ~60 s on 2 cores."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = _toy_http_config(url)
    _starting_model(cfg, tmp_path)
    serve = ["serve", "--model", str(tmp_path / "model"), "--port", str(port), "--max-context", "128"]
    server = subprocess.Popen(
        [sys.executable, "-m", "jaxswe", *serve, "--max-batch", "1"],  # rollouts, not training, are slow
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**ONE_DEVICE, "JAX_PLATFORMS": "cpu"},
    )
    try:
        _wait_healthy(url, server)
        (tmp_path / "rl.yaml").write_text(yaml.safe_dump(cfg))
        run_dir = tmp_path / "run"
        argv = ["rl", "--config", str(tmp_path / "rl.yaml"), "--run-dir", str(run_dir)]
        rl = subprocess.run(  # the CLI on one CPU device, as a user runs it
            [sys.executable, "-m", "jaxswe", *argv],
            env=ONE_DEVICE,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert rl.returncode == 0, rl.stderr[-3000:]
        with urllib.request.urlopen(url + "/get_weight_version", timeout=10) as r:
            served = json.loads(r.read())["weight_version"]
    finally:
        server.terminate()
        log = server.communicate(timeout=30)[0]
    assert served == str(ITERATIONS), log[-2000:]  # the last sync is the last iteration's policy

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, ITERATIONS + 1))
    for row in rows:
        assert {"staleness_mean", "staleness_max", "staleness_frac_0", "staleness_frac_1"} <= set(row)
        assert row["staleness_max"] <= 1 and row["infra_failures"] == 0
    assert any(r["staleness_frac_1"] > 0 for r in rows)  # some trained tokens are one version old

    two_versions = 0
    for step in range(1, ITERATIONS + 1):
        for ep in map(
            json.loads, (run_dir / "trajectories" / f"iter_{step:04d}.jsonl").read_text().splitlines()
        ):
            sampled = [v for v, m in zip(ep["policy_versions"], ep["loss_mask"], strict=True) if m]
            assert all(v >= 0 for v in sampled) and sorted(sampled) == sampled  # versions only grow
            if ep["group_kept"]:  # trained by version step - 1; a token more than k = 1 behind is left out
                assert all(step - 1 - v >= 0 for v in sampled), (step, sampled)
                if any(step - 1 - v > 1 for v in sampled):
                    assert rows[step - 1]["staleness_masked_frac"] > 0, (step, sampled)
            two_versions += len(set(sampled)) > 1
    assert two_versions > 0  # episodes went on across a weight sync, each token with its version

    # every sync (version 0 at the start, then one per iteration) paused the server, loaded, and
    # continued it; and at least one pause returned requests in flight
    pauses = [
        int(line.split("): ")[1].split()[0]) for line in log.splitlines() if "pause_generation(abort)" in line
    ]
    updates = [line for line in log.splitlines() if "update_weights_from_disk(" in line]
    assert len(pauses) == len(updates) == ITERATIONS + 1, log[-3000:]
    assert log.count("continue_generation") == ITERATIONS + 1
    assert max(pauses) > 0, log[-3000:]
    assert updates[-1].endswith(f"serving weight_version {ITERATIONS}")


async def _recording_workers(n: int, *, slow_pause: float, failing: int | None):
    """n HTTP workers answering the control calls, recording (worker, path, start, end) in one
    list; worker 0 pauses slowly, worker `failing` cannot load."""
    events = []

    def handler(i):
        async def control(request):
            start = time.monotonic()
            if request.path == "/pause_generation" and i == 0:
                await asyncio.sleep(slow_pause)
            events.append((i, request.path, start, time.monotonic()))
            if request.path == "/update_weights_from_disk" and i == failing:
                return web.json_response(
                    {"success": False, "message": "bad", "num_paused_requests": 0}, status=400
                )
            return web.json_response({"success": True, "message": "", "num_paused_requests": 0})

        return control

    runners, urls = [], []
    for i in range(n):
        app = web.Application()
        for path in ("/pause_generation", "/update_weights_from_disk", "/continue_generation"):
            app.router.add_post(path, handler(i))
        runner = web.AppRunner(app)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
    return runners, urls, events


@pytest.mark.parametrize("failing", [None, 1])
def test_paused_update_pauses_every_worker_before_any_loads_and_always_continues(failing):
    async def run():
        runners, urls, events = await _recording_workers(3, slow_pause=0.3, failing=failing)
        try:
            async with RolloutClient(urls, max_retries=0) as client:
                if failing is None:
                    await client.update_weights_from_disk("/w/1", weight_version="1", pause=True)
                else:
                    with pytest.raises(RolloutError, match="failed on worker"):
                        await client.update_weights_from_disk("/w/1", weight_version="1", pause=True)
        finally:
            for r in runners:
                await r.cleanup()
        return events

    events = asyncio.run(run())
    by_path = {p: [(i, s, e) for i, q, s, e in events if q == p] for p in {q for _, q, _, _ in events}}
    for path in ("/pause_generation", "/update_weights_from_disk", "/continue_generation"):
        assert sorted(i for i, _, _ in by_path[path]) == [0, 1, 2], path  # every worker, once
    assert max(e for _, _, e in by_path["/pause_generation"]) <= min(
        s for _, s, _ in by_path["/update_weights_from_disk"]
    )  # no worker loads before the slowest has paused
    assert max(e for _, _, e in by_path["/update_weights_from_disk"]) <= min(
        s for _, s, _ in by_path["/continue_generation"]
    )  # none continues before all have answered the update (a failure included)
