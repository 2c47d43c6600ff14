"""Per-task virtual environments for the local backend, built once from a task's install recipe.

`task_venv(task)` builds (once, cached under `$JAXSWE_CACHE_DIR/venvs/<key>`, under a file lock) a
virtualenv WITHOUT the host's site-packages by the official recipe's steps: the repository's
requirements at the environment commit as swebench reads and cleans them (`packages:
requirements.txt`, `reqs_path`), the spec's `packages` and `pip_packages`, then the recipe's
`install` (e.g. `pip install -e .`) run in a clean copy of the repository at the base commit (a venv
whose pip predates 20.3, on Python 3.5 or 3.6, first gets the pip conda's environments have); the
repository's own distribution is then kept as metadata only (METADATA, entry points: what
`importlib.metadata` and plugin loaders read) without its code or import hooks, so no code of a
graded patch runs before the grader's checks and the code under test is always the sandbox's
checkout: `venv_env` puts the checkout's import root (`src/` for a src layout, else the root) on
PYTHONPATH and the venv's bin first on PATH. Recipes that read no repository share one venv per
recipe. The venv's Python is the recipe's X.Y as users have it (`find_python`: `pythonX.Y` on PATH
that runs, then pyenv, uv and conda installs), else the host's base interpreter; sandboxes bind its
prefix read-only with the venv (`venv_binds`). A recipe whose Python runs nowhere here (the error
names every place tried), a conda environment.yml or `pre_install` steps (system commands) is
refused with the reason (`Task.recipe_problem`: the docker backend runs the last). A failed build is
cached with pip's real error line (`<key>.failed`) and raised again without a rebuild. The build
runs with none of the caller's GIT_* variables (envs.host_git.host_env), so an install that asks git
for the version (setuptools-scm) reads the clean copy, not the caller's repository.
"""

from __future__ import annotations

import csv
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.errors import SandboxError
from envs.host_git import cache_dir, git, host_env
from envs.tasks import official
from envs.tasks.patches import patch_files
from envs.tasks.repos import task_source

if TYPE_CHECKING:
    from envs.tasks.records import Task

_READY = "jaxswe-venv.json"
_RECIPE_KEYS = ("python", "packages", "pip_packages", "reqs_path", "install")
# pip 20.3 and later skip a release whose Requires-Python excludes the venv's Python; ensurepip's pip
# on Python 3.5 and 3.6 (9, 18.1) takes the newest release an index offers without that data (a
# local mirror, a find-links folder) and fails. 21.3.1, the last pip for 3.6, is what conda's
# Python 3.6 environments, the official recipe's, carry (21.x).
_RESOLVING_PIP = "pip>=20.3,<21.4"


def _recipe(task: Task) -> dict[str, Any]:
    return {k: task.install[k] for k in _RECIPE_KEYS if task.install.get(k)}


@dataclass(frozen=True)
class Interpreter:
    """A Python that runs: its executable, X.Y version and prefix (bound read-only in sandboxes)."""

    path: str
    version: str
    prefix: str


_PROBE = (
    "import os, sys; print('%d.%d' % sys.version_info[:2]); print(sys.base_prefix); "
    "print(os.path.realpath(sys.executable))"
)


def _probe(python: str) -> Interpreter | str:
    """The interpreter `python` is, or why it is none (it does not run: a pyenv shim not selected)."""
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, env=host_env()
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{python} does not run ({type(err).__name__})"
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 3:
        return f"{python} exits {done.returncode}"
    return Interpreter(lines[2], lines[0], lines[1])  # the executable itself, not a shim


def _version_key(path: Path) -> tuple[int, ...]:
    """Newest first: 3.9.18 before 3.9.2 (the patch number of a `3.9.18` directory name)."""
    return tuple(int(n) for n in re.findall(r"\d+", path.name)[:3])


def _conda_roots() -> list[Path]:
    home = Path.home()
    roots = [os.environ.get("CONDA_PREFIX", ""), str(Path(os.environ.get("CONDA_EXE", "/")).parent.parent)]
    roots += [str(home / n) for n in ("miniconda3", "anaconda3", "miniforge3", "mambaforge")]
    roots += ["/opt/conda", "/opt/miniconda3"]
    return [Path(r) for r in dict.fromkeys(roots) if r and r != "/" and Path(r).is_dir()]


