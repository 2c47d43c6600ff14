"""`jaxswe tasks validate|filter|mine`: thin commands over envs.grading.validate / envs.grading.mining."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from jaxswe.errors import UserError


def _load(file: str):
    from envs import BACKENDS, load_tasks

    return load_tasks(file), BACKENDS


# what validate and filter share
TaskFileArg = Annotated[
    str,
    typer.Argument(metavar="FILE", help="task file (.json/.jsonl), a built-in task directory, or `builtin`"),
]
RunsOpt = Annotated[
    int, typer.Option("--runs", metavar="N", min=1, help="gold-patch runs per task (flakiness check)")
]
BackendOpt = Annotated[str, typer.Option("--backend", metavar="BACKEND", help="local | docker")]
WorkersOpt = Annotated[int, typer.Option("--workers", metavar="N", min=1, help="tasks validated at once")]
BudgetOpt = Annotated[
    int, typer.Option("--budget", metavar="N", min=1, help="wrong fixes graded per task (test strength)")
]
StrengthSecondsOpt = Annotated[
    float,
    typer.Option("--strength-seconds", metavar="SECONDS", help="no new wrong-fix grade of a task after this"),
]


def _strength_note(measured) -> str:
    """One stderr line: a task's strength and its survivors (possibly equivalent to gold)."""
    if measured.strength is None and not measured.undecided:
        return f"{measured.instance_id}: test strength undecided (no wrong fix could be derived from gold)"
    figure = "undecided" if measured.strength is None else f"{measured.strength:.2f}"
    decided = measured.rejected + len(measured.survivors)
    line = f"{measured.instance_id}: test strength {figure} ({measured.rejected} of {decided} wrong fixes"
    line += " rejected"
    line += f", {measured.undecided} undecided)" if measured.undecided else ")"
    if measured.survivors:
        fixes = "; ".join(f"{s.kind} {s.where} {s.change}" for s in measured.survivors)
        line += f"; survivors (possibly equivalent): {fixes}"
    return line


def validate(
    file: TaskFileArg,
    runs: RunsOpt = 1,
    backend: BackendOpt = "local",
    workers: WorkersOpt = 1,
    timeout: float = typer.Option(
        600.0, "--timeout", metavar="SECONDS", help="seconds allowed for one test run"
    ),
    strength: bool = typer.Option(
        False, "--strength", help="also grade wrong fixes derived from gold: the task's test strength"
    ),
    budget: BudgetOpt = 12,
    strength_seconds: StrengthSecondsOpt = 300.0,
) -> None:
    """Gold patch resolves, empty patch does not, stable over --runs: one JSON line per task. With
    --strength, each valid task's line has `strength`: the fraction of wrong fixes its tests reject,
    and the survivors (wrong fixes they accept; one line per task on stderr too)."""
    from envs.grading.strength import measure
    from envs.grading.validate import validate_many

    tasks, backends = _load(file)
    if backend not in backends:
        raise UserError(f"--backend must be one of {', '.join(backends)}, got {backend!r}")
    from jaxswe.run.progress import Progress

    tally = {"valid": 0, "invalid": 0, "infrastructure": 0}
    by_id = {t.instance_id: t for t in tasks}
    results = validate_many(tasks, runs=runs, backend=backend, workers=workers, test_timeout=timeout)
    with Progress("tasks validate", len(tasks), unit="task") as bar:
        for result in results:
            tally["valid" if result.ok else "infrastructure" if result.infrastructure else "invalid"] += 1
            bar.update(1, **tally)
            line = result.to_json()
            if strength and result.ok:
                task = by_id[result.instance_id]
                measured = measure(task, backend=backend, budget=budget, seconds=strength_seconds,
                                   workers=workers, test_timeout=timeout)  # fmt: skip
                line["strength"] = measured.to_json()
                print(_strength_note(measured), file=sys.stderr)
            print(json.dumps(line), flush=True)
    print(
        f"jaxswe: {len(tasks)} task{'s' * (len(tasks) != 1)}: {tally['valid']} valid, "
        f"{tally['invalid']} invalid, {tally['infrastructure']} infrastructure failures "
        "(the environment, not the patches)",
        file=sys.stderr,
    )
    if tally["valid"] < len(tasks):
        raise SystemExit(1)  # click (standalone_mode=False) would turn typer.Exit into a return value


