"""`jaxswe plan`: a config's per-GPU memory and FLOPs (jaxswe.plan)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        config: Path = typer.Option(..., "--config", metavar="FILE", help="run config YAML"),
        overrides: list[str] = typer.Option(
            [], "--set", metavar="KEY=VALUE", help="section.key=value override (repeatable)"
        ),
        as_json: bool = typer.Option(False, "--json", metavar="JSON", help="print one JSON object"),
        stage: str | None = typer.Option(
            None, "--stage", metavar="STAGE", help="rl or rft (default: the config's)"
        ),
    ) -> None:
        """Per-GPU memory (params, grads, AdamW state, activations, transients) and FLOPs of a config."""
        from jaxswe.config import load_config
        from jaxswe.plan import plan_config, render  # jax: imported by the command, not by `--version`

        cfg = load_config(config, overrides)
        p, inp, what = plan_config(cfg, stage)
        if as_json:
            out = p.to_json()
            out["stage"], out["mesh"] = what, dict(inp.mesh)
            typer.echo(json.dumps(out, sort_keys=True))
        else:
            typer.echo(render(p, inp, what))
        if not p.fits:
            raise typer.Exit(1)
