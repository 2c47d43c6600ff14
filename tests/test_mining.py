"""`jaxswe tasks mine` on a bounded range of toolz's real history (the full runs: docs/tasks.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envs.grading import grade
from envs.mining import (
    STAGES,
    Outcome,
    _stable,
    environment_commit,
    mine,
    pull_request_text,
    split_commit,
    stage_counts,
    statement_problem,
)
from envs.tasks import load_tasks
from envs.validate import validate_task

BUNDLE = (
    Path(__file__).resolve().parents[2] / "shared" / "repos" / "toolz.bundle"
)  # ../shared beside the checkout
FIX = "5a7e078"  # partition_all raises on a lying __len__ (toolz#603)


@pytest.fixture(scope="module")
def toolz(tmp_path_factory):
    if not BUNDLE.is_file():
        pytest.skip("shared repositories missing")
    repo = tmp_path_factory.mktemp("mine") / "toolz"
    subprocess.run(["git", "clone", "-q", str(BUNDLE), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", FIX], check=True)
    return repo


def test_mine_bounded_range_resumes_and_validates(toolz, tmp_path):
    out = tmp_path / "tasks.jsonl"
    seen: list[Outcome] = []
    # the newest 4 commits up to the fix: three change no source+tests, the fix is a valid task
    counts = mine(toolz, out, name="pytoolz/toolz", install={"test_cmd": "pytest -rA"}, runs=1, limit=4,
                  workers=2, on_outcome=seen.append)  # fmt: skip
    assert len(seen) == 4 and counts["commits"] == 4 and counts["valid"] == 1, [o.to_json() for o in seen]
    assert list(counts) == list(STAGES)
    (task,) = load_tasks(out)
    assert task.fail_to_pass == ("toolz/tests/test_itertoolz.py::test_partition_all",)
    assert "toolz/tests/test_itertoolz.py::test_remove" in task.pass_to_pass
    assert task.patch.count("diff --git") == 1 and "toolz/tests/" in task.test_patch
    assert task.source_dir == str(toolz.resolve())
    # resumable: a rerun redoes nothing and writes the same tasks
    again: list[Outcome] = []
    assert mine(toolz, out, name="pytoolz/toolz", install={"test_cmd": "pytest -rA"}, runs=1, limit=4,
                on_outcome=again.append) == counts  # fmt: skip
    assert again == [] and load_tasks(out) == [task]
    # the record validates as written (what `jaxswe tasks validate` runs)
    check = validate_task(task, runs=1)
    assert check.ok and not check.empty_resolved, check.reason


def test_split_and_stage_counts(toolz):
    parent, patch, test_patch = split_commit(toolz, FIX)
    assert "toolz/itertoolz.py" in patch and "toolz/tests" not in patch and "toolz/tests/" in test_patch
    outcomes = [Outcome("a", "commits"), Outcome("b", "size"), Outcome("c", "valid")]
    assert stage_counts(outcomes, 3) == {
        "commits": 3, "src+tests": 2, "size": 2, "bug fix, no leak": 1, "tests ran": 1, "fail-to-pass": 1,
        "no new API": 1, "valid": 1,
    }  # fmt: skip
    runs = [({"t1": "PASSED", "t2": "FAILED"}, {}), ({"t1": "PASSED", "t2": "PASSED"}, {})]
    assert _stable(runs) == {"t1": "PASSED"}  # t2 is flaky


def test_statements_that_are_no_bug_report_or_give_the_fix_away():
    def nothing_known(names):
        return set()

    fix = "+++ b/pkg/core.py\n+def parse_strict(text):\n+    return text.strip() or None\n"
    assert statement_problem("Add a --verbose option", fix, nothing_known).startswith(
        "the commit message does not"
    )
    assert statement_problem("Fix crash on empty input", fix, nothing_known) == ""
    assert "parse_strict" in statement_problem("Fix crash: call parse_strict()", fix, nothing_known)
    assert statement_problem("Fix crash: call parse_strict()", fix, lambda names: names) == ""  # it existed
    assert "return text.strip()" in statement_problem("Fix: return text.strip() or None", fix, nothing_known)
    # past its issue references, a summary led by a feature or chore verb that names no bug is no bug fix
    # (cachetools' "Fix #N: ..." messages, docs/tasks.md's spot check)
    features = [
        "Fix #131: Add cache_info() function to @cached decorator",
        "Fix #256: Deprecate MRUCache class",
        "Fix #357: Convert @cachedmethod decorators to descriptors",
        "Update docs (fixes #12)",
    ]
    for message in features:
        assert "feature or chore" in statement_problem(message, fix, nothing_known), message
    for message in (
        "Fix #200: Handle __missing__ not storing cache items",
        "Add a guard against the crash (#7)",
    ):
        assert statement_problem(message, fix, nothing_known) == "", message
    # the bug-fix test reads the commit message; the leak test reads the statement the agent is shown
    pr_text = "Make strict parsing work: call parse_strict()"
    assert "parse_strict" in statement_problem(pr_text, fix, nothing_known, message="Fix crash (#9)")


def test_statement_from_the_pull_request_and_environment_from_the_tasks_own_commit(toolz):
    """The statement is the merged pull request's text where a GitHub merge names one; the environment
    is installed at the newest packaging change at or before the task's base, not the tip."""
    git = lambda *a: subprocess.run(["git", "-C", str(toolz), *a], capture_output=True, text=True).stdout  # noqa: E731
    via_pr = git("rev-parse", "d70d110").strip()  # one commit of toolz PR #574, merged by 4057679
    assert pull_request_text(toolz, via_pr) == (
        "Minimal maintenance to support Python 3.12 (and drop 3.5 and 3.6)\n\n(pull request #574)"
    )
    assert pull_request_text(toolz, git("rev-parse", FIX).strip()) is None  # squash-merged: the message
    env = environment_commit(toolz, f"{FIX}^")
    assert git("log", "-1", "--format=%s", env).startswith("Modernize to use pyproject.toml")
    assert (
        git("merge-base", env, f"{FIX}^").strip() == env != git("rev-parse", f"{FIX}^").strip()
    )  # an ancestor