def filter_(
    file: TaskFileArg,
    out: Path = typer.Option(..., "--out", metavar="FILE", help="JSONL file for the kept task records"),
    runs: RunsOpt = 1,
    backend: BackendOpt = "local",
    workers: WorkersOpt = 1,
    max_files: int = typer.Option(
        7, "--max-files", metavar="N", help="keep gold patches changing at most this many files"
    ),
    max_lines: int = typer.Option(
        500, "--max-lines", metavar="N", help="keep gold patches changing fewer lines than this"
    ),
    no_tests: bool = typer.Option(False, "--no-tests", help="size filters only; run no tests"),
    min_strength: float = typer.Option(
        None,
        "--min-strength",
        metavar="X",
        min=0.0,
        max=1.0,
        help="drop tasks whose tests reject less than this fraction of wrong fixes (measured unless stored)",
    ),  # fmt: skip
    budget: BudgetOpt = 12,
    strength_seconds: StrengthSecondsOpt = 300.0,
) -> None:
    """The paper's task filters; kept records go to --out, one JSON line per dropped task to stdout.
    --min-strength also drops weak tasks; kept records store their strength and surviving wrong fixes
    (with --no-tests only stored strengths count)."""
    from envs import filter_tasks
    from envs.grading.strength import filter_by_strength
    from jaxswe.run.files import write_text_atomic

    tasks, backends = _load(file)
    if backend not in backends:
        raise UserError(f"--backend must be one of {', '.join(backends)}, got {backend!r}")
    kept, dropped = filter_tasks(
        tasks, backend=backend, runs=runs, max_files=max_files, max_lines=max_lines, run_tests=not no_tests,
        workers=workers,
    )  # fmt: skip
    if min_strength is not None:
        kept, weak, unmeasured = filter_by_strength(
            kept, min_strength, measure_missing=not no_tests, backend=backend, budget=budget,
            seconds=strength_seconds, workers=workers,
        )  # fmt: skip
        dropped.update(weak)
        if unmeasured:
            print(f"jaxswe: kept {len(unmeasured)} task{'s' * (len(unmeasured) != 1)} with no test strength "
                  f"({'not measured' if no_tests else 'no wrong fix made or decided'}): "
                  f"{', '.join(unmeasured)}", file=sys.stderr)  # fmt: skip
    for instance_id, reason in dropped.items():
        print(json.dumps({"instance_id": instance_id, "dropped": reason}))
    write_text_atomic(out, "".join(json.dumps(t.to_record()) + "\n" for t in kept))  # nothing half-written
    print(f"kept {len(kept)} of {len(tasks)} tasks -> {out}", file=sys.stderr)


def mine(
    repo: Path = typer.Argument(
        ..., metavar="REPO", help="a git repository (a clone; its HEAD's history is mined)"
    ),
    out: Path = typer.Option(
        Path("mined.jsonl"), "--out", metavar="FILE", help="JSONL file for the valid task records"
    ),
    since: str = typer.Option(
        None, "--since", metavar="DATE", help="only commits after this date (git's --since)"
    ),
    until: str = typer.Option(
        None, "--until", metavar="DATE", help="only commits before this date (git's --until)"
    ),
    limit: int = typer.Option(
        None, "--limit", metavar="N", min=1, help="only the newest N commits of the range"
    ),
    name: str = typer.Option(
        None, "--name", metavar="NAME", help="owner/name of the repository (default: from origin)"
    ),
    install: str = typer.Option(
        None,
        "--install",
        metavar="JSON",
        help="install recipe as JSON (install_config; default pip install -e . + pytest -rA)",
    ),
    runs: int = typer.Option(
        3, "--runs", metavar="N", min=1, help="test runs per side and gold runs (flakiness check)"
    ),
    workers: int = typer.Option(1, "--workers", metavar="N", min=1, help="commits processed at once"),
    timeout: float = typer.Option(
        600.0, "--timeout", metavar="SECONDS", help="seconds allowed for one test run"
    ),
) -> None:
    """Tasks from a git history: commits changing source and tests, FAIL_TO_PASS/PASS_TO_PASS from
    runs before and after, the paper's filters, validated. Resumes from --out's .state.jsonl (a
    different --install re-examines the commits whose outcome depended on the recipe). Why commits
    were dropped is summarized on stderr, one line per cause."""
    from envs.errors import TaskError
    from envs.grading.mining import candidate_commits, drop_summary, mine_outcomes, stage_counts

    if not repo.is_dir():
        raise UserError(f"{repo} is not a directory")
    try:
        recipe = json.loads(install) if install else None
    except json.JSONDecodeError as err:
        raise UserError(f"--install is not JSON: {err.msg}") from None
    if recipe is not None and not isinstance(recipe, dict):
        raise UserError("--install must be a JSON object (an install_config)")
    try:
        total = len(candidate_commits(repo, since, until))
    except Exception as err:
        raise UserError(f"{repo}: cannot read its history: {err}") from None
    from jaxswe.run.progress import Progress

    with Progress("tasks mine", min(total, limit or total), unit="commit") as bar:
        kept = 0

        def progress(outcome) -> None:
            nonlocal kept
            kept += outcome.record is not None
            bar.update(1, valid=kept)

        try:
            outcomes, scanned = mine_outcomes(
                repo, out, since=since, until=until, name=name, install=recipe, runs=runs, workers=workers,
                limit=limit, on_outcome=progress, test_timeout=timeout,
            )  # fmt: skip
        except TaskError as err:
            raise UserError(str(err)) from None
    valid = sum(o.record is not None for o in outcomes)
    dropped = drop_summary(outcomes)
    print(f"jaxswe: {scanned} commits: {valid} valid task{'s' * (valid != 1)} -> {out}"
          + (f"; {scanned - valid} dropped, by cause:" if dropped else ""), file=sys.stderr)  # fmt: skip
    for line in dropped:
        print(line, file=sys.stderr)
    print(json.dumps({"stages": stage_counts(outcomes, scanned), "out": str(out)}))


def register(app: typer.Typer) -> None:
    tasks = typer.Typer(help="Check, filter and mine SWE task files.", no_args_is_help=True)
    tasks.command("validate")(validate)
    tasks.command("filter")(filter_)
    tasks.command("mine")(mine)
    app.add_typer(tasks, name="tasks")
