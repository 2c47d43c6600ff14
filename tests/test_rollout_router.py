"""Control calls behind an sglang-router: generation through the router, weight updates, cache
flushes and health checks to every worker; a worker that fails an update is named."""

import asyncio
import socket

import pytest
from aiohttp import web

from jaxswe.config import RolloutSection
from jaxswe.errors import UserError
from jaxswe.rollout.client import RolloutClient, RolloutError, client_from_config
from jaxswe.rollout.types import SamplingParams


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _server(routes: dict[str, object]):
    app = web.Application()
    for path, handler in routes.items():
        (app.router.add_get if path == "/health" else app.router.add_post)(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
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
