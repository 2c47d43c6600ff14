"""Grading a patch in a FRESH sandbox: resolved only if every FAIL_TO_PASS and PASS_TO_PASS test passes.

1. The patch must parse with git and every file section needs a `diff --git` header
   (envs.patches); it is applied with `git apply --index` only (no fuzzy fallback), so the files
   it changed are read back from git's own index, never from a hand-written diff parser.
2. Every change to a protected path (envs.patches: tests, conftest.py, runner configuration,
   .pth / sitecustomize, new runner-shadowing or compiled modules; pyproject.toml when its
   `[tool.pytest...]` tables change) is reset to the base state and named in `dropped_paths`.
3. The remaining change is scanned for tampering (code that reaches into the runner's internals,
   defines pytest hooks or plugins, registers exit hooks, or names report files): a tampering
   patch is not resolved and its `tamper` lists why.
4. test_patch is applied. If it does not apply, the grader checks it against the clean base: if it
   does not apply there either, the task is broken (`error`, excluded); else the patch broke it (0).
5. A pytest command runs with the grader's own configuration: `-c` the project's (reset) config
   file or an empty one, `--rootdir` the checkout, plugin autoload off, `-p no:cacheprovider`,
   PYTHONSAFEPATH, and the grader's plugin (envs.grader_plugin) whose JSON-lines report is the
   only source of results. The verdict needs the report's session end and the runner's exit
   status to agree. Other commands are parsed from their log by the task's named parser.
6. A graded test missing from the results failed. Before the patch, a preflight (`--help` with
   the grader's plugin) checks that the runner starts on the clean base; if it does not, the test
   command cannot start: an infrastructure failure (`error`). A run the patch stops before the
   plugin loads is the patch's failure.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.backends import open_sandbox
from envs.errors import SandboxError
from envs.parsers import (
    ERROR,
    FAILED,
    MISSING,
    PARSERS,
    PASSED,
    PASSING,
    SKIPPED,
    XFAIL,
    graded_failures,
    status_of,
)
from envs.patches import PatchError, check_git_sections, is_protected, patch_files
from envs.sandbox import Sandbox
from envs.tasks import Task

DEFAULT_TEST_TIMEOUT_S = 1800.0
REPORT_LIMIT = 64 << 20  # bytes of the grader's report read back at most
_PYTEST_RE = re.compile(r"^\s*(?:\w+=\S*\s+)*(python3?\s+-m\s+)?pytest(?:\s|$)")
_PLUGIN_SOURCE = Path(__file__).with_name("grader_plugin.py")
_NOT_STARTED = "the test command cannot start"
# Added code that tampers with the runner or its report. Runner-internal names are exempt in a
# project that tracks the runner itself (pytest's own repository).
_TAMPER = {
    "reaches into the test runner's internals": r"\b_pytest\b|\bpluggy\b|\bhookimpl\b|\bpytest_plugins\b"
    r"|^\s*(?:async\s+)?def\s+pytest_\w+|sys\.modules\s*\[\s*['\"]pytest",
    "registers an exit hook": r"\batexit\b|\bos\s*\.\s*_exit\b|\bsys\s*\.\s*exitfunc\b",
    "touches the test report": r"junit|--junitxml|report\.xml|jaxswe|JAXSWE|PYTEST_ADDOPTS|PYTEST_PLUGINS",
}
_RUNNER_INTERNALS = next(iter(_TAMPER))
_CONFIG_ORDER = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                 "setup.cfg")  # fmt: skip
_RANK = {PASSED: 0, XFAIL: 0, SKIPPED: 1, FAILED: 2, ERROR: 3, MISSING: 4}


@dataclass(frozen=True)
class GradeResult:
    """`tests`: status of every test the run reported, plus MISSING for graded tests it did not.
    `error`: the task or infrastructure failed (not the agent); such results are excluded, not scored 0.
    `tamper`: why the patch was flagged as tampering with the grader (never resolved)."""

    resolved: bool
    tests: dict[str, str]
    log: str
    reason: str
    messages: dict[str, str] = field(default_factory=dict)
    dropped_paths: tuple[str, ...] = ()
    error: bool = False
    tamper: tuple[str, ...] = ()


def _git(sandbox: Sandbox, args: str, timeout: float = 120) -> tuple[bool, str]:
    done = sandbox.exec(f"git -c core.quotepath=false {args} 2>&1", timeout=timeout)
    return done.exit_code == 0 and not done.timed_out, done.output


def _changed_paths(sandbox: Sandbox) -> list[tuple[str, str]]:
    """(status letter, path) of every index change against HEAD, renames split, from git itself."""
    out = f".git/jaxswe-{uuid.uuid4().hex}.names"
    ok, log = _git(sandbox, f"diff --cached --name-status -z --no-renames HEAD > {out}")
    if not ok:
        raise SandboxError(f"git diff --cached failed: {log.strip()[-300:]}")
    raw = sandbox.read_file(out, max_bytes=REPORT_LIMIT)
    fields = raw.split("\0")
    return [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2) if fields[i]]


def _pytest_tables(text: str) -> Any:
    try:
        return tomllib.loads(text).get("tool", {}).get("pytest")
    except tomllib.TOMLDecodeError:
        return "unparseable"


def _protected_changes(sandbox: Sandbox, changes: list[tuple[str, str]], test_files: set[str]) -> list[str]:
    """The changed paths to reset: protected ones, and pyproject.toml files whose pytest tables changed."""
    dropped = []
    for status, path in changes:
        if is_protected(path, test_files, new=status == "A"):
            dropped.append(path)
        elif Path(path).name == "pyproject.toml" and status != "D":
            base = sandbox.exec(f"git show HEAD:{shlex.quote(path)}", timeout=30)
            old = _pytest_tables(base.output) if base.exit_code == 0 else None
            if old != _pytest_tables(_read(sandbox, path)):
                dropped.append(path)
    return dropped


def _read(sandbox: Sandbox, path: str) -> str:
    try:
        return sandbox.read_file(path)
    except SandboxError:
        return ""


def _reset(sandbox: Sandbox, paths: list[str]) -> None:
    """Put `paths` back to HEAD (tracked) or remove them (new), in index and work tree."""
    for path in paths:
        q = shlex.quote(path)
        sandbox.exec(
            f"git reset -q HEAD -- {q}; if git cat-file -e HEAD:{q} 2>/dev/null; "
            f"then git checkout HEAD -- {q}; else rm -rf -- {q}; fi",
            timeout=60,
        )


def tamper_reasons(diff: str, *, runner_exempt: bool = False) -> tuple[str, ...]:
    """Why the added lines of `diff` (a git diff) tamper with grading (see the module docstring)."""
    added = "\n".join(ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++ "))
    return tuple(
        why
        for why, pattern in _TAMPER.items()
        if not (runner_exempt and why == _RUNNER_INTERNALS) and re.search(pattern, added, re.MULTILINE)
    )


def _apply_test_patch(sandbox: Sandbox, test_patch: str) -> tuple[bool, bool, str]:
    """(applied, applies to the clean base, log)."""
    name = f".git/jaxswe-{uuid.uuid4().hex}.diff"
    sandbox.write_file(name, test_patch)
    ok, log = _git(sandbox, f"apply --whitespace=nowarn -v {name}")
    clean = True
    if not ok:
        idx = f".git/jaxswe-{uuid.uuid4().hex}.index"
        clean, _ = _git(sandbox, f"read-tree --index-output={idx} HEAD && GIT_INDEX_FILE={idx} "
                                 f"git apply --cached --check {name}")  # fmt: skip
    return ok, clean, log


def _config_file(sandbox: Sandbox) -> str | None:
    """The checkout's pytest configuration file as pytest would find it at the root, or None."""
    names = " ".join(_CONFIG_ORDER)
    present = sandbox.exec(f'for f in {names}; do [ -f "$f" ] && echo "$f"; done', timeout=30).output.split()
    for name in [n for n in _CONFIG_ORDER if n in present]:
        if name not in ("pyproject.toml", "tox.ini", "setup.cfg"):
            return name
        text = _read(sandbox, name)
        if name == "pyproject.toml" and not _pytest_tables(text):
            continue
        if name == "tox.ini" and "[pytest]" not in text:
            continue
        if name == "setup.cfg" and "[tool:pytest]" not in text:
            continue
        return name
    return None


