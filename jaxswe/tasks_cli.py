"""`jaxswe tasks validate|filter`: thin commands over envs.validate_task / envs.filter_tasks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from jaxswe.errors import UserError


def _load(file: str):
    from envs import BACKENDS, load_tasks

    return load_tasks(file), BACKENDS


def validate(
    file: str = typer.Argument(..., help="task file (.json/.jsonl), a built-in task directory, or `builtin`"),
    runs: int = typer.Option(1, "--runs", min=1, help="gold-patch runs per task (flakiness check)"),
    backend: str = typer.Option("local", "--backend", help="local | docker"),
    workers: int = typer.Option(1, "--workers", min=1, help="tasks validated at once"),
    timeout: float = typer.Option(1800.0, "--timeout", help="seconds allowed for one test run"),
) -> None:
    """Gold patch resolves, empty patch does not, stable over --runs: one JSON line per task."""
    from envs.validate import validate_many

    tasks, backends = _load(file)
    if backend not in backends:
        raise UserError(f"--backend must be one of {', '.join(backends)}, got {backend!r}")
    failed = 0
    for result in validate_many(tasks, runs=runs, backend=backend, workers=workers, test_timeout=timeout):
        failed += not result.ok
        print(json.dumps(result.to_json()), flush=True)
    if failed:
        print(f"{failed} of {len(tasks)} tasks failed validation", file=sys.stderr)
        raise SystemExit(1)  # click (standalone_mode=False) would turn typer.Exit into a return value


def filter_(
    file: str = typer.Argument(..., help="task file (.json/.jsonl), a built-in task directory, or `builtin`"),
    out: Path = typer.Option(..., "--out", help="JSONL file for the kept task records"),
    runs: int = typer.Option(1, "--runs", min=1, help="gold-patch runs per task (flakiness check)"),
    backend: str = typer.Option("local", "--backend", help="local | docker"),
    workers: int = typer.Option(1, "--workers", min=1, help="tasks validated at once"),
    max_files: int = typer.Option(
        7, "--max-files", help="keep gold patches changing at most this many files"
    ),
    max_lines: int = typer.Option(
        500, "--max-lines", help="keep gold patches changing fewer lines than this"
    ),
    no_tests: bool = typer.Option(False, "--no-tests", help="size filters only; run no tests"),
) -> None:
    """The paper's task filters; kept records go to --out, one JSON line per dropped task to stdout."""
    from envs import filter_tasks

    tasks, backends = _load(file)
    if backend not in backends:
        raise UserError(f"--backend must be one of {', '.join(backends)}, got {backend!r}")
    kept, dropped = filter_tasks(
        tasks, backend=backend, runs=runs, max_files=max_files, max_lines=max_lines, run_tests=not no_tests,
        workers=workers,
    )  # fmt: skip
    for instance_id, reason in dropped.items():
        print(json.dumps({"instance_id": instance_id, "dropped": reason}))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(t.to_record()) + "\n" for t in kept))
    tmp.replace(out)  # nothing half-written
    print(f"kept {len(kept)} of {len(tasks)} tasks -> {out}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    tasks = typer.Typer(help="Check and filter SWE task files.", no_args_is_help=True)
    tasks.command("validate")(validate)
    tasks.command("filter")(filter_)
    app.add_typer(tasks, name="tasks")
