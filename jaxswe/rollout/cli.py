"""`jaxswe serve`: the embedded rollout server (SGLang's native HTTP API over the JAX sampler)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def _load_model_or_stage(path: str, *, dtype: str):
    """A stage dir's newest checkpoint (what `jaxswe export` writes), else `load_model(path)`."""
    from jaxswe.model.export import is_stage_dir, load_stage
    from jaxswe.rollout.weights import load_model

    if not is_stage_dir(path):
        return load_model(path, dtype=dtype)
    import jax

    cfg, params, _ = load_stage(path)
    return cfg.replace(dtype=dtype, remat="none"), jax.tree.map(lambda x: x.astype(dtype), params)


def serve(
    model: Path = typer.Option(
        ..., "--model", help="Hugging Face model dir, Orbax checkpoint dir, or a stage dir (RUN_DIR/rl)"
    ),
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

    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    if max_batch < 1:
        raise UserError(f"--max-batch must be >= 1, got {max_batch}")
    load_fn = functools.partial(_load_model_or_stage, dtype=dtype)
    cfg, params = load_fn(str(model))
    sampler = Sampler(cfg, params, max_context=max_context, seed=seed, cache_dtype=dtype)
    engine = EmbeddedEngine(sampler, load_fn=load_fn, model_path=str(model), max_batch=max_batch)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(engine, host, port))
