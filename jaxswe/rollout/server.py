"""`jaxswe serve`: SGLang 0.5.x's native HTTP API (docs/architecture.md's subset) over an `EmbeddedEngine`.

Routes: /generate, /health, /health_generate, /model_info (and /get_model_info), /server_info
(and /get_server_info), /get_weight_version, /flush_cache, /update_weights_from_disk,
/pause_generation, /continue_generation, /abort_request. Request and response fields follow
SGLang's (`UpdateWeightFromDiskReqInput`, `PauseGenerationReqInput`, `AbortReq`); of the pause
modes only "abort" is served (see `jaxswe.rollout.engine`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

import jaxswe
from jaxswe.errors import UserError
from jaxswe.rollout.engine import EmbeddedEngine
from jaxswe.rollout.protocol import ProtocolError, generation_to_json, parse_generate_body

log = logging.getLogger(__name__)
ENGINE_KEY = web.AppKey("engine", EmbeddedEngine)


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object ({} for an empty body); raises ProtocolError otherwise."""
    if not await request.read():
        return {}
    try:
        body = await request.json()
    except json.JSONDecodeError:
        raise ProtocolError("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ProtocolError("body must be a JSON object")
    return body


def _field(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """`body[key]` checked to be a `kind` (None allowed when it is the default)."""
    value = body.get(key, default)
    if not (isinstance(value, kind) or value is None is default):
        raise ProtocolError(f"{key}: expected {kind.__name__}, got {value!r}")
    return value


async def _model_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": engine.weight_version,
            "engine": "jaxswe",
            "vocab_size": engine.sampler.vocab_size,
            "context_length": engine.sampler.max_context,
            "eos_token_ids": list(engine.sampler.eos_token_ids),
        }
    )


async def _server_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {
            "model_path": engine.model_path,
            "weight_version": engine.weight_version,
            "context_length": engine.sampler.max_context,
            "max_running_requests": engine.max_batch,
            "kv_cache_dtype": engine.sampler.cache_dtype,
            "random_seed": engine.sampler.seed,
            "enable_deterministic_inference": engine.batch_invariant,
            "internal_states": [{"paused": engine.paused, "num_in_flight": engine.num_in_flight}],
            "version": f"jaxswe {jaxswe.__version__}",
        }
    )


async def _weight_version(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": request.app[ENGINE_KEY].weight_version})


async def _generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await _json_body(request)
        reqs, batched = parse_generate_body(body, vocab_size=engine.sampler.vocab_size)
        start = time.monotonic()
        results = await engine.submit(reqs)
    except ProtocolError as err:
        return _json_error(400, str(err))
    latency = time.monotonic() - start
    out = [generation_to_json(r, g, version) for r, (g, version) in zip(reqs, results, strict=True)]
    for o in out:
        o["meta_info"]["e2e_latency"] = latency
    return web.json_response(out if batched else out[0])


async def _flush_cache(request: web.Request) -> web.Response:
    # no prefix cache to drop; like SGLang, refuse while requests are running or waiting
    if request.app[ENGINE_KEY].num_in_flight:
        return web.Response(status=400, text="Cache not flushed: requests are in flight.")
    return web.Response(text="Cache flushed.")


async def _update_weights(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await _json_body(request)
        path = _field(body, "model_path", str, None)
        if not path:
            raise ProtocolError("model_path: a non-empty string is required")
        version = _field(body, "weight_version", str, None)
        abort_all = _field(body, "abort_all_requests", bool, False)
        if body.get("load_format") not in (None, "auto"):
            raise ProtocolError(
                f"load_format {body['load_format']!r}: jaxswe serve loads HF or Orbax dirs (auto)"
            )
    except ProtocolError as err:
        return web.json_response(
            {"success": False, "message": str(err), "num_paused_requests": 0}, status=400
        )
    try:
        await engine.update_weights_from_disk(path, weight_version=version, abort_all_requests=abort_all)
    except Exception as err:  # any load failure: report it, keep serving the old weights
        log.warning("update_weights_from_disk(%s) failed: %s", path, err)
        msg = f"failed to load {path}: {err}; old weights kept"
        return web.json_response({"success": False, "message": msg, "num_paused_requests": 0}, status=400)
    msg = f"Succeeded to update model weights from {path}."
    if version is not None:
        msg += f" Weight version updated to {version}."
    log.info("update_weights_from_disk(%s): serving weight_version %s", path, engine.weight_version)
    return web.json_response({"success": True, "message": msg, "num_paused_requests": 0})


async def _pause(request: web.Request) -> web.Response:
    try:
        body = await _json_body(request)
        mode = _field(body, "mode", str, "abort")
        aborted = await request.app[ENGINE_KEY].pause(mode)
    except ProtocolError as err:
        return _json_error(400, str(err))
    log.info("pause_generation(%s): %d requests in flight returned their partial tokens", mode, aborted)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def _continue(request: web.Request) -> web.Response:
    try:
        await _json_body(request)
    except ProtocolError as err:
        return _json_error(400, str(err))
    await request.app[ENGINE_KEY].continue_generation()
    log.info("continue_generation")
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def _abort(request: web.Request) -> web.Response:
    try:
        body = await _json_body(request)
        rid = _field(body, "rid", str, "")
        abort_all = _field(body, "abort_all", bool, False)
    except ProtocolError as err:
        return _json_error(400, str(err))
    request.app[ENGINE_KEY].abort(rid or None, abort_all=abort_all)
    return web.Response(status=200)


def build_app(engine: EmbeddedEngine) -> web.Application:
    """The aiohttp application serving `engine`."""
    app = web.Application(client_max_size=1 << 30)
    app[ENGINE_KEY] = engine
    app.router.add_get("/health", _health)
    app.router.add_get("/health_generate", _health)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, _model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, _server_info)
    app.router.add_get("/get_weight_version", _weight_version)
    app.router.add_post("/generate", _generate)
    app.router.add_route("*", "/flush_cache", _flush_cache)
    app.router.add_post("/update_weights_from_disk", _update_weights)
    app.router.add_post("/pause_generation", _pause)
    app.router.add_post("/continue_generation", _continue)
    app.router.add_post("/abort_request", _abort)

    async def _close(app: web.Application) -> None:
        await engine.close()

    app.on_cleanup.append(_close)
    return app


class _GrpcProbeFilter(logging.Filter):
    """sglang-router probes every worker over HTTP and gRPC at once; the gRPC probe's HTTP/2
    preface ("PRI * HTTP/2.0") is a bad HTTP/1 request to aiohttp, which logs a traceback each time.
    This prints one line instead (the HTTP probe answers, so the router registers the worker)."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if not (isinstance(err, BadHttpMessage) and "PRI" in str(err)):
            return True
        if not self.said:
            self.said = True
            print("jaxswe serve: answered an HTTP/2 preface (sglang-router's gRPC probe) with 400; "
                  "not logged again", file=sys.stderr, flush=True)  # fmt: skip
        return False


_GRPC_PROBE = _GrpcProbeFilter()


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
        logging.getLogger("aiohttp.server").addFilter(_GRPC_PROBE)
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
