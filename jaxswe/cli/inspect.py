"""`jaxswe inspect`: a run as one self-contained HTML report (jaxswe.cli.report)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)


def inspect(
    run_dir: Path = typer.Argument(
        ..., metavar="RUN_DIR", help="a run dir (every stage in it) or a stage dir"
    ),
    out: Path | None = typer.Option(
        None, "--out", metavar="FILE", help="the HTML file to write (default: RUN_DIR/report.html)"
    ),
    episodes: int = typer.Option(
        24, "--episodes", metavar="N", min=1, help="episodes shown per trajectory file (every outcome kept)"
    ),
    files: int = typer.Option(
        20, "--files", metavar="N", min=1, help="trajectory files shown per stage (spread first to last)"
    ),
    max_chars: int = typer.Option(
        20000, "--max-chars", metavar="N", min=100, help="characters shown of one message, patch or error"
    ),
) -> None:
    """Write one HTML file (no network loads) of a run: each stage's summary and curves, its
    episodes turn by turn, with outcome filters and a turn search, and the test strength and
    surviving wrong fixes of the tasks it shows (from the task records its config names); print
    its path."""
    from jaxswe.cli.report import load_stage, read_json, render_report
    from jaxswe.errors import UserError
    from jaxswe.run.files import write_text_atomic
    from jaxswe.run.layout import StageDir, stage_dirs

    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: not a directory (expected a run dir or a stage dir)")
    stages = stage_dirs(run_dir)
    if not stages:
        raise UserError(f"{run_dir}: no stage found (expected a run dir or a stage dir)")
    run_summary = read_json(StageDir(run_dir).summary) if stages != [run_dir] else None  # a pipeline's
    loaded = [load_stage(s, episodes=episodes, files=files) for s in stages]
    html = render_report(f"jaxswe run: {run_dir.absolute()}", loaded, run_summary, max_chars=max_chars)
    target = out or StageDir(run_dir).report
    write_text_atomic(target, html)
    typer.echo(str(target))
