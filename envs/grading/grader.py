"""Grading a patch in a FRESH sandbox: resolved only if every FAIL_TO_PASS and PASS_TO_PASS test passes.

The grading environment is the task's own: its import root, its pytest plugins, its config. Code
the patch adds runs inside the test process, so nothing that process reports is trusted on its
own: canary tests (envs.grading.canaries) planted after the patch must come back as expected, else the
result was forged. The other layers are tripwires and hygiene on top:

1. Before the patch, a preflight (`--help` with the grader's plugin) checks that the runner starts
   on the clean base: if it does not (a plugin the config needs is missing, the environment is
   broken), the test command cannot start, an infrastructure failure (`error`), never reward 0.
   It also records the entry-point plugins pytest autoloads there (the task environment's own:
   pytest-mock, pytest-asyncio, ...); the graded run loads exactly those, by name (`-p NAME`,
   before the grader's plugin puts the checkout on sys.path) with autoload off, so nothing in the
   checkout (a `*.dist-info` with a `[pytest11]` entry point) runs at runner start-up. A pytest too
   old to load a plugin by its entry-point name (before 4.4), or a plugin found only through the
   task's own path (the runner does not start with it named), autoloads as the environment says.
2. The patch must parse with git and every file section needs a `diff --git` header
   (envs.tasks.patches); it is applied with `git apply --index`, else (as SWE-bench does) with
   `patch --fuzz=5` when its `+++` names agree with git's, so the files it changed are read back
   from git's own index, never from a hand-written diff parser.
3. Every change to a protected path (envs.tasks.patches: tests, conftest.py, runner configuration,
   .gitattributes, start-up hooks, new modules shadowing the runner or the stdlib at an import
   root, importable binaries) is reset to the sandbox's start state (HEAD plus a task image's own
   uncommitted setup edits: patches are taken against that state) and named in `dropped_paths`.
4. The remaining change, every byte of it (attributes and textconv ignored), is scanned by regex
   tripwires (code that reaches into the runner's internals, registers exit hooks, names report
   files). A match is a flag for a reader, named in `flags`: it never lowers the reward (a correct
   fix whose docstring mentions `atexit` resolves, flagged); the patch is graded as any other and
   `resolved` is decided by the tests and canaries alone.
5. test_patch is applied. If it does not apply, the grader checks it against the clean base: if it
   does not apply there either, the task is broken (`error`, excluded); else the patch broke it (0).
6. Canaries go into every graded test file. A pytest command runs with `-c` the project's (reset)
   config file or an empty one, `--rootdir` the checkout, `-p no:cacheprovider`, `--maxfail=0`,
   only the grader's directory on PYTHONPATH (its plugin, envs.grading.grader_plugin, puts the task's
   path back once pytest is imported) and `python -m pytest` started through the grader's launcher,
   so the checkout is never first on sys.path while pytest imports itself. The plugin's JSON-lines
   report is the source of results; the verdict needs its session end and the exit status to agree.
   Other commands are parsed from their log by the task's named parser.
7. Verdict: a test's status is its call phase's (setup only: MISSING; a test past the per-test
   timeout: FAILED); a graded test missing from the results failed; with reference statuses (the
   gold run's, recorded at validation) XFAIL and SKIPPED count only where gold had them; any canary
   not as expected: reward 0, `tamper` ("forged result"), the canary named in the reason.
"""

from __future__ import annotations

import builtins
import configparser
import functools
import hashlib
import json
import random
import re
import secrets
import shlex
import tomllib
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from envs.errors import EngineError, SandboxError
from envs.grading.canaries import STYLES, Canary, plant, wrong
from envs.host_git import cache_dir
from envs.provision.backends import open_sandbox
from envs.provision.venvs import packaging_note
from envs.sandbox.protocol import ExecResult, Sandbox
from envs.tasks import twins
from envs.tasks.parsers import (
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
from envs.tasks.patches import IMPORTABLE_SUFFIXES, PatchError, check_git_sections, is_protected, patch_files
from envs.tasks.records import Task
from envs.tasks.twins import Twin, added_lines, fit, make_twins, twin_patch

DEFAULT_TEST_TIMEOUT_S = 600.0  # one whole test run
DEFAULT_CASE_TIMEOUT_S = 120.0  # one test's call phase (pytest)
REPORT_LIMIT = 16 << 20  # bytes of the grader's report read back at most (a longer one is not read)
FORGED = "forged result"
NO_TWIN = "no validated twin: the grade rests on its canaries alone"
_PYTEST_RE = re.compile(r"^\s*(?:\w+=\S*\s+)*(?P<py>python3?\s+-m\s+pytest|pytest)(?:\s|$)")
_PLUGIN_SOURCE = Path(__file__).with_name("grader_plugin.py")
_FILE_STATUS_RE = re.compile(r"\s+\[(?:OK|FAIL)\]$", re.M)
_LAUNCHER = "import sys\n\nimport pytest\n\nsys.exit(pytest.main())\n"
_NOT_STARTED = "the test command cannot start"
# Tripwires: added code that looks like it tampers with the runner or its report (flags only, a
# correct fix may match). Runner-internal names are exempt in a project that tracks the runner
# itself (pytest's own repository).
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
_GIT = "git -c core.quotepath=false -c core.attributesFile=/dev/null"


@dataclass(frozen=True)
class GradeResult:
    """`tests`: status of every test the run reported, plus MISSING for graded tests it did not.
    `error`: the task or infrastructure failed (not the agent); such results are excluded, not scored 0.
    `tamper`: why the patch was found tampering with the grader (a forged result: never resolved).
    `flags`: the tripwires the kept change matched (module docstring, layer 4): reported, never scored.
    `canaries`: how many canary tests the run held (0: graded without them, `reason` or `notes` say why)."""

    resolved: bool
    tests: dict[str, str]
    log: str
    reason: str
    messages: dict[str, str] = field(default_factory=dict)
    dropped_paths: tuple[str, ...] = ()
    error: bool = False
    tamper: tuple[str, ...] = ()
    canaries: int = 0
    notes: tuple[str, ...] = ()
    uncollected: tuple[str, ...] = ()  # graded test files the run could not collect (import errors)
    flags: tuple[str, ...] = ()


def _git(sandbox: Sandbox, args: str, timeout: float = 120) -> tuple[bool, str]:
    done = sandbox.exec(f"{_GIT} {args} 2>&1", timeout=timeout)
    return done.exit_code == 0 and not done.timed_out, done.output


def _start_tree(sandbox: Sandbox) -> str:
    """The fresh sandbox's state as a git tree: HEAD's, plus a task image's own uncommitted setup
    edits (SWE-bench images change tox.ini and the like), staged so `git apply --index` applies."""
    ok, out = _git(sandbox, "add -A -- . >/dev/null 2>&1; git write-tree")
    tree = out.strip().splitlines()[-1:] if ok else []
    if not tree:
        raise SandboxError(f"cannot read the checkout's state: {out.strip()[-300:]}")
    return tree[0]


def _changed_paths(sandbox: Sandbox, start: str) -> list[tuple[str, str]]:
    """(status letter, path) of every index change against `start`, renames split, from git itself."""
    out = f".git/jaxswe-{uuid.uuid4().hex}.names"
    ok, log = _git(sandbox, f"diff --cached --name-status -z --no-renames {start} > {out}")
    if not ok:
        raise SandboxError(f"git diff --cached failed: {log.strip()[-300:]}")
    raw = sandbox.read_file(out, max_bytes=REPORT_LIMIT)
    fields = raw.split("\0")
    return [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2) if fields[i]]


