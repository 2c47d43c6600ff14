"""`jaxswe serve`: the embedded rollout server (SGLang's native HTTP API over the JAX sampler)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: Path = typer.Option(..., "--model", help="Hugging Face model dir or Orbax checkpoint dir"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(30000, help="port to listen on (0: any free port)"),
    dtype: str = typer.Option("float32", help="compute and KV-cache dtype: float32 or bfloat16"),
    max_batch: int = typer.Option(16, help="most requests decoded together"),
    max_context: int | None = typer.Option(None, help="context length (default: the model's)"),
    seed: int = typer.Option(0, help="sampling PRNG seed"),
) -> None:
    """Serve /generate, /health, /get_model_info, /flush_cache, /update_weights_from_disk."""
    from jaxswe.errors import UserError
    from jaxswe.rollout.engine import EmbeddedEngine
    from jaxswe.rollout.sampler import Sampler
    from jaxswe.rollout.server import serve_forever
    from jaxswe.rollout.weights import load_model

    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    if max_batch < 1:
        raise UserError(f"--max-batch must be >= 1, got {max_batch}")
    load_fn = functools.partial(load_model, dtype=dtype)
    cfg, params = load_fn(str(model))
    sampler = Sampler(cfg, params, max_context=max_context, seed=seed, cache_dtype=dtype)
    engine = EmbeddedEngine(sampler, load_fn=load_fn, model_path=str(model), max_batch=max_batch)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(engine, host, port))
