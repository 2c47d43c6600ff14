"""Test ids and statuses agree with the official `swebench` parsers on real test logs.

The corpus: the real suites of the shared repositories (cachetools, toolz, boltons) run with
`pytest -rA` and a junit-xml report, at the bundle's tip and at a real bug's parent commit with
the fix's tests (real failures). cachetools' tests inherit methods from mixins in tests/__init__.py,
boltons has parametrized ids with spaces (published truncated at the first space).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import REPOS

from envs.tasks import official
from envs.tasks.parsers import (
    ERROR,
    FAILED,
    MISSING,
    PASSED,
    SKIPPED,
    XFAIL,
    graded_failures,
    parse_django,
    parse_junit_xml,
    parse_pytest,
    parser_name_for_repo,
    resolve,
    status_of,
)

if not REPOS.is_dir():
    REPOS = Path("/work/shared/repos")
needs_swebench = pytest.mark.skipif(not official.available(), reason="the swebench extra is not installed")
needs_repos = pytest.mark.skipif(not REPOS.is_dir(), reason="shared repositories missing")

# (repo, commit to test, commit whose test files are checked out on top or None)
CORPUS = [
    ("cachetools", "HEAD", None),
    ("toolz", "HEAD", None),
    ("boltons", "HEAD", None),
    ("toolz", "5a7e078^", "5a7e078"),  # partition_all with a lying __len__: real failures
    ("cachetools", "86352aed^", "86352aed"),  # mined tasks' parents with their fixes' tests
    ("boltons", "289edfc^", "289edfc"),
]


def _run_suite(tmp: Path, name: str, commit: str, tests_from: str | None) -> tuple[str, str, list[str]]:
    repo = tmp / f"{name}-{commit}"
    if not repo.exists():
        subprocess.run(["git", "clone", "-q", str(REPOS / f"{name}.bundle"), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-f", commit], check=True)
    if tests_from:
        changed = subprocess.run(
            ["git", "-C", str(repo), "diff", "--name-only", commit, tests_from, "--", "*tests*"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", tests_from, "--", *changed], check=True)
    report = tmp / f"{name}-{commit}.xml"
    env = {**os.environ, "PYTHONPATH": f"{repo / 'src'}:{repo}", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
         f"--junitxml={report}"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    files = subprocess.run(["git", "-C", str(repo), "ls-files", "*.py"], capture_output=True, text=True)
    return done.stdout + done.stderr, report.read_text(), files.stdout.split()


@pytest.mark.slow
@needs_swebench
@needs_repos
def test_statuses_agree_with_official_parser_on_real_logs(tmp_path):
    official_pytest = official.parser(name="parse_log_pytest")
    seen_statuses, totals = Counter(), {"tests": 0, "truncated": 0}
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda case: _run_suite(tmp_path, *case), CORPUS))
    for (name, _, _), (log, xml, files) in zip(CORPUS, runs, strict=True):
        expected = {k: v for k, v in official_pytest(log).items() if not (k[:1] == "[" and k[1:-1].isdigit())}
        assert len(expected) > 100, (name, log[-2000:])
        # the text parser names every test exactly as the official one
        assert parse_pytest(log)[0] == expected, name
        # the junit report, named by the collecting file, gives every official id its status
        for with_files in (files, None):
            junit, _ = parse_junit_xml(xml, files=with_files)
            disagree = {k: (v, status_of(k, junit)) for k, v in expected.items() if status_of(k, junit) != v}
            assert not disagree, (name, list(disagree.items())[:5])
        totals["tests"] += len(expected)
        totals["truncated"] += sum(k.count("[") > k.count("]") for k in expected)
        seen_statuses.update(expected.values())
    assert seen_statuses[FAILED] >= 10 and seen_statuses[PASSED] > 1000, seen_statuses
    assert totals["truncated"] >= 3, totals


def test_truncated_ids_follow_swebench_5():
    tests = {
        "t.py::test_x[a b]": PASSED,
        "t.py::test_x[a c]": XFAIL,
        "t.py::test_y[p q]": PASSED,
        "t.py::test_y[p r]": FAILED,
        "t.py::test_z": SKIPPED,
    }
    assert resolve("t.py::test_x[a", tests) in ("t.py::test_x[a b]", "t.py::test_x[a c]")
    assert status_of("t.py::test_x[a", tests) in (PASSED, XFAIL)
    assert resolve("t.py::test_y[p", tests) is None  # the candidates disagree: ambiguous
    assert resolve("t.py::test_x", tests) is None  # balanced brackets: exact ids only
    assert status_of("t.py::test_q", tests) == MISSING
    # F2P must pass; P2P passes or is skipped; missing fails both
    assert graded_failures(["t.py::test_x[a"], ["t.py::test_z"], tests) == []
    assert graded_failures(["t.py::test_z"], [], tests) == [("t.py::test_z", SKIPPED)]
    assert graded_failures([], ["t.py::test_y[p", "t.py::test_q"], tests) == [
        ("t.py::test_y[p", MISSING),
        ("t.py::test_q", MISSING),
    ]


def test_inherited_method_named_by_collecting_file():
    xml = (
        '<testsuites><testsuite><testcase classname="tests.test_lru.LRUCacheTest" name="test_insert" '
        'file="tests/__init__.py" line="3"/><testcase classname="tests.test_lru" name="test_f" '
        'file="tests/test_lru.py"><skipped type="pytest.skip" message="x"/></testcase>'
        '<testcase classname="pkg.sub.test_m.TestA.TestB" name="test_n[a b]" file="pkg/base.py">'
        '<error message="boom"/></testcase></testsuite></testsuites>'
    )
    tests, messages = parse_junit_xml(xml)
    assert tests == {
        "tests/test_lru.py::LRUCacheTest::test_insert": PASSED,
        "tests/test_lru.py::test_f": SKIPPED,
        "pkg/sub/test_m.py::TestA::TestB::test_n[a b]": ERROR,
    }
    assert messages["pkg/sub/test_m.py::TestA::TestB::test_n[a b]"] == "boom"
    lower = xml.replace("LRUCacheTest", "lru_cases")
    assert (
        "tests/test_lru.py::lru_cases::test_insert" in parse_junit_xml(lower, files=["tests/test_lru.py"])[0]
    )


DJANGO_LOG = """\
Testing against Django installed in '/testbed/django'
test_a (app.tests.T) ... ok
test_b (app.tests.T) ... skipped 'no db'
test_c (app.tests.T) ... FAIL
test_d (app.tests.T) ... ERROR
test_e (app.tests.T)
A docstring names this test. ... ok
test_f (app.tests.T) ... System check identified no issues (0 silenced).
ok
======================================================================
FAIL: test_c (app.tests.T)
"""


@needs_swebench
def test_django_parser_matches_official():
    expected = official.parser(name="parse_log_django")(DJANGO_LOG)
    assert parse_django(DJANGO_LOG)[0] == expected
    assert expected["A docstring names this test."] == PASSED
    assert parser_name_for_repo("django/django") == "parse_log_django"
    assert parser_name_for_repo("sympy/sympy") == "parse_log_sympy"
    assert parser_name_for_repo("pallets/flask") == "parse_log_pytest"


@needs_swebench
def test_official_image_names():
    assert official.instance_image("django__django-11099") == "sweb.eval.x86_64.django__django-11099:latest"
    assert (
        official.instance_image("django__django-11099", namespace="swebench")
        == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )
