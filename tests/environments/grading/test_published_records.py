"""Real published SWE-bench records graded end to end as the official harness graded them.

pylint-dev__astroid-1268 (SWE-bench Lite dev) and sympy__sympy-13031 (SWE-bench Lite test), both
spec Python 3.9 with `python -m pip install -e .`, their repositories stored as the base commit's
tree only (tests/data/published/repos, a bundle of that one commit, fetched into a shallow
repository). astroid: gold resolves, empty fails exactly the FAIL_TO_PASS test, and the model patch
cut from the official evaluation log of deepseek-chat (tests/data/published/swe_bench_eval/
deepseek_lite_dev: the eval script prints `git diff <base>` with the patch applied) gets the official
report's verdict and every test's outcome. sympy: `jaxswe tasks validate` from the CLI, beside a
record whose repository is missing. bench/bench_published.py grades all the stored records.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
from helpers import DATA

from envs.errors import SandboxError
from envs.grading.grader import grade
from envs.provision.venvs import find_python
from envs.tasks.published import model_patch, official_outcomes, repos_from_bundles
from envs.tasks.records import load_tasks

PUBLISHED = DATA / "published"
RUN = PUBLISHED / "swe_bench_eval" / "deepseek_lite_dev"
MODEL_RUN = "pylint-dev__astroid-1268"  # its official run is stored
SYMPY = "sympy__sympy-13031"
CASES = {MODEL_RUN: "swe_bench_dev_real.json", SYMPY: "swe_bench_lite_real.json"}


@pytest.fixture(scope="module")
def published(request, tmp_path_factory):
    """The record, its repository from its bundle in $JAXSWE_REPOS_DIR."""
    records = CASES[request.param]
    (task,) = [t for t in load_tasks(PUBLISHED / records) if t.instance_id == request.param]
    try:
        find_python(task.install["python"])
    except SandboxError as err:  # CI has pyenv builds of 3.6-3.13: there a missing one fails
        (pytest.fail if os.environ.get("CI") else pytest.skip)(str(err))
    bundle = PUBLISHED / "repos" / f"{task.repo.replace('/', '__')}-{task.base_commit[:7]}.bundle"
    repos = repos_from_bundles([bundle], tmp_path_factory.mktemp("repos"))
    mp = pytest.MonkeyPatch()
    mp.setenv("JAXSWE_REPOS_DIR", str(repos))
    yield task
    mp.undo()


@pytest.mark.slow
@pytest.mark.parametrize("published", [MODEL_RUN], indirect=True)
def test_gold_resolves_and_empty_fails_exactly_the_fail_to_pass_tests(published):
    """The spec's Python from pyenv, the venv built once (cached under $JAXSWE_CACHE_DIR), the plain
    verdicts (twins=False: the twin run is a check of jaxswe's own, tested on its own)."""
    gold = grade(published, published.patch, twins=False)
    assert gold.resolved and not gold.error, gold.reason
    empty = grade(published, "", twins=False)
    assert not empty.resolved and not empty.error
    graded = [*published.fail_to_pass, *published.pass_to_pass]
    assert [t for t in graded if empty.tests[t] != "PASSED"] == list(published.fail_to_pass)


@pytest.mark.slow
@pytest.mark.parametrize("published", [MODEL_RUN], indirect=True)
def test_a_model_patch_gets_the_official_verdict_test_by_test(published):
    """deepseek-chat's patch, cut from the official log: not resolved, every test as reported."""
    report = json.loads((RUN / MODEL_RUN / "report.json").read_text())[MODEL_RUN]
    log = gzip.decompress((RUN / MODEL_RUN / "test_output.txt.gz").read_bytes()).decode()
    official = official_outcomes(report)
    assert set(official) == {*published.fail_to_pass, *published.pass_to_pass}
    model = grade(published, model_patch(log, published.base_commit), twins=False)
    assert not model.error and model.resolved == report["resolved"] is False, model.reason
    assert {t: model.tests[t] == "PASSED" for t in official} == official  # every test as published


@pytest.mark.slow
@pytest.mark.parametrize("published", [SYMPY], indirect=True)
def test_jaxswe_tasks_validate_takes_published_records_as_a_user_brings_them(published, tmp_path):
    """The CLI on two records as published: sympy's (spec Python 3.9, `bin/test`) is valid; a
    django record, whose repository is not here, is an infrastructure failure naming the missing
    clone, never an invalid task."""
    records = [r for r in json.loads((PUBLISHED / CASES[SYMPY]).read_text())
               if r["instance_id"] in (SYMPY, "django__django-15781")]  # fmt: skip
    (tmp_path / "tasks.json").write_text(json.dumps(records))
    done = subprocess.run([sys.executable, "-m", "jaxswe", "tasks", "validate", str(tmp_path / "tasks.json")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = {line["instance_id"]: line for line in map(json.loads, done.stdout.splitlines())}
    assert done.returncode == 1, done.stderr[-2000:]
    assert (
        lines[SYMPY]["ok"] and lines[SYMPY]["gold_resolved"] == [True] and not lines[SYMPY]["empty_resolved"]
    )
    assert set(lines[SYMPY]["reference_statuses"].values()) == {"PASSED"}
    django = lines["django__django-15781"]
    assert django["infrastructure"] and not django["ok"]
    assert "no local clone of django/django" in django["reason"]
    assert "1 valid, 0 invalid, 1 infrastructure failures" in done.stderr
