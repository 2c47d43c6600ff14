"""Task checks: the gold patch resolves (N times, the same way), the empty patch does not; and the
paper's filters (<= 7 files and < 500 lines changed, not flaky, failing tests that do not fail
with ImportError/AttributeError). A valid task's gold statuses are its reference statuses
(`Validation.reference_statuses`; `filter_tasks` and mining store them with the task); a task that
has them must still get them from its gold run. Validation also makes the task's perturbed twins
(envs.tasks.twins, checked by envs.grading.grader.checked_twins) and stores the ones gold and the base
fail."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from envs.errors import EnvError
from envs.grading.grader import GradeResult, checked_twins, grade
from envs.tasks.parsers import status_of
from envs.tasks.patches import changed_lines, patch_files
from envs.tasks.records import Task
from envs.tasks.twins import Twin

_NAME_ERROR_RE = re.compile(r"\b(ImportError|ModuleNotFoundError|AttributeError)\b")


@dataclass(frozen=True)
class Validation:
    """The outcome of `validate_task`; `ok` when gold resolves every run, empty fails, not flaky."""

    instance_id: str
    ok: bool
    reason: str
    gold_resolved: tuple[bool, ...]
    empty_resolved: bool
    flaky: bool
    flaky_tests: tuple[str, ...]
    import_or_attribute_error: bool  # a test fails with ImportError/AttributeError before the fix
    seconds: float
    # each graded test's status under gold (when gold resolved the same way every run): the
    # reference statuses to store with the task (envs.tasks.records.Task.reference_statuses)
    reference_statuses: dict[str, str] = field(default_factory=dict)
    infrastructure: bool = False  # the task's environment failed (cannot start or collect), not its patches
    # the perturbed twins gold fails and the base fails (envs.tasks.twins), to store with the task
    twins: tuple[Twin, ...] = ()
    twin_coverage: float = 0.0  # the fraction of FAIL_TO_PASS tests that have one

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "twins": [t.to_json() for t in self.twins]}


def _name_error(result: GradeResult) -> bool:
    return any(_NAME_ERROR_RE.search(m) for m in result.messages.values())


def validate_task(task: Task, *, runs: int = 1, backend: str = "local", **limits: Any) -> Validation:
    """Grade the gold patch `runs` times and the empty patch once, each in a fresh sandbox."""
    if runs < 1:
        raise EnvError(f"runs must be >= 1, got {runs}")
    start = time.monotonic()
    try:
        golds = [grade(task, task.patch, backend, twins=False, **limits) for _ in range(runs)]
        empty = grade(task, "", backend, twins=False, **limits)
    except EnvError as err:
        why = f"infrastructure failure: {err}"
        return Validation(task.instance_id, False, why, (), False, False, (), False, time.monotonic() - start,
                          infrastructure=True)  # fmt: skip
    graded = [*task.fail_to_pass, *task.pass_to_pass]
    flaky_tests = tuple(t for t in graded if len({g.tests.get(t) for g in golds}) > 1)
    flaky = bool(flaky_tests) or len({g.resolved for g in golds}) > 1
    reference = {t: status_of(t, golds[0].tests) for t in graded}
    stale = [t for t, s in task.reference_statuses.items() if reference.get(t) != s]
    infrastructure = any(g.error for g in [*golds, empty])
    if infrastructure:
        reason = f"infrastructure failure: {next(g.reason for g in [*golds, empty] if g.error)}"
    elif flaky:
        reason = f"flaky over {runs} runs: {', '.join(flaky_tests) or 'resolved differs'}"
    elif not all(g.resolved for g in golds):
        reason = f"gold patch does not resolve: {golds[0].reason}"
    elif empty.resolved:
        reason = "empty patch resolves"
    elif stale:
        reason = (
            f"the task's reference statuses are not the gold run's, e.g. {stale[0]} {reference.get(stale[0])}"
        )
    else:
        reason = ""
    twins = () if reason else checked_twins(task, backend, **limits)
    if not reason and task.twins is not None and set(task.twins) != set(twins):
        reason = "the task's stored twins are not the ones its gold and base runs check"
    covered = {t for twin in twins for t in twin.tests}
    return Validation(
        task.instance_id, not reason, reason or "ok", tuple(g.resolved for g in golds), empty.resolved, flaky,
        flaky_tests, _name_error(empty), time.monotonic() - start, reference if not reason else {},
        infrastructure, twins, len(covered) / len(task.fail_to_pass),
    )  # fmt: skip


def with_validation(task: Task, check: Validation) -> Task:
    """`task` carrying what a passed validation found: its reference statuses and its twins."""
    if not check.ok:
        return task
    return replace(
        task, reference_statuses=check.reference_statuses or task.reference_statuses, twins=check.twins
    )


def static_reject(task: Task, *, max_files: int = 7, max_lines: int = 500) -> str:
    """Why the gold patch is too big for the paper's filter ('' when it is not)."""
    files, lines = len(patch_files(task.patch)), changed_lines(task.patch)
    if files > max_files:
        return f"gold patch changes {files} files (> {max_files})"
    if lines >= max_lines:
        return f"gold patch changes {lines} lines (>= {max_lines})"
    return ""


def filter_tasks(
    tasks: Iterable[Task], *, backend: str = "local", runs: int = 1, max_files: int = 7, max_lines: int = 500,
    run_tests: bool = True, workers: int = 1, **limits: Any,
) -> tuple[list[Task], dict[str, str]]:  # fmt: skip
    """(kept tasks, {instance_id: why dropped}) under the paper's filters; with `run_tests`, each
    task that passes the size filter is validated (flaky, broken and ImportError/AttributeError
    tasks are dropped)."""
    tasks = list(tasks)
    dropped = {
        t.instance_id: why
        for t in tasks
        if (why := static_reject(t, max_files=max_files, max_lines=max_lines))
    }
    candidates = [t for t in tasks if t.instance_id not in dropped]
    if run_tests:
        with ThreadPoolExecutor(max(1, workers)) as pool:
            checks = list(
                pool.map(lambda t: validate_task(t, runs=runs, backend=backend, **limits), candidates)
            )
        checked = {}
        for t, v in zip(candidates, checks, strict=True):
            if not v.ok:
                dropped[t.instance_id] = v.reason
            elif v.import_or_attribute_error:
                dropped[t.instance_id] = "failing tests fail with ImportError/AttributeError before the fix"
            checked[t.instance_id] = v
        tasks = [with_validation(t, checked[t.instance_id]) if t.instance_id in checked else t for t in tasks]
    return [t for t in tasks if t.instance_id not in dropped], dropped


def validate_many(tasks: Iterable[Task], *, runs: int = 1, backend: str = "local", workers: int = 1,
                  **limits: Any) -> Iterable[Validation]:  # fmt: skip
    """validate_task over many tasks with `workers` threads, yielding results in task order."""
    with ThreadPoolExecutor(max(1, workers)) as pool:
        yield from pool.map(lambda t: validate_task(t, runs=runs, backend=backend, **limits), tasks)