def test_mine_cli_bad_repo_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "jaxswe", "tasks", "mine", str(tmp_path / "nope")],
        capture_output=True, text=True, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_mine_src_layout_range(tmp_path):
    """cachetools is a src layout with no pytest `pythonpath` setting: its tests import the package only
    through the task environment's import root, which grading keeps (it once replaced PYTHONPATH, and
    mining this repository found no task). The newest 2 commits up to cachetools 18e5930 (Fix #218)."""
    bundle = BUNDLE.with_name("cachetools.bundle")
    if not bundle.is_file():
        pytest.skip("shared repositories missing")
    repo = tmp_path / "cachetools"
    subprocess.run(["git", "clone", "-q", str(bundle), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "18e5930"], check=True)
    out = tmp_path / "tasks.jsonl"
    install = {"install": "pip install -e .", "test_cmd": "pytest -rA"}
    counts = mine(repo, out, name="tkem/cachetools", install=install, runs=1, limit=2, workers=1)
    assert counts["commits"] == 2 and counts["valid"] == 1, counts
    (task,) = load_tasks(out)
    assert (repo / "src" / "cachetools").is_dir() and "src/cachetools/" in task.patch
    assert task.fail_to_pass and set(task.reference_statuses) == {*task.fail_to_pass, *task.pass_to_pass}
    # a forged result on the mined task: every test body replaced from package code, caught by a canary
    init = "src/cachetools/__init__.py"
    base = subprocess.run(["git", "-C", str(repo), "show", f"{task.base_commit}:{init}"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    forged = _diff(init, base, base + "\nimport pytest as _p\n\n_p.Function.runtest = lambda self: None\n")
    result = grade(task, forged)
    assert not result.resolved and result.tamper == ("forged result",), result.reason


def _diff(path: str, old: str, new: str) -> str:
    """A one-hunk git diff of `path` from `old` to `new` (whole-file replacement)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,{len(a)} +1,{len(b)} @@\n"
            + "".join("-" + ln for ln in a) + "".join("+" + ln for ln in b))  # fmt: skip