def build_test_command(task: Task, private_dir: str | None, config: str | None = None) -> tuple[str, dict]:
    """(command, extra environment): a pytest command gets the grader's configuration and plugin."""
    command = task.test_command
    m = _PYTEST_RE.match(command)
    if private_dir is None or not m or re.search(r"[;&|<>`$\n]", command):
        return command, {}
    ini = config or f"{private_dir}/pytest.ini"
    env = {"JAXSWE_GRADER_REPORT": f"{private_dir}/report.jsonl", "PYTHONSAFEPATH": "1"}
    if m.group(1):
        env["JAXSWE_GRADER_CWD"] = "1"
    extra = f" -c {shlex.quote(ini)} --rootdir=. -p no:cacheprovider -p jaxswe_grader"
    return command + extra, env


def _env_prefix(env: dict[str, str], private_dir: str) -> str:
    pairs = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": private_dir, **env}
    unset = "unset PYTEST_ADDOPTS PYTEST_PLUGINS PYTHONSTARTUP PYTHONHOME; "
    return unset + " ".join(f"{k}={shlex.quote(v)}" for k, v in pairs.items()) + " "


def parse_report(text: str) -> tuple[dict[str, str], dict[str, str], bool, int | None]:
    """The grader plugin's JSON lines -> (status per test, messages, started, final exit status)."""
    tests: dict[str, str] = {}
    messages: dict[str, str] = {}
    started, exitstatus = False, None
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        event = rec.get("event") if isinstance(rec, dict) else None
        if event == "start":
            started = True
        elif event == "finish":
            exitstatus = rec.get("exitstatus")
        elif event == "test":
            status = _status(rec)
            node = str(rec.get("nodeid"))
            if node not in tests or _RANK[status] > _RANK[tests[node]]:
                tests[node] = status
                if rec.get("message"):
                    messages[node] = str(rec["message"])
    return tests, messages, started, exitstatus


