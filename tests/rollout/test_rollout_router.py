"""Control calls behind an sglang-router: generation through the router, weight updates, cache
flushes and health checks to every worker; a worker that fails an update is named."""

import asyncio

import pytest
from aiohttp import web
from helpers import free_port

from jaxswe.config import RolloutSection
from jaxswe.errors import UserError
from jaxswe.rollout.client import RolloutClient, RolloutError, client_from_config
from jaxswe.rollout.types import SamplingParams


async def _server(routes: dict[str, object]):
    app = web.Application()
    for path, handler in routes.items():
        (app.router.add_get if path == "/health" else app.router.add_post)(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _worker(name: str, calls: list, *, update_ok: bool = True, healthy: bool = True):
    async def record(request, path):
        calls.append((name, path))

    async def generate(request):
        await record(request, "/generate")
        return web.json_response({"output_ids": [3], "meta_info": {"output_token_logprobs": [[-1.0, 3, None]],
                                  "finish_reason": {"type": "stop"}}})  # fmt: skip

    async def update(request):
        await record(request, "/update_weights_from_disk")
        if update_ok:
            return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})
        return web.json_response({"success": False, "message": "cannot load weights"}, status=400)

    async def flush(request):
        await record(request, "/flush_cache")
        return web.Response(text="ok")

    async def health(request):
        await record(request, "/health")
        return web.Response(status=200 if healthy else 503)

    return {
        "/generate": generate,
        "/update_weights_from_disk": update,
        "/flush_cache": flush,
        "/health": health,
    }


def test_router_gets_generation_workers_get_control():
    async def main():
        calls: list = []
        servers = [
            await _server(_worker("w0", calls)),
            await _server(_worker("w1", calls, update_ok=False, healthy=False)),
        ]
        # the router: /generate forwards nowhere special, no update route, /health always 200
        router_routes = _worker("router", calls)
        del router_routes["/update_weights_from_disk"], router_routes["/flush_cache"]
        router = await _server(router_routes)
        workers = [url for _, url in servers]
        try:
            async with RolloutClient(workers, router=router[1], max_retries=0) as client:
                await client.generate([1, 2], SamplingParams(max_new_tokens=1))
                healthy = await client.check_health()
                await client.flush_cache()
                with pytest.raises(RolloutError) as err:
                    await client.update_weights_from_disk("/weights")
        finally:
            for runner, _ in [*servers, router]:
                await runner.cleanup()
        return calls, healthy, workers, str(err.value)

    calls, healthy, workers, message = asyncio.run(main())
    assert ("router", "/generate") in calls and not any(n != "router" and p == "/generate" for n, p in calls)
    assert healthy == [workers[0]]  # the unhealthy worker is seen; the router is never asked
    assert not any(n == "router" and p != "/generate" for n, p in calls)
    assert {n for n, p in calls if p == "/flush_cache"} == {"w0", "w1"}
    assert {n for n, p in calls if p == "/update_weights_from_disk"} == {"w0", "w1"}
    assert workers[1] in message and workers[0] not in message and "cannot load weights" in message


def test_config_keeps_the_router_out_of_the_worker_list():
    """rollout.router takes generation; rollout.urls must hold the workers, never the router."""
    workers = ["http://w0:30000", "http://w1:30000"]
    client = client_from_config(RolloutSection(engine="http", urls=workers, router="http://r:31000/"))
    assert client.urls == workers and client.generate_urls == ["http://r:31000"]
    with pytest.raises(UserError, match="lists the router"):
        client_from_config(
            RolloutSection(engine="http", urls=[*workers, "http://r:31000"], router="http://r:31000/")
        )


def _versioned_worker(state: dict):
    """A worker that reports the weight version it last loaded (as SGLang and `jaxswe serve` do)."""

    async def generate(request):
        state["generated"] += 1
        return web.json_response({"output_ids": [3], "meta_info": {
            "output_token_logprobs": [[-1.0, 3, None]], "finish_reason": {"type": "stop"},
            "weight_version": state["version"]}})  # fmt: skip

    async def update(request):
        state["version"] = (await request.json())["weight_version"]
        return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})

    async def ok(request):
        return web.json_response({"model_path": "m", "weight_version": state["version"]})

    return {"/generate": generate, "/update_weights_from_disk": update, "/health": ok,
            "/get_model_info": ok, "/get_server_info": ok, "/pause_generation": ok,
            "/continue_generation": ok, "/flush_cache": ok}  # fmt: skip


async def _serve_at(routes, port):
    app = web.Application()
    for path, handler in routes.items():
        (
            app.router.add_get
            if path in ("/health", "/get_model_info", "/get_server_info")
            else app.router.add_post
        )(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def test_worker_dies_behind_the_real_router_and_rejoins_at_the_current_version(caplog):
    """The real sglang-router (pip) in front of two workers: one dies; generation goes on through
    the router, weight updates skip the dead worker with one log line, pause/continue too; back at
    the same address it loads the newest weights before it takes part again."""
    import json
    import subprocess
    import sys
    import urllib.request

    pytest.importorskip("sglang_router")  # the dev extra installs it
    ports, router_port = [free_port(), free_port()], free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    states = [{"version": "0", "generated": 0} for _ in ports]

    async def main():
        runners = [await _serve_at(_versioned_worker(s), p) for s, p in zip(states, ports, strict=True)]
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
             str(router_port), "--worker-urls", *urls, "--policy", "round_robin", "--log-level", "warn",
             "--health-check-interval-secs", "1", "--prometheus-port", str(free_port())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        router_url = f"http://127.0.0.1:{router_port}"
        try:
            for _ in range(300):  # the router answers /health 200 before it knows a worker: ask /workers
                try:
                    reply = await asyncio.to_thread(urllib.request.urlopen, router_url + "/workers", None, 1)
                    if sum(w.get("is_healthy", False) for w in json.loads(reply.read())["workers"]) == 2:
                        break
                except (OSError, ValueError, KeyError):
                    pass
                await asyncio.sleep(0.1)
            async with RolloutClient(urls, router=router_url, max_retries=3, backoff_s=0.05) as client:
                client.rejoin_every_s = 0.0
                params = SamplingParams(max_new_tokens=1)
                await asyncio.gather(*(client.generate([1, 2], params) for _ in range(4)))
                assert all(s["generated"] > 0 for s in states)  # the router spreads requests
                await runners[1].cleanup()  # worker 1 dies
                gens = await asyncio.gather(*(client.generate([1, 2], params) for _ in range(6)))
                assert all(g.output_ids == [3] for g in gens)
                await client.update_weights_from_disk("/w", weight_version="1", pause=True)
                await client.update_weights_from_disk("/w", weight_version="2", pause=True)
                assert client.stale == {urls[1]} and states[0]["version"] == "2"
                states[1]["version"] = "0"  # restarted with its launch weights
                runners[1] = await _serve_at(_versioned_worker(states[1]), ports[1])
                await client.generate([1, 2], params)  # probes the left-out worker: it rejoins
                assert client.stale == set() and states[1]["version"] == "2"
        finally:
            router.kill()
            router.wait()
            for r in runners:
                await r.cleanup()

    with caplog.at_level("WARNING", logger="jaxswe.rollout.client"):
        asyncio.run(main())
    left_out = [r.message for r in caplog.records if "does not answer" in r.message]
    assert len(left_out) == 1 and urls[1] in left_out[0], left_out  # one line, not one per call
    assert any("rejoined at weight version 2" in r.message for r in caplog.records)
