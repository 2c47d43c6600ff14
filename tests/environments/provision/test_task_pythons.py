"""A task's Python as users have it: found on PATH (when it runs), in pyenv, uv or conda installs,
refused naming every place tried; a task whose recipe names a Python other than the grader's own
builds its venv with that interpreter and grades in the local sandbox, whose bind of the
interpreter's prefix lets the venv's `bin/python` run there."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from envs.errors import SandboxError
from envs.grading.grader import grade
from envs.provision.backends import open_sandbox
from envs.provision.images import requirement_steps
from envs.provision.venvs import find_python, task_requirements, task_venv, venv_binds
from envs.tasks import official
from envs.tasks.records import Task, task_from_record

PYENV = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
OTHER = "3.9"  # a spec Python of most SWE-bench repositories, not the grader's own 3.11
pytestmark = pytest.mark.skipif(
    not list((PYENV / "versions").glob(f"{OTHER}.*/bin/python{OTHER}")), reason=f"no pyenv Python {OTHER}"
)


def _isolated(monkeypatch, tmp_path: Path, *, pyenv: Path, uv: Path) -> None:
    """PATH holding only an unselected pyenv-like shim (exits 127, as pyenv's does) and the system."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    shim = shims / f"python{OTHER}"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.9: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:/usr/bin:/bin")
    monkeypatch.setenv("PYENV_ROOT", str(pyenv))
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(uv))
    for name in ("CONDA_PREFIX", "CONDA_EXE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/miniconda3 and the like


def test_interpreters_are_found_where_users_have_them(tmp_path, monkeypatch):
    real = next(iter(sorted((PYENV / "versions").glob(f"{OTHER}.*"))))
    _isolated(monkeypatch, tmp_path, pyenv=PYENV, uv=tmp_path / "uv")
    found = find_python(OTHER)  # the shim on PATH exits 127: pyenv's own build instead
    assert found.version == OTHER and Path(found.path).is_relative_to(PYENV / "versions"), found
    uv_bin = tmp_path / "uv" / f"cpython-{OTHER}.18-linux-x86_64-gnu" / "bin"
    uv_bin.mkdir(parents=True)
    (uv_bin / f"python{OTHER}").symlink_to(real / "bin" / f"python{OTHER}")
    _isolated(monkeypatch, tmp_path, pyenv=tmp_path / "no-pyenv", uv=tmp_path / "uv")
    assert find_python(OTHER).version == OTHER  # a uv-managed install (linking to the real one)
    _isolated(monkeypatch, tmp_path, pyenv=tmp_path / "no-pyenv", uv=tmp_path / "no-uv")
    with pytest.raises(SandboxError) as refused:
        find_python(OTHER)
    why = str(refused.value)
    assert f"needs Python {OTHER} and none runs here" in why
    for place in (
        f"python{OTHER} on PATH ({tmp_path}/shims/python{OTHER} exits 127)",
        f"pyenv {tmp_path}/no-pyenv/versions/{OTHER}.* (none)",
        f"uv {tmp_path}/no-uv/cpython-{OTHER}.* (none)",
        "conda (no installation) (none)",
    ):
        assert place in why, why


_DATE = {"GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
_CODE = "def removeprefix(text, prefix):\n    return text[len(prefix):]\n"  # the bug: no check
_FIXED = (
    "def removeprefix(text, prefix):\n    return text[len(prefix):] if text.startswith(prefix) else text\n"
)
# setup.py only: pip 23 on 3.9 installs it with `setup.py develop` (an egg-link, metadata in the checkout)
_SETUP = """from setuptools import setup\n\nsetup(name="strs", version="1.2.3", py_modules=["strs"],
      entry_points={"strs.plugins": ["strip = strs:removeprefix"]})\n"""
_TEST = """import sys\nfrom importlib.metadata import entry_points, version\n
from strs import removeprefix\n\n
def test_runs_on_the_recipes_python():\n    assert sys.version_info[:2] == (3, 9)\n\n
def test_own_metadata():\n    assert version("strs") == "1.2.3"
    assert [e.name for e in entry_points()["strs.plugins"]] == ["strip"]\n\n
def test_strip():\n    assert removeprefix("abc", "a") == "bc"\n"""
_NEW_TEST = '\n\ndef test_keep():\n    assert removeprefix("abc", "x") == "abc"\n'


def _repo(path: Path) -> tuple[str, str, str]:
    """A tiny repository (deterministic commits); (base commit, gold patch, test patch)."""
    who = {f"GIT_{role}_{what}": "t" for role in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL")}
    env = {**os.environ, **_DATE, **who}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], env=env, check=True, capture_output=True,
                              text=True).stdout  # fmt: skip

    path.mkdir()
    git("init", "-q", "-b", "main")
    (path / "strs.py").write_text(_CODE)
    (path / "setup.py").write_text(_SETUP)
    (path / "requirements.txt").write_text(_REQUIREMENTS)
    (path / "test_strs.py").write_text(_TEST)
    git("add", ".")
    git("commit", "-q", "-m", "base")
    base = git("rev-parse", "HEAD").strip()
    (path / "strs.py").write_text(_FIXED)
    gold = git("diff")
    git("checkout", "-q", "strs.py")
    (path / "test_strs.py").write_text(_TEST + _NEW_TEST)
    test_patch = git("diff")
    git("checkout", "-q", "test_strs.py")
    return base, gold, test_patch


# as SWE-bench repositories have them: pip given this file raw fails (`.[test]` here is no project,
# types-pkg_resources is yanked); swebench's reading drops the first two lines and replaces the third
_REQUIREMENTS = "-e .\n.[test]\ntypes-pkg_resources\n"
_BUMP = """diff --git a/setup.py b/setup.py
--- a/setup.py
+++ b/setup.py
@@ -1,4 +1,4 @@
 from setuptools import setup

-setup(name="strs", version="1.2.3", py_modules=["strs"],
+setup(name="strs", version="1.2.4", py_modules=["strs"],
       entry_points={"strs.plugins": ["strip = strs:removeprefix"]})
""".replace("\n\n", "\n \n")
_PASSING = ("test_runs_on_the_recipes_python", "test_own_metadata", "test_strip")


def _task(tmp_path: Path, **recipe) -> Task:
    base, gold, test_patch = _repo(tmp_path / "repo")
    record = {
        "instance_id": "py39__strs-1", "repo": "py39/strs", "base_commit": base, "patch": gold,
        "test_patch": test_patch, "FAIL_TO_PASS": ["test_strs.py::test_keep"],
        "PASS_TO_PASS": [f"test_strs.py::{t}" for t in _PASSING],
        "install_config": {"python": OTHER, "test_cmd": "pytest -rA", **recipe},
    }  # fmt: skip
    return task_from_record(record, source_dir=str(tmp_path / "repo"))


@pytest.mark.slow
def test_a_task_on_another_python_grades_in_the_local_sandbox(tmp_path):
    """The venv (cached under $JAXSWE_CACHE_DIR: built once) is Python 3.9's; its bin/python links
    into pyenv's prefix, bound read-only; the repository's own distribution is installed as the
    official recipe does (its requirements.txt as swebench cleans it, `pip install -e .` at the base
    commit) and kept as metadata only: its
    version and entry points read as published, its code the checkout's. Gold resolves, empty fails."""
    task = _task(tmp_path, packages="requirements.txt", install="python -m pip install -e .")
    venv, prefix = venv_binds(task)
    assert prefix != sys.base_prefix and os.path.realpath(Path(venv) / "bin" / "python").startswith(prefix)
    site = next(Path(venv).glob("lib/python*/site-packages"))
    assert [p.name for p in site.glob("strs*")] == ["strs.egg-info"]  # no egg-link, no code
    with open_sandbox(task, "local") as sb:
        ran = sb.exec("python -c 'import sys, strs; print(sys.version_info[:2], strs.__file__)'")
        assert ran.exit_code == 0 and ran.output.strip() == f"(3, 9) {sb.workdir}/strs.py", ran.output
        assert sb.exec("python -m pip show -q types-setuptools").exit_code == 0  # the replacement
    resolved = grade(task, task.patch, twins=False)  # the plain verdict: twins are tested on their own
    assert resolved.resolved and not resolved.error, resolved.reason
    assert not [n for n in resolved.notes if "packaging metadata" in n]
    empty = grade(task, "", twins=False)
    assert not empty.resolved and not empty.error and empty.tests["test_strs.py::test_keep"] == "FAILED"
    assert all(empty.tests[t] == "PASSED" for t in task.pass_to_pass), empty.tests
    bumped = grade(task, task.patch + _BUMP, twins=False)  # metadata stays the base commit's, and says so
    assert bumped.resolved and any("packaging metadata (setup.py)" in n for n in bumped.notes), bumped.notes


@pytest.mark.slow
def test_a_failed_build_is_an_infrastructure_failure_with_pips_error_once(tmp_path, monkeypatch):
    """A recipe pip cannot satisfy: the grade is an error (never a 0) naming pip's real error line,
    not its "Ignored the following versions" noise; the failure is cached (not rebuilt on the next
    grade) and `jaxswe tasks validate` reports it once, as an infrastructure failure."""
    monkeypatch.setenv("JAXSWE_CACHE_DIR", str(tmp_path / "cache"))  # the failure is cached here only
    task = _task(tmp_path, pip_packages=["pytest==99.0"])
    result = grade(task, task.patch, twins=False)
    assert result.error and not result.resolved
    assert "No matching distribution found for pytest==99.0" in result.reason, result.reason
    assert "Ignored the following" not in result.reason
    failed = list((tmp_path / "cache" / "venvs").glob("*.failed"))
    assert len(failed) == 1 and not [p for p in failed[0].parent.iterdir() if p.is_dir()]
    start = time.monotonic()
    again = grade(task, "", twins=False)
    assert again.error and again.reason == result.reason and time.monotonic() - start < 10
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task.to_record()) + "\n")
    cli = Path(sys.executable).parent / "jaxswe"
    done = subprocess.run([str(cli), "tasks", "validate", str(tasks)], capture_output=True, text=True,
                          env={**os.environ, "JAXSWE_REPOS_DIR": str(tmp_path)})  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["reason"].startswith("infrastructure failure: ")
    assert line.count("No matching distribution found for pytest==99.0") == 1
    assert "0 valid, 0 invalid, 1 infrastructure failures" in done.stderr