def _status(rec: dict) -> str:
    outcome, when = rec.get("outcome"), rec.get("when")
    if outcome == "passed":
        if rec.get("raised"):  # the phase raised but its report says passed: rewritten
            return FAILED
        return PASSED
    if outcome == "skipped":
        return XFAIL if rec.get("xfail") else SKIPPED
    return FAILED if when == "call" else ERROR


def _preflight(sandbox: Sandbox, task: Task, private: str) -> GradeResult | None:
    """On the clean base, before the patch: the runner starts and loads the grader's plugin (`--help`
    loads `-p` plugins), else the test command cannot start: an infrastructure failure."""
    sandbox.write_file(f"{private}/pytest.ini", "[pytest]\n")
    sandbox.write_file(f"{private}/jaxswe_grader.py", _PLUGIN_SOURCE.read_text())
    command, env = build_test_command(task, private, _config_file(sandbox))
    if not env:
        return None
    run = sandbox.exec(_env_prefix(env, private) + command + " --help", timeout=300)
    started = parse_report(_read(sandbox, f"{private}/report.jsonl"))[2]
    sandbox.exec(f"rm -f {private}/report.jsonl", timeout=30)
    if started:
        return None
    return GradeResult(False, {}, run.output, f"{_NOT_STARTED}: exit {run.exit_code}", error=True)


