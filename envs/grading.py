"""Grading a patch in a FRESH sandbox: resolved only if every FAIL_TO_PASS and PASS_TO_PASS test passes.

1. The agent's patch loses every file section on a test path (envs.patches: the files test_patch
   touches, tests/ test/ testing/ dirs, test_*.py, *_test.py, conftest.py, pytest.ini), then is
   applied (`git apply`, else `patch --fuzz=5`); a patch that does not apply is not resolved.
2. test_patch is applied, and the test command runs.
3. A pytest command gets `-rA --junitxml=<random path>` and the junit report is the only source
   of results: text the agent's code prints (fake `PASSED ...` lines) is never parsed. Other
   commands are parsed from their log by the task's named parser (envs.parsers).
4. A graded test missing from the results failed. A non-zero exit code of the test command when
   every parsed test passed (a crash after the summary, or printed results) is not resolved.
"""

from __future__ import annotations

import re
import shlex
import uuid
from dataclasses import dataclass, field
from typing import Any

from envs.backends import open_sandbox
from envs.parsers import PARSERS, PASSING, graded_failures, parse_junit_xml, status_of
from envs.patches import file_sections, patch_files, split_patch
from envs.sandbox import Sandbox
from envs.tasks import Task

MISSING = "MISSING"
DEFAULT_TEST_TIMEOUT_S = 1800.0
_PYTEST_RE = re.compile(r"^\s*(?:\w+=\S*\s+)*(?:python3?\s+-m\s+)?pytest(?:\s|$)")


@dataclass(frozen=True)
class GradeResult:
    """`tests`: status of every test the run reported, plus MISSING for graded tests it did not.
    `error`: the task or infrastructure failed (not the agent); such results are excluded, not scored 0."""

    resolved: bool
    tests: dict[str, str]
    log: str
    reason: str
    messages: dict[str, str] = field(default_factory=dict)
    dropped_paths: tuple[str, ...] = ()
    error: bool = False


def _apply(sandbox: Sandbox, diff: str) -> tuple[bool, str]:
    name = f".git/jaxswe-{uuid.uuid4().hex}.diff"
    sandbox.write_file(name, diff)
    done = sandbox.exec(
        f"git apply --whitespace=nowarn -v {name} 2>&1 || "
        f"{{ command -v patch >/dev/null && patch --batch --fuzz=5 -p1 -i {name}; }}; "
        f"rc=$?; rm -f {name}; exit $rc",
        timeout=120,
    )
    return done.exit_code == 0, done.output


def build_test_command(task: Task, report_path: str | None) -> str:
    """The task's test command; a pytest command also writes a junit-xml report to `report_path`."""
    command = task.test_command
    if report_path is None or not _PYTEST_RE.match(command) or re.search(r"[;&|<>`$]", command):
        return command
    return f"{command} -rA -o junit_family=xunit1 --junitxml={shlex.quote(report_path)}"


def grade_in(
    sandbox: Sandbox, task: Task, patch: str, *, test_timeout: float = DEFAULT_TEST_TIMEOUT_S
) -> GradeResult:
    """Grade `patch` in `sandbox`, which must be fresh at the task's clean base state."""
    if patch.strip() and not file_sections(patch):
        return GradeResult(False, {}, patch[-2000:], "patch does not apply: not a unified diff")
    kept, dropped = split_patch(patch, patch_files(task.test_patch))
    if kept.strip():
        ok, out = _apply(sandbox, kept)
        if not ok:
            return GradeResult(
                False, {}, out, f"patch does not apply: {out.strip()[-300:]}", dropped_paths=tuple(dropped)
            )
    ok, out = _apply(sandbox, task.test_patch)
    if not ok:
        return GradeResult(
            False, {}, out, "test_patch does not apply", dropped_paths=tuple(dropped), error=True
        )
    report = f"/tmp/jaxswe-{uuid.uuid4().hex}/report.xml"
    command = build_test_command(task, report)
    if command != task.test_command:
        sandbox.exec(f"mkdir -p {shlex.quote(report.rsplit('/', 1)[0])}", timeout=30)
    run = sandbox.exec(command, timeout=test_timeout)
    if command != task.test_command:
        try:
            listed = sandbox.exec("git ls-files -co --exclude-standard -- '*.py'", timeout=60).output
            tests, messages = parse_junit_xml(sandbox.read_file(report), files=listed.splitlines())
        except Exception:  # no report or a broken one: every graded test is missing
            tests, messages = {}, {}
        sandbox.exec(f"rm -rf {shlex.quote(report.rsplit('/', 1)[0])}", timeout=30)
    else:
        tests, messages = PARSERS[task.log_parser](run.output)
    return _verdict(task, tests, messages, run.output, run.exit_code, run.timed_out, tuple(dropped))


def _verdict(
    task: Task, tests: dict[str, str], messages: dict[str, str], log: str, exit_code: int, timed_out: bool,
    dropped: tuple[str, ...],
) -> GradeResult:  # fmt: skip
    graded = [*task.fail_to_pass, *task.pass_to_pass]  # SWE-bench's rules: envs.parsers
    statuses = {**tests, **{t: status_of(t, tests) for t in graded if t not in tests}}
    failing = graded_failures(task.fail_to_pass, task.pass_to_pass, tests)
    if failing:
        first, status = failing[0]
        reason = f"{len(failing)} of {len(graded)} graded tests not passing, e.g. {first} {status}"
    elif timed_out:
        reason = "the test command timed out"
    elif exit_code != 0 and all(s in PASSING for s in tests.values()):
        reason = f"the test command exited {exit_code} although every reported test passed"
    else:
        reason = ""
    return GradeResult(not reason, statuses, log, reason or "resolved", messages, dropped)


def grade(task: Task, patch: str, backend: str = "local", *, test_timeout: float = DEFAULT_TEST_TIMEOUT_S,
          **limits: Any) -> GradeResult:  # fmt: skip
    """Grade `patch` for `task` in a fresh sandbox of `backend` (see the module docstring)."""
    with open_sandbox(task, backend, **limits) as sandbox:
        return grade_in(sandbox, task, patch, test_timeout=test_timeout)
