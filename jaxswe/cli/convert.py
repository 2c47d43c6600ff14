"""`jaxswe convert`: Hugging Face safetensors <-> Orbax parameter checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

from jaxswe.run.layout import GENERATION_CONFIG, TOKENIZER_FILES


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)


def convert(
    src: Path = typer.Argument(
        ..., metavar="SRC", help="Hugging Face model dir (config.json + *.safetensors) or Orbax dir"
    ),
    dst: Path = typer.Argument(..., metavar="DST", help="output directory (must not exist)"),
    to: str = typer.Option(..., "--to", metavar="FORMAT", help="target format: orbax or hf"),
    dtype: str | None = typer.Option(
        None,
        metavar="DTYPE",
        help="dtype written: float32 or bfloat16 (default bfloat16 for hf, float32 for orbax)",
    ),
    max_shard_gb: float = typer.Option(5.0, metavar="GB", help="largest safetensors file when writing hf"),
) -> None:
    """Convert weights between Hugging Face safetensors and an Orbax checkpoint (config.json kept)."""
    import jax.numpy as jnp

    from jaxswe.errors import UserError
    from jaxswe.model.hf_io import load_hf, read_hf_config, save_hf
    from jaxswe.model.orbax_io import load_params_orbax, save_params_orbax

    if to not in ("orbax", "hf"):
        raise UserError(f"--to must be orbax or hf, got {to!r}")
    dtype = dtype or ("bfloat16" if to == "hf" else "float32")
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    if dst.exists():
        raise UserError(f"{dst}: already exists; choose a new output directory")
    if to == "orbax":
        config, params = load_hf(src, dtype=jnp.dtype(dtype))
        save_params_orbax(dst, params, config)
    else:
        config = read_hf_config(src)
        params = load_params_orbax(src, config)
        save_hf(dst, config, params, dtype=dtype, max_shard_bytes=int(max_shard_gb * 1024**3))
    for name in (*TOKENIZER_FILES, GENERATION_CONFIG):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    typer.echo(f"wrote {to} checkpoint to {dst}")