def _places(version: str) -> list[tuple[str, list[str]]]:
    """(place, candidate executables) in the order tried: PATH, pyenv, uv, conda."""
    exe = f"python{version}"
    which = shutil.which(exe)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    uv = Path(os.environ.get("UV_PYTHON_INSTALL_DIR") or data / "uv" / "python")
    conda = [p for root in _conda_roots() for p in [root, *sorted(root.glob("envs/*"))]]

    def found(dirs: list[Path]) -> list[str]:
        return [str(d / "bin" / exe) for d in dirs if (d / "bin" / exe).is_file()]

    return [
        (f"{exe} on PATH", [which] if which else []),
        (
            f"pyenv {pyenv}/{version}.*",
            found(sorted(pyenv.glob(f"{version}.*"), key=_version_key, reverse=True)),
        ),
        (
            f"uv {uv}/cpython-{version}.*",
            found(sorted(uv.glob(f"cpython-{version}.*"), key=_version_key, reverse=True)),
        ),
        ("conda " + (", ".join(str(r) for r in _conda_roots()) or "(no installation)"), found(conda)),
    ]


@functools.cache
def _find(version: str, where: tuple[str | None, ...]) -> Interpreter | str:
    tried = []
    for place, candidates in _places(version):
        why = []
        for candidate in candidates:
            got = _probe(candidate)
            if isinstance(got, Interpreter) and got.version == version:
                return got
            why.append(got if isinstance(got, str) else f"{candidate} is Python {got.version}")
        tried.append(f"{place} ({'; '.join(why) or 'none'})")
    return f"its recipe needs Python {version} and none runs here; tried: " + ", ".join(tried)


def find_python(version: str | None) -> Interpreter:
    """The recipe's Python X.Y as users have it (`pythonX.Y` on PATH that runs, a pyenv, uv or conda
    install), or with no version the host's base interpreter; SandboxError naming every place tried."""
    if not version:
        base = getattr(sys, "_base_executable", None) or sys.executable
        return Interpreter(base, "{}.{}".format(*sys.version_info[:2]), sys.base_prefix)
    where = tuple(
        os.environ.get(k) for k in ("PATH", "PYENV_ROOT", "UV_PYTHON_INSTALL_DIR", "CONDA_PREFIX", "HOME")
    )
    got = _find(version, where)
    if isinstance(got, str):
        raise SandboxError(got)
    return got


def _python(version: str | None) -> str:
    return find_python(version).path


def venv_key(task: Task) -> str:
    """The cache key: the recipe and Python, the repository + environment commit when it reads the
    repository's requirements, + base commit when it installs the repository (its metadata)."""
    recipe = _recipe(task)
    parts: dict[str, Any] = {"recipe": recipe, "python": _python(str(recipe.get("python") or ""))}
    if recipe.get("install") or task.requirement_files:
        parts |= {"repo": task.repo, "commit": task.env_commit or task.base_commit}
    if recipe.get("install"):
        parts["base"] = task.base_commit
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def pip_error(output: str) -> str:
    """pip's real error from its output: its ERROR lines but the "Ignored the following versions"
    noise (else the last lines), at most 1,000 characters."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [
        ln for ln in lines if ln.startswith("ERROR:") and not ln.startswith("ERROR: Ignored the following")
    ]
    kept = errors or [ln for ln in lines if not ln.startswith("ERROR: Ignored the following")][-8:]
    return " / ".join(kept)[-1000:]


def _run(cmd: list[str] | str, *, cwd: Path, env: dict[str, str], what: str) -> None:
    done = subprocess.run(cmd, cwd=cwd, env=env, shell=isinstance(cmd, str), capture_output=True, text=True)
    if done.returncode != 0:
        raise SandboxError(f"{what} failed ({done.returncode}): {pip_error(done.stdout + done.stderr)}")


def _import_root(checkout: Path) -> str:
    """`src` for a src layout (a package under src/), else the repository root."""
    src = checkout / "src"
    if src.is_dir() and any((p / "__init__.py").is_file() or p.suffix == ".py" for p in src.iterdir()):
        return "src"
    return "."


def _show(source: Path, commit: str) -> Callable[[str], str | None]:
    """A reader of the repository's files at `commit` (None: no such file)."""

    def read(path: str) -> str | None:
        done = subprocess.run(["git", "-C", str(source), "show", f"{commit}:{path}"], capture_output=True,
                              text=True, env=host_env())  # fmt: skip
        return done.stdout if done.returncode == 0 else None

    return read


