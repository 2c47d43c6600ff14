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
        compile_: bool = typer.Option(
            False, "--compile", help="also compile the train step and recompute pass for the target"
        ),
        target: str = typer.Option(
            "h200",
            "--target",
            metavar="TARGET",
            help="--compile for h200 (deviceless, JAXSWE_CUDA_PLUGIN) or cpu",
        ),
        hlo_dir: Path | None = typer.Option(
            None, "--hlo-dir", metavar="DIR", help="with --compile: write the optimized HLO text here"
        ),
    ) -> None:
        """Per-GPU memory (params, grads, AdamW state, activations, transients) and FLOPs of a config;
        with --compile, the compiler's per-device peak beside the planner's."""
        from jaxswe.config import load_config
        from jaxswe.plan import plan_config, render  # jax: imported by the command, not by `--version`
        from jaxswe.plan.compile_report import compile_report
        from jaxswe.plan.compile_report import render as render_compiled

        cfg = load_config(config, overrides)
        p, inp, what = plan_config(cfg, stage)
        report = compile_report(config, overrides, cfg, stage, target, hlo_dir) if compile_ else None
        if as_json:
            out = p.to_json()
            out["stage"], out["mesh"] = what, dict(inp.mesh)
            if report is not None:
                out["compiled"] = report
            typer.echo(json.dumps(out, sort_keys=True))
        else:
            typer.echo(render(p, inp, what))
            if report is not None:
                typer.echo(render_compiled(report))
        if not (report or {"fits": p.fits})["fits"]:
            raise typer.Exit(1)