def _wheel_without_index_data(folder: Path, name: str, version: str, requires_python: str) -> None:
    """A wheel in a find-links folder: only its METADATA, read once pip has it, names its Python."""
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                           f"Requires-Python: {requires_python}\n")  # fmt: skip
        wheel.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist}/RECORD", "")


@pytest.mark.slow
def test_a_python_36_venv_skips_releases_it_cannot_run(tmp_path, monkeypatch):
    """An index offering a pytest for Python >= 3.10 without saying so in its listing (a find-links
    folder, as local mirrors are): ensurepip's pip 18.1 on 3.6 takes it and the build fails; the venv's
    pip is first raised to 21.3.1 (conda's Python 3.6 has 21.x), which reads the wheel's
    Requires-Python, skips it and installs pytest 7.0.1, the last release for 3.6."""
    try:
        find_python("3.6")
    except SandboxError as err:  # CI has pyenv builds of 3.6-3.13: there a missing one fails
        (pytest.fail if os.environ.get("CI") else pytest.skip)(str(err))
    links = tmp_path / "links"
    links.mkdir()
    _wheel_without_index_data(links, "pytest", "99.0", ">=3.10")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("JAXSWE_CACHE_DIR", str(tmp_path / "cache"))
    venv = task_venv(_task(tmp_path, python="3.6", pip_packages=["pytest"]))
    show = (
        "import pip, pytest, sys; print(pip.__version__, pytest.__version__, '%d.%d' % sys.version_info[:2])"
    )
    versions = subprocess.run([str(venv / "bin" / "python"), "-c", show], capture_output=True, text=True)
    assert versions.stdout.split() == ["21.3.1", "7.0.1", "3.6"], versions.stderr


