"""`jaxswe serve`: the embedded rollout server (SGLang's native HTTP API over the JAX sampler)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: Path = typer.Option(
        ...,
        "--model",
        metavar="DIR",
        help="Hugging Face model dir, Orbax checkpoint dir, or a stage dir (RUN_DIR/rl)",
    ),
    host: str = typer.Option("127.0.0.1", metavar="HOST", help="address to listen on"),
    port: int = typer.Option(30000, metavar="PORT", help="port to listen on (0: any free port)"),
    dtype: str = typer.Option(
        "float32", metavar="DTYPE", help="compute and KV-cache dtype: float32 or bfloat16"
    ),
    max_batch: int = typer.Option(16, metavar="N", help="most requests decoded together"),
    max_context: int | None = typer.Option(
        None, metavar="TOKENS", help="context length (default: the model's)"
    ),
    seed: int = typer.Option(0, metavar="SEED", help="sampling PRNG seed"),
    weight_version: str = typer.Option(
        "default", metavar="VERSION", help="initial weight version (meta_info.weight_version)"
    ),
    deterministic: bool = typer.Option(
        False,
        "--enable-deterministic-inference",
        help="batch only requests of one padded prompt length, at the fixed batch size --max-batch: "
        "each request gets exactly the numbers it gets alone, whatever runs beside it (slower)",
    ),
) -> None:
    """Serve SGLang's native API: /generate, /health, /model_info, /server_info, /flush_cache,
    /update_weights_from_disk, /pause_generation, /continue_generation, /abort_request."""
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
    eos = eos_token_ids(model)
    batch = max_batch if deterministic else 1  # deterministic: every batch at the size --max-batch
    sampler = Sampler(
        cfg,
        params,
        max_context=max_context,
        seed=seed,
        cache_dtype=dtype,
        eos_token_ids=eos,
        min_batch_bucket=batch,
    )
    engine = EmbeddedEngine(
        sampler,
        load_fn=load_fn,
        model_path=str(model),
        max_batch=max_batch,
        weight_version=weight_version,
        batch_invariant=deterministic,
    )
    handler = logging.StreamHandler()  # control calls (pause, update, continue), one line each
    handler.setFormatter(logging.Formatter("jaxswe serve: %(message)s"))
    server_log = logging.getLogger("jaxswe.rollout.server")
    server_log.addHandler(handler)
    server_log.setLevel(logging.INFO)
    server_log.propagate = False  # once, whatever handlers the root logger has
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(engine, host, port))


def eos_token_ids(model_dir: Path) -> tuple[int, ...]:
    """The model's EOS ids, as SGLang takes them: `eos_token_id` of config.json and of
    generation_config.json (an int or a list each), in that order, without repeats."""
    from jaxswe.errors import UserError

    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir) / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, AttributeError, UnicodeDecodeError) as err:
            raise UserError(f"{path}: not a JSON object ({err})") from None
        values = value if isinstance(value, list) else [] if value is None else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise UserError(f"{path}: eos_token_id must be an id or a list of ids, got {value!r}")
        ids.extend(v for v in values if v not in ids)
    return tuple(ids)