def grade_in(
    sandbox: Sandbox, task: Task, patch: str, *, test_timeout: float = DEFAULT_TEST_TIMEOUT_S
) -> GradeResult:
    """Grade `patch` in `sandbox`, which must be fresh at the task's clean base state."""
    dropped: list[str] = []
    tamper: tuple[str, ...] = ()
    private = f"/tmp/jaxswe-grader-{uuid.uuid4().hex}"
    if _PYTEST_RE.match(task.test_command) and (failed := _preflight(sandbox, task, private)) is not None:
        return failed
    if patch.strip():
        try:
            check_git_sections(patch)
        except PatchError as err:
            return GradeResult(False, {}, patch[-2000:], f"patch does not apply: {err}")
        name = f".git/jaxswe-{uuid.uuid4().hex}.diff"
        sandbox.write_file(name, patch)
        ok, out = _git(sandbox, f"update-index -q --refresh; git apply --index --whitespace=nowarn -v {name}")
        if not ok:
            return GradeResult(False, {}, out, f"patch does not apply: {out.strip()[-300:]}")
        dropped = _protected_changes(sandbox, _changed_paths(sandbox), set(patch_files(task.test_patch)))
        _reset(sandbox, dropped)
        kept = sandbox.exec(
            "git -c core.quotepath=false diff --cached --no-color --no-ext-diff HEAD", timeout=120
        )
        exempt = sandbox.exec(
            "git ls-files -- '_pytest/*' 'src/_pytest/*' | head -1", timeout=30
        ).output.strip()
        tamper = tamper_reasons(kept.output, runner_exempt=bool(exempt))
        if tamper:
            missing = {t: MISSING for t in [*task.fail_to_pass, *task.pass_to_pass]}
            return GradeResult(False, missing, kept.output[-2000:], f"tampering: {'; '.join(tamper)}",
                               dropped_paths=tuple(dropped), tamper=tamper)  # fmt: skip
    ok, clean, out = _apply_test_patch(sandbox, task.test_patch)
    if not ok:
        why = (
            "test_patch does not apply to the clean base"
            if not clean
            else "the patch makes test_patch fail to apply"
        )
        return GradeResult(False, {}, out, why, dropped_paths=tuple(dropped), error=not clean)
    command, env = build_test_command(task, private, _config_file(sandbox))
    if env:
        run = sandbox.exec(_env_prefix(env, private) + command, timeout=test_timeout)
        try:
            report = sandbox.read_file(f"{private}/report.jsonl", max_bytes=REPORT_LIMIT)
        except SandboxError:
            report = ""
        tests, messages, started, exitstatus = parse_report(report)
        disagree = None
        if not started:  # it started on the clean base (preflight): the patch stopped it
            disagree = "the test run never reached the grader's plugin"
        elif exitstatus is None:
            disagree = "the test run did not finish (no session end in the grader's report)"
        elif exitstatus != run.exit_code:
            disagree = f"the test command exited {run.exit_code} but its session ended with {exitstatus}"
    else:
        run = sandbox.exec(command, timeout=test_timeout)
        tests, messages = PARSERS[task.log_parser](run.output)
        if not tests and run.exit_code in (126, 127):  # the shell could not find or run the command
            return GradeResult(False, {}, run.output, f"{_NOT_STARTED}: exit {run.exit_code}",
                               dropped_paths=tuple(dropped), error=True)  # fmt: skip
        disagree = None
    return _verdict(task, tests, messages, run.output, run.exit_code, run.timed_out, tuple(dropped), disagree)


def _verdict(
    task: Task, tests: dict[str, str], messages: dict[str, str], log: str, exit_code: int, timed_out: bool,
    dropped: tuple[str, ...], disagree: str | None,
) -> GradeResult:  # fmt: skip
    graded = [*task.fail_to_pass, *task.pass_to_pass]  # SWE-bench's rules: envs.parsers
    statuses = {**tests, **{t: status_of(t, tests) for t in graded if t not in tests}}
    failing = graded_failures(task.fail_to_pass, task.pass_to_pass, tests)
    if failing:
        first, status = failing[0]
        reason = f"{len(failing)} of {len(graded)} graded tests not passing, e.g. {first} {status}"
    elif timed_out:
        reason = "the test command timed out"
    elif disagree:
        reason = disagree
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
