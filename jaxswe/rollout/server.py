"""`jaxswe serve`: SGLang's native HTTP API (the subset in design.md) over an `EmbeddedEngine`."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from jaxswe.errors import UserError
from jaxswe.rollout.engine import EmbeddedEngine
from jaxswe.rollout.protocol import ProtocolError, generation_to_json, parse_generate_body

log = logging.getLogger(__name__)
ENGINE_KEY = web.AppKey("engine", EmbeddedEngine)


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _model_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    cfg = engine.sampler.cfg
    return web.json_response(
        {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "is_generation": True,
            "engine": "jaxswe",
            "vocab_size": cfg.vocab_size,
            "context_length": engine.sampler.max_context,
        }
    )


async def _generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await request.json()
    except json.JSONDecodeError:
        return _json_error(400, "body is not valid JSON")
    try:
        reqs, batched = parse_generate_body(body, vocab_size=engine.sampler.vocab_size)
        start = time.monotonic()
        gens = await engine.submit(reqs)
    except ProtocolError as err:
        return _json_error(400, str(err))
    latency = time.monotonic() - start
    out = [generation_to_json(r, g) for r, g in zip(reqs, gens, strict=True)]
    for o in out:
        o["meta_info"]["e2e_latency"] = latency
    return web.json_response(out if batched else out[0])


async def _flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.")  # no prefix cache: nothing to drop


async def _update_weights(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await request.json()
        path = body["model_path"]
        if not isinstance(path, str) or not path:
            raise TypeError
    except (json.JSONDecodeError, KeyError, TypeError):
        return web.json_response({"success": False, "message": "body must be {model_path: str}"}, status=400)
    try:
        await engine.update_weights_from_disk(path)
    except Exception as err:  # any load failure: report it, keep serving the old weights
        log.warning("update_weights_from_disk(%s) failed: %s", path, err)
        msg = f"failed to load {path}: {err}; old weights kept"
        return web.json_response({"success": False, "message": msg}, status=400)
    return web.json_response({"success": True, "message": f"loaded {path}", "num_paused_requests": 0})


def build_app(engine: EmbeddedEngine) -> web.Application:
    """The aiohttp application serving `engine`."""
    app = web.Application(client_max_size=1 << 30)
    app[ENGINE_KEY] = engine
    app.router.add_get("/health", _health)
    app.router.add_get("/health_generate", _health)
    app.router.add_get("/get_model_info", _model_info)
    app.router.add_post("/generate", _generate)
    app.router.add_route("*", "/flush_cache", _flush_cache)
    app.router.add_post("/update_weights_from_disk", _update_weights)

    async def _close(app: web.Application) -> None:
        await engine.close()

    app.on_cleanup.append(_close)
    return app


class RolloutServer:
    """Start/stop the app on the current event loop (tests and embedding in another program)."""

    def __init__(self, engine: EmbeddedEngine, host: str = "127.0.0.1", port: int = 0):
        self.app = build_app(engine)
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as err:
            await self._runner.cleanup()
            raise UserError(f"cannot listen on {self.host}:{self.port}: {err.strerror or err}") from None
        self.port = site._server.sockets[0].getsockname()[1]
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve_forever(engine: EmbeddedEngine, host: str, port: int) -> None:
    """Run until cancelled (Ctrl-C)."""
    server = RolloutServer(engine, host, port)
    url = await server.start()
    print(f"jaxswe serve: listening on {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
