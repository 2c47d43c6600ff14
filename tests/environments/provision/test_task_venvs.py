"""Local task environments: a per-task venv from the install recipe, never the host's packages.

The host venv has toolz 1.2.0 installed, which already holds the partition_all fix of toolz commit
5a7e078; the task sits at that commit's parent. Graded against the host's copy, the empty patch
would pass; graded against the repository's code (the task venv), gold resolves and empty fails.
"""

from __future__ import annotations

import subprocess

import pytest
from helpers import REPOS

from envs.errors import SandboxError
from envs.grading.grader import grade
from envs.host_git import cache_dir
from envs.provision.backends import open_sandbox
from envs.provision.venvs import task_venv, venv_key
from envs.tasks.records import task_from_record

FIX = "5a7e078"


@pytest.fixture(scope="module")
def toolz_task(tmp_path_factory):
    if not (REPOS / "toolz.bundle").is_file():
        pytest.skip("shared repositories missing")
    root = tmp_path_factory.mktemp("venvs")
    mp = pytest.MonkeyPatch()
    mp.setenv("JAXSWE_CACHE_DIR", str(root / "cache"))
    mp.setenv("JAXSWE_REPOS_DIR", str(root / "repos"))
    clone = root / "repos" / "pytoolz__toolz"
    subprocess.run(["git", "clone", "-q", "--bare", str(REPOS / "toolz.bundle"), str(clone)], check=True)

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(clone), *args], capture_output=True, text=True, check=True
        ).stdout

    parent = git("rev-parse", f"{FIX}^").strip()
    record = {
        "instance_id": "pytoolz__toolz-603",
        "repo": "pytoolz/toolz",
        "base_commit": parent,
        "patch": git("diff", parent, FIX, "--", "toolz/itertoolz.py"),
        "test_patch": git("diff", parent, FIX, "--", "toolz/tests"),
        "FAIL_TO_PASS": ["toolz/tests/test_itertoolz.py::test_partition_all"],
        "PASS_TO_PASS": ["toolz/tests/test_itertoolz.py::test_remove"],
        "install_config": {"install": "pip install -e .", "test_cmd": "pytest -rA"},
    }
    yield task_from_record(record)
    mp.undo()


@pytest.mark.slow
def test_host_installed_package_is_not_what_the_task_grades(toolz_task):
    import toolz  # the host's copy, a later release holding the fix

    assert "site-packages" in toolz.__file__
    gold = grade(toolz_task, toolz_task.patch)
    assert gold.resolved, gold.reason
    empty = grade(toolz_task, "")
    assert not empty.resolved and empty.tests["toolz/tests/test_itertoolz.py::test_partition_all"] == "FAILED"


def test_sandbox_commands_use_the_task_venv(toolz_task):
    venv = task_venv(toolz_task)
    assert task_venv(toolz_task) == venv  # cached: built once
    with open_sandbox(toolz_task, "local") as sb:
        where = sb.exec("python -c 'import sys, toolz; print(sys.prefix); print(toolz.__file__)'")
        assert where.exit_code == 0, where.output
        prefix, module = where.output.split()
        assert prefix == str(venv) and module.startswith(sb.workdir)  # the checkout, not site-packages
        assert sb.exec("command -v pytest").output.strip() == str(venv / "bin" / "pytest")
        assert sb.exec("python -c 'import jax'").exit_code != 0  # no host site-packages
        # the repository's distribution as the official harness leaves it: its metadata, not its code
        meta = sb.exec("python -c 'import importlib.metadata as m; print(m.distribution(\"toolz\").version)'")
        assert meta.exit_code == 0 and meta.output.strip()[:1].isdigit(), meta.output
    site = next(venv.glob("lib/python*/site-packages"))
    assert not [
        p for p in site.iterdir() if "toolz" in p.name and not p.name.endswith((".dist-info", ".egg-info"))
    ]
    # a recipe that installs nothing shares one venv; one that installs the repo is per repo+commit
    bare = task_from_record({**toolz_task.raw, "install_config": {"test_cmd": "pytest -rA"}})
    other = task_from_record({**toolz_task.raw, "repo": "other/toolz"})
    assert venv_key(bare) == venv_key(task_from_record({**bare.raw, "repo": "x/y"}))
    assert venv_key(other) != venv_key(toolz_task)


_PYX_FIX = "diff --git a/pkg/_speed.pyx b/pkg/_speed.pyx\n--- a/pkg/_speed.pyx\n+++ b/pkg/_speed.pyx\n"
_PYX_FIX += "@@ -1 +1 @@\n-a\n+b\n"


@pytest.mark.parametrize(
    ("recipe", "patch", "why"),
    [
        ({"python": "3.4", "install": "pip install -e ."}, "", "needs Python 3.4 and none runs here"),
        ({"packages": "environment.yml"}, "", "conda environment.yml"),
        ({"pre_install": ["apt-get install -y locales"]}, "", "pre_install steps"),
        ({"install": "pip install -e ."}, _PYX_FIX, "compiled-extension source"),
    ],
)
def test_a_recipe_built_otherwise_than_its_harness_would_is_refused(
    recipe, patch, why, tmp_path, monkeypatch
):
    """The environment is the spec's or none: another Python, a conda environment.yml, system
    steps locally, a fix that needs the post-patch rebuild: one clear error naming the reason, no
    half-built venv (in a cache of its own: the pre_install recipe's venv key is the bare one other
    tasks build)."""
    monkeypatch.setenv("JAXSWE_CACHE_DIR", str(tmp_path / "cache"))
    record = {
        "instance_id": "o__r-1", "repo": "o/r", "base_commit": "0" * 40, "patch": patch, "test_patch": "",
        "FAIL_TO_PASS": ["t.py::test_a"], "PASS_TO_PASS": [], "install_config": recipe,
    }  # fmt: skip
    task = task_from_record(record)
    with pytest.raises(SandboxError, match=why):
        task_venv(task)
    assert not [p for p in (cache_dir() / "venvs").glob("*") if p.is_dir()]  # none half-built
    if "pre_install" in recipe:  # the docker backend runs them, in the repository
        assert task.recipe_problem("3.11", local=False) is None
