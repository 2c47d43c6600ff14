"""Async RL (rl.max_staleness = 1) over the HTTP backend: the handover's ordering over several
workers (all paused before any loads, all continued after all loaded, or after a failure). The run
itself, `jaxswe rl` on 2 processes against `jaxswe serve` workers behind a router, is
tests/system/test_cluster.py."""

import asyncio
import time

import pytest
from aiohttp import web
from helpers import free_port

from jaxswe.rollout.client import RolloutClient, RolloutError


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
        port = free_port()
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
