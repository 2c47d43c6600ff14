"""`jaxswe export`: a trained stage's newest checkpoint as a Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def export(
    stage: Path = typer.Argument(
        ...,
        metavar="RUN_OR_STAGE_DIR",
        help="a run dir (its newest stage), a stage dir or its checkpoints/ dir",
    ),
    out: Path = typer.Argument(
        ..., metavar="OUT", help="the Hugging Face directory to write (must not exist)"
    ),
    dtype: str = typer.Option(
        "bfloat16", "--dtype", metavar="DTYPE", help="weights written: bfloat16 or float32"
    ),
    max_shard_gb: float = typer.Option(5.0, "--max-shard-gb", metavar="GB", help="largest safetensors file"),
) -> None:
    """Export a trained stage's newest checkpoint as a Hugging Face model (weights, config.json,
    generation_config.json, tokenizer) for transformers, SGLang or `jaxswe serve`."""
    from jaxswe.stages.export import export_stage  # jax: imported by the command, not by `--version`

    export_stage(stage, out, dtype=dtype, max_shard_bytes=int(max_shard_gb * 1024**3))
    typer.echo(f"wrote {out}")
