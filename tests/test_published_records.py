"""A real published SWE-bench record graded end to end as the official harness graded it.

pylint-dev__astroid-1268 (SWE-bench Lite dev; spec Python 3.9, `python -m pip install -e .`), its
repository stored as the base commit's tree only (tests/data/published/repos, a bundle of that one
commit, fetched into a shallow repository). The model patch is cut from the official evaluation
log of deepseek-chat (tests/data/published/swe_bench_eval/deepseek_lite_dev: the eval script prints
`git diff <base>` with the patch applied); the official report gives its verdict and every test's
outcome. Gold resolves, empty fails, the model patch gets the official verdict, test by test.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from envs.errors import SandboxError
from envs.grading import grade
from envs.tasks import load_tasks
from envs.venvs import find_python

DATA = Path(__file__).parent / "data" / "published"
RUN = DATA / "swe_bench_eval" / "deepseek_lite_dev"
INSTANCE = "pylint-dev__astroid-1268"


def model_patch(log: str, base_commit: str) -> str:
    """The patch the official eval script graded: its `git diff <base>` output in the log (up to the
    script's next command, which re-activates conda)."""
    lines = log.splitlines()
    start = lines.index(f"+ git -c core.fileMode=false diff {base_commit}") + 1
    end = lines.index("+ source /opt/miniconda3/bin/activate", start)
    return "\n".join(lines[start:end]) + "\n"


def official_outcomes(report: dict) -> dict[str, bool]:
    """Each graded test of the official report: passed or not."""
    statuses = report["tests_status"]
    return {t: ok == "success" for kind in ("FAIL_TO_PASS", "PASS_TO_PASS") for ok in ("success", "failure")
            for t in statuses[kind][ok]}  # fmt: skip


@pytest.fixture(scope="module")
def astroid(tmp_path_factory):
    (task,) = [t for t in load_tasks(DATA / "swe_bench_dev_real.json") if t.instance_id == INSTANCE]
    try:
        find_python(task.install["python"])
    except SandboxError as err:  # CI has pyenv builds of 3.6-3.13: there a missing one fails
        (pytest.fail if os.environ.get("CI") else pytest.skip)(str(err))
    repos = tmp_path_factory.mktemp("repos")
    clone = repos / "pylint-dev__astroid"
    subprocess.run(["git", "init", "-q", "--bare", str(clone)], check=True)
    (clone / "shallow").write_text(task.base_commit + "\n")  # the commit's parents are not stored
    bundle = DATA / "repos" / f"pylint-dev__astroid-{task.base_commit[:7]}.bundle"
    subprocess.run(["git", "-C", str(clone), "fetch", "-q", str(bundle), "main:main"], check=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("JAXSWE_REPOS_DIR", str(repos))
    yield task
    mp.undo()


@pytest.mark.slow
def test_a_published_record_grades_as_the_official_harness_graded_it(astroid):
    """Spec Python 3.9 from pyenv, the venv built once (cached under $JAXSWE_CACHE_DIR), the plain
    verdicts (twins=False: the twin run is a check of jaxswe's own, tested on its own)."""
    report = json.loads((RUN / INSTANCE / "report.json").read_text())[INSTANCE]
    log = gzip.decompress((RUN / INSTANCE / "test_output.txt.gz").read_bytes()).decode()
    official = official_outcomes(report)
    assert set(official) == {*astroid.fail_to_pass, *astroid.pass_to_pass}
    gold = grade(astroid, astroid.patch, twins=False)
    assert gold.resolved and not gold.error, gold.reason
    empty = grade(astroid, "", twins=False)
    assert not empty.resolved and not empty.error
    assert [t for t in official if empty.tests[t] != "PASSED"] == list(astroid.fail_to_pass)
    model = grade(astroid, model_patch(log, astroid.base_commit), twins=False)
    assert not model.error and model.resolved == report["resolved"] is False, model.reason
    assert {t: model.tests[t] == "PASSED" for t in official} == official  # every test as published