def _pytest_tables(name: str, text: str) -> Any:
    """The pytest configuration a pyproject.toml or setup.cfg holds (its `[tool.pytest...]` tables,
    its `[tool:pytest]` section)."""
    if name == "setup.cfg":
        parser = configparser.RawConfigParser()
        try:
            parser.read_string(text)
        except configparser.Error:
            return "unparseable"
        return dict(parser["tool:pytest"]) if parser.has_section("tool:pytest") else None
    try:
        return tomllib.loads(text).get("tool", {}).get("pytest")
    except tomllib.TOMLDecodeError:
        return "unparseable"


def _binaries(sandbox: Sandbox, paths: list[str]) -> list[str]:
    """Those of `paths` (files the patch added or changed) that are importable and not text."""
    code = [p for p in paths if p.endswith(IMPORTABLE_SUFFIXES)]
    if not code:
        return []
    listed = " ".join(shlex.quote(p) for p in code)
    found = sandbox.exec(
        f'for f in {listed}; do [ -f "$f" ] && [ -s "$f" ] && ! grep -qI \'\' "$f" && printf \'%s\\n\' "$f"; '
        "done; true",
        timeout=60,
    )
    return [p for p in found.output.splitlines() if p in code]


@functools.lru_cache(maxsize=1024)
def _files_of(diff: str) -> frozenset[str]:
    """The paths a task's diff touches (git's parser, once per diff: grading asks for every episode)."""
    return frozenset(patch_files(diff))


def _protected_changes(
    sandbox: Sandbox, changes: list[tuple[str, str]], test_files: frozenset[str],
    import_roots: tuple[str, ...], start: str, gold_files: frozenset[str],
) -> list[str]:  # fmt: skip
    """The changed paths to reset: protected ones, importable binaries, and pyproject.toml /
    setup.cfg files whose pytest configuration changed. A file the gold patch itself changes is
    the task's code, as upstream treats it (only its shadowing and binary rules apply)."""
    dropped = []
    for status, path in changes:
        name = PurePosixPath(path).name
        if path in gold_files and status != "A":
            continue
        if is_protected(path, test_files, new=status == "A", import_roots=import_roots):
            dropped.append(path)
        elif name in ("pyproject.toml", "setup.cfg") and status != "D":
            base = sandbox.exec(f"git show {start}:{shlex.quote(path)}", timeout=30)
            old = _pytest_tables(name, base.output) if base.exit_code == 0 else None
            if old != _pytest_tables(name, _read(sandbox, path)):
                dropped.append(path)
    kept = [p for s, p in changes if s != "D" and p not in dropped]
    return dropped + _binaries(sandbox, kept)


def _layout(sandbox: Sandbox) -> tuple[tuple[str, ...], bool]:
    """(where a new top-level module would be importable: the root, and `src/` in a src layout;
    whether the project tracks the test runner itself, pytest's own repository), in one call."""
    found = sandbox.exec(
        "git ls-files -- 'src/*.py' 'src/*/__init__.py' | head -1; echo :; "
        "git ls-files -- '_pytest/*' 'src/_pytest/*' | head -1",
        timeout=30,
    ).output
    src, _, runner = found.partition(":")
    return ((".", "src") if src.strip() else (".",)), bool(runner.strip())


def _read(sandbox: Sandbox, path: str) -> str:
    try:
        return sandbox.read_file(path)
    except SandboxError:
        return ""