def task_requirements(task: Task) -> tuple[str, str]:
    """(path, text) of the task's requirements as the official harness installs them: the first of
    its requirement files at the environment commit, cleaned by swebench (`official.requirements`)."""
    commit = task.env_commit or task.base_commit
    found = official.requirements(list(task.requirement_files), _show(task_source(task), commit))
    if found is None:  # the official harness fails the same way
        raise SandboxError(f"none of {', '.join(task.requirement_files)} exists at {commit[:12]}")
    return found


def _build(task: Task, venv: Path) -> None:
    """The official recipe's steps, in its order: requirements (as swebench cleans them) or the
    spec's packages, pip_packages, then the repository's install at the base commit, kept as
    metadata only; pytest when the recipe brought none."""
    recipe = _recipe(task)
    python = _python(str(recipe.get("python") or ""))
    env = {k: v for k, v in host_env().items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env |= {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(venv),
            "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}  # fmt: skip
    _run([python, "-m", "venv", str(venv)], cwd=venv.parent, env=env, what="python -m venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install"]
    with tempfile.TemporaryDirectory(prefix="jaxswe-venv-build-") as tmp:
        run = functools.partial(_run, cwd=Path(tmp), env=env)
        if _pip_version(venv) < (20, 3):
            run([*pip, _RESOLVING_PIP], what=f"pip install {_RESOLVING_PIP}")
        if task.requirement_files:
            path, text = task_requirements(task)
            (Path(tmp) / "requirements.txt").write_text(text)
            run([*pip, "-r", "requirements.txt"], what=f"pip install -r {path}")
        packages = recipe.get("packages")
        if isinstance(packages, str) and packages not in ("", "requirements.txt", "environment.yml"):
            run([*pip, *packages.split()], what=f"pip install {packages}")  # conda names: pip gets the same
        if recipe.get("pip_packages"):
            run([*pip, *recipe["pip_packages"]], what=f"pip install {' '.join(recipe['pip_packages'])}")
        if recipe.get("install"):
            _install_repository(task, venv, Path(tmp) / "repo", env)
    if subprocess.run([str(venv / "bin" / "python"), "-c", "import pytest"], capture_output=True).returncode:
        _run([*pip, "pytest"], cwd=venv, env=env, what="pip install pytest")


def _pip_version(venv: Path) -> tuple[int, ...]:
    """The (major, minor) of the venv's pip."""
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "import pip; print(pip.__version__)"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return tuple(int(part) for part in done.stdout.split(".")[:2])


def _install_repository(task: Task, venv: Path, checkout: Path, env: dict[str, str]) -> None:
    """The recipe's install run in a clean copy at the base commit (as the official image runs it),
    then the repository's distribution kept as metadata only (the sandbox imports its checkout)."""
    done = subprocess.run(["git", "clone", "-q", "--no-checkout", str(task_source(task)), str(checkout)],
                          capture_output=True, text=True, env=host_env())  # fmt: skip
    if done.returncode != 0:
        raise SandboxError(f"git clone failed: {done.stderr[-500:]}")
    git(checkout, "checkout", "-q", task.base_commit)
    install = task.install["install"]
    for command in [c for c in [official.repo_install(task.repo)] if c] + (
        [install] if isinstance(install, str) else list(install)
    ):
        _run(command, cwd=checkout, env=env, what=command)
    _metadata_only(venv, checkout)


def _site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def _metadata_only(venv: Path, checkout: Path) -> list[str]:
    """Strip the distributions installed from `checkout` down to their metadata (METADATA, entry
    points; an egg-link's egg-info copied in): their code and import hooks (editable .pth files,
    finders, egg-links) removed. Returns their directory names."""
    site, root = _site_packages(venv), checkout.resolve()
    kept = []
    for direct in site.glob("*.dist-info/direct_url.json"):
        try:
            url = json.loads(direct.read_text()).get("url", "")
        except (OSError, json.JSONDecodeError):
            continue
        if not (url.startswith("file://") and Path(url[7:]).resolve().is_relative_to(root)):
            continue
        for row in csv.reader((direct.parent / "RECORD").read_text().splitlines()):
            path = (site / row[0]).resolve() if row else site
            if path.is_file() and path.is_relative_to(site) and not path.is_relative_to(direct.parent):
                path.unlink()
                for parent in path.parents:
                    if parent == site or any(parent.iterdir()):
                        break
                    parent.rmdir()
        kept.append(direct.parent.name)
    for link in site.glob("*.egg-link"):
        target = Path(link.read_text().splitlines()[0].strip()).resolve()
        if not target.is_relative_to(root):
            continue
        for info in target.glob("*.egg-info"):
            shutil.copytree(info, site / info.name)
            kept.append(info.name)
        link.unlink()
        pth = site / "easy-install.pth"
        if pth.is_file():
            lines = pth.read_text().splitlines()
            pth.write_text("".join(f"{ln}\n" for ln in lines if Path(ln.strip()).resolve() != target))
    return kept


def task_venv(task: Task) -> Path:
    """The task's venv (built on first use; concurrent callers wait for one build); SandboxError
    where the recipe cannot be built as its harness builds it (`Task.recipe_problem`)."""
    try:
        python = find_python(str(_recipe(task).get("python") or ""))
    except SandboxError as err:
        raise SandboxError(f"cannot build the environment of {task.instance_id}: {err}") from None
    if (problem := task.recipe_problem(python.version, local=True)) is not None:
        raise SandboxError(f"cannot build the environment of {task.instance_id}: {problem}")
    root = cache_dir() / "venvs"
    root.mkdir(parents=True, exist_ok=True)
    venv = root / venv_key(task)
    failed = root / f"{venv.name}.failed"
    if (venv / _READY).is_file():
        return venv
    with open(root / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / _READY).is_file():
            return venv
        if failed.is_file():  # a failed build is not retried on every grade
            raise SandboxError(failed.read_text())
        shutil.rmtree(venv, ignore_errors=True)  # a build that died half-way
        venv.mkdir()
        try:
            _build(task, venv)
        except SandboxError as err:
            shutil.rmtree(venv, ignore_errors=True)
            why = f"building the environment of {task.instance_id} failed: {err} (delete {failed} to retry)"
            failed.write_text(why)
            raise SandboxError(why) from None
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        (venv / _READY).write_text(json.dumps({"recipe": _recipe(task), "repo": task.repo}))
    return venv


_PACKAGING = ("setup.py", "setup.cfg", "pyproject.toml")


def packaging_note(task: Task, patch: str) -> tuple[str, ...]:
    """A note for a patch that changes the packaging metadata of a task whose recipe installs the
    repository: its installed metadata (version, entry points) stays the base commit's."""
    changed = [f for f in patch_files(patch) if f in _PACKAGING] if task.install.get("install") else []
    if not changed:
        return ()
    return (
        f"the patch changes packaging metadata ({', '.join(changed)}): graded with the repository's metadata "
        "as installed from the base commit (the official harness reinstalls after the patch; jaxswe runs no "
        "code of a patch before the grader's checks)",
    )


def venv_binds(task: Task) -> tuple[str, ...]:
    """What a sandbox running the task's venv binds read-only: the venv and the prefix of the
    interpreter its `bin/python` links into (when that is not the host's own, bound anyway)."""
    prefix = find_python(str(_recipe(task).get("python") or "")).prefix
    return (str(task_venv(task)),) if prefix == sys.base_prefix else (str(task_venv(task)), prefix)


def venv_env(task: Task, checkout: Path | None = None) -> dict[str, str]:
    """Environment for the sandbox's commands: the task venv first on PATH, the checkout's import
    root on PYTHONPATH (`{workdir}` stands for the sandbox's repository root), pytest plugins of
    the venv loading as they would in the task's own environment."""
    venv = task_venv(task)
    root = _import_root(checkout) if checkout is not None else "."
    return {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv),
        "PYTHONPATH": "{workdir}" if root == "." else "{workdir}/" + root,
        "PYTHONNOUSERSITE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "",  # the venv's plugins are the task's own (pytest-asyncio, ...)
    }
