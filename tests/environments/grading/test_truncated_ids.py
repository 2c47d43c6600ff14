"""A real task whose tests have ids with spaces, published as SWE-bench publishes them (cut at the
first space): its gold patch resolves under SWE-bench 5.x's matching, and would not by exact ids.

boltons 289edfc changes funcutils.py and tests/test_funcutils_fb*.py, whose parametrized
`test_get_invocation_sig_str[... a, b ...]` ids contain spaces.
"""

from __future__ import annotations

import subprocess

import pytest
from helpers import REPOS

from envs.grading.grader import grade
from envs.grading.mining import mine_commit
from envs.tasks.records import task_from_record

BUNDLE = REPOS / "boltons.bundle"
FIX = "289edfc"
RECIPE = {"test_cmd": "pytest -rA", "pip_packages": ["pytest~=7.4"]}  # boltons' conftest predates pytest 9


@pytest.mark.slow
def test_truncated_ids_of_a_real_task_resolve(tmp_path):
    if not BUNDLE.is_file():
        pytest.skip("shared repositories missing")
    repo = tmp_path / "boltons"
    subprocess.run(["git", "clone", "-q", str(BUNDLE), str(repo)], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", FIX], capture_output=True, text=True).stdout
    mined = mine_commit(
        repo,
        commit.strip(),
        name="mahmoud/boltons",
        install=RECIPE,
        runs=1,
        check_statement=False,
    )  # its message names co_posonlyargcount, which the fix uses
    assert mined.record is not None, mined.reason
    spaced = [t for t in mined.record["PASS_TO_PASS"] + mined.record["FAIL_TO_PASS"] if " " in t]
    assert len(spaced) >= 2, spaced
    published = {
        **mined.record,
        "FAIL_TO_PASS": [t.split(" ")[0] for t in mined.record["FAIL_TO_PASS"]],
        "PASS_TO_PASS": [t.split(" ")[0] for t in mined.record["PASS_TO_PASS"]],
    }
    task = task_from_record(published)
    gold = grade(task, task.patch)
    assert gold.resolved, gold.reason
    for t in spaced:
        assert gold.tests[t.split(" ")[0]] == "PASSED"  # the truncated id names the full one
    assert not grade(task, "").resolved