def _reset(sandbox: Sandbox, paths: list[str], start: str) -> None:
    """Put `paths` back to the sandbox's start state (or remove them if new), in index and work tree."""
    for path in paths:
        q = shlex.quote(path)
        sandbox.exec(
            f"git reset -q {start} -- {q}; if git cat-file -e {start}:{q} 2>/dev/null; "
            f"then git checkout {start} -- {q}; else rm -rf -- {q}; fi",
            timeout=60,
        )


def tamper_reasons(diff: str, *, runner_exempt: bool = False) -> tuple[str, ...]:
    """The tripwires the added lines of `diff` (a git diff) match: flags, never a verdict (see the
    module docstring, layer 4)."""
    added = "\n".join(ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++ "))
    return tuple(
        why
        for why, pattern in _TAMPER.items()
        if not (runner_exempt and why == _RUNNER_INTERNALS) and re.search(pattern, added, re.MULTILINE)
    )


def _apply_patch(sandbox: Sandbox, patch: str) -> tuple[bool, str]:
    """`git apply --index`, else `patch --fuzz=5` (SWE-bench's fallback) when the patch's `---`/`+++`
    names are git's own (so both tools change the same files), its files then staged by name."""
    name = f".git/jaxswe-{uuid.uuid4().hex}.diff"
    sandbox.write_file(name, patch)
    ok, out = _git(sandbox, f"update-index -q --refresh; {_GIT} apply --index --whitespace=nowarn -v {name}")
    if ok:
        return True, out
    paths = set(patch_files(patch))
    named = {ln[6:].rstrip("\n") for ln in patch.splitlines() if ln.startswith(("+++ b/", "--- a/"))}
    if not named or not named <= paths or any(c in "".join(paths) for c in '"\\\t\n'):
        return False, out
    done = sandbox.exec(
        f"patch --batch --fuzz=5 -p1 --no-backup-if-mismatch -r - -i {name} 2>&1", timeout=120
    )
    if done.exit_code != 0:
        sandbox.exec("git checkout -q -- . 2>/dev/null; git clean -fdq 2>/dev/null", timeout=120)
        return False, out + done.output
    staged, log = _git(sandbox, "add -A -f -- " + " ".join(shlex.quote(p) for p in sorted(paths)))
    return staged, out + done.output + log


def _apply_test_patch(sandbox: Sandbox, test_patch: str, start: str) -> tuple[bool, bool, str]:
    """(applied, applies to the clean base, log). An empty test_patch (SWE-smith: the tests are in
    the repository) applies trivially."""
    if not test_patch.strip():
        return True, True, ""
    name = f".git/jaxswe-{uuid.uuid4().hex}.diff"
    sandbox.write_file(name, test_patch)
    ok, log = _git(sandbox, f"apply --whitespace=nowarn -v {name}")
    clean = True
    if not ok:
        idx = f".git/jaxswe-{uuid.uuid4().hex}.index"
        clean, _ = _git(sandbox, f"read-tree --index-output={idx} {start} && GIT_INDEX_FILE={idx} "
                                 f"{_GIT} apply --cached --check {name}")  # fmt: skip
    return ok, clean, log


def _config_file(sandbox: Sandbox) -> str | None:
    """The checkout's pytest configuration file as pytest would find it at the root, or None."""
    names = " ".join(_CONFIG_ORDER)
    present = sandbox.exec(f'for f in {names}; do [ -f "$f" ] && echo "$f"; done', timeout=30).output.split()
    for name in [n for n in _CONFIG_ORDER if n in present]:
        if name not in ("pyproject.toml", "tox.ini", "setup.cfg"):
            return name
        text = _read(sandbox, name)
        if name == "pyproject.toml" and not _pytest_tables(name, text):
            continue
        if name == "tox.ini" and "[pytest]" not in text:
            continue
        if name == "setup.cfg" and "[tool:pytest]" not in text:
            continue
        return name
    return None


def _via_plugin(command: str) -> bool:
    """Whether `command` is a plain pytest command (run with the grader's plugin), not a shell line."""
    return bool(_PYTEST_RE.match(command)) and not re.search(r"[;&|<>`$\n]", command)


def build_test_command(
    task: Task, private_dir: str | None, config: str | None = None, extra_ids: tuple[str, ...] = (),
    plugins: tuple[str, ...] | None = None,
) -> tuple[str, dict]:  # fmt: skip
    """(command, extra environment): a pytest command gets the grader's configuration, launcher and
    plugin (see the module docstring); `extra_ids` (canaries) are added where the command names
    single tests; `plugins` (recorded on the clean base): loaded by name, autoload off (None: the
    environment's autoload as it is)."""
    command = task.test_command
    if private_dir is None or not _via_plugin(command):
        return command, {}
    m = _PYTEST_RE.match(command)
    ini = config or f"{private_dir}/pytest.ini"
    env = {"JAXSWE_GRADER_REPORT": f"{private_dir}/report.jsonl"}
    if m.group("py") != "pytest":  # python -m pytest: the launcher, then the cwd on sys.path
        python = m.group("py").split()[0]
        command = (
            command[: m.start("py")] + f"{python} {private_dir}/jaxswe_pytest.py" + command[m.end("py") :]
        )
        env["JAXSWE_GRADER_CWD"] = "1"
    if extra_ids and "::" in " ".join(task.test_directives):
        command += " " + " ".join(shlex.quote(i) for i in extra_ids)
    if plugins is not None:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    named = "".join(f" -p {shlex.quote(name)}" for name in plugins or ())
    extra = f" -c {shlex.quote(ini)} --rootdir=. -p no:cacheprovider --maxfail=0{named} -p jaxswe_grader"
    return command + extra, env


def _env_prefix(env: dict[str, str], private_dir: str) -> str:
    """The task's environment as it is (plugins, PYTHONPATH handed to the plugin), and the grader's
    directory alone on PYTHONPATH while pytest starts."""
    keep = 'JAXSWE_GRADER_PATH="${PYTHONPATH-}" '
    pairs = {"PYTHONPATH": private_dir, **env}
    unset = "unset PYTEST_ADDOPTS PYTEST_PLUGINS PYTHONSTARTUP PYTHONHOME PYTHONSAFEPATH; "
    return unset + keep + " ".join(f"{k}={shlex.quote(v)}" for k, v in pairs.items()) + " "


@dataclass(frozen=True)
class Report:
    """The grader plugin's report: status per test, messages, failed collectors, start and finish."""

    tests: dict[str, str]
    messages: dict[str, str]
    collect_errors: frozenset[str]
    started: bool
    exitstatus: int | None
    plugins: tuple[str, ...] | None = None  # entry-point plugins loaded (None: unknown, or pytest < 4.4)


def parse_report(text: str) -> Report:
    """The grader plugin's JSON lines -> Report. A test's status is its call phase's; a setup that
    failed or skipped gives ERROR or SKIPPED; a setup with no call is MISSING; a failed teardown
    makes it ERROR; a phase that raised while its report says passed is FAILED."""
    phases: dict[str, dict[str, str]] = {}
    messages: dict[str, str] = {}
    collect: set[str] = set()
    started, exitstatus, plugins = False, None, None
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
        elif event == "plugins":
            plugins = _plugin_names(rec)
        elif event == "collect":
            collect.add(str(rec.get("nodeid")))
            messages[str(rec.get("nodeid"))] = str(rec.get("message", ""))
        elif event == "test" and rec.get("when") in ("setup", "call", "teardown"):
            node = str(rec.get("nodeid"))
            status = _status(rec)
            seen = phases.setdefault(node, {})
            if _RANK[status] >= _RANK.get(seen.get(rec["when"], PASSED), 0):
                seen[rec["when"]] = status
            if rec.get("message") and status not in PASSING:
                messages[node] = str(rec["message"])
    tests = {node: _test_status(p) for node, p in phases.items()}
    return Report(tests, messages, frozenset(collect), started, exitstatus, plugins)


def _plugin_names(rec: dict) -> tuple[str, ...] | None:
    """The entry-point plugin names of a `plugins` record, or None where pytest cannot load a
    plugin by its entry-point name (`-p NAME`: pytest 4.4 on)."""
    version = tuple(int(p) if p.isdigit() else 0 for p in str(rec.get("pytest", "0")).split(".")[:2])
    names = rec.get("names")
    if version < (4, 4) or not isinstance(names, list):
        return None
    return tuple(str(n) for n in names)


def _status(rec: dict) -> str:
    outcome, when = rec.get("outcome"), rec.get("when")
    if outcome == "passed":
        return FAILED if rec.get("raised") else PASSED  # raised, but the report says passed: rewritten
    if outcome == "skipped":
        return XFAIL if rec.get("xfail") else SKIPPED
    return FAILED if when == "call" else ERROR


def _test_status(phases: dict[str, str]) -> str:
    if "call" in phases:
        status = phases["call"]
    elif phases.get("setup", PASSED) != PASSED:
        status = phases["setup"]
    else:
        status = MISSING  # set up but never called: killed or hung in between
    if phases.get("teardown", PASSED) in (FAILED, ERROR) and status != MISSING:
        status = ERROR
    return status


_STARTED: set[tuple] = set()  # (backend, task, command, recipe): the runner started there once


def _start_key(task: Task, backend: str) -> tuple:
    """What decides whether the runner starts on a task's clean base (so it is checked once)."""
    recipe = json.dumps(task.install, sort_keys=True, default=str)
    return backend, task.instance_id, task.base_commit, task.workdir, hash((task.test_command, recipe))


_PLUGINS: dict[tuple, tuple[str, ...] | None] = {}  # the entry-point plugins recorded on a clean base


def _plugins_key(sandbox: Sandbox, task: Task) -> tuple:
    """What decides a task environment's entry-point plugins: the sandbox kind, its image or venv,
    the task's base and command."""
    where = getattr(sandbox, "image", None) or getattr(sandbox, "ro_binds", None)
    recipe = json.dumps(task.install, sort_keys=True, default=str)
    return (
        type(sandbox).__name__,
        str(where),
        task.instance_id,
        task.base_commit,
        task.workdir,
        hash((task.test_command, recipe)),
    )


def _help(sandbox: Sandbox, private: str, command: str, env: dict) -> tuple[ExecResult, Report]:
    """`command --help` on the clean base (it loads every plugin, writing no bytecode) and the
    grader plugin's report of it."""
    run = sandbox.exec(
        "PYTHONDONTWRITEBYTECODE=1 " + _env_prefix(env, private) + command + " --help", timeout=300
    )
    report = f"{private}/report.jsonl"  # read twice: one slow read under load is not a broken runner
    found = parse_report(_read(sandbox, report))
    found = found if found.started else parse_report(_read(sandbox, report))
    sandbox.exec(f"rm -f {report}", timeout=30)
    return run, found


def _preflight(sandbox: Sandbox, task: Task, private: str, check: bool) -> GradeResult | None:
    """Write the grader's files; with `check`, on the clean base, before the patch: the runner
    starts, loads the grader's plugin and takes the config's options (`--help` loads every plugin,
    writing no bytecode), else the test command cannot start (an infrastructure failure)."""
    files = {
        "pytest.ini": "[pytest]\n",
        "jaxswe_grader.py": _PLUGIN_SOURCE.read_text(),
        "jaxswe_pytest.py": _LAUNCHER,
    }
    written = sandbox.exec(
        f"mkdir -p {private} && "
        + " && ".join(f"printf %s {shlex.quote(t)} > {private}/{n}" for n, t in files.items()),
        timeout=30,
    )  # one call for the grader's three files
    if written.exit_code != 0:
        raise SandboxError(f"cannot write the grader's files: {written.output.strip()[-300:]}")
    config = _config_file(sandbox)
    command, env = build_test_command(task, private, config)
    key = _plugins_key(sandbox, task)
    if not env or (not check and key in _PLUGINS):
        return None
    run, found = _help(sandbox, private, command, env)
    if found.started and run.exit_code == 0:
        plugins = found.plugins
        if plugins:  # loaded by name before the task's path is on sys.path: the runner starts so too?
            named, named_env = build_test_command(task, private, config, plugins=plugins)
            again, by_name = _help(sandbox, private, named, named_env)
            if not (by_name.started and again.exit_code == 0):
                plugins = None  # one is found only through the task's path: autoload, as the environment says
        _PLUGINS[key] = plugins
        return None
    tail = run.output.strip().splitlines()[-1:] or [""]
    return GradeResult(False, {}, run.output, f"{_NOT_STARTED}: exit {run.exit_code}: {tail[0][-300:]}",
                       error=True)  # fmt: skip


def _plant_canaries(sandbox: Sandbox, task: Task) -> tuple[list[Canary], tuple[str, ...]]:
    """Canaries in every graded test file (see envs.grading.canaries); (canaries, notes on what has none).
    A pytest command run through the grader's plugin gets them always (the grader's `--maxfail=0`
    overrides the command's `-x`), and so does a command whose log parser's runner canaries exist
    for (envs.grading.canaries.STYLES), unless it stops at the first failure (`-x`: it would stop at the
    must-fail canary) or names single tests."""
    graded = [*task.fail_to_pass, *task.pass_to_pass]
    style = "pytest" if _via_plugin(task.test_command) else STYLES.get(task.log_parser)
    if style is None:
        return [], (f"no canaries: log parser {task.log_parser!r} is not one canaries exist for",)
    if not _via_plugin(task.test_command) and re.search(
        r"(?:^|\s)(?:-x|--exitfirst|--maxfail(?:=\S+)?)(?:\s|$)", task.test_command
    ):
        return [], ("no canaries: the test command stops at the first failure",)
    if style == "pytest":
        files: dict[str, list[str]] = {}
        for t in graded:
            if (file := t.split("::")[0]).endswith(".py"):
                files.setdefault(file, []).append(t)
        name_of = {t: t.split("::")[-1].split("[")[0] for t in graded}
    else:  # tests named by function (and class): the test files test_patch touches that define them
        name_of = {t: t.split(" ", 1)[0] for t in graded}
        if any(re.search(rf"\b{re.escape(n)}\b", task.test_command) for n in name_of.values()):
            return [], ("no canaries: the test command names single tests",)
        files = {f: list(graded) for f in patch_files(task.test_patch) if f.endswith(".py")}
    rng = random.Random(secrets.randbits(64))
    canaries: list[Canary] = []
    notes = []
    for file, ids in files.items():
        try:
            source = sandbox.read_file(file)
        except SandboxError:
            notes.append(f"no canaries in {file}: cannot read it")
            continue
        defined = set(re.findall(r"def\s+(\w+)", source))
        peers = tuple(t for t in ids if name_of[t] in defined) if style != "pytest" else tuple(ids)
        if not peers:
            continue
        classes = [parts[1] for t in peers if len(parts := t.split("::")) == 3] if style == "pytest" else []
        text, planted = plant(source, file, rng, [name_of[t] for t in peers], style, classes)
        if not planted:
            notes.append(f"no canaries in {file}: no class holds its graded tests")
            continue
        sandbox.write_file(file, text)
        canaries += [replace(c, peers=peers) for c in planted]
    return canaries, tuple(notes)


def _forged(canaries: list[Canary], tests: dict[str, str], broken_files: set[str], finished: bool) -> str:
    """Why the canaries show a forged result ('' when they came back as expected). A missing canary
    is a forgery when the run finished and its file's graded tests were reported (its record was
    dropped); a skipped one is not where its file's graded tests were all skipped too."""
    for canary in canaries:
        if canary.file in broken_files:
            continue
        status = canary.status(tests)
        ran = [s for t in canary.peers if (s := status_of(t, tests)) != MISSING]
        skipped = bool(ran) and all(s == SKIPPED for s in ran)
        if wrong(canary, status, file_skipped=skipped) or (status == MISSING and finished and ran):
            expected = "pass" if canary.must_pass else "fail"
            return f"{FORGED}: canary {canary.test_id} must {expected} but came back {status}"
    return ""


def grade_in(
    sandbox: Sandbox, task: Task, patch: str, *, test_timeout: float = DEFAULT_TEST_TIMEOUT_S,
    case_timeout: float = DEFAULT_CASE_TIMEOUT_S, preflight: bool = True,
) -> GradeResult:  # fmt: skip
    """Grade `patch` (a diff against the sandbox's start state) in `sandbox`, which must be fresh at
    the task's clean state; protected paths go back to that state, a task image's own edits kept.
    `preflight`: check first that the runner starts on the clean base."""
    dropped: list[str] = []
    flags: tuple[str, ...] = ()
    private = f"/tmp/jaxswe-grader-{uuid.uuid4().hex}"
    start = _start_tree(sandbox)
    plugin = _via_plugin(task.test_command)
    if plugin and (failed := _preflight(sandbox, task, private, preflight)) is not None:
        return failed
    if patch.strip():
        try:
            check_git_sections(patch)
        except PatchError as err:
            return GradeResult(False, {}, patch[-2000:], f"patch does not apply: {err}")
        ok, out = _apply_patch(sandbox, patch)
        if not ok:
            return GradeResult(False, {}, out, f"patch does not apply: {out.strip()[-300:]}")
        test_files = _files_of(task.test_patch)
        changes = _changed_paths(sandbox, start)
        roots, runner_project = _layout(sandbox)
        gold_files = _files_of(task.patch) - test_files
        dropped = _protected_changes(sandbox, changes, test_files, roots, start, gold_files)
        _reset(sandbox, dropped, start)
        kept = sandbox.exec(f"{_GIT} diff --cached --no-color --no-ext-diff --no-textconv --text {start}",
                            timeout=120)  # fmt: skip
        flags = tamper_reasons(kept.output, runner_exempt=runner_project)
    ok, clean, out = _apply_test_patch(sandbox, task.test_patch, start)
    if not ok:
        why = (
            "test_patch does not apply to the clean base"
            if not clean
            else "the patch makes test_patch fail to apply"
        )
        return GradeResult(False, {}, out, why, dropped_paths=tuple(dropped), error=not clean)
    canaries, notes = _plant_canaries(sandbox, task)
    ids = tuple(c.test_id for c in canaries)
    plugins = _PLUGINS.get(_plugins_key(sandbox, task))
    command, env = build_test_command(task, private, _config_file(sandbox), ids, plugins)
    if env:
        env["JAXSWE_GRADER_TEST_TIMEOUT"] = str(case_timeout)
        run = sandbox.exec(_env_prefix(env, private) + command, timeout=test_timeout)
        try:
            report = parse_report(sandbox.read_file(f"{private}/report.jsonl", max_bytes=REPORT_LIMIT))
        except SandboxError:
            report = Report({}, {}, frozenset(), False, None)
        tests, messages, broken = report.tests, report.messages, set(report.collect_errors)
        seen = tests
        disagree = None
        if not report.started:  # it started on the clean base (preflight): the patch stopped it
            disagree = "the test run never reached the grader's plugin"
        elif report.exitstatus is None:
            disagree = "the test run did not finish (no session end in the grader's report)"
        elif report.exitstatus != run.exit_code:
            disagree = (
                f"the test command exited {run.exit_code} but its session ended with {report.exitstatus}"
            )
        finished = report.exitstatus is not None and not run.timed_out  # a session end: canaries reported
        if not tests and run.exit_code in (2, 3, 4):  # stopped before collecting (conftest, config)
            broken.add("")
            messages[""] = run.output[-1000:]
    else:
        run = sandbox.exec(command, timeout=test_timeout)
        tests, messages = PARSERS[task.log_parser](run.output)
        # sympy's runner ends a file's last test line with the file's [OK]/[FAIL], unread by its parser
        seen = PARSERS[task.log_parser](_FILE_STATUS_RE.sub("", run.output))[0]
        if not tests and run.exit_code in (126, 127):  # the shell could not find or run the command
            return GradeResult(False, {}, run.output, f"{_NOT_STARTED}: exit {run.exit_code}",
                               dropped_paths=tuple(dropped), error=True)  # fmt: skip
        disagree = None
        broken = {t for t, s in tests.items() if s == ERROR and "::" not in t}
        finished = bool(tests) and not run.timed_out
    graded = (*task.fail_to_pass, *task.pass_to_pass)
    files = {f for t in graded if (f := t.split("::")[0]).endswith(".py")}
    uncollected = sorted(
        f for f in files if any(b in ("", ".") or f == b or f.startswith(b + "/") for b in broken)
    )  # a file reported broken fails all its graded tests, whatever else is reported for them
    shielded = [t for t in graded if t.split("::")[0] in uncollected and tests.get(t) in PASSING]
    tests = {**tests, **{t: ERROR for t in graded if t.split("::")[0] in uncollected}}
    result = _verdict(
        task, tests, messages, run.output, run.exit_code, run.timed_out, tuple(dropped), disagree,
        {c.test_id for c in canaries}, seen,
    )  # fmt: skip
    forged = _forged(canaries, seen, broken, finished)
    if env and run.exit_code == 0 and any(s in (FAILED, ERROR) for s in tests.values()):
        forged = f"{FORGED}: the test command exited 0 although its report holds failed tests"
    if shielded:  # a file that did not collect cannot have run a test
        forged = f"{FORGED}: {shielded[0]} passed in a file reported as not collected"
    return GradeResult(
        result.resolved and not forged, result.tests, result.log, forged or result.reason, result.messages,
        result.dropped_paths, tamper=(FORGED,) if forged else (), canaries=len(canaries), notes=notes,
        uncollected=tuple(uncollected), flags=flags,
    )  # fmt: skip


def _verdict(
    task: Task, tests: dict[str, str], messages: dict[str, str], log: str, exit_code: int, timed_out: bool,
    dropped: tuple[str, ...], disagree: str | None, canary_ids: set[str], seen: dict[str, str],
) -> GradeResult:  # fmt: skip
    """`tests`: the statuses the task's parser reads; `seen`: every status the grader can read
    (sympy's: also each file's last test, so a failing canary there explains a nonzero exit)."""
    graded = [*task.fail_to_pass, *task.pass_to_pass]  # the task's harness's rules: envs.tasks.parsers
    statuses = {**tests, **{t: status_of(t, tests, task.rules) for t in graded if t not in tests}}
    failing = graded_failures(task.fail_to_pass, task.pass_to_pass, tests, task.reference_statuses,
                              task.rules, ignored=canary_ids)  # fmt: skip
    if (
        not task.reference_statuses
    ):  # no gold run says a skip or an xfail is right: package code can cause either
        failing += [
            (t, s) for t in task.fail_to_pass if (s := status_of(t, tests, task.rules)) in (XFAIL, SKIPPED)
        ]
    if failing:
        first, status = failing[0]
        reason = f"{len(failing)} of {len(graded)} graded tests not passing, e.g. {first} {status}"
    elif timed_out:
        reason = "the test command timed out"
    elif disagree:
        reason = disagree
    elif exit_code != 0 and all(s in PASSING for s in seen.values()):
        reason = f"the test command exited {exit_code} although every reported test passed"
    else:
        reason = ""
    return GradeResult(not reason, statuses, log, reason or "resolved", messages, dropped)


_GOLD_UNCOLLECTED: dict[tuple, tuple[str, ...]] = {}  # (task, backend) -> the files gold cannot collect


def grade(task: Task, patch: str, backend: str = "local", *, test_timeout: float = DEFAULT_TEST_TIMEOUT_S,
          case_timeout: float = DEFAULT_CASE_TIMEOUT_S, twins: bool = True,
          **limits: Any) -> GradeResult:  # fmt: skip
    """Grade `patch` for `task` in a fresh sandbox of `backend` (see the module docstring). A
    sandbox that fails (cannot start, dies) is an infrastructure failure (`error`), not an exception.
    Graded test files that do not collect are the patch's failure unless they do not collect with the
    gold patch either (the task environment is broken: `error`; gold's outcome is cached per process).
    A grade that would pay is confirmed by the twin run (`twins`; envs.tasks.twins): the same patch in a
    fresh sandbox with the task's perturbed twins in place of its FAIL_TO_PASS tests, which must fail.
    A task without twins or reference statuses (a record published as is) gets both first, once per
    task (`with_checks`)."""
    timeouts = {"test_timeout": test_timeout, "case_timeout": case_timeout}
    if twins and (not fit(task) or not task.reference_statuses):  # a record published as is, or edited
        task = with_checks(task, backend, **timeouts, **limits)
    key = _start_key(task, backend)
    check = key not in _STARTED  # decided once, so the twin run starts exactly as the first run did

    def run(p: str, t: Task = task) -> GradeResult:
        try:
            with open_sandbox(t, backend, **dict(limits)) as sandbox:
                graded = grade_in(sandbox, t, p, test_timeout=test_timeout, case_timeout=case_timeout,
                                  preflight=check)  # fmt: skip
            return replace(graded, notes=(*graded.notes, *packaging_note(t, p)))
        except (SandboxError, EngineError) as err:  # EngineError: a Docker engine of the pool died
            return GradeResult(False, {}, "", f"sandbox failure: {err}", error=True)

    result = run(patch)
    if not (result.error and result.reason.startswith(_NOT_STARTED)):
        _STARTED.add(key)
    if result.uncollected and not result.error:
        result = _uncollected(task, patch, backend, result, run)
    if not result.resolved or not twins:
        return result
    made = task.twins
    if not made:
        return replace(result, notes=(*result.notes, NO_TWIN))
    twin = run(patch, replace(task, test_patch=twin_patch(task.test_patch, made), twins=()))
    if twin.error:
        return replace(result, resolved=False, error=True, reason=f"the twin run failed: {twin.reason}")
    passed = [
        t for tw in made for t in tw.tests if status_of(t, twin.tests, task.rules) not in (FAILED, ERROR)
    ]
    if passed or twin.tamper:  # a real fix fails each twin; passed, skipped or dropped: forged
        why = (f"{FORGED}: the twin of {passed[0]} (its expected behaviour changed) did not fail"
               if passed else f"{FORGED} in the twin run: {twin.reason}")  # fmt: skip
        return replace(result, resolved=False, reason=why, tamper=(FORGED,), log=result.log + twin.log)
    perturbed = sum(len(tw.tests) for tw in made)
    note = f"twin run: {perturbed} perturbed FAIL_TO_PASS tests failed, as a real fix's do"
    return replace(result, notes=(*result.notes, note))


def _uncollected(task: Task, patch: str, backend: str, result: GradeResult, run: Any) -> GradeResult:
    """`result` as an infrastructure failure where gold cannot collect the same graded files."""
    key = (
        task.instance_id,
        task.base_commit,
        hash((task.patch, task.test_patch, task.test_command)),
        backend,
    )
    if patch == task.patch:
        _GOLD_UNCOLLECTED[key] = result.uncollected
    elif key not in _GOLD_UNCOLLECTED:
        gold = run(task.patch)
        _GOLD_UNCOLLECTED[key] = () if gold.error else gold.uncollected
    broken = [f for f in result.uncollected if f in _GOLD_UNCOLLECTED[key]]
    if not broken:
        return result
    message = next((m for k, m in result.messages.items() if broken[0].startswith(k)), "")
    lines = (
        [ln.strip() for ln in message.splitlines() if "Error" in ln] or message.strip().splitlines() or [""]
    )
    why = f"the task environment cannot collect {broken[0]}, even with the gold patch: {lines[-1][-300:]}"
    return replace(result, resolved=False, error=True, reason=why)


_CHECKED: dict[str, Any] = {}  # what checked_twins and gold_statuses found, per task, this process
_CHECK_CODE = hashlib.sha256(  # the code that makes and checks them: a change invalidates the cache
    (Path(twins.__file__).read_text() + Path(__file__).read_text()).encode()
).hexdigest()


def _cached(kind: str, task: Task, backend: str, compute: Any) -> Any:
    """`compute()` (JSON; None: a failure, not cached) once per task and backend, in this process and
    in `$JAXSWE_CACHE_DIR/<kind>`."""
    key = [kind, task.instance_id, task.base_commit, task.patch, task.test_patch, task.test_command,
           task.fail_to_pass, task.pass_to_pass, backend, _CHECK_CODE]  # fmt: skip
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]
    cache = cache_dir() / kind / f"{digest}.json"
    if digest not in _CHECKED and cache.is_file():
        _CHECKED[digest] = json.loads(cache.read_text())
    if digest not in _CHECKED:
        value = compute()
        if value is None:
            return None
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(value))
        tmp.replace(cache)
        _CHECKED[digest] = value
    return _CHECKED[digest]