def test_requirements_are_read_as_swebench_reads_them():
    """`-r` files inlined, `-e .`, `.[test` and comments dropped, yanked packages replaced by
    swebench's own clean_requirements; the first path that exists wins."""
    files = {
        "requirements/dev.txt": "-r base.txt\n-e .\n# tools\ntypes-pkg_resources==0.1.3\nblack\n",
        "requirements/base.txt": ".[test]\nattrs>=20\n",
    }
    path, text = official.requirements(["requirements/missing.txt", "requirements/dev.txt"], files.get)
    assert path == "requirements/dev.txt"
    assert [ln for ln in text.splitlines() if ln] == ["attrs>=20", "types-setuptools", "black"]
    assert official.requirements(["requirements.txt"], files.get) is None


def test_docker_images_install_the_requirements_local_venvs_install(tmp_path):
    """Both backends install the same swebench-cleaned text of the first requirement file that
    exists (pip given the raw file fails on `.[test]` and the yanked package)."""
    task = _task(tmp_path, reqs_path=["missing.txt", "requirements.txt"])
    path, text = task_requirements(task)
    assert path == "requirements.txt" and [ln for ln in text.splitlines() if ln] == ["types-setuptools"]
    script = "\n".join(requirement_steps(task))
    assert shlex.quote(text) in script and ".[test]" not in script and "pip install -q -r" in script
