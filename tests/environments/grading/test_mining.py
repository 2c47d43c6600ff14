"""`jaxswe tasks mine` on a bounded range of toolz's real history (the full runs: docs/tasks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPOS, ROOT, user_env
from test_grading_twins import SPARES_CANARIES_UNITTEST

from envs.grading.grader import grade
from envs.grading.mining import (
    STAGES,
    Outcome,
    _stable,
    drop_summary,
    environment_commit,
    mine,
    portable_record,
    pull_request_text,
    split_commit,
    stage_counts,
    statement_problem,
    strip_trailers,
)
from envs.grading.validate import validate_task
from envs.tasks.records import load_tasks
from envs.tasks.repos import task_source
from jaxswe.tokenizer import build_tokenizer

BUNDLE = REPOS / "toolz.bundle"
FIX = "5a7e078"  # partition_all raises on a lying __len__ (toolz#603)


@pytest.fixture(scope="module")
def toolz(tmp_path_factory):
    if not BUNDLE.is_file():
        pytest.skip("shared repositories missing")
    repo = tmp_path_factory.mktemp("mine") / "toolz"
    subprocess.run(["git", "clone", "-q", str(BUNDLE), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", FIX], check=True)
    return repo


@pytest.mark.slow
def test_mine_bounded_range_resumes_and_validates(toolz, tmp_path):
    """The newest 4 commits up to the fix: three are no task (two change no source+tests, one too
    much source), the fix is a valid task. A recipe whose test command needs a missing plugin
    (pytest-cov) keeps nothing, and the terminal says why; the fixed recipe into the same --out
    re-examines only the commit that depended on it."""
    out = tmp_path / "tasks.jsonl"
    cov = '{"test_cmd": "pytest -rA --cov"}'
    argv = [sys.executable, "-m", "jaxswe", "tasks", "mine", str(toolz), "--name", "pytoolz/toolz",
            "--runs", "1", "--limit", "4", "--out", str(out), "--install", cov]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stderr.splitlines()[-4:] == [
        f"jaxswe: 4 commits: 0 valid tasks -> {out}; 4 dropped, by cause:",
        "     2  does not change both .py tests and .py source",
        f"     1  gold patch too large (e.g. {_rev(toolz, 'a39cd67')[:10]}: "
        "gold patch changes 24 files (> 7))",
        f"     1  tests did not run (e.g. {_rev(toolz, FIX)[:10]}: the test run reported no tests: "
        "pytest: error: unrecognized arguments: --cov)",
    ], done.stderr
    seen: list[Outcome] = []
    counts = mine(toolz, out, name="pytoolz/toolz", install={"test_cmd": "pytest -rA"}, runs=1, limit=4,
                  workers=2, on_outcome=seen.append)  # fmt: skip
    assert [o.commit[:7] for o in seen] == [FIX] and counts["commits"] == 4 and counts["valid"] == 1, seen
    assert list(counts) == list(STAGES)
    (task,) = load_tasks(out)
    assert task.fail_to_pass == ("toolz/tests/test_itertoolz.py::test_partition_all",)
    assert "toolz/tests/test_itertoolz.py::test_remove" in task.pass_to_pass
    assert task.patch.count("diff --git") == 1 and "toolz/tests/" in task.test_patch
    # the record names its repository relative to the task file; loaded, it is the clone
    assert json.loads(out.read_text())["source_dir"] == os.path.relpath(toolz, tmp_path)
    assert task.source_dir == str(toolz.resolve())
    # resumable: a rerun redoes nothing and writes the same tasks
    again: list[Outcome] = []
    assert mine(toolz, out, name="pytoolz/toolz", install={"test_cmd": "pytest -rA"}, runs=1, limit=4,
                on_outcome=again.append) == counts  # fmt: skip
    assert again == [] and load_tasks(out) == [task]
    # the record validates as written (what `jaxswe tasks validate` runs), its twins included
    check = validate_task(task, runs=1)
    assert check.ok and not check.empty_resolved, check.reason
    assert task.twins and check.twins == task.twins and check.twin_coverage == 1.0, check


def _rev(repo: Path, rev: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", rev], capture_output=True, text=True
    ).stdout.strip()


def test_records_name_their_repository_portably(toolz, tmp_path, monkeypatch):
    """A clone at `$JAXSWE_REPOS_DIR/<owner>__<name>` is named by the record's repo alone; any other
    repository by a path relative to the task file (loaded in the main test above)."""
    record = {"instance_id": "toolz-1", "repo": "pytoolz/toolz", "base_commit": _rev(toolz, f"{FIX}^"),
              "patch": "", "test_patch": "", "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": [],
              "source_dir": str(toolz)}  # fmt: skip
    out = tmp_path / "tasks" / "mined.jsonl"
    repos = tmp_path / "repos"
    monkeypatch.setenv("JAXSWE_REPOS_DIR", str(repos))
    assert portable_record(record, toolz, out)["source_dir"] == os.path.relpath(toolz, out.parent)
    repos.mkdir()
    (repos / "pytoolz__toolz").symlink_to(toolz)
    written = portable_record(record, toolz, out)
    assert "source_dir" not in written
    out.parent.mkdir()
    out.write_text(json.dumps(written) + "\n")
    (task,) = load_tasks(out)
    assert task_source(task) == repos / "pytoolz__toolz"


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
        "Fix #357: Convert @cachedmethod decorators to descriptors",
        "Update docs (fixes #12)",
    ]
    for message in features:
        assert "feature or chore" in statement_problem(message, fix, nothing_known), message
    # conventional-commit features and deprecations, whatever bug words they hold (cachetools 2c0d9f6,
    # boltons 1b1d378, cachetools 1bfc3c7)
    features = [
        "feat: add cached_property with TTL support (closes #354)\n\n- Raises ValueError for ttl <= 0",
        "feat(strutils): add human_readable_list function to format lists of strings",
        "feat: deprecate the positional form, which raised TypeError",
        "Deprecate dummy_threading fallback import",
        "Fix #256: Deprecate MRUCache class",
        "Raise a DeprecationWarning on the old error path",
    ]
    for message in features:
        assert "feature or deprecation" in statement_problem(message, fix, nothing_known), message
    for message in (
        "Fix #200: Handle __missing__ not storing cache items",
        "Add a guard against the crash (#7)",
    ):
        assert statement_problem(message, fix, nothing_known) == "", message
    # the bug-fix test reads the commit message; the leak test reads the statement the agent is shown
    pr_text = "Make strict parsing work: call parse_strict()"
    assert "parse_strict" in statement_problem(pr_text, fix, nothing_known, message="Fix crash (#9)")


def test_statements_lose_their_trailers():
    """boltons ec1ff9f's and c2b04b4's messages (a squash merge's `---` rule), and a Gerrit-style block."""
    ec1ff9f = ("Fix issupserset typo in _ComplementSet comparisons (#438)\n\n_ComplementSet.__le__ called\n"
               "set.issupserset.\n\nCo-authored-by: u <u@users.noreply.github.com>")  # fmt: skip
    assert strip_trailers(ec1ff9f) == ec1ff9f.split("\n\nCo-authored-by")[0]
    c2b04b4 = ("fix: make copy_function work with keyword-only defaults (#336)\n\n* move kwdefaults test\n\n"
               "---------\n\nCo-authored-by: Mahmoud Hashemi <mahmoud@hatnote.com>")  # fmt: skip
    assert strip_trailers(c2b04b4) == c2b04b4.split("\n\n---")[0]
    gerrit = (
        "Fix x\n\nThe body.\nSigned-off-by: A <a@b>\n\nChange-Id: I12ab\nReviewed-on: https://r/1\nBug: 7"
    )
    assert strip_trailers(gerrit) == "Fix x\n\nThe body."
    assert strip_trailers("Fix: crash on empty input") == "Fix: crash on empty input"  # the summary stays


def test_drop_summary_is_one_line_per_cause():
    outcomes = [Outcome("a" * 40, "commits", "does not change both .py tests and .py source"),
                Outcome("b" * 40, "bug fix, no leak", "tests did not run: No module named 'hypothesis'"),
                Outcome("c" * 40, "bug fix, no leak", "tests did not run: No module named 'numpy'"),
                Outcome("d" * 40, "valid", "", {"instance_id": "x"})]  # fmt: skip
    assert drop_summary(outcomes) == [
        "     2  tests did not run (e.g. cccccccccc: No module named 'numpy')",
        "     1  does not change both .py tests and .py source",
    ]


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
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
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
    # one that spares the canaries (a module function runs the usual way): caught by the twins
    assert task.twins, "mining stores the twins validation checked"
    forged = _diff(init, base, base + SPARES_CANARIES_UNITTEST)  # its tests are unittest cases
    assert grade(task, forged, twins=False).resolved  # past the canaries
    # a forgery of unittest cases alone (module functions run honestly): the canaries planted as
    # methods of a class that holds graded tests take its path and catch it, even without the twins
    adapter_only = (
        "\nimport unittest as _u\n\n\ndef _run(self, result=None):\n    result.startTest(self)\n"
        "    result.addSuccess(self)\n    result.stopTest(self)\n\n\n_u.TestCase.run = _run\n"
    )
    result = grade(task, _diff(init, base, base + adapter_only), twins=False)
    assert not result.resolved and result.tamper == ("forged result",), result.reason
    result = grade(task, forged)
    assert not result.resolved and "twin of" in result.reason, result.reason
    _weak_tests_found_and_dropped_from_rl(out, tmp_path)


def _weak_tests_found_and_dropped_from_rl(mined: Path, tmp_path: Path) -> None:
    """The strength audit finds the mined cachetools task's weak tests (its fix made at 2 of its 4
    call sites passes them: docs/tasks.md), and `jaxswe rl` with rl.min_strength 0.9, from the CLI
    on that record beside a strong built-in task, samples the built-in alone and names the mined one
    dropped. One tiny iteration: the facts are the filter's."""
    measured = tmp_path / "measured.jsonl"
    jaxswe = [sys.executable, "-m", "jaxswe"]
    env = user_env()
    audit = subprocess.run([*jaxswe, "tasks", "filter", str(mined), "--min-strength", "0", "--budget", "3",
                            "--workers", "1", "--out", str(measured)], capture_output=True, text=True,
                           env=env, timeout=600)  # fmt: skip
    assert audit.returncode == 0, audit.stderr[-3000:]
    (weak,) = load_tasks(measured)
    assert weak.strength is not None and weak.strength < 0.9 and weak.survivors, weak.strength
    strong = next(t for t in load_tasks("builtin") if t.instance_id == "builtin__slugify-1")
    tasks = tmp_path / "rl_tasks.jsonl"
    tasks.write_text("".join(json.dumps(t.to_record()) + "\n" for t in (weak, strong)))
    build_tokenizer([strong.problem_statement, weak.problem_statement], 300, tmp_path / "tokenizer")
    sets = ("rl.min_strength=0.9", f"model.tokenizer={tmp_path}/tokenizer", "rl.iterations=1",
            "rl.problems_per_iteration=1", "rl.group_size=2", "rl.resample_to_fill=false",
            "agent.max_turns=2", "rl.turn_penalty_threshold=1", "rollout.max_new_tokens=8",
            "eval.after_stage=false", "eval.heldout=[]", "allow_untrained_stage=true")  # fmt: skip
    run = tmp_path / "run"
    argv = ["rl", "--config", "configs/demo-cpu.yaml", "--tasks", str(tasks), "--run-dir", str(run)]
    done = subprocess.run([*jaxswe, *argv, *(a for s in sets for a in ("--set", s))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "rl" / "summary.json").read_text())
    assert summary["task_strength"]["dropped"] == [weak.instance_id], summary
    assert summary["task_strength"]["kept"] == 1 and summary["task_strength"]["below_1"] == {}, summary
    episodes = (run / "rl" / "trajectories" / "iter_0001.jsonl").read_text().splitlines()
    assert [json.loads(e)["task_id"] for e in episodes] == [strong.instance_id] * 2


def _diff(path: str, old: str, new: str) -> str:
    """A one-hunk git diff of `path` from `old` to `new` (whole-file replacement)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,{len(a)} +1,{len(b)} @@\n"
            + "".join("-" + ln for ln in a) + "".join("+" + ln for ln in b))  # fmt: skip
