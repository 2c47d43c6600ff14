"""The built-in task suite (envs/tasks/builtin): every record is well formed and really graded.

For each task, repo/ is turned into a git checkout, test_patch is applied and the task's own
test command runs: FAIL_TO_PASS tests must fail and PASS_TO_PASS tests pass; after the gold
patch every listed test passes. Uses only git, pytest and the files themselves.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest
from helpers import ROOT

BUILTIN_DIR = ROOT / "envs" / "tasks" / "builtin"
TASK_DIRS = sorted(path for path in BUILTIN_DIR.iterdir() if path.is_dir())
TASK_IDS = [path.name for path in TASK_DIRS]
FIELDS = {
    "instance_id": str,
    "repo": str,
    "problem_statement": str,
    "patch": str,
    "test_patch": str,
    "FAIL_TO_PASS": list,
    "PASS_TO_PASS": list,
    "test_cmd": str,
    "version": str,
}
TEST_CMD = "python -m pytest -rA -p no:cacheprovider"
RESULT_LINE = re.compile(r"^(PASSED|FAILED|ERROR) (\S+)(?: - (.*))?$", re.MULTILINE)
# The paper drops tasks whose tests fail with these (broken environments, not real bugs).
NAME_ERROR = re.compile(r"\b(ImportError|ModuleNotFoundError|AttributeError)\b")
MAX_PATCH_LINES = 8  # changed lines of a gold patch: the CPU demo's tiny model must learn them
MAX_SOURCE_LINES = 60
Statuses = dict[str, tuple[str, str]]  # node id -> (PASSED/FAILED/ERROR, failure message)
Graded = tuple[Statuses, Statuses]  # with test_patch applied: before and after the gold patch


def load_task(task_dir: Path) -> dict:
    return json.loads((task_dir / "task.json").read_text())


def changed_files(diff: str) -> list[str]:
    return [line[len("+++ b/") :] for line in diff.splitlines() if line.startswith("+++ b/")]


def changed_lines(diff: str) -> list[str]:
    return [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++ ", "--- "))]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=60,
    )


def apply_diff(cwd: Path, diff: str) -> None:
    subprocess.run(["git", "apply", "-"], cwd=cwd, input=diff.encode(), check=True, timeout=60)


def run_task_tests(cwd: Path, test_cmd: str) -> Statuses:
    """Node id -> (PASSED/FAILED/ERROR, failure message), from the task's command's `-rA` summary."""
    argv = shlex.split(test_cmd)
    assert argv[0] == "python"
    # No third-party pytest plugins: the task repos use plain pytest, and autoloading the
    # plugins of this venv costs seconds per run.
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    return {node: (status, message) for status, node, message in RESULT_LINE.findall(proc.stdout)}


def grade_task(task_dir: Path) -> Graded:
    """Test statuses with test_patch applied: (before the gold patch, after it)."""
    task = load_task(task_dir)
    with tempfile.TemporaryDirectory() as tmp:
        checkout = Path(tmp) / "repo"
        shutil.copytree(task_dir / "repo", checkout)
        git(checkout, "init", "-q")
        git(checkout, "add", "-A")
        git(checkout, "commit", "-qm", "base")
        apply_diff(checkout, task["test_patch"])
        before = run_task_tests(checkout, task["test_cmd"])
        apply_diff(checkout, task["patch"])
        after = run_task_tests(checkout, task["test_cmd"])
    return before, after


def grade_or_error(task_dir: Path) -> Graded | Exception:
    try:
        return grade_task(task_dir)
    except Exception as error:  # reported by that task's own test, not by every task's
        return error


@cache
def graded_suite() -> dict[str, Graded | Exception]:
    """Every task graded once, two at a time (CI has two cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(TASK_IDS, pool.map(grade_or_error, TASK_DIRS), strict=True))


def test_suite_size_and_unique_ids():
    tasks = [load_task(task_dir) for task_dir in TASK_DIRS]
    ids = [task["instance_id"] for task in tasks]
    assert len(ids) >= 24
    assert len(set(ids)) == len(ids)
    assert ids == TASK_IDS  # a task lives in the directory named after its id


def test_at_least_three_multi_file_fixes():
    multi = [d.name for d in TASK_DIRS if len(changed_files(load_task(d)["patch"])) >= 2]
    assert len(multi) >= 3, multi


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=TASK_IDS)
def test_record_is_well_formed(task_dir: Path):
    task = load_task(task_dir)
    for field, kind in FIELDS.items():
        assert isinstance(task.get(field), kind), f"{task_dir.name}: field {field!r}"
    assert re.fullmatch(r"builtin__[a-z0-9]+-\d+", task["instance_id"])
    assert task["repo"] == "builtin/" + task["instance_id"].removeprefix("builtin__").rsplit("-", 1)[0]
    assert task["test_cmd"] == TEST_CMD
    assert task["version"] == "1.0"
    f2p, p2p = task["FAIL_TO_PASS"], task["PASS_TO_PASS"]
    assert f2p and p2p and not set(f2p) & set(p2p)
    for node in f2p + p2p:
        assert re.fullmatch(r"tests/test_\w+\.py::test_\w+", node), node


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=TASK_IDS)
def test_patches_touch_the_right_files(task_dir: Path):
    task = load_task(task_dir)
    fixed = changed_files(task["patch"])
    assert fixed and not any(path.startswith("tests/") for path in fixed)
    assert all((task_dir / "repo" / path).is_file() for path in fixed)
    test_files = changed_files(task["test_patch"])
    assert test_files and all(path.startswith("tests/test_") for path in test_files)
    assert len(changed_lines(task["patch"])) <= MAX_PATCH_LINES


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=TASK_IDS)
def test_repo_is_small_and_clean(task_dir: Path):
    files = [path for path in (task_dir / "repo").rglob("*") if path.is_file()]
    assert not [p for p in files if "__pycache__" in p.parts or p.suffix == ".pyc"]
    assert (task_dir / "repo" / "tests").is_dir()
    for path in files:
        if path.suffix == ".py" and "tests" not in path.relative_to(task_dir / "repo").parts:
            assert len(path.read_text().splitlines()) <= MAX_SOURCE_LINES, path


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=TASK_IDS)
def test_problem_statement_describes_without_the_fix(task_dir: Path):
    task = load_task(task_dir)
    words = len(task["problem_statement"].split())
    assert 40 <= words <= 160, words
    added = [line[1:].strip() for line in changed_lines(task["patch"]) if line.startswith("+")]
    for line in added:
        if len(line) > 12:
            assert line not in task["problem_statement"], f"the issue gives the fix away: {line!r}"


@pytest.mark.slow
@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=TASK_IDS)
def test_gold_patch_resolves_and_tests_fail_without_it(task_dir: Path):
    task = load_task(task_dir)
    graded = graded_suite()[task_dir.name]
    if isinstance(graded, Exception):
        raise graded
    before, after = graded
    listed = set(task["FAIL_TO_PASS"]) | set(task["PASS_TO_PASS"])
    assert set(after) == listed, "the test run and the task's test lists disagree"
    for node in task["FAIL_TO_PASS"]:
        status, message = before.get(node, ("MISSING", ""))
        assert status in ("FAILED", "ERROR"), f"{node} passes without the fix"
        assert not NAME_ERROR.search(message), f"{node} fails with a name error: {message}"
    for node in task["PASS_TO_PASS"]:
        assert before.get(node, ("MISSING",))[0] == "PASSED", f"{node} fails before the fix"
    assert all(status == "PASSED" for status, _ in after.values()), after