def with_checks(task: Task, backend: str = "local", **kwargs: Any) -> Task:
    """`task` with what a paying grade relies on and a record published without validation lacks:
    its gold run's statuses as reference statuses, and its checked twins (each found once per task;
    made anew where the record's own no longer fit its tests)."""
    twins = task.twins if fit(task) else checked_twins(task, backend, **kwargs)
    reference = task.reference_statuses or gold_statuses(task, backend, **kwargs)
    return replace(task, reference_statuses=reference, twins=twins)


def gold_statuses(task: Task, backend: str = "local", **kwargs: Any) -> dict[str, str]:
    """Each graded test's status under the gold patch where gold resolves ({} where it does not, or
    the environment failed), cached (see `_cached`)."""

    def run() -> dict[str, str] | None:
        gold = grade(task, task.patch, backend, twins=False, **kwargs)
        if gold.error:
            return None
        graded = [*task.fail_to_pass, *task.pass_to_pass]
        return {t: status_of(t, gold.tests, task.rules) for t in graded} if gold.resolved else {}

    return _cached("references", task, backend, run) or {}


def checked_twins(
    task: Task, backend: str = "local", *, rounds: int = 3, test_timeout: float = DEFAULT_TEST_TIMEOUT_S,
    case_timeout: float = DEFAULT_CASE_TIMEOUT_S, **limits: Any,
) -> tuple[Twin, ...]:  # fmt: skip
    """The task's perturbed twins (envs.tasks.twins) that the gold patch fails at the perturbed check and
    the unpatched base fails as well, one per FAIL_TO_PASS test function where one exists (up to
    `rounds` candidates each), cached (see `_cached`)."""
    timeouts = {"test_timeout": test_timeout, "case_timeout": case_timeout}

    def run() -> list[dict] | None:
        try:
            with open_sandbox(task, backend, **dict(limits)) as sandbox:
                applied, _, log = _apply_test_patch(sandbox, task.test_patch, _start_tree(sandbox))
                sources = {f: _read(sandbox, f) for f in added_lines(task.test_patch)} if applied else {}
        except (SandboxError, EngineError):
            return None
        kept: list[Twin] = []
        pending = set(task.fail_to_pass)
        for skip in range(rounds):
            trial = tuple(t for t in make_twins(task, sources, skip=skip) if set(t.tests) <= pending)
            if not trial:
                break
            twinned = replace(task, test_patch=twin_patch(task.test_patch, trial), twins=())
            gold = grade(twinned, task.patch, backend, twins=False, **timeouts, **limits)
            base = grade(twinned, "", backend, twins=False, **timeouts, **limits)
            if gold.error or base.error:
                return None  # the environment failed, not the twins
            for twin in trial:
                if all(_fails_at(twin, t, gold, task.rules) for t in twin.tests) and not any(
                    status_of(t, base.tests, task.rules) in PASSING for t in twin.tests
                ):
                    kept.append(twin)
                    pending -= set(twin.tests)
        return [t.to_json() for t in kept]

    found = _cached("twins", task, backend, run)
    return () if found is None else tuple(Twin.from_json(t) for t in found)


def _fails_at(twin: Twin, test: str, result: GradeResult, rules: str) -> bool:
    """Whether `test` failed at the twin's perturbed check in `result`: an AssertionError raised in
    the test file (the original passes under the same patch, and the two differ only at that check),
    or for an exception twin the original exception escaping; a runner without messages
    (log-parsed) must report a failure (an error: the escaping exception of an exception twin)."""
    status = status_of(test, result.tests, rules)
    message = result.messages.get(test)
    if message is None:  # unittest-style runners report an escaping exception as an error
        return status == FAILED or (status == ERROR and twin.kind == "exception")
    if status != FAILED:
        return False
    last = (message.strip().splitlines() or [""])[-1].rstrip()
    if twin.kind == "exception":  # the original exception, or a builtin subclass of it, escaped
        raised = re.search(r"(\w+)$", last)
        expected, got = (
            getattr(builtins, twin.old, None),
            getattr(builtins, raised.group(1) if raised else "", None),
        )
        subclass = isinstance(expected, type) and isinstance(got, type) and issubclass(got, expected)
        return raised is not None and (raised.group(1) == twin.old or subclass)
    return bool(re.fullmatch(rf"{re.escape(twin.file)}:\d+: AssertionError", last))
